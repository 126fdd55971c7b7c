"""The pybind11 kernel module's CPU path against a float64 NumPy reference."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

from pe_testing import (
    INDEX_DTYPE_NAMES,
    VALUE_DTYPE_NAMES,
    masked_scatter_sub_reference,
    numpy_dtype,
    unit_roundoff,
)


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
pytest.importorskip("ml_dtypes")  # NumPy's bfloat16


def reference(var, indices, updates, row_mask):
    """var - sum of the permitted updates in float64, and an error bound.

    The bound allows one rounding per update of a row, each at most the unit
    roundoff times the largest magnitude the row's running value can reach.
    """
    expected, hits, magnitude = masked_scatter_sub_reference(var, indices, updates, row_mask)
    roundings = (hits + 1).reshape((-1,) + (1,) * (var.ndim - 1))
    return expected, unit_roundoff(var.dtype) * roundings * magnitude


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


@pytest.mark.parametrize("value_dtype", VALUE_DTYPE_NAMES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPE_NAMES)
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


@pytest.mark.parametrize("index_dtype", INDEX_DTYPE_NAMES)
def test_heavy_duplicates_large_rows(rng, index_dtype):
    # Enough work for several threads; one hot row takes most updates.
    var, indices, updates, row_mask = make_problem(rng, "float32", index_dtype, 300, (64,), (4000,))
    indices[rng.random(indices.size) < 0.5] = 7
    row_mask[7] = True
    expected, bound = reference(var, indices, updates, row_mask)
    kernels.masked_scatter_sub_cpu(var, indices, updates, row_mask, num_threads=4)
    assert_within(var, expected, bound)


def test_bfloat16_as_uint16_bits(rng):
    var, indices, updates, row_mask = make_problem(rng, "bfloat16", "int64", 20, (8,), (30,))
    expected_var = var.copy()
    kernels.masked_scatter_sub_cpu(expected_var, indices, updates, row_mask)
    bits = var.view(np.uint16)
    kernels.masked_scatter_sub_cpu(
        bits, indices, updates.view(np.uint16), row_mask, dtype="bfloat16"
    )
    np.testing.assert_array_equal(bits, expected_var.view(np.uint16))


@pytest.mark.parametrize("value_dtype", VALUE_DTYPE_NAMES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPE_NAMES)
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


@pytest.mark.skipif(
    not os.environ.get("PE_KERNELS_MODULE_PATH"),
    reason="only where the module is loaded by path (build_tools/sanitize.sh)",
)
def test_tensorflow_stays_out_of_the_sanitized_process():
    # The sanitizers watch this process; TensorFlow is not instrumented.
    assert "tensorflow" not in sys.modules


# --- masked_sparse_apply_rule_cpu: the fused rules' core, compact slots included ----

ADAM_SCALARS = {
    "learning_rate": 0.01,
    "one_minus_beta_1": 0.1,
    "one_minus_beta_2": 0.001,
    "epsilon": 1e-3,
    "alpha": 0.0123,
}
# The same in the table's order for "adam" (no weight decay).
ADAM_HYPER = [ADAM_SCALARS.get(name, 0.0) for name in kernels.RULES["adam"]["hyperparameters"]]


def test_the_rule_table_is_exported():
    assert list(kernels.RULES)[:3] == ["sgd", "momentum", "nesterov"]
    assert len(kernels.RULES) == 13
    adam = kernels.RULES["adam"]
    assert adam["slots"] == ("momentum", "velocity") and adam["per_row"] == (False, False)
    assert adam["hyperparameters"][:2] == ("learning_rate", "weight_decay")
    assert kernels.RULES["rowwise_adam"]["per_row"] == (False, True)


def test_a_rule_is_refused_by_name_slots_and_hyperparameters(rng):
    var = rng.standard_normal((4, 3)).astype(np.float32)
    before = var.copy()
    slots = [np.zeros_like(var), np.zeros_like(var)]
    indices, gradient, row_mask = np.array([0, 1]), np.ones((2, 3), np.float32), np.ones(4, bool)

    def step(rule, slots, hyperparameters):
        kernels.masked_sparse_apply_rule_cpu(
            rule, var, slots, indices, None, gradient, row_mask, hyperparameters
        )

    with pytest.raises(ValueError, match=r"rule: 'adamw' is not a rule of the table \(sgd, "):
        step("adamw", slots, ADAM_HYPER)
    with pytest.raises(ValueError, match=r"slots: 1 given; rule 'adam' has 2 slot\(s\)"):
        step("adam", slots[:1], ADAM_HYPER)
    with pytest.raises(ValueError, match=r"hyperparameters: shape \(2,\) must be \(6,\)"):
        step("adam", slots, [0.1, 0.0])
    with pytest.raises(ValueError, match=r"velocity: shape \(4, 3\) does not match \[V\]"):
        step("rowwise_adam", slots, [0.1] * 7)
    np.testing.assert_array_equal(var, before)


def adam_model(var, m, v, indices, gradient, row_mask, slot_rows):
    """The core's step for float32/float64, each operation rounded in var's dtype."""
    dtype = var.dtype.type
    s = {k: dtype(x) for k, x in ADAM_SCALARS.items()}
    var, m, v = var.copy(), m.copy(), v.copy()
    for row in dict.fromkeys(indices.tolist()):
        if not row_mask[row]:
            continue
        positions = np.flatnonzero(indices == row)
        slot = row if slot_rows is None else slot_rows[positions[0]]
        g = np.zeros(var.shape[1:], dtype)
        for position in positions:
            g = g + gradient[position]
        m[slot] = m[slot] + (g - m[slot]) * s["one_minus_beta_1"]
        v[slot] = v[slot] + (g * g - v[slot]) * s["one_minus_beta_2"]
        var[row] = var[row] - (m[slot] * s["alpha"]) / (np.sqrt(v[slot]) + s["epsilon"])
    return var, m, v


def adam_case(rng, dtype, index_dtype):
    """A step with duplicates and frozen rows, and a compact slot map for it."""
    var = rng.standard_normal((40, 6)).astype(dtype)
    indices = rng.integers(0, 20, size=90).astype(index_dtype)
    gradient = rng.standard_normal((90, 6)).astype(dtype)
    row_mask = rng.random(40) < 0.6
    m = (0.1 * rng.standard_normal((40, 6))).astype(dtype)
    v = np.abs(0.01 * rng.standard_normal((40, 6))).astype(dtype)
    permitted = np.unique(indices[row_mask[indices]])
    num_slot_rows = len(permitted) + 2
    slot_of_row = dict(zip(permitted.tolist(), rng.permutation(num_slot_rows).tolist()))
    slot_indices = np.array(
        [slot_of_row.get(int(i), int(rng.integers(num_slot_rows))) for i in indices], index_dtype
    )
    compact_m = np.zeros((num_slot_rows, 6), dtype)
    compact_v = np.zeros((num_slot_rows, 6), dtype)
    for row, slot in slot_of_row.items():
        compact_m[slot], compact_v[slot] = m[row], v[row]
    return var, m, v, indices, gradient, row_mask, slot_indices, compact_m, compact_v, slot_of_row


@pytest.mark.parametrize("value_dtype", VALUE_DTYPE_NAMES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPE_NAMES)
def test_adam_compact_slots_equal_full_size_slots(rng, value_dtype, index_dtype):
    var, m, v, indices, gradient, row_mask, slot_indices, cm, cv, slot_of_row = adam_case(
        rng, numpy_dtype(value_dtype), index_dtype
    )
    full = [var.copy(), m.copy(), v.copy()]
    kernels.masked_sparse_apply_rule_cpu(
        "adam", full[0], full[1:], indices, None, gradient, row_mask, ADAM_HYPER
    )
    compact_var = var.copy()
    kernels.masked_sparse_apply_rule_cpu(
        "adam", compact_var, [cm, cv], indices, slot_indices, gradient, row_mask, ADAM_HYPER
    )
    np.testing.assert_array_equal(compact_var.view(np.uint8), full[0].view(np.uint8))
    for row, slot in slot_of_row.items():
        np.testing.assert_array_equal(cm[slot].view(np.uint8), full[1][row].view(np.uint8))
        np.testing.assert_array_equal(cv[slot].view(np.uint8), full[2][row].view(np.uint8))
    if value_dtype in ("float32", "float64"):
        expected = adam_model(var, m, v, indices, gradient, row_mask, None)
        for got, want in zip(full, expected):
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPE_NAMES)
def test_adam_bad_slot_map_raises_and_writes_nothing(rng, index_dtype):
    var, _, _, indices, gradient, row_mask, slot_indices, cm, cv, _ = adam_case(
        rng, np.float32, index_dtype
    )
    first_permitted = int(np.flatnonzero(row_mask[indices])[0])
    out_of_range = slot_indices.copy()
    out_of_range[first_permitted] = cm.shape[0]
    tables = [var.copy(), cm.copy(), cv.copy()]
    with pytest.raises(IndexError, match=rf"slot_indices\[{first_permitted}\] = {cm.shape[0]}"):
        kernels.masked_sparse_apply_rule_cpu(
            "adam", tables[0], tables[1:], indices, out_of_range, gradient, row_mask, ADAM_HYPER
        )
    with pytest.raises(IndexError, match=r"indices\[0\] = 40 is not in \[0, 40\)"):
        bad_indices = indices.copy()
        bad_indices[0] = 40
        kernels.masked_sparse_apply_rule_cpu(
            "adam", tables[0], tables[1:], bad_indices, slot_indices, gradient, row_mask, ADAM_HYPER
        )
    with pytest.raises(
        ValueError, match=r"momentum: shape \(3, 6\) does not match var's shape \(40, 6\)"
    ):
        kernels.masked_sparse_apply_rule_cpu(
            "adam", var.copy(), [cm[:3].copy(), cv[:3].copy()], indices, None, gradient,
            row_mask, ADAM_HYPER,
        )  # fmt: skip
    for got, want in zip(tables, (var, cm, cv)):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def quantized_case(rng, index_dtype, num_rows=300, width=11, store_rows=17, num_ids=400):
    codes = rng.integers(-127, 128, size=(num_rows, width)).astype(np.int8)
    scales = rng.uniform(0.5, 200.0, size=num_rows).astype(np.float32)
    trained = rng.choice(num_rows, size=store_rows - 1, replace=False)
    sorted_ids = np.append(np.sort(trained), num_rows).astype(np.int32)
    store_index = np.append(rng.permutation(store_rows - 1), store_rows - 1).astype(np.int32)
    store = rng.standard_normal((store_rows, width)).astype(np.float32)
    ids = rng.integers(0, num_rows, size=num_ids)
    ids[::3] = rng.choice(trained, size=len(ids[::3]))
    return codes, scales, store, sorted_ids, store_index, ids.astype(index_dtype)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPE_NAMES)
@pytest.mark.parametrize("num_threads", [1, 3])
def test_quantized_lookup_matches_numpy(rng, index_dtype, num_threads):
    codes, scales, store, sorted_ids, store_index, ids = quantized_case(rng, index_dtype)
    out = np.zeros((len(ids), codes.shape[1]), np.float32)
    row_of = np.zeros(len(ids), np.int32)
    kernels.quantized_lookup_cpu(
        codes, scales, store, sorted_ids, store_index, ids, out, row_of, num_threads=num_threads
    )
    sentinel = len(sorted_ids) - 1
    position = np.minimum(np.searchsorted(sorted_ids, ids), sentinel)
    found = sorted_ids[position] == ids
    expected_row_of = np.where(found, store_index[position], sentinel)
    # One IEEE float32 division per value, as Keras dequantizes.
    expected = codes[ids].astype(np.float32) / scales[ids][:, None]
    expected[found] = store[expected_row_of[found]]
    np.testing.assert_array_equal(row_of, expected_row_of)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPE_NAMES)
def test_quantized_lookup_refuses_bad_input_and_writes_nothing(rng, index_dtype):
    codes, scales, store, sorted_ids, store_index, ids = quantized_case(rng, index_dtype)
    out = np.full((len(ids), codes.shape[1]), -7.0, np.float32)
    row_of = np.full(len(ids), -7, np.int32)
    bad_ids = ids.copy()
    bad_ids[[5, 9]] = [-1, codes.shape[0]]
    with pytest.raises(IndexError, match=r"ids\[5\] = -1 is not in \[0, 300\); nothing"):
        kernels.quantized_lookup_cpu(codes, scales, store, sorted_ids, store_index, bad_ids,
                                     out, row_of)  # fmt: skip
    bad_index = store_index.copy()
    bad_index[2] = len(bad_index)
    with pytest.raises(ValueError, match=r"store_index: a store row outside \[0, 17\)"):
        kernels.quantized_lookup_cpu(codes, scales, store, sorted_ids, bad_index, ids, out, row_of)
    with pytest.raises(ValueError, match=r"scales: shape \(299,\) must be \(300,\)"):
        kernels.quantized_lookup_cpu(codes, scales[:-1].copy(), store, sorted_ids, store_index,
                                     ids, out, row_of)  # fmt: skip
    assert np.all(out == -7.0) and np.all(row_of == -7)


# --- EmbeddingBag and its gradient (cc/core/embedding_bag.h) -----------------------


def _bag_problem(rng, value_dtype, index_dtype, num_rows=17, width=6, num_bags=9):
    dtype = numpy_dtype(value_dtype)
    compute = np.float64 if value_dtype == "float64" else np.float32
    params = rng.standard_normal([num_rows, width]).astype(dtype)
    lengths = rng.integers(0, 7, size=num_bags)
    bags = np.repeat(np.arange(num_bags), lengths).astype(np.int64)
    ids = rng.integers(-1, num_rows, size=bags.size).astype(numpy_dtype(index_dtype))
    weights = rng.uniform(0.25, 2.0, size=bags.size).astype(compute)
    return params, ids, bags, weights


@pytest.mark.parametrize("index_dtype", INDEX_DTYPE_NAMES)
@pytest.mark.parametrize("value_dtype", VALUE_DTYPE_NAMES)
def test_embedding_bag_and_gradient_match_reference(rng, value_dtype, index_dtype):
    params, ids, bags, weights = _bag_problem(rng, value_dtype, index_dtype)
    num_bags, width = 9, params.shape[1]
    out, factors = kernels.embedding_bag_cpu(
        params, ids, bags, num_bags, weights=weights, combiner="sqrtn"
    )
    kept = ids >= 0
    sums = np.bincount(bags[kept], weights=weights[kept].astype(np.float64) ** 2, minlength=9)
    scale = np.divide(1.0, np.sqrt(sums), out=np.zeros(9), where=sums > 0)
    exact_factors = np.where(kept, weights * scale[bags], 0.0)
    terms = exact_factors[:, None] * params[np.maximum(ids, 0)].astype(np.float64)
    expected = np.zeros([num_bags, width])
    np.add.at(expected, bags, terms)
    magnitude = np.zeros_like(expected)
    np.add.at(magnitude, bags, np.abs(terms))
    compute = 2.0**-53 if value_dtype == "float64" else 2.0**-24
    # Factors: a sum, a square root, a division, a product; then each term
    # and addition (at most 7 a bag) in the compute type; one final rounding.
    bound = (2 * 7 + 4) * compute * magnitude + unit_roundoff(value_dtype) * np.abs(expected)
    assert_within(out, expected, bound)
    np.testing.assert_allclose(factors, exact_factors, rtol=20 * compute)

    row_mask = rng.random(params.shape[0]) < 0.5
    grad = rng.standard_normal([num_bags, width]).astype(params.dtype)
    rows, values = kernels.masked_embedding_bag_grad_cpu(grad, ids, bags, factors, row_mask)
    first_seen = list(dict.fromkeys(int(r) for r in ids if r >= 0 and row_mask[r]))
    assert rows.tolist() == first_seen and rows.dtype == ids.dtype
    dense = np.zeros(params.shape)
    dense_magnitude = np.zeros(params.shape)
    contributions = factors[:, None].astype(np.float64) * grad[bags].astype(np.float64)
    keep = kept & row_mask[np.maximum(ids, 0)]
    np.add.at(dense, ids[keep], contributions[keep])
    np.add.at(dense_magnitude, ids[keep], np.abs(contributions[keep]))
    counts = np.bincount(ids[keep], minlength=params.shape[0])[first_seen][:, None]
    bound = (counts + 1) * compute * dense_magnitude[first_seen] + unit_roundoff(
        value_dtype
    ) * np.abs(dense[first_seen])
    assert_within(values, dense[first_seen], bound)

    bad = ids.copy()
    bad[bags == 4] = params.shape[0]
    position = int(np.flatnonzero(bags == 4)[0]) if (bags == 4).any() else None
    if position is not None:
        with pytest.raises(IndexError, match=rf"sp_ids: bag 4, position 0 = {params.shape[0]}"):
            kernels.embedding_bag_cpu(params, bad, bags, num_bags)


@pytest.mark.parametrize("value_dtype", VALUE_DTYPE_NAMES)
def test_fused_bag_adam_equals_gradient_then_adam(rng, value_dtype):
    """The fused bag backward + Adam (masked_embedding_bag_apply_rule_cpu,
    compact slots whose map already holds every permitted row) gives the bits
    of the bag gradient followed by the Adam step on its rows."""
    params, ids, bags, _ = _bag_problem(rng, value_dtype, "int32")
    row_mask = rng.random(params.shape[0]) < 0.6
    slot_of_row = np.full(params.shape[0], 0, np.int32)
    slot_of_row[row_mask] = rng.permutation(int(row_mask.sum())).astype(np.int32)
    slot_map = np.where(row_mask, slot_of_row, -1).astype(np.float32)
    slots = max(1, int(row_mask.sum()))
    _, factors = kernels.embedding_bag_cpu(params, ids, bags, 9, combiner="mean")
    grad = rng.standard_normal([9, params.shape[1]]).astype(params.dtype)
    m = (rng.standard_normal([slots, params.shape[1]]) * 0.1).astype(params.dtype)
    v = np.abs(rng.standard_normal([slots, params.shape[1]]) * 0.01).astype(params.dtype)
    hyper = [_HYPER[name] for name in kernels.RULES["adam"]["hyperparameters"]]
    fused = [params.copy(), m.copy(), v.copy()]
    map_before = slot_map.copy()
    rows_used = kernels.masked_embedding_bag_apply_rule_cpu(
        "adam", fused[0], fused[1:], grad, ids, bags, factors, row_mask, hyper,
        slot_of_row=slot_map, rows_used=int(row_mask.sum()),
    )  # fmt: skip
    assert rows_used == int(row_mask.sum()) and slot_map.tobytes() == map_before.tobytes()
    two_ops = [params.copy(), m.copy(), v.copy()]
    rows, values = kernels.masked_embedding_bag_grad_cpu(grad, ids, bags, factors, row_mask)
    kernels.masked_sparse_apply_rule_cpu(
        "adam", two_ops[0], two_ops[1:], rows, slot_of_row[rows], values, row_mask, hyper
    )
    for name, a, b in zip(("var", "m", "v"), fused, two_ops):
        assert a.tobytes() == b.tobytes(), f"{name} differs"
    assert fused[0].tobytes() != params.tobytes() or rows.size == 0


def _fused_bag_problem(rng, compact):
    """A fused bag Adam step's arguments (float32, a slot map when ``compact``)."""
    params, ids, bags, _ = _bag_problem(rng, "float32", "int32")
    _, factors = kernels.embedding_bag_cpu(params, ids, bags, 9, combiner="mean")
    num_rows, width = params.shape
    slots = num_rows if not compact else 4
    args = dict(
        var=params, m=np.zeros([slots, width], np.float32), v=np.zeros([slots, width], np.float32),
        grad=np.ones([9, width], np.float32), ids=ids, bags=bags, factors=factors,
        row_mask=np.ones(num_rows, bool),
    )  # fmt: skip
    if compact:
        args["slot_of_row"] = (np.arange(num_rows) % slots).astype(np.float32)
    return args


