"""Tests of PartialReversibleEmbedding and ops.masked_reverse_projection.

Random inputs come from the seeded ``rng`` fixture (conftest.py): fixed by
default, printed on failure, replayed with PE_TEST_SEED=<int>, fresh with
PE_TEST_SEED=random.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import assert_bits_equal, assert_within_rounding, global_dtype_policy

NUM_ROWS, WIDTH, SEQUENCE = 13, 4, 5
PERMITTED = [2, 7, 11, 12]
EXECUTION = ["eager", "tf_function"]


def run(execution, function, *args):
    if execution == "tf_function":
        return tf.function(function)(*args)
    return function(*args)


def permitted_mask(ids=PERMITTED, rows=NUM_ROWS):
    mask = np.zeros([rows], dtype=bool)
    mask[ids] = True
    return mask


# -- the op: gradient against a float64 reference ---------------------------


def assert_float32_dot_products(got, reference, abs_products, terms):
    """``got`` (float32 sums of ``terms`` products each) against the float64
    ``reference``, within the classic bound of a float32 dot product:
    ``|got - exact| <= gamma(terms + 1) * sum|a_i * b_i|`` with
    ``gamma(n) = n u / (1 - n u)`` and ``u = 2**-24`` (one rounding per
    product and per addition; the inputs are float32, so exact in float64).
    A relative tolerance alone fails on some seeds: a small logit that is
    the difference of larger products carries an absolute, not a relative,
    error."""
    unit = 2.0**-24
    gamma = (terms + 1) * unit / (1 - (terms + 1) * unit)
    error = np.abs(got.astype(np.float64) - reference)
    bound = gamma * abs_products
    assert np.all(error <= bound), (
        f"largest error / bound: {np.max(error / np.maximum(bound, 1e-300))}"
    )


@pytest.mark.parametrize("execution", EXECUTION)
def test_reverse_gradient_matches_float64_reference(rng, execution):
    table_values = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    hidden_values = rng.standard_normal([2, 3, WIDTH]).astype(np.float32)
    upstream = rng.standard_normal([2, 3, NUM_ROWS]).astype(np.float32)
    table = tf.Variable(table_values)
    mask = tf.Variable(permitted_mask())

    def gradients(hidden):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            logits = pe.ops.masked_reverse_projection(hidden, table, mask)
            loss = tf.reduce_sum(logits * upstream)
        table_grad, hidden_grad = tape.gradient(loss, [table, hidden])
        return logits, table_grad, hidden_grad

    logits, table_grad, hidden_grad = run(execution, gradients, tf.constant(hidden_values))

    flat_hidden = hidden_values.reshape(-1, WIDTH).astype(np.float64)
    flat_upstream = upstream.reshape(-1, NUM_ROWS).astype(np.float64)
    dense_reference = flat_upstream.T @ flat_hidden
    assert isinstance(table_grad, tf.IndexedSlices)
    assert table_grad.indices.numpy().tolist() == PERMITTED
    assert tuple(table_grad.values.shape) == (len(PERMITTED), WIDTH)
    assert table_grad.dense_shape.numpy().tolist() == [NUM_ROWS, WIDTH]
    abs_hidden, abs_table = np.abs(flat_hidden), np.abs(table_values.astype(np.float64))
    abs_upstream = np.abs(flat_upstream)
    assert_float32_dot_products(
        table_grad.values.numpy(),
        dense_reference[PERMITTED],
        (abs_upstream.T @ abs_hidden)[PERMITTED],
        terms=flat_hidden.shape[0],
    )
    assert_float32_dot_products(
        logits.numpy().reshape(-1, NUM_ROWS),
        flat_hidden @ table_values.T.astype(np.float64),
        abs_hidden @ abs_table.T,
        terms=WIDTH,
    )
    # hidden's gradient: dense and exactly what a plain matmul's would be: the
    # same [N, D] x [V, D]^T MatMul (a [2, 3, D] operand would be a
    # BatchMatMul, whose kernel may round differently on some CPUs: it did on
    # an AMD EPYC without AVX-512).
    with tf.GradientTape() as tape:
        hidden = tf.constant(hidden_values.reshape(-1, WIDTH))
        tape.watch(hidden)
        plain = tf.reduce_sum(
            tf.matmul(hidden, table_values, transpose_b=True) * upstream.reshape(-1, NUM_ROWS)
        )
    assert isinstance(hidden_grad, tf.Tensor)
    plain_grad = tape.gradient(plain, hidden).numpy().reshape(hidden_grad.shape)
    assert_bits_equal(hidden_grad.numpy(), plain_grad, "hidden grad")
    assert_float32_dot_products(
        hidden_grad.numpy().reshape(-1, WIDTH),
        flat_upstream @ table_values.astype(np.float64),
        abs_upstream @ abs_table,
        terms=NUM_ROWS,
    )


def test_reverse_gradient_in_float64_is_the_reference(rng):
    table_values = rng.standard_normal([NUM_ROWS, WIDTH])
    hidden_values = rng.standard_normal([6, WIDTH])
    upstream = rng.standard_normal([6, NUM_ROWS])
    table = tf.Variable(table_values)
    with tf.GradientTape() as tape:
        logits = pe.ops.masked_reverse_projection(hidden_values, table, permitted_mask())
        loss = tf.reduce_sum(logits * upstream)
    grad = tape.gradient(loss, table)
    # Sums of 6 products, in float64 on both sides: each side errs by at most
    # gamma(6) * sum |upstream * hidden| from the exact sum, however far the
    # mixed-sign products cancel; so the two differ by at most gamma(12) times it.
    assert_within_rounding(
        grad.values.numpy(),
        (upstream.T @ hidden_values)[PERMITTED],
        (np.abs(upstream).T @ np.abs(hidden_values))[PERMITTED],
        2 * len(hidden_values),
        "float64",
        "reverse gradient",
    )


@pytest.mark.parametrize("execution", EXECUTION)
def test_mask_changes_apply_without_retracing(rng, execution):
    table = tf.Variable(rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32))
    mask = tf.Variable(permitted_mask())
    hidden = tf.constant(rng.standard_normal([3, WIDTH]).astype(np.float32))

    def table_gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pe.ops.masked_reverse_projection(hidden, table, mask))
        grad = tape.gradient(loss, table)
        return grad.indices, grad.values

    step = tf.function(table_gradient) if execution == "tf_function" else table_gradient
    indices, values = step()
    assert indices.numpy().tolist() == PERMITTED
    mask.assign(permitted_mask([0]))
    indices, values = step()
    assert indices.numpy().tolist() == [0]
    assert tuple(values.shape) == (1, WIDTH)
    mask.assign(np.zeros([NUM_ROWS], dtype=bool))
    indices, values = step()
    assert tuple(values.shape) == (0, WIDTH)


def test_reverse_projection_never_builds_a_dense_table_gradient(rng):
    table = tf.Variable(rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32))
    mask = tf.Variable(permitted_mask())

    @tf.function
    def step(hidden):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pe.ops.masked_reverse_projection(hidden, table, mask))
        return tape.gradient(loss, table)

    graph = step.get_concrete_function(tf.TensorSpec([None, WIDTH], tf.float32)).graph
    # The read of the table and its forwarding (no new buffer) are [V, D];
    # nothing else that runs may be (an output nobody consumes is pruned).
    aliases = {"ReadVariableOp", "IdentityN", "Identity"}
    for operation in graph.get_operations():
        for output in operation.outputs:
            if not output.consumers():
                continue
            shape = output.shape
            assert not (shape.rank == 2 and shape[0] == NUM_ROWS and shape[1] == WIDTH) or (
                operation.type in aliases
            ), f"{operation.name} ({operation.type}) makes a [V, D] tensor"


def test_reverse_projection_errors(rng):
    table = tf.Variable(np.zeros([NUM_ROWS, WIDTH], np.float32))
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="last dimension"):
        pe.ops.masked_reverse_projection(
            np.zeros([2, WIDTH + 1], np.float32), table, permitted_mask()
        )
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="one entry per row"):
        pe.ops.masked_reverse_projection(np.zeros([2, WIDTH], np.float32), table, [True, False])
    with pytest.raises(pe.PartialEmbeddingTypeError, match="bool"):
        pe.ops.masked_reverse_projection(
            np.zeros([2, WIDTH], np.float32), table, np.ones([NUM_ROWS], np.int32)
        )
    with pytest.raises(pe.PartialEmbeddingTypeError, match="floating"):
        pe.ops.masked_reverse_projection(np.zeros([2, WIDTH], np.int32), table, permitted_mask())


# -- the layer: gradients ----------------------------------------------------


@pytest.mark.parametrize("execution", EXECUTION)
def test_tied_layer_gradient_adds_lookup_and_reverse_rows(rng, execution):
    layer = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, trainable_ids=PERMITTED)
    layer.build()
    ids = tf.constant([[2, 3, 7], [12, 0, 2]], tf.int32)
    upstream = rng.standard_normal([2, 3, NUM_ROWS]).astype(np.float32)

    def gradient(ids):
        with tf.GradientTape() as tape:
            hidden = layer(ids)
            loss = tf.reduce_sum(layer(hidden, reverse=True) * upstream)
        return tape.gradient(loss, layer.trainable_variables)[0]

    grad = run(execution, gradient, ids)
    assert isinstance(grad, tf.IndexedSlices)
    assert set(grad.indices.numpy().tolist()) <= set(PERMITTED)

    table = layer.embeddings.numpy().astype(np.float64)
    hidden = table[ids.numpy()].reshape(-1, WIDTH)
    flat_upstream = upstream.reshape(-1, NUM_ROWS).astype(np.float64)
    reference = flat_upstream.T @ hidden
    # The lookup's part: each occurrence gets dlogits @ table.
    lookup_part = flat_upstream @ table
    for position, row in enumerate(ids.numpy().reshape(-1)):
        reference[row] += lookup_part[position]
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices, NUM_ROWS).numpy()
    np.testing.assert_allclose(dense[PERMITTED], reference[PERMITTED], rtol=1e-5, atol=1e-6)
    assert not dense[np.setdiff1d(np.arange(NUM_ROWS), PERMITTED)].any()


def test_untied_layer_gradient_names_only_its_own_permitted_rows(rng):
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS, WIDTH, tie_weights=False, trainable_ids=PERMITTED, reverse_trainable_ids=[1, 5]
    )
    layer.build()
    assert layer.reverse_embeddings.shape == (NUM_ROWS, WIDTH)
    assert layer.reverse_trainable_ids.tolist() == [1, 5]
    hidden = tf.constant(rng.standard_normal([4, WIDTH]).astype(np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(hidden, reverse=True))
    table_grad, reverse_grad = tape.gradient(loss, [layer.embeddings, layer.reverse_embeddings])
    assert table_grad is None
    assert isinstance(reverse_grad, tf.IndexedSlices)
    assert reverse_grad.indices.numpy().tolist() == [1, 5]
    # Each row's gradient sums the 4 hidden rows (times an upstream 1, exact)
    # in float32: 3 roundings, one more for the float64 reference, on the
    # scale of sum |hidden|, which the sum itself may cancel far below.
    hidden_values = hidden.numpy().astype(np.float64)
    assert_within_rounding(
        reverse_grad.values.numpy(),
        np.tile(hidden_values.sum(0), (2, 1)),
        np.tile(np.abs(hidden_values).sum(0), (2, 1)),
        len(hidden_values),
        "float32",
        "reverse gradient",
    )
    attribute = "_partial_embedding_row_mask"
    assert getattr(layer.reverse_embeddings, attribute) is layer.reverse_trainable_mask
    assert getattr(layer.embeddings, attribute) is layer.trainable_mask


# -- the layer: training -----------------------------------------------------


def language_model(layer, sequence=SEQUENCE):
    ids = keras.Input((sequence,), dtype="int32")
    hidden = keras.layers.Dense(WIDTH, name="mixer")(layer(ids))
    return keras.Model(ids, layer(hidden, reverse=True))


def lm_batch(rng, batch=16):
    ids = rng.integers(0, NUM_ROWS, size=(batch, SEQUENCE)).astype(np.int32)
    return ids, np.roll(ids, -1, axis=1)


def compile_lm(model, optimizer):
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )


@pytest.mark.parametrize("compact_slots", [True, False], ids=["compact", "full_slots"])
@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
def test_fit_with_masked_adam_keeps_frozen_rows_bit_exact(rng, tie_weights, compact_slots):
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS, WIDTH, tie_weights=tie_weights, trainable_ids=PERMITTED
    )
    model = language_model(layer)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=compact_slots)
    compile_lm(model, optimizer)
    ids, targets = lm_batch(rng)
    # The rows each table trains: the input table's rows get a gradient only
    # where their id is in the batch (with 80 ids of 13 rows, a permitted id
    # is absent on about 1 seed in 150); the reverse projection gives every
    # row one. A lazy rule leaves every other row's bits alone, permitted
    # rows without a gradient included.
    looked_up = np.intersect1d(PERMITTED, ids)
    tables = [(layer.embeddings, np.asarray(PERMITTED) if tie_weights else looked_up)]
    if not tie_weights:
        tables.append((layer.reverse_embeddings, np.asarray(PERMITTED)))
    before = [table.numpy().copy() for table, _ in tables]
    model.fit(ids, targets, epochs=3, batch_size=8, verbose=0)
    frozen = np.setdiff1d(np.arange(NUM_ROWS), PERMITTED)
    for (table, trained), old in zip(tables, before, strict=True):
        new = table.numpy()
        untouched = np.setdiff1d(np.arange(NUM_ROWS), trained)
        assert_bits_equal(new[untouched], old[untouched], f"rows of {table.path} given no step")
        assert (new[trained] != old[trained]).any(axis=1).all(), table.path
    if compact_slots:
        return
    # Full-size slots: those of frozen rows were never written, and each
    # slot holds state exactly in the rows its table trained.
    table_slots = [
        variable
        for variable in model.optimizer.variables
        if tuple(variable.shape) == (NUM_ROWS, WIDTH)
    ]
    assert len(table_slots) == 2 * len(tables)
    for slot in table_slots:
        assert_bits_equal(slot.numpy()[frozen], np.zeros([len(frozen), WIDTH]), slot.path)
    written = sorted(
        tuple(np.flatnonzero((slot.numpy() != 0).any(axis=1)).tolist()) for slot in table_slots
    )
    expected = sorted(tuple(np.sort(trained).tolist()) for _, trained in tables for _ in "mv")
    assert written == expected


def stock_language_model(tie_weights):
    layer = keras.layers.ReversibleEmbedding(NUM_ROWS, WIDTH, tie_weights=tie_weights)
    return layer, language_model(layer)


def copy_weights(stock_layer, stock_model, layer, model):
    layer.set_weights(stock_layer.get_weights())
    model.get_layer("mixer").set_weights(stock_model.get_layer("mixer").get_weights())


@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
def test_fit_all_rows_permitted_equals_stock_with_sgd(rng, tie_weights):
    stock_layer, stock_model = stock_language_model(tie_weights)
    layer = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, tie_weights=tie_weights)
    model = language_model(layer)
    copy_weights(stock_layer, stock_model, layer, model)
    compile_lm(stock_model, keras.optimizers.SGD(0.5))
    compile_lm(model, pe.MaskedOptimizer(keras.optimizers.SGD(0.5)))
    ids, targets = lm_batch(rng)
    stock_model.fit(ids, targets, epochs=2, batch_size=8, shuffle=False, verbose=0)
    model.fit(ids, targets, epochs=2, batch_size=8, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        layer.embeddings.numpy(), stock_layer.embeddings.numpy(), rtol=1e-5, atol=1e-6
    )
    if not tie_weights:
        np.testing.assert_allclose(
            layer.reverse_embeddings.numpy(),
            stock_layer.reverse_embeddings.numpy().T,
            rtol=1e-5,
            atol=1e-6,
        )


def test_fit_partial_rows_equals_stock_with_masked_dense_gradient(rng):
    """SGD on permitted rows equals a stock step whose frozen rows' gradient is zeroed."""
    stock_layer, stock_model = stock_language_model(True)
    layer = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, trainable_ids=PERMITTED)
    model = language_model(layer)
    copy_weights(stock_layer, stock_model, layer, model)
    compile_lm(model, pe.MaskedOptimizer(keras.optimizers.SGD(0.5)))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    reference_optimizer = keras.optimizers.SGD(0.5)
    row_mask = permitted_mask()[:, None]
    ids, targets = lm_batch(rng, batch=8)
    for _ in range(2):
        model.train_on_batch(ids, targets)
        with tf.GradientTape() as tape:
            loss = loss_fn(targets, stock_model(ids))
        variables = stock_model.trainable_variables
        grads = tape.gradient(loss, variables)
        grads = [
            tf.where(row_mask, tf.convert_to_tensor(grad), 0.0)
            if variable is stock_layer.embeddings
            else grad
            for grad, variable in zip(grads, variables)
        ]
        reference_optimizer.apply_gradients(zip(grads, variables))
    np.testing.assert_allclose(
        layer.embeddings.numpy(), stock_layer.embeddings.numpy(), rtol=1e-5, atol=1e-6
    )


