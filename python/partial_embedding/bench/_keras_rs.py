"""keras-rs's ``DistributedEmbedding`` against ours (``bench --keras-rs``).

Needs the ``keras-rs`` extra. One table of ``V`` rows and ``D`` columns, one
feature of ``batch x bag`` ids (a bag per example, mean combiner) and a
``Dense(1)`` head, trained with ``train_on_batch`` (forward, backward,
update) for each optimizer:

* ``keras_rs``: ``keras_rs.layers.DistributedEmbedding`` on the default
  device (a Keras ``Embedding`` and a combiner per table) with the plain Keras
  optimizer, as a keras-rs user runs it on a CPU or GPU;
* ``ours``: ``partial_embedding.DistributedEmbedding`` with the same configs
  and ``MaskedOptimizer`` around the same optimizer, every row trainable.

Both are built from the same ``FeatureConfig`` and timed in interleaved rounds
(the order alternating), each its best and median round; ours runs more steps
a round, since keras-rs's step is far slower. An optimizer that does not run
under ``MaskedOptimizer`` (FTRL, before it is a rule of the table) is
reported with its error instead of a time. The report gives milliseconds and
the ratio keras-rs / ours measured in the same run, nothing else.

:func:`measure` returns a :class:`KerasRsBenchmark`; :func:`report` prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

__all__ = [
    "OPTIMIZERS",
    "KerasRsBenchConfig",
    "KerasRsBenchmark",
    "OptimizerFigures",
    "main",
    "measure",
    "parse_args",
    "report",
]

#: The optimizers timed, in report order.
OPTIMIZERS = ("adam", "adagrad", "sgd", "ftrl")


@dataclasses.dataclass(frozen=True)
class KerasRsBenchConfig:
    """What one run measures.

    Attributes:
      vocabs: Table sizes ``V``, each measured in turn.
      dim: Table width ``D``.
      batch, bag: Each step trains on ``batch`` bags of ``bag`` ids.
      rounds: Interleaved timing rounds.
      ours_steps, keras_rs_steps: Steps a round of each.
      warmup: Untimed steps of each first (tracing, slot creation).
      optimizers: Names of ``OPTIMIZERS`` to time.
      seed: Seed of the ids and the weights.
    """

    vocabs: tuple[int, ...] = (1_000_000,)
    dim: int = 64
    batch: int = 256
    bag: int = 16
    rounds: int = 5
    ours_steps: int = 20
    keras_rs_steps: int = 2
    warmup: int = 2
    optimizers: tuple[str, ...] = OPTIMIZERS
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("dim", "batch", "bag", "rounds", "ours_steps", "keras_rs_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        if not self.vocabs or min(self.vocabs) < 1:
            raise ValueError(f"vocabs must be positive sizes; got {self.vocabs}")
        unknown = sorted(set(self.optimizers) - set(OPTIMIZERS))
        if unknown:
            raise ValueError(f"optimizers must be among {OPTIMIZERS}; got {unknown}")


@dataclasses.dataclass(frozen=True)
class OptimizerFigures:
    """One optimizer at one ``V``: best and median ms a step of each layer, or
    the error that kept a layer from training (then its times are NaN)."""

    vocab: int
    optimizer: str
    ours_ms: tuple[float, float]
    keras_rs_ms: tuple[float, float]
    error: str | None = None

    @property
    def ratio(self) -> float:
        """keras-rs's median step over ours."""
        return self.keras_rs_ms[1] / self.ours_ms[1]


@dataclasses.dataclass(frozen=True)
class KerasRsBenchmark:
    config: KerasRsBenchConfig
    figures: list[OptimizerFigures]


def _optimizer(name: str) -> Any:
    import keras

    return {
        "adam": lambda: keras.optimizers.Adam(1e-3),
        "adagrad": lambda: keras.optimizers.Adagrad(1e-2),
        "sgd": lambda: keras.optimizers.SGD(1e-2),
        "ftrl": lambda: keras.optimizers.Ftrl(1e-2),
    }[name]()


def _model(layer_class: Any, config: KerasRsBenchConfig, vocab: int) -> Any:
    import keras
    import keras_rs

    table = keras_rs.layers.TableConfig(
        "items", vocabulary_size=vocab, embedding_dim=config.dim, combiner="mean"
    )
    feature = keras_rs.layers.FeatureConfig(
        "items", table, (config.batch, config.bag), (config.batch, config.dim)
    )
    ids = keras.Input((config.bag,), batch_size=config.batch, dtype="int32", name="items")
    pooled = layer_class({"items": feature})({"items": ids})["items"]
    return keras.Model({"items": ids}, keras.layers.Dense(1)(pooled))


def _step(variant: str, optimizer: str, config: KerasRsBenchConfig, vocab: int) -> Any:
    """A compiled model's training step, or the error that stops it."""
    import keras
    import keras_rs

    import partial_embedding as pe

    keras.utils.set_random_seed(config.seed)
    ours = variant == "ours"
    layer_class = pe.DistributedEmbedding if ours else keras_rs.layers.DistributedEmbedding
    model = _model(layer_class, config, vocab)
    rule = _optimizer(optimizer)
    model.compile(pe.MaskedOptimizer(rule) if ours else rule, "mse", jit_compile=False)
    rng = np.random.default_rng(config.seed)
    ids = rng.integers(0, vocab, (config.batch, config.bag)).astype(np.int32)
    targets = rng.normal(size=(config.batch, 1)).astype(np.float32)
    step = lambda: model.train_on_batch({"items": ids}, targets)  # noqa: E731
    for _ in range(config.warmup):
        step()
    return step


