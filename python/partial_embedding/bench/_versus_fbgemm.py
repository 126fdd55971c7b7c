"""Our embedding steps against FBGEMM's CPU table-batched embeddings.

``python -m partial_embedding.bench --versus-fbgemm`` (``--help`` for its
flags) times one step of the embedding alone (lookup, backward and the
optimizer's update of the table and its state, fed a fixed upstream gradient)
for each rule, on two shapes:

* ``bags``: 256 bags of 16 ids, mean of each bag;
* ``per-id``: 4,096 ids, one row each (in FBGEMM's terms, 4,096 bags of one).

Ours is ``PartialEmbedding`` (``combiner="mean"`` for bags) with every row
permitted, trained by ``MaskedOptimizer(inner)`` inside ``tf.function``.
Theirs is ``SplitTableBatchedEmbeddingBagsCodegen`` on the host
(``EmbeddingLocation.HOST``, ``ComputeDevice.CPU``, mean pooling), whose
backward applies the rule in place: ``EXACT_SGD`` against ``SGD``,
``EXACT_ADAGRAD`` against ``Adagrad`` and ``EXACT_ROWWISE_ADAGRAD`` against
``RowwiseAdagrad``. FBGEMM's CPU kernels take no Adam, so Adam is measured
against PyTorch's ``nn.EmbeddingBag(sparse=True)`` + ``torch.optim.SparseAdam``
(lazy like ours), and the table says so. Each side gets the same ids and
upstream gradients; both are warmed up, then timed in interleaved rounds in
one process (``bench._timing.interleaved_rounds``), and each keeps its best
round. Each rule runs in a process of its own (``--quick``: all in this one),
each side with one thread unless ``--threads`` says otherwise (see
``_use_threads`` for why).

It needs PyTorch and FBGEMM (``pip install torch==2.13.0 fbgemm-gpu-cpu==1.8.0``,
the CPU build of torch); without them it says what is missing and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
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

from partial_embedding.bench._timing import (  # noqa: E402
    interleaved_rounds,
    lacks_room_for,
    release_memory,
)
from partial_embedding.layers import PartialEmbedding  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer, RowwiseAdagrad  # noqa: E402

__all__ = ["RULES", "SHAPES", "VersusConfig", "main", "measure", "missing_requirements"]

#: This module's name, also where it runs as ``__main__`` (a rule's process).
_MODULE = "partial_embedding.bench._versus_fbgemm"

#: What to install where the other side is missing (the CPU build of torch).
INSTALL_HINT = "pip install torch==2.13.0 fbgemm-gpu-cpu==1.8.0"

#: The shapes timed: (bags, ids per bag, our layer's combiner).
SHAPES = {"bags": (256, 16, "mean"), "per-id": (4096, 1, None)}
_SHAPE_LABELS = {"bags": "bags 256x16 mean", "per-id": "per-id 4,096"}

_LEARNING_RATE = 0.01
_EPSILON = 1e-8


@dataclasses.dataclass(frozen=True)
class _Rule:
    """One optimizer rule on both sides.

    Attributes:
      inner: Our ``MaskedOptimizer``'s inner optimizer, built fresh.
      optim_type: FBGEMM's ``EmbOptimType`` member; None where FBGEMM's CPU
        kernels have no such rule and PyTorch's sparse optimizer stands in.
      theirs: How the table names the other side.
      state_tables: ``V x D`` tables of optimizer state each side holds.
    """

    inner: Callable[[], keras.optimizers.Optimizer]
    optim_type: str | None
    theirs: str
    state_tables: float


#: Every rule, by the name ``--optimizer`` takes. Both sides share the
#: learning rate; the other hyperparameters are each library's defaults
#: (they change the values a step writes, not its work).
RULES = {
    "sgd": _Rule(
        lambda: keras.optimizers.SGD(_LEARNING_RATE), "EXACT_SGD", "FBGEMM EXACT_SGD", 0.0
    ),
    "adagrad": _Rule(
        lambda: keras.optimizers.Adagrad(_LEARNING_RATE, epsilon=_EPSILON),
        "EXACT_ADAGRAD",
        "FBGEMM EXACT_ADAGRAD",
        1.0,
    ),
    "rowwise_adagrad": _Rule(
        lambda: RowwiseAdagrad(_LEARNING_RATE, epsilon=_EPSILON),
        "EXACT_ROWWISE_ADAGRAD",
        "FBGEMM EXACT_ROWWISE_ADAGRAD",
        0.0,
    ),
    "adam": _Rule(lambda: keras.optimizers.Adam(_LEARNING_RATE), None, "torch SparseAdam", 2.0),
}


@dataclasses.dataclass(frozen=True)
class VersusConfig:
    """One comparison.

    Attributes:
      rows, dim: The table ``V x D`` (float32).
      rules: Names from ``RULES``, in the order timed.
      rounds: Interleaved rounds (fewer where a round would have under 10
        steps: ``interleaved_rounds``).
      steps: Timed steps of each side and shape in a round.
      warmup: Untimed steps of each first.
      batches: Distinct batches of ids and upstream gradients cycled through.
      seed: Seed of the ids, the upstream gradients and both tables.
      threads: Threads each side is given (TensorFlow's intra- and inter-op
        pools, PyTorch's); 0 leaves each framework its default (every core).
      isolate: Time each rule in a process of its own (TensorFlow keeps the
        memory of a rule's tables for itself until its process ends, so the
        rules' tables would pile up); False: in this process.
    """

    rows: int = 1_000_000
    dim: int = 128
    rules: tuple[str, ...] = tuple(RULES)
    rounds: int = 5
    steps: int = 30
    warmup: int = 3
    batches: int = 8
    seed: int = 0
    threads: int = 1
    isolate: bool = True


#: ``--quick``: a small table and one short round in this process, for tests.
QUICK = {"rows": 20_000, "rounds": 1, "steps": 3, "warmup": 1, "batches": 2, "isolate": False}


def missing_requirements() -> str | None:
    """A line saying what the comparison lacks and how to install it; None
    where PyTorch and FBGEMM both import."""
    missing = []
    for module in ("torch", "fbgemm_gpu"):
        try:
            importlib.import_module(module)
        except ImportError as error:
            missing.append(f"{module} ({error})")
    if not missing:
        return None
    return (
        f"partial_embedding.bench --versus-fbgemm: needs PyTorch and FBGEMM; missing "
        f"{', '.join(missing)}. Install them with: {INSTALL_HINT}"
    )


# -- the batches both sides are fed --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Batch:
    """One step's ids (``[bags, ids_per_bag]``) and upstream gradient (``[bags, D]``)."""

    ids: np.ndarray
    upstream: np.ndarray


def _batches(config: VersusConfig, shape: str) -> list[_Batch]:
    bags, ids_per_bag, _ = SHAPES[shape]
    rng = np.random.default_rng([config.seed, bags, ids_per_bag])
    return [
        _Batch(
            rng.integers(0, config.rows, (bags, ids_per_bag)),
            (rng.normal(size=(bags, config.dim)) * 1e-3).astype(np.float32),
        )
        for _ in range(config.batches)
    ]


# -- our side ---------------------------------------------------------------------


def _our_step(config: VersusConfig, rule: str, shape: str) -> tuple[Callable[..., Any], list[Any]]:
    """Our step of ``shape`` under ``rule``, compiled, and the objects it keeps."""
    _, ids_per_bag, combiner = SHAPES[shape]
    keras.utils.set_random_seed(config.seed)
    layer = PartialEmbedding(
        config.rows,
        config.dim,
        trainable_ids=np.ones(config.rows, bool),
        embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=config.seed),
        combiner=combiner,
    )
    layer.build((None, ids_per_bag) if combiner else (None,))
    table = layer.embeddings
    optimizer = MaskedOptimizer(RULES[rule].inner())
    optimizer.build([table])

    @tf.function
    def step(ids: tf.Tensor, upstream: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            rows = layer(ids, training=True)
        (gradient,) = tape.gradient(rows, [table], output_gradients=upstream)
        optimizer.apply([gradient], [table])
        return optimizer.iterations

    # Traced here, once per rule and shape: TensorFlow would otherwise warn of
    # "retracing" when the same Python function is traced for the next rule.
    ids_shape = (SHAPES[shape][0],) + ((ids_per_bag,) if combiner else ())
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")
    try:
        step.get_concrete_function(
            tf.TensorSpec(ids_shape, tf.int32), tf.TensorSpec((SHAPES[shape][0], config.dim))
        )
    finally:
        logger.setLevel(level)
    return step, [layer, optimizer]


def _our_inputs(batches: list[_Batch], shape: str) -> list[tuple[tf.Tensor, tf.Tensor]]:
    per_id = SHAPES[shape][2] is None
    return [
        (
            tf.constant(batch.ids.reshape(-1) if per_id else batch.ids, tf.int32),
            tf.constant(batch.upstream),
        )
        for batch in batches
    ]


# -- their side -------------------------------------------------------------------


class _TorchStep:
    """A step of theirs: the pooled rows, their backward and, where the
    rule is not fused into FBGEMM's backward, PyTorch's sparse optimizer."""

    def __init__(self, module: Any, optimizer: Any = None) -> None:
        self.module = module
        self.optimizer = optimizer

    def __call__(self, indices: Any, offsets: Any, upstream: Any) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self.module(indices, offsets).backward(upstream)
        if self.optimizer is not None:
            self.optimizer.step()


def _their_step(config: VersusConfig, rule: str) -> _TorchStep:
    """Their step under ``rule`` (both shapes share it: a bag of one id is
    that id's row)."""
    import torch

    torch.manual_seed(config.seed)
    optim_type = RULES[rule].optim_type
    if optim_type is None:
        bag = torch.nn.EmbeddingBag(
            config.rows, config.dim, mode="mean", sparse=True, include_last_offset=True
        )
        torch.nn.init.uniform_(bag.weight, -0.05, 0.05)
        return _TorchStep(bag, torch.optim.SparseAdam(bag.parameters(), lr=_LEARNING_RATE))
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(config.rows, config.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=getattr(EmbOptimType, optim_type),
        learning_rate=_LEARNING_RATE,
        eps=_EPSILON,
        pooling_mode=PoolingMode.MEAN,
    )
    # The host table starts uninitialized: fill it as ours is.
    tbe.init_embedding_weights_uniform(-0.05, 0.05)
    return _TorchStep(tbe)


def _their_inputs(batches: list[_Batch]) -> list[tuple[Any, Any, Any]]:
    import torch

    inputs = []
    for batch in batches:
        bags, ids_per_bag = batch.ids.shape
        offsets = torch.arange(0, bags * ids_per_bag + 1, ids_per_bag, dtype=torch.int64)
        indices = torch.from_numpy(batch.ids.reshape(-1).astype(np.int64))
        inputs.append((indices, offsets, torch.from_numpy(batch.upstream)))
    return inputs


# -- one rule, every rule -----------------------------------------------------------


def _room_for(config: VersusConfig, rule: str) -> str | None:
    """Why ``rule`` is not timed now (too little free memory); None: time it."""
    per_side = 1 + RULES[rule].state_tables
    return lacks_room_for(2 * per_side * config.rows * config.dim * 4)


def time_rule(config: VersusConfig, rule: str) -> dict[str, dict[str, Any]]:
    """Both sides of ``rule`` on every shape, timed shape by shape in
    interleaved rounds; ``{shape: {"theirs": figures, "ours": figures}}``
    with ``interleaved_rounds``' figures.

    Theirs serves every shape (a bag of one id is that id's row); ours is
    built anew for each shape and let go after it.
    """
    theirs = _their_step(config, rule)
    by_shape: dict[str, dict[str, Any]] = {}
    for shape in SHAPES:
        batches = _batches(config, shape)
        ours, kept = _our_step(config, rule, shape)
        runs: dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]] = {
            "theirs": (theirs, _their_inputs(batches)),
            "ours": (ours, _our_inputs(batches, shape)),
        }
        by_shape[shape] = interleaved_rounds(
            runs, config.rounds * config.steps, config.warmup, max_rounds=config.rounds
        )
        del runs, ours, kept
        release_memory()
    return by_shape


