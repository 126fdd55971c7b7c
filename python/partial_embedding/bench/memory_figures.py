"""What the memory benchmark measures and predicts: its cases, figures and the largest table."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "END",
    "EXTRA_VARIANTS",
    "GIB",
    "INT8_VARIANTS",
    "MIB",
    "PHASES",
    "RUNNABLE_VARIANTS",
    "TRANSIENT",
    "VARIANTS",
    "VARIANT_LABELS",
    "LargestTable",
    "MemoryBenchmark",
    "MemoryCase",
    "MemoryMeasurement",
    "fit_peak_line",
    "predict_largest",
    "short_count",
]

VARIANTS = ("partial", "partial_mmap", "keras", "stock_tf", "int8_quantize", "int8_mmap")
#: Known to the benchmark but not run by default: an int8 layer built from
#: its initializer (no float file), for the largest tables.
EXTRA_VARIANTS = ("int8_init",)
#: The variants whose frozen rows are int8 (``partial_embedding.bench.quantized``).
INT8_VARIANTS = ("int8_quantize", "int8_mmap", "int8_init")
# A self-check of the sampler, not a configuration: a table-sized NumPy
# array allocated, filled and freed at once (three times over).
TRANSIENT = "numpy_transient"
#: Every name ``--variants`` and ``measure_case`` take.
RUNNABLE_VARIANTS = (*VARIANTS, *EXTRA_VARIANTS, TRANSIENT)
PHASES = ("construction", "first_step", "steady")
VARIANT_LABELS = {
    "partial": "PartialEmbedding + MaskedOptimizer(Adam)",
    "partial_mmap": 'the same, weights=np.load(..., mmap_mode="r")',
    "keras": "stock keras.layers.Embedding + Adam",
    "stock_tf": "stock TF ops, lazy Adam",
    "int8_quantize": 'PartialEmbedding, then layer.quantize("int8")',
    "int8_mmap": 'PartialEmbedding(dtype="int8_from_float32", weights=np.load(mmap))',
    "int8_init": 'PartialEmbedding(dtype="int8_from_float32"), initializer',
    TRANSIENT: "a table-sized NumPy array, allocated and freed",
}
MIB = 2**20
GIB = 2**30
#: The phase a child announces when it has finished.
END = "end"


def short_count(count: int) -> str:
    if count % 1_000_000 == 0:
        return f"{count // 1_000_000}M"
    if count % 1_000 == 0:
        return f"{count // 1_000}k"
    if count > 1 and count & (count - 1) == 0:
        return f"2^{count.bit_length() - 1}"
    return f"{count:,}"


# -- what is measured -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MemoryCase:
    """One configuration, measured in a process of its own.

    Attributes:
      variant: One of ``VARIANTS`` or ``EXTRA_VARIANTS`` (or ``"numpy_transient"``).
      vocab, width: The table is ``vocab x width`` float32 (int8 variants
        hold it in int8, but their figures are multiples of the float32 table).
      permitted_fraction: Fraction of rows that may learn (random, fixed seed).
      batch, ids_per_sample: Each step looks up ``batch x ids_per_sample`` ids,
        drawn among all rows.
      steps: Steps of the steady phase (after the first).
      seed: Seed of the permitted rows, the ids and the targets.
    """

    variant: str = "partial"
    vocab: int = 1_000_000
    width: int = 128
    permitted_fraction: float = 0.01
    batch: int = 256
    ids_per_sample: int = 16
    steps: int = 10
    seed: int = 0

    @property
    def table_bytes(self) -> int:
        return self.vocab * self.width * 4

    @property
    def label(self) -> str:
        return f"{self.variant} V={short_count(self.vocab)}"


@dataclasses.dataclass
class MemoryMeasurement:
    """What one configuration took, over its process's baseline.

    Attributes:
      case: The configuration.
      status: ``"ok"``, or why the run did not finish (killed by the
        watchdog, a nonzero exit and the end of its stderr).
      baseline_anon_bytes: The child's ``RssAnon`` after imports and warm-up.
      baseline_rss_bytes: Its whole resident set then (what the process
        itself costs before any table).
      phase_peak_bytes: Per phase reached, the highest ``RssAnon`` sample
        over the baseline.
      phase_end_bytes: Per phase reached, ``RssAnon`` over the baseline when
        it ended (what it kept).
      optimizer_bytes: Sum over the optimizer's variables (None where the run
        did not get that far).
      samples: How many samples the parent took.
      seconds: Wall time of the child.
      child_figures: What the child reported of itself: the bytes of each
        variable of the layer and the optimizer, the allocators' figures at
        the end, and for int8 variants whether a sample of frozen rows kept
        its int8 bytes and scales.
    """

    case: MemoryCase
    status: str = "ok"
    baseline_anon_bytes: int = 0
    baseline_rss_bytes: int = 0
    phase_peak_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    phase_end_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    optimizer_bytes: int | None = None
    samples: int = 0
    seconds: float = 0.0
    child_figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def peak_bytes(self) -> int:
        """The highest sample over the baseline, any phase."""
        return max(self.phase_peak_bytes.values(), default=0)

    def multiple(self, phase: str | None = None) -> float:
        """A phase's peak (None: the highest) as a multiple of the table."""
        peak = self.peak_bytes if phase is None else self.phase_peak_bytes.get(phase, 0)
        return peak / self.case.table_bytes

    @property
    def steady_multiple(self) -> float:
        """What the process still held after the steady steps (``RssAnon``
        when the steady phase ended, over the baseline), x table."""
        return self.phase_end_bytes.get("steady", 0) / self.case.table_bytes

    @property
    def optimizer_multiple(self) -> float | None:
        if self.optimizer_bytes is None:
            return None
        return self.optimizer_bytes / self.case.table_bytes

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryMeasurement:
        """The inverse of ``to_dict`` (its derived figures are recomputed)."""
        names = {field.name for field in dataclasses.fields(cls)} - {"case"}
        fields = {name: data[name] for name in names if name in data}
        return cls(case=MemoryCase(**data["case"]), **fields)

    def to_dict(self) -> dict[str, Any]:
        result = dataclasses.asdict(self)
        result["table_bytes"] = self.case.table_bytes
        result["peak_bytes"] = self.peak_bytes
        result["peak_multiple"] = self.multiple()
        result["phase_multiple"] = {p: self.multiple(p) for p in self.phase_peak_bytes}
        result["optimizer_multiple"] = self.optimizer_multiple
        result["steady_multiple"] = self.steady_multiple
        return result


