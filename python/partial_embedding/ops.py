"""TensorFlow ops of partial_embedding: thin, validated wrappers.

Nothing here imports Keras; Keras variables are recognised by duck typing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._loader import load_ops
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)

__all__ = ["masked_scatter_sub", "resolve_variable"]

SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
INDEX_DTYPES = (tf.int32, tf.int64)


def resolve_variable(ref: Any, argument: str = "ref") -> tf.Variable:
    """Returns the resource-backed ``tf.Variable`` behind ``ref``.

    Accepts a ``tf.Variable`` (resource variable) or a Keras 3 variable on the
    TensorFlow backend, whose ``tf.Variable`` this returns.

    Raises:
      PartialEmbeddingTypeError: ``ref`` is not such a variable.
    """
    candidate = ref
    # A Keras 3 variable keeps its tf.Variable in `_value` (`.value` may be an
    # autocast tensor inside a mixed-precision scope).
    inner = getattr(ref, "_value", None)
    if isinstance(inner, tf.Variable):
        candidate = inner
    if isinstance(candidate, tf.Variable) and hasattr(candidate, "handle"):
        try:
            handle = candidate.handle
        except (AttributeError, ValueError, TypeError):
            handle = None
        if handle is not None and handle.dtype == tf.resource:
            return candidate
    raise PartialEmbeddingTypeError(
        f"{argument}: expected a resource tf.Variable or a Keras variable, got "
        f"{type(ref).__name__}"
    )


def _to_tensor_keeping_dtype(value: Any, default_dtype: tf.DType) -> tf.Tensor:
    """Converts `value`; python scalars and lists take `default_dtype`."""
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray, np.generic)) or hasattr(
        value, "dtype"
    ):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value, dtype=default_dtype)


def masked_scatter_sub(
    ref: Any,
    indices: Any,
    updates: Any,
    row_mask: Any,
    use_locking: bool = True,
    name: str | None = None,
) -> tf.Operation | None:
    """Subtracts ``updates`` from the permitted rows of ``ref``, in place.

    For every position ``i`` of ``indices``::

        if row_mask[indices[i]]:
            ref[indices[i], ...] -= updates[i, ...]

    Rows whose mask is false are never written, bit for bit. Duplicate indices
    accumulate. Every index is checked against ``[0, V)`` before anything is
    written, also where its row is frozen. The variable's buffer is updated in
    place (copied only if a reader still holds it) and is not switched into
    copy-on-read mode, so later full reads stay cheap.

    Args:
      ref: A ``tf.Variable`` or Keras 3 variable of rank >= 1 with ``V`` rows,
        of dtype float16, bfloat16, float32 or float64.
      indices: int32 or int64 row numbers, any shape.
      updates: ``indices.shape + ref.shape[1:]``, of ``ref``'s dtype.
      row_mask: bool, shape ``[V]``: a tensor, array or ``tf.Variable``; true
        where a row may be written.
      use_locking: If true (the default), the variable's lock is held
        exclusively for the whole update. If false, validation and any copy
        happen under the exclusive lock and the write under the shared lock:
        concurrent unlocked updates of the same row may interleave and lose
        increments (Hogwild-style).
      name: A name for the operation.

    Returns:
      The operation in graph mode (``tf.compat.v1``); ``None`` eagerly.

    Raises:
      PartialEmbeddingArgumentError: (a ``ValueError`` and a
        ``tf.errors.InvalidArgumentError``) a shape or dtype that is wrong
        before running. Nothing is written.
      tf.errors.InvalidArgumentError: at run time, an index outside
        ``[0, V)``, naming its position and value. Nothing is written.
      tf.errors.FailedPreconditionError or tf.errors.NotFoundError: the
        variable is not initialized.

    >>> import tensorflow as tf, partial_embedding as pe
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    >>> pe.masked_scatter_sub(table, [0, 1, 1], tf.ones([3, 2]),
    ...                       row_mask=[True, False, True])
    >>> table.numpy().tolist()
    [[0.0, 0.0], [2.0, 2.0], [3.0, 3.0]]
    """
    variable = resolve_variable(ref)
    var_dtype = variable.dtype.base_dtype
    if var_dtype not in SUPPORTED_DTYPES:
        raise PartialEmbeddingTypeError(
            f"ref: dtype {var_dtype.name} is not supported; use float16, "
            "bfloat16, float32 or float64"
        )
    with tf.name_scope(name or "masked_scatter_sub"):
        indices = tf.convert_to_tensor(indices)
        if indices.dtype not in INDEX_DTYPES:
            raise PartialEmbeddingTypeError(
                f"indices: dtype {indices.dtype.name} is not an index type; use "
                "int32 or int64"
            )
        updates = _to_tensor_keeping_dtype(updates, var_dtype)
        if updates.dtype != var_dtype:
            raise PartialEmbeddingTypeError(
                f"updates: dtype {updates.dtype.name} does not match the "
                f"variable's dtype {var_dtype.name}"
            )
        row_mask = _to_tensor_keeping_dtype(row_mask, tf.bool)
        if row_mask.dtype != tf.bool:
            raise PartialEmbeddingTypeError(
                f"row_mask: dtype {row_mask.dtype.name} must be bool"
            )
        _check_static_shapes(variable.shape, indices.shape, updates.shape, row_mask.shape)
        return load_ops().partial_embedding_masked_scatter_sub(
            resource=variable.handle,
            indices=indices,
            updates=updates,
            row_mask=row_mask,
            use_locking=use_locking,
        )


def _check_static_shapes(
    var_shape: tf.TensorShape,
    indices_shape: tf.TensorShape,
    updates_shape: tf.TensorShape,
    mask_shape: tf.TensorShape,
) -> None:
    """Raises for shapes that are already known to be wrong."""
    if var_shape.rank is not None and var_shape.rank < 1:
        raise PartialEmbeddingArgumentError(
            f"ref: the variable must have rank >= 1, got shape {var_shape}"
        )
    if mask_shape.rank is not None and mask_shape.rank != 1:
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {mask_shape} must be [V] (rank 1)"
        )
    if var_shape.rank is None:
        return
    num_rows = var_shape[0]
    if mask_shape.rank == 1 and not mask_shape.is_compatible_with([num_rows]):
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {mask_shape} must be [{num_rows}] (one entry per "
            f"row of the variable of shape {var_shape})"
        )
    if indices_shape.rank is not None:
        expected = indices_shape.concatenate(var_shape[1:])
        if not updates_shape.is_compatible_with(expected):
            raise PartialEmbeddingArgumentError(
                f"updates: shape {updates_shape} must be {expected} "
                f"(indices.shape + variable.shape[1:]) for indices of shape "
                f"{indices_shape} and a variable of shape {var_shape}"
            )
