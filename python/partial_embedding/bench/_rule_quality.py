"""Training quality of each rule: the loss before and after the same steps.

Run ``python -m partial_embedding.bench._rule_quality`` (``--help`` for
options). For every rule of ``bench._rules.RULES`` it trains two models from
the same start on the same fixed-seed data for the same number of steps, and
prints a table of their losses before and after; a report, not a target (the
learning rates are the benchmarks' own, not tuned per model):

* ``demo``: the sentiment demo's classifier (``demo._training.train``:
  ``PartialEmbedding`` over the pretrained word vectors, the new words
  learning, masked mean, ``Dense(1)``, binary cross-entropy) with
  ``MaskedOptimizer`` around the rule, on the demo's training sentences as one
  batch: each step's loss is then the whole training set's before that step.
  The held-out accuracy and whether every frozen row kept its bits are shown
  too. Needs the demo's data (gensim's test files); left out without it.
* ``bag``: the bag benchmark's model (``bench._bags``, ``combiner``:
  ``PartialEmbedding(combiner="mean")`` + ``MaskedOptimizer`` around the rule,
  ``Dense(1)``, MSE against random targets) at a small size, cycling through
  a few fixed batches; its loss is the mean over those batches.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.bench._bags import BagConfig, build_bag_variant, permitted_rows  # noqa: E402
from partial_embedding.bench._rules import RULES, make_optimizer  # noqa: E402

__all__ = ["QualityConfig", "bag_losses", "demo_losses", "main", "measure_quality", "quality_table"]


@dataclasses.dataclass(frozen=True)
class QualityConfig:
    """What one run trains.

    Attributes:
      steps: Training steps of every rule on each model.
      seed: Seed of the data, the masks and the initial weights.
      rules: Which of ``RULES``.
      demo: Train the demo's classifier too (where its data are installed).
      bag: The bag model's shape (``vocab``, ``width``, ``batch``,
        ``ids_per_bag``, ``permitted_fraction``).
      bag_batches: The fixed batches the bag model cycles through.
    """

    steps: int = 30
    seed: int = 0
    rules: Sequence[str] = tuple(RULES)
    demo: bool = True
    bag: BagConfig = BagConfig(vocab=2_000, width=16, batch=64, ids_per_bag=8)
    bag_batches: int = 4


# -- the demo's classifier ----------------------------------------------------------


def demo_inputs(seed: int) -> tuple[Any | None, str | None]:
    """The demo's data (real rows only) split with ``seed``, or None and why
    not (its data are not installed)."""
    from partial_embedding.demo import _sentiment as sentiment

    try:
        return sentiment.load_inputs(
            sentiment.parse_args(["--vocab-size=0", f"--seed={seed}"])
        ), None
    except sentiment.DemoDataError as error:
        return None, str(error)


def demo_losses(rule: str, inputs: Any, steps: int, seed: int) -> dict[str, Any]:
    """The demo's classifier trained with ``rule`` for ``steps`` full-batch
    steps: ``{"before", "after"}`` (the training set's mean loss),
    ``"held_out_accuracy"`` and ``"frozen_rows_kept"``."""
    from partial_embedding.demo._training import check_frozen_rows, train

    keras.utils.set_random_seed(seed)
    train_rows, test_rows = inputs.train_rows, inputs.test_rows
    # One epoch is one step over every training sentence; its loss is taken
    # before its update, so the loss after `steps` updates is epoch steps + 1's.
    run = train(
        masked=True,
        data=inputs.table,
        train_ids=inputs.ids[train_rows],
        train_labels=inputs.labels[train_rows],
        test_ids=inputs.ids[test_rows],
        test_labels=inputs.labels[test_rows],
        epochs=steps + 1,
        batch_size=len(train_rows),
        seed=seed,
        optimizer=make_optimizer(rule),
    )
    proof = check_frozen_rows(inputs.table.table, run.final_table, inputs.table.frozen_mask)
    return {
        "before": run.epoch_losses[0],
        "after": run.epoch_losses[steps],
        "held_out_accuracy": run.test_accuracy,
        "frozen_rows_kept": proof.passed and all(p.passed for _, p in run.slot_checks),
    }


# -- the bag model ------------------------------------------------------------------


def bag_data(config: QualityConfig) -> tuple[np.ndarray, list[tuple[tf.Tensor, tf.Tensor]]]:
    """The bag model's row mask and fixed ``(ids, targets)`` batches."""
    bag = config.bag
    rng = np.random.default_rng([config.seed, bag.vocab])
    permitted = permitted_rows(rng, bag)
    batches = [
        (
            tf.constant(rng.integers(0, bag.vocab, (bag.batch, bag.ids_per_bag)), tf.int32),
            tf.constant(rng.normal(size=(bag.batch, 1)), tf.float32),
        )
        for _ in range(config.bag_batches)
    ]
    return permitted, batches


def bag_losses(
    rule: str,
    config: QualityConfig,
    permitted: np.ndarray,
    batches: Sequence[tuple[tf.Tensor, tf.Tensor]],
) -> dict[str, float]:
    """The bag model trained with ``rule`` for ``config.steps`` steps through
    ``batches`` in turn: ``{"before", "after"}``, the mean loss over them."""
    bag = config.bag
    keras.utils.set_random_seed(config.seed)
    step, (model, _) = build_bag_variant(
        "combiner", bag.vocab, bag.width, permitted, bag.ids_per_bag, rule
    )

    def mean_loss() -> float:
        losses = [tf.reduce_mean(tf.square(model(ids) - targets)) for ids, targets in batches]
        return float(np.mean([float(loss) for loss in losses]))

    before = mean_loss()
    for number in range(config.steps):
        step(*batches[number % len(batches)])
    return {"before": before, "after": mean_loss()}


# -- the run and its table ----------------------------------------------------------


def measure_quality(config: QualityConfig) -> dict[str, Any]:
    """Trains each rule on both models; returns ``{"config": ..., "rules":
    {rule: {"demo": demo_losses' dict or None, "bag": bag_losses' dict}},
    "demo_left_out": why (None where it ran)}``."""
    inputs, why = demo_inputs(config.seed) if config.demo else (None, "not asked for")
    permitted, batches = bag_data(config)
    rules = {}
    for rule in config.rules:
        rules[rule] = {
            "demo": None
            if inputs is None
            else demo_losses(rule, inputs, config.steps, config.seed),
            "bag": bag_losses(rule, config, permitted, batches),
        }
    summary = dataclasses.asdict(config)
    summary["rules"] = list(config.rules)
    return {"config": summary, "rules": rules, "demo_left_out": why}


def _cell(value: float | None, spec: str = "9.4f") -> str:
    return f"{'-' if value is None else format(value, spec):>9}"


def quality_table(result: dict[str, Any]) -> str:
    """``measure_quality``'s result as a table, one row per rule."""
    config, bag = result["config"], result["config"]["bag"]
    lines = [
        f"-- loss before and after {config['steps']} steps, the same data and start for every "
        f"rule (seed {config['seed']})",
        "   demo: the sentiment classifier, its training sentences as one batch, binary "
        "cross-entropy",
        f"   bag: {config['bag_batches']} batches of {bag['batch']} bags x {bag['ids_per_bag']} "
        f"ids, V={bag['vocab']:,} D={bag['width']}, MSE against random targets",
        f"{'rule':<18}{'demo':>9}{'after':>9}{'ratio':>9}{'held-out':>9}{'frozen':>8}"
        f"{'bag':>11}{'after':>9}{'ratio':>9}",
        f"{'':<18}{'before':>9}{'':>9}{'':>9}{'accuracy':>9}{'rows':>8}{'before':>11}",
    ]
    for rule, figures in result["rules"].items():
        demo, bag_figures = figures["demo"] or {}, figures["bag"]
        demo_ratio = demo["after"] / demo["before"] if demo else None
        kept = demo.get("frozen_rows_kept")
        frozen = "-" if kept is None else ("kept" if kept else "MOVED")
        lines.append(
            f"{rule:<18}{_cell(demo.get('before'))}{_cell(demo.get('after'))}"
            f"{_cell(demo_ratio, '9.3f')}{_cell(demo.get('held_out_accuracy'), '9.3f')}"
            f"{frozen:>8}  {_cell(bag_figures['before'])}{_cell(bag_figures['after'])}"
            f"{_cell(bag_figures['after'] / bag_figures['before'], '9.3f')}"
        )
    if result["demo_left_out"]:
        lines.append(f"   (demo left out: {result['demo_left_out']})")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    defaults = QualityConfig()
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench._rule_quality",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--rules", nargs="+", choices=list(RULES), default=list(RULES))
    parser.add_argument("--no-demo", dest="demo", action="store_false", help="the bag model only")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line entry point: trains, prints the table; returns the figures."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.steps < 1:
        raise SystemExit(f"--steps: must be at least 1, got {args.steps}")
    config = QualityConfig(steps=args.steps, seed=args.seed, rules=args.rules, demo=args.demo)
    result = measure_quality(config)
    print(quality_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
    return result


if __name__ == "__main__":
    main()
