"""Issue #45's bench modes on the CPU: ``--gpu-host-table`` and ``--gpu-step --timing-only``.

Both measure on a GPU (build_tools/device_check.sh runs them there); here they
run their ``--device /CPU:0`` paths at small sizes, and the tests check what
the findings hold and their correctness fields (the frozen rows bit for bit,
the rows that learn moved), never their timings. The GPU is hidden from the
processes this starts, so that they test the CPU path everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from partial_embedding.bench import _gpu_host_table as host_table
from partial_embedding.bench import _gpu_step as gpu_step
from pe_testing import run_as_main


def _cpu_environment() -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}


def _bench(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "partial_embedding.bench", *arguments],
        env=_cpu_environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _json_line(output: str, prefix: str, count: int = 1) -> dict:
    """The last of the ``count`` JSON lines printed after ``prefix``."""
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    assert len(lines) == count, output[-3000:]
    return json.loads(lines[-1][len(prefix) :])


# -- --gpu-host-table ----------------------------------------------------------------


@pytest.mark.slow
def test_the_quick_cpu_run_keeps_the_frozen_rows_and_says_it_is_no_gpu_figure(
    tmp_path: Path,
) -> None:
    written = tmp_path / "host_table.json"
    done = _bench("--gpu-host-table", "--quick", "--device", "/CPU:0", "--json", str(written))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = _json_line(done.stdout, host_table.JSON_PREFIX)
    assert json.loads(written.read_text()) == found

    assert found["gpu_figures"] is False and "not GPU figures" in found["note"]
    assert "not GPU figures" in done.stdout
    assert found["memory_limit_set"] is False and found["gpu_memory"] is None
    limit_bytes = found["memory_limit_mb"] * 2**20
    assert found["table"]["bytes"] == host_table.TABLE_OVER_LIMIT * limit_bytes
    assert found["table"]["rows"] * found["table"]["width"] * 4 == found["table"]["bytes"]
    assert found["fits_table"]["bytes"] <= limit_bytes
    assert "CPU:0" in found["placement"]["frozen_table"]
    assert "CPU:0" in found["placement"]["stock_table"]

    # The correctness fields.
    assert found["frozen_bit_for_bit"] == {"met": True, "rows_compared": found["table"]["rows"]}
    assert found["trained_rows_moved"] is True

    # Every figure with its target; the verdicts are booleans, whatever the timings.
    assert set(found["step_ms"]) == {"host", "fits", "stock_cpu"}
    assert found["host_over_fits"]["target_at_most"] == host_table.HOST_OVER_FITS_TARGET
    assert found["stock_cpu_over_host"]["target_at_least"] == host_table.STOCK_OVER_HOST_TARGET
    for figure in ("host_over_fits", "stock_cpu_over_host"):
        assert isinstance(found[figure]["met"], bool) and found[figure]["ratio"] > 0


@pytest.mark.slow
def test_a_gpu_run_without_a_gpu_says_so() -> None:
    done = _bench("--gpu-host-table", "--quick")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "TensorFlow sees no GPU" in done.stdout
    assert host_table.JSON_PREFIX not in done.stdout


# -- --gpu-step --timing-only: the embedding's cost ------------------------------------


def _row(vocab: int, **milliseconds: float) -> dict:
    return {"vocab": vocab, **{f"{name}_ms": ms for name, ms in milliseconds.items()}}


def test_the_embedding_cost_is_a_step_minus_the_head_alone() -> None:
    rows = [
        _row(1000, partial=3.0, keras=12.0, head=2.0, partial_xla=1.5, keras_xla=3.0, head_xla=1.0),
        _row(8000, partial=3.1, keras=52.0, head=2.0, partial_xla=1.0, keras_xla=9.0, head_xla=1.1),
    ]
    costs = gpu_step.embedding_costs(rows)
    first, last = costs["no_xla"]["per_vocab"]
    assert (first["ours_cost_ms"], first["keras_cost_ms"]) == (1.0, 10.0)
    assert first["ours_cost_over_keras_cost"] == 0.1 and first["met"] is True
    assert last["ours_cost_over_keras_cost"] == pytest.approx(0.022, abs=1e-3)
    growth = costs["no_xla"]["ours_cost_growth"]
    assert growth["ratio"] == pytest.approx(1.1) and growth["met"] is True
    assert growth["target"] == gpu_step.COST_GROWTH_TARGET

    first, last = costs["xla"]["per_vocab"]
    assert first["ours_cost_over_keras_cost"] == 0.25 and first["met"] is False
    # Ours within the head's noise: no cost, the ratio 0, and the growth below 0.
    assert last["ours_cost_ms"] < 0 and last["ours_cost_over_keras_cost"] == 0.0
    assert costs["xla"]["ours_cost_growth"]["ratio"] < 0


def test_without_a_stock_cost_there_is_no_ratio_and_no_pass() -> None:
    rows = [_row(10, partial=2.0, keras=1.0, head=1.5, partial_xla=1, keras_xla=1, head_xla=1)]
    costs = gpu_step.embedding_costs(rows)
    entry = costs["no_xla"]["per_vocab"][0]
    assert entry["ours_cost_over_keras_cost"] is None and entry["met"] is False
    assert costs["no_xla"]["ours_cost_growth"] == {
        "target": gpu_step.COST_GROWTH_TARGET,
        "ratio": None,
        "met": False,
    }


@pytest.mark.slow
def test_timing_only_on_the_cpu_prints_the_figures_as_json_lines(capsys, monkeypatch) -> None:
    arguments = ["--gpu-step", "--timing-only", "--device", "/CPU:0", "--vocabs", "400", "3200"]
    arguments += ["--rounds", "1", "--steps", "2", "--batch", "8", "--ids-per-sample", "2"]
    arguments += ["--width", "4"]
    assert run_as_main("partial_embedding.bench", arguments, monkeypatch) == 0
    output = capsys.readouterr().out
    # One line after each V: a run stopped part way keeps the Vs it timed.
    first = _json_line(output.split("V=3,200")[0], gpu_step.TIMING_JSON_PREFIX)
    assert [row["vocab"] for row in first["rows"]] == [400] and first["complete"] is False
    found = _json_line(output, gpu_step.TIMING_JSON_PREFIX, count=2)
    assert found["complete"] is True
    assert found["gpu_figures"] is False and "not GPU figures" in found["note"]
    assert [row["vocab"] for row in found["rows"]] == [400, 3200]
    names = {name for name, *_ in gpu_step.TIMED_VARIANTS}
    for row in found["rows"]:
        assert {f"{name}_ms" for name in names} <= set(row)
    for mode in ("no_xla", "xla"):
        entries = found["embedding_cost"][mode]["per_vocab"]
        assert [entry["vocab"] for entry in entries] == [400, 3200]
        assert all(entry["target"] == gpu_step.COST_RATIO_TARGET for entry in entries)
        assert found["embedding_cost"][mode]["ours_cost_growth"]["to_vocab"] == 3200
    assert "embedding cost, xla, V=3,200" in output
