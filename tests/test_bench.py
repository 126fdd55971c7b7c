"""Tests of ``python -m partial_embedding.bench``: structure, not speed.

Timings are never asserted (they depend on the machine and its load); what is
checked is that every figure the bench reports is present, finite and
consistent with the others.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from partial_embedding import bench


def _finite_positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    json_path = folder / "bench.json"
    plot_path = folder / "bench.png"
    output = io.StringIO()
    returned = bench.run(
        bench.parse_args(["--quick", "--json", str(json_path), "--plot", str(plot_path)]),
        stream=output,
    )
    with open(json_path, encoding="utf-8") as handle:
        written = json.load(handle)
    return {"returned": returned, "json": written, "text": output.getvalue(), "plot": plot_path}


def test_json_holds_the_machine_and_every_op_point(quick_run):
    report = quick_run["json"]
    assert report["preset"] == "quick"
    assert report["machine"]["usable_cores"] >= 1
    assert report["machine"]["tensorflow"]
    preset = bench.PRESETS["quick"]
    expected_points = [
        (name, case.num_rows, case.width) for name, cases in preset.sweeps for case in cases
    ]
    points = [(row["sweep"], row["num_rows"], row["width"]) for row in report["op"]]
    assert points == expected_points
    for row in report["op"]:
        assert set(row["seconds"]) == set(bench.ALL_METHODS)
        assert _finite_positive(row["seconds"][bench.BASELINE])
        for method, reason in row["skipped"].items():
            assert method in bench.DENSE_METHODS and reason
            assert row["seconds"][method] is None and row["ratio_vs"][method] is None
        for method in set(bench.ALL_METHODS) - set(row["skipped"]):
            assert _finite_positive(row["seconds"][method])
            assert row["repeats"][method] >= 1


def test_reported_ratios_match_reported_times(quick_run):
    for row in quick_run["json"]["op"]:
        base = row["seconds"][bench.BASELINE]
        assert row["ratio_vs"][bench.BASELINE] == pytest.approx(1.0)
        for method, seconds in row["seconds"].items():
            if seconds is not None:
                assert row["ratio_vs"][method] == pytest.approx(base / seconds, rel=1e-12)


def test_dense_methods_are_skipped_only_above_the_limit(quick_run):
    limit = bench.PRESETS["quick"].dense_limit
    for row in quick_run["json"]["op"]:
        too_large = row["num_rows"] * row["width"] > limit
        assert bool(row["skipped"]) == too_large
    # The quick grid covers both kinds of point.
    assert any(row["skipped"] for row in quick_run["json"]["op"])
    assert any(not row["skipped"] for row in quick_run["json"]["op"])


def test_table_on_screen_shows_each_point(quick_run):
    text = quick_run["text"]
    for row in quick_run["json"]["op"]:
        cell = f"{row['seconds'][bench.BASELINE] * 1e3:9.3f}ms"
        assert cell in text
    assert "skipped" in text
    assert "below 1.0 means masked_scatter_sub is faster" in text


def test_training_section_is_consistent(quick_run):
    training = quick_run["json"].get("training")
    if training is None:
        pytest.skip("partial_embedding.bench_training is not available")
    variants = training["variants"]
    assert "partial" in variants and "keras" in variants
    partial_ms = variants["partial"]["step_ms"]
    for name, figures in variants.items():
        assert _finite_positive(figures["step_ms"])
        if name != "partial":
            ratio = training["ratios"][f"{name}_over_partial"]
            assert ratio == pytest.approx(figures["step_ms"] / partial_ms, rel=1e-9)
    assert training["config"]["vocab"] == bench.PRESETS["quick"].training["vocab"]
    update_only = training["update_only"]
    if "stock_tf" in variants:
        assert _finite_positive(update_only["partial"])
        assert _finite_positive(update_only["stock_tf"])
        assert update_only["stock_tf_over_partial"] == pytest.approx(
            update_only["stock_tf"] / update_only["partial"], rel=1e-9
        )
        assert f"{update_only['partial']:.3f} ms" in quick_run["text"]


def test_gpu_section_is_absent_or_complete(quick_run):
    gpu = quick_run["json"]["gpu"]
    if gpu is None:
        assert "-- gpu:" in quick_run["text"] and "skipped" in quick_run["text"]
        return
    for row in gpu["rows"]:
        assert row["op_GBps"] == pytest.approx(row["moved_bytes"] / (row["op_ms"] * 1e-3) / 1e9)
        assert row["fraction_of_copy"] == pytest.approx(row["copy_ms"] / row["op_ms"])


def test_plot_is_a_png_when_matplotlib_is_there(quick_run):
    pytest.importorskip("matplotlib")
    with open(quick_run["plot"], "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_moved_bytes_counts_permitted_rows_once():
    case = bench.OpCase(num_rows=10, width=4, num_indices=5)
    inputs = {
        "indices": np.array([1, 1, 2, 3, 9], dtype=np.int64),
        "row_mask": np.array([True, True, False, True] + [False] * 6),
    }
    # 5 ids of 8 bytes + 1 mask byte; 3 permitted update rows (1, 1, 3);
    # 2 distinct permitted table rows, read and written.
    expected = 5 * 9 + 3 * 16 + 2 * 2 * 16
    assert bench._moved_bytes(case, inputs, 4) == expected


def test_the_earlier_functions_keep_working():
    case = bench.OpCase(num_rows=1000, width=8, num_indices=64, permitted_fraction=0.5)
    seconds = bench.time_op_case(case, ("masked_scatter_sub", "scatter_sub"), repeats=2, rounds=1)
    assert set(seconds) == {"masked_scatter_sub", "scatter_sub"}
    rows = bench.run_op_benchmark([case], ("masked_scatter_sub",), 2, 1, stream=io.StringIO())
    assert rows[0]["num_rows"] == 1000 and rows[0]["ratio_vs"]["masked_scatter_sub"] == 1.0
