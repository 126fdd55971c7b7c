"""Training-step benchmark: PartialEmbedding + MaskedOptimizer(Adam) vs. the rest.

Run ``python -m partial_embedding.bench --training`` (``--help`` for options).
One run times a training step (forward, backward, optimizer update) of the same small model
(``V x D`` ids mean-pooled into a ``Dense(1)``, MSE, Adam), built six ways:

* ``partial``: ``PartialEmbedding`` + ``MaskedOptimizer(Adam)`` (this library,
  compact slots: at most half the rows are permitted);
* ``partial_xla``: the same, its step compiled with XLA
  (``tf.function(jit_compile=True)``): the library's XLA path of stock ops
  with static shapes instead of its kernels;
* ``partial_full_slots``: the same with full-size slots
  (``compact_slots=False``), what ``partial`` was before compact slots;
* ``keras``: stock ``keras.layers.Embedding`` + ``Adam`` (trains every row;
  Keras densifies the update: every row and slot rewritten per step);
* ``dense_mask``: the widely copied layer
  ``stop_gradient(mask * W) + (1 - mask) * W`` + ``Adam``;
* ``stock_tf``: the best with stock TF ops alone: lookups by ``ResourceGather``,
  ``tf.unique`` + ``unsorted_segment_sum``, row gathers, lazy Adam on the
  permitted rows, ``scatter_update`` of the table and both moments.

It then times the optimizer update alone, ``partial`` against ``stock_tf``
(and ``partial_xla``) fed the same fixed sparse gradients (the part of the step
that the fused kernel replaces), ``partial`` and ``partial_xla`` again at other
vocabulary sizes (the step must not grow with V), and reports each variant's
peak resident-memory growth over its timed steps (Linux ``VmHWM``, reset
through ``/proc/self/clear_refs``) and, where TensorFlow's CPU allocator keeps
statistics (oneDNN builds, the default on x86, whose pooled allocator also
hides per-step allocations from the RSS), the most memory TensorFlow held at
once during them beyond what it held before: both next to the size of one
table.

``measure`` takes a ``BenchmarkConfig`` and returns a ``TrainingBenchmark``;
``run_benchmark`` returns the same figures as a dict for other modules;
``BenchmarkReport`` prints them as they come in.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.bench.models import (  # noqa: E402
    VARIANTS,
    build_variant,
    stock_tf_tables,
    stock_tf_update,
)
from partial_embedding.layers import PartialEmbedding  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer  # noqa: E402

__all__ = [
    "BenchmarkConfig",
    "BenchmarkReport",
    "TrainingBenchmark",
    "main",
    "measure",
    "run_benchmark",
]


#: The variants timed together in interleaved rounds (milliseconds a step).
FAST_VARIANTS = ("partial", "partial_xla", "partial_full_slots", "stock_tf")

#: The variants timed again at each of ``scaling_vocabs``, together.
SCALED_VARIANTS = ("partial", "partial_xla")


# -- memory ------------------------------------------------------------------


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


def _reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


# -- timing ------------------------------------------------------------------


class _MemoryProbe:
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
        peak = _status_kib("VmHWM")
        if not self.can_reset or peak is None or self.rss_before is None:
            return None
        return max(0, peak - self.rss_before) / 1024

    def allocator_growth_mib(self) -> float | None:
        after = _tf_cpu_allocator_bytes()
        if self.allocator_before is None or after is None:
            return None
        return max(0, after["peak"] - self.allocator_before["current"]) / 2**20


@dataclasses.dataclass
class _RoundFigures:
    """One run's figures, round after round."""

    step_ms: list[float] = dataclasses.field(default_factory=list)
    rss_growth_mib: list[float] = dataclasses.field(default_factory=list)
    alloc_growth_mib: list[float] = dataclasses.field(default_factory=list)

    def add(
        self, step_ms: float, rss_growth_mib: float | None, alloc_growth_mib: float | None
    ) -> None:
        self.step_ms.append(step_ms)
        if rss_growth_mib is not None:
            self.rss_growth_mib.append(rss_growth_mib)
        if alloc_growth_mib is not None:
            self.alloc_growth_mib.append(alloc_growth_mib)

    def summary(self, steps: int) -> dict[str, float]:
        """The best round, the mean and median over rounds, and the most
        memory a round added."""
        result = {
            "step_ms": min(self.step_ms),
            "mean_step_ms": float(np.mean(self.step_ms)),
            "median_step_ms": float(np.median(self.step_ms)),
            "steps": steps,
        }
        if self.rss_growth_mib:
            result["peak_rss_growth_mib"] = max(self.rss_growth_mib)
        if self.alloc_growth_mib:
            result["peak_step_alloc_mib"] = max(self.alloc_growth_mib)
        return result


