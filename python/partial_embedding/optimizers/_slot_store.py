"""The optimizer slots MaskedOptimizer makes itself, and reading or writing
any slot's rows whatever its layout.

Keras' own optimizer keeps full-size slots for the variables it builds.
``MaskedOptimizer`` keeps the others in a :class:`SlotStore`:

* compact slots (``_compact_slots.CompactSlots``) of a masked variable;
* a sharded table's per-shard slots (``_sharded.ShardedSlots``), full-size or
  compact, on each shard's parameter server;
* under XLA, each masked variable's int64 ``[V + 1]`` scratch for summing
  duplicate rows without a sort (never saved: its values never outlive a
  step).

A ``SlotStore`` is a plain object, so neither Keras nor TensorFlow tracks
what it holds: the optimizer tracks its two :class:`SlotVariableState`
containers (``compact_state``, ``shard_state``) under attributes of its own,
which fixes the checkpoint keys, and nothing tracks the XLA scratch.

:class:`SlotPart` describes where a variable's rows keep a slot's values
(one part, or one per shard), which is all that :func:`read_slot_rows`,
:func:`slot_rows_present` and :func:`write_slot_rows` need.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.growable import GrowWithMask, is_growable, make_growable
from partial_embedding._internal.row_mask import RowMask, admission_of, watch_mask
from partial_embedding._internal.types import Variable
from partial_embedding._internal.variables import (
    assign_host_rows,
    read_host_rows,
    resolve_variable,
)
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.optimizers import _sharded as sharded
from partial_embedding.optimizers._compact_slots import (
    MAX_SLOT_ROWS,
    CompactSlots,
    SlotSpec,
    SlotVariableState,
    reset_rows,
)

#: The values ``compact_slots`` takes.
COMPACT_SLOTS_CHOICES = ("auto", True, False)

#: Key prefix of the compact slots in a Keras variable store (``.keras``).
COMPACT_KEY = "compact_"


class SlotPart(NamedTuple):
    """Where the rows ``[start, stop)`` of a table keep one slot's values.

    ``slot`` holds them by row (less ``start``) unless ``compact`` is set:
    then ``slot`` holds slot rows, found through ``compact.slot_of_row``.
    """

    start: int
    stop: int
    slot: tf.Variable
    compact: CompactSlots | None


class SlotStore:
    """The slots a ``MaskedOptimizer`` owns, keyed by the optimizer's
    variable key (the same for every copy of a mirrored variable)."""

    def __init__(self) -> None:
        self.compact: dict[Any, CompactSlots] = {}
        #: The compact slots' variables, in build order (saved by position).
        self.compact_variables: list[tf.Variable] = []
        self.compact_state = SlotVariableState("compact_slots")
        self.sharded: dict[Any, sharded.ShardedSlots] = {}
        self.shard_variables: list[tf.Variable] = []
        self.shard_state = SlotVariableState("shard_slots")
        self.xla_owner_maps: dict[Any, tf.Variable] = {}
        #: Watchers growing full-size slots with their table (held here:
        #: the mask observer holds them weakly).
        self.growth_watchers: list[Any] = []

    def all_compact_slots(self) -> list[CompactSlots]:
        """Every compact slots object: whole tables' and each shard's."""
        shard_slots = [c for s in self.sharded.values() for c in s.compact if c is not None]
        return [*self.compact.values(), *shard_slots]

    def skipped_updates(self) -> int:
        """Row updates XLA steps skipped for want of a free slot row, so far.

        Only slots a step has used under XLA can have skipped any: the others'
        counters are not read (an eager ``apply`` asks every step, and each
        read waits for the device)."""
        return sum(
            slots.skipped_update_count()
            for slots in self.all_compact_slots()
            if slots.used_under_xla
        )

    def create_compact_slots(
        self,
        key: Any,
        variable: Variable,
        specs: tuple[SlotSpec, ...],
        capacity: int,
        name: str,
        fixed_capacity: bool = False,
        recycles: bool = False,
    ) -> CompactSlots:
        """Makes and keeps ``variable``'s compact slots (growable, unless
        ``fixed_capacity``: a variable on a parameter server; giving slot rows
        back with ``recycles``)."""
        slots = CompactSlots(
            variable,
            specs,
            capacity,
            name=name,
            fixed_capacity=fixed_capacity,
            recycles=recycles,
        )
        self.compact[key] = slots
        for slot_variable in slots.variables:
            self.compact_state.track(slot_variable)
            self.compact_variables.append(slot_variable)
        return slots

    def create_shard_slots(
        self,
        key: Any,
        table: Variable,
        specs: tuple[SlotSpec, ...],
        compact: bool,
        capacity: int | None,
        row_mask: RowMask,
        name: str,
    ) -> None:
        """Makes and keeps each shard's slots of the sharded ``table``."""
        sharded.check_constraint(table)
        slots = sharded.ShardedSlots(
            table,
            specs,
            compact=compact,
            capacity=capacity,
            row_mask=row_mask,  # type: ignore[arg-type]
            name=name,
        )
        self.sharded[key] = slots
        for slot_variable in slots.variables:
            self.shard_state.track(slot_variable)
            self.shard_variables.append(slot_variable)

    def xla_owner_map(self, key: Any, variable: Variable) -> tf.Variable | None:
        """``variable``'s int64 ``[V + 1]`` scratch for deduplicating without
        a sort under XLA (made once, eagerly, next to it); None for a table
        of unknown size or one distributed over devices."""
        if key not in self.xla_owner_maps:
            try:
                target = resolve_variable(variable)
            except PartialEmbeddingTypeError:
                return None
            num_rows = target.shape[0] if target.shape.rank else None
            if num_rows is None or tf.distribute.has_strategy():
                return None
            with tf.init_scope(), tf.device(target.device):
                self.xla_owner_maps[key] = tf.Variable(
                    tf.zeros([num_rows + 1], tf.int64),
                    trainable=False,
                    name="xla_owner_map",
                )
        return self.xla_owner_maps[key]

    def reserve_for_xla(self, key: Any, mask: RowMask) -> None:
        """While a step is traced for XLA (which cannot grow compact slots
        inside it): room, now, for every permitted row without a slot row."""
        slots = self.compact.get(key)
        if slots is not None:
            slots.used_under_xla = True
            reserve_slot_rows(slots, mask)

    def has_compact_slots(self, key: Any) -> bool:
        shard_slots = self.sharded.get(key)
        if shard_slots is not None:
            return shard_slots.is_compact
        return key in self.compact

    def compact_slot_rows(self, key: Any) -> int | None:
        shard_slots = self.sharded.get(key)
        if shard_slots is not None:
            return shard_slots.slot_rows_used() if shard_slots.is_compact else None
        slots = self.compact.get(key)
        return None if slots is None else int(slots.rows_in_use().numpy())

    def parts(
        self, key: Any, variable: Variable, name: str, keras_slot: Callable[[], tf.Variable]
    ) -> list[SlotPart]:
        """Where ``variable``'s rows keep the slot ``name``; ``keras_slot``
        gives the wrapped optimizer's own (full-size) slot."""
        num_rows = int(variable.shape[0])
        shard_slots = self.sharded.get(key)
        if shard_slots is not None:
            starts = shard_slots.starts
            return [
                SlotPart(
                    starts[i],
                    starts[i + 1],
                    compact.slot(name) if compact is not None else full[name],
                    compact,
                )
                for i, (compact, full) in enumerate(zip(shard_slots.compact, shard_slots.full))
            ]
        compact = self.compact.get(key)
        if compact is not None:
            return [SlotPart(0, num_rows, compact.slot(name), compact)]
        return [SlotPart(0, num_rows, keras_slot(), None)]

    def stored_slot(
        self, key: Any, name: str, keras_slot: Callable[[], tf.Variable]
    ) -> tf.Variable | list[tf.Variable]:
        """The slot ``name`` as stored (see ``MaskedOptimizer.slot_variable``)."""
        shard_slots = self.sharded.get(key)
        if shard_slots is not None:
            return [
                compact.slot(name) if compact is not None else full[name]
                for compact, full in zip(shard_slots.compact, shard_slots.full)
            ]
        compact = self.compact.get(key)
        return keras_slot() if compact is None else compact.slot(name)

    def save(self, store: Any) -> None:
        """Adds the compact slots to a Keras variable store (``compact_0``, ...)."""
        for i, variable in enumerate(self.compact_variables):
            store[f"{COMPACT_KEY}{i}"] = variable.numpy()

    def load(self, store: Any) -> bool:
        """Loads the compact slots from a Keras variable store; False (and
        nothing loaded) when it holds another number of them."""
        saved = [k for k in store.keys() if k.startswith(COMPACT_KEY)]
        if len(saved) != len(self.compact_variables):
            return False
        for i, variable in enumerate(self.compact_variables):
            variable.assign(store[f"{COMPACT_KEY}{i}"])
        return True


