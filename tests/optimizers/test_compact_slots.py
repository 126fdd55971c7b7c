"""Compact optimizer slots (MaskedOptimizer's default for mostly-frozen tables).

Compact slots must give the same bits as full-size slots: the same table, and
for every row that trained, the same slot values; across freeze -> unfreeze,
growth beyond the initial capacity, and every way of saving and loading.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import (
    assert_bits_equal,
    masked_fit_problem,
    row_rule_configs,
    seed_frameworks,
)

VOCAB = 60
WIDTH = 4
IDS_PER_SAMPLE = 3
BATCH = 8
SAMPLES = 48

# Every rule with slots (plain SGD and RMSprop without options are covered
# by their richer variants here).
RULES = {
    name: factory for name, factory in row_rule_configs().items() if name not in ("sgd", "rmsprop")
}


def _problem(rng: np.random.Generator):
    return masked_fit_problem(rng, VOCAB, WIDTH, IDS_PER_SAMPLE, SAMPLES)


def _model(table, permitted, dtype="float32"):
    seed_frameworks("test_compact_slots", "model")
    layer = pe.PartialEmbedding(
        VOCAB, WIDTH, trainable_ids=permitted, weights=table.astype(dtype), dtype=dtype
    )
    model = keras.Sequential(
        [
            keras.Input((IDS_PER_SAMPLE,), dtype="int32"),
            layer,
            keras.layers.Flatten(),
            keras.layers.Dense(1, kernel_initializer="ones", dtype=dtype),
        ]
    )
    return model, layer


def _train(rule_name, compact, table, permitted, x, y, dtype="float32", slot_capacity=None):
    """Trains, then freezes half the trained rows and unfreezes new ones
    (more than the slots' initial capacity), then trains again."""
    model, layer = _model(table, permitted, dtype)
    optimizer = pe.MaskedOptimizer(
        RULES[rule_name](), compact_slots=compact, slot_capacity=slot_capacity
    )
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    trained = np.flatnonzero(permitted)
    layer.freeze(trained[::2])
    layer.unfreeze(np.flatnonzero(~permitted)[: VOCAB // 3])
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    layer.unfreeze(trained[::2])
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model, layer, optimizer


def _compact_state(optimizer, layer):
    variables = {v.name.split("/")[-1].split(":")[0]: v for v in optimizer.compact_slot_variables}
    slot_of_row = variables["slot_of_row"].numpy()
    return variables, slot_of_row


def _full_slots(optimizer, shape):
    """The optimizer's slots of a ``shape`` table: per element, or per row
    (``[V]``, the row-wise rules' second moments)."""
    shapes = (tuple(shape), tuple(shape[:1]))
    return {
        v.name.split(":")[0]: v.numpy() for v in optimizer.variables if tuple(v.shape) in shapes
    }


@pytest.mark.parametrize("rule_name", sorted(RULES))
def test_compact_slots_match_full_size_slots_bit_for_bit(rule_name, rng):
    table, permitted, x, y = _problem(rng)
    full_model, full_layer, full_optimizer = _train(rule_name, False, table, permitted, x, y)
    model, layer, optimizer = _train(rule_name, True, table, permitted, x, y)
    assert optimizer.has_compact_slots(layer.embeddings)
    assert not full_optimizer.has_compact_slots(full_layer.embeddings)

    assert_bits_equal(layer.embeddings.numpy(), full_layer.embeddings.numpy(), "table")
    for mine, theirs in zip(model.get_weights(), full_model.get_weights()):
        assert_bits_equal(mine, theirs, "model weights")

    variables, slot_of_row = _compact_state(optimizer, layer)
    full_slots = _full_slots(full_optimizer, table.shape)
    slot_names = optimizer.slot_names()
    assert len(full_slots) == len(slot_names) > 0
    has_slot = slot_of_row >= 0
    # Slot rows exist only for rows that were permitted at some step, each
    # its own, numbered in order.
    ever_permitted = permitted.copy()
    ever_permitted[np.flatnonzero(~permitted)[: VOCAB // 3]] = True
    assert not has_slot[~ever_permitted].any()
    used = int(variables["slot_rows_used"].numpy())
    assert optimizer.compact_slot_rows(layer.embeddings) == used == has_slot.sum()
    assert sorted(slot_of_row[has_slot].astype(int)) == list(range(used))
    # Grown beyond the initial capacity (the permitted rows at build).
    assert used > permitted.sum()
    for name in slot_names:
        compact_slot = variables[name].numpy()
        full = next(value for key, value in full_slots.items() if key.endswith(name))
        assert_bits_equal(
            compact_slot[slot_of_row[has_slot].astype(int)], full[has_slot], f"slot {name}"
        )
        # A row without a slot row holds the initial value in full size.
        initial = compact_slot[used:] if len(compact_slot) > used else None
        if initial is not None:
            assert (initial == initial.reshape(-1)[0]).all()
        untouched = full[~has_slot]
        assert (untouched == untouched.reshape(-1)[0]).all(), name


def test_frozen_row_keeps_its_slot_row_untouched_and_resumes(rng):
    table, permitted, x, y = _problem(rng)
    model, layer = _model(table, permitted)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05))
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    variables, slot_of_row = _compact_state(optimizer, layer)
    trained = np.flatnonzero(slot_of_row >= 0)
    row = int(trained[0])
    slot_row = int(slot_of_row[row])
    before = {name: variables[name].numpy()[slot_row].copy() for name in ("momentum", "velocity")}
    table_row = layer.embeddings.numpy()[row].copy()

    layer.freeze([row])
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for name, value in before.items():
        assert_bits_equal(variables[name].numpy()[slot_row], value, f"{name} of a frozen row")
    assert_bits_equal(layer.embeddings.numpy()[row], table_row, "a frozen row")

    layer.unfreeze([row])
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    _, slot_of_row_after = _compact_state(optimizer, layer)
    assert int(slot_of_row_after[row]) == slot_row  # The same slot row.
    assert not np.array_equal(variables["momentum"].numpy()[slot_row], before["momentum"])


def test_growth_from_one_slot_row_matches_full_size(rng):
    table, permitted, x, y = _problem(rng)
    full_model, full_layer, _ = _train("adam", False, table, permitted, x, y)
    model, layer, optimizer = _train("adam", True, table, permitted, x, y, slot_capacity=1)
    assert_bits_equal(layer.embeddings.numpy(), full_layer.embeddings.numpy(), "table")
    variables, slot_of_row = _compact_state(optimizer, layer)
    assert len(variables["momentum"].numpy()) >= optimizer.compact_slot_rows(layer.embeddings)


def test_sixteen_bit_tables_match_full_size(rng):
    table, permitted, x, y = _problem(rng)
    _, full_layer, _ = _train("rmsprop_momentum_centered", False, table, permitted, x, y, "float16")
    _, layer, _ = _train("rmsprop_momentum_centered", True, table, permitted, x, y, "float16")
    assert_bits_equal(layer.embeddings.numpy(), full_layer.embeddings.numpy(), "float16 table")


def test_optimizer_state_is_permitted_rows_plus_the_map():
    vocab, width, permitted_rows = 4000, 16, 40
    layer = pe.PartialEmbedding(vocab, width, trainable_ids=np.arange(permitted_rows))
    model = keras.Sequential([keras.Input((2,), dtype="int32"), layer])
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam())
    optimizer.build(model.trainable_variables)
    sizes = {
        v.name: int(np.prod(v.numpy().shape))
        for v in [*optimizer.variables, *optimizer.compact_slot_variables]
    }
    slots = sum(size for name, size in sizes.items() if "momentum" in name or "velocity" in name)
    assert slots == 2 * permitted_rows * width
    map_size = sum(size for name, size in sizes.items() if "slot_of_row" in name)
    assert map_size == vocab
    # Everything else: scalars (iterations, learning rates, the count).
    assert sum(sizes.values()) - slots - map_size <= 8


@pytest.mark.parametrize(
    ("compact_slots", "permitted_rows", "expected"),
    [
        ("auto", 10, True),
        ("auto", 15, True),
        ("auto", 16, False),
        (False, 1, False),
        (True, 30, True),
    ],
)
def test_when_slots_are_compact(compact_slots, permitted_rows, expected):
    table = keras.Variable(np.zeros((30, 2), "float32"))
    mask = np.arange(30) < permitted_rows
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.Adam(), row_masks=[(table, mask)], compact_slots=compact_slots
    )
    optimizer.build([table])
    assert optimizer.has_compact_slots(table) is expected
    assert (optimizer.compact_slot_rows(table) is None) is not expected


def test_rules_without_slots_need_none():
    table = keras.Variable(np.zeros((30, 2), "float32"))
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.SGD(0.1), row_masks=[(table, np.arange(30) < 3)], compact_slots=True
    )
    optimizer.build([table])
    assert not optimizer.has_compact_slots(table)


