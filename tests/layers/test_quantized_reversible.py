"""PartialReversibleEmbedding with int8 frozen rows and float trainable rows.

References: Keras' own quantized ``keras.layers.ReversibleEmbedding`` on the
same weights (bytes, scales and the logits of columns without a float row,
bit for bit), float64 NumPy (logits of float columns, gradients) and a float
``PartialReversibleEmbedding`` trained on the same batches (trainable rows
within float tolerance).
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.errors import PartialEmbeddingArgumentError

ROWS, WIDTH = 40, 6


def _table(rng: np.random.Generator, rows: int = ROWS, width: int = WIDTH) -> np.ndarray:
    return rng.normal(size=(rows, width)).astype(np.float32)


def _keras_quantized(
    table: np.ndarray, reverse: np.ndarray | None, soft_cap: float | None = None
) -> keras.layers.ReversibleEmbedding:
    """Keras' quantized layer; ``reverse`` row-major ``[V, D]`` (None: tied)."""
    reference = keras.layers.ReversibleEmbedding(
        *table.shape, tie_weights=reverse is None, logit_soft_cap=soft_cap
    )
    reference.build()
    reference._embeddings.assign(table)
    if reverse is not None:
        reference.reverse_embeddings.assign(reverse.T)
    reference.quantize("int8")
    return reference


def _float_layer(
    table: np.ndarray, reverse: np.ndarray | None, trainable: np.ndarray, **kwargs
) -> pe.PartialReversibleEmbedding:
    layer = pe.PartialReversibleEmbedding(
        *table.shape, tie_weights=reverse is None, trainable_ids=trainable, **kwargs
    )
    layer.build()
    layer.embeddings.assign(table)
    if reverse is not None:
        layer.reverse_embeddings.assign(reverse)
    return layer


def _hidden_model(layer: keras.layers.Layer, length: int = 3) -> keras.Model:
    """ids -> lookup and hidden -> logits: a per-entry loss on either keeps
    every row's gradient its own."""
    ids = keras.Input((length,), dtype="int32")
    hidden = keras.Input((layer.output_dim,))
    return keras.Model([ids, hidden], [layer(ids), layer(hidden, reverse=True)])


def _frozen_state(layer: pe.PartialReversibleEmbedding) -> list[np.ndarray]:
    names = ["_embeddings", "embeddings_scale"]
    if not layer.tie_weights:
        names += ["reverse_embeddings", "reverse_embeddings_scale"]
    return [getattr(layer, name).numpy().copy() for name in names]


def _store(layer: pe.PartialReversibleEmbedding, reverse: bool) -> dict[str, np.ndarray]:
    prefix = "reverse_" if reverse and not layer.tie_weights else ""
    names = ("embeddings", "embeddings_scale", "float_rows", "float_row_ids", "float_row_index")
    values = {
        name: getattr(layer, prefix + name if prefix or name != "embeddings" else "_embeddings")
        for name in names
    }
    return {name: np.asarray(value.numpy()) for name, value in values.items()}


def _effective_table(store: dict[str, np.ndarray]) -> np.ndarray:
    """float64 ``[V, D]``: the float row where a row has one, else int8 / scale."""
    table = (
        store["embeddings"].astype(np.float64)
        / store["embeddings_scale"].astype(np.float64)[:, None]
    )
    rows = store["float_row_ids"] < table.shape[0]
    ids, index = store["float_row_ids"][rows], store["float_row_index"][rows]
    table[ids] = store["float_rows"][index].astype(np.float64)
    return table


def _float_columns(store: dict[str, np.ndarray], rows: int) -> np.ndarray:
    ids = store["float_row_ids"]
    return ids[ids < rows]


