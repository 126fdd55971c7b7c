"""masked_scatter_sub as an XLA custom call (ops/xla_custom_call.py, cc/xla/).

Skips where the optional library was not built (CMake ``PE_ENABLE_XLA_FFI``)
or was loaded too late to take effect in this process.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding.errors import PartialEmbeddingArgumentError
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


def test_index_out_of_range_raises_and_writes_nothing():
    table = np.arange(10.0, dtype=np.float32).reshape(5, 2)
    variable = tf.Variable(table)
    message = r"indices\[1, 0\] = 5 is not in \[0, 5\); nothing was written"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _jit_update(variable)(
            tf.constant([[0], [5]]), tf.ones([2, 1, 2]), tf.constant([True] * 5)
        )  # fmt: skip
    np.testing.assert_array_equal(variable.numpy(), table)


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


_ADAM_HYPER = dict(
    learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7, alpha=0.003, weight_decay=0.004
)


def _adam_case(dtype, seed):
    rng = np.random.default_rng(seed)
    num_rows, width, count = 40, 3, 30
    tables = [rng.standard_normal([num_rows, width]).astype(dtype) for _ in range(2)]
    tables.append(np.abs(rng.standard_normal([num_rows, width])).astype(dtype))
    tables.append((tables[2] * 1.5).astype(dtype))  # v_hat >= v in places
    ids = rng.integers(0, num_rows, count).astype(np.int32)
    ids[:4] = 11  # A duplicate, summed before the step.
    grad = rng.standard_normal([count, width]).astype(dtype)
    mask = rng.random(num_rows) < 0.5
    mask[11] = True
    return tables, ids, grad, mask


def _adam_reference(tables, ids, grad, mask, amsgrad):
    """Lazy Adam/AdamW(/AMSGrad) on the permitted rows in float64, as documented."""
    var, m, v, v_hat = (t.astype(np.float64) for t in tables)
    h = _ADAM_HYPER
    for row in np.unique(ids):
        if not mask[row]:
            continue
        g = grad[ids == row].astype(np.float64).sum(axis=0)
        var[row] -= var[row] * h["weight_decay"] * h["learning_rate"]
        m[row] += (g - m[row]) * (1 - h["beta_1"])
        v[row] += (g * g - v[row]) * (1 - h["beta_2"])
        second = v[row]
        if amsgrad:
            v_hat[row] = np.maximum(v_hat[row], v[row])
            second = v_hat[row]
        var[row] -= m[row] * h["alpha"] / (np.sqrt(second) + h["epsilon"])
    return [var, m, v, v_hat]


def _adam_step(variables, amsgrad, jit):
    def step(ids, grad, mask):
        xla_custom_call.masked_sparse_apply_adam_custom_call(
            *variables[:3], ids, grad, mask, v_hat=variables[3] if amsgrad else None, **_ADAM_HYPER
        )

    return tf.function(step, jit_compile=True) if jit else step


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_matches_reference_and_the_kernel_bits(amsgrad, dtype):
    tables, ids, grad, mask = _adam_case(dtype, seed=11)
    compiled = [tf.Variable(t) for t in tables]
    kernel = [tf.Variable(t) for t in tables]
    _adam_step(compiled, amsgrad, jit=True)(ids, grad, mask)
    _adam_step(kernel, amsgrad, jit=False)(ids, grad, mask)
    expected = _adam_reference(tables, ids, grad, mask, amsgrad)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for name, got, want, before, other in zip(
        "m v v_hat".split(), compiled[1:], expected[1:], tables[1:], kernel[1:]
    ):
        np.testing.assert_allclose(got.numpy(), want, rtol=tolerance, atol=tolerance, err_msg=name)
        np.testing.assert_array_equal(got.numpy()[~mask], before[~mask])
        np.testing.assert_array_equal(got.numpy(), other.numpy())
    np.testing.assert_allclose(compiled[0].numpy(), expected[0], rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(compiled[0].numpy()[~mask], tables[0][~mask])
    np.testing.assert_array_equal(compiled[0].numpy(), kernel[0].numpy())


def test_adam_compiles_to_one_aliased_custom_call():
    tables, ids, grad, mask = _adam_case(np.float32, seed=13)
    step = _adam_step([tf.Variable(t) for t in tables], amsgrad=False, jit=True)
    text = step.experimental_get_compiler_ir(ids, grad, mask)(stage="hlo")
    assert text.count('custom_call_target="partial_embedding_masked_sparse_apply_adam"') == 1
    assert "output_to_operand_aliasing={{0}: (0, {}), {1}: (1, {}), {2}: (2, {})}" in text
    assert "scatter(" not in text and "sort(" not in text


def test_adam_index_out_of_range_raises_and_writes_nothing():
    tables, ids, grad, mask = _adam_case(np.float32, seed=17)
    ids[5] = 40
    variables = [tf.Variable(t) for t in tables]
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"indices\[5\] = 40 is not in \[0, 40\)"
    ):
        _adam_step(variables, amsgrad=False, jit=True)(ids, grad, mask)
    for variable, table in zip(variables, tables):
        np.testing.assert_array_equal(variable.numpy(), table)


def test_adam_slot_of_another_shape_is_refused_before_running():
    tables, ids, grad, mask = _adam_case(np.float32, seed=19)
    variables = [tf.Variable(t) for t in tables]
    variables[1] = tf.Variable(tables[1][:5])
    with pytest.raises(ValueError, match=r"m: shape \[5,3\] does not match"):
        _adam_step(variables, amsgrad=False, jit=True)(ids, grad, mask)
    np.testing.assert_array_equal(variables[0].numpy(), tables[0])
