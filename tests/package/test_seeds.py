"""The test suite cannot fail by chance: seeds are fixed unless a run opts in
to random ones, every case's seed is printed, and Hypothesis runs
derandomized by default."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pe_testing import base_seed, case_seed, make_rng


def test_default_seed_is_fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PE_TEST_SEED", raising=False)
    assert base_seed() == 0
    first = make_rng("a case").standard_normal(4)
    second = make_rng("a case").standard_normal(4)
    np.testing.assert_array_equal(first, second)
    assert case_seed("a case") != case_seed("another case")


def test_an_integer_seed_replays_and_random_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PE_TEST_SEED", "12345")
    assert base_seed() == 12345
    replayed = case_seed("a case")
    monkeypatch.setenv("PE_TEST_SEED", "random")
    drawn = base_seed()
    assert base_seed() == drawn  # one random base seed for the whole run
    monkeypatch.setenv("PE_TEST_SEED", "12345")
    assert case_seed("a case") == replayed


def test_a_bad_seed_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PE_TEST_SEED", "twelve")
    with pytest.raises(ValueError, match="PE_TEST_SEED: expected an integer or 'random'"):
        base_seed()


def test_the_seed_is_printed(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("PE_TEST_SEED", "77")
    make_rng("printed case")
    assert "PE_TEST_SEED=77" in capsys.readouterr().out


@pytest.mark.skipif(
    os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci", reason="another profile was chosen"
)
def test_hypothesis_runs_derandomized_by_default() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    current = hypothesis.settings()
    assert current.derandomize is True
    assert current.database is None
    assert current.deadline is None
