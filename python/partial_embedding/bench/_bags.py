"""The bag model of the training benchmark: bags of ids pooled into one vector.

``python -m partial_embedding.bench --training`` runs it after the per-id
model (``--bags-only`` alone, ``--no-bags`` not at all). A training step of
256 bags of 16 ids (``V x 128`` table, half the rows permitted, mean of each
bag into a ``Dense(1)``, MSE, Adam) is timed five ways, in the same
interleaved rounds at each V (100k, 1M, 4M, each in a process of its own):

* ``combiner``: ``PartialEmbedding(combiner="mean")`` + ``MaskedOptimizer(Adam)``:
  the bag op and its gradient, fed straight to the fused Adam;
* ``pooled``: ``PartialEmbedding`` + ``GlobalAveragePooling1D`` +
  ``MaskedOptimizer(Adam)`` (the library before bags);
* ``stock_tf``: ``tf.nn.embedding_lookup_sparse`` (mean) + a lazy masked Adam of
  stock TF ops (``bench._models.stock_tf_update``);
* ``keras``: stock ``keras.layers.Embedding`` + ``GlobalAveragePooling1D`` +
  ``Adam`` (every row trains, the update is dense: fewer steps, same rounds);
* ``head_only``: the same head, loss and Adam fed pooled vectors: a step less
  this floor is the embedding's own cost.

In the same rounds, two bare loops of the kernel module on NumPy arrays
measure the fused "bag backward + rule" idea: ``bare_two_ops`` (the bag
gradient, then the fused Adam on its rows, as the kernel path runs them)
against ``bare_fused`` (``masked_embedding_bag_apply_rule_cpu("adam", ...)``:
the same bits in one pass), single-threaded.

``--optimizer NAME`` (one of ``bench._models.RULES``; ``adam`` by default)
trains ``combiner``, ``pooled`` and ``keras`` with another rule (the head-only
floor keeps Adam); ``stock_tf`` and the two bare loops are Adam written out
by hand, and are then left out, said in one line.

Printed: each step, each embedding cost (where the run resolves it:
``bench._floors.resolved_difference``), stock_tf / combiner, pooled /
combiner, the combiner step at the largest V over the smallest,
bare_two_ops / bare_fused; then the peak memory of a step at 16 ids a bag and
at 256 (``--memory-length``) for ``combiner`` and ``pooled``, TensorFlow's
CPU allocator peak during the step over what it held before (in a process
started with ``TF_CPU_ALLOCATOR_USE_BFC=true``, which keeps the statistics).
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

from partial_embedding.bench._floors import (  # noqa: E402
    UNRESOLVED_NOTE,
    adam_hyperparameters,
    kernel_module,
    ratio,
    resolved_difference,
)
from partial_embedding.bench._models import (  # noqa: E402
    DEFAULT_RULE,
    RULES,
    adam_only_note,
    keras_step,
    make_optimizer,
    stock_tf_step,
)
from partial_embedding.bench._timing import (  # noqa: E402
    interleaved_rounds,
    lacks_room_for,
    release_memory,
)
from partial_embedding.layers import PartialEmbedding  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer  # noqa: E402

__all__ = [
    "BAG_VARIANTS",
    "BagConfig",
    "bag_report",
    "build_bag_variant",
    "main",
    "measure_bags",
    "run_bag_runs",
]

#: The bag model's steps, and the floors timed with them.
BAG_VARIANTS = ("combiner", "pooled", "stock_tf", "keras")
BAG_FLOORS = ("head_only", "bare_two_ops", "bare_fused")
#: What is Adam written out by hand: timed under ``adam`` only.
BAG_ADAM_ONLY = ("stock_tf", "bare_two_ops", "bare_fused")
#: How many ``V x D`` tables each variant holds (table and Adam slots).
_TABLES_HELD = {"combiner": 2.0, "pooled": 2.0, "stock_tf": 3.0, "keras": 3.0, "bare": 2.0}


@dataclasses.dataclass(frozen=True)
class BagConfig:
    """One measurement of the bag model at one V.

    Attributes:
      vocab, width: The table ``V x D``.
      batch, ids_per_bag: Bags per step and ids per bag.
      permitted_fraction: Share of rows that learn.
      steps: Timed steps of each fast variant over all rounds.
      keras_steps: Timed steps of ``keras`` (its dense update is slow).
      max_rounds: Most interleaved rounds.
      warmup: Untimed steps first.
      seed: Seed of the ids and the mask.
      optimizer: The rule of ``bench._models.RULES`` that ``combiner``,
        ``pooled`` and ``keras`` train with; under any but ``adam``,
        ``BAG_ADAM_ONLY`` is left out.
    """

    vocab: int = 1_000_000
    width: int = 128
    batch: int = 256
    ids_per_bag: int = 16
    permitted_fraction: float = 0.5
    steps: int = 200
    keras_steps: int = 10
    max_rounds: int = 10
    warmup: int = 3
    seed: int = 0
    optimizer: str = DEFAULT_RULE


# -- the models --------------------------------------------------------------------


def _head() -> keras.layers.Dense:
    return keras.layers.Dense(1, name="head")


def _bag_model(embedding: keras.layers.Layer, ids_per_bag: int, pool: bool) -> keras.Model:
    ids = keras.Input((ids_per_bag,), dtype="int32")
    rows = embedding(ids)
    pooled = keras.layers.GlobalAveragePooling1D()(rows) if pool else rows
    return keras.Model(ids, _head()(pooled))


def _mean_of_bags(table: tf.Variable, sp_ids: tf.SparseTensor) -> tf.Tensor:
    return tf.nn.embedding_lookup_sparse(table, sp_ids, None, combiner="mean")


def build_bag_variant(
    variant: str,
    vocab: int,
    width: int,
    permitted: np.ndarray,
    ids_per_bag: int,
    rule: str = DEFAULT_RULE,
) -> tuple[Callable[..., Any], list[Any]]:
    """A training step of the bag model built one way (``BAG_VARIANTS`` or
    ``head_only``) with ``rule`` as its optimizer (``head_only``: Adam), and
    the objects it keeps alive.

    Raises:
      ValueError: An unknown variant, or ``stock_tf`` (lazy Adam of stock
        ops) with a rule other than ``adam``.
    """
    if variant == "stock_tf":
        if rule != "adam":
            raise ValueError(f"the bag model's stock_tf implements lazy Adam only, not {rule!r}")
        return stock_tf_step(vocab, width, permitted, pool=_mean_of_bags)
    if variant == "head_only":
        pooled = keras.Input((width,))
        model = keras.Model(pooled, _head()(pooled))
        optimizer: Any = keras.optimizers.Adam()
    elif variant in ("combiner", "pooled"):
        combiner = "mean" if variant == "combiner" else None
        embedding = PartialEmbedding(vocab, width, trainable_ids=permitted, combiner=combiner)
        model = _bag_model(embedding, ids_per_bag, pool=combiner is None)
        optimizer = MaskedOptimizer(make_optimizer(rule))
    elif variant == "keras":
        model = _bag_model(keras.layers.Embedding(vocab, width), ids_per_bag, pool=True)
        optimizer = make_optimizer(rule)
    else:
        raise ValueError(f"unknown bag variant {variant!r}; choose from {BAG_VARIANTS}")
    return keras_step(model, optimizer), [model, optimizer]


# -- the bare loops: the fused bag backward + Adam against the two ops ----------------


@dataclasses.dataclass
class _BareBags:
    """The bag gradient and the fused Adam of the kernel module on NumPy
    arrays (compact slots, one thread): two ops, or one fused pass.
    ``slot_of_row`` maps each row to its slot row (int32, frozen rows 0) for
    the two ops, ``slot_map`` the same for the fused step as its kernel keeps
    it (float32, frozen rows -1; every permitted row has its slot row, so the
    step adds none)."""

    kernels: Any
    arrays: list[np.ndarray]
    permitted: np.ndarray
    slot_of_row: np.ndarray
    bags: np.ndarray
    factors: np.ndarray
    fused: bool
    hyperparameters: list[float] = dataclasses.field(default_factory=adam_hyperparameters)

    def __post_init__(self) -> None:
        self.slot_map = np.where(self.permitted, self.slot_of_row, -1).astype(np.float32)
        self.slot_rows = int(self.permitted.sum())

    def __call__(self, ids: np.ndarray, grad: np.ndarray) -> None:
        table, *moments = self.arrays
        if self.fused:
            self.kernels.masked_embedding_bag_apply_rule_cpu(
                "adam",
                table,
                moments,
                grad,
                ids,
                self.bags,
                self.factors,
                self.permitted,
                self.hyperparameters,
                slot_of_row=self.slot_map,
                rows_used=self.slot_rows,
                num_threads=1,
            )
            return
        rows, values = self.kernels.masked_embedding_bag_grad_cpu(
            grad, ids, self.bags, self.factors, self.permitted, num_threads=1
        )
        self.kernels.masked_sparse_apply_rule_cpu(
            "adam",
            table,
            moments,
            rows,
            self.slot_of_row[rows].astype(rows.dtype),
            values,
            self.permitted,
            self.hyperparameters,
            num_threads=1,
        )


def _bare_runs(
    config: BagConfig, permitted: np.ndarray, id_batches: list[np.ndarray], rng: np.random.Generator
) -> dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]]:
    """``bare_two_ops`` and ``bare_fused`` (each with its own table and
    slots), or none where the kernel module lacks them."""
    kernels = kernel_module()
    if kernels is None or not hasattr(kernels, "masked_embedding_bag_apply_rule_cpu"):
        return {}
    slot_of_row = np.zeros(config.vocab, np.int32)
    slot_of_row[permitted] = np.arange(int(permitted.sum()), dtype=np.int32)
    slots = max(1, int(permitted.sum()))
    bags = np.repeat(np.arange(config.batch), config.ids_per_bag).astype(np.int64)
    factors = np.full(bags.size, 1.0 / config.ids_per_bag, np.float32)
    inputs: list[tuple[Any, ...]] = [
        (
            np.ascontiguousarray(ids.reshape(-1), dtype=np.int32),
            (rng.normal(size=(config.batch, config.width)) * 1e-3).astype(np.float32),
        )
        for ids in id_batches
    ]
    runs: dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]] = {}
    # One table and one pair of moments for both: each step's time does not
    # depend on the values, and two copies of a 4M-row table do not fit here.
    table = rng.random((config.vocab, config.width), dtype=np.float32) * 0.1
    arrays = [table, *(np.zeros((slots, config.width), np.float32) for _ in range(2))]
    for name, fused in (("bare_two_ops", False), ("bare_fused", True)):
        bare = _BareBags(kernels, arrays, permitted, slot_of_row, bags, factors, fused)
        runs[name] = (bare, inputs)
    return runs


# -- one measurement ------------------------------------------------------------------


def _batches(
    config: BagConfig, rng: np.random.Generator, count: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        (
            rng.integers(0, config.vocab, (config.batch, config.ids_per_bag)),
            rng.normal(size=(config.batch, 1)).astype(np.float32),
        )
        for _ in range(count)
    ]


def permitted_rows(rng: np.random.Generator, config: BagConfig) -> np.ndarray:
    """Exactly ``round(vocab * permitted_fraction)`` rows, drawn at random.

    Exactly: ``compact_slots="auto"`` compacts only where at most half the
    rows learn, so a mask of about half the rows (a draw per row) chose
    full-size slots on some seeds and compact ones on others, and the runs of
    one setting measured two different optimizers.
    """
    permitted = np.zeros(config.vocab, bool)
    count = round(config.vocab * config.permitted_fraction)
    permitted[rng.choice(config.vocab, count, replace=False)] = True
    return permitted


def _sparse_batches(
    config: BagConfig, batches: list[tuple[np.ndarray, np.ndarray]]
) -> list[tuple[tf.SparseTensor, tf.Tensor]]:
    """``batches`` with their ids as the ``SparseTensor`` that
    ``tf.nn.embedding_lookup_sparse`` takes."""
    # Every id of a bag is an entry of the SparseTensor, in row-major order.
    every_entry = np.stack(
        np.meshgrid(np.arange(config.batch), np.arange(config.ids_per_bag), indexing="ij"), -1
    ).reshape(-1, 2)
    return [
        (
            tf.SparseTensor(every_entry, ids.reshape(-1), [config.batch, config.ids_per_bag]),
            tf.constant(y),
        )
        for ids, y in batches
    ]


def measure_bags(config: BagConfig, with_bare: bool = True) -> dict[str, Any]:
    """Times the bag model's variants and floors at ``config.vocab``, in the
    same interleaved rounds (under a rule other than ``adam``, less
    ``BAG_ADAM_ONLY``); returns ``{"figures": {name: ...}, "skipped": {name:
    why}, "embedding_cost": {variant: ms}, "optimizer": the rule}``."""
    adam = config.optimizer == "adam"
    rng = np.random.default_rng([config.seed, config.vocab])
    permitted = permitted_rows(rng, config)
    batches = _batches(config, rng, 16)
    dense = [(tf.constant(ids, tf.int32), tf.constant(y)) for ids, y in batches]
    sparse = _sparse_batches(config, batches)
    pooled_rows = [
        (tf.constant(rng.normal(size=(config.batch, config.width)), tf.float32), y)
        for _, y in dense
    ]
    table_bytes = config.vocab * config.width * 4
    runs: dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]] = {}
    kept: list[Any] = []
    skipped: dict[str, str] = {}
    for variant in (*BAG_VARIANTS, "head_only"):
        if variant in BAG_ADAM_ONLY and not adam:
            continue
        held = _TABLES_HELD.get(variant, 0.0) * table_bytes
        if variant in ("stock_tf", "keras") and (reason := lacks_room_for(held)):
            skipped[variant] = reason
            continue
        step, objects = build_bag_variant(
            variant, config.vocab, config.width, permitted, config.ids_per_bag, config.optimizer
        )
        inputs = {"stock_tf": sparse, "head_only": pooled_rows}.get(variant, dense)
        runs[variant] = (step, list(inputs))
        kept += objects
    if with_bare and adam:
        if reason := lacks_room_for(_TABLES_HELD["bare"] * table_bytes):
            skipped["bare loops"] = reason
        else:
            runs.update(_bare_runs(config, permitted, [ids for ids, _ in batches], rng))
    figures = interleaved_rounds(
        runs,
        config.steps,
        config.warmup,
        config.max_rounds,
        steps_of={"keras": config.keras_steps},
    )
    del runs, kept
    release_memory()
    floor = figures["head_only"]
    costs = {
        variant: cost
        for variant in BAG_VARIANTS
        if variant in figures and (cost := resolved_difference(figures[variant], floor)) is not None
    }
    return {
        "figures": figures,
        "skipped": skipped,
        "embedding_cost": costs,
        "optimizer": config.optimizer,
    }


def measure_memory(config: BagConfig) -> dict[str, float | None]:
    """The most TensorFlow's CPU allocator held during a step of ``combiner``
    and ``pooled`` beyond what it held before (MiB); None where it keeps no
    statistics (start the process with ``TF_CPU_ALLOCATOR_USE_BFC=true``)."""
    rng = np.random.default_rng([config.seed, config.vocab, config.ids_per_bag])
    permitted = permitted_rows(rng, config)
    batches = [(tf.constant(ids, tf.int32), tf.constant(y)) for ids, y in _batches(config, rng, 4)]
    runs: dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]] = {}
    kept: list[Any] = []
    for variant in ("combiner", "pooled"):
        step, objects = build_bag_variant(
            variant, config.vocab, config.width, permitted, config.ids_per_bag, config.optimizer
        )
        runs[variant] = (step, batches)
        kept += objects
    figures = interleaved_rounds(runs, 10, config.warmup, max_rounds=2)
    return {variant: figures[variant].get("peak_step_alloc_mib") for variant in runs}


# -- processes, runs and the report ---------------------------------------------------


def _in_child(arguments: Sequence[str], environment: dict[str, str] | None = None) -> Any:
    """This module in a fresh process (TensorFlow keeps the tables a traced
    step captured until the process ends); its JSON result, or None."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "result.json")
        command = [sys.executable, "-m", "partial_embedding.bench._bags", *arguments, "--out", path]
        done = subprocess.run(
            command, check=False, env={**os.environ, **(environment or {})}, text=True
        )
        if done.returncode != 0 or not os.path.exists(path):
            print(f"  its process failed (exit status {done.returncode}); left out")
            return None
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)


