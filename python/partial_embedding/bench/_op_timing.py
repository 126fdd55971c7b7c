"""The op benchmark's cases and presets, and the interleaved timing of each method.

``time_op_case`` times the methods of ``kernels`` on one ``OpCase`` side by
side, in interleaved rounds, on the same inputs; ``measure_op_case`` returns
those times with each method's ratio to ``masked_scatter_sub``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding.ops import masked_scatter_sub

__all__ = [
    "ALL_METHODS",
    "BASELINE",
    "DENSE_METHODS",
    "PRESETS",
    "OpCase",
    "OpTiming",
    "Preset",
    "make_inputs",
    "measure_op_case",
    "seconds_per_call",
    "skip_reason",
    "synchronizer",
    "time_methods",
    "time_op_case",
]

ALL_METHODS = ("masked_scatter_sub", "scatter_sub", "tensor_scatter_nd_sub", "dense_mask")
DENSE_METHODS = ("tensor_scatter_nd_sub", "dense_mask")
BASELINE = "masked_scatter_sub"


@dataclass
class OpCase:
    """One point of the op benchmark grid."""

    num_rows: int = 1_000_000
    width: int = 128
    num_indices: int = 4096
    duplicate_rate: float = 0.0
    permitted_fraction: float = 1.0
    dtype: str = "float32"


@dataclass(frozen=True)
class Preset:
    """How much a run measures."""

    name: str
    sweeps: tuple[tuple[str, tuple[OpCase, ...]], ...]
    rounds: int
    max_repeats: int
    target_seconds: float  # per method and point, all rounds together
    dense_limit: int  # V * D above which the dense methods are skipped
    training: dict[str, Any]
    gpu_sweeps: tuple[tuple[str, tuple[OpCase, ...]], ...]


def _sweep(base: OpCase, field: str, values: Iterable[Any]) -> tuple[OpCase, ...]:
    return tuple(dataclasses.replace(base, **{field: value}) for value in values)


_FULL_VOCAB_BASE = OpCase(num_rows=1_000_000, width=128, num_indices=4096, permitted_fraction=0.5)
_FULL_BASE = dataclasses.replace(_FULL_VOCAB_BASE, num_rows=100_000)
_QUICK_BASE = OpCase(num_rows=10_000, width=32, num_indices=256, permitted_fraction=0.5)

PRESETS = {
    "quick": Preset(
        name="quick",
        sweeps=(
            ("vocab", _sweep(_QUICK_BASE, "num_rows", [10_000, 40_000])),
            ("width", _sweep(_QUICK_BASE, "width", [8])),
            ("duplicates", _sweep(_QUICK_BASE, "duplicate_rate", [0.5])),
        ),
        rounds=3,
        max_repeats=20,
        target_seconds=0.05,
        dense_limit=1 << 20,
        training={
            "vocab": 20_000,
            "width": 16,
            "batch": 32,
            "ids_per_sample": 4,
            "permitted_fraction": 0.5,
            "steps": 3,
            "baseline_steps": 2,
            "warmup": 1,
            "scaling_vocabs": (),
            "seed": 0,
            "update_only_steps": 3,
        },
        gpu_sweeps=(("vocab", _sweep(_QUICK_BASE, "num_rows", [10_000, 40_000])),),
    ),
    "full": Preset(
        name="full",
        sweeps=(
            (
                "vocab",
                _sweep(
                    _FULL_VOCAB_BASE,
                    "num_rows",
                    [10_000, 30_000, 100_000, 300_000, 1_000_000, 4_000_000],
                ),
            ),
            ("width", _sweep(_FULL_BASE, "width", [16, 64, 512])),
            ("ids per step", _sweep(_FULL_BASE, "num_indices", [256, 65_536])),
            ("duplicates", _sweep(_FULL_BASE, "duplicate_rate", [0.5, 0.9])),
            ("permitted", _sweep(_FULL_BASE, "permitted_fraction", [0.01, 1.0])),
        ),
        rounds=5,
        max_repeats=200,
        target_seconds=1.0,
        dense_limit=1_000_000 * 128,
        # The training step: a 1M x 128 table, 256 samples of 16 ids.
        training={
            "vocab": 1_000_000,
            "width": 128,
            "batch": 256,
            "ids_per_sample": 16,
            "permitted_fraction": 0.5,
            "steps": 50,
            "baseline_steps": 5,
            "warmup": 3,
            "scaling_vocabs": (100_000, 4_000_000),
            "seed": 0,
            "update_only_steps": 50,
        },
        gpu_sweeps=(
            (
                "vocab",
                _sweep(
                    _FULL_VOCAB_BASE,
                    "num_rows",
                    [10_000, 100_000, 1_000_000, 4_000_000, 16_000_000],
                ),
            ),
            (
                "ids per step",
                _sweep(_FULL_VOCAB_BASE, "num_indices", [256, 65_536, 1_048_576]),
            ),
        ),
    ),
}


# -- the op benchmark -----------------------------------------------------------


def make_inputs(case: OpCase, seed: int) -> dict[str, tf.Tensor]:
    rng = np.random.default_rng(seed)
    distinct = max(1, int(round(case.num_indices * (1.0 - case.duplicate_rate))))
    pool = rng.choice(case.num_rows, size=min(distinct, case.num_rows), replace=False)
    indices = rng.choice(pool, size=case.num_indices)
    mask = rng.random(case.num_rows) < case.permitted_fraction
    updates = rng.standard_normal((case.num_indices, case.width), dtype=np.float32)
    return {
        "indices": tf.constant(indices, tf.int64),
        "updates": tf.constant(updates, case.dtype),
        "row_mask": tf.constant(mask),
    }


def _method_step(
    method: str, table: tf.Variable, inputs: dict[str, tf.Tensor]
) -> Callable[[], None]:
    indices, updates, row_mask = inputs["indices"], inputs["updates"], inputs["row_mask"]

    if method == "masked_scatter_sub":

        @tf.function
        def step() -> None:
            masked_scatter_sub(table, indices, updates, row_mask)

    elif method == "scatter_sub":
        slices = tf.IndexedSlices(updates, indices, tf.shape(table, out_type=tf.int64))

        @tf.function
        def step() -> None:
            table.scatter_sub(slices)

    elif method == "tensor_scatter_nd_sub":

        @tf.function
        def step() -> None:
            table.assign(tf.tensor_scatter_nd_sub(table, indices[:, None], updates))

    elif method == "dense_mask":

        @tf.function
        def step() -> None:
            dense = tf.scatter_nd(indices[:, None], updates, tf.shape(table, out_type=tf.int64))
            table.assign_sub(tf.cast(row_mask, table.dtype)[:, None] * dense)

    else:
        raise ValueError(f"method: unknown method {method!r}; choose from {ALL_METHODS}")
    return step


def synchronizer(table: tf.Variable) -> Callable[[], None]:
    """Waits for the table's pending updates (GPU kernels run asynchronously).

    Gathers one row rather than reading the table: a full read would copy a
    table that scatter_sub switched into copy-on-read mode.
    """
    first_row = tf.constant([0], tf.int64)

    def wait() -> None:
        table.sparse_read(first_row).numpy()

    return wait


def _no_wait() -> None:
    pass


def seconds_per_call(step: Callable[[], None], wait: Callable[[], None], count: int) -> float:
    """Runs ``step`` ``count`` times, waits for it, returns the seconds per call."""
    start = time.perf_counter()
    for _ in range(count):
        step()
    wait()
    return (time.perf_counter() - start) / count


def _fitting_repeats(
    step: Callable[[], None],
    wait: Callable[[], None],
    repeats: int,
    rounds: int,
    target_seconds: float | None,
) -> int:
    """At most ``repeats``, fewer where ``rounds`` rounds of them would take
    longer than ``target_seconds`` together."""
    if target_seconds is None:
        return repeats
    once = max(seconds_per_call(step, wait, 1), 1e-7)
    return max(1, min(repeats, int(target_seconds / (rounds * once))))


def time_methods(
    case: OpCase,
    methods: Sequence[str],
    repeats: int,
    rounds: int,
    seed: int,
    target_seconds: float | None,
    synchronize: bool,
) -> tuple[dict[str, float], dict[str, int]]:
    """Median seconds per step of each method, measured in interleaved
    rounds, and the repeats each ran per round."""
    inputs = make_inputs(case, seed)
    initial = tf.random.stateless_normal(
        [case.num_rows, case.width], seed=[seed, 1], dtype=case.dtype
    )
    steps: dict[str, Callable[[], None]] = {}
    waits: dict[str, Callable[[], None]] = {}
    repeats_of: dict[str, int] = {}
    for method in methods:
        table = tf.Variable(initial)
        steps[method] = _method_step(method, table, inputs)
        waits[method] = synchronizer(table) if synchronize else _no_wait
        steps[method]()  # trace and warm up
        waits[method]()
        repeats_of[method] = _fitting_repeats(
            steps[method], waits[method], repeats, rounds, target_seconds
        )
    del initial
    samples: dict[str, list[float]] = {method: [] for method in methods}
    for _ in range(rounds):
        for method in methods:
            samples[method].append(
                seconds_per_call(steps[method], waits[method], repeats_of[method])
            )
    seconds = {method: statistics.median(values) for method, values in samples.items()}
    return seconds, repeats_of


def time_op_case(
    case: OpCase,
    methods: tuple[str, ...] = ("masked_scatter_sub", "scatter_sub"),
    repeats: int = 50,
    rounds: int = 5,
    seed: int = 0,
    target_seconds: float | None = None,
) -> dict[str, float]:
    """Median seconds per step of each method, measured interleaved in rounds.

    Each method updates its own copy of the table, so the built-in scatter's
    switch into copy-on-read mode cannot slow the others down. With
    ``target_seconds``, each method runs at most ``repeats`` steps per round,
    fewer where a step is slow, so that its rounds take about that long.
    """
    seconds, _ = time_methods(case, methods, repeats, rounds, seed, target_seconds, False)
    return seconds


def skip_reason(method: str, case: OpCase, dense_limit: int | None) -> str | None:
    if dense_limit is not None and method in DENSE_METHODS:
        if case.num_rows * case.width > dense_limit:
            return f"O(V*D) per step; skipped above V*D = {dense_limit:,}"
    return None


@dataclass(frozen=True)
class OpTiming:
    """How the op benchmark times each point (see ``run_op_benchmark``)."""

    repeats: int
    rounds: int
    target_seconds: float | None = None
    dense_limit: int | None = None


def measure_op_case(
    case: OpCase, methods: tuple[str, ...], timing: OpTiming, sweep: str = "grid"
) -> dict[str, Any]:
    """Times one point; returns its row (see ``run_op_benchmark``).

    ``methods`` must include ``BASELINE``, which the ratios divide.
    """
    skipped = {m: r for m in methods if (r := skip_reason(m, case, timing.dense_limit))}
    timed_methods = tuple(m for m in methods if m not in skipped)
    measured, repeats_of = time_methods(
        case, timed_methods, timing.repeats, timing.rounds, 0, timing.target_seconds, False
    )
    seconds: dict[str, float | None] = {m: measured.get(m) for m in methods}
    base = measured[BASELINE]
    return {
        **asdict(case),
        "sweep": sweep,
        "seconds": seconds,
        "ratio_vs": {m: (base / s if s else None) for m, s in seconds.items()},
        "repeats": repeats_of,
        "rounds": timing.rounds,
        "skipped": skipped,
    }
