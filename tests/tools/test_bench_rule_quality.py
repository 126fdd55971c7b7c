"""The rule-quality run (bench._rule_quality) at a tiny size: every rule learns.

A real property at the rules' learning rates (``bench._rules``): each rule
lowers both models' loss from the same start on the same data, on every seed
tried (0 to 9 for the bag model, 0 to 5 for the demo's classifier, five
steps each). The demo's classifier needs gensim's test files; without them
its half is left out and said so.
"""

from __future__ import annotations

import math

import pytest

from partial_embedding.bench import _rule_quality as rule_quality
from partial_embedding.bench._bags import BagConfig
from partial_embedding.bench._rules import RULES

_TINY_BAG = BagConfig(vocab=200, width=4, batch=16, ids_per_bag=4)


def _tiny(rules, seed=0):
    config = rule_quality.QualityConfig(
        steps=5, seed=seed, rules=tuple(rules), bag=_TINY_BAG, bag_batches=2
    )
    return rule_quality.measure_quality(config)


@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_lowers_both_losses(rule):
    result = _tiny([rule])
    figures = result["rules"][rule]
    models = ["bag"] if figures["demo"] is None else ["bag", "demo"]
    if figures["demo"] is None:
        assert result["demo_left_out"]
    for model in models:
        before, after = figures[model]["before"], figures[model]["after"]
        assert math.isfinite(before) and math.isfinite(after), (model, before, after)
        assert after < before, (model, before, after)
    if figures["demo"] is not None:
        assert figures["demo"]["frozen_rows_kept"]
        assert 0.0 <= figures["demo"]["held_out_accuracy"] <= 1.0


def test_every_rule_starts_from_the_same_loss_and_the_table_shows_each():
    result = _tiny(["sgd", "rowwise_adam"])
    sgd, rowwise = result["rules"]["sgd"], result["rules"]["rowwise_adam"]
    assert sgd["bag"]["before"] == rowwise["bag"]["before"]
    if sgd["demo"] is not None:
        assert sgd["demo"]["before"] == rowwise["demo"]["before"]
    text = rule_quality.quality_table(result)
    assert text.startswith("-- loss before and after 5 steps")
    (row,) = [line for line in text.splitlines() if line.startswith("rowwise_adam ")]
    assert f"{rowwise['bag']['after']:9.4f}" in row


def test_the_command_writes_the_figures(tmp_path, capsys):
    path = tmp_path / "quality.json"
    returned = rule_quality.main(
        ["--steps", "1", "--rules", "adagrad", "--no-demo", "--json", str(path)]
    )
    assert list(returned["rules"]) == ["adagrad"] and returned["rules"]["adagrad"]["demo"] is None
    assert "demo left out: not asked for" in capsys.readouterr().out
    assert path.read_text(encoding="utf-8").startswith("{")
    with pytest.raises(SystemExit, match="--steps"):
        rule_quality.main(["--steps", "0"])
