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
