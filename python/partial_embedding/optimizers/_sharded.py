"""MaskedOptimizer on ``ShardedVariable`` tables (ParameterServerStrategy).

A table that ``ParameterServerStrategy``'s ``variable_partitioner`` split is
a ``ShardedVariable``: contiguous row ranges, each a plain variable on one
parameter server. The pipeline treats such a table as one masked variable
of ``V`` rows (one gradient of global row ids, deduplicated and clipped as
any other); this module then gives each shard its own part of the update:

* ``global_gradient``: the per-shard gradients a tape gives for
  ``table.variables`` (local ids) as one gradient of global ids.
* ``ShardedRowMask``: the table's row mask, read shard by shard (a mask
  sharded alike, as the layer's, or slices of a fixed one).
* ``ShardedSlots``: each shard's optimizer slots (full-size, or compact with
  their own row -> slot-row map), created next to the shard, and the update:
  each shard's rows (local ids) with the rule, on the shard's device, so
  that only the batch's rows travel between a worker and a parameter server.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.checks import row_mask_tensor
from partial_embedding._internal.row_mask import RowMask, admission_of
from partial_embedding._internal.variables import (
    ids_per_shard,
    masks_per_shard,
    shard_row_starts,
    sharded_variable,
)
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.optimizers import _row_rules as row_rules
from partial_embedding.optimizers._compact_slots import (
    CompactSlots,
    SlotSpec,
    fixed_slot_rows,
    reset_rows,
)


def is_sharded(variable: Any) -> bool:
    """Whether ``variable`` (Keras or TF) holds a ``ShardedVariable``."""
    return sharded_variable(variable) is not None


def shards_of(variable: Any) -> list[tf.Variable]:
    """The shards of a sharded table, in row order."""
    table = sharded_variable(variable)
    if table is None:
        raise PartialEmbeddingTypeError(
            f"expected a ShardedVariable table, got {type(variable).__name__}"
        )
    return list(table.variables)


def gradient_sources(variables: list[Any]) -> list[Any]:
    """What to take gradients with respect to: a sharded table's shards
    (a list, in its place), any other variable itself.

    ``tf.GradientTape`` cannot differentiate with respect to a Keras variable
    that holds a ``ShardedVariable``; with respect to its shards it gives one
    gradient per shard, with local row ids, which ``MaskedOptimizer.apply``
    takes in the table's place.
    """
    return [shards_of(v) if is_sharded(v) else v for v in variables]


def global_gradient(gradient: Any, variable: Any) -> Any:
    """One gradient of global row ids for a sharded table.

    Args:
      gradient: A list with one gradient per shard (local row ids;
        ``IndexedSlices``, a dense tensor or None), or already one gradient of
        the whole table (returned as is).
      variable: The sharded table.

    Returns:
      An ``IndexedSlices`` of global row ids (int64) with the table's dense
      shape, or None where every shard's gradient is None.
    """
    if not isinstance(gradient, (list, tuple)):
        return gradient
    shards = shards_of(variable)
    if len(gradient) != len(shards):
        raise PartialEmbeddingArgumentError(
            f"gradient of sharded variable {variable.name}: expected one gradient per "
            f"shard ({len(shards)}), got {len(gradient)}"
        )
    starts = shard_row_starts(shards)
    indices, values = [], []
    for shard_gradient, shard, start in zip(gradient, shards, starts):
        if shard_gradient is None:
            continue
        if isinstance(shard_gradient, tf.IndexedSlices):
            local = tf.cast(shard_gradient.indices, tf.int64)
            shard_values = shard_gradient.values
        else:
            # A dense gradient speaks for every row of the shard.
            shard_values = tf.convert_to_tensor(shard_gradient)
            local = tf.range(int(shard.shape[0]), dtype=tf.int64)
        indices.append(local + start)
        values.append(shard_values)
    if not values:
        return None
    dense_shape = tf.constant([starts[-1], *shards[0].shape[1:]], tf.int64)
    return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0), dense_shape)


class ShardedRowMask(RowMask):
    """The row mask of a sharded table, as ``RowMask`` offers it.

    Args:
      mask: A bool ``[V]`` mask: a variable (Keras or TF) sharded like the
        table (each shard's part read on its parameter server), another
        variable, a tensor or a NumPy array (fixed, split into slices).
      variable: The sharded table.
    """

    def __init__(self, mask: Any, variable: Any) -> None:
        # RowMask's constructor resolves one variable; a sharded mask has several.
        shards = shards_of(variable)
        self.starts = shard_row_starts(shards)
        self.devices = [shard.device for shard in shards]
        name = getattr(variable, "path", None) or getattr(variable, "name", "?")
        #: The admission state of a layer whose admitted rows this is, or None.
        self.admission = admission_of(mask)
        value = getattr(mask, "_value", mask)
        parts = sharded_variable(value)
        dtype = (parts.variables[0] if parts is not None else value).dtype
        shape = tf.TensorShape(getattr(value, "shape", np.shape(value)))
        if tf.as_dtype(dtype).base_dtype != tf.bool:
            raise PartialEmbeddingTypeError(
                f"row mask of variable {name}: dtype {tf.as_dtype(dtype).name} must be bool"
            )
        if shape.rank != 1 or (shape[0] is not None and shape[0] != self.starts[-1]):
            raise PartialEmbeddingArgumentError(
                f"row mask of variable {name}: shape {shape} must be "
                f"[{self.starts[-1]}] (one entry per row of the variable of shape "
                f"{tuple(variable.shape)})"
            )
        # A variable's values may change between steps: the shards of one
        # sharded alike are read as they are; another variable is read whole
        # and sliced at each step. A fixed mask is sliced once.
        self._whole: Any = None
        if parts is not None and shard_row_starts(parts.variables) == self.starts:
            self._parts: list[Any] = list(parts.variables)
        elif parts is not None or isinstance(value, tf.Variable):
            self._whole = value
            self._parts = [None] * (len(self.starts) - 1)
        else:
            with tf.init_scope():
                value = row_mask_tensor(tf.convert_to_tensor(value, tf.bool))
                self._parts = masks_per_shard(value, self.starts)

    def shard_mask(self, index: int) -> tf.Tensor:
        """Shard ``index``'s mask; a variable's read aliases its buffer."""
        if self._whole is not None:
            whole = tf.convert_to_tensor(self._whole)
            return whole[self.starts[index] : self.starts[index + 1]]
        part = self._parts[index]
        return part.value() if isinstance(part, tf.Variable) else part

    def gather(self, rows: tf.Tensor) -> tf.Tensor:
        """The mask at global ``rows``: each shard reads its own rows."""
        positions, local_ids = ids_per_shard(rows, self.starts)
        flags = []
        for index, (device, shard_rows) in enumerate(zip(self.devices, local_ids)):
            with tf.device(device):
                flags.append(tf.gather(self.shard_mask(index), shard_rows))
        return tf.dynamic_stitch(positions, flags)

    def full(self) -> tf.Tensor:
        """The whole mask (``V`` bools): for a dense gradient only."""
        return tf.concat([self.shard_mask(i) for i in range(len(self._parts))], 0)

    @property
    def variable(self) -> tf.Variable | None:
        """None: a sharded mask is no single variable."""
        return None

    def values(self) -> np.ndarray:
        """The whole mask now, read eagerly shard by shard."""
        with tf.init_scope():
            return np.asarray(self.full().numpy(), dtype=bool)

    def count_permitted(self) -> int | None:
        """How many rows the mask permits now (read eagerly)."""
        with tf.init_scope():
            return sum(
                int(np.count_nonzero(self.shard_mask(i).numpy())) for i in range(len(self._parts))
            )


def row_mask_for(mask: Any, variable: Any) -> RowMask:
    """The ``RowMask`` of ``variable``: per shard for a sharded table."""
    if is_sharded(variable):
        return ShardedRowMask(mask, variable)
    return RowMask(mask, variable)


class _ShardRowStep(row_rules.RowStep):
    """A ``RowStep`` on one shard: local rows, the shard's own slots, and the
    whole table's weight-decay setting."""

    def __init__(
        self, *args: Any, table: Any, slots: dict[str, tf.Variable], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._table = table
        self._slots = slots

    def slot(self, name: str) -> Any:
        if self.compact is not None:
            return self.compact.slot(name)
        return self._slots[name]

    def weight_decay(self) -> tf.Tensor | None:
        optimizer = self.optimizer
        if optimizer.weight_decay is None or not framework_private.uses_weight_decay(
            optimizer, self._table
        ):
            return None
        return tf.cast(optimizer.weight_decay, self.dtype)


def _shard_slot_rows(
    admission: Any,
    candidates: np.ndarray | None,
    row_mask: ShardedRowMask,
    starts: list[int],
    index: int,
    capacity: int | None,
    name: str,
) -> int:
    """The fixed slot rows of shard ``index``'s compact slots: ``capacity``
    (``slot_capacity``) if set, else half as many again as the rows
    ``row_mask`` permits there now, plus one; under row admission, room for
    as many rows as the shard may hold at once (``min(capacity, its
    candidates)``), and a smaller ``slot_capacity`` is refused.
    """
    if admission is None:
        permitted = 0
        if capacity is None:  # Room for half as many rows again as are permitted now.
            with tf.init_scope():
                permitted = int(np.count_nonzero(row_mask.shard_mask(index).numpy()))
        return fixed_slot_rows(permitted, capacity)
    assert candidates is not None
    most = int(np.count_nonzero(candidates[starts[index] : starts[index + 1]]))
    if admission.capacity is not None:
        most = min(most, admission.capacity)
    if capacity is not None and capacity < most:
        raise PartialEmbeddingArgumentError(
            f"slot_capacity: {capacity} slot rows a shard cannot hold the {most} rows the row "
            f"admission of {name} may admit in shard {index} (capacity={admission.capacity}); "
            f"pass slot_capacity >= {most}, or a smaller capacity"
        )
    return max(most, 1) if capacity is None else int(capacity)


class ShardedSlots:
    """The optimizer slots of a sharded table, one set per shard on its
    parameter server, and the row update of each shard there.

    Args:
      variable: The sharded table (a Keras variable holding a
        ``ShardedVariable``).
      specs: The rule's slots.
      compact: Whether each shard gets compact slots (its own row -> slot
        row map and slot rows) instead of full-size ones.
      capacity: With ``compact``: each shard's slot rows, for good (None:
        half as many again as its rows ``row_mask`` permits now, plus one).
      row_mask: The table's ``ShardedRowMask``.
      name: A prefix for the variables' names.
    """

    def __init__(
        self,
        variable: Any,
        specs: tuple[SlotSpec, ...],
        compact: bool,
        capacity: int | None,
        row_mask: ShardedRowMask,
        name: str,
    ) -> None:
        self.shards = shards_of(variable)
        self.starts = shard_row_starts(self.shards)
        self.is_compact = compact
        self.compact: list[CompactSlots | None] = []
        self.full: list[dict[str, tf.Variable]] = []
        strategy = tf.distribute.get_strategy()
        admission = row_mask.admission
        self.admission = admission
        self.specs = specs
        candidates = None if admission is None else admission.candidate_values()
        for index, shard in enumerate(self.shards):
            shard_name = f"{name}/shard_{index}"
            if compact:
                slot_rows = _shard_slot_rows(
                    admission, candidates, row_mask, self.starts, index, capacity, name
                )
                # Fixed row counts: TensorFlow cannot pass a handle with an
                # unknown dimension to another task, so these cannot grow.
                self.compact.append(
                    CompactSlots(
                        shard,
                        specs,
                        slot_rows,
                        shard_name,
                        fixed_capacity=True,
                        recycles=admission is not None and admission.capacity is not None,
                    )
                )
                self.full.append({})
                continue
            self.compact.append(None)
            slots = {}
            with (
                tf.init_scope(),
                strategy.extended.colocate_vars_with(shard),
                tf.device(shard.device),
            ):
                for spec in specs:
                    # One value a row for a per-row slot (the row-wise rules).
                    shape = shard.shape[:1] if spec.per_row else shard.shape
                    slots[spec.name] = tf.Variable(
                        lambda spec=spec, shape=shape, shard=shard: tf.fill(
                            shape, tf.cast(spec.initial_value, shard.dtype)
                        ),
                        trainable=False,
                        name=f"{shard_name}/{spec.name}",
                        dtype=shard.dtype,
                    )
            self.full.append(slots)

    @property
    def variables(self) -> list[tf.Variable]:
        """Every variable, shard by shard."""
        result: list[tf.Variable] = []
        for compact, full in zip(self.compact, self.full):
            result.extend(compact.variables if compact is not None else full.values())
        return result

    def slot_rows_used(self) -> int:
        """Compact slot rows in use, over all shards (read eagerly)."""
        return sum(int(c.rows_used.numpy()) for c in self.compact if c is not None)

    def release_evicted(self, row_mask: ShardedRowMask) -> None:
        """Gives back, shard by shard, the optimizer state of the rows the
        table's row admission evicted since the last step (see
        ``_slot_store.release_evicted_rows``)."""
        admission = self.admission
        if admission is None or admission.capacity is None:
            return
        rows, valid, overflow = admission.drain_evicted()
        _, local_ids = ids_per_shard(tf.boolean_mask(rows, valid), self.starts)
        candidates = masks_per_shard(admission.candidates, self.starts)
        for index, shard in enumerate(self.shards):
            with tf.device(shard.device):
                writable = candidates[index]
                if isinstance(writable, tf.Variable):
                    writable = writable.value()
                local = local_ids[index]
                everywhere = tf.ones(tf.shape(local), tf.bool)
                compact = self.compact[index]
                if compact is not None:
                    if compact.recycles:
                        compact.release(
                            local, everywhere, overflow, row_mask.shard_mask(index), writable
                        )
                    continue
                for spec in self.specs:
                    reset_rows(
                        self.full[index][spec.name], local, everywhere, spec.initial_value, writable
                    )

    def apply(
        self,
        rule: Any,
        row_rule: row_rules.RowRule,
        gradient: tf.IndexedSlices,
        row_mask: ShardedRowMask,
        learning_rate: Any,
        table: Any,
    ) -> None:
        """Each shard's rows of ``gradient`` (global ids, deduplicated,
        frozen rows zero), with local ids, updated on the shard's device."""
        positions, local_ids = ids_per_shard(gradient.indices, self.starts)
        for index, shard in enumerate(self.shards):
            with tf.device(shard.device):
                local = tf.IndexedSlices(
                    tf.gather(gradient.values, positions[index]),
                    local_ids[index],
                    tf.shape(shard, out_type=local_ids[index].dtype),
                )
                step = _ShardRowStep(
                    rule,
                    local,
                    shard,
                    row_mask.shard_mask(index),
                    learning_rate,
                    compact=self.compact[index],
                    table=table,
                    slots=self.full[index],
                )
                if not step.empty:
                    row_rule.update_for(local, shard).apply(step)


def check_constraint(variable: Any) -> None:
    """A sharded table's constraint would need the whole table: rejected."""
    if getattr(variable, "constraint", None) is not None:
        raise PartialEmbeddingArgumentError(
            f"MaskedOptimizer: the sharded variable {variable.name} has a constraint; "
            "constraints on ShardedVariable tables are not supported"
        )
