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
from typing import Any, Callable, TextIO

import numpy as np

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

    @property
    def num_rows(self) -> int:
        return int(self.table.shape[0])

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

    New and synthetic rows are drawn from a normal distribution with the
    pretrained vectors' standard deviation, so they start on the same scale.

    Raises:
      ValueError: ``vocab_size`` is positive but smaller than the real rows.
    """
    rng = np.random.default_rng(seed)
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
    num_rows = max(vocab_size, real_rows)
    num_synthetic = num_rows - real_rows
    scale = float(pretrained_vectors.std())
    table = np.zeros((num_rows, width), dtype=np.float32)
    table[1 : 1 + num_pretrained] = pretrained_vectors
    table[1 + num_pretrained :] = (
        rng.standard_normal((num_rows - 1 - num_pretrained, width)) * scale
    ).astype(np.float32)
    frozen_mask = np.ones(num_rows, dtype=bool)
    first_new = num_rows - len(new_words)
    frozen_mask[first_new:] = False
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
        # The first step traces the function: leave it out.
        timed = self.step_seconds[1:] or self.step_seconds
        return statistics.median(timed)


def _table_sized_slots(optimizer: Any, table_shape: tuple[int, ...]) -> list[Any]:
    """The optimizer variables shaped like the table: its per-row slots."""
    seen, slots = set(), []
    candidates = list(optimizer.variables)
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        candidates += list(inner.variables)
    for variable in candidates:
        key = id(variable)
        if key not in seen and tuple(variable.shape) == table_shape:
            seen.add(key)
            slots.append(variable)
    return slots


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
    stream: TextIO,
    title: str,
    max_steps: int | None = None,
) -> TrainingRun:
    """Trains the classifier with PartialEmbedding + MaskedOptimizer
    (``masked``) or with stock ``keras.layers.Embedding`` + the bare optimizer.

    Both see the same initial weights and the same batches in the same order.
    With ``max_steps``, training stops after that many steps (the stock
    baseline's steps cost the whole vocabulary, so it is only timed).
    """
    import keras
    import tensorflow as tf

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
    model = _build_classifier(embedding, train_ids.shape[1], seed)
    if not masked:
        embedding.embeddings.assign(data.table)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
    variables = model.trainable_variables
    optimizer.build(variables)

    slots = _table_sized_slots(optimizer, tuple(data.table.shape)) if masked else []
    slot_references = [
        (slot.path if hasattr(slot, "path") else slot.name, np.array(slot.numpy()))
        for slot in slots
    ]

    spec = [
        tf.TensorSpec([None, train_ids.shape[1]], tf.int32),
        tf.TensorSpec([None, 1], tf.float32),
    ]

    @tf.function(input_signature=spec)
    def train_step(ids: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids, training=True))
        gradients = tape.gradient(loss, variables)
        optimizer.apply(gradients, variables)
        return loss

    rng = np.random.default_rng(seed)
    steps_per_epoch = -(-len(train_ids) // batch_size)
    bar = ProgressBar(steps_per_epoch, stream)
    epoch_losses: list[float] = []
    step_seconds: list[float] = []
    labels_column = train_labels.astype(np.float32)[:, None]
    if max_steps is not None:
        epochs = min(epochs, -(-max_steps // steps_per_epoch))
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(train_ids))
        batch_losses = []
        prefix = f"{title} epoch {epoch:>3}/{epochs}"
        for step in range(steps_per_epoch):
            if max_steps is not None and len(step_seconds) >= max_steps:
                break
            batch = order[step * batch_size : (step + 1) * batch_size]
            ids = tf.constant(train_ids[batch])
            labels = tf.constant(labels_column[batch])
            start = time.perf_counter()
            loss = float(train_step(ids, labels))  # float() waits for the step
            step_seconds.append(time.perf_counter() - start)
            batch_losses.append(loss)
            bar.update(prefix, step + 1, f"loss {loss:.4f}")
        epoch_losses.append(float(np.mean(batch_losses)))
        timed = step_seconds[1:] or step_seconds
        epoch_step_ms = statistics.median(timed[-len(batch_losses) :]) * 1e3
        bar.finish(
            prefix,
            f"loss {epoch_losses[-1]:.4f}  {epoch_step_ms:7.2f} ms/step",
            done=len(batch_losses),
        )
    logits = model.predict(test_ids, verbose=0, batch_size=256)[:, 0]
    accuracy = float(np.mean((logits > 0).astype(np.int64) == test_labels))
    final_table = np.array(embedding.embeddings.numpy())
    frozen = data.frozen_mask
    slot_checks = [
        (name, check_frozen_rows(reference, np.array(slot.numpy()), frozen))
        for (name, reference), slot in zip(slot_references, slots)
    ]
    return TrainingRun(epoch_losses, step_seconds, accuracy, final_table, slot_checks)


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


def run_demo(args: argparse.Namespace, stream: TextIO = sys.stdout) -> dict[str, Any]:
    """Runs the demo, prints its report to ``stream``, returns the figures.

    Raises:
      DemoDataError: the data files are not available.
    """

    def say(text: str = "") -> None:
        stream.write(text + "\n")
        stream.flush()

    folder = find_data_dir(args.data_dir)
    words, vectors = load_word_vectors(folder / PRETRAINED_FILE)
    sentences, labels = load_labeled_sentences(folder / REVIEWS_FILE)
    data = build_table(words, vectors, sentences, args.vocab_size, args.seed)
    ids = encode_sentences(sentences, data.word_ids)
    train_rows, test_rows = split_train_test(labels, args.test_fraction, args.seed)
    tokens = [token for tokens in sentences for token in tokens]
    covered = sum(
        token in data.word_ids and data.word_ids[token] <= data.num_pretrained for token in tokens
    )

    import keras
    import tensorflow as tf

    devices = ", ".join(d.name for d in tf.config.list_logical_devices())
    say(
        f"partial_embedding demo: TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"devices: {devices}"
    )
    say(f"data: {folder}")
    say(
        f"  pretrained: {PRETRAINED_FILE}: {len(words):,} words x {vectors.shape[1]} "
        "(fastText, trained on news)"
    )
    say(
        f"  reviews:    {REVIEWS_FILE}: {len(sentences)} sentences ({int(labels.sum())} positive, "
        f"{int((labels == 0).sum())} negative), {len(tokens):,} tokens, "
        f"{100.0 * covered / len(tokens):.0f}% of them in the pretrained vocabulary"
    )
    say(
        f"table: {data.num_rows:,} rows x {data.table.shape[1]} = 1 padding + "
        f"{data.num_pretrained:,} pretrained + {data.num_synthetic:,} synthetic + "
        f"{data.num_new:,} new review words"
    )
    say(
        f"  learn: {data.num_new:,} new rows (e.g. {', '.join(data.new_words[100:105])}) "
        f"and the head; frozen: {int(data.frozen_mask.sum()):,} rows"
    )
    say(
        f"training: {len(train_rows)} sentences ({len(test_rows)} held out), "
        f"batch {args.batch_size}, {args.epochs} epochs, "
        f"MaskedOptimizer({args.optimizer}, learning rate {args.learning_rate})"
    )

    common = dict(
        data=data,
        train_ids=ids[train_rows],
        train_labels=labels[train_rows],
        test_ids=ids[test_rows],
        test_labels=labels[test_rows],
        optimizer_name=args.optimizer,
        learning_rate=args.learning_rate,
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        stream=stream,
    )
    with _device_scope(args.device):
        started = time.perf_counter()
        partial = train(masked=True, title="PartialEmbedding", **common)
        partial_seconds = time.perf_counter() - started

    say()
    say("loss curve (mean training loss per epoch):")
    for line in text_curve(partial.epoch_losses):
        say("  " + line)
    say(
        f"loss {partial.epoch_losses[0]:.4f} -> {partial.epoch_losses[-1]:.4f}; held-out accuracy "
        f"{partial.test_accuracy:.2f} on {len(test_rows)} sentences; {partial_seconds:.1f} s"
    )

    proof = check_frozen_rows(data.table, partial.final_table, data.frozen_mask)
    say()
    say(
        f"rows: {proof.updated_rows:,} of {proof.trainable_rows:,} trainable rows updated, "
        f"{proof.frozen_rows:,} frozen"
    )
    say(
        f"frozen-row proof: compared the bits of all {proof.frozen_rows:,} frozen rows with the "
        f"pretrained table as read from {PRETRAINED_FILE} (synthetic and padding rows as built)"
    )
    say(f"  sha256 before: {proof.digest_before}")
    say(f"  sha256 after:  {proof.digest_after}")
    slot_failures = []
    for name, slot_proof in partial.slot_checks:
        say(
            f"  optimizer slot {name}: frozen rows "
            + (
                "unchanged"
                if slot_proof.passed
                else f"CHANGED in {len(slot_proof.moved_rows):,} rows"
            )
        )
        if not slot_proof.passed:
            slot_failures.append(name)
    if proof.passed and not slot_failures:
        say(
            f"  PASSED: all {proof.frozen_rows:,} frozen rows are bit-identical to the "
            "pretrained ones"
        )

    result: dict[str, Any] = {
        "vocab_size": data.num_rows,
        "width": int(data.table.shape[1]),
        "pretrained_rows": data.num_pretrained,
        "synthetic_rows": data.num_synthetic,
        "new_rows": data.num_new,
        "optimizer": args.optimizer,
        "learning_rate": args.learning_rate,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "epoch_losses": partial.epoch_losses,
        "test_accuracy": partial.test_accuracy,
        "rows_updated": proof.updated_rows,
        "rows_trainable": proof.trainable_rows,
        "rows_frozen": proof.frozen_rows,
        "frozen_rows_moved": len(proof.moved_rows),
        "slots_checked": [name for name, _ in partial.slot_checks],
        "slot_failures": slot_failures,
        "proof_passed": proof.passed and not slot_failures,
        "digest_before": proof.digest_before,
        "digest_after": proof.digest_after,
        "step_ms": partial.median_step_seconds * 1e3,
    }

    if not args.no_baseline:
        say()
        say(
            "the same model with stock keras.layers.Embedding (every row trains) and the "
            "bare optimizer:"
        )
        with _device_scope(args.device):
            stock = train(
                masked=False, title="keras Embedding ", max_steps=args.baseline_steps, **common
            )
        stock_proof = check_frozen_rows(data.table, stock.final_table, data.frozen_mask)
        ratio = stock.median_step_seconds / partial.median_step_seconds
        say(
            f"  stock, {len(stock.step_seconds)} steps: loss {stock.epoch_losses[0]:.4f} -> "
            f"{stock.epoch_losses[-1]:.4f}; it changed {len(stock_proof.moved_rows):,} of the "
            f"{stock_proof.frozen_rows:,} rows meant to stay frozen"
        )
        say()
        say(
            f"median step time (first step left out) at V = {data.num_rows:,}, "
            f"D = {data.table.shape[1]}, batch {args.batch_size}:"
        )
        labels_and_times = [
            (f"PartialEmbedding + MaskedOptimizer({args.optimizer})", partial.median_step_seconds),
            (f"keras.layers.Embedding + {args.optimizer}", stock.median_step_seconds),
        ]
        label_width = max(len(label) for label, _ in labels_and_times)
        for label, seconds in labels_and_times:
            say(f"  {label:<{label_width}} {seconds * 1e3:9.2f} ms")
        verdict = (
            "faster" if ratio >= 1 else "slower: at this table size per-step overheads dominate"
        )
        say(f"  PartialEmbedding is {ratio:.1f}x {verdict}")
        result.update(
            stock_step_ms=stock.median_step_seconds * 1e3,
            stock_epoch_losses=stock.epoch_losses,
            stock_test_accuracy=stock.test_accuracy,
            stock_frozen_rows_moved=len(stock_proof.moved_rows),
            speedup_vs_stock=ratio,
        )

    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)

    if not result["proof_passed"]:
        first = proof.moved_rows[:5]
        message = (
            f"FROZEN-ROW PROOF FAILED: {len(proof.moved_rows):,} frozen rows changed "
            f"(first: {first}); optimizer slots changed: {slot_failures or 'none'}"
        )
        say(message)
        print(message, file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    """The command line entry point; returns the exit status (1: a frozen row moved)."""
    args = parse_args(argv)
    try:
        result = run_demo(args)
    except DemoDataError as error:
        print(f"partial_embedding.demo: {error}", file=sys.stderr)
        return 2
    return 0 if result["proof_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
