"""``python -m partial_embedding.bench --versus-fbgemm`` (bench._versus_fbgemm):
one clear line and exit status 0 without PyTorch or FBGEMM; with them, a quick
run times both sides of every rule on both shapes. Times are never asserted."""

from __future__ import annotations

import json
import math
import sys

import pytest

from partial_embedding.bench import _versus_fbgemm as versus
from pe_testing import run_as_main


@pytest.mark.parametrize("absent", [("torch", "fbgemm_gpu"), ("fbgemm_gpu",)], ids="-".join)
def test_without_pytorch_or_fbgemm_it_says_what_to_install_and_exits_0(absent, monkeypatch, capsys):
    for module in absent:
        # None in sys.modules makes `import module` raise ImportError.
        monkeypatch.setitem(sys.modules, module, None)
    status = run_as_main("partial_embedding.bench", ["--versus-fbgemm", "--quick"], monkeypatch)
    printed = capsys.readouterr().out.strip().splitlines()
    assert status == 0
    assert len(printed) == 1, printed
    (line,) = printed
    for module in absent:
        assert f"missing {module}" in line or f", {module}" in line, line
    assert versus.INSTALL_HINT in line


def test_help_lists_the_flags(monkeypatch, capsys):
    status = run_as_main("partial_embedding.bench", ["--versus-fbgemm", "--help"], monkeypatch)
    printed = capsys.readouterr().out
    assert status == 0
    for flag in ("--rows", "--dim", "--rounds", "--steps", "--optimizer", "--quick", "--threads"):
        assert flag in printed


def _figures(step_ms: float) -> dict[str, float]:
    return {"step_ms": step_ms, "median_step_ms": step_ms, "rounds": 5, "steps": 150}


def test_report_gives_a_line_per_rule_and_shape_and_names_the_adam_anchor():
    by_shape = {
        shape: {"theirs": _figures(2.0), "ours": _figures(3.0), "ratio": 1.5}
        for shape in versus.SHAPES
    }
    result = {
        "config": {"rows": 1000, "dim": 8},
        "versions": {"torch": "t", "fbgemm_gpu": "f", "tensorflow": "tf", "cpus": 2},
        "threads": {"torch": 1, "tensorflow": 1},
        "rules": {rule: by_shape for rule in versus.RULES},
        "skipped": {},
    }
    lines = versus.report(result).splitlines()
    for rule in versus.RULES:
        rows = [line for line in lines if line.split()[:1] == [rule]]
        assert len(rows) == len(versus.SHAPES), lines
        assert all(row.split()[-4:-2] == ["1.50", "5"] for row in rows), rows
    assert any("torch.optim.SparseAdam" in line for line in lines)


@pytest.mark.slow
def test_quick_run_times_both_sides_of_every_rule(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training")
    path = tmp_path / "versus.json"
    arguments = ["--versus-fbgemm", "--quick", "--rows", "2000", "--dim", "16"]
    status = run_as_main("partial_embedding.bench", [*arguments, "--json", str(path)], monkeypatch)
    printed = capsys.readouterr().out
    assert status == 0
    result = json.loads(path.read_text(encoding="utf-8"))
    assert set(result["rules"]) == set(versus.RULES) and not result["skipped"]
    for rule, by_shape in result["rules"].items():
        assert set(by_shape) == set(versus.SHAPES)
        for figures in by_shape.values():
            for side in ("theirs", "ours"):
                assert math.isfinite(figures[side]["step_ms"]) and figures[side]["step_ms"] > 0
            assert figures["ratio"] == pytest.approx(
                figures["ours"]["step_ms"] / figures["theirs"]["step_ms"]
            )
        table_rows = [line for line in printed.splitlines() if line.split()[:1] == [rule]]
        assert len(table_rows) == len(versus.SHAPES), printed
    assert "torch.optim.SparseAdam" in printed
