"""build_tools/device_check.sh --dry-run: the plan a lent GPU machine would run.

Without a GPU (and without TensorFlow's parts) the dry run lists the steps in
order with their commands and budgets, what the device calls carry and the calls
themselves, and writes device_check.json with every step marked dry_run;
--steps picks a subset. Skipped where the source tree's build_tools/ is absent
(CI runs the tests outside it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "build_tools" / "device_check.sh"
if not SCRIPT.exists():
    pytest.skip("needs the source tree's build_tools/", allow_module_level=True)
if shutil.which("bash") is None or shutil.which("python3") is None:
    pytest.skip("needs bash and python3", allow_module_level=True)

#: A fragment of each step's commands, in the order the steps run.
STEP_COMMANDS = {
    1: "bash build_tools/gpu_check.sh --seed random",
    2: "PARTIAL_EMBEDDING_GPU_FUSED=1 bash build_tools/gpu_check.sh --tensorflow",
    3: "-m pytest tests/ops/test_fused_gpu.py",
    4: "-m pytest tests -n 14",
    5: "time_steps([1_000_000, 8_000_000]",
}


def dry_run(out: Path, *arguments: str) -> subprocess.CompletedProcess:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DEVICE_CHECK_", "PARTIAL_EMBEDDING_", "PE_GPU_CHECK_"))
        and key != "PYTHON"
    }
    environment["OUT"] = str(out)
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_dry_run_lists_every_step_in_order_and_the_device_calls(tmp_path):
    result = dry_run(tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    positions = [
        re.search(rf"^  step {number} \w+:", text, re.M).start() for number in STEP_COMMANDS
    ]
    assert positions == sorted(positions)
    for number, fragment in STEP_COMMANDS.items():
        following = text[positions[number - 1] :]
        assert fragment in following.split("\n\n")[0], (number, fragment)
        assert f"DEVICE_CHECK_BUDGET_{number}" in following
    assert "PARTIAL_EMBEDDING_GPU_FUSED=1 " in text[positions[2] : positions[3]]
    assert "bash .gpu_tf/on_device.sh" in text
    for carried in (".gpu_tf/part00", ".gpu_tf/parts.txt", ".gpu_tf/on_device.sh"):
        assert carried in text
    calls = [line for line in text.splitlines() if " run {" in line]
    last = json.loads(calls[-1].split(" run ", 1)[1])
    assert last["command"] == "bash build_tools/device_check.sh"
    assert ".gpu_tf/on_device.sh" in last["carry"] and last["timeout_s"] <= 600


def test_the_dry_run_writes_the_json_with_every_step_dry(tmp_path):
    assert dry_run(tmp_path).returncode == 0
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["dry_run"] is True and report["exit_code"] == 0
    assert [step["number"] for step in report["steps"]] == [1, 2, 3, 4, 5]
    for step in report["steps"]:
        assert step["dry_run"] is True and step["status"] == "dry_run"
        assert step["budget_s"] > 0 and step["commands"]
        assert STEP_COMMANDS[step["number"]] in " ".join(step["commands"])
        assert all(run["dry_run"] and run["exit_code"] is None for run in step["runs"])
    assert (
        sum(step["budget_s"] for step in report["steps"]) + report["budgets"]["tensorflow_setup_s"]
        <= report["budgets"]["total_s"]
        <= 480
    )
    assert report["tensorflow"]["state"] == "dry_run"
    assert (tmp_path / "device_check_summary.txt").exists()


def test_steps_selects_a_subset(tmp_path):
    result = dry_run(tmp_path, "--steps", "1,3")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert [step["number"] for step in report["steps"]] == [1, 3]
    assert re.findall(r"^  step (\d) ", result.stdout, re.M) == ["1", "3"]
    assert "bash build_tools/device_check.sh --steps 1,3" in result.stdout

    only_the_build = dry_run(tmp_path, "--steps", "1")
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["tensorflow"] is None
    calls = [line for line in only_the_build.stdout.splitlines() if " run {" in line]
    assert len(calls) == 1 and json.loads(calls[0].split(" run ", 1)[1])["carry"] == []


@pytest.mark.parametrize("steps", ["0", "6", "1,x", ""])
def test_bad_steps_are_refused(tmp_path, steps):
    result = dry_run(tmp_path, "--steps", steps)
    assert result.returncode == 2 and "--steps" in result.stderr
