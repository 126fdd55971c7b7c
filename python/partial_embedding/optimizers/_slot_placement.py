"""MaskedOptimizer's ``build``: where each variable's slots live.

The wrapped optimizer makes full-size slots for the variables it keeps; a
masked table split by a ``variable_partitioner`` gets slots per shard, and a
masked table of which few rows are permitted gets compact slots (see
``compact_slots``), which follow its mask as it changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.row_mask import RowMask, admission_of, watch_mask
from partial_embedding._internal.types import KerasOptimizer, Variable
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.optimizers import _cluster as cluster
from partial_embedding.optimizers import _row_rules as row_rules
from partial_embedding.optimizers import _sharded as sharded
from partial_embedding.optimizers import _slot_store as slot_store
from partial_embedding.optimizers._compact_slots import MAX_SLOT_ROWS, CompactSlots, fixed_slot_rows
from partial_embedding.optimizers._slot_store import SlotStore, variable_path


class SlotPlacement:
    """``build`` and the compact-slot choices it makes (a mixin of
    ``MaskedOptimizer``, which sets the attributes below)."""

    name: str
    inner_optimizer: KerasOptimizer
    compact_slots: bool | str
    slot_capacity: int | None
    _base_optimizer: KerasOptimizer
    _row_rule: row_rules.RowRule
    _row_masks: dict[Any, RowMask]
    _saved_compact_indices: list[int] | None
    _slot_store: SlotStore
    _key: Callable[[Any], Any]
    _resolve_masks: Callable[[list[Any]], None]

    @framework_private.no_automatic_dependency_tracking
    def build(self, var_list: list[Variable]) -> None:
        """Finds the masked variables, then makes every slot: the wrapped
        optimizer's full-size ones for the variables it keeps, each shard's
        for a sharded table, compact ones for the others that get them."""
        var_list = list(var_list)
        slot_store.check_compact_indices(self._saved_compact_indices, len(var_list))
        cluster.check_in_process_servers(tf.distribute.get_strategy())
        self._resolve_masks(var_list)
        compact = [v for i, v in enumerate(var_list) if self._wants_compact_slots(v, i)]
        # A masked ShardedVariable table gets slots per shard, made here.
        shard_tables = [
            v for v in var_list if self._key(v) in self._row_masks and sharded.is_sharded(v)
        ]
        own_keys = {self._key(v) for v in compact + shard_tables}
        # The wrapped optimizer makes full-size slots for the others only.
        full_size = [v for v in var_list if self._key(v) not in own_keys]
        self.inner_optimizer.build(full_size)
        framework_private.check_built(self.inner_optimizer)
        slot_store.follow_growth(self, full_size)
        super().build(var_list)  # type: ignore[misc]
        compact_keys = {self._key(v) for v in compact}
        specs = self._row_rule.slots(self._base_optimizer)
        for table in shard_tables:
            key = self._key(table)
            self._slot_store.create_shard_slots(
                key,
                table,
                specs,
                compact=key in compact_keys,
                capacity=self.slot_capacity,
                row_mask=self._row_masks[key],
                name=f"{self.name}/{variable_path(table)}",
            )
        for variable in compact:
            if not sharded.is_sharded(variable):
                self._create_compact_slots(variable)

    def _create_compact_slots(self, variable: Variable) -> None:
        """Compact slots for ``variable``, watching its mask. Not among
        ``variables`` (Keras counts and names those, and the slots' row
        count is not static); saved with them all the same."""
        key = self._key(variable)
        fixed_rows = self._fixed_slot_rows(variable)
        admission = admission_of(self._row_masks[key].variable)
        slots = self._slot_store.create_compact_slots(
            key,
            variable,
            self._row_rule.slots(self._base_optimizer),
            self._initial_slot_rows(variable) if fixed_rows is None else fixed_rows,
            name=f"{self.name}/{variable_path(variable)}",
            fixed_capacity=fixed_rows is not None,
            recycles=admission is not None and admission.capacity is not None,
        )
        self._watch_mask_of(key, slots)

    def _wants_compact_slots(self, variable: Variable, position: int) -> bool:
        """Whether ``variable`` (at ``position`` in the built list) gets
        compact slots (see ``compact_slots``)."""
        mask = self._row_masks.get(self._key(variable))
        if mask is None or not self._row_rule.slots(self._base_optimizer):
            return False
        if self._saved_compact_indices is not None:
            return position in self._saved_compact_indices
        if self.compact_slots == "auto":
            permitted = mask.count_permitted()
            return permitted is not None and 2 * permitted <= int(variable.shape[0])
        return bool(self.compact_slots)

    def _initial_slot_rows(self, variable: Variable) -> int:
        if self.slot_capacity is not None:
            return int(self.slot_capacity)
        if self._saved_compact_indices is not None:
            return 1  # A model being loaded: its saved slots replace these.
        permitted = self._row_masks[self._key(variable)].count_permitted()
        return min(max(permitted or 1, 1), MAX_SLOT_ROWS)

    def _watch_mask_of(self, key: Any, slots: CompactSlots) -> None:
        """Lets changes of the mask of the variable ``key`` reserve room in its
        compact ``slots`` (see ``mask_changed``), and reserves it now if a
        step was traced for XLA."""
        mask = self._row_masks[key]
        if mask.variable is not None:
            watch_mask(mask.variable, slots)
        if slots.used_under_xla:
            slot_store.reserve_slot_rows(slots, mask)

    def _fixed_slot_rows(self, variable: Variable) -> int | None:
        """The fixed slot rows of ``variable``'s compact slots where they
        cannot grow (on a parameter server, see ``_cluster``); else None."""
        if not cluster.needs_fixed_capacity(variable):
            return None
        mask = self._row_masks[self._key(variable)]
        admission = admission_of(mask.variable)
        if admission is not None:
            # Rows are admitted inside steps: room for all that may be.
            most = admission.capacity
            if most is None:
                most = int(np.count_nonzero(admission.candidate_values()))
            if self.slot_capacity is not None and self.slot_capacity < most:
                raise PartialEmbeddingArgumentError(
                    f"slot_capacity: {self.slot_capacity} slot rows on a parameter server "
                    f"cannot hold the {most} rows the row admission of {variable_path(variable)} "
                    f"may admit at once (capacity={admission.capacity}); pass slot_capacity "
                    f">= {most}, or a smaller capacity"
                )
            return fixed_slot_rows(most, self.slot_capacity or most)
        permitted = mask.count_permitted() or 0
        return fixed_slot_rows(permitted, self.slot_capacity)

    def compact_slot_rows(self, variable: Variable) -> int | None:
        """How many slot rows ``variable``'s compact slots use now: one per
        permitted row that a step has updated (frozen or not since); None
        without compact slots (not masked, full-size slots, or not built)."""
        return self._slot_store.compact_slot_rows(self._key(variable))

    def has_compact_slots(self, variable: Variable) -> bool:
        """Whether ``variable``'s optimizer slots hold only its trained rows."""
        return self._slot_store.has_compact_slots(self._key(variable))
