"""PartialEmbedding in place of keras.layers.Embedding (issue #14, items 4-6).

Sparse and ragged ids give what the stock layer gives, with gradients that
name permitted rows only; a stock layer's weights (a one-array list, a
``.weights.h5`` of a stock model, a stock layer's store) load into the table
and leave the mask as constructed; ``embeddings.constraint`` is the user's
constraint while frozen rows stay as they are.
"""

from __future__ import annotations

import copy
import pickle

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import INDEX_DTYPES, assert_bits_equal

VOCAB = 7
WIDTH = 3
FROZEN = [0, 2, 5]


def _table(rng: np.random.Generator) -> np.ndarray:
    # Away from zero so no row can be mistaken for an untouched default.
    return rng.uniform(0.5, 1.5, size=(VOCAB, WIDTH)).astype(np.float32)


def _pair(table: np.ndarray, **kwargs) -> tuple[keras.layers.Embedding, pe.PartialEmbedding]:
    stock = keras.layers.Embedding(VOCAB, WIDTH, **kwargs)
    stock.build()
    stock.embeddings.assign(table)
    ours = pe.PartialEmbedding(VOCAB, WIDTH, frozen_ids=FROZEN, **kwargs)
    ours.build()
    ours.set_weights([table])
    return stock, ours


def _sparse_ids(index_dtype: tf.DType) -> tf.SparseTensor:
    # Unordered indices; positions left out hold row 0 in Keras' output.
    return tf.SparseTensor(
        indices=[[1, 3], [0, 0], [2, 1], [0, 2], [1, 0]],
        values=tf.constant([2, 4, 6, 1, 5], index_dtype),
        dense_shape=[3, 4],
    )


def _ragged_ids(index_dtype: tf.DType) -> tf.RaggedTensor:
    return tf.ragged.constant([[1, 2, 6], [], [5], [0, 4, 4, 3]], dtype=index_dtype)


# -- item 4: sparse and ragged ids ---------------------------------------------


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=lambda d: d.name)
def test_sparse_ids_give_the_stock_output(rng, index_dtype):
    stock, ours = _pair(_table(rng))
    ids = _sparse_ids(index_dtype)
    expected = stock(ids)
    actual = ours(ids)
    assert isinstance(actual, tf.Tensor) and not isinstance(actual, tf.SparseTensor)
    assert actual.shape == expected.shape == (3, 4, WIDTH)
    assert_bits_equal(actual, expected, "sparse ids")


def test_sparse_float_ids_are_cast_as_the_stock_layer_casts(rng):
    stock, ours = _pair(_table(rng))
    ids = tf.SparseTensor([[0, 1], [1, 0]], tf.constant([3.0, 6.0]), [2, 2])
    assert_bits_equal(ours(ids), stock(ids), "sparse float ids")


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=lambda d: d.name)
def test_ragged_ids_give_the_stock_output(rng, index_dtype):
    stock, ours = _pair(_table(rng))
    ids = _ragged_ids(index_dtype)
    expected = stock(ids)
    actual = ours(ids)
    assert isinstance(actual, tf.RaggedTensor)
    assert_bits_equal(actual.row_splits, expected.row_splits, "row splits")
    assert_bits_equal(actual.flat_values, expected.flat_values, "ragged values")


def test_ragged_ids_of_two_ragged_dimensions(rng):
    stock, ours = _pair(_table(rng))
    ids = tf.ragged.constant([[[1, 2], [6]], [], [[5, 0, 3]]])
    expected = stock(ids)
    actual = ours(ids)
    assert actual.ragged_rank == expected.ragged_rank == 2
    assert actual.to_list() == expected.to_list()


def test_symbolic_sparse_and_ragged_inputs_match_the_stock_specs():
    for flag in ("sparse", "ragged"):
        stock_out = keras.layers.Embedding(VOCAB, WIDTH)(
            keras.Input((4,), dtype="int32", **{flag: True})
        )
        our_out = pe.PartialEmbedding(VOCAB, WIDTH)(
            keras.Input((4,), dtype="int32", **{flag: True})
        )
        assert our_out.shape == stock_out.shape
        assert our_out.ragged == stock_out.ragged
        assert our_out.sparse == stock_out.sparse


