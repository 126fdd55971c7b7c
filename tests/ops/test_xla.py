"""The XLA path (``jit_compile=True``): same training as the kernel path.

Under XLA the custom kernels cannot run; the lookup, ``masked_scatter_sub``
and ``MaskedOptimizer`` use stock ops with static shapes instead. These
tests train the same model on the same batches with and without XLA, for
every supported rule, with compact and full-size slots, through
``model.fit`` and through a custom ``tf.function(jit_compile=True)`` loop:
rows that were never permitted, and their slots, keep their exact bits;
permitted rows and their slots equal the kernel path's (rtol 1e-5).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding._internal import framework_private
from partial_embedding._internal import rule_table as pe_rule_table
from pe_testing import (
    assert_bits_equal,
    assert_within_rounding,
    fused_hyperparameters,
    global_dtype_policy,
    masked_fit_problem,
    row_rule_configs,
    seed_frameworks,
)

VOCAB = 40
WIDTH = 4
IDS_PER_SAMPLE = 3
BATCH = 8
SAMPLES = 32
RTOL = 1e-5
ATOL = 1e-6

RULES = row_rule_configs()


def _problem(rng):
    return masked_fit_problem(rng, VOCAB, WIDTH, IDS_PER_SAMPLE, SAMPLES)


def _model(table, permitted, dtype=None):
    seed_frameworks("test_xla", "model")
    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table, dtype=dtype)
    model = keras.Sequential(
        [
            keras.Input((IDS_PER_SAMPLE,), dtype="int32"),
            layer,
            keras.layers.Flatten(dtype=dtype),
            keras.layers.Dense(1, kernel_initializer="ones", dtype=dtype),
        ]
    )
    return model, layer


def _mask_changes(permitted):
    """The rows :func:`_fit` freezes (half the trained ones) and unfreezes
    between its two fits."""
    return np.flatnonzero(permitted)[::2], np.flatnonzero(~permitted)[: VOCAB // 4]


def _fit(rule_name, jit, compact, table, permitted, x, y):
    """Trains, then freezes half the trained rows and unfreezes new ones (more
    than the compact slots were built for), then trains again: under XLA the
    slots cannot grow inside a step, so ``unfreeze`` must reserve room. The
    model computes in the table's dtype."""
    model, layer = _model(table, permitted, table.dtype.name)
    optimizer = pe.MaskedOptimizer(RULES[rule_name](), compact_slots=compact)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    assert model.jit_compile is jit
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    frozen, unfrozen = _mask_changes(permitted)
    layer.freeze(frozen)
    layer.unfreeze(unfrozen)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    ever_permitted = permitted.copy()
    ever_permitted[unfrozen] = True
    return model, layer, optimizer, ever_permitted


def _slots_by_row(optimizer, layer, names):
    """Each slot as a [V, ...] array (compact slots spread back to their rows;
    rows without a slot row hold NaN) and which rows have a slot."""
    if optimizer.has_compact_slots(layer.embeddings):
        variables = {
            v.name.split("/")[-1].split(":")[0]: v.numpy() for v in optimizer.compact_slot_variables
        }
        slot_of_row = variables["slot_of_row"]
        has_slot = slot_of_row >= 0
        spread = {}
        for name in names:
            # Per element, or one value a row (the row-wise rules).
            values = np.full((VOCAB, *variables[name].shape[1:]), np.nan, variables[name].dtype)
            values[has_slot] = variables[name][slot_of_row[has_slot].astype(int)]
            spread[name] = values
        return spread, has_slot
    return {
        name: framework_private.slot(optimizer.base_optimizer, name, layer.embeddings).numpy()
        for name in names
    }, None


FIT_CASES = [(name, True) for name in sorted(RULES)] + [
    (name, False) for name in ("adam_amsgrad_decay", "rmsprop_momentum_centered", "sgd_momentum")
]


#: Every case in float64, where the kernel path trains beside XLA and is
#: compared; every other case in float32 too, where only what is known from
#: the ids and the mask changes is checked (every rule also runs under XLA in
#: float32 in test_custom_xla_loop_matches_the_kernel_path_for_every_rule and
#: in test_fused_rules.py's rotation).
FIT_PARAMS = [(name, compact, "float64") for name, compact in FIT_CASES] + [
    (name, compact, "float32") for name, compact in FIT_CASES[::2]
]


