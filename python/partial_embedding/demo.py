"""The seed use case end to end: ``python -m partial_embedding.demo``.

A sentiment classifier starts from pretrained word vectors. Words of the
reviews that the pretrained table lacks get new, random rows. Only those new
rows and the classifier's head learn; every pretrained row must stay exactly as
it was, bit for bit.

The data are two small files that the ``gensim`` wheel ships (nothing is
downloaded at run time):

* ``lee_fasttext.vec``: 1,762 word vectors of width 10 in word2vec text
  format, trained by gensim's authors on the Lee news corpus;
* ``pang_lee_polarity.cor``: 200 movie-review sentences (by the file's name,
  from Pang & Lee's sentence polarity data), one per line, each starting with
  ``__label__pos`` or ``__label__neg``, tokenized and lower-cased, encoded in
  cp1252; 100 of each label.

The table is laid out as::

    row 0                     padding (frozen, zeros)
    rows 1 .. 1762            pretrained vectors from lee_fasttext.vec (frozen)
    synthetic rows            only with --vocab-size: random frozen rows that
                              stand in for the rest of a large pretrained
                              vocabulary (no review uses them)
    last rows                 the review words the pretrained table lacks (learn)

``pe.table_from_pretrained`` lays the real rows (padding, pretrained words,
review words) onto the pretrained vectors and reports the coverage, which the
demo prints.

The classifier is ``PartialEmbedding`` -> masked mean -> ``Dense(1)``, trained
with ``MaskedOptimizer`` around a stock Keras optimizer. After training the
demo compares the bits of every frozen row (and of the optimizer's slots for
those rows) with what they were: if a single bit moved it says so and exits
with status 1. It then trains the same model with a stock
``keras.layers.Embedding`` and the bare optimizer on the same batches and
reports both step times.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

import numpy as np

if TYPE_CHECKING:
    from partial_embedding.pretrained import PretrainedCoverage

__all__ = [
    "BaselineOutcome",
    "DemoDataError",
    "DemoInputs",
    "DemoResult",
    "FrozenRowProof",
    "PartialOutcome",
    "check_frozen_rows",
    "load_inputs",
    "main",
    "parse_args",
    "run_demo",
    "train_baseline",
    "train_partial",
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
_UINT_OF_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}


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


# -- the frozen-row proof ------------------------------------------------------


def _bits(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    return array.view(_UINT_OF_SIZE[array.dtype.itemsize])


@dataclasses.dataclass
class FrozenRowProof:
    """The outcome of comparing a table's frozen rows with their reference bits."""

    frozen_rows: int
    moved_rows: list[int]
    trainable_rows: int
    updated_rows: int
    digest_before: str
    digest_after: str

    @property
    def passed(self) -> bool:
        return not self.moved_rows


def check_frozen_rows(
    reference: np.ndarray, final: np.ndarray, frozen_mask: np.ndarray
) -> FrozenRowProof:
    """Compares the bit patterns of ``final`` with ``reference``, row by row.

    Bits, not values: ``-0.0`` against ``0.0`` or a changed NaN payload counts
    as a moved row. Also counts the trainable rows that changed (the rows the
    optimizer updated) and hashes the frozen rows' bytes before and after.
    """
    if reference.shape != final.shape or reference.dtype != final.dtype:
        raise ValueError(
            f"the final table {final.shape} {final.dtype} does not match the "
            f"reference {reference.shape} {reference.dtype}"
        )
    reference_bits = _bits(reference).reshape(reference.shape[0], -1)
    final_bits = _bits(final).reshape(final.shape[0], -1)
    changed = np.any(reference_bits != final_bits, axis=1)
    frozen_mask = np.asarray(frozen_mask, dtype=bool)
    moved = np.flatnonzero(changed & frozen_mask)
    return FrozenRowProof(
        frozen_rows=int(frozen_mask.sum()),
        moved_rows=[int(row) for row in moved],
        trainable_rows=int((~frozen_mask).sum()),
        updated_rows=int((changed & ~frozen_mask).sum()),
        digest_before=hashlib.sha256(reference_bits[frozen_mask].tobytes()).hexdigest(),
        digest_after=hashlib.sha256(final_bits[frozen_mask].tobytes()).hexdigest(),
    )


