"""Kernel and training-step benchmarks: ``python -m partial_embedding.bench``.

Times ``masked_scatter_sub`` against TensorFlow's built-in alternatives in the
same run, on the same inputs, and prints ratios (absolute times drift on busy
machines; ratios measured side by side, interleaved, drift much less).

Methods, each updating a [V, D] float32 table with k rows of updates:
  masked_scatter_sub      this library's in-place kernel
  scatter_sub             ``tf.Variable.scatter_sub`` (no mask; the built-in
                          sparse update, which also flips the variable into
                          copy-on-read mode)
  tensor_scatter_nd_sub   ``var.assign(tf.tensor_scatter_nd_sub(var, ...))``
  dense_mask              the gradient-masking workaround's update:
                          ``var.assign_sub(mask[:, None] * dense_update)``

Sections of a run:
  op        the methods above over sweeps of vocabulary size V, row width D,
            ids per step k, duplicate rate and permitted fraction (one factor
            at a time around a base point). The two dense methods cost
            O(V * D) per step; above --dense-limit elements they are skipped
            and the table says so.
  training  a Keras training step, PartialEmbedding + MaskedOptimizer(Adam)
            against stock keras.layers.Embedding + Adam and the other
            baselines of ``partial_embedding.bench._training``.
  gpu       where a GPU is present: through TensorFlow if it sees one, else
            through the TF-free kernel module ``partial_embedding._kernels``
            (CUDA build) on CuPy or PyTorch arrays; with the bandwidth the op
            reaches against a device-to-device copy of as many bytes.

Presets: ``--quick`` (seconds, for tests), ``--full`` (the default: about
five minutes on two cores). Grid flags (--rows, --width, --indices,
--duplicate-rate, --permitted) replace the preset's op sweeps by their
product. Output: a table per sweep, ``--json FILE`` for machines, ``--plot
FILE`` (PNG, needs matplotlib: ``pip install tf-partial-embedding[plot]``).

``--memory`` runs the memory benchmark instead (``bench._memory``:
peak memory per phase, the largest table that trains), ``--training`` the
training-step benchmark alone (``bench._training``), ``--lm`` the tied
language-model benchmark (``bench._lm``); the other flags are then its own
(``--memory --help`` lists them).

The ratio printed next to a time, and ``ratio_vs`` in the JSON, is
masked_scatter_sub's time divided by that method's time: below 1.0 means
masked_scatter_sub is faster.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import tensorflow as tf

from partial_embedding.bench._gpu import GpuUnavailable, measure_gpu, run_gpu_section
from partial_embedding.bench._op_timing import (
    ALL_METHODS,
    BASELINE,
    DENSE_METHODS,
    PRESETS,
    OpCase,
    OpTiming,
    Preset,
    measure_op_case,
    time_op_case,
)
from partial_embedding.bench._training_results import vocab_table

__all__ = [
    "ALL_METHODS",
    "BASELINE",
    "DENSE_METHODS",
    "GpuUnavailable",
    "main",
    "measure_gpu",
    "measure_op_case",
    "OpCase",
    "OpTiming",
    "parse_args",
    "Preset",
    "PRESETS",
    "report_training",
    "run",
    "run_op_benchmark",
    "run_op_sweeps",
    "time_op_case",
    "write_plot",
]


def _format_ms(seconds: float | None, ratio: float | None) -> str:
    if seconds is None:
        return "skipped"
    return f"{seconds * 1e3:9.3f}ms ({ratio:5.2f}x)"


def _op_table_heading(methods: Sequence[str], sweep: str) -> str:
    header = f"{'V':>9} {'D':>4} {'k':>7} {'dup':>4} {'perm':>4} " + " ".join(
        f"{m:>22}" for m in methods
    )
    return f"-- op sweep: {sweep}\n{header}\n"


def _op_table_line(row: dict[str, Any], methods: Sequence[str]) -> str:
    cells = [_format_ms(row["seconds"][m], row["ratio_vs"][m]) for m in methods]
    return (
        f"{row['num_rows']:>9} {row['width']:>4} {row['num_indices']:>7} "
        f"{row['duplicate_rate']:>4.2f} {row['permitted_fraction']:>4.2f} "
        + " ".join(f"{c:>22}" for c in cells)
        + "\n"
    )


def run_op_benchmark(
    cases: list[OpCase],
    methods: tuple[str, ...],
    repeats: int,
    rounds: int,
    *,
    target_seconds: float | None = None,
    dense_limit: int | None = None,
    sweep: str = "grid",
    stream: TextIO | None = None,
) -> list[dict]:
    """Times every case, prints a table with ratios, returns the rows.

    Each row holds the case, ``seconds`` per method (None where skipped),
    ``ratio_vs`` (masked_scatter_sub's seconds / the method's), ``repeats``
    and ``skipped`` (the reason, per skipped method).
    """
    stream = stream or sys.stdout
    methods = tuple(dict.fromkeys([BASELINE, *methods]))
    timing = OpTiming(repeats, rounds, target_seconds, dense_limit)
    stream.write(_op_table_heading(methods, sweep))
    rows = []
    for case in cases:
        rows.append(measure_op_case(case, methods, timing, sweep))
        stream.write(_op_table_line(rows[-1], methods))
        stream.flush()
    return rows


def run_op_sweeps(
    sweeps: Sequence[tuple[str, Sequence[OpCase]]],
    methods: tuple[str, ...],
    timing: OpTiming,
    stream: TextIO,
) -> list[dict]:
    """``run_op_benchmark`` over each sweep, then the ratios' legend; all rows."""
    rows = []
    for sweep_name, cases in sweeps:
        rows += run_op_benchmark(
            list(cases),
            methods,
            timing.repeats,
            timing.rounds,
            target_seconds=timing.target_seconds,
            dense_limit=timing.dense_limit,
            sweep=sweep_name,
            stream=stream,
        )
    stream.write(
        "(x) = masked_scatter_sub time / method time: below 1.0 means "
        "masked_scatter_sub is faster\n"
    )
    return rows


