"""pe_testing.once_per_run: a module-scoped setup shared by the xdist workers."""

from __future__ import annotations

import pytest

from pe_testing import once_per_run


class _Factory:
    """What once_per_run reads of pytest's tmp_path_factory: a worker's folder."""

    def __init__(self, run_folder) -> None:
        self._worker_folder = run_folder / "popen-gw1"

    def getbasetemp(self):
        return self._worker_folder


def test_under_xdist_the_value_is_computed_once_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    calls = []

    def compute():
        calls.append(1)
        return {"peak": [1, 2.5]}

    factory = _Factory(tmp_path)
    assert once_per_run(factory, "setup", compute) == {"peak": [1, 2.5]}
    assert once_per_run(factory, "setup", compute) == {"peak": [1, 2.5]}
    assert len(calls) == 1
    assert once_per_run(factory, "another setup", lambda: 7) == 7


def test_a_failed_computation_leaves_nothing_and_runs_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    factory = _Factory(tmp_path)

    def fail():
        raise RuntimeError("the child crashed")

    with pytest.raises(RuntimeError, match="the child crashed"):
        once_per_run(factory, "setup", fail)
    assert once_per_run(factory, "setup", lambda: "measured") == "measured"


def test_without_xdist_it_just_computes(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    calls = []
    for _ in range(2):
        once_per_run(_Factory(tmp_path), "setup", lambda: calls.append(1))
    assert len(calls) == 2
    assert not (tmp_path / "once_per_run").exists()