def run_bag_runs(
    vocabs: Sequence[int],
    steps: int,
    memory_lengths: Sequence[int],
    seed: int,
    rule: str = DEFAULT_RULE,
) -> dict[str, Any]:
    """One run with ``rule`` as the optimizer: each V in a process of its
    own, then the memory of a step at each of ``memory_lengths`` ids a bag
    (V = the smallest of ``vocabs``)."""
    left_out = [] if rule == "adam" else list(BAG_ADAM_ONLY)
    if left_out:
        print("  " + adam_only_note(rule, left_out))
    by_vocab = {}
    for vocab in vocabs:
        result = _in_child(
            [
                "--child",
                "time",
                f"--vocab={vocab}",
                f"--steps={steps}",
                f"--seed={seed}",
                f"--optimizer={rule}",
            ]
        )
        if result is not None:
            by_vocab[vocab] = result
            print(_vocab_lines(vocab, result))
    memory = {}
    for length in memory_lengths:
        result = _in_child(
            [
                "--child",
                "memory",
                f"--vocab={min(vocabs)}",
                f"--ids-per-bag={length}",
                f"--seed={seed}",
                f"--optimizer={rule}",
            ],
            {"TF_CPU_ALLOCATOR_USE_BFC": "true"},
        )
        if result is not None:
            memory[length] = result
            print(_memory_line(min(vocabs), length, result))
    run = {
        "optimizer": rule,
        "adam_only_left_out": left_out,
        "by_vocab": by_vocab,
        "memory": memory,
    }
    print(bag_report([run]))
    return run


