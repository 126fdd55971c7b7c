"""Tests of the fused per-id rules (ops.masked_sparse_apply_rule).

Every rule of the table but FTRL matches pe_testing.rule_reference_step bit
for bit: NumPy in float64 rounded to the variable's dtype after every
operation, in the kernel's order (exact; see round_to), in every dtype,
with full-size and compact slots. The wrapper's and the op's refusals of
bad input (checked through Adam's and AMSGrad's slots, whose names they
print) write nothing. MaskedOptimizer's Adam options: the fused step equals
the composed path (separate TF ops) bit for bit.
"""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding._internal.rule_table import RULES
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.ops import masked_sparse_apply_rule
from partial_embedding.optimizers import _row_rules as row_rules
from pe_testing import (
    INDEX_DTYPE_NAMES,
    VALUE_DTYPE_NAMES,
    VALUE_DTYPES,
    assert_bits_equal,
    base_seed,
    fused_slot_values,
    make_rng,
    masked_sparse_apply_adam,
    numpy_dtype,
    round_to,
    rule_hyperparameters,
    rule_reference_step,
    summed_rows,
)

# These test the fused CPU kernels: on a machine with a GPU too.
pytestmark = pytest.mark.usefixtures("on_cpu")


def _numpy_dtype(dtype: tf.DType) -> np.dtype:
    return np.dtype(dtype.as_numpy_dtype)


def _round(x: np.ndarray, dtype: tf.DType) -> np.ndarray:
    return round_to(x, dtype.name)


def _random_tables(rng, shape, dtype, amsgrad):
    var = _round(rng.normal(size=shape), dtype)
    m = _round(rng.normal(size=shape) * 0.1, dtype)
    v = _round(np.abs(rng.normal(size=shape)) * 0.01, dtype)
    v_hat = _round(np.abs(rng.normal(size=shape)) * 0.01, dtype) if amsgrad else None
    return var, m, v, v_hat


def _variables(tables, dtype):
    return [None if t is None else tf.Variable(t.astype(_numpy_dtype(dtype))) for t in tables]


HYPER = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, alpha=0.1)


# --- Every rule against the reference (pe_testing.rule_reference_step) ----------

#: Every rule of the table but FTRL, whose pow is the math library's, not
#: correctly rounded (test_fused_rules bounds it in every dtype and mode).
EXACT_RULES = tuple(rule for rule in RULES if rule != "ftrl")
_CASES = list(itertools.product(EXACT_RULES, VALUE_DTYPE_NAMES))


def _compact_copy(rng, tables, slot_of_row, num_slot_rows, dtype):
    """Slots of ``num_slot_rows`` rows: each mapped slot row a copy of the
    full-size row it stands for, every other slot row random."""
    compact = []
    for table in tables:
        slot = round_to(np.abs(rng.normal(size=(num_slot_rows, *table.shape[1:]))), dtype)
        for row, slot_row in slot_of_row.items():
            slot[slot_row] = table[row]
        compact.append(slot)
    return compact


def _run_rule(rule, var, slots, indices, grad, mask, tensors, mode="eager", slot_indices=None):
    def run():
        masked_sparse_apply_rule(
            rule, var, slots, indices, grad, mask, tensors, slot_indices=slot_indices
        )

    tf.function(run)() if mode == "function" else run()


def _assert_compact_slots(compact, expected, before, slot_of_row, what):
    """Each mapped slot row holds the full-size row it stands for; every
    other slot row is unchanged since ``before``."""
    rows = list(slot_of_row)
    slot_rows = [slot_of_row[r] for r in rows]
    for index, (variable, want, old) in enumerate(zip(compact, expected, before)):
        value = variable.numpy()
        assert_bits_equal(value[slot_rows], want[rows], f"{what} slot {index}")
        others = np.setdiff1d(np.arange(len(value)), slot_rows)
        assert_bits_equal(value[others], old[others], f"{what} untouched slot {index}")