@pytest.mark.parametrize(
    ("rule_name", "compact", "dtype"),
    FIT_PARAMS,
    ids=[
        f"{name}-{'compact' if compact else 'full_slots'}-{dtype}"
        for name, compact, dtype in FIT_PARAMS
    ],
)
def test_fit_with_xla_matches_the_kernel_path(rule_name, compact, dtype, rng):
    """What holds exactly is checked in both dtypes: rows never permitted keep
    their bits (and, in full-size slots, their slots' initial value), the
    same rows get compact slot rows, the mask is the same, permitted rows
    train. Values are compared in float64: XLA rounds the head's forward and
    backward in another order, and Adam, RMSprop and Adagrad divide by a
    root of the squared gradients, which carries a rounding difference in a
    gradient that is small through cancellation into any difference in the
    step (float32 tolerances had to be widened after seeds 1048545783 and
    2825084864). In float64 the paths agree to rounding, far below the
    tolerances, so a difference there is one of algorithm. So only the
    float64 case trains the kernel path beside XLA; what float32 compares
    with it (the mask, which rows have slot rows) is known from the ids and
    the mask changes alone, and is checked against that in both dtypes."""
    table, permitted, x, y = _problem(rng)
    table = table.astype(dtype)
    model, layer, optimizer, ever = _fit(rule_name, True, compact, table, permitted, x, y)
    final_mask = ever.copy()  # the rows ever permitted, less those frozen before the second fit
    final_mask[_mask_changes(permitted)[0]] = False
    looked_up = np.zeros(VOCAB, bool)
    looked_up[x.ravel()] = True

    trained = layer.embeddings.numpy()
    assert trained.dtype == dtype
    # Never permitted: the initial bits. Permitted at some step: the kernel
    # path's values.
    assert_bits_equal(trained[~ever], table[~ever], "rows never permitted")
    assert not np.array_equal(trained[ever], table[ever]), "permitted rows did not train"
    np.testing.assert_array_equal(layer.trainable_mask.numpy(), final_mask)
    if dtype == "float64":
        ref_model, ref_layer, ref_optimizer, _ = _fit(
            rule_name, False, compact, table, permitted, x, y
        )
        np.testing.assert_array_equal(
            layer.trainable_mask.numpy(), ref_layer.trainable_mask.numpy()
        )
        np.testing.assert_allclose(
            trained, ref_layer.embeddings.numpy(), rtol=RTOL, atol=ATOL, err_msg="table"
        )
        table_paths = {layer.embeddings.path, layer.trainable_mask.path}
        for variable, theirs in zip(model.weights, ref_model.get_weights(), strict=True):
            if variable.path not in table_paths:
                np.testing.assert_allclose(variable.numpy(), theirs, rtol=RTOL, atol=ATOL)

    names = [spec.name for spec in optimizer._row_rule.slots(optimizer.base_optimizer)]
    assert optimizer.has_compact_slots(layer.embeddings) is (compact and bool(names))
    slots, has_slot = _slots_by_row(optimizer, layer, names)
    if dtype == "float64":
        ref_slots, ref_has_slot = _slots_by_row(ref_optimizer, ref_layer, names)
    if has_slot is not None:
        # Slot rows for exactly the rows that a batch held while they were
        # permitted (so none for a row never permitted), as the kernel path
        # gives them.
        np.testing.assert_array_equal(has_slot, ever & looked_up)
        if dtype == "float64":
            np.testing.assert_array_equal(has_slot, ref_has_slot)
    for name in names:
        if has_slot is None:
            initial = np.full(slots[name].shape[1:], spec_initial(optimizer, name), dtype)
            assert_bits_equal(
                slots[name][~ever], np.broadcast_to(initial, slots[name][~ever].shape), name
            )
        if dtype == "float64":
            np.testing.assert_allclose(slots[name], ref_slots[name], rtol=RTOL, atol=ATOL)


