"""Adding tokens to keras-hub, three ways: ``python -m partial_embedding.bench --keras-hub``.

Needs the ``keras-hub`` extra. One GPT-2 causal LM is built from a small
config (random weights standing in for ``from_preset``), then ``K`` tokens are
added to it three ways and a training step (``train_on_batch``: forward,
backward, AdamW update) of each is timed in the same run:

* ``ours``: :func:`partial_embedding.keras_hub.add_tokens` and
  ``MaskedOptimizer(AdamW)``: only the ``K`` new rows of the tied table train,
  and the optimizer keeps slots for those rows alone;
* ``stock_embedding``: what stock keras-hub offers: rebuild the backbone with
  ``V + K`` rows, copy every weight by hand (the new rows get the old rows'
  mean), freeze every layer but the token embedding and train the whole
  table with AdamW;
* ``lora``: the same resized model with keras-hub's
  ``backbone.enable_lora(rank, target_layer_names=["token_embedding"])``:
  every row trains through two low-rank factors (``[V + K, r]`` and
  ``[r, D]``), AdamW on the factors.

The steps are timed in interleaved rounds (the order alternating), so a busy
machine slows each variant alike; each keeps its best and median round. Next
to the times: the bytes of the optimizer's variables (slots, counters and, for
``ours``, the compact slots with their row map) and the trainable parameters.
Every figure is also given as a ratio to ``ours``.

:func:`measure` returns a :class:`KerasHubBenchmark`; :func:`report` prints it.
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
    "VARIANTS",
    "KerasHubBenchConfig",
    "KerasHubBenchmark",
    "VariantFigures",
    "main",
    "measure",
    "parse_args",
    "report",
]

#: The three ways of adding tokens, in the order they are reported.
VARIANTS = ("ours", "stock_embedding", "lora")


@dataclasses.dataclass(frozen=True)
class KerasHubBenchConfig:
    """What one run measures.

    Attributes:
      vocab: Rows of the "pretrained" table (``V``).
      new_tokens: Tokens added (``K``).
      hidden: Width of the model and its table (``D``).
      layers: Transformer layers.
      batch, sequence: Each step trains on ``batch x sequence`` ids, every
        fourth a new token.
      steps: Timed steps per variant, split into interleaved rounds.
      rounds: Most rounds the steps are split into.
      warmup: Untimed steps first (tracing, slot creation).
      lora_rank: Rank of the LoRA factors.
      seed: Seed of the weights and the ids.
    """

    vocab: int = 8192
    new_tokens: int = 16
    hidden: int = 128
    layers: int = 2
    batch: int = 8
    sequence: int = 64
    steps: int = 60
    rounds: int = 6
    warmup: int = 3
    lora_rank: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("vocab", "new_tokens", "hidden", "layers", "batch", "sequence", "steps")
        for name in (*positive, "rounds", "lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be at least 0; got {self.warmup}")


@dataclasses.dataclass(frozen=True)
class VariantFigures:
    """One variant's figures.

    Attributes:
      best_step_ms, median_step_ms: Milliseconds a step, best and median round.
      optimizer_bytes: Bytes of the optimizer's variables after training.
      trainable_parameters: Scalars the optimizer updates.
    """

    best_step_ms: float
    median_step_ms: float
    optimizer_bytes: int
    trainable_parameters: int


@dataclasses.dataclass(frozen=True)
class KerasHubBenchmark:
    """The run's settings and each variant's figures (keys of ``VARIANTS``)."""

    config: KerasHubBenchConfig
    variants: dict[str, VariantFigures]

    def ratio(self, variant: str, field: str) -> float:
        """``variant``'s figure ``field`` over ``ours``'."""
        return float(getattr(self.variants[variant], field)) / float(
            getattr(self.variants["ours"], field)
        )


def _variable_bytes(variables: Sequence[Any]) -> int:
    """Bytes the variables hold now (compact slots have no static row count)."""
    import tensorflow as tf

    return sum(int(tf.size(v)) * tf.as_dtype(v.dtype).size for v in variables)


def _optimizer_bytes(optimizer: Any) -> int:
    """The optimizer's variables, with a ``MaskedOptimizer``'s compact slots."""
    return _variable_bytes(
        list(optimizer.variables) + list(getattr(optimizer, "compact_slot_variables", []))
    )


def _pretrained_lm(config: KerasHubBenchConfig, vocab: int) -> Any:
    import keras
    import keras_hub

    keras.utils.set_random_seed(config.seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab,
        num_layers=config.layers,
        num_heads=4,
        hidden_dim=config.hidden,
        intermediate_dim=4 * config.hidden,
        max_sequence_length=config.sequence,
        dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _resized_by_hand(original: Any, new_tokens: int) -> Any:
    """Stock keras-hub: a ``V + K`` backbone from the config, weights copied
    by hand (new rows: the old rows' mean), everything but the table frozen."""
    import keras_hub

    old = original.backbone
    config = {**old.get_config(), "vocabulary_size": old.vocabulary_size + new_tokens}
    backbone = type(old).from_config(config)
    for source, target in zip(old.weights, backbone.weights, strict=True):
        value = np.asarray(source.numpy())
        if target.path == "token_embedding/embeddings":
            mean = value.mean(axis=0, keepdims=True)
            value = np.concatenate([value, np.repeat(mean, new_tokens, axis=0)])
        target.assign(value)
    for layer in backbone.layers:
        layer.trainable = layer.name == "token_embedding"
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _build(variant: str, original: Any, config: KerasHubBenchConfig) -> tuple[Any, Any]:
    """The model and optimizer of one variant, compiled."""
    import keras

    import partial_embedding as pe
    import partial_embedding.keras_hub as pek

    adamw = keras.optimizers.AdamW(learning_rate=1e-3)
    if variant == "ours":
        model = pek.add_tokens(original, config.new_tokens).model
        optimizer: Any = pe.MaskedOptimizer(adamw)
    elif variant == "stock_embedding":
        model, optimizer = _resized_by_hand(original, config.new_tokens), adamw
    elif variant == "lora":
        model, optimizer = _resized_by_hand(original, config.new_tokens), adamw
        model.backbone.enable_lora(config.lora_rank, target_layer_names=["token_embedding"])
    else:
        raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=False)
    return model, optimizer


