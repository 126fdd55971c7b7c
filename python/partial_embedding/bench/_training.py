"""Training-step benchmark: PartialEmbedding + MaskedOptimizer(Adam) vs. the rest.

Run ``python -m partial_embedding.bench --training`` (``--help`` for options;
``--runs 3`` repeats the whole measurement, ``--json FILE`` writes the figures).
One run times a training step (forward, backward, optimizer update) of the same small model
(``V x D`` ids mean-pooled into a ``Dense(1)``, MSE, Adam), built six ways.
``--optimizer NAME`` trains every Keras-optimizer variant below with another
rule of ``bench._models`` (SGD, Adagrad, RMSprop, AdamW, the row-wise rules...);
``stock_tf``, the update-only comparison and the ``bare_loop`` floor are lazy
Adam written out by hand, and are then left out (said in one line):

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

In the same interleaved rounds as the steps it times the floors of
``bench._floors`` (unless ``--no-floors``): the same head and loss fed rows
already looked up (``head_only``, and ``head_only_xla`` under XLA), whose time
a step less is the embedding's own cost, and the bare C++ loop of the fused
Adam rows (``bare_loop``). It then times the optimizer update alone,
``partial`` against ``stock_tf`` (and ``partial_xla``) fed the same fixed
sparse gradients, and ``partial``, ``partial_xla`` and ``stock_tf`` with the
floors again at other vocabulary sizes (how the step grows with V). The
figures timed together at each V, their embedding costs (where the run
resolves them: ``bench._floors.resolved_difference``) and the ratios that
follow close the run as one table (``bench._training_results.vocab_table``).

Then the bag model (``bench._bags``): 256 bags of 16 ids pooled into one
vector, ``PartialEmbedding(combiner="mean")`` against the pooled layer, stock
TF's ``embedding_lookup_sparse`` and stock Keras, at V = 100k, 1M and 4M
(``--bags-only``: the bag model alone; ``--no-bags``: without it).

Each variant's peak resident-memory growth over its timed steps (Linux
``VmHWM``) and, where TensorFlow's CPU allocator keeps statistics, the most
memory TensorFlow held at once beyond what it held before are reported next
to the size of one table (``bench._timing``).

``measure`` takes a ``BenchmarkConfig`` and returns a ``TrainingBenchmark``;
``run_benchmark`` returns the same figures as a dict for other modules;
``BenchmarkReport`` prints them as they come in.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.bench import _bags as bags  # noqa: E402
from partial_embedding.bench._floors import FLOORS, floor_runs  # noqa: E402
from partial_embedding.bench._models import (  # noqa: E402
    RULES,
    VARIANTS,
    adam_only_note,
    build_variant,
    stock_tf_tables,
    stock_tf_update,
)
from partial_embedding.bench._timing import (  # noqa: E402
    interleaved_rounds,
    lacks_room_for,
    release_memory,
)
from partial_embedding.bench._training_results import (  # noqa: E402
    FAST_VARIANTS,
    RECORDED_SETTINGS,
    SCALED_VARIANTS,
    SKIPPABLE,
    BenchmarkConfig,
    BenchmarkReport,
    TrainingBenchmark,
    runs_summary,
)
from partial_embedding.layers import PartialEmbedding  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer  # noqa: E402


def _tables_held(name: str, permitted_fraction: float) -> float:
    """How many ``V x D`` tables' worth of memory a variant or floor holds."""
    compact = 1 + 2 * permitted_fraction
    held = {"partial": compact, "partial_xla": compact, "bare_loop": compact}
    return held.get(name, 3.0 if name in ("partial_full_slots", "stock_tf") else 0.0)


def _room_for(name: str, config: BenchmarkConfig) -> str | None:
    """Why ``name`` (one of ``SKIPPABLE``) is not built now; None: build it."""
    if name not in SKIPPABLE:
        return None
    table_bytes = config.table_mib * 2**20
    return lacks_room_for(_tables_held(name, config.permitted_fraction) * table_bytes)


