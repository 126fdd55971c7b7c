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
  ``partial_embedding.bench.models``).

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

``measure_case`` returns a ``MemoryMeasurement``; ``run`` returns a
``MemoryBenchmark``; ``report`` prints one; ``write_svg`` draws one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from partial_embedding.bench.memory_child import child_main
from partial_embedding.bench.memory_figures import (
    GIB,
    INT8_VARIANTS,
    PHASES,
    RUNNABLE_VARIANTS,
    TRANSIENT,
    VARIANTS,
    LargestTable,
    MemoryBenchmark,
    MemoryCase,
    MemoryMeasurement,
    fit_peak_line,
    predict_largest,
)
from partial_embedding.bench.memory_report import (
    report,
    report_breakdown,
    report_heading,
    report_largest,
    report_measurement,
    write_svg,
)
from partial_embedding.bench.memory_sampling import (
    measure_case,
    memory_available_bytes,
    memory_total_bytes,
)

__all__ = [
    "LargestTable",
    "MemoryBenchmark",
    "MemoryCase",
    "MemoryMeasurement",
    "PHASES",
    "TRANSIENT",
    "VARIANTS",
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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--marker-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ack-fd", type=int, help=argparse.SUPPRESS)
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
    from partial_embedding.bench.quantized import confirm_largest, report_confirmation

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
    args = parse_args(argv)
    if args.child is not None:
        child_main(args.child, args.marker_fd, args.ack_fd)
        return
    run(args)


if __name__ == "__main__":
    main()