# --- logits: Keras' int8 formula bit for bit, float columns in float -------------


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("how", ["quantize", "model.quantize", "dtype_policy", "constructor"])
def test_logits_are_keras_bit_for_bit_where_rows_have_no_float_row(
    rng: np.random.Generator, tie: bool, how: str
) -> None:
    table = _table(rng)
    reverse = None if tie else _table(rng)
    table[int(rng.integers(ROWS))] = 0.0  # a zero row: its scale from epsilon alone
    trainable = rng.choice(ROWS, size=4, replace=False)
    if how == "constructor":
        layer = pe.PartialReversibleEmbedding(
            ROWS, WIDTH, tie_weights=tie, trainable_ids=trainable, weights=table,
            dtype="int8_from_float32",
        )  # fmt: skip
        if not tie:
            layer.set_weights([table, reverse.T])  # a stock layer's float arrays
    else:
        layer = _float_layer(table, reverse, trainable)
        if how == "quantize":
            layer.quantize("int8")
        elif how == "model.quantize":
            _hidden_model(layer).quantize("int8")
        else:
            layer.dtype_policy = "int8_from_float32"
    reference = _keras_quantized(table, reverse)
    assert layer.quantization_mode == "int8"
    for ours, theirs in zip(_frozen_state(layer), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs.T if ours.shape != theirs.shape else theirs)
    hidden = rng.normal(size=(3, 5, WIDTH)).astype(np.float32)
    logits = layer(hidden, reverse=True).numpy()
    expected = reference(hidden, reverse=True).numpy()
    frozen = np.setdiff1d(np.arange(ROWS), trainable)
    np.testing.assert_array_equal(logits[..., frozen], expected[..., frozen])
    source = table if tie else reverse
    np.testing.assert_allclose(
        logits[..., trainable],
        hidden.astype(np.float64) @ source[trainable].astype(np.float64).T,
        rtol=1e-5, atol=1e-5,
    )  # fmt: skip
    # Lookups of frozen rows are Keras' too.
    ids = rng.integers(0, ROWS, size=(2, 7))
    looked_up, keras_rows = layer(ids).numpy(), reference(ids).numpy()
    np.testing.assert_array_equal(
        looked_up[~np.isin(ids, trainable)], keras_rows[~np.isin(ids, trainable)]
    )


@pytest.mark.parametrize("tie", [True, False])
def test_every_row_frozen_gives_keras_logits_with_soft_cap(
    rng: np.random.Generator, tie: bool
) -> None:
    table = _table(rng)
    reverse = None if tie else _table(rng)
    layer = _float_layer(table, reverse, np.array([], np.int64), logit_soft_cap=2.5)
    layer.quantize("int8")
    reference = _keras_quantized(table, reverse, soft_cap=2.5)
    hidden = rng.normal(size=(4, WIDTH)).astype(np.float32) * 3
    np.testing.assert_array_equal(
        layer(hidden, reverse=True).numpy(), reference(hidden, reverse=True).numpy()
    )
    # Dequantized, the int8 logits are within the rounding bound of the float ones.
    rows = (table if tie else reverse).astype(np.float64)
    float_logits = hidden.astype(np.float64) @ rows.T
    capped = np.tanh(float_logits / 2.5) * 2.5
    error = np.abs(layer(hidden, reverse=True).numpy() - capped)
    assert np.all(error <= _int8_logit_bound(hidden, rows)), error.max()