@dataclasses.dataclass
class LargestTable:
    """The largest table of one variant that should train within a budget.

    ``peak = fixed_bytes + per_table_byte * table_bytes`` is the line through
    the measured points; the prediction leaves ``margin`` of the budget free
    and the process's baseline resident set (``process_bytes``) aside.
    ``rows_at_memory_total`` is the same arithmetic for a budget of the
    whole ``MemTotal`` (a prediction only). ``confirmation`` is the run at
    ``rows`` (None where not run).
    """

    variant: str
    width: int
    per_table_byte: float
    fixed_bytes: float
    process_bytes: int
    budget_bytes: int
    margin: float
    rows: int
    memory_total_bytes: int
    rows_at_memory_total: int = 0
    confirmation: MemoryMeasurement | None = None

    @property
    def table_bytes(self) -> int:
        return self.rows * self.width * 4

    @property
    def fraction_of_memory(self) -> float:
        """The table's size as a fraction of the machine's ``MemTotal``."""
        return self.table_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0

    @property
    def confirmed(self) -> bool | None:
        return None if self.confirmation is None else self.confirmation.ok

    def to_dict(self) -> dict[str, Any]:
        result = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "confirmation"
        }
        result["table_bytes"] = self.table_bytes
        result["fraction_of_memory"] = self.fraction_of_memory
        result["confirmed"] = self.confirmed
        result["confirmation"] = self.confirmation.to_dict() if self.confirmation else None
        return result


