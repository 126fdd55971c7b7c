"""The keras-rs benchmark: both layers in one run with tiny settings; its flags."""

from __future__ import annotations

import io
import math

import pytest

pytest.importorskip("keras_rs")

from partial_embedding.bench import _keras_rs as bench  # noqa: E402


def test_both_layers_are_timed_and_reported():
    config = bench.KerasRsBenchConfig(
        vocabs=(50,),
        dim=4,
        batch=4,
        bag=3,
        rounds=1,
        ours_steps=1,
        keras_rs_steps=1,
        warmup=1,
        optimizers=("sgd", "ftrl"),
    )
    result = bench.measure(config)
    sgd, ftrl = result.figures
    assert sgd.error is None and sgd.ours_ms[1] > 0 and sgd.keras_rs_ms[1] > 0
    # FTRL runs under MaskedOptimizer once it is a rule of the table; until
    # then its error is reported in place of its time.
    assert math.isfinite(ftrl.keras_rs_ms[1])
    assert (ftrl.error is None) == math.isfinite(ftrl.ours_ms[1])
    stream = io.StringIO()
    bench.report(result, stream)
    assert "keras-rs/ours" in stream.getvalue() and "ftrl" in stream.getvalue()


def test_flags():
    assert bench.parse_args(["--keras-rs", "--quick"]).vocabs == (10_000,)
    assert bench.parse_args(["--full"]).vocabs == (1_000_000, 10_000_000)
    with pytest.raises(SystemExit):
        bench.parse_args(["--optimizers", "lion"])
