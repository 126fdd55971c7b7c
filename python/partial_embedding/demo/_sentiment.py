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

With ``--int8`` it also trains the model with its frozen rows in int8 (one
scale per row; ``PartialEmbedding(..., dtype="int8_from_float32")`` from the
same float table, the new rows training in float) on the same batches, and
prints its held-out accuracy next to the float run's, with the proof that
the frozen rows' int8 bytes and scales did not move.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

if TYPE_CHECKING:
    pass

from partial_embedding.demo._data import (
    DEFAULT_LEARNING_RATES,
    OPTIMIZERS,
    PRETRAINED_FILE,
    REVIEWS_FILE,
    DemoDataError,
    DemoTable,
    build_table,
    encode_sentences,
    find_data_dir,
    load_labeled_sentences,
    load_word_vectors,
    split_train_test,
)
from partial_embedding.demo._training import (
    FrozenRowProof,
    TrainingRun,
    check_frozen_rows,
    text_curve,
    train,
)

__all__ = [
    "BaselineOutcome",
    "DemoDataError",
    "DemoInputs",
    "DemoResult",
    "FrozenRowProof",
    "Int8Outcome",
    "PartialOutcome",
    "check_frozen_rows",
    "load_inputs",
    "main",
    "parse_args",
    "run_demo",
    "train_baseline",
    "train_int8",
    "train_partial",
]


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
        "--int8",
        action="store_true",
        help="also train with the frozen rows in int8 and compare the held-out accuracy",
    )
    parser.add_argument(
        "--data-dir", help="a folder with the two data files (default: gensim's test data)"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument(
        "--lm",
        action="store_true",
        help="run the language-model demo instead (its own flags: --lm --help)",
    )
    return _checked(parser, parser.parse_args(argv))


def _checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The parsed arguments, checked, with the optimizer's default learning rate filled in."""
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
    quantized: bool = False,
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
            quantized=quantized,
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
class Int8Outcome:
    """The run with int8 frozen rows: its accuracy is the quality figure."""

    run: TrainingRun
    seconds: float

    @property
    def moved_rows(self) -> int:
        """Frozen rows whose int8 bytes or scale changed (0 when all kept)."""
        moved: set[int] = set()
        for _, proof in self.run.quantized_checks:
            moved.update(proof.moved_rows)
        return len(moved)

    @property
    def passed(self) -> bool:
        return bool(self.run.quantized_checks) and self.moved_rows == 0


def train_int8(inputs: DemoInputs, args: argparse.Namespace, stream: TextIO) -> Int8Outcome:
    """Trains with the frozen rows in int8 (same data, batches and seed)."""
    run, seconds = _train_variant(
        inputs, args, stream, masked=True, title="int8 frozen rows", quantized=True
    )
    return Int8Outcome(run, seconds)


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
    int8: Int8Outcome | None = None

    @property
    def passed(self) -> bool:
        """No frozen row moved, in the float run nor (if run) the int8 one."""
        return self.partial.passed and (self.int8 is None or self.int8.passed)

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
        figures["all_proofs_passed"] = self.passed
        if self.int8 is not None:
            figures.update(
                int8_test_accuracy=self.int8.run.test_accuracy,
                int8_epoch_losses=self.int8.run.epoch_losses,
                int8_frozen_rows_moved=self.int8.moved_rows,
                int8_proof_passed=self.int8.passed,
                int8_step_ms=self.int8.run.median_step_seconds * 1e3,
            )
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


def report_int8(int8: Int8Outcome, partial: PartialOutcome, stream: TextIO) -> None:
    """The held-out accuracy with int8 frozen rows next to float frozen rows."""
    run = int8.run
    checks = ", ".join(
        f"{name} {'unchanged' if proof.passed else f'CHANGED in {len(proof.moved_rows):,} rows'}"
        for name, proof in run.quantized_checks
    )
    frozen = run.quantized_checks[0][1].frozen_rows if run.quantized_checks else 0
    _write_lines(
        stream,
        [
            f"  int8 frozen rows: loss {run.epoch_losses[0]:.4f} -> {run.epoch_losses[-1]:.4f}; "
            f"{frozen:,} frozen rows: {checks}",
            f"held-out accuracy: float frozen rows {partial.run.test_accuracy:.3f}, "
            f"int8 frozen rows {run.test_accuracy:.3f} "
            f"(difference {run.test_accuracy - partial.run.test_accuracy:+.3f})",
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
    int8 = None
    if args.int8:
        _write_lines(stream, ["", "the same model with its frozen rows in int8:"])
        int8 = train_int8(inputs, args, stream)
        report_int8(int8, partial, stream)
    baseline = None
    if not args.no_baseline:
        report_baseline_start(stream)
        baseline = train_baseline(inputs, args, stream, partial.run)
        report_baseline(baseline, partial.run, inputs.table, args, stream)
    result = DemoResult(args, inputs, partial, baseline, int8)
    figures = result.figures()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    if not partial.passed:
        report_failure(partial, stream)
    if int8 is not None and not int8.passed:
        message = f"FROZEN-ROW PROOF FAILED (int8): {int8.moved_rows:,} frozen rows changed"
        _write_lines(stream, [message])
        print(message, file=sys.stderr)
    return figures


def main(argv: list[str] | None = None) -> int:
    """The command line entry point; returns the exit status (1: a frozen row moved).

    ``python -m partial_embedding.demo --lm`` runs the language-model demo
    instead (``partial_embedding.demo._lm``); ``partial_embedding.demo.main``
    makes that choice before this runs.
    """
    args = parse_args(argv)
    try:
        result = run_demo(args)
    except DemoDataError as error:
        print(f"partial_embedding.demo: {error}", file=sys.stderr)
        return 2
    return 0 if result["all_proofs_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