def _time_rule_in_child(config: VersusConfig, rule: str) -> dict[str, Any] | None:
    """``time_rule`` in a fresh process; its figures, or None where it failed."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rule.json")
        child = json.dumps(dataclasses.asdict(dataclasses.replace(config, rules=(rule,))))
        command = [sys.executable, "-m", _MODULE, "--child", child, "--out", path]
        sys.stdout.flush()
        done = subprocess.run(command, check=False)
        if done.returncode != 0 or not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as handle:
            figures: dict[str, Any] = json.load(handle)
            return figures


def _run_child(config_json: str, out: str) -> None:
    """One rule's ``time_rule`` in this process, its figures written to ``out``."""
    settings = json.loads(config_json)
    config = VersusConfig(**{**settings, "rules": tuple(settings["rules"])})
    _use_threads(config.threads)
    by_shape = time_rule(config, config.rules[0])
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(by_shape, handle)


def measure(config: VersusConfig, verbose: bool = True) -> dict[str, Any]:
    """Times every rule of ``config`` (one after another, each let go before
    the next: in a process of its own where ``config.isolate``); prints each
    as it comes where ``verbose``.

    Returns:
      ``{"config": ..., "versions": {...}, "rules": {rule: {shape: {"theirs":
      figures, "ours": figures, "ratio": ours / theirs}}}, "skipped": {rule:
      why}}``, figures as ``interleaved_rounds`` gives them.
    """
    result: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "versions": _versions(),
        "threads": _use_threads(config.threads),
        "rules": {},
        "skipped": {},
    }
    if verbose:
        print(_heading(result), flush=True)
    for rule in config.rules:
        if reason := _room_for(config, rule):
            result["skipped"][rule] = reason
            if verbose:
                print(f"  {rule:<16} not timed: {reason}", flush=True)
            continue
        by_shape = (_time_rule_in_child if config.isolate else time_rule)(config, rule)
        if by_shape is None:
            result["skipped"][rule] = "its process failed"
            if verbose:
                print(f"  {rule:<16} not timed: its process failed", flush=True)
            continue
        for figures in by_shape.values():
            figures["ratio"] = figures["ours"]["step_ms"] / figures["theirs"]["step_ms"]
        result["rules"][rule] = by_shape
        if verbose:
            print("\n".join(_rule_lines(rule, by_shape)), flush=True)
    if verbose and (notes := _notes(result)):
        print("\n".join(notes))
    return result


