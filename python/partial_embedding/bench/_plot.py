"""``--plot``: the op benchmark's times (and the training step's) as a PNG, through matplotlib."""

from __future__ import annotations

from typing import Any

__all__ = ["write_plot"]


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
