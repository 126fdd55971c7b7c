"""How the training benchmark prints its figures (``bench._training``).

``BenchmarkReport`` prints the figures of one run as they come in;
``vocab_table`` formats what was timed together at each vocabulary size (the
steps, their floors, the embedding costs where the run resolves them, and the
ratios that follow) from ``TrainingBenchmark.as_dict()``, and ``runs_summary``
the same ratios of several runs side by side. Both work on the dict read back
from the JSON too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from partial_embedding.bench._floors import DERIVED, HEAD_FLOOR_OF, UNRESOLVED_NOTE
from partial_embedding.bench._training_results import BenchmarkConfig, TrainingBenchmark

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
