"""PartialEmbedding(combiner=...): one vector per bag of ids.

The kinds of input (ragged, sparse, padded dense), the config and a .keras
round trip, training under Keras' fit on ragged input, frozen rows bit for
bit under Adam, AdamW and SGD with momentum, jit_compile=True, int8 frozen
rows, and bad arguments.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import assert_bits_equal, assert_within_rounding

ROWS, WIDTH = 30, 4


def bag_model(layer, length=None, ragged=False, weighted=False):
    ids = keras.Input((length,), dtype="int32", ragged=ragged)
    inputs = [ids]
    if weighted:
        weights = keras.Input((length,), dtype="float32", ragged=ragged)
        inputs.append(weights)
        pooled = layer(ids, weights=weights)
    else:
        pooled = layer(ids)
    head = keras.layers.Dense(1, kernel_initializer="ones", name="head")
    return keras.Model(inputs, head(pooled))


def random_layer(rng, combiner, **kwargs):
    table = rng.standard_normal([ROWS, WIDTH]).astype(np.float32)
    trainable = rng.random(ROWS) < 0.4
    layer = pe.PartialEmbedding(
        ROWS, WIDTH, weights=table, trainable_ids=trainable, combiner=combiner, **kwargs
    )
    return layer, table, trainable


def padded(rng, batch, length):
    """Dense ids with padding 0 at the end of each row (some rows empty)."""
    ids = rng.integers(1, ROWS, size=[batch, length])
    lengths = rng.integers(0, length + 1, size=batch)
    ids[np.arange(length)[None, :] >= lengths[:, None]] = 0
    return ids


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_ragged_sparse_and_padded_ids_give_the_same_bits(rng, combiner):
    layer, table, _ = random_layer(rng, combiner, mask_zero=True)
    ids = padded(rng, 6, 5)
    weights = rng.uniform(0.5, 2.0, size=ids.shape).astype(np.float32)
    ragged = tf.RaggedTensor.from_tensor(tf.constant(ids, tf.int32), padding=0)
    ragged_weights = tf.RaggedTensor.from_tensor(tf.constant(weights), lengths=ragged.row_lengths())
    from_dense = layer(ids, weights=weights)
    assert from_dense.shape == (6, WIDTH)
    assert_bits_equal(layer(ragged, weights=ragged_weights), from_dense, "ragged ids")
    assert_bits_equal(
        layer(ragged.to_sparse(), weights=ragged_weights.to_sparse()), from_dense, "sparse ids"
    )
    # One row by hand: the combiner of that bag's rows.
    row = ids[1][ids[1] != 0]
    w = weights[1][ids[1] != 0].astype(np.float64)
    total = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w**2).sum())}[combiner]
    expected = (w[:, None] * table[row]).sum(0) / total if row.size else np.zeros(WIDTH)
    np.testing.assert_allclose(from_dense[1], expected, rtol=1e-5, atol=1e-6)
    assert layer.compute_mask(ids) is None


def test_combiner_is_in_the_config_and_survives_a_keras_file(rng, tmp_path):
    layer, table, trainable = random_layer(rng, "sqrtn")
    model = bag_model(layer, ragged=True, weighted=True)
    assert layer.get_config()["combiner"] == "sqrtn"
    assert pe.PartialEmbedding.from_config(layer.get_config()).combiner == "sqrtn"
    ids = tf.ragged.constant([[1, 2, 2], [], [5]])
    weights = tf.ragged.constant([[1.0, 0.5, 2.0], [], [3.0]])
    path = tmp_path / "bags.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_layer = loaded.layers[2]
    assert loaded_layer.combiner == "sqrtn"
    assert_bits_equal(loaded_layer.trainable_mask.numpy(), trainable, "mask")
    assert_bits_equal(loaded([ids, weights]), model([ids, weights]), "outputs")


def test_fit_on_ragged_input_trains_only_permitted_rows(rng):
    layer, table, trainable = random_layer(rng, "mean")
    model = bag_model(layer, ragged=True)
    model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), "mse")
    rows = [rng.integers(-1, ROWS, size=rng.integers(0, 6)).tolist() for _ in range(32)]
    ids = tf.ragged.constant(rows, dtype=tf.int32)
    targets = rng.standard_normal([32, 1]).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((ids, targets)).batch(8)
    model.fit(dataset, epochs=2, verbose=0)
    after = layer.embeddings.numpy()
    assert_bits_equal(after[~trainable], table[~trainable], "frozen rows")
    touched = np.unique([r for row in rows for r in row if r >= 0])
    moved = touched[trainable[touched]]
    assert moved.size and np.all((after[moved] != table[moved]).any(axis=1))


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.Adam(0.1),
        lambda: keras.optimizers.AdamW(0.1, weight_decay=0.2),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    ],
    ids=["adam", "adamw", "sgd_momentum"],
)
def test_frozen_rows_stay_bit_exact(rng, optimizer):
    """Padded ids with weights, a freeze and an unfreeze between steps."""
    layer, table, trainable = random_layer(rng, "sum", mask_zero=True)
    model = bag_model(layer, length=6, weighted=True)
    masked = pe.MaskedOptimizer(optimizer())
    masked.build(model.trainable_variables)
    variables = model.trainable_variables

    @tf.function
    def step(ids, weights, targets):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model([ids, weights]) - targets))
        masked.apply(tape.gradient(loss, variables), variables)

    for index in range(6):
        if index == 3:
            layer.freeze(np.flatnonzero(trainable)[:2])
            layer.unfreeze(np.flatnonzero(~trainable)[:1])
        ids = padded(rng, 8, 6)
        weights = rng.uniform(0.5, 2.0, size=ids.shape).astype(np.float32)
        step(ids, weights, rng.standard_normal([8, 1]).astype(np.float32))
    never = ~trainable
    never[np.flatnonzero(~trainable)[:1]] = False
    assert_bits_equal(layer.embeddings.numpy()[never], table[never], "frozen rows")
    assert (layer.embeddings.numpy()[trainable] != table[trainable]).any()


def test_jit_compile_fit_matches_the_kernel_path(rng):
    """Keras' fit with jit_compile=True (its default on a GPU): the XLA path
    of stock ops trains as the kernels do; frozen rows keep their bits."""
    results = []
    ids = padded(rng, 16, 5)
    targets = rng.standard_normal([16, 1]).astype(np.float32)
    state = rng.bit_generator.state
    for jit_compile in (False, True):
        rng.bit_generator.state = state
        layer, table, trainable = random_layer(rng, "mean", mask_zero=True)
        model = bag_model(layer, length=5)
        model.compile(
            pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), "mse", jit_compile=jit_compile
        )
        model.fit(ids, targets, batch_size=8, epochs=2, shuffle=False, verbose=0)
        after = layer.embeddings.numpy()
        assert_bits_equal(after[~trainable], table[~trainable], "frozen rows")
        results.append(after)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


def test_jit_compile_takes_ragged_input_as_keras_does(rng):
    layer, table, trainable = random_layer(rng, "sqrtn")
    model = bag_model(layer, ragged=True)
    model.compile(pe.MaskedOptimizer(keras.optimizers.SGD(0.1)), "mse", jit_compile=True)
    ids = tf.ragged.constant([[1, 2], [3, 4, 5], [6], [7, 8]], dtype=tf.int32)
    targets = np.ones([4, 1], np.float32)
    model.fit(tf.data.Dataset.from_tensor_slices((ids, targets)).batch(4), verbose=0)
    assert_bits_equal(layer.embeddings.numpy()[~trainable], table[~trainable], "frozen rows")


def test_int8_frozen_rows(rng):
    """A quantized layer: frozen rows from int8, trainable rows from the float
    store; training moves the store's permitted rows only."""
    table = rng.standard_normal([ROWS, WIDTH]).astype(np.float32)
    trainable = np.zeros(ROWS, bool)
    trainable[[2, 5, 11]] = True
    layer = pe.PartialEmbedding(
        ROWS, WIDTH, weights=table, trainable_ids=trainable, combiner="mean",
        dtype="int8_from_float32",
    )  # fmt: skip
    per_id = pe.PartialEmbedding(
        ROWS, WIDTH, weights=table, trainable_ids=trainable, dtype="int8_from_float32"
    )
    ids = tf.ragged.constant([[2, 3, 4], [5, 5], [], [11, 12, -1]])
    # The quantized per-id lookup (int8 and store rows) of the unpruned ids.
    rows = per_id(tf.ragged.boolean_mask(ids, ids >= 0))
    expected = tf.math.divide_no_nan(
        tf.reduce_sum(rows, axis=1), tf.cast(rows.row_lengths(), tf.float32)[:, None]
    )
    np.testing.assert_allclose(layer(ids), expected, rtol=1e-6, atol=1e-6)

    model = bag_model(layer, ragged=True)
    model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), "mse")
    codes, scales = layer._embeddings.numpy().copy(), layer.embeddings_scale.numpy().copy()
    store = layer.float_rows.numpy().copy()
    model.fit(tf.data.Dataset.from_tensor_slices((ids, np.ones([4, 1]))).batch(4), verbose=0)
    assert_bits_equal(layer._embeddings.numpy(), codes, "int8 rows")
    assert_bits_equal(layer.embeddings_scale.numpy(), scales, "scales")
    moved = (layer.float_rows.numpy() != store).any(axis=1)
    assert moved[:3].all() and not moved[3:].any()


