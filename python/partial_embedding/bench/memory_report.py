"""Prints the memory benchmark's figures and draws them as an SVG bar chart."""

from __future__ import annotations

import math
import sys
import xml.sax.saxutils
from collections.abc import Sequence
from typing import TextIO

from partial_embedding.bench.memory_figures import (
    GIB,
    MIB,
    PHASES,
    LargestTable,
    MemoryBenchmark,
    MemoryMeasurement,
)

__all__ = [
    "report",
    "report_breakdown",
    "report_heading",
    "report_largest",
    "report_measurement",
    "write_svg",
]

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
    confirmation = {None: "not run", True: "confirmed", False: "FAILED"}[largest.confirmed]
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


def write_svg(
    measurements: Sequence[MemoryMeasurement], path: str, title: str = "", target: float = 1.3
) -> None:
    """A bar chart: per configuration, one bar per phase, its peak as a
    multiple of the table; a dashed line at ``target``. Written by hand, no
    plotting library needed. Each bar is a ``rect`` of class ``bar`` with
    ``data-config`` and ``data-phase`` attributes."""
    left, top, bar_width, gap, plot_height = 60, 40, 18, 24, 260
    group_width = bar_width * len(PHASES) + gap
    width = left + group_width * max(1, len(measurements)) + 20
    height = top + plot_height + 110
    top_value = max([target, *(m.multiple(p) for m in measurements for p in PHASES)])
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
    y = y_of(target)
    parts.append(
        f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#c00" '
        f'stroke-dasharray="5,4"/><text x="{width - 12}" y="{y - 4:.1f}" text-anchor="end" '
        f'fill="#c00">target {target:g}x</text>'
    )
    parts.extend(_svg_legend(left, height))
    parts.append("</svg>\n")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(parts))