@pytest.mark.parametrize("rule, dtype", _CASES)
def test_every_rule_matches_the_reference_bit_for_bit(rule, dtype):
    # Full-size and compact slots alike, eagerly and in tf.function, with
    # duplicates, absent and frozen rows (which the reference leaves as they
    # were: compared bit for bit with the rest). Index dtypes and weight
    # decay rotate over the cases.
    # Offset by the rule, so that every dtype meets each of them too.
    k, d = EXACT_RULES.index(rule), VALUE_DTYPE_NAMES.index(dtype)
    index_dtype = INDEX_DTYPE_NAMES[(d + k) % 2]
    decay = 0.1 if (d // 2 + k) % 2 else 0.0
    rng = make_rng("rule reference", rule, dtype)
    vocab, width, count = 13, int(rng.integers(1, 12)), 24
    var = round_to(rng.normal(size=(vocab, width)), dtype)
    slots = [
        round_to(s, dtype)
        for s in fused_slot_values(RULES[rule].slots, rng, vocab, width, np.float64)
    ]
    mask = rng.random(vocab) < 0.6
    batches = [rng.integers(0, vocab, count) for _ in range(3)]  # Duplicates.
    touched = list(dict.fromkeys(r for ids in batches for r in ids.tolist() if mask[r]))
    slot_of_row, num_slot_rows = _compact_slot_map(rng, touched, extra_rows=3)
    storage = numpy_dtype(dtype)
    full = [tf.Variable(t.astype(storage)) for t in (var, *slots)]
    compact_start = _compact_copy(rng, slots, slot_of_row, num_slot_rows, dtype)
    compact = [tf.Variable(var.astype(storage))] + [
        tf.Variable(t.astype(storage)) for t in compact_start
    ]
    for step, indices in enumerate(batches):
        grad = round_to(rng.normal(size=(count, width)), dtype)
        tensors, hyper = rule_hyperparameters(rng, rule, dtype, decay)
        mode = "function" if step == 1 else "eager"
        ids = tf.constant(indices, index_dtype)
        slot_indices = _slot_indices_for(rng, indices, mask, slot_of_row, num_slot_rows)
        before = [t.numpy() for t in compact[1:]]
        _run_rule(rule, full[0], full[1:], ids, grad.astype(storage), mask, tensors, mode)
        if slots:  # (SGD has none to compact)
            _run_rule(
                rule, compact[0], compact[1:], ids, grad.astype(storage), mask, tensors, mode,
                slot_indices=tf.constant(slot_indices, index_dtype),
            )  # fmt: skip
        rows, g = summed_rows(indices, grad, mask, dtype)
        var, slots = rule_reference_step(rule, var, slots, rows, g, hyper, dtype)
        for index, (variable, want) in enumerate(zip(full, (var, *slots))):
            assert_bits_equal(variable, want, f"step {step} table {index}")
        if slots:
            assert_bits_equal(compact[0], var, f"step {step} var, compact slots")
        _assert_compact_slots(compact[1:], slots, before, slot_of_row, f"step {step}")


@pytest.mark.parametrize("rule", ["amsgrad", "rowwise_adam", "rmsprop_centered_momentum"])
def test_large_input_uses_threads_and_stays_exact(rule):
    # Large enough for several shards; the result must not depend on them.
    # Compact slots with indices of rank 2 as well.
    rng = make_rng("large", rule)
    vocab, width, count = 3000, 64, 20000
    var = round_to(rng.normal(size=(vocab, width)), "float32")
    slots = list(fused_slot_values(RULES[rule].slots, rng, vocab, width, np.float32))
    mask = rng.random(vocab) < 0.5
    indices = rng.integers(0, vocab, count)
    grad = rng.normal(size=(count, width)).astype(np.float32)
    tensors, hyper = rule_hyperparameters(rng, rule, "float32", 0.01)
    touched = list(dict.fromkeys(r for r in indices.tolist() if mask[r]))
    slot_of_row, num_slot_rows = _compact_slot_map(rng, touched, extra_rows=50)
    slot_indices = _slot_indices_for(rng, indices, mask, slot_of_row, num_slot_rows)
    full = [tf.Variable(t.astype(np.float32)) for t in (var, *slots)]
    compact = [tf.Variable(var.astype(np.float32))] + [
        tf.Variable(t.astype(np.float32))
        for t in _compact_copy(rng, slots, slot_of_row, num_slot_rows, "float32")
    ]
    before = [t.numpy() for t in compact[1:]]
    _run_rule(rule, full[0], full[1:], indices, grad, mask, tensors)
    _run_rule(
        rule, compact[0], compact[1:], indices.reshape(100, 200), grad.reshape(100, 200, width),
        mask, tensors, slot_indices=slot_indices.reshape(100, 200),
    )  # fmt: skip
    rows, g = summed_rows(indices, grad, mask, "float32")
    var, slots = rule_reference_step(rule, var, slots, rows, g, hyper, "float32")
    for index, (variable, want) in enumerate(zip(full, (var, *slots))):
        assert_bits_equal(variable, want, f"table {index}")
    assert_bits_equal(compact[0], var, "var, compact slots")
    _assert_compact_slots(compact[1:], slots, before, slot_of_row, "large")


@pytest.mark.parametrize("rule", ["adam", "rowwise_adagrad"])
def test_compact_slot_table_of_one_row(rule):
    rng = make_rng("compact one row", rule)
    var = rng.normal(size=(4, 3))
    slots = list(fused_slot_values(RULES[rule].slots, rng, 4, 3, np.float64))
    compact_start = _compact_copy(rng, slots, {2: 0}, 1, "float64")
    compact = [tf.Variable(var)] + [tf.Variable(t) for t in compact_start]
    mask = np.array([False, False, True, False])
    indices, grad = np.array([2, 0, 2, 3]), rng.normal(size=(4, 3))
    tensors, hyper = rule_hyperparameters(rng, rule, "float64", 0.0)
    _run_rule(rule, compact[0], compact[1:], indices, grad, mask, tensors, slot_indices=[0] * 4)
    rows, g = summed_rows(indices, grad, mask, "float64")
    var, slots = rule_reference_step(rule, var, slots, rows, g, hyper, "float64")
    assert_bits_equal(compact[0], var, "var")
    _assert_compact_slots(compact[1:], slots, compact_start, {2: 0}, "one row")


def test_snapshot_taken_before_the_step_keeps_its_values():
    rng = make_rng("snapshot")
    tables = _random_tables(rng, (6, 3), tf.float32, amsgrad=False)
    variables = _variables(tables, tf.float32)
    snapshot = variables[0].read_value()
    before = snapshot.numpy().copy()
    masked_sparse_apply_adam(
        *variables[:3], [0, 5], np.ones((2, 3), np.float32), np.ones(6, bool), **HYPER
    )
    np.testing.assert_array_equal(snapshot.numpy(), before)
    assert not np.array_equal(variables[0].numpy(), before)


def test_changing_hyperparameters_do_not_retrace():
    rng = make_rng("retrace")
    variables = _variables(_random_tables(rng, (6, 3), tf.float32, amsgrad=False), tf.float32)
    var, m, v, _ = variables

    @tf.function
    def step(learning_rate, alpha):
        masked_sparse_apply_adam(
            var, m, v, [1, 2], tf.ones([2, 3]), tf.ones([6], tf.bool),
            learning_rate=learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
            alpha=alpha, weight_decay=0.01,
        )  # fmt: skip

    for value in (0.1, 0.2, 0.3):
        step(tf.constant(value), tf.constant(value / 2))
    assert step.experimental_get_tracing_count() == 1


def test_compat_v1_graph_mode_returns_the_op():
    with tf.Graph().as_default():
        var, m, v = (
            tf.compat.v1.get_variable(
                name, initializer=np.ones((4, 2), np.float32), use_resource=True
            )
            for name in ("var", "m", "v")
        )
        op = masked_sparse_apply_adam(
            var, m, v, [1], np.ones((1, 2), np.float32), np.ones(4, bool),
            learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, alpha=0.1,
        )  # fmt: skip
        assert isinstance(op, tf.Operation)
        with tf.compat.v1.Session() as session:
            session.run([var.initializer, m.initializer, v.initializer])
            session.run(op)
            result = session.run(var)
    assert result[1, 0] < 1.0 and result[0, 0] == 1.0


# --- Bad input: a clear error, every variable unchanged -------------------------


def _bad_input_setup():
    rng = make_rng("bad")
    tables = _random_tables(rng, (10, 3), tf.float32, amsgrad=True)
    return tables, _variables(tables, tf.float32)


def _assert_unchanged(variables, tables):
    for name, variable, before in zip(("var", "m", "v", "v_hat"), variables, tables):
        assert_bits_equal(variable.numpy(), before, name)


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize(
    "indices, message",
    [
        ([1, 2, 10], r"indices\[2\] = 10 is not in \[0, 10\); nothing was written"),
        ([-1, 2, 3], r"indices\[0\] = -1 is not in \[0, 10\)"),
    ],
)
def test_out_of_range_index_writes_nothing(indices, message, use_function):
    tables, variables = _bad_input_setup()
    var, m, v, v_hat = variables

    def run():
        masked_sparse_apply_adam(
            var, m, v, indices, np.ones((3, 3), np.float32), np.ones(10, bool),
            v_hat=v_hat, **HYPER,
        )  # fmt: skip

    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tf.function(run)() if use_function else run()
    _assert_unchanged(variables, tables)


_SHAPE_ERROR = PartialEmbeddingArgumentError
# The compact-slot rule, as cc/core/row_update_contract.h words it.
_SLOT_RULE = r" must be \[S\] \+ var.shape\[1:\] with one S >= 1 for all slots"
_TYPE_ERROR = PartialEmbeddingTypeError


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(grad=np.ones((3, 4), np.float32)), _SHAPE_ERROR, r"grad: shape \[3,4\] must be"),
        (dict(row_mask=np.ones(9, bool)), _SHAPE_ERROR, r"row_mask: shape \[9\] must be \[10\]"),
        (dict(grad=np.ones((3, 3), np.float64)), _TYPE_ERROR, "grad: dtype float64 does not"),
        (dict(indices=np.array([1.0, 2.0, 3.0])), _TYPE_ERROR, "indices: dtype float64"),
        (dict(row_mask=np.ones(10, np.int32)), _TYPE_ERROR, "row_mask: dtype int32 must be"),
        (dict(alpha=np.ones(2, np.float32)), _SHAPE_ERROR, r"alpha: shape \[2\] must be a scalar"),
    ],
)
def test_wrong_static_inputs_are_rejected_before_running(arguments, error, message):
    tables, variables = _bad_input_setup()
    var, m, v, v_hat = variables
    call = dict(
        indices=np.array([1, 2, 3]), grad=np.ones((3, 3), np.float32), row_mask=np.ones(10, bool)
    )
    call.update(arguments)
    hyper = dict(HYPER)
    if "alpha" in call:
        hyper["alpha"] = call.pop("alpha")
    with pytest.raises(error, match=message):
        masked_sparse_apply_adam(var, m, v, v_hat=v_hat, **call, **hyper)
    _assert_unchanged(variables, tables)


