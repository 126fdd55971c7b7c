"""A masked variable's row mask, as MaskedOptimizer holds it."""

from __future__ import annotations

import reprlib
import weakref
from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal.variables import gather_rows, resolve_variable
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)

#: The attribute a layer sets on its table variable, pointing to the table's
#: row mask; MaskedOptimizer looks for it to find masked variables without
#: user help. The layer/optimizer contract lives here, on the variable.
ROW_MASK_ATTRIBUTE = "_partial_embedding_row_mask"

#: The attribute a layer with row admission sets on the row mask it gives its
#: table (the admitted rows): its admission state, through which an optimizer
#: finds the rows evicted since its last step (``drain_evicted()``), the
#: candidates (``candidate_values()``) and the ``capacity``.
ADMISSION_ATTRIBUTE = "_partial_embedding_admission"


def admission_of(mask_variable: Any) -> Any:
    """The admission state behind a row-mask variable, or None."""
    if mask_variable is None:
        return None
    return getattr(mask_variable, ADMISSION_ATTRIBUTE, None)


def is_variable_like(value: Any) -> bool:
    return isinstance(value, (tf.Variable, keras.Variable))


def _eager_constant(mask: Any) -> tf.Tensor:
    """``mask`` as an eager bool tensor, made outside any trace.

    The optimizer may resolve its masks while a training step is being traced
    (``fit`` without a strategy builds it there); a constant made in that
    graph could not be used by a later trace (``train_on_batch``, a
    recompiled ``fit``, a second input signature). An eager tensor is
    captured by each trace instead. A symbolic tensor stays as given.
    """
    if tf.is_symbolic_tensor(mask):
        return tf.convert_to_tensor(mask, dtype=tf.bool)
    with tf.init_scope():
        return tf.convert_to_tensor(mask, dtype=tf.bool)


class RowMask:
    """A variable's row mask: a bool variable (changeable at run time), or a
    fixed tensor or NumPy array (held as an eager tensor)."""

    def __init__(self, mask: Any, variable: Any) -> None:
        if is_variable_like(mask):
            self._variable = resolve_variable(mask, argument="row mask")
            dtype, shape = self._variable.dtype, self._variable.shape
        else:
            self._variable = None
            dtype = tf.as_dtype(getattr(mask, "dtype", tf.bool))
            self._constant = _eager_constant(mask) if dtype == tf.bool else None
            shape = tf.TensorShape(getattr(mask, "shape", np.shape(mask)))
        name = getattr(variable, "path", None) or getattr(variable, "name", "?")
        if dtype != tf.bool:
            raise PartialEmbeddingTypeError(
                f"row mask of variable {name}: dtype {tf.as_dtype(dtype).name} must be bool"
            )
        num_rows = variable.shape[0] if len(variable.shape) else None
        if shape.rank != 1 or (
            num_rows is not None and shape[0] is not None and shape[0] != num_rows
        ):
            raise PartialEmbeddingArgumentError(
                f"row mask of variable {name}: shape {shape} must be "
                f"[{num_rows}] (one entry per row of the variable of shape "
                f"{tuple(variable.shape)})"
            )

    def gather(self, rows: tf.Tensor) -> tf.Tensor:
        if self._variable is not None:
            return gather_rows(self._variable, rows)
        return tf.gather(self._constant, rows)

    @property
    def variable(self) -> tf.Variable | None:
        """The mask's variable, or None for a fixed mask."""
        return self._variable

    def values(self) -> np.ndarray | None:
        """The mask now, read eagerly as a NumPy bool array; None for a mask
        given as a symbolic tensor."""
        if self._variable is None and tf.is_symbolic_tensor(self._constant):
            return None
        with tf.init_scope():
            source: Any = (
                self._variable.read_value() if self._variable is not None else self._constant
            )
            return np.asarray(source.numpy(), dtype=bool)

    def count_permitted(self) -> int | None:
        """How many rows the mask permits now (read eagerly); None for a
        mask given as a symbolic tensor, which has no value yet."""
        if self._variable is None and tf.is_symbolic_tensor(self._constant):
            return None
        with tf.init_scope():
            if self._variable is not None:
                values = self._variable.read_value()
            else:
                values = self._constant
            # NumPy counts the bools in place (tf.math.count_nonzero would
            # make two [V] temporaries, one of int64).
            return int(np.count_nonzero(values.numpy()))

    def full(self) -> tf.Tensor:
        """The whole mask; a variable read aliases its buffer (no copy)."""
        if self._variable is not None:
            return self._variable.value()
        return self._constant