def spec_initial(optimizer, name):
    return next(
        spec.initial_value
        for spec in optimizer._row_rule.slots(optimizer.base_optimizer)
        if spec.name == name
    )


def _custom_loops(jit, table, permitted, x, y):
    """Every rule's model trained by one ``tf.function`` (one compilation for
    all of them): full-size slots for Adam, compact slots for the others."""
    runs = {}
    for rule_name in sorted(RULES):
        model, layer = _model(table, permitted, table.dtype.name)
        optimizer = pe.MaskedOptimizer(RULES[rule_name](), compact_slots=rule_name != "adam")
        optimizer.build(model.trainable_variables)
        runs[rule_name] = (model, layer, optimizer)
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function(jit_compile=jit)
    def step(ids, targets):
        losses = []
        for model, _, optimizer in runs.values():
            with tf.GradientTape() as tape:
                loss = loss_fn(targets, model(ids, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(gradients, model.trainable_variables)
            losses.append(loss)
        return tf.stack(losses)

    losses = np.stack(
        [
            step(tf.constant(x[i : i + BATCH]), tf.constant(y[i : i + BATCH])).numpy()
            for i in range(0, SAMPLES, BATCH)
        ]
    )
    return runs, losses


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_custom_xla_loop_matches_the_kernel_path_for_every_rule(rng, dtype):
    """Frozen rows keep their bits and permitted rows train in both dtypes;
    values are compared in float64, the only dtype that trains the kernel path
    beside XLA (see test_fit_with_xla_matches_the_kernel_path)."""
    table, permitted, x, y = _problem(rng)
    table, y = table.astype(dtype), y.astype(dtype)
    runs, losses = _custom_loops(True, table, permitted, x, y)
    if dtype == "float64":
        ref_runs, ref_losses = _custom_loops(False, table, permitted, x, y)
        np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)
    for rule_name, (model, layer, _) in runs.items():
        trained = layer.embeddings.numpy()
        assert trained.dtype == dtype
        assert_bits_equal(trained[~permitted], table[~permitted], f"frozen rows, {rule_name}")
        assert not np.array_equal(trained[permitted], table[permitted]), rule_name
        if dtype == "float64":
            ref_model, ref_layer, _ = ref_runs[rule_name]
            np.testing.assert_allclose(
                trained, ref_layer.embeddings.numpy(), rtol=RTOL, atol=ATOL, err_msg=rule_name
            )
            for mine, theirs in zip(model.get_weights(), ref_model.get_weights()):
                np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=ATOL, err_msg=rule_name)


def test_masked_scatter_sub_under_xla_matches_numpy_and_skips_bad_ids(rng):
    for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
        for index_dtype in (tf.int32, tf.int64):
            rows = int(rng.integers(5, 30))
            width = int(rng.integers(1, 5))
            start = rng.normal(size=(rows, width)).astype(np.float64)
            start[0, 0] = -0.0  # keeps its sign where frozen
            mask = rng.random(rows) < 0.5
            count = int(rng.integers(1, 40))
            ids = rng.integers(-3, rows + 3, size=count)  # duplicates, bad ids
            updates = rng.normal(size=(count, width))
            variable = tf.Variable(tf.cast(start, dtype))
            before = variable.numpy()

            @tf.function(jit_compile=True)
            def update(ids, updates, variable=variable, mask=mask):
                pe.masked_scatter_sub(variable, ids, updates, mask)

            update(tf.constant(ids, index_dtype), tf.cast(updates, dtype))
            expected = before.astype(np.float64)
            for i, row in enumerate(ids):
                if 0 <= row < rows and mask[row]:
                    expected[row] -= tf.cast(updates[i], dtype).numpy().astype(np.float64)
            after = variable.numpy()
            what = f"{dtype.name}/{index_dtype.name}"
            assert_bits_equal(after[~mask], before[~mask], f"frozen rows, {what}")
            tolerance = 1e-2 if dtype in (tf.float16, tf.bfloat16) else 1e-6
            np.testing.assert_allclose(
                after.astype(np.float64), expected, rtol=tolerance, atol=tolerance, err_msg=what
            )


