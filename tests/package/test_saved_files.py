"""Files written by main before the restructure (issue #23) still load, with
identical outputs: a ``.keras`` file, a ``tf.train.Checkpoint`` and a
SavedModel, made by ``make_fixtures.py`` with the code of 3f7d58d."""

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


def test_keras_file_loads_with_identical_outputs_and_state(expected):
    model = keras.saving.load_model(FIXTURES / "model.keras")
    assert isinstance(model.get_layer("tied"), pe.PartialReversibleEmbedding)
    assert isinstance(model.get_layer("plain"), pe.PartialEmbedding)
    assert isinstance(model.optimizer, pe.MaskedOptimizer)
    np.testing.assert_array_equal(model.predict(expected["ids"], verbose=0), expected["outputs"])
    for got, want in zip(model.get_weights(), _weights(expected), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.get_layer("tied").trainable_ids, np.arange(30, 40))


def test_checkpoint_restores_identical_weights_and_optimizer_state(expected):
    model = build_model()
    model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), loss="mse")
    model.optimizer.build(model.trainable_variables)
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(
        str(FIXTURES / "checkpoint" / "ckpt")
    )
    status.assert_existing_objects_matched()
    for got, want in zip(model.get_weights(), _weights(expected), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.predict(expected["ids"], verbose=0), expected["outputs"])
    # One more step from the restored state matches one from the .keras file's.
    loaded = keras.saving.load_model(FIXTURES / "model.keras")
    for resumed in (model, loaded):
        resumed.fit(expected["ids"][:4], expected["targets"][:4], verbose=0, shuffle=False)
    for got, want in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_saved_model_serves_identical_outputs(expected):
    restored = tf.saved_model.load(str(FIXTURES / "saved_model"))
    outputs = restored.serve(tf.constant(expected["ids"]))
    np.testing.assert_array_equal(np.asarray(outputs), expected["outputs"])


# -- int32 bookkeeping (files of 5856fa8, make_int32_fixtures.py) ------------------

OLD = FIXTURES / "int32_bookkeeping"


def test_an_int8_keras_file_with_int32_maps_loads(tmp_path):
    """The int8 store's maps were int32 variables; they are int64 now (int32
    ones stay on the host next to a GPU). The file loads, cast."""
    import make_int32_fixtures as old

    with np.load(OLD / "expected.npz") as expected:
        model = keras.saving.load_model(OLD / "model.keras")
        layer = model.layers[1]
        assert layer.float_row_ids.dtype == "int64"
        np.testing.assert_array_equal(np.sort(layer.trainable_ids), [3, 7, 9, 11])
        _, ids, _ = old.inputs()
        np.testing.assert_array_equal(model.predict(ids, verbose=0), expected["outputs"])


def test_an_int8_checkpoint_with_int32_bookkeeping_restores_and_trains_on():
    """A tf.train.Checkpoint of 5856fa8 holds the store's maps and the compact
    slots' row count as int32: it restores into the int64 variables, and one
    more step from it equals one from the .keras file of the same state."""
    import make_int32_fixtures as old

    table, ids, targets = old.inputs()
    model, layer = old.build_model(np.zeros_like(table))
    model.optimizer.build(model.trainable_variables)
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(str(OLD / "ckpt"))
    status.assert_existing_objects_matched()
    with np.load(OLD / "expected.npz") as expected:
        count = len([k for k in expected if k.startswith("weight_")])
        for i, got in enumerate(model.get_weights()[:count]):
            np.testing.assert_array_equal(got, expected[f"weight_{i}"])
        np.testing.assert_array_equal(model.predict(ids, verbose=0), expected["outputs"])
    assert model.optimizer.compact_slot_rows(layer.float_rows) == 4
    loaded = keras.saving.load_model(OLD / "model.keras")
    for resumed in (model, loaded):
        resumed.fit(ids[:4], targets[:4], verbose=0, shuffle=False)
    for got, want in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_new_checkpoints_and_saved_models_hold_the_bookkeeping_as_int64(rng, tmp_path):
    """Written now, both keep the variables' own dtype, and both read back:
    a checkpoint into a model, a SavedModel's variables through a checkpoint
    reader and through tf.saved_model.load."""
    import make_int32_fixtures as old

    table, ids, targets = old.inputs()
    model, layer = old.build_model(table)
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
        fresh, fresh_layer = old.build_model(np.zeros_like(table))
        fresh.optimizer.build(fresh.trainable_variables)
        tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(files).expect_partial()
        np.testing.assert_array_equal(
            fresh_layer.float_row_ids.numpy(), layer.float_row_ids.numpy()
        )
        np.testing.assert_array_equal(fresh.predict(ids, verbose=0), model.predict(ids, verbose=0))
    tf.saved_model.load(str(served))
