"""What a run of the training benchmark measures, and what it found.

``BenchmarkConfig`` is what one run of ``python -m partial_embedding.bench
--training`` measures; ``TrainingBenchmark`` holds its figures and the ones
that follow from them (the embedding costs, where the run resolves them, and
the ratios of ``bench._floors.derived_figures``); the benchmark
(``bench._training``) reads them from here, and ``vocab_table`` and the
report below print them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from partial_embedding.bench._floors import (
    DERIVED,
    HEAD_FLOOR_OF,
    UNRESOLVED_NOTE,
    derived_figures,
    embedding_costs,
)
from partial_embedding.bench._models import DEFAULT_RULE, VARIANTS

#: The variants timed together in interleaved rounds (milliseconds a step).
FAST_VARIANTS = ("partial", "partial_xla", "partial_full_slots", "stock_tf")

#: Left out of a group where too little memory is free when it is built (the
#: others first): a machine shared with other processes is not driven into its
#: out-of-memory killer. ``partial`` and ``partial_xla`` are always built.
SKIPPABLE = ("stock_tf", "partial_full_slots", "bare_loop")

#: The variants timed again at each of ``scaling_vocabs``, together (with the floors).
SCALED_VARIANTS = ("partial", "partial_xla", "stock_tf")

#: What is lazy Adam written out by hand (stock TF ops, the C++ Adam rows
#: alone): timed under ``adam`` only, left out under any other rule.
ADAM_ONLY = ("stock_tf", "bare_loop")


#: The BenchmarkConfig fields that a result's "config" records.
RECORDED_SETTINGS = (
    "vocab",
    "width",
    "batch",
    "ids_per_sample",
    "permitted_fraction",
    "steps",
    "baseline_steps",
    "max_rounds",
    "floors",
    "optimizer",
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
        (and ``partial_xla`` and ``stock_tf`` with it, interleaved, where they
        are among ``variants``, and the floors).
      variants: Which of ``VARIANTS``.
      seed: Seed of the ids and masks; None for fresh randomness.
      update_only_steps: Timed steps of the optimizer update alone (``partial``
        against ``stock_tf``, and ``partial_xla`` where it is among
        ``variants``, same fixed gradients); 0 skips it.
      floors: Time the floors of ``bench._floors`` (``FLOORS``) with
        ``partial`` at every vocabulary size, in the same rounds.
      isolate_scaling: Time each of ``scaling_vocabs`` in a Python process of
        its own, before the main group (TensorFlow keeps the buffers of
        variables a traced step captured until the process ends, so sizes
        timed in one process pile their tables up); the command line's default.
      optimizer: The rule of ``bench._models.RULES`` that every Keras-optimizer
        variant trains with (the heads of the floors keep Adam); under any
        other than ``adam``, what is lazy Adam written out by hand
        (``ADAM_ONLY``, and the update-only comparison with ``stock_tf``) is
        left out.
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
    floors: bool = True
    isolate_scaling: bool = False
    optimizer: str = DEFAULT_RULE

    @property
    def table_mib(self) -> float:
        """The size of one table."""
        return self.vocab * self.width * 4 / 2**20

    @property
    def adam_only_left_out(self) -> tuple[str, ...]:
        """``ADAM_ONLY`` under any rule but ``adam``; empty under it."""
        return () if self.optimizer == "adam" else ADAM_ONLY

    def summary(self) -> dict[str, Any]:
        """The settings that the result's ``"config"`` records."""
        return {name: getattr(self, name) for name in RECORDED_SETTINGS}

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
        ``partial_xla`` and ``stock_tf`` where they are among ``variants``."""
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
      by_vocab: Per vocabulary size, the figures of ``partial``,
        ``partial_xla``, ``stock_tf`` and the floors timed there in the same
        rounds (those among the variants, the floors where ``config.floors``).
      skipped: Per vocabulary size, the variants and floors left out for
        lack of free memory (``SKIPPABLE``), each with the reason.
    """

    config: BenchmarkConfig
    variants: dict[str, dict[str, float]]
    update_only: dict[str, float] = dataclasses.field(default_factory=dict)
    scaling_points: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)
    xla_scaling_points: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)
    by_vocab: dict[int, dict[str, dict[str, float]]] = dataclasses.field(default_factory=dict)
    skipped: dict[int, dict[str, str]] = dataclasses.field(default_factory=dict)

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
        return largest_over_smallest(self.scaling)

    @property
    def xla_scaling(self) -> dict[int, float]:
        """``partial_xla``'s step ms per vocabulary size (empty where not timed)."""
        return self._scaling_of("partial_xla", self.xla_scaling_points)

    @property
    def xla_scaling_ratio(self) -> float | None:
        """``scaling_ratio`` of ``partial_xla``."""
        return largest_over_smallest(self.xla_scaling)

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

    @property
    def embedding_cost(self) -> dict[int, dict[str, float]]:
        """Per vocabulary size, each step's best round less its head-only
        floor's, where the run resolves it (``_floors.embedding_costs``): the
        embedding's own cost in ms."""
        return {vocab: embedding_costs(figures) for vocab, figures in self.by_vocab.items()}

    @property
    def derived(self) -> dict[str, Any]:
        """The costs and ratios that follow from ``by_vocab`` (``_floors.derived_figures``)."""
        return derived_figures(self.by_vocab)

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
            "by_vocab": dict(sorted(self.by_vocab.items())),
            "embedding_cost": dict(sorted(self.embedding_cost.items())),
            "derived": self.derived,
            "skipped": dict(sorted(self.skipped.items())),
            "adam_only_left_out": list(self.config.adam_only_left_out),
            "table_mib": self.config.table_mib,
        }


