"""Reading ``add_tokens``' ``new_tokens`` and extending keras-hub tokenizers.

A tokenizer takes new strings where keras-hub gives a public route: a
``WordPieceTokenizer`` (its vocabulary list, through the constructor's
``vocabulary``) and a ``BytePairTokenizer`` (its vocabulary mapping, with the
new strings as ``unsplittable_tokens`` so that they are never split). Other
tokenizers (SentencePiece, byte-level, ...) have no public way to add a
piece: strings are refused for them, and a count or ids still work.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

import keras
import keras_hub
import numpy as np

from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError

__all__ = [
    "NewTokens",
    "extended_preprocessor",
    "extended_tokenizer",
    "parse_new_tokens",
    "subword_rows",
]


@dataclasses.dataclass(frozen=True)
class NewTokens:
    """What ``new_tokens`` asks for.

    Attributes:
      count: Rows to append (0 for existing ids).
      ids: Existing ids to train (None when rows are appended).
      tokens: The strings (None for a count or ids).
    """

    count: int
    ids: np.ndarray | None
    tokens: tuple[str, ...] | None


def _is_integer(value: Any) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool)


def parse_new_tokens(new_tokens: Any, vocabulary_size: int) -> NewTokens:
    """Checks ``new_tokens`` (a count, strings or existing ids) against the table.

    Raises:
      PartialEmbeddingArgumentError: a count <= 0; an empty list; an id
        outside ``[0, vocabulary_size)``; repeats.
      PartialEmbeddingTypeError: anything else.
    """
    if _is_integer(new_tokens):
        if new_tokens <= 0:
            raise PartialEmbeddingArgumentError(
                f"new_tokens: a count must be > 0; got new_tokens={new_tokens}"
            )
        return NewTokens(int(new_tokens), None, None)
    if isinstance(new_tokens, (str, bytes)) or not isinstance(new_tokens, (Sequence, np.ndarray)):
        raise PartialEmbeddingTypeError(
            "new_tokens: must be a count, a list of token strings or a list of "
            f"existing ids; got {new_tokens!r}"
        )
    items = list(new_tokens)
    if not items:
        raise PartialEmbeddingArgumentError("new_tokens: the list is empty")
    if all(isinstance(item, str) for item in items):
        if len(set(items)) != len(items):
            raise PartialEmbeddingArgumentError(f"new_tokens: repeated strings in {items}")
        return NewTokens(len(items), None, tuple(items))
    if not all(_is_integer(item) for item in items):
        raise PartialEmbeddingTypeError(
            f"new_tokens: a list must hold only strings or only integer ids; got {items!r}"
        )
    ids = np.asarray(items, dtype=np.int64)
    bad = [int(i) for i in ids if not 0 <= i < vocabulary_size]
    if bad:
        raise PartialEmbeddingArgumentError(
            f"new_tokens: id {bad[0]} is not in [0, {vocabulary_size}) (the vocabulary size)"
        )
    if len(np.unique(ids)) != len(ids):
        raise PartialEmbeddingArgumentError(f"new_tokens: repeated ids in {ids.tolist()}")
    return NewTokens(0, np.sort(ids), None)


def _tokenizer_of(preprocessor: Any) -> Any:
    tokenizer = getattr(preprocessor, "tokenizer", None)
    if tokenizer is None:
        raise PartialEmbeddingArgumentError(
            "new_tokens: strings need a tokenizer; pass the task model with its "
            "preprocessor, or a count of rows"
        )
    return tokenizer


def _vocabulary_list(tokenizer: Any) -> list[str]:
    vocabulary = tokenizer.get_vocabulary()
    if isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer):
        return sorted(tokenizer.vocabulary, key=tokenizer.vocabulary.get)
    return list(vocabulary)


def extended_tokenizer(preprocessor: Any, tokens: Sequence[str], vocabulary_size: int) -> Any:
    """A new tokenizer like the preprocessor's, with ``tokens`` as ids ``V, V+1, ...``.

    Raises:
      PartialEmbeddingArgumentError: no tokenizer; a token already in the
        vocabulary; a tokenizer whose vocabulary is not the table's size.
      PartialEmbeddingTypeError: a tokenizer with no public route to new
        tokens.
    """
    tokenizer = _tokenizer_of(preprocessor)
    is_word_piece = isinstance(tokenizer, keras_hub.tokenizers.WordPieceTokenizer)
    is_byte_pair = isinstance(tokenizer, keras_hub.tokenizers.BytePairTokenizer)
    if not (is_word_piece or is_byte_pair):
        raise PartialEmbeddingTypeError(
            f"new_tokens: {type(tokenizer).__name__} has no public way to add tokens "
            "(WordPiece and BytePair tokenizers do); pass a count or ids instead"
        )
    vocabulary = _vocabulary_list(tokenizer)
    if len(vocabulary) != vocabulary_size:
        raise PartialEmbeddingArgumentError(
            f"new_tokens: the tokenizer has {len(vocabulary)} tokens and the table "
            f"{vocabulary_size} rows; strings need them equal (pass a count or ids)"
        )
    known = set(vocabulary)
    present = [token for token in tokens if token in known]
    if present:
        raise PartialEmbeddingArgumentError(
            f"new_tokens: {present[0]!r} is already in the vocabulary "
            f"(id {vocabulary.index(present[0])})"
        )
    config = tokenizer.get_config()
    if is_word_piece:
        config["vocabulary"] = vocabulary + list(tokens)
    else:
        config["vocabulary"] = {
            token: index for index, token in enumerate(vocabulary + list(tokens))
        }
        config["merges"] = list(tokenizer.merges)
        config["unsplittable_tokens"] = list(tokenizer.unsplittable_tokens or []) + list(tokens)
    return type(tokenizer).from_config(config)


def extended_preprocessor(preprocessor: Any, tokenizer: Any) -> Any:
    """A preprocessor of ``preprocessor``'s class and config holding ``tokenizer``."""
    config = {**preprocessor.get_config(), "tokenizer": tokenizer}
    return type(preprocessor).from_config(config)


def subword_rows(preprocessor: Any, tokens: Sequence[str], table: np.ndarray) -> np.ndarray:
    """Row ``i``: the mean of ``table``'s rows the tokenizer splits ``tokens[i]`` into.

    Raises:
      PartialEmbeddingArgumentError: no tokenizer; a token it splits into
        nothing.
    """
    tokenizer = _tokenizer_of(preprocessor)
    rows = np.empty((len(tokens), table.shape[1]), dtype=np.float64)
    for index, token in enumerate(tokens):
        pieces = np.asarray(keras.ops.convert_to_numpy(tokenizer(token))).reshape(-1)
        if pieces.size == 0:
            raise PartialEmbeddingArgumentError(
                f"init='subword_mean': the tokenizer splits {token!r} into no tokens"
            )
        rows[index] = np.asarray(table[pieces], dtype=np.float64).mean(axis=0)
    return rows