def test_negative_sparse_and_ragged_ids_raise_as_dense_ones_do():
    # Keras counts negative ids from the end; this layer refuses them, dense
    # or not, so a bad id never reads (or trains) the wrong row.
    layer = pe.PartialEmbedding(VOCAB, WIDTH)
    for ids in (
        tf.constant([[-1]]),
        tf.SparseTensor([[0, 1]], tf.constant([-1]), [1, 2]),
        tf.ragged.constant([[2], [-1]]),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError, match="negative id"):
            layer(ids)


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
def test_gradient_names_only_permitted_rows(rng, kind):
    _, ours = _pair(_table(rng))
    ids = _sparse_ids(tf.int32) if kind == "sparse" else _ragged_ids(tf.int32)
    with tf.GradientTape() as tape:
        outputs = ours(ids)
        values = outputs.flat_values if kind == "ragged" else outputs
        loss = tf.reduce_sum(values * values)
    (gradient,) = tape.gradient(loss, [ours.embeddings])
    assert isinstance(gradient, tf.IndexedSlices)
    named = set(np.asarray(gradient.indices).tolist())
    assert named and not named & set(FROZEN)


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
def test_masked_adam_step_keeps_frozen_rows(rng, kind):
    table = _table(rng)
    _, ours = _pair(table)
    ids = _sparse_ids(tf.int64) if kind == "sparse" else _ragged_ids(tf.int64)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1))
    for _ in range(2):
        with tf.GradientTape() as tape:
            outputs = ours(ids)
            values = outputs.flat_values if kind == "ragged" else outputs
            loss = tf.reduce_sum(values * values)
        optimizer.apply_gradients(zip(tape.gradient(loss, [ours.embeddings]), [ours.embeddings]))
    after = ours.embeddings.numpy()
    assert_bits_equal(after[FROZEN], table[FROZEN], "frozen rows")
    # Every trainable row these ids touch moved.
    touched = {1, 3, 4, 6} if kind == "ragged" else {1, 4, 6}
    for row in touched:
        assert not np.array_equal(after[row], table[row]), row


def test_fit_with_ragged_ids_keeps_frozen_rows(rng):
    table = _table(rng)
    layer = pe.PartialEmbedding(VOCAB, WIDTH, frozen_ids=FROZEN, weights=[table])
    inputs = keras.Input((None,), dtype="int32", ragged=True)
    pooled = keras.layers.Lambda(lambda x: tf.reduce_sum(x, axis=1))(layer(inputs))
    model = keras.Model(inputs, pooled)
    model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    ids = _ragged_ids(tf.int32)
    model.fit(ids, np.zeros([4, WIDTH], np.float32), batch_size=4, epochs=2, verbose=0)
    after = layer.embeddings.numpy()
    assert_bits_equal(after[FROZEN], table[FROZEN], "frozen rows")
    assert not np.array_equal(after[[1, 3, 4, 6]], table[[1, 3, 4, 6]])


# -- item 5: a stock Embedding's weights ---------------------------------------


def test_set_weights_with_the_stock_one_array_list(rng):
    stock, _ = _pair(_table(rng))
    ours = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=[3, 4])
    ours.build()
    ours.set_weights(stock.get_weights())
    assert_bits_equal(ours.embeddings.numpy(), stock.embeddings.numpy(), "table")
    assert ours.trainable_ids.tolist() == [3, 4]


def test_set_weights_with_two_arrays_still_sets_the_mask(rng):
    table = _table(rng)
    ours = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=[3, 4])
    ours.build()
    mask = np.zeros([VOCAB], bool)
    mask[[0, 6]] = True
    ours.set_weights([table, mask])
    assert_bits_equal(ours.embeddings.numpy(), table, "table")
    assert ours.trainable_ids.tolist() == [0, 6]


def test_set_weights_with_a_table_of_the_wrong_shape_raises(rng):
    ours = pe.PartialEmbedding(VOCAB, WIDTH)
    ours.build()
    with pytest.raises(ValueError, match="not compatible"):
        ours.set_weights([np.zeros([VOCAB, WIDTH + 1], np.float32)])


def test_load_own_variables_with_a_stock_store(rng):
    stock, _ = _pair(_table(rng))
    store: dict = {}
    stock.save_own_variables(store)
    assert len(store) == 1
    ours = pe.PartialEmbedding(VOCAB, WIDTH, frozen_ids=[1, 6])
    ours.build()
    ours.load_own_variables(store)
    assert_bits_equal(ours.embeddings.numpy(), stock.embeddings.numpy(), "table")
    assert ours.frozen_ids.tolist() == [1, 6]


def _sequential(embedding: keras.layers.Layer) -> keras.Model:
    return keras.Sequential(
        [keras.Input((4,), dtype="int32"), embedding, keras.layers.Flatten(), keras.layers.Dense(2)]
    )


def _functional(embedding: keras.layers.Layer) -> keras.Model:
    inputs = keras.Input((4,), dtype="int32")
    outputs = keras.layers.Dense(2)(keras.layers.Flatten()(embedding(inputs)))
    return keras.Model(inputs, outputs)


class _Subclassed(keras.Model):
    def __init__(self, embedding: keras.layers.Layer) -> None:
        super().__init__()
        self.embedding = embedding
        self.head = keras.layers.Dense(2)

    def call(self, inputs):
        return self.head(keras.ops.reshape(self.embedding(inputs), (-1, 4 * WIDTH)))


