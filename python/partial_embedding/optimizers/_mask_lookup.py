"""Which variables a MaskedOptimizer masks: the ``row_masks`` argument read
as ``(key, mask)`` pairs, and whether a key names a variable."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from partial_embedding._internal.row_mask import is_variable_like
from partial_embedding._internal.types import Variable
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError


def normalize_row_masks(row_masks: Any) -> Iterable[tuple[Any, Any]]:
    if row_masks is None:
        return []
    if isinstance(row_masks, Mapping):
        return list(row_masks.items())
    pairs = []
    for pair in row_masks:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise PartialEmbeddingArgumentError(
                "row_masks: expected a mapping or (variable, mask) pairs, got "
                f"an item of type {type(pair).__name__}"
            )
        pairs.append(tuple(pair))
    return pairs


def key_matches(key: Any, variable: Variable, var_key: Callable[[Variable], Any]) -> bool:
    """Whether the ``row_masks`` key ``key`` names ``variable`` (``var_key``:
    the optimizer's key of a variable)."""
    if isinstance(key, str):
        return key in (getattr(variable, "path", None), variable.name)
    if hasattr(key, "deref") and not is_variable_like(key):
        key = key.deref()
    if is_variable_like(key):
        return bool(var_key(key) == var_key(variable))
    raise PartialEmbeddingTypeError(
        "row_masks: a key must be a Keras variable, a tf.Variable, "
        f"variable.ref() or a variable path/name, got {type(key).__name__}"
    )
