"""Tied-embedding benchmark: new tokens of a language model, three ways.

Run ``python -m partial_embedding.bench --lm`` (``--help`` for options). One run
builds a small causal-LM-like model, ids -> tied embedding -> ``Dense(D)`` ->
the same embedding in reverse (logits over the vocabulary) -> sparse
categorical cross-entropy, and times its training step (forward, backward,
optimizer update) built three ways:

* ``partial``: ``PartialReversibleEmbedding`` whose last ``new_tokens`` rows
  learn, + ``MaskedOptimizer(Adam)``: the reverse projection's table gradient
  holds those rows only, and so does the optimizer state;
* ``stock``: ``keras.layers.ReversibleEmbedding`` + ``Adam``: every row
  trains (the tied table gets a dense ``V x D`` gradient each step);
* ``stock_frozen``: the same with the embedding frozen (``trainable=False``),
  the floor: new tokens cannot learn.

For each vocabulary size it reports the median step time and the bytes of
optimizer state (every optimizer variable, compact slots included) next to
the table's bytes. ``measure`` takes an ``LmBenchConfig`` and returns an
``LmBenchmark``; ``report`` prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.layers import PartialReversibleEmbedding  # noqa: E402
from partial_embedding.optimizers import MaskedOptimizer  # noqa: E402

__all__ = [
    "LM_VARIANTS",
    "LmBenchConfig",
    "LmBenchmark",
    "LmTiming",
    "main",
    "measure",
    "measure_case",
    "report",
]

LM_VARIANTS = ("partial", "stock", "stock_frozen")


@dataclasses.dataclass(frozen=True)
class LmBenchConfig:
    """What one run measures.

    Attributes:
      vocab_sizes: The vocabulary sizes V, each a table of ``V x width``.
      width: D, the embedding width.
      new_tokens: The rows that learn in ``partial`` (the last ones).
      batch: Sequences per step.
      sequence: Tokens per sequence.
      steps: Timed steps per case (the median is reported).
      warmup: Untimed steps first (tracing, first touch of the slots).
      variants: Which of ``LM_VARIANTS`` to build.
      seed: Seed of the ids and of the initializers.
    """

    vocab_sizes: tuple[int, ...] = (32_768, 262_144)
    width: int = 512
    new_tokens: int = 100
    batch: int = 8
    sequence: int = 64
    steps: int = 20
    warmup: int = 3
    variants: tuple[str, ...] = LM_VARIANTS
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.variants) - set(LM_VARIANTS))
        if unknown:
            raise ValueError(f"variants: unknown {unknown}; choose from {list(LM_VARIANTS)}")
        for size in self.vocab_sizes:
            if size <= self.new_tokens:
                raise ValueError(f"vocab_sizes: {size} must exceed new_tokens = {self.new_tokens}")
        if self.steps < 1 or self.warmup < 0:
            raise ValueError("steps must be >= 1 and warmup >= 0")


@dataclasses.dataclass(frozen=True)
class LmTiming:
    """One variant at one vocabulary size.

    Attributes:
      variant: One of ``LM_VARIANTS``.
      vocab_size: V.
      width: D.
      step_ms: The median training step, in milliseconds.
      optimizer_bytes: Bytes of every optimizer variable (slots included).
      table_bytes: Bytes of one ``V x D`` table.
    """

    variant: str
    vocab_size: int
    width: int
    step_ms: float
    optimizer_bytes: int
    table_bytes: int

    @property
    def optimizer_to_table(self) -> float:
        """Optimizer state as a multiple of one table."""
        return self.optimizer_bytes / self.table_bytes


@dataclasses.dataclass
class LmBenchmark:
    """Every case of one run, and the ratios of their step times."""

    config: LmBenchConfig
    timings: list[LmTiming]

    def timing(self, variant: str, vocab_size: int) -> LmTiming | None:
        for timing in self.timings:
            if timing.variant == variant and timing.vocab_size == vocab_size:
                return timing
        return None

    def ratio(self, numerator: str, denominator: str, vocab_size: int) -> float | None:
        """Step time of ``numerator`` over ``denominator`` at ``vocab_size``."""
        top, bottom = self.timing(numerator, vocab_size), self.timing(denominator, vocab_size)
        if top is None or bottom is None or bottom.step_ms <= 0:
            return None
        return top.step_ms / bottom.step_ms


def _variable_bytes(variables: Sequence[Any]) -> int:
    total = 0
    for variable in variables:
        total += int(tf.size(variable)) * tf.as_dtype(variable.dtype).size
    return total


def _optimizer_bytes(optimizer: Any) -> int:
    variables = list(optimizer.variables)
    variables += list(getattr(optimizer, "compact_slot_variables", []))
    return _variable_bytes(variables)


def _build(variant: str, vocab_size: int, config: LmBenchConfig) -> tuple[keras.Model, Any]:
    initializer = keras.initializers.RandomUniform(-0.05, 0.05, seed=config.seed)
    if variant == "partial":
        new_ids = np.arange(vocab_size - config.new_tokens, vocab_size)
        embedding: Any = PartialReversibleEmbedding(
            vocab_size, config.width, trainable_ids=new_ids, embeddings_initializer=initializer
        )
        optimizer: Any = MaskedOptimizer(keras.optimizers.Adam())
    else:
        embedding = keras.layers.ReversibleEmbedding(
            vocab_size,
            config.width,
            embeddings_initializer=initializer,
            trainable=variant != "stock_frozen",
        )
        optimizer = keras.optimizers.Adam()
    ids = keras.Input((config.sequence,), dtype="int32")
    hidden = keras.layers.Dense(config.width, name="mixer")(embedding(ids))
    model = keras.Model(ids, embedding(hidden, reverse=True))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    return model, optimizer


def measure_case(variant: str, vocab_size: int, config: LmBenchConfig) -> LmTiming:
    """Builds one variant at one vocabulary size and times its step."""
    rng = np.random.default_rng(config.seed)
    model, optimizer = _build(variant, vocab_size, config)
    # Batches that contain the new tokens (the case the partial model is for).
    ids = rng.integers(0, vocab_size, size=(config.batch, config.sequence)).astype(np.int32)
    ids[:, ::4] = rng.integers(vocab_size - config.new_tokens, vocab_size, ids[:, ::4].shape)
    targets = np.roll(ids, -1, axis=1)
    for _ in range(config.warmup):
        model.train_on_batch(ids, targets)
    times = []
    for _ in range(config.steps):
        start = time.perf_counter()
        model.train_on_batch(ids, targets)
        times.append(time.perf_counter() - start)
    timing = LmTiming(
        variant=variant,
        vocab_size=vocab_size,
        width=config.width,
        step_ms=float(np.median(times) * 1e3),
        optimizer_bytes=_optimizer_bytes(optimizer),
        table_bytes=vocab_size * config.width * 4,
    )
    del model, optimizer
    keras.backend.clear_session()
    gc.collect()
    return timing


def measure(config: LmBenchConfig) -> LmBenchmark:
    """Every variant at every vocabulary size of ``config``."""
    timings = [
        measure_case(variant, vocab_size, config)
        for vocab_size in config.vocab_sizes
        for variant in config.variants
    ]
    return LmBenchmark(config, timings)


def report(result: LmBenchmark, write: Any = print) -> None:
    """Prints one line per case, then partial / all-frozen and stock / partial at each V."""
    config = result.config
    write(
        f"tied LM step: D = {config.width}, batch {config.batch} x {config.sequence}, "
        f"{config.new_tokens} new tokens, median of {config.steps} steps"
    )
    for timing in result.timings:
        write(
            f"  V = {timing.vocab_size:>7}  {timing.variant:<13} {timing.step_ms:9.2f} ms   "
            f"optimizer state {timing.optimizer_bytes / 2**20:9.2f} MiB "
            f"({timing.optimizer_to_table:.3f} x table)"
        )
    for vocab_size in config.vocab_sizes:
        frozen = result.ratio("partial", "stock_frozen", vocab_size)
        stock = result.ratio("stock", "partial", vocab_size)
        if frozen is not None:
            write(f"  V = {vocab_size}: partial / all-frozen step = {frozen:.2f}")
        if stock is not None:
            write(f"  V = {vocab_size}: stock full training / partial step = {stock:.2f}")


def parse_args(argv: Sequence[str] | None = None) -> LmBenchConfig:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --lm", description=__doc__.splitlines()[0]
    )
    defaults = LmBenchConfig()
    parser.add_argument("--vocab-sizes", type=int, nargs="+", default=list(defaults.vocab_sizes))
    parser.add_argument("--width", type=int, default=defaults.width)
    parser.add_argument("--new-tokens", type=int, default=defaults.new_tokens)
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument("--sequence", type=int, default=defaults.sequence)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--warmup", type=int, default=defaults.warmup)
    parser.add_argument("--variants", nargs="+", default=list(defaults.variants))
    args = parser.parse_args(argv)
    return LmBenchConfig(
        vocab_sizes=tuple(args.vocab_sizes),
        width=args.width,
        new_tokens=args.new_tokens,
        batch=args.batch,
        sequence=args.sequence,
        steps=args.steps,
        warmup=args.warmup,
        variants=tuple(args.variants),
    )


def main(argv: Sequence[str] | None = None) -> LmBenchmark:
    """``python -m partial_embedding.bench --lm``: measures and prints."""
    result = measure(parse_args(argv))
    report(result)
    return result


if __name__ == "__main__":
    main()
