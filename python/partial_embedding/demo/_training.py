"""The sentiment demo's training: the classifier, the batches, the loop and the frozen-row proof.

``train`` trains one variant and returns a ``TrainingRun``;
``check_frozen_rows`` compares the bits of every frozen row with what they were.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, TextIO

import numpy as np

if TYPE_CHECKING:
    pass

from partial_embedding.demo._data import (
    DemoTable,
)

__all__ = [
    "BatchSchedule",
    "EpochProgress",
    "FrozenRowProof",
    "ProgressBar",
    "TrainingRun",
    "check_frozen_rows",
    "text_curve",
    "train",
]

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


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
    optimizer_name: str | None,
    learning_rate: float | None,
    sequence_length: int,
    seed: int,
    quantized: bool = False,
    inner_optimizer: Any | None = None,
) -> tuple[Any, Any, Any]:
    """The classifier, its embedding layer and its optimizer (built), both
    starting from ``data.table``: PartialEmbedding + MaskedOptimizer when
    ``masked`` (its frozen rows in int8 when ``quantized``), else stock
    ``keras.layers.Embedding`` + the bare optimizer. The optimizer is
    ``inner_optimizer`` where given, else ``optimizer_name`` at ``learning_rate``."""
    import keras

    import partial_embedding as pe

    if inner_optimizer is None:
        if optimizer_name is None or learning_rate is None:
            raise ValueError("train: give optimizer, or optimizer_name and learning_rate")
        inner_optimizer = _make_optimizer(optimizer_name, learning_rate)
    num_rows, width = data.table.shape
    if masked:
        embedding = pe.PartialEmbedding(
            num_rows,
            width,
            trainable_ids=data.new_ids,
            mask_zero=True,
            weights=data.table,
            name="words",
            dtype="int8_from_float32" if quantized else None,
        )
        optimizer = pe.MaskedOptimizer(inner_optimizer)
    else:
        embedding = keras.layers.Embedding(num_rows, width, mask_zero=True, name="words")
        optimizer = inner_optimizer
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
    #: With int8 frozen rows: the proofs of the int8 rows and of their scales.
    quantized_checks: list[tuple[str, FrozenRowProof]] = dataclasses.field(default_factory=list)

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


def _quantized_snapshots(embedding: Any) -> list[tuple[str, np.ndarray]]:
    """Copies of a quantized layer's int8 rows and scales (as ``[V, 1]``)."""
    scales = np.array(embedding.embeddings_scale.numpy())[:, None]
    return [("int8 rows", np.array(embedding.embeddings.numpy())), ("scales", scales)]


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
    optimizer_name: str | None = None,
    learning_rate: float | None = None,
    epochs: int,
    batch_size: int,
    seed: int,
    stream: TextIO | None = None,
    title: str = "",
    max_steps: int | None = None,
    quantized: bool = False,
    optimizer: Any | None = None,
) -> TrainingRun:
    """Trains the classifier with PartialEmbedding + MaskedOptimizer
    (``masked``; with ``quantized``, its frozen rows in int8, built with
    ``dtype="int8_from_float32"``) or with stock ``keras.layers.Embedding`` +
    the bare optimizer.

    Both see the same initial weights and the same batches in the same order.
    With ``max_steps``, training stops after that many steps (the stock
    baseline's steps cost the whole vocabulary, so it is only timed). With
    ``stream``, a progress bar titled ``title`` is drawn there. The optimizer
    is ``optimizer_name`` at ``learning_rate``, or ``optimizer`` (a fresh,
    unbuilt Keras optimizer, wrapped in ``MaskedOptimizer`` where ``masked``).

    Raises:
      ValueError: Neither ``optimizer`` nor both ``optimizer_name`` and
        ``learning_rate`` are given.
    """
    sequence_length = train_ids.shape[1]
    model, embedding, optimizer = _build_variant(
        masked, data, optimizer_name, learning_rate, sequence_length, seed, quantized, optimizer
    )
    slots = _table_sized_slots(optimizer, tuple(data.table.shape)) if masked else []
    snapshots = _slot_snapshots(slots)
    quantized_before = _quantized_snapshots(embedding) if quantized else []
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
        quantized_checks=[
            (name, check_frozen_rows(before, after, data.frozen_mask))
            for (name, before), (_, after) in zip(
                quantized_before, _quantized_snapshots(embedding) if quantized else []
            )
        ],
    )