# -- the layer: forward, serialization, errors -------------------------------


@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("logit_soft_cap", [None, 0.5])
@pytest.mark.parametrize("reverse_dtype", [None, "float64", "float16"])
def test_forward_equals_stock(rng, tie_weights, logit_soft_cap, reverse_dtype):
    stock = keras.layers.ReversibleEmbedding(
        NUM_ROWS,
        WIDTH,
        tie_weights=tie_weights,
        logit_soft_cap=logit_soft_cap,
        reverse_dtype=reverse_dtype,
    )
    stock.build()
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS,
        WIDTH,
        tie_weights=tie_weights,
        logit_soft_cap=logit_soft_cap,
        reverse_dtype=reverse_dtype,
        trainable_ids=PERMITTED,
    )
    layer.build()
    layer.set_weights(stock.get_weights())
    ids = rng.integers(0, NUM_ROWS, size=(3, SEQUENCE)).astype(np.int32)
    assert_bits_equal(layer(ids).numpy(), stock(ids).numpy(), "lookup")
    hidden = rng.standard_normal([3, SEQUENCE, WIDTH]).astype(np.float32)
    ours, theirs = layer(hidden, reverse=True), stock(hidden, reverse=True)
    assert ours.dtype == theirs.dtype
    assert ours.shape == theirs.shape == (3, SEQUENCE, NUM_ROWS)
    # One matmul over the flattened batch where Keras broadcasts a batched
    # one: float32 kernels may round the last bit differently.
    tolerance = 1e-3 if ours.dtype == tf.float16 else 1e-6
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=tolerance, atol=tolerance / 10)


