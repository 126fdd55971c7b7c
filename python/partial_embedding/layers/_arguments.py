"""Checks of the layers' constructor arguments, run before anything is allocated.

Each raises an error naming the argument and the value it got.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._internal.row_mask import ids_to_row_mask
from partial_embedding._internal.types import RowMask, Table
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.layers._table_init import table_like

#: The largest row count or width a table may have: TensorFlow builds a
#: variable's shape (and the lookups index its rows) in int32 on some paths.
MAX_DIMENSION = 2**31 - 1

#: ``reverse_dtype``'s default: the layer's compute dtype.
COMPUTE_DTYPE = "compute_dtype"

_REVERSE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def dimension(value: Any, argument: str) -> int:
    """``value`` as a table dimension: an integer in ``[1, MAX_DIMENSION]``.

    Raises:
      PartialEmbeddingArgumentError: anything else (a float, a bool, a
        negative or too large number), named with its value and type.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise PartialEmbeddingArgumentError(
            f"`{argument}` must be a positive integer. Received: "
            f"{argument}={value!r} (of type {type(value).__name__})."
        )
    if not 0 < int(value) <= MAX_DIMENSION:
        raise PartialEmbeddingArgumentError(
            f"`{argument}` must be a positive integer of at most 2**31 - 1 "
            f"({MAX_DIMENSION}), the largest dimension a table can have. Received: "
            f"{argument}={int(value)}."
        )
    return int(value)


#: Where a layer keeps its frozen rows: with the table on the layer's device
#: (the default), or in host memory (docs/large_vocabularies.md).
FROZEN_ROWS_ON = ("device", "host")


def frozen_rows_on(value: Any) -> str:
    """``value`` as where the frozen rows live: ``"device"`` or ``"host"``.

    Raises:
      PartialEmbeddingArgumentError: anything else, named with its value.
    """
    if isinstance(value, str) and value in FROZEN_ROWS_ON:
        return value
    raise PartialEmbeddingArgumentError(
        f"frozen_rows_on: must be one of {', '.join(map(repr, FROZEN_ROWS_ON))}. "
        f"Received: frozen_rows_on={value!r}."
    )


def reverse_dtype(value: Any) -> str | None:
    """``value`` as the reverse projection's dtype: None, ``"compute_dtype"`` or a float name.

    Raises:
      PartialEmbeddingArgumentError: a value that names no dtype (an integer
        such as 5, which TensorFlow would read as the enum of int16; a bool; an
        unknown name), a ``ValueError`` as Keras' "Invalid dtype".
      PartialEmbeddingTypeError: a dtype that is not a float (int32, bool).
    """
    if value is None or (isinstance(value, str) and value == COMPUTE_DTYPE):
        return value
    name = None
    if not isinstance(value, (bool, numbers.Number)):
        try:
            name = tf.as_dtype(value).name
        except TypeError:
            name = None
    if name in _REVERSE_DTYPES:
        return name
    error = PartialEmbeddingArgumentError if name is None else PartialEmbeddingTypeError
    raise error(
        f"reverse_dtype: must be None, {COMPUTE_DTYPE!r} or one of "
        f"{', '.join(_REVERSE_DTYPES)}. Received: reverse_dtype={value!r}."
    )


def from_config_as_keras(
    keras_from_config: Callable[[dict], Any], config: dict, layer_name: str
) -> Any:
    """``keras_from_config(config)``, a bad argument raised as Keras raises it there.

    Keras' ``Layer.from_config`` turns whatever the constructor raises into a
    ``TypeError`` (its own tests expect one for ``Embedding.from_config`` with
    ``input_dim=3.7``), whose message holds the whole config. An argument
    error of ours comes out as a ``PartialEmbeddingTypeError``: a
    ``TypeError`` as in Keras, and still the ``ValueError`` our constructor
    raises, with our message naming the argument and its value.
    """
    try:
        return keras_from_config(config)
    except TypeError as error:
        cause = error.__cause__ or error.__context__
        if isinstance(cause, PartialEmbeddingArgumentError) and cause is not error:
            raise PartialEmbeddingTypeError(f"{layer_name}.from_config: {cause}") from cause
        raise