# -- training -----------------------------------------------------------------


class ProgressBar:
    """A plain-text progress bar: redrawn in place on a terminal, one line per
    epoch otherwise (logs and test captures stay readable)."""

    def __init__(self, total: int, stream: TextIO, width: int = 24) -> None:
        self.total = total
        self.stream = stream
        self.width = width
        self.interactive = hasattr(stream, "isatty") and stream.isatty()

    def _line(self, prefix: str, done: int, suffix: str) -> str:
        filled = int(round(self.width * done / max(self.total, 1)))
        bar = "#" * filled + "." * (self.width - filled)
        return f"{prefix} [{bar}] {done:>3}/{self.total} {suffix}"

    def update(self, prefix: str, done: int, suffix: str) -> None:
        if self.interactive:
            self.stream.write("\r" + self._line(prefix, done, suffix))
            self.stream.flush()

    def finish(self, prefix: str, suffix: str, done: int | None = None) -> None:
        line = self._line(prefix, self.total if done is None else done, suffix)
        self.stream.write(("\r" if self.interactive else "") + line + "\n")
        self.stream.flush()


def text_curve(values: list[float], height: int = 6) -> list[str]:
    """A plain-text plot of ``values``: one column per value, high at the top."""
    if not values:
        return []
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    levels = [int(round((value - low) / span * (height - 1))) for value in values]
    lines = []
    for level in range(height - 1, -1, -1):
        label = (
            f"{high:7.4f}" if level == height - 1 else (f"{low:7.4f}" if level == 0 else " " * 7)
        )
        cells = "".join("*" if value_level == level else " " for value_level in levels)
        lines.append(f"{label} |{cells}")
    lines.append(" " * 8 + "+" + "-" * len(values) + f"  epochs 1..{len(values)}")
    return lines


def _make_optimizer(name: str, learning_rate: float) -> Any:
    import keras

    factories: dict[str, Callable[[], Any]] = {
        "adam": lambda: keras.optimizers.Adam(learning_rate),
        "adamw": lambda: keras.optimizers.AdamW(learning_rate, weight_decay=0.004),
        "sgd": lambda: keras.optimizers.SGD(learning_rate, momentum=0.9),
        "adagrad": lambda: keras.optimizers.Adagrad(learning_rate),
        "rmsprop": lambda: keras.optimizers.RMSprop(learning_rate),
    }
    return factories[name]()


def _build_classifier(embedding: Any, sequence_length: int, seed: int) -> Any:
    import keras

    ids = keras.Input((sequence_length,), dtype="int32", name="word_ids")
    vectors = embedding(ids)
    # The embedding layer's mask (mask_zero) makes this a mean over real words.
    sentence = keras.layers.GlobalAveragePooling1D(name="mean_of_words")(vectors)
    logit = keras.layers.Dense(
        1, kernel_initializer=keras.initializers.GlorotUniform(seed), name="head"
    )(sentence)
    return keras.Model(ids, logit)


def _build_variant(
    masked: bool,
    data: DemoTable,
    optimizer_name: str,
    learning_rate: float,
    sequence_length: int,
    seed: int,
) -> tuple[Any, Any, Any]:
    """The classifier, its embedding layer and its optimizer (built), both
    starting from ``data.table``: PartialEmbedding + MaskedOptimizer when
    ``masked``, else stock ``keras.layers.Embedding`` + the bare optimizer."""
    import keras

    import partial_embedding as pe

    num_rows, width = data.table.shape
    if masked:
        embedding = pe.PartialEmbedding(
            num_rows,
            width,
            trainable_ids=data.new_ids,
            mask_zero=True,
            weights=data.table,
            name="words",
        )
        optimizer = pe.MaskedOptimizer(_make_optimizer(optimizer_name, learning_rate))
    else:
        embedding = keras.layers.Embedding(num_rows, width, mask_zero=True, name="words")
        optimizer = _make_optimizer(optimizer_name, learning_rate)
    model = _build_classifier(embedding, sequence_length, seed)
    if not masked:
        embedding.embeddings.assign(data.table)
    optimizer.build(model.trainable_variables)
    return model, embedding, optimizer