def test_default_reverse_dtype_is_the_compute_dtype(rng):
    layer = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, dtype="mixed_float16")
    hidden = rng.standard_normal([2, WIDTH]).astype(np.float32)
    assert layer(hidden, reverse=True).dtype == tf.float16
    stock = keras.layers.ReversibleEmbedding(
        NUM_ROWS, WIDTH, dtype="mixed_float16", reverse_dtype="float16"
    )
    stock.build()
    stock.set_weights([layer.embeddings.numpy()])
    assert_bits_equal(
        layer(hidden, reverse=True).numpy(), stock(hidden, reverse=True).numpy(), "logits"
    )


def test_mask_zero_masks_ids_not_logits():
    layer = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, mask_zero=True)
    ids = tf.constant([[0, 3, 0]])
    assert layer.compute_mask(ids).numpy().tolist() == [[False, True, False]]
    assert layer.compute_mask(tf.zeros([1, 3, WIDTH])) is None


@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
def test_keras_round_trip(rng, tie_weights, tmp_path):
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS, WIDTH, tie_weights=tie_weights, trainable_ids=PERMITTED, logit_soft_cap=3.0
    )
    model = language_model(layer)
    compile_lm(model, pe.MaskedOptimizer(keras.optimizers.Adam(0.05)))
    ids, targets = lm_batch(rng)
    model.fit(ids, targets, epochs=1, verbose=0)
    if not tie_weights:
        layer.set_reverse_trainable_ids([0, 1])
    path = tmp_path / "lm.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    restored_layer = restored.layers[1]
    assert isinstance(restored_layer, pe.PartialReversibleEmbedding)
    assert restored_layer.trainable_ids.tolist() == PERMITTED
    for ours, theirs in zip(restored_layer.get_weights(), layer.get_weights()):
        assert_bits_equal(ours, theirs, "weight")
    if not tie_weights:
        assert restored_layer.reverse_trainable_ids.tolist() == [0, 1]
    assert_bits_equal(restored.predict(ids, verbose=0), model.predict(ids, verbose=0), "logits")


