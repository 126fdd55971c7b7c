"""partial_embedding.keras_hub: token strings, ids, each init, padding and bad input."""

from __future__ import annotations

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras  # noqa: E402
from keras_hub_models import tiny_bert, tiny_gpt2  # noqa: E402

import partial_embedding as pe  # noqa: E402
import partial_embedding.keras_hub as pek  # noqa: E402

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "token", "##izer", "##s", "a"]


def _numpy(value: object) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value))


def _bert_classifier(vocabulary: list[str]) -> object:
    backbone = tiny_bert(len(vocabulary), 7)
    tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocabulary, lowercase=True)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor)


def _gpt2_lm() -> object:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["<|endoftext|>", "Ġ", *letters, "th", "the", "Ġthe"]
    vocabulary = {token: index for index, token in enumerate(tokens)}
    merges = ["t h", "th e", "Ġ the"]
    backbone = tiny_gpt2(len(vocabulary), 8, max_sequence_length=32)
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=8)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=preprocessor)


@pytest.fixture(scope="module")
def bert() -> object:
    vocabulary = WORDS + [f"w{i}" for i in range(54)]
    return _bert_classifier(vocabulary)


@pytest.fixture(scope="module")
def gpt2() -> object:
    return _gpt2_lm()


def _table(model: object) -> np.ndarray:
    backbone = getattr(model, "backbone", model)
    return _numpy(backbone.token_embedding.embeddings).astype(np.float64)


def test_word_piece_strings_join_the_vocabulary(bert: object) -> None:
    size = bert.backbone.token_embedding.input_dim
    added = pek.add_tokens(bert, ["tokenizer", "keras"], init="subword_mean")
    assert added.tokens == ["tokenizer", "keras"]
    assert added.new_ids.tolist() == [size, size + 1]
    tokenizer = added.model.preprocessor.tokenizer
    assert tokenizer.vocabulary_size() == size + 2
    assert _numpy(tokenizer("the tokenizer keras")).tolist() == [5, size, size + 1]
    # The original model and its tokenizer are untouched.
    assert bert.preprocessor.tokenizer.vocabulary_size() == size
    assert _numpy(bert.preprocessor.tokenizer("tokenizer")).tolist() == [6, 7]
    # subword_mean: "tokenizer" was "token" + "##izer"; "keras" was [UNK].
    old, new = _table(bert), _table(added.model)
    np.testing.assert_array_equal(new[:size], old)
    np.testing.assert_allclose(new[size], old[[6, 7]].mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(new[size + 1], old[1], rtol=1e-6)


def test_byte_pair_strings_are_unsplittable(gpt2: object) -> None:
    size = gpt2.backbone.token_embedding.input_dim
    added = pek.add_tokens(gpt2, ["<|domain|>"])
    tokenizer = added.model.preprocessor.tokenizer
    ids = _numpy(tokenizer("the<|domain|>the")).tolist()
    assert ids == [29, size, 29]
    assert "<|domain|>" in tokenizer.unsplittable_tokens
    assert _numpy(gpt2.preprocessor.tokenizer("the")).tolist() == [29]


def test_byte_pair_subword_mean(gpt2: object) -> None:
    size = gpt2.backbone.token_embedding.input_dim
    added = pek.add_tokens(gpt2, ["thea"], init="subword_mean")
    old = _table(gpt2)
    # The old tokenizer splits "thea" into "the" (29) and "a" (2).
    assert _numpy(gpt2.preprocessor.tokenizer("thea")).tolist() == [29, 2]
    np.testing.assert_allclose(_table(added.model)[size], old[[29, 2]].mean(axis=0), rtol=1e-6)


def test_a_token_already_in_the_vocabulary_is_refused(bert: object, gpt2: object) -> None:
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="'token' is already in the vocab"):
        pek.add_tokens(bert, ["new", "token"])
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="'the' is already"):
        pek.add_tokens(gpt2, ["the"])
    assert bert.preprocessor.tokenizer.vocabulary_size() == 64
    assert isinstance(bert.backbone.token_embedding, keras.layers.ReversibleEmbedding)


