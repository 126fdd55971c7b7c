"""Memory benchmark: ``python -m partial_embedding.bench --memory``.

How much memory training with a large embedding table takes, per phase, for
the same small model (ids mean-pooled into a ``Dense(1)``, mean squared
error, Adam) built four ways:

* ``partial``: ``PartialEmbedding`` + ``MaskedOptimizer(Adam)``, default
  initializer;
* ``partial_mmap``: the same with ``weights=np.load(path, mmap_mode="r")``
  (the ``.npy`` is written to a temporary folder first, by the parent
  process, and deleted after);
* ``keras``: stock ``keras.layers.Embedding`` + ``Adam``;
* ``stock_tf``: a ``tf.Variable`` table trained by lazy Adam written with
  stock TF ops (gathers and ``scatter_update``; see
  ``partial_embedding.bench._models``).

Each configuration runs in a fresh child process, so peaks never mix. The
parent samples the child's anonymous memory (``RssAnon`` of
``/proc/<pid>/status``) about every millisecond from outside it: a sampler
inside the child would stop whenever the child's own code holds the GIL and
miss the transients that matter most. The child tells the parent where each
phase begins (over a pipe, waiting for the answer, so the boundary is exact).
Figures are relative to the child's baseline: after importing TensorFlow,
Keras and this package and a tiny warm-up (the same variant at 64 rows).

Phases: ``construction`` (the layer, the model, compiling), ``first_step``
(the first training step: optimizer build, tracing), ``steady`` (the next
``--steps`` steps). Each phase's figure is the highest sample in it, over the
baseline, in MiB and as a multiple of the table's size; next to them the
bytes of the optimizer's variables as a multiple of the table.

Then the largest table that trains with Adam here, per variant: a line
``peak = fixed + per_table_byte * table`` through the measured points, solved
for a budget (``MemAvailable`` of ``/proc/meminfo``, or ``--budget-gib``)
less a safety margin, and confirmed by one run at that size (construction and
a few steps). A watchdog kills a run when ``MemAvailable`` falls under
``--min-available-gib`` and reports it as failed.

``measure_case`` (``bench._memory_process``: the child and the sampler)
returns a ``MemoryMeasurement``; ``run`` returns a ``MemoryBenchmark``;
``report`` prints one; ``write_svg`` draws one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import xml.sax.saxutils
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from partial_embedding.bench._memory_process import (
    GIB,
    INT8_VARIANTS,
    MIB,
    PHASES,
    RUNNABLE_VARIANTS,
    TRANSIENT,
    VARIANTS,
    MemoryCase,
    MemoryMeasurement,
    measure_case,
    memory_available_bytes,
    memory_total_bytes,
)

# What tests and tools read from here: the case, its measurement and the sampler.
__all__ = [
    "PHASES",
    "TRANSIENT",
    "LargestTable",
    "MemoryBenchmark",
    "MemoryCase",
    "MemoryMeasurement",
    "fit_peak_line",
    "main",
    "measure_case",
    "parse_args",
    "predict_largest",
    "report",
    "report_breakdown",
    "run",
    "write_svg",
]


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


# -- printing and drawing -------------------------------------------------------------


def _mib(value: float) -> str:
    return f"{value / MIB:9.1f}"


def report_measurement(measurement: MemoryMeasurement, stream: TextIO) -> None:
    case = measurement.case
    cells = []
    for phase in PHASES:
        if phase in measurement.phase_peak_bytes:
            cells.append(
                f"{_mib(measurement.phase_peak_bytes[phase])} {measurement.multiple(phase):5.2f}x"
            )
        else:
            cells.append(f"{'-':>16}")
    optimizer = measurement.optimizer_multiple
    stream.write(
        f"{case.variant:<15} {case.vocab:>10,} {case.table_bytes / MIB:9.1f} "
        + " ".join(cells)
        + f" {measurement.multiple():6.2f}x"
        + (f" {optimizer:6.2f}x" if optimizer is not None else f" {'-':>7}")
        + f" {measurement.steady_multiple:8.3f}x"
        + ("" if measurement.ok else f"  {measurement.status.splitlines()[0][:120]}")
        + "\n"
    )
    stream.flush()


def _breakdown_groups(measurement: MemoryMeasurement) -> dict[str, int]:
    """The child's variables, summed into the parts of a quantized table."""
    groups = {"int8 rows": 0, "scales": 0, "float store": 0, "row masks": 0, "optimizer": 0}
    for path, size in measurement.child_figures.get("layer_variables", {}).items():
        name = path.rsplit("/", 1)[-1]
        if name == "embeddings":
            groups["int8 rows"] += size
        elif name == "embeddings_scale":
            groups["scales"] += size
        elif name.startswith("float_row"):
            groups["float store" if name == "float_rows" else "row masks"] += size
        else:
            groups["row masks"] += size
    groups["optimizer"] = sum(measurement.child_figures.get("optimizer_variables", {}).values())
    return groups


