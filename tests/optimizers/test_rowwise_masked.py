"""RowwiseAdagrad and RowwiseAdam inside MaskedOptimizer: lazy, permitted
rows only, equal to the optimizer alone on the permitted part of the
gradient; frozen rows and their state untouched; compact slots of one value
a row for the second moment (state ratios against Adagrad and Adam); the
per-row slots through the slot API and a trained-rows file."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import assert_bits_equal

RULES = {"rowwise_adagrad": pe.RowwiseAdagrad, "rowwise_adam": pe.RowwiseAdam}


def _batches(rng: np.random.Generator, rows: int, width: int, steps: int) -> list[tuple]:
    """``steps`` sparse gradients of 2-9 ids each, with repeats."""
    batches = []
    for _ in range(steps):
        count = int(rng.integers(2, 10))
        ids = rng.integers(0, rows, size=count)
        ids[-1] = ids[0]  # a duplicate in every batch
        batches.append((ids, rng.normal(size=(count, width))))
    return batches


def _apply(optimizer: Any, table: Any, ids: np.ndarray, values: np.ndarray, graph: bool) -> None:
    grad = tf.IndexedSlices(
        tf.constant(values, table.dtype), tf.constant(ids), tf.constant(table.shape)
    )
    if graph:
        tf.function(lambda: optimizer.apply([grad], [table]))()
    else:
        optimizer.apply([grad], [table])


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("compact", [False, True], ids=["full_slots", "compact"])
@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_masked_equals_the_optimizer_alone_on_permitted_rows(rule, compact, graph, dtype, rng):
    rows, width = int(rng.integers(8, 20)), int(rng.integers(1, 5))
    initial = rng.normal(size=(rows, width)).astype(dtype)
    mask = rng.random(rows) < 0.5
    mask[0], mask[1] = True, False
    hyper = dict(learning_rate=0.1, epsilon=1e-3)
    masked_table = keras.Variable(initial)
    optimizer = pe.MaskedOptimizer(
        RULES[rule](**hyper),
        row_masks=[(masked_table, keras.Variable(mask, trainable=False))],
        compact_slots=compact,
    )
    alone_table = keras.Variable(initial)
    alone = RULES[rule](**hyper)
    alone.build([alone_table])
    batches = _batches(rng, rows, width, steps=3)
    # Row 0 (permitted) in the first batch: some permitted row is stepped on
    # every seed (seed 919900375 drew three batches of frozen rows only).
    batches[0][0][[0, -1]] = 0
    for ids, values in batches:
        _apply(optimizer, masked_table, ids, values, graph)
        # The optimizer alone sees the permitted entries only (maybe none:
        # it still counts the step, which Adam's bias correction reads).
        keep = mask[ids]
        _apply(alone, alone_table, ids[keep], values[keep], graph)
    assert optimizer.has_compact_slots(masked_table) is compact

    tolerance = dict(rtol=1e-6, atol=1e-7) if dtype == "float32" else dict(rtol=1e-13, atol=0)
    got, want = masked_table.numpy(), alone_table.numpy()
    np.testing.assert_allclose(got, want, **tolerance)
    assert_bits_equal(got[~mask], initial[~mask], "frozen rows")
    touched = np.zeros(rows, bool)
    for ids, _ in batches:
        touched[ids] = True
    assert not np.array_equal(got[mask & touched], initial[mask & touched])

    ids = np.arange(rows)
    names = optimizer.slot_names()
    assert names == (["accumulator"] if rule == "rowwise_adagrad" else ["momentum", "velocity"])
    for name in names:
        mine = optimizer.slot_rows(masked_table, name, ids)
        lists = {
            "accumulator": "_accumulators",
            "momentum": "_momentums",
            "velocity": "_velocities",
        }
        theirs = getattr(alone, lists[name])[0].numpy()
        per_row = name in ("accumulator", "velocity")
        assert mine.shape == ((rows,) if per_row else (rows, width)), name
        np.testing.assert_allclose(mine[mask], theirs[mask], **tolerance, err_msg=name)
        # Frozen rows' state: never written (the initial value, 0 here).
        assert not mine[~mask].any(), name
    if compact:
        present = optimizer.slot_rows_present(masked_table, ids)
        np.testing.assert_array_equal(present, mask & touched)


def _compact_state_bytes(optimizer: Any, table: Any) -> tuple[int, int]:
    """Bytes of the slot rows, and of the row -> slot-row map and count."""
    slot_of_row, rows_used, *slots = optimizer.compact_slot_variables
    slot_bytes = sum(s.numpy().nbytes for s in slots)
    map_bytes = slot_of_row.numpy().nbytes + rows_used.numpy().nbytes
    return slot_bytes, map_bytes


def test_compact_state_is_one_value_a_row_for_the_second_moment():
    """At V = 20,000, D = 128, 1 % permitted: RowwiseAdagrad's slot rows are
    1/128 of Adagrad's, RowwiseAdam's (D + 1) / 2D of Adam's; the map is the
    same for every rule and left out of both ratios."""
    rows, width = 20_000, 128
    mask = np.zeros(rows, bool)
    mask[:: rows // 200] = True  # 1 %
    state = {}
    for name, inner in {
        "adagrad": keras.optimizers.Adagrad(),
        "rowwise_adagrad": pe.RowwiseAdagrad(),
        "adam": keras.optimizers.Adam(),
        "rowwise_adam": pe.RowwiseAdam(),
    }.items():
        table = keras.Variable(np.zeros((rows, width), np.float32))
        optimizer = pe.MaskedOptimizer(
            inner, row_masks=[(table, keras.Variable(mask, trainable=False))]
        )
        optimizer.build([table])
        assert optimizer.has_compact_slots(table)
        state[name] = _compact_state_bytes(optimizer, table)
    assert state["rowwise_adagrad"][0] * 100 <= state["adagrad"][0]
    assert state["rowwise_adagrad"][0] * width == state["adagrad"][0]
    assert state["rowwise_adam"][0] <= 0.51 * state["adam"][0]
    assert state["rowwise_adam"][0] * 2 * width == state["adam"][0] * (width + 1)
    assert len({maps for _, maps in state.values()}) == 1


def _model(inner: Any, compact: bool) -> tuple[keras.Model, Any, Any]:
    keras.utils.set_random_seed(1)
    layer = pe.PartialEmbedding(20, 4, trainable_ids=[1, 3, 5])
    ids = keras.Input((2,), dtype="int32")
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
    optimizer = pe.MaskedOptimizer(inner, compact_slots=compact)
    model.compile(optimizer, "mse")
    return model, layer, optimizer


@pytest.mark.parametrize("compact", [False, True], ids=["full_slots", "compact"])
def test_per_row_slots_round_trip_through_a_trained_rows_file(compact, tmp_path):
    """Saved from one layout, loaded into the other: the same slot rows; an
    Adam optimizer refuses the file's per-row velocity, table untouched."""
    x = np.array([[1, 3], [5, 7], [3, 3]], np.int32)
    model, layer, optimizer = _model(pe.RowwiseAdam(0.1), compact)
    model.fit(x, np.ones((3, 1), np.float32), epochs=2, verbose=0)
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, layer, optimizer=optimizer)
    saved = pe.read_trained_rows(path)
    assert {k: v.shape for k, v in saved.slots.items()} == {"momentum": (3, 4), "velocity": (3,)}

    other_model, other_layer, other = _model(pe.RowwiseAdam(0.1), not compact)
    other.build(other_model.trainable_variables)
    pe.load_trained_rows(path, other_layer, optimizer=other, check=False)
    for name in ("momentum", "velocity"):
        assert_bits_equal(
            other.slot_rows(other_layer.embeddings, name, [1, 3, 5]),
            optimizer.slot_rows(layer.embeddings, name, [1, 3, 5]),
            name,
        )

    adam_model, adam_layer, adam = _model(keras.optimizers.Adam(0.1), compact)
    adam.build(adam_model.trainable_variables)
    before = adam_layer.embeddings.numpy().copy()
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=r"values: shape \(3,\)"):
        pe.load_trained_rows(path, adam_layer, optimizer=adam, check=False)
    assert_bits_equal(adam_layer.embeddings.numpy(), before, "table after a refused load")