def test_config_names_no_ids():
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS,
        WIDTH,
        tie_weights=False,
        trainable_ids=PERMITTED,
        reverse_trainable_ids=[3],
        reverse_dtype="float64",
        logit_soft_cap=2.0,
    )
    config = layer.get_config()
    assert config["trainable_ids"] is None
    assert config["frozen_ids"] is None
    assert config["reverse_trainable_ids"] is None
    assert config["tie_weights"] is False
    assert config["reverse_dtype"] == "float64"
    assert config["logit_soft_cap"] == 2.0
    clone = pe.PartialReversibleEmbedding.from_config(config)
    clone.build()
    assert clone.get_config() == config
    assert clone.trainable_ids.tolist() == list(range(NUM_ROWS))
    assert clone.reverse_trainable_ids.tolist() == list(range(NUM_ROWS))


def test_set_weights_transposes_stock_untied_reverse_table(rng):
    stock = keras.layers.ReversibleEmbedding(NUM_ROWS, WIDTH, tie_weights=False)
    stock.build()
    layer = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, tie_weights=False)
    layer.build()
    layer.set_weights(stock.get_weights())
    assert_bits_equal(layer.reverse_embeddings.numpy(), stock.reverse_embeddings.numpy().T, "rev")
    own = [weight + 1 for weight in layer.get_weights()[:2]] + layer.get_weights()[2:]
    layer.set_weights(own)
    assert_bits_equal(layer.reverse_embeddings.numpy(), own[1], "own order")


