"""Tests of PartialEmbedding and PartialEmbeddingsUpdate.

Random inputs come from the seeded ``rng`` fixture (conftest.py): fixed by
default, printed on failure, replayed with PE_TEST_SEED=<int>, fresh with
PE_TEST_SEED=random.
"""

from __future__ import annotations

import json
import re
import warnings
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import assert_bits_equal, assert_within_rounding, bits_equal

NUM_ROWS, WIDTH, SEQUENCE = 12, 3, 5


def random_ids(rng, batch=16, sequence=SEQUENCE, low=0):
    return rng.integers(low, NUM_ROWS, size=(batch, sequence)).astype(np.int32)


def regression_model(layer, sequence=SEQUENCE):
    inputs = keras.Input((sequence,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(layer(inputs))
    outputs = keras.layers.Dense(1, dtype="float32")(pooled)
    return keras.Model(inputs, outputs)


def fit(model, ids, rng, epochs=1, batch_size=8):
    targets = rng.standard_normal([len(ids), 1]).astype(np.float32)
    model.fit(ids, targets, epochs=epochs, batch_size=batch_size, verbose=0)


def changed_rows(before, after):
    return np.any(before != after, axis=tuple(range(1, before.ndim)))


# -- training --------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "mixed_float16"])
@pytest.mark.parametrize("how", ["trainable_ids", "frozen_ids", "bool_mask"])
def test_fit_with_sgd_keeps_frozen_rows_bit_exact(rng, dtype, how):
    row_mask = rng.random(NUM_ROWS) < 0.5
    row_mask[:2] = [True, False]
    if how == "trainable_ids":
        kwargs = dict(trainable_ids=np.flatnonzero(row_mask).tolist())
    elif how == "frozen_ids":
        kwargs = dict(frozen_ids=np.flatnonzero(~row_mask))
    else:
        kwargs = dict(trainable_ids=row_mask)
    layer = pe.PartialEmbedding(
        NUM_ROWS, WIDTH, dtype=dtype, embeddings_initializer="normal", **kwargs
    )
    model = regression_model(layer)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    np.testing.assert_array_equal(layer.trainable_mask.numpy(), row_mask)
    before = layer.embeddings.numpy().copy()
    ids = random_ids(rng)
    ids[:, 0], ids[:, 1] = 0, 1
    fit(model, ids, rng, epochs=2)
    after = layer.embeddings.numpy()
    assert bits_equal(after[~row_mask], before[~row_mask])
    touched = np.isin(np.arange(NUM_ROWS), ids)
    assert np.all(changed_rows(before, after)[row_mask & touched])
    assert not np.any(changed_rows(before, after)[~touched])


def test_neither_ids_argument_means_all_rows_train(rng):
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH)
    model = regression_model(layer)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    before = layer.embeddings.numpy().copy()
    ids = random_ids(rng)
    fit(model, ids, rng)
    assert layer.trainable_mask.numpy().all()
    touched = np.isin(np.arange(NUM_ROWS), ids)
    assert np.all(changed_rows(before, layer.embeddings.numpy())[touched])


def test_output_equals_gather_and_input_casting(rng):
    table = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, weights=table, frozen_ids=[1, 2])
    ids = random_ids(rng, batch=3)
    for inputs in (ids, ids.astype(np.int64), ids.astype(np.float32)):
        assert bits_equal(layer(inputs), table[ids])
    assert bits_equal(layer(ids[0, 0]), table[ids[0, 0]])


def test_weights_argument_accepts_table_and_table_with_mask(rng):
    table = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    row_mask = rng.random(NUM_ROWS) < 0.5
    first = pe.PartialEmbedding(NUM_ROWS, WIDTH, weights=[table], trainable_ids=[3])
    assert bits_equal(first.embeddings.numpy(), table)
    second = pe.PartialEmbedding(NUM_ROWS, WIDTH, weights=[table, row_mask])
    assert bits_equal(second.embeddings.numpy(), table)
    np.testing.assert_array_equal(second.trainable_mask.numpy(), row_mask)


