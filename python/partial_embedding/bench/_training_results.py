"""What a run of the training benchmark measures, and what it found.

``BenchmarkConfig`` is what one run of ``python -m partial_embedding.bench
--training`` measures; ``TrainingBenchmark`` holds its figures and the ones
that follow from them (the embedding costs, where the run resolves them, and
the ratios of ``bench._floors.derived_figures``). The benchmark
(``bench._training``), its report (``bench._training_report``) and the
update-only timing (``bench._update_only``) all read them from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from partial_embedding.bench._floors import derived_figures, embedding_costs
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