@pytest.mark.parametrize(
    ("arguments", "pattern"),
    [
        ({"compact_slots": "yes"}, "compact_slots"),
        ({"compact_slots": 1.5}, "compact_slots"),
        ({"slot_capacity": 0}, "slot_capacity"),
        ({"slot_capacity": 2.5}, "slot_capacity"),
        ({"slot_capacity": True}, "slot_capacity"),
    ],
)
def test_bad_arguments_are_named(arguments, pattern):
    with pytest.raises(ValueError, match=pattern):
        pe.MaskedOptimizer(keras.optimizers.Adam(), **arguments)


def test_config_round_trip_and_size_independent_of_vocabulary():
    configs = []
    for vocab in (100, 100_000):
        layer = pe.PartialEmbedding(vocab, 4, trainable_ids=[1, 2, 3])
        model = keras.Sequential([keras.Input((2,), dtype="int32"), layer])
        optimizer = pe.MaskedOptimizer(
            keras.optimizers.Adam(name="adam"), slot_capacity=7, name="masked"
        )
        optimizer.build(model.trainable_variables)
        config = optimizer.get_config()
        configs.append(json.dumps(config))
        assert config["compact_slots"] == "auto"
        assert config["slot_capacity"] == 7
        assert config["compact_variable_indices"] == [0]
        clone = pe.MaskedOptimizer.from_config(config)
        assert clone.get_config()["compact_variable_indices"] == [0]
    assert len(configs[0]) == len(configs[1])


