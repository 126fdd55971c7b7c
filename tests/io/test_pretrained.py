"""Tests of ``pe.table_from_pretrained``: the mapping, reserved rows, the new-row
strategies, the vector sources, errors and ``PretrainedTable.layer()``."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest

import partial_embedding as pe
from pe_testing import VALUE_DTYPE_NAMES, assert_bits_equal

WORDS = ["the", "cat", "sat", "on", "mat", "Dog"]


@pytest.fixture
def pretrained(rng):
    """Six words and their float32 vectors of width 4."""
    return list(WORDS), rng.standard_normal((len(WORDS), 4)).astype(np.float32)


class FakeKeyedVectors:
    """What the helper uses of gensim's KeyedVectors: key_to_index and vectors."""

    def __init__(self, words, vectors):
        self.key_to_index = {word: row for row, word in enumerate(words)}
        self.vectors = vectors


def _expect_pretrained_rows(result, vocabulary, words, vectors):
    """Every row whose token has a vector holds exactly its bits."""
    for row, token in enumerate(vocabulary):
        if row in set(result.pretrained_ids.tolist()):
            assert_bits_equal(result.table[row], vectors[words.index(token)], f"row {row}")


def test_mapping_copies_bits_and_trains_missing_rows(pretrained):
    words, vectors = pretrained
    vocabulary = ["", "mat", "zebra", "the", "mat", "quokka", "cat"]
    result = pe.table_from_pretrained(vocabulary, FakeKeyedVectors(words, vectors))

    assert result.table.shape == (7, 4) and result.table.dtype == np.float32
    assert result.pretrained_ids.tolist() == [1, 3, 4, 6]
    assert result.trainable_ids.tolist() == [0, 2, 5]
    assert result.trainable_ids.dtype == np.int64 and result.pretrained_ids.dtype == np.int64
    _expect_pretrained_rows(result, vocabulary, words, vectors)
    assert_bits_equal(result.table[4], vectors[4], "a duplicate token gets the vector too")

    coverage = result.coverage
    assert (coverage.num_tokens, coverage.num_pretrained, coverage.num_new) == (7, 4, 3)
    assert coverage.fraction_pretrained == pytest.approx(4 / 7)
    assert coverage.missing_examples == ("zebra", "quokka")
    assert coverage.reserved == ("",)
    assert coverage.num_missing == 2
    text = str(coverage)
    assert "7 rows" in text and "4 (57.1 %)" in text and "'zebra'" in text and "reserved" in text


def test_missing_examples_stop_at_ten(pretrained):
    words, vectors = pretrained
    vocabulary = ["the"] + [f"new{i}" for i in range(25)]
    coverage = pe.table_from_pretrained(vocabulary, (words, vectors)).coverage
    assert coverage.missing_examples == tuple(f"new{i}" for i in range(10))
    assert coverage.num_new == 25 and coverage.reserved == ()


def test_lowercase_fallback(pretrained):
    words, vectors = pretrained
    vocabulary = ["The", "CAT", "Dog", "dog"]
    plain = pe.table_from_pretrained(vocabulary, (words, vectors))
    assert plain.pretrained_ids.tolist() == [2]
    folded = pe.table_from_pretrained(vocabulary, (words, vectors), lowercase=True)
    assert folded.pretrained_ids.tolist() == [0, 1, 2]  # "dog" is not lowered to itself
    assert_bits_equal(folded.table[0], vectors[0], "The -> the")
    assert_bits_equal(folded.table[1], vectors[1], "CAT -> cat")
    assert_bits_equal(folded.table[2], vectors[5], "Dog as it is")


def test_rows_are_copied_in_blocks(pretrained, monkeypatch):
    from partial_embedding import pretrained as module

    words, vectors = pretrained
    vocabulary = [words[i % 7] if i % 7 < 6 else f"x{i}" for i in range(40)]
    expected = pe.table_from_pretrained(vocabulary, (words, vectors), new_rows="zeros")
    monkeypatch.setattr(module, "_BLOCK_BYTES", 3 * 4 * 4)  # three rows per block
    blocked = pe.table_from_pretrained(vocabulary, (words, vectors), new_rows="zeros")
    assert_bits_equal(blocked.table, expected.table, "table built in blocks of 3 rows")
    np.testing.assert_array_equal(blocked.trainable_ids, np.arange(6, 40, 7))