def largest_over_smallest(scaling: dict[int, float]) -> float | None:
    """Step time at the largest V over that at the smallest; None below two sizes."""
    if len(scaling) < 2:
        return None
    return scaling[max(scaling)] / scaling[min(scaling)]


# -- How the training benchmark prints its figures (``bench._training``) ---------

#: The rows of ``vocab_table``, in order, with what each is.
TABLE_ROWS = (
    ("partial", "partial (kernel step)"),
    ("partial_xla", "partial_xla (XLA step)"),
    ("stock_tf", "stock_tf (stock TF ops)"),
    ("head_only", "head_only (no embedding)"),
    ("head_only_xla", "head_only_xla (the same, XLA)"),
    ("bare_loop", "bare_loop (C++ Adam rows alone)"),
)

_LABEL, _CELL = 44, 13


def _by_vocab(mapping: Mapping[Any, Any]) -> dict[int, Any]:
    """``mapping`` with int keys (JSON turns them into strings), sorted."""
    return {int(key): value for key, value in sorted(mapping.items(), key=lambda kv: int(kv[0]))}


def _cell(value: float | None, spec: str = "9.3f") -> str:
    return f"{'-' if value is None else format(value, spec):>{_CELL}}"


def _heading(title: str, vocabs: Sequence[int]) -> str:
    return f"{title:<{_LABEL}}" + "".join(f"{'V=' + format(v, ','):>{_CELL}}" for v in vocabs)


def _derived_lines(derived: Mapping[str, Any], vocabs: Sequence[int]) -> list[str]:
    lines = []
    for key, description in DERIVED:
        values = _by_vocab(derived.get(key) or {})
        cells = "".join(_cell(values.get(v), "9.2f") for v in vocabs)
        lines.append(f"{'  ' + description:<{_LABEL}}{cells}")
    flat = []
    for name in ("partial", "partial_xla"):
        ratio = derived.get(f"{name}_step_flatness")
        if ratio is not None:
            flat.append(f"{name} {ratio:.2f}x")
    if flat and len(vocabs) >= 2:
        lines.append(f"  step V={max(vocabs):,} / V={min(vocabs):,}: " + ", ".join(flat))
    return lines


def vocab_table(result: Mapping[str, Any]) -> str:
    """The steps and floors timed together at each V, the embedding costs and
    the ratios that follow, as a table with one column per V (empty where
    nothing was timed with the floors); a cost the run does not resolve is
    ``-``, and a note says why.

    Args:
      result: ``TrainingBenchmark.as_dict()`` (or the same read from JSON).
    """
    by_vocab = _by_vocab(result.get("by_vocab") or {})
    if not by_vocab:
        return ""
    vocabs = list(by_vocab)
    lines = [_heading("-- timed together at each V: best round, ms", vocabs)]
    for name, label in TABLE_ROWS:
        if any(name in figures for figures in by_vocab.values()):
            steps = [by_vocab[v].get(name, {}).get("step_ms") for v in vocabs]
            lines.append(f"  {label:<{_LABEL - 2}}" + "".join(_cell(ms) for ms in steps))
    costs = _by_vocab(result.get("embedding_cost") or {})
    lines.append("  embedding cost (step - head-only floor), ms:")
    for variant, floor in HEAD_FLOOR_OF.items():
        if any(variant in by_vocab[v] for v in vocabs):
            label = f"    {variant} - {floor}"
            lines.append(
                f"{label:<{_LABEL}}" + "".join(_cell(costs.get(v, {}).get(variant)) for v in vocabs)
            )
    lines += _derived_lines(result.get("derived") or {}, vocabs)
    if any(
        costs.get(v, {}).get(variant) is None
        for v in vocabs
        for variant in HEAD_FLOOR_OF
        if variant in by_vocab[v]
    ):
        lines.append(f"  ({UNRESOLVED_NOTE})")
    for vocab, skipped in _by_vocab(result.get("skipped") or {}).items():
        for name, reason in skipped.items():
            lines.append(f"  not timed at V={vocab:,}: {name} ({reason})")
    return "\n".join(lines)


