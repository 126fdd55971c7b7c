"""masked_scatter_sub and the fused rule step (every rule of the table, full-size
slots) as XLA custom calls (ops/xla_custom_call.py, cc/xla/).

Skips where the optional library was not built (CMake ``PE_ENABLE_XLA_FFI``)
or was loaded too late to take effect in this process.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding._internal.rule_table import RULES
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.ops import xla_custom_call
from pe_testing import (
    assert_bits_equal,
    assert_rule_tables_as_the_kernel,
    bits_equal,
    fused_hyperparameters,
    fused_slot_values,
    make_rng,
    numpy_dtype,
    skip_without_xla_custom_calls,
    xla_handlers_emulated,
)

# These test XLA's CPU custom calls: on a machine with a GPU too.
pytestmark = pytest.mark.usefixtures("on_cpu")

skip_without_xla_custom_calls()

_TARGET = 'custom_call_target="partial_embedding_masked_scatter_sub"'


def _reference(table, ids, updates, mask):
    """The update in float64 NumPy, applied in index order."""
    result = table.astype(np.float64)
    for position, row in enumerate(ids.ravel()):
        if mask[row]:
            result[row] -= updates.reshape(ids.size, -1)[position].reshape(table.shape[1:])
    return result


def _jit_update(table):
    @tf.function(jit_compile=True)
    def update(ids, updates, mask):
        xla_custom_call.masked_scatter_sub_custom_call(table, ids, updates, mask)

    return update


def _random_case(dtype, index_dtype, seed):
    rng = np.random.default_rng(seed)
    num_rows, width = 50, 3
    table = rng.standard_normal([num_rows, width]).astype(dtype)
    ids = rng.integers(0, num_rows, size=[4, 6]).astype(index_dtype)
    ids[0, :3] = 7  # A permitted duplicate: its three updates accumulate.
    updates = rng.standard_normal([4, 6, width]).astype(dtype)
    mask = rng.random(num_rows) < 0.5
    mask[7] = True
    return table, ids, updates, mask


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_matches_reference_and_keeps_frozen_rows(dtype, index_dtype):
    table, ids, updates, mask = _random_case(dtype, index_dtype, seed=3)
    variable = tf.Variable(table)
    update = _jit_update(variable)
    update(ids, updates, mask)
    result = variable.numpy()
    tolerance = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(result, _reference(table, ids, updates, mask), rtol=tolerance)
    np.testing.assert_array_equal(result[~mask].view(np.uint8), table[~mask].view(np.uint8))
    untouched = np.setdiff1d(np.arange(len(table)), ids)
    np.testing.assert_array_equal(result[untouched], table[untouched])


@pytest.mark.skipif(
    xla_handlers_emulated(),
    reason="the CUDA core sums a row's duplicates before subtracting them: within the "
    "reference's bound (test_matches_reference_and_keeps_frozen_rows), not the CPU's bits",
)
def test_same_bits_as_the_kernel_path():
    table, ids, updates, mask = _random_case(np.float32, np.int32, seed=5)
    compiled, kernel = tf.Variable(table), tf.Variable(table)
    _jit_update(compiled)(ids, updates, mask)
    xla_custom_call.masked_scatter_sub_custom_call(kernel, ids, updates, mask)
    np.testing.assert_array_equal(compiled.numpy().view(np.uint32), kernel.numpy().view(np.uint32))


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_half_precision_dtypes(dtype):
    table = tf.Variable(tf.cast([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype))
    _jit_update(table)(
        tf.constant([2, 0, 2]), tf.cast([[1.0, 1.0], [9.0, 9.0], [0.5, 0.5]], dtype),
        tf.constant([False, True, True]),
    )  # fmt: skip
    expected = np.array([[1.0, 2.0], [3.0, 4.0], [3.5, 4.5]])
    np.testing.assert_array_equal(tf.cast(table, tf.float64).numpy(), expected)


def test_compiles_to_an_aliased_custom_call():
    table, ids, updates, mask = _random_case(np.float32, np.int32, seed=7)
    update = _jit_update(tf.Variable(table))
    hlo = update.experimental_get_compiler_ir(ids, updates, mask)(stage="hlo")
    assert _TARGET in hlo
    assert "output_to_operand_aliasing={{}: (0, {})}" in hlo
    assert "api_version=API_VERSION_TYPED_FFI" in hlo
    assert "scatter(" not in hlo  # No stock scatter left over.


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_indices_out_of_range_are_skipped(index_dtype):
    """XLA has no run-time errors: like XLA's own scatters (and the stock-op
    path), the custom call skips an index outside ``[0, V)`` and writes the
    valid permitted positions."""
    table, ids, updates, mask = _random_case(np.float32, index_dtype, seed=11)
    bad = np.zeros(ids.shape, bool)
    bad[1, 2], bad[2, 0], bad[3, 5] = True, True, True
    ids[1, 2], ids[2, 0], ids[3, 5] = len(table), -1, np.iinfo(index_dtype).max
    variable = tf.Variable(table)
    _jit_update(variable)(ids, updates, mask)
    expected = _reference(table, ids[~bad], updates[~bad], mask)
    np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)
    written = np.unique(ids[~bad][mask[ids[~bad]]])
    kept = np.setdiff1d(np.arange(len(table)), written)
    assert_bits_equal(variable.numpy()[kept], table[kept], "rows not written")
    assert not bits_equal(variable.numpy()[written], table[written]), "nothing was written"


def test_only_bad_indices_write_nothing():
    table = np.arange(10.0, dtype=np.float32).reshape(5, 2)
    variable = tf.Variable(table)
    _jit_update(variable)(tf.constant([[5], [-2]]), tf.ones([2, 1, 2]), tf.constant([True] * 5))
    assert_bits_equal(variable, table, "after a call of bad indices only")


def test_wrong_row_mask_shape_raises_before_running():
    table = np.ones([4, 2], np.float32)
    variable = tf.Variable(table)
    with pytest.raises(PartialEmbeddingArgumentError, match=r"row_mask: shape \[3\] must be \[4\]"):
        _jit_update(variable)(tf.constant([0]), tf.ones([1, 2]), tf.constant([True] * 3))
    np.testing.assert_array_equal(variable.numpy(), table)


def test_outside_xla_it_is_the_kernel():
    variable = tf.Variable([[1.0], [2.0]])
    xla_custom_call.masked_scatter_sub_custom_call(variable, [1, 1], [[0.5], [0.25]], [True, True])
    np.testing.assert_array_equal(variable.numpy(), [[1.0], [1.25]])


# --- the fused rule step (MaskedSparseApplyRule) with full-size slots -----------------

_RULE_TARGET = 'custom_call_target="partial_embedding_masked_sparse_apply_rule"'
_NUM_ROWS, _WIDTH, _COUNT = 40, 3, 30


def _rule_case(rule, dtype):
    """var, the rule's full-size slots, ids with a permitted duplicate, grad, mask."""
    rng = make_rng("xla rule custom call", rule, dtype)
    dtype = numpy_dtype(dtype)
    table = rng.standard_normal([_NUM_ROWS, _WIDTH]).astype(dtype)
    tables = [table, *fused_slot_values(RULES[rule].slots, rng, _NUM_ROWS, _WIDTH, dtype)]
    ids = rng.integers(0, _NUM_ROWS, _COUNT).astype(np.int32)
    ids[:4] = 11  # A duplicate, summed before the step.
    grad = rng.standard_normal([_COUNT, _WIDTH]).astype(dtype)
    mask = rng.random(_NUM_ROWS) < 0.5
    mask[11] = True
    return tables, ids, grad, mask


