"""The pybind11 kernel module's CPU path against a float64 NumPy reference."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest


def _load_kernels():
    """The module under test: the package's, or the file PE_KERNELS_MODULE_PATH names.

    build_tools/sanitize.sh points PE_KERNELS_MODULE_PATH at a build with
    AddressSanitizer and UndefinedBehaviorSanitizer; loading it by path keeps
    the package (and TensorFlow) out of the sanitized process.
    """
    path = os.environ.get("PE_KERNELS_MODULE_PATH")
    if not path:
        return pytest.importorskip("partial_embedding._kernels")
    spec = importlib.util.spec_from_file_location("_kernels", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernels = _load_kernels()
ml_dtypes = pytest.importorskip("ml_dtypes")

VALUE_DTYPES = ["float16", "bfloat16", "float32", "float64"]
INDEX_DTYPES = [np.int32, np.int64]
# Unit roundoff of each stored type: every update of a row may round once.
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}


def numpy_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def reference(var, indices, updates, row_mask):
    """var - sum of the permitted updates in float64, and an error bound.

    The bound allows one rounding per update of a row, each at most the unit
    roundoff times the largest magnitude the row's running value can reach.
    """
    result = var.astype(np.float64)
    magnitude = np.abs(result)
    flat_indices = indices.reshape(-1)
    flat_updates = updates.reshape(flat_indices.size, -1).astype(np.float64)
    keep = row_mask[flat_indices]
    np.subtract.at(result.reshape(var.shape[0], -1), flat_indices[keep], flat_updates[keep])
    np.add.at(magnitude.reshape(var.shape[0], -1), flat_indices[keep], np.abs(flat_updates[keep]))
    counts = np.bincount(flat_indices[keep], minlength=var.shape[0]).astype(np.float64)
    roundings = (counts + 1).reshape((-1,) + (1,) * (var.ndim - 1))
    unit = UNIT_ROUNDOFF[numpy_dtype_name(var.dtype)]
    return result, unit * roundings * magnitude


def numpy_dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype == np.dtype(ml_dtypes.bfloat16) else dtype.name


def assert_within(actual, expected, bound):
    error = np.abs(actual.astype(np.float64) - expected)
    worst = np.argmax(error - bound) if error.size else 0
    assert np.all(error <= bound), (
        f"error {error.flat[worst]:.3g} > bound {bound.flat[worst]:.3g} at flat "
        f"position {worst}: got {actual.flat[worst]}, expected {expected.flat[worst]}"
    )


def make_problem(rng, value_dtype, index_dtype, num_rows, row_shape, indices_shape):
    dtype = numpy_dtype(value_dtype)
    var = rng.standard_normal((num_rows, *row_shape)).astype(dtype)
    # Few distinct rows, so duplicates are common.
    indices = rng.integers(0, num_rows, size=indices_shape).astype(index_dtype)
    updates = rng.standard_normal((*indices_shape, *row_shape)).astype(dtype)
    row_mask = rng.random(num_rows) < 0.6
    return var, indices, updates, row_mask


@pytest.fixture
def rng():
    return np.random.default_rng()  # Fresh inputs every run.


@pytest.mark.parametrize("value_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("num_threads", [1, 3])
def test_matches_reference(rng, value_dtype, index_dtype, num_threads):
    for _ in range(5):
        num_rows = int(rng.integers(1, 50))
        row_shape = tuple(int(d) for d in rng.integers(1, 6, size=rng.integers(0, 3)))
        indices_shape = tuple(int(d) for d in rng.integers(1, 8, size=rng.integers(1, 3)))
        var, indices, updates, row_mask = make_problem(
            rng, value_dtype, index_dtype, num_rows, row_shape, indices_shape
        )
        before = var.copy()
        expected, bound = reference(var, indices, updates, row_mask)

        kernels.masked_scatter_sub_cpu(var, indices, updates, row_mask, num_threads=num_threads)

        assert_within(var, expected, bound)
        # Frozen rows and rows never indexed stay untouched, bit for bit.
        untouched = ~row_mask.copy()
        untouched[np.setdiff1d(np.arange(num_rows), indices.reshape(-1))] = True
        np.testing.assert_array_equal(
            var[untouched].view(np.uint8), before[untouched].view(np.uint8)
        )


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_heavy_duplicates_large_rows(rng, index_dtype):
    # Enough work for several threads; one hot row takes most updates.
    var, indices, updates, row_mask = make_problem(rng, "float32", index_dtype, 300, (64,), (4000,))
    indices[rng.random(indices.size) < 0.5] = 7
    row_mask[7] = True
    expected, bound = reference(var, indices, updates, row_mask)
    kernels.masked_scatter_sub_cpu(var, indices, updates, row_mask, num_threads=4)
    assert_within(var, expected, bound)


def test_bfloat16_as_uint16_bits(rng):
    var, indices, updates, row_mask = make_problem(rng, "bfloat16", np.int64, 20, (8,), (30,))
    expected_var = var.copy()
    kernels.masked_scatter_sub_cpu(expected_var, indices, updates, row_mask)
    bits = var.view(np.uint16)
    kernels.masked_scatter_sub_cpu(
        bits, indices, updates.view(np.uint16), row_mask, dtype="bfloat16"
    )
    np.testing.assert_array_equal(bits, expected_var.view(np.uint16))


@pytest.mark.parametrize("value_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("bad_value", [-1, 10, 1 << 30])
def test_out_of_range_raises_and_writes_nothing(rng, value_dtype, index_dtype, bad_value):
    var, indices, updates, row_mask = make_problem(rng, value_dtype, index_dtype, 10, (3,), (4, 5))
    row_mask[:] = True
    indices[2, 3] = bad_value
    indices[3, 1] = -5  # A later bad position is not the one reported.
    before = var.copy()
    with pytest.raises(
        IndexError,
        match=rf"indices\[2, 3\] = {bad_value} is not in \[0, 10\); nothing was written",
    ):
        kernels.masked_scatter_sub_cpu(var, indices, updates, row_mask)
    np.testing.assert_array_equal(var.view(np.uint8), before.view(np.uint8))


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda a: {**a, "updates": np.ascontiguousarray(a["updates"][:, :2])},
            r"updates: shape \(4, 2\) must be \(4, 3\)",
        ),
        (lambda a: {**a, "row_mask": a["row_mask"][:5]}, r"row_mask: shape \(5,\) must be \(10,\)"),
        (
            lambda a: {**a, "row_mask": a["row_mask"].astype(np.int8)},
            r"row_mask: dtype int8 is not bool",
        ),
        (lambda a: {**a, "indices": a["indices"].astype(np.float32)}, r"indices: dtype float32"),
        (
            lambda a: {**a, "updates": a["updates"].astype(np.float64)},
            r"updates: dtype float64 does not match",
        ),
        (lambda a: {**a, "var": a["var"].astype(np.int32)}, r"var: dtype int32"),
        (
            lambda a: {**a, "var": np.asfortranarray(np.ones((10, 3), np.float32))[:, :]},
            r"var: must be C-contiguous",
        ),
    ],
)
def test_bad_arguments_raise_value_error(rng, change, message):
    var, indices, updates, row_mask = make_problem(rng, "float32", np.int32, 10, (3,), (4,))
    arguments = change({"var": var, "indices": indices, "updates": updates, "row_mask": row_mask})
    with pytest.raises(ValueError, match=message):
        kernels.masked_scatter_sub_cpu(**arguments)


def test_read_only_var_raises(rng):
    var, indices, updates, row_mask = make_problem(rng, "float32", np.int32, 10, (3,), (4,))
    var.setflags(write=False)
    with pytest.raises(ValueError, match="var: must be writable"):
        kernels.masked_scatter_sub_cpu(var, indices, updates, row_mask)


def test_empty_indices_is_a_no_op(rng):
    var, _, _, row_mask = make_problem(rng, "float32", np.int64, 10, (3,), (1,))
    before = var.copy()
    kernels.masked_scatter_sub_cpu(
        var, np.zeros((0,), np.int64), np.zeros((0, 3), np.float32), row_mask
    )
    np.testing.assert_array_equal(var, before)