class StoreHidingKeys:
    """A Keras variable store seen without some of its keys (so that Keras'
    own loading never sees the compact slots' entries)."""

    def __init__(self, store: Any, hidden: set[str]) -> None:
        self._store = store
        self._hidden = hidden

    def keys(self) -> list[str]:
        return [k for k in self._store.keys() if k not in self._hidden]

    def __getitem__(self, key: str) -> Any:
        return self._store[key]


def reserve_slot_rows(slots: CompactSlots, mask: RowMask) -> None:
    """Room in ``slots`` for every row ``mask`` permits now (see
    ``CompactSlots.reserve``); none for a mask with no value yet. Where the
    mask is a layer's admitted rows (row admission), rows are admitted inside
    the step: room for every candidate then, or for ``capacity`` rows (the
    slot rows of evicted rows are reused)."""
    admission = admission_of(mask.variable)
    if admission is not None:
        slots.reserve_for_admission(admission)
        return
    values = mask.values()
    if values is not None:
        slots.reserve(values)


# -- a slot's rows, whatever the layout ---------------------------------------------------


def _in_parts(parts: list[SlotPart], ids: np.ndarray) -> Iterator[tuple[SlotPart, np.ndarray]]:
    """Each part with the positions in ``ids`` of its rows."""
    for part in parts:
        yield part, np.flatnonzero((ids >= part.start) & (ids < part.stop))