def test_stock_untied_store_loads_transposed(rng):
    stock = keras.layers.ReversibleEmbedding(NUM_ROWS, WIDTH, tie_weights=False)
    stock.build()
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS, WIDTH, tie_weights=False, trainable_ids=PERMITTED
    )
    layer.build()
    # A stock layer's store, as its load_own_variables receives it.
    store = {}
    stock.save_own_variables(store)
    layer.load_own_variables(store)
    assert_bits_equal(layer.embeddings.numpy(), stock.embeddings.numpy(), "table")
    assert_bits_equal(
        layer.reverse_embeddings.numpy(), stock.reverse_embeddings.numpy().T, "reverse table"
    )
    assert layer.trainable_ids.tolist() == PERMITTED
    assert layer.reverse_trainable_ids.tolist() == PERMITTED


def test_errors():
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=r"id 13 .* not in \[0, 13\)"):
        pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, trainable_ids=[13])
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="at most one"):
        pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, trainable_ids=[1], frozen_ids=[2])
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="tie_weights=False"):
        pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, reverse_trainable_ids=[1])
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="reverse_trainable_ids: id -1"):
        pe.PartialReversibleEmbedding(
            NUM_ROWS, WIDTH, tie_weights=False, reverse_trainable_ids=[-1]
        )
    tied = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH)
    with pytest.raises(AttributeError, match="tie_weights=False"):
        tied.reverse_trainable_ids  # noqa: B018
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="last dimension"):
        tied(np.zeros([2, WIDTH + 1], np.float32), reverse=True)


