"""Row admission: a layer's candidate rows train once the data has shown them often enough.

``RowAdmission`` is the policy a user passes (``PartialEmbedding(...,
admission=pe.RowAdmission(min_count=3, capacity=100_000))``); ``AdmissionState``
is what a built layer keeps for it and runs at every training call. The rules
(docs/row_admission.md):

* The rows the layer's mask permits are the candidates. A candidate trains
  once it is admitted; a row that is not a candidate never trains.
* Each training call counts, for every candidate row in the batch, one more
  batch in which it appeared (duplicates count once) and records the call's
  step (1, 2, ...) as its last-seen step.
* A row is admitted in the batch whose count reaches ``min_count``, and that
  batch trains it already.
* With a ``capacity``, at most that many rows are admitted at once. Admitting
  beyond it first evicts admitted rows absent from the batch: ``"lfu"`` the
  lowest count, ties to the least recently seen, then the smaller id;
  ``"lru"`` the least recently seen, then the smaller id. An evicted row's
  count restarts from 0, its optimizer state is released (a
  ``MaskedOptimizer`` drains the rows evicted since its last step) and its
  value is kept or redrawn from the layer's initializer (``on_evict``). When
  more rows want in than there is room for, the most often seen win, ties to
  the smaller id; the others wait until their next batch.

The layer's table carries the admitted mask (not the candidates) as its row
mask (``_internal.row_mask.ROW_MASK_ATTRIBUTE``): the lookup, the gradient and
``MaskedOptimizer`` see only admitted rows. The admitted mask carries this
state under ``ADMISSION_ATTRIBUTE``, through which the optimizer finds the
evicted rows and the rows to reserve slots for.

A step that admits or evicts nothing is O(batch): a sort of the batch's ids,
gathers and scatters of their rows. Evicting is O(capacity) (the admitted list
is read whole, only in that branch). Every shape is static, so the same code
runs under XLA, where out-of-range ids are skipped (as the lookup skips them)
instead of refused.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.row_mask import ADMISSION_ATTRIBUTE, ids_to_row_mask
from partial_embedding._internal.scattered import read_rows, write_rows_where
from partial_embedding._internal.variables import gather_rows, resolve_variable
from partial_embedding._loader import load_ops
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.ops import masked_scatter_sub

__all__ = ["RowAdmission"]

#: ``eviction`` values.
EVICTION_POLICIES = ("lfu", "lru")
#: ``on_evict`` values.
ON_EVICT_CHOICES = ("keep", "reinitialize")


def _positive_integer(value: Any, argument: str, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        expected = "None or an integer >= 1" if allow_none else "an integer >= 1"
        raise PartialEmbeddingArgumentError(f"{argument}: expected {expected}, got {value!r}")
    if int(value) < 1:
        raise PartialEmbeddingArgumentError(f"{argument}: must be >= 1, got {int(value)}")
    return int(value)


@keras.saving.register_keras_serializable(package="partial_embedding")
class RowAdmission:
    """Which candidate rows train: seen in ``min_count`` batches, at most ``capacity`` at once.

    Passed as ``PartialEmbedding(..., admission=RowAdmission(...))`` (or to
    ``PartialReversibleEmbedding``). The layer's trainable rows
    (``trainable_ids``, ``set_trainable_ids``, ``freeze`` / ``unfreeze``)
    become candidates; a candidate trains from the batch in which it has been
    seen in ``min_count`` training batches. Rows never admitted and evicted
    rows stay bit for bit as they are, without optimizer state. The rules and
    their tie-breaks are in docs/row_admission.md.

    Args:
      min_count: Training batches a candidate must appear in (duplicates in a
        batch count once) before it trains; 1 admits it at first sight.
      capacity: Most rows admitted at once; None for no limit.
      eviction: Which admitted row makes room (only with a ``capacity``):
        ``"lfu"`` (the lowest count, ties to the least recently seen) or
        ``"lru"`` (the least recently seen).
      on_evict: ``"keep"`` an evicted row's value, or ``"reinitialize"`` it
        from the layer's ``embeddings_initializer``.

    Raises:
      PartialEmbeddingArgumentError: ``min_count < 1``, ``capacity < 1``, an
        unknown ``eviction`` or ``on_evict``, each named with its value.

    >>> import partial_embedding as pe
    >>> pe.RowAdmission(min_count=2, capacity=1000)
    RowAdmission(min_count=2, capacity=1000, eviction='lfu', on_evict='keep')
    """

    __module__ = "partial_embedding"

    def __init__(
        self,
        min_count: int = 1,
        capacity: int | None = None,
        eviction: str = "lfu",
        on_evict: str = "keep",
    ) -> None:
        self.min_count = _positive_integer(min_count, "min_count", allow_none=False)
        self.capacity = _positive_integer(capacity, "capacity", allow_none=True)
        if not isinstance(eviction, str) or eviction not in EVICTION_POLICIES:
            raise PartialEmbeddingArgumentError(
                f"eviction: expected one of {EVICTION_POLICIES}, got {eviction!r}"
            )
        if not isinstance(on_evict, str) or on_evict not in ON_EVICT_CHOICES:
            raise PartialEmbeddingArgumentError(
                f"on_evict: expected one of {ON_EVICT_CHOICES}, got {on_evict!r}"
            )
        self.eviction = eviction
        self.on_evict = on_evict

    def get_config(self) -> dict[str, Any]:
        return {
            "min_count": self.min_count,
            "capacity": self.capacity,
            "eviction": self.eviction,
            "on_evict": self.on_evict,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RowAdmission:
        return cls(**config)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowAdmission) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(tuple(self.get_config().items()))

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"RowAdmission({arguments})"


def checked_admission(admission: Any) -> RowAdmission | None:
    """``admission`` as a ``RowAdmission`` (a config dict is deserialized), or None.

    Raises:
      PartialEmbeddingTypeError: anything else.
    """
    if admission is None or isinstance(admission, RowAdmission):
        return admission
    if isinstance(admission, dict):
        config = admission.get("config", admission)
        if isinstance(config, dict) and set(config) <= {
            "min_count",
            "capacity",
            "eviction",
            "on_evict",
        }:
            return RowAdmission(**config)
    raise PartialEmbeddingTypeError(
        f"admission: expected None or a partial_embedding.RowAdmission, got {admission!r}"
    )


# -- writes and reads of the state ------------------------------------------------


def _state_variable(variable: Any, name: str) -> Any:
    """The tf.Variable behind a state variable (this replica's copy inside a
    strategy's update), or its ShardedVariable: a ParameterServerStrategy's
    partitioner splits the ``[V]`` counters as it splits the table, so each
    shard sits beside the table's rows it counts."""
    sharded = framework_private.sharded_variable(variable)
    return sharded if sharded is not None else resolve_variable(variable, argument=name)


def _value(variable: Any) -> tf.Tensor:
    """A whole state variable's value (a ShardedVariable's shards joined)."""
    return tf.convert_to_tensor(variable)


def _stable_order(keys: list[tf.Tensor]) -> tf.Tensor:
    """The permutation that sorts positions by ``keys`` (int64 ``[C]``,
    most significant first), ties to the earlier position."""
    order = tf.range(tf.shape(keys[0])[0])
    for key in reversed(keys):
        order = tf.gather(order, tf.argsort(tf.gather(key, order), stable=True))
    return order


def _ranks(order: tf.Tensor) -> tf.Tensor:
    """The rank of each position in the permutation ``order``."""
    size = tf.shape(order)[0]
    return tf.scatter_nd(tf.expand_dims(order, 1), tf.range(size), [size])


class AdmissionState:
    """What a built layer keeps for its ``RowAdmission``.

    Saved with the layer (Keras weights): ``admitted_mask`` (bool ``[V]``, the
    table's row mask), ``admission_counts`` and ``admission_last_seen`` (int64
    ``[V]``), ``admission_step`` and ``admitted_count`` (int64 scalars) and,
    with a capacity, ``admitted_list`` (int64 ``[capacity]``, the admitted
    ids first, then -1). Not saved: the rows evicted since the optimizer last
    released their state (``evicted_rows``, int64 ``[2 * capacity]``, and
    ``evicted_count``): a ``MaskedOptimizer`` step drains them before it
    updates, so between steps, where a model is saved, there are none.
    """

    def __init__(self, layer: Any, policy: RowAdmission) -> None:
        self.policy = policy
        self.num_rows = int(layer.input_dim)
        self.candidates = layer.trainable_mask
        self._layer = layer
        num_rows = self.num_rows

        def constant(value: Any, dtype: Any) -> Any:
            def initializer(shape: Any, dtype: Any = dtype) -> Any:
                return np.full(shape, value, dtype=dtype)

            return initializer

        def weight(name: str, shape: tuple, value: Any, dtype: str) -> Any:
            variable = layer.add_weight(
                shape=shape,
                initializer=constant(value, dtype),
                dtype=dtype,
                name=name,
                trainable=False,
            )
            # An attribute of the layer: tf.train.Checkpoint saves it by name.
            setattr(layer, name, variable)
            return variable

        self.admitted = weight("admitted_mask", (num_rows,), False, "bool")
        self.counts = weight("admission_counts", (num_rows,), 0, "int64")
        self.last_seen = weight("admission_last_seen", (num_rows,), 0, "int64")
        self.step = weight("admission_step", (), 0, "int64")
        self.admitted_count = weight("admitted_count", (), 0, "int64")
        self.admitted_list = None
        self.evicted_rows = None
        self.evicted_count = None
        capacity = policy.capacity
        if capacity is not None:
            self.admitted_list = weight("admitted_list", (capacity,), -1, "int64")
            target = _state_variable(self.admitted, "admitted_mask")
            strategy = tf.distribute.get_strategy()
            placement = (
                strategy.extended.colocate_vars_with(target)
                if isinstance(target, tf.Variable)
                else contextlib.nullcontext()  # A ShardedVariable: wherever its strategy puts them.
            )
            with tf.init_scope(), placement:
                self.evicted_rows = tf.Variable(
                    tf.fill([2 * capacity], tf.constant(-1, tf.int64)),
                    trainable=False,
                    name="evicted_rows",
                )
                self.evicted_count = tf.Variable(
                    tf.constant(0, tf.int64), trainable=False, name="evicted_count"
                )
        # What the kernel takes in place of the list and the record without
        # a capacity (it never touches them then).
        with tf.init_scope():
            self._unused = {
                "list": tf.Variable(tf.zeros([0], tf.int64), trainable=False, name="unused_list"),
                "rows": tf.Variable(tf.zeros([0], tf.int64), trainable=False, name="unused_rows"),
                "count": tf.Variable(tf.constant(0, tf.int64), trainable=False, name="unused"),
            }
        self._reinitializer: Any = None
        if policy.on_evict == "reinitialize":
            self._reinitializer = _reseeding(layer.embeddings_initializer)
        # The optimizer's way in (plain attributes: not tracked), on the
        # Keras variable and on what it holds.
        for holder in {
            id(v): v for v in (self.admitted, _state_variable(self.admitted, "admitted_mask"))
        }.values():
            setattr(holder, ADMISSION_ATTRIBUTE, self)

    # -- what the optimizer asks ------------------------------------------------

    @property
    def capacity(self) -> int | None:
        return self.policy.capacity

    def candidate_values(self) -> np.ndarray:
        """The candidate mask now (read eagerly)."""
        with tf.init_scope():
            return np.asarray(tf.convert_to_tensor(self.candidates).numpy(), dtype=bool)

    def drain_evicted(self) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The rows evicted since the last drain, and forgets them.

        Returns:
          ``(rows, valid, overflow)``: int64 ``[2 * capacity]`` rows (0 where
          not ``valid``), bool ``[2 * capacity]``, and whether more were
          evicted than that holds (then the caller must release every row
          that is not admitted).
        """
        assert self.evicted_rows is not None and self.evicted_count is not None
        rows_variable = _state_variable(self.evicted_rows, "evicted_rows")
        count_variable = _state_variable(self.evicted_count, "evicted_count")
        count = _value(count_variable)
        rows = _value(rows_variable)
        size = tf.shape(rows, out_type=tf.int64)[0]
        valid = tf.range(size) < count
        with tf.control_dependencies([rows, count]):
            count_variable.assign(tf.zeros([], tf.int64))
        return tf.where(valid, rows, tf.zeros([], tf.int64)), valid, count > size

    # -- a training call ----------------------------------------------------------

    def observe(self, ids: tf.Tensor, ignore_negative: bool = False) -> None:
        """Counts the batch ``ids`` (any shape) and admits or evicts rows.

        Under a strategy with several replicas in sync, every replica's ids
        count: they are gathered and every copy of the state takes the same
        decision. ``ignore_negative``: negative ids are not rows (a bag's
        padding) and are left out; otherwise every id must be in
        ``[0, input_dim)`` (outside XLA an id that is not stops the step
        before anything is written; under XLA it is skipped).
        """
        ids = tf.reshape(ids, [-1])
        if ids.dtype not in (tf.int32, tf.int64):
            ids = tf.cast(ids, tf.int32)
        ids = tf.cast(ids, tf.int64)
        context = tf.distribute.get_replica_context()
        strategy = tf.distribute.get_strategy()
        if (
            tf.distribute.has_strategy()
            and context is not None
            and strategy.num_replicas_in_sync > 1
        ):
            every_id = context.all_gather(ids, axis=0)

            def update_everywhere(distribution: Any, gathered: Any) -> None:
                distribution.extended.update(
                    resolve_variable(self.admitted, argument="admitted_mask"),
                    lambda _, batch: self._observe_local(batch, ignore_negative),
                    args=(gathered,),
                    group=False,
                )

            context.merge_call(update_everywhere, args=(every_id,))
            return
        self._observe_local(ids, ignore_negative)

    def _variables(self) -> dict[str, tf.Variable]:
        names = ["admitted", "counts", "last_seen", "step", "admitted_count", "candidates"]
        if self.admitted_list is not None:
            names += ["admitted_list", "evicted_rows", "evicted_count"]
        return {name: _state_variable(getattr(self, name), name) for name in names}

    def _uses_kernel(self, state: dict[str, Any]) -> bool:
        """Whether this call takes the compiled CPU kernel: outside XLA, with
        every state variable a whole one on the CPU."""
        if in_xla_context():
            return False
        for variable in state.values():
            if not isinstance(variable, tf.Variable):  # A ShardedVariable.
                return False
            device = variable.device or ""
            if device and tf.DeviceSpec.from_string(device).device_type != "CPU":
                return False
        return True

    def _observe_with_kernel(
        self, state: dict[str, Any], ids: tf.Tensor, ignore_negative: bool
    ) -> None:
        """One batch through ``RowAdmissionObserve``: every write in place,
        O(batch), and O(capacity) when it evicts."""
        policy = self.policy
        unused = self._unused
        evicted = load_ops().partial_embedding_row_admission_observe(
            candidates=state["candidates"].handle,
            admitted=state["admitted"].handle,
            counts=state["counts"].handle,
            last_seen=state["last_seen"].handle,
            step=state["step"].handle,
            admitted_count=state["admitted_count"].handle,
            admitted_list=state.get("admitted_list", unused["list"]).handle,
            evicted_rows=state.get("evicted_rows", unused["rows"]).handle,
            evicted_count=state.get("evicted_count", unused["count"]).handle,
            ids=ids,
            min_count=policy.min_count,
            capacity=-1 if policy.capacity is None else policy.capacity,
            eviction=policy.eviction,
            ignore_negative=ignore_negative,
        )
        if self._reinitializer is not None:
            self._reinitialize(evicted, tf.ones(tf.shape(evicted), tf.bool))

    def _observe_local(self, ids: tf.Tensor, ignore_negative: bool) -> None:
        state = self._variables()
        num_rows = self.num_rows
        xla = in_xla_context()
        if tf.executing_eagerly():  # Our message for a bad id, on either path.
            self._check_ids_eagerly(ids, ignore_negative)
        if self._uses_kernel(state):
            self._observe_with_kernel(state, ids, ignore_negative)
            return
        inside = tf.logical_and(ids >= 0, ids < num_rows)
        if xla:
            probe = tf.where(inside, ids, tf.zeros_like(ids))
        else:
            # Outside XLA a bad id stops the call before anything is written:
            # eagerly with our message (above), in a graph by the
            # bounds-checked read below ("indices[i] = v is not in [0, V)"),
            # whose values every write depends on. (Ids outside [0, V) never
            # reach a write.)
            probe = ids if not ignore_negative else tf.where(ids < 0, tf.zeros_like(ids), ids)
        counted = tf.logical_and(inside, read_rows(state["candidates"], probe))
        # Sorted candidate ids, the others last (as row num_rows): one flag
        # per distinct candidate row, static shapes throughout.
        keyed = tf.sort(tf.where(counted, ids, tf.constant(num_rows, tf.int64)))
        previous = tf.concat([tf.constant([-1], tf.int64), keyed[:-1]], 0)
        candidate = tf.logical_and(tf.not_equal(keyed, previous), keyed < num_rows)
        rows = tf.minimum(keyed, num_rows - 1)
        with tf.control_dependencies([keyed]):  # After the bounds check.
            step = state["step"].assign_add(1)
        write_rows_where(state["counts"], rows, tf.ones_like(rows), candidate, add=True)
        write_rows_where(state["last_seen"], rows, tf.fill(tf.shape(rows), step), candidate)
        counts = read_rows(state["counts"], rows)
        admitted = read_rows(state["admitted"], rows)
        wanting = tf.logical_and(
            tf.logical_and(candidate, tf.logical_not(admitted)),
            counts >= self.policy.min_count,
        )
        if self.policy.capacity is None:
            self._admit(state, rows, wanting)
            return
        capacity = self.policy.capacity
        wanted = tf.reduce_sum(tf.cast(wanting, tf.int64))
        free = capacity - _value(state["admitted_count"])

        def admit_all() -> tf.Tensor:
            self._admit(state, rows, wanting)
            return tf.constant(True)

        def evict_then_admit() -> tf.Tensor:
            self._evict_then_admit(state, rows, wanting, counts, wanted, free, step)
            return tf.constant(True)

        tf.cond(wanted <= free, admit_all, evict_then_admit)

    def _check_ids_eagerly(self, ids: tf.Tensor, ignore_negative: bool) -> None:
        """Refuses, naming it, an id outside ``[0, input_dim)`` (negative
        ones are padding with ``ignore_negative``)."""
        values = ids.numpy()
        outside = (values >= self.num_rows) | ((values < 0) & (not ignore_negative))
        positions = np.flatnonzero(outside)
        if positions.size:
            position = int(positions[0])
            raise PartialEmbeddingArgumentError(
                f"ids: id {int(values[position])} (at position {position}) is not in "
                f"[0, {self.num_rows}); row admission counted nothing"
            )

    def _admit(self, state: dict[str, tf.Variable], rows: tf.Tensor, chosen: tf.Tensor) -> None:
        """Admits ``rows`` where ``chosen`` (distinct, not admitted)."""
        write_rows_where(state["admitted"], rows, tf.ones_like(chosen), chosen)
        count = state["admitted_count"]
        if self.policy.capacity is not None:
            rank = tf.cumsum(tf.cast(chosen, tf.int64), exclusive=True)
            write_rows_where(state["admitted_list"], _value(count) + rank, rows, chosen)
        count.assign_add(tf.reduce_sum(tf.cast(chosen, tf.int64)))

    def _evict_then_admit(
        self,
        state: dict[str, tf.Variable],
        rows: tf.Tensor,
        wanting: tf.Tensor,
        counts: tf.Tensor,
        wanted: tf.Tensor,
        free: tf.Tensor,
        step: tf.Tensor,
    ) -> None:
        """More rows want in than there is room for: evicts admitted rows
        absent from the batch, as few as needed, then admits the most often
        seen of the others (O(capacity))."""
        capacity = int(self.policy.capacity)  # type: ignore[arg-type]
        listed = _value(state["admitted_list"])
        used = _value(state["admitted_count"])
        positions = tf.range(capacity, dtype=tf.int64)
        occupied = positions < used
        listed_rows = tf.where(occupied, listed, tf.zeros([], tf.int64))
        listed_counts = read_rows(state["counts"], listed_rows)
        listed_seen = read_rows(state["last_seen"], listed_rows)
        evictable = tf.logical_and(occupied, tf.not_equal(listed_seen, step))
        last = tf.constant(np.iinfo(np.int64).max, tf.int64)
        if self.policy.eviction == "lfu":
            keys = [tf.where(evictable, listed_counts, last), listed_seen, listed_rows]
        else:
            keys = [tf.where(evictable, listed_seen, last), listed_rows]
        rank = tf.cast(_ranks(_stable_order(keys)), tf.int64)
        evict_count = tf.minimum(wanted - free, tf.reduce_sum(tf.cast(evictable, tf.int64)))
        evicted = tf.logical_and(evictable, rank < evict_count)
        self._evict(state, listed_rows, evicted)
        # The list without the evicted rows, in its order.
        kept = tf.logical_and(occupied, tf.logical_not(evicted))
        kept_count = tf.reduce_sum(tf.cast(kept, tf.int64))
        compacted = tf.argsort(tf.where(kept, positions, positions + capacity), stable=True)
        state["admitted_list"].assign(
            tf.where(positions < kept_count, tf.gather(listed, compacted), -1)
        )
        state["admitted_count"].assign(kept_count)
        # The most often seen of the wanting rows win, ties to the smaller id
        # (rows are sorted).
        room = capacity - kept_count
        order = tf.argsort(
            tf.where(wanting, counts, tf.constant(-1, tf.int64)),
            direction="DESCENDING",
            stable=True,
        )
        chosen = tf.logical_and(wanting, tf.cast(_ranks(order), tf.int64) < room)
        self._admit(state, rows, chosen)

    def _evict(self, state: dict[str, tf.Variable], rows: tf.Tensor, evicted: tf.Tensor) -> None:
        """Evicts ``rows`` where ``evicted`` (distinct, admitted): no longer
        admitted, counts from 0, recorded for the optimizer, and redrawn with
        ``on_evict="reinitialize"``."""
        write_rows_where(state["admitted"], rows, tf.zeros_like(evicted), evicted)
        write_rows_where(state["counts"], rows, tf.zeros_like(rows), evicted)
        self._record_evicted(state, rows, evicted)
        if self._reinitializer is not None:
            self._reinitialize(rows, evicted)

    def _record_evicted(
        self, state: dict[str, tf.Variable], rows: tf.Tensor, evicted: tf.Tensor
    ) -> None:
        count = state["evicted_count"]
        first = _value(count)
        positions = first + tf.cumsum(tf.cast(evicted, tf.int64), exclusive=True)
        room = tf.shape(state["evicted_rows"], out_type=tf.int64)[0]
        write_rows_where(
            state["evicted_rows"], positions, rows, tf.logical_and(evicted, positions < room)
        )
        count.assign_add(tf.reduce_sum(tf.cast(evicted, tf.int64)))

    def _reinitialize(self, rows: tf.Tensor, evicted: tf.Tensor) -> None:
        """Redraws the table's ``rows`` where ``evicted``: two in-place
        subtractions, ``x - x = 0`` then ``0 - (-new) = new``, both exact."""
        layer = self._layer
        table = layer.embeddings
        dtype = tf.as_dtype(table.dtype)
        # At most `capacity` rows leave in one batch: one draw of that many,
        # of which the first len(rows) are used.
        size = int(self.policy.capacity)  # type: ignore[arg-type]
        drawn = tf.cast(
            self._reinitializer(shape=(size, layer.output_dim), dtype=dtype.name), dtype
        )[: tf.shape(rows)[0]]
        where = tf.reshape(evicted, [-1, 1])
        current = gather_rows(table, rows)
        mask = self.candidates
        masked_scatter_sub(table, rows, tf.where(where, current, tf.zeros_like(current)), mask)
        masked_scatter_sub(table, rows, tf.where(where, -drawn, tf.zeros_like(drawn)), mask)

    # -- eager: the user changed the candidates ---------------------------------------

    def candidates_changed(self, mask: np.ndarray) -> None:
        """Called eagerly after the candidate mask became ``mask``: admitted
        rows that are no longer candidates leave, as if evicted: their counts
        start from 0 and their values stay. (The layer then tells the
        optimizer, ``mask_changed``: compact slots that recycle give their
        slot rows back at once; without a capacity, they keep them, as a
        frozen row of a plain layer keeps its state.)"""
        with tf.init_scope():
            admitted = np.asarray(self.admitted.numpy(), dtype=bool)
            leaving = admitted & ~mask
            if not leaving.any():
                return
            self.admitted.assign(admitted & mask)
            counts = np.asarray(self.counts.numpy())
            counts[leaving] = 0
            self.counts.assign(counts)
            self.admitted_count.assign(int(np.count_nonzero(admitted & mask)))
            if self.admitted_list is None:
                return
            listed = np.asarray(self.admitted_list.numpy())
            kept = [row for row in listed[listed >= 0] if not leaving[row]]
            self.admitted_list.assign(
                np.array(kept + [-1] * (len(listed) - len(kept)), dtype=np.int64)
            )

    # -- reads --------------------------------------------------------------------------

    def admitted_ids(self) -> np.ndarray:
        with tf.init_scope():
            return np.flatnonzero(np.asarray(self.admitted.numpy(), dtype=bool)).astype(np.int64)

    def row_counts(self, ids: Any) -> np.ndarray:
        array = np.asarray(ids.numpy() if hasattr(ids, "numpy") else ids)
        if array.dtype == np.bool_ or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise PartialEmbeddingTypeError(
                f"ids: row ids must be integers, got dtype {array.dtype}"
            )
        ids_to_row_mask(array.astype(np.int64), "ids", self.num_rows)  # Range check.
        with tf.init_scope():
            counts = np.asarray(self.counts.numpy(), dtype=np.int64)
        return counts[array.astype(np.int64)]


def _reseeding(initializer: Any) -> Any:
    """``initializer``, or a copy drawing new values at every call: a Keras
    random initializer with an integer seed (or none) draws the same values
    each time; its copy takes a ``SeedGenerator`` seeded from it."""
    seed = getattr(initializer, "seed", None)
    if not isinstance(initializer, keras.initializers.Initializer) or not hasattr(
        initializer, "seed"
    ):
        return initializer
    if isinstance(seed, keras.random.SeedGenerator):
        return initializer
    config = initializer.get_config()
    copy = type(initializer).from_config(config)
    copy.seed = keras.random.SeedGenerator(seed if isinstance(seed, int) else None)
    return copy