def _build_runs(
    variants: Sequence[str],
    config: BenchmarkConfig,
    batches: list[tuple[tf.Tensor, tf.Tensor]],
    rng: np.random.Generator,
    with_floors: bool,
) -> tuple[dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]], list[Any], dict[str, str]]:
    """The interleaved runs of ``variants`` (and the floors where
    ``with_floors``), the objects they keep alive, and why any of
    ``SKIPPABLE`` was left out (too little memory free now)."""
    permitted = rng.random(config.vocab) < config.permitted_fraction
    skipped: dict[str, str] = {}
    runs: dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]] = {}
    kept: list[Any] = []
    # The skippable ones last, so each sees what the others took.
    for variant in sorted(variants, key=lambda name: name in SKIPPABLE):
        if reason := _room_for(variant, config):
            skipped[variant] = reason
            continue
        step, objects = build_variant(
            variant, config.vocab, config.width, permitted, config.ids_per_sample, config.optimizer
        )
        runs[variant], kept = (step, list(batches)), kept + objects
    runs = {variant: runs[variant] for variant in variants if variant in runs}
    if with_floors:
        if reason := _room_for("bare_loop", config):
            skipped["bare_loop"] = reason
        bare_loop = not reason and "bare_loop" not in config.adam_only_left_out
        floors, objects = floor_runs(
            batches, config.vocab, config.width, permitted, rng, with_bare_loop=bare_loop
        )
        runs.update(floors)
        kept += objects
    return runs, kept, skipped


