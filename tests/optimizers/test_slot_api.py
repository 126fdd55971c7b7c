"""MaskedOptimizer's public slot API: slot_names, slot_variable, slot_rows,
slot_rows_present and assign_slot_rows, on compact and full-size slots,
against the slot variables read directly; bad input refused before any
write; compact_variable_indices range-checked."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding._internal import framework_private

NUM_ROWS, WIDTH = 12, 3
PERMITTED = (1, 4, 7)


@pytest.mark.parametrize(
    "optimizer, names",
    [
        (lambda: keras.optimizers.SGD(), []),
        (lambda: keras.optimizers.SGD(momentum=0.9), ["momentum"]),
        (lambda: keras.optimizers.Adam(), ["momentum", "velocity"]),
        (lambda: keras.optimizers.Adam(amsgrad=True), ["momentum", "velocity", "velocity_hat"]),
        (lambda: keras.optimizers.AdamW(), ["momentum", "velocity"]),
        (lambda: keras.optimizers.Adagrad(), ["accumulator"]),
        (lambda: keras.optimizers.RMSprop(), ["velocity"]),
        (
            lambda: keras.optimizers.RMSprop(momentum=0.5, centered=True),
            ["velocity", "momentum", "average_gradient"],
        ),
        (
            lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
            ["momentum", "velocity"],
        ),
    ],
)
def test_slot_names_of_every_rule(optimizer, names):
    assert pe.MaskedOptimizer(optimizer()).slot_names() == names


def _trained(compact: bool, optimizer=None, steps: int = 3):
    """A masked table trained a few steps on rows 1 and 4 (7 is permitted
    but never in a batch), with a plain variable beside it."""
    rng = np.random.default_rng(7)
    table = keras.Variable(rng.standard_normal((NUM_ROWS, WIDTH)).astype("float32"))
    bias = keras.Variable(np.zeros(WIDTH, "float32"))
    mask = np.zeros(NUM_ROWS, bool)
    mask[list(PERMITTED)] = True
    mask_variable = keras.Variable(mask, trainable=False)
    optimizer = pe.MaskedOptimizer(
        optimizer or keras.optimizers.Adam(0.1),
        row_masks=[(table, mask_variable)],
        compact_slots=compact,
    )
    for _ in range(steps):
        values = rng.standard_normal((4, WIDTH)).astype("float32")
        grad = tf.IndexedSlices(
            tf.constant(values), tf.constant([1, 4, 1, 0]), tf.constant([NUM_ROWS, WIDTH])
        )
        optimizer.apply([grad, tf.ones([WIDTH])], [table, bias])
    assert optimizer.has_compact_slots(table) == compact
    return optimizer, table, bias


def _direct_rows(optimizer, table, name, ids):
    """The slot's rows read from its variables, without the slot API."""
    if not optimizer.has_compact_slots(table):
        slot = framework_private.slot(optimizer.base_optimizer, name, table)
        return slot.numpy()[ids]
    slot_of_row, _, *slots = optimizer.compact_slot_variables
    slot = slots[optimizer.slot_names().index(name)].numpy()
    initial = 0.0
    rows = np.full((len(ids), WIDTH), initial, np.float32)
    for position, row in enumerate(ids):
        if slot_of_row.numpy()[row] >= 0:
            rows[position] = slot[int(slot_of_row.numpy()[row])]
    return rows


@pytest.mark.parametrize("compact", [True, False])
def test_slot_rows_match_the_slot_variables(compact):
    optimizer, table, bias = _trained(compact)
    ids = np.array([4, 0, 7, 1, 4, 11])
    for name in optimizer.slot_names():
        got = optimizer.slot_rows(table, name, ids)
        assert got.dtype == np.float32 and got.shape == (len(ids), WIDTH)
        np.testing.assert_array_equal(got, _direct_rows(optimizer, table, name, ids))
        # Trained rows have moved off the initial value; the others hold it.
        assert np.all(got[[0, 3, 4]] != 0.0)
        np.testing.assert_array_equal(got[[1, 2, 5]], np.zeros((3, WIDTH), np.float32))
    present = optimizer.slot_rows_present(table, ids)
    expected = [True, False, False, True, True, False] if compact else [True] * 6
    assert present.tolist() == expected
    # A variable without a mask: Keras' own slots.
    np.testing.assert_array_equal(
        optimizer.slot_rows(bias, "momentum", [0, 2]),
        framework_private.slot(optimizer.base_optimizer, "momentum", bias).numpy()[[0, 2]],
    )


def test_slot_variable_is_the_stored_slot():
    compact, table, _ = _trained(True)
    stored = compact.slot_variable(table, "velocity")
    assert stored is compact.compact_slot_variables[3]
    assert stored.numpy().shape[0] == len(PERMITTED)  # room for the rows permitted at build
    full, full_table, _ = _trained(False)
    stored = full.slot_variable(full_table, "velocity")
    assert stored is framework_private.slot(full.base_optimizer, "velocity", full_table)
    assert tuple(stored.shape) == (NUM_ROWS, WIDTH)


