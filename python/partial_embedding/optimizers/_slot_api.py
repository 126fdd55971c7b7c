"""The public slot API of MaskedOptimizer: slots by name, and their values by
table row whatever the layout (compact or full-size, sharded or not)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.checks import checked_row_ids
from partial_embedding._internal.types import KerasOptimizer, RowIds, TensorLike, Variable
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.optimizers import _row_rules as row_rules
from partial_embedding.optimizers import _slot_store as slot_store
from partial_embedding.optimizers._compact_slots import SlotSpec
from partial_embedding.optimizers._slot_store import SlotStore, variable_path


class SlotAPI:
    """Slots by name and by row (a mixin of ``MaskedOptimizer``, which sets
    the attributes below)."""

    _base_optimizer: KerasOptimizer
    _row_rule: row_rules.RowRule
    _slot_store: SlotStore
    _skipped_updates_warned: int
    built: bool

    def _key(self, variable: Variable) -> Any:
        raise NotImplementedError

    def slot_names(self) -> list[str]:
        """The names of the slots the wrapped optimizer keeps per variable.

        The names :meth:`slot_variable` and :meth:`slot_rows` take, in the order
        the row rule reads them (``SGD`` with momentum: ``["momentum"]``;
        ``Adam``: ``["momentum", "velocity"]``; ``SGD`` without momentum:
        ``[]``).

        >>> import keras, partial_embedding as pe
        >>> pe.MaskedOptimizer(keras.optimizers.Adam()).slot_names()
        ['momentum', 'velocity']
        """
        return [spec.name for spec in self._row_rule.slots(self._base_optimizer)]

    def slot_variable(self, variable: Variable, name: str) -> tf.Variable | list[tf.Variable]:
        """The slot ``name`` of ``variable``, as it is stored.

        Full-size slots (Keras' own, and those of a variable without a mask)
        are a ``[V, ...]`` variable indexed by row. Compact slots are a
        ``[S, ...]`` variable of slot rows, in the order rows first trained
        (read a row's values with :meth:`slot_rows`). For a sharded table
        (``ParameterServerStrategy``), a list with one such variable per
        shard, in row order, each on the shard's parameter server (full-size
        ones indexed by the shard's local row ids).

        Raises:
          PartialEmbeddingArgumentError: the optimizer is not built, does not
            train ``variable``, or has no slot ``name``.

        >>> import numpy as np, keras, partial_embedding as pe
        >>> table = keras.Variable(np.zeros((6, 2), "float32"))
        >>> mask = keras.Variable([False, True, False, False, False, False])
        >>> optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(), row_masks=[(table, mask)])
        >>> optimizer.build([table])
        >>> optimizer.slot_variable(table, "velocity").numpy().shape  # compact: 1 row
        (1, 2)
        """
        key = self._checked_slot_variable(variable, name)
        return self._slot_store.stored_slot(key, name, lambda: self._keras_slot(variable, name))

    def slot_rows(self, variable: Variable, name: str, ids: RowIds) -> np.ndarray:
        """The values of the slot ``name`` at table rows ``ids``, whatever the layout.

        Compact or full-size, sharded or not: one row of values per id
        (repeats allowed). A row without slot state (compact slots of a row
        no step has updated) reads as the slot's initial value, as Keras'
        full-size slot holds for it.

        Args:
          variable: A variable the optimizer trains.
          name: One of :meth:`slot_names`.
          ids: Row ids ``[N]``, each in ``[0, V)``.

        Returns:
          A ``[N, ...]`` array of the variable's dtype (``[N]`` for a per-row
          slot).

        Raises:
          PartialEmbeddingArgumentError: the optimizer is not built, does not
            train ``variable``, has no slot ``name``, or an id is out of range.

        >>> import numpy as np, keras, tensorflow as tf, partial_embedding as pe
        >>> table = keras.Variable(np.zeros((6, 2), "float32"))
        >>> mask = keras.Variable([False, True, False, True, False, False])
        >>> optimizer = pe.MaskedOptimizer(keras.optimizers.SGD(1.0, momentum=0.5),
        ...                                row_masks=[(table, mask)])
        >>> grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3]), tf.constant([6, 2]))
        >>> optimizer.apply([grad], [table])
        >>> optimizer.slot_rows(table, "momentum", [3, 1]).tolist()
        [[-1.0, -1.0], [0.0, 0.0]]
        """
        ids, parts = self._slot_request(variable, name, ids)
        dtype = np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype)
        return slot_store.read_slot_rows(parts, ids, self._slot_spec(name).initial_value, dtype)

    def slot_rows_present(self, variable: Variable, ids: RowIds) -> np.ndarray:
        """Whether each of table rows ``ids`` holds slot state: always with
        full-size slots; with compact ones, whether the row has a slot row
        (a step has updated it). A bool ``[N]`` array.

        Raises:
          PartialEmbeddingArgumentError: as :meth:`slot_rows`.
        """
        names = self.slot_names()
        ids, parts = self._slot_request(variable, names[0] if names else None, ids)
        if not names:
            return np.ones(len(ids), dtype=bool)
        return slot_store.slot_rows_present(parts, ids)

    def assign_slot_rows(
        self,
        variable: Variable,
        name: str,
        ids: RowIds,
        values: TensorLike,
        present: RowIds | None = None,
    ) -> None:
        """Writes ``values`` to the slot ``name`` at table rows ``ids``, in place.

        Every argument is checked before anything is written. With compact
        slots a row marked ``present`` takes a slot row if it has none (as a
        step that updates it would); a row not marked ``present`` that has
        none keeps none and reads as the initial value afterwards.

        Args:
          variable: A variable the optimizer trains.
          name: One of :meth:`slot_names`.
          ids: Distinct row ids ``[N]``, each in ``[0, V)``.
          values: ``[N, ...]`` values (the variable's row shape), or ``[N]``
            for a per-row slot (``RowwiseAdagrad``, ``RowwiseAdam``).
          present: Bool ``[N]``: which rows hold slot state (see
            :meth:`slot_rows_present`); default: all.

        Raises:
          PartialEmbeddingArgumentError: as :meth:`slot_rows`; ``ids`` repeat;
            ``values`` or ``present`` has the wrong shape.

        >>> import numpy as np, keras, partial_embedding as pe
        >>> table = keras.Variable(np.zeros((6, 2), "float32"))
        >>> mask = keras.Variable([False, True, False, True, False, False])
        >>> optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(), row_masks=[(table, mask)])
        >>> optimizer.build([table])
        >>> optimizer.assign_slot_rows(table, "velocity", [3], [[2.0, 4.0]])
        >>> optimizer.slot_rows(table, "velocity", [3, 1]).tolist()
        [[2.0, 4.0], [0.0, 0.0]]
        """
        ids, parts = self._slot_request(variable, name, ids)
        if np.unique(ids).size != ids.size:
            raise PartialEmbeddingArgumentError("ids: repeat (each row may be written once)")
        dtype = np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype)
        values = np.asarray(values, dtype=dtype)
        # One value per row for a per-row slot (RowwiseAdagrad, RowwiseAdam).
        per_row = self._slot_spec(name).per_row
        expected = (len(ids),) if per_row else (len(ids), *variable.shape[1:])
        if values.shape != expected:
            raise PartialEmbeddingArgumentError(
                f"values: shape {values.shape} must be {expected} (one row per id)"
            )
        present = np.ones(len(ids), bool) if present is None else np.asarray(present, bool)
        if present.shape != (len(ids),):
            raise PartialEmbeddingArgumentError(
                f"present: shape {present.shape} must be ({len(ids)},) (one entry per id)"
            )
        slot_store.write_slot_rows(parts, ids, values, present)

    def _slot_spec(self, name: str) -> SlotSpec:
        """The rule's slot ``name`` (one of :meth:`slot_names`)."""
        return next(s for s in self._row_rule.slots(self._base_optimizer) if s.name == name)

    def _checked_slot_variable(self, variable: Variable, name: str | None) -> Any:
        """The key of ``variable`` once the request is known to be valid."""
        if not self.built:
            raise PartialEmbeddingArgumentError(
                "optimizer: not built yet; call optimizer.build(model.trainable_variables) first"
            )
        key = self._key(variable)
        if all(self._key(v) != key for v in framework_private.trainable_variables(self)):
            raise PartialEmbeddingArgumentError(
                f"variable: the optimizer has no slots for {variable_path(variable)}: it does "
                "not train it (was it built with the layer's trainable variables?)"
            )
        names = self.slot_names()
        if name is not None and name not in names:
            raise PartialEmbeddingArgumentError(
                f"name: {name!r} is not a slot of {type(self._base_optimizer).__name__}; "
                f"its slots are {names}"
            )
        return key

    def _slot_request(
        self, variable: Variable, name: str | None, ids: RowIds
    ) -> tuple[np.ndarray, list[slot_store.SlotPart]]:
        """The checked ``ids`` and where ``variable``'s rows keep slot
        ``name`` (none without a name), once every argument is valid."""
        key = self._checked_slot_variable(variable, name)
        ids = checked_row_ids(ids, int(variable.shape[0]))
        if name is None:
            return ids, []
        parts = self._slot_store.parts(
            key, variable, name, lambda: self._keras_slot(variable, name)
        )
        return ids, parts

    def _keras_slot(self, variable: Variable, name: str) -> tf.Variable:
        """The wrapped optimizer's own (full-size) slot ``name`` of ``variable``."""
        return framework_private.slot(self._base_optimizer, name, variable)

    @property
    def base_optimizer(self) -> KerasOptimizer:
        """The Keras optimizer whose rule and hyperparameters a step uses: the
        inner optimizer, or the one inside an inner ``LossScaleOptimizer``."""
        return self._base_optimizer

    # -- updates XLA steps skipped -------------------------------------------------

    @property
    def skipped_row_updates(self) -> int:
        """How many row updates XLA-compiled steps have skipped so far.

        Compact slots cannot grow inside an XLA step: a permitted row that
        finds no free slot row (its mask variable was assigned directly,
        not through ``PartialEmbedding``'s ``freeze`` / ``unfreeze`` /
        ``set_trainable_ids`` or :meth:`set_row_mask`, which reserve room)
        skips its update. Read eagerly; neither saved nor in the config.
        Reading it (and the next eager ``apply``, and the end of ``fit``)
        warns once for each new count.

        >>> import keras, partial_embedding as pe
        >>> pe.MaskedOptimizer(keras.optimizers.Adam()).skipped_row_updates
        0
        """
        count = self._slot_store.skipped_updates() if self.built else 0
        if count > self._skipped_updates_warned:
            self._skipped_updates_warned = count
            warnings.warn(
                f"MaskedOptimizer: XLA steps skipped {count} row update(s) so far: rows "
                "permitted by a mask variable assigned directly found no free compact slot "
                "row (an XLA step cannot grow them). Change masks with the layer's "
                "freeze/unfreeze/set_trainable_ids or MaskedOptimizer.set_row_mask, which "
                "reserve room, or build the optimizer with compact_slots=False",
                RuntimeWarning,
                stacklevel=2,
            )
        return count

    def _warn_of_skipped_updates(self) -> None:
        """At an eager point: warns if XLA steps skipped updates since the last warning."""
        if self.built and tf.executing_eagerly() and not tf.inside_function():
            _ = self.skipped_row_updates

    def finalize_variable_values(self, var_list: Any) -> None:
        """Called eagerly by ``fit`` at the end of training: also warns of
        skipped row updates (see :attr:`skipped_row_updates`)."""
        self._warn_of_skipped_updates()
        super().finalize_variable_values(var_list)  # type: ignore[misc]
