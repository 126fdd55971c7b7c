"""New tokens in a tied language model: ``python -m partial_embedding.demo --lm``.

A small causal language model whose input and output embeddings are one tied
table (``PartialReversibleEmbedding``, the drop-in for Keras'
``ReversibleEmbedding``) is "pretrained" (random weights, fixed seed: nothing
is downloaded) on a vocabulary of 32,768 rows. The demo adds new tokens, words
of a text that Python itself ships (the documentation topics of
``pydoc_data``) that the pretrained vocabulary lacks, and trains only their
rows with ``MaskedOptimizer(Adam)``: the rest of the model stays as it was. It
then proves that every old row is bit-identical, writes the trained rows to a
small safetensors file, loads that file into a freshly built model on the same
pretrained weights and shows that the two models give identical outputs.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

__all__ = ["LanguageModelDemo", "main", "parse_args", "report", "run_lm_demo"]

#: Rows of the "pretrained" vocabulary (real words first, then filler rows).
PRETRAINED_ROWS = 32_768


def _corpus_words() -> list[str]:
    """The words of the documentation topics that Python ships, in order."""
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics))
    return re.findall(r"[a-z]+", text.lower())


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The pretrained rows, the new tokens appended after them, and the text as ids."""

    tokens: list[str]
    pretrained_rows: int
    new_ids: np.ndarray
    ids: np.ndarray

    @property
    def size(self) -> int:
        return len(self.tokens)


def build_vocabulary(new_tokens: int, pretrained_rows: int = PRETRAINED_ROWS) -> Vocabulary:
    """Words of the corpus by frequency; the ``new_tokens`` least frequent of
    those seen at least 3 times become the new rows, the others the start of
    the pretrained vocabulary (padded with filler rows to ``pretrained_rows``)."""
    words = _corpus_words()
    counts = collections.Counter(words)
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    frequent = [w for w in ranked if counts[w] >= 3]
    if new_tokens >= len(frequent):
        raise ValueError(f"new_tokens: at most {len(frequent) - 1}, got {new_tokens}")
    new = frequent[-new_tokens:] if new_tokens else []
    new_set = set(new)
    pretrained = ["<unk>"] + [w for w in ranked if w not in new_set]
    if len(pretrained) > pretrained_rows:
        pretrained = pretrained[:pretrained_rows]
    pretrained += [f"<pretrained_{i}>" for i in range(len(pretrained), pretrained_rows)]
    tokens = pretrained + new
    index = {token: row for row, token in enumerate(tokens)}
    ids = np.array([index.get(w, 0) for w in words], dtype=np.int32)
    new_ids = np.arange(pretrained_rows, pretrained_rows + len(new), dtype=np.int64)
    return Vocabulary(tokens, pretrained_rows, new_ids, ids)


