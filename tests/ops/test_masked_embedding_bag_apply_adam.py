"""Tests of the fused bag backward + rule step,
ops.fused.masked_embedding_bag_apply_rule, and of MaskedOptimizer's use of it
for a CPU table looked up by bags.

The reference: each permitted id's gradient summed from the bags' gradient
in the compute type (float32; float64 for float64 tables), in position
order, rounded to the table's dtype once; then the rule's step of
pe_testing.rule_reference_step (exact), which every rule but FTRL matches
bit for bit. Compact slots: rows without a slot row take the next ones in
order of first occurrence; full slots grow to max(needed, S + S // 2 + 1)
rows of zeros. Bad input, through Adam (the slot names it prints), writes
nothing.
"""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding._internal.rule_table import RULES
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.ops.fused import masked_embedding_bag_apply_rule
from partial_embedding.optimizers import _row_rules as row_rules
from pe_testing import (
    INDEX_DTYPE_NAMES,
    VALUE_DTYPE_NAMES,
    assert_bits_equal,
    fused_slot_values,
    make_rng,
    masked_embedding_bag_apply_adam,
    masked_sparse_apply_adam,
    numpy_dtype,
    round_to,
    rule_hyperparameters,
    rule_reference_step,
)

pytestmark = pytest.mark.usefixtures("on_cpu")


def _round(x, dtype) -> np.ndarray:
    """float64 values rounded as one operation in ``dtype`` rounds them."""
    return round_to(x, tf.as_dtype(dtype).name)


def _compute_dtype(dtype: tf.DType) -> np.dtype:
    return np.dtype(np.float64 if dtype == tf.float64 else np.float32)


def _random_batch(rng, vocab, num_bags, frozen_share=0.4):
    """Ids with duplicates, pruned ids (< 0), empty bags; their bags (sorted)
    and factors (mean of each bag's unpruned ids)."""
    lengths = rng.integers(0, 6, num_bags)
    lengths[rng.integers(num_bags)] = 0  # At least one empty bag.
    bags = np.repeat(np.arange(num_bags), lengths).astype(np.int64)
    hot = rng.integers(0, vocab, 3)
    ids = np.where(
        rng.random(bags.size) < 0.3, rng.choice(hot, bags.size), rng.integers(0, vocab, bags.size)
    )
    ids = np.where(rng.random(bags.size) < 0.15, -rng.integers(1, 4, bags.size), ids)
    counts = np.bincount(bags[ids >= 0], minlength=num_bags).astype(np.float32)
    scale = np.divide(1.0, counts, out=np.zeros_like(counts), where=counts > 0)
    factors = np.where(ids >= 0, scale[bags], 0.0).astype(np.float32)
    mask = rng.random(vocab) >= frozen_share
    return ids, bags, factors, mask


def _hyperparameters(rng, dtype, weight_decay):
    """Adam's hyperparameters by their usual names, as scalars of ``dtype``."""
    values = {
        "learning_rate": rng.uniform(0.01, 0.1),
        "beta_1": rng.uniform(0.8, 0.95),
        "beta_2": rng.uniform(0.99, 0.9999),
        "epsilon": 1e-3 if dtype in (tf.float16, tf.bfloat16) else 1e-7,
        "alpha": rng.uniform(0.01, 0.1),
        "weight_decay": weight_decay,
    }
    return {name: tf.constant(value, dtype) for name, value in values.items()}, None


def _bag_rows(grad, ids, bags, factors, mask, dtype):
    """The permitted ids in order of first occurrence and each one's
    gradient: ``factor * grad[bag]`` summed in the compute type in position
    order, rounded to ``dtype`` once."""
    compute = _compute_dtype(tf.as_dtype(dtype))
    rows = [r for r in dict.fromkeys(ids.tolist()) if r >= 0 and mask[r]]
    g = np.zeros((len(rows), grad.shape[1]))
    for i, row in enumerate(rows):
        total = np.zeros(grad.shape[1:], compute)
        for position in np.flatnonzero(ids == row):
            total = total + compute.type(factors[position]) * grad[bags[position]].astype(compute)
        g[i] = _round(total, dtype)
    return np.array(rows, np.int64), g


