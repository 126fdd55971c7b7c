"""Tests of partial_embedding.bench_lm's result objects (a tiny run, not timing)."""

from __future__ import annotations

import pytest

from partial_embedding.bench import _lm as bench_lm


def tiny_config(**changes):
    settings = dict(
        vocab_sizes=(64,), width=8, new_tokens=4, batch=2, sequence=4, steps=1, warmup=1
    )
    settings.update(changes)
    return bench_lm.LmBenchConfig(**settings)


@pytest.mark.slow
def test_measure_returns_a_timing_per_case():
    config = tiny_config(vocab_sizes=(64, 96))
    result = bench_lm.measure(config)
    assert [(t.variant, t.vocab_size) for t in result.timings] == [
        (variant, size) for size in (64, 96) for variant in bench_lm.LM_VARIANTS
    ]
    for timing in result.timings:
        assert timing.step_ms > 0
        assert timing.table_bytes == timing.vocab_size * 8 * 4
    # Adam keeps two table-sized slots for the stock model; none for a frozen
    # table; the partial model's state is far smaller than a table.
    stock = result.timing("stock", 64)
    frozen = result.timing("stock_frozen", 64)
    partial = result.timing("partial", 64)
    assert stock.optimizer_bytes >= 2 * stock.table_bytes
    assert frozen.optimizer_bytes < frozen.table_bytes
    assert partial.optimizer_bytes < stock.optimizer_bytes - stock.table_bytes
    assert result.ratio("partial", "stock_frozen", 64) == pytest.approx(
        partial.step_ms / frozen.step_ms
    )
    assert result.ratio("partial", "stock_frozen", 1000) is None
    lines = []
    bench_lm.report(result, write=lines.append)
    assert any("partial / all-frozen" in line for line in lines)
    assert sum("V =" in line for line in lines) == 6 + 4


def test_config_checks():
    with pytest.raises(ValueError, match="unknown"):
        tiny_config(variants=("nope",))
    with pytest.raises(ValueError, match="must exceed"):
        tiny_config(vocab_sizes=(4,))
    assert bench_lm.parse_args(["--vocab-sizes", "64", "--new-tokens", "4"]).vocab_sizes == (64,)