@pytest.mark.parametrize("rule", sorted(RULES))
def test_keras_file_and_checkpoint_resume_exactly(rule, tmp_path):
    """A ``.keras`` file and a ``tf.train.Checkpoint`` of a model trained
    with ``MaskedOptimizer(rule)`` on compact slots: each restored model
    takes the next step exactly as the uninterrupted one."""
    x = np.array([[1, 3], [5, 7], [3, 3], [1, 5]], np.int32)
    y = np.linspace(-1, 1, 4, dtype=np.float32).reshape(4, 1)
    model, layer, optimizer = _model(RULES[rule](0.1), compact=True)
    model.fit(x, y, epochs=2, batch_size=2, shuffle=False, verbose=0)
    assert optimizer.has_compact_slots(layer.embeddings)
    model.save(tmp_path / "model.keras")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    path = checkpoint.write(str(tmp_path / "ckpt"))

    from_file = keras.saving.load_model(tmp_path / "model.keras")
    from_checkpoint, _, restored = _model(RULES[rule](0.1), compact=True)
    restored.build(from_checkpoint.trainable_variables)
    tf.train.Checkpoint(model=from_checkpoint, optimizer=restored).read(
        path
    ).assert_existing_objects_matched()
    for resumed in (model, from_file, from_checkpoint):
        resumed.fit(x, y, epochs=1, batch_size=2, shuffle=False, verbose=0)
    for other in (from_file, from_checkpoint):
        for got, want in zip(other.get_weights(), model.get_weights(), strict=True):
            assert_bits_equal(got, want, f"{rule}: weights after the resumed step")
        table = next(x for x in other.layers if isinstance(x, pe.PartialEmbedding)).embeddings
        for name in other.optimizer.slot_names():
            assert_bits_equal(
                other.optimizer.slot_rows(table, name, np.arange(20)),
                optimizer.slot_rows(layer.embeddings, name, np.arange(20)),
                f"{rule}: slot {name}",
            )


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_plain_tf_variable_trains_alone_and_masked(rule):
    """A ``tf.Variable`` (no Keras path) gets its per-row state too, alone
    and inside MaskedOptimizer, in a ``tf.function``."""
    grad = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([1, 4]), tf.constant([6, 3]))
    alone_table = tf.Variable(np.zeros((6, 3), np.float32), name="plain/table")
    alone = RULES[rule](0.1)
    tf.function(lambda: alone.apply_gradients([(grad, alone_table)]))()
    table = tf.Variable(np.zeros((6, 3), np.float32))
    mask = tf.Variable([True, True, True, True, False, True], trainable=False)
    masked = pe.MaskedOptimizer(RULES[rule](0.1), row_masks=[(table, mask)])
    tf.function(lambda: masked.apply([grad], [table]))()
    expected = np.zeros((6, 3), np.float32)
    expected[1] = alone_table.numpy()[1]
    assert expected[1].any()
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-6)