def test_wrong_shapes_at_run_time_write_nothing():
    tables, variables = _bad_input_setup()
    var, m, v, v_hat = variables

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.bool)])
    def run(grad, row_mask):
        masked_sparse_apply_adam(var, m, v, [1, 2, 3], grad, row_mask, v_hat=v_hat, **HYPER)

    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"grad: shape \[3,4\] must be \[3,3\]"
    ):
        run(np.ones((3, 4), np.float32), np.ones(10, bool))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"row_mask: shape \[9\] must be \[10\]"
    ):
        run(np.ones((3, 3), np.float32), np.ones(9, bool))
    _assert_unchanged(variables, tables)


def test_slot_of_another_shape_or_dtype_is_rejected():
    tables, variables = _bad_input_setup()
    var, m, v, v_hat = variables
    with pytest.raises(
        PartialEmbeddingArgumentError, match=r"velocity: shape \[10,4\] does not match"
    ):
        masked_sparse_apply_adam(
            var, m, tf.Variable(tf.zeros([10, 4])), [1], np.ones((1, 3), np.float32),
            np.ones(10, bool), **HYPER,
        )  # fmt: skip
    with pytest.raises(PartialEmbeddingTypeError, match="m: dtype float64 does not match"):
        masked_sparse_apply_adam(
            var, tf.Variable(tf.zeros([10, 3], tf.float64)), v, [1],
            np.ones((1, 3), np.float32), np.ones(10, bool), **HYPER,
        )  # fmt: skip
    _assert_unchanged(variables, tables)


