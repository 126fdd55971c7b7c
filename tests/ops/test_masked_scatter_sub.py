"""Tests of partial_embedding.masked_scatter_sub against a float64 NumPy reference."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import (
    INDEX_DTYPES,
    VALUE_DTYPES,
    base_seed,
    bits,
    masked_scatter_sub_reference,
    unit_roundoff,
)

MODES = ["eager", "function"]
CASES_PER_COMBINATION = 24  # 4 dtypes x 2 index dtypes x 2 modes x 24 = 384 cases


def _random_case(rng: np.random.Generator, dtype: tf.DType, index_dtype: tf.DType):
    num_rows = int(rng.integers(1, 40))
    var_rank = int(rng.integers(1, 4))
    row_shape = tuple(int(d) for d in rng.integers(1, 6, size=var_rank - 1))
    indices_rank = int(rng.integers(1, 3))
    indices_shape = tuple(int(d) for d in rng.integers(1, 12, size=indices_rank))
    # Heavy duplicates: draw from a few "hot" rows most of the time.
    hot_rows = rng.integers(0, num_rows, size=max(1, num_rows // 4))
    all_rows = rng.integers(0, num_rows, size=indices_shape)
    use_hot = rng.random(indices_shape) < 0.7
    indices = np.where(use_hot, rng.choice(hot_rows, size=indices_shape), all_rows)
    mask = rng.random(num_rows) < rng.uniform(0.2, 0.8)
    np_dtype = dtype.as_numpy_dtype
    var = rng.uniform(-2, 2, size=(num_rows,) + row_shape).astype(np_dtype)
    updates = rng.uniform(-1, 1, size=indices_shape + row_shape).astype(np_dtype)
    return var, indices.astype(index_dtype.as_numpy_dtype), updates, mask


def _apply(mode: str, variable: tf.Variable, indices, updates, mask) -> None:
    if mode == "eager":
        pe.masked_scatter_sub(variable, indices, updates, mask)
    else:
        tf.function(lambda i, u, m: pe.masked_scatter_sub(variable, i, u, m))(
            tf.constant(indices), tf.constant(updates), tf.constant(mask)
        )


def _assert_matches_reference(before, after, indices, updates, mask, dtype):
    expected, hits, magnitude = masked_scatter_sub_reference(before, indices, updates, mask)
    untouched = hits == 0
    # Frozen rows and rows not in the batch: bit for bit.
    np.testing.assert_array_equal(bits(after[untouched]), bits(before[untouched]))
    # Written rows: a sum of hits + 1 terms (the row and its updates) in any
    # order, each addition rounded once, plus one rounding of a wider
    # accumulator to the table's dtype: |error| <= gamma(hits + 1) * (|row| +
    # sum |updates|), gamma(n) = n u / (1 - n u). The bound holds for every
    # input, so no seed can break it; a relative tolerance on the result
    # alone would fail where the updates nearly cancel the row.
    unit = unit_roundoff(dtype)
    terms = (hits + 1).astype(np.float64)
    gamma = terms * unit / (1 - terms * unit)
    bound = gamma.reshape((-1,) + (1,) * (before.ndim - 1)) * magnitude
    error = np.abs(after.astype(np.float64) - expected)
    assert np.all(error <= bound), f"max error / bound {np.max(error / np.maximum(bound, 1e-300))}"


@pytest.mark.parametrize(
    "dtype,index_dtype,mode",
    list(itertools.product(VALUE_DTYPES, INDEX_DTYPES, MODES)),
    ids=lambda value: getattr(value, "name", value),
)
def test_random_cases_match_float64_reference(rng, dtype, index_dtype, mode):
    for case in range(CASES_PER_COMBINATION):
        var, indices, updates, mask = _random_case(rng, dtype, index_dtype)
        variable = tf.Variable(var)
        _apply(mode, variable, indices, updates, mask)
        try:
            _assert_matches_reference(var, variable.numpy(), indices, updates, mask, dtype)
        except AssertionError as error:
            raise AssertionError(f"PE_TEST_SEED={base_seed()} case={case}: {error}") from error


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=lambda d: d.name)
def test_16bit_subtraction_rounds_like_numpy(rng, dtype):
    """Every element is float(var) - float(update) rounded once to the dtype."""
    np_dtype = dtype.as_numpy_dtype
    all_bits = np.arange(2**16, dtype=np.uint16)
    var = all_bits.view(np_dtype)
    finite = np.isfinite(var.astype(np.float32))
    var = var[finite]
    # Mix of updates: zero (round trip), tiny (subnormals), huge (overflow).
    updates = np.concatenate(
        [
            np.zeros(var.size // 4, np.float32),
            rng.normal(0, 1e-6, var.size // 4).astype(np.float32),
            rng.normal(0, 1e4, var.size // 4).astype(np.float32),
            rng.uniform(-70000, 70000, var.size - 3 * (var.size // 4)).astype(np.float32),
        ]
    )
    with np.errstate(over="ignore"):
        updates = updates.astype(np_dtype)
    rng.shuffle(updates)
    variable = tf.Variable(var)
    pe.masked_scatter_sub(variable, np.arange(var.size), updates, np.ones(var.size, bool))
    with np.errstate(over="ignore"):
        exact = var.astype(np.float32) - updates.astype(np.float32)
        expected = exact.astype(np_dtype)
    # TensorFlow runs CPU kernels with float32 denormals flushed to zero (the
    # GPU kernel keeps them); only bfloat16 has such values, so compare those
    # cases apart.
    tiny = np.finfo(np.float32).tiny
    on_cpu = tf.DeviceSpec.from_string(variable.device).device_type == "CPU"
    denormal = [
        (np.abs(x) < tiny) & (x != 0) & on_cpu
        for x in (var.astype(np.float32), updates.astype(np.float32), exact)
    ]
    flushed = denormal[0] | denormal[1] | denormal[2]
    result = variable.numpy()
    np.testing.assert_array_equal(bits(result[~flushed]), bits(expected[~flushed]))
    if flushed.any():
        flushed_expected = np.where(denormal[0], 0, var.astype(np.float32)) - np.where(
            denormal[1], 0, updates.astype(np.float32)
        )
        flushed_expected = np.where(np.abs(flushed_expected) < tiny, 0, flushed_expected)
        np.testing.assert_array_equal(result[flushed].astype(np.float32), flushed_expected[flushed])


@pytest.mark.usefixtures("on_cpu")  # the CPU kernel's threads and order
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=lambda d: d.name)
def test_large_update_uses_threads_and_is_deterministic(rng, index_dtype):
    """Large enough to run on several shards: same bits every run, right values."""
    num_rows, width, count = 300, 64, 8192
    var = rng.normal(size=(num_rows, width)).astype(np.float32)
    indices = rng.integers(0, 40, size=count).astype(index_dtype.as_numpy_dtype)
    updates = rng.normal(size=(count, width)).astype(np.float32)
    mask = rng.random(num_rows) < 0.5
    results = []
    for _ in range(3):
        variable = tf.Variable(var)
        pe.masked_scatter_sub(variable, indices, updates, mask)
        results.append(variable.numpy())
    for result in results[1:]:
        np.testing.assert_array_equal(bits(result), bits(results[0]))
    # Row by row in index order, in float32: bit-identical to the kernel.
    sequential = var.copy()
    for position, row in enumerate(indices):
        if mask[row]:
            sequential[row] -= updates[position]
    np.testing.assert_array_equal(bits(results[0]), bits(sequential))


def test_mask_in_variable_changes_between_calls(rng):
    num_rows, width = 20, 3
    var = rng.normal(size=(num_rows, width)).astype(np.float32)
    mask_variable = tf.Variable(rng.random(num_rows) < 0.5)
    variable = tf.Variable(var)
    step = tf.function(lambda i, u: pe.masked_scatter_sub(variable, i, u, mask_variable))
    expected = var.astype(np.float64)
    for _ in range(4):
        indices = rng.integers(0, num_rows, size=15)
        updates = rng.normal(size=(15, width)).astype(np.float32)
        mask_now = mask_variable.numpy()
        step(tf.constant(indices), tf.constant(updates))
        expected = masked_scatter_sub_reference(expected, indices, updates, mask_now).result
        np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-5, atol=1e-5)
        mask_variable.assign(rng.random(num_rows) < 0.5)
    assert step.experimental_get_tracing_count() == 1


def test_snapshot_keeps_old_values(rng):
    var = rng.normal(size=(10, 4)).astype(np.float32)
    variable = tf.Variable(var)
    snapshot = variable.read_value()
    pe.masked_scatter_sub(variable, [1, 2, 2], np.ones((3, 4), np.float32), np.ones(10, bool))
    np.testing.assert_array_equal(bits(snapshot.numpy()), bits(var))
    expected = masked_scatter_sub_reference(
        var, np.array([1, 2, 2]), np.ones((3, 4)), np.ones(10, bool)
    ).result
    np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)


def test_keras_variable_is_accepted(rng):
    keras = pytest.importorskip("keras")
    var = rng.normal(size=(8, 2)).astype(np.float32)
    variable = keras.Variable(var)
    mask = np.array([True, False] * 4)
    indices = np.array([0, 1, 0, 7, 6])
    updates = rng.normal(size=(5, 2)).astype(np.float32)
    pe.masked_scatter_sub(variable, indices, updates, mask)
    # Row 0 takes two updates, which may nearly cancel it: the bound is the
    # reference's (rounding of every term), not a tolerance on the result.
    # Frozen rows and rows outside the batch are checked bit for bit there.
    _assert_matches_reference(var, np.asarray(variable.numpy()), indices, updates, mask, tf.float32)


def test_use_locking_false_gives_the_same_result(rng):
    var = rng.normal(size=(30, 5)).astype(np.float64)
    indices = rng.integers(0, 30, size=50)
    updates = rng.normal(size=(50, 5))
    mask = rng.random(30) < 0.5
    variable = tf.Variable(var)
    pe.masked_scatter_sub(variable, indices, updates, mask, use_locking=False)
    _assert_matches_reference(var, variable.numpy(), indices, updates, mask, tf.float64)


def test_empty_indices_change_nothing():
    var = np.arange(12, dtype=np.float32).reshape(4, 3)
    variable = tf.Variable(var)
    pe.masked_scatter_sub(
        variable, np.zeros([0], np.int32), np.zeros([0, 3], np.float32), np.ones(4, bool)
    )
    np.testing.assert_array_equal(bits(variable.numpy()), bits(var))


def test_compat_v1_graph_mode_returns_the_op(rng):
    var = rng.normal(size=(6, 2)).astype(np.float32)
    indices = np.array([5, 0, 5])
    updates = rng.normal(size=(3, 2)).astype(np.float32)
    mask = np.array([True, True, False, True, True, True])
    with tf.Graph().as_default():
        variable = tf.compat.v1.get_variable("table", initializer=var, use_resource=True)
        op = pe.masked_scatter_sub(variable, indices, updates, mask)
        assert isinstance(op, tf.Operation)
        with tf.compat.v1.Session() as session:
            session.run(variable.initializer)
            session.run(op)
            result = session.run(variable)
    _assert_matches_reference(var, result, indices, updates, mask, tf.float32)


def test_uninitialized_variable_is_reported():
    with tf.Graph().as_default():
        variable = tf.compat.v1.get_variable(
            "never_initialized", shape=[4, 2], dtype=tf.float32, use_resource=True
        )
        op = pe.masked_scatter_sub(variable, [1], np.ones([1, 2], np.float32), np.ones(4, bool))
        with tf.compat.v1.Session() as session:
            with pytest.raises(
                (tf.errors.FailedPreconditionError, tf.errors.NotFoundError),
                match="not initialized",
            ):
                session.run(op)


# --- Bad input: a clear error, and the variable left bit for bit -------------


def _bad_input_variable(rng: np.random.Generator) -> tuple[np.ndarray, tf.Variable]:
    var = rng.normal(size=(10, 3)).astype(np.float32)
    return var, tf.Variable(var)


GOOD_UPDATES = np.ones((3, 3), np.float32)
GOOD_MASK = np.ones(10, bool)

BAD_INPUTS = {
    "index_too_large": (
        np.array([1, 10, 2]),
        GOOD_UPDATES,
        GOOD_MASK,
        r"indices\[1\] = 10 is not in \[0, 10\)",
    ),
    "index_negative": (
        np.array([1, 2, -1]),
        GOOD_UPDATES,
        GOOD_MASK,
        r"indices\[2\] = -1 is not in \[0, 10\)",
    ),
    "index_bad_on_frozen_row": (
        np.array([0, 11, 2]),
        GOOD_UPDATES,
        np.zeros(10, bool),
        r"indices\[1\] = 11 is not in \[0, 10\)",
    ),
    "mask_wrong_length": (
        np.array([1, 2, 3]),
        GOOD_UPDATES,
        np.ones(9, bool),
        r"row_mask.*\[9\].*\[10\]",
    ),
    "mask_wrong_rank": (
        np.array([1, 2, 3]),
        GOOD_UPDATES,
        np.ones((10, 1), bool),
        r"row_mask.*10,1",
    ),
    "updates_wrong_shape": (
        np.array([1, 2, 3]),
        np.ones((3, 4), np.float32),
        GOOD_MASK,
        r"updates.*\[?3,4\]?",
    ),
}


BAD_INPUT_MODES = ["eager", "function_dynamic_shapes"]


def _bad_input_call(mode: str, variable, indices, updates, mask) -> Callable[[], object]:
    """The op on ``variable``, eagerly or in a tf.function without static shapes."""
    if mode == "eager":
        return lambda: pe.masked_scatter_sub(variable, indices, updates, mask)

    # Unknown static shapes: the kernel's own checks must catch it.
    @tf.function(
        input_signature=[
            tf.TensorSpec(None, tf.int64),
            tf.TensorSpec(None, tf.float32),
            tf.TensorSpec(None, tf.bool),
        ]
    )
    def step(i, u, m):
        pe.masked_scatter_sub(variable, i, u, m)

    return lambda: step(indices.astype(np.int64), updates, mask)


@pytest.mark.parametrize("mode", BAD_INPUT_MODES)
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_reported_and_nothing_written(rng, case, mode):
    indices, updates, mask, pattern = BAD_INPUTS[case]
    var, variable = _bad_input_variable(rng)
    call = _bad_input_call(mode, variable, indices, updates, mask)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=pattern):
        call()
    np.testing.assert_array_equal(bits(variable.numpy()), bits(var))


@pytest.mark.parametrize(
    "case,args,error,pattern",
    [
        (
            "float_indices",
            (np.array([1.0, 2.0, 3.0]), GOOD_UPDATES, GOOD_MASK),
            TypeError,
            r"indices: dtype float64",
        ),
        (
            "updates_wrong_dtype",
            (np.array([1, 2, 3]), np.ones((3, 3), np.float64), GOOD_MASK),
            TypeError,
            r"updates: dtype float64 does not match the variable's dtype float32",
        ),
        (
            "mask_wrong_dtype",
            (np.array([1, 2, 3]), GOOD_UPDATES, np.ones(10, np.int32)),
            TypeError,
            r"row_mask: dtype int32",
        ),
    ],
)
def test_bad_dtype_is_reported_and_nothing_written(rng, case, args, error, pattern):
    var, variable = _bad_input_variable(rng)
    with pytest.raises(error, match=pattern) as caught:
        pe.masked_scatter_sub(variable, *args)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, tf.errors.InvalidArgumentError)
    np.testing.assert_array_equal(bits(variable.numpy()), bits(var))


@pytest.mark.parametrize(
    "not_a_variable",
    [np.zeros((10, 3), np.float32), tf.zeros((10, 3)), [[0.0] * 3] * 10],
    ids=["ndarray", "tensor", "list"],
)
def test_non_variable_is_rejected(not_a_variable):
    with pytest.raises((TypeError, ValueError), match="ref: expected a resource tf.Variable"):
        pe.masked_scatter_sub(not_a_variable, [1], np.ones((1, 3), np.float32), GOOD_MASK)


def test_integer_variable_is_rejected_and_unchanged():
    variable = tf.Variable(np.arange(10, dtype=np.int32))
    with pytest.raises(TypeError, match="ref: dtype int32 is not supported"):
        pe.masked_scatter_sub(variable, [1], np.ones(1, np.int32), GOOD_MASK)
    np.testing.assert_array_equal(variable.numpy(), np.arange(10))


def test_bfloat16_numpy_type_is_ml_dtypes():
    # The reference for bfloat16 relies on ml_dtypes' rounding.
    assert tf.bfloat16.as_numpy_dtype == ml_dtypes.bfloat16
