"""The context an op is built in: eager, ``tf.function``, a v1 graph, XLA.

What an in-place wrapper returns depends on it, and under XLA the ops take
their stock-op path (``_internal.xla``).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from partial_embedding._internal import framework_private

__all__ = ["in_xla_context", "never_empty_across_replicas", "update_result"]


def update_result(op: tf.Operation | Sequence[tf.Operation | None]) -> tf.Operation | None:
    """What an in-place wrapper returns for ``op`` (or for several, grouped).

    The operation in ``tf.compat.v1`` graph mode; None eagerly and inside
    ``tf.function``.
    """
    # Inside tf.function the op runs through automatic control dependencies;
    # returning it there would make `return masked_scatter_sub(...)` fail.
    if tf.executing_eagerly() or tf.inside_function():
        return None
    if isinstance(op, Sequence):
        return tf.group(op)
    return op


def in_xla_context() -> bool:
    """True while tracing for XLA (``jit_compile=True``)."""
    # TensorFlow has no public predicate for this; without the private one
    # we only lose the clearer error message.
    return framework_private.graph_in_xla_context(tf.compat.v1.get_default_graph())


def _in_multi_replica_context() -> bool:
    """True in the replica context of a strategy with several replicas in sync."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return False
    return bool(tf.distribute.get_strategy().num_replicas_in_sync > 1)


def never_empty_across_replicas(
    values: tf.Tensor, indices: tf.Tensor, spare_rows: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """``(values, indices)`` of a sparse gradient, with one zero row appended
    when they are empty, in a replica context of a strategy with several
    replicas; unchanged (no op added) anywhere else.

    A cross-replica sum gathers each replica's rows, and TensorFlow's
    collective gather crashes the process (a segmentation fault, TF 2.21)
    when every replica's rows are empty: a batch with no permitted id under
    ``MirroredStrategy``. The zero row is for ``spare_rows[0]``, a row the
    caller does not update (a frozen one): a zero there changes nothing in a
    masked update, and nothing in a stock Keras optimizer's (it treats a row
    absent from the gradient as a zero one). When ``spare_rows`` is empty
    too (an empty batch) it is for row 0, which a masked optimizer then
    steps with a zero gradient if row 0 is permitted (a stock
    ``Embedding``'s empty gradient crashes there).

    Args:
        values: ``[n, ...]`` gradient rows.
        indices: ``[n]`` their row numbers.
        spare_rows: Row numbers that are all frozen whenever ``indices`` is
            empty (the looked-up ids, say).
    """
    if not _in_multi_replica_context():
        return values, indices
    first_or_zero = tf.concat(
        [tf.reshape(spare_rows, [-1])[:1], tf.zeros([1], spare_rows.dtype)], 0
    )
    # 1 when empty, 0 otherwise: no branch, the same graph on every replica.
    missing = 1 - tf.minimum(tf.shape(indices)[0], 1)
    pad_shape = tf.concat([[missing], tf.shape(values)[1:]], 0)
    values = tf.concat([values, tf.zeros(pad_shape, values.dtype)], 0)
    indices = tf.concat([indices, tf.fill([missing], tf.cast(first_or_zero[0], indices.dtype))], 0)
    return values, indices
