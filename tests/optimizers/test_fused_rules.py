"""Every rule of the fused kernels' table inside MaskedOptimizer.

- Each optimizer the table covers equals a float64 NumPy reference of its
  lazy rule on random sparse gradients with duplicates (FTRL's reference in
  pe_testing, with its own running error bound): every float dtype,
  both index dtypes, full and compact slots, eagerly, in ``tf.function`` and
  under XLA (its custom call); frozen rows stay bit for bit.
- Where the stock-op path is exact (SGD, Adagrad, Adam, AMSGrad: every slot
  is added to, never reassigned), the fused kernel gives its bits.
- A bag lookup's gradient fused into the rule gives the bits of the bag
  gradient op followed by the per-id kernel, for every rule.
- The Python table is the header's (cc/core/row_rules.h), entry by entry.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, Callable

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding._internal.rule_table import RULES
from partial_embedding.optimizers import _row_rules as row_rules
from pe_testing import (
    FTRL_OPTIONS,
    assert_bits_equal,
    assert_within_bound,
    ftrl_reference,
    make_rng,
    numpy_dtype,
    spy_on_the_fused_rule,
    unit_roundoff,
)

#: One optimizer per rule of the table (and weight decay, where the rule
#: takes it), with its table name.
CONFIGS: dict[str, tuple[str, Callable[[], Any]]] = {
    "sgd": ("sgd", lambda: keras.optimizers.SGD(0.2)),
    "sgd_decay": ("sgd", lambda: keras.optimizers.SGD(0.2, weight_decay=0.1)),
    "momentum": ("momentum", lambda: keras.optimizers.SGD(0.1, momentum=0.9)),
    "nesterov": ("nesterov", lambda: keras.optimizers.SGD(0.1, momentum=0.5, nesterov=True)),
    "adagrad": ("adagrad", lambda: keras.optimizers.Adagrad(0.2)),
    "rmsprop": ("rmsprop", lambda: keras.optimizers.RMSprop(0.02)),
    "rmsprop_momentum": (
        "rmsprop_momentum",
        lambda: keras.optimizers.RMSprop(0.02, momentum=0.5),
    ),
    "rmsprop_centered": ("rmsprop_centered", lambda: keras.optimizers.RMSprop(0.02, centered=True)),
    "rmsprop_centered_momentum": (
        "rmsprop_centered_momentum",
        lambda: keras.optimizers.RMSprop(0.02, momentum=0.5, centered=True),
    ),
    "adam": ("adam", lambda: keras.optimizers.Adam(0.05)),
    "adamw": ("adam", lambda: keras.optimizers.AdamW(0.05, weight_decay=0.2)),
    "amsgrad": ("amsgrad", lambda: keras.optimizers.Adam(0.05, amsgrad=True, weight_decay=0.1)),
    "rowwise_adagrad": (
        "rowwise_adagrad",
        lambda: pe.RowwiseAdagrad(0.2, initial_accumulator_value=0.1),
    ),
    "rowwise_adam": ("rowwise_adam", lambda: pe.RowwiseAdam(0.05, weight_decay=0.1)),
    "ftrl": (
        "ftrl",
        lambda: keras.optimizers.Ftrl(**FTRL_OPTIONS, weight_decay=0.05),
    ),
}

#: The configurations whose stock-op path is exact (see module doc).
EXACT_STOCK = ("sgd", "sgd_decay", "adagrad", "adam", "adamw", "amsgrad")

DTYPES = ("float16", "bfloat16", "float32", "float64")
MODES = ("eager", "function", "xla")
STEPS = 3


# --- the float64 reference ---------------------------------------------------------


def _f32(value: float) -> float:
    """What ``ops.cast`` makes of a Python number: float32 first."""
    return float(np.float32(value))


def _slots_start(optimizer: Any, rows: int, width: int) -> dict[str, np.ndarray]:
    # Keras' Constant initializer casts the value (float32 first).
    init = _f32(getattr(optimizer, "initial_accumulator_value", 0.0))
    full = {
        name: np.full((rows, width), init if name == "accumulator" else 0.0)
        for name in ("momentum", "velocity", "velocity_hat", "accumulator", "average_gradient")
    }
    full["row_accumulator"] = np.full(rows, init)
    full["row_velocity"] = np.zeros(rows)
    return full


def _rounded_betas(optimizer: Any, dtype: str, first: Callable[[float], float]) -> list[float]:
    """The betas of the bias corrections as the optimizer rounds them to the
    variable's dtype (Adam casts through float32, ``first``; RowwiseAdam
    converts directly). 1 - beta^t magnifies that rounding (by ~10 for
    beta_1 = 0.9; in bfloat16 beta_2 = 0.999 is 1.0, so the correction is 0
    and the step is 0): a property of the rule, which the kernel shares."""
    return [
        float(np.array(first(b)).astype(numpy_dtype(dtype)))
        for b in (optimizer.beta_1, optimizer.beta_2)
    ]


def _reference_row(
    rule: str, optimizer: Any, t: int, x: np.ndarray, g: np.ndarray, s: dict, r: int, dtype: str
) -> np.ndarray:
    """One lazy step of ``rule`` on row ``r`` (float64), slots ``s`` updated."""
    # Keras keeps the learning rate in a float32 variable and casts the weight
    # decay, SGD's momentum and (in Adam's bias correction) the betas.
    o, lr = optimizer, float(optimizer.learning_rate)
    if o.weight_decay:
        x = x - x * _f32(o.weight_decay) * lr
    if rule == "sgd":
        return x - lr * g
    if rule in ("momentum", "nesterov"):
        momentum = _f32(o.momentum)
        m = momentum * s["momentum"][r] - lr * g
        s["momentum"][r] = m
        return x + (momentum * m - lr * g if rule == "nesterov" else m)
    if rule == "adagrad":
        s["accumulator"][r] += g * g
        return x - lr * g / np.sqrt(s["accumulator"][r] + o.epsilon)
    if rule.startswith("rmsprop"):
        s["velocity"][r] = o.rho * s["velocity"][r] + (1 - o.rho) * g * g
        denominator = s["velocity"][r] + o.epsilon
        if o.centered:
            s["average_gradient"][r] = o.rho * s["average_gradient"][r] + (1 - o.rho) * g
            denominator = denominator - s["average_gradient"][r] ** 2
        increment = lr * g / np.sqrt(denominator)
        if o.momentum > 0:
            s["momentum"][r] = o.momentum * s["momentum"][r] + increment
            increment = s["momentum"][r]
        return x - increment
    if rule in ("adam", "amsgrad"):
        beta_1, beta_2 = _rounded_betas(o, dtype, _f32)
        alpha = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        s["momentum"][r] += (g - s["momentum"][r]) * (1 - o.beta_1)
        s["velocity"][r] += (g * g - s["velocity"][r]) * (1 - o.beta_2)
        v = s["velocity"][r]
        if rule == "amsgrad":
            s["velocity_hat"][r] = v = np.maximum(s["velocity_hat"][r], v)
        return x - alpha * s["momentum"][r] / (np.sqrt(v) + o.epsilon)
    if rule == "rowwise_adagrad":
        s["row_accumulator"][r] += np.mean(g * g)
        return x - lr * g / (np.sqrt(s["row_accumulator"][r]) + o.epsilon)
    assert rule == "rowwise_adam"
    s["row_velocity"][r] = o.beta_2 * s["row_velocity"][r] + (1 - o.beta_2) * np.mean(g * g)
    s["momentum"][r] = o.beta_1 * s["momentum"][r] + (1 - o.beta_1) * g
    beta_1, beta_2 = _rounded_betas(o, dtype, float)
    m_hat = s["momentum"][r] / (1 - beta_1**t)
    with np.errstate(divide="ignore"):  # 1 - beta_2^t = 0 in bfloat16: no step
        v_hat = s["row_velocity"][r] / (1 - beta_2**t)
    return x - lr * m_hat / (np.sqrt(v_hat) + o.epsilon)


def _reference(rule, optimizer, table, mask, batches, dtype) -> np.ndarray:
    x = table.astype(np.float64)
    slots = _slots_start(optimizer, *table.shape)
    for t, (ids, values) in enumerate(batches, start=1):
        for r in dict.fromkeys(int(i) for i in ids):  # distinct rows, any order
            if mask[r]:
                g = values[ids == r].astype(np.float64).sum(axis=0)
                x[r] = _reference_row(rule, optimizer, t, x[r], g, slots, r, dtype)
    return x


# --- MaskedOptimizer's fused step ----------------------------------------------------


def _batches(rng: np.random.Generator, rows: int, width: int, dtype: str) -> list[tuple]:
    """Sparse gradients with duplicates, each value exactly representable in
    ``dtype`` (the reference sums what the kernel sums).

    Magnitudes lie in [0.25, 2) with one sign a column per batch, so a row's
    summed gradient is at least 0.25: Adam's ``(1 - beta_2) * g**2`` stays a
    normal float16 number (>= 6.1e-5). Below that float16 underflows it, the
    denominator becomes epsilon and the step explodes, in Keras' own Adam as
    in the kernel: a limit of float16, which a float64 reference does not
    model.
    """
    batches = []
    for _ in range(STEPS):
        ids = rng.integers(0, rows, size=int(rng.integers(3, 10)))
        ids[-1] = ids[0]
        signs = rng.choice([-1.0, 1.0], size=width)
        values = (rng.uniform(0.25, 2.0, size=(ids.size, width)) * signs).astype(numpy_dtype(dtype))
        batches.append((ids, values))
    return batches


def _run_fused(
    make: Callable[[], Any], dtype, table, mask, batches, index_dtype, compact, mode, monkeypatch
):
    calls = spy_on_the_fused_rule(monkeypatch)
    variable = keras.Variable(table.astype(numpy_dtype(dtype)), dtype=dtype)
    optimizer = pe.MaskedOptimizer(make(), row_masks=[(variable, mask)], compact_slots=compact)
    optimizer.build([variable])

    def apply(ids, values):
        optimizer.apply([tf.IndexedSlices(values, ids, tf.constant(table.shape))], [variable])

    step = apply if mode == "eager" else tf.function(apply, jit_compile=mode == "xla")
    for ids, values in batches:
        step(tf.constant(ids, index_dtype), tf.constant(values))
    return variable, optimizer, calls


_CASES = list(itertools.product(sorted(CONFIGS), DTYPES))


@pytest.mark.parametrize("config, dtype", _CASES)
def test_every_rule_equals_the_float64_reference(config, dtype, monkeypatch):
    # Modes, index dtypes and slot layouts rotate over the cases, so every
    # rule meets each of them without the whole product's run time.
    case = _CASES.index((config, dtype))
    mode = MODES[case % 3]
    index_dtype = (tf.int32, tf.int64)[case % 2]
    compact = (case // 2) % 2 == 1
    rule, make = CONFIGS[config]
    rng = make_rng("fused rules", config, dtype)
    rows, width = int(rng.integers(6, 14)), int(rng.integers(1, 6))
    table = rng.normal(size=(rows, width)).astype(numpy_dtype(dtype))
    mask = rng.random(rows) < 0.6
    batches = _batches(rng, rows, width, dtype)
    variable, optimizer, calls = _run_fused(
        make, dtype, table, mask, batches, index_dtype, compact, mode, monkeypatch
    )
    assert calls and set(calls) == {rule}, calls  # the fused kernel (custom call) ran
    frozen = ~mask
    assert_bits_equal(np.asarray(variable.numpy())[frozen], table[frozen], "frozen rows")
    if rule == "ftrl":
        # FTRL replaces the row (var = (clip(linear) - linear) / quadratic)
        # rather than stepping it: its bound is the reference's own running
        # error analysis (pe_testing.ftrl_reference).
        reference = ftrl_reference(optimizer.base_optimizer, table, mask, batches, dtype)
        assert_within_bound(variable.numpy(), reference["var"], f"{config} {dtype}")
        return
    actual = np.asarray(variable.numpy()).astype(np.float64)
    expected = _reference(rule, optimizer.base_optimizer, table, mask, batches, dtype)
    # Bound: a step rounds the row once (u |x|) and its update Delta after at
    # most ~8 roundings of the chain that makes it (8 u |Delta|), with
    # |Delta| <= max(1, |x|) here (learning rates <= 0.2, a row's summed
    # gradient <= ~6); the hyperparameters' own rounding adds u |Delta|. Per
    # step <= 10 u max(1, |x|), over three steps < 32 u max(1, |x|).
    bound = 32 * unit_roundoff(dtype) * np.maximum(1.0, np.abs(expected))
    error = np.abs(actual - expected)
    assert np.all(error <= bound), (error / bound).max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", EXACT_STOCK)
def test_fused_gives_the_stock_op_bits_where_those_are_exact(config, dtype, monkeypatch):
    # Eagerly: in a tf.function Grappler may regroup the stock ops'
    # arithmetic (x * wd * lr), and they lose the exactness compared here.
    rule, make = CONFIGS[config]
    rng = make_rng("fused vs stock", config, dtype)
    rows, width = 11, 4
    table = rng.normal(size=(rows, width)).astype(numpy_dtype(dtype))
    mask = rng.random(rows) < 0.6
    batches = _batches(rng, rows, width, dtype)
    runs = []
    for fused in (True, False):
        with monkeypatch.context() as patch:
            if not fused:
                patch.setattr(row_rules, "fused_kernel_applies", lambda *a: False)
            variable, optimizer, calls = _run_fused(
                make, dtype, table, mask, batches, tf.int64, False, "eager", patch
            )
            assert bool(calls) == fused
            runs.append([variable, *optimizer.base_optimizer.variables[1:]])
    for fused_value, stock_value in zip(*runs):
        assert_bits_equal(fused_value, stock_value, f"{config}: {fused_value.name}")


def _bag_model(vocab, width, trainable_ids, seed):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((None,), dtype="int32", ragged=True)
    layer = pe.PartialEmbedding(vocab, width, trainable_ids=trainable_ids, combiner="mean")
    return layer, keras.Model(ids, keras.layers.Dense(1)(layer(ids)))


def _train_bags(make, compact, fused_bag, ids, targets, trainable, patch) -> np.ndarray:
    """Three steps of a bag model; the table after them."""
    ran: list[str] = []
    real = row_rules._bag_fused

    def spy(*arguments):
        ran.append("bag")
        return real(*arguments)

    patch.setattr(row_rules, "_bag_fused", spy if fused_bag else (lambda *a: False))
    layer, model = _bag_model(30, 4, trainable, 11)
    optimizer = pe.MaskedOptimizer(make(), compact_slots=compact)
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids) - targets))
        optimizer.apply(tape.gradient(loss, variables), variables)

    for _ in range(STEPS):
        step()
    assert bool(ran) == fused_bag
    return layer.embeddings.numpy()


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_the_fused_bag_gradient_gives_the_two_ops_bits_for_every_rule(config, monkeypatch):
    _, make = CONFIGS[config]
    rng = make_rng("fused bag rules", config)
    trainable = np.flatnonzero(rng.random(30) < 0.5)
    ids = tf.ragged.constant(
        [list(rng.integers(0, 30, size=int(rng.integers(1, 6)))) for _ in range(8)],
        dtype=tf.int32,
    )
    targets = tf.constant(rng.normal(size=(8, 1)), tf.float32)
    compact = sorted(CONFIGS).index(config) % 2 == 1
    tables = []
    for fused_bag in (True, False):
        with monkeypatch.context() as patch:
            tables.append(_train_bags(make, compact, fused_bag, ids, targets, trainable, patch))
    assert_bits_equal(tables[0], tables[1], f"{config}: table")


def test_the_python_table_is_the_compiled_table():
    """The table the op library was compiled from (the kernel module exports
    it) is the Python one, entry by entry and in order."""
    kernels = pytest.importorskip("partial_embedding._kernels")
    assert list(kernels.RULES) == list(RULES)
    for name, compiled in kernels.RULES.items():
        rule = RULES[name]
        assert list(compiled["slots"]) == [slot for slot, _ in rule.slots]
        assert list(compiled["per_row"]) == [per_row for _, per_row in rule.slots]
        assert list(compiled["hyperparameters"]) == list(rule.hyperparameters)


def test_the_python_table_is_the_header_table():
    """The same against the header, where the source tree is at hand (the
    installed wheel's tests read the compiled table above)."""
    header = Path(__file__).parents[2] / "cc" / "core" / "row_rules.h"
    if not header.exists():
        pytest.skip("the source tree is not here: the compiled table is checked instead")
    text = header.read_text()
    start = text.index("kRuleTable[kNumRules] = {")
    body = text[start : text.index("// clang-format on", start)]
    entries = re.findall(
        r'\{"(\w+)",\s*(\d+),\s*\{([^}]*)\},\s*\{([^}]*)\},\s*(\d+),\s*\{([^}]*)\}', body
    )
    assert [entry[0] for entry in entries] == list(RULES)
    for name, count, slots, per_row, num_hyper, hypers in entries:
        rule = RULES[name]
        slot_names = re.findall(r'"(\w+)"', slots)
        flags = [flag.strip() == "true" for flag in per_row.split(",") if flag.strip()]
        assert int(count) == len(rule.slots) == len(slot_names)
        assert [slot for slot, _ in rule.slots] == slot_names
        assert [row for _, row in rule.slots] == flags + [False] * (len(slot_names) - len(flags))
        assert int(num_hyper) == len(rule.hyperparameters)
        assert list(rule.hyperparameters) == re.findall(r'"(\w+)"', hypers)


# --- bad input: a clear error, nothing written ------------------------------------


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("bag", [False, True], ids=["per_id", "bag"])
def test_a_bad_id_is_refused_before_anything_is_written(rule, bag):
    from partial_embedding.ops.fused import masked_embedding_bag_apply_rule
    from pe_testing import fused_hyperparameters, fused_slot_values

    rng = make_rng("bad id", rule, bag)
    table = tf.Variable(rng.normal(size=(5, 3)).astype(np.float32))
    slots = [
        tf.Variable(value) for value in fused_slot_values(RULES[rule].slots, rng, 5, 3, np.float32)
    ]
    before = [v.numpy().copy() for v in (table, *slots)]
    hyper = fused_hyperparameters(RULES[rule].hyperparameters)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=r"\b7\b.*\[0, 5\)|not in \[0, 5\)"):
        if bag:
            masked_embedding_bag_apply_rule(
                rule, table, slots, tf.ones([2, 3]), [1, 7, 2],
                tf.constant([0, 1, 1], tf.int64), [1.0, 0.5, 0.5], [True] * 5, hyper,
            )  # fmt: skip
        else:
            pe.ops.masked_sparse_apply_rule(
                rule, table, slots, [1, 2, 7], tf.ones([3, 3]), [True] * 5, hyper
            )
    for variable, old in zip((table, *slots), before):
        assert_bits_equal(variable, old, f"{rule}: {variable.name} after a refused step")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rule": "lamb"}, r"rule: 'lamb' is not a rule of the table \(sgd, momentum"),
        ({"slots": []}, r"slots: 0 given; rule 'adagrad' has 1 \(accumulator\)"),
        ({"hyperparameters": {"learning_rate": 0.1}}, r"missing: epsilon"),
        ({"hyperparameters": {"learning_rate": 0.1, "epsilon": 1e-7, "rho": 0.9}}, "unknown: rho"),
        ({"slots": "per_row"}, r"accumulator: shape \[4\] does not match var's shape \[4,2\]"),
    ],
)
def test_wrong_rule_arguments_are_named(change, message):
    table = tf.Variable(np.ones((4, 2), np.float32))
    accumulator = tf.Variable(np.ones((4, 2), np.float32))
    arguments: dict[str, Any] = {
        "rule": "adagrad",
        "slots": [accumulator],
        "hyperparameters": {"learning_rate": 0.1, "epsilon": 1e-7},
    }
    arguments.update(change)
    if arguments["slots"] == "per_row":
        arguments["slots"] = [tf.Variable(np.ones(4, np.float32))]
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=message):
        pe.ops.masked_sparse_apply_rule(
            arguments["rule"], table, arguments["slots"], [0, 1], tf.ones([2, 2]),
            [True] * 4, arguments["hyperparameters"],
        )  # fmt: skip
    np.testing.assert_array_equal(table.numpy(), 1.0)
    np.testing.assert_array_equal(accumulator.numpy(), 1.0)