def _slot_rows_of(part: SlotPart, ids: np.ndarray) -> np.ndarray:
    assert part.compact is not None
    return read_host_rows(part.compact.slot_of_row, ids - part.start, "slot").astype(np.int64)


def read_slot_rows(
    parts: list[SlotPart], ids: np.ndarray, initial_value: float, dtype: np.dtype
) -> np.ndarray:
    """The slot's values at table rows ``ids``; ``initial_value`` for a row
    without a slot row."""
    row_shape = tuple(parts[0].slot.shape[1:])
    values = np.full((len(ids), *row_shape), initial_value, dtype=dtype)
    for part, positions in _in_parts(parts, ids):
        rows = ids[positions] - part.start
        if part.compact is not None:
            rows = _slot_rows_of(part, ids[positions])
            positions, rows = positions[rows >= 0], rows[rows >= 0]
        values[positions] = read_host_rows(part.slot, rows, "slot")
    return values


def slot_rows_present(parts: list[SlotPart], ids: np.ndarray) -> np.ndarray:
    """Whether each of ``ids`` has slot state (always, for full-size slots)."""
    present = np.ones(len(ids), dtype=bool)
    for part, positions in _in_parts(parts, ids):
        if part.compact is not None:
            present[positions] = _slot_rows_of(part, ids[positions]) >= 0
    return present


def write_slot_rows(
    parts: list[SlotPart], ids: np.ndarray, values: np.ndarray, present: np.ndarray
) -> None:
    """Writes ``values`` to the slot at table rows ``ids`` (distinct, checked).

    With compact slots a row that is ``present`` takes a slot row if it has
    none (as a training step would give it); a row that is not present and
    has none keeps none.
    """
    for part, positions in _in_parts(parts, ids):
        rows = ids[positions] - part.start
        if part.compact is not None:
            compact = part.compact
            num_rows = part.stop - part.start
            compact.slot_rows(
                tf.constant(rows, tf.int64),
                tf.constant(present[positions]),
                tf.ones([num_rows], tf.bool),
            )
            rows = _slot_rows_of(part, ids[positions])
            positions, rows = positions[rows >= 0], rows[rows >= 0]
        assign_host_rows(part.slot, rows, values[positions], "slot")


# -- argument checks ------------------------------------------------------------------------