def test_optimizer_contract_attribute(rng):
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, trainable_ids=[0])
    layer.build()
    assert layer.embeddings._partial_embedding_row_mask is layer.trainable_mask
    assert layer.trainable_mask.dtype == "bool"
    assert not layer.trainable_mask.trainable
    assert layer.trainable_mask.shape == (NUM_ROWS,)
    assert layer.trainable_weights == [layer.embeddings]
    assert layer.non_trainable_weights == [layer.trainable_mask]


# -- changing the mask -----------------------------------------------------


class CountingPartialEmbedding(pe.PartialEmbedding):
    """Counts Python executions of call(): one per trace in graph mode."""

    calls = 0

    def call(self, inputs):
        CountingPartialEmbedding.calls += 1
        return super().call(inputs)


def test_freeze_unfreeze_mid_training_apply_next_step_without_retracing(rng):
    CountingPartialEmbedding.calls = 0
    layer = CountingPartialEmbedding(NUM_ROWS, WIDTH, embeddings_initializer="normal")
    model = regression_model(layer)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    ids = np.tile(np.arange(NUM_ROWS, dtype=np.int32)[:SEQUENCE], (8, 1))
    targets = rng.standard_normal([8, 1]).astype(np.float32)
    shifts = iter(np.arange(0, 40, 4, dtype=np.float32))

    def step():
        # Every sample holds the same ids, so every row gets the same update,
        # proportional to the sum of the residuals. Fixed targets let SGD
        # drive that sum towards 0, until the update is below half an ulp of
        # a larger row, which then keeps its bits although permitted (seed
        # 1419469299): the targets move by 4 each step, so it never does.
        before = layer.embeddings.numpy().copy()
        model.train_on_batch(ids, targets + next(shifts))
        return changed_rows(before, layer.embeddings.numpy())

    touched = np.isin(np.arange(NUM_ROWS), ids)
    assert np.array_equal(step(), touched)
    train_function = model.train_function
    calls_after_first_trace = CountingPartialEmbedding.calls

    layer.freeze([0, 1])
    assert np.array_equal(np.flatnonzero(step()), [2, 3, 4])
    layer.unfreeze([1])
    assert np.array_equal(np.flatnonzero(step()), [1, 2, 3, 4])
    layer.set_trainable_ids([4, 7])
    assert np.array_equal(np.flatnonzero(step()), [4])
    layer.set_trainable_ids(np.arange(NUM_ROWS) < 3)
    assert np.array_equal(np.flatnonzero(step()), [0, 1, 2])
    np.testing.assert_array_equal(layer.trainable_ids, [0, 1, 2])
    np.testing.assert_array_equal(layer.frozen_ids, np.arange(3, NUM_ROWS))

    assert model.train_function is train_function
    assert CountingPartialEmbedding.calls == calls_after_first_trace