# -- ids -> mask ---------------------------------------------------------------


def as_array(ids: Any) -> np.ndarray:
    if isinstance(ids, (tf.Tensor, tf.Variable)) or hasattr(ids, "numpy"):
        return np.asarray(ids.numpy())
    if isinstance(ids, (set, frozenset, range)) or (
        isinstance(ids, Iterable) and not isinstance(ids, (list, tuple, np.ndarray))
    ):
        ids = list(ids)
    return np.asarray(ids)


def ids_to_row_mask(ids: Any, argument: str, input_dim: int) -> np.ndarray:
    """Turns row ids (or a bool mask of shape [input_dim]) into a bool mask.

    Raises:
      PartialEmbeddingArgumentError: an id outside [0, input_dim), or a bool
        mask of the wrong shape (a ``ValueError``).
      PartialEmbeddingTypeError: ids that are not integers.
    """
    if ids is None:
        raise PartialEmbeddingArgumentError(
            f"{argument}: expected row ids (integers in [0, {input_dim})) or a "
            f"bool mask of shape ({input_dim},), got None"
        )
    try:
        array = as_array(ids)
    except ValueError:
        raise PartialEmbeddingArgumentError(
            f"{argument}: expected row ids (integers in [0, {input_dim})) or a bool mask of "
            f"shape ({input_dim},); got a ragged nesting, {argument}={reprlib.repr(ids)}"
        ) from None
    if array.dtype == np.bool_:
        if array.shape != (input_dim,):
            raise PartialEmbeddingArgumentError(
                f"{argument}: a bool mask must have shape ({input_dim},) (one "
                f"entry per row), got shape {array.shape}"
            )
        return array.copy()
    if array.size == 0:
        return np.zeros([input_dim], dtype=bool)
    if not np.issubdtype(array.dtype, np.integer):
        raise PartialEmbeddingTypeError(
            f"{argument}: row ids must be integers (or a bool mask of shape "
            f"({input_dim},)), got dtype {array.dtype}"
        )
    flat = array.reshape(-1)
    outside = np.flatnonzero((flat < 0) | (flat >= input_dim))
    if outside.size:
        position = int(outside[0])
        raise PartialEmbeddingArgumentError(
            f"{argument}: id {int(flat[position])} (at position {position}) is "
            f"not in [0, {input_dim}); {outside.size} of {flat.size} ids are "
            "outside"
        )
    mask = np.zeros([input_dim], dtype=bool)
    mask[flat] = True
    return mask


# -- the mask-change observer -----------------------------------------------------
#
# A layer that changes a mask variable eagerly (freeze, unfreeze,
# set_trainable_ids) calls mask_changed; whatever keeps per-row state for the
# rows that mask permits (an optimizer's compact slots) registers a callback
# with watch_mask. Neither side imports the other.

# id(mask variable) -> (the variable, callbacks keyed by their owner), all held
# weakly: a watcher that is gone is dropped.
_WATCHERS: dict[int, tuple[weakref.ref[Any], list[weakref.ref[Any]]]] = {}


def watch_mask(mask_variable: Any, watcher: Any) -> None:
    """Registers ``watcher`` (an object with a ``mask_changed(mask_variable)``
    method, held weakly) to be told when ``mask_variable`` changes."""
    for key in [k for k, (v, _) in _WATCHERS.items() if v() is None]:
        del _WATCHERS[key]
    entry = _WATCHERS.get(id(mask_variable))
    if entry is None or entry[0]() is not mask_variable:
        entry = (weakref.ref(mask_variable), [])
        _WATCHERS[id(mask_variable)] = entry
    entry[1][:] = [w for w in entry[1] if w() is not None and w() is not watcher]
    entry[1].append(weakref.ref(watcher))


def mask_changed(mask_variable: Any) -> None:
    """Called eagerly after ``mask_variable`` changed: tells every watcher
    registered with :func:`watch_mask` for it."""
    try:
        variable = resolve_variable(mask_variable, argument="row mask")
    except PartialEmbeddingTypeError:  # Not a single variable: none is watched.
        return
    entry = _WATCHERS.get(id(variable))
    if entry is None or entry[0]() is not variable:
        return
    for watcher in [w() for w in entry[1]]:
        if watcher is not None:
            watcher.mask_changed(variable)
