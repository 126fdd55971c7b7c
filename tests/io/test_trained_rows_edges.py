"""Trained-rows files at the edges: no rows, rows of no width, a path that
cannot be read, and a load whose write fails midway (what it wrote is put
back: the rows, their slots, the step count)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding import _trained_rows_tables
from partial_embedding._internal import safetensors as codec
from partial_embedding.trained_rows import TrainedRowsError
from pe_testing import assert_bits_equal

NUM_ROWS, WIDTH = 12, 3
NEW_IDS = np.arange(8, 12)


def _table() -> np.ndarray:
    return np.arange(NUM_ROWS * WIDTH, dtype=np.float32).reshape(NUM_ROWS, WIDTH) / 8


def _layer(trainable_ids=NEW_IDS) -> pe.PartialEmbedding:
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, weights=_table(), trainable_ids=trainable_ids)
    layer.build()
    return layer


def _optimizer(layer, compact: bool) -> pe.MaskedOptimizer:
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), compact_slots=compact)
    optimizer.build(layer.trainable_variables)
    return optimizer


def _train(layer, optimizer, ids, steps: int = 2) -> None:
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(np.asarray(ids, np.int32)) - 1.0))
        optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)


# -- no rows, rows of no width ---------------------------------------------------------


def test_a_file_of_no_rows_round_trips(tmp_path):
    path = tmp_path / "none.safetensors"
    layer = _layer(trainable_ids=[])
    optimizer = _optimizer(layer, compact=True)
    saved = pe.save_trained_rows(path, layer, optimizer=optimizer)
    assert saved.ids.shape == (0,) and saved.values.shape == (0, WIDTH)
    rows = pe.read_trained_rows(path)
    assert rows.ids.shape == (0,) and rows.values.shape == (0, WIDTH)
    assert rows.slots["momentum"].shape == (0, WIDTH) and rows.iterations == 0
    fresh = _layer()
    pe.load_trained_rows(path, fresh, optimizer=_optimizer(fresh, compact=True))
    assert_bits_equal(fresh.embeddings.numpy(), _table(), "a load of no rows")
    assert_bits_equal(pe.merge_trained_rows(_table(), path), _table(), "a merge of no rows")


@pytest.mark.parametrize("shape", [(0, 3), (4, 0), (0,), (3, 0, 2)])
def test_rows_with_no_values_are_finite(shape):
    # No reshape of an empty array: no rows, or rows of width 0, hold no NaN.
    codec.require_finite(np.zeros(shape, np.float32), np.arange(shape[0]), "file", "rows")


def test_a_nan_row_is_named_by_its_id():
    values = np.zeros((3, 2, 2), np.float32)
    values[2, 1, 0] = np.nan
    with pytest.raises(codec.SafetensorsError, match="rows of row id 9 holds NaN or Inf"):
        codec.require_finite(values, np.array([3, 5, 9]), "file", "rows")


def test_a_file_whose_rows_have_no_width_fails_as_a_trained_rows_error(tmp_path):
    path = tmp_path / "narrow.safetensors"
    pe.save_trained_rows(path, _layer())
    tensors = {"ids": NEW_IDS.astype(np.int64), "rows": np.zeros((len(NEW_IDS), 0), np.float32)}
    metadata = {**pe.read_trained_rows(path).metadata, "width": "[0]"}
    codec.write_file(path, tensors, metadata)
    with pytest.raises(
        TrainedRowsError, match=r"rows of a \[12, 0\] table; this table is \[12, 3\]"
    ):
        pe.load_trained_rows(path, _layer(), check=False)


# -- a path that cannot be read ----------------------------------------------------------


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_a_path_that_cannot_be_read_is_a_trained_rows_error_naming_it(tmp_path, what):
    path = tmp_path / "rows.safetensors"
    if what == "directory":
        path.mkdir()
    layer = _layer()
    for call in (
        lambda: pe.read_trained_rows(path),
        lambda: pe.load_trained_rows(path, layer),
        lambda: pe.merge_trained_rows(_table(), path),
    ):
        with pytest.raises(TrainedRowsError, match=f"path: cannot read '{path}'"):
            call()
    assert_bits_equal(layer.embeddings.numpy(), _table(), "after a refused load")


# -- a write that fails midway ------------------------------------------------------------


def _saved(tmp_path, compact: bool, reversible: bool):
    """A file of trained rows (and slots) and a fresh layer + optimizer to load it into."""

    def make():
        if reversible:
            layer = pe.PartialReversibleEmbedding(
                NUM_ROWS,
                WIDTH,
                weights=_table(),
                trainable_ids=NEW_IDS,
                tie_weights=False,
                reverse_trainable_ids=NEW_IDS[:2],
            )
            layer.build()
            layer.reverse_embeddings.assign(-_table())  # the same pretrained output table
        else:
            layer = _layer()
        return layer, _optimizer(layer, compact)

    trained, trained_optimizer = make()
    _train(trained, trained_optimizer, NEW_IDS[:3])
    if reversible:  # its permitted output rows learned too
        reverse = trained.reverse_embeddings.numpy()
        reverse[NEW_IDS[:2]] += 1.0
        trained.reverse_embeddings.assign(reverse)
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained, optimizer=trained_optimizer)
    layer, optimizer = make()
    # Some state of its own first, which the failed load must leave as it was.
    _train(layer, optimizer, NEW_IDS[2:], steps=1)
    return path, layer, optimizer


def _state(layer, optimizer) -> list[np.ndarray]:
    tables = [layer.embeddings]
    if getattr(layer, "reverse_embeddings", None) is not None:
        tables.append(layer.reverse_embeddings)
    state = [np.asarray(optimizer.iterations.numpy())]
    for table in tables:
        state.append(table.numpy())
        ids = np.arange(NUM_ROWS)
        state.append(optimizer.slot_rows_present(table, ids))
        state += [optimizer.slot_rows(table, name, ids) for name in optimizer.slot_names()]
    return state


FAILURES = {
    # The first slot of the second table: after the first table and its slots.
    "reverse slots": ("assign_slot_rows", 3),
    # The second table, after the first one and its slots.
    "reverse table": ("table write", 2),
    # The step count, written last.
    "iterations": ("iterations", 1),
    # The second slot of the only table.
    "second slot": ("assign_slot_rows", 2),
}


@pytest.mark.parametrize("compact", [False, True], ids=["full-size", "compact"])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_load_that_fails_midway_leaves_everything_as_it_was(
    tmp_path, monkeypatch, failure, compact
):
    where, failing_call = FAILURES[failure]
    path, layer, optimizer = _saved(tmp_path, compact, reversible=failure.startswith("reverse"))
    before = _state(layer, optimizer)
    calls = {"count": 0}

    def failing(original):
        def call(*args, **kwargs):
            calls["count"] += 1
            if calls["count"] == failing_call:
                raise RuntimeError(f"injected failure in {where}")
            return original(*args, **kwargs)

        return call

    if where == "assign_slot_rows":
        monkeypatch.setattr(
            optimizer,
            "assign_slot_rows",
            failing(type(optimizer).assign_slot_rows.__get__(optimizer)),
        )
    elif where == "table write":
        original = _trained_rows_tables.FloatTable.write
        monkeypatch.setattr(
            _trained_rows_tables.FloatTable,
            "write",
            lambda self, ids, values: failing(original)(self, ids, values),
        )
    else:
        iterations = optimizer.iterations
        monkeypatch.setattr(iterations, "assign", failing(iterations.assign))
    with pytest.raises(RuntimeError, match="injected failure"):
        pe.load_trained_rows(path, layer, optimizer=optimizer)
    assert calls["count"] >= failing_call
    monkeypatch.undo()
    after = _state(layer, optimizer)
    for index, (value, expected) in enumerate(zip(after, before)):
        assert_bits_equal(value, expected, f"state {index} after a failed load ({failure})")
    # And the same load, not failing, goes through.
    pe.load_trained_rows(path, layer, optimizer=optimizer)
    assert not np.array_equal(layer.embeddings.numpy(), before[1])