def _windows(vocabulary: Vocabulary, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Training windows that contain at least one new token: inputs and next ids."""
    ids = vocabulary.ids
    is_new = ids >= vocabulary.pretrained_rows
    starts = [
        s for s in range(0, len(ids) - length - 1, length // 2) if is_new[s : s + length + 1].any()
    ]
    x = np.stack([ids[s : s + length] for s in starts])
    y = np.stack([ids[s + 1 : s + length + 1] for s in starts])
    return x, y


def build_model(
    vocab_size: int, pretrained_rows: int, width: int, new_ids: np.ndarray, seed: int
) -> tuple[Any, Any, np.ndarray]:
    """The "pretrained" model: the same weights for the same seed, new rows
    initialized to the mean of the pretrained ones; only new rows train."""
    import keras

    import partial_embedding as pe

    rng = np.random.default_rng(seed)
    table = np.empty((vocab_size, width), np.float32)
    table[:pretrained_rows] = rng.normal(0.0, 0.05, size=(pretrained_rows, width))
    table[pretrained_rows:] = table[:pretrained_rows].mean(axis=0)
    embedding = pe.PartialReversibleEmbedding(
        vocab_size, width, trainable_ids=new_ids, weights=table, name="tokens"
    )
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None,), dtype="int32")
    hidden = embedding(inputs)
    # Causal: each position sees itself and the three before it.
    hidden = keras.layers.Conv1D(width, 4, padding="causal", activation="gelu", name="mix")(hidden)
    hidden = keras.layers.Dense(width, name="out")(hidden)
    logits = embedding(hidden, reverse=True)
    model = keras.Model(inputs, logits)
    for layer in model.layers:
        if layer is not embedding:
            layer.trainable = False
    return model, embedding, table


@dataclasses.dataclass
class LanguageModelDemo:
    """What the language-model demo measured."""

    vocab_size: int
    new_tokens: int
    width: int
    losses: list[float]
    step_ms: float
    old_rows_moved: int
    new_rows_moved: int
    file_bytes: int
    table_bytes: int
    max_output_difference: float
    outputs_identical: bool
    #: Before training, on the first windows: the float model's loss, the
    #: same model with int8 frozen rows, and how often their top-1 agree.
    float_loss: float = float("nan")
    int8_loss: float = float("nan")
    int8_top1_agreement: float = float("nan")

    @property
    def passed(self) -> bool:
        return (
            self.old_rows_moved == 0
            and self.new_rows_moved > 0
            and self.outputs_identical
            and self.losses[-1] < self.losses[0]
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


def int8_comparison(
    model: Any, embedding: Any, x: np.ndarray, y: np.ndarray, windows: int = 256
) -> tuple[float, float, float]:
    """(float loss, int8 loss, top-1 agreement) of the tied logits on the first
    ``windows`` windows: ``model`` as it is, then with its embedding's frozen
    rows in int8 (a copy of the model; the new rows stay float)."""
    import keras

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    probe_x, probe_y = x[:windows], y[:windows]
    float_logits = model.predict(probe_x, verbose=0)
    quantized = keras.models.clone_model(model)
    quantized.set_weights(model.get_weights())
    quantized.quantize("int8", filters=embedding.name)
    int8_logits = quantized.predict(probe_x, verbose=0)
    agreement = float(np.mean(float_logits.argmax(-1) == int8_logits.argmax(-1)))
    return float(loss(probe_y, float_logits)), float(loss(probe_y, int8_logits)), agreement


def run_lm_demo(args: argparse.Namespace, stream: TextIO | None = sys.stdout) -> LanguageModelDemo:
    """Trains the new tokens' rows, proves the old rows untouched, round-trips the rows."""
    import keras

    import partial_embedding as pe

    vocabulary = build_vocabulary(args.new_tokens)
    model, embedding, table = build_model(
        vocabulary.size, vocabulary.pretrained_rows, args.width, vocabulary.new_ids, args.seed
    )
    x, y = _windows(vocabulary, args.length)
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(args.learning_rate))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    float_loss, int8_loss, agreement = int8_comparison(model, embedding, x, y)
    before = embedding.embeddings.numpy().copy()
    losses, seconds = [], []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        history = model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0)
        seconds.append((time.perf_counter() - start) / max(1, -(-len(x) // args.batch_size)))
        losses.append(float(history.history["loss"][-1]))
        if stream is not None:
            print(f"  epoch {epoch + 1}: loss {losses[-1]:.4f}", file=stream, flush=True)
    after = embedding.embeddings.numpy()
    old = slice(0, vocabulary.pretrained_rows)
    old_moved = int(np.any(before[old].view(np.uint32) != after[old].view(np.uint32), axis=1).sum())
    new_moved = int(
        np.any(
            before[vocabulary.pretrained_rows :] != after[vocabulary.pretrained_rows :], axis=1
        ).sum()
    )

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "new_tokens.safetensors")
        pe.save_trained_rows(path, embedding)
        file_bytes = os.path.getsize(path)
        fresh, fresh_embedding, _ = build_model(
            vocabulary.size, vocabulary.pretrained_rows, args.width, vocabulary.new_ids, args.seed
        )
        pe.load_trained_rows(path, fresh_embedding)
    probe = x[: min(len(x), 8)]
    expected = model.predict(probe, verbose=0)
    actual = fresh.predict(probe, verbose=0)
    difference = float(np.max(np.abs(expected - actual)))
    identical = bool(np.array_equal(expected.view(np.uint32), actual.view(np.uint32)))
    return LanguageModelDemo(
        vocab_size=vocabulary.size,
        new_tokens=len(vocabulary.new_ids),
        width=args.width,
        losses=losses,
        step_ms=1e3 * float(np.median(seconds)),
        old_rows_moved=old_moved,
        new_rows_moved=new_moved,
        file_bytes=file_bytes,
        table_bytes=table.nbytes,
        max_output_difference=difference,
        outputs_identical=identical,
        float_loss=float_loss,
        int8_loss=int8_loss,
        int8_top1_agreement=agreement,
    )


def report(result: LanguageModelDemo, stream: TextIO = sys.stdout) -> None:
    """Prints what the demo proved."""
    lines = [
        f"tied language model: {result.vocab_size:,} rows x {result.width} "
        f"({result.vocab_size - result.new_tokens:,} pretrained, {result.new_tokens} new tokens)",
        f"  loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f} over {len(result.losses)} "
        f"epochs, {result.step_ms:.1f} ms per step",
        f"  pretrained rows changed: {result.old_rows_moved:,} (bit for bit); new rows trained: "
        f"{result.new_rows_moved}",
        f"  trained-rows file: {result.file_bytes:,} bytes = "
        f"{100 * result.file_bytes / result.table_bytes:.2f} % of the table's "
        f"{result.table_bytes:,}",
        f"  a fresh model + that file: outputs identical bit for bit: {result.outputs_identical} "
        f"(largest difference {result.max_output_difference:g})",
        f"  frozen rows in int8 (before training, tied logits): loss {result.int8_loss:.4f} "
        f"(float {result.float_loss:.4f}), top-1 agreement "
        f"{100 * result.int8_top1_agreement:.1f} %",
        "PASSED" if result.passed else "FAILED",
    ]
    print("\n".join(lines), file=stream, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.demo --lm", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--lm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the demo; exit status 0 when every check passed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = run_lm_demo(parse_args(argv))
    report(result)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
