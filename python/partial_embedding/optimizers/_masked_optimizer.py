"""MaskedOptimizer's surface and pipeline: the wrapped optimizer's apply(),
masked variables updated by row.

A step: filter empty gradients, unscale (loss scaling), sum the masked
variables' gradients over replicas, sum duplicate rows and zero frozen ones
(unless a fused kernel takes the raw gradient), clip, then update the other
variables with the wrapped optimizer's own step and the masked ones with
their row rule (``_row_rules``), in place. The gradient helpers are in
``_gradients``; the slots the wrapper makes itself (compact, per shard) in
``_slot_store``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import keras
import tensorflow as tf

from partial_embedding._internal import framework_private as keras_internals
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.row_mask import ROW_MASK_ATTRIBUTE, RowMask, watch_mask
from partial_embedding._internal.types import KerasOptimizer, TensorLike, Variable
from partial_embedding._internal.types import RowMask as RowMaskLike
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.ops import resolve_variable
from partial_embedding.optimizers import _cluster as cluster
from partial_embedding.optimizers import _gradients as gradients
from partial_embedding.optimizers import _row_rules as row_rules
from partial_embedding.optimizers import _sharded as sharded
from partial_embedding.optimizers import _slot_store as slot_store
from partial_embedding.optimizers._compact_slots import (
    MAX_SLOT_ROWS,
    CompactSlots,
    fixed_slot_rows,
)
from partial_embedding.optimizers._delegation import Delegation
from partial_embedding.optimizers._mask_lookup import key_matches, normalize_row_masks
from partial_embedding.optimizers._sharded import is_sharded
from partial_embedding.optimizers._slot_api import SlotAPI
from partial_embedding.optimizers._slot_store import (
    COMPACT_KEY,
    COMPACT_SLOTS_CHOICES,
    SlotStore,
    StoreHidingKeys,
    check_compact_arguments,
    variable_path,
)

__all__ = ["COMPACT_SLOTS_CHOICES", "MaskedOptimizer"]


@keras.saving.register_keras_serializable(package="partial_embedding")
class MaskedOptimizer(
    keras_internals.SaveableChildren, SlotAPI, Delegation, keras.optimizers.Optimizer
):
    """Wraps a stock Keras optimizer so masked tables train only permitted rows.

    For every masked variable (the ``embeddings`` of each
    ``partial_embedding.PartialEmbedding``, found automatically, plus those in
    ``row_masks``), a step updates only the rows that are both permitted by the
    mask and present in the gradient (duplicate ids summed first), with the
    wrapped optimizer's own rule and hyperparameters: learning rate (and
    schedule), ``iterations`` and bias correction, weight decay (applied only
    to the updated rows), ``clipnorm`` / ``clipvalue`` / ``global_clipnorm``,
    ``loss_scale_factor``. The variable and its slots are written in place by
    :func:`partial_embedding.masked_scatter_sub`; all other rows of the
    variable and of its slots stay bit-identical. All other variables are
    updated by the wrapped optimizer exactly as without the wrapper.

    The update is *lazy* (like TF's ``SparseApply*`` ops and PyTorch's
    ``SparseAdam``): a row absent from a batch keeps its moments. When every
    permitted row is present in every batch, the result equals the stock
    optimizer applied to a table holding only the permitted rows.

    Supported inner optimizers: ``SGD`` (momentum, nesterov), ``Adam``
    (amsgrad), ``AdamW``, ``Adagrad``, ``RMSprop`` (momentum, centered), or a
    ``LossScaleOptimizer`` around one of them. Keras wraps the optimizer in a
    ``LossScaleOptimizer`` itself under a ``mixed_float16`` policy; with a
    ``LossScaleOptimizer`` *inside* compile with ``auto_scale_loss=False`` so
    the loss is not scaled twice. (Keras' ``LossScaleOptimizer`` *around* the
    wrapper checks gradients with a dense ``isfinite``, one table-sized
    temporary per step; inside, the check looks at the gradient's rows only.)

    A row mask that is a variable (as PartialEmbedding's ``trainable_mask``)
    may be changed at any time; the next step uses it, without retracing.
    Per-step cost and temporaries are proportional to the rows in the batch.

    Under XLA (``model.compile(jit_compile=True)``, ``tf.function(
    jit_compile=True)``) every rule runs on stock ops with static shapes:
    duplicate rows summed by a sort, each variable and slot written by one
    ``ResourceScatterSub`` in which rows that may not change receive
    ``x - 0`` (their bits kept). Results equal the kernel path's up to
    rounding. Compact slots cannot grow inside an XLA step: room is reserved
    eagerly when the step is traced and when ``PartialEmbedding``'s
    ``freeze`` / ``unfreeze`` / ``set_trainable_ids`` or :meth:`set_row_mask`
    change a mask; a row that still finds none (a mask variable assigned
    directly) skips its update until room is made, counted in
    :attr:`skipped_row_updates` and warned of at the next eager point.

    *Compact slots* (``compact_slots``): by default, a masked variable of
    which at most half the rows are permitted when the optimizer is built
    gets slots that hold only its permitted rows (Adam at 1 % permitted: 2 %
    of the table instead of 200 %), plus a float32 ``[V]`` map from a row to
    its slot row (``V`` values). A permitted row takes a slot row the first
    time a step updates it, holding the slot's initial value, so results are
    bit for bit those of full-size slots. A frozen row keeps its slot row,
    untouched, and resumes from it when unfrozen (as with full-size slots).
    When more rows have trained than the slots hold (``freeze`` /
    ``unfreeze`` / ``set_trainable_ids`` made more rows permitted), the slots
    grow inside the step, by half or to what is needed, keeping their
    values: no retracing, no error; slot rows are never given back. Compact
    slots are not in ``variables`` (see :attr:`compact_slot_variables`); they
    are saved and restored by ``tf.train.Checkpoint``, SavedModel and
    ``.keras`` files. ``compact_slots=False`` gives Keras' own full-size
    slots; ``True`` makes them compact at any permitted share. Rules without
    slots (``SGD`` without momentum) need neither.

    The wrapper's ``clipnorm``, ``clipvalue`` and ``global_clipnorm`` are the
    inner optimizer's (reading or setting them here reads or sets them there),
    and :meth:`exclude_from_weight_decay` excludes variables, masked ones
    included, as when called on the inner optimizer before wrapping.

    A masked variable's constraint is applied to its permitted rows only,
    after each step; like any constraint it reads the whole table. Not
    supported: ``use_ema`` and ``gradient_accumulation_steps`` on the inner
    optimizer (rejected at construction).

    Under ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` the masked
    variables' gradients are summed over replicas first, then every copy of
    the variable and of its slots receives the same row update (through
    ``strategy.extended.update``, as Keras' own optimizers do).

    Under ``ParameterServerStrategy`` a masked table that the
    ``variable_partitioner`` split (a ``ShardedVariable``; its mask split
    alike or not) gets each shard's slots on the shard's parameter server,
    made at ``build``, and each shard's rows (local ids) updated there. Take
    the gradient with respect to :meth:`gradient_sources`; ``apply`` takes a
    sharded table's per-shard gradients as its gradient. Compact slots of a
    sharded table have a fixed number of rows per shard (``slot_capacity``,
    by default half as many again as the shard's permitted rows at build,
    plus one): a step that needs more fails. A sharded table may not have a
    constraint.

    Args:
      inner: The optimizer to wrap: an instance (or a name / config accepted
        by ``keras.optimizers.get``) of a supported optimizer.
      row_masks: Optional extra masked variables: a mapping, or an iterable
        of ``(variable, mask)`` pairs. A key is a Keras variable or
        ``tf.Variable`` (Keras and TF variables are not hashable, so use the
        pair form, ``variable.ref()`` or the variable's ``path``/``name``
        string as a mapping key). A mask is a bool variable, tensor or NumPy
        array of shape ``[V]`` for a variable of ``V`` rows (a tensor or
        array is fixed; it serves every trace of a training step). Not saved
        with the optimizer's config (masks are model state): pass them again,
        or call :meth:`set_row_mask`, after loading.
      name: The optimizer's name.
      compact_slots: ``"auto"`` (the default: compact where at most half the
        rows are permitted at build), ``True`` or ``False``.
      slot_capacity: Slot rows each compact variable allocates at build
        (default: its permitted rows then; at least 1). They grow as needed;
        on a sharded table: each shard's slot rows, for good.
      compact_variable_indices: Which of the variables the optimizer is built
        with get compact slots, by position: set by ``from_config`` so that a
        loaded model rebuilds the slots it saved (its masks are loaded only
        later). Leave it None.

    Raises:
      PartialEmbeddingTypeError: ``inner`` is not a supported optimizer.
      PartialEmbeddingArgumentError: ``inner`` uses ``use_ema`` or
        ``gradient_accumulation_steps``; ``compact_slots`` is not ``"auto"``,
        ``True`` or ``False``; ``slot_capacity`` is not None or an int in
        ``[1, 2**24]``.
      ImportError: the installed Keras lacks a private member the wrapper
        relies on (the message names them all).

    >>> import numpy as np, keras, tensorflow as tf, partial_embedding as pe
    >>> table = keras.Variable(np.ones((4, 2), "float32"))
    >>> mask = keras.Variable([True, False, True, False], trainable=False)
    >>> optimizer = pe.MaskedOptimizer(keras.optimizers.SGD(0.5),
    ...                                row_masks=[(table, mask)])
    >>> grad = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([0, 1, 0]),
    ...                         tf.constant([4, 2]))
    >>> optimizer.apply([grad], [table])
    >>> table.numpy().tolist()
    [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    """

    built: bool

    def __init__(
        self,
        inner: KerasOptimizer | str | dict[str, Any],
        row_masks: Mapping[Any, RowMaskLike] | Iterable[tuple[Variable, RowMaskLike]] | None = None,
        name: str | None = None,
        *,
        compact_slots: bool | str = "auto",
        slot_capacity: int | None = None,
        compact_variable_indices: Iterable[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if keras.backend.backend() != "tensorflow":
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer needs the TensorFlow backend of Keras, got "
                f"{keras.backend.backend()!r}"
            )
        if kwargs:
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer does not take optimizer arguments "
                f"({', '.join(sorted(kwargs))}); set them on the inner optimizer"
            )
        check_compact_arguments(compact_slots, slot_capacity)
        if isinstance(inner, (str, dict)):
            inner = keras.optimizers.get(inner)
        keras_internals.check_keras_internals(inner)
        base_optimizer = inner
        if isinstance(inner, keras.optimizers.LossScaleOptimizer):
            base_optimizer = inner.inner_optimizer
        row_rule = row_rules.row_rule_for(base_optimizer)
        if base_optimizer.use_ema:
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer does not support use_ema=True on the inner "
                "optimizer (the moving average would rewrite every row each step)"
            )
        if base_optimizer.gradient_accumulation_steps:
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer does not support gradient_accumulation_steps on "
                "the inner optimizer"
            )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner
        self._base_optimizer = base_optimizer
        self._row_rule = row_rule
        self._loss_scale_optimizer = (
            inner if isinstance(inner, keras.optimizers.LossScaleOptimizer) else None
        )
        self._requested_masks: list[tuple[Any, Any]] = list(normalize_row_masks(row_masks))
        # var_key(variable) -> RowMask, filled at build.
        self._row_masks: dict[int, RowMask] = {}
        self.compact_slots = compact_slots
        self.slot_capacity = slot_capacity
        # Positions (in the list the optimizer is built with) of the variables
        # with compact slots, as saved in a config: a model being loaded
        # builds the slots it saved, whatever its masks hold before their
        # values are loaded. None: decide at build.
        self._saved_compact_indices = slot_store.compact_indices(compact_variable_indices)
        # The slots this wrapper makes itself (compact, per shard) and the
        # XLA scratch, in a holder neither Keras nor TensorFlow tracks; its
        # two variable containers are tracked here, under the attribute
        # names that fix their checkpoint keys.
        self._slot_store = SlotStore()
        self._skipped_updates_warned = 0
        self._compact_slot_state = self._slot_store.compact_state
        self._shard_slot_state = self._slot_store.shard_state

    # -- masks -----------------------------------------------------------------

    def _key(self, variable: Any) -> Any:
        """The key of ``variable`` (the same for every copy of a mirrored one)."""
        return keras_internals.var_key(self, variable)

    def set_row_mask(self, variable: Variable, row_mask: RowMaskLike) -> None:
        """Makes ``variable`` masked by ``row_mask`` (bool ``[V]``).

        Call it before the first training step (or before ``fit`` builds its
        train function): a traced step keeps the variables it was traced
        with. To change which rows are permitted later, assign to the mask
        variable instead.
        """
        self._requested_masks.append((variable, row_mask))
        if self.built:
            self._resolve_masks(keras_internals.trainable_variables(self))
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

    # -- build: masks, then where each variable's slots live -------------------

    @keras_internals.no_automatic_dependency_tracking
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
        shard_tables = [v for v in var_list if self._key(v) in self._row_masks and is_sharded(v)]
        own_keys = {self._key(v) for v in compact + shard_tables}
        # The wrapped optimizer makes full-size slots for the others only.
        full_size = [v for v in var_list if self._key(v) not in own_keys]
        self.inner_optimizer.build(full_size)
        keras_internals.check_built(self.inner_optimizer)
        slot_store.follow_growth(self, full_size)
        super().build(var_list)
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
        slots = self._slot_store.create_compact_slots(
            key,
            variable,
            self._row_rule.slots(self._base_optimizer),
            self._initial_slot_rows(variable) if fixed_rows is None else fixed_rows,
            name=f"{self.name}/{variable_path(variable)}",
            fixed_capacity=fixed_rows is not None,
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
        permitted = self._row_masks[self._key(variable)].count_permitted() or 0
        return fixed_slot_rows(permitted, self.slot_capacity)

    def compact_slot_rows(self, variable: Variable) -> int | None:
        """How many slot rows ``variable``'s compact slots use now: one per
        permitted row that a step has updated (frozen or not since); None
        without compact slots (not masked, full-size slots, or not built)."""
        return self._slot_store.compact_slot_rows(self._key(variable))

    def has_compact_slots(self, variable: Variable) -> bool:
        """Whether ``variable``'s optimizer slots hold only its trained rows."""
        return self._slot_store.has_compact_slots(self._key(variable))

    @staticmethod
    def gradient_sources(variables: Iterable[Variable]) -> list[Variable | list[Variable]]:
        """What to take a tape's gradient with respect to, for :meth:`apply`.

        A Keras variable holding a ``ShardedVariable`` (a table split by
        ``ParameterServerStrategy``'s ``variable_partitioner``) becomes the
        list of its shards, in row order; any other variable stays itself.
        ``tf.GradientTape`` cannot differentiate with respect to such a Keras
        variable, and gives one gradient per shard (local row ids) with
        respect to the shards; ``apply`` takes that list in the table's place:
        ``grads = tape.gradient(loss, MaskedOptimizer.gradient_sources(vs))``
        then ``optimizer.apply(grads, vs)``.

        >>> import keras, partial_embedding as pe
        >>> weights = [keras.Variable([[1.0]]), keras.Variable([2.0])]
        >>> pe.MaskedOptimizer.gradient_sources(weights) == weights
        True
        """
        return sharded.gradient_sources(list(variables))

    # Graph-safe as written: AutoGraph converting it (and all it calls) in a
    # user's tf.function only made tracing slower (docs/api.md).
    @tf.autograph.experimental.do_not_convert
    def apply(
        self,
        grads: list[TensorLike | list[TensorLike] | None],
        trainable_variables: list[Variable] | None = None,
    ) -> None:
        self._warn_of_skipped_updates()
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                raise PartialEmbeddingArgumentError(
                    "MaskedOptimizer.apply: pass trainable_variables on the first "
                    "call (the optimizer is not built)"
                )
            trainable_variables = keras_internals.trainable_variables(self)
        else:
            trainable_variables = list(trainable_variables)
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(trainable_variables)
                self.built = True
            keras_internals.check_variables_are_known(self, trainable_variables)
        if any(isinstance(g, (list, tuple)) for g in grads):
            # A sharded table's gradient: one gradient per shard.
            grads = [
                sharded.global_gradient(g, v) if isinstance(g, (list, tuple)) else g
                for g, v in zip(grads, trainable_variables, strict=True)
            ]
        if not grads:
            return
        if self._loss_scale_optimizer is None:
            self._apply_with_rule(grads, trainable_variables)
        else:
            gradients.apply_with_loss_scale(
                self,
                self._loss_scale_optimizer,
                grads,
                trainable_variables,
                self._apply_with_rule,
            )

    def _apply_with_rule(self, grads: list[Any], variables: list[Any]) -> None:
        """The stock apply() pipeline, with masked variables updated by row."""
        base_optimizer = self._base_optimizer
        with keras.name_scope(base_optimizer.name, caller=base_optimizer):
            grads, variables = keras_internals.filter_empty_gradients(
                base_optimizer, grads, variables
            )
            grads, variables = keras_internals.overwrite_variables_directly_with_gradients(
                base_optimizer, grads, variables
            )
            if grads:
                if base_optimizer.loss_scale_factor is not None:
                    grads = [
                        gradients.divide_gradient(g, base_optimizer.loss_scale_factor)
                        for g in grads
                    ]
                masks = [self._row_mask_of(v) for v in variables]
                grads = gradients.all_reduce_masked_gradients(grads, masks)
                grads, masked = self._choose_row_updates(grads, variables, masks)
                grads = gradients.clip_gradients(base_optimizer, grads)
                dense_pairs = [
                    (g, v) for g, v, mask in zip(grads, variables, masks) if mask is None
                ]
                if dense_pairs:
                    dense_grads, dense_vars = (list(x) for x in zip(*dense_pairs))
                    keras_internals.apply_weight_decay(base_optimizer, dense_vars)
                    keras_internals.backend_update_step(
                        base_optimizer, dense_grads, dense_vars, base_optimizer.learning_rate
                    )
                    for variable in dense_vars:
                        if variable.constraint is not None:
                            variable.assign(variable.constraint(variable))
                if masked:
                    self._update_masked_variables(
                        base_optimizer,
                        [(grads[p], variables[p], mask, update) for p, mask, update in masked],
                    )
        base_optimizer.iterations.assign_add(1)

    def _choose_row_updates(
        self, grads: list[Any], variables: list[Any], masks: list[RowMask | None]
    ) -> tuple[list[Any], list[tuple[int, RowMask, row_rules.RowUpdate]]]:
        """Chooses each masked variable's update, once, and gives it the
        gradient it takes: the raw sparse gradient where a fused kernel takes
        it, else the deduplicated gradient of the permitted rows.

        Returns the gradients and, per masked variable, its position, mask and
        update.
        """
        base_optimizer = self._base_optimizer
        masked = [
            (
                position,
                mask,
                self._row_rule.update_for(grads[position], variable),
            )
            for position, (variable, mask) in enumerate(zip(variables, masks))
            if mask is not None
        ]
        # Clipping measures (clipnorm, global_clipnorm) or bounds (clipvalue)
        # the deduplicated, permitted-only gradient: a fused kernel takes the
        # raw gradient only without clipping.
        clips = any(
            value
            for value in (
                base_optimizer.clipnorm,
                base_optimizer.clipvalue,
                base_optimizer.global_clipnorm,
            )
        )
        grads = list(grads)
        for position, mask, update in masked:
            gradient = grads[position]
            raw = isinstance(gradient, tf.IndexedSlices) and not clips
            if not (raw and update.takes_raw_gradient):
                grads[position] = gradients.permitted_row_gradient(
                    gradient, variables[position], mask, self._xla_owner_map(variables[position])
                )
        return grads, masked

    def _update_masked_variables(
        self, base_optimizer: Any, masked: list[tuple[Any, Any, RowMask, row_rules.RowUpdate]]
    ) -> None:
        """The row updates; under a tf.distribute strategy, on every copy.

        In a replica context (``strategy.run``, ``model.fit``) the gradients
        are already summed over replicas, and the update goes through the
        strategy as Keras' own does (``merge_call`` when the strategy uses it,
        then ``extended.update``): it runs once per component of each
        mirrored variable, where ``masked_scatter_sub`` and the slots resolve
        to that component.
        """

        if in_xla_context():
            for _, variable, mask, _ in masked:
                self._slot_store.reserve_for_xla(self._key(variable), mask)

        def update(
            gradient: Any, variable: Any, mask: RowMask, row_update: row_rules.RowUpdate
        ) -> None:
            step = row_rules.RowStep(
                base_optimizer,
                gradient,
                variable,
                mask.full(),
                base_optimizer.learning_rate,
                compact=self._slot_store.compact.get(self._key(variable)),
                mask_variable=mask.variable,
            )
            # No row to update (eagerly, e.g. a batch of frozen ids only): Keras'
            # ops.add mistakes two [0, D] operands for a bias and fails, and there is nothing to do.
            if not step.empty:
                row_update.apply(step)
            if variable.constraint is not None:
                gradients.apply_masked_constraint(variable, mask)

        # A ShardedVariable table: each shard updated on its own device, in
        # this context (ParameterServerStrategy has one replica per worker).
        for gradient, variable, mask, _ in masked:
            shard_slots = self._slot_store.sharded.get(self._key(variable))
            if shard_slots is not None:
                shard_slots.apply(
                    base_optimizer,
                    self._row_rule,
                    gradient,
                    mask,  # type: ignore[arg-type]
                    base_optimizer.learning_rate,
                    variable,
                )
        masked = [m for m in masked if self._key(m[1]) not in self._slot_store.sharded]
        if not masked:
            return
        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            for gradient, variable, mask, row_update in masked:
                update(gradient, variable, mask, row_update)
            return

        def distributed_update(distribution: Any, gradients: list[Any]) -> None:
            for gradient, (_, variable, mask, row_update) in zip(gradients, masked):
                distribution.extended.update(
                    resolve_variable(variable),
                    lambda _, g, v=variable, m=mask, u=row_update: update(g, v, m, u),
                    args=(gradient,),
                    group=False,
                )

        keras_internals.maybe_merge_call(
            distributed_update, tf.distribute.get_strategy(), [g for g, _, _, _ in masked]
        )

    def _xla_owner_map(self, variable: Variable) -> tf.Variable | None:
        """Under XLA, ``variable``'s int64 ``[V + 1]`` scratch for deduplicating
        without a sort (see ``SlotStore.xla_owner_map``); None elsewhere, or
        for a sharded table."""
        if not in_xla_context() or sharded.is_sharded(variable):
            return None
        return self._slot_store.xla_owner_map(self._key(variable), variable)

    # -- serialization ----------------------------------------------------------

    @property
    def compact_slot_variables(self) -> list[tf.Variable]:
        """The variables of the compact slots, in build order.

        Per masked variable with compact slots: its row -> slot-row map
        (float32 ``[V]``, ``-1`` for a row without a slot row), the number of
        slot rows used, then one ``[capacity] + row_shape`` variable per slot
        (the row count grows during training, so its static shape is
        ``[None] + row_shape``). Not in ``variables``; ``tf.train.Checkpoint``,
        SavedModel and ``.keras`` files save them.
        """
        return list(self._slot_store.compact_variables)

    def save_own_variables(self, store: Any) -> None:
        """Saves ``variables`` as Keras does, then the compact slots
        (keys ``compact_0``, ``compact_1``, ...)."""
        super().save_own_variables(store)
        self._slot_store.save(store)

    def load_own_variables(self, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved."""
        compact_keys = {k for k in store.keys() if k.startswith(COMPACT_KEY)}
        super().load_own_variables(StoreHidingKeys(store, compact_keys))
        if not self._slot_store.load(store):
            warnings.warn(
                f"Skipping the compact slots of optimizer '{self.name}': it has "
                f"{len(self._slot_store.compact_variables)} compact slot variables whereas "
                f"the saved optimizer has {len(compact_keys)}.",
                stacklevel=2,
            )

    def get_config(self) -> dict[str, Any]:
        if self.built:
            compact_indices: list[int] | None = [
                i
                for i, v in enumerate(keras_internals.trainable_variables(self))
                if self.has_compact_slots(v)
            ]
        else:
            compact_indices = self._saved_compact_indices
        return {
            "name": self.name,
            "inner": keras.saving.serialize_keras_object(self.inner_optimizer),
            "compact_slots": self.compact_slots,
            "slot_capacity": self.slot_capacity,
            "compact_variable_indices": compact_indices,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> MaskedOptimizer:
        config = dict(config)
        # A config without the key comes from version 0.1, whose optimizer
        # state holds full-size slots: load it as such.
        config.setdefault("compact_slots", False)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner"), custom_objects=custom_objects
        )
        return cls(inner, **config)


# Its public home: Keras' serialized configs name this module, and doctest
# finds the class' example there.
MaskedOptimizer.__module__ = "partial_embedding.optimizers"