def _reference(rule, tables, slot_map, grad, ids, bags, factors, mask, hyper, dtype):
    """One fused step on float64 copies (pe_testing.rule_reference_step):
    returns (var, slots, slot_of_row, used)."""
    var, slots = tables
    rows, g = _bag_rows(grad, ids, bags, factors, mask, dtype)
    if slot_map is None:
        return (*rule_reference_step(rule, var, slots, rows, g, hyper, dtype), None, None)
    slot_of_row, used = slot_map[0].copy(), slot_map[1]
    for row in rows:
        if slot_of_row[row] < 0:
            slot_of_row[row] = used
            used += 1
    capacity = slots[0].shape[0]
    if used > capacity:
        grown = max(used, capacity + capacity // 2 + 1)
        slots = [np.concatenate([t, np.zeros((grown - capacity, *t.shape[1:]))]) for t in slots]
    slot_rows = slot_of_row[rows].astype(np.int64)
    var, slots = rule_reference_step(rule, var, slots, rows, g, hyper, dtype, slot_rows)
    return var, slots, slot_of_row, used


def _initial_slot_map(rng, vocab, mask, capacity):
    """Some rows (permitted and frozen) hold distinct slot rows already."""
    slot_of_row = np.full(vocab, -1.0, np.float32)
    holders = rng.permutation(vocab)[: min(capacity, rng.integers(0, vocab // 2 + 1))]
    slot_of_row[holders] = np.arange(holders.size)
    return slot_of_row, int(holders.size)


#: Every rule of the table but FTRL, whose pow is the math library's, not
#: correctly rounded (test_fused_rules bounds it, bags included).
EXACT_RULES = tuple(rule for rule in RULES if rule != "ftrl")
_CASES = list(itertools.product(EXACT_RULES, VALUE_DTYPE_NAMES))


@pytest.mark.parametrize("rule, dtype", _CASES)
def test_every_rule_matches_the_reference_bit_for_bit(rule, dtype):
    # Index dtypes, slot layouts (full-size; compact, growing) and weight
    # decay rotate over the cases: every rule meets each of them.
    # Offset by the rule, so that every dtype meets each of them too.
    k, d = EXACT_RULES.index(rule), VALUE_DTYPE_NAMES.index(dtype)
    index_dtype = INDEX_DTYPE_NAMES[d % 2]
    compact = (d // 2 + k) % 2 == 1 and bool(RULES[rule].slots)
    decay = 0.1 if (d + d // 2 + k) % 2 else 0.0
    tf_dtype = tf.as_dtype(dtype)
    rng = make_rng("bag rule", rule, dtype)
    vocab, width, num_bags = (
        int(rng.integers(8, 24)),
        int(rng.integers(1, 12)),
        int(rng.integers(3, 9)),
    )
    capacity = int(rng.integers(1, 6)) if compact else vocab
    var = _round(rng.normal(size=(vocab, width)), tf_dtype)
    slots = [
        _round(s, tf_dtype)
        for s in fused_slot_values(RULES[rule].slots, rng, capacity, width, np.float64)
    ]
    storage = numpy_dtype(dtype)
    variables = [tf.Variable(t.astype(storage), shape=tf.TensorShape(None)) for t in (var, *slots)]
    ids, bags, factors, mask = _random_batch(rng, vocab, num_bags)
    slot_map = _initial_slot_map(rng, vocab, mask, capacity) if compact else None
    map_variables = (
        (tf.Variable(slot_map[0]), tf.Variable(slot_map[1], dtype=tf.int64))
        if compact
        else (None, None)
    )
    for step in range(3):
        grad = _round(rng.normal(size=(num_bags, width)), tf_dtype)
        tensors, hyper = rule_hyperparameters(rng, rule, dtype, decay)
        var, slots, *new_map = _reference(
            rule, (var, slots), slot_map, grad, ids, bags, factors, mask, hyper, dtype
        )
        masked_embedding_bag_apply_rule(
            rule, variables[0], variables[1:], tf.constant(grad.astype(storage)),
            tf.constant(ids, index_dtype), tf.constant(bags),
            tf.constant(factors.astype(_compute_dtype(tf_dtype))), mask, tensors,
            slot_of_row=map_variables[0], slot_rows_used=map_variables[1],
        )  # fmt: skip
        for index, (actual, wanted) in enumerate(zip(variables, (var, *slots))):
            assert_bits_equal(actual, wanted.astype(storage), f"table {index} at step {step}")
        if compact:
            slot_map = tuple(new_map)
            assert_bits_equal(map_variables[0], slot_map[0].astype(np.float32), "slot_of_row")
            assert int(map_variables[1].numpy()) == slot_map[1]
        # The next step: new ids over the same tables.
        ids, bags, factors, _ = _random_batch(rng, vocab, num_bags)


def _two_ops(variables, slot_map, grad, ids, bags, factors, mask, tensors):
    """The same step as MaskedOptimizer ran it before: MaskedEmbeddingBagGrad,
    the compact slot rows, then the fused Adam."""
    ops = pe._loader.load_ops()
    rows, values = ops.partial_embedding_masked_embedding_bag_grad(
        grad=grad, ids=ids, bags=bags, factors=factors, row_mask=mask
    )
    kwargs = {}
    if slot_map is not None:
        slot_of_row, used = slot_map
        current = tf.gather(slot_of_row, rows)
        new_rows = tf.boolean_mask(rows, current < 0)
        first = used.read_value()
        total = first + tf.size(new_rows, out_type=tf.int64)
        capacity = tf.shape(variables[1], out_type=tf.int64)[0]
        grown = tf.maximum(total, capacity + capacity // 2 + 1)
        for slot in variables[1:]:
            if slot is not None and bool(total > capacity):
                slot.assign(
                    tf.concat([slot, tf.zeros([grown - capacity, slot.shape[1]], slot.dtype)], 0)
                )
        slot_of_row.scatter_nd_update(
            tf.expand_dims(new_rows, 1), tf.cast(tf.range(first, total), tf.float32)
        )
        used.assign(total)
        kwargs["slot_indices"] = tf.cast(tf.gather(slot_of_row, rows), rows.dtype)
    masked_sparse_apply_adam(
        variables[0],
        variables[1],
        variables[2],
        rows,
        values,
        mask,
        v_hat=variables[3],
        **tensors,
        **kwargs,
    )


@pytest.mark.parametrize("compact", [False, True], ids=["full_slots", "compact_slots"])
def test_equals_the_two_ops_bit_for_bit(compact):
    rng = make_rng("two ops", compact)
    dtype, vocab, width, num_bags = tf.float32, 40, 8, 12
    capacity = 3 if compact else vocab
    # Slots that grow have rows of unknown number, as MaskedOptimizer's.
    slot_shape = tf.TensorShape([None if compact else capacity, width])
    table = rng.normal(size=(vocab, width)).astype(np.float32)
    fused, separate = (
        [tf.Variable(table)]
        + [tf.Variable(np.zeros((capacity, width), np.float32), shape=slot_shape) for _ in range(3)]
        for _ in range(2)
    )
    maps = [
        (tf.Variable(np.full(vocab, -1.0, np.float32)), tf.Variable(0, dtype=tf.int64))
        for _ in range(2)
    ]
    tensors, _ = _hyperparameters(rng, dtype, 0.0)
    for _ in range(4):
        ids, bags, factors, mask = _random_batch(rng, vocab, num_bags, frozen_share=0.3)
        grad = tf.constant(rng.normal(size=(num_bags, width)).astype(np.float32))
        args = (grad, tf.constant(ids), tf.constant(bags), tf.constant(factors), tf.constant(mask))
        masked_embedding_bag_apply_adam(
            *fused[:3],
            *args,
            v_hat=fused[3],
            slot_of_row=maps[0][0] if compact else None,
            slot_rows_used=maps[0][1] if compact else None,
            **tensors,
        )
        _two_ops(separate, maps[1] if compact else None, *args, tensors)
        for name, a, b in zip(("var", "m", "v", "v_hat"), fused, separate):
            assert_bits_equal(a, b, name)
        if compact:
            assert_bits_equal(maps[0][0], maps[1][0], "slot_of_row")
            assert int(maps[0][1].numpy()) == int(maps[1][1].numpy())


# --- bad input: a clear error, nothing written -----------------------------------


def _small_problem(compact=True):
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    m, v = (tf.Variable(np.full((2, 3), 0.5, np.float32)) for _ in range(2))
    slot_of_row = tf.Variable([1.0, -1.0, -1.0, -1.0])
    used = tf.Variable(2, dtype=tf.int64)
    args = dict(
        grad=tf.ones([2, 3]),
        ids=tf.constant([0, 1, 2]),
        bags=tf.constant([0, 0, 1], tf.int64),
        factors=tf.constant([0.5, 0.5, 1.0]),
        row_mask=tf.constant([True, True, False, True]),
        learning_rate=0.1,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-7,
        alpha=0.1,
    )
    if compact:
        args.update(slot_of_row=slot_of_row, slot_rows_used=used)
    return [table, m, v, slot_of_row, used], args


BAD_RUN_TIME = {
    "id_out_of_range": (
        dict(ids=tf.constant([0, 4, 2])),
        r"sp_ids: bag 0, position 1 = 4 is not in \[0, 4\)",
    ),
    "bag_out_of_range": (
        dict(bags=tf.constant([0, 0, 2], tf.int64)),
        r"bags\[2\] = 2 is not in \[0, 2\)",
    ),
    "slot_row_out_of_range": ("map 7", r"slot_of_row\[0\] = 7 is not a slot row .*\[0, 2\)"),
    "slot_row_not_whole": ("map 0.5", r"slot_of_row\[0\] = 0.5 is not a slot row"),
    "slot_row_shared": (
        "share",
        r"slot_of_row: rows 0 and 1 both have slot row 1; two permitted rows",
    ),
    "rows_used_negative": ("used -1", r"slot_rows_used: -1 slot rows is not in \[0, 16777216\]"),
    "mask_of_wrong_length": (
        dict(row_mask=tf.constant([True, False])),
        r"row_mask: shape \[2\] must be \[4\]",
    ),
    "grad_of_wrong_width": (
        dict(grad=tf.ones([2, 2])),
        r"grad: shape \[2,2\] must be \[B\] \+ \[3\]",
    ),
}


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("case", sorted(BAD_RUN_TIME))
def test_bad_input_is_refused_and_nothing_is_written(case, use_function):
    variables, args = _small_problem()
    change, message = BAD_RUN_TIME[case]
    if isinstance(change, dict):
        args.update(change)
    elif change.startswith("map"):
        variables[3].assign([float(change.split()[1]), -1.0, -1.0, -1.0])
    elif change == "share":
        variables[3].assign([1.0, 1.0, -1.0, -1.0])
    else:
        variables[4].assign(int(change.split()[1]))
    before = [x.numpy().copy() for x in variables]

    def run():
        masked_embedding_bag_apply_adam(*variables[:3], **args)

    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        tf.function(run)() if use_function else run()
    for name, variable, old in zip(("var", "m", "v", "slot_of_row", "used"), variables, before):
        assert_bits_equal(variable, old, f"{name} after a refused step")


@pytest.mark.parametrize(
    "change, error, message",
    [
        (
            dict(bags=tf.constant([0, 0, 1], tf.int32)),
            PartialEmbeddingTypeError,
            "bags: dtype int32 must be int64",
        ),
        (dict(grad=tf.ones([2, 3], tf.float64)), PartialEmbeddingTypeError, "grad: dtype float64"),
        (
            dict(factors=tf.constant([0.5, 0.5, 1.0], tf.float64)),
            PartialEmbeddingTypeError,
            "factors: dtype float64",
        ),
        (dict(slot_rows_used=None), PartialEmbeddingArgumentError, "give both"),
    ],
    ids=["bags_int32", "grad_dtype", "factors_dtype", "half_a_slot_map"],
)
def test_bad_arguments_are_refused_with_their_names(change, error, message):
    variables, args = _small_problem()
    args.update(change)
    with pytest.raises(error, match=message):
        masked_embedding_bag_apply_adam(*variables[:3], **args)


# The compact-slot rule, as cc/core/row_update_contract.h words it.
_SLOT_RULE = r" must be \[S\] \+ var.shape\[1:\] with one S >= 1 for all slots"


@pytest.mark.parametrize("use_function", [False, True], ids=["kernel", "shape_function"])
@pytest.mark.parametrize(
    "tables, message",
    [
        (
            {"v": (3, 3)},
            r"velocity: shape \[3,3\]" + _SLOT_RULE + r" \(var: \[4,3\], momentum: \[2,3\]\)",
        ),
        ({"m": (2, 4), "v": (2, 4)}, r"momentum: shape \[2,4\]" + _SLOT_RULE),
        ({"m": (0, 3), "v": (0, 3)}, r"momentum: shape \[0,3\]" + _SLOT_RULE),
        (
            {"slot_of_row": (3,)},
            r"slot_of_row: shape \[3\] must be \[4\] \(one entry per row of var\)",
        ),
    ],
    ids=["v_rows", "row_shape", "no_slot_row", "map_short"],
)
def test_wrong_compact_slot_shapes_are_refused_before_anything_runs(tables, message, use_function):
    # Eagerly the kernel refuses them; in a graph the op's shape function
    # already does, from the variables' handles, when the step is traced.
    variables, args = _small_problem()
    for name, shape in tables.items():
        index = ("var", "m", "v", "slot_of_row").index(name)
        variables[index] = tf.Variable(tf.zeros(shape))
    args["slot_of_row"] = variables[3]
    before = [x.numpy().copy() for x in variables]

    def run():
        masked_embedding_bag_apply_adam(*variables[:3], **args)

    with pytest.raises(PartialEmbeddingArgumentError, match=message):
        tf.function(run).get_concrete_function() if use_function else run()
    for name, variable, old in zip(("var", "m", "v", "slot_of_row", "used"), variables, before):
        assert_bits_equal(variable, old, f"{name} after a refused step")


def _lookup(**change):
    """EmbeddingBag's raw op on a [4, 3] table, three positions in two bags."""
    from partial_embedding._loader import load_ops

    args = dict(
        params=tf.ones([4, 3]), ids=tf.constant([0, 1, 2]), bags=tf.constant([0, 0, 1], tf.int64),
        num_bags=tf.constant(2, tf.int64), weights=tf.zeros([0]), combiner="mean",
    )  # fmt: skip
    args.update(change)
    return load_ops().partial_embedding_embedding_bag(**args)


def _gradient(**change):
    """MaskedEmbeddingBagGrad's raw op for the same batch."""
    from partial_embedding._loader import load_ops

    args = dict(
        grad=tf.ones([2, 3]), ids=tf.constant([0, 1, 2]), bags=tf.constant([0, 0, 1], tf.int64),
        factors=tf.constant([0.5, 0.5, 1.0]), row_mask=tf.ones([4], tf.bool),
    )  # fmt: skip
    args.update(change)
    return load_ops().partial_embedding_masked_embedding_bag_grad(**args)


_ONE_PER_POSITION = r": must be vectors with one entry per position, got shapes "


@pytest.mark.parametrize("use_function", [False, True], ids=["kernel", "shape_function"])
@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: _lookup(bags=tf.constant([0, 1], tf.int64)),
            r"ids and bags" + _ONE_PER_POSITION + r"\[3\] and \[2\]",
        ),
        (
            lambda: _lookup(weights=tf.ones([2])),
            r"ids, bags and weights" + _ONE_PER_POSITION + r"\[3\], \[3\] and \[2\]",
        ),
        (lambda: _lookup(params=tf.constant(1.0)), r"params: shape \[\] must be \[V, \.\.\.\]"),
        (lambda: _lookup(num_bags=tf.constant(-1, tf.int64)), r"num_bags: -1 must be >= 0"),
        (
            lambda: _gradient(row_mask=tf.ones([4, 1], tf.bool)),
            r"row_mask: shape \[4,1\] must be \[V\] \(rank 1\)",
        ),
        (
            lambda: _gradient(factors=tf.ones([2])),
            r"ids, bags and factors" + _ONE_PER_POSITION + r"\[3\], \[3\] and \[2\]",
        ),
    ],
    ids=["bags", "weights", "params", "num_bags", "row_mask", "factors"],
)
def test_bag_ops_kernel_and_shape_function_refuse_with_one_text(call, message, use_function):
    # cc/core/embedding_bag_contract.h words each refusal once: the kernel's
    # (eager) and the shape function's (while tracing) are the same text.
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        tf.function(call).get_concrete_function() if use_function else call()


# --- MaskedOptimizer ---------------------------------------------------------------


def _bag_model(vocab, width, trainable_ids, seed):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((None,), dtype="int32", ragged=True)
    layer = pe.PartialEmbedding(vocab, width, trainable_ids=trainable_ids, combiner="mean")
    return layer, keras.Model(ids, keras.layers.Dense(1)(layer(ids)))


def _train(monkeypatch, fused, compact_slots, steps, rng_seed, amsgrad=False):
    """Trains a bag model; returns the layer, optimizer and the op types of the step."""
    if not fused:
        monkeypatch.setattr(row_rules, "_bag_fused", lambda *a: False)
    rng = make_rng("optimizer batches", rng_seed)
    vocab, width = 50, 4
    trainable_ids = np.flatnonzero(rng.random(vocab) < 0.5)
    layer, model = _bag_model(vocab, width, trainable_ids, 7)
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.Adam(0.05, amsgrad=amsgrad),
        compact_slots=compact_slots,
        slot_capacity=2 if compact_slots else None,
    )
    variables = model.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step(ids, targets):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids) - targets))
        optimizer.apply(tape.gradient(loss, variables), variables)

    op_types = None
    for _ in range(steps):
        lengths = rng.integers(0, 5, 6)
        flat = np.where(rng.random(lengths.sum()) < 0.1, -1, rng.integers(0, vocab, lengths.sum()))
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(flat, tf.int32), lengths)
        targets = tf.constant(rng.normal(size=(6, 1)).astype(np.float32))
        step(ids, targets)
        if op_types is None:
            graph = step.get_concrete_function(ids, targets).graph
            op_types = {op.type for op in graph.get_operations()}
    return layer, optimizer, op_types


