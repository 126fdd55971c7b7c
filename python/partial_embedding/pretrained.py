"""From pretrained vectors to a table whose missing rows train.

``table_from_pretrained`` lays a vocabulary (a token list, or the vocabulary of
a ``keras.layers.StringLookup`` / ``TextVectorization``) onto pretrained
vectors (gensim ``KeyedVectors``, a ``(tokens, array)`` pair or a dict) and
returns the table, the ids of the rows that have no pretrained vector (the
rows to train) and a coverage report. The table is allocated once and filled
in row blocks: a large pretrained matrix is never copied whole.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np

from partial_embedding._internal.types import PretrainedVectors, Vocabulary
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError

__all__ = ["PretrainedCoverage", "PretrainedTable", "table_from_pretrained"]

NEW_ROW_STRATEGIES = ("mean", "normal", "zeros")
_BLOCK_BYTES = 4 * 2**20
_MISSING_EXAMPLES = 10


@dataclasses.dataclass(frozen=True)
class PretrainedCoverage:
    """How much of a vocabulary the pretrained vectors cover.

    Attributes:
      num_tokens: rows of the vocabulary (reserved rows included).
      num_pretrained: rows that received a pretrained vector.
      num_new: rows without one (reserved rows and missing tokens).
      fraction_pretrained: ``num_pretrained / num_tokens``.
      missing_examples: the first tokens (at most 10, in row order) that the
        pretrained vectors lack, reserved rows not counted.
      reserved: the reserved rows' tokens in row order, e.g. ``("", "[UNK]")``
        for a ``StringLookup`` with a mask token and one OOV index.

    >>> coverage = PretrainedCoverage(4, 2, 2, 0.5, ("zebra",), ("",))
    >>> coverage.num_missing
    1
    >>> print(coverage)  # doctest: +NORMALIZE_WHITESPACE
    4 rows: 2 (50.0 %) have a pretrained vector, 2 are new: 1 reserved ('') and 1
    missing token (e.g. 'zebra').
    """

    num_tokens: int
    num_pretrained: int
    num_new: int
    fraction_pretrained: float
    missing_examples: tuple[str, ...]
    reserved: tuple[str, ...]

    @property
    def num_missing(self) -> int:
        """Rows of ordinary tokens that the pretrained vectors lack."""
        return self.num_new - len(self.reserved)

    def __str__(self) -> str:
        reserved = ", ".join(repr(token) for token in self.reserved)
        examples = ", ".join(repr(token) for token in self.missing_examples)
        missing = self.num_missing
        return (
            f"{self.num_tokens:,} rows: {self.num_pretrained:,} "
            f"({100.0 * self.fraction_pretrained:.1f} %) have a pretrained vector, "
            f"{self.num_new:,} are new: {len(self.reserved):,} reserved"
            + (f" ({reserved})" if reserved else "")
            + f" and {missing:,} missing token{'' if missing == 1 else 's'}"
            + (f" (e.g. {examples})." if examples else ".")
        )


@dataclasses.dataclass(frozen=True, eq=False)
class PretrainedTable:
    """What ``table_from_pretrained`` returns.

    Attributes:
      table: ``[V, D]`` initial values, one row per vocabulary entry.
      trainable_ids: int64, sorted: the rows without a pretrained vector
        (reserved rows and missing tokens), the ones to train.
      pretrained_ids: int64, sorted: the rows holding a pretrained vector.
      coverage: a ``PretrainedCoverage``.

    >>> result = table_from_pretrained(["a", "zebra"], {"a": [1.0, 2.0]}, new_rows="zeros")
    >>> layer = result.layer(name="words")
    >>> layer.input_dim, layer.output_dim, layer.trainable_mask.numpy().tolist()
    (2, 2, [False, True])
    """

    table: np.ndarray
    trainable_ids: np.ndarray
    pretrained_ids: np.ndarray
    coverage: PretrainedCoverage

    def layer(self, *, reversible: bool = False, **kwargs: Any) -> Any:
        """A ``PartialEmbedding`` holding ``table`` that trains only ``trainable_ids``.

        With ``reversible=True``, a ``PartialReversibleEmbedding`` (tied by
        default: ``layer(hidden, reverse=True)`` gives logits over the
        vocabulary). ``kwargs`` go to the layer (``mask_zero``, ``name``,
        ...). Without ``dtype`` there, a table of another dtype than float32
        gives the layer its dtype.
        """
        from partial_embedding.layers import PartialEmbedding, PartialReversibleEmbedding

        layer_class = PartialReversibleEmbedding if reversible else PartialEmbedding

        if "dtype" not in kwargs and self.table.dtype != np.float32:
            kwargs["dtype"] = self.table.dtype.name
        num_rows, width = self.table.shape
        return layer_class(
            num_rows, width, trainable_ids=self.trainable_ids, weights=self.table, **kwargs
        )


def _vocabulary_tokens(vocabulary: Any) -> tuple[list[str], int]:
    """The tokens in row order and how many leading rows are reserved."""
    if hasattr(vocabulary, "get_vocabulary"):
        tokens = list(vocabulary.get_vocabulary())
        ordinary = len(vocabulary.get_vocabulary(include_special_tokens=False))
        num_reserved = len(tokens) - ordinary
    elif isinstance(vocabulary, np.ndarray) and vocabulary.ndim == 1:
        tokens, num_reserved = vocabulary.tolist(), 0
    elif isinstance(vocabulary, (str, bytes)) or not isinstance(vocabulary, Sequence):
        raise PartialEmbeddingTypeError(
            "vocabulary: expected a list, tuple or 1-D array of str tokens, a StringLookup or a "
            f"TextVectorization, got {type(vocabulary).__name__}"
        )
    else:
        tokens, num_reserved = list(vocabulary), 0
    for row, token in enumerate(tokens):
        if isinstance(token, bytes):
            try:
                tokens[row] = token.decode("utf-8")
            except UnicodeDecodeError as error:
                raise PartialEmbeddingArgumentError(
                    f"vocabulary: token {row} ({token[:40]!r}) is not UTF-8 ({error.reason} at "
                    f"byte {error.start})"
                ) from None
        elif isinstance(token, str):
            tokens[row] = str(token)  # np.str_ -> str
        else:
            raise PartialEmbeddingTypeError(
                f"vocabulary: token {row} is {type(token).__name__} {token!r}, not a str"
            )
    if not tokens:
        raise PartialEmbeddingArgumentError(
            "vocabulary: is empty; it needs at least one token (one row)"
        )
    return tokens, num_reserved


class _IndexedVectors:
    """Vectors as rows of one matrix and a token -> row map."""

    def __init__(self, key_to_index: Mapping[str, int], matrix: Any) -> None:
        matrix = _numeric_array(matrix, "the vector array")  # a memory map stays one
        if matrix.ndim != 2:
            raise PartialEmbeddingArgumentError(
                f"vectors: the vector array must have rank 2 [count, width], got shape "
                f"{matrix.shape}"
            )
        self.key_to_index = key_to_index
        self.matrix = matrix
        self.width = int(matrix.shape[1])


def _numeric_array(values: Any, what: str) -> np.ndarray:
    """``np.asarray(values)``, refusing ragged, string and object arrays."""
    try:
        array = np.asarray(values)
    except ValueError as error:  # ragged nested lists
        raise PartialEmbeddingArgumentError(f"vectors: {what} is ragged ({error})") from None
    if array.dtype.kind not in "fiub" and array.dtype.name != "bfloat16":
        raise PartialEmbeddingArgumentError(
            f"vectors: {what} has dtype {array.dtype}, not a number type (strings, objects or "
            "vectors of unequal lengths?)"
        )
    return array


def _pair_vectors(tokens: Any, matrix: Any) -> _IndexedVectors:
    matrix = _numeric_array(matrix, "the vector array")
    tokens = list(tokens)
    if matrix.ndim != 2 or matrix.shape[0] != len(tokens):
        raise PartialEmbeddingArgumentError(
            f"vectors: a (tokens, array) pair needs an array of shape [{len(tokens)}, width] "
            f"(one row per token), got shape {matrix.shape}"
        )
    index: dict[str, int] = {}
    for row, token in enumerate(tokens):
        index.setdefault(str(token), row)  # the first of duplicate tokens wins
    return _IndexedVectors(index, matrix)


def _source(vectors: Any) -> _IndexedVectors | Any:
    """An ``_IndexedVectors`` where rows can be gathered, else the mapping itself."""
    if hasattr(vectors, "key_to_index") and hasattr(vectors, "vectors"):
        return _IndexedVectors(vectors.key_to_index, vectors.vectors)
    if isinstance(vectors, (tuple, list)) and len(vectors) == 2 and not isinstance(vectors, str):
        return _pair_vectors(*vectors)
    if hasattr(vectors, "__getitem__") and hasattr(vectors, "__contains__"):
        return vectors
    raise PartialEmbeddingTypeError(
        "vectors: expected gensim KeyedVectors (or an object with key_to_index and vectors), "
        f"a (tokens, array) pair or a dict token -> vector, got {type(vectors).__name__}"
    )


def _find(token: str, contains: Callable[[str], bool], lowercase: bool) -> str | None:
    """The key under which ``token`` has a vector, or None."""
    if contains(token):
        return token
    if lowercase and token.lower() != token and contains(token.lower()):
        return token.lower()
    return None


def _source_rows(
    tokens: list[str], ordinary_rows: np.ndarray, source: _IndexedVectors, lowercase: bool
) -> np.ndarray:
    """Row of ``source.matrix`` for each token (-1: none), every index checked."""
    index = source.key_to_index
    count = int(source.matrix.shape[0])
    source_rows = np.full(len(tokens), -1, dtype=np.int64)
    for row in ordinary_rows:
        key = _find(tokens[row], index.__contains__, lowercase)
        if key is None:
            continue
        position = index[key]
        if isinstance(position, (bool, np.bool_)) or not isinstance(position, (int, np.integer)):
            raise PartialEmbeddingArgumentError(
                f"vectors: key_to_index[{key!r}] is {position!r}, not an integer row"
            )
        if not 0 <= position < count:
            raise PartialEmbeddingArgumentError(
                f"vectors: key_to_index[{key!r}] = {position} is not in [0, {count}) (the rows "
                "of vectors)"
            )
        source_rows[row] = position
    return source_rows


def _check_finite_rows(
    table: np.ndarray, pretrained_ids: np.ndarray, tokens: list[str], block: int
) -> None:
    """Refuses a pretrained vector holding NaN or Inf (after the cast to the table's dtype)."""
    for start in range(0, len(pretrained_ids), block):
        ids = pretrained_ids[start : start + block]
        finite = np.isfinite(table[ids]).all(axis=1)
        if not finite.all():
            row = int(ids[np.flatnonzero(~finite)[0]])
            raise PartialEmbeddingArgumentError(
                f"vectors: the vector of {tokens[row]!r} (row {row}) holds NaN or Inf (after the "
                f"cast to {table.dtype.name}); it would make every 'mean' row NaN too"
            )


def _rows_per_block(width: int, itemsize: int) -> int:
    return max(1, _BLOCK_BYTES // max(1, width * itemsize))


def _fill_from_matrix(
    table: np.ndarray, source_rows: np.ndarray, matrix: np.ndarray, block: int
) -> None:
    """``table[i] = matrix[source_rows[i]]`` where ``source_rows[i] >= 0``, by row blocks."""
    for start in range(0, len(source_rows), block):
        rows = source_rows[start : start + block]
        found = np.flatnonzero(rows >= 0)
        if found.size:
            table[start + found] = matrix[rows[found]]


def _vector_of(mapping: Any, key: str, width: int | None) -> np.ndarray:
    vector = _numeric_array(mapping[key], f"the vector of {key!r}")
    if vector.ndim != 1 or (width is not None and vector.shape[0] != width):
        raise PartialEmbeddingArgumentError(
            f"vectors: the vector of {key!r} has shape {vector.shape}, expected "
            f"({width if width is not None else 'width'},): vectors of inconsistent width"
        )
    return vector


def _mapping_width(mapping: Any, found_keys: list[str]) -> int:
    """The width of the first vector found (every one is checked as it is copied)."""
    if found_keys:
        first = _numeric_array(mapping[found_keys[0]], f"the vector of {found_keys[0]!r}")
    elif isinstance(mapping, Mapping) and len(mapping):
        first = _numeric_array(next(iter(mapping.values())), "the first vector")
    else:
        raise PartialEmbeddingArgumentError(
            "vectors: holds no vector for any token of the vocabulary, so the width is unknown"
        )
    if first.ndim != 1:
        raise PartialEmbeddingArgumentError(
            f"vectors: every vector must have rank 1 [width], found one of shape {first.shape}"
        )
    return int(first.shape[0])


def _as_float_dtype(dtype: Any) -> np.dtype:
    import tensorflow as tf

    try:
        resolved = np.dtype(tf.as_dtype(dtype).as_numpy_dtype)
    except TypeError as error:
        raise PartialEmbeddingArgumentError(f"dtype: {dtype!r} is not a dtype") from error
    if not tf.as_dtype(resolved).is_floating:
        raise PartialEmbeddingArgumentError(
            f"dtype: {dtype!r} is not a floating-point dtype; use float16, bfloat16, float32 "
            "or float64"
        )
    return resolved


def _pretrained_moments(
    table: np.ndarray, pretrained_ids: np.ndarray, block: int, covariance: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """The float64 mean (and covariance) of ``table[pretrained_ids]``, by row blocks."""
    width = table.shape[1]
    total = np.zeros(width, dtype=np.float64)
    for start in range(0, len(pretrained_ids), block):
        total += table[pretrained_ids[start : start + block]].astype(np.float64).sum(axis=0)
    mean = total / len(pretrained_ids)
    if not covariance:
        return mean, None
    scatter = np.zeros((width, width), dtype=np.float64)
    for start in range(0, len(pretrained_ids), block):
        centered = table[pretrained_ids[start : start + block]].astype(np.float64) - mean
        scatter += centered.T @ centered
    return mean, scatter / max(len(pretrained_ids) - 1, 1)


def _keras_initializer(new_rows: Any, seed: int | None) -> Callable[..., Any]:
    import keras

    if callable(new_rows) and not isinstance(new_rows, str):
        return new_rows
    try:
        initializer = keras.initializers.get(new_rows)
    except (ValueError, TypeError) as error:
        raise PartialEmbeddingArgumentError(
            f"new_rows: {new_rows!r} is neither one of {list(NEW_ROW_STRATEGIES)} nor a Keras "
            "initializer (a name, an instance or a callable(shape, dtype))"
        ) from error
    if isinstance(new_rows, str) and seed is not None and hasattr(initializer, "get_config"):
        config = initializer.get_config()
        if "seed" in config:
            initializer = type(initializer).from_config({**config, "seed": seed})
    return initializer


def _fill_new_rows(
    table: np.ndarray,
    new_ids: np.ndarray,
    pretrained_ids: np.ndarray,
    new_rows: Any,
    seed: int | None,
    block: int,
) -> None:
    if new_ids.size == 0:
        return
    width = table.shape[1]
    if isinstance(new_rows, str) and new_rows == "zeros":
        table[new_ids] = 0
        return
    if isinstance(new_rows, str) and new_rows in ("mean", "normal"):
        if pretrained_ids.size == 0:
            raise PartialEmbeddingArgumentError(
                f"new_rows: {new_rows!r} needs at least one pretrained row, and no token of the "
                "vocabulary has a pretrained vector"
            )
        mean, covariance = _pretrained_moments(
            table, pretrained_ids, block, covariance=new_rows == "normal"
        )
        if covariance is None:
            for start in range(0, len(new_ids), block):
                table[new_ids[start : start + block]] = mean
            return
        # x = mean + z @ factor.T has covariance factor @ factor.T = covariance;
        # eigenvalues below zero are rounding (the matrix is a sum of squares).
        eigenvalues, eigenvectors = np.linalg.eigh(covariance)
        factor = eigenvectors * np.sqrt(np.clip(eigenvalues, 0.0, None))
        rng = np.random.default_rng(seed)
        for start in range(0, len(new_ids), block):
            ids = new_ids[start : start + block]
            table[ids] = mean + rng.standard_normal((len(ids), width)) @ factor.T
        return
    initializer = _keras_initializer(new_rows, seed)
    import keras

    values = keras.ops.convert_to_numpy(initializer((len(new_ids), width), dtype=table.dtype.name))
    if values.shape != (len(new_ids), width):
        raise PartialEmbeddingArgumentError(
            f"new_rows: the initializer returned shape {values.shape}, expected "
            f"{(len(new_ids), width)}"
        )
    table[new_ids] = values


def _check_seed(seed: Any) -> None:
    if seed is not None and (
        isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral) or seed < 0
    ):
        raise PartialEmbeddingArgumentError(
            f"seed: expected None or an integer >= 0. Received: seed={seed!r}"
        )


def table_from_pretrained(
    vocabulary: Vocabulary,
    vectors: PretrainedVectors,
    *,
    new_rows: Any = "mean",
    dtype: Any = "float32",
    seed: int | None = None,
    lowercase: bool = False,
) -> PretrainedTable:
    """Lays ``vocabulary`` onto pretrained ``vectors``: a table and the rows to train.

    Row ``i`` of the table is the vocabulary's token ``i``. A token with a
    pretrained vector gets exactly that vector (cast to ``dtype``). Rows
    without one (reserved rows and tokens the vectors lack) are the
    ``trainable_ids`` and are filled by ``new_rows``. The table is filled in
    row blocks of about 4 MiB, the vectors never copied whole. The contract:
    docs/pretrained_and_trained_rows.md.

    Args:
      vocabulary: Tokens in row order (str or bytes; ``""`` marks a reserved
        padding row), or a ``keras.layers.StringLookup`` /
        ``TextVectorization``, whose special rows are reserved.
      vectors: gensim ``KeyedVectors`` (or any object with ``key_to_index``
        and a ``vectors`` matrix), a ``(tokens, array)`` pair, or a dict
        token -> vector.
      new_rows: How rows without a pretrained vector start: ``"mean"``,
        ``"normal"`` (the pretrained rows' mean and covariance), ``"zeros"``,
        or a Keras initializer (a name, an instance or a callable).
      dtype: The table's dtype (float16, bfloat16, float32, float64).
      seed: For ``"normal"`` and for an initializer given by name.
      lowercase: A token without a vector also tries ``token.lower()``.

    Returns:
      A ``PretrainedTable``; ``.layer()`` makes the ``PartialEmbedding``.

    Raises:
      PartialEmbeddingArgumentError: (a ``ValueError``) a bad value, named.
      PartialEmbeddingTypeError: a vocabulary or vectors of an unsupported kind.

    >>> import numpy as np
    >>> words = ["the", "cat", "sat"]
    >>> vectors = np.array([[1.0, 0.0], [3.0, 2.0], [2.0, 4.0]], dtype=np.float32)
    >>> result = table_from_pretrained(["", "cat", "the", "zebra"], (words, vectors))
    >>> result.table
    array([[2., 1.],
           [3., 2.],
           [1., 0.],
           [2., 1.]], dtype=float32)
    >>> result.trainable_ids.tolist(), result.pretrained_ids.tolist()
    ([0, 3], [1, 2])
    >>> print(result.coverage)  # doctest: +NORMALIZE_WHITESPACE
    4 rows: 2 (50.0 %) have a pretrained vector, 2 are new: 1 reserved ('') and 1
    missing token (e.g. 'zebra').
    """
    _check_seed(seed)
    tokens, num_reserved = _vocabulary_tokens(vocabulary)
    if isinstance(new_rows, str) and new_rows not in NEW_ROW_STRATEGIES:
        _keras_initializer(new_rows, seed)  # an unknown name fails here, before any work
    elif not isinstance(new_rows, str) and not callable(new_rows):
        raise PartialEmbeddingArgumentError(
            f"new_rows: {new_rows!r} is neither one of {list(NEW_ROW_STRATEGIES)} nor a Keras "
            "initializer (a name, an instance or a callable(shape, dtype))"
        )
    table_dtype = _as_float_dtype(dtype)
    source = _source(vectors)

    reserved = np.zeros(len(tokens), dtype=bool)
    reserved[:num_reserved] = True
    if num_reserved == 0:
        reserved[[row for row, token in enumerate(tokens) if token == ""]] = True
    ordinary_rows = np.flatnonzero(~reserved)

    if isinstance(source, _IndexedVectors):
        source_rows = _source_rows(tokens, ordinary_rows, source, lowercase)
        width = source.width
        table = np.empty((len(tokens), width), dtype=table_dtype)
        block = _rows_per_block(width, table.itemsize)
        _fill_from_matrix(table, source_rows, source.matrix, block)
        has_vector = source_rows >= 0
    else:
        keys: list[str | None] = [None] * len(tokens)
        for row in ordinary_rows:
            keys[row] = _find(tokens[row], source.__contains__, lowercase)
        found_keys = [key for key in keys if key is not None]
        width = _mapping_width(source, found_keys)
        table = np.empty((len(tokens), width), dtype=table_dtype)
        block = _rows_per_block(width, table.itemsize)
        for position, key in enumerate(keys):
            if key is not None:
                table[position] = _vector_of(source, key, width)
        has_vector = np.array([key is not None for key in keys], dtype=bool)

    pretrained_ids = np.flatnonzero(has_vector).astype(np.int64)
    trainable_ids = np.flatnonzero(~has_vector).astype(np.int64)
    _check_finite_rows(table, pretrained_ids, tokens, block)
    _fill_new_rows(table, trainable_ids, pretrained_ids, new_rows, seed, block)

    missing = np.flatnonzero(~has_vector & ~reserved)[:_MISSING_EXAMPLES]
    coverage = PretrainedCoverage(
        num_tokens=len(tokens),
        num_pretrained=len(pretrained_ids),
        num_new=len(trainable_ids),
        fraction_pretrained=len(pretrained_ids) / len(tokens),
        missing_examples=tuple(tokens[row] for row in missing),
        reserved=tuple(tokens[row] for row in np.flatnonzero(reserved)),
    )
    return PretrainedTable(table, trainable_ids, pretrained_ids, coverage)
