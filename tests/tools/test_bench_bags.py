"""The bag model of the training benchmark (bench._bags), at a tiny size."""

from __future__ import annotations

import pytest

from partial_embedding.bench import _bags as bags
from partial_embedding.bench._floors import MIN_ROUNDS


@pytest.mark.slow
def test_every_variant_and_floor_is_timed_in_the_same_rounds():
    config = bags.BagConfig(
        vocab=60, width=4, batch=8, ids_per_bag=3, steps=4, keras_steps=2, max_rounds=2, warmup=1
    )
    result = bags.measure_bags(config)
    figures = result["figures"]
    assert set(figures) == {*bags.BAG_VARIANTS, "head_only", "bare_two_ops", "bare_fused"}
    assert figures["keras"]["steps"] == 2 and figures["combiner"]["steps"] == 4
    # Two rounds cannot resolve a step less its floor: no cost is formed.
    assert figures["combiner"]["rounds"] < MIN_ROUNDS and result["embedding_cost"] == {}
    assert result["skipped"] == {}


def test_report_gives_each_runs_ratios():
    def run(stock_tf: float, pooled: float) -> dict:
        costs = {"combiner": 1.0, "pooled": pooled, "stock_tf": stock_tf, "keras": 90.0}
        figures = {
            "combiner": {"step_ms": 2.0},
            "bare_two_ops": {"step_ms": 1.2},
            "bare_fused": {"step_ms": 1.0},
        }
        return {
            "by_vocab": {"1000000": {"figures": figures, "embedding_cost": costs}},
            "memory": {"256": {"combiner": 12.0, "pooled": 32.0}},
        }

    text = bags.bag_report([run(5.5, 1.25), run(4.5, 1.5)])
    assert "stock_tf / combiner embedding cost: 5.50 4.50" in text
    assert "pooled / combiner: 1.25 1.50" in text
    assert "bare two ops / fused: 1.20 1.20" in text
    assert "at 256 ids a bag: combiner 12.0 MiB, pooled 32.0 MiB" in text


@pytest.mark.parametrize("vocab", [1001, 4000])
def test_the_mask_permits_exactly_the_fraction_on_every_seed(vocab):
    """A draw per row permitted about half the rows: more than half on some
    seeds, and `compact_slots="auto"` then chose full-size slots, so runs of
    one setting timed two optimizers."""
    import numpy as np

    for seed in range(6):
        config = bags.BagConfig(vocab=vocab, seed=seed)
        permitted = bags.permitted_rows(np.random.default_rng([seed, vocab]), config)
        assert permitted.dtype == bool and permitted.shape == (vocab,)
        assert permitted.sum() == round(vocab * 0.5) <= vocab // 2
