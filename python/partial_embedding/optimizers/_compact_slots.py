"""Compact optimizer slots: a masked variable's slots hold only the rows that train.

With Keras' own slots, Adam keeps two tables as large as the embedding, most of
whose rows belong to frozen rows and are never read. ``CompactSlots`` keeps,
for one masked variable of ``V`` rows:

* ``slot_of_row``: a float32 ``[V]`` map from a row to its slot row, ``-1``
  while the row has none. Float32 so that ``masked_scatter_sub`` writes it in
  place (TensorFlow's integer scatter ops would switch it into copy-on-read
  mode, after which every read copies it whole); slot rows are whole numbers
  below ``2**24``, which float32 holds exactly.
* ``rows_used``: how many slot rows are taken (an int64 scalar: TensorFlow
  keeps int32 variables in host memory on a GPU, out of an XLA step's reach).
* one ``[capacity] + row_shape`` variable per slot (Adam: ``momentum`` and
  ``velocity``), holding the slot rows in the order rows first trained.

A permitted row gets its slot row the first time a step updates it, filled
with the slot's initial value (what a full-size slot holds for a row no step
has touched), so results are bit for bit those of full-size slots. A row keeps
its slot row when it is frozen (its moments stay as they were, untouched, as
full-size slots keep them) and takes up where it left off when it is
unfrozen. When more rows need slots than there is room for, the slots grow
inside the step (by half, or to what is needed), keeping their values: no
retracing, no error. Slot rows are given back only where the table's layer
has row admission with a capacity (``layers._admission``): an evicted row's
slot rows are reset to their initial value and go to a free pool
(``free_slot_rows``, ``free_count``), from which the next rows to train take
theirs first, so the slots hold no more rows than are admitted at once.

Under XLA (``jit_compile=True``) a step cannot change a variable's shape, so
the slots cannot grow inside it. Room is reserved eagerly instead, for every
permitted row that has no slot row yet: when the step is traced, and
whenever ``PartialEmbedding.freeze`` / ``unfreeze`` / ``set_trainable_ids``
or ``MaskedOptimizer.set_row_mask`` change a mask (see ``_internal.row_mask.mask_changed``).
A row that still finds no room (a mask variable assigned directly, more
rows permitted than reserved) skips its update, table and slots alike, until
room is made; it is never written wrongly.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal import xla as _xla
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.growable import grow_rows, is_growable, make_growable
from partial_embedding._internal.growable import num_rows as num_rows_of
from partial_embedding._internal.row_mask import admission_of
from partial_embedding._internal.scattered import read_rows, write_rows_where
from partial_embedding.ops import gather_rows, masked_scatter_sub, resolve_variable

#: Largest number of slot rows a float32 map holds exactly.
MAX_SLOT_ROWS = 2**24


def _check_rows(needed: tf.Tensor, limit: tf.Tensor, message: str) -> tf.Operation:
    """Stops the step with ``message`` unless ``needed <= limit`` (int64
    scalars). The values reach the error as strings: ``Assert`` with only
    string data is one op, where ``tf.debugging.assert_less_equal`` on int64
    data guards it with a ``tf.cond`` (a costly trace on every first step)."""
    return tf.debugging.Assert(
        needed <= limit,
        [
            message,
            "rows needed:",
            tf.strings.as_string(needed),
            "at most:",
            tf.strings.as_string(limit),
        ],
    )


class SlotSpec(NamedTuple):
    """One slot of a rule: its name (as in the row rules), initial value and
    whether it holds one value per row (row-wise rules) instead of one per
    element."""

    name: str
    initial_value: float
    per_row: bool = False


def _readable(variable: Any) -> tf.Variable:
    """The variable, or its copy on this device inside a strategy's update."""
    return resolve_variable(variable, argument="slot")


def fixed_slot_rows(permitted: int, slot_capacity: int | None) -> int:
    """Slot rows of compact slots that cannot grow (a sharded table's shards,
    a whole table on a parameter server): ``slot_capacity`` if set, else half
    as many again as the rows permitted at build, plus one; within
    ``[1, MAX_SLOT_ROWS]``."""
    rows = slot_capacity if slot_capacity is not None else permitted + permitted // 2 + 1
    return min(max(int(rows), 1), MAX_SLOT_ROWS)