@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
def test_fit_under_mixed_precision(rng, tie_weights):
    with global_dtype_policy("mixed_float16"):
        layer = pe.PartialReversibleEmbedding(
            NUM_ROWS, WIDTH, tie_weights=tie_weights, trainable_ids=PERMITTED
        )
        model = language_model(layer)
    compile_lm(model, pe.MaskedOptimizer(keras.optimizers.Adam(0.05)))
    assert model.output.dtype == "float16"
    before = layer.embeddings.numpy().copy()
    ids, targets = lm_batch(rng)
    model.fit(ids, targets, epochs=2, batch_size=8, verbose=0)
    after = layer.embeddings.numpy()
    assert layer.embeddings.dtype == "float32"
    # Untied, the input table trains only the permitted ids in the batch
    # (see test_fit_with_masked_adam_keeps_frozen_rows_bit_exact).
    trained = PERMITTED if tie_weights else np.intersect1d(PERMITTED, ids).tolist()
    assert np.flatnonzero((after != before).any(axis=1)).tolist() == trained


@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
def test_weights_argument_builds_the_layer(rng, tie_weights):
    pretrained = rng.standard_normal([NUM_ROWS, WIDTH]).astype(np.float32)
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS, WIDTH, tie_weights=tie_weights, weights=[pretrained, permitted_mask()]
    )
    assert layer.built
    assert_bits_equal(layer.embeddings.numpy(), pretrained, "table")
    assert layer.trainable_ids.tolist() == PERMITTED
    if not tie_weights:
        assert layer.reverse_trainable_ids.tolist() == PERMITTED