def _vocab_lines(vocab: int, result: dict[str, Any]) -> str:
    figures, costs = result["figures"], result["embedding_cost"]
    rule = result.get("optimizer", DEFAULT_RULE)
    lines = [
        f"-- bag model, V={vocab:,}, optimizer {rule}: 256 bags x 16 ids, best round (median), "
        "ms/step"
    ]
    for name, values in figures.items():
        cost = costs.get(name)
        extra = "" if cost is None else f"   embedding cost {cost:7.3f}"
        if cost is None and name in BAG_VARIANTS:
            extra = f"   embedding cost {'-':>7}"
        lines.append(
            f"  {name:<13} {values['step_ms']:8.3f} ({values['median_step_ms']:8.3f}){extra}"
        )
    if any(name in figures and name not in costs for name in BAG_VARIANTS):
        lines.append(f"  ({UNRESOLVED_NOTE})")
    for name, reason in result["skipped"].items():
        lines.append(f"  {name:<13} not timed: {reason}")
    return "\n".join(lines)


def _memory_line(vocab: int, length: int, result: dict[str, Any]) -> str:
    parts = ", ".join(
        f"{name} {'-' if mib is None else format(mib, '.1f')} MiB" for name, mib in result.items()
    )
    return f"-- peak TF memory of a step, V={vocab:,}, 256 bags x {length} ids: {parts}"


