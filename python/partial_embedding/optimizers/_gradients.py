"""MaskedOptimizer's gradient helpers: scaling, summing over replicas,
deduplicating the rows of a masked variable (zero on frozen rows), clipping,
and a masked variable's constraint on its permitted rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from keras import ops

from partial_embedding._internal import framework_private
from partial_embedding._internal import xla as _xla
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.growable import is_growable
from partial_embedding._internal.row_mask import RowMask
from partial_embedding._internal.types import KerasOptimizer
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.ops import resolve_variable


def scale_gradient(gradient: Any, factor: Any) -> Any:
    """``gradient * factor`` for a dense tensor or ``tf.IndexedSlices``."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            gradient.values * tf.cast(factor, gradient.values.dtype),
            gradient.indices,
            gradient.dense_shape,
        )
    return gradient * tf.cast(factor, gradient.dtype)


def divide_gradient(gradient: Any, divisor: Any) -> Any:
    """``gradient / divisor`` for a dense tensor or ``tf.IndexedSlices``."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            ops.divide(gradient.values, divisor),
            gradient.indices,
            gradient.dense_shape,
        )
    return ops.divide(gradient, divisor)


def gradient_values(gradient: Any) -> tf.Tensor:
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def all_reduce_masked_gradients(grads: list[Any], masks: list[Any]) -> list[Any]:
    """Sums the masked variables' gradients over replicas (in a replica
    context of a strategy with several): every replica then updates its copy
    with the same rows. Keras sums the other gradients itself, later."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return grads
    strategy = tf.distribute.get_strategy()
    positions = [i for i, (g, mask) in enumerate(zip(grads, masks)) if mask and g is not None]
    if strategy.num_replicas_in_sync == 1 or not positions:
        return grads
    reduced = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, [grads[i] for i in positions]
    )
    grads = list(grads)
    for position, gradient in zip(positions, reduced):
        grads[position] = gradient
    return grads


def _skipped_row_message(variable: Any, num_rows: int | None) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", "a variable")
    row = f"row {num_rows}" if num_rows is not None else "row V (its number of rows)"
    bound = num_rows if num_rows is not None else "V"
    return (
        f"MaskedOptimizer.apply: the gradient of {name} names {row}, one past its "
        f"last row: a gradient taken under XLA (jit_compile=True) marks so the ids it "
        f"skipped (ids outside [0, {bound}), a bag's frozen or pruned ids). Apply it "
        f"inside the same compiled function that took it (as fit and a "
        f"tf.function(jit_compile=True) training step do), where those entries are "
        f"skipped; outside XLA they are refused and nothing is written"
    )


def refuse_rows_skipped_under_xla(grads: list[Any], variables: list[Any]) -> list[Any]:
    """Outside XLA, refuses a sparse gradient that names row ``V``.

    A gradient taken under XLA names row ``V`` (one past the last) for the
    occurrences that train no row, which XLA's scatters and our custom calls
    skip; applied outside XLA, TensorFlow's gathers would refuse it with
    ``indices[i] = V is not in [0, V)``, which says nothing of the cause. This
    says what happened and what to do, before any write: eagerly it raises
    ``PartialEmbeddingArgumentError``; in a graph it returns the checks, which
    the caller makes every write of the step depend on
    (``tf.errors.InvalidArgumentError`` when one fails). A growable variable
    (a store that gains rows between steps) is compared with the rows it holds
    when the step runs, not with its shape when the step was traced."""
    if in_xla_context():
        return []
    checks = []
    for gradient, variable in zip(grads, variables):
        if not isinstance(gradient, tf.IndexedSlices) or not len(variable.shape):
            continue
        indices = tf.cast(gradient.indices, tf.int64)
        if is_growable(variable):
            static_rows = None
            rows = tf.cast(tf.shape(resolve_variable(variable).value())[0], tf.int64)
        elif variable.shape[0] is None:
            continue
        else:
            static_rows = int(variable.shape[0])
            rows = tf.constant(static_rows, tf.int64)
        names_row_v = tf.reduce_any(tf.equal(indices, rows))
        if tf.executing_eagerly():
            if bool(names_row_v):
                raise PartialEmbeddingArgumentError(
                    _skipped_row_message(variable, int(rows.numpy()))
                )
            continue
        message = _skipped_row_message(variable, static_rows)
        checks.append(tf.debugging.Assert(tf.logical_not(names_row_v), [message]))
    return checks