@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
@pytest.mark.parametrize("compact_slots", [False, True], ids=["full_slots", "compact_slots"])
def test_masked_optimizer_uses_it_and_gets_the_two_ops_bits(monkeypatch, compact_slots, amsgrad):
    initial_layer, _ = _bag_model(50, 4, np.arange(25), 7)
    initial = initial_layer.embeddings.numpy().copy()
    layer, optimizer, op_types = _train(monkeypatch, True, compact_slots, 6, 0, amsgrad)
    assert any("MaskedEmbeddingBagApplyRule" in t for t in op_types)
    with monkeypatch.context() as patch:
        reference_layer, reference_optimizer, reference_types = _train(
            patch, False, compact_slots, 6, 0, amsgrad
        )
    assert not any("MaskedEmbeddingBagApplyRule" in t for t in reference_types)
    assert_bits_equal(layer.embeddings, reference_layer.embeddings, "table")
    for name in ("momentum", "velocity") + (("velocity_hat",) if amsgrad else ()):
        assert_bits_equal(
            optimizer.slot_variable(layer.embeddings, name),
            reference_optimizer.slot_variable(reference_layer.embeddings, name),
            name,
        )
    if compact_slots:
        assert optimizer.compact_slot_rows(
            layer.embeddings
        ) == reference_optimizer.compact_slot_rows(reference_layer.embeddings)
    frozen = ~layer.trainable_mask.numpy()
    assert frozen.any()
    assert_bits_equal(layer.embeddings.numpy()[frozen], initial[frozen], "frozen rows")
    assert not np.array_equal(layer.embeddings.numpy()[~frozen], initial[~frozen])