def _time_round(
    function: Callable, inputs: list[tuple[Any, ...]], first: int, count: int
) -> tuple[float, float | None, float | None]:
    """Ms per call over ``count`` calls (cycling through ``inputs`` from
    ``first``), and the memory they added (see ``_MemoryProbe``)."""
    probe = _MemoryProbe()
    start = time.perf_counter()
    for i in range(count):
        last = function(*inputs[(first + i) % len(inputs)])
    last.numpy()
    step_ms = 1e3 * (time.perf_counter() - start) / count
    return step_ms, probe.rss_growth_mib(), probe.allocator_growth_mib()


def _interleaved_rounds(
    runs: dict[str, tuple[Callable, list[tuple[Any, ...]]]],
    steps: int,
    warmup: int,
    max_rounds: int = 5,
) -> dict[str, dict[str, float]]:
    """Times each run's function in interleaved rounds; figures per run.

    ``runs`` maps a name to a function and the argument tuples it cycles
    through. Every function is warmed up first, then they are timed round by
    round in turn (the order alternating between rounds), so slow drifts of a
    shared machine reach each of them alike: up to ``max_rounds`` rounds of
    at least 10 steps. Each keeps its best round (the one least disturbed by
    other processes), the mean and median over all rounds, and
    the most memory any of its rounds added (RSS, and TF's CPU allocator where
    it keeps statistics).
    """
    for function, inputs in runs.values():
        for i in range(warmup):
            function(*inputs[i % len(inputs)]).numpy()
    gc.collect()
    rounds = max(1, min(max_rounds, steps // 10))
    per_round = max(1, steps // rounds)
    names = list(runs)
    figures = {name: _RoundFigures() for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            function, inputs = runs[name]
            figures[name].add(*_time_round(function, inputs, r * per_round, per_round))
    return {name: figures[name].summary(rounds * per_round) for name in names}


def _release_memory() -> None:
    """Drops what Keras and Python still hold of the last measurement."""
    keras.backend.clear_session()
    gc.collect()


# The BenchmarkConfig fields that a result's "config" records.
_RECORDED_SETTINGS = (
    "vocab",
    "width",
    "batch",
    "ids_per_sample",
    "permitted_fraction",
    "steps",
    "baseline_steps",
    "max_rounds",
)


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """What one run of the benchmark measures (the defaults: a 1M x 128 table).

    Attributes:
      vocab, width: Table shape ``V x D`` of the comparison.
      batch, ids_per_sample: Each step looks up ``batch x ids_per_sample`` ids.
      permitted_fraction: Fraction of rows that may learn (chosen at random).
      steps: Timed steps of the fast variants (``FAST_VARIANTS``).
      baseline_steps: Timed steps of ``keras`` and ``dense_mask`` (slow).
      max_rounds: Most interleaved rounds the steps are split into (each of
        at least 10 steps); more rounds give steadier medians on a busy machine.
      warmup: Untimed steps first (tracing, first-touch of the slots).
      scaling_vocabs: Other vocabulary sizes at which ``partial`` is timed
        (and ``partial_xla`` with it, interleaved, where it is among ``variants``).
      variants: Which of ``VARIANTS``.
      seed: Seed of the ids and masks; None for fresh randomness.
      update_only_steps: Timed steps of the optimizer update alone (``partial``
        against ``stock_tf``, and ``partial_xla`` where it is among
        ``variants``, same fixed gradients); 0 skips it.
    """

    vocab: int = 1_000_000
    width: int = 128
    batch: int = 256
    ids_per_sample: int = 16
    permitted_fraction: float = 0.5
    steps: int = 100
    baseline_steps: int = 5
    max_rounds: int = 5
    warmup: int = 3
    scaling_vocabs: Sequence[int] = (100_000, 4_000_000)
    variants: Sequence[str] = VARIANTS
    seed: int | None = None
    update_only_steps: int = 100

    @property
    def table_mib(self) -> float:
        """The size of one table."""
        return self.vocab * self.width * 4 / 2**20

    def summary(self) -> dict[str, Any]:
        """The settings that the result's ``"config"`` records."""
        return {name: getattr(self, name) for name in _RECORDED_SETTINGS}

    def variant_groups(self) -> list[tuple[list[str], int]]:
        """The variants timed together, each group with its step count.

        The fast variants are timed together, round by round in turn; the
        slow baselines (seconds per step) each on their own.
        """
        fast = [v for v in self.variants if v in FAST_VARIANTS]
        slow = [([v], self.baseline_steps) for v in self.variants if v not in fast]
        return ([(fast, self.steps)] if fast else []) + slow

    def scaled_variants(self) -> list[str]:
        """The variants timed at ``scaling_vocabs``: ``partial`` always,
        ``partial_xla`` where it is among ``variants``."""
        return [v for v in SCALED_VARIANTS if v == "partial" or v in self.variants]

    def scaling_vocabs_to_time(self, partial_timed: bool) -> list[int]:
        """The ``scaling_vocabs`` still to time ``partial`` at; ``vocab``
        itself once at most, and not at all where ``partial_timed``."""
        todo = []
        for other in self.scaling_vocabs:
            if other == self.vocab:
                if partial_timed:
                    continue
                partial_timed = True
            todo.append(other)
        return todo


def _time_variants(
    variants: Sequence[str], config: BenchmarkConfig, steps: int, rng: np.random.Generator
) -> dict[str, dict[str, float]]:
    """Builds the variants at ``config``'s shape and times their training
    steps, interleaved."""
    permitted = rng.random(config.vocab) < config.permitted_fraction
    built = {
        variant: build_variant(
            variant, config.vocab, config.width, permitted, config.ids_per_sample
        )
        for variant in variants
    }
    batches = [
        (
            tf.constant(
                rng.integers(0, config.vocab, (config.batch, config.ids_per_sample)), tf.int32
            ),
            tf.constant(rng.normal(size=(config.batch, 1)), tf.float32),
        )
        for _ in range(min(steps, 16))
    ]
    runs = {variant: (step, batches) for variant, (step, _) in built.items()}
    results = _interleaved_rounds(runs, steps, config.warmup, config.max_rounds)
    del built, batches, runs
    _release_memory()
    return results


def _masked_adam_update(
    vocab: int, width: int, permitted: np.ndarray, jit_compile: bool = False
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``MaskedOptimizer(Adam).apply`` on a table of its own, as a function
    of a sparse gradient's indices and values (compiled with XLA where
    ``jit_compile``)."""
    dense_shape = tf.constant([vocab, width], tf.int32)
    layer = PartialEmbedding(vocab, width, trainable_ids=permitted)
    layer.build((None,))
    optimizer = MaskedOptimizer(keras.optimizers.Adam())
    optimizer.build([layer.embeddings])

    @tf.function(jit_compile=jit_compile)
    def update(indices: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        gradient = tf.IndexedSlices(values, indices, dense_shape)
        optimizer.apply([gradient], [layer.embeddings])
        return optimizer.iterations

    return update


def _update_only_runs(
    vocab: int, width: int, permitted: np.ndarray, xla: bool = False
) -> dict[str, Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]:
    """The optimizer update alone, as a function of a sparse gradient's
    indices and values: ``partial`` is ``MaskedOptimizer(Adam).apply``,
    ``stock_tf`` the same lazy masked Adam written with stock TF ops and,
    where ``xla``, ``partial_xla`` the first compiled with XLA."""
    tables, mask, step_count = stock_tf_tables(vocab, width, permitted)

    @tf.function
    def stock_tf_step_update(indices: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        stock_tf_update(tables, mask, step_count, tf.IndexedSlices(values, indices))
        return step_count.read_value()

    runs = {
        "partial": _masked_adam_update(vocab, width, permitted),
        "stock_tf": stock_tf_step_update,
    }
    if xla:
        runs["partial_xla"] = _masked_adam_update(vocab, width, permitted, jit_compile=True)
    return runs


def _time_updates_only(config: BenchmarkConfig, rng: np.random.Generator) -> dict[str, float]:
    """Best-round ms of the optimizer update alone (``_update_only_runs``),
    both fed the same fixed sparse gradients of ``batch x ids_per_sample``
    rows in interleaved rounds: the part of the step that the fused kernel
    replaces; with ``"stock_tf_over_partial"`` (and ``"partial_xla"``,
    ``"partial_xla_over_partial"`` where ``partial_xla`` is among the variants)."""
    num_ids = config.batch * config.ids_per_sample
    permitted = rng.random(config.vocab) < config.permitted_fraction
    gradients = [
        (
            tf.constant(rng.integers(0, config.vocab, num_ids), tf.int32),
            tf.constant(rng.normal(size=(num_ids, config.width)) * 1e-3, tf.float32),
        )
        for _ in range(min(config.update_only_steps, 16))
    ]
    updates = _update_only_runs(
        config.vocab, config.width, permitted, xla="partial_xla" in config.variants
    )
    runs = {name: (update, gradients) for name, update in updates.items()}
    figures = _interleaved_rounds(runs, config.update_only_steps, config.warmup, config.max_rounds)
    del updates, gradients, runs
    _release_memory()
    update_only = {name: result["step_ms"] for name, result in figures.items()}
    for name in ("stock_tf", "partial_xla"):
        if name in update_only:
            update_only[f"{name}_over_partial"] = update_only[name] / update_only["partial"]
    return update_only


# -- results and their report --------------------------------------------------


@dataclasses.dataclass
class TrainingBenchmark:
    """The figures of one run of the benchmark.

    Attributes:
      config: What was measured.
      variants: Per variant, ``"step_ms"`` (best round of up to
        ``max_rounds``), ``"mean_step_ms"``, ``"median_step_ms"``,
        ``"steps"``, ``"peak_rss_growth_mib"`` and ``"peak_step_alloc_mib"``
        (TF's CPU allocator, where it keeps statistics).
      update_only: ``{"partial": ms, "stock_tf": ms, "stock_tf_over_partial": x}``
        of the optimizer update alone (with ``"partial_xla"`` and
        ``"partial_xla_over_partial"`` where that variant was timed); empty
        when skipped.
      scaling_points: ``partial``'s figures at the other vocabulary sizes, in
        the order they were timed.
      xla_scaling_points: ``partial_xla``'s at the same sizes, timed in the
        same rounds; empty where it was not among the variants.
    """

    config: BenchmarkConfig
    variants: dict[str, dict[str, float]]
    update_only: dict[str, float] = dataclasses.field(default_factory=dict)
    scaling_points: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)
    xla_scaling_points: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)

    def _over_partial(self, figure: str) -> dict[str, float]:
        if "partial" not in self.variants:
            return {}
        base = self.variants["partial"][figure]
        return {
            f"{variant}_over_partial": figures[figure] / base
            for variant, figures in self.variants.items()
            if variant != "partial"
        }

    @property
    def ratios(self) -> dict[str, float]:
        """Each variant's step time over ``partial``'s, as ``"<name>_over_partial"``."""
        return self._over_partial("step_ms")

    @property
    def median_ratios(self) -> dict[str, float]:
        """``ratios`` of the median rounds (steadier on a busy machine)."""
        return self._over_partial("median_step_ms")

    def _scaling_of(
        self, variant: str, points: list[tuple[int, dict[str, float]]]
    ) -> dict[int, float]:
        scaling = {}
        if self.config.scaling_vocabs and variant in self.variants:
            scaling[self.config.vocab] = self.variants[variant]["step_ms"]
        for vocab, figures in points:
            scaling[vocab] = figures["step_ms"]
        return scaling

    @property
    def scaling(self) -> dict[int, float]:
        """``partial``'s step ms per vocabulary size (empty without ``scaling_vocabs``)."""
        return self._scaling_of("partial", self.scaling_points)

    @property
    def scaling_ratio(self) -> float | None:
        """Step time at the largest V over that at the smallest; None below two sizes."""
        return _largest_over_smallest(self.scaling)

    @property
    def xla_scaling(self) -> dict[int, float]:
        """``partial_xla``'s step ms per vocabulary size (empty where not timed)."""
        return self._scaling_of("partial_xla", self.xla_scaling_points)

    @property
    def xla_scaling_ratio(self) -> float | None:
        """``scaling_ratio`` of ``partial_xla``."""
        return _largest_over_smallest(self.xla_scaling)

    @property
    def xla_over_partial_by_vocab(self) -> dict[int, float]:
        """``partial_xla``'s step time over ``partial``'s, per vocabulary size
        at which both were timed in the same rounds."""
        scaling = self.scaling
        return {
            vocab: step_ms / scaling[vocab]
            for vocab, step_ms in self.xla_scaling.items()
            if vocab in scaling
        }

    def as_dict(self) -> dict[str, Any]:
        """The figures as ``run_benchmark`` returns them."""
        return {
            "config": self.config.summary(),
            "variants": self.variants,
            "ratios": self.ratios,
            "median_ratios": self.median_ratios,
            "update_only": self.update_only,
            "scaling": self.scaling,
            "scaling_ratio": self.scaling_ratio,
            "xla_scaling": self.xla_scaling,
            "xla_scaling_ratio": self.xla_scaling_ratio,
            "xla_over_partial_by_vocab": self.xla_over_partial_by_vocab,
            "table_mib": self.config.table_mib,
        }


def _largest_over_smallest(scaling: dict[int, float]) -> float | None:
    """Step time at the largest V over that at the smallest; None below two sizes."""
    if len(scaling) < 2:
        return None
    return scaling[max(scaling)] / scaling[min(scaling)]


def _quiet(*args: Any, **kwargs: Any) -> None:
    pass


class BenchmarkReport:
    """Prints the figures as they come in; says nothing when not ``verbose``."""

    def __init__(self, verbose: bool = True) -> None:
        self.say: Callable[..., None] = print if verbose else _quiet

    def setting(self, config: BenchmarkConfig) -> None:
        self.say(
            f"V={config.vocab:,} D={config.width} batch={config.batch}x{config.ids_per_sample} "
            f"ids, {config.permitted_fraction:.0%} of rows permitted; "
            f"one table = {config.table_mib:.0f} MiB"
        )

    def variants(self, figures_of: dict[str, dict[str, float]], steps: int) -> None:
        for variant, figures in figures_of.items():
            self.say(
                f"  {variant:<18} {figures['step_ms']:9.3f} ms/step "
                f"(mean {figures['mean_step_ms']:9.3f}, median {figures['median_step_ms']:9.3f}) "
                f"(peak RSS growth {figures.get('peak_rss_growth_mib', float('nan')):8.1f} "
                f"MiB, TF temporaries {figures.get('peak_step_alloc_mib', float('nan')):8.1f} "
                f"MiB, over {steps} steps)"
            )

    def ratios(
        self, ratios: dict[str, float], median_ratios: dict[str, float] | None = None
    ) -> None:
        for name, ratio in ratios.items():
            median = (median_ratios or {}).get(name)
            medians = "" if median is None else f" (medians {median:.2f}x)"
            self.say(f"  {name:<33} {ratio:8.2f}x{medians}")

    def update_only(self, config: BenchmarkConfig, update_only: dict[str, float]) -> None:
        self.say(
            f"  optimizer update alone ({config.batch * config.ids_per_sample:,} gradient rows): "
            f"partial {update_only['partial']:.3f} ms, stock_tf {update_only['stock_tf']:.3f} ms, "
            f"{update_only['stock_tf_over_partial']:.1f}x"
        )
        if "partial_xla" in update_only:
            self.say(
                f"  optimizer update alone under XLA: partial_xla "
                f"{update_only['partial_xla']:.3f} ms, "
                f"{update_only['partial_xla_over_partial']:.2f}x partial"
            )

    def scaling_point(
        self, vocab: int, figures: dict[str, float], xla_figures: dict[str, float] | None = None
    ) -> None:
        self.say(
            f"  partial at V={vocab:>10,}: {figures['step_ms']:.3f} ms/step "
            f"(median {figures['median_step_ms']:.3f}, peak RSS growth "
            f"{figures.get('peak_rss_growth_mib', float('nan')):.1f} MiB)"
        )
        if xla_figures is not None:
            self.say(
                f"  partial_xla at V={vocab:>10,}: {xla_figures['step_ms']:.3f} ms/step, "
                f"{xla_figures['step_ms'] / figures['step_ms']:.2f}x partial "
                f"(median {xla_figures['median_step_ms']:.3f}, "
                f"{xla_figures['median_step_ms'] / figures['median_step_ms']:.2f}x; "
                f"peak RSS growth "
                f"{xla_figures.get('peak_rss_growth_mib', float('nan')):.1f} MiB)"
            )

    def scaling_ratio(self, result: TrainingBenchmark) -> None:
        for name, scaling, ratio in (
            ("", result.scaling, result.scaling_ratio),
            ("partial_xla ", result.xla_scaling, result.xla_scaling_ratio),
        ):
            if ratio is not None:
                self.say(
                    f"  {name}step time V={max(scaling):,} / V={min(scaling):,}: "
                    f"{ratio:.2f}x (target <= 1.3x)"
                )


def measure(config: BenchmarkConfig, report: BenchmarkReport | None = None) -> TrainingBenchmark:
    """Times a training step of each variant, the update alone and the
    scaling with V, as ``config`` asks; ``report`` shows figures as they come."""
    report = report or BenchmarkReport(verbose=False)
    rng = np.random.default_rng(config.seed)
    report.setting(config)
    timed: dict[str, dict[str, float]] = {}
    for group, steps in config.variant_groups():
        figures = _time_variants(group, config, steps, rng)
        report.variants(figures, steps)
        timed.update(figures)
    result = TrainingBenchmark(config, {variant: timed[variant] for variant in config.variants})
    report.ratios(result.ratios, result.median_ratios)
    if config.update_only_steps and {"partial", "stock_tf"} <= set(result.variants):
        result.update_only = _time_updates_only(config, rng)
        report.update_only(config, result.update_only)
    for vocab in config.scaling_vocabs_to_time("partial" in result.variants):
        figures = _time_variants(
            config.scaled_variants(), dataclasses.replace(config, vocab=vocab), config.steps, rng
        )
        result.scaling_points.append((vocab, figures["partial"]))
        if "partial_xla" in figures:
            result.xla_scaling_points.append((vocab, figures["partial_xla"]))
        report.scaling_point(vocab, figures["partial"], figures.get("partial_xla"))
    report.scaling_ratio(result)
    return result


def run_benchmark(
    config: BenchmarkConfig | None = None, *, verbose: bool = True, **settings: Any
) -> dict[str, Any]:
    """Times a training step of each variant; returns the figures.

    Args:
      config: What to measure; the defaults of ``BenchmarkConfig`` without it.
      verbose: Print a table as figures come in.
      **settings: ``BenchmarkConfig`` fields that replace those of ``config``
        (``run_benchmark(vocab=20_000, steps=3)``).

    Returns:
      ``{"config": ..., "variants": {name: {"step_ms" (best round of up to
      max_rounds), "mean_step_ms", "median_step_ms", "steps",
      "peak_rss_growth_mib", "peak_step_alloc_mib" (TF's CPU allocator, where
      it keeps statistics)}}, "ratios": {"<name>_over_partial": x} (best
      rounds), "median_ratios": the same of the medians over rounds,
      "update_only": {"partial": ms, "stock_tf": ms, "stock_tf_over_partial": x,
      "partial_xla": ms, "partial_xla_over_partial": x} (empty when skipped; the
      last two where partial_xla is among the variants),
      "scaling": {V: step_ms}, "scaling_ratio": step(max V) / step(min V),
      "xla_scaling", "xla_scaling_ratio": the same of partial_xla,
      "xla_over_partial_by_vocab": {V: partial_xla / partial, same rounds},
      "table_mib": one table's size}`` (``TrainingBenchmark.as_dict``).
    """
    config = dataclasses.replace(config or BenchmarkConfig(), **settings)
    return measure(config, BenchmarkReport(verbose)).as_dict()


def _parser() -> argparse.ArgumentParser:
    defaults = BenchmarkConfig()
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --training",
        description=__doc__.split("\n\n")[0],
    )
    for name in (*_RECORDED_SETTINGS, "warmup"):
        default = getattr(defaults, name)
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    parser.add_argument(
        "--scaling-vocabs",
        type=int,
        nargs="*",
        default=list(defaults.scaling_vocabs),
        help="other V at which to time partial and partial_xla (none: skip)",
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--update-only-steps",
        type=int,
        default=defaults.update_only_steps,
        help="timed steps of the optimizer update alone (0: skip)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line entry point; prints the figures and returns them."""
    return run_benchmark(BenchmarkConfig(**vars(_parser().parse_args(argv))))


if __name__ == "__main__":
    main()