def test_freeze_in_custom_tf_function_loop_no_retrace(rng):
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, embeddings_initializer="normal")
    layer.build()
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def train_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(ids)))
        grads = tape.gradient(loss, layer.trainable_variables)
        optimizer.apply_gradients(zip(grads, layer.trainable_variables))

    # No row more than 4 times in the batch: one step of SGD(0.1) on a sum of
    # squares scales a row hit c times by 1 - 0.2 c, which is 0 for c = 5, and
    # a row of zeros would never change again.
    occurrences = np.repeat(np.arange(NUM_ROWS, dtype=np.int32), 4)
    ids = tf.constant(rng.permutation(occurrences)[: 4 * SEQUENCE].reshape(4, SEQUENCE))
    touched = np.isin(np.arange(NUM_ROWS), ids.numpy())
    for frozen in ([], [int(ids[0, 0])], np.arange(NUM_ROWS // 2)):
        layer.set_trainable_ids(np.arange(NUM_ROWS))
        layer.freeze(frozen)
        before = layer.embeddings.numpy().copy()
        train_step(ids)
        permitted = layer.trainable_mask.numpy()
        assert np.array_equal(changed_rows(before, layer.embeddings.numpy()), permitted & touched)
    assert train_step.experimental_get_tracing_count() == 1


def test_mask_methods_before_build(rng):
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, trainable_ids=[1, 2, 3])
    layer.freeze([2])
    layer.unfreeze([5])
    layer.build()
    np.testing.assert_array_equal(np.flatnonzero(layer.trainable_mask.numpy()), [1, 3, 5])


# -- regularizers, constraints, masking ------------------------------------


def test_regularizer_and_constraint_leave_frozen_rows(rng):
    table = 10.0 * rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    frozen = np.flatnonzero(rng.random(NUM_ROWS) < 0.5)
    layer = pe.PartialEmbedding(
        NUM_ROWS,
        WIDTH,
        frozen_ids=frozen,
        weights=table,
        embeddings_regularizer=keras.regularizers.L2(0.1),
        embeddings_constraint=keras.constraints.MaxNorm(1.0, axis=1),
    )
    model = regression_model(layer)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    fit(model, random_ids(rng), rng)
    after = layer.embeddings.numpy()
    permitted = np.setdiff1d(np.arange(NUM_ROWS), frozen)
    assert bits_equal(after[frozen], table[frozen])
    # Every permitted row is regularized (dense) and constrained.
    assert np.all(np.linalg.norm(after[permitted], axis=1) <= 1.0 + 1e-5)
    assert len(model.losses) == 1


def test_mask_zero(rng):
    table = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, mask_zero=True, weights=table)
    ids = random_ids(rng, batch=4, low=1)
    ids[:, -2:] = 0  # padding
    ids[0, :] = 0
    ids[0, 0] = 3
    np.testing.assert_array_equal(layer.compute_mask(ids), ids != 0)
    outputs = layer(ids)
    np.testing.assert_array_equal(outputs._keras_mask, ids != 0)
    pooled = keras.layers.GlobalAveragePooling1D()(outputs)
    kept = [table[row[row != 0]].astype(np.float64) for row in ids]
    # A float32 sum over the SEQUENCE positions (padding adds an exact 0) and a
    # division: SEQUENCE roundings, one more for the float64 reference, on the
    # scale of the mean of |rows|: the mean itself may cancel far below it.
    assert_within_rounding(
        pooled,
        np.stack([rows.mean(axis=0) for rows in kept]),
        np.stack([np.abs(rows).mean(axis=0) for rows in kept]),
        SEQUENCE + 1,
        "float32",
        "pooled",
    )
    assert pe.PartialEmbedding(NUM_ROWS, WIDTH).compute_mask(ids) is None


# -- serialization ---------------------------------------------------------


@pytest.mark.parametrize("how", ["trainable_ids", "frozen_ids", "neither"])
def test_keras_save_load_round_trip(rng, tmp_path, how):
    kwargs = {"trainable_ids": [1, 4, 5], "frozen_ids": [0, 2], "neither": {}}[how]
    if how != "neither":
        kwargs = {how: kwargs}
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, name="partial", mask_zero=True, **kwargs)
    model = regression_model(layer)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    fit(model, random_ids(rng), rng)
    layer.freeze([4])
    layer.unfreeze([11])
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_layer = loaded.get_layer("partial")
    assert type(loaded_layer) is pe.PartialEmbedding
    assert bits_equal(loaded_layer.embeddings.numpy(), layer.embeddings.numpy())
    np.testing.assert_array_equal(loaded_layer.trainable_mask.numpy(), layer.trainable_mask.numpy())
    assert loaded_layer.mask_zero
    assert loaded_layer.embeddings._partial_embedding_row_mask is (loaded_layer.trainable_mask)
    assert loaded_layer.get_config() == layer.get_config()
    ids = random_ids(rng, batch=3)
    np.testing.assert_array_equal(loaded.predict(ids, verbose=0), model.predict(ids, verbose=0))


