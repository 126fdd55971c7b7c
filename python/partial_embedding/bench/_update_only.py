"""The optimizer update alone, ``partial`` against ``stock_tf`` (and ``partial_xla``).

Part of the training benchmark (``bench._training``): each update is fed the
same fixed sparse gradients of ``batch x ids_per_sample`` rows in interleaved
rounds, so the part of the step that the fused kernel replaces is timed on
its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.bench._models import stock_tf_tables, stock_tf_update  # noqa: E402
from partial_embedding.bench._timing import interleaved_rounds, release_memory  # noqa: E402
from partial_embedding.bench._training_results import BenchmarkConfig  # noqa: E402
from partial_embedding.layers import PartialEmbedding  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer  # noqa: E402


def _masked_adam_update(
    vocab: int, width: int, permitted: np.ndarray, jit_compile: bool = False
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``MaskedOptimizer(Adam).apply`` on a table of its own, as a function
    of a sparse gradient's indices and values (compiled with XLA where
    ``jit_compile``)."""
    dense_shape = tf.constant([vocab, width], tf.int32)
    layer = PartialEmbedding(vocab, width, trainable_ids=permitted)
    layer.build((None,))
    optimizer = MaskedOptimizer(keras.optimizers.Adam())
    optimizer.build([layer.embeddings])

    @tf.function(jit_compile=jit_compile)
    def update(indices: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        gradient = tf.IndexedSlices(values, indices, dense_shape)
        optimizer.apply([gradient], [layer.embeddings])
        return optimizer.iterations

    return update


def _update_only_runs(
    vocab: int, width: int, permitted: np.ndarray, xla: bool = False
) -> dict[str, Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]:
    """The optimizer update alone, as a function of a sparse gradient's
    indices and values: ``partial`` is ``MaskedOptimizer(Adam).apply``,
    ``stock_tf`` the same lazy masked Adam written with stock TF ops and,
    where ``xla``, ``partial_xla`` the first compiled with XLA."""
    tables, mask, step_count = stock_tf_tables(vocab, width, permitted)

    @tf.function
    def stock_tf_step_update(indices: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        stock_tf_update(tables, mask, step_count, tf.IndexedSlices(values, indices))
        return step_count.read_value()

    runs = {
        "partial": _masked_adam_update(vocab, width, permitted),
        "stock_tf": stock_tf_step_update,
    }
    if xla:
        runs["partial_xla"] = _masked_adam_update(vocab, width, permitted, jit_compile=True)
    return runs


def time_updates_only(config: BenchmarkConfig, rng: np.random.Generator) -> dict[str, float]:
    """Best-round ms of the optimizer update alone (``_update_only_runs``),
    both fed the same fixed sparse gradients of ``batch x ids_per_sample``
    rows in interleaved rounds: the part of the step that the fused kernel
    replaces; with ``"stock_tf_over_partial"`` (and ``"partial_xla"``,
    ``"partial_xla_over_partial"`` where ``partial_xla`` is among the variants)."""
    num_ids = config.batch * config.ids_per_sample
    permitted = rng.random(config.vocab) < config.permitted_fraction
    gradients = [
        (
            tf.constant(rng.integers(0, config.vocab, num_ids), tf.int32),
            tf.constant(rng.normal(size=(num_ids, config.width)) * 1e-3, tf.float32),
        )
        for _ in range(min(config.update_only_steps, 16))
    ]
    updates = _update_only_runs(
        config.vocab, config.width, permitted, xla="partial_xla" in config.variants
    )
    runs = {name: (update, gradients) for name, update in updates.items()}
    figures = interleaved_rounds(runs, config.update_only_steps, config.warmup, config.max_rounds)
    del updates, gradients, runs
    release_memory()
    update_only = {name: result["step_ms"] for name, result in figures.items()}
    for name in ("stock_tf", "partial_xla"):
        if name in update_only:
            update_only[f"{name}_over_partial"] = update_only[name] / update_only["partial"]
    return update_only
