"""keras.optimizers.Ftrl inside MaskedOptimizer: the rule table's fused "ftrl".

- Against a float64 NumPy reference of Keras' ``Ftrl.update_step`` applied
  lazily (only the rows of the batch), with a running bound on the rounding
  (``pe_testing.ftrl_reference``): sparse and dense gradients, every dtype,
  int32 and int64 ids, full-size and compact slots, eagerly, in a
  ``tf.function`` and under XLA (its custom call); var, accumulator and
  linear alike.
- Frozen rows and their slot rows stay bit for bit; permitted rows the
  batches never touch too (lazy).
- Against the stock ``keras.optimizers.Ftrl`` on a plain variable (dense
  gradient, every row permitted): bit for bit where pow is exact
  (``learning_rate_power=0``), else within both computations' bounds.
- ``initial_accumulator_value`` is honoured; bad arguments to the op are
  named and nothing is written.
"""

from __future__ import annotations

import itertools
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding._internal.rule_table import RULES
from pe_testing import (
    FTRL_OPTIONS,
    Bounded,
    assert_bits_equal,
    assert_within_bound,
    ftrl_reference,
    fused_hyperparameters,
    fused_slot_values,
    make_rng,
    numpy_dtype,
    spy_on_the_fused_rule,
)

DTYPES = ("float16", "bfloat16", "float32", "float64")
MODES = ("eager", "function", "xla")
STEPS = 3

#: Ftrl's options, by case. Every exponent (-learning_rate_power) is exact in
#: every dtype, as the reference's bound assumes.
CONFIGS: dict[str, dict[str, Any]] = {
    # Every hyperparameter non-zero, weight decay too.
    "all": dict(FTRL_OPTIONS, weight_decay=0.05),
    "defaults": dict(learning_rate=0.1),
    # l1 large enough that many coordinates clip to exactly zero.
    "strong_l1": dict(learning_rate=0.2, l1_regularization_strength=0.5, beta=0.5),
    # A fixed learning rate (p(a) = 1) and beta: quadratic = 1 / lr + beta / lr.
    "fixed_rate": dict(learning_rate=0.05, learning_rate_power=0.0, beta=1.0),
    # Square root, the accumulator starting at zero.
    "half_power_from_zero": dict(
        learning_rate=0.3,
        learning_rate_power=-0.5,
        initial_accumulator_value=0.0,
        l2_regularization_strength=0.1,
        l2_shrinkage_regularization_strength=0.05,
    ),
}


def _ftrl(config: str) -> keras.optimizers.Ftrl:
    return keras.optimizers.Ftrl(**CONFIGS[config])