def test_compact_slots_without_room_skip_rows_under_xla_and_never_write_them():
    """A mask variable assigned directly (no reservation): the rows that find
    no slot row skip their update, table and slots, instead of being written
    with wrong state."""
    table = np.arange(VOCAB * WIDTH, dtype=np.float32).reshape(VOCAB, WIDTH) / 100
    variable = tf.Variable(table)
    mask = tf.Variable(np.arange(VOCAB) < 2)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), row_masks=[(variable, mask)])
    optimizer.build([variable])
    assert optimizer.has_compact_slots(variable)

    @tf.function(jit_compile=True)
    def step(ids):
        optimizer.apply([tf.IndexedSlices(tf.ones([4, WIDTH]), ids, [VOCAB, WIDTH])], [variable])

    step(tf.constant([0, 1, 0, 1]))  # traced: room for rows 0 and 1
    mask.assign(np.arange(VOCAB) < 6)  # not through the layer: nothing reserved
    step(tf.constant([2, 3, 4, 5]))
    after = variable.numpy()
    # Rows 2..5 found no slot row (capacity 2): untouched, and they have none.
    assert_bits_equal(after[2:], table[2:], "rows without room and frozen rows")
    assert optimizer.compact_slot_rows(variable) == 2
    # A new trace reserves room (as does PartialEmbedding.unfreeze): they train.
    optimizer.set_row_mask(variable, mask)
    step(tf.constant([2, 3, 4, 5]))
    assert optimizer.compact_slot_rows(variable) == 6
    assert not np.array_equal(variable.numpy()[2:6], table[2:6])
    assert_bits_equal(variable.numpy()[6:], table[6:], "frozen rows")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
def test_reversible_language_model_fits_under_xla_like_the_kernel_path(rng, tie_weights, dtype):
    """Frozen rows keep their bits on both paths. The trained rows are compared
    in float64: XLA fuses the softmax cross-entropy and the projection with
    another order of float operations, and Adam divides each gradient by its
    own root mean square, which turns a rounding difference in a gradient
    that is small through cancellation into a much larger one in the step.
    In float32 that reached 9e-5 relative after four steps on some seeds
    (PE_TEST_SEED=2825084864); in float64 the two paths agree to 1e-15
    relative on every seed tried, so a difference above RTOL/ATOL there is
    a difference of algorithm, not of rounding."""
    vocab, width, sequence = 30, 4, 5
    permitted = np.zeros(vocab, bool)
    permitted[[3, 7, 11, 20]] = True
    ids = rng.integers(0, vocab, size=(16, sequence)).astype(np.int32)
    targets = np.roll(ids, -1, axis=1)

    def fit(jit):
        seed_frameworks("test_xla", "lm", tie_weights)
        layer = pe.PartialReversibleEmbedding(
            vocab, width, tie_weights=tie_weights, trainable_ids=permitted, dtype=dtype
        )
        inputs = keras.Input((sequence,), dtype="int32")
        hidden = keras.layers.Dense(width, name="mixer", dtype=dtype)(layer(inputs))
        model = keras.Model(inputs, layer(hidden, reverse=True))
        model.compile(
            optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit,
        )
        start = [w.copy() for w in layer.get_weights()]
        model.fit(ids, targets, batch_size=8, epochs=2, shuffle=False, verbose=0)
        return layer, start

    ref_layer, _ = fit(False)
    layer, start = fit(True)
    # Every permitted row of a table the logits use learns; of an input-only
    # table, those the ids look up.
    looked_up = permitted & np.isin(np.arange(vocab), ids)
    tables = [(layer.embeddings, ref_layer.embeddings, start[0], permitted)]
    if not tie_weights:
        tables[0] = (*tables[0][:3], looked_up)
        tables.append((layer.reverse_embeddings, ref_layer.reverse_embeddings, start[1], permitted))
    for xla, kernel, before, learning in tables:
        assert xla.dtype == dtype
        assert_bits_equal(xla.numpy()[~permitted], before[~permitted], "frozen rows (XLA)")
        assert_bits_equal(kernel.numpy()[~permitted], before[~permitted], "frozen rows (kernel)")
        assert learning.any() and np.all(xla.numpy()[learning] != before[learning])
        if dtype == "float64":
            np.testing.assert_allclose(xla.numpy(), kernel.numpy(), rtol=RTOL, atol=ATOL)