def _fresh_trained(rng, steps=3):
    table, permitted, x, y = _problem(rng)
    model, layer = _model(table, permitted)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05, amsgrad=True), slot_capacity=2)
    model.compile(optimizer=optimizer, loss="mse")
    for step in range(steps):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        model.train_on_batch(x[batch], y[batch])
    return model, layer, optimizer, (table, permitted, x, y)


def _continue(model, x, y):
    for step in range(3, 6):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        model.train_on_batch(x[batch], y[batch])
    return model.get_weights()


def _assert_same_optimizer_state(saved, restored):
    assert len(saved.variables) == len(restored.variables)
    assert len(saved.compact_slot_variables) == len(restored.compact_slot_variables) > 0
    pairs = [
        *zip(saved.variables, restored.variables),
        *zip(saved.compact_slot_variables, restored.compact_slot_variables),
    ]
    for mine, theirs in pairs:
        assert_bits_equal(np.asarray(theirs.numpy()), np.asarray(mine.numpy()), mine.name)


def test_keras_file_round_trip_keeps_compact_slots(rng, tmp_path):
    model, layer, optimizer, (_, _, x, y) = _fresh_trained(rng)
    assert optimizer.has_compact_slots(layer.embeddings)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert loaded.optimizer.has_compact_slots(loaded.layers[0].embeddings)
    _assert_same_optimizer_state(optimizer, loaded.optimizer)
    for mine, theirs in zip(_continue(model, x, y), _continue(loaded, x, y)):
        assert_bits_equal(theirs, mine, "weights after resuming")


def test_checkpoint_round_trip_keeps_compact_slots(rng, tmp_path):
    model, layer, optimizer, (table, permitted, x, y) = _fresh_trained(rng)
    prefix = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    restored_model, restored_layer = _model(table, permitted)
    restored = pe.MaskedOptimizer(keras.optimizers.Adam(0.05, amsgrad=True), slot_capacity=2)
    restored_model.compile(optimizer=restored, loss="mse")
    restored.build(restored_model.trainable_variables)
    status = tf.train.Checkpoint(model=restored_model, optimizer=restored).restore(prefix)
    status.assert_existing_objects_matched()
    _assert_same_optimizer_state(optimizer, restored)
    for mine, theirs in zip(_continue(model, x, y), _continue(restored_model, x, y)):
        assert_bits_equal(theirs, mine, "weights after resuming")


def test_saved_model_holds_compact_slots(rng, tmp_path):
    model, layer, optimizer, (table, permitted, x, y) = _fresh_trained(rng)
    root = tf.Module()
    root.model = model
    root.optimizer = optimizer
    tf.saved_model.save(root, str(tmp_path / "saved"))
    restored_model, _ = _model(table, permitted)
    restored = pe.MaskedOptimizer(keras.optimizers.Adam(0.05, amsgrad=True))
    restored_model.compile(optimizer=restored, loss="mse")
    restored.build(restored_model.trainable_variables)
    # The SavedModel's root has no save counter: everything else must match.
    tf.train.Checkpoint(model=restored_model, optimizer=restored).restore(
        str(tmp_path / "saved" / "variables" / "variables")
    ).expect_partial()
    _assert_same_optimizer_state(optimizer, restored)


@pytest.mark.parametrize("rule_name", ["adam_amsgrad_decay", "adamw_clipnorm"])
def test_composed_adam_on_compact_slots_matches_full_size(rule_name, rng, monkeypatch):
    """Where the fused kernel does not apply (a GPU), Adam runs as composed
    ops: compact slots give the same bits there too."""
    from partial_embedding.optimizers import _row_rules

    monkeypatch.setattr(_row_rules, "fused_kernel_applies", lambda *a: False)
    table, permitted, x, y = _problem(rng)
    _, full_layer, _ = _train(rule_name, False, table, permitted, x, y)
    _, layer, optimizer = _train(rule_name, True, table, permitted, x, y)
    assert optimizer.has_compact_slots(layer.embeddings)
    assert_bits_equal(layer.embeddings.numpy(), full_layer.embeddings.numpy(), "table")
