"""Serving and checkpoints: SavedModels in a fresh process, exact checkpoint resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import bits, seed_frameworks

VOCAB = 12
WIDTH = 3


class _Table(tf.Module):
    """A served table: lookups, and masked in-place updates."""

    def __init__(self, table: np.ndarray, row_mask: np.ndarray) -> None:
        super().__init__()
        self.table = tf.Variable(table)
        self.row_mask = tf.Variable(row_mask, trainable=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def lookup(self, ids):
        return pe.masked_embedding_lookup(self.table, ids, self.row_mask)

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, WIDTH], tf.float32)]
    )
    def update(self, ids, updates):
        pe.masked_scatter_sub(self.table, ids, updates, self.row_mask)
        return self.table.read_value()


_FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf

    path, ids, updates = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    result = {}
    try:  # Without the package the op is unknown to TensorFlow.
        tf.saved_model.load(path)
        result["without_package"] = "loaded"
    except Exception as error:  # noqa: BLE001
        result["without_package"] = f"{type(error).__name__}: {error}"[:300]

    import partial_embedding  # noqa: F401  (registers the op)

    loaded = tf.saved_model.load(path)
    ids = tf.constant(ids, tf.int64)
    result["lookup"] = loaded.lookup(ids).numpy().tolist()
    serving = loaded.signatures["serving_default"]
    result["signature"] = serving(ids=ids)["output_0"].numpy().tolist()
    result["updated"] = loaded.update(ids, tf.constant(updates, tf.float32)).numpy().tolist()
    print(json.dumps(result))
    """
)


@pytest.mark.slow
def test_saved_model_reloads_and_runs_in_a_fresh_process(rng, tmp_path):
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    row_mask = rng.random(VOCAB) < 0.5
    row_mask[[1, 2]] = [True, False]
    module = _Table(table, row_mask)
    path = str(tmp_path / "table")
    tf.saved_model.save(module, path, signatures={"serving_default": module.lookup})

    ids = [1, 2, 1, 11, 0]
    updates = rng.normal(size=(len(ids), WIDTH)).astype(np.float32)
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, path, json.dumps(ids), json.dumps(updates.tolist())],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])

    # Shows that the import is what makes the op available.
    assert "Op type not registered" in result["without_package"], result
    assert "MaskedScatterSub" in result["without_package"], result
    expected_rows = table[ids]
    np.testing.assert_array_equal(np.array(result["lookup"], np.float32), expected_rows)
    np.testing.assert_array_equal(np.array(result["signature"], np.float32), expected_rows)

    reference = table.copy()
    module.update(tf.constant(ids, tf.int64), tf.constant(updates))
    np.testing.assert_array_equal(
        bits(np.array(result["updated"], np.float32)), bits(module.table.numpy())
    )
    frozen = ~row_mask
    np.testing.assert_array_equal(
        bits(np.array(result["updated"], np.float32)[frozen]), bits(reference[frozen])
    )


# --- tf.train.Checkpoint of a Keras model with PartialEmbedding + MaskedOptimizer ---

IDS_PER_SAMPLE = 4
BATCH = 6
STEPS = 6
SAVE_AFTER = 3


def _data(rng):
    x = rng.integers(0, VOCAB, size=(STEPS * BATCH, IDS_PER_SAMPLE)).astype(np.int32)
    y = rng.normal(size=(STEPS * BATCH, 1)).astype(np.float32)
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    return x, y, table


def _model_and_optimizer(table: np.ndarray):
    # The same initial head in each of the three models (seeds Keras alike).
    seed_frameworks("test_serving", "model")
    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=np.arange(0, VOCAB, 2), weights=table)
    model = keras.Sequential(
        [
            keras.Input((IDS_PER_SAMPLE,), dtype="int32"),
            layer,
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    # Full-size slots: the test finds them by the table's shape (compact
    # slots are checkpointed in test_compact_slots.py).
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05, amsgrad=True), compact_slots=False)
    model.compile(optimizer=optimizer, loss="mse")
    return model, layer, optimizer


def _train(model, x, y, steps) -> list[float]:
    losses = []
    for step in steps:
        batch = slice(step * BATCH, (step + 1) * BATCH)
        losses.append(float(model.train_on_batch(x[batch], y[batch])))
        if step == 1:
            # A mask change mid-training is state the checkpoint must carry.
            model.layers[0].freeze([0])
            model.layers[0].unfreeze([1])
    return losses


def _state(model, optimizer) -> list[tuple[str, np.ndarray]]:
    """Every model and optimizer variable, in creation order (paths differ
    between two models by Keras' name uniquification)."""
    return [(v.name, v.numpy()) for v in [*model.variables, *optimizer.variables]]


def test_checkpoint_restores_exactly_and_training_resumes_identically(rng, tmp_path):
    x, y, table = _data(rng)
    model, layer, optimizer = _model_and_optimizer(table)
    uninterrupted = _train(model, x, y, range(STEPS))
    uninterrupted_table = layer.embeddings.numpy()

    model, layer, optimizer = _model_and_optimizer(table)
    first_half = _train(model, x, y, range(SAVE_AFTER))
    saved_state = _state(model, optimizer)
    prefix = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))

    restored_model, restored_layer, restored_optimizer = _model_and_optimizer(table)
    restored_optimizer.build(restored_model.trainable_variables)
    status = tf.train.Checkpoint(model=restored_model, optimizer=restored_optimizer).restore(prefix)
    status.assert_existing_objects_matched()
    restored_state = _state(restored_model, restored_optimizer)
    assert len(restored_state) == len(saved_state)
    slots = [
        name for name, value in saved_state[len(model.variables) :] if value.shape == table.shape
    ]
    assert len(slots) == 3, slots  # m, v and v_hat of the table
    for (name, saved), (_, restored) in zip(saved_state, restored_state):
        np.testing.assert_array_equal(
            np.atleast_1d(restored).view(np.uint8),
            np.atleast_1d(saved).view(np.uint8),
            err_msg=name,
        )
    np.testing.assert_array_equal(
        restored_layer.trainable_mask.numpy(), layer.trainable_mask.numpy()
    )
    assert restored_layer.trainable_mask.numpy()[1] and not restored_layer.trainable_mask.numpy()[0]

    second_half = _train(restored_model, x, y, range(SAVE_AFTER, STEPS))
    assert first_half + second_half == uninterrupted
    np.testing.assert_array_equal(
        bits(restored_layer.embeddings.numpy()), bits(uninterrupted_table)
    )