def test_fused_rule_op_says_it_has_no_xla_version():
    table = tf.Variable(tf.ones([3, 2]))
    m = tf.Variable(tf.zeros([3, 2]))
    v = tf.Variable(tf.zeros([3, 2]))

    @tf.function(jit_compile=True)
    def step():
        pe.ops.masked_sparse_apply_rule(
            "adam",
            table,
            [m, v],
            [0],
            tf.ones([1, 2]),
            [True, True, True],
            fused_hyperparameters(pe_rule_table.RULES["adam"].hyperparameters),
        )

    with pytest.raises(pe.PartialEmbeddingArgumentError, match="no XLA version"):
        step()
    assert_bits_equal(table.numpy(), np.ones([3, 2], np.float32), "table")


def _mixed_float16_sgd_step(jit, table, permitted, x, y):
    """Trains on one batch until the first step that is not skipped (the loss
    scale starts at 2**15 and halves at each overflow); returns the table,
    the skipped steps and the loss scale."""
    with global_dtype_policy("mixed_float16"):
        model, layer = _model(table, permitted)
        model.compile(
            optimizer=pe.MaskedOptimizer(keras.optimizers.SGD(2.0**-4)), loss="mse", jit_compile=jit
        )
        skipped = 0
        model.train_on_batch(x, y)
        while np.array_equal(layer.embeddings.numpy(), table):
            skipped += 1
            assert skipped < 20, "20 steps and still no update"
            model.train_on_batch(x, y)
        scale = float(np.asarray(model.optimizer.dynamic_scale.numpy()))
    return layer.embeddings.numpy(), skipped, scale