def test_the_same_variable_twice_is_rejected():
    tables, variables = _bad_input_setup()
    var, m, v, v_hat = variables
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="momentum and velocity are the same variable"
    ):
        masked_sparse_apply_adam(
            var, m, m, [1], np.ones((1, 3), np.float32), np.ones(10, bool), **HYPER
        )
    _assert_unchanged(variables, tables)


def test_uninitialized_variable_is_reported():
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("var", shape=[4, 2], use_resource=True)
        m = tf.compat.v1.get_variable(
            "m", initializer=np.zeros((4, 2), np.float32), use_resource=True
        )
        v = tf.compat.v1.get_variable(
            "v", initializer=np.zeros((4, 2), np.float32), use_resource=True
        )
        op = masked_sparse_apply_adam(
            var, m, v, [1], np.ones((1, 2), np.float32), np.ones(4, bool), **HYPER
        )
        with tf.compat.v1.Session() as session:
            session.run([m.initializer, v.initializer])
            with pytest.raises(
                (tf.errors.FailedPreconditionError, tf.errors.NotFoundError),
                match="var: the variable is not initialized",
            ):
                session.run(op)
            np.testing.assert_array_equal(session.run(m), np.zeros((4, 2)))


# --- MaskedOptimizer: fused path == composed path, bit for bit -----------------

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.02),
    "amsgrad": lambda: keras.optimizers.Adam(0.02, amsgrad=True),
    "adamw": lambda: keras.optimizers.AdamW(0.02, weight_decay=0.2),
    "adam_weight_decay_schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5), weight_decay=0.3
    ),
    "adam_clipnorm": lambda: keras.optimizers.Adam(0.02, clipnorm=0.3),
    "adam_loss_scale_factor": lambda: keras.optimizers.Adam(0.02, loss_scale_factor=4.0),
}


