"""Which variables a MaskedOptimizer masks, and by what: the ``row_masks``
argument read as ``(key, mask)`` pairs, whether a key names a variable, and
each trained variable's mask (its own, as a ``PartialEmbedding`` attaches
it, or one given in ``row_masks`` or to ``set_row_mask``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from partial_embedding._internal import framework_private
from partial_embedding._internal.row_mask import ROW_MASK_ATTRIBUTE, RowMask, is_variable_like
from partial_embedding._internal.types import RowMask as RowMaskLike
from partial_embedding._internal.types import Variable
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.optimizers import _sharded as sharded
from partial_embedding.optimizers._compact_slots import CompactSlots
from partial_embedding.optimizers._slot_store import SlotStore


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


class MaskLookup:
    """The masks of the variables a ``MaskedOptimizer`` trains (a mixin of
    it, which sets the attributes below; ``_watch_mask_of`` comes from its
    ``build``)."""

    built: bool
    _requested_masks: list[tuple[Any, Any]]
    _row_masks: dict[Any, RowMask]
    _slot_store: SlotStore
    _key: Callable[[Any], Any]
    _watch_mask_of: Callable[[Any, CompactSlots], None]

    def set_row_mask(self, variable: Variable, row_mask: RowMaskLike) -> None:
        """Makes ``variable`` masked by ``row_mask`` (bool ``[V]``).

        Call it before the first training step (or before ``fit`` builds its
        train function): a traced step keeps the variables it was traced
        with. To change which rows are permitted later, assign to the mask
        variable instead.
        """
        self._requested_masks.append((variable, row_mask))
        if self.built:
            self._resolve_masks(framework_private.trainable_variables(self))
            for key, slots in self._slot_store.compact.items():
                self._watch_mask_of(key, slots)

    def _resolve_masks(self, var_list: list[Any]) -> None:
        for variable in var_list:
            attached = getattr(variable, ROW_MASK_ATTRIBUTE, None)
            if attached is not None:
                self._row_masks[self._key(variable)] = sharded.row_mask_for(attached, variable)
        for key, mask in self._requested_masks:
            found = [v for v in var_list if key_matches(key, v, self._key)]
            if not found:
                warnings.warn(
                    "MaskedOptimizer: a variable in row_masks is not among the "
                    "variables this optimizer trains; its mask is ignored",
                    stacklevel=3,
                )
            for variable in found:
                self._row_masks[self._key(variable)] = sharded.row_mask_for(mask, variable)
        for variable in var_list:
            if self._key(variable) in self._row_masks:
                if len(variable.shape) < 1:
                    raise PartialEmbeddingArgumentError(
                        f"MaskedOptimizer: masked variable {variable.name} must have rank >= 1"
                    )

    def _row_mask_of(self, variable: Any) -> RowMask | None:
        key = self._key(variable)
        if key not in self._row_masks:
            attached = getattr(variable, ROW_MASK_ATTRIBUTE, None)
            if attached is not None:
                self._row_masks[key] = sharded.row_mask_for(attached, variable)
        return self._row_masks.get(key)

    def is_masked(self, variable: Variable) -> bool:
        """Whether ``variable`` is trained row by row under a mask."""
        return self._row_mask_of(variable) is not None