def report_breakdown(measurement: MemoryMeasurement, stream: TextIO) -> None:
    """Where an int8 case's memory goes: its variables and the allocators,
    as multiples of the float32 table."""
    table = measurement.case.table_bytes
    groups = _breakdown_groups(measurement)
    parts = ", ".join(f"{name} {size / table:.4f}x" for name, size in groups.items())
    allocator = measurement.child_figures.get("allocator", {})
    pools = ", ".join(f"{name} {size / table:.3f}x" for name, size in allocator.items())
    sample = measurement.child_figures.get("frozen_sample_unchanged")
    stream.write(
        f"  variables {sum(groups.values()) / table:.4f}x = {parts}\n"
        f"  allocators at the end: {pools or 'no figures'}\n"
        + ("" if sample is None else f"  sampled frozen int8 rows and scales unchanged: {sample}\n")
    )
    stream.flush()


def report_heading(stream: TextIO) -> None:
    phases = " ".join(f"{phase + ' MiB, x':>16}" for phase in PHASES)
    stream.write(
        "peak RssAnon over the process's baseline, per phase (MiB, x table)\n"
        f"{'variant':<15} {'V':>10} {'table MiB':>9} {phases} {'peak':>7} {'opt.var':>7} "
        f"{'kept':>9}\n"
        "(int8 variants: multiples of the float32 table; kept: RssAnon over the baseline "
        "when the steady phase ended)\n"
    )


def report_largest(largest: LargestTable, stream: TextIO) -> None:
    confirmation = {None: "not run", True: "one run: trained", False: "one run: did not finish"}[
        largest.confirmed
    ]
    if largest.confirmation is not None and not largest.confirmation.ok:
        confirmation += f" ({largest.confirmation.status.splitlines()[0][:100]})"
    stream.write(
        f"{largest.variant:<15} {largest.per_table_byte:5.2f} x table + "
        f"{(largest.fixed_bytes + largest.process_bytes) / MIB:7.0f} MiB -> "
        f"{largest.rows:>12,} rows = {largest.table_bytes / GIB:6.2f} GiB table "
        f"({largest.fraction_of_memory:5.1%} of MemTotal), budget "
        f"{largest.budget_bytes / GIB:.1f} GiB: {confirmation}; for all of MemTotal: "
        f"{largest.rows_at_memory_total:,} rows\n"
    )


def report(benchmark: MemoryBenchmark, stream: TextIO | None = None) -> None:
    """Prints a whole run."""
    stream = stream or sys.stdout
    report_heading(stream)
    for measurement in benchmark.measurements:
        report_measurement(measurement, stream)
    if benchmark.largest:
        stream.write("largest table that trains with Adam (predicted, then one run):\n")
        for largest in benchmark.largest.values():
            report_largest(largest, stream)
    if benchmark.largest_ratio is not None:
        stream.write(f"largest table, ours / stock Keras: {benchmark.largest_ratio:.2f}x\n")


_PHASE_COLORS = {"construction": "#4e79a7", "first_step": "#f28e2b", "steady": "#59a14f"}


def _svg_legend(left: int, height: int) -> list[str]:
    """One colored square and name per phase, along the bottom edge."""
    parts = []
    for number, phase in enumerate(PHASES):
        x = left + number * 110
        parts.append(
            f'<rect x="{x}" y="{height - 18}" width="10" height="10" '
            f'fill="{_PHASE_COLORS[phase]}"/><text x="{x + 14}" y="{height - 9}">{phase}</text>'
        )
    return parts


