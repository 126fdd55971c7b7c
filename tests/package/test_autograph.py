"""AutoGraph leaves the library alone inside a user's ``tf.function``.

``tf.function`` converts the Python it traces with AutoGraph by default:
every function the step calls that is not TensorFlow's or Keras' own, and
everything those call. The library is graph-safe as written, so converting it
only made tracing slower (the custom loops of ``tests/ops/test_xla.py`` traced
in half the time without it). The public entry points a step calls are marked
``tf.autograph.experimental.do_not_convert``. These tests record what AutoGraph
converts while user steps trace, and want the user's own step converted (so the
recorder works) and nothing of ``partial_embedding``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl import api as autograph_api

import partial_embedding as pe
from pe_testing import masked_fit_problem

VOCAB, WIDTH, IDS, SAMPLES, BATCH = 24, 4, 3, 16, 8


@pytest.fixture
def converted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The module and name of every function AutoGraph converts."""
    seen: list[str] = []
    convert = autograph_api._convert_actual

    def recording(entity: Callable, program_ctx: object) -> object:
        seen.append(f"{getattr(entity, '__module__', '')}:{getattr(entity, '__qualname__', '')}")
        return convert(entity, program_ctx)

    monkeypatch.setattr(autograph_api, "_convert_actual", recording)
    yield seen


def _library(seen: list[str]) -> list[str]:
    return [name for name in seen if name.startswith("partial_embedding")]


def _model(layer: keras.layers.Layer) -> keras.Model:
    return keras.Sequential(
        [keras.Input((IDS,), dtype="int32"), layer, keras.layers.Flatten(), keras.layers.Dense(1)]
    )


#: Each layer with each slot layout and each path, in four steps (every pair
#: of the three choices appears).
STEPS = [
    (False, True, False),
    (False, False, True),
    (True, True, True),
    (True, False, False),
]


@pytest.mark.parametrize(
    ("reversible", "compact", "jit"),
    STEPS,
    ids=[
        f"{'reversible' if r else 'embedding'}-{'compact' if c else 'full_slots'}-"
        f"{'xla' if j else 'kernels'}"
        for r, c, j in STEPS
    ],
)
def test_a_custom_training_step_converts_nothing_of_the_library(
    converted, rng, jit, compact, reversible
):
    table, permitted, x, y = masked_fit_problem(rng, VOCAB, WIDTH, IDS, SAMPLES)
    cls = pe.PartialReversibleEmbedding if reversible else pe.PartialEmbedding
    layer = cls(VOCAB, WIDTH, trainable_ids=np.flatnonzero(permitted), weights=table)
    model = _model(layer)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=compact)
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function(jit_compile=jit)
    def user_step(ids: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(targets, model(ids, training=True))
            if reversible:
                hidden = tf.reduce_mean(layer(ids), axis=1)
                loss += tf.reduce_mean(layer(hidden, reverse=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    for start in range(0, SAMPLES, BATCH):
        user_step(tf.constant(x[start : start + BATCH]), tf.constant(y[start : start + BATCH]))
    frozen = ~layer.trainable_mask.numpy()
    np.testing.assert_array_equal(layer.embeddings.numpy()[frozen], table[frozen])
    assert any(name.endswith("user_step") for name in converted), converted
    assert _library(converted) == []


def test_the_public_ops_in_a_traced_function_convert_nothing_of_the_library(converted, rng):
    table = tf.Variable(rng.normal(size=(VOCAB, WIDTH)).astype(np.float32))
    mask = tf.constant(rng.random(VOCAB) < 0.5)
    ids = tf.constant(rng.integers(0, VOCAB, size=(BATCH, IDS)), tf.int32)
    bags = tf.RaggedTensor.from_tensor(ids)

    @tf.function
    def user_ops() -> tf.Tensor:
        with tf.GradientTape() as tape:
            rows = pe.masked_embedding_lookup(table, ids, mask)
            pooled = pe.masked_embedding_lookup_sparse(table, bags, mask, combiner="sqrtn")
            logits = pe.ops.masked_reverse_projection(pooled, table, mask)
            kept = pe.entry_stop_gradients(rows, tf.ones_like(rows, tf.bool))
            loss = tf.reduce_sum(kept) + tf.reduce_sum(logits)
        (grad,) = tape.gradient(loss, [table])
        update = tf.convert_to_tensor(grad)
        pe.masked_scatter_sub(table, tf.range(VOCAB), 0.01 * update, mask)
        return loss

    before = table.numpy()
    user_ops()
    after = table.numpy()
    frozen = ~mask.numpy()
    np.testing.assert_array_equal(after[frozen], before[frozen])
    assert not np.array_equal(after[~frozen], before[~frozen])
    assert any(name.endswith("user_ops") for name in converted), converted
    assert _library(converted) == []
