"""Int8 frozen rows in the benchmarks: ``python -m partial_embedding.bench --int8``.

A ``PartialEmbedding`` whose frozen rows are int8 (one scale per row) and
whose permitted rows train in a compact float store; the memory benchmark
builds such layers three ways (``bench._models.int8_embedding``). Here:

* ``--confirm-largest V``: one child process builds a ``V``-row int8 layer,
  trains a few steps and compares a sample of frozen rows' int8 bytes and
  scales before and after; sampled from outside as the memory benchmark samples
  (``RssAnon`` over the baseline);
* ``--step-time``: the training step of the pooled model with an int8 layer
  against the same model with a float layer (both ``MaskedOptimizer(Adam)``)
  in interleaved rounds in one process, and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import numpy as np

from partial_embedding.bench._models import INT8_VARIANTS, int8_embedding

# -- confirming that a table trains in int8 -----------------------------------------


def confirm_largest(
    vocab: int,
    *,
    width: int = 128,
    variant: str = "int8_init",
    permitted_fraction: float = 0.01,
    steps: int = 3,
    batch: int = 256,
    ids_per_sample: int = 16,
    min_available_bytes: int = 2**29,
    timeout: float | None = None,
) -> Any:
    """Builds and trains a ``vocab``-row int8 layer in one child process.

    The child runs the memory benchmark's case (pooled model, a first step and
    ``steps`` more) and compares a sample of frozen rows' int8 bytes and
    scales before and after (``child_figures["frozen_sample_unchanged"]``).
    Returns the ``MemoryMeasurement``; it is ``ok`` when the run finished.
    """
    from partial_embedding.bench._memory_process import MemoryCase, measure_case

    if variant not in INT8_VARIANTS:
        raise ValueError(f"variant: unknown {variant!r}; choose from {INT8_VARIANTS}")
    case = MemoryCase(
        variant=variant,
        vocab=vocab,
        width=width,
        permitted_fraction=permitted_fraction,
        batch=batch,
        ids_per_sample=ids_per_sample,
        steps=steps,
    )
    return measure_case(case, min_available_bytes=min_available_bytes, timeout=timeout)


def report_confirmation(measurement: Any, stream: TextIO) -> None:
    """One line: the run's peak and end as multiples of the float32 table."""
    case = measurement.case
    figures = measurement.child_figures
    status = "finished" if measurement.ok else measurement.status.splitlines()[0][:160]
    stream.write(
        f"{case.variant} V={case.vocab:,} D={case.width}: peak {measurement.multiple():.3f}x, "
        f"steady end {measurement.steady_multiple:.3f}x the float32 table "
        f"({case.table_bytes / 2**30:.2f} GiB); {figures.get('frozen_sample_rows', 0):,} "
        f"frozen rows sampled, unchanged: {figures.get('frozen_sample_unchanged')}; "
        f"{status} ({measurement.seconds:.0f} s)\n"
    )
    stream.flush()


# -- step time: int8 against float, interleaved --------------------------------------


@dataclasses.dataclass
class StepTimes:
    """Milliseconds a step per round, for the float and the int8 layer."""

    vocab: int
    width: int
    steps_per_round: int
    float_ms: list[float]
    int8_ms: list[float]

    @property
    def ratio(self) -> float:
        """Median int8 step over median float step."""
        return statistics.median(self.int8_ms) / statistics.median(self.float_ms)

    def to_dict(self) -> dict[str, Any]:
        result = dataclasses.asdict(self)
        result.update(
            float_median_ms=statistics.median(self.float_ms),
            int8_median_ms=statistics.median(self.int8_ms),
            ratio=self.ratio,
        )
        return result


def _pooled_step(layer: Any, ids_per_sample: int) -> Callable[[Any, Any], Any]:
    import keras

    from partial_embedding.bench._models import keras_step, pooled_model
    from partial_embedding.optimizers import MaskedOptimizer

    model = pooled_model(layer, ids_per_sample)
    return keras_step(model, MaskedOptimizer(keras.optimizers.Adam()))


def _round_ms(step: Callable[[Any, Any], Any], batches: Sequence[tuple[Any, Any]]) -> float:
    start = time.perf_counter()
    for ids, targets in batches:
        loss = step(ids, targets)
    float(loss)  # waits for the last step
    return 1e3 * (time.perf_counter() - start) / len(batches)


