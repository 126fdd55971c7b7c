"""The keras-hub benchmark: three variants in one run with tiny settings; its flags."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("keras_hub")

from partial_embedding.bench import _keras_hub as bench  # noqa: E402
from pe_testing import run_as_main  # noqa: E402


@pytest.mark.slow
def test_three_variants_with_times_and_optimizer_state() -> None:
    config = bench.parse_args(
        ["--vocab", "256", "--new-tokens", "8", "--hidden", "32", "--layers", "1",
         "--batch", "2", "--sequence", "8", "--steps", "4", "--rounds", "2", "--warmup", "1",
         "--lora-rank", "2"]
    )  # fmt: skip
    result = bench.measure(config)
    assert set(result.variants) == set(bench.VARIANTS)
    for figures in result.variants.values():
        assert figures.best_step_ms > 0 and figures.median_step_ms >= figures.best_step_ms
        assert figures.optimizer_bytes > 0
    ours, stock = result.variants["ours"], result.variants["stock_embedding"]
    lora = result.variants["lora"]
    assert ours.optimizer_bytes < stock.optimizer_bytes
    # Scalars that train: K rows; the whole V + K table; the two LoRA factors.
    assert ours.trainable_parameters == 8 * 32
    assert stock.trainable_parameters == (256 + 8) * 32
    assert lora.trainable_parameters == (256 + 8) * 2 + 2 * 32
    # AdamW keeps two slots per trained scalar: the whole table's at least.
    assert stock.optimizer_bytes >= 2 * 4 * stock.trainable_parameters
    assert result.ratio("stock_embedding", "optimizer_bytes") > 1
    text = io.StringIO()
    bench.report(result, text)
    for variant in bench.VARIANTS:
        assert variant in text.getvalue()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="new_tokens must be at least 1; got 0"):
        bench.KerasHubBenchConfig(new_tokens=0)
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])


def test_help_lists_the_flags(monkeypatch, capsys) -> None:
    status = run_as_main("partial_embedding.bench", ["--keras-hub", "--help"], monkeypatch)
    printed = capsys.readouterr()
    assert status == 0, printed.err[-3000:]
    for flag in ("--vocab", "--new-tokens", "--steps", "--rounds", "--lora-rank", "--seed"):
        assert flag in printed.out
