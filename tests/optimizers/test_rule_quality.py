"""Every rule learns: from the same start on the same data, each rule of the
benchmarks (``bench._models.RULES``, at their learning rates) lowers the loss
of two models in a few steps.

* ``demo``: the sentiment demo's classifier (``demo._training.train``:
  ``PartialEmbedding`` over the pretrained word vectors, the new words
  learning, masked mean, ``Dense(1)``, binary cross-entropy) with
  ``MaskedOptimizer`` around the rule, its training sentences as one batch;
  its frozen rows keep their bits. Needs the demo's data (gensim's test
  files); left out without them.
* ``bag``: the bag benchmark's model (``bench._bags``, ``combiner``:
  ``PartialEmbedding(combiner="mean")`` + ``MaskedOptimizer`` around the rule,
  ``Dense(1)``, MSE against random targets) cycling through fixed batches.

A real property at these learning rates, on every seed tried (0 to 9 for the
bag model, 0 to 5 for the demo's classifier, five steps each).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from partial_embedding.bench._bags import BagConfig, build_bag_variant, permitted_rows
from partial_embedding.bench._models import RULES, make_optimizer

_STEPS, _SEED = 5, 0
_TINY_BAG = BagConfig(vocab=200, width=4, batch=16, ids_per_bag=4)


@pytest.fixture(scope="module")
def demo_inputs():
    """The demo's data (real rows only), or None where it is not installed."""
    from partial_embedding.demo import _sentiment as sentiment

    try:
        return sentiment.load_inputs(sentiment.parse_args(["--vocab-size=0", f"--seed={_SEED}"]))
    except sentiment.DemoDataError:
        return None


def _demo_losses(rule, inputs):
    """The demo's classifier trained with ``rule`` for ``_STEPS`` full-batch
    steps: the training set's loss before and after, the held-out accuracy,
    whether every frozen row (and slot) kept its bits."""
    from partial_embedding.demo._training import check_frozen_rows, train

    keras.utils.set_random_seed(_SEED)
    train_rows, test_rows = inputs.train_rows, inputs.test_rows
    # One epoch is one step over every training sentence; its loss is taken
    # before its update, so the loss after n updates is epoch n + 1's.
    run = train(
        masked=True,
        data=inputs.table,
        train_ids=inputs.ids[train_rows],
        train_labels=inputs.labels[train_rows],
        test_ids=inputs.ids[test_rows],
        test_labels=inputs.labels[test_rows],
        epochs=_STEPS + 1,
        batch_size=len(train_rows),
        seed=_SEED,
        optimizer=make_optimizer(rule),
    )
    proof = check_frozen_rows(inputs.table.table, run.final_table, inputs.table.frozen_mask)
    return {
        "before": run.epoch_losses[0],
        "after": run.epoch_losses[_STEPS],
        "held_out_accuracy": run.test_accuracy,
        "frozen_rows_kept": proof.passed and all(p.passed for _, p in run.slot_checks),
    }


def _bag_losses(rule, batches=2):
    """The bag model trained with ``rule`` for ``_STEPS`` steps through fixed
    batches in turn: the mean loss over them before and after."""
    bag = _TINY_BAG
    rng = np.random.default_rng([_SEED, bag.vocab])
    permitted = permitted_rows(rng, bag)
    data = [
        (
            tf.constant(rng.integers(0, bag.vocab, (bag.batch, bag.ids_per_bag)), tf.int32),
            tf.constant(rng.normal(size=(bag.batch, 1)), tf.float32),
        )
        for _ in range(batches)
    ]
    keras.utils.set_random_seed(_SEED)
    step, (model, _) = build_bag_variant(
        "combiner", bag.vocab, bag.width, permitted, bag.ids_per_bag, rule
    )

    def mean_loss():
        return float(np.mean([float(tf.reduce_mean(tf.square(model(x) - y))) for x, y in data]))

    before = mean_loss()
    for number in range(_STEPS):
        step(*data[number % len(data)])
    return {"before": before, "after": mean_loss()}


def _assert_lowers(model, figures):
    before, after = figures["before"], figures["after"]
    assert math.isfinite(before) and math.isfinite(after), (model, before, after)
    assert after < before, (model, before, after)


@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_lowers_the_bag_models_loss(rule):
    _assert_lowers("bag", _bag_losses(rule))


@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_lowers_the_demo_classifiers_loss_and_keeps_its_frozen_rows(rule, demo_inputs):
    if demo_inputs is None:
        pytest.skip("the demo's data (gensim's test files) are not installed")
    figures = _demo_losses(rule, demo_inputs)
    _assert_lowers("demo", figures)
    assert figures["frozen_rows_kept"]
    assert 0.0 <= figures["held_out_accuracy"] <= 1.0


def test_every_rule_starts_from_the_same_loss(demo_inputs):
    assert _bag_losses("sgd")["before"] == _bag_losses("rowwise_adam")["before"]
    if demo_inputs is not None:
        demo = [_demo_losses(rule, demo_inputs)["before"] for rule in ("sgd", "rowwise_adam")]
        assert demo[0] == demo[1]