def test_get_config_round_trip_carries_no_row_ids():
    # The mask is state (the weight trainable_mask), not config: the config
    # names no row ids, and from_config gives a layer whose rows all learn.
    layer = pe.PartialEmbedding(
        NUM_ROWS,
        WIDTH,
        trainable_ids=[3, 1],
        embeddings_initializer="zeros",
        embeddings_regularizer="l2",
        embeddings_constraint="non_neg",
        activity_regularizer="l1",
        mask_zero=True,
        name="pe_layer",
        dtype="float64",
    )
    config = layer.get_config()
    assert config["trainable_ids"] is None and config["frozen_ids"] is None
    clone = pe.PartialEmbedding.from_config(config)
    assert clone.get_config() == config
    clone.build()
    assert clone.trainable_mask.numpy().all()
    layer.build()
    layer.unfreeze([7])
    assert layer.get_config() == config
    np.testing.assert_array_equal(layer.trainable_ids, [1, 3, 7])
    frozen_layer = pe.PartialEmbedding(NUM_ROWS, WIDTH)
    assert frozen_layer.get_config()["frozen_ids"] is None
    frozen_layer.freeze([2, 0])
    assert frozen_layer.get_config()["frozen_ids"] is None
    assert frozen_layer.get_config()["trainable_ids"] is None
    registered = keras.saving.get_registered_name(pe.PartialEmbedding)
    assert registered == "partial_embedding>PartialEmbedding"


def _config_json(layer):
    return json.dumps(keras.saving.serialize_keras_object(layer), sort_keys=True)


@pytest.mark.parametrize("how", ["trainable_ids", "frozen_ids", "update"])
def test_config_size_does_not_grow_with_the_vocabulary(how):
    def make(rows):
        ids = np.arange(0, rows, max(1, rows // 6))
        if how == "update":
            return pe.PartialEmbeddingsUpdate(rows, None, ids, output_dim=WIDTH, name="table")
        return pe.PartialEmbedding(rows, WIDTH, name="table", **{how: ids})

    small, large = make(10), make(10**7)
    size_of_input_dim = len(str(10**7)) - len(str(10))
    assert len(_config_json(large)) == len(_config_json(small)) + size_of_input_dim
    config = large.get_config()
    if how == "update":
        assert config["indices_to_update"] is None and config["weights"] is None
    else:
        assert config["trainable_ids"] is None and config["frozen_ids"] is None


@pytest.mark.parametrize("update", [False, True], ids=["partial", "update"])
def test_keras_file_config_has_no_ids_and_the_mask_loads_from_weights(rng, tmp_path, update):
    row_mask = np.zeros(NUM_ROWS, bool)
    row_mask[[2, 5, 9]] = True
    table = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    if update:
        layer = pe.PartialEmbeddingsUpdate(NUM_ROWS, table, row_mask, name="partial")
    else:
        layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, weights=table, frozen_ids=~row_mask)
        layer.freeze([5])
        layer.unfreeze([0])
        row_mask[[5, 0]] = [False, True]
    model = keras.Sequential([keras.Input((SEQUENCE,), dtype="int32"), layer])
    path = tmp_path / "model.keras"
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        saved = json.loads(archive.read("config.json"))
    (layer_config,) = [entry["config"] for entry in saved["config"]["layers"][1:]]
    id_keys = ["indices_to_update"] if update else ["trainable_ids", "frozen_ids"]
    assert all(layer_config[key] is None for key in id_keys)
    loaded = keras.models.load_model(path).layers[0]
    assert type(loaded) is type(layer)
    np.testing.assert_array_equal(loaded.trainable_mask.numpy(), row_mask)
    assert bits_equal(loaded.embeddings.numpy(), table)
    # The config alone (from_config, clone_model) permits every row.
    assert type(layer).from_config(layer.get_config()).trainable_ids.size == NUM_ROWS
    cloned = keras.models.clone_model(model).layers[0]
    assert cloned.trainable_mask.numpy().all()
    cloned.set_weights(layer.get_weights())
    np.testing.assert_array_equal(cloned.trainable_mask.numpy(), row_mask)


# -- compilation -----------------------------------------------------------


def test_jit_compile_true_is_kept_and_an_explicit_xla_trace_matches_eager(rng):
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH)
    assert layer.supports_jit is True
    model = regression_model(layer)
    # "auto" follows Keras: XLA only where a GPU is present.
    model.compile(optimizer="sgd", loss="mse", jit_compile="auto")
    assert model.jit_compile is bool(tf.config.list_physical_devices("GPU"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert model.jit_compile is True
    assert not any("jit_compile" in str(warning.message) for warning in caught)
    fit(model, random_ids(rng), rng)

    @tf.function(jit_compile=True)
    def xla_call(ids):
        return layer(ids)

    ids = tf.constant(random_ids(rng, batch=2))
    assert_bits_equal(xla_call(ids), layer(ids), "XLA lookup vs eager lookup")


# -- bad input -------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (
            dict(trainable_ids=[1], frozen_ids=[2]),
            ValueError,
            "at most one of trainable_ids and frozen_ids",
        ),
        (
            dict(trainable_ids=[0, NUM_ROWS]),
            ValueError,
            rf"trainable_ids: id {NUM_ROWS} \(at position 1\) is not in \[0, {NUM_ROWS}\)",
        ),
        (
            dict(frozen_ids=[-1]),
            ValueError,
            rf"frozen_ids: id -1 \(at position 0\) is not in \[0, {NUM_ROWS}\)",
        ),
        (
            dict(trainable_ids=[True, False]),
            ValueError,
            rf"trainable_ids: a bool mask must have shape \({NUM_ROWS},\)",
        ),
        (dict(frozen_ids=[0.5]), TypeError, "frozen_ids: row ids must be integers"),
        (
            dict(weights=np.zeros([NUM_ROWS + 1, WIDTH])),
            ValueError,
            rf"weights: the table must have shape \({NUM_ROWS}, {WIDTH}\)",
        ),
        (dict(lora_rank=2), ValueError, "does not support LoRA"),
        (dict(quantization_config="int8"), ValueError, "quantization_config"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        pe.PartialEmbedding(NUM_ROWS, WIDTH, **kwargs)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, None])