# -- the training-step benchmark -------------------------------------------------


def _training_function() -> Callable[..., dict] | None:
    """``bench._training.run_benchmark``, or None where that module is absent."""
    try:
        module = importlib.import_module("partial_embedding.bench._training")
    except ImportError:
        return None
    function = getattr(module, "run_benchmark", None)
    return function if callable(function) else None


def _optional_cell(value: float | None, spec: str, width: int) -> str:
    return f"{'n/a' if value is None else format(value, spec):>{width}}"


def report_training(result: dict[str, Any], stream: TextIO) -> None:
    """Prints ``bench._training.run_benchmark``'s figures as a table, then the
    steps and floors timed together at each V with the costs and ratios
    that follow (``bench._training_results.vocab_table``) where the figures
    have them."""
    partial_ms = result["variants"]["partial"]["step_ms"]
    stream.write(
        f"{'variant':<18} {'ms/step':>10} {'x partial':>10} {'peak MiB':>9} "
        f"{'TF tmp MiB':>10} {'steps':>6}\n"
    )
    for variant, figures in result["variants"].items():
        stream.write(
            f"{variant:<18} {figures['step_ms']:10.3f} {figures['step_ms'] / partial_ms:10.2f} "
            f"{_optional_cell(figures.get('peak_rss_growth_mib'), '9.1f', 9)} "
            f"{_optional_cell(figures.get('peak_step_alloc_mib'), '10.1f', 10)} "
            f"{figures['steps']:>6}\n"
        )
    update_only = result.get("update_only") or {}
    if update_only:
        stream.write(
            f"optimizer update alone: partial {update_only['partial']:.3f} ms, "
            f"stock_tf {update_only['stock_tf']:.3f} ms "
            f"({update_only['stock_tf_over_partial']:.1f}x)\n"
        )
    if "partial_xla" in update_only:
        stream.write(
            f"optimizer update alone under XLA: partial_xla {update_only['partial_xla']:.3f} ms "
            f"({update_only['partial_xla_over_partial']:.2f}x partial)\n"
        )
    xla_scaling = result.get("xla_scaling") or {}
    xla_over_partial = result.get("xla_over_partial_by_vocab") or {}
    for vocab, step_ms in sorted(result.get("scaling", {}).items()):
        line = f"partial at V = {vocab:>10,}: {step_ms:8.3f} ms/step"
        if vocab in xla_scaling and vocab in xla_over_partial:
            line += (
                f", partial_xla {xla_scaling[vocab]:8.3f} ms/step "
                f"({xla_over_partial[vocab]:.2f}x partial)"
            )
        stream.write(line + "\n")
    for name, key in (("partial", "scaling_ratio"), ("partial_xla", "xla_scaling_ratio")):
        if result.get(key) is not None:
            stream.write(f"{name} step time, largest V / smallest V: {result[key]:.2f}x\n")
    table = vocab_table(result)
    if table:
        stream.write(table + "\n")
    stream.flush()


