"""The sentiment demo's data: gensim's two test files, read, and laid out as one table.

``find_data_dir`` finds the files; ``load_word_vectors`` and
``load_labeled_sentences`` read them; ``build_table`` lays the pretrained
vectors, synthetic frozen rows and the review words that learn into one table.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from partial_embedding.pretrained import PretrainedCoverage

__all__ = [
    "DEFAULT_LEARNING_RATES",
    "LABELS",
    "OPTIMIZERS",
    "PADDING_ID",
    "PRETRAINED_FILE",
    "REVIEWS_ENCODING",
    "REVIEWS_FILE",
    "DemoDataError",
    "DemoTable",
    "build_table",
    "encode_sentences",
    "find_data_dir",
    "load_labeled_sentences",
    "load_word_vectors",
    "split_train_test",
]

PRETRAINED_FILE = "lee_fasttext.vec"
REVIEWS_FILE = "pang_lee_polarity.cor"
REVIEWS_ENCODING = "cp1252"
LABELS = {"__label__neg": 0, "__label__pos": 1}
PADDING_ID = 0
OPTIMIZERS = ("adam", "adamw", "sgd", "adagrad", "rmsprop")
DEFAULT_LEARNING_RATES = {
    "adam": 0.02,
    "adamw": 0.02,
    "sgd": 2.0,
    "adagrad": 2.0,
    "rmsprop": 0.02,
}


class DemoDataError(RuntimeError):
    """The demo's data files cannot be found or read."""


# -- data ---------------------------------------------------------------------