def _interleaved(steps: dict[str, tuple[Callable[[], Any], int]], rounds: int) -> dict:
    """Best and median ms a step of each, rounds in turn, the order alternating."""
    gc.collect()
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            step, count = steps[name]
            start = time.perf_counter()
            for _ in range(count):
                step()
            times[name].append(1e3 * (time.perf_counter() - start) / count)
    return {name: (min(t), float(np.median(t))) for name, t in times.items()}


def _measure_one(config: KerasRsBenchConfig, vocab: int, optimizer: str) -> OptimizerFigures:
    import keras

    nan = (float("nan"), float("nan"))
    steps: dict[str, tuple[Callable[[], Any], int]] = {}
    errors = []
    for variant, count in (("ours", config.ours_steps), ("keras_rs", config.keras_rs_steps)):
        try:
            steps[variant] = (_step(variant, optimizer, config, vocab), count)
        except Exception as error:  # reported, not raised: the other rows still run
            errors.append(f"{variant}: {type(error).__name__}: {str(error).splitlines()[0]}")
    timed = _interleaved(steps, config.rounds) if steps else {}
    del steps
    keras.backend.clear_session()
    gc.collect()
    return OptimizerFigures(
        vocab,
        optimizer,
        timed.get("ours", nan),
        timed.get("keras_rs", nan),
        "; ".join(errors) or None,
    )


def measure(config: KerasRsBenchConfig) -> KerasRsBenchmark:
    """Times both layers for every ``V`` and optimizer of ``config``."""
    figures = [
        _measure_one(config, vocab, optimizer)
        for vocab in config.vocabs
        for optimizer in config.optimizers
    ]
    return KerasRsBenchmark(config, figures)


def report(result: KerasRsBenchmark, stream: TextIO = sys.stdout) -> None:
    """Prints ms a step of each layer and keras-rs / ours, per ``V`` and optimizer."""
    config = result.config
    stream.write(
        f"DistributedEmbedding step (train_on_batch), D={config.dim}, {config.batch} bags x "
        f"{config.bag} ids, mean, Dense(1) head; {config.rounds} interleaved rounds of "
        f"{config.ours_steps} (ours) and {config.keras_rs_steps} (keras-rs) steps\n"
    )
    stream.write(
        f"{'V':>11} {'optimizer':<9} {'ours median':>12} {'ours best':>10} "
        f"{'keras-rs median':>16} {'keras-rs best':>14} {'keras-rs/ours':>14}\n"
    )
    for f in result.figures:
        stream.write(
            f"{f.vocab:>11,} {f.optimizer:<9} {f.ours_ms[1]:>12.2f} {f.ours_ms[0]:>10.2f} "
            f"{f.keras_rs_ms[1]:>16.1f} {f.keras_rs_ms[0]:>14.1f} {f.ratio:>14.1f}\n"
        )
        if f.error:
            stream.write(f"{'':>11} {f.optimizer:<9} did not run: {f.error}\n")


def parse_args(argv: Sequence[str] | None = None) -> KerasRsBenchConfig:
    """The benchmark's flags as a config (``--keras-rs`` is accepted and ignored)."""
    defaults = KerasRsBenchConfig()
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --keras-rs",
        description="keras-rs's DistributedEmbedding against partial_embedding's, "
        "train_on_batch step time per optimizer.",
    )
    parser.add_argument("--keras-rs", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="V = 10,000 and a few steps (seconds)")
    parser.add_argument(
        "--full", action="store_true", help="V = 1M and 10M (keras-rs at 10M needs ~8 GiB)"
    )
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(defaults.vocabs))
    parser.add_argument("--optimizers", nargs="+", default=list(defaults.optimizers))
    for name in ("dim", "batch", "bag", "rounds", "ours_steps", "keras_rs_steps", "warmup"):
        default = getattr(defaults, name)
        parser.add_argument(
            "--" + name.replace("_", "-"), type=int, default=default, help=f"(default {default})"
        )
    args = vars(parser.parse_args(argv))
    args.pop("keras_rs")
    quick, full = args.pop("quick"), args.pop("full")
    if quick:
        args.update(vocabs=[10_000], rounds=2, ours_steps=3, keras_rs_steps=1, warmup=1)
    elif full:
        args["vocabs"] = [1_000_000, 10_000_000]
    args["vocabs"], args["optimizers"] = tuple(args["vocabs"]), tuple(args["optimizers"])
    try:
        return KerasRsBenchConfig(**args)
    except ValueError as error:
        parser.error(str(error))
        raise  # parser.error exits; this keeps type checkers content


def main(argv: Sequence[str] | None = None) -> KerasRsBenchmark:
    """Runs the benchmark from the command line and prints its report."""
    config = parse_args(argv)
    result = measure(config)
    report(result)
    return result