def run_training_section(settings: dict[str, Any], stream: TextIO) -> dict | None:
    """Times a Keras training step through ``bench._training.run_benchmark``.

    Prints each variant's step time, its ratio to PartialEmbedding +
    MaskedOptimizer, its peak memory growth, and PartialEmbedding's step time
    at other vocabulary sizes. Returns run_benchmark's dict, or None (with a
    note) where bench._training is not available.
    """
    function = _training_function()
    if function is None:
        stream.write("-- training step: partial_embedding.bench._training is absent; skipped\n")
        return None
    stream.write(
        f"-- training step: V = {settings['vocab']:,}, D = {settings['width']}, batch "
        f"{settings['batch']} x {settings['ids_per_sample']} ids, "
        f"{settings['permitted_fraction']:.0%} of rows permitted, Adam\n"
    )
    stream.flush()
    result = function(verbose=False, **settings)
    report_training(result, stream)
    return result


# -- machine, command line ------------------------------------------------


def describe_machine() -> dict[str, Any]:
    """The facts a reader needs to weigh the figures."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable_cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable_cores = os.cpu_count() or 0
    return {
        "cpu_model": model,
        "usable_cores": usable_cores,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads() or "default",
        # Other processes' load skews absolute times (ratios less so).
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _custom_grid(args: argparse.Namespace) -> list[OpCase] | None:
    given = [args.rows, args.width, args.indices, args.duplicate_rate, args.permitted]
    if all(value is None for value in given):
        return None
    defaults = OpCase()
    return [
        OpCase(v, d, k, dup, perm)
        for v in args.rows or [defaults.num_rows]
        for d in args.width or [defaults.width]
        for k in args.indices or [defaults.num_indices]
        for dup in args.duplicate_rate or [defaults.duplicate_rate]
        for perm in args.permitted or [defaults.permitted_fraction]
    ]


#: The flags that run another benchmark instead, and what each runs.
_OTHER_BENCHMARKS = (
    ("--memory", "the memory benchmark"),
    ("--training", "the training-step benchmark alone"),
    ("--lm", "the tied language-model benchmark"),
    ("--gpu-step", "the GPU smoke check of the training step"),
    ("--bags", "the bag-model benchmark alone"),
    ("--int8", "the int8 frozen-row checks"),
    ("--versus-fbgemm", "our embedding steps against FBGEMM's CPU kernels"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="a few seconds (for tests)")
    preset.add_argument("--full", action="store_true", help="the default grid (minutes)")
    parser.add_argument("--rows", type=int, nargs="+", help="vocabulary sizes V")
    parser.add_argument("--width", type=int, nargs="+", help="row widths D")
    parser.add_argument("--indices", type=int, nargs="+", help="indices per update k")
    parser.add_argument("--duplicate-rate", type=float, nargs="+")
    parser.add_argument("--permitted", type=float, nargs="+", help="fraction of rows permitted")
    parser.add_argument("--methods", nargs="+", default=list(ALL_METHODS), choices=ALL_METHODS)
    parser.add_argument("--repeats", type=int, help="most steps per round and method")
    parser.add_argument("--rounds", type=int)
    parser.add_argument(
        "--target-seconds",
        type=float,
        help="time per method and point; slow methods run fewer repeats (0: always --repeats)",
    )
    parser.add_argument(
        "--dense-limit", type=int, help="skip the dense methods above this V * D (0: never)"
    )
    # Picked by ``partial_embedding.bench.main`` before this parser sees them;
    # listed here so that --help names every benchmark.
    for flag, benchmark in _OTHER_BENCHMARKS:
        parser.add_argument(
            flag,
            action="store_true",
            help=f"run {benchmark} instead (its own flags: {flag} --help)",
        )
    parser.add_argument("--no-op", action="store_true", help="skip the op benchmark")
    parser.add_argument("--no-training", action="store_true", help="skip the training step")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU section")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--plot", help="also write a PNG plot (needs matplotlib)")
    return parser.parse_args(argv)


def _op_timing(args: argparse.Namespace, preset: Preset) -> OpTiming:
    """The preset's timing, with what the flags replace (0: no target, no limit)."""
    target = preset.target_seconds if args.target_seconds is None else args.target_seconds
    dense_limit = preset.dense_limit if args.dense_limit is None else args.dense_limit
    return OpTiming(
        repeats=args.repeats or preset.max_repeats,
        rounds=args.rounds or preset.rounds,
        target_seconds=target or None,
        dense_limit=dense_limit or None,
    )


