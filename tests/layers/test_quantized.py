"""PartialEmbedding with int8 frozen rows and float trainable rows (``quantize("int8")``).

References: Keras' own quantized ``keras.layers.Embedding`` on the same
weights (bytes, scales and frozen lookups bit for bit), a float
``PartialEmbedding`` trained on the same batches (trainable rows within float
tolerance) and NumPy (dequantized values).
"""

from __future__ import annotations

import os
import pathlib
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute.sharded_variable import ShardedVariable

import partial_embedding as pe
from pe_testing import buffer_address


def _table(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    return rng.normal(size=(rows, width)).astype(np.float32)


def _keras_quantized(table: np.ndarray) -> keras.layers.Embedding:
    reference = keras.layers.Embedding(*table.shape, weights=table)
    reference.quantize("int8")
    return reference


def _model(layer: keras.layers.Layer, length: int) -> keras.Model:
    return keras.Sequential([keras.Input((length,), dtype="int32"), layer])


def _frozen_state(layer: pe.PartialEmbedding) -> tuple[np.ndarray, np.ndarray]:
    return layer._embeddings.numpy().copy(), layer.embeddings_scale.numpy().copy()


@pytest.mark.parametrize("how", ["quantize", "model.quantize", "dtype_policy", "constructor"])
def test_int8_rows_and_frozen_lookups_are_keras_bit_for_bit(
    rng: np.random.Generator, how: str
) -> None:
    rows, width = int(rng.integers(20, 80)), int(rng.integers(1, 12))
    table = _table(rng, rows, width)
    table[int(rng.integers(rows))] = 0.0  # an all-zero row: scale from epsilon alone
    trainable = rng.choice(rows, size=3, replace=False)
    if how == "constructor":
        layer = pe.PartialEmbedding(
            rows, width, weights=table, trainable_ids=trainable, dtype="int8_from_float32"
        )
    else:
        layer = pe.PartialEmbedding(rows, width, weights=table, trainable_ids=trainable)
        if how == "quantize":
            layer.quantize("int8")
        elif how == "model.quantize":
            _model(layer, 5).quantize("int8")
        else:
            layer.dtype_policy = "int8_from_float32"
    reference = _keras_quantized(table)
    assert layer.quantization_mode == "int8"
    assert layer._embeddings.dtype == "int8"
    np.testing.assert_array_equal(layer._embeddings.numpy(), reference._embeddings.numpy())
    np.testing.assert_array_equal(
        layer.embeddings_scale.numpy(), reference.embeddings_scale.numpy()
    )
    ids = rng.integers(0, rows, size=(4, 7))
    ours, theirs = layer(ids).numpy(), reference(ids).numpy()
    frozen = ~np.isin(ids, trainable)
    np.testing.assert_array_equal(ours[frozen], theirs[frozen])
    # Trainable rows keep their float values.
    np.testing.assert_array_equal(ours[~frozen], table[ids][~frozen])
    np.testing.assert_array_equal(np.sort(layer.trainable_ids), np.sort(trainable))


def test_every_row_frozen_behaves_as_keras_quantized_layer(rng: np.random.Generator) -> None:
    table = _table(rng, 30, 6)
    layer = pe.PartialEmbedding(30, 6, weights=table, trainable_ids=[])
    layer.quantize("int8")
    reference = _keras_quantized(table)
    ids = rng.integers(0, 30, size=(3, 5))
    np.testing.assert_array_equal(layer(ids).numpy(), reference(ids).numpy())
    # Keras' formula, in float64 NumPy: int8 / scale, rounded once to float32.
    expected = (
        reference._embeddings.numpy()[ids].astype(np.float64)
        / reference.embeddings_scale.numpy()[ids][..., None].astype(np.float64)
    ).astype(np.float32)
    np.testing.assert_array_equal(layer(ids).numpy(), expected)


def test_construction_from_memory_mapped_file(rng: np.random.Generator, tmp_path) -> None:
    table = _table(rng, 64, 8)
    path = os.path.join(tmp_path, "table.npy")
    np.save(path, table.astype(np.float64))  # cast to the variable dtype per block
    mapped = np.load(path, mmap_mode="r")
    layer = pe.PartialEmbedding(
        64, 8, weights=mapped, trainable_ids=[5, 9], dtype="int8_from_float32"
    )
    reference = _keras_quantized(table)
    np.testing.assert_array_equal(layer._embeddings.numpy(), reference._embeddings.numpy())
    np.testing.assert_array_equal(layer(np.array([[5, 9]])).numpy()[0], table[[5, 9]])


@pytest.mark.parametrize("as_path", [str, pathlib.Path], ids=["str", "pathlib"])
def test_construction_from_the_path_of_a_npy_file(
    rng: np.random.Generator, tmp_path, as_path
) -> None:
    table = _table(rng, 48, 6)
    path = os.path.join(tmp_path, "table.npy")
    np.save(path, table)
    layer = pe.PartialEmbedding(
        48, 6, weights=as_path(path), trainable_ids=[3, 40], dtype="int8_from_float32"
    )
    reference = _keras_quantized(table)
    np.testing.assert_array_equal(layer._embeddings.numpy(), reference._embeddings.numpy())
    np.testing.assert_array_equal(layer(np.array([3, 40])).numpy(), table[[3, 40]])
    plain = pe.PartialReversibleEmbedding(48, 6, weights=as_path(path), trainable_ids=[1])
    np.testing.assert_array_equal(plain.embeddings.numpy(), table)


def test_a_path_that_is_not_a_npy_file_is_refused(tmp_path) -> None:
    missing = os.path.join(tmp_path, "missing.npy")
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="weights: a path must name"):
        pe.PartialEmbedding(8, 2, weights=missing, dtype="int8_from_float32")
    text = os.path.join(tmp_path, "table.txt")
    with open(text, "w") as handle:
        handle.write("not an array")
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="table.txt"):
        pe.PartialEmbedding(8, 2, weights=text)


