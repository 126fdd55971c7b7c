"""MaskedSparseApplyAdamWithSlotIndices (compact slots) as an XLA custom call.

The lowering in cc/xla/ runs the kernel's own fused code; under XLA a position
whose slot index is negative is skipped (the optimizer's XLA path numbers ids
outside ``[0, V)`` and rows without a slot row so). Skips where the optional
library was not built or is not in effect in this process.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding.ops import xla_custom_call

# These test XLA's CPU custom calls: on a machine with a GPU too.
pytestmark = pytest.mark.usefixtures("on_cpu")

if not os.path.exists(xla_custom_call.xla_library_path()):
    pytest.skip(
        "the XLA custom-call library was not built (PE_ENABLE_XLA_FFI=OFF)",
        allow_module_level=True,
    )
if not xla_custom_call.load_xla_custom_calls():
    pytest.skip(
        "the XLA custom-call library loaded after this process's first XLA compilation",
        allow_module_level=True,
    )

_HYPER = dict(
    learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7, alpha=0.003, weight_decay=0.004
)
_NUM_ROWS, _WIDTH, _SLOT_ROWS = 40, 3, 12


def _case(dtype, seed):
    """A table, compact slots, ids with a permitted duplicate, their slot rows."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal([_NUM_ROWS, _WIDTH]).astype(dtype)
    m = rng.standard_normal([_SLOT_ROWS, _WIDTH]).astype(dtype)
    v = np.abs(rng.standard_normal([_SLOT_ROWS, _WIDTH])).astype(dtype)
    v_hat = (v * 1.5).astype(dtype)
    mask = np.zeros(_NUM_ROWS, bool)
    permitted = rng.choice(_NUM_ROWS, _SLOT_ROWS, replace=False)
    mask[permitted] = True
    slot_of_row = np.zeros(_NUM_ROWS, np.int64)
    slot_of_row[permitted] = rng.permutation(_SLOT_ROWS)
    ids = rng.integers(0, _NUM_ROWS, 30)
    ids[:4] = permitted[0]  # A duplicate, summed before the step.
    grad = rng.standard_normal([30, _WIDTH]).astype(dtype)
    return [table, m, v, v_hat], ids, slot_of_row[ids], grad, mask


def _reference(tables, ids, slots, grad, mask, amsgrad):
    """Lazy AdamW(/AMSGrad) on the permitted rows in float64, as documented."""
    var, m, v, v_hat = (t.astype(np.float64) for t in tables)
    h = _HYPER
    for row in np.unique(ids):
        if not mask[row]:
            continue
        s = slots[ids == row][0]
        g = grad[ids == row].astype(np.float64).sum(axis=0)
        var[row] -= var[row] * h["weight_decay"] * h["learning_rate"]
        m[s] += (g - m[s]) * (1 - h["beta_1"])
        v[s] += (g * g - v[s]) * (1 - h["beta_2"])
        second = v[s]
        if amsgrad:
            v_hat[s] = np.maximum(v_hat[s], v[s])
            second = v_hat[s]
        var[row] -= m[s] * h["alpha"] / (np.sqrt(second) + h["epsilon"])
    return [var, m, v, v_hat]


def _step(variables, amsgrad, jit):
    def step(ids, slots, grad, mask):
        xla_custom_call.masked_sparse_apply_adam_custom_call(
            *variables[:3], ids, grad, mask, v_hat=variables[3] if amsgrad else None,
            slot_indices=slots, **_HYPER,
        )  # fmt: skip

    return tf.function(step, jit_compile=True) if jit else step


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_reference_and_the_kernel_bits(amsgrad, dtype):
    tables, ids, slots, grad, mask = _case(dtype, seed=21)
    compiled = [tf.Variable(t) for t in tables]
    kernel = [tf.Variable(t) for t in tables]
    _step(compiled, amsgrad, jit=True)(ids, slots, grad, mask)
    _step(kernel, amsgrad, jit=False)(ids, slots, grad, mask)
    expected = _reference(tables, ids, slots, grad, mask, amsgrad)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for got, want, other in zip(compiled, expected, kernel):
        np.testing.assert_allclose(got.numpy(), want, rtol=tolerance, atol=tolerance)
        np.testing.assert_array_equal(got.numpy().view(np.uint8), other.numpy().view(np.uint8))
    frozen = compiled[0].numpy()[~mask]
    np.testing.assert_array_equal(frozen.view(np.uint8), tables[0][~mask].view(np.uint8))
    unused = np.setdiff1d(np.arange(_SLOT_ROWS), slots[mask[ids]])
    np.testing.assert_array_equal(compiled[1].numpy()[unused], tables[1][unused])


def test_negative_slot_index_skips_the_position_under_xla():
    tables, ids, slots, grad, mask = _case(np.float32, seed=23)
    ids[[5, 9]] = [_NUM_ROWS, -3]  # Outside [0, V): skipped, never checked.
    slots[[5, 9]] = -1
    slots[12] = -1  # A valid position, skipped too.
    compiled = [tf.Variable(t) for t in tables]
    kernel = [tf.Variable(t) for t in tables]
    _step(compiled, False, jit=True)(ids, slots, grad, mask)
    kept = slots >= 0
    _step(kernel, False, jit=False)(ids[kept], slots[kept], grad[kept], mask)
    for got, other in zip(compiled, kernel):
        np.testing.assert_array_equal(got.numpy().view(np.uint32), other.numpy().view(np.uint32))


def _slot_out_of_range(ids, slots):
    slots[3] = _SLOT_ROWS


def _row_out_of_range(ids, slots):
    ids[6] = _NUM_ROWS


def _duplicate_in_two_slot_rows(ids, slots):
    slots[2] = (slots[2] + 1) % _SLOT_ROWS  # ids[2] is ids[0], a permitted row.


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_slot_out_of_range, r"slot_indices\[3\] = 12 is not in \[0, 12\)"),
        (_row_out_of_range, r"indices\[6\] = 40 is not in \[0, 40\)"),
        (_duplicate_in_two_slot_rows, "must name the same slot row"),
    ],
)
def test_bad_slot_indices_raise_and_write_nothing(change, message):
    tables, ids, slots, grad, mask = _case(np.float32, seed=25)
    change(ids, slots)
    variables = [tf.Variable(t) for t in tables]
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _step(variables, False, jit=True)(ids, slots, grad, mask)
    for variable, table in zip(variables, tables):
        np.testing.assert_array_equal(variable.numpy(), table)


def test_compiles_to_one_aliased_custom_call():
    tables, ids, slots, grad, mask = _case(np.float32, seed=27)
    step = _step([tf.Variable(t) for t in tables], amsgrad=True, jit=True)
    text = step.experimental_get_compiler_ir(ids, slots, grad, mask)(stage="hlo")
    target = 'custom_call_target="partial_embedding_masked_sparse_apply_amsgrad_slots"'
    assert text.count(target) == 1
    assert "{3}: (3, {})" in text
    assert "scatter(" not in text and "sort(" not in text