def _rule_step(rule, variables, jit, hyperparameters=None):
    """The rule's step on ``variables`` (var, then its slots)."""
    if hyperparameters is None:
        hyperparameters = fused_hyperparameters(RULES[rule].hyperparameters)

    def step(ids, grad, mask):
        xla_custom_call.masked_sparse_apply_rule_custom_call(
            rule, variables[0], variables[1:], ids, grad, mask, hyperparameters,
            slot_indices=None,
        )  # fmt: skip

    return tf.function(step, jit_compile=True) if jit else step


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rule", list(RULES))
def test_rule_same_bits_as_the_kernel(rule, dtype):
    tables, ids, grad, mask = _rule_case(rule, dtype)
    compiled = [tf.Variable(t) for t in tables]
    kernel = [tf.Variable(t) for t in tables]
    _rule_step(rule, compiled, jit=True)(ids, grad, mask)
    _rule_step(rule, kernel, jit=False)(ids, grad, mask)
    assert_rule_tables_as_the_kernel(rule, compiled, kernel, tables)
    for got, before in zip(compiled, tables):
        assert_bits_equal(got.numpy()[~mask], before[~mask], f"{rule}: frozen rows")
    assert not bits_equal(compiled[0].numpy()[11], tables[0][11]), "row 11 was not stepped"