def test_memory_mapped_vectors(pretrained, tmp_path):
    words, vectors = pretrained
    np.save(tmp_path / "vectors.npy", vectors)
    mapped = np.load(tmp_path / "vectors.npy", mmap_mode="r")
    result = pe.table_from_pretrained(["cat", "mat", "new"], FakeKeyedVectors(words, mapped))
    assert_bits_equal(result.table[:2], vectors[[1, 4]], "rows gathered from a memory map")


def test_string_lookup_reserved_rows(pretrained):
    words, vectors = pretrained
    lookup = keras.layers.StringLookup(vocabulary=["cat", "zebra", "the"], mask_token="")
    assert lookup.get_vocabulary() == ["", "[UNK]", "cat", "zebra", "the"]
    result = pe.table_from_pretrained(lookup, (words, vectors))
    assert result.trainable_ids.tolist() == [0, 1, 3]
    assert result.pretrained_ids.tolist() == [2, 4]
    assert result.coverage.reserved == ("", "[UNK]")
    assert result.coverage.missing_examples == ("zebra",)
    _expect_pretrained_rows(result, lookup.get_vocabulary(), words, vectors)

    two_oov = keras.layers.StringLookup(vocabulary=["cat"], num_oov_indices=2)
    result = pe.table_from_pretrained(two_oov, (words, vectors))
    assert result.coverage.reserved == ("[UNK]", "[UNK]")
    assert result.trainable_ids.tolist() == [0, 1]


def test_reserved_rows_are_never_looked_up(rng):
    # Even where the vectors hold "[UNK]", the layer's OOV row stays new.
    vectors = {"[UNK]": np.ones(3, np.float32), "cat": np.full(3, 2.0, np.float32)}
    lookup = keras.layers.StringLookup(vocabulary=["cat"])
    result = pe.table_from_pretrained(lookup, vectors, new_rows="zeros")
    assert result.trainable_ids.tolist() == [0]
    np.testing.assert_array_equal(result.table, [[0, 0, 0], [2, 2, 2]])


def test_text_vectorization_vocabulary(pretrained):
    words, vectors = pretrained
    layer = keras.layers.TextVectorization()
    layer.adapt(["the cat sat", "the zebra sat"])
    vocabulary = layer.get_vocabulary()
    assert vocabulary[:2] == ["", "[UNK]"]
    result = pe.table_from_pretrained(layer, FakeKeyedVectors(words, vectors))
    assert result.coverage.reserved == ("", "[UNK]")
    assert result.trainable_ids.tolist() == [0, 1, vocabulary.index("zebra")]
    _expect_pretrained_rows(result, vocabulary, words, vectors)


def test_new_rows_mean_is_the_float64_mean_cast(pretrained):
    words, vectors = pretrained
    vocabulary = ["the", "cat", "sat", "new", "", "mat"]
    result = pe.table_from_pretrained(vocabulary, (words, vectors), new_rows="mean")
    expected = vectors[[0, 1, 2, 4]].astype(np.float64).mean(axis=0).astype(np.float32)
    for row in (3, 4):
        assert_bits_equal(result.table[row], expected, f"new row {row}")
    half = pe.table_from_pretrained(vocabulary, (words, vectors), dtype="float16")
    assert half.table.dtype == np.float16
    np.testing.assert_array_equal(half.table[[0, 1]], vectors[[0, 1]].astype(np.float16))


@pytest.mark.parametrize("strategy", ["mean", "normal", "zeros", "glorot_uniform"])
@pytest.mark.parametrize("dtype", VALUE_DTYPE_NAMES)
def test_every_float_dtype(pretrained, dtype, strategy):
    words, vectors = pretrained
    vocabulary = ["", "cat", "new", "mat"]
    result = pe.table_from_pretrained(vocabulary, (words, vectors), new_rows=strategy, dtype=dtype)
    assert result.table.dtype.name == dtype and result.table.shape == (4, 4)
    expected = vectors[[1, 4]].astype(result.table.dtype)
    assert_bits_equal(result.table[[1, 3]], expected, f"pretrained rows cast to {dtype}")
    assert np.all(np.isfinite(result.table.astype(np.float64)))
    assert result.layer().embeddings.dtype == dtype