@pytest.mark.parametrize("compact", [True, False])
def test_assign_slot_rows_writes_those_rows_only(compact):
    optimizer, table, _ = _trained(compact)
    before = {n: optimizer.slot_rows(table, n, np.arange(NUM_ROWS)) for n in optimizer.slot_names()}
    ids = np.array([7, 1])
    values = np.array([[1.5, -2.0, 3.25], [0.5, 0.25, -0.125]], np.float32)
    optimizer.assign_slot_rows(table, "velocity", ids, values)
    after = optimizer.slot_rows(table, "velocity", np.arange(NUM_ROWS))
    np.testing.assert_array_equal(after[ids], values)
    others = np.setdiff1d(np.arange(NUM_ROWS), ids)
    np.testing.assert_array_equal(after[others], before["velocity"][others])
    np.testing.assert_array_equal(
        optimizer.slot_rows(table, "momentum", np.arange(NUM_ROWS)), before["momentum"]
    )
    assert optimizer.slot_rows_present(table, [7]).tolist() == [True]
    if compact:
        assert optimizer.compact_slot_rows(table) == 3
    # A row not present keeps no slot row (compact) and reads as the initial value.
    optimizer.assign_slot_rows(table, "velocity", [10], [[9.0, 9.0, 9.0]], present=[False])
    if compact:
        assert optimizer.slot_rows_present(table, [10]).tolist() == [False]
        np.testing.assert_array_equal(optimizer.slot_rows(table, "velocity", [10]), [[0, 0, 0]])


def test_bad_requests_are_refused_before_any_write():
    optimizer, table, _ = _trained(True)
    snapshot = [v.numpy().copy() for v in optimizer.compact_slot_variables]
    foreign = keras.Variable(np.zeros((NUM_ROWS, WIDTH), "float32"))
    error = pe.PartialEmbeddingArgumentError
    with pytest.raises(error, match="name: 'moment' is not a slot of Adam"):
        optimizer.slot_rows(table, "moment", [1])
    with pytest.raises(error, match="has no slots for"):
        optimizer.slot_rows(foreign, "momentum", [1])
    with pytest.raises(error, match="has no slots for"):
        optimizer.slot_variable(foreign, "momentum")
    with pytest.raises(error, match=r"ids\[1\] = 12 is not in \[0, 12\)"):
        optimizer.slot_rows(table, "momentum", [1, 12])
    with pytest.raises(error, match=r"ids\[0\] = -1 is not in \[0, 12\)"):
        optimizer.assign_slot_rows(table, "momentum", [-1], [[0.0] * WIDTH])
    with pytest.raises(error, match="1-D integer"):
        optimizer.slot_rows_present(table, [[1]])
    with pytest.raises(error, match="repeat"):
        optimizer.assign_slot_rows(table, "momentum", [1, 1], np.zeros((2, WIDTH)))
    with pytest.raises(error, match=r"values: shape \(1, 2\) must be \(1, 3\)"):
        optimizer.assign_slot_rows(table, "momentum", [7], np.ones((1, 2)))
    with pytest.raises(error, match=r"present: shape \(2,\) must be \(1,\)"):
        optimizer.assign_slot_rows(table, "momentum", [7], np.ones((1, 3)), present=[True, True])
    for variable, saved in zip(optimizer.compact_slot_variables, snapshot, strict=True):
        np.testing.assert_array_equal(variable.numpy(), saved)
    unbuilt = pe.MaskedOptimizer(keras.optimizers.Adam())
    with pytest.raises(error, match="not built"):
        unbuilt.slot_variable(table, "momentum")
    with pytest.raises(error, match="not built"):
        unbuilt.slot_rows(table, "momentum", [0])


def _masked_table():
    table = keras.Variable(np.zeros((NUM_ROWS, WIDTH), "float32"))
    mask = keras.Variable(np.arange(NUM_ROWS) < 2, trainable=False)
    return table, mask


@pytest.mark.parametrize("indices", [[99], [1], [0, 5]])
def test_compact_variable_indices_out_of_range_are_refused_at_build(indices):
    table, mask = _masked_table()
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.Adam(), row_masks=[(table, mask)], compact_variable_indices=indices
    )
    bad = next(i for i in indices if i != 0)
    message = f"compact_variable_indices: {bad} is not in [0, 1)"
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=re.escape(message)):
        optimizer.build([table])
    assert not optimizer.built
    assert optimizer.compact_slot_variables == []
    assert not optimizer.inner_optimizer.built


@pytest.mark.parametrize("indices", [[-1], [0, -3], ["0"], [True], [0.5]])
def test_negative_or_non_int_compact_variable_indices_are_refused(indices):
    config = pe.MaskedOptimizer(keras.optimizers.Adam()).get_config()
    config["compact_variable_indices"] = indices
    with pytest.raises(
        pe.PartialEmbeddingArgumentError, match=r"compact_variable_indices: expected .*got"
    ):
        pe.MaskedOptimizer.from_config(config)


@pytest.mark.parametrize("indices", [5, 0.5, "01", b"0"])
def test_compact_variable_indices_that_are_not_a_list_are_refused_naming_the_value(indices):
    config = pe.MaskedOptimizer(keras.optimizers.Adam()).get_config()
    config["compact_variable_indices"] = indices
    message = f"compact_variable_indices: expected None or a list of ints >= 0 .*got {indices!r}"
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=message):
        pe.MaskedOptimizer.from_config(config)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=message):
        pe.MaskedOptimizer(keras.optimizers.Adam(), compact_variable_indices=indices)


def test_valid_compact_variable_indices_still_load():
    table, mask = _masked_table()
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.Adam(), row_masks=[(table, mask)], compact_variable_indices=[0]
    )
    optimizer.build([table])
    assert optimizer.has_compact_slots(table)