def bag_figures(run: dict[str, Any]) -> dict[str, Any]:
    """The ratios that follow from one run's figures (None where one of
    their costs is not resolved)."""
    by_vocab = {int(v): r for v, r in run["by_vocab"].items()}
    out: dict[str, Any] = {
        "stock_tf_over_combiner_embedding": {},
        "pooled_over_combiner_embedding": {},
    }
    out["bare_two_ops_over_fused"] = {}
    for vocab, result in sorted(by_vocab.items()):
        costs, figures = result["embedding_cost"], result["figures"]
        out["stock_tf_over_combiner_embedding"][vocab] = ratio(
            costs.get("stock_tf"), costs.get("combiner")
        )
        out["pooled_over_combiner_embedding"][vocab] = ratio(
            costs.get("pooled"), costs.get("combiner")
        )
        out["bare_two_ops_over_fused"][vocab] = ratio(
            figures.get("bare_two_ops", {}).get("step_ms"),
            figures.get("bare_fused", {}).get("step_ms"),
        )
    steps = {v: r["figures"]["combiner"]["step_ms"] for v, r in by_vocab.items()}
    out["combiner_step_largest_over_smallest"] = (
        steps[max(steps)] / steps[min(steps)] if len(steps) >= 2 else None
    )
    memory = {int(k): v for k, v in run.get("memory", {}).items()}
    out["memory_mib"] = memory
    return out