# -- the report ---------------------------------------------------------------------


def _use_threads(threads: int) -> dict[str, int]:
    """Gives each side ``threads`` threads (0: leaves their defaults); the
    threads each then has (TensorFlow's 0: every core).

    OpenMP's spinning barriers (PyTorch's, so FBGEMM's) slow down many times
    over where the cores are busy with other work, TensorFlow's pool far
    less: on a shared machine one thread a side keeps the comparison about
    the kernels. TensorFlow takes the setting only before it first runs (a
    test process keeps what it has; the table says what each side had).
    """
    import torch

    if threads:
        torch.set_num_threads(threads)
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:
            pass
    return {
        "torch": torch.get_num_threads(),
        "tensorflow": tf.config.threading.get_intra_op_parallelism_threads(),
    }


def _versions() -> dict[str, Any]:
    import fbgemm_gpu
    import torch

    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "torch": torch.__version__,
        "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "?"),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cpus": len(affinity(0)) if affinity else os.cpu_count(),
    }


def _heading(result: dict[str, Any]) -> str:
    config, versions, threads = result["config"], result["versions"], result["threads"]
    return (
        f"-- ours vs FBGEMM's CPU TBE: V={config['rows']:,} x {config['dim']}, float32, every "
        f"row permitted; torch {versions['torch']}, fbgemm_gpu {versions['fbgemm_gpu']}, "
        f"TensorFlow {versions['tensorflow']}; {versions['cpus']} CPUs, threads: ours "
        f"{threads['tensorflow'] or 'all'}, theirs {threads['torch']}\n"
        f"   ms per step of the embedding alone (forward, backward, update), best round; "
        f"ratio = ours / theirs (above 1: ours slower)\n"
        f"  {'rule':<16} {'shape':<17} {'theirs':<28} {'theirs ms':>9} {'ours ms':>9} "
        f"{'ratio':>6}  rounds x steps"
    )