def test_array_and_bytes_vocabularies(pretrained):
    words, vectors = pretrained
    as_list = pe.table_from_pretrained(["cat", "x", "mat"], (words, vectors))
    as_array = pe.table_from_pretrained(np.array(["cat", "x", "mat"]), (words, vectors))
    as_bytes = pe.table_from_pretrained([b"cat", b"x", b"mat"], (words, vectors))
    for other in (as_array, as_bytes):
        assert_bits_equal(other.table, as_list.table, "same table")
        assert other.coverage == as_list.coverage


def test_new_rows_normal_matches_mean_and_covariance(rng):
    width = 3
    mixing = np.array([[1.0, 0.0, 0.0], [0.5, 2.0, 0.0], [-1.0, 0.3, 0.5]])
    base = (rng.standard_normal((500, width)) @ mixing.T + [1.0, -2.0, 0.5]).astype(np.float32)
    words = [f"w{i}" for i in range(500)]
    vocabulary = words + [f"new{i}" for i in range(20000)]
    result = pe.table_from_pretrained(vocabulary, (words, base), new_rows="normal", seed=7)
    new = result.table[500:].astype(np.float64)
    reference = base.astype(np.float64)
    # Whitened by the pretrained rows' own moments, the new rows are a standard
    # normal sample: w = L^-1 (x - mean) = Q z with Q orthogonal, so |mean(w)| and
    # the eigenvalues of cov(w) are those of the seed-7 draw z, whatever `rng`
    # drew for `base`. For N = 20000 draws in 3 dimensions their spread is
    # sqrt(3 / N) = 0.012 and about 2 sqrt(3 / N) = 0.025; 0.06 is > 4 of those.
    cholesky = np.linalg.cholesky(np.cov(reference.T))
    whitened = np.linalg.solve(cholesky, (new - reference.mean(axis=0)).T).T
    assert np.linalg.norm(whitened.mean(axis=0)) < 0.06
    deviation = np.linalg.eigvalsh(np.cov(whitened.T)) - 1.0
    assert np.abs(deviation).max() < 0.06, deviation
    assert len(np.unique(new, axis=0)) == 20000  # a sample, not one vector

    again = pe.table_from_pretrained(vocabulary, (words, base), new_rows="normal", seed=7)
    assert_bits_equal(again.table, result.table, "same seed, same table")
    other = pe.table_from_pretrained(vocabulary, (words, base), new_rows="normal", seed=8)
    assert not np.array_equal(other.table[500:], result.table[500:])
    assert_bits_equal(other.table[:500], base, "pretrained rows whatever the seed")


@pytest.mark.parametrize("seed", [-1, 2.5, "7", True])
@pytest.mark.parametrize("new_rows", ["normal", "mean", "glorot_uniform"])
def test_a_seed_that_is_not_an_integer_at_least_zero_is_refused_naming_it(seed, new_rows):
    with pytest.raises(
        pe.PartialEmbeddingArgumentError,
        match=rf"seed: expected None or an integer >= 0\. Received: seed={re.escape(repr(seed))}",
    ):
        pe.table_from_pretrained(["a", "b", "c"], {"a": [1.0, 2.0]}, new_rows=new_rows, seed=seed)


def test_new_rows_zeros(pretrained):
    words, vectors = pretrained
    result = pe.table_from_pretrained(["x", "cat", "y"], (words, vectors), new_rows="zeros")
    assert_bits_equal(result.table[[0, 2]], np.zeros((2, 4), np.float32), "zeros")