def release_evicted_rows(
    optimizer: Any, variable: Variable, mask: RowMask, compact: CompactSlots | None
) -> None:
    """Gives back the optimizer state of the rows the row admission of
    ``variable``'s layer evicted since the last step (see
    ``layers._admission``): compact slot rows go to the free pool, full-size
    slot rows are reset to their initial value. Nothing without admission or
    without a capacity (then nothing is evicted)."""
    admission = admission_of(mask.variable)
    if admission is None or admission.capacity is None:
        return
    rows, valid, overflow = admission.drain_evicted()
    row_mask = mask.full()
    # Evicted rows are candidates: the candidate mask permits their writes.
    candidates = resolve_variable(admission.candidates).value()
    if compact is not None:
        if compact.recycles:
            compact.release(rows, valid, overflow, row_mask, candidates)
        return
    base = optimizer._base_optimizer
    specs = optimizer._row_rule.slots(base)
    slots = []
    for spec in specs:
        try:
            slots.append(
                (spec, resolve_variable(framework_private.slot(base, spec.name, variable)))
            )
        except (KeyError, IndexError, AttributeError):
            continue
    if not slots:
        return

    def reset_evicted() -> tf.Tensor:
        recorded, where = rows, valid
        if not in_xla_context():  # Only the rows recorded, not the record's whole room.
            recorded = tf.boolean_mask(rows, valid)
            where = tf.ones(tf.shape(recorded), tf.bool)
        for spec, slot in slots:
            reset_rows(slot, recorded, where, spec.initial_value, candidates)
        return tf.constant(True)

    def reset_unpermitted() -> tf.Tensor:
        # More rows were evicted than recorded: every row not admitted.
        for spec, slot in slots:
            keep = tf.reshape(row_mask, [-1] + [1] * (slot.shape.rank - 1))
            slot.assign(tf.where(keep, slot.value(), tf.cast(spec.initial_value, slot.dtype)))
        return tf.constant(True)

    tf.cond(
        overflow,
        reset_unpermitted,
        lambda: tf.cond(tf.reduce_any(valid), reset_evicted, lambda: tf.constant(False)),
    )


def check_compact_arguments(compact_slots: Any, slot_capacity: Any) -> None:
    if not any(
        compact_slots is choice or (isinstance(compact_slots, str) and compact_slots == choice)
        for choice in COMPACT_SLOTS_CHOICES
    ):
        raise PartialEmbeddingArgumentError(
            f'compact_slots: expected "auto", True or False, got {compact_slots!r}'
        )
    if slot_capacity is not None and (
        isinstance(slot_capacity, bool)
        or not isinstance(slot_capacity, numbers.Integral)
        or not 1 <= int(slot_capacity) <= MAX_SLOT_ROWS
    ):
        raise PartialEmbeddingArgumentError(
            f"slot_capacity: expected None or an int in [1, {MAX_SLOT_ROWS}], got {slot_capacity!r}"
        )


def check_compact_indices(indices: list[int] | None, num_variables: int) -> None:
    """``compact_variable_indices`` (from a config) against the variables the
    optimizer is built with: each a position among them."""
    if indices is None:
        return
    bad = [i for i in indices if not 0 <= i < num_variables]
    if bad:
        raise PartialEmbeddingArgumentError(
            f"compact_variable_indices: {bad[0]} is not in [0, {num_variables}) (the "
            f"optimizer is built with {num_variables} variables; got {indices})"
        )


def compact_indices(indices: Iterable[int] | None) -> list[int] | None:
    """``compact_variable_indices`` checked (ints >= 0) and sorted."""
    if indices is None:
        return None
    if isinstance(indices, (str, bytes)) or not isinstance(indices, Iterable):
        raise PartialEmbeddingArgumentError(
            "compact_variable_indices: expected None or a list of ints >= 0 (positions of the "
            f"variables the optimizer is built with), got {indices!r}"
        )
    values = list(indices)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise PartialEmbeddingArgumentError(
                "compact_variable_indices: expected None or ints >= 0 (positions of "
                f"the variables the optimizer is built with), got {value!r} in {values!r}"
            )
    return sorted(int(i) for i in values)


def variable_path(variable: Variable) -> str:
    return str(getattr(variable, "path", None) or variable.name)


def follow_growth(optimizer: Any, variables: list[Any]) -> None:
    """Has ``optimizer``'s (a ``MaskedOptimizer``) full-size slots, those its
    wrapped optimizer made for ``variables``, grow with a masked table whose
    rows grow (a quantized layer's float store, see ``_internal.growable``):
    made growable now (with the value Keras' build gives them: built inside a
    traced step, they have none to read yet), grown when the table's mask
    changes (a ``GrowWithMask`` watcher, kept by its slot store)."""
    base = optimizer._base_optimizer
    specs = optimizer._row_rule.slots(base)
    for variable in variables:
        mask = optimizer._row_mask_of(variable)
        if mask is None or mask.variable is None or not is_growable(variable):
            continue
        try:
            slots = [framework_private.slot(base, spec.name, variable) for spec in specs]
        except (KeyError, IndexError, AttributeError):
            continue
        if slots and all(
            make_growable(slot, spec.initial_value) for slot, spec in zip(slots, specs)
        ):
            watcher = GrowWithMask(slots)
            optimizer._slot_store.growth_watchers.append(watcher)
            watch_mask(mask.variable, watcher)
