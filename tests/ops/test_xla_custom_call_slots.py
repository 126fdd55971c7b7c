"""MaskedSparseApplyRuleWithSlotIndices (compact slots) as an XLA custom call,
for every rule of the table.

The lowering in cc/xla/ runs the kernel's own fused code; under XLA a position
whose slot index is negative is skipped (the optimizer's XLA path numbers ids
outside ``[0, V)``, frozen rows and rows without a slot row so). Skips where the
optional library was not built or is not in effect in this process.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding._internal.rule_table import RULES
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

_NUM_ROWS, _WIDTH, _SLOT_ROWS, _COUNT = 40, 3, 12, 30
_TARGET = 'custom_call_target="partial_embedding_masked_sparse_apply_rule_slots"'


def _case(rule, dtype, index_dtype=np.int32):
    """A table, the rule's compact slots, ids with a permitted duplicate, their
    slot rows, the gradient and the mask."""
    rng = make_rng("xla rule custom call, compact slots", rule, dtype)
    dtype = numpy_dtype(dtype)
    table = rng.standard_normal([_NUM_ROWS, _WIDTH]).astype(dtype)
    slots = fused_slot_values(RULES[rule].slots, rng, _SLOT_ROWS, _WIDTH, dtype)
    mask = np.zeros(_NUM_ROWS, bool)
    permitted = rng.choice(_NUM_ROWS, _SLOT_ROWS, replace=False)
    mask[permitted] = True
    slot_of_row = np.zeros(_NUM_ROWS, index_dtype)
    slot_of_row[permitted] = rng.permutation(_SLOT_ROWS)
    ids = rng.integers(0, _NUM_ROWS, _COUNT).astype(index_dtype)
    ids[:4] = permitted[0]  # A duplicate, summed before the step.
    grad = rng.standard_normal([_COUNT, _WIDTH]).astype(dtype)
    return [table, *slots], ids, slot_of_row[ids], grad, mask


def _step(rule, variables, jit):
    hyperparameters = fused_hyperparameters(RULES[rule].hyperparameters)

    def step(ids, slot_indices, grad, mask):
        xla_custom_call.masked_sparse_apply_rule_custom_call(
            rule, variables[0], variables[1:], ids, grad, mask, hyperparameters,
            slot_indices=slot_indices,
        )  # fmt: skip

    return tf.function(step, jit_compile=True) if jit else step


def _with_skips(ids, slot_indices):
    """Marks positions -1 as the optimizer's XLA path does (ids outside
    ``[0, V)``, which the kernel would refuse, and a valid position), and
    leaves one id outside ``[0, V)`` with a valid slot index: skipped too."""
    ids[[5, 9, 17]] = [_NUM_ROWS, -3, _NUM_ROWS + 7]
    slot_indices[[5, 9]] = -1
    slot_indices[[2, 12]] = -1  # One occurrence of the duplicate, and another row.
    return (slot_indices >= 0) & (ids >= 0) & (ids < _NUM_ROWS)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rule", list(RULES))
def test_same_bits_as_the_kernel_skipping_negative_slot_indices(rule, dtype):
    tables, ids, slot_indices, grad, mask = _case(rule, dtype)
    kept = _with_skips(ids, slot_indices)
    compiled = [tf.Variable(t) for t in tables]
    kernel = [tf.Variable(t) for t in tables]
    _step(rule, compiled, jit=True)(ids, slot_indices, grad, mask)
    # The kernel refuses negative slot indices: it gets the kept positions.
    _step(rule, kernel, jit=False)(ids[kept], slot_indices[kept], grad[kept], mask)
    names = ["var", *(slot for slot, _ in RULES[rule].slots)]
    assert_rule_tables_as_the_kernel(rule, compiled, kernel, tables)
    assert_bits_equal(compiled[0].numpy()[~mask], tables[0][~mask], "frozen rows")
    assert not bits_equal(compiled[0].numpy()[ids[0]], tables[0][ids[0]]), "not stepped"
    stepped = np.unique(slot_indices[kept][mask[ids[kept]]])
    unused = np.setdiff1d(np.arange(_SLOT_ROWS), stepped)
    for name, got, before in zip(names[1:], compiled[1:], tables[1:]):
        assert_bits_equal(got.numpy()[unused], before[unused], f"{rule} {name}: unused slot rows")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rule", ["rmsprop_centered_momentum", "rowwise_adam"])
def test_half_precision_same_bits_as_the_kernel(rule, dtype):
    tables, ids, slot_indices, grad, mask = _case(rule, dtype, np.int64)
    compiled = [tf.Variable(t) for t in tables]
    kernel = [tf.Variable(t) for t in tables]
    _step(rule, compiled, jit=True)(ids, slot_indices, grad, mask)
    _step(rule, kernel, jit=False)(ids, slot_indices, grad, mask)
    assert_rule_tables_as_the_kernel(rule, compiled, kernel, tables)


def _slot_out_of_range(ids, slot_indices):
    slot_indices[3] = _SLOT_ROWS


def _duplicate_in_two_slot_rows(ids, slot_indices):
    slot_indices[2] = (slot_indices[2] + 1) % _SLOT_ROWS  # ids[2] is ids[0], permitted.


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_slot_out_of_range, r"slot_indices\[3\] = 12 is not in \[0, 12\)"),
        (_duplicate_in_two_slot_rows, "must name the same slot row"),
    ],
)
def test_bad_slot_indices_raise_and_write_nothing(change, message):
    """Slot indices that break the slot map are refused before any write. The
    CUDA handlers (here on the emulator) cannot raise: an error would need a
    wait for the device in every step; they write nothing instead."""
    tables, ids, slot_indices, grad, mask = _case("adam", "float32")
    change(ids, slot_indices)
    variables = [tf.Variable(t) for t in tables]
    step = _step("adam", variables, jit=True)
    if xla_handlers_emulated():
        step(ids, slot_indices, grad, mask)
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            step(ids, slot_indices, grad, mask)
    for variable, table in zip(variables, tables):
        assert_bits_equal(variable, table, "after a refused step")


def test_compiles_to_one_aliased_custom_call():
    tables, ids, slot_indices, grad, mask = _case("rowwise_adam", "float32")
    step = _step("rowwise_adam", [tf.Variable(t) for t in tables], jit=True)
    text = step.experimental_get_compiler_ir(ids, slot_indices, grad, mask)(stage="hlo")
    assert text.count(_TARGET) == 1
    assert 'backend_config={rule = "rowwise_adam"}' in text
    assert "{0}: (0, {}), {1}: (1, {}), {2}: (2, {})" in text
    assert "scatter(" not in text and "sort(" not in text