def _train(make_optimizer, dtype, table, mask, batches, fused, monkeypatch):
    with monkeypatch.context() as patch:
        calls = []
        real = row_rules.masked_sparse_apply_rule
        patch.setattr(
            row_rules,
            "masked_sparse_apply_rule",
            lambda *a, **k: calls.append(1) or real(*a, **k),
        )
        if not fused:
            patch.setattr(row_rules, "fused_kernel_applies", lambda *a: False)
        variable = keras.Variable(table.astype(_numpy_dtype(dtype)), dtype=dtype.name)
        # Full-size slots, read below (compact ones: test_compact_slots.py).
        optimizer = pe.MaskedOptimizer(
            make_optimizer(), row_masks=[(variable, mask)], compact_slots=False
        )
        optimizer.build([variable])
        for indices, values in batches:
            gradient = tf.IndexedSlices(
                tf.constant(values.astype(_numpy_dtype(dtype))),
                tf.constant(indices),
                tf.constant(table.shape),
            )
            optimizer.apply([gradient], [variable])
        assert bool(calls) == fused
        rule = optimizer.base_optimizer
        slots = [rule._momentums[0], rule._velocities[0]]
        if rule.amsgrad:
            slots.append(rule._velocity_hats[0])
        return [np.asarray(x.numpy()) for x in [variable, *slots]]


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_fused_optimizer_step_equals_the_composed_path(optimizer_name, dtype, monkeypatch):
    rng = make_rng("composed", optimizer_name, dtype.name)
    vocab, width = 16, 3
    table = rng.normal(size=(vocab, width))
    mask = rng.random(vocab) < 0.6
    batches = [
        (rng.integers(0, vocab, 20).astype(np.int32), rng.normal(size=(20, width)))
        for _ in range(4)
    ]
    make = OPTIMIZERS[optimizer_name]
    fused = _train(make, dtype, table, mask, batches, True, monkeypatch)
    composed = _train(make, dtype, table, mask, batches, False, monkeypatch)
    names = ("var", "m", "v", "v_hat")
    rtol = 1e-2 if dtype in (tf.float16, tf.bfloat16) else 1e-5
    for name, a, b in zip(names, fused, composed):
        if "amsgrad" in optimizer_name:
            # The composed path writes v_hat as old - (old - max), which may
            # be off from max in the last bit; the kernel stores max itself.
            np.testing.assert_allclose(
                a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=1e-6,
                err_msg=f"{name} (base seed {base_seed()})",
            )  # fmt: skip
        else:
            assert_bits_equal(a, b, name)
    frozen = ~mask
    for name, a in zip(names, fused):
        # Never written: the bits the variable was made with (float64 cast
        # straight to the dtype, as _train does; _round's float32 step would
        # round twice, one ulp off on some draws).
        initial = table if name == "var" else np.zeros_like(table)
        assert_bits_equal(a[frozen], initial.astype(_numpy_dtype(dtype))[frozen], f"frozen {name}")