@pytest.mark.parametrize(
    "inner",
    [
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.Adam(0.05),
        lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1),
        lambda: keras.optimizers.Adagrad(0.1),
        lambda: keras.optimizers.RMSprop(0.01),
    ],
    ids=["sgd_momentum", "adam", "adamw", "adagrad", "rmsprop"],
)
def test_trainable_rows_match_a_float_layer_and_frozen_bytes_stay(
    rng: np.random.Generator, inner
) -> None:
    rows, width, length = 40, 4, 6
    table = _table(rng, rows, width)
    trainable = rng.choice(rows, size=6, replace=False)
    ids = rng.integers(0, rows, size=(16, length))
    targets = rng.normal(size=(16, length, width)).astype(np.float32)
    layers = []
    for quantized in (False, True):
        layer = pe.PartialEmbedding(rows, width, weights=table, trainable_ids=trainable)
        if quantized:
            layer.quantize("int8")
            before = _frozen_state(layer)
        model = _model(layer, length)
        model.compile(pe.MaskedOptimizer(inner()), "mse")
        model.fit(ids, targets, epochs=4, batch_size=4, shuffle=False, verbose=0)
        layers.append(layer)
    float_layer, int8_layer = layers
    for now, then in zip(_frozen_state(int8_layer), before, strict=True):
        np.testing.assert_array_equal(now, then)
    probe = np.arange(rows)[None, :]
    ours = int8_layer(probe).numpy()[0]
    # The loss is per entry, so each trainable row's gradient depends on
    # that row alone: the float layer's rows are the reference.
    np.testing.assert_allclose(
        ours[trainable], float_layer.embeddings.numpy()[trainable], rtol=1e-5, atol=1e-6
    )
    frozen = np.setdiff1d(np.arange(rows), trainable)
    reference = _keras_quantized(table)
    np.testing.assert_array_equal(ours[frozen], reference(probe).numpy()[0][frozen])
    # Optimizer state: the store's rows only.
    store_rows = int(int8_layer.float_rows.shape[0])
    for variable in int8_layer.float_rows, *int8_layer.non_trainable_weights:
        assert variable.shape[0] in (rows, store_rows)


def test_freeze_unfreeze_without_retrace(rng: np.random.Generator) -> None:
    table = _table(rng, 30, 4)
    layer = pe.PartialEmbedding(30, 4, weights=table, trainable_ids=[1, 2], trainable_capacity=5)
    layer.quantize("int8")
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1))
    ids = tf.constant([[1, 2, 7]])

    @tf.function
    def train_step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(ids) - 1.0))
        gradients = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(gradients, layer.trainable_variables))

    train_step()
    train_step()
    traces = train_step.experimental_get_tracing_count()
    dequantized_7 = layer(np.array([[7]])).numpy()[0, 0]
    layer.unfreeze([7])
    # Its float row holds the dequantized values: the lookup does not jump.
    np.testing.assert_array_equal(layer(np.array([[7]])).numpy()[0, 0], dequantized_7)
    layer.freeze([1])
    row_1 = layer(np.array([[1]])).numpy()[0, 0].copy()
    assert not np.array_equal(row_1, table[1])  # it trained in the first step
    train_step()
    assert train_step.experimental_get_tracing_count() == traces
    # Row 7 learned; row 1, frozen again, keeps its trained float values.
    assert not np.array_equal(layer(np.array([[7]])).numpy()[0, 0], dequantized_7)
    np.testing.assert_array_equal(layer(np.array([[1]])).numpy()[0, 0], row_1)
    np.testing.assert_array_equal(layer.trainable_ids, [2, 7])


