"""A quantized layer's float store grows when more rows learn than it holds.

Training goes on through the growth with the same compiled model (no
recompile): steps traced before it read the grown store, the optimizer's
slots (compact or full-size, with or without XLA) grow with it, the trained
rows match a float ``PartialEmbedding`` trained on the same batches, and the
frozen rows' int8 bytes and scales keep their bits. A grown layer saves and
loads (``.keras``, ``tf.train.Checkpoint``).
"""

from __future__ import annotations

import gc
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe

ROWS, WIDTH, LENGTH, BATCH = 120, 4, 5, 16
FIRST = np.array([3, 9, 40])
LATER = np.arange(60, 100)  # 40 new rows where the store holds 3 + 16


def _effective_table(layer: pe.PartialEmbedding) -> np.ndarray:
    return layer(np.arange(ROWS)).numpy()


def _model(layer: keras.layers.Layer, compact, jit_compile: bool) -> keras.Model:
    model = keras.Sequential([keras.Input((LENGTH,), dtype="int32"), layer])
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=compact)
    model.compile(optimizer, "mse", jit_compile=jit_compile)
    return model


def _batches(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate(
        [
            rng.choice(FIRST, (BATCH, 2)),
            rng.choice(LATER, (BATCH, 2)),
            rng.integers(0, ROWS, (BATCH, 1)),
        ],
        axis=1,
    )
    return ids, rng.normal(size=(BATCH, LENGTH, WIDTH)).astype(np.float32)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("compact", ["auto", True, False], ids=["auto", "compact", "full"])
def test_training_goes_on_through_growth(rng: np.random.Generator, compact, jit_compile) -> None:
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    quantized = pe.PartialEmbedding(
        ROWS, WIDTH, weights=table, trainable_ids=FIRST, dtype="int8_from_float32"
    )
    capacity = quantized.trainable_capacity
    # The float reference starts from the same effective table: float rows
    # where the int8 layer has them, dequantized rows elsewhere.
    reference = pe.PartialEmbedding(
        ROWS, WIDTH, weights=_effective_table(quantized), trainable_ids=FIRST
    )
    codes = quantized._embeddings.numpy().copy()
    scales = quantized.embeddings_scale.numpy().copy()
    models = [_model(quantized, compact, jit_compile), _model(reference, compact, jit_compile)]
    first = _batches(rng)
    for model in models:
        model.fit(*first, epochs=2, batch_size=BATCH, shuffle=False, verbose=0)
    before = _effective_table(quantized)
    for layer in (quantized, reference):
        layer.unfreeze(LATER)
    assert quantized.trainable_capacity >= len(FIRST) + len(LATER) > capacity
    assert quantized.float_rows.numpy().shape[0] == quantized.trainable_capacity + 1
    # A first lookup after the growth: nothing moved.
    np.testing.assert_array_equal(_effective_table(quantized), before)
    later = _batches(rng)
    for model in models:
        model.fit(*later, epochs=3, batch_size=BATCH, shuffle=False, verbose=0)
    after = _effective_table(quantized)
    np.testing.assert_allclose(after, _effective_table(reference), rtol=1e-5, atol=1e-6)
    learned = np.union1d(FIRST, LATER)
    frozen = np.setdiff1d(np.arange(ROWS), learned)
    np.testing.assert_array_equal(after[frozen].view(np.uint32), before[frozen].view(np.uint32))
    assert np.all(np.any(after[LATER] != before[LATER], axis=1)[np.isin(LATER, later[0])])
    np.testing.assert_array_equal(quantized._embeddings.numpy(), codes)
    np.testing.assert_array_equal(
        quantized.embeddings_scale.numpy().view(np.uint32), scales.view(np.uint32)
    )


def test_a_grown_layer_saves_and_loads(rng: np.random.Generator, tmp_path) -> None:
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    layer = pe.PartialEmbedding(
        ROWS, WIDTH, weights=table, trainable_ids=FIRST, dtype="int8_from_float32"
    )
    model = _model(layer, "auto", False)
    batch = _batches(rng)
    model.fit(*batch, epochs=1, batch_size=BATCH, verbose=0)
    layer.unfreeze(LATER)
    model.fit(*batch, epochs=1, batch_size=BATCH, verbose=0)
    path = os.path.join(tmp_path, "grown.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    grown = loaded.layers[0]
    assert grown.trainable_capacity == layer.trainable_capacity
    np.testing.assert_array_equal(_effective_table(grown), _effective_table(layer))
    np.testing.assert_array_equal(grown.trainable_ids, layer.trainable_ids)
    # Both go on training alike.
    for each in (model, loaded):
        each.fit(*batch, epochs=1, batch_size=BATCH, shuffle=False, verbose=0)
    np.testing.assert_allclose(_effective_table(grown), _effective_table(layer), rtol=1e-6)

    checkpoint_dir = os.path.join(tmp_path, "checkpoint")
    saved = tf.train.Checkpoint(layer=layer).save(checkpoint_dir)
    fresh = pe.PartialEmbedding(
        ROWS,
        WIDTH,
        trainable_ids=FIRST,
        trainable_capacity=layer.trainable_capacity,
        dtype="int8_from_float32",
    )
    fresh.build()
    tf.train.Checkpoint(layer=fresh).restore(saved).assert_existing_objects_matched()
    np.testing.assert_array_equal(_effective_table(fresh), _effective_table(layer))
    np.testing.assert_array_equal(fresh.trainable_ids, layer.trainable_ids)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_growth_needs_no_retrace(rng: np.random.Generator, jit_compile: bool) -> None:
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    layer = pe.PartialEmbedding(
        ROWS, WIDTH, weights=table, trainable_ids=FIRST, dtype="int8_from_float32"
    )
    model = keras.Sequential([keras.Input((LENGTH,), dtype="int32"), layer])
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05))
    optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=jit_compile)
    def step(ids: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids) - targets))
        variables = model.trainable_variables
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    ids, targets = (tf.constant(array) for array in _batches(rng))
    step(ids, targets)
    traces = step.experimental_get_tracing_count()
    layer.unfreeze(LATER)
    assert layer.trainable_capacity >= len(FIRST) + len(LATER)
    before = layer(LATER).numpy()
    step(ids, targets)
    assert step.experimental_get_tracing_count() == traces
    # The same trace trained rows that have store rows since the growth.
    seen = np.isin(LATER, ids.numpy())
    assert seen.any()
    assert np.all(np.any(layer(LATER).numpy() != before, axis=1)[seen])


