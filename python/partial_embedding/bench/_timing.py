"""Interleaved timing rounds and the memory a stretch of work adds.

The training benchmark (``bench._training``) times several step functions
against each other: each is warmed up, then they run round by round in turn
(``interleaved_rounds``), so slow drifts of a shared machine reach each of them
alike, and each keeps its best round. Every round also records the peak
resident-memory growth (Linux ``VmHWM``, reset through
``/proc/self/clear_refs``) and, where TensorFlow's CPU allocator keeps
statistics, the most memory TensorFlow held at once beyond what it held before.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

#: A timed function and the argument tuples it cycles through.
TimedRun = tuple[Callable[..., Any], list[tuple[Any, ...]]]


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _tf_cpu_allocator_bytes(reset_peak: bool = False) -> dict[str, int] | None:
    """TensorFlow's CPU allocator statistics (current and peak bytes in use),
    or None where the allocator keeps none. oneDNN builds (the default on
    x86) pool CPU memory, which hides per-step allocations from the RSS."""
    try:
        if reset_peak:
            tf.config.experimental.reset_memory_stats("CPU:0")
        info = tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, tf.errors.OpError, RuntimeError):
        return None
    return {"current": int(info["current"]), "peak": int(info["peak"])}


def _available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (Linux), None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def lacks_room_for(
    nbytes: float, headroom: float = 1.25, reserve_bytes: int = 1 << 30
) -> str | None:
    """Why ``nbytes`` more should not be allocated now, or None where they fit.

    They fit when ``nbytes * headroom`` plus ``reserve_bytes`` are available
    (``MemAvailable``; always where that is unknown): a machine shared with
    other processes is not driven into its out-of-memory killer.
    """
    available = _available_bytes()
    if available is None or nbytes * headroom + reserve_bytes <= available:
        return None
    return f"needs ~{nbytes / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available"


def _reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


class MemoryProbe:
    """What a stretch of work adds to memory: started on creation, read after.

    The peak RSS growth (Linux ``VmHWM``, reset first) and, where TF's CPU
    allocator keeps statistics, the most TensorFlow held at once beyond what
    it held before: the per-step temporaries.
    """

    def __init__(self) -> None:
        self.rss_before = _status_kib("VmRSS")
        self.can_reset = _reset_peak_rss()
        self.allocator_before = _tf_cpu_allocator_bytes(reset_peak=True)

    def rss_growth_mib(self) -> float | None:
        """The peak RSS since creation less the RSS then, in MiB (None: unknown)."""
        peak = _status_kib("VmHWM")
        if not self.can_reset or peak is None or self.rss_before is None:
            return None
        return max(0, peak - self.rss_before) / 1024

    def allocator_growth_mib(self) -> float | None:
        """TF's CPU allocator peak since creation less what it held then, in MiB."""
        after = _tf_cpu_allocator_bytes()
        if self.allocator_before is None or after is None:
            return None
        return max(0, after["peak"] - self.allocator_before["current"]) / 2**20


@dataclasses.dataclass
class RoundFigures:
    """One timed function's figures, round after round."""

    step_ms: list[float] = dataclasses.field(default_factory=list)
    rss_growth_mib: list[float] = dataclasses.field(default_factory=list)
    alloc_growth_mib: list[float] = dataclasses.field(default_factory=list)

    def add(
        self, step_ms: float, rss_growth_mib: float | None, alloc_growth_mib: float | None
    ) -> None:
        """Records one round (memory figures only where known)."""
        self.step_ms.append(step_ms)
        if rss_growth_mib is not None:
            self.rss_growth_mib.append(rss_growth_mib)
        if alloc_growth_mib is not None:
            self.alloc_growth_mib.append(alloc_growth_mib)

    def summary(self, steps: int) -> dict[str, float]:
        """The best round, the mean and median over rounds, how many rounds,
        and the most memory a round added."""
        result = {
            "step_ms": min(self.step_ms),
            "rounds": len(self.step_ms),
            "mean_step_ms": float(np.mean(self.step_ms)),
            "median_step_ms": float(np.median(self.step_ms)),
            "steps": steps,
        }
        if self.rss_growth_mib:
            result["peak_rss_growth_mib"] = max(self.rss_growth_mib)
        if self.alloc_growth_mib:
            result["peak_step_alloc_mib"] = max(self.alloc_growth_mib)
        return result


def _wait_for(result: Any) -> None:
    """Waits for a TensorFlow result (host functions return when done)."""
    if hasattr(result, "numpy"):
        result.numpy()


def time_round(
    function: Callable[..., Any], inputs: list[tuple[Any, ...]], first: int, count: int
) -> tuple[float, float | None, float | None]:
    """Ms per call over ``count`` calls (cycling through ``inputs`` from
    ``first``), and the memory they added (see ``MemoryProbe``)."""
    probe = MemoryProbe()
    start = time.perf_counter()
    last = None
    for i in range(count):
        last = function(*inputs[(first + i) % len(inputs)])
    _wait_for(last)
    step_ms = 1e3 * (time.perf_counter() - start) / count
    return step_ms, probe.rss_growth_mib(), probe.allocator_growth_mib()


def interleaved_rounds(
    runs: dict[str, TimedRun],
    steps: int,
    warmup: int,
    max_rounds: int = 5,
    steps_of: dict[str, int] | None = None,
) -> dict[str, dict[str, float]]:
    """Times each run's function in interleaved rounds; figures per run.

    ``runs`` maps a name to a function and the argument tuples it cycles
    through. Every function is warmed up first, then they are timed round by
    round in turn (the order alternating between rounds), so slow drifts of a
    shared machine reach each of them alike: up to ``max_rounds`` rounds of
    at least 10 steps. Each keeps its best round (the one least disturbed by
    other processes), the mean and median over all rounds, and the most
    memory any of its rounds added (RSS, and TF's CPU allocator where it
    keeps statistics).

    Args:
      runs: Name -> (function, argument tuples).
      steps: Timed calls of each function, over all rounds.
      warmup: Untimed calls of each function first.
      max_rounds: Most rounds the steps are split into.
      steps_of: Fewer timed calls for some runs (slow ones), by name; each
        of them is still timed in every round.

    Returns:
      Name -> ``RoundFigures.summary``.
    """
    for function, inputs in runs.values():
        for i in range(warmup):
            _wait_for(function(*inputs[i % len(inputs)]))
    gc.collect()
    rounds = max(1, min(max_rounds, steps // 10))
    per_round = max(1, steps // rounds)
    names = list(runs)
    figures = {name: RoundFigures() for name in names}
    count = {name: max(1, (steps_of or {}).get(name, steps) // rounds) for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            function, inputs = runs[name]
            figures[name].add(*time_round(function, inputs, r * per_round, count[name]))
    return {name: figures[name].summary(rounds * count[name]) for name in names}


def release_memory() -> None:
    """Drops what Keras and Python still hold of the last measurement."""
    keras.backend.clear_session()
    gc.collect()