@pytest.mark.parametrize(
    ("new_tokens", "error", "pattern"),
    [
        (0, pe.PartialEmbeddingArgumentError, "a count must be > 0; got new_tokens=0"),
        (-2, pe.PartialEmbeddingArgumentError, "a count must be > 0; got new_tokens=-2"),
        ([], pe.PartialEmbeddingArgumentError, "the list is empty"),
        ([3, 64], pe.PartialEmbeddingArgumentError, r"id 64 is not in \[0, 64\)"),
        ([-1], pe.PartialEmbeddingArgumentError, r"id -1 is not in \[0, 64\)"),
        ([3, 3], pe.PartialEmbeddingArgumentError, "repeated ids"),
        (["x", "x"], pe.PartialEmbeddingArgumentError, "repeated strings"),
        ([1, "x"], pe.PartialEmbeddingTypeError, "only strings or only integer ids"),
        ("word", pe.PartialEmbeddingTypeError, "must be a count"),
        (True, pe.PartialEmbeddingTypeError, "must be a count"),
    ],
)
def test_bad_new_tokens(bert: object, new_tokens: object, error: type, pattern: str) -> None:
    before = _table(bert)
    with pytest.raises(error, match=pattern):
        pek.add_tokens(bert, new_tokens)
    np.testing.assert_array_equal(_table(bert), before)
    assert isinstance(bert.backbone.token_embedding, keras.layers.ReversibleEmbedding)


def test_bad_models_and_options(bert: object) -> None:
    with pytest.raises(pe.PartialEmbeddingTypeError, match="model: must be a keras_hub"):
        pek.add_tokens(keras.Sequential([keras.layers.Embedding(4, 2)]), 1)
    inputs = keras.Input((2,))
    no_table = keras_hub.models.Backbone(inputs=inputs, outputs=keras.layers.Dense(2)(inputs))
    with pytest.raises(pe.PartialEmbeddingTypeError, match="has no token_embedding"):
        pek.add_tokens(no_table, 1)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="strings need a tokenizer"):
        pek.add_tokens(bert.backbone, ["newword"])
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="subword_mean' needs new_tokens"):
        pek.add_tokens(bert, 2, init="subword_mean")
    with pytest.raises(pe.PartialEmbeddingTypeError, match="init: must be one of"):
        pek.add_tokens(bert, 2, init="median")
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="pad_to_multiple_of: must be"):
        pek.add_tokens(bert, 2, pad_to_multiple_of=0)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="not to existing ids"):
        pek.add_tokens(bert, [3], pad_to_multiple_of=8)
    added = pek.add_tokens(bert.backbone, 1)
    with pytest.raises(pe.PartialEmbeddingTypeError, match="already a PartialReversibleEmbedding"):
        pek.add_tokens(added.model, 1)


def test_existing_ids_train_without_growing(bert: object) -> None:
    old = _table(bert)
    added = pek.add_tokens(bert.backbone, [60, 61, 62], init=None)
    table = added.model.token_embedding
    assert table.input_dim == 64 and added.new_ids.tolist() == [60, 61, 62]
    assert table.trainable_ids.tolist() == [60, 61, 62]
    np.testing.assert_array_equal(_table(added.model), old)
    mean = pek.add_tokens(bert.backbone, [60, 61, 62], init="mean").model
    others = np.delete(old, [60, 61, 62], axis=0)
    expected = np.array(old, dtype=np.float32)
    expected[60:63] = others.mean(axis=0).astype(np.float32)
    np.testing.assert_array_equal(_table(mean), expected)
    assert mean.get_config()["vocabulary_size"] == 64


def test_padding_rows_are_frozen(bert: object) -> None:
    added = pek.add_tokens(bert.backbone, 3, pad_to_multiple_of=16)
    table = added.model.token_embedding
    assert table.input_dim == 80
    assert added.new_ids.tolist() == [64, 65, 66]
    assert table.trainable_ids.tolist() == [64, 65, 66]
    old = _table(bert)
    mean = old.mean(axis=0).astype(np.float32)
    np.testing.assert_array_equal(_table(added.model)[64:], np.tile(mean, (16, 1)))


