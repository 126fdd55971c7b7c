"""PartialEmbedding.from_layer, PartialReversibleEmbedding.from_layer, PretrainedTable.layer."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe


def _stock(kind: type, rows: int = 6, width: int = 3, **kwargs: object) -> keras.layers.Layer:
    layer = kind(rows, width, name="words", **kwargs)
    layer.build()
    table = np.arange(rows * width, dtype=np.float64).reshape(rows, width) ** 1.5 / 7.0
    layer.embeddings.assign(table.astype("float32"))
    if getattr(layer, "tie_weights", True) is False:
        reverse = -np.arange(rows * width, dtype=np.float64).reshape(width, rows) / 3.0
        layer.reverse_embeddings.assign(reverse.astype("float32"))
    return layer


def _numpy(value: object) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value))


def test_embedding_copies_config_and_rows_and_appends_mean() -> None:
    stock = _stock(
        keras.layers.Embedding, mask_zero=True, embeddings_regularizer="l2", dtype="float32"
    )
    layer = pe.PartialEmbedding.from_layer(stock, extra_rows=2)
    assert type(layer) is pe.PartialEmbedding
    assert (layer.input_dim, layer.output_dim, layer.name) == (8, 3, "words")
    assert layer.mask_zero and layer.embeddings_regularizer is not None
    table = _numpy(layer.embeddings)
    old = _numpy(stock.embeddings)
    np.testing.assert_array_equal(table[:6], old)
    mean = old.astype(np.float64).mean(axis=0).astype(np.float32)
    np.testing.assert_array_equal(table[6:], np.stack([mean, mean]))
    assert layer.trainable_ids.tolist() == [6, 7]
    ids = np.array([[0, 5, 2]])
    np.testing.assert_array_equal(_numpy(layer(ids)), _numpy(stock(ids)))


def test_reversible_tied_logits_match_the_stock_layer() -> None:
    stock = _stock(keras.layers.ReversibleEmbedding, logit_soft_cap=30.0)
    layer = pe.PartialReversibleEmbedding.from_layer(stock, extra_rows=1, init="zeros")
    assert layer.tie_weights and layer.logit_soft_cap == 30.0
    hidden = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    logits = _numpy(layer(hidden, reverse=True))
    np.testing.assert_allclose(logits[:, :6], _numpy(stock(hidden, reverse=True)), atol=1e-5)
    np.testing.assert_array_equal(logits[:, 6], np.zeros(2))


def test_reversible_untied_grows_both_tables() -> None:
    stock = _stock(keras.layers.ReversibleEmbedding, tie_weights=False)
    layer = pe.PartialReversibleEmbedding.from_layer(stock, extra_rows=2, init="mean")
    assert not layer.tie_weights
    reverse = _numpy(layer.reverse_embeddings)
    stock_reverse = _numpy(stock.reverse_embeddings).T
    np.testing.assert_array_equal(reverse[:6], stock_reverse)
    expected = stock_reverse.astype(np.float64).mean(axis=0).astype(np.float32)
    np.testing.assert_array_equal(reverse[6:], np.stack([expected, expected]))
    assert layer.reverse_trainable_ids.tolist() == [6, 7]


def test_trainable_ids_without_growing_fill_or_keep() -> None:
    stock = _stock(keras.layers.Embedding)
    old = _numpy(stock.embeddings)
    kept = pe.PartialEmbedding.from_layer(stock, trainable_ids=[1, 4], init=None)
    np.testing.assert_array_equal(_numpy(kept.embeddings), old)
    assert kept.trainable_ids.tolist() == [1, 4]
    filled = pe.PartialEmbedding.from_layer(stock, trainable_ids=[1, 4], init="mean")
    expected = old.copy()
    expected[[1, 4]] = old[[0, 2, 3, 5]].astype(np.float64).mean(axis=0).astype(np.float32)
    np.testing.assert_array_equal(_numpy(filled.embeddings), expected)


def test_mean_cov_draws_are_seeded_and_array_and_initializer_inits() -> None:
    stock = _stock(keras.layers.Embedding, rows=40, width=3)
    first = pe.PartialEmbedding.from_layer(stock, extra_rows=5, init="mean_cov", seed=1)
    again = pe.PartialEmbedding.from_layer(stock, extra_rows=5, init="mean_cov", seed=1)
    np.testing.assert_array_equal(_numpy(first.embeddings), _numpy(again.embeddings))
    rows = np.full((2, 3), 0.5, dtype=np.float32)
    given = pe.PartialEmbedding.from_layer(stock, extra_rows=2, init=rows)
    np.testing.assert_array_equal(_numpy(given.embeddings)[40:], rows)
    ones = pe.PartialEmbedding.from_layer(stock, extra_rows=2, init="ones")
    np.testing.assert_array_equal(_numpy(ones.embeddings)[40:], np.ones((2, 3)))


def test_unbuilt_stock_layer_gives_unbuilt_layer_of_its_config() -> None:
    stock = keras.layers.ReversibleEmbedding(10, 4, tie_weights=False, name="t")
    layer = pe.PartialReversibleEmbedding.from_layer(stock, extra_rows=3)
    assert not layer.built and layer.input_dim == 13 and not layer.tie_weights
    assert layer.trainable_ids.tolist() == [10, 11, 12]


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (
            lambda s: pe.PartialEmbedding.from_layer(s, extra_rows=-1),
            pe.PartialEmbeddingArgumentError,
            "extra_rows must be >= 0; got extra_rows=-1",
        ),
        (
            lambda s: pe.PartialEmbedding.from_layer(s, extra_rows=1.5),
            pe.PartialEmbeddingTypeError,
            "extra_rows must be an integer",
        ),
        (
            lambda s: pe.PartialEmbedding.from_layer(s, extra_rows=1, init=None),
            pe.PartialEmbeddingArgumentError,
            "new rows need an init",
        ),
        (
            lambda s: pe.PartialEmbedding.from_layer(s, extra_rows=1, init="nonsense"),
            pe.PartialEmbeddingTypeError,
            "init: must be one of",
        ),
        (
            lambda s: pe.PartialEmbedding.from_layer(s, extra_rows=1, init=np.ones((2, 3))),
            pe.PartialEmbeddingArgumentError,
            r"must have shape \(1, 3\)",
        ),
        (lambda s: pe.PartialEmbedding.from_layer(s, trainable_ids=[9]), ValueError, "9"),
        (
            lambda s: pe.PartialReversibleEmbedding.from_layer(s),
            pe.PartialEmbeddingTypeError,
            "must be a keras.layers.ReversibleEmbedding",
        ),
        (
            lambda s: pe.PartialEmbedding.from_layer(keras.layers.Dense(2)),
            pe.PartialEmbeddingTypeError,
            "must be a keras.layers.Embedding",
        ),
        (
            lambda s: pe.PartialEmbedding.from_layer(keras.layers.ReversibleEmbedding(3, 2)),
            pe.PartialEmbeddingTypeError,
            "use PartialReversibleEmbedding.from_layer",
        ),
    ],
)
def test_bad_arguments(call: object, error: type, pattern: str) -> None:
    stock = _stock(keras.layers.Embedding)
    before = _numpy(stock.embeddings)
    with pytest.raises(error, match=pattern):
        call(stock)
    np.testing.assert_array_equal(_numpy(stock.embeddings), before)


def test_lora_stock_layer_is_refused() -> None:
    stock = _stock(keras.layers.Embedding)
    stock.enable_lora(2)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="LoRA or quantization"):
        pe.PartialEmbedding.from_layer(stock, extra_rows=1)


def test_pretrained_table_reversible_layer() -> None:
    result = pe.table_from_pretrained(
        ["a", "b", "zebra"], {"a": [1.0, 2.0], "b": [0.0, 1.0]}, new_rows="zeros"
    )
    layer = result.layer(reversible=True, name="words")
    assert type(layer) is pe.PartialReversibleEmbedding and layer.tie_weights
    assert layer.trainable_ids.tolist() == [2]
    logits = _numpy(layer(tf.constant([[1.0, 1.0]]), reverse=True))
    np.testing.assert_array_equal(logits, [[3.0, 1.0, 0.0]])
    assert type(result.layer()) is pe.PartialEmbedding