def _compiled_train_step(
    model: Any, optimizer: Any, sequence_length: int
) -> Callable[[Any, Any], Any]:
    """One training step (binary cross-entropy on logits) as a tf.function."""
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
    variables = model.trainable_variables
    spec = [
        tf.TensorSpec([None, sequence_length], tf.int32),
        tf.TensorSpec([None, 1], tf.float32),
    ]

    @tf.function(input_signature=spec)
    def train_step(ids: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids, training=True))
        gradients = tape.gradient(loss, variables)
        optimizer.apply(gradients, variables)
        return loss

    return train_step


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
    """How many epochs of how many steps a run takes."""

    num_examples: int
    batch_size: int
    epochs: int
    max_steps: int | None = None

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.num_examples // self.batch_size)

    @property
    def num_epochs(self) -> int:
        """``epochs``, fewer where ``max_steps`` ends the run sooner."""
        if self.max_steps is None:
            return self.epochs
        return min(self.epochs, -(-self.max_steps // self.steps_per_epoch))

    def steps_in_epoch(self, steps_so_far: int) -> int:
        """The steps of the next epoch: all of them, fewer where ``max_steps`` ends it."""
        if self.max_steps is None:
            return self.steps_per_epoch
        return max(0, min(self.steps_per_epoch, self.max_steps - steps_so_far))

    def batch(self, order: np.ndarray, step: int) -> np.ndarray:
        """The rows of ``order`` that make up batch ``step`` of an epoch."""
        return order[step * self.batch_size : (step + 1) * self.batch_size]


class EpochProgress:
    """Shows a run's progress on a ``ProgressBar``: one bar per epoch."""

    def __init__(self, stream: TextIO, title: str, schedule: BatchSchedule) -> None:
        self.bar = ProgressBar(schedule.steps_per_epoch, stream)
        self.title = title
        self.epochs = schedule.num_epochs

    def _prefix(self, epoch: int) -> str:
        return f"{self.title} epoch {epoch:>3}/{self.epochs}"

    def step_done(self, epoch: int, step: int, loss: float) -> None:
        self.bar.update(self._prefix(epoch), step, f"loss {loss:.4f}")

    def epoch_done(self, epoch: int, steps: int, loss: float, step_ms: float) -> None:
        self.bar.finish(self._prefix(epoch), f"loss {loss:.4f}  {step_ms:7.2f} ms/step", done=steps)


def _timed_steps(step_seconds: list[float]) -> list[float]:
    """The steps whose times count: all but the first, which traces the function."""
    return step_seconds[1:] or step_seconds


def _timed_step(
    train_step: Callable[[Any, Any], Any], ids: np.ndarray, labels: np.ndarray
) -> tuple[float, float]:
    """Runs one step; its loss and its seconds."""
    import tensorflow as tf

    ids_tensor, labels_tensor = tf.constant(ids), tf.constant(labels)
    start = time.perf_counter()
    loss = float(train_step(ids_tensor, labels_tensor))  # float() waits for the step
    return loss, time.perf_counter() - start


def _run_epochs(
    train_step: Callable[[Any, Any], Any],
    train_ids: np.ndarray,
    train_labels: np.ndarray,
    schedule: BatchSchedule,
    seed: int,
    progress: EpochProgress | None,
) -> tuple[list[float], list[float]]:
    """Trains on shuffled batches; returns the mean loss per epoch and the
    seconds of every step."""
    rng = np.random.default_rng(seed)
    labels_column = train_labels.astype(np.float32)[:, None]
    epoch_losses: list[float] = []
    step_seconds: list[float] = []
    for epoch in range(1, schedule.num_epochs + 1):
        order = rng.permutation(len(train_ids))
        batch_losses = []
        for step in range(schedule.steps_in_epoch(len(step_seconds))):
            batch = schedule.batch(order, step)
            loss, seconds = _timed_step(train_step, train_ids[batch], labels_column[batch])
            step_seconds.append(seconds)
            batch_losses.append(loss)
            if progress is not None:
                progress.step_done(epoch, step + 1, loss)
        epoch_losses.append(float(np.mean(batch_losses)))
        if progress is not None:
            step_ms = statistics.median(_timed_steps(step_seconds)[-len(batch_losses) :]) * 1e3
            progress.epoch_done(epoch, len(batch_losses), epoch_losses[-1], step_ms)
    return epoch_losses, step_seconds


@dataclasses.dataclass
class TrainingRun:
    """What one training run measured."""

    epoch_losses: list[float]
    step_seconds: list[float]
    test_accuracy: float
    final_table: np.ndarray
    slot_checks: list[tuple[str, FrozenRowProof]]

    @property
    def median_step_seconds(self) -> float:
        return statistics.median(_timed_steps(self.step_seconds))


def _table_sized_slots(optimizer: Any, table_shape: tuple[int, ...]) -> list[Any]:
    """The optimizer's per-row state: slots shaped like the table, or the
    row -> slot-row map of compact slots."""
    seen, slots = set(), []
    candidates = list(optimizer.variables) + list(getattr(optimizer, "compact_slot_variables", []))
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        candidates += list(inner.variables)
    for variable in candidates:
        key = id(variable)
        # Full-size slots have the table's shape. Compact slots (the default
        # for a mostly frozen table) hold only trained rows; their row ->
        # slot-row map has one entry per row, and a frozen row's must stay
        # empty (-1).
        compact_map = "slot_of_row" in variable.name and tuple(variable.shape) == table_shape[:1]
        if key not in seen and (tuple(variable.shape) == table_shape or compact_map):
            seen.add(key)
            slots.append(variable)
    return slots


def _slot_snapshots(slots: list[Any]) -> list[tuple[str, np.ndarray]]:
    """Each slot's name and a copy of its values."""
    return [
        (slot.path if hasattr(slot, "path") else slot.name, np.array(slot.numpy()))
        for slot in slots
    ]


def _check_slots(
    slots: list[Any], snapshots: list[tuple[str, np.ndarray]], frozen_mask: np.ndarray
) -> list[tuple[str, FrozenRowProof]]:
    """Compares each slot's frozen rows with its snapshot."""
    return [
        (name, check_frozen_rows(reference, np.array(slot.numpy()), frozen_mask))
        for (name, reference), slot in zip(snapshots, slots)
    ]


def _accuracy(model: Any, ids: np.ndarray, labels: np.ndarray) -> float:
    """The share of ``ids`` whose logit has the sign of its label."""
    logits = model.predict(ids, verbose=0, batch_size=256)[:, 0]
    return float(np.mean((logits > 0).astype(np.int64) == labels))


def train(
    *,
    masked: bool,
    data: DemoTable,
    train_ids: np.ndarray,
    train_labels: np.ndarray,
    test_ids: np.ndarray,
    test_labels: np.ndarray,
    optimizer_name: str,
    learning_rate: float,
    epochs: int,
    batch_size: int,
    seed: int,
    stream: TextIO | None = None,
    title: str = "",
    max_steps: int | None = None,
) -> TrainingRun:
    """Trains the classifier with PartialEmbedding + MaskedOptimizer
    (``masked``) or with stock ``keras.layers.Embedding`` + the bare optimizer.

    Both see the same initial weights and the same batches in the same order.
    With ``max_steps``, training stops after that many steps (the stock
    baseline's steps cost the whole vocabulary, so it is only timed). With
    ``stream``, a progress bar titled ``title`` is drawn there.
    """
    sequence_length = train_ids.shape[1]
    model, embedding, optimizer = _build_variant(
        masked, data, optimizer_name, learning_rate, sequence_length, seed
    )
    slots = _table_sized_slots(optimizer, tuple(data.table.shape)) if masked else []
    snapshots = _slot_snapshots(slots)
    train_step = _compiled_train_step(model, optimizer, sequence_length)
    schedule = BatchSchedule(len(train_ids), batch_size, epochs, max_steps)
    progress = None if stream is None else EpochProgress(stream, title, schedule)
    epoch_losses, step_seconds = _run_epochs(
        train_step, train_ids, train_labels, schedule, seed, progress
    )
    return TrainingRun(
        epoch_losses=epoch_losses,
        step_seconds=step_seconds,
        test_accuracy=_accuracy(model, test_ids, test_labels),
        final_table=np.array(embedding.embeddings.numpy()),
        slot_checks=_check_slots(slots, snapshots, data.frozen_mask),
    )


# -- the command --------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=1_000_000,
        help="total rows of the table; rows beyond the real ones are synthetic frozen "
        "rows that stand for a large pretrained vocabulary (0: real rows only, 3,075). "
        "Default: %(default)s",
    )
    parser.add_argument(
        "--optimizer", choices=OPTIMIZERS, default="adam", help="default: %(default)s"
    )
    parser.add_argument("--learning-rate", type=float, default=None, help="default: per optimizer")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="where to train (default: %(default)s)",
    )
    parser.add_argument("--epochs", type=int, default=30, help="default: %(default)s")
    parser.add_argument("--batch-size", type=int, default=32, help="default: %(default)s")
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=0.2,
        help="held out, stratified (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--baseline-steps",
        type=int,
        default=20,
        help="steps of the stock keras.layers.Embedding run, which is only timed: each of "
        "its steps rewrites the whole table (default: %(default)s)",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the stock keras.layers.Embedding comparison",
    )
    parser.add_argument(
        "--data-dir", help="a folder with the two data files (default: gensim's test data)"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.baseline_steps < 2:
        parser.error("--epochs and --batch-size must be at least 1, --baseline-steps at least 2")
    if not 0.0 < args.test_fraction < 1.0:
        parser.error("--test-fraction must be in (0, 1)")
    if args.learning_rate is None:
        args.learning_rate = DEFAULT_LEARNING_RATES[args.optimizer]
    return args


def _device_scope(device: str) -> Any:
    import contextlib

    import tensorflow as tf

    if device == "auto":
        return contextlib.nullcontext()
    if device == "gpu" and not tf.config.list_logical_devices("GPU"):
        raise DemoDataError("--device gpu: TensorFlow sees no GPU on this machine")
    return tf.device("/GPU:0" if device == "gpu" else "/CPU:0")


# -- the run: each step computes a result, reporting is apart --------------------


@dataclasses.dataclass
class DemoInputs:
    """The demo's data as read, laid out as a table, encoded and split."""

    folder: Path
    num_pretrained_words: int
    num_sentences: int
    labels: np.ndarray  # [num_sentences], 1 = positive
    num_tokens: int
    num_covered_tokens: int  # tokens found in the pretrained vocabulary
    table: DemoTable
    ids: np.ndarray  # [num_sentences, longest], padded with PADDING_ID
    train_rows: np.ndarray
    test_rows: np.ndarray


def load_inputs(args: argparse.Namespace) -> DemoInputs:
    """Reads the data files and lays out the table as ``args`` asks.

    Raises:
      DemoDataError: the data files are not available.
    """
    folder = find_data_dir(args.data_dir)
    words, vectors = load_word_vectors(folder / PRETRAINED_FILE)
    sentences, labels = load_labeled_sentences(folder / REVIEWS_FILE)
    table = build_table(words, vectors, sentences, args.vocab_size, args.seed)
    train_rows, test_rows = split_train_test(labels, args.test_fraction, args.seed)
    tokens = [token for tokens in sentences for token in tokens]
    covered = sum(
        token in table.word_ids and table.word_ids[token] <= table.num_pretrained
        for token in tokens
    )
    return DemoInputs(
        folder=folder,
        num_pretrained_words=len(words),
        num_sentences=len(sentences),
        labels=labels,
        num_tokens=len(tokens),
        num_covered_tokens=covered,
        table=table,
        ids=encode_sentences(sentences, table.word_ids),
        train_rows=train_rows,
        test_rows=test_rows,
    )


def _train_variant(
    inputs: DemoInputs,
    args: argparse.Namespace,
    stream: TextIO,
    *,
    masked: bool,
    title: str,
    max_steps: int | None = None,
) -> tuple[TrainingRun, float]:
    """``train`` on the inputs' split, on ``args.device``; the run and its
    wall-clock seconds."""
    with _device_scope(args.device):
        started = time.perf_counter()
        run = train(
            masked=masked,
            data=inputs.table,
            train_ids=inputs.ids[inputs.train_rows],
            train_labels=inputs.labels[inputs.train_rows],
            test_ids=inputs.ids[inputs.test_rows],
            test_labels=inputs.labels[inputs.test_rows],
            optimizer_name=args.optimizer,
            learning_rate=args.learning_rate,
            epochs=args.epochs,
            batch_size=args.batch_size,
            seed=args.seed,
            stream=stream,
            title=title,
            max_steps=max_steps,
        )
        return run, time.perf_counter() - started


@dataclasses.dataclass
class PartialOutcome:
    """The PartialEmbedding run, how long it took, and its frozen-row proof."""

    run: TrainingRun
    seconds: float
    proof: FrozenRowProof

    @property
    def slot_failures(self) -> list[str]:
        """The optimizer slots whose frozen rows moved."""
        return [name for name, proof in self.run.slot_checks if not proof.passed]

    @property
    def passed(self) -> bool:
        """No frozen row of the table or of a slot moved."""
        return self.proof.passed and not self.slot_failures


def train_partial(inputs: DemoInputs, args: argparse.Namespace, stream: TextIO) -> PartialOutcome:
    """Trains with PartialEmbedding + MaskedOptimizer and checks every frozen row."""
    run, seconds = _train_variant(inputs, args, stream, masked=True, title="PartialEmbedding")
    table = inputs.table
    return PartialOutcome(
        run, seconds, check_frozen_rows(table.table, run.final_table, table.frozen_mask)
    )


@dataclasses.dataclass
class BaselineOutcome:
    """The stock ``keras.layers.Embedding`` run, which is only timed."""

    run: TrainingRun
    proof: FrozenRowProof  # which of the rows meant to stay frozen it moved
    speedup: float  # its median step time over PartialEmbedding's


def train_baseline(
    inputs: DemoInputs, args: argparse.Namespace, stream: TextIO, partial: TrainingRun
) -> BaselineOutcome:
    """Trains ``args.baseline_steps`` steps with the stock layer and compares
    its step time with ``partial``'s."""
    run, _ = _train_variant(
        inputs, args, stream, masked=False, title="keras Embedding ", max_steps=args.baseline_steps
    )
    table = inputs.table
    proof = check_frozen_rows(table.table, run.final_table, table.frozen_mask)
    return BaselineOutcome(run, proof, run.median_step_seconds / partial.median_step_seconds)


@dataclasses.dataclass
class DemoResult:
    """Everything one run of the demo computed."""

    args: argparse.Namespace
    inputs: DemoInputs
    partial: PartialOutcome
    baseline: BaselineOutcome | None

    def figures(self) -> dict[str, Any]:
        """The figures as ``run_demo`` returns them and ``--json`` writes them."""
        table, run, proof = self.inputs.table, self.partial.run, self.partial.proof
        figures: dict[str, Any] = {
            "vocab_size": table.num_rows,
            "width": table.width,
            "pretrained_rows": table.num_pretrained,
            "synthetic_rows": table.num_synthetic,
            "new_rows": table.num_new,
            "pretrained_fraction": (
                table.coverage.fraction_pretrained if table.coverage is not None else None
            ),
            "optimizer": self.args.optimizer,
            "learning_rate": self.args.learning_rate,
            "epochs": self.args.epochs,
            "batch_size": self.args.batch_size,
            "epoch_losses": run.epoch_losses,
            "test_accuracy": run.test_accuracy,
            "rows_updated": proof.updated_rows,
            "rows_trainable": proof.trainable_rows,
            "rows_frozen": proof.frozen_rows,
            "frozen_rows_moved": len(proof.moved_rows),
            "slots_checked": [name for name, _ in run.slot_checks],
            "slot_failures": self.partial.slot_failures,
            "proof_passed": self.partial.passed,
            "digest_before": proof.digest_before,
            "digest_after": proof.digest_after,
            "step_ms": run.median_step_seconds * 1e3,
        }
        if self.baseline is not None:
            stock = self.baseline.run
            figures.update(
                stock_step_ms=stock.median_step_seconds * 1e3,
                stock_epoch_losses=stock.epoch_losses,
                stock_test_accuracy=stock.test_accuracy,
                stock_frozen_rows_moved=len(self.baseline.proof.moved_rows),
                speedup_vs_stock=self.baseline.speedup,
            )
        return figures


# -- the report -----------------------------------------------------------------


def _write_lines(stream: TextIO, lines: list[str]) -> None:
    for line in lines:
        stream.write(line + "\n")
    stream.flush()


def _runtime_description() -> str:
    import keras
    import tensorflow as tf

    devices = ", ".join(d.name for d in tf.config.list_logical_devices())
    return f"TensorFlow {tf.__version__}, Keras {keras.__version__}, devices: {devices}"


def report_inputs(inputs: DemoInputs, args: argparse.Namespace, stream: TextIO) -> None:
    """The versions, the data, the table's layout and the training setting."""
    table, labels = inputs.table, inputs.labels
    coverage = 100.0 * inputs.num_covered_tokens / inputs.num_tokens
    _write_lines(
        stream,
        [
            f"partial_embedding demo: {_runtime_description()}",
            f"data: {inputs.folder}",
            f"  pretrained: {PRETRAINED_FILE}: {inputs.num_pretrained_words:,} words x "
            f"{table.width} (fastText, trained on news)",
            f"  reviews:    {REVIEWS_FILE}: {inputs.num_sentences} sentences "
            f"({int(labels.sum())} positive, {int((labels == 0).sum())} negative), "
            f"{inputs.num_tokens:,} tokens, {coverage:.0f}% of them in the pretrained vocabulary",
            f"table: {table.num_rows:,} rows x {table.width} = 1 padding + "
            f"{table.num_pretrained:,} pretrained + {table.num_synthetic:,} synthetic + "
            f"{table.num_new:,} new review words",
            f"  learn: {table.num_new:,} new rows (e.g. {', '.join(table.new_words[100:105])}) "
            f"and the head; frozen: {int(table.frozen_mask.sum()):,} rows",
            f"  pe.table_from_pretrained on the real rows: {table.coverage}",
            f"training: {len(inputs.train_rows)} sentences ({len(inputs.test_rows)} held out), "
            f"batch {args.batch_size}, {args.epochs} epochs, "
            f"MaskedOptimizer({args.optimizer}, learning rate {args.learning_rate})",
        ],
    )


def _proof_lines(partial: PartialOutcome) -> list[str]:
    proof = partial.proof
    lines = [
        f"rows: {proof.updated_rows:,} of {proof.trainable_rows:,} trainable rows updated, "
        f"{proof.frozen_rows:,} frozen",
        f"frozen-row proof: compared the bits of all {proof.frozen_rows:,} frozen rows with the "
        f"pretrained table as read from {PRETRAINED_FILE} (synthetic and padding rows as built)",
        f"  sha256 before: {proof.digest_before}",
        f"  sha256 after:  {proof.digest_after}",
    ]
    for name, slot_proof in partial.run.slot_checks:
        moved = len(slot_proof.moved_rows)
        state = "unchanged" if slot_proof.passed else f"CHANGED in {moved:,} rows"
        lines.append(f"  optimizer slot {name}: frozen rows {state}")
    if partial.passed:
        lines.append(
            f"  PASSED: all {proof.frozen_rows:,} frozen rows are bit-identical to the "
            "pretrained ones"
        )
    return lines


def report_partial(partial: PartialOutcome, inputs: DemoInputs, stream: TextIO) -> None:
    """The loss curve, the held-out accuracy and the frozen-row proof."""
    losses = partial.run.epoch_losses
    _write_lines(
        stream,
        [
            "",
            "loss curve (mean training loss per epoch):",
            *("  " + line for line in text_curve(losses)),
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; held-out accuracy "
            f"{partial.run.test_accuracy:.2f} on {len(inputs.test_rows)} sentences; "
            f"{partial.seconds:.1f} s",
            "",
            *_proof_lines(partial),
        ],
    )


def report_baseline_start(stream: TextIO) -> None:
    """Announces the stock baseline, whose progress bar follows."""
    _write_lines(
        stream,
        [
            "",
            "the same model with stock keras.layers.Embedding (every row trains) and the "
            "bare optimizer:",
        ],
    )


def report_baseline(
    baseline: BaselineOutcome,
    partial: TrainingRun,
    table: DemoTable,
    args: argparse.Namespace,
    stream: TextIO,
) -> None:
    """What the stock run did to the frozen rows, and both step times."""
    stock, proof = baseline.run, baseline.proof
    times = [
        (f"PartialEmbedding + MaskedOptimizer({args.optimizer})", partial.median_step_seconds),
        (f"keras.layers.Embedding + {args.optimizer}", stock.median_step_seconds),
    ]
    label_width = max(len(label) for label, _ in times)
    verdict = (
        "faster"
        if baseline.speedup >= 1
        else "slower: at this table size per-step overheads dominate"
    )
    _write_lines(
        stream,
        [
            f"  stock, {len(stock.step_seconds)} steps: loss {stock.epoch_losses[0]:.4f} -> "
            f"{stock.epoch_losses[-1]:.4f}; it changed {len(proof.moved_rows):,} of the "
            f"{proof.frozen_rows:,} rows meant to stay frozen",
            "",
            f"median step time (first step left out) at V = {table.num_rows:,}, "
            f"D = {table.width}, batch {args.batch_size}:",
            *(f"  {label:<{label_width}} {seconds * 1e3:9.2f} ms" for label, seconds in times),
            f"  PartialEmbedding is {baseline.speedup:.1f}x {verdict}",
        ],
    )


def report_failure(partial: PartialOutcome, stream: TextIO) -> None:
    """Says loudly, on ``stream`` and on stderr, which frozen rows moved."""
    moved = partial.proof.moved_rows
    message = (
        f"FROZEN-ROW PROOF FAILED: {len(moved):,} frozen rows changed "
        f"(first: {moved[:5]}); optimizer slots changed: {partial.slot_failures or 'none'}"
    )
    _write_lines(stream, [message])
    print(message, file=sys.stderr)


def run_demo(args: argparse.Namespace, stream: TextIO = sys.stdout) -> dict[str, Any]:
    """Runs the demo, prints its report to ``stream``, returns the figures.

    Raises:
      DemoDataError: the data files are not available.
    """
    inputs = load_inputs(args)
    report_inputs(inputs, args, stream)
    partial = train_partial(inputs, args, stream)
    report_partial(partial, inputs, stream)
    baseline = None
    if not args.no_baseline:
        report_baseline_start(stream)
        baseline = train_baseline(inputs, args, stream, partial.run)
        report_baseline(baseline, partial.run, inputs.table, args, stream)
    figures = DemoResult(args, inputs, partial, baseline).figures()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    if not partial.passed:
        report_failure(partial, stream)
    return figures


def main(argv: list[str] | None = None) -> int:
    """The command line entry point; returns the exit status (1: a frozen row moved).

    ``--lm`` runs the language-model demo instead (``partial_embedding.demo_lm``).
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    if "--lm" in arguments:
        from partial_embedding import demo_lm

        return demo_lm.main(arguments)
    args = parse_args(argv)
    try:
        result = run_demo(args)
    except DemoDataError as error:
        print(f"partial_embedding.demo: {error}", file=sys.stderr)
        return 2
    return 0 if result["proof_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