#: Adam's hyperparameters by name (weight_decay 0).
_HYPER = dict(
    learning_rate=0.01,
    weight_decay=0.0,
    one_minus_beta_1=0.1,
    one_minus_beta_2=0.001,
    epsilon=1e-3,
    alpha=0.02,
)
_POSITIONS = r": must be vectors with one entry per position, got shapes "


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda p, i, b, w: kernels.embedding_bag_cpu(p, i, b[:-1], 9),
            r"ids and bags" + _POSITIONS + r"\(\d+,\) and \(\d+,\)$",
        ),
        (
            lambda p, i, b, w: kernels.embedding_bag_cpu(p, i, b, 9, weights=w[:-1]),
            r"ids, bags and weights" + _POSITIONS,
        ),
        (lambda p, i, b, w: kernels.embedding_bag_cpu(p, i, b, -1), r"num_bags: -1 must be >= 0"),
        (
            lambda p, i, b, w: kernels.embedding_bag_cpu(np.asarray(p[0, 0]), i, b, 9),
            r"params: shape \(\) must be \[V, \.\.\.\] \(rank >= 1\)",
        ),
        (
            lambda p, i, b, w: kernels.masked_embedding_bag_grad_cpu(
                p[:9], i, b, w, np.ones([17, 1], bool)
            ),
            r"row_mask: shape \(17, 1\) must be \[V\] \(rank 1\)",
        ),
        (
            lambda p, i, b, w: kernels.masked_embedding_bag_grad_cpu(
                p[:9], i, b, w[:-1], np.ones(17, bool)
            ),
            r"ids, bags and factors" + _POSITIONS,
        ),
    ],
    ids=["bags_short", "weights_short", "num_bags", "params_scalar", "row_mask_2d", "factors"],
)
def test_bag_shapes_are_refused_with_the_contract_text(rng, call, message):
    """The module leaves the shapes to cc/core/embedding_bag_contract.h: the
    TF kernels' text, in NumPy's notation, as ValueError."""
    params, ids, bags, weights = _bag_problem(rng, "float32", "int32")
    with pytest.raises(ValueError, match=message):
        call(params, ids, bags, weights)