def bag_report(runs: Sequence[dict[str, Any]]) -> str:
    """The ratios of one or more runs, run by run."""
    figures = [bag_figures(run) for run in runs]
    vocabs = sorted({v for f in figures for v in f["stock_tf_over_combiner_embedding"]})

    def cells(key: str, vocab: int) -> str:
        values = [f[key].get(vocab) for f in figures]
        return " ".join("-" if x is None else f"{x:.2f}" for x in values)

    lines = [f"== bag model, {len(runs)} run(s), run by run"]
    for vocab in vocabs:
        lines.append(
            f"  V={vocab:>9,}: stock_tf / combiner embedding cost: "
            f"{cells('stock_tf_over_combiner_embedding', vocab)}; pooled / combiner: "
            f"{cells('pooled_over_combiner_embedding', vocab)}; bare two ops / fused: "
            f"{cells('bare_two_ops_over_fused', vocab)}"
        )
    ratios = [f["combiner_step_largest_over_smallest"] for f in figures]
    if any(r is not None for r in ratios):
        lines.append(
            f"  combiner step, V={max(vocabs):,} / V={min(vocabs):,}: "
            + " ".join("-" if r is None else f"{r:.2f}" for r in ratios)
        )
    for f in figures:
        for length, memory in sorted(f["memory_mib"].items()):
            combiner, pooled = memory.get("combiner"), memory.get("pooled")
            lines.append(
                f"  peak TF memory of a step at {length} ids a bag: combiner "
                f"{'-' if combiner is None else format(combiner, '.1f')} MiB, pooled "
                f"{'-' if pooled is None else format(pooled, '.1f')} MiB"
            )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --bags", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--vocabs", type=int, nargs="+", default=[100_000, 1_000_000, 4_000_000])
    parser.add_argument("--steps", type=int, default=BagConfig.steps)
    parser.add_argument("--memory-lengths", type=int, nargs="*", default=[16, 256])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--optimizer",
        choices=list(RULES),
        default=DEFAULT_RULE,
        help="the rule combiner, pooled and keras train with (default: %(default)s; under "
        "another, stock_tf and the bare loops, Adam written out by hand, are left out)",
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", help="write every run's figures to this JSON file")
    # One measurement in this process (how runs call their children).
    parser.add_argument("--child", choices=["time", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, default=BagConfig.vocab, help=argparse.SUPPRESS)
    parser.add_argument(
        "--ids-per-bag", type=int, default=BagConfig.ids_per_bag, help=argparse.SUPPRESS
    )
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the bag benchmark ``--runs`` times; returns ``{"runs": [...]}``."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.child:
        config = BagConfig(
            vocab=args.vocab,
            ids_per_bag=args.ids_per_bag,
            steps=args.steps,
            seed=args.seed,
            optimizer=args.optimizer,
        )
        result = measure_bags(config) if args.child == "time" else measure_memory(config)
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle)
        return {}
    runs = []
    for run in range(args.runs):
        if args.runs > 1:
            print(f"== bag model: run {run + 1} of {args.runs}")
        runs.append(
            run_bag_runs(
                args.vocabs, args.steps, args.memory_lengths, args.seed + run, args.optimizer
            )
        )
    if args.runs > 1:
        print(bag_report(runs))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"runs": runs}, handle, indent=2, default=str)
    return {"runs": runs}


if __name__ == "__main__":
    main()
