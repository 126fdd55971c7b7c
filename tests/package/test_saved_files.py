"""Files written by an earlier commit still load, with identical outputs: a
``.keras`` file, a ``tf.train.Checkpoint`` and a SavedModel, made by
``make_fixtures.py`` (see its docstring for the commit). Then the int8
store's int64 bookkeeping as checkpoints and SavedModels write it now."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from make_fixtures import build_model

import partial_embedding as pe

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected.npz") as data:
        return dict(data)


def _weights(expected: dict[str, np.ndarray]) -> list[np.ndarray]:
    count = len([k for k in expected if k.startswith("weight_")])
    return [expected[f"weight_{i}"] for i in range(count)]


@pytest.fixture(scope="module")
def outputs_here(expected) -> np.ndarray:
    """The fixture model's outputs computed on this machine: a fresh model
    given the recorded weights. A loaded file must give these bit for bit.
    The recorded outputs were computed on the machine that wrote the files;
    another CPU's matmul kernels (oneDNN picks them by instruction set: the
    AMD EPYC without AVX-512 of 2026-12-06 differed from the recording in the
    last bit of 12 % of the logits) may round the same dot products
    differently, so against the recording the bound is float32's for dot
    products of WIDTH terms (checked here too)."""
    model = build_model()
    model.set_weights(_weights(expected))
    here = model.predict(expected["ids"], verbose=0)
    np.testing.assert_allclose(here, expected["outputs"], rtol=1e-5, atol=1e-6)
    return here


def test_keras_file_loads_with_identical_outputs_and_state(expected, outputs_here):
    model = keras.saving.load_model(FIXTURES / "model.keras")
    assert isinstance(model.get_layer("tied"), pe.PartialReversibleEmbedding)
    assert isinstance(model.get_layer("plain"), pe.PartialEmbedding)
    assert isinstance(model.optimizer, pe.MaskedOptimizer)
    np.testing.assert_array_equal(model.predict(expected["ids"], verbose=0), outputs_here)
    for got, want in zip(model.get_weights(), _weights(expected), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.get_layer("tied").trainable_ids, np.arange(30, 40))


def test_checkpoint_restores_identical_weights_and_optimizer_state(expected, outputs_here):
    model = build_model()
    model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), loss="mse")
    model.optimizer.build(model.trainable_variables)
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(
        str(FIXTURES / "checkpoint" / "ckpt")
    )
    status.assert_existing_objects_matched()
    for got, want in zip(model.get_weights(), _weights(expected), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.predict(expected["ids"], verbose=0), outputs_here)
    # One more step from the restored state matches one from the .keras file's.
    loaded = keras.saving.load_model(FIXTURES / "model.keras")
    for resumed in (model, loaded):
        resumed.fit(expected["ids"][:4], expected["targets"][:4], verbose=0, shuffle=False)
    for got, want in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_saved_model_serves_identical_outputs(expected, outputs_here):
    restored = tf.saved_model.load(str(FIXTURES / "saved_model"))
    outputs = restored.serve(tf.constant(expected["ids"]))
    np.testing.assert_array_equal(np.asarray(outputs), outputs_here)


# -- reading before the optimizer is built; async checkpoints --------------------------


def _fixture_model(build_optimizer: bool) -> keras.Model:
    model = build_model()
    model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), loss="mse")
    if build_optimizer:
        model.optimizer.build(model.trainable_variables)
    return model


def _optimizer_state(optimizer) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in optimizer.variables + optimizer.compact_slot_variables]


def _slot_row_counts(path: str) -> list[str]:
    dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
    return sorted(
        d.name for n, d in dtypes.items() if "_compact_slot_state/v" in n and d.is_integer
    )


def test_the_checkpoint_read_before_the_optimizer_is_built_restores_on_build(expected):
    """Read first, then build (the compact slots are made, and the file's
    values reach them as they are tracked, deferred): the state equals that
    of a read after the build, and training goes on identically."""
    path = str(FIXTURES / "checkpoint" / "ckpt")
    assert _slot_row_counts(path) == ["int64", "int64"]
    built_first = _fixture_model(build_optimizer=True)
    tf.train.Checkpoint(model=built_first, optimizer=built_first.optimizer).read(
        path
    ).assert_existing_objects_matched()
    read_first = _fixture_model(build_optimizer=False)
    tf.train.Checkpoint(model=read_first, optimizer=read_first.optimizer).read(path)
    read_first.optimizer.build(read_first.trainable_variables)
    assert read_first.optimizer.compact_slot_rows(read_first.get_layer("tied").embeddings) > 0
    for got, want in zip(
        _optimizer_state(read_first.optimizer), _optimizer_state(built_first.optimizer), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    for resumed in (read_first, built_first):
        resumed.fit(expected["ids"][:4], expected["targets"][:4], verbose=0, shuffle=False)
    for got, want in zip(read_first.get_weights(), built_first.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_async_checkpoint_saves_the_slot_row_count_as_it_was_at_write(tmp_path, expected):
    """An async checkpoint snapshots at write(): the row count too, so a
    change right after write() returns is not in the file."""
    model = _fixture_model(build_optimizer=False)
    model.fit(expected["ids"], expected["targets"], verbose=0, shuffle=False)
    rows_used = model.optimizer.compact_slot_variables[1]
    at_write = int(rows_used.numpy())
    assert at_write > 0
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    path = checkpoint.write(
        str(tmp_path / "c"),
        options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True),
    )
    rows_used.assign(at_write + 3)  # after write() returned
    checkpoint.sync()
    fresh = _fixture_model(build_optimizer=True)
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(path).expect_partial()
    assert int(fresh.optimizer.compact_slot_variables[1].numpy()) == at_write


# -- the int8 store's bookkeeping, written now --------------------------------------

ROWS, WIDTH, LENGTH = 50, 8, 4


def _int8_model(table: np.ndarray) -> tuple[keras.Model, keras.layers.Layer]:
    """An int8 PartialEmbedding (a row unfrozen after quantization) + a dense
    head, compiled with MaskedOptimizer(Adam) on compact slots."""
    layer = pe.PartialEmbedding(ROWS, WIDTH, weights=table, trainable_ids=[3, 7, 9])
    ids = keras.Input((LENGTH,), dtype="int32")
    model = keras.Model(ids, keras.layers.Dense(2)(layer(ids)))
    layer.quantize("int8")
    layer.unfreeze([11])
    model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), "mse", jit_compile=False)
    return model, layer


def _int8_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5856)
    table = rng.normal(size=(ROWS, WIDTH)).astype(np.float32)
    ids = rng.integers(0, ROWS, size=(8, LENGTH)).astype(np.int32)
    ids[:, 0] = [3, 7, 9, 11, 3, 7, 9, 11]
    targets = rng.normal(size=(8, LENGTH, 2)).astype(np.float32)
    return table, ids, targets


def test_new_checkpoints_and_saved_models_hold_the_bookkeeping_as_int64(rng, tmp_path):
    """Written now, both keep the variables' own dtype, and both read back:
    a checkpoint into a model, a SavedModel's variables through a checkpoint
    reader and through tf.saved_model.load."""
    table, ids, targets = _int8_inputs()
    model, layer = _int8_model(table)
    model.fit(ids, targets, verbose=0)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(tmp_path / "c"))
    served = tmp_path / "served"
    root = tf.Module()
    root.model, root.optimizer = model, model.optimizer
    tf.saved_model.save(root, str(served))
    for files in (path, str(served / "variables" / "variables")):
        dtypes = tf.train.load_checkpoint(files).get_variable_to_dtype_map()
        maps = sorted(d.name for n, d in dtypes.items() if "float_row_i" in n)
        assert maps == ["int64", "int64"], files
        fresh, fresh_layer = _int8_model(np.zeros_like(table))
        fresh.optimizer.build(fresh.trainable_variables)
        tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(files).expect_partial()
        np.testing.assert_array_equal(
            fresh_layer.float_row_ids.numpy(), layer.float_row_ids.numpy()
        )
        np.testing.assert_array_equal(fresh.predict(ids, verbose=0), model.predict(ids, verbose=0))
    tf.saved_model.load(str(served))


def test_an_async_checkpoint_saves_the_bookkeeping_as_it_was_at_write(tmp_path):
    """An async checkpoint snapshots at write(): the int8 store's maps too,
    so rows unfrozen right after write() returns are not in the file, while
    the store rows it snapshotted are."""
    table, ids, targets = _int8_inputs()
    model, layer = _int8_model(table)
    model.fit(ids, targets, verbose=0, shuffle=False)
    at_copy = layer.float_row_ids.numpy().copy()
    probe = np.full([1, LENGTH], 20, np.int32)
    at_write = model.predict(probe, verbose=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    path = checkpoint.write(
        str(tmp_path / "c"),
        options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True),
    )
    layer.unfreeze([20])  # moves the maps after write() returned
    assert not np.array_equal(layer.float_row_ids.numpy(), at_copy)
    checkpoint.sync()
    fresh, fresh_layer = _int8_model(np.zeros_like(table))
    fresh.optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(path).expect_partial()
    np.testing.assert_array_equal(fresh_layer.float_row_ids.numpy(), at_copy)
    np.testing.assert_array_equal(fresh.predict(probe, verbose=0), at_write)