def _write_outputs(result: dict[str, Any], args: argparse.Namespace, stream: TextIO) -> None:
    """``--json`` and ``--plot``, where asked for."""
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2, default=str)
    if not args.plot:
        return
    if not result["op"]:
        stream.write("--plot: no op results to plot\n")
    elif not write_plot(
        result["op"], args.plot, training=result.get("training"), machine=result["machine"]
    ):
        stream.write(
            "--plot: matplotlib is not installed; pip install 'tf-partial-embedding[plot]'\n"
        )


def run(args: argparse.Namespace, stream: TextIO | None = None) -> dict[str, Any]:
    """Runs the sections the arguments ask for; returns what the JSON holds."""
    stream = stream or sys.stdout
    preset = PRESETS["quick" if args.quick else "full"]
    machine = describe_machine()
    stream.write(
        f"partial_embedding bench ({preset.name}): {machine['cpu_model']}, "
        f"{machine['usable_cores']} usable cores, TensorFlow {machine['tensorflow']}\n"
    )
    if preset.name == "quick":
        stream.write(
            "quick run: a few steps per figure, so its times are indicative only; "
            "--full (the default) for figures to compare\n"
        )
    custom = _custom_grid(args)
    result: dict[str, Any] = {
        "preset": preset.name if custom is None else "custom",
        "machine": machine,
        "ratio_definition": "ratio_vs[m] = seconds['masked_scatter_sub'] / seconds[m]",
        "op": [],
    }
    started = time.perf_counter()
    if not args.no_op:
        sweeps = (("grid", tuple(custom)),) if custom is not None else preset.sweeps
        methods = tuple(dict.fromkeys([BASELINE, *args.methods]))
        result["op"] = run_op_sweeps(sweeps, methods, _op_timing(args, preset), stream)
    if not args.no_training:
        result["training"] = run_training_section(preset.training, stream)
    if not args.no_gpu:
        result["gpu"] = run_gpu_section(preset, stream)
    result["total_seconds"] = time.perf_counter() - started
    if hasattr(os, "getloadavg"):
        result["machine"]["load_average_at_end"] = list(os.getloadavg())
    _write_outputs(result, args, stream)
    return result