def _rule_lines(rule: str, by_shape: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for shape, figures in by_shape.items():
        theirs, ours = figures["theirs"], figures["ours"]
        rounds = int(ours["rounds"])
        lines.append(
            f"  {rule:<16} {_SHAPE_LABELS[shape]:<17} {RULES[rule].theirs:<28} "
            f"{theirs['step_ms']:9.3f} {ours['step_ms']:9.3f} {figures['ratio']:6.2f}  "
            f"{rounds} x {int(ours['steps']) // max(1, rounds)}"
        )
    return lines


def report(result: dict[str, Any]) -> str:
    """The table of a ``measure`` result: a line per rule and shape."""
    lines = [_heading(result)]
    for rule, by_shape in result["rules"].items():
        lines += _rule_lines(rule, by_shape)
    for rule, reason in result["skipped"].items():
        lines.append(f"  {rule:<16} not timed: {reason}")
    return "\n".join(lines + _notes(result))


def _notes(result: dict[str, Any]) -> list[str]:
    """What the table's last lines say about the other side."""
    if not any(RULES[rule].optim_type is None for rule in result["rules"]):
        return []
    return [
        "  torch SparseAdam: nn.EmbeddingBag(sparse=True) + torch.optim.SparseAdam, "
        "as FBGEMM's CPU kernels take no Adam"
    ]


def _parser() -> argparse.ArgumentParser:
    defaults = VersusConfig()
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --versus-fbgemm",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--rows", type=int, default=None, help=f"V (default {defaults.rows:,})")
    parser.add_argument("--dim", type=int, default=defaults.dim, help="row width D")
    parser.add_argument("--rounds", type=int, default=None, help=f"default {defaults.rounds}")
    parser.add_argument(
        "--steps", type=int, default=None, help=f"timed steps a round (default {defaults.steps})"
    )
    parser.add_argument(
        "--optimizer", nargs="+", choices=list(RULES), default=list(RULES), help="rules to time"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--threads",
        type=int,
        default=defaults.threads,
        help="threads each side may use (0: each framework's default, every core)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small and short ({', '.join(f'{k}={v}' for k, v in QUICK.items())})",
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    # One rule in this process (how a run calls its children): its settings, its output.
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the comparison; returns ``measure``'s result (empty where
    PyTorch or FBGEMM is missing: said in one line, nothing raised)."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if missing := missing_requirements():
        print(missing)
        return {}
    if args.child:
        _run_child(args.child, args.out)
        return {}
    settings: dict[str, Any] = dict(QUICK) if args.quick else {}
    for name in ("rows", "rounds", "steps"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    config = VersusConfig(
        dim=args.dim,
        rules=tuple(dict.fromkeys(args.optimizer)),
        seed=args.seed,
        threads=args.threads,
        **settings,
    )
    result = measure(config)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
