"""The keras-hub demo: runs end to end in a fresh process; its flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("keras_hub")

from pe_testing import run_as_main  # noqa: E402

# Runs the demo with tiny settings and prints its result as JSON (last line).
_RUN = """
import dataclasses, json, sys
from partial_embedding.demo import _keras_hub as demo
result = demo.run_demo(steps=int(sys.argv[1]), seed=3, out=sys.argv[2])
print(json.dumps({**dataclasses.asdict(result), "passed": result.passed}))
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )


@pytest.mark.slow
def test_demo_trains_ships_and_plain_keras_hub_reloads(tmp_path: object) -> None:
    out = tmp_path / "demo"
    finished = _python("-c", _RUN, "12", str(out))
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    words = len(result["pieces_before"])
    assert result["new_ids"] == list(range(31, 31 + words))
    assert result["vocabulary_after"] == result["vocabulary_before"] + words
    # The small tokenizer split each word into several tokens before.
    assert min(result["pieces_before"].values()) > 1
    assert result["new_token_loss_after"] < result["new_token_loss_before"]
    assert result["loss_after"] < result["loss_before"]
    assert result["frozen_rows_identical"] and result["other_weights_identical"]
    assert result["new_rows_moved"] == words
    assert os.path.getsize(out / "new_rows.safetensors") == result["rows_file_bytes"]
    assert os.path.isfile(out / "preset" / "config.json")
    for check in ("token_ids", "table", "hidden", "logits"):
        assert result[f"{check}_identical"], check
    assert result["passed"]


def test_help_lists_the_flags(monkeypatch, capsys) -> None:
    status = run_as_main("partial_embedding.demo", ["--keras-hub", "--help"], monkeypatch)
    printed = capsys.readouterr()
    assert status == 0, printed.err[-3000:]
    for flag in ("--steps", "--seed", "--out"):
        assert flag in printed.out