def test_mixed_precision_returns_the_compute_dtype(rng):
    layer, _, _ = random_layer(rng, "mean", dtype="mixed_float16")
    assert layer(tf.ragged.constant([[1, 2], [3]])).dtype == tf.float16


def test_bad_arguments():
    with pytest.raises(ValueError, match="combiner: 'max' is not None, 'sum', 'mean' or 'sqrtn'"):
        pe.PartialEmbedding(ROWS, WIDTH, combiner="max")
    layer = pe.PartialEmbedding(ROWS, WIDTH)
    with pytest.raises(ValueError, match="weights: only a layer with a combiner takes weights"):
        layer(np.array([[1, 2]]), weights=np.ones([1, 2], np.float32))
    with pytest.raises(ValueError, match="combiner: PartialReversibleEmbedding looks up one row"):
        pe.PartialReversibleEmbedding(ROWS, WIDTH, combiner="mean")
    assert "combiner" not in pe.PartialReversibleEmbedding(ROWS, WIDTH).get_config()
    bags = pe.PartialEmbedding(ROWS, WIDTH, combiner="sum")
    with pytest.raises(tf.errors.InvalidArgumentError, match="bag 1, position 0 = 30"):
        bags(np.array([[1, 2], [30, 0]]))


def test_stateless_call_matches_call_and_stops_frozen_gradients(rng):
    layer, table, trainable = random_layer(rng, "sqrtn", mask_zero=True)
    model = keras.Sequential([keras.Input((5,), dtype="int32"), layer])
    ids = padded(rng, 4, 5)
    table_tensor = tf.constant(table)
    with tf.GradientTape() as tape:
        tape.watch(table_tensor)
        outputs, _ = model.stateless_call([table_tensor], [tf.constant(trainable)], ids)
        loss = tf.reduce_sum(outputs)
    np.testing.assert_allclose(outputs, model(ids), rtol=1e-6, atol=1e-7)
    grad = tf.convert_to_tensor(tape.gradient(loss, table_tensor)).numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(ids))
    kernel = tape.gradient(loss, layer.embeddings.value)
    expected = np.zeros_like(table)
    np.add.at(expected, np.asarray(kernel.indices), np.asarray(kernel.values))
    np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-7)
    assert not grad[~trainable].any()