# --- Compact slots (slot_indices) ---------------------------------------------


def _compact_slot_map(rng, permitted_rows, extra_rows):
    """A random injective slot row for each of `permitted_rows` among
    len(permitted_rows) + extra_rows + 1 slot rows; the last is the scratch
    row that frozen occurrences name. Returns ({row: slot row}, S)."""
    num_slot_rows = len(permitted_rows) + extra_rows + 1
    chosen = rng.permutation(num_slot_rows - 1)[: len(permitted_rows)]
    return dict(zip(permitted_rows, chosen.tolist())), num_slot_rows


def _slot_indices_for(rng, indices, mask, slot_of_row, num_slot_rows):
    """Each permitted occurrence's slot row; frozen occurrences name the
    scratch row or any slot row (only their range is checked)."""
    frozen_choice = np.where(
        rng.random(len(indices)) < 0.5,
        num_slot_rows - 1,
        rng.integers(0, num_slot_rows, len(indices)),
    )
    return np.array(
        [slot_of_row[r] if mask[r] else s for r, s in zip(indices.tolist(), frozen_choice)]
    )


# --- Compact slots: bad input, a clear error, nothing written -------------------


def _compact_setup(num_slot_rows=10, slot_shape=None):
    """var [12, 3] (rows 10 and 11 frozen), compact slots of S rows."""
    rng = make_rng("compact bad")
    var = _round(rng.normal(size=(12, 3)), tf.float32)
    shape = slot_shape or (num_slot_rows, 3)
    tables = [var] + [_round(np.abs(rng.normal(size=shape)), tf.float32) for _ in range(3)]
    mask = np.arange(12) < 10
    return tables, _variables(tables, tf.float32), mask


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize(
    "indices, slot_indices, message",
    [
        ([1, 2, 3, 4], [0, 1, 2, 10], r"slot_indices\[3\] = 10 is not in \[0, 10\); nothing was"),
        ([1, 2, 3, 4], [0, -1, 2, 3], r"slot_indices\[1\] = -1 is not in \[0, 10\)"),
        ([1, 11, 3], [0, 12, 2], r"slot_indices\[1\] = 12 is not in \[0, 10\)"),  # frozen row
        ([1, 12, 3], [0, 12, 2], r"(?<!slot_)indices\[1\] = 12 is not in \[0, 12\)"),  # rows first
        (
            [5, 2, 5, 5],
            [4, 1, 4, 7],
            r"slot_indices: row 5 has slot row 4 at slot_indices\[0\] and slot row 7 at "
            r"slot_indices\[3\]; every occurrence of a row must name the same slot row; "
            "nothing was written",
        ),
        (
            [[5, 2], [6, 2]],
            [[4, 1], [1, 1]],
            r"slot_indices: rows 2 \(indices\[0, 1\]\) and 6 \(indices\[1, 0\]\) both have "
            "slot row 1; two permitted rows cannot share a slot row; nothing was written",
        ),
    ],
)
def test_bad_slot_indices_write_nothing(indices, slot_indices, message, use_function):
    tables, variables, mask = _compact_setup()
    var, m, v, v_hat = variables
    grad = np.ones((*np.shape(indices), 3), np.float32)

    def run():
        masked_sparse_apply_adam(
            var, m, v, indices, grad, mask, v_hat=v_hat, slot_indices=slot_indices, **HYPER
        )

    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tf.function(run)() if use_function else run()
    _assert_unchanged(variables, tables)