def _held_rows(name_part: str) -> dict[str, list[int]]:
    """Rows held by every initialized ``tf.Variable`` still alive whose name
    contains ``name_part``, by what follows it in the name (a list: one entry
    per variable)."""
    gc.collect()
    held: dict[str, list[int]] = {}
    for candidate in gc.get_objects():
        if not isinstance(candidate, tf.Variable) or name_part not in candidate.name:
            continue
        if candidate.shape.rank == 2 and bool(candidate.is_initialized()):
            rows = int(tf.shape(candidate.value())[0])
            # What the variable is, whatever scope named it: "float_rows_momentum:0"
            kind = candidate.name.split(name_part, 1)[1].replace("/", "_").strip("_")
            held.setdefault(kind, []).append(rows)
    return held


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("compact", ["auto", True, False], ids=["auto", "compact", "full"])
def test_no_store_sized_variable_is_left_behind(
    rng: np.random.Generator, compact, jit_compile: bool
) -> None:
    """Keras builds the optimizer inside ``fit``'s first trace, and
    ``tf.function`` keeps the variables that trace made: the slots replaced
    by growable ones must not keep a store-sized buffer (at 1M rows, 1 %
    trainable, that was 2 % of the float table in dead Adam slots)."""
    name = f"left_behind_{compact}_{jit_compile}".lower()
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    layer = pe.PartialEmbedding(
        ROWS, WIDTH, weights=table, trainable_ids=FIRST, dtype="int8_from_float32", name=name
    )
    model = _model(layer, compact, jit_compile)
    model.fit(*_batches(rng), epochs=1, batch_size=BATCH, verbose=0)
    layer.unfreeze(LATER)  # the store grows
    model.fit(*_batches(rng), epochs=1, batch_size=BATCH, verbose=0)
    held = _held_rows(name)
    assert held, "no variable of the layer found"
    for kind, rows in held.items():
        # One live variable of each kind; any other may hold no rows.
        assert sorted(rows, reverse=True)[1:] == [0] * (len(rows) - 1), (kind, rows)
        assert max(rows) > 0, (kind, rows)
    assert {"float_rows_momentum:0", "float_rows_velocity:0"} <= set(held), held