def test_new_rows_keras_initializer_by_name_and_instance(pretrained):
    words, vectors = pretrained
    vocabulary = ["cat", "x", "y", "the", "z"]
    ones = pe.table_from_pretrained(vocabulary, (words, vectors), new_rows="ones")
    np.testing.assert_array_equal(ones.table[[1, 2, 4]], np.ones((3, 4)))

    by_name = pe.table_from_pretrained(
        vocabulary, (words, vectors), new_rows="glorot_uniform", seed=3
    )
    again = pe.table_from_pretrained(
        vocabulary, (words, vectors), new_rows="glorot_uniform", seed=3
    )
    assert_bits_equal(by_name.table, again.table, "a seeded initializer by name")
    expected = keras.initializers.GlorotUniform(seed=3)((3, 4), dtype="float32")
    assert_bits_equal(by_name.table[[1, 2, 4]], keras.ops.convert_to_numpy(expected), "seed")

    instance = keras.initializers.Constant(0.25)
    constant = pe.table_from_pretrained(vocabulary, (words, vectors), new_rows=instance)
    np.testing.assert_array_equal(constant.table[[1, 2, 4]], np.full((3, 4), 0.25))
    assert_bits_equal(constant.table[[0, 3]], vectors[[1, 0]], "pretrained rows")

    def halves(shape, dtype=None):
        return np.full(shape, 0.5, dtype=dtype)

    result = pe.table_from_pretrained(
        vocabulary, (words, vectors), new_rows=halves, dtype="float64"
    )
    assert result.table.dtype == np.float64
    np.testing.assert_array_equal(result.table[[1, 2, 4]], np.full((3, 4), 0.5))


def test_dict_and_pair_forms_agree(pretrained):
    words, vectors = pretrained
    vocabulary = ["", "sat", "new", "the"]
    as_dict = pe.table_from_pretrained(vocabulary, dict(zip(words, vectors)), new_rows="zeros")
    as_pair = pe.table_from_pretrained(vocabulary, (words, vectors), new_rows="zeros")
    as_keyed = pe.table_from_pretrained(
        vocabulary, FakeKeyedVectors(words, vectors), new_rows="zeros"
    )
    for other in (as_pair, as_keyed):
        assert_bits_equal(other.table, as_dict.table, "same table from every source")
        assert other.trainable_ids.tolist() == as_dict.trainable_ids.tolist() == [0, 2]
    as_lists = pe.table_from_pretrained(
        ["cat"], {"cat": [1.0, 2.0]}, new_rows="zeros", dtype="float64"
    )
    np.testing.assert_array_equal(as_lists.table, [[1.0, 2.0]])


def test_gensim_keyed_vectors(pretrained):
    models = pytest.importorskip("gensim.models")
    words, vectors = pretrained
    keyed = models.KeyedVectors(vector_size=4)
    keyed.add_vectors(words, vectors)
    result = pe.table_from_pretrained(["mat", "new", "Dog"], keyed)
    assert result.pretrained_ids.tolist() == [0, 2]
    assert_bits_equal(result.table[[0, 2]], vectors[[4, 5]], "gensim rows")


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda w, v: pe.table_from_pretrained([], (w, v)), r"vocabulary: is empty"),
        (
            lambda w, v: pe.table_from_pretrained(["cat"], (w, v), new_rows="median"),
            r"new_rows: 'median'",
        ),
        (
            lambda w, v: pe.table_from_pretrained(["cat"], (w, v), new_rows=3),
            r"new_rows: 3",
        ),
        (
            lambda w, v: pe.table_from_pretrained(
                ["cat", "the"], {"cat": np.zeros(4), "the": np.zeros(5)}
            ),
            r"vectors: .*inconsistent width",
        ),
        (
            lambda w, v: pe.table_from_pretrained(["cat"], (w, v[:3])),
            r"vectors: a \(tokens, array\) pair needs an array of shape \[6, width\]",
        ),
        (
            lambda w, v: pe.table_from_pretrained(["x"], (w, v), new_rows="mean"),
            r"new_rows: 'mean' needs at least one pretrained row",
        ),
        (
            lambda w, v: pe.table_from_pretrained(["cat"], (w, v), dtype="int32"),
            r"dtype: 'int32' is not a floating-point dtype",
        ),
    ],
    ids=["empty", "unknown_name", "not_an_initializer", "widths", "pair", "mean_of_none", "int"],
)
def test_bad_arguments_raise_value_error(pretrained, call, pattern):
    words, vectors = pretrained
    with pytest.raises(ValueError, match=pattern):
        call(words, vectors)


def test_bad_kinds_raise_type_error(pretrained):
    words, vectors = pretrained
    with pytest.raises(TypeError, match=r"vocabulary: expected a list, tuple or 1-D array"):
        pe.table_from_pretrained("the cat", (words, vectors))
    with pytest.raises(TypeError, match=r"vocabulary: token 1 is int"):
        pe.table_from_pretrained(["the", 3], (words, vectors))
    with pytest.raises(TypeError, match=r"vectors: expected gensim KeyedVectors"):
        pe.table_from_pretrained(["the"], 3.0)