def test_saved_model_serves_with_stock_ops_only(rng, tmp_path):
    layer, table, _ = random_layer(rng, "sqrtn", mask_zero=True)
    model = bag_model(layer, length=5)
    ids = padded(rng, 3, 5).astype(np.int32)
    expected = model(ids).numpy()
    path = str(tmp_path / "saved")
    model.export(path, format="tf_saved_model", verbose=False)
    # Stock ops only: the SavedModel serves where this library is not installed.
    with open(tmp_path / "saved" / "saved_model.pb", "rb") as graph:
        saved = graph.read()
    assert b"EmbeddingBag" not in saved and b"PartialEmbedding>" not in saved
    loaded = tf.saved_model.load(path)
    # Stock ops and the kernel sum in other orders. Each output sums a bag's
    # |rows| / sqrt(n) over the width: from the exact value each side errs by
    # its roundings (4 bag additions, 3 for the sqrtn factor: square root,
    # division, product; WIDTH - 1 head additions, the head's ones exact) times
    # that magnitude, which the mixed-sign sum itself may cancel far below.
    counts = np.count_nonzero(ids, axis=1)
    magnitude = np.abs(table[ids].astype(np.float64) * (ids != 0)[..., None]).sum(axis=(1, 2))
    magnitude /= np.sqrt(np.maximum(counts, 1))
    assert_within_rounding(
        loaded.serve([tf.constant(ids)]).numpy()[:, 0],
        expected[:, 0],
        magnitude,
        2 * (ids.shape[1] - 1 + 3 + WIDTH - 1),
        "float32",
        "served outputs",
    )