def _batches(
    rng: np.random.Generator, rows: int, width: int, dtype: str, dense: bool, touched: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, gradient rows) a step. Sparse: ids from ``touched`` with
    duplicates; dense: every row once. Values exact in ``dtype``, magnitudes
    in [0.25, 2) (no element of a summed gradient is zero, so the
    accumulator of ``half_power_from_zero`` never stays at 0, where Keras'
    own rule divides 0 by 0)."""
    batches = []
    for _ in range(STEPS):
        if dense:
            ids = np.arange(rows)
        else:
            ids = rng.choice(touched, size=int(rng.integers(3, 10)))
            ids[-1] = ids[0]
        signs = rng.choice([-1.0, 1.0], size=width)
        values = (rng.uniform(0.25, 2.0, size=(ids.size, width)) * signs).astype(numpy_dtype(dtype))
        batches.append((ids, values))
    return batches


def _train(config, dtype, table, mask, batches, index_dtype, compact, mode, dense):
    variable = keras.Variable(table, dtype=dtype)
    optimizer = pe.MaskedOptimizer(
        _ftrl(config), row_masks=[(variable, mask)], compact_slots=compact
    )
    optimizer.build([variable])

    def apply(ids, values):
        if dense:  # ids are every row in order: the values are the gradient
            gradient = values
        else:
            gradient = tf.IndexedSlices(values, ids, tf.constant(table.shape))
        optimizer.apply([gradient], [variable])

    step = apply if mode == "eager" else tf.function(apply, jit_compile=mode == "xla")
    for ids, values in batches:
        step(tf.constant(ids, index_dtype), tf.constant(values))
    return variable, optimizer


_CASES = list(itertools.product(DTYPES, MODES, (False, True), ("sparse", "dense")))


@pytest.mark.parametrize("dtype, mode, compact, gradient", _CASES)
def test_ftrl_equals_the_float64_reference(dtype, mode, compact, gradient, monkeypatch):
    # The configurations and index dtypes rotate over the cases: each meets
    # every dtype, mode and slot layout.
    case = _CASES.index((dtype, mode, compact, gradient))
    config = sorted(CONFIGS)[case % len(CONFIGS)]
    index_dtype = (tf.int32, tf.int64)[(case // 3) % 2]
    dense = gradient == "dense"
    rng = make_rng("ftrl", dtype, mode, compact, gradient)
    rows, width = int(rng.integers(8, 16)), int(rng.integers(1, 6))
    table = rng.normal(size=(rows, width)).astype(numpy_dtype(dtype))
    mask = rng.random(rows) < 0.6
    mask[0], mask[1] = True, False  # at least one permitted and one frozen row
    # Sparse: the batches touch rows 0 and 1 and two thirds of the others.
    touched = np.flatnonzero((rng.random(rows) < 0.67) | (np.arange(rows) < 2))
    batches = _batches(rng, rows, width, dtype, dense, touched)
    calls = spy_on_the_fused_rule(monkeypatch)
    variable, optimizer = _train(
        config, dtype, table, mask, batches, index_dtype, compact, mode, dense
    )
    assert calls and set(calls) == {"ftrl"}, calls  # the fused rule (custom call) ran

    expected = ftrl_reference(optimizer.base_optimizer, table, mask, batches, dtype)
    what = f"{config} {dtype} {mode} {'compact' if compact else 'full'} {gradient}"
    for bound in expected.values():
        assert np.all(np.isfinite(bound.error)), what
    assert_within_bound(variable.numpy(), expected["var"], f"{what}: var")
    all_rows = np.arange(rows)
    slots = {
        name: optimizer.slot_rows(variable, name, all_rows) for name in ("accumulator", "linear")
    }
    for name, values in slots.items():
        assert_within_bound(values, expected[name], f"{what}: {name}")

    # Frozen rows, and permitted rows no batch touched, keep every bit; their
    # slot rows read as Keras' initial values (compact: they have none).
    stepped = np.zeros(rows, bool)
    for ids, _ in batches:
        stepped[ids] = True
    stepped &= mask
    kept = ~stepped
    assert kept.any()
    assert_bits_equal(np.asarray(variable.numpy())[kept], table[kept], f"{what}: rows not stepped")
    initial = {
        "accumulator": np.asarray(
            np.float32(CONFIGS[config].get("initial_accumulator_value", 0.1))
        ).astype(numpy_dtype(dtype)),
        "linear": np.zeros((), numpy_dtype(dtype)),
    }
    for name, values in slots.items():
        assert_bits_equal(
            values[kept], np.broadcast_to(initial[name], values[kept].shape), f"{what}: {name}"
        )
    if compact:
        present = optimizer.slot_rows_present(variable, all_rows)
        np.testing.assert_array_equal(present, stepped)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_ftrl_equals_stock_keras_ftrl(config, dtype, rng, monkeypatch):
    """Every row permitted and a dense gradient: the lazy fused step is Keras'
    dense step. Its operations are Keras' own in Keras' order, each rounded
    once, except pow: glibc's against TensorFlow's (Eigen's), either within a
    few ulps of the exact power. So where pow is exact (x ** 0 = 1) the bits
    agree; elsewhere each lies within the reference's running bound, and the
    two within the sum of their bounds."""
    rows, width = 9, 4
    table = rng.normal(size=(rows, width)).astype(dtype)
    batches = _batches(rng, rows, width, dtype, True, np.arange(rows))
    calls = spy_on_the_fused_rule(monkeypatch)
    fused, optimizer = _train(
        config, dtype, table, np.ones(rows, bool), batches, tf.int64, False, "eager", True
    )
    assert calls == ["ftrl"] * STEPS
    stock_variable = keras.Variable(table, dtype=dtype)
    stock = _ftrl(config)
    stock.build([stock_variable])
    for _, values in batches:
        stock.apply([tf.constant(values)], [stock_variable])
    accumulator, linear = stock.variables[-2:]
    assert accumulator.name.endswith("accumulator") and linear.name.endswith("linear")
    expected = ftrl_reference(optimizer.base_optimizer, table, np.ones(rows, bool), batches, dtype)
    pairs = {
        "var": (fused.numpy(), stock_variable.numpy()),
        "accumulator": (optimizer.slot_rows(fused, "accumulator", np.arange(rows)), accumulator),
        "linear": (optimizer.slot_rows(fused, "linear", np.arange(rows)), linear),
    }
    exact_pow = CONFIGS[config].get("learning_rate_power", -0.5) == 0.0
    for name, (ours, theirs) in pairs.items():
        theirs = np.asarray(theirs)
        if exact_pow:
            assert_bits_equal(ours, theirs, f"{config} {name}: fused vs stock")
            continue
        assert_within_bound(ours, expected[name], f"{config} {name}: fused")
        assert_within_bound(theirs, expected[name], f"{config} {name}: stock Keras")
        twice = Bounded(theirs.astype(np.float64), 2 * expected[name].error)
        assert_within_bound(ours, twice, f"{config} {name}: fused vs stock")


@pytest.mark.parametrize("compact", [False, True], ids=["full", "compact"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_initial_accumulator_value_is_honoured(dtype, compact):
    table = np.arange(12, dtype=np.float32).reshape(4, 3).astype(numpy_dtype(dtype))
    variable = keras.Variable(table, dtype=dtype)
    mask = np.array([True, True, False, True])
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.Ftrl(0.1, initial_accumulator_value=0.5),
        row_masks=[(variable, mask)],
        compact_slots=compact,
    )
    grad = np.array([[0.5, -1.0, 2.0]], numpy_dtype(dtype))
    optimizer.apply(
        [tf.IndexedSlices(tf.constant(grad), tf.constant([1]), tf.constant([4, 3]))], [variable]
    )
    accumulator = optimizer.slot_rows(variable, "accumulator", [0, 1, 2, 3])
    start = np.asarray(np.float32(0.5)).astype(numpy_dtype(dtype))
    # Row 1: 0.5 + g^2, one rounding (exact here); the others keep 0.5.
    stepped = (start.astype(np.float64) + grad.astype(np.float64) ** 2).astype(numpy_dtype(dtype))
    assert_bits_equal(accumulator[1], stepped[0], "the stepped row's accumulator")
    assert_bits_equal(accumulator[[0, 2, 3]], np.full((3, 3), start), "the other rows'")
    assert_bits_equal(variable.numpy()[[0, 2, 3]], table[[0, 2, 3]], "rows not stepped")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"slots": 1}, r"slots: 1 given; rule 'ftrl' has 2 \(accumulator, linear\)"),
        ({"drop": "power"}, r"missing: power"),
        ({"add": "epsilon"}, r"unknown: epsilon"),
    ],
)
def test_bad_ftrl_arguments_are_named_and_nothing_is_written(change, message, rng):
    rule = RULES["ftrl"]
    table = tf.Variable(rng.normal(size=(5, 3)).astype(np.float32))
    slots = [tf.Variable(v) for v in fused_slot_values(rule.slots, rng, 5, 3, np.float32)]
    hyperparameters = fused_hyperparameters(rule.hyperparameters)
    if "drop" in change:
        del hyperparameters[change["drop"]]
    if "add" in change:
        hyperparameters[change["add"]] = 1e-7
    before = [v.numpy().copy() for v in (table, *slots)]
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=message):
        pe.ops.masked_sparse_apply_rule(
            "ftrl",
            table,
            slots[: change.get("slots", 2)],
            [1, 2],
            tf.ones([2, 3]),
            [True] * 5,
            hyperparameters,
        )
    for variable, old in zip((table, *slots), before):
        assert_bits_equal(variable, old, f"ftrl: {variable.name} after a refused step")


def _numpy_ftrl_step(x, g, accumulator, linear, h, power):
    """One FTRL element step in x's dtype, each operation rounded once as
    NumPy rounds it (IEEE, a correctly rounded sqrt), a^power as the kernel's
    forms take it: sqrt(a) + 0, 1 or a (cc/core/row_rules.h FtrlPower)."""
    t = x.dtype.type
    lr, l1, shrink, two_l2 = (
        t(h[name]) for name in ("learning_rate", "l1", "two_l2_shrinkage", "two_l2")
    )

    def p(a):
        return {0.5: np.sqrt(a) + t(0), 0.0: np.ones_like(a), 1.0: a}[power]

    updated = accumulator + g * g
    power_new = p(updated)
    sigma = (power_new - p(accumulator)) / lr
    new_linear = linear + ((g + shrink * x) - sigma * x)
    clipped = np.maximum(np.minimum(new_linear, l1), -l1)
    return (clipped - new_linear) / (power_new / lr + two_l2), updated, new_linear


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("power", [0.5, 0.0, 1.0])
def test_exponents_without_pow_are_exactly_rounded(dtype, power, rng):
    """learning_rate_power -0.5 (the default), 0 and -1 take no pow: the fused
    kernel's step equals the step in NumPy, each operation rounded once, bit
    for bit (a^0.5 a correctly rounded square root), an accumulator of 0
    included; var, accumulator and linear."""
    rows, width = 64, 9
    x = rng.normal(size=(rows, width)).astype(dtype)
    accumulator = (np.abs(rng.normal(size=(rows, width))) + 0.01).astype(dtype)
    accumulator[0] = 0
    linear = rng.normal(size=(rows, width)).astype(dtype)
    g = rng.normal(size=(rows, width)).astype(dtype)
    g[0, :3] = 0  # an accumulator that stays 0
    h = dict(
        learning_rate=0.3, weight_decay=0.0, l1=0.2, two_l2_shrinkage=0.05, two_l2=0.1, power=power
    )
    h = {name: float(np.asarray(value, dtype)) for name, value in h.items()}
    variables = [tf.Variable(v) for v in (x, accumulator, linear)]
    pe.ops.masked_sparse_apply_rule(
        "ftrl", variables[0], variables[1:], np.arange(rows), g, np.ones(rows, bool), h
    )
    expected = _numpy_ftrl_step(x, g, accumulator, linear, h, power)
    for name, variable, value in zip(("var", "accumulator", "linear"), variables, expected):
        assert_bits_equal(variable.numpy(), value, f"power {power} {name}")