def time_steps(
    vocab: int = 1_000_000,
    *,
    width: int = 128,
    permitted_fraction: float = 0.01,
    batch: int = 256,
    ids_per_sample: int = 16,
    rounds: int = 7,
    steps_per_round: int = 20,
    warmup: int = 3,
    seed: int = 0,
) -> StepTimes:
    """Times the pooled model's step with a float and an int8 layer.

    Both layers start from the same float table (the int8 one is built from
    it with ``dtype="int8_from_float32"``), permit the same rows and see the
    same batches; rounds alternate between them (which goes first alternates
    too), after ``warmup`` untimed steps each.
    """
    import tensorflow as tf

    from partial_embedding.layers import PartialEmbedding

    rng = np.random.default_rng([seed, 3])
    table = rng.uniform(-0.05, 0.05, (vocab, width)).astype(np.float32)
    count = max(1, int(round(vocab * permitted_fraction)))
    permitted = np.sort(rng.choice(vocab, size=count, replace=False))
    steps = {
        "float": _pooled_step(
            PartialEmbedding(vocab, width, weights=table, trainable_ids=permitted), ids_per_sample
        ),
        "int8": _pooled_step(
            int8_embedding("int8_mmap", vocab, width, permitted, table), ids_per_sample
        ),
    }
    del table
    batches = [
        (
            tf.constant(rng.integers(0, vocab, (batch, ids_per_sample), dtype=np.int32)),
            tf.constant(rng.standard_normal((batch, 1)).astype(np.float32)),
        )
        for _ in range(steps_per_round)
    ]
    for step in steps.values():
        _round_ms(step, batches[: max(1, warmup)])
    times: dict[str, list[float]] = {name: [] for name in steps}
    for number in range(rounds):
        order = list(steps) if number % 2 == 0 else list(reversed(steps))
        for name in order:
            times[name].append(_round_ms(steps[name], batches))
    return StepTimes(vocab, width, steps_per_round, times["float"], times["int8"])


def report_step_times(result: StepTimes, stream: TextIO) -> None:
    """The medians and their ratio."""
    figures = result.to_dict()
    stream.write(
        f"step time at V={result.vocab:,} D={result.width}, PartialEmbedding + "
        f"MaskedOptimizer(Adam), {len(result.float_ms)} interleaved rounds of "
        f"{result.steps_per_round} steps: float {figures['float_median_ms']:.2f} ms, "
        f"int8 {figures['int8_median_ms']:.2f} ms, int8/float {result.ratio:.2f}x\n"
    )
    stream.flush()


# -- the command line ---------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --int8",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--step-time", action="store_true", help="time int8 against float")
    parser.add_argument("--vocab", type=int, default=1_000_000, help="V of --step-time")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of --step-time")
    parser.add_argument("--steps-per-round", type=int, default=20)
    parser.add_argument(
        "--confirm-largest", type=int, metavar="V", help="confirm by a run that V rows train"
    )
    parser.add_argument(
        "--build", choices=INT8_VARIANTS, default="int8_init", help="how --confirm-largest builds"
    )
    parser.add_argument("--dim", type=int, default=128, help="row width D")
    parser.add_argument("--permitted", type=float, default=0.01, help="fraction permitted")
    parser.add_argument("--json", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    if not args.step_time and args.confirm_largest is None:
        parser.error("choose --step-time and/or --confirm-largest V")
    return args


def main(argv: Sequence[str] | None = None, stream: TextIO | None = None) -> dict[str, Any]:
    """Runs what the arguments ask; prints it and returns the figures."""
    args = parse_args(argv)
    stream = stream or sys.stdout
    results: dict[str, Any] = {}
    if args.step_time:
        times = time_steps(
            args.vocab,
            width=args.dim,
            permitted_fraction=args.permitted,
            rounds=args.rounds,
            steps_per_round=args.steps_per_round,
        )
        report_step_times(times, stream)
        results["step_time"] = times.to_dict()
    if args.confirm_largest is not None:
        measurement = confirm_largest(
            args.confirm_largest,
            width=args.dim,
            variant=args.build,
            permitted_fraction=args.permitted,
        )
        report_confirmation(measurement, stream)
        results["confirmation"] = measurement.to_dict()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return results


if __name__ == "__main__":
    main()
