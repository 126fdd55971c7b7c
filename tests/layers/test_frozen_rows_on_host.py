"""``PartialEmbedding(..., frozen_rows_on="host")``: the frozen table in host memory.

The reference is the plain layer (``frozen_rows_on="device"``) trained side
by side on the same batches: on a machine without a GPU both live on the
CPU, and the host layout (its own path: a frozen table plus a compact float
store) must give the same lookups and trained rows bit for bit. The frozen
table is checked against the table it was built from, byte for byte.
Placement on another compute device than the host is checked on two
logical CPUs in test_frozen_rows_on_host_devices.py.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.layers import _quantized

ROWS, WIDTH, LENGTH, BATCH = 60, 6, 5, 8
TRAINABLE = [3, 7, 45, 10]


def _table(rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(ROWS, WIDTH)).astype(np.float32)


def _batches(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(0, ROWS, size=(2 * BATCH, LENGTH))
    # Every trainable row in both halves: each step trains each of them.
    ids[[0, 1, BATCH, BATCH + 1], [0, 1, 2, 3]] = TRAINABLE
    targets = rng.normal(size=(2 * BATCH, LENGTH, WIDTH)).astype(np.float32)
    return ids, targets


def _layer(table: np.ndarray, on: str, **kwargs: Any) -> pe.PartialEmbedding:
    kwargs.setdefault("trainable_ids", TRAINABLE)
    return pe.PartialEmbedding(ROWS, WIDTH, weights=table, frozen_rows_on=on, **kwargs)


def _model(layer: keras.layers.Layer, **compile_kwargs: Any) -> keras.Model:
    model = keras.Sequential([keras.Input((LENGTH,), dtype="int32"), layer])
    compile_kwargs.setdefault("loss", "mse")
    model.compile(**compile_kwargs)
    return model


def _fit(model: keras.Model, ids: np.ndarray, targets: np.ndarray, epochs: int = 2) -> None:
    model.fit(ids, targets, epochs=epochs, batch_size=BATCH, shuffle=False, verbose=0)


def _all_rows(layer: pe.PartialEmbedding) -> np.ndarray:
    """Every row as a lookup returns it."""
    return np.asarray(layer(np.arange(ROWS)[None, :]).numpy())[0]


def _device(variable: Any) -> str:
    """The device of a Keras or TensorFlow variable."""
    return variable.value.device if isinstance(variable, keras.Variable) else variable.device


def _masked_adam() -> keras.optimizers.Optimizer:
    return pe.MaskedOptimizer(keras.optimizers.Adam(0.05))


OPTIMIZERS: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "masked_adam": _masked_adam,
    "masked_sgd_momentum": lambda: pe.MaskedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
    "keras_sgd": lambda: keras.optimizers.SGD(0.1),
    "keras_adam": lambda: keras.optimizers.Adam(0.05),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_trains_as_the_plain_layer_bit_for_bit(rng: np.random.Generator, optimizer: str) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    plain, host = _layer(table, "device"), _layer(table, "host")
    plain_model = _model(plain, optimizer=OPTIMIZERS[optimizer]())
    host_model = _model(host, optimizer=OPTIMIZERS[optimizer]())
    np.testing.assert_array_equal(_all_rows(host), table)
    _fit(plain_model, ids, targets)
    _fit(host_model, ids, targets)
    expected = plain.embeddings.numpy()
    assert not np.array_equal(expected[TRAINABLE], table[TRAINABLE])  # something trained
    np.testing.assert_array_equal(_all_rows(host), expected)
    np.testing.assert_array_equal(
        host_model.predict(ids, verbose=0), plain_model.predict(ids, verbose=0)
    )
    # The frozen table is never written: every row keeps its bytes.
    np.testing.assert_array_equal(host.embeddings.numpy(), table)
    assert host.trainable_variables == [host.float_rows]
    if optimizer.startswith("masked"):
        # Compact slots: state for the store's trained rows, not per table row.
        assert host_model.optimizer.compact_slot_variables


def test_mixed_precision_trains_as_the_plain_layer(rng: np.random.Generator) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    plain = _layer(table, "device", dtype="mixed_float16")
    host = _layer(table, "host", dtype="mixed_float16")
    for layer in (plain, host):
        _fit(_model(layer, optimizer=_masked_adam()), ids, targets)
    rows = _all_rows(host)
    assert rows.dtype == np.float16
    np.testing.assert_array_equal(rows, _all_rows(plain))
    assert host.float_rows.dtype == "float32"


def test_int8_host_layout_trains_as_the_int8_device_layout(rng: np.random.Generator) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    device, host = _layer(table, "device"), _layer(table, "host")
    for layer in (device, host):
        layer.quantize("int8")
    device_model = _model(device, optimizer=_masked_adam())
    host_model = _model(host, optimizer=_masked_adam())
    codes = host._embeddings.numpy().copy()
    np.testing.assert_array_equal(codes, device._embeddings.numpy())
    np.testing.assert_array_equal(host.embeddings_scale.numpy(), device.embeddings_scale.numpy())
    _fit(device_model, ids, targets)
    _fit(host_model, ids, targets)
    np.testing.assert_array_equal(_all_rows(host), _all_rows(device))
    np.testing.assert_array_equal(host._embeddings.numpy(), codes)
    assert "CPU:0" in host._embeddings.value.device
    assert host.get_config()["frozen_rows_on"] == "host"


def test_variable_devices_are_as_documented(rng: np.random.Generator) -> None:
    layer = _layer(_table(rng), "host")
    model = _model(layer, optimizer=_masked_adam())
    _fit(model, *_batches(rng), epochs=1)
    compute_device = tf.Variable(0.0).device  # the default placement
    assert _device(layer.embeddings).endswith("device:CPU:0")
    for name in _quantized.STORE_VARIABLES:
        assert _device(getattr(layer, name)) == compute_device, name
    assert _device(layer.trainable_mask) == compute_device
    assert model.optimizer.compact_slot_variables
    for slot in model.optimizer.compact_slot_variables:
        assert _device(slot) == compute_device


def test_freeze_unfreeze_and_set_trainable_ids_follow_the_plain_layer(
    rng: np.random.Generator,
) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    ids[2, :3] = [20, 21, 22]
    plain, host = _layer(table, "device"), _layer(table, "host", trainable_capacity=5)
    models = [_model(layer, optimizer=_masked_adam()) for layer in (plain, host)]

    def both(change: Callable[[pe.PartialEmbedding], None]) -> None:
        for layer, model in zip((plain, host), models):
            change(layer)
            _fit(model, ids, targets, epochs=1)
        np.testing.assert_array_equal(_all_rows(host), plain.embeddings.numpy())
        np.testing.assert_array_equal(host.trainable_ids, plain.trainable_ids)

    both(lambda layer: None)
    both(lambda layer: layer.unfreeze([20]))  # a new row: a store row of its table values
    assert not np.array_equal(_all_rows(host)[20], table[20])  # it learned
    trained_20 = _all_rows(host)[20].copy()
    both(lambda layer: layer.freeze([20]))  # frozen again: keeps its trained values
    np.testing.assert_array_equal(_all_rows(host)[20], trained_20)
    both(lambda layer: layer.set_trainable_ids([3, 20, 21, 22]))  # beyond capacity 5: grows
    assert host.trainable_capacity >= 6
    np.testing.assert_array_equal(host.trainable_ids, [3, 20, 21, 22])
    # Rows that never trained still look up as the host table's bytes.
    never = np.setdiff1d(np.arange(ROWS), [3, 7, 10, 45, 20, 21, 22])
    np.testing.assert_array_equal(_all_rows(host)[never], table[never])
    np.testing.assert_array_equal(host.embeddings.numpy(), table)


@pytest.mark.parametrize("frozen", ["float", "int8"])
def test_keras_file_round_trip_and_training_goes_on(
    rng: np.random.Generator, tmp_path: pathlib.Path, frozen: str
) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    layer = _layer(table, "host")
    if frozen == "int8":
        # Quantized after training started: the store and its slots stay.
        model = _model(layer, optimizer=_masked_adam())
        _fit(model, ids, targets, epochs=1)
        layer.unfreeze([20])
        layer.quantize("int8")
    model = _model(layer, optimizer=_masked_adam())
    _fit(model, ids, targets)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_layer = loaded.layers[0]
    assert loaded_layer.get_config()["frozen_rows_on"] == "host"
    # As JSON: Keras' quantizer config gives a tuple that comes back a list.
    assert json.dumps(loaded_layer.get_config()) == json.dumps(layer.get_config())
    assert "CPU:0" in loaded_layer.embeddings.value.device
    for saved, restored in zip(layer.weights, loaded_layer.weights):
        assert saved.name == restored.name
        np.testing.assert_array_equal(restored.numpy(), saved.numpy())
    _fit(model, ids, targets)
    _fit(loaded, ids, targets)
    np.testing.assert_array_equal(_all_rows(loaded_layer), _all_rows(layer))
    np.testing.assert_array_equal(loaded_layer.embeddings.numpy(), layer.embeddings.numpy())
    if frozen == "float":
        np.testing.assert_array_equal(loaded_layer.embeddings.numpy(), table)
    else:
        assert loaded_layer.embeddings.dtype == "int8"
        np.testing.assert_array_equal(loaded_layer.trainable_ids, [3, 7, 10, 20, 45])


def test_checkpoint_mid_training_equals_an_uninterrupted_run(
    rng: np.random.Generator, tmp_path: pathlib.Path
) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    uninterrupted = _model(_layer(table, "host"), optimizer=_masked_adam())
    _fit(uninterrupted, ids, targets, epochs=4)

    first = _model(_layer(table, "host"), optimizer=_masked_adam())
    _fit(first, ids, targets)
    checkpoint = tf.train.Checkpoint(model=first, optimizer=first.optimizer)
    prefix = checkpoint.save(os.path.join(tmp_path, "ckpt"))
    second = _model(_layer(table, "host"), optimizer=_masked_adam())
    second.optimizer.build(second.trainable_variables)
    tf.train.Checkpoint(model=second, optimizer=second.optimizer).restore(prefix)
    _fit(second, ids, targets)
    np.testing.assert_array_equal(_all_rows(second.layers[0]), _all_rows(uninterrupted.layers[0]))
    assert int(second.optimizer.iterations) == int(uninterrupted.optimizer.iterations)


def test_xla_fit_matches_the_plain_layer(rng: np.random.Generator) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    plain, host = _layer(table, "device"), _layer(table, "host")
    plain_model = _model(plain, optimizer=_masked_adam(), jit_compile=True)
    host_model = _model(host, optimizer=_masked_adam(), jit_compile=True)
    _fit(plain_model, ids, targets)
    _fit(host_model, ids, targets)
    assert not np.array_equal(plain.embeddings.numpy()[TRAINABLE], table[TRAINABLE])
    np.testing.assert_array_equal(_all_rows(host), plain.embeddings.numpy())
    np.testing.assert_array_equal(host.embeddings.numpy(), table)


def test_stock_table_loads_into_the_host_table(rng: np.random.Generator) -> None:
    table, stock_table = _table(rng), _table(rng)
    layer = _layer(table, "host")
    layer.set_weights([stock_table])
    np.testing.assert_array_equal(_all_rows(layer), stock_table)
    np.testing.assert_array_equal(layer.embeddings.numpy(), stock_table)


def test_save_trained_rows_of_an_int8_host_layer(
    rng: np.random.Generator, tmp_path: pathlib.Path
) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    layer = _layer(table, "host")
    layer.quantize("int8")
    model = _model(layer, optimizer=_masked_adam())
    _fit(model, ids, targets)
    path = os.path.join(tmp_path, "rows.safetensors")
    rows = pe.save_trained_rows(path, layer, optimizer=model.optimizer)
    np.testing.assert_array_equal(rows.ids, sorted(TRAINABLE))
    np.testing.assert_array_equal(rows.values, _all_rows(layer)[sorted(TRAINABLE)])
    assert rows.slot_present is not None and rows.slot_present.all()


def test_save_trained_rows_of_a_float_host_layer(
    rng: np.random.Generator, tmp_path: pathlib.Path
) -> None:
    table = _table(rng)
    ids, targets = _batches(rng)
    layer = _layer(table, "host")
    model = _model(layer, optimizer=_masked_adam())
    _fit(model, ids, targets)
    trained = _all_rows(layer)
    path = os.path.join(tmp_path, "rows.safetensors")
    rows = pe.save_trained_rows(path, layer, optimizer=model.optimizer)
    np.testing.assert_array_equal(rows.values, trained[sorted(TRAINABLE)])
    # The other rows' fingerprints are a float table's: the rows load into a
    # plain layer and into a fresh host layer on the same table, and not
    # into one on another table.
    plain = _layer(table, "device")
    pe.load_trained_rows(path, plain)
    np.testing.assert_array_equal(plain.embeddings.numpy(), trained)
    fresh = _layer(table, "host")
    pe.load_trained_rows(path, fresh)
    np.testing.assert_array_equal(_all_rows(fresh), trained)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="differ"):
        pe.load_trained_rows(path, _layer(table + 1.0, "host"))


def test_tied_reverse_projection_of_a_host_layout(rng: np.random.Generator) -> None:
    table = _table(rng)
    tokens = rng.integers(0, ROWS, size=(BATCH, LENGTH))
    tokens[0, :4] = TRAINABLE

    def train(on: str) -> tuple[pe.PartialReversibleEmbedding, list[np.ndarray]]:
        layer = pe.PartialReversibleEmbedding(
            ROWS, WIDTH, weights=table, trainable_ids=TRAINABLE, frozen_rows_on=on
        )
        optimizer = _masked_adam()
        logits_per_step = []
        for _ in range(3):
            with tf.GradientTape() as tape:
                logits = layer(layer(tokens[:, :-1]), reverse=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(
                        tokens[:, 1:], logits, from_logits=True
                    )
                )
            grads = tape.gradient(loss, layer.trainable_variables)
            logits_per_step.append(logits.numpy())
            optimizer.apply(grads, layer.trainable_variables)
        return layer, logits_per_step

    plain, plain_logits = train("device")
    host, host_logits = train("host")
    # The first step's logits are bit for bit; later ones within float32
    # rounding: the inputs' gradient sums the host's columns and the
    # store's in two matmuls instead of one.
    np.testing.assert_array_equal(host_logits[0], plain_logits[0])
    for got, expected in zip(host_logits, plain_logits):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_all_rows(host), plain.embeddings.numpy(), rtol=1e-5, atol=1e-5)
    frozen = np.setdiff1d(np.arange(ROWS), TRAINABLE)
    np.testing.assert_array_equal(_all_rows(host)[frozen], table[frozen])
    assert not np.allclose(_all_rows(host)[TRAINABLE], table[TRAINABLE])


@pytest.mark.parametrize("value", ["cpu", "HOST", "", None, 1, True, ("host",)])
def test_bad_frozen_rows_on_is_refused(value: Any) -> None:
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="frozen_rows_on") as error:
        pe.PartialEmbedding(ROWS, WIDTH, frozen_rows_on=value)
    assert repr(value) in str(error.value)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"combiner": "mean"}, "combiner"),
        ({"admission": pe.RowAdmission(min_count=2)}, "admission"),
    ],
)
def test_bad_combinations_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=f"'host'.*{match}"):
        pe.PartialEmbedding(ROWS, WIDTH, frozen_rows_on="host", **kwargs)


def test_untied_reversible_host_layout_is_refused() -> None:
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="frozen_rows_on.*tie_weights"):
        pe.PartialReversibleEmbedding(ROWS, WIDTH, tie_weights=False, frozen_rows_on="host")


def test_default_is_device_and_in_the_config() -> None:
    layer = pe.PartialEmbedding(ROWS, WIDTH)
    assert layer.frozen_rows_on == "device"
    assert layer.get_config()["frozen_rows_on"] == "device"
    rebuilt = pe.PartialEmbedding.from_config(
        pe.PartialEmbedding(ROWS, WIDTH, frozen_rows_on="host").get_config()
    )
    assert rebuilt.frozen_rows_on == "host"
