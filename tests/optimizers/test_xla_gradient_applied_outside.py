"""A gradient taken under XLA names row ``V`` for the ids it skipped (bad ids,
a bag's frozen or pruned ids). Applied in the same compiled function those
entries are skipped; applied outside XLA, ``MaskedOptimizer.apply`` refuses
it with a message that says what happened and what to do, and writes nothing
(docs/xla.md)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import assert_bits_equal

VOCAB, WIDTH = 8, 2
_MESSAGE = (
    r"names row 8, one past its last row: a gradient taken under XLA \(jit_compile=True\)"
    r".*Apply it inside the same compiled function"
)


def _layer_and_optimizer(combiner=None):
    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=[0, 1, 2, 3], combiner=combiner)
    layer.build((None,) if combiner is None else (None, None))
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1))
    optimizer.build(layer.trainable_variables)
    return layer, optimizer


def _xla_gradient(layer, ids):
    @tf.function(jit_compile=True)
    def gradient(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids))
        return tape.gradient(loss, layer.trainable_variables)

    return gradient(ids)


@pytest.mark.parametrize("where", ["eager", "tf.function"])
def test_refused_outside_xla_with_what_to_do(where):
    layer, optimizer = _layer_and_optimizer()
    grads = _xla_gradient(layer, tf.constant([0, 9, 1, -1]))
    assert isinstance(grads[0], tf.IndexedSlices)
    assert VOCAB in grads[0].indices.numpy()  # The premise: XLA marked row V.
    before = layer.embeddings.numpy()

    def apply():
        optimizer.apply(grads, layer.trainable_variables)

    run = apply if where == "eager" else tf.function(apply)
    with pytest.raises(tf.errors.InvalidArgumentError, match=_MESSAGE):
        run()
    assert_bits_equal(layer.embeddings, before, "the table after a refused apply")
    assert int(optimizer.iterations.numpy()) == 0


def test_bag_gradient_with_frozen_ids_refused_outside_xla():
    layer, optimizer = _layer_and_optimizer(combiner="mean")
    grads = _xla_gradient(layer, tf.ragged.constant([[0, 6], [1]]))  # Row 6 is frozen.
    if not isinstance(grads[0], tf.IndexedSlices) or VOCAB not in grads[0].indices.numpy():
        pytest.skip("this bag gradient names no skipped row (the dense form was taken)")
    with pytest.raises(tf.errors.InvalidArgumentError, match=_MESSAGE):
        optimizer.apply(grads, layer.trainable_variables)


def test_applied_in_the_same_compiled_function_the_entries_are_skipped():
    layer, optimizer = _layer_and_optimizer()
    before = layer.embeddings.numpy()

    @tf.function(jit_compile=True)
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids))
        optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)

    step(tf.constant([0, 9, 1, -1]))
    after = layer.embeddings.numpy()
    assert not np.array_equal(after[[0, 1]], before[[0, 1]])
    assert_bits_equal(after[2:], before[2:], "rows the batch did not train")


def test_a_gradient_taken_outside_xla_is_unaffected():
    layer, optimizer = _layer_and_optimizer()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([0, 3, 3])))
    optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
    assert int(optimizer.iterations.numpy()) == 1
