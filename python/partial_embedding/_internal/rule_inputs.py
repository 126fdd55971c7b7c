"""The fused rules' inputs, checked: what the op wrappers (``ops/fused.py``)
and the XLA custom call (``ops/xla_custom_call.py``) both build before
calling their kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from partial_embedding._internal.checks import (
    check_dtype_matches,
    index_tensor,
    shape_text,
    to_tensor_keeping_dtype,
)
from partial_embedding._internal.rule_table import KernelRule
from partial_embedding.errors import PartialEmbeddingArgumentError

__all__ = [
    "adam_hyperparameters",
    "rule_hyperparameters",
    "slot_index_tensor",
]


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


def rule_hyperparameters(rule: KernelRule, dtype: tf.DType, values: Mapping[str, Any]) -> tf.Tensor:
    """The kernel's vector of ``rule``'s hyperparameters in ``dtype``, in the
    table's order: Python numbers round once, tensors are cast; a missing
    ``weight_decay`` is 0. Unknown or missing names are refused."""
    if not isinstance(values, Mapping):
        raise PartialEmbeddingArgumentError(
            f"hyperparameters: {type(values).__name__} given; pass a mapping of "
            f"{', '.join(rule.hyperparameters)}"
        )
    values = {"weight_decay": 0.0, **values}
    unknown = sorted(set(values) - set(rule.hyperparameters))
    missing = [name for name in rule.hyperparameters if name not in values]
    if unknown or missing:
        raise PartialEmbeddingArgumentError(
            f"hyperparameters: rule {rule.name!r} takes {', '.join(rule.hyperparameters)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    scalars = _checked_scalars(
        **{name: _hyperparameter(values[name], dtype) for name in rule.hyperparameters}
    )
    return tf.stack(list(scalars.values()))


def adam_hyperparameters(
    learning_rate: Any, beta_1: Any, beta_2: Any, epsilon: Any, alpha: Any, weight_decay: Any
) -> dict[str, Any]:
    """Adam's hyperparameters by the table's names, ``1 - beta`` computed as
    Keras' rules compute it (in Python for Python numbers)."""
    return {
        "learning_rate": learning_rate,
        "weight_decay": weight_decay,
        "one_minus_beta_1": complement(beta_1),
        "one_minus_beta_2": complement(beta_2),
        "epsilon": epsilon,
        "alpha": alpha,
    }


def complement(value: Any) -> Any:
    """``1 - value``: in Python for a Python number (Keras' rules round the
    difference once), else as a tensor op in the value's dtype."""
    if isinstance(value, (int, float)):
        return 1 - value
    return 1 - tf.convert_to_tensor(value)
