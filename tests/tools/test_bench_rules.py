"""``--optimizer`` of the training and bag benchmarks (bench._models.RULES): every
Keras-optimizer variant takes the chosen rule; what is lazy Adam written out
by hand is left out under another, said in one line; the JSON records the rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding.bench import _bags as bags
from partial_embedding.bench import _models as rules
from partial_embedding.bench import _training as bench_training
from partial_embedding.bench._models import VARIANTS, build_variant


def test_every_rule_is_a_fresh_optimizer_and_adam_is_the_default():
    assert rules.DEFAULT_RULE == "adam"
    assert bench_training.BenchmarkConfig().optimizer == bags.BagConfig().optimizer == "adam"
    for name in rules.RULES:
        assert rules.make_optimizer(name) is not rules.make_optimizer(name)
    adam = rules.make_optimizer("adam")
    assert type(adam).__name__ == "Adam" and float(adam.learning_rate) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="choose from sgd, momentum"):
        rules.make_optimizer("lamb")


def test_the_hand_written_adam_refuses_another_rule():
    permitted = np.ones(10, bool)
    with pytest.raises(ValueError, match="lazy Adam only"):
        build_variant("stock_tf", 10, 4, permitted, 2, "sgd")
    with pytest.raises(ValueError, match="lazy Adam only"):
        bags.build_bag_variant("stock_tf", 10, 4, permitted, 2, "adagrad")


def test_another_rule_leaves_out_stock_tf_and_the_bare_loop_in_one_line():
    config = bench_training.BenchmarkConfig(
        vocab=50, width=4, batch=2, ids_per_sample=2, optimizer="rowwise_adagrad"
    )
    said = []
    report = bench_training.BenchmarkReport()
    report.say = said.append
    kept = bench_training._without_adam_only(config, report)
    assert list(kept.variants) == [v for v in config.variants if v != "stock_tf"]
    assert said == [
        "  --optimizer rowwise_adagrad: stock_tf, the update-only comparison and the "
        "bare_loop floor are lazy Adam written out by hand; left out"
    ]
    batches = [(tf.constant([[1, 2], [3, 4]]), tf.constant([[0.5], [1.0]]))]
    runs, _, skipped = bench_training._build_runs(
        ["partial"], kept, batches, np.random.default_rng(0), with_floors=True
    )
    assert list(runs) == ["partial", "head_only", "head_only_xla"] and skipped == {}
    # Under adam nothing is left out and nothing is said.
    said.clear()
    adam = bench_training.BenchmarkConfig(vocab=50, width=4)
    assert bench_training._without_adam_only(adam, report) is adam and said == []


def test_the_rule_reaches_the_json_and_the_processes_of_their_own():
    config = bench_training.BenchmarkConfig(
        vocab=50, width=4, steps=7, scaling_vocabs=(100,), optimizer="amsgrad"
    )
    figures = bench_training.TrainingBenchmark(config, {}).as_dict()
    assert figures["config"]["optimizer"] == "amsgrad"
    assert figures["adam_only_left_out"] == ["stock_tf", "bare_loop"]
    arguments = bench_training._child_arguments(config, 100)
    assert vars(bench_training._parser().parse_args(arguments))["optimizer"] == "amsgrad"
    with pytest.raises(SystemExit):
        bench_training._parser().parse_args(["--optimizer", "lamb"])


def test_the_bag_runs_pass_the_rule_to_their_processes(monkeypatch, capsys):
    seen = []

    def fake_child(arguments, environment=None):
        seen.append(list(arguments))
        return None

    monkeypatch.setattr(bags, "_in_child", fake_child)
    run = bags.run_bag_runs([100], 5, [16], seed=1, rule="nesterov")
    assert all("--optimizer=nesterov" in arguments for arguments in seen) and len(seen) == 2
    assert run["optimizer"] == "nesterov"
    assert run["adam_only_left_out"] == ["stock_tf", "bare_two_ops", "bare_fused"]
    printed = capsys.readouterr().out
    assert "--optimizer nesterov: stock_tf, bare_two_ops and bare_fused are lazy Adam" in printed


@pytest.mark.slow
def test_the_bag_model_under_another_rule_times_what_takes_it():
    config = bags.BagConfig(
        vocab=60,
        width=4,
        batch=8,
        ids_per_bag=3,
        steps=4,
        keras_steps=2,
        max_rounds=2,
        warmup=1,
        optimizer="rmsprop_centered",
    )
    result = bags.measure_bags(config)
    assert set(result["figures"]) == {"combiner", "pooled", "keras", "head_only"}
    assert result["optimizer"] == "rmsprop_centered" and result["skipped"] == {}
    assert "optimizer rmsprop_centered" in bags._vocab_lines(60, result)


@pytest.mark.slow
# One rule of each slot layout (none; three per element; one per row): the
# rules' own values are tests/optimizers/test_fused_rules.py's.
@pytest.mark.parametrize("rule", ["sgd", "amsgrad", "rowwise_adam"])
def test_every_keras_optimizer_variant_trains_with_every_slot_layout(rule):
    rng = np.random.default_rng(0)
    permitted = rng.random(300) < 0.5
    ids = tf.constant(rng.integers(0, 300, (8, 4)), tf.int32)
    targets = tf.constant(rng.normal(size=(8, 1)), tf.float32)
    steps = [build_variant(v, 300, 4, permitted, 4, rule)[0] for v in VARIANTS if v != "stock_tf"]
    for variant in ("combiner", "keras"):
        steps.append(bags.build_bag_variant(variant, 300, 4, permitted, 4, rule)[0])
    for step in steps:
        losses = [float(step(ids, targets)) for _ in range(3)]
        assert all(map(math.isfinite, losses)) and losses[-1] < losses[0], losses