def _row_map(num_rows: int, name: str, growable: bool) -> tf.Variable:
    """A row -> slot-row map, float32 ``[num_rows]`` of ``-1`` (no slot row);
    with an unknown length where the table's rows grow."""
    row_map = tf.Variable(
        lambda: tf.fill([num_rows], tf.constant(-1.0, tf.float32)),
        shape=[None] if growable else [num_rows],
        trainable=False,
        name=name,
        dtype=tf.float32,
    )
    if growable:
        make_growable(row_map)
    return row_map


def _free_pool(capacity: int, fixed_capacity: bool, name: str) -> tuple[Any, Any]:
    """A free pool of slot rows: the rows (``capacity`` of -1, growable
    unless ``fixed_capacity``) and their count (int64)."""
    rows = tf.Variable(
        lambda: tf.fill([capacity], tf.constant(-1, tf.int64)),
        shape=[capacity if fixed_capacity else None],
        trainable=False,
        name=f"{name}/free_slot_rows",
        dtype=tf.int64,
    )
    count = tf.Variable(0, trainable=False, name=f"{name}/free_count", dtype=tf.int64)
    return rows, count


class CompactSlots:
    """The slots of one masked variable, one row per permitted row that trained.

    Args:
      variable: The masked variable (Keras or TF, possibly mirrored).
      specs: The rule's slots.
      capacity: Slot rows to allocate now (at least 1).
      name: A prefix for the variables' names.
      recycles: Whether slot rows are given back (:meth:`release`): the
        table's rows are admitted and evicted (row admission with a
        capacity).
      fixed_capacity: Whether the slots keep ``capacity`` rows for good
        (static shapes): a step that needs more fails. For variables on
        another task (a parameter server), whose handles TensorFlow cannot
        pass between tasks with an unknown dimension. Such slots may also be
        updated by several steps at once (ParameterServerStrategy's workers
        run steps concurrently): slot rows are then given under a lock
        (a ``tf.CriticalSection`` next to the variable), so that no two rows
        get the same one.
    """

    def __init__(
        self,
        variable: Any,
        specs: tuple[SlotSpec, ...],
        capacity: int,
        name: str,
        fixed_capacity: bool = False,
        recycles: bool = False,
    ):
        #: Set once a step has been traced for XLA: mask changes then
        #: reserve room eagerly (see ``_internal.row_mask.mask_changed``).
        self.used_under_xla = False
        capacity = max(int(capacity), 1)
        if capacity > MAX_SLOT_ROWS:
            raise ValueError(
                f"compact slots of {name}: capacity {capacity} is more than "
                f"{MAX_SLOT_ROWS} slot rows; use compact_slots=False"
            )
        self.specs = specs
        self.fixed_capacity = fixed_capacity
        self.dtype = tf.as_dtype(variable.dtype)
        self.row_shape = tf.TensorShape(variable.shape[1:])
        num_rows = int(variable.shape[0])
        # Next to the variable: on its device, and mirrored like it.
        target = resolve_variable(variable, argument="variable")
        strategy = tf.distribute.get_strategy()
        with tf.init_scope(), strategy.extended.colocate_vars_with(target):
            #: Whether the table's rows grow (a quantized layer's float
            #: store): the map then grows with them (``mask_changed``).
            self.follows_growth = is_growable(variable)
            self.slot_of_row = _row_map(num_rows, f"{name}/slot_of_row", self.follows_growth)
            # Placed with the variable (a ParameterServerStrategy cannot
            # colocate a critical section's mutex; the device scope does).
            self._allocation_lock: tf.CriticalSection | None = None
            if fixed_capacity:
                with tf.device(target.device):
                    self._allocation_lock = tf.CriticalSection(name=f"{name}/allocation")
            self.rows_used = tf.Variable(
                0, trainable=False, name=f"{name}/slot_rows_used", dtype=tf.int64
            )
            self.slots = {
                spec.name: tf.Variable(
                    lambda spec=spec: tf.fill(
                        [capacity, *self.slot_row_shape(spec)],
                        tf.cast(spec.initial_value, self.dtype),
                    ),
                    shape=tf.TensorShape([capacity if fixed_capacity else None]).concatenate(
                        self.slot_row_shape(spec)
                    ),
                    trainable=False,
                    name=f"{name}/{spec.name}",
                    dtype=self.dtype,
                )
                for spec in specs
            }
            #: Slot rows given back, the last on top (int64, as long as the
            #: slots), and how many: with ``recycles`` only.
            self.free_slot_rows: tf.Variable | None = None
            self.free_count: tf.Variable | None = None
            if recycles:
                self.free_slot_rows, self.free_count = _free_pool(capacity, fixed_capacity, name)
            #: Updates an XLA step skipped because a row found no free slot
            #: row (an XLA step cannot grow the slots): counted per replica,
            #: read as the sum; neither saved nor in ``variables``.
            self.skipped_updates = tf.Variable(
                0,
                trainable=False,
                name=f"{name}/skipped_updates",
                dtype=tf.int64,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

    def slot_row_shape(self, spec: SlotSpec) -> list[int]:
        """The shape of one slot row of ``spec``: the table's row shape, or
        ``[]`` for a per-row slot (one value a row)."""
        return [] if spec.per_row else self.row_shape.as_list()

    def skipped_update_count(self) -> int:
        """How many row updates XLA steps have skipped so far (read eagerly)."""
        with tf.init_scope():
            return int(self.skipped_updates.read_value())

    @property
    def recycles(self) -> bool:
        """Whether slot rows are given back (see ``recycles``)."""
        return self.free_slot_rows is not None

    @property
    def variables(self) -> list[tf.Variable]:
        """Every variable it holds: the map, the count, the slots (then the
        free pool, if it recycles)."""
        pool = [] if self.free_slot_rows is None else [self.free_slot_rows, self.free_count]
        return [self.slot_of_row, self.rows_used, *self.slots.values(), *pool]

    def rows_in_use(self) -> tf.Tensor:
        """Slot rows that belong to a row now (int64 scalar)."""
        used = _readable(self.rows_used).read_value()
        if self.free_count is None:
            return used
        return used - _readable(self.free_count).read_value()

    def slot(self, name: str) -> tf.Variable:
        return self.slots[name]

    def is_slot(self, target: Any) -> bool:
        """Whether ``target`` is one of these slots (or a copy of one)."""
        resolved = _readable(target)
        return any(resolved is _readable(slot) for slot in self.slots.values())

    def capacity(self) -> tf.Tensor:
        """Slot rows allocated now (a scalar int64 tensor, as ``rows_used``);
        the shape alone is read (a slot :meth:`release` wrote with a scatter
        would copy itself whole at a full read)."""
        first = _readable(next(iter(self.slots.values())))
        return tf.raw_ops.VariableShape(input=first.handle, out_type=tf.int64)[0]

    def slot_rows(self, rows: tf.Tensor, permitted: tf.Tensor, row_mask: tf.Tensor) -> tf.Tensor:
        """The slot row of each of ``rows``; rows that have none get one now.

        Args:
          rows: Row ids ``[N]`` (duplicates allowed).
          permitted: Bool ``[N]``: whether each row trains at this step.
          row_mask: The variable's whole bool ``[V]`` mask.

        Returns:
          Slot rows ``[N]`` of ``rows.dtype``: a permitted row's own; 0 for
          the others (a valid row the caller never writes for them).
        """
        slot_of_row = _readable(self.slot_of_row)
        current = gather_rows(slot_of_row, rows)
        missing = tf.logical_and(permitted, current < 0)

        def allocate(missing: tf.Tensor) -> tf.Tensor:
            new_rows, _ = tf.unique(tf.boolean_mask(rows, missing))
            count = tf.size(new_rows, out_type=tf.int64)
            rows_used = _readable(self.rows_used)
            first = rows_used.read_value()
            if self.free_count is None:
                total = first + count
                self._ensure_capacity(total)
                new_slot_rows = tf.cast(tf.range(first, total), tf.float32)
            else:
                rank = tf.range(count)
                taking = tf.ones([count], tf.bool)
                new_slot_rows, total = self._take_slot_rows(rank, first, taking)
                self._ensure_capacity(total)
                new_slot_rows = tf.cast(new_slot_rows, tf.float32)
            # Each map entry holds -1 now: -1 - (-1 - s) = s, exactly.
            masked_scatter_sub(slot_of_row, new_rows, -1.0 - new_slot_rows, row_mask)
            rows_used.assign(total)
            return gather_rows(slot_of_row, rows)

        lock = self._allocation_lock
        if lock is None:
            current = tf.cond(tf.reduce_any(missing), lambda: allocate(missing), lambda: current)
        else:

            def allocate_exclusively() -> tf.Tensor:
                # Another step may have given some of the rows theirs since.
                now = gather_rows(slot_of_row, rows)
                still_missing = tf.logical_and(permitted, now < 0)
                return tf.cond(
                    tf.reduce_any(still_missing), lambda: allocate(still_missing), lambda: now
                )

            current = tf.cond(
                tf.reduce_any(missing),
                lambda: lock.execute(allocate_exclusively, exclusive_resource_access=False),
                lambda: current,
            )
        return tf.where(permitted, tf.cast(current, rows.dtype), tf.zeros([], rows.dtype))

    def _take_slot_rows(
        self, rank: tf.Tensor, first: tf.Tensor, taking: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The slot rows of the new rows where ``taking``, ranked ``rank``
        (0, 1, ... int64 among them): free ones from the top of the pool
        first, then fresh ones from ``first`` (``rows_used``). Takes them from
        the pool, and returns them with the new ``rows_used`` (not yet
        assigned)."""
        assert self.free_count is not None and self.free_slot_rows is not None
        free_count = _readable(self.free_count)
        pool = free_count.read_value()
        from_pool = tf.logical_and(taking, rank < pool)
        top = tf.where(from_pool, pool - 1 - rank, tf.zeros([], tf.int64))
        pooled = read_rows(_readable(self.free_slot_rows), top)
        fresh = first + rank - pool
        taken = tf.reduce_sum(tf.cast(from_pool, tf.int64))
        with tf.control_dependencies([pooled]):
            free_count.assign(pool - taken)
        count = tf.reduce_sum(tf.cast(taking, tf.int64))
        return tf.where(from_pool, pooled, fresh), first + count - taken

    def release(
        self,
        rows: tf.Tensor,
        valid: tf.Tensor,
        everything_unpermitted: tf.Tensor,
        row_mask: Any,
        writable: Any,
    ) -> None:
        """Gives back the slot rows of table ``rows`` where ``valid`` (int64,
        distinct): each is reset to the slot's initial value and goes to the
        free pool; the rows have none after. ``writable``: a bool ``[V]``
        mask (or its variable) that permits those rows (the layer's
        candidates). With ``everything_unpermitted`` (a bool scalar: more
        rows were evicted than recorded), every row ``row_mask`` (bool
        ``[V]``) does not permit gives its back instead (O(V), rare)."""
        assert self.free_count is not None and self.free_slot_rows is not None

        def release_recorded() -> tf.Tensor:
            if in_xla_context():
                self._release(rows, valid, writable)
            else:  # Only the rows recorded, not the record's whole room.
                recorded = tf.boolean_mask(rows, valid)
                self._release(recorded, tf.ones(tf.shape(recorded), tf.bool), writable)
            return tf.constant(True)

        def release_unpermitted() -> tf.Tensor:
            row_mask_tensor = tf.convert_to_tensor(row_mask)
            num_rows = tf.shape(row_mask_tensor, out_type=tf.int64)[0]
            self._release(
                tf.range(num_rows), tf.logical_not(row_mask_tensor), tf.ones([num_rows], tf.bool)
            )
            return tf.constant(True)

        tf.cond(
            everything_unpermitted,
            release_unpermitted,
            # Most steps evicted nothing.
            lambda: tf.cond(tf.reduce_any(valid), release_recorded, lambda: tf.constant(False)),
        )

    def _release(self, rows: tf.Tensor, valid: tf.Tensor, writable: Any) -> None:
        assert self.free_count is not None and self.free_slot_rows is not None
        slot_of_row = _readable(self.slot_of_row)
        rows = tf.where(valid, rows, tf.zeros([], rows.dtype))
        slot_rows = tf.cast(gather_rows(slot_of_row, rows), tf.int64)
        has = tf.logical_and(valid, slot_rows >= 0)
        slot_rows = tf.where(has, slot_rows, tf.zeros([], tf.int64))
        slot_row_mask = self.slot_row_mask()
        for spec in self.specs:
            reset_rows(
                _readable(self.slots[spec.name]), slot_rows, has, spec.initial_value, slot_row_mask
            )
        free_count = _readable(self.free_count)
        pool = free_count.read_value()
        positions = pool + tf.cumsum(tf.cast(has, tf.int64), exclusive=True)
        write_rows_where(_readable(self.free_slot_rows), positions, slot_rows, has)
        free_count.assign(pool + tf.reduce_sum(tf.cast(has, tf.int64)))
        # Each map entry holds s >= 0: s - (s + 1) = -1, exactly.
        amount = tf.where(has, tf.cast(slot_rows, tf.float32) + 1.0, 0.0)
        masked_scatter_sub(slot_of_row, rows, amount, writable)

    def release_unpermitted_eagerly(self, row_mask: np.ndarray) -> None:
        """Eagerly gives back the slot rows of every row ``row_mask`` (bool
        ``[V]``) does not permit (rows that left a layer's admitted set when
        its candidates changed), on every copy."""
        with tf.init_scope():
            for slot_of_row, _, *rest in zip(*(_local_copies(v) for v in self.variables)):
                slots, (pool, free_count) = rest[: len(self.specs)], rest[len(self.specs) :]
                row_map = slot_of_row.numpy()
                leaving = (row_map >= 0) & ~row_mask[: len(row_map)]
                if not leaving.any():
                    continue
                slot_rows = row_map[leaving].astype(np.int64)
                for spec, slot in zip(self.specs, slots):
                    values = slot.numpy()
                    values[slot_rows] = spec.initial_value
                    slot.assign(values)
                free = int(free_count.numpy())
                stack = pool.numpy()
                stack[free : free + len(slot_rows)] = slot_rows
                pool.assign(stack)
                free_count.assign(free + len(slot_rows))
                row_map[leaving] = -1.0
                slot_of_row.assign(row_map)

    def _ensure_capacity(self, needed: tf.Tensor) -> None:
        """Grows every slot to hold ``needed`` rows, keeping the values."""
        capacity = self.capacity()
        if self.fixed_capacity:
            _check_rows(
                needed,
                capacity,
                "compact optimizer slots on a parameter server (a sharded table's "
                "shards, or a whole table under ParameterServerStrategy) have a fixed "
                "number of rows (MaskedOptimizer's slot_capacity, else 1.5 times the "
                "rows permitted at build, plus one) and more rows have trained; build "
                "the optimizer with a larger slot_capacity, or compact_slots=False",
            )
            return

        def grow() -> tf.Tensor:
            new_capacity = tf.maximum(needed, capacity + capacity // 2 + 1)
            new_capacity = tf.minimum(new_capacity, MAX_SLOT_ROWS)
            check = _check_rows(
                needed,
                tf.constant(MAX_SLOT_ROWS, needed.dtype),
                f"compact optimizer slots hold at most {MAX_SLOT_ROWS} rows; "
                "use MaskedOptimizer(..., compact_slots=False)",
            )
            with tf.control_dependencies([check]):
                extra = new_capacity - capacity
            for spec in self.specs:
                slot = _readable(self.slots[spec.name])
                fill = tf.fill(
                    tf.concat([[extra], tf.constant(self.slot_row_shape(spec), tf.int64)], 0),
                    tf.cast(spec.initial_value, self.dtype),
                )
                slot.assign(tf.concat([slot.value(), fill], 0))
            if self.free_slot_rows is not None:
                pool = _readable(self.free_slot_rows)
                pool.assign(
                    tf.concat([pool.value(), tf.fill([extra], tf.constant(-1, tf.int64))], 0)
                )
            return tf.constant(True)

        tf.cond(needed > capacity, grow, lambda: tf.constant(False))

    def xla_slot_rows(self, rows: tf.Tensor, write: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """:meth:`slot_rows` with static shapes, for XLA.

        Args:
          rows: Valid row ids ``[N]``, duplicates allowed (the deduplicated
            gradient's, or the raw one's for a fused custom call).
          write: Bool ``[N]``: whether each row trains at this step (the
            same for every occurrence of a row).

        Returns:
          ``(slot_rows, has_slot)``: each row's slot row (0 where it has
          none) and whether it has one now. Rows that need a slot row take
          the next free ones, in the order of the positions that claimed
          them; those that find no room (the slots cannot grow inside an XLA
          step) get none and count once each in ``skipped_updates``.
        """
        self.used_under_xla = True
        slot_of_row = _readable(self.slot_of_row)
        missing = tf.logical_and(write, gather_rows(slot_of_row, rows) < 0)
        # Every occurrence of a row without a slot row writes -2 - its
        # position there; whichever stays, all of them read the same one
        # back: that occurrence claims the row (whole numbers below 2**24
        # are exact in float32).
        claim = -2.0 - tf.cast(tf.range(tf.shape(rows)[0]), tf.float32)
        _xla.update_at(slot_of_row, _xla.write_targets(rows, missing), claim)
        claims = tf.logical_and(missing, tf.equal(gather_rows(slot_of_row, rows), claim))
        rank = tf.cumsum(tf.cast(claims, tf.int64), exclusive=True)
        rows_used = _readable(self.rows_used)
        first = rows_used.read_value()
        if self.free_count is None:
            new_slot_rows = first + rank
        else:
            new_slot_rows, _ = self._take_slot_rows(rank, first, claims)
        assign = tf.logical_and(claims, new_slot_rows < self.capacity())
        # The claimed entries get their slot row, or -1 again without room.
        _xla.update_at(
            slot_of_row,
            _xla.write_targets(rows, claims),
            tf.where(assign, tf.cast(new_slot_rows, tf.float32), -1.0),
        )
        fresh = tf.logical_and(assign, new_slot_rows >= first)
        rows_used.assign(first + tf.reduce_sum(tf.cast(fresh, tf.int64)))
        skipped = tf.logical_and(claims, tf.logical_not(assign))
        self.skipped_updates.assign_add(tf.reduce_sum(tf.cast(skipped, tf.int64)))
        current = gather_rows(slot_of_row, rows)
        has_slot = tf.logical_and(write, current >= 0)
        slot_rows = tf.where(has_slot, tf.cast(current, tf.int32), tf.zeros([], tf.int32))
        return tf.cast(slot_rows, rows.dtype), has_slot

    def mask_changed(self, mask_variable: Any) -> None:
        """Told (``_internal.row_mask.mask_changed``) that the mask of its
        table changed eagerly: slots of XLA-compiled steps reserve room for
        the permitted rows now (an XLA step cannot grow them). Where the
        table's rows grew (a quantized layer's store), the row map grows
        first: the new rows have no slot row."""
        if self.follows_growth:
            grow_rows(self.slot_of_row, num_rows_of(mask_variable))
        if self.recycles:
            self.release_unpermitted_eagerly(
                np.asarray(tf.convert_to_tensor(mask_variable), dtype=bool)
            )
        if not self.used_under_xla:  # Read the mask only for slots that need it.
            return
        admission = admission_of(mask_variable)
        if admission is not None:
            self.reserve_for_admission(admission)
        else:
            self.reserve(np.asarray(tf.convert_to_tensor(mask_variable), dtype=bool))

    def reserve_for_admission(self, admission: Any) -> None:
        """:meth:`reserve` for a table whose rows are admitted inside the step
        (row admission, see ``_internal.row_mask.ADMISSION_ATTRIBUTE``): room
        for every candidate, or for ``capacity`` rows (evicted rows' slot
        rows are reused)."""
        if admission.capacity is not None:
            self.reserve(np.zeros([int(self.slot_of_row.shape[0])], bool), admission.capacity)
        else:
            self.reserve(admission.candidate_values())

    def reserve(self, mask: np.ndarray, at_least: int = 0) -> None:
        """Eagerly grows the slots to hold a row for every row ``mask`` (bool
        ``[V]``) permits that has none yet, and ``at_least`` rows (for XLA
        steps, which cannot grow them)."""
        with tf.init_scope():
            for slot_of_row, rows_used, *rest in zip(*(_local_copies(v) for v in self.variables)):
                slots = rest[: len(self.specs)]
                without = np.count_nonzero(mask & (slot_of_row.numpy() < 0))
                needed = max(int(rows_used.numpy()) + int(without), int(at_least))
                capacity = int(tf.raw_ops.VariableShape(input=slots[0].handle)[0]) if slots else 0
                if needed <= capacity:
                    continue
                if self.fixed_capacity:
                    # A parameter server's slots keep their shape (see
                    # __init__); what does not fit is skipped and counted.
                    warnings.warn(
                        f"compact optimizer slots of fixed capacity hold {capacity} rows, and "
                        f"the row mask now needs {needed}: XLA steps skip the updates of rows "
                        "that find no free slot row (MaskedOptimizer.skipped_row_updates "
                        f"counts them); build with slot_capacity >= {needed} to keep them",
                        stacklevel=2,
                    )
                    continue
                if needed > MAX_SLOT_ROWS:
                    raise ValueError(
                        f"compact optimizer slots hold at most {MAX_SLOT_ROWS} rows; "
                        "use MaskedOptimizer(..., compact_slots=False)"
                    )
                extra = min(max(needed, capacity + capacity // 2 + 1), MAX_SLOT_ROWS) - capacity
                for spec, slot in zip(self.specs, slots):
                    fill = tf.fill(
                        [extra, *self.slot_row_shape(spec)],
                        tf.cast(spec.initial_value, self.dtype),
                    )
                    slot.assign(tf.concat([slot.value(), fill], 0))
                if self.free_slot_rows is not None:
                    pool = rest[len(self.specs)]
                    pool.assign(
                        tf.concat([pool.value(), tf.fill([extra], tf.constant(-1, tf.int64))], 0)
                    )

    def slot_row_mask(self) -> tf.Tensor:
        """A bool mask over the slot rows: all may be written."""
        return tf.ones([self.capacity()], tf.bool)

    def gather(self, slot: Any, slot_rows: tf.Tensor) -> tf.Tensor:
        return gather_rows(_readable(slot), slot_rows)

    def subtract(
        self, slot: Any, slot_rows: tf.Tensor, amount: tf.Tensor, slot_row_mask: tf.Tensor
    ) -> None:
        """``slot[slot_rows] -= amount`` in place (``slot_row_mask``: see
        :meth:`slot_row_mask`, made once per step for all slots)."""
        masked_scatter_sub(_readable(slot), slot_rows, amount, slot_row_mask)


def reset_rows(
    variable: tf.Variable, rows: tf.Tensor, where: tf.Tensor, value: float, row_mask: tf.Tensor
) -> None:
    """``variable[rows] = value`` where ``where`` (``rows`` distinct there),
    in place: ``x - x = 0``, then ``0 - (-value) = value``, both exact for a
    finite ``x`` (a TensorFlow scatter would put the variable in copy-on-read
    mode). ``row_mask`` must permit those rows."""
    current = gather_rows(variable, rows)
    keep = tf.reshape(where, [-1] + [1] * (current.shape.rank - 1))
    zero = tf.zeros_like(current)
    masked_scatter_sub(variable, rows, tf.where(keep, current, zero), row_mask)
    if value != 0:
        fill = tf.fill(tf.shape(current), tf.cast(-value, current.dtype))
        masked_scatter_sub(variable, rows, tf.where(keep, fill, zero), row_mask)


class SlotVariableState(framework_private.SaveableChildren, tf.Module):
    """Holds slot variables that are not among an optimizer's ``variables``
    (compact slots, a sharded table's per-shard slots) as attributes ``v0``,
    ``v1``, ...: checkpoint keys by position, as Keras' own optimizer
    variables.

    Args:
      name: The module's name.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self._count = 0

    def track(self, variable: tf.Variable) -> None:
        setattr(self, f"v{self._count}", variable)
        self._count += 1


def _local_copies(variable: Any) -> list[tf.Variable]:
    """The variable's copies on this machine (one unless mirrored)."""
    return [
        resolve_variable(copy, argument="slot")
        for copy in tf.distribute.get_strategy().experimental_local_results(variable)
    ]
