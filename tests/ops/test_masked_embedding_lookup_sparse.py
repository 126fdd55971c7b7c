"""Tests of masked_embedding_lookup_sparse: pooled lookups of bags of ids.

Forward values and gradients against a float64 NumPy reference on random bags
(empty bags, pruned ids, duplicates within and across bags, frozen rows),
every dtype x index type x combiner, with and without weights; against
tf.nn.safe_embedding_lookup_sparse; the stock-op path (GPU tables,
SavedModels), the XLA path and sharded tables against the kernel path; bad
input; and that the backward makes no tensor with a row per id.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.ops import bags as bags_module
from pe_testing import INDEX_DTYPE_NAMES, VALUE_DTYPE_NAMES, assert_bits_equal, numpy_dtype

COMBINERS = ("sum", "mean", "sqrtn")
#: Unit roundoff of the type the sums run in (float32; float64 for float64).
COMPUTE_ROUNDOFF = {"float64": 2.0**-53}
STORAGE_ROUNDOFF = {
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
}


def random_bags(rng, num_rows, num_bags, max_length, weighted):
    """Ragged ids and positive weights: bag 0 empty, about one id in eight
    pruned (negative), ids from a few rows so they repeat within and across
    bags, bag 1 holding one row twice."""
    pool = rng.choice(num_rows, size=max(2, num_rows // 2), replace=False)
    ids, weights = [], []
    for bag in range(num_bags):
        length = 0 if bag == 0 else int(rng.integers(1, max_length + 1))
        row = rng.choice(pool, size=length).tolist()
        if bag == 1:
            row = row[:1] * 2 + row[2:]
        row = [-1 if rng.random() < 0.125 else r for r in row]
        ids.append(row)
        weights.append(rng.uniform(0.25, 2.0, size=len(row)).tolist() if weighted else None)
    return ids, weights


def reference(table, ids, weights, combiner, row_mask, upstream):
    """Bags, and the gradient of sum(bags * upstream) on permitted rows, in
    float64, with the magnitudes and term counts the bounds need."""
    table = np.asarray(table, np.float64)
    num_rows, width = table.shape
    out = np.zeros([len(ids), width])
    out_magnitude = np.zeros_like(out)
    out_terms = np.zeros(len(ids))
    grad = np.zeros_like(table)
    grad_magnitude = np.zeros_like(table)
    grad_terms = np.zeros(num_rows)
    for bag, row in enumerate(ids):
        w = np.ones(len(row)) if weights[bag] is None else np.asarray(weights[bag])
        kept = np.asarray(row, np.int64) >= 0
        total = {"sum": None, "mean": w[kept].sum(), "sqrtn": np.sqrt((w[kept] ** 2).sum())}[
            combiner
        ]
        scale = 1.0 if total is None else (0.0 if total == 0 else 1.0 / total)
        for i, r in enumerate(row):
            if r < 0:
                continue
            f = w[i] * scale
            out[bag] += f * table[r]
            out_magnitude[bag] += np.abs(f * table[r])
            out_terms[bag] += 1
            if row_mask[r]:
                grad[r] += f * upstream[bag]
                grad_magnitude[r] += np.abs(f * upstream[bag])
                grad_terms[r] += 1
    return out, out_magnitude, out_terms, grad, grad_magnitude, grad_terms


def assert_within_bound(actual, exact, magnitude, terms, dtype_name, what, scale=1.0):
    """|actual - exact| within the rounding bound of the sums: the factors
    (a sum of up to `bag` weights, a division, a product) and each product
    and addition round once in the compute type, the result once in its
    dtype. `terms` bounds the number of additions per element."""
    compute = COMPUTE_ROUNDOFF.get(dtype_name, 2.0**-24)
    terms = np.asarray(terms, np.float64).reshape(-1, *([1] * (np.ndim(exact) - 1)))
    bound = scale * (
        (2 * terms + 4) * compute * magnitude + STORAGE_ROUNDOFF[dtype_name] * np.abs(exact)
    )
    error = np.abs(np.asarray(actual, np.float64) - exact)
    bad = ~(error <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} element(s) outside the bound; first at "
        f"{np.argwhere(bad)[0].tolist()}: {np.asarray(actual, np.float64)[bad][0]} vs "
        f"{exact[bad][0]} (bound {bound[bad][0]:.3g})"
    )


def problem(rng, dtype_name, index_name, weighted, num_rows=13, width=5, num_bags=7):
    np_dtype = numpy_dtype(dtype_name)
    table = rng.standard_normal([num_rows, width]).astype(np_dtype)
    ids, weights = random_bags(rng, num_rows, num_bags, 6, weighted)
    row_mask = rng.random(num_rows) < 0.5
    flat = [r for row in ids for r in row if r >= 0]
    row_mask[flat[0]], row_mask[flat[-1]] = True, False
    upstream = rng.standard_normal([num_bags, width]).astype(np_dtype)
    ragged_ids = tf.ragged.constant(ids, dtype=tf.as_dtype(index_name), row_splits_dtype=tf.int64)
    # The weights the op sees are float32: the reference takes those values.
    weights = [None if w is None else np.float32(w).astype(np.float64).tolist() for w in weights]
    ragged_weights = (
        tf.ragged.constant([w or [] for w in weights], dtype=tf.float32, row_splits_dtype=tf.int64)
        if weighted
        else None
    )
    return table, ids, weights, row_mask, upstream, ragged_ids, ragged_weights


def bags_and_gradient(table_variable, ids, row_mask, weights, combiner, upstream, function):
    def run(ids, weights):
        with tf.GradientTape() as tape:
            bags = pe.masked_embedding_lookup_sparse(
                table_variable, ids, row_mask, sp_weights=weights, combiner=combiner
            )
            loss = tf.reduce_sum(tf.cast(bags, tf.float64) * tf.cast(upstream, tf.float64))
        return bags, tape.gradient(loss, table_variable)

    return tf.function(run)(ids, weights) if function else run(ids, weights)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("index_name", INDEX_DTYPE_NAMES)
@pytest.mark.parametrize("dtype_name", VALUE_DTYPE_NAMES)
def test_forward_and_gradient_match_float64_reference(
    rng, dtype_name, index_name, combiner, weighted
):
    table, ids, weights, row_mask, upstream, ragged_ids, ragged_weights = problem(
        rng, dtype_name, index_name, weighted
    )
    variable = tf.Variable(table)
    bags, grad = bags_and_gradient(
        variable,
        ragged_ids,
        row_mask,
        ragged_weights,
        combiner,
        upstream,
        function=combiner == "mean",
    )
    out, out_magnitude, out_terms, dense, grad_magnitude, grad_terms = reference(
        table, ids, weights, combiner, row_mask, np.asarray(upstream, np.float64)
    )
    assert bags.dtype == tf.as_dtype(dtype_name) and bags.shape == out.shape
    assert_within_bound(bags, out, out_magnitude, out_terms, dtype_name, "bags")
    assert not np.asarray(bags, np.float64)[0].any(), "the empty bag is not zero"

    assert isinstance(grad, tf.IndexedSlices)
    # The distinct permitted rows, by first occurrence; frozen ones absent.
    first_seen = list(dict.fromkeys(r for row in ids for r in row if r >= 0 and row_mask[r]))
    assert np.asarray(grad.indices).tolist() == first_seen
    assert_within_bound(
        grad.values,
        dense[first_seen],
        grad_magnitude[first_seen],
        grad_terms[first_seen] + max(map(len, ids)),
        dtype_name,
        "gradient",
    )


@pytest.mark.parametrize("combiner", COMBINERS)
def test_sparse_ids_give_the_bits_of_ragged_ids(rng, combiner):
    table, ids, weights, row_mask, upstream, ragged_ids, ragged_weights = problem(
        rng, "float32", "int64", weighted=True
    )
    variable = tf.Variable(table)
    sparse_ids = ragged_ids.to_sparse()
    sparse_weights = ragged_weights.to_sparse()
    from_ragged = bags_and_gradient(
        variable, ragged_ids, row_mask, ragged_weights, combiner, upstream, False
    )
    from_sparse = bags_and_gradient(
        variable, sparse_ids, row_mask, sparse_weights, combiner, upstream, False
    )
    for ragged_result, sparse_result in zip(from_ragged, from_sparse):
        ragged_value = getattr(ragged_result, "values", ragged_result)
        assert_bits_equal(getattr(sparse_result, "values", sparse_result), ragged_value)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_values_equal_safe_embedding_lookup_sparse(rng, combiner, weighted):
    """Within twice the float32 summation bound (both sums round); the
    gradient too, on the permitted rows. Weights are positive: TF's version
    prunes the others."""
    table, ids, weights, row_mask, upstream, ragged_ids, ragged_weights = problem(
        rng, "float32", "int64", weighted
    )
    variable = tf.Variable(table)
    sparse_ids = ragged_ids.to_sparse()
    sparse_weights = ragged_weights.to_sparse() if weighted else None
    ours, grad = bags_and_gradient(
        variable, sparse_ids, row_mask, sparse_weights, combiner, upstream, False
    )
    with tf.GradientTape() as tape:
        theirs = tf.nn.safe_embedding_lookup_sparse(
            variable, sparse_ids, sparse_weights, combiner=combiner
        )
        loss = tf.reduce_sum(theirs * upstream)
    their_grad = tf.convert_to_tensor(tape.gradient(loss, variable)).numpy()
    out, out_magnitude, out_terms, _, grad_magnitude, grad_terms = reference(
        table, ids, weights, combiner, row_mask, np.asarray(upstream, np.float64)
    )
    assert_within_bound(
        ours,
        theirs.numpy().astype(np.float64),
        out_magnitude,
        out_terms,
        "float32",
        "against safe_embedding_lookup_sparse",
        scale=2.0,
    )
    permitted = np.asarray(grad.indices)
    assert_within_bound(
        grad.values,
        their_grad[permitted].astype(np.float64),
        grad_magnitude[permitted],
        grad_terms[permitted] + max(map(len, ids)),
        "float32",
        "gradient against safe_embedding_lookup_sparse",
        scale=2.0,
    )


def test_stock_path_gives_the_kernel_paths_gradient(rng, monkeypatch):
    """The path of GPU tables and SavedModels (forward from stock ops) on this
    CPU: the same values within the bound, the same gradient bits (one op)."""
    table, ids, weights, row_mask, upstream, ragged_ids, ragged_weights = problem(
        rng, "float32", "int32", weighted=True
    )
    variable = tf.Variable(table)
    kernel = bags_and_gradient(
        variable, ragged_ids, row_mask, ragged_weights, "sqrtn", upstream, True
    )
    monkeypatch.setattr(bags_module, "_kernel_applies", lambda variable: False)
    stock = bags_and_gradient(
        variable, ragged_ids, row_mask, ragged_weights, "sqrtn", upstream, True
    )
    out, out_magnitude, out_terms, *_ = reference(
        table, ids, weights, "sqrtn", row_mask, np.asarray(upstream, np.float64)
    )
    assert_within_bound(stock[0], out, out_magnitude, out_terms, "float32", "stock bags")
    assert_bits_equal(stock[1].indices, kernel[1].indices)
    # The factors come from other ops (same formula): equal to rounding.
    np.testing.assert_allclose(stock[1].values, kernel[1].values, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("path", ["kernel", "stock", "sharded"])
def test_an_id_out_of_range_is_named_by_bag_and_position(path, monkeypatch):
    if path == "stock":
        monkeypatch.setattr(bags_module, "_kernel_applies", lambda variable: False)
    table = np.ones([10, 2], np.float32)
    if path == "sharded":
        from tensorflow.python.distribute.sharded_variable import ShardedVariable

        variable = ShardedVariable([tf.Variable(table[:6]), tf.Variable(table[6:])])
    else:
        variable = tf.Variable(table)
    ids = tf.ragged.constant([[1], [], [4, -1, 3, 10], [2]], dtype=tf.int64)
    message = re.escape("sp_ids: bag 2, position 3 = 10 is not in [0, 10)")
    lookup = lambda ids: pe.masked_embedding_lookup_sparse(variable, ids, np.ones(10, bool))  # noqa: E731
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        lookup(ids)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tf.function(lookup)(ids)


def test_a_refused_step_writes_nothing():
    """A training step whose batch holds a bad id fails before any write."""
    import keras

    table = np.arange(20, dtype=np.float32).reshape(10, 2)
    variable = keras.Variable(table)
    mask = keras.Variable(np.ones(10, bool), trainable=False)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), row_masks=[(variable, mask)])
    optimizer.build([variable])

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pe.masked_embedding_lookup_sparse(variable, ids, mask))
        optimizer.apply(tape.gradient(loss, [variable]), [variable])

    step(tf.ragged.constant([[1, 2], [3]]))
    before = variable.numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match="bag 1, position 0 = 11"):
        step(tf.ragged.constant([[1, 2], [11]]))
    assert_bits_equal(variable.numpy(), before, "table after a refused step")


#: Bad arguments of ``masked_embedding_lookup_sparse`` on a [4, 2] float32
#: table: (case, keyword arguments over the defaults of ``bad_bag_call``,
#: error type, message). ``build_tools/bad_input_table.py`` reads this table
#: for docs/bad_input.md.
BAD_BAG_ARGUMENTS = [
    ("combiner max", {"combiner": "max"}, ValueError, "combiner: 'max' is not one of"),
    (
        "dense ids",
        {"sp_ids": lambda: tf.constant([[0, 1]])},
        TypeError,
        "sp_ids: expected a tf.SparseTensor or tf.RaggedTensor",
    ),
    (
        "dense weights",
        {"sp_weights": lambda: tf.ones([3])},
        TypeError,
        "sp_weights: sp_ids is a RaggedTensor",
    ),
    (
        "float ids",
        {"sp_ids": lambda: tf.ragged.constant([[0.0]])},
        TypeError,
        "sp_ids: dtype float32 is not an index type",
    ),
    (
        "int weights",
        {"sp_weights": lambda: tf.ragged.constant([[1, 1], [1]])},
        TypeError,
        "sp_weights: dtype int32 is not a floating-point",
    ),
    (
        "row_mask of 5 entries",
        {"row_mask": lambda: np.ones(5, bool)},
        ValueError,
        "row_mask: shape",
    ),
    (
        "weights of other bag lengths",
        {"sp_weights": lambda: tf.ragged.constant([[1.0], [1.0, 1.0]])},
        tf.errors.InvalidArgumentError,
        "sp_weights: must have sp_ids' row",
    ),
    (
        "id = 4 (V = 4)",
        {"sp_ids": lambda: tf.ragged.constant([[0, 1], [4]])},
        tf.errors.InvalidArgumentError,
        re.escape("sp_ids: bag 1, position 0 = 4 is not in [0, 4)"),
    ),
]


def bad_bag_call(variable: tf.Variable, kwargs: dict) -> Any:
    """The lookup of a ``BAD_BAG_ARGUMENTS`` case: ragged ids ``[[0, 1], [2]]``
    and a mask of 4 true entries unless ``kwargs`` makes (with the callables
    it holds) other arguments."""
    made = {name: value() if callable(value) else value for name, value in kwargs.items()}
    arguments = {"sp_ids": tf.ragged.constant([[0, 1], [2]]), "row_mask": np.ones(4, bool), **made}
    return pe.masked_embedding_lookup_sparse(variable, **arguments)


@pytest.mark.parametrize(("case", "kwargs", "error", "message"), BAD_BAG_ARGUMENTS)
def test_bad_arguments_are_refused_with_their_names(case, kwargs, error, message):
    variable = tf.Variable(np.arange(8, dtype=np.float32).reshape(4, 2))
    before = variable.numpy()
    with pytest.raises(error, match=message):
        bad_bag_call(variable, kwargs)
    assert_bits_equal(variable.numpy(), before, case)


def test_mask_variable_change_applies_without_retracing(rng):
    variable = tf.Variable(rng.standard_normal([8, 2]).astype(np.float32))
    mask = tf.Variable(np.ones(8, bool))
    ids = tf.ragged.constant([[0, 1, 2], [3, 4], [5, 6, 7]])

    @tf.function
    def gradient_rows(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pe.masked_embedding_lookup_sparse(variable, ids, mask))
        return tape.gradient(loss, variable).indices

    for _ in range(3):
        new_mask = rng.random(8) < 0.5
        mask.assign(new_mask)
        assert np.asarray(gradient_rows(ids)).tolist() == np.flatnonzero(new_mask).tolist()
    assert gradient_rows.experimental_get_tracing_count() == 1


def densified(gradient, num_rows):
    """The dense gradient; indices outside ``[0, V)`` (the XLA path's rows
    that take no step) left out."""
    indices = np.asarray(gradient.indices)
    values = np.asarray(gradient.values, np.float64)
    dense = np.zeros([num_rows, values.shape[1]])
    kept = (indices >= 0) & (indices < num_rows)
    np.add.at(dense, indices[kept], values[kept])
    return dense


@pytest.mark.parametrize("num_rows", [6, 40], ids=["rows_below_ids", "rows_above_ids"])
def test_xla_path_matches_the_kernel_path(rng, num_rows):
    """Static shapes: a dense gradient where the table has no more rows than
    the batch has ids, else one row per id; equal to the kernel path's sums;
    an id out of range is pruned, not raised."""
    table = rng.standard_normal([num_rows, 3]).astype(np.float32)
    row_mask = rng.random(num_rows) < 0.5
    ids = rng.integers(-1, num_rows, size=[4, 5])
    weights = rng.uniform(0.5, 1.5, size=[4, 5]).astype(np.float32)
    upstream = rng.standard_normal([4, 3]).astype(np.float32)
    variable = tf.Variable(table)

    def run(ids):
        bags = bags_module.bags_from_dense(ids, weights=weights)
        with tf.GradientTape() as tape:
            out = bags_module.lookup_bags(variable, bags, row_mask, "mean")
            loss = tf.reduce_sum(out * upstream)
        return out, tape.gradient(loss, variable)

    kernel_out, kernel_grad = tf.function(run)(tf.constant(ids))
    xla_out, xla_grad = tf.function(run, jit_compile=True)(tf.constant(ids))
    np.testing.assert_allclose(xla_out, kernel_out, rtol=1e-5, atol=1e-6)
    expected_rows = num_rows if num_rows <= ids.size else ids.size
    assert xla_grad.values.shape[0] == expected_rows
    # Only the rows the kernel path names take a step: the others are numbered V.
    named = np.asarray(xla_grad.indices)
    assert set(named[named < num_rows].tolist()) == set(np.asarray(kernel_grad.indices).tolist())
    np.testing.assert_allclose(
        densified(xla_grad, num_rows), densified(kernel_grad, num_rows), rtol=1e-5, atol=1e-6
    )
    bad = ids.copy()
    bad[1, 2] = num_rows + 3
    pruned = ids.copy()
    pruned[1, 2] = -1
    np.testing.assert_allclose(
        tf.function(run, jit_compile=True)(tf.constant(bad))[0],
        tf.function(run)(tf.constant(pruned))[0],
        rtol=1e-5,
        atol=1e-6,
    )


def test_sharded_table_matches_one_variable(rng):
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    table, ids, weights, row_mask, upstream, ragged_ids, ragged_weights = problem(
        rng, "float32", "int64", weighted=True, num_rows=10
    )
    whole = tf.Variable(table)
    sharded = ShardedVariable(
        [tf.Variable(table[:4]), tf.Variable(table[4:7]), tf.Variable(table[7:])]
    )
    single = bags_and_gradient(whole, ragged_ids, row_mask, ragged_weights, "mean", upstream, False)
    with tf.GradientTape() as tape:
        bags = pe.masked_embedding_lookup_sparse(
            sharded, ragged_ids, row_mask, sp_weights=ragged_weights
        )
        loss = tf.reduce_sum(bags * upstream)
    np.testing.assert_allclose(bags, single[0], rtol=1e-6, atol=1e-6)
    expected = densified(single[1], 10)
    parts = tape.gradient(loss, sharded.variables)
    got = np.concatenate([densified(part, part.dense_shape[0]) for part in parts])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


# --- the backward makes no tensor with a row per id -------------------------------------

BATCH, IDS_PER_BAG, WIDTH = 8, 32, 6


def _lookups(num_rows):
    """The bag lookup and the pooled per-id lookup (what PartialEmbedding +
    GlobalAveragePooling1D computes) of dense ``[BATCH, IDS_PER_BAG]`` ids."""
    variable = tf.Variable(tf.ones([num_rows, WIDTH]))
    mask = np.arange(num_rows) % 2 == 0

    def bag(ids):
        return pe.masked_embedding_lookup_sparse(variable, tf.RaggedTensor.from_tensor(ids), mask)

    def pooled(ids):
        return tf.reduce_mean(pe.masked_embedding_lookup(variable, ids, mask), axis=1)

    upstream = tf.Variable(
        np.linspace(-1.0, 1.0, BATCH * WIDTH).reshape(BATCH, WIDTH), dtype=tf.float32
    )

    def gradient_of(lookup):
        # The gradient alone: the loss is linear in the bags, so the
        # forward pass is not needed (compilers and sessions prune it).
        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(lookup(ids) * upstream)
            return tf.convert_to_tensor(tape.gradient(loss, variable).values)

        return step

    return variable, gradient_of(bag), gradient_of(pooled)


def _per_id_shapes(shapes):
    """The shapes among ``shapes`` with a row per id: ``[BATCH * IDS_PER_BAG,
    WIDTH]`` or ``[BATCH, IDS_PER_BAG, WIDTH]``."""
    per_id = ([BATCH * IDS_PER_BAG, WIDTH], [BATCH, IDS_PER_BAG, WIDTH])
    return [shape for shape in shapes if list(shape) in per_id]


def test_graph_backward_makes_no_per_id_tensor():
    """Every tensor the step made, with its run-time shape (a v1 session's
    full trace): the pooled lookup's backward has ``[ids, D]`` tensors, the
    bag lookup's none."""
    ids_value = np.random.default_rng(0).integers(0, 100, [BATCH, IDS_PER_BAG])
    made = {}
    for name in ("bag", "pooled"):
        graph = tf.Graph()
        with graph.as_default():
            variable, bag_step, pooled_step = _lookups(100)
            # Fed, so that nothing is folded into a constant before it runs.
            ids = tf.compat.v1.placeholder(tf.int64, [BATCH, IDS_PER_BAG])
            result = (bag_step if name == "bag" else pooled_step)(ids)
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
                metadata = tf.compat.v1.RunMetadata()
                session.run(result, {ids: ids_value}, options=options, run_metadata=metadata)
        made[name] = [
            [d.size for d in output.tensor_description.shape.dim]
            for device in metadata.step_stats.dev_stats
            for node in device.node_stats
            for output in node.output
        ]
    assert _per_id_shapes(made["pooled"]), "the check finds nothing where it must"
    assert not _per_id_shapes(made["bag"]), _per_id_shapes(made["bag"])


def test_xla_backward_makes_no_per_id_tensor():
    """The compiled program (optimized HLO) of the XLA path, with fewer rows
    than ids: no buffer with a row per id; the pooled lookup's has some."""
    ids = tf.constant(np.random.default_rng(0).integers(0, 50, [BATCH, IDS_PER_BAG]))
    programs = {}
    _, bag_step, pooled_step = _lookups(50)
    for name, step in (("bag", bag_step), ("pooled", pooled_step)):
        compiled = tf.function(step, jit_compile=True)
        programs[name] = compiled.experimental_get_compiler_ir(ids)(stage="optimized_hlo")

    def shapes(hlo):
        found = re.findall(r"f32\[([\d,]+)\]", hlo)
        return [[int(d) for d in shape.split(",")] for shape in found]

    assert _per_id_shapes(shapes(programs["pooled"])), "the check finds nothing where it must"
    assert not _per_id_shapes(shapes(programs["bag"])), _per_id_shapes(shapes(programs["bag"]))
