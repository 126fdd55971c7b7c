"""The fused Adam step's inputs, checked: what the op wrapper
(``ops/fused.py``) and the XLA custom call (``ops/xla_custom_call.py``) both
build before calling their kernel.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from partial_embedding._internal.checks import (
    check_dtype_matches,
    index_tensor,
    shape_text,
    to_tensor_keeping_dtype,
)
from partial_embedding.errors import PartialEmbeddingArgumentError

__all__ = ["adam_scalars", "slot_index_tensor"]


def adam_scalars(
    dtype: tf.DType,
    learning_rate: Any,
    beta_1: Any,
    beta_2: Any,
    epsilon: Any,
    alpha: Any,
    weight_decay: Any,
) -> dict[str, tf.Tensor]:
    """The fused Adam kernel's scalar inputs (the op's and the XLA custom
    call's), in the table's dtype, checked."""
    return _checked_scalars(
        learning_rate=_hyperparameter(learning_rate, dtype),
        one_minus_beta_1=_complement(beta_1, dtype),
        one_minus_beta_2=_complement(beta_2, dtype),
        epsilon=_hyperparameter(epsilon, dtype),
        alpha=_hyperparameter(alpha, dtype),
        weight_decay=_hyperparameter(weight_decay, dtype),
    )


def slot_index_tensor(slot_indices: Any, indices: tf.Tensor) -> tf.Tensor:
    """``slot_indices`` as a tensor of ``indices``' dtype and shape (Python
    lists take that dtype; anything else must already have it)."""
    tensor = index_tensor(to_tensor_keeping_dtype(slot_indices, indices.dtype), "slot_indices")
    check_dtype_matches("slot_indices", tensor.dtype, indices.dtype, "indices'")
    if not tensor.shape.is_compatible_with(indices.shape):
        raise PartialEmbeddingArgumentError(
            f"slot_indices: shape {shape_text(tensor.shape)} does not match indices' "
            f"shape {shape_text(indices.shape)}"
        )
    return tensor


def _checked_scalars(**scalars: tf.Tensor) -> dict[str, tf.Tensor]:
    """The kernel's scalar inputs, once each is known to be a scalar."""
    for argument, scalar in scalars.items():
        if scalar.shape.rank is not None and scalar.shape.rank != 0:
            raise PartialEmbeddingArgumentError(
                f"{argument}: shape {shape_text(scalar.shape)} must be a scalar"
            )
    return scalars


def _hyperparameter(value: Any, dtype: tf.DType) -> tf.Tensor:
    """A scalar of ``dtype``: Python numbers round once, tensors are cast."""
    if isinstance(value, (int, float)):
        return tf.convert_to_tensor(value, dtype=dtype)
    return tf.cast(value, dtype)


def _complement(beta: Any, dtype: tf.DType) -> tf.Tensor:
    """``1 - beta`` as Keras' rules compute it: in Python for Python numbers."""
    if isinstance(beta, (int, float)):
        return tf.convert_to_tensor(1 - beta, dtype=dtype)
    return 1 - tf.cast(beta, dtype)