@dataclasses.dataclass
class MemoryBenchmark:
    """A whole run: the machine, each configuration, the largest tables."""

    machine: dict[str, Any]
    measurements: list[MemoryMeasurement]
    largest: dict[str, LargestTable] = dataclasses.field(default_factory=dict)
    #: Runs of ``--int8-largest``: int8 tables confirmed (or not) to train.
    int8_confirmations: list[MemoryMeasurement] = dataclasses.field(default_factory=list)

    @property
    def largest_ratio(self) -> float | None:
        """Rows of ours (``partial``) over rows of stock Keras, where both exist."""
        ours, stock = self.largest.get("partial"), self.largest.get("keras")
        if ours is None or stock is None or stock.rows <= 0:
            return None
        return ours.rows / stock.rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "phases": list(PHASES),
            "measurements": [m.to_dict() for m in self.measurements],
            "largest": {name: table.to_dict() for name, table in self.largest.items()},
            "largest_ratio_partial_over_keras": self.largest_ratio,
            "int8_largest": [m.to_dict() for m in self.int8_confirmations],
        }


# -- the largest table ------------------------------------------------------------------


def fit_peak_line(points: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """``(fixed, per_table_byte)`` of ``peak = fixed + per_table_byte * table``.

    ``points`` are ``(table_bytes, peak_bytes)``. With one point, or where the
    least-squares slope is not positive (noise between close sizes), the line
    goes through the origin and the largest point: the cautious choice.

    >>> fixed, per_table_byte = fit_peak_line([(100, 600), (200, 1100)])
    >>> round(fixed), round(per_table_byte, 6)
    (100, 5.0)
    """
    if not points:
        raise ValueError("points: need at least one (table_bytes, peak_bytes)")
    tables = np.array([p[0] for p in points], dtype=np.float64)
    peaks = np.array([p[1] for p in points], dtype=np.float64)
    if len(set(tables.tolist())) >= 2:
        slope, intercept = np.polyfit(tables, peaks, 1)
        if slope > 0:
            return max(0.0, float(intercept)), float(slope)
    largest = int(np.argmax(tables))
    return 0.0, float(peaks[largest] / tables[largest])


def predict_largest(
    variant: str,
    points: Sequence[tuple[int, int]],
    *,
    width: int,
    process_bytes: int,
    budget_bytes: int,
    memory_total_bytes: int,
    margin: float = 0.1,
    row_multiple: int = 1024,
) -> LargestTable:
    """The largest ``rows x width`` float32 table whose predicted peak fits.

    ``budget * (1 - margin) >= process_bytes + fixed + per_table_byte * table``,
    with the line of ``fit_peak_line(points)``; rows are rounded down to a
    multiple of ``row_multiple`` (0 where nothing fits).

    >>> gib = 2**30
    >>> largest = predict_largest(
    ...     "partial", [(gib, 5 * gib)], width=128, process_bytes=0,
    ...     budget_bytes=10 * gib, memory_total_bytes=20 * gib, margin=0.1,
    ... )
    >>> round(largest.table_bytes / gib, 3), round(largest.fraction_of_memory, 3)
    (1.8, 0.09)
    """
    fixed, per_table_byte = fit_peak_line(points)

    def fitting_rows(budget: int) -> int:
        usable = budget * (1.0 - margin) - process_bytes - fixed
        table_bytes = max(0.0, usable / per_table_byte)
        return int(table_bytes // (width * 4)) // row_multiple * row_multiple

    return LargestTable(
        variant=variant,
        width=width,
        per_table_byte=per_table_byte,
        fixed_bytes=fixed,
        process_bytes=process_bytes,
        budget_bytes=budget_bytes,
        margin=margin,
        rows=fitting_rows(budget_bytes),
        memory_total_bytes=memory_total_bytes,
        rows_at_memory_total=fitting_rows(memory_total_bytes),
    )