def write_svg(measurements: Sequence[MemoryMeasurement], path: str, title: str = "") -> None:
    """A bar chart: per configuration, one bar per phase, its peak as a
    multiple of the table. Written by hand, no
    plotting library needed. Each bar is a ``rect`` of class ``bar`` with
    ``data-config`` and ``data-phase`` attributes."""
    left, top, bar_width, gap, plot_height = 60, 40, 18, 24, 260
    group_width = bar_width * len(PHASES) + gap
    width = left + group_width * max(1, len(measurements)) + 20
    height = top + plot_height + 110
    top_value = max([1.0, *(m.multiple(p) for m in measurements for p in PHASES)])
    top_value = math.ceil(top_value + 0.5)

    def y_of(value: float) -> float:
        return top + plot_height * (1 - value / top_value)

    escape = xml.sax.saxutils.quoteattr
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="13">'
        f"{xml.sax.saxutils.escape(title or 'Peak anonymous memory over baseline, x table')}"
        "</text>",
    ]
    for tick in range(0, top_value + 1):
        y = y_of(tick)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}x</text>'
        )
    for index, measurement in enumerate(measurements):
        x0 = left + gap / 2 + index * group_width
        for number, phase in enumerate(PHASES):
            value = measurement.multiple(phase)
            y = y_of(value)
            parts.append(
                f'<rect class="bar" data-config={escape(measurement.case.label)} '
                f"data-phase={escape(phase)} "
                f'x="{x0 + number * bar_width:.1f}" y="{y:.1f}" width="{bar_width - 2}" '
                f'height="{top + plot_height - y:.1f}" fill="{_PHASE_COLORS[phase]}">'
                f"<title>{xml.sax.saxutils.escape(measurement.case.label)}, {phase}: "
                f"{value:.2f}x table</title></rect>"
                f'<text x="{x0 + number * bar_width + (bar_width - 2) / 2:.1f}" '
                f'y="{y - 3:.1f}" text-anchor="middle" font-size="8">{value:.1f}</text>'
            )
        label_x = x0 + bar_width * len(PHASES) / 2
        label_y = top + plot_height + 14
        parts.append(
            f'<text x="{label_x:.1f}" y="{label_y}" text-anchor="end" '
            f'transform="rotate(-30 {label_x:.1f} {label_y})">'
            f"{xml.sax.saxutils.escape(measurement.case.label)}</text>"
        )
    parts.extend(_svg_legend(left, height))
    parts.append("</svg>\n")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(parts))


# -- the command line ---------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--vocabs", default="1000000,4000000", help="comma-separated V")
    parser.add_argument("--dim", type=int, default=128, help="row width D")
    parser.add_argument("--steps", type=int, default=10, help="steps of the steady phase")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ids-per-sample", type=int, default=16)
    parser.add_argument("--permitted", type=float, default=0.01, help="fraction permitted")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {VARIANTS}"
    )
    parser.add_argument("--skip-largest", action="store_true", help="no largest-table section")
    parser.add_argument(
        "--confirm",
        default="partial,keras",
        help="variants whose predicted largest table is confirmed by a run ('' for none)",
    )
    parser.add_argument(
        "--budget-gib", type=float, help="memory to predict for (default: MemAvailable now)"
    )
    parser.add_argument("--margin", type=float, default=0.1, help="of the budget, kept free")
    parser.add_argument(
        "--min-available-gib",
        type=float,
        default=0.5,
        help="kill a run when MemAvailable falls under this",
    )
    parser.add_argument(
        "--int8-largest",
        default="",
        metavar="V[,V...]",
        help="confirm by a run (one child each: a few steps, a sample of frozen int8 rows "
        "checked unchanged) that these tables train in int8",
    )
    parser.add_argument(
        "--int8-build",
        default="int8_init",
        choices=INT8_VARIANTS,
        help="how --int8-largest builds its layer (default: %(default)s, no float file)",
    )
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--svg", help="write a bar chart of the peaks to this SVG file")
    args = parser.parse_args(argv)
    unknown = [name for name in args.variants.split(",") if name and name not in RUNNABLE_VARIANTS]
    if unknown:
        parser.error(
            f"--variants: unknown {', '.join(map(repr, unknown))}; choose from {RUNNABLE_VARIANTS}"
        )
    return args


def _describe_machine() -> dict[str, Any]:
    import platform

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_total_bytes": memory_total_bytes(),
        "memory_available_bytes_at_start": memory_available_bytes(),
    }