def initial_mask(
    trainable_ids: Any, frozen_ids: Any, input_dim: int, what: str = "PartialEmbedding"
) -> RowMask | None:
    """The mask ``trainable_ids`` or ``frozen_ids`` give; None (every row learns) for neither.

    Raises:
      PartialEmbeddingArgumentError: both given; an id outside
        ``[0, input_dim)``; a bool mask of another shape.
      PartialEmbeddingTypeError: ids that are not integers (floats, NaN).
    """
    if trainable_ids is not None and frozen_ids is not None:
        raise PartialEmbeddingArgumentError(
            f"{what}: pass at most one of trainable_ids and frozen_ids, got both"
        )
    if trainable_ids is not None:
        return ids_to_row_mask(trainable_ids, "trainable_ids", input_dim)
    if frozen_ids is not None:
        return ~ids_to_row_mask(frozen_ids, "frozen_ids", input_dim)
    return None


def as_table(table: Any, argument: str) -> Any:
    """``table`` as something rows can be sliced from; ragged or odd input refused."""
    if isinstance(table, (tf.RaggedTensor, tf.SparseTensor)):
        raise PartialEmbeddingArgumentError(
            f"{argument}: the table must be a rectangular numeric array, got a "
            f"{type(table).__name__}"
        )
    try:
        table = table_like(table)
    except (ValueError, TypeError) as error:
        raise PartialEmbeddingArgumentError(
            f"{argument}: the table must be a rectangular numeric array, got "
            f"{type(table).__name__} that is not one ({error})"
        ) from None
    try:
        dtype = tf.as_dtype(table.dtype)
    except TypeError:
        dtype = None
    # Floats include bfloat16 and the other ml_dtypes NumPy sees as void.
    if dtype is None or not (dtype.is_floating or dtype.is_integer):
        raise PartialEmbeddingTypeError(
            f"{argument}: the table must hold integers or floats, got dtype {table.dtype}"
        )
    return table


def _mapped_npy(path: str | os.PathLike, argument: str) -> np.ndarray:
    """The ``.npy`` file at ``path``, memory-mapped read-only."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as error:
        raise PartialEmbeddingArgumentError(
            f"{argument}: a path must name a readable .npy file, got {os.fspath(path)!r} ({error})"
        ) from None


def initial_weights(weights: Any, input_dim: int, output_dim: int) -> tuple[Table, RowMask | None]:
    """The table (checked, not read) and the mask (or None) that ``weights`` holds.

    ``weights`` is a table, a one-element list of it, or
    ``[table, trainable_mask]`` as ``get_weights()`` gives; a table may also
    be the path of a ``.npy`` file (``str`` or ``os.PathLike``), which is
    memory-mapped (``np.load(path, mmap_mode="r")``), never read whole.

    Raises:
      PartialEmbeddingArgumentError: a table of another shape than
        ``(input_dim, output_dim)``, ragged, or a mask of the wrong shape.
      PartialEmbeddingTypeError: a table of strings, objects or bools.
    """
    argument = "weights"
    if isinstance(weights, (list, tuple)) and len(weights) == 2:
        table, mask = weights
        mask = ids_to_row_mask(mask, "weights[1]", input_dim)
        argument = "weights[0]"
    else:
        if isinstance(weights, (list, tuple)) and len(weights) == 1:
            weights = weights[0]
        table, mask = weights, None
    if isinstance(table, (str, os.PathLike)):
        table = _mapped_npy(table, argument)
    table = as_table(table, argument)
    expected = (input_dim, output_dim)
    if tuple(table.shape) != expected:
        raise PartialEmbeddingArgumentError(
            f"weights: the table must have shape {expected} (input_dim, "
            f"output_dim), got {tuple(table.shape)}"
        )
    return table, mask