def test_mixed_float16_fit_under_xla_matches_the_kernel_path(rng):
    """Keras wraps the optimizer in a LossScaleOptimizer under mixed_float16:
    its finite check and scaling compile with the row updates.

    XLA evaluates the float16 forward and backward in another order, so on
    arbitrary values the two paths differ by rounding. Here every value is a
    multiple of 1/16 in [-1, 1], so each float16 sum and product of the step
    (12 entries a prediction, (pred - y) / 4, sums of duplicates, loss
    scales that are powers of two) is exact, and so is the float32 update
    with a learning rate of 1/16: both paths must skip the same overflowing
    steps and then write the same bits, those of exact SGD in float64."""
    table = (rng.integers(-16, 17, size=(VOCAB, WIDTH)) / 16).astype(np.float32)
    permitted = np.zeros(VOCAB, bool)
    permitted[rng.choice(VOCAB, VOCAB // 4, replace=False)] = True
    x = rng.integers(0, VOCAB, size=(BATCH, IDS_PER_SAMPLE)).astype(np.int32)
    y = (rng.integers(-16, 17, size=(BATCH, 1)) / 16).astype(np.float32)

    kernel = _mixed_float16_sgd_step(False, table, permitted, x, y)
    xla = _mixed_float16_sgd_step(True, table, permitted, x, y)
    assert xla[1:] == kernel[1:], "skipped steps and loss scale"
    assert_bits_equal(xla[0], kernel[0], "table after the first update")

    gradient = 2 * (table.astype(np.float64)[x].sum(axis=(1, 2)) - y[:, 0]) / BATCH
    expected = table.astype(np.float64)
    for sample, ids in enumerate(x):
        for row in ids[permitted[ids]]:
            expected[row] -= 2.0**-4 * gradient[sample]
    assert_bits_equal(xla[0], expected.astype(np.float32), "exact SGD")


def test_mixed_float16_adam_fit_under_xla_keeps_frozen_rows(rng):
    """Adam under mixed_float16 and XLA for two epochs: frozen rows keep their
    bits, permitted rows learn and stay finite. (Not compared with the kernel
    path: Adam divides each gradient by its RMS, so float16 rounding
    differences have no bound there; see above for the exact comparison.)"""
    table, permitted, x, y = _problem(rng)
    with global_dtype_policy("mixed_float16"):
        model, layer = _model(table, permitted)
        model.compile(
            optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), loss="mse", jit_compile=True
        )
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    trained = layer.embeddings.numpy()
    assert_bits_equal(trained[~permitted], table[~permitted], "frozen rows")
    # Steps whose scaled gradients overflow are skipped (the scale halves),
    # so which rows learn depends on the data; some must, all stay finite.
    assert np.any(trained[permitted] != table[permitted])
    assert np.all(np.isfinite(trained))


def test_both_deduplications_sum_each_row_once_like_numpy(rng):
    """The sort-free (owner map) and the sorting deduplication under XLA,
    against a float64 NumPy reference: each distinct valid id once with its
    summed values, padding rows numbered V, out-of-range ids dropped."""
    from partial_embedding._internal import xla as _xla

    for index_dtype in (tf.int32, tf.int64):
        rows_count = int(rng.integers(3, 50))
        count = int(rng.integers(1, 80))
        ids = rng.integers(-2, rows_count + 2, size=count)
        values = rng.normal(size=(count, 3))
        # int64 as the library's: an int32 variable stays on the host next to a GPU.
        owner_map = tf.Variable(tf.fill([rows_count + 1], tf.constant(7, tf.int64)))  # stale values

        @tf.function(jit_compile=True)
        def both(ids, values, owner_map=owner_map, rows_count=rows_count):
            return (
                _xla.owner_segment_sum(ids, values, rows_count, owner_map),
                _xla.sorted_segment_sum(ids, values, rows_count),
            )

        occurrences = {}
        for row, value in zip(ids, values):
            if 0 <= row < rows_count:
                occurrences.setdefault(int(row), []).append(value)
        # Exact sums (math.fsum, rounded once) and the sums of |values|.
        expected = {
            row: np.array([math.fsum(column) for column in np.transpose(terms)])
            for row, terms in occurrences.items()
        }
        magnitude = {row: np.abs(terms).sum(axis=0) for row, terms in occurrences.items()}
        for rows, summed in both(tf.constant(ids, index_dtype), tf.constant(values)):
            rows, summed = rows.numpy(), summed.numpy()
            assert rows.shape == (count,) and rows.dtype == index_dtype.as_numpy_dtype
            real = rows < rows_count
            assert sorted(rows[real].tolist()) == sorted(expected)
            assert np.all(rows[~real] == rows_count)
            assert np.all(summed[~real] == 0)
            for row, total in zip(rows[real], summed[real]):
                # k values summed in any order: k - 1 roundings, one more for
                # the reference's; the error scales with sum |values|, not
                # with the sum, which mixed signs may cancel.
                terms = len(occurrences[int(row)])
                assert_within_rounding(
                    total,
                    expected[int(row)],
                    magnitude[int(row)],
                    terms,
                    "float64",
                    f"row {row}",
                )


@pytest.mark.parametrize("bad_id", [-1, VOCAB, VOCAB + 7])
def test_a_bad_id_under_xla_moves_no_row(rng, bad_id):
    """Under XLA a bad id looks up zeros and gets no gradient: its gradient
    names no row, so no permitted row (row 0, which XLA gathers in its place,
    among them) takes an Adam step with a zero gradient from it."""
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    variable = tf.Variable(table)
    mask = np.ones(VOCAB, bool)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), row_masks=[(variable, mask)])
    optimizer.build([variable])

    @tf.function(jit_compile=True)
    def step(ids):
        with tf.GradientTape() as tape:
            rows = pe.masked_embedding_lookup(variable, ids, mask)
            loss = tf.reduce_sum(tf.square(rows - 1.0))
        optimizer.apply(tape.gradient(loss, [variable]), [variable])
        return rows

    step(tf.constant([0, 1, 2, 3]))  # rows 0-3 now have moments
    before = variable.numpy()
    looked_up = step(tf.constant([1, 2, 3, bad_id])).numpy()
    after = variable.numpy()
    assert_bits_equal(looked_up[3], np.zeros(WIDTH, np.float32), "the bad id's row")
    assert_bits_equal(after[0], before[0], "row 0, absent from the batch")
    assert_bits_equal(after[4:], before[4:], "rows absent from the batch")
    assert np.all(np.any(after[1:4] != before[1:4], axis=1)), "rows 1-3 train"