def _int8_logit_bound(hidden: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Worst-case |int8 logit - float logit|, per [batch, vocab] entry.

    Keras quantizes each hidden row and each table row by its absmax: an
    element moves by at most absmax / 254 (half a step of absmax / 127), so
    |h'.w' - h.w| <= e_w sum|h| + e_h sum|w| + D e_h e_w. A soft cap
    (c tanh(x / c), slope <= 1) does not widen it; 1e-5 covers float32 sums.
    """
    hidden = np.abs(hidden.astype(np.float64))
    rows = np.abs(rows)
    e_h = hidden.max(axis=1, keepdims=True) / 254  # [batch, 1]
    e_w = rows.max(axis=1)[None, :] / 254  # [1, vocab]
    sum_h = hidden.sum(axis=1, keepdims=True)
    sum_w = rows.sum(axis=1)[None, :]
    return e_w * sum_h + e_h * sum_w + rows.shape[1] * e_h * e_w + 1e-5


# --- gradients: IndexedSlices over the store, straight-through inputs -----------


@pytest.mark.parametrize("tie", [True, False])
def test_gradients_match_a_float64_reference(rng: np.random.Generator, tie: bool) -> None:
    table = _table(rng)
    reverse = None if tie else _table(rng)
    trainable = rng.choice(ROWS, size=5, replace=False)
    layer = _float_layer(table, reverse, trainable)
    layer.quantize("int8")
    # A row that learned once and is frozen again keeps a float column, no gradient.
    refrozen = int(trainable[0])
    if tie:
        layer.freeze([refrozen])
    else:
        layer.set_reverse_trainable_ids(trainable[1:])
    hidden = tf.constant(rng.normal(size=(6, WIDTH)).astype(np.float32))
    weights = rng.normal(size=(6, ROWS))
    store_rows = layer.float_rows if tie else layer.reverse_float_rows
    with tf.GradientTape() as tape:
        tape.watch(hidden)
        loss = tf.reduce_sum(layer(hidden, reverse=True) * weights.astype(np.float32))
    d_hidden, d_store = tape.gradient(loss, [hidden, store_rows])
    store = _store(layer, reverse=True)
    assert isinstance(d_store, tf.IndexedSlices)
    assert d_store.dense_shape.numpy().tolist() == list(store_rows.shape)
    columns = _float_columns(store, ROWS)
    index = store["float_row_index"][: len(columns)]
    permitted = np.setdiff1d(trainable, [refrozen])
    expected_store = np.zeros(store_rows.shape)
    learning = np.isin(columns, permitted)
    expected_store[index[learning]] = weights[:, columns[learning]].T @ hidden.numpy()
    np.testing.assert_allclose(
        tf.convert_to_tensor(d_store).numpy(), expected_store, rtol=1e-5, atol=1e-5
    )
    assert set(d_store.indices.numpy().tolist()) <= set(index[learning].tolist())
    # Straight-through: the int8 columns as their dequantized rows.
    expected_hidden = weights @ _effective_table(store)
    np.testing.assert_allclose(d_hidden.numpy(), expected_hidden, rtol=1e-5, atol=1e-5)


# --- training: frozen bytes stay, trainable rows as a float layer's -------------


def _train(model: keras.Model, inner: type, data: tuple, jit: bool = False) -> None:
    model.compile(pe.MaskedOptimizer(inner(0.05)), ["mse", "mse"], jit_compile=jit)
    inputs, targets = data
    model.fit(inputs, targets, epochs=3, batch_size=4, shuffle=False, verbose=0)


def _data(rng: np.random.Generator, count: int = 12, length: int = 3) -> tuple:
    ids = rng.integers(0, ROWS, size=(count, length)).astype(np.int32)
    hidden = rng.normal(size=(count, WIDTH)).astype(np.float32)
    targets = [
        rng.normal(size=(count, length, WIDTH)).astype(np.float32),
        rng.normal(size=(count, ROWS)).astype(np.float32),
    ]
    return [ids, hidden], targets


def _reverse_rows(layer: pe.PartialReversibleEmbedding) -> np.ndarray:
    """The output table as the reverse projection sees it, ``[V, D]``."""
    return layer(np.eye(WIDTH, dtype=np.float32), reverse=True).numpy().T


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("inner", [keras.optimizers.SGD, keras.optimizers.Adam])
def test_trainable_rows_match_a_float_layer_and_frozen_bytes_stay(
    rng: np.random.Generator, tie: bool, inner: type
) -> None:
    table = _table(rng)
    reverse = None if tie else _table(rng)
    trainable = rng.choice(ROWS, size=6, replace=False)
    data = _data(rng)
    float_layer = _float_layer(table, reverse, trainable)
    _train(_hidden_model(float_layer), inner, data)
    layer = _float_layer(table, reverse, trainable)
    layer.quantize("int8")
    before = _frozen_state(layer)
    _train(_hidden_model(layer), inner, data)
    for now, then in zip(_frozen_state(layer), before, strict=True):
        np.testing.assert_array_equal(now, then)
    looked_up = layer(trainable[None, :]).numpy()[0]
    np.testing.assert_allclose(
        looked_up, float_layer.embeddings.numpy()[trainable], rtol=1e-5, atol=1e-6
    )
    expected_reverse = float_layer.embeddings if tie else float_layer.reverse_embeddings
    np.testing.assert_allclose(
        _reverse_rows(layer)[trainable], expected_reverse.numpy()[trainable], rtol=1e-5, atol=1e-6
    )
    # Optimizer state: the stores' rows only, never [V, D].
    for variable in layer.trainable_variables:
        assert variable.shape[0] == layer.trainable_capacity + 1


@pytest.mark.parametrize("tie", [True, False])
def test_xla_fit_matches_eager_fit(rng: np.random.Generator, tie: bool) -> None:
    table = _table(rng)
    reverse = None if tie else _table(rng)
    trainable = rng.choice(ROWS, size=4, replace=False)
    data = _data(rng)
    results = []
    for jit in (False, True):
        layer = _float_layer(table, reverse, trainable)
        layer.quantize("int8")
        before = _frozen_state(layer)
        _train(_hidden_model(layer), keras.optimizers.Adam, data, jit=jit)
        for now, then in zip(_frozen_state(layer), before, strict=True):
            np.testing.assert_array_equal(now, then)
        results.append([variable.numpy() for variable in layer.trainable_variables])
    for xla, eager in zip(results[1], results[0], strict=True):
        np.testing.assert_allclose(xla, eager, rtol=1e-5, atol=1e-6)


# --- the untied output table's mask ---------------------------------------------


def test_set_reverse_trainable_ids_gives_new_rows_float_rows(rng: np.random.Generator) -> None:
    table, reverse = _table(rng), _table(rng)
    layer = _float_layer(table, reverse, np.array([1, 2]))
    layer.quantize("int8", trainable_capacity=3)
    codes, scale = layer.reverse_embeddings.numpy(), layer.reverse_embeddings_scale.numpy()
    layer.set_reverse_trainable_ids([2, 7])
    np.testing.assert_array_equal(layer.reverse_trainable_ids, [2, 7])
    np.testing.assert_array_equal(layer.trainable_ids, [1, 2])
    store = _store(layer, reverse=True)
    np.testing.assert_array_equal(_float_columns(store, ROWS), [1, 2, 7])
    # Row 7's float row holds its dequantized values (Keras' formula, in
    # float32); row 1 keeps its float values.
    np.testing.assert_array_equal(
        _effective_table(store)[7], codes[7].astype(np.float32) / scale[7]
    )
    np.testing.assert_array_equal(_effective_table(store)[1], reverse[1])
    mask = layer.reverse_float_rows_mask.numpy()
    assert mask[store["float_row_index"][:3]].tolist() == [False, True, True]
    # More new rows than free float rows: both stores grow alike (they
    # share trainable_capacity), the rows already there stay.
    layer.set_reverse_trainable_ids([2, 3, 4, 7])
    assert layer.trainable_capacity == 5
    assert layer.float_rows.shape[0] == layer.reverse_float_rows.shape[0] == 6
    np.testing.assert_array_equal(layer.reverse_trainable_ids, [2, 3, 4, 7])
    np.testing.assert_array_equal(
        _float_columns(_store(layer, reverse=True), ROWS), [1, 2, 3, 4, 7]
    )
    np.testing.assert_array_equal(_float_columns(_store(layer, reverse=False), ROWS), [1, 2])
    np.testing.assert_array_equal(_effective_table(_store(layer, reverse=True))[1], reverse[1])
    tied = _float_layer(table, None, np.array([1]))
    tied.quantize("int8")
    with pytest.raises(AttributeError, match="tie_weights=False"):
        tied.set_reverse_trainable_ids([1])


def test_bad_quantize_calls_change_nothing(rng: np.random.Generator) -> None:
    layer = _float_layer(_table(rng), _table(rng), np.arange(3), reverse_trainable_ids=np.arange(9))
    paths = [variable.path for variable in layer.weights]
    values = layer.get_weights()
    with pytest.raises(PartialEmbeddingArgumentError, match="trainable_capacity"):
        layer.quantize("int8", trainable_capacity=5)  # 9 reverse rows learn
    with pytest.raises(NotImplementedError, match="int4"):
        layer.quantize("int4")
    assert layer.quantization_mode is None
    assert [variable.path for variable in layer.weights] == paths
    for now, then in zip(layer.get_weights(), values, strict=True):
        np.testing.assert_array_equal(now, then)
    layer.quantize("int8")
    assert layer.trainable_capacity >= 9
    state = _frozen_state(layer)
    with pytest.raises(ValueError, match="already quantized"):
        layer.quantize("int8")
    for now, then in zip(_frozen_state(layer), state, strict=True):
        np.testing.assert_array_equal(now, then)


# --- config and saving ------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
def test_config_round_trip_builds_the_same_weights(rng: np.random.Generator, tie: bool) -> None:
    layer = pe.PartialReversibleEmbedding(
        ROWS, WIDTH, tie_weights=tie, trainable_ids=[3, 4], logit_soft_cap=3.0,
        dtype="int8_from_float32",
    )  # fmt: skip
    layer.build()
    config = layer.get_config()
    rebuilt = pe.PartialReversibleEmbedding.from_config(config)
    rebuilt.build()
    assert rebuilt.get_config() == config
    assert rebuilt.quantization_mode == "int8"
    assert [(v.path.split("/")[-1], v.shape, v.dtype) for v in rebuilt.weights] == [
        (v.path.split("/")[-1], v.shape, v.dtype) for v in layer.weights
    ]


@pytest.mark.parametrize("tie", [True, False])
def test_saving_round_trips(rng: np.random.Generator, tie: bool, tmp_path) -> None:
    table = _table(rng)
    reverse = None if tie else _table(rng)
    layer = _float_layer(table, reverse, np.array([3, 4]))
    model = _hidden_model(layer)
    model.quantize("int8")
    _train(model, keras.optimizers.Adam, _data(rng))
    layer.unfreeze([9])
    if not tie:
        layer.set_reverse_trainable_ids([4, 11])
    inputs, _ = _data(rng, count=3)
    expected = model.predict(inputs, verbose=0)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    for ours, theirs in zip(loaded.predict(inputs, verbose=0), expected, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    loaded_layer = loaded.get_layer(layer.name)
    np.testing.assert_array_equal(loaded_layer.trainable_ids, [3, 4, 9])
    if not tie:
        np.testing.assert_array_equal(loaded_layer.reverse_trainable_ids, [4, 11])
    for now, then in zip(_frozen_state(loaded_layer), _frozen_state(layer), strict=True):
        np.testing.assert_array_equal(now, then)
    # Weights only, into a model quantized the same way.
    weights_path = os.path.join(tmp_path, "model.weights.h5")
    model.save_weights(weights_path)
    fresh = _hidden_model(_float_layer(_table(rng), None if tie else _table(rng), np.array([3, 4])))
    fresh.quantize("int8")
    fresh.load_weights(weights_path)
    for ours, theirs in zip(fresh.predict(inputs, verbose=0), expected, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    # tf.train.Checkpoint, into a model built quantized from its config.
    prefix = tf.train.Checkpoint(model=model).save(os.path.join(tmp_path, "ckpt"))
    rebuilt = keras.Model.from_config(model.get_config())
    tf.train.Checkpoint(model=rebuilt).restore(prefix).expect_partial()
    for ours, theirs in zip(rebuilt.predict(inputs, verbose=0), expected, strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_a_quantized_stock_layers_weights_load(rng: np.random.Generator) -> None:
    table, reverse = _table(rng), _table(rng)
    reference = _keras_quantized(table, reverse)
    layer = pe.PartialReversibleEmbedding(
        ROWS, WIDTH, tie_weights=False, trainable_ids=[5], dtype="int8_from_float32"
    )
    layer.build()
    layer.set_weights(reference.get_weights())
    hidden = rng.normal(size=(4, WIDTH)).astype(np.float32)
    logits, expected = layer(hidden, reverse=True).numpy(), reference(hidden, reverse=True).numpy()
    # Row 5's float row holds its dequantized values: its column is float
    # (no quantization of the inputs).
    frozen = np.setdiff1d(np.arange(ROWS), [5])
    np.testing.assert_array_equal(logits[:, frozen], expected[:, frozen])
    codes, scale = reference.reverse_embeddings.numpy()[:, 5], reference.reverse_embeddings_scale[5]
    dequantized = codes.astype(np.float64) / float(scale)
    np.testing.assert_allclose(logits[:, 5], hidden @ dequantized, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tie", [True, False])
def test_mixed_bfloat16_logits_are_keras_cast_to_bfloat16(
    rng: np.random.Generator, tie: bool
) -> None:
    table = _table(rng)
    reverse = None if tie else _table(rng)
    reference = keras.layers.ReversibleEmbedding(
        ROWS, WIDTH, tie_weights=tie, dtype="mixed_bfloat16"
    )
    reference.build()
    reference._embeddings.assign(table)
    if not tie:
        reference.reverse_embeddings.assign(reverse.T)
    reference.quantize("int8")
    layer = _float_layer(table, reverse, np.array([2]), dtype="mixed_bfloat16")
    layer.quantize("int8")
    hidden = rng.normal(size=(3, WIDTH)).astype(np.float32)
    logits = layer(hidden, reverse=True)
    assert logits.dtype == tf.bfloat16
    expected = tf.cast(reference(hidden, reverse=True), tf.bfloat16)
    frozen = np.setdiff1d(np.arange(ROWS), [2])
    np.testing.assert_array_equal(
        tf.cast(logits, tf.float32).numpy()[:, frozen],
        tf.cast(expected, tf.float32).numpy()[:, frozen],
    )


@pytest.mark.parametrize("tie", [True, False])
def test_saved_model_and_stateless_call(rng: np.random.Generator, tie: bool, tmp_path) -> None:
    layer = pe.PartialReversibleEmbedding(
        25, 4, tie_weights=tie, trainable_ids=[3], dtype="int8_from_float32"
    )
    hidden = keras.Input((4,))
    model = keras.Model(hidden, layer(hidden, reverse=True))
    inputs = rng.normal(size=(2, 4)).astype(np.float32)
    expected = model(inputs).numpy()
    path = os.path.join(tmp_path, "saved")
    model.export(path, format="tf_saved_model", verbose=False)
    loaded = tf.saved_model.load(path)
    np.testing.assert_array_equal(loaded.serve(tf.constant(inputs)).numpy(), expected)
    # Values from the scope: a changed float row changes its column only.
    trainable = [variable.numpy() for variable in model.trainable_variables]
    trainable = [value + 1.0 for value in trainable]
    non_trainable = [variable.numpy() for variable in model.non_trainable_variables]
    outputs, _ = model.stateless_call(trainable, non_trainable, inputs)
    outputs = np.asarray(outputs)
    frozen = np.setdiff1d(np.arange(25), [3])
    np.testing.assert_array_equal(outputs[:, frozen], expected[:, frozen])
    np.testing.assert_allclose(
        outputs[:, 3], expected[:, 3] + inputs.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5
    )