@pytest.mark.parametrize("build_model", [_sequential, _functional, _Subclassed])
def test_load_weights_of_a_stock_model(tmp_path, build_model):
    stock_model = build_model(keras.layers.Embedding(VOCAB, WIDTH))
    stock_model(np.zeros([1, 4], np.int32))
    path = str(tmp_path / "stock.weights.h5")
    stock_model.save_weights(path)

    ours = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=[2, 3])
    our_model = build_model(ours)
    our_model(np.zeros([1, 4], np.int32))
    our_model.load_weights(path)
    stock_vars = stock_model.weights
    our_vars = [v for v in our_model.weights if v is not ours.trainable_mask]
    assert len(stock_vars) == len(our_vars)
    for stock_var, our_var in zip(stock_vars, our_vars):
        assert_bits_equal(our_var.numpy(), stock_var.numpy(), stock_var.path)
    assert ours.trainable_ids.tolist() == [2, 3]


def test_our_saved_weights_still_round_trip(tmp_path, rng):
    table = _table(rng)
    model = _sequential(pe.PartialEmbedding(VOCAB, WIDTH, frozen_ids=FROZEN, weights=[table]))
    path = str(tmp_path / "ours.weights.h5")
    model.save_weights(path)
    fresh = pe.PartialEmbedding(VOCAB, WIDTH)
    _sequential(fresh).load_weights(path)
    assert_bits_equal(fresh.embeddings.numpy(), table, "table")
    assert fresh.frozen_ids.tolist() == FROZEN


def test_two_stock_embeddings_are_not_guessed_between(tmp_path):
    def build(first, second):
        inputs = keras.Input((4,), dtype="int32")
        merged = keras.layers.Add()([first(inputs), second(inputs)])
        return keras.Model(inputs, merged)

    stock_model = build(keras.layers.Embedding(VOCAB, WIDTH), keras.layers.Embedding(VOCAB, WIDTH))
    path = str(tmp_path / "two.weights.h5")
    stock_model.save_weights(path)
    our_model = build(pe.PartialEmbedding(VOCAB, WIDTH), pe.PartialEmbedding(VOCAB, WIDTH))
    with pytest.raises(ValueError, match="expected 2 variables"):
        our_model.load_weights(path)


# -- item 6 (layer half): embeddings.constraint --------------------------------


def test_embeddings_constraint_is_the_users():
    constraint = keras.constraints.MaxNorm(2.0, axis=1)
    layer = pe.PartialEmbedding(VOCAB, WIDTH, embeddings_constraint=constraint)
    layer.build()
    reported = layer.embeddings.constraint
    assert reported == constraint
    assert isinstance(reported, keras.constraints.MaxNorm)
    assert reported.max_value == 2.0
    assert reported.get_config() == constraint.get_config()
    assert keras.constraints.serialize(reported) == keras.constraints.serialize(constraint)
    assert layer.embeddings_constraint is constraint

    # Copies and pickles keep both faces: the user's constraint, our masking.
    for duplicate in (copy.copy(reported), pickle.loads(pickle.dumps(reported))):
        assert isinstance(duplicate, keras.constraints.MaxNorm)
        assert duplicate.get_config() == constraint.get_config()
    assert copy.copy(reported) == constraint
    assert copy.deepcopy(reported).get_config() == constraint.get_config()

    plain = pe.PartialEmbedding(VOCAB, WIDTH)
    plain.build()
    assert plain.embeddings.constraint is None


@pytest.mark.parametrize("masked", [False, True], ids=["sgd", "masked_adam"])
def test_constraint_spares_frozen_rows_and_applies_to_trainable_ones(rng, masked):
    # Rows of norm ~5: every row breaks MaxNorm(2), frozen ones included.
    table = (rng.uniform(2.5, 3.5, size=(VOCAB, WIDTH))).astype(np.float32)
    constraint = keras.constraints.MaxNorm(2.0, axis=1)
    layer = pe.PartialEmbedding(
        VOCAB, WIDTH, frozen_ids=FROZEN, embeddings_constraint=constraint, weights=[table]
    )
    optimizer = (
        pe.MaskedOptimizer(keras.optimizers.Adam(0.01)) if masked else keras.optimizers.SGD(0.01)
    )
    ids = tf.constant([[0, 1, 2, 3, 4, 5, 6]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids))
    optimizer.apply_gradients(zip(tape.gradient(loss, [layer.embeddings]), [layer.embeddings]))
    after = layer.embeddings.numpy()
    assert_bits_equal(after[FROZEN], table[FROZEN], "frozen rows")
    trainable = [row for row in range(VOCAB) if row not in FROZEN]
    norms = np.linalg.norm(after[trainable], axis=1)
    np.testing.assert_allclose(norms, 2.0, rtol=1e-5)