def test_zeros_and_keras_initializers(bert: object) -> None:
    zeros = pek.add_tokens(bert.backbone, 2, init="zeros").model
    np.testing.assert_array_equal(_table(zeros)[64:], np.zeros((2, 16)))
    constant = pek.add_tokens(bert.backbone, 2, init=keras.initializers.Constant(0.25)).model
    np.testing.assert_array_equal(_table(constant)[64:], np.full((2, 16), 0.25))
    ones = pek.add_tokens(bert.backbone, 2, init="ones")
    np.testing.assert_array_equal(_table(ones.model)[64:], np.ones((2, 16)))
    assert ones.init == "ones"


def test_mean_cov_matches_the_old_rows_statistics() -> None:
    """Draws from N(mean, cov) of the old rows: their sample moments agree.

    With n draws in d dimensions the sample mean's error along any unit
    direction u has variance u^T C u / n <= lambda_max / n; the Mahalanobis
    form n (m - mu)^T C^-1 (m - mu) is chi-squared with d degrees of freedom
    (mean d, sd sqrt(2d)), so with d = 8 it stays below d + 8 sqrt(2d) = 53
    but with probability ~1e-9. The sample covariance's relative Frobenius
    error has sd about sqrt((d + 1) / n) ~ 0.03 for n = 8192: 0.15 is five sd.
    """
    width, count = 8, 8192
    backbone = tiny_gpt2(200, 9, hidden_dim=width, intermediate_dim=16, max_sequence_length=8)
    rng = np.random.default_rng(0)
    mixing = rng.standard_normal((width, width))
    old = rng.standard_normal((200, width)) @ mixing + rng.standard_normal(width)
    backbone.token_embedding.embeddings.assign(old.astype(np.float32))
    added = pek.add_tokens(backbone, count, init="mean_cov", seed=3)
    table = _table(added.model)
    old = table[:200]
    mu = old.mean(axis=0)
    cov = (old - mu).T @ (old - mu) / 200
    draws = table[200:]
    m = draws.mean(axis=0)
    mahalanobis = count * (m - mu) @ np.linalg.solve(cov, m - mu)
    assert mahalanobis < width + 8 * np.sqrt(2 * width), mahalanobis
    sample_cov = np.cov(draws, rowvar=False, bias=True)
    assert np.linalg.norm(sample_cov - cov) / np.linalg.norm(cov) < 0.15
    again = pek.add_tokens(backbone, count, init="mean_cov", seed=3).model
    np.testing.assert_array_equal(_table(again), table)


def test_an_array_of_rows_as_init(bert: object) -> None:
    rows = np.full((2, 16), 0.75, dtype=np.float32)
    added = pek.add_tokens(bert.backbone, 2, init=rows)
    np.testing.assert_array_equal(_table(added.model)[64:], rows)


def test_enable_lora_naming_the_partial_table_is_refused(bert: object) -> None:
    """keras-hub's ``Backbone.enable_lora`` calls ``enable_lora`` on each named
    layer that has one: naming the partial table gets its clear refusal (not
    a silent skip), and LoRA on the attention layers alone still works."""
    model = pek.add_tokens(bert, ["lora"]).model
    backbone = model.backbone
    table = backbone.token_embedding
    trainable = table.trainable_ids.copy()
    with pytest.raises(ValueError, match=r"does not support LoRA \(rank=4"):
        backbone.enable_lora(4, target_layer_names=[table.name])
    assert _numpy(table.trainable_ids).tolist() == trainable.tolist()
    assert not any("lora" in weight.path for weight in table.weights)
    backbone.enable_lora(4)  # the default targets: query and value projections
    lora_weights = [weight.path for weight in backbone.trainable_weights if "lora" in weight.path]
    assert lora_weights and not any(table.name in path for path in lora_weights)
