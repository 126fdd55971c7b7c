"""Int8 frozen rows in the benchmarks: ``python -m partial_embedding.bench.quantized``.

Three things about a ``PartialEmbedding`` whose frozen rows are int8 (one
scale per row) and whose permitted rows train in a compact float store:

* the int8 layers the memory benchmark builds (``int8_embedding``), three
  ways: ``int8_quantize`` (a float layer, then ``layer.quantize("int8")``),
  ``int8_mmap`` (``dtype="int8_from_float32"`` from a memory-mapped float
  ``.npy``, quantized block by block) and ``int8_init`` (the same policy from
  the initializer: no float file, for very large tables), with what each of
  their variables holds (``variable_bytes``) and a check that a sample of
  frozen rows keeps its int8 bytes and scales (``FrozenSample``);
* ``--confirm-largest V``: one child process builds a ``V``-row int8 layer,
  trains a few steps and checks the frozen sample; sampled from outside as
  the memory benchmark samples (``RssAnon`` over the baseline);
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

from partial_embedding.bench.memory_figures import INT8_VARIANTS

__all__ = [
    "FROZEN_SAMPLE_ROWS",
    "INT8_VARIANTS",
    "FrozenSample",
    "StepTimes",
    "allocator_figures",
    "confirm_largest",
    "int8_embedding",
    "main",
    "parse_args",
    "report_confirmation",
    "report_step_times",
    "time_steps",
    "variable_bytes",
]

#: Frozen rows whose int8 bytes and scales are compared before and after training.
FROZEN_SAMPLE_ROWS = 4096


# -- building and inspecting an int8 layer ------------------------------------------


def int8_embedding(
    variant: str, vocab: int, width: int, permitted: np.ndarray, weights: Any
) -> Any:
    """A quantized ``PartialEmbedding`` built as ``variant`` says.

    Args:
      variant: One of ``INT8_VARIANTS``.
      vocab, width: The table's shape.
      permitted: The rows that train (sorted ids).
      weights: The float table for ``int8_mmap`` (an array or a memory-mapped
        ``.npy``); ignored otherwise.

    Raises:
      ValueError: an unknown variant, or ``int8_mmap`` without weights.
    """
    from partial_embedding.layers import PartialEmbedding

    if variant == "int8_quantize":
        layer = PartialEmbedding(vocab, width, trainable_ids=permitted)
        layer.build()
        layer.quantize("int8")
        return layer
    if variant == "int8_mmap":
        if weights is None:
            raise ValueError("variant: 'int8_mmap' needs the float weights")
        return PartialEmbedding(
            vocab, width, weights=weights, trainable_ids=permitted, dtype="int8_from_float32"
        )
    if variant == "int8_init":
        return PartialEmbedding(vocab, width, trainable_ids=permitted, dtype="int8_from_float32")
    raise ValueError(f"variant: unknown {variant!r}; choose from {INT8_VARIANTS}")


def variable_bytes(variables: Sequence[Any]) -> dict[str, int]:
    """Bytes each variable holds now, by its path (or name), without reading it."""
    import tensorflow as tf

    figures: dict[str, int] = {}
    for variable in {id(v): v for v in variables}.values():
        name = getattr(variable, "path", None) or variable.name
        figures[name] = int(tf.size(variable)) * tf.as_dtype(variable.dtype).size
    return figures


def allocator_figures() -> dict[str, int]:
    """What the allocators hold: TensorFlow's CPU pool (bytes in use now and
    at most, where it keeps statistics) and glibc's heap (``mallinfo2``: in
    use, free but kept, and in ``mmap`` blocks), where available."""
    import ctypes

    import tensorflow as tf

    figures: dict[str, int] = {}
    try:
        info = tf.config.experimental.get_memory_info("CPU:0")
        figures.update(tf_current=int(info["current"]), tf_peak=int(info["peak"]))
    except (ValueError, tf.errors.OpError, RuntimeError):
        pass

    class _MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                "fsmblks", "uordblks", "fordblks", "keepcost",
            )
        ]  # fmt: skip

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        heap = libc.mallinfo2()
    except (OSError, AttributeError):
        return figures
    figures.update(
        malloc_in_use=int(heap.uordblks),
        malloc_free=int(heap.fordblks),
        malloc_mmap=int(heap.hblkhd),
    )
    return figures


class FrozenSample:
    """A copy of some frozen rows' int8 bytes and scales, to compare later."""

    def __init__(self, layer: Any, count: int = FROZEN_SAMPLE_ROWS, seed: int = 0) -> None:
        frozen = ~np.asarray(layer.trainable_mask.numpy(), bool)
        candidates = np.flatnonzero(frozen)
        rng = np.random.default_rng([seed, 2])
        size = min(count, len(candidates))
        self.ids = np.sort(rng.choice(candidates, size=size, replace=False)).astype(np.int64)
        self.layer = layer
        self.codes, self.scales = self._read()

    def _read(self) -> tuple[np.ndarray, np.ndarray]:
        import tensorflow as tf

        ids = tf.constant(self.ids)
        codes = np.array(tf.gather(self.layer.embeddings, ids).numpy())
        scales = np.array(tf.gather(self.layer.embeddings_scale, ids).numpy())
        return codes, scales

    def unchanged(self) -> bool:
        """Whether every sampled row's int8 bytes and scale bits are as copied."""
        codes, scales = self._read()
        same_scales = scales.view(np.uint8).tobytes() == self.scales.view(np.uint8).tobytes()
        return bool(np.array_equal(codes, self.codes)) and same_scales


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
    scales before and after. Returns the ``MemoryMeasurement``; it is ``ok``
    only when the run finished and the sample did not change (status says
    otherwise).
    """
    from partial_embedding.bench.memory_figures import MemoryCase
    from partial_embedding.bench.memory_sampling import measure_case

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
    measurement = measure_case(case, min_available_bytes=min_available_bytes, timeout=timeout)
    if measurement.ok and measurement.child_figures.get("frozen_sample_unchanged") is not True:
        measurement.status = "failed: the sampled frozen rows' int8 bytes or scales changed"
    return measurement


def report_confirmation(measurement: Any, stream: TextIO) -> None:
    """One line: the run's peak and end as multiples of the float32 table."""
    case = measurement.case
    figures = measurement.child_figures
    verdict = "trains in int8" if measurement.ok else measurement.status.splitlines()[0][:160]
    stream.write(
        f"{case.variant} V={case.vocab:,} D={case.width}: peak {measurement.multiple():.3f}x, "
        f"steady end {measurement.steady_multiple:.3f}x the float32 table "
        f"({case.table_bytes / 2**30:.2f} GiB); {figures.get('frozen_sample_rows', 0):,} "
        f"frozen rows sampled, unchanged: {figures.get('frozen_sample_unchanged')}; "
        f"{verdict} ({measurement.seconds:.0f} s)\n"
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

    from partial_embedding.bench.models import keras_step, pooled_model
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


def report_step_times(result: StepTimes, stream: TextIO, target: float = 1.2) -> None:
    """The medians, the ratio and whether it meets ``target``."""
    figures = result.to_dict()
    verdict = "meets" if result.ratio <= target else "MISSES"
    stream.write(
        f"step time at V={result.vocab:,} D={result.width}, PartialEmbedding + "
        f"MaskedOptimizer(Adam), {len(result.float_ms)} interleaved rounds of "
        f"{result.steps_per_round} steps: float {figures['float_median_ms']:.2f} ms, "
        f"int8 {figures['int8_median_ms']:.2f} ms, int8/float {result.ratio:.2f}x "
        f"({verdict} the {target:g}x target)\n"
    )
    stream.flush()


# -- the command line ---------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench.quantized",
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