def _time_variants(
    variants: Sequence[str],
    config: BenchmarkConfig,
    steps: int,
    rng: np.random.Generator,
    with_floors: bool = False,
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Builds the variants at ``config``'s shape and times their training
    steps, interleaved (with the floors of ``bench._floors`` where
    ``with_floors``); returns their figures and why any was skipped."""
    batches = [
        (
            tf.constant(
                rng.integers(0, config.vocab, (config.batch, config.ids_per_sample)), tf.int32
            ),
            tf.constant(rng.normal(size=(config.batch, 1)), tf.float32),
        )
        for _ in range(min(steps, 16))
    ]
    runs, kept, skipped = _build_runs(variants, config, batches, rng, with_floors)
    results = interleaved_rounds(runs, steps, config.warmup, config.max_rounds)
    del batches, runs, kept
    release_memory()
    return results, skipped


# -- results and their report --------------------------------------------------


def _timed_together(figures: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The figures of ``SCALED_VARIANTS`` and ``FLOORS`` among ``figures``."""
    return {name: figures[name] for name in (*SCALED_VARIANTS, *FLOORS) if name in figures}


def _no_room_for_all(variants: Sequence[str], config: BenchmarkConfig) -> str | None:
    """Why ``variants`` together do not fit in free memory at ``config``'s
    shape now; None where they do."""
    held = sum(_tables_held(v, config.permitted_fraction) for v in variants)
    return lacks_room_for(held * config.table_mib * 2**20)


def _child_arguments(config: BenchmarkConfig, vocab: int) -> list[str]:
    """The command line of a run that times ``config``'s scaled variants
    (and floors) at ``vocab`` as its main group, and nothing else."""
    arguments = [
        f"--{name.replace('_', '-')}={getattr(config, name)}"
        for name in ("width", "batch", "ids_per_sample", "permitted_fraction", "steps")
        + ("max_rounds", "warmup")
    ]
    arguments += [f"--vocab={vocab}", "--update-only-steps=0", "--in-process", "--scaling-vocabs"]
    arguments += [f"--optimizer={config.optimizer}"]
    arguments += [] if config.floors else ["--no-floors"]
    arguments += [] if config.seed is None else [f"--seed={config.seed}"]
    return [*arguments, "--variants", *config.scaled_variants()]


def _scaling_point(
    config: BenchmarkConfig, vocab: int, rng: np.random.Generator
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """The figures of ``scaled_variants`` (and the floors) timed together at
    ``vocab``, and why any was left out: in a process of its own where
    ``config.isolate_scaling``; none where even the variants that are never
    skipped do not fit in free memory (all of them under ``skipped`` then)."""
    shape = dataclasses.replace(config, vocab=vocab)
    required = [v for v in config.scaled_variants() if v not in SKIPPABLE]
    if not config.isolate_scaling:
        if reason := _no_room_for_all(required, shape):
            return {}, {v: reason for v in required}
        return _time_variants(
            config.scaled_variants(), shape, config.steps, rng, with_floors=config.floors
        )
    run = _run_in_child(_child_arguments(config, vocab), quiet=True)
    if run is None:
        return {}, {v: "its process failed (too little memory?)" for v in required}
    return run["by_vocab"].get(str(vocab), {}), run["skipped"].get(str(vocab), {})


def _time_scaling(
    config: BenchmarkConfig,
    result: TrainingBenchmark,
    rng: np.random.Generator,
    report: BenchmarkReport,
) -> None:
    """Times ``scaled_variants`` (with the floors) at each of
    ``scaling_vocabs`` still to time, into ``result`` (``_scaling_point``);
    what was left out is said."""
    for vocab in config.scaling_vocabs_to_time("partial" in config.variants):
        figures, skipped = _scaling_point(config, vocab, rng)
        if skipped:
            result.skipped[vocab] = skipped
            report.skipped(vocab, skipped)
        if "partial" not in figures:
            continue
        result.scaling_points.append((vocab, figures["partial"]))
        if "partial_xla" in figures:
            result.xla_scaling_points.append((vocab, figures["partial_xla"]))
        result.by_vocab[vocab] = _timed_together(figures)
        report.scaling_point(vocab, figures["partial"], figures.get("partial_xla"))
        others = {n: f for n, f in figures.items() if n not in ("partial", "partial_xla")}
        report.variants(others, config.steps)


def _without_adam_only(config: BenchmarkConfig, report: BenchmarkReport) -> BenchmarkConfig:
    """``config`` less its ``adam_only_left_out`` variants; one line says
    what is left out and why (nothing under ``adam``)."""
    left_out = [v for v in config.adam_only_left_out if v in config.variants]
    if config.update_only_steps and "stock_tf" in left_out:
        left_out.append("the update-only comparison")
    if config.floors and "bare_loop" in config.adam_only_left_out:
        left_out.append("the bare_loop floor")
    if not left_out:
        return config
    report.say("  " + adam_only_note(config.optimizer, left_out))
    kept = [v for v in config.variants if v not in config.adam_only_left_out]
    return dataclasses.replace(config, variants=kept)


def measure(config: BenchmarkConfig, report: BenchmarkReport | None = None) -> TrainingBenchmark:
    """Times a training step of each variant (with the floors, in the same
    rounds as ``partial``), the update alone and the scaling with V, as
    ``config`` asks; ``report`` shows figures as they come.

    Raises:
      MemoryError: Where ``partial`` and ``partial_xla`` (those among the
        variants) do not fit in free memory at ``config.vocab`` (checked first).
    """
    report = report or BenchmarkReport(verbose=False)
    report.setting(config)
    config = _without_adam_only(config, report)
    first = [v for v in config.variants if v in FAST_VARIANTS and v not in SKIPPABLE]
    if reason := _no_room_for_all(first, config):
        raise MemoryError(f"{', '.join(first)} at V={config.vocab:,}: {reason}; nothing was timed")
    rng = np.random.default_rng(config.seed)
    # Processes of their own start from this one's memory: before it holds tables.
    early = TrainingBenchmark(config, {})
    if config.isolate_scaling:
        _time_scaling(config, early, rng, report)
    timed: dict[str, dict[str, float]] = {}
    skipped_here: dict[str, str] = {}
    for group, steps in config.variant_groups():
        with_floors = config.floors and "partial" in group
        figures, skipped = _time_variants(group, config, steps, rng, with_floors)
        report.variants(figures, steps)
        report.skipped(config.vocab, skipped)
        timed.update(figures)
        skipped_here.update(skipped)
    result = TrainingBenchmark(config, {v: timed[v] for v in config.variants if v in timed})
    if skipped_here:
        result.skipped[config.vocab] = skipped_here
    if "partial" in timed:
        result.by_vocab[config.vocab] = _timed_together(timed)
    report.ratios(result.ratios, result.median_ratios)
    if config.update_only_steps and {"partial", "stock_tf"} <= set(result.variants):
        result.update_only = time_updates_only(config, rng)
        report.update_only(config, result.update_only)
    if config.isolate_scaling:
        result.scaling_points, result.xla_scaling_points = (
            early.scaling_points,
            early.xla_scaling_points,
        )
        result.by_vocab.update(early.by_vocab)
        result.skipped.update(early.skipped)
    else:
        _time_scaling(config, result, rng, report)
    report.scaling_ratio(result)
    report.table(result.as_dict())
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
      "by_vocab": {V: {name: figures}} of the steps and floors timed together
      at each V, "embedding_cost": {V: {step: ms}} (step less its head-only
      floor, where the run resolves it), "derived": the costs and ratios of
      ``_floors.derived_figures``, "skipped": {V: {name: why}} (left out for lack of
      free memory), "table_mib": one table's size}``
      (``TrainingBenchmark.as_dict``).
    """
    config = dataclasses.replace(config or BenchmarkConfig(), **settings)
    return measure(config, BenchmarkReport(verbose)).as_dict()


def _parser() -> argparse.ArgumentParser:
    defaults = BenchmarkConfig()
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --training",
        description=__doc__.split("\n\n")[0],
    )
    for name in (*RECORDED_SETTINGS, "warmup"):
        default = getattr(defaults, name)
        if not isinstance(default, bool) and name != "optimizer":
            parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    parser.add_argument(
        "--scaling-vocabs",
        type=int,
        nargs="*",
        default=list(defaults.scaling_vocabs),
        help="other V at which to time partial, partial_xla, stock_tf and the floors (none: skip)",
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument(
        "--optimizer",
        choices=list(RULES),
        default=defaults.optimizer,
        help="the rule every Keras-optimizer variant trains with, here and in the bag model "
        "(default: %(default)s; under another, stock_tf, the update-only comparison and the "
        "bare-loop floor, lazy Adam written out by hand, are left out)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--update-only-steps",
        type=int,
        default=defaults.update_only_steps,
        help="timed steps of the optimizer update alone (0: skip)",
    )
    parser.add_argument(
        "--no-floors",
        dest="floors",
        action="store_false",
        help="skip the head-only and bare-loop floors",
    )
    parser.add_argument(
        "--in-process",
        dest="isolate_scaling",
        action="store_false",
        help="time the other V in this process too (default: a process each)",
    )
    parser.set_defaults(isolate_scaling=True)
    parser.add_argument(
        "--runs", type=int, default=1, help="repeat the whole measurement this many times"
    )
    parser.add_argument("--json", help="also write every run's figures to this JSON file")
    parser.epilog = (
        "--no-bags skips the bag model (bench._bags) that follows; --bags-only times it alone"
    )
    return parser


#: This module's name, also where it runs as ``__main__``.
_MODULE = "partial_embedding.bench._training"


def _run_in_child(arguments: Sequence[str], quiet: bool = False) -> dict[str, Any] | None:
    """One run in a fresh Python process, its output passed through (unless
    ``quiet``); its figures, or None where it failed (said so).

    TensorFlow keeps the buffers of the variables a traced step captured
    until the process ends, so runs in one process would pile their tables
    up; a process per run starts each from the same memory.
    """
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.json")
        # The last --runs and --json given win.
        command = [
            sys.executable, "-m", _MODULE, *arguments, "--runs", "1", "--json", path, "--no-bags"
        ]  # fmt: skip
        sys.stdout.flush()
        finished = subprocess.run(
            command, check=False, stdout=subprocess.DEVNULL if quiet else None
        )
        if finished.returncode != 0 or not os.path.exists(path):
            print(f"  its process failed (exit status {finished.returncode}); left out")
            return None
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)["runs"][0]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line entry point: runs the benchmark ``--runs`` times (each in
    a process of its own where more than one), printing each run and then the
    derived figures of all runs side by side.

    Returns:
      ``{"runs": [run_benchmark's dict, ...]}``, as ``--json`` writes it
      (runs that failed left out).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    # The bag model's switches (see the parser's epilog), then this model's flags.
    bags_only, with_bags = "--bags-only" in arguments, "--no-bags" not in arguments
    arguments = [a for a in arguments if a not in ("--bags-only", "--no-bags")]
    settings = vars(_parser().parse_args(arguments))
    runs, json_path = settings.pop("runs"), settings.pop("json")
    if runs < 1:
        raise SystemExit(f"--runs: must be at least 1, got {runs}")
    results: list[dict[str, Any]] = []
    if bags_only:
        pass
    elif runs == 1:
        results = [run_benchmark(BenchmarkConfig(**settings))]
    else:
        for run in range(runs):
            print(f"== run {run + 1} of {runs}")
            figures = _run_in_child(arguments)
            results += [figures] if figures is not None else []
        print(runs_summary(results))
    bag_runs = []
    if with_bags or bags_only:
        seed = [] if settings["seed"] is None else ["--seed", str(settings["seed"])]
        rule = ["--optimizer", settings["optimizer"]]
        bag_runs = bags.main(["--runs", str(runs), *seed, *rule])["runs"]
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump({"runs": results, "bags": bag_runs}, handle, indent=2, default=str)
    return {"runs": results, "bags": bag_runs}


# -- the optimizer update alone, ``partial`` against ``stock_tf`` (and ``partial_xla``) ---


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


def time_updates_only(config: BenchmarkConfig, rng: np.random.Generator) -> dict[str, float]:
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
    figures = interleaved_rounds(runs, config.update_only_steps, config.warmup, config.max_rounds)
    del updates, gradients, runs
    release_memory()
    update_only = {name: result["step_ms"] for name, result in figures.items()}
    for name in ("stock_tf", "partial_xla"):
        if name in update_only:
            update_only[f"{name}_over_partial"] = update_only[name] / update_only["partial"]
    return update_only


if __name__ == "__main__":
    main()