def test_unfreezing_beyond_capacity_grows_the_store(rng: np.random.Generator) -> None:
    layer = pe.PartialEmbedding(20, 3, trainable_ids=[0], trainable_capacity=2)
    layer.build()
    layer.quantize("int8")
    codes, scales = layer._embeddings.numpy().copy(), layer.embeddings_scale.numpy().copy()
    before = layer(np.arange(20)).numpy()
    state = [variable.numpy().copy() for variable in layer.weights]
    with pytest.raises(ValueError, match="20"):
        layer.freeze([20])
    with pytest.raises(ValueError):
        layer.set_trainable_ids([-1])
    for variable, kept in zip(layer.weights, state, strict=True):
        np.testing.assert_array_equal(variable.numpy(), kept)
    # Three rows learn where two fit: the store grows by half (2 -> 4 rows).
    layer.unfreeze([4, 5])
    assert layer.trainable_capacity == 4 and layer.get_config()["trainable_capacity"] == 4
    assert tuple(layer.float_rows.shape) == (5, 3) and layer.float_rows.numpy().shape == (5, 3)
    np.testing.assert_array_equal(layer.trainable_ids, [0, 4, 5])
    np.testing.assert_array_equal(layer(np.arange(20)).numpy(), before)
    np.testing.assert_array_equal(layer._embeddings.numpy(), codes)
    np.testing.assert_array_equal(layer.embeddings_scale.numpy(), scales)
    # Many more: it grows to what is needed.
    layer.unfreeze(np.arange(6, 18))
    assert layer.trainable_capacity == 15
    np.testing.assert_array_equal(layer(np.arange(20)).numpy(), before)


def test_bad_quantize_calls_change_nothing(rng: np.random.Generator) -> None:
    layer = pe.PartialEmbedding(10, 4, trainable_ids=[1])
    with pytest.raises(ValueError, match="isn't yet built"):
        layer.quantize("int8")
    layer.build()
    table = layer.embeddings.numpy().copy()
    with pytest.raises(ValueError, match="Invalid quantization mode"):
        layer.quantize("int7")
    with pytest.raises(NotImplementedError, match="int4"):
        layer.quantize("int4")
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="trainable_capacity"):
        layer.quantize("int8", trainable_capacity=11)
    assert layer.quantization_mode is None
    np.testing.assert_array_equal(layer.embeddings.numpy(), table)
    layer.quantize("int8")
    before = _frozen_state(layer)
    with pytest.raises(ValueError, match="already quantized"):
        layer.quantize("int8")
    for now, then in zip(_frozen_state(layer), before, strict=True):
        np.testing.assert_array_equal(now, then)


def test_integer_table_is_refused() -> None:
    layer = pe.PartialEmbedding(10, 4, dtype="int32", embeddings_initializer="zeros")
    layer.build()
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="int32 table"):
        layer.quantize("int8", type_check=True)
    assert layer.quantization_mode is None and layer.embeddings.dtype == "int32"


def test_subclass_needs_type_check_false() -> None:
    class MyEmbedding(pe.PartialEmbedding):
        pass

    layer = MyEmbedding(10, 4)
    layer.build()
    with pytest.raises(NotImplementedError):
        layer.quantize("int8")
    layer.quantize("int8", type_check=False)
    assert layer.quantization_mode == "int8"


def test_model_quantize_int4_warns_and_keeps_the_layer(rng: np.random.Generator) -> None:
    layer = pe.PartialEmbedding(10, 4, trainable_ids=[1])
    model = _model(layer, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize("int4")
    assert any("int4" in str(warning.message) for warning in caught)
    assert layer.quantization_mode is None and layer.embeddings.dtype == "float32"


def test_saving_round_trips(rng: np.random.Generator, tmp_path) -> None:
    table = _table(rng, 25, 4)
    layer = pe.PartialEmbedding(25, 4, weights=table, trainable_ids=[3, 4])
    model = _model(layer, 3)
    model.quantize("int8")
    model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), "mse")
    ids = rng.integers(0, 25, size=(4, 3))
    model.fit(ids, np.ones([4, 3, 4]), epochs=2, verbose=0)
    layer.unfreeze([9])
    expected = model.predict(ids, verbose=0)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(ids, verbose=0), expected)
    loaded_layer = loaded.layers[0]
    np.testing.assert_array_equal(loaded_layer.trainable_ids, [3, 4, 9])
    np.testing.assert_array_equal(loaded_layer._embeddings.numpy(), layer._embeddings.numpy())
    # Weights only, into a model quantized the same way.
    weights_path = os.path.join(tmp_path, "model.weights.h5")
    model.save_weights(weights_path)
    fresh = _model(pe.PartialEmbedding(25, 4, trainable_ids=[3, 4]), 3)
    fresh.quantize("int8")
    fresh.load_weights(weights_path)
    np.testing.assert_array_equal(fresh.predict(ids, verbose=0), expected)
    # tf.train.Checkpoint, into a layer built quantized from its config.
    prefix = tf.train.Checkpoint(model=model).save(os.path.join(tmp_path, "ckpt"))
    rebuilt = keras.Sequential.from_config(model.get_config())
    tf.train.Checkpoint(model=rebuilt).restore(prefix).expect_partial()
    np.testing.assert_array_equal(rebuilt.predict(ids, verbose=0), expected)


