"""A table's regularizer and constraint, restricted to the rows its mask permits."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from partial_embedding._internal.types import RowMask, TensorLike
from partial_embedding.ops import entry_stop_gradients


def _broadcastable_row_mask(row_mask: RowMask, rank: int) -> tf.Tensor:
    mask = tf.convert_to_tensor(row_mask)
    return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([rank - 1], tf.int32)], 0))


class RowMaskedRegularizer(keras.regularizers.Regularizer):
    """Applies a regularizer whose gradient reaches permitted rows only.

    The penalty is computed over the whole table (as in Keras), so it is a
    per-step pass over the vocabulary; frozen rows get an exact zero gradient.
    A ``keras.regularizers.Regularizer`` (Keras 3.13 and 3.14 accept nothing
    else as a variable's regularizer); its config is the wrapped one's.
    """

    def __init__(self, regularizer: Any, row_mask: RowMask) -> None:
        self.regularizer = regularizer
        self.row_mask = row_mask

    def __call__(self, table: TensorLike) -> Any:
        table = tf.convert_to_tensor(table)
        mask = _broadcastable_row_mask(self.row_mask, table.shape.rank)
        return self.regularizer(entry_stop_gradients(table, mask))

    def get_config(self) -> dict[str, Any]:
        return dict(keras.regularizers.serialize(self.regularizer))


class RowMaskedConstraint:
    """Applies a constraint to permitted rows; frozen rows are left as they are.

    It stands in for the user's constraint on the embeddings variable, where
    every Keras optimizer calls it after a step, so it presents itself as that
    constraint: ``isinstance``, ``==``, ``hash``, ``get_config`` and attribute
    reads answer as the wrapped object would. Only the call differs (it keeps
    frozen rows). ``wrapped`` is the user's object itself.
    """

    def __init__(self, constraint: Any, row_mask: RowMask) -> None:
        self.wrapped = constraint
        self.row_mask = row_mask

    def __call__(self, table: TensorLike) -> tf.Tensor:
        table = tf.convert_to_tensor(table)
        mask = _broadcastable_row_mask(self.row_mask, table.shape.rank)
        return tf.where(mask, self.wrapped(table), table)

    # Kept for code that read the wrapped constraint under its old name.
    @property
    def constraint(self) -> Any:
        return self.wrapped

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self.wrapped)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class lacks (max_value, axis, ...).
        if name in ("wrapped", "row_mask"):
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowMaskedConstraint):
            other = other.wrapped
        return bool(self.wrapped == other)

    def __hash__(self) -> int:
        return hash(self.wrapped)

    def __repr__(self) -> str:
        return repr(self.wrapped)

    def __reduce__(self) -> tuple:
        # pickle and copy would otherwise build the wrapped class from ours.
        return (RowMaskedConstraint, (self.wrapped, self.row_mask))

    def get_config(self) -> Any:
        return self.wrapped.get_config()