def main(argv: list[str] | None = None) -> None:
    """``python -m partial_embedding.bench`` without ``--memory``, ``--training`` or ``--lm``."""
    run(parse_args(argv))


# -- ``--plot``: the op benchmark's times (and the training step's) as a PNG (matplotlib) --


def _log_axes(axes: Any, ticker: Any) -> None:
    axes.set_xscale("log")
    axes.set_yscale("log")
    # Plain numbers on the axes: "0.1, 1, 10 ms" reads better than 10^-1.
    axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axes.set_xlabel("vocabulary size V (rows)")
    axes.grid(True, which="both", alpha=0.3)


def _plot_op_panel(axes: Any, op_rows: list[dict], title: str, ticker: Any) -> None:
    """Time per update step against V, one line per method (the vocab sweep)."""
    rows = [row for row in op_rows if row["sweep"] == "vocab"] or op_rows
    rows = sorted(rows, key=lambda row: row["num_rows"])
    methods = list(dict.fromkeys(m for row in rows for m in row["seconds"]))
    for method in methods:
        points = [
            (row["num_rows"], row["seconds"][method] * 1e3)
            for row in rows
            if row["seconds"].get(method) is not None
        ]
        if points:
            xs, ys = zip(*points)
            axes.plot(xs, ys, marker="o", label=method)
    _log_axes(axes, ticker)
    axes.set_ylabel("time per update step (ms)")
    if rows:
        first = rows[0]
        axes.set_title(
            title
            or f"update op: D = {first['width']}, k = {first['num_indices']:,} ids, "
            f"{first['permitted_fraction']:.0%} of rows permitted"
        )
    axes.legend()


def _plot_training_panel(axes: Any, training: dict, ticker: Any) -> None:
    """Training step time: ``partial`` (and ``partial_xla``) at every V it was
    timed at, the other variants at the comparison's V."""
    config = training["config"]
    lines = {
        "partial": ("scaling", "partial (PartialEmbedding + MaskedOptimizer)"),
        "partial_xla": ("xla_scaling", "partial_xla (the same, jit_compile=True)"),
    }
    for key, label in lines.values():
        scaling = sorted((int(v), ms) for v, ms in (training.get(key) or {}).items())
        if scaling:
            xs, ys = zip(*scaling)
            axes.plot(xs, ys, marker="o", label=label)
    for variant, figures in training["variants"].items():
        if variant not in lines or not training.get(lines[variant][0]):
            axes.plot([config["vocab"]], [figures["step_ms"]], marker="s", ls="", label=variant)
    _log_axes(axes, ticker)
    axes.set_ylabel("time per training step (ms)")
    axes.set_title(
        f"Keras training step, Adam: D = {config['width']}, batch {config['batch']} x "
        f"{config['ids_per_sample']} ids"
    )
    # Between the fast variants (bottom) and the dense ones (top).
    axes.legend(loc="center right")


def write_plot(
    op_rows: list[dict],
    path: str,
    title: str = "",
    training: dict | None = None,
    machine: dict | None = None,
) -> bool:
    """Time per step against V, log-log, one line per method (the vocab sweep).

    With ``training`` (``bench._training.run_benchmark``'s dict), a second panel shows the
    training step: PartialEmbedding + MaskedOptimizer at every V it was timed
    at, the other variants at the comparison's V. Returns False (and writes
    nothing) where matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    panels = 2 if training else 1
    figure, all_axes = plt.subplots(1, panels, figsize=(7 * panels, 4.8), dpi=110, squeeze=False)
    _plot_op_panel(all_axes[0][0], op_rows, title, matplotlib.ticker)
    if training:
        _plot_training_panel(all_axes[0][1], training, matplotlib.ticker)
    if machine:
        figure.suptitle(
            f"CPU: {machine['cpu_model']}, {machine['usable_cores']} cores, "
            f"TensorFlow {machine['tensorflow']}",
            fontsize="medium",
        )
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True


if __name__ == "__main__":
    main()
