"""The row-admission benchmark (``bench --training --admission``), at a tiny size.

Timings are never asserted; what is checked is that the printed report has
every figure, and that the admissions and evictions it counts are those a
replay of the same stream counts (and the timed models ended where the
counting pass did).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re

import numpy as np
import pytest

from partial_embedding import bench
from partial_embedding.bench import _admission as admission_bench

TINY = admission_bench.AdmissionConfig(
    vocab=2000, width=4, batch=16, ids_per_sample=4, steps=20, max_rounds=2, warmup=4, capacity=40
)
TINY_FLAGS = [
    "--vocab=2000", "--width=4", "--batch=16", "--ids-per-sample=4", "--steps=20",
    "--max-rounds=2", "--warmup=4", "--capacity=40",
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    json_path = tmp_path_factory.mktemp("admission") / "run.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench.main(["--training", "--admission", *TINY_FLAGS, "--json", str(json_path)])
    with open(json_path, encoding="utf-8") as handle:
        return {"result": json.load(handle), "text": printed.getvalue()}


def _replay(config: admission_bench.AdmissionConfig, steps: int, capacity: int | None) -> dict:
    """Admissions and evictions of a fresh layer fed the bench's stream
    eagerly, from the admitted sets before and after each batch."""
    from partial_embedding import PartialEmbedding, RowAdmission

    layer = PartialEmbedding(
        config.vocab,
        config.width,
        trainable_ids=admission_bench.candidate_mask(config),
        admission=RowAdmission(min_count=config.min_count, capacity=capacity),
    )
    stream = admission_bench.zipf_stream(config)[:steps]
    admitted, evicted, steps_that_evicted, most = 0, 0, 0, 0
    before = set()
    layer.build()
    for ids, _ in stream:
        layer(ids, training=True)
        after = set(layer.admitted_ids.tolist())
        admitted += len(after - before)
        evicted += len(before - after)
        steps_that_evicted += bool(before - after)
        most = max(most, len(after))
        before = after
    return {
        "admissions": admitted,
        "evictions": evicted,
        "steps_that_evicted": steps_that_evicted,
        "admitted_at_end": len(before),
        "most_admitted": most,
    }


@pytest.mark.slow
def test_report_shows_each_model_and_finite_ratios(tiny_run):
    result, text = tiny_run["result"], tiny_run["text"]
    for name in admission_bench.MODELS:
        assert re.search(rf"^  {name} +\d+\.\d{{3}} +\d+\.\d{{3}} +\d+$", text, re.M), name
    for name in ("admitting", "evicting"):
        ratio = result["ratios"][f"{name}_over_plain"]
        assert math.isfinite(ratio) and ratio > 0
        figures = result["figures"]
        assert ratio == pytest.approx(figures[name]["step_ms"] / figures["plain"]["step_ms"])
        assert f"{name} / plain: {ratio:.2f} (medians" in text
    assert "capacity=40, eviction='lfu'" in text
    # Every model took the same timed steps of the stream, and they were counted.
    timed = {result["figures"][name]["steps"] for name in admission_bench.MODELS}
    assert timed == {result["timed"][name]["steps"] for name in ("admitting", "evicting")}
    assert "final admitted rows are the timed model's: admitting yes, evicting yes" in text


@pytest.mark.slow
def test_counts_match_a_replay_of_the_stream(tiny_run):
    result = tiny_run["result"]
    steps = TINY.warmup + result["figures"]["plain"]["steps"]
    assert result["counts_agree"] == {"admitting": True, "evicting": True}
    for name, capacity in (("admitting", None), ("evicting", TINY.capacity)):
        counted = result["stream"][name]
        assert counted["steps"] == steps
        replayed = _replay(TINY, steps, capacity)
        assert {key: counted[key] for key in replayed} == replayed, name
        assert f"{counted['admissions']:>10,}{counted['evictions']:>10,}" in tiny_run["text"]
    evicting = result["stream"]["evicting"]
    assert evicting["most_admitted"] <= TINY.capacity
    assert evicting["admissions"] - evicting["evictions"] == evicting["admitted_at_end"]
    assert result["stream"]["admitting"]["evictions"] == 0
    assert result["stream"]["admitting"]["admissions"] > 0
    # The capacity is small enough that the timed steps evict.
    assert result["timed"]["evicting"]["steps_that_evicted"] > 0


def test_zipf_stream_is_in_range_skewed_and_seeded():
    config = admission_bench.AdmissionConfig(
        vocab=500, batch=64, ids_per_sample=8, steps=3, warmup=1
    )
    stream = admission_bench.zipf_stream(config)
    assert len(stream) == config.stream_length
    ids = np.concatenate([batch.ravel() for batch, _ in stream])
    assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < config.vocab
    # Zipf: the most frequent id takes far more than its even share.
    assert np.bincount(ids).max() > 20 * len(ids) / config.vocab
    again = admission_bench.zipf_stream(config)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(stream, again, strict=True))


def test_default_capacity_is_above_the_distinct_ids_of_a_batch():
    targets = np.zeros((2, 1), np.float32)
    stream = [
        (np.array([[1, 1, 2], [3, 4, 4]]), targets),
        (np.array([[5, 5, 5], [5, 6, 7]]), targets),
    ]
    assert admission_bench.distinct_candidates_per_batch(stream, None) == 3.5
    candidates = np.zeros(10, bool)
    candidates[[1, 5]] = True
    assert admission_bench.distinct_candidates_per_batch(stream, candidates) == 1.0
    assert admission_bench.default_capacity(3.5) == 4


def test_admission_flag_needs_training():
    with pytest.raises(SystemExit, match="--admission goes with --training"):
        bench.main(["--admission"])
    with pytest.raises(SystemExit, match="--admission goes with --training"):
        bench.main(["--memory", "--admission"])