def test_frozen_rows_slot_indices_are_only_range_checked():
    tables, variables, mask = _compact_setup()
    var, m, v, v_hat = variables
    # Row 10 (frozen) names two slot rows; rows 10 and 11 (frozen) share
    # slot row 4 with permitted row 3.
    masked_sparse_apply_adam(
        var, m, v, [10, 3, 11, 10], np.ones((4, 3), np.float32), mask, v_hat=v_hat,
        slot_indices=[4, 4, 4, 9], **HYPER,
    )  # fmt: skip
    for name, variable, before in zip(("var", "m", "v"), variables, tables):
        changed = np.flatnonzero(np.any(variable.numpy() != before, axis=1)).tolist()
        assert changed == ([3] if name == "var" else [4]), name
    # AMSGrad's v_hat row is max(v_hat, new v): it keeps its value wherever the
    # old maximum is still the larger (the inputs decide which, so the test
    # checks the maximum itself, not that the row moved).
    expected_v_hat = tables[3].copy()
    expected_v_hat[4] = np.maximum(tables[3][4], v.numpy()[4])
    np.testing.assert_array_equal(v_hat.numpy(), expected_v_hat)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (
            dict(slot_indices=np.array([0, 1, 2], np.int64)),
            _TYPE_ERROR,
            "slot_indices: dtype int64 does not match indices' dtype int32",
        ),
        (
            dict(slot_indices=np.array([0.0, 1.0, 2.0])),
            _TYPE_ERROR,
            "slot_indices: dtype float64 is not an index type",
        ),
        (
            dict(slot_indices=[0, 1]),
            _SHAPE_ERROR,
            r"slot_indices: shape \[2\] does not match indices' shape \[3\]",
        ),
        (
            dict(v=(8, 3)),
            _SHAPE_ERROR,
            r"velocity: shape \[8,3\]" + _SLOT_RULE + r" \(var: \[\d+,3\], momentum: \[10,3\]\)",
        ),
        (
            dict(v_hat=(10, 4)),
            _SHAPE_ERROR,
            r"velocity_hat: shape \[10,4\]" + _SLOT_RULE,
        ),
        (
            dict(m=(0, 3)),
            _SHAPE_ERROR,
            r"momentum: shape \[0,3\]" + _SLOT_RULE,
        ),
    ],
)
def test_wrong_static_slot_arguments_are_rejected_before_running(arguments, error, message):
    tables, variables, mask = _compact_setup()
    call = dict(zip(("var", "m", "v", "v_hat"), variables))
    slot_indices = arguments.pop("slot_indices", [0, 1, 2])
    for name, shape in arguments.items():
        call[name] = tf.Variable(tf.zeros(shape))
    with pytest.raises(error, match=message):
        masked_sparse_apply_adam(
            indices=[1, 2, 3], grad=np.ones((3, 3), np.float32), row_mask=mask,
            slot_indices=slot_indices, **call, **HYPER,
        )  # fmt: skip
    _assert_unchanged(variables, tables)


