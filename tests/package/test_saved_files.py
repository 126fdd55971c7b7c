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


def _optimizer_state(optimizer) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in optimizer.variables]


def test_an_int32_checkpoint_read_before_the_optimizer_is_built_restores_on_build():
    """Read first, then fit (the optimizer builds its slots, and the
    checkpoint's values reach them as they are tracked, deferred): the int32
    values restore into the int64 variables as when the optimizer was built
    first, and training goes on identically."""
    import make_int32_fixtures as old

    table, ids, targets = old.inputs()
    built_first, _ = old.build_model(np.zeros_like(table))
    built_first.optimizer.build(built_first.trainable_variables)
    tf.train.Checkpoint(model=built_first, optimizer=built_first.optimizer).read(
        str(OLD / "ckpt")
    ).assert_existing_objects_matched()
    read_first, layer = old.build_model(np.zeros_like(table))
    tf.train.Checkpoint(model=read_first, optimizer=read_first.optimizer).read(str(OLD / "ckpt"))
    read_first.optimizer.build(read_first.trainable_variables)
    assert read_first.optimizer.compact_slot_rows(layer.float_rows) == 4
    for got, want in zip(
        _optimizer_state(read_first.optimizer), _optimizer_state(built_first.optimizer), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    for resumed in (read_first, built_first):
        resumed.fit(ids[:4], targets[:4], verbose=0, shuffle=False)
    for got, want in zip(read_first.get_weights(), built_first.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_int32_checkpoint_rewritten_in_place_reads_again(tmp_path):
    """Read an int32 checkpoint, write the model back to the same path (int64
    now), read it again: the second read asks for the dtypes the file holds
    now, not those of the first."""
    import shutil

    import make_int32_fixtures as old

    for name in ("ckpt.index", "ckpt.data-00000-of-00001"):
        shutil.copy(OLD / name, tmp_path / name)
    path = str(tmp_path / "ckpt")
    table, ids, _ = old.inputs()
    first, _ = old.build_model(np.zeros_like(table))
    first.optimizer.build(first.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=first, optimizer=first.optimizer)
    checkpoint.read(path).assert_existing_objects_matched()
    checkpoint.write(path)
    dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
    assert sorted(d.name for n, d in dtypes.items() if "float_row_i" in n) == ["int64", "int64"]
    again, layer = old.build_model(np.zeros_like(table))
    again.optimizer.build(again.trainable_variables)
    tf.train.Checkpoint(model=again, optimizer=again.optimizer).read(
        path
    ).assert_existing_objects_matched()
    assert layer.float_row_ids.dtype == "int64"
    np.testing.assert_array_equal(again.predict(ids, verbose=0), first.predict(ids, verbose=0))
    for got, want in zip(
        _optimizer_state(again.optimizer), _optimizer_state(first.optimizer), strict=True
    ):
        np.testing.assert_array_equal(got, want)


def test_an_async_checkpoint_saves_the_bookkeeping_as_it_was_at_write(tmp_path):
    """An async checkpoint snapshots at write(): the int8 store's maps too
    (they are saved through stand-ins), so rows unfrozen right after write()
    returns are not in the file, while the store rows it snapshotted are."""
    import make_int32_fixtures as old
    from tensorflow.python.util import object_identity

    from partial_embedding._internal import framework_private

    table, ids, targets = old.inputs()
    model, layer = old.build_model(table)
    model.fit(ids, targets, verbose=0, shuffle=False)
    # The mechanism: the stand-in's snapshot keeps the values of its copy.
    stand_in = framework_private.checkpoint_stand_in(layer.float_row_ids)
    assert stand_in is not layer.float_row_ids
    copies = object_identity.ObjectIdentityDictionary()
    stand_in._copy_trackable_to_cpu(copies)
    at_copy = layer.float_row_ids.numpy().copy()
    probe = np.full([1, old.LENGTH], 20, np.int32)
    at_write = model.predict(probe, verbose=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    path = checkpoint.write(
        str(tmp_path / "c"),
        options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True),
    )
    layer.unfreeze([20])  # moves the maps after write() returned
    np.testing.assert_array_equal(copies[stand_in]._variable.numpy(), at_copy)
    checkpoint.sync()
    fresh, fresh_layer = old.build_model(np.zeros_like(table))
    fresh.optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(path).expect_partial()
    np.testing.assert_array_equal(fresh_layer.float_row_ids.numpy(), at_copy)
    np.testing.assert_array_equal(fresh.predict(probe, verbose=0), at_write)