def _batch(config: KerasHubBenchConfig) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Ids over the grown vocabulary, every fourth a new token; next-id targets."""
    rng = np.random.default_rng(config.seed)
    size = config.vocab + config.new_tokens
    ids = rng.integers(0, config.vocab, size=(config.batch, config.sequence)).astype(np.int32)
    ids[:, ::4] = rng.integers(config.vocab, size, size=ids[:, ::4].shape)
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}, np.roll(ids, -1, axis=1)


def _interleaved_step_ms(
    steps: dict[str, Callable[[], Any]], config: KerasHubBenchConfig
) -> dict[str, tuple[float, float]]:
    """Best and median ms a step of each function, timed round by round in
    turn (the order alternating between rounds)."""
    for step in steps.values():
        for _ in range(config.warmup):
            step()
    gc.collect()
    rounds = max(1, min(config.rounds, config.steps))
    per_round = max(1, config.steps // rounds)
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            for _ in range(per_round):
                steps[name]()
            times[name].append(1e3 * (time.perf_counter() - start) / per_round)
    return {name: (min(t), float(np.median(t))) for name, t in times.items()}


def measure(config: KerasHubBenchConfig) -> KerasHubBenchmark:
    """Builds the three variants on one pretrained model and times them together."""
    import keras

    original = _pretrained_lm(config, config.vocab)
    inputs, targets = _batch(config)
    built = {variant: _build(variant, original, config) for variant in VARIANTS}

    def step_of(model: Any) -> Callable[[], Any]:
        return lambda: model.train_on_batch(inputs, targets)

    timed = _interleaved_step_ms({v: step_of(m) for v, (m, _) in built.items()}, config)
    figures = {
        variant: VariantFigures(
            best_step_ms=timed[variant][0],
            median_step_ms=timed[variant][1],
            optimizer_bytes=_optimizer_bytes(optimizer),
            trainable_parameters=_trainable_parameters(model, optimizer),
        )
        for variant, (model, optimizer) in built.items()
    }
    del built
    keras.backend.clear_session()
    gc.collect()
    return KerasHubBenchmark(config=config, variants=figures)


def _trainable_parameters(model: Any, optimizer: Any) -> int:
    """Scalars that train: for a partial table, its permitted rows only."""
    table = model.backbone.token_embedding
    permitted = getattr(table, "trainable_ids", None)
    total = 0
    for variable in model.trainable_variables:
        if permitted is not None and variable.path == "token_embedding/embeddings":
            total += len(permitted) * table.output_dim
        elif "mask" not in variable.path:
            total += int(np.prod(variable.shape))
    return total


def report(result: KerasHubBenchmark, stream: TextIO = sys.stdout) -> None:
    """Prints each variant's figures and their ratios to ``ours``."""
    config = result.config
    stream.write(
        f"keras-hub GPT-2 ({config.layers} layers, hidden {config.hidden}), V={config.vocab}, "
        f"K={config.new_tokens} new tokens, batch {config.batch} x {config.sequence} ids, "
        f"AdamW, LoRA rank {config.lora_rank}, {config.steps} steps in "
        f"{min(config.rounds, config.steps)} interleaved rounds\n"
    )
    stream.write(
        f"{'variant':<16} {'median ms':>10} {'best ms':>9} {'x ours':>7} "
        f"{'optimizer bytes':>16} {'x ours':>8} {'trainable':>10} {'x ours':>8}\n"
    )
    for variant in VARIANTS:
        figures = result.variants[variant]
        stream.write(
            f"{variant:<16} {figures.median_step_ms:>10.2f} {figures.best_step_ms:>9.2f} "
            f"{result.ratio(variant, 'median_step_ms'):>7.2f} "
            f"{figures.optimizer_bytes:>16,} {result.ratio(variant, 'optimizer_bytes'):>8.1f} "
            f"{figures.trainable_parameters:>10,} "
            f"{result.ratio(variant, 'trainable_parameters'):>8.1f}\n"
        )


def parse_args(argv: Sequence[str] | None = None) -> KerasHubBenchConfig:
    """The benchmark's flags as a config (``--keras-hub`` is accepted and ignored)."""
    defaults = KerasHubBenchConfig()
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --keras-hub",
        description="Step time and optimizer state of adding tokens to a keras-hub model, "
        "three ways: add_tokens + MaskedOptimizer, stock whole-embedding fine-tuning, LoRA.",
    )
    parser.add_argument("--keras-hub", action="store_true", help=argparse.SUPPRESS)
    for field in dataclasses.fields(KerasHubBenchConfig):
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        parser.add_argument(flag, type=int, default=default, help=f"(default {default})")
    args = vars(parser.parse_args(argv))
    args.pop("keras_hub")
    try:
        return KerasHubBenchConfig(**args)
    except ValueError as error:
        parser.error(str(error))
        raise  # parser.error exits; this keeps type checkers content


def main(argv: Sequence[str] | None = None) -> KerasHubBenchmark:
    """Runs the benchmark from the command line and prints its report."""
    config = parse_args(argv)
    result = measure(config)
    report(result)
    return result