def test_saved_model_round_trip(rng: np.random.Generator, tmp_path) -> None:
    layer = pe.PartialEmbedding(25, 4, trainable_ids=[3], dtype="int8_from_float32")
    model = _model(layer, 3)
    ids = rng.integers(0, 25, size=(2, 3)).astype(np.int32)
    expected = model(ids).numpy()
    path = os.path.join(tmp_path, "saved")
    model.export(path, format="tf_saved_model", verbose=False)
    # Stock ops only: the SavedModel serves where this library is not installed.
    with open(os.path.join(path, "saved_model.pb"), "rb") as graph:
        assert b"QuantizedLookup" not in graph.read()
    loaded = tf.saved_model.load(path)
    np.testing.assert_array_equal(loaded.serve(tf.constant(ids)).numpy(), expected)


def test_xla_fit_matches_eager_fit(rng: np.random.Generator) -> None:
    table = _table(rng, 30, 4)
    ids = rng.integers(0, 30, size=(8, 5))
    targets = rng.normal(size=(8, 5, 4)).astype(np.float32)
    results = []
    for jit in (False, True):
        layer = pe.PartialEmbedding(30, 4, weights=table, trainable_ids=[1, 2, 3, 4])
        layer.quantize("int8")
        before = _frozen_state(layer)
        model = _model(layer, 5)
        model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), "mse", jit_compile=jit)
        model.fit(ids, targets, epochs=3, batch_size=4, shuffle=False, verbose=0)
        for now, then in zip(_frozen_state(layer), before, strict=True):
            np.testing.assert_array_equal(now, then)
        results.append(layer.float_rows.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


def _two_shards(next_creator, **kwargs):
    """Tables of 10 rows become ShardedVariables of 5 + 5 rows, as
    ParameterServerStrategy with a partitioner makes them."""
    initial = kwargs["initial_value"]
    value = tf.convert_to_tensor(initial() if callable(initial) else initial)
    if value.shape.rank != 2 or value.shape[0] != 10:
        return next_creator(**kwargs)
    parts = [
        next_creator(**{**kwargs, "initial_value": value[start : start + 5], "shape": [5, 4]})
        for start in (0, 5)
    ]
    return ShardedVariable(parts)


def test_a_table_on_parameter_servers_is_refused_clearly() -> None:
    with tf.variable_creator_scope(_two_shards):
        layer = pe.PartialEmbedding(10, 4, trainable_ids=[1])
        layer.build()
    assert "Sharded" in type(layer.embeddings.value).__name__
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="ParameterServerStrategy"):
        layer.quantize("int8")
    assert layer.quantization_mode is None


def test_layer_built_quantized_round_trips_through_its_config(rng, tmp_path) -> None:
    table = _table(rng, 40, 4)
    layer = pe.PartialEmbedding(
        40, 4, weights=table, trainable_ids=[2, 3], dtype="int8_from_float32"
    )
    model = _model(layer, 3)
    ids = rng.integers(0, 40, size=(2, 3))
    path = os.path.join(tmp_path, "built_quantized.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.layers[0].float_rows.shape == layer.float_rows.shape
    np.testing.assert_array_equal(loaded.predict(ids, verbose=0), model.predict(ids, verbose=0))


@pytest.mark.usefixtures("on_cpu")  # buffer addresses through DLPack: host buffers
@pytest.mark.parametrize("built", ["quantize", "constructor"])
def test_reads_alias_the_int8_table_after_unfreeze_and_steps(rng, built) -> None:
    """Nothing puts the int8 table or the scales into copy-on-read mode (where
    every read, each step's included, copies the whole table)."""
    if built == "constructor":
        layer = pe.PartialEmbedding(64, 8, trainable_ids=[1], dtype="int8_from_float32")
        layer.build()
    else:
        layer = pe.PartialEmbedding(64, 8, trainable_ids=[1])
        layer.build()
        layer.quantize("int8")
    layer.unfreeze([5])
    model = _model(layer, 4)
    model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), "mse", jit_compile=False)
    model.fit(rng.integers(0, 64, size=(4, 4)), np.ones([4, 4, 8]), verbose=0)
    for variable in (layer._embeddings, layer.embeddings_scale):
        assert buffer_address(variable) == buffer_address(variable)