def test_layer_trains_only_the_new_rows(pretrained):
    words, vectors = pretrained
    vocabulary = ["", "the", "zebra", "cat", "quokka", "sat"]
    result = pe.table_from_pretrained(vocabulary, (words, vectors), new_rows="normal", seed=1)
    layer = result.layer(name="words")
    assert isinstance(layer, pe.PartialEmbedding)
    model = keras.Sequential([keras.Input((3,), dtype="int32"), layer, keras.layers.Flatten()])
    assert_bits_equal(layer.embeddings.numpy(), result.table, "the layer starts from the table")
    np.testing.assert_array_equal(
        np.flatnonzero(layer.trainable_mask.numpy()), result.trainable_ids
    )
    model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    ids = np.array([[1, 2, 3], [4, 5, 0], [2, 4, 1]], dtype=np.int32)
    model.fit(ids, np.ones((3, 12), np.float32), epochs=3, verbose=0)
    final = layer.embeddings.numpy()
    assert_bits_equal(final[result.pretrained_ids], result.table[result.pretrained_ids], "frozen")
    for row in result.trainable_ids:
        assert not np.array_equal(final[row], result.table[row]), f"new row {row} did not train"

    wide = pe.table_from_pretrained(["cat"], (words, vectors.astype(np.float64)), dtype="float64")
    assert wide.layer().dtype == "float64"


class _FakeKeyedVectors:
    """gensim's KeyedVectors surface: ``key_to_index`` and ``vectors``."""

    def __init__(self, key_to_index, vectors):
        self.key_to_index = key_to_index
        self.vectors = vectors


@pytest.mark.parametrize(
    "vocabulary, vectors, pattern",
    [
        ([b"\xff\xfe", "cat"], {"cat": [1.0]}, r"vocabulary: token 0 \(b'\\xff\\xfe'\) is not UTF-8"),  # noqa: E501
        (["cat"], _FakeKeyedVectors({"cat": 5}, np.zeros((2, 3))), r"key_to_index\['cat'\] = 5 is not in \[0, 2\)"),  # noqa: E501
        (["cat"], _FakeKeyedVectors({"cat": -1}, np.zeros((2, 3))), r"key_to_index\['cat'\] = -1"),
        (["cat"], _FakeKeyedVectors({"cat": "0"}, np.zeros((2, 3))), r"key_to_index\['cat'\] is '0'"),  # noqa: E501
        (["cat"], {"cat": ["a", "b"]}, r"vectors: the vector of 'cat' has dtype <U1, not a number"),
        (["cat"], (["cat"], [["a", "b"]]), r"vectors: the vector array has dtype <U1"),
        (["cat", "dog"], (["cat", "dog"], [[1.0, 2.0], [3.0]]), r"vectors: the vector array is ragged"),  # noqa: E501
        (["cat", "dog"], {"cat": [1.0, 2.0], "dog": [[3.0], [4.0, 5.0]]}, r"vectors: the vector of 'dog' is ragged"),  # noqa: E501
        (["cat", "x"], {"cat": [np.nan, 1.0]}, r"vectors: the vector of 'cat' \(row 0\) holds NaN or Inf"),  # noqa: E501
        (["x", "cat"], (["cat"], [[1.0, np.inf]]), r"vectors: the vector of 'cat' \(row 1\) holds NaN"),  # noqa: E501
    ],
    ids=["non-utf8", "index-high", "index-negative", "index-str", "str-dict", "str-pair",
         "ragged-pair", "ragged-dict", "nan", "inf"],
)  # fmt: skip
def test_hostile_inputs_raise_a_clear_argument_error(vocabulary, vectors, pattern):
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=pattern):
        pe.table_from_pretrained(vocabulary, vectors)


def test_a_float64_vector_that_overflows_the_table_dtype_is_refused():
    # 1e300 is finite in float64 but Inf in float32: every "mean" row would be Inf.
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=r"after the cast to float32"):
        pe.table_from_pretrained(["cat", "new"], {"cat": np.array([1e300, 0.0])})
    result = pe.table_from_pretrained(
        ["cat", "new"], {"cat": np.array([1e300, 0.0])}, dtype="float64"
    )
    assert result.table[1].tolist() == [1e300, 0.0]
