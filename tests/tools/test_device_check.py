"""build_tools/device_check.sh --dry-run: the plan a lent GPU machine would run.

Without a GPU (and without TensorFlow's parts) the dry run lists the steps in
order with their commands and budgets, what the device calls carry and the calls
themselves, and writes device_check.json with every step marked dry_run;
--steps picks a subset. The report's JSON carries every figure issue #45 asks
for with its target, and reads them from a run's log (here a made-up one).
Skipped where the source tree's build_tools/ is absent (CI runs the tests
outside it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "build_tools" / "device_check.sh"
REPORT = SCRIPT.with_name("device_check_report.py")
if not SCRIPT.exists():
    pytest.skip("needs the source tree's build_tools/", allow_module_level=True)
if shutil.which("bash") is None or shutil.which("python3") is None:
    pytest.skip("needs bash and python3", allow_module_level=True)

#: A fragment of each step's commands, in the order the steps run.
STEP_COMMANDS = {
    1: "bash build_tools/gpu_check.sh --seed random",
    2: "PARTIAL_EMBEDDING_GPU_FUSED=1 bash build_tools/gpu_check.sh --tensorflow",
    3: "-m pytest tests/ops/test_fused_gpu.py tests/ops/test_xla_custom_call_gpu.py",
    4: "-m pytest tests -n 14",
    5: "-m partial_embedding.bench --gpu-step --timing-only --vocabs 1000000 8000000",
    6: "-m partial_embedding.bench --gpu-host-table --memory-limit-mb 512",
}
#: Issue #45's figures: (item, a fragment of the name, the target), in order.
ISSUE_45 = [
    *[
        (1, f"{what}, {mode}{vocab}, {path}", target)
        for path in ("default GPU path", "PARTIAL_EMBEDDING_GPU_FUSED=1")
        for mode in ("without XLA", "XLA (Keras' default on a GPU)")
        for what, vocab, target in (
            ("embedding cost, ours / keras.layers.Embedding + Adam", ", V = 1,000,000", "<= 0.2"),
            ("embedding cost, ours / keras.layers.Embedding + Adam", ", V = 8,000,000", "<= 0.2"),
            ("our embedding cost's growth, V = 1M -> 8M", "", "<= 1.2x"),
        )
    ],
    (2, "k=524,288 unique (V=4M)", "<= 1.5x"),
    (3, "frozen rows after the steps", "bit for bit"),
    (3, "its step / the step with a table that fits", "<= 3x"),
    (3, "keras.layers.Embedding + Adam on /CPU:0 / its step", ">= 5x"),
]


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
    assert "PARTIAL_EMBEDDING_GPU_FUSED=1 " in text[positions[4] : positions[5]]
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
    assert [step["number"] for step in report["steps"]] == [1, 2, 3, 4, 5, 6]
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


def test_the_dry_run_lists_every_figure_of_issue_45_with_its_target(tmp_path):
    assert dry_run(tmp_path).returncode == 0
    section = json.loads((tmp_path / "device_check.json").read_text())["issue_45"]
    figures = section["figures"]
    assert len(figures) == len(ISSUE_45)
    for entry, (item, name, target) in zip(figures, ISSUE_45):
        assert (entry["item"], entry["target"]) == (item, target) and name in entry["name"]
        assert entry["measured"] is False and entry["met"] is None and entry["value"] is None
        assert entry["missing"].startswith("dry run")
    assert (section["met"], section["not_met"], section["not_measured"]) == (0, 0, len(ISSUE_45))
    assert section["all_met"] is False
    summary = (tmp_path / "device_check_summary.txt").read_text()
    assert f"issue #45: 0 figures met, 0 not met, {len(ISSUE_45)} not measured" in summary


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


@pytest.mark.parametrize("steps", ["0", "7", "1,x", ""])
def test_bad_steps_are_refused(tmp_path, steps):
    result = dry_run(tmp_path, "--steps", steps)
    assert result.returncode == 2 and "--steps" in result.stderr


def _timing_findings(ratio: float, growth: float) -> dict:
    """What bench --gpu-step --timing-only prints on a GPU, cut to the costs."""
    per_vocab = [
        {"vocab": vocab, "ours_cost_ms": 0.1, "keras_cost_ms": 1.0, "target": 0.2}
        | {"ours_cost_over_keras_cost": ratio, "met": ratio <= 0.2}
        for vocab in (1_000_000, 8_000_000)
    ]
    mode = {
        "per_vocab": per_vocab,
        "ours_cost_growth": {"from_vocab": 1_000_000, "to_vocab": 8_000_000}
        | {"target": 1.2, "ratio": growth, "met": growth <= 1.2},
    }
    return {"gpu_figures": True, "note": None, "embedding_cost": {"no_xla": mode, "xla": mode}}


def test_the_report_reads_issue_45s_figures_from_a_run(tmp_path):
    """A made-up run of steps 1, 3, 5 and 6: the plan, the records and the log
    the script would leave, and gpu_check.json; the report's issue_45."""
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    host = {
        "gpu_figures": True,
        "note": None,
        "memory_limit_mb": 512,
        "step_ms": {"host": 2.0, "fits": 1.0, "stock_cpu": 40.0},
        "frozen_bit_for_bit": {"met": True, "rows_compared": 8},
        "host_over_fits": {"ratio": 2.0, "target_at_most": 3.0, "met": True},
        "stock_cpu_over_host": {"ratio": 4.0, "target_at_least": 5.0, "met": False},
    }
    pytest_log = (
        "[gw0] [ 50%] PASSED tests/ops/test_xla_custom_call_gpu.py::test_a\n"
        "[gw1] [100%] SKIPPED tests/ops/test_fused_gpu.py::test_b\n"
        "=========== 1 passed, 1 skipped in 3.0s ===========\n"
    )
    runs = [
        (1, "gpu_check", 0, 1, "auto", "gpu_check PASS: gpu, 10/10 correctness checks\n"),
        (3, "fused_tests", 1, 1, "fused", pytest_log),
        (5, "step_time", 1, 0, "default", "GPU_STEP_TIMING_JSON "
         + json.dumps(_timing_findings(0.1, 1.1)) + "\n"),
        (5, "step_time", 1, 0, "fused", "GPU_STEP_TIMING_JSON "
         + json.dumps(_timing_findings(0.3, 1.5)) + "\n"),
        (6, "host_table", 1, 1, "default", "GPU_HOST_TABLE_JSON " + json.dumps(host) + "\n"),
    ]  # fmt: skip
    started = time.time() - 60
    log = out / "device_check.log"
    plan, records = work / "plan.tsv", work / "runs.tsv"
    with log.open("w") as log_file, plan.open("w") as plan_file, records.open("w") as records_file:
        for number, name, tf, correctness, label, text in runs:
            plan_file.write(
                f"{number}\t{name}\ttitle\t{tf}\t{correctness}\t60\t{label}\talways\tcmd\n"
            )
            begin = log_file.tell()
            log_file.write(text)
            records_file.write(
                f"run\t{number}\t{label}\t0\t{started}\t{started + 5}\t60\t{begin}\t"
                f"{log_file.tell()}\t\tcmd\n"
            )
    adam = [
        {"case": "k=65,536 unique (V=1M)", "ours_x_floor": 1.1, "target_x_floor": 2.0},
        {"case": "k=524,288 unique (V=4M)", "ours_x_floor": 1.25, "target_x_floor": 1.5}
        | {"ours_ms": 1.0, "floor_ms": 0.8},
    ]
    (out / "gpu_check.json").write_text(json.dumps({"status": "PASS", "adam_timing": adam}))
    environment = {
        **os.environ,
        "DC_ROOT": str(SCRIPT.parents[1]),
        "DC_OUT": str(out),
        "DC_WORK": str(work),
        "DC_LOG": str(log),
        "DC_PLAN": str(plan),
        "DC_RECORDS": str(records),
        "DC_DRY_RUN": "0",
        "DC_STARTED": str(started),
        "DC_TOTAL": "470",
        "DC_TF_BUDGET": "60",
        "DC_TF_COMMAND": "true",
        "DC_TF_ENV_JSON": str(work / "env.json"),
        "DC_TF_ENV_FILE": str(work / "env.sh"),
        "DC_BASE_ENV_JSON": str(work / "base.json"),
        "DC_SEED": "1",
        "DC_PYTHON": "python3",
        "DC_STEPS": "1 3 5 6",
        "DC_STEPS_ARG": "1,3,5,6",
        "DC_STEPS_GIVEN": "1",
        "DC_GPU": "a GPU",
    }
    done = subprocess.run(
        ["python3", str(REPORT), "final"], env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    section = json.loads((out / "device_check.json").read_text())["issue_45"]
    figures = section["figures"]
    assert [(f["item"], f["target"]) for f in figures] == [(i, t) for i, _, t in ISSUE_45]
    assert all(f["measured"] for f in figures)
    default, fused = figures[:6], figures[6:12]
    assert [f["value"] for f in default] == [0.1, 0.1, 1.1] * 2
    assert all(f["met"] for f in default)
    assert [f["value"] for f in fused] == [0.3, 0.3, 1.5] * 2
    assert not any(f["met"] for f in fused)
    adam_figure, frozen, host_over_fits, stock_over_host = figures[12:]
    assert (adam_figure["value"], adam_figure["met"], adam_figure["floor_ms"]) == (1.25, True, 0.8)
    assert (frozen["value"], frozen["met"]) == ("bit for bit", True)
    assert (host_over_fits["value"], host_over_fits["met"]) == (2.0, True)
    assert (stock_over_host["value"], stock_over_host["met"]) == (4.0, False)
    assert (section["met"], section["not_met"], section["not_measured"]) == (9, 7, 0)
    assert section["all_met"] is False
    assert section["xla_custom_call_gpu_tests"] == {"passed": 1}
    assert "[NOT MET]" in done.stdout and "issue #45: 9 figures met, 7 not met" in done.stdout