def test_bad_dimensions(bad):
    with pytest.raises(ValueError, match="input_dim"):
        pe.PartialEmbedding(bad, WIDTH)
    with pytest.raises(ValueError, match="output_dim"):
        pe.PartialEmbedding(NUM_ROWS, bad)


@pytest.mark.parametrize("method", ["freeze", "unfreeze", "set_trainable_ids"])
@pytest.mark.parametrize("built", [False, True])
def test_bad_ids_in_mask_methods_change_nothing(rng, method, built):
    row_mask = rng.random(NUM_ROWS) < 0.5
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, trainable_ids=row_mask)
    if built:
        layer.build()
    bad_inputs = [
        (
            [1, NUM_ROWS + 2],
            ValueError,
            rf"ids: id {NUM_ROWS + 2} \(at position 1\) is not in \[0, {NUM_ROWS}\)",
        ),
        ([-5], ValueError, rf"ids: id -5 .* not in \[0, {NUM_ROWS}\)"),
        (
            np.ones(NUM_ROWS + 1, dtype=bool),
            ValueError,
            rf"ids: a bool mask must have shape \({NUM_ROWS},\) .*got shape \({NUM_ROWS + 1},\)",
        ),
        ([1.5], TypeError, "ids: row ids must be integers"),
        (None, ValueError, "ids: expected row ids"),
    ]
    for ids, error, pattern in bad_inputs:
        with pytest.raises(error, match=pattern):
            getattr(layer, method)(ids)
        np.testing.assert_array_equal(layer._current_mask(), row_mask)


def test_out_of_range_ids_at_call_time(rng):
    table = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, weights=table)
    model = regression_model(layer, sequence=2)
    # Outside XLA (Keras' "auto" picks it on a GPU): an XLA program cannot
    # raise, and gathers an out-of-range id as zeros there (docs/xla.md).
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    for bad in ([[0, NUM_ROWS]], [[-1, 0]]):
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=re.escape("ids must be in [0, V)")
        ):
            layer(np.array(bad))
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=re.escape("ids must be in [0, V)")
        ):
            model.fit(np.array(bad * 4), np.zeros([4, 1]), verbose=0)
    assert bits_equal(layer.embeddings.numpy(), table)


