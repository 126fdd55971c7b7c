"""What a gradient was made from, remembered beside the graph that made it.

The lookups build their gradients from inputs that a fused optimizer kernel
can read directly (the per-id lookup's uncompacted gradient, the bag lookup's
bags): they record those inputs here, keyed by the gradient's tensors, and
the optimizer asks for them. Only in a graph, where the ops the optimizer
then leaves without readers are pruned.
"""

from __future__ import annotations

import weakref
from typing import Any

import tensorflow as tf


class GradientMemo:
    """Inputs recorded for gradients ``(values, indices)`` built in a graph.

    Entries hold weak references only (a graph keeps its tensors alive, and an
    entry must not keep the graph alive) and go when ``values`` goes.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, ...]] = {}

    def remember(self, values: tf.Tensor, indices: tf.Tensor, *inputs: Any) -> None:
        """Records ``inputs`` for ``(values, indices)``; nothing eagerly."""
        if tf.executing_eagerly():
            return
        key = id(values)
        self._entries[key] = tuple(weakref.ref(x) for x in (values, indices, *inputs))
        weakref.finalize(values, self._entries.pop, key, None)

    def recall(self, values: Any, indices: Any) -> list[Any] | None:
        """The inputs recorded for ``(values, indices)``, where both are
        exactly the tensors recorded, of the current graph, and every input
        is still alive; else None."""
        entry = self._entries.get(id(values))
        if entry is None:
            return None
        tensors = [ref() for ref in entry]
        if tensors[0] is not values or tensors[1] is not indices or any(t is None for t in tensors):
            return None
        if getattr(values, "graph", None) is not tf.compat.v1.get_default_graph():
            return None
        return tensors[2:]
