"""MaskedOptimizer's step: the wrapped optimizer's ``apply()`` pipeline,
with masked variables updated by row.

A step: filter empty gradients, unscale (loss scaling), sum the masked
variables' gradients over replicas, sum duplicate rows and zero frozen ones
(unless a fused kernel takes the raw gradient), clip, then update the other
variables with the wrapped optimizer's own step and the masked ones with
their row rule (``_row_rules``), in place: on each copy of a mirrored
variable, and shard by shard on a sharded table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import keras
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.row_mask import RowMask
from partial_embedding._internal.types import KerasOptimizer, TensorLike, Variable
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.ops import resolve_variable
from partial_embedding.optimizers import _gradients as gradients
from partial_embedding.optimizers import _row_rules as row_rules
from partial_embedding.optimizers import _sharded as sharded
from partial_embedding.optimizers._slot_store import SlotStore, release_evicted_rows


class ApplyPipeline:
    """``apply`` and the steps it runs (a mixin of ``MaskedOptimizer``, which
    sets the attributes below; ``build`` and the others come from its other
    parts)."""

    name: str
    built: bool
    _base_optimizer: KerasOptimizer
    _loss_scale_optimizer: KerasOptimizer | None
    _row_rule: row_rules.RowRule
    _slot_store: SlotStore
    _key: Callable[[Any], Any]
    _row_mask_of: Callable[[Any], RowMask | None]
    _warn_of_skipped_updates: Callable[[], None]
    build: Callable[[list[Any]], None]

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
            trainable_variables = framework_private.trainable_variables(self)
        else:
            trainable_variables = list(trainable_variables)
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(trainable_variables)
                self.built = True
            framework_private.check_variables_are_known(self, trainable_variables)
        if any(isinstance(g, (list, tuple)) for g in grads):
            # A sharded table's gradient: one gradient per shard.
            grads = [
                sharded.global_gradient(g, v) if isinstance(g, (list, tuple)) else g
                for g, v in zip(grads, trainable_variables, strict=True)
            ]
        if not grads:
            return
        checks = gradients.refuse_rows_skipped_under_xla(grads, trainable_variables)
        with tf.control_dependencies(checks):
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
            grads, variables = framework_private.filter_empty_gradients(
                base_optimizer, grads, variables
            )
            grads, variables = framework_private.overwrite_variables_directly_with_gradients(
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
                    framework_private.apply_weight_decay(base_optimizer, dense_vars)
                    framework_private.backend_update_step(
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
            compact = self._slot_store.compact.get(self._key(variable))
            # Rows a layer's row admission evicted since the last step give
            # their optimizer state back first.
            release_evicted_rows(self, variable, mask, compact)
            step = row_rules.RowStep(
                base_optimizer,
                gradient,
                variable,
                mask.full(),
                base_optimizer.learning_rate,
                compact=compact,
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
                shard_slots.release_evicted(mask)  # type: ignore[arg-type]
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

        framework_private.maybe_merge_call(
            distributed_update, tf.distribute.get_strategy(), [g for g, _, _, _ in masked]
        )

    def _xla_owner_map(self, variable: Variable) -> tf.Variable | None:
        """Under XLA, ``variable``'s int64 ``[V + 1]`` scratch for deduplicating
        without a sort (see ``SlotStore.xla_owner_map``); None elsewhere, or
        for a sharded table."""
        if not in_xla_context() or sharded.is_sharded(variable):
            return None
        return self._slot_store.xla_owner_map(self._key(variable), variable)