def test_rule_compiles_to_one_aliased_custom_call():
    tables, ids, grad, mask = _rule_case("amsgrad", "float32")
    step = _rule_step("amsgrad", [tf.Variable(t) for t in tables], jit=True)
    text = step.experimental_get_compiler_ir(ids, grad, mask)(stage="hlo")
    assert text.count(_RULE_TARGET) == 1
    assert 'backend_config={rule = "amsgrad"}' in text
    assert "{0}: (0, {}), {1}: (1, {}), {2}: (2, {}), {3}: (3, {})" in text
    assert "scatter(" not in text and "sort(" not in text


def test_rule_without_slots_has_one_aliased_result():
    tables, ids, grad, mask = _rule_case("sgd", "float32")
    step = _rule_step("sgd", [tf.Variable(t) for t in tables], jit=True)
    text = step.experimental_get_compiler_ir(ids, grad, mask)(stage="hlo")
    assert text.count(_RULE_TARGET) == 1
    assert "output_to_operand_aliasing={{}: (0, {})}" in text


@pytest.mark.parametrize("rule", ["adam", "rowwise_adam", "sgd"])
def test_rule_indices_out_of_range_are_skipped(rule):
    """The same bad-id rule as every XLA path: an index outside ``[0, V)`` is
    skipped, the other positions are stepped as the kernel steps them."""
    tables, ids, grad, mask = _rule_case(rule, "float32")
    ids[5], ids[9], ids[20] = _NUM_ROWS, -3, ids[0]
    ids[2] = -1  # One occurrence of the permitted duplicate (row 11).
    kept = (ids >= 0) & (ids < _NUM_ROWS)
    compiled = [tf.Variable(t) for t in tables]
    kernel = [tf.Variable(t) for t in tables]
    _rule_step(rule, compiled, jit=True)(ids, grad, mask)
    _rule_step(rule, kernel, jit=False)(ids[kept], grad[kept], mask)
    assert_rule_tables_as_the_kernel(rule, compiled, kernel, tables)
    for got, before in zip(compiled, tables):
        assert_bits_equal(got.numpy()[~mask], before[~mask], f"{rule}: frozen rows")
    assert not bits_equal(compiled[0].numpy()[11], tables[0][11]), "row 11 was not stepped"


def test_rule_slot_of_another_shape_is_refused_before_running():
    tables, ids, grad, mask = _rule_case("adam", "float32")
    variables = [tf.Variable(t) for t in tables]
    variables[1] = tf.Variable(tables[1][:5])
    with pytest.raises(ValueError, match=r"momentum: shape \[5,3\] does not match"):
        _rule_step("adam", variables, jit=True)(ids, grad, mask)
    assert_bits_equal(variables[0], tables[0], "var")


def test_rule_missing_hyperparameter_is_refused_before_running():
    tables, ids, grad, mask = _rule_case("momentum", "float32")
    variables = [tf.Variable(t) for t in tables]
    step = _rule_step("momentum", variables, jit=True, hyperparameters={"learning_rate": 0.1})
    with pytest.raises(PartialEmbeddingArgumentError, match="missing: momentum"):
        step(ids, grad, mask)
    assert_bits_equal(variables[0], tables[0], "var")