@pytest.mark.parametrize(
    "compact, change, message",
    [
        (
            False,
            dict(m=np.zeros([16, 6], np.float32)),
            r"momentum: shape \(16, 6\) does not match var's",
        ),
        (
            True,
            dict(v=np.zeros([3, 6], np.float32)),
            r"velocity: shape \(3, 6\) must be \[S\] \+ var",
        ),
        (
            True,
            dict(slot_of_row=np.zeros(16, np.float32)),
            r"slot_of_row: shape \(16,\) must be \(17,\) \(one entry per row of var\)",
        ),
        (
            False,
            dict(grad=np.ones([9, 5], np.float32)),
            r"grad: shape \(9, 5\) must be \[B\] \+ \(6,\) \(var.shape\[1:\]\)",
        ),
        (
            False,
            dict(row_mask=np.ones(16, bool)),
            r"row_mask: shape \(16,\) must be \(17,\) \(one entry per row of var\)",
        ),
        (
            True,
            dict(slot_of_row=np.full(17, 4, np.float32)),
            r"slot_of_row\[\d+\] = 4\.0* is not a slot row",
        ),
        (False, dict(row_mask=np.ones(17, np.int8)), r"row_mask: dtype int8 is not bool"),
        (
            True,
            dict(slot_of_row=np.zeros(17, np.int32)),
            r"slot_of_row: must be writable float32, got int32",
        ),
    ],
    ids=[
        "full_m_rows", "compact_v", "map_short", "grad_width", "mask_short", "map_value", "mask",
        "map_dtype",
    ],
)  # fmt: skip
def test_fused_bag_adam_refuses_bad_input_and_writes_nothing(rng, compact, change, message):
    args = _fused_bag_problem(rng, compact)
    args.update(change)
    before = {name: args[name].copy() for name in ("var", "m", "v")}
    with pytest.raises(ValueError, match=message):
        kernels.masked_embedding_bag_apply_rule_cpu(
            "adam",
            args["var"],
            [args["m"], args["v"]],
            *(args[name] for name in ("grad", "ids", "bags", "factors", "row_mask")),
            [_HYPER[name] for name in kernels.RULES["adam"]["hyperparameters"]],
            slot_of_row=args.get("slot_of_row"),
            rows_used=4 if compact else 0,
        )
    for name, old in before.items():
        assert args[name].tobytes() == old.tobytes(), f"{name} was written"
