"""The context an op is built in: eager, ``tf.function``, a v1 graph, XLA.

What an in-place wrapper returns depends on it, and under XLA the ops take
their stock-op path (``_xla``).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from partial_embedding._internal import framework_private

__all__ = ["in_xla_context", "update_result"]


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