def find_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Returns the folder holding the demo's two data files.

    Without ``data_dir``, that is gensim's ``test/test_data`` folder. gensim is
    located, not imported (importing it costs seconds and pulls in SciPy).

    Raises:
      DemoDataError: gensim is not installed, or a file is missing.
    """
    if data_dir is None:
        spec = importlib.util.find_spec("gensim")
        if spec is None or not spec.submodule_search_locations:
            raise DemoDataError(
                "The demo trains on two small files that the gensim wheel ships "
                f"({PRETRAINED_FILE} and {REVIEWS_FILE}), and gensim is not "
                "installed. Install it with 'pip install gensim' (or "
                "'pip install tf-partial-embedding[demo]'), or pass --data-dir "
                "with a folder holding both files."
            )
        folder = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data"
        where = f"gensim's test data folder {folder}"
    else:
        folder = Path(data_dir)
        where = f"--data-dir {folder}"
    missing = [name for name in (PRETRAINED_FILE, REVIEWS_FILE) if not (folder / name).is_file()]
    if missing:
        raise DemoDataError(
            f"{where} lacks {', '.join(missing)}; the demo needs "
            f"{PRETRAINED_FILE} and {REVIEWS_FILE} (gensim 4.x ships both)."
        )
    return folder


def load_word_vectors(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """Reads word2vec text format: a ``count width`` header, then ``word v1 .. vD``.

    Returns the words and a float32 ``[count, width]`` array, each value parsed
    straight to float32 (as gensim does), so the array holds exactly the bits
    the file describes.

    Raises:
      DemoDataError: the file does not match its header.
    """
    with open(path, encoding="utf-8") as handle:
        header = handle.readline().split()
        if len(header) != 2:
            raise DemoDataError(f"{path}: the first line must be 'count width', got {header}")
        count, width = int(header[0]), int(header[1])
        words: list[str] = []
        vectors = np.empty((count, width), dtype=np.float32)
        for line_number, line in enumerate(handle, start=2):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if parts == [""]:
                continue
            if len(parts) != width + 1 or len(words) >= count:
                raise DemoDataError(
                    f"{path}:{line_number}: expected a word and {width} numbers "
                    f"({count} lines), got {len(parts)} fields"
                )
            vectors[len(words)] = np.asarray(parts[1:], dtype=np.float32)
            words.append(parts[0])
    if len(words) != count:
        raise DemoDataError(f"{path}: the header says {count} vectors, the file has {len(words)}")
    return words, vectors


def load_labeled_sentences(path: str | os.PathLike) -> tuple[list[list[str]], np.ndarray]:
    """Reads ``__label__pos|__label__neg token token ...`` lines.

    Returns the token lists and int labels (1 = positive, 0 = negative).

    Raises:
      DemoDataError: a line without one of the two labels.
    """
    sentences: list[list[str]] = []
    labels: list[int] = []
    text = Path(path).read_bytes().decode(REVIEWS_ENCODING)
    for line_number, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0] not in LABELS:
            raise DemoDataError(
                f"{path}:{line_number}: a line must start with one of {sorted(LABELS)}, "
                f"got {tokens[0]!r}"
            )
        labels.append(LABELS[tokens[0]])
        sentences.append(tokens[1:])
    return sentences, np.asarray(labels, dtype=np.int64)


@dataclasses.dataclass
class DemoTable:
    """The embedding table and what each row is."""

    table: np.ndarray  # [num_rows, width], float32: the initial values
    frozen_mask: np.ndarray  # [num_rows], bool
    word_ids: dict[str, int]
    num_pretrained: int
    num_synthetic: int
    num_new: int
    new_words: list[str]
    # What pe.table_from_pretrained found for the real rows (padding,
    # pretrained words, review words), synthetic rows aside.
    coverage: PretrainedCoverage | None = None

    @property
    def num_rows(self) -> int:
        return int(self.table.shape[0])

    @property
    def width(self) -> int:
        return int(self.table.shape[1])

    @property
    def new_ids(self) -> np.ndarray:
        return np.flatnonzero(~self.frozen_mask)


def build_table(
    pretrained_words: list[str],
    pretrained_vectors: np.ndarray,
    sentences: list[list[str]],
    vocab_size: int,
    seed: int,
) -> DemoTable:
    """Lays out padding, pretrained, synthetic and new rows (see the module doc).

    ``pe.table_from_pretrained`` maps the real vocabulary (padding, the
    pretrained words, the review words they lack) onto the pretrained
    vectors: it copies their bits, names the rows without a vector and reports
    the coverage. Synthetic rows go between the pretrained and the new rows.
    New and synthetic rows are drawn from a normal distribution with the
    pretrained vectors' standard deviation, so they start on the same scale;
    the padding row stays zero and frozen.

    Raises:
      ValueError: ``vocab_size`` is positive but smaller than the real rows.
    """
    from partial_embedding.pretrained import table_from_pretrained

    known = set(pretrained_words)
    new_words = sorted({token for tokens in sentences for token in tokens} - known)
    num_pretrained, width = pretrained_vectors.shape
    real_rows = 1 + num_pretrained + len(new_words)
    if vocab_size and vocab_size < real_rows:
        raise ValueError(
            f"--vocab-size {vocab_size} is smaller than the real rows ({real_rows}: "
            f"padding, {num_pretrained} pretrained, {len(new_words)} new); use 0 or at "
            f"least {real_rows}"
        )
    # The reserved padding row "" and the missing words start at zero here;
    # the new words' random rows are drawn below, after the synthetic ones.
    real = table_from_pretrained(
        ["", *pretrained_words, *new_words],
        (pretrained_words, pretrained_vectors),
        new_rows="zeros",
    )
    num_rows = max(vocab_size, real_rows)
    num_synthetic = num_rows - real_rows
    first_new = num_rows - len(new_words)
    table = np.empty((num_rows, width), dtype=np.float32)
    table[: 1 + num_pretrained] = real.table[: 1 + num_pretrained]
    rng = np.random.default_rng(seed)
    scale = float(pretrained_vectors.std())
    for start, stop in ((1 + num_pretrained, first_new), (first_new, num_rows)):
        table[start:stop] = (rng.standard_normal((stop - start, width)) * scale).astype(np.float32)
    frozen_mask = np.ones(num_rows, dtype=bool)
    # Of the helper's trainable rows, the padding row stays frozen; the
    # review words' rows move to the end of the table.
    new_rows = real.trainable_ids[real.trainable_ids != PADDING_ID]
    frozen_mask[new_rows - (1 + num_pretrained) + first_new] = False
    word_ids = {word: 1 + row for row, word in enumerate(pretrained_words)}
    word_ids.update({word: first_new + row for row, word in enumerate(new_words)})
    return DemoTable(
        table=table,
        frozen_mask=frozen_mask,
        word_ids=word_ids,
        num_pretrained=num_pretrained,
        num_synthetic=num_synthetic,
        num_new=len(new_words),
        new_words=new_words,
        coverage=real.coverage,
    )


def encode_sentences(sentences: list[list[str]], word_ids: dict[str, int]) -> np.ndarray:
    """Ids ``[num_sentences, longest]``, padded with ``PADDING_ID``."""
    longest = max(len(tokens) for tokens in sentences)
    ids = np.full((len(sentences), longest), PADDING_ID, dtype=np.int32)
    for row, tokens in enumerate(sentences):
        ids[row, : len(tokens)] = [word_ids[token] for token in tokens]
    return ids


def split_train_test(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A stratified split: the same share of each label is held out."""
    rng = np.random.default_rng(seed)
    train_rows: list[int] = []
    test_rows: list[int] = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        held_out = int(round(len(members) * test_fraction))
        test_rows.extend(members[:held_out])
        train_rows.extend(members[held_out:])
    return np.sort(np.asarray(train_rows)), np.sort(np.asarray(test_rows))