def runs_summary(results: Sequence[Mapping[str, Any]]) -> str:
    """The derived figures of several runs side by side: per figure and V,
    each run's figure in order (``-`` where it could not be formed)."""
    vocabs = sorted({int(v) for result in results for v in result.get("by_vocab") or {}})
    if not vocabs:
        return ""
    width = max(_CELL, 7 * len(results) + 2)
    lines = [
        f"{'== ' + str(len(results)) + ' runs: derived figures, run by run':<{_LABEL}}"
        + "".join(f"{'V=' + format(v, ','):>{width}}" for v in vocabs)
    ]
    for key, description in DERIVED:
        per_run = [_by_vocab((result.get("derived") or {}).get(key) or {}) for result in results]
        cells = [
            " ".join("-" if run.get(v) is None else f"{run[v]:.2f}" for run in per_run)
            for v in vocabs
        ]
        lines.append(f"{'  ' + description:<{_LABEL}}" + "".join(f"{c:>{width}}" for c in cells))
    for name in ("partial", "partial_xla"):
        ratios = [(result.get("derived") or {}).get(f"{name}_step_flatness") for result in results]
        if any(ratio is not None for ratio in ratios):
            shown = " ".join("-" if r is None else f"{r:.2f}" for r in ratios)
            lines.append(f"  {name} step V={max(vocabs):,} / V={min(vocabs):,}: {shown}")
    return "\n".join(lines)


def _quiet(*args: Any, **kwargs: Any) -> None:
    pass


class BenchmarkReport:
    """Prints the figures as they come in; says nothing when not ``verbose``."""

    def __init__(self, verbose: bool = True) -> None:
        self.say: Callable[..., None] = print if verbose else _quiet

    def setting(self, config: BenchmarkConfig) -> None:
        """The shape of the run."""
        self.say(
            f"V={config.vocab:,} D={config.width} batch={config.batch}x{config.ids_per_sample} "
            f"ids, {config.permitted_fraction:.0%} of rows permitted, optimizer "
            f"{config.optimizer}; one table = {config.table_mib:.0f} MiB"
        )

    def variants(self, figures_of: dict[str, dict[str, float]], steps: int) -> None:
        """One line per variant (or floor) timed in a group."""
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
        """Each variant's step over ``partial``'s (best rounds, and medians)."""
        for name, ratio in ratios.items():
            median = (median_ratios or {}).get(name)
            medians = "" if median is None else f" (medians {median:.2f}x)"
            self.say(f"  {name:<33} {ratio:8.2f}x{medians}")

    def update_only(self, config: BenchmarkConfig, update_only: dict[str, float]) -> None:
        """The optimizer update alone, ``partial`` against ``stock_tf`` (and XLA)."""
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
        """``partial`` (and ``partial_xla``) at another vocabulary size."""
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
        """Step time at the largest V over the smallest."""
        for name, scaling, ratio in (
            ("", result.scaling, result.scaling_ratio),
            ("partial_xla ", result.xla_scaling, result.xla_scaling_ratio),
        ):
            if ratio is not None:
                self.say(f"  {name}step time V={max(scaling):,} / V={min(scaling):,}: {ratio:.2f}x")

    def skipped(self, vocab: int, skipped: Mapping[str, str]) -> None:
        """What was left out at ``vocab`` for lack of free memory, and why."""
        for name, reason in skipped.items():
            self.say(f"  {name:<18} not timed at V={vocab:,}: {reason}")

    def table(self, result: Mapping[str, Any]) -> None:
        """``vocab_table`` of a run's dict, where it has one."""
        table = vocab_table(result)
        if table:
            self.say(table)
