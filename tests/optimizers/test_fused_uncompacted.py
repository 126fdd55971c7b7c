"""The fused Adam kernel reading the lookup's whole upstream gradient.

In a graph, ``masked_embedding_lookup``'s gradient drops frozen rows'
occurrences by copying the permitted rows; the fused kernel skips frozen rows
itself, so ``_row_rules`` hands it the uncompacted gradient instead (and the
copy is pruned). These tests check that the step is bit for bit the one the
compacted gradient gives, with full-size and compact slots, that frozen rows
and their slots keep their bits, and that the shortcut applies only to the
exact tensors the lookup built.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.ops import lookup
from partial_embedding.optimizers import _row_rules

# These test the fused CPU kernel: on a machine with a GPU too.
pytestmark = pytest.mark.usefixtures("on_cpu")

VOCAB, WIDTH, BATCH, IDS = 64, 8, 6, 5


def _train(
    compact: bool,
    uncompacted: bool,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    dtype: str = "float32",
):
    """Three tf.function steps; returns the layer, the optimizer, the
    trained variable's values before, the trainable ids and the kernel's
    gradient input types."""
    if not uncompacted:
        monkeypatch.setattr(_row_rules, "uncompacted_gradient", lambda values, indices: None)
    rng = np.random.default_rng(seed)
    trainable = np.flatnonzero(rng.random(VOCAB) < 0.5)
    keras.utils.set_random_seed(seed)
    embedding = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=trainable, dtype=dtype)
    inputs = keras.Input((IDS,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(embedding(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.01), compact_slots=compact)
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step(ids: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids, training=True) - targets))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    # Few distinct ids: many duplicates, summed in position order.
    batches = [
        (
            tf.constant(rng.integers(0, VOCAB // 4, (BATCH, IDS)) * 4 % VOCAB, tf.int32),
            tf.constant(rng.normal(size=(BATCH, 1)), tf.float32),
        )
        for _ in range(3)
    ]
    before = _trained_variable(embedding).numpy().copy()
    for ids, targets in batches:
        step(ids, targets)
    graph = step.get_concrete_function(*batches[0]).graph
    kernel_inputs = [
        op.inputs[5 if compact else 4].op.type
        for op in graph.get_operations()
        if "MaskedSparseApplyRule" in op.type
    ]
    return embedding, optimizer, before, trainable, kernel_inputs


def _trained_variable(embedding: pe.PartialEmbedding) -> keras.Variable:
    """The table, or an int8 layer's float store (what the optimizer writes)."""
    return embedding.float_rows if embedding.quantization_mode else embedding.embeddings


@pytest.mark.parametrize("compact", [False, True])
def test_uncompacted_gradient_gives_the_same_bits(compact: bool, monkeypatch: pytest.MonkeyPatch):
    seed = 20261203
    with monkeypatch.context() as patch:
        plain, plain_optimizer, _, _, plain_inputs = _train(compact, False, patch, seed)
    fast, fast_optimizer, before, trainable, fast_inputs = _train(compact, True, monkeypatch, seed)
    # The shortcut is taken (the kernel reads the tape's gradient, not a
    # gather of it) only where it is allowed.
    assert plain_inputs == ["GatherV2"]
    assert fast_inputs != ["GatherV2"] and len(fast_inputs) == 1
    table = fast.embeddings.numpy()
    np.testing.assert_array_equal(table.view(np.uint32), plain.embeddings.numpy().view(np.uint32))
    frozen = np.setdiff1d(np.arange(VOCAB), trainable)
    np.testing.assert_array_equal(table[frozen].view(np.uint32), before[frozen].view(np.uint32))
    assert not np.array_equal(table[trainable], before[trainable])
    for mine, theirs in zip(fast_optimizer.variables, plain_optimizer.variables):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
    for mine, theirs in zip(
        fast_optimizer.compact_slot_variables, plain_optimizer.compact_slot_variables
    ):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


@pytest.mark.parametrize("compact", [False, True])
def test_uncompacted_gradient_of_an_int8_layer(compact: bool, monkeypatch: pytest.MonkeyPatch):
    """The int8 lookup's gradient (over float store rows; ids without one
    name the store's sentinel row) is handed over uncompacted the same way."""
    seed = 20261204
    with monkeypatch.context() as patch:
        plain, plain_optimizer, _, _, plain_inputs = _train(
            compact, False, patch, seed, dtype="int8_from_float32"
        )
    codes = plain._embeddings.numpy().copy()
    scales = plain.embeddings_scale.numpy().copy()
    fast, fast_optimizer, before, trainable, fast_inputs = _train(
        compact, True, monkeypatch, seed, dtype="int8_from_float32"
    )
    assert plain_inputs == ["GatherV2"]
    assert fast_inputs != ["GatherV2"] and len(fast_inputs) == 1
    store = fast.float_rows.numpy()
    np.testing.assert_array_equal(store.view(np.uint32), plain.float_rows.numpy().view(np.uint32))
    assert not np.array_equal(store, before)
    # The sentinel row (last) and the int8 rows keep their bits.
    np.testing.assert_array_equal(store[-1].view(np.uint32), before[-1].view(np.uint32))
    np.testing.assert_array_equal(fast._embeddings.numpy(), codes)
    np.testing.assert_array_equal(
        fast.embeddings_scale.numpy().view(np.uint32), scales.view(np.uint32)
    )
    frozen = np.setdiff1d(np.arange(VOCAB), trainable)
    np.testing.assert_array_equal(
        fast(frozen).numpy().view(np.uint32), plain(frozen).numpy().view(np.uint32)
    )
    for mine, theirs in zip(
        fast_optimizer.compact_slot_variables, plain_optimizer.compact_slot_variables
    ):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_uncompacted_gradient_only_for_the_lookups_own_tensors():
    table = tf.Variable(tf.reshape(tf.range(12.0), [4, 3]))
    mask = tf.constant([True, False, True, True])
    ids = tf.constant([2, 1, 2, 0])

    def gradient() -> tf.IndexedSlices:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pe.masked_embedding_lookup(table, ids, mask) * 2.0)
        return tape.gradient(loss, table)

    # Eagerly the copy has been made already: nothing is offered.
    eager = gradient()
    assert lookup.uncompacted_gradient(eager.values, eager.indices) is None

    @tf.function
    def in_graph() -> tuple[tf.Tensor, ...]:
        grad = gradient()
        assert lookup.uncompacted_gradient(grad.values, tf.identity(grad.indices)) is None
        assert lookup.uncompacted_gradient(grad.values * 1.0, grad.indices) is None
        found = lookup.uncompacted_gradient(grad.values, grad.indices)
        assert found is not None
        values, all_ids, kept = found
        return grad.values, grad.indices, values, all_ids, kept

    compact_values, compact_ids, values, all_ids, kept = (t.numpy() for t in in_graph())
    np.testing.assert_array_equal(all_ids, [2, 1, 2, 0])
    np.testing.assert_array_equal(kept, [0, 2, 3])
    np.testing.assert_array_equal(values, np.full([4, 3], 2.0))
    np.testing.assert_array_equal(compact_values, values[kept])
    np.testing.assert_array_equal(compact_ids, all_ids[kept])