def _raw_compact_op(variables, indices, slot_indices, mask, grad):
    """The op itself, bypassing the wrapper's static checks."""
    from partial_embedding._loader import load_ops

    var, m, v, v_hat = variables
    # learning_rate, weight_decay, 1 - beta_1, 1 - beta_2, epsilon, alpha.
    hyperparameters = tf.constant([0.1, 0.0, 0.1, 0.001, 1e-7, 0.1], tf.float32)
    return load_ops().partial_embedding_masked_sparse_apply_rule_with_slot_indices(
        var=var.handle, slots=[m.handle, v.handle, v_hat.handle], indices=indices,
        slot_indices=slot_indices, grad=grad, row_mask=mask,
        hyperparameters=hyperparameters, rule="amsgrad",
    )  # fmt: skip


@pytest.mark.parametrize("use_function", [False, True], ids=["kernel", "shape_function"])
@pytest.mark.parametrize(
    "slots, slot_indices, message",
    [
        (
            {"v": (8, 3)},
            [0, 1, 2],
            r"velocity: shape \[8,3\]" + _SLOT_RULE,
        ),
        (
            {"v_hat": (10, 2)},
            [0, 1, 2],
            r"velocity_hat: shape \[10,2\]" + _SLOT_RULE,
        ),
        (
            {"m": (0, 3), "v": (0, 3), "v_hat": (0, 3)},
            [0, 1, 2],
            r"momentum: shape \[0,3\]" + _SLOT_RULE,
        ),
        ({}, [0, 1], r"slot_indices: shape \[2\] does not match indices' shape \[3\]"),
    ],
)
def test_wrong_slot_shapes_in_the_op_write_nothing(slots, slot_indices, message, use_function):
    # Eagerly the kernel checks (no shape function runs); in a graph, the
    # shape function already knows the variables' shapes.
    tables, variables, mask = _compact_setup()
    for name, shape in slots.items():
        index = ("var", "m", "v", "v_hat").index(name)
        tables[index] = np.zeros(shape, np.float32)
        variables[index] = tf.Variable(tables[index])

    def run():
        _raw_compact_op(
            variables, tf.constant([1, 2, 3]), tf.constant(slot_indices), mask,
            tf.ones([3, 3]),
        )  # fmt: skip

    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        tf.function(run)() if use_function else run()
    _assert_unchanged(variables, tables)


def test_wrong_slot_indices_shape_at_run_time_writes_nothing():
    tables, variables, mask = _compact_setup()
    var, m, v, v_hat = variables

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int32)])
    def run(slot_indices):
        masked_sparse_apply_adam(
            var, m, v, [1, 2, 3], tf.ones([3, 3]), mask, v_hat=v_hat,
            slot_indices=slot_indices, **HYPER,
        )  # fmt: skip

    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"slot_indices: shape \[3,1\] does not match indices' shape \[3\]",
    ):
        run(tf.constant([[0], [1], [2]]))
    _assert_unchanged(variables, tables)
    run(tf.constant([0, 1, 2]))
    assert not np.array_equal(var.numpy(), tables[0])