def _cases(args: argparse.Namespace) -> list[MemoryCase]:
    vocabs = [int(v) for v in args.vocabs.split(",") if v]
    variants = [v for v in args.variants.split(",") if v]
    return [
        MemoryCase(
            variant=variant,
            vocab=vocab,
            width=args.dim,
            permitted_fraction=args.permitted,
            batch=args.batch,
            ids_per_sample=args.ids_per_sample,
            steps=args.steps,
        )
        for vocab in vocabs
        for variant in variants
    ]


def _largest_section(
    measurements: Sequence[MemoryMeasurement], args: argparse.Namespace, stream: TextIO
) -> dict[str, LargestTable]:
    largest = {}
    confirm = [v for v in args.confirm.split(",") if v]
    total = memory_total_bytes()
    for variant in dict.fromkeys(m.case.variant for m in measurements):
        done = [m for m in measurements if m.case.variant == variant and m.ok]
        if not done:
            continue
        budget = int(args.budget_gib * GIB) if args.budget_gib else memory_available_bytes()
        table = predict_largest(
            variant,
            [(m.case.table_bytes, m.peak_bytes) for m in done],
            width=done[0].case.width,
            process_bytes=max(m.baseline_rss_bytes for m in done),
            budget_bytes=budget,
            memory_total_bytes=total,
            margin=args.margin,
        )
        if variant in confirm and table.rows > 0:
            case = dataclasses.replace(done[0].case, vocab=table.rows, steps=3)
            table.confirmation = measure_case(
                case, min_available_bytes=int(args.min_available_gib * GIB)
            )
        report_largest(table, stream)
        largest[variant] = table
    return largest


def _int8_largest(args: argparse.Namespace, stream: TextIO) -> list[MemoryMeasurement]:
    """The runs ``--int8-largest`` asks for, one child each, reported as they end."""
    from partial_embedding.bench._quantized import confirm_largest, report_confirmation

    vocabs = [int(v) for v in args.int8_largest.split(",") if v]
    if vocabs:
        stream.write("tables that train in int8 (one run each):\n")
    confirmations = []
    for vocab in vocabs:
        confirmations.append(
            confirm_largest(
                vocab,
                width=args.dim,
                variant=args.int8_build,
                permitted_fraction=args.permitted,
                batch=args.batch,
                ids_per_sample=args.ids_per_sample,
                min_available_bytes=int(args.min_available_gib * GIB),
            )
        )
        report_confirmation(confirmations[-1], stream)
    return confirmations


def run(args: argparse.Namespace, stream: TextIO | None = None) -> MemoryBenchmark:
    """Measures every configuration (one child each), then the largest
    tables; prints as it goes and returns the results."""
    stream = stream or sys.stdout
    machine = _describe_machine()
    stream.write(
        f"partial_embedding memory benchmark: {machine['cpus']} CPUs, "
        f"MemTotal {machine['memory_total_bytes'] / GIB:.1f} GiB, "
        f"MemAvailable {machine['memory_available_bytes_at_start'] / GIB:.1f} GiB\n"
    )
    report_heading(stream)
    measurements = []
    for case in _cases(args):
        measurements.append(
            measure_case(case, min_available_bytes=int(args.min_available_gib * GIB))
        )
        report_measurement(measurements[-1], stream)
        if case.variant in INT8_VARIANTS and measurements[-1].child_figures:
            report_breakdown(measurements[-1], stream)
    benchmark = MemoryBenchmark(machine=machine, measurements=measurements)
    if not args.skip_largest:
        stream.write("largest table that trains with Adam (predicted, then one run):\n")
        benchmark.largest = _largest_section(measurements, args, stream)
        if benchmark.largest_ratio is not None:
            stream.write(f"largest table, ours / stock Keras: {benchmark.largest_ratio:.2f}x\n")
    benchmark.int8_confirmations = _int8_largest(args, stream)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(benchmark.to_dict(), handle, indent=2)
    if args.svg:
        first = measurements[0].case if measurements else MemoryCase()
        write_svg(
            measurements,
            args.svg,
            title=f"Peak RssAnon over the baseline per phase, x table: D = {first.width} "
            f"float32, {first.permitted_fraction:.0%} of rows permitted, Adam",
        )
    return benchmark


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m partial_embedding.bench --memory``: measures and prints."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