# -- seed-style helpers ----------------------------------------------------


def test_partial_embeddings_update_trains_only_indices_to_update(rng, tmp_path):
    pretrained = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    indices_to_update = np.unique(rng.integers(0, NUM_ROWS, size=4))
    layer = pe.PartialEmbeddingsUpdate(NUM_ROWS, pretrained, indices_to_update)
    assert isinstance(layer, pe.PartialEmbedding)
    ids = np.tile(np.arange(NUM_ROWS, dtype=np.int32)[None, :SEQUENCE], (4, 1))
    ids[:, : len(indices_to_update)] = indices_to_update
    assert bits_equal(layer(ids), pretrained[ids])
    model = regression_model(layer)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    fit(model, ids, rng, epochs=2, batch_size=4)
    changed = changed_rows(pretrained, layer.embeddings.numpy())
    assert np.array_equal(np.flatnonzero(changed), indices_to_update)

    config = layer.get_config()
    assert config["len_vocab"] == NUM_ROWS and config["weights"] is None
    assert config["indices_to_update"] is None
    path = str(tmp_path / "update.keras")
    model.save(path)
    loaded_layer = keras.models.load_model(path).layers[1]
    assert type(loaded_layer) is pe.PartialEmbeddingsUpdate
    assert bits_equal(loaded_layer.embeddings.numpy(), layer.embeddings.numpy())
    np.testing.assert_array_equal(loaded_layer.trainable_mask.numpy(), layer.trainable_mask.numpy())


def test_partial_embeddings_update_bad_input():
    with pytest.raises(ValueError, match=r"weights: must have shape \(5, output_dim\)"):
        pe.PartialEmbeddingsUpdate(5, np.zeros([4, 2]), [0])
    with pytest.raises(ValueError, match=r"indices_to_update: id 5 .* not in \[0, 5\)"):
        pe.PartialEmbeddingsUpdate(5, np.zeros([5, 2]), [5])
    with pytest.raises(ValueError, match="weights: the pretrained matrix is required"):
        pe.PartialEmbeddingsUpdate(5, None, [0])


def test_stateless_call_stops_gradients_of_frozen_occurrences(rng):
    table = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    row_mask = rng.random(NUM_ROWS) < 0.5
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, weights=table, trainable_ids=row_mask)
    model = keras.Sequential([keras.Input((SEQUENCE,), dtype="int32"), layer])
    ids = random_ids(rng, batch=2)
    table_tensor = tf.constant(table)
    with tf.GradientTape() as tape:
        tape.watch(table_tensor)
        outputs, _ = model.stateless_call([table_tensor], [tf.constant(row_mask)], tf.constant(ids))
        loss = tf.reduce_sum(outputs)
    assert bits_equal(outputs, table[ids])
    grad = tf.convert_to_tensor(tape.gradient(loss, table_tensor)).numpy()
    counts = np.bincount(ids.reshape(-1), minlength=NUM_ROWS)
    expected = np.where(row_mask, counts, 0)[:, None] * np.ones([1, WIDTH])
    np.testing.assert_array_equal(grad, expected)


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("layer_class", [pe.PartialEmbedding, pe.PartialReversibleEmbedding])
def test_enable_lora_is_refused_with_nothing_changed(layer_class, quantized, rng) -> None:
    layer = layer_class(NUM_ROWS, WIDTH, trainable_ids=[1, 4])
    layer.build()
    if quantized:
        layer.quantize("int8")
    before = [weight.numpy().copy() for weight in layer.weights]
    names = [weight.path for weight in layer.weights]
    for kwargs in ({}, {"lora_alpha": 8.0}):
        with pytest.raises(ValueError, match=r"does not support LoRA \(rank=2, lora_alpha="):
            layer.enable_lora(2, **kwargs)
    assert [weight.path for weight in layer.weights] == names
    for weight, value in zip(layer.weights, before):
        np.testing.assert_array_equal(weight.numpy(), value)
    assert not getattr(layer, "lora_enabled", False)
