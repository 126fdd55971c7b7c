"""A masked variable's row mask, as MaskedOptimizer holds it."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)
from partial_embedding.ops import gather_rows, resolve_variable

#: Attribute a layer sets on a Keras variable to make it masked.
ROW_MASK_ATTRIBUTE = "_partial_embedding_row_mask"


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