def summed_rows(gradient: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """The distinct rows of a sparse gradient and each one's summed gradient."""
    rows, positions = tf.unique(gradient.indices)
    return rows, tf.math.unsorted_segment_sum(gradient.values, positions, tf.shape(rows)[0])


def permitted_row_gradient(
    gradient: Any, variable: Any, mask: RowMask, owner_map: tf.Variable | None = None
) -> tf.IndexedSlices:
    """Deduplicated gradient of the permitted rows, as IndexedSlices
    (``owner_map``: the XLA path's scratch, see ``_xla.owner_segment_sum``)."""
    if in_xla_context():
        return xla_permitted_row_gradient(gradient, variable, mask, owner_map)
    if isinstance(gradient, tf.IndexedSlices):
        rows, summed = summed_rows(gradient)
    else:
        # A dense gradient speaks for every row: all permitted rows count
        # as present (O(V), as the dense gradient itself is).
        gradient = tf.convert_to_tensor(gradient)
        rows = tf.cast(tf.reshape(tf.where(mask.full()), [-1]), tf.int64)
        return tf.IndexedSlices(
            tf.gather(gradient, rows), rows, tf.shape(gradient, out_type=tf.int64)
        )
    # Frozen rows get a zero gradient instead of being dropped: cheaper
    # than compacting, invisible to clipping norms, and the in-place
    # kernel never writes them (nor their slots).
    permitted = tf.reshape(
        mask.gather(rows),
        tf.concat([tf.shape(rows), tf.ones([summed.shape.rank - 1], tf.int32)], 0),
    )
    return tf.IndexedSlices(
        tf.where(permitted, summed, tf.zeros([], summed.dtype)),
        rows,
        tf.shape(variable, out_type=rows.dtype)
        if gradient.dense_shape is None
        else tf.cast(gradient.dense_shape, rows.dtype),
    )


def xla_permitted_row_gradient(
    gradient: Any, variable: Any, mask: RowMask, owner_map: tf.Variable | None = None
) -> tf.IndexedSlices:
    """``permitted_row_gradient`` with static shapes, for XLA: the distinct
    rows (and padding rows numbered V) and their summed gradient, zero on
    frozen rows; a dense gradient keeps all V rows. ``owner_map``: see
    ``_xla.owner_segment_sum`` (None: sort instead)."""
    dense_shape = tf.shape(resolve_variable(variable), out_type=tf.int64)
    num_rows = dense_shape[0]
    if isinstance(gradient, tf.IndexedSlices):
        indices = tf.cast(gradient.indices, tf.int64)
        if owner_map is not None:
            rows, summed = _xla.owner_segment_sum(indices, gradient.values, num_rows, owner_map)
        else:
            rows, summed = _xla.sorted_segment_sum(indices, gradient.values, num_rows)
    else:
        summed = tf.convert_to_tensor(gradient)
        rows = tf.range(num_rows)
    # The padding rows (numbered V) stay as they are: RowStep writes none.
    _, _, permitted = _xla.valid_rows(rows, num_rows, mask.gather)
    return tf.IndexedSlices(_xla.where_rows(permitted, summed), rows, dense_shape)


def clip_gradients(base_optimizer: KerasOptimizer, grads: list[Any]) -> list[Any]:
    """The inner optimizer's clipping; global_clipnorm also for slices."""
    if base_optimizer.global_clipnorm and base_optimizer.global_clipnorm > 0:
        squared = [ops.sum(ops.square(gradient_values(g))) for g in grads if g is not None]
        norm = ops.sqrt(ops.sum(ops.stack(squared)))
        clip_norm = base_optimizer.global_clipnorm
        scale = clip_norm * ops.minimum(1.0 / norm, 1.0 / clip_norm)
        scale = scale + (norm - norm)  # NaN for a non-finite norm, as Keras
        return [None if g is None else scale_gradient(g, scale) for g in grads]
    return framework_private.clip_gradients(base_optimizer, grads)


def apply_masked_constraint(variable: Any, mask: RowMask) -> None:
    """The variable's constraint, on permitted rows only (a pass over V).

    A constraint is a function of the whole table, so this costs what it
    costs in Keras; frozen rows keep their exact values.
    """
    table = tf.convert_to_tensor(resolve_variable(variable))
    permitted = tf.reshape(mask.full(), [-1] + [1] * (len(variable.shape) - 1))
    variable.assign(tf.where(permitted, variable.constraint(table), table))


def apply_with_loss_scale(
    optimizer: KerasOptimizer,
    lso: KerasOptimizer,
    grads: list[Any],
    variables: list[Any],
    apply: Callable[[list[Any], list[Any]], None],
) -> None:
    """LossScaleOptimizer ``lso``'s dynamic scaling around ``apply`` (the
    wrapper ``optimizer``'s pipeline), with a row-sized finite check."""
    present = [gradient_values(g) for g in grads if g is not None]
    finite = ops.all(ops.convert_to_tensor([ops.all(ops.isfinite(v)) for v in present]))

    def finite_step() -> None:
        scale = lso.dynamic_scale
        unscaled = [
            g
            if g is None or framework_private.overwrites_with_gradient(optimizer, v)
            else divide_gradient(g, scale)
            for g, v in zip(grads, variables)
        ]
        apply(unscaled, variables)

        def upscale() -> None:
            lso.step_counter.assign(0)
            lso.dynamic_scale.assign(ops.multiply(lso.dynamic_scale, 2.0))

        def increment() -> None:
            lso.step_counter.assign_add(1)

        ops.cond(
            ops.equal(lso.step_counter, lso.dynamic_growth_steps - 1),
            upscale,
            increment,
        )

    def skip_step() -> None:
        lso.step_counter.assign(0)
        lso.dynamic_scale.assign(ops.multiply(lso.dynamic_scale, 0.5))

    ops.cond(finite, finite_step, skip_step)