def test_freeze_applies_to_both_directions_of_a_tied_table(rng):
    layer = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, trainable_ids=PERMITTED)
    layer.build()
    layer.freeze([2, 7])
    hidden = tf.constant(rng.standard_normal([3, WIDTH]).astype(np.float32))
    with tf.GradientTape() as tape:
        logits = layer(hidden, reverse=True)
        rows = layer(tf.constant([[2, 11]]))
        loss = tf.reduce_sum(logits) + tf.reduce_sum(rows)
    grad = tape.gradient(loss, layer.embeddings.value)
    assert sorted(set(grad.indices.numpy().tolist())) == [11, 12]


def test_stateless_call_matches_call(rng):
    layer = pe.PartialReversibleEmbedding(NUM_ROWS, WIDTH, trainable_ids=PERMITTED)
    model = language_model(layer)
    ids, _ = lm_batch(rng, batch=4)
    trainable = [variable.value for variable in model.trainable_variables]
    non_trainable = [variable.value for variable in model.non_trainable_variables]
    with tf.GradientTape() as tape:
        tape.watch(trainable)
        logits, _ = model.stateless_call(trainable, non_trainable, ids)
        loss = tf.reduce_sum(logits)
    grad = tape.gradient(loss, trainable)[0]
    assert_bits_equal(logits.numpy(), model(ids).numpy(), "logits")
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices, NUM_ROWS).numpy()
    assert not dense[np.setdiff1d(np.arange(NUM_ROWS), PERMITTED)].any()
