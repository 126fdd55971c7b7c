"""build_tools/device_check.sh's bookkeeping: the JSON, the summary, the
dry run's listing and the parsing of each step's output (python3 is on the
GPU machine; no TensorFlow needed). Called by device_check.sh only, with its
state in DC_* environment variables.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import time

E = os.environ
ROOT, OUT, WORK, LOG = E["DC_ROOT"], E["DC_OUT"], E["DC_WORK"], E["DC_LOG"]
DRY = E["DC_DRY_RUN"] == "1"
STARTED = float(E["DC_STARTED"])
TOTAL = int(E["DC_TOTAL"])
MIB = 1024 * 1024
CALL_LIMIT = 64 * MIB
OUR_FILES = (
    "device_check.json",
    "device_check_summary.txt",
    "device_check.log",
    "gpu_check.json",
    "gpu_check_nvcc.json",
    "gpu_step.json",
    "gpu_step_fused.json",
)
RUN_JSON = {
    (1, "auto"): "gpu_check.json",
    (1, "nvcc"): "gpu_check_nvcc.json",
    (2, "default"): "gpu_step.json",
    (2, "fused"): "gpu_step_fused.json",
}
TF_STATE = os.path.join(WORK, "tensorflow.json")


def iso(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def read_plan():
    steps = {}
    with open(E["DC_PLAN"]) as plan:
        for line in plan:
            number, name, title, tf, correctness, budget, label, when, command = line.rstrip(
                "\n"
            ).split("\t")
            step = steps.setdefault(
                int(number),
                {
                    "number": int(number),
                    "name": name,
                    "title": title,
                    "needs_tensorflow": tf == "1",
                    "correctness": correctness == "1",
                    "budget_s": int(budget),
                    "env": f"DEVICE_CHECK_BUDGET_{number}",
                    "runs": [],
                },
            )
            step["runs"].append({"label": label, "when": when, "command": command})
    selected = [int(n) for n in E["DC_STEPS"].split()]
    return [steps[n] for n in selected]


def read_records():
    records = {}
    if os.path.exists(E["DC_RECORDS"]):
        with open(E["DC_RECORDS"]) as lines:
            for line in lines:
                kind, step, label, rc, start, end, budget, log_start, log_end, reason, command = (
                    line.rstrip("\n").split("\t", 10)
                )
                records[(step, label)] = {
                    "kind": kind,
                    "rc": int(rc) if rc else None,
                    "start": float(start or 0),
                    "end": float(end or 0),
                    "budget": int(budget or 0),
                    "log": (int(log_start or 0), int(log_end or 0)),
                    "reason": reason or None,
                    "command": command,
                }
    return records


def log_text(record):
    start, end = record["log"]
    try:
        with open(LOG, "rb") as log:
            log.seek(start)
            return log.read(max(0, end - start)).decode("utf-8", "replace")
    except OSError:
        return ""


def fresh_json(name, since):
    """A file of ours in OUT written since ``since`` (not one left from an earlier run), parsed."""
    path = os.path.join(OUT, name)
    try:
        if os.path.getmtime(path) + 1 < since:
            return None
        with open(path) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def last_line(text, *prefixes):
    found = [line.strip() for line in text.splitlines() if line.strip().startswith(prefixes)]
    return found[-1] if found else None


# --- parsers
def parse_gpu_check(run, record, text):
    parsed = {
        "summary_line": last_line(text, "gpu_check PASS", "gpu_check FAIL"),
        "toolchain_note": last_line(text, "gpu_check: NOTE"),
        "build_line": last_line(text, "gpu_check: built"),
    }
    findings = fresh_json(RUN_JSON[(1, run["label"])], record["start"])
    if findings:
        parsed.update(
            {
                "json": os.path.join(OUT, RUN_JSON[(1, run["label"])]),
                "status": findings.get("status"),
                "summary": findings.get("summary"),
                "checks": findings.get("checks"),
                "failures_count": len(findings.get("failures") or []),
                "failures": (findings.get("failures") or [])[:10],
                "seed": findings.get("seed"),
                "device": findings.get("device"),
                "backend": findings.get("backend"),
                "toolchain": (findings.get("build") or {}).get("toolchain"),
                "adam_timing": findings.get("adam_timing"),
                "timing_table": findings.get("timing_table"),
            }
        )
    return parsed


def parse_gpu_step(run, record, text):
    parsed = {"result_line": last_line(text, "PASSED", "FAILED:", "TensorFlow sees no GPU")}
    summary = fresh_json(RUN_JSON[(2, run["label"])], record["start"])
    if summary:
        checks = summary.get("checks") or []
        parsed.update(
            {
                "json": os.path.join(OUT, RUN_JSON[(2, run["label"])]),
                "passed": summary.get("passed"),
                "checks": len(checks),
                "checks_passed": sum(1 for c in checks if c.get("passed")),
                "failed_checks": [c.get("name") for c in checks if not c.get("passed")],
                "fused_op_traces": {
                    c["name"]: c["fused_op_traces"] for c in checks if "fused_op_traces" in c
                },
                "tensorflow": summary.get("tensorflow"),
                "gpu": summary.get("gpu"),
                "build": summary.get("build"),
            }
        )
    return parsed


PYTEST_END = re.compile(r"^=+ (.+?) in ([\d.]+)s\b.*=+\s*$", re.M)
PYTEST_COUNT = re.compile(
    r"(\d+) (passed|failed|skipped|xfailed|xpassed|deselected|errors?|warnings?)\b"
)
PYTEST_PROGRESS = re.compile(
    r"\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+)"
)
PYTEST_SHORT = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


PYTEST_VERBOSE = re.compile(
    r"^(?:\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+?)::"
    r"|(\S+?)::\S+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b)",
    re.M,
)


def by_file(text):
    """pytest -v's outcomes per test file (xdist's progress lines or plain ones)."""
    files = {}
    for match in PYTEST_VERBOSE.finditer(text):
        outcome = (match.group(1) or match.group(4)).lower()
        path = match.group(2) or match.group(3)
        counts = files.setdefault(path, {})
        counts[outcome] = counts.get(outcome, 0) + 1
    return files


def parse_pytest(run, record, text):
    counts, counted_from, pytest_seconds = {}, None, None
    ends = [m for m in PYTEST_END.finditer(text) if PYTEST_COUNT.search(m.group(1))]
    if ends:
        for number, word in PYTEST_COUNT.findall(ends[-1].group(1)):
            counts[{"error": "errors", "warning": "warnings"}.get(word, word)] = int(number)
        counted_from, pytest_seconds = "pytest's last line", float(ends[-1].group(2))
    else:
        names = {
            "PASSED": "passed",
            "FAILED": "failed",
            "SKIPPED": "skipped",
            "ERROR": "errors",
            "XFAIL": "xfailed",
            "XPASS": "xpassed",
        }
        for outcome, _ in PYTEST_PROGRESS.findall(text):
            counts[names[outcome]] = counts.get(names[outcome], 0) + 1
        counted_from = "progress lines (no final line: the run was cut short)" if counts else None
    failed = list(dict.fromkeys(PYTEST_SHORT.findall(text))) or list(
        dict.fromkeys(
            name
            for outcome, name in PYTEST_PROGRESS.findall(text)
            if outcome in ("FAILED", "ERROR")
        )
    )
    return {
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0),
        "skipped": counts.get("skipped", 0),
        "errors": counts.get("errors", 0),
        "counts": counts,
        "counted_from": counted_from,
        "pytest_seconds": pytest_seconds,
        "by_file": by_file(text),
        "failed_tests": failed[:40],
        "failed_tests_total": len(failed),
        "last_line": ends[-1].group(0).strip("= \n") if ends else None,
    }


# What bench --gpu-step --timing-only and --gpu-host-table print before their
# findings' JSON line (bench._gpu_step.TIMING_JSON_PREFIX, bench._gpu_host_table.JSON_PREFIX).
STEP_TIME_JSON = "GPU_STEP_TIMING_JSON "
HOST_TABLE_JSON = "GPU_HOST_TABLE_JSON "

STEP_LINE = re.compile(
    r"V=([\d,]+): ours ([\d.]+) ms \(XLA ([\d.]+)\), keras\.layers\.Embedding \+ Adam "
    r"([\d.]+) ms \(XLA ([\d.]+)\): ([\d.]+)x / ([\d.]+)x"
)


def parse_step_time(run, record, text):
    rows = [
        {
            "vocab": int(m.group(1).replace(",", "")),
            "ours_ms": float(m.group(2)),
            "ours_xla_ms": float(m.group(3)),
            "keras_ms": float(m.group(4)),
            "keras_xla_ms": float(m.group(5)),
            "keras_over_ours": float(m.group(6)),
            "keras_xla_over_ours_xla": float(m.group(7)),
        }
        for m in STEP_LINE.finditer(text)
    ]
    return {
        "lines": [
            line.strip()
            for line in text.splitlines()
            if STEP_LINE.search(line) or line.strip().startswith("embedding cost")
        ],
        "rows": rows,
        "findings": json_line(text, STEP_TIME_JSON),
        "error_line": last_line(text, "TensorFlow sees no GPU", "Traceback"),
    }


def json_line(text, prefix):
    """The object a run printed as one JSON line after ``prefix`` (the last), or None."""
    found = None
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                found = json.loads(line[len(prefix) :])
            except ValueError:
                pass
    return found


def parse_host_table(run, record, text):
    return {
        "lines": [
            line.strip()
            for line in text.splitlines()
            if line.startswith(("table ", "  step:", "  frozen rows", "  host /", "  stock on"))
        ],
        "findings": json_line(text, HOST_TABLE_JSON),
        "error_line": last_line(
            text, "TensorFlow sees no GPU", "Traceback", "--gpu-host-table: stopped"
        ),
    }


PARSERS = {
    1: parse_gpu_check,
    2: parse_gpu_step,
    3: parse_pytest,
    4: parse_pytest,
    5: parse_step_time,
    6: parse_host_table,
}


# --- the device calls and what they carry
def carry_plan():
    gpu_tf = os.path.join(ROOT, ".gpu_tf")
    expected = None
    try:
        with open(os.path.join(gpu_tf, "parts.txt")) as parts_txt:
            expected = int(parts_txt.read().strip())
    except (OSError, ValueError):
        pass
    present = (
        sorted(p for p in os.listdir(gpu_tf) if re.fullmatch(r"part\d+", p))
        if os.path.isdir(gpu_tf)
        else []
    )
    count = expected if expected is not None else (len(present) or 6)
    files = []
    for name in [f"part{i:02d}" for i in range(count)] + ["parts.txt", "on_device.sh"]:
        path = os.path.join(gpu_tf, name)
        files.append(
            {
                "path": f".gpu_tf/{name}",
                "present": os.path.isfile(path),
                "bytes": os.path.getsize(path) if os.path.isfile(path) else None,
            }
        )
    return {
        "parts_expected": expected,
        "parts_assumed": None if expected is not None else count,
        "files": files,
        "missing": [f["path"] for f in files if not f["present"]],
        "pack_command": (
            "PYTHON=.venv/bin/python ../shared/gpu/pack.sh  (after pip install .; 5-9 min)"
        ),
    }


def tree_bytes():
    """What travels with every call: tracked and untracked-not-ignored files."""
    try:
        names = subprocess.run(
            ["git", "ls-files", "-z", "-co", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            timeout=30,
            check=True,
        ).stdout.split(b"\0")
    except (OSError, subprocess.SubprocessError):
        return None
    total = 0
    for name in filter(None, names):
        try:
            total += os.lstat(os.path.join(ROOT.encode(), name)).st_size
        except OSError:
            pass
    return total


def stale_sources():
    """Sources changed after the pack was made: the device runs the package installed then."""
    try:
        packed = os.path.getmtime(os.path.join(ROOT, ".gpu_tf", "parts.txt"))
    except OSError:
        return []
    newer = []
    for top in ("python/partial_embedding", "cc"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            newer += [
                os.path.join(folder, f)
                for f in files
                if not f.endswith((".so", ".pyc"))
                and f != "_build_info.json"
                and os.path.getmtime(os.path.join(folder, f)) > packed
            ]
    newer += [
        os.path.join(ROOT, f)
        for f in ("CMakeLists.txt", "setup.py", "pyproject.toml")
        if os.path.exists(os.path.join(ROOT, f))
        and os.path.getmtime(os.path.join(ROOT, f)) > packed
    ]
    return sorted(os.path.relpath(p, ROOT) for p in newer)


def device_calls(carry, needs_tf):
    overrides = [
        f"{k}={shlex.quote(v)}"
        for k, v in sorted(E.items())
        if k.startswith("DEVICE_CHECK_") and k != "DEVICE_CHECK_HELPER"
    ]
    command = " ".join(
        overrides
        + ["bash build_tools/device_check.sh"]
        + (["--steps", E["DC_STEPS_ARG"]] if E["DC_STEPS_GIVEN"] == "1" else [])
    )
    timeout_s = min(600, TOTAL + 70)
    if not needs_tf:
        return [{"command": command, "timeout_s": timeout_s, "carry": []}]
    parts = [f["path"] for f in carry["files"] if re.fullmatch(r"\.gpu_tf/part\d+", f["path"])]
    calls = [
        {
            "command": f"mkdir -p /tmp/pe_gpu_tf/parts && cp {part} /tmp/pe_gpu_tf/parts/",
            "timeout_s": 60,
            "carry": [part],
        }
        for part in parts[:-1]
    ]
    calls.append(
        {
            "command": command,
            "timeout_s": timeout_s,
            "carry": parts[-1:] + [".gpu_tf/parts.txt", ".gpu_tf/on_device.sh"],
        }
    )
    return calls


# --- issue #45's figures, each with its target
ISSUE_45_VOCABS = (1_000_000, 8_000_000)
ISSUE_45_ADAM_CASE = "k=524,288 unique (V=4M)"  # gpu_check_rules.TIMING_CASES[1]
ISSUE_45_MODES = {"no_xla": "without XLA", "xla": "XLA (Keras' default on a GPU)"}
ISSUE_45_PATHS = {"default": "default GPU path", "fused": "PARTIAL_EMBEDDING_GPU_FUSED=1"}


def run_findings(entries, number, label, key):
    """A run's parsed ``key`` and, when it is missing, why."""
    entry = next((e for e in entries if e["number"] == number), None)
    if entry is None:
        return None, f"step {number} was not selected (--steps)"
    if DRY:
        return None, "dry run: measured on a lent GPU by step " + str(number)
    run = next((r for r in entry["runs"] if r["label"] == label), None)
    parsed = (entry.get("parsed") or {}).get(label)
    found = (parsed or {}).get(key)
    if found:
        return found, None
    if run is None or run["status"] in ("pending", "running"):
        return None, f"step {number} [{label}] has not run yet"
    if run["skipped"]:
        return None, f"step {number} [{label}] skipped: {run['skipped']}"
    error = (parsed or {}).get("error_line")
    return None, f"step {number} [{label}] {run['status']}, no findings" + (
        f": {error}" if error else ""
    )


def figure(item, name, target, source, value=None, met=None, missing=None, **detail):
    return {
        "item": item,
        "name": name,
        "target": target,
        "value": value,
        "met": met if missing is None else None,
        "measured": missing is None,
        "missing": missing,
        "source": source,
        **detail,
    }


def issue_45(entries):
    """Every figure issue #45 asks for, with its target, value and verdict (None
    where not measured, or measured off a GPU), in a fixed order."""
    figures = []
    for label, path in ISSUE_45_PATHS.items():
        source = f"step 5 step_time [{label}]: bench --gpu-step --timing-only"
        found, missing = run_findings(entries, 5, label, "findings")
        off_gpu = found is not None and not found.get("gpu_figures")
        if off_gpu:
            missing = "not a GPU figure: " + (found.get("note") or "timed off the GPU")
        costs = (found or {}).get("embedding_cost") or {}
        failed = {
            row.get("vocab"): row.get("failed") or {} for row in (found or {}).get("rows", [])
        }
        for mode, mode_name in ISSUE_45_MODES.items():
            per_vocab = {e["vocab"]: e for e in (costs.get(mode) or {}).get("per_vocab", [])}
            for vocab in ISSUE_45_VOCABS:
                cost = per_vocab.get(vocab)
                figures.append(
                    figure(
                        1,
                        f"embedding cost, ours / keras.layers.Embedding + Adam, {mode_name},"
                        f" V = {vocab:,}, {path}",
                        "<= 0.2",
                        source,
                        value=(cost or {}).get("ours_cost_over_keras_cost"),
                        met=(cost or {}).get("met"),
                        missing=missing or (None if cost else f"no V = {vocab:,} in the findings"),
                        ours_cost_ms=(cost or {}).get("ours_cost_ms"),
                        keras_cost_ms=(cost or {}).get("keras_cost_ms"),
                        failed_variants=failed.get(vocab) or None,
                    )
                )
            growth = (costs.get(mode) or {}).get("ours_cost_growth") or {}
            figures.append(
                figure(
                    1,
                    f"our embedding cost's growth, V = 1M -> 8M, {mode_name}, {path}",
                    "<= 1.2x",
                    source,
                    value=growth.get("ratio"),
                    met=growth.get("met"),
                    missing=missing or (None if "from_vocab" in growth else "no growth figure"),
                )
            )
    for label in ("auto", "nvcc"):
        adam, missing = run_findings(entries, 1, label, "adam_timing")
        if label == "nvcc" and adam is None:
            continue  # the second build runs only after a CUDA 12 line build
        case = next((c for c in adam or () if c.get("case") == ISSUE_45_ADAM_CASE), None)
        value = round(case["ours_x_floor"], 3) if case else None
        figures.append(
            figure(
                2,
                f"fused masked Adam at {ISSUE_45_ADAM_CASE}, float32 D = 128, over the"
                f" memory floor ({label} build)",
                "<= 1.5x",
                f"step 1 gpu_check [{label}]: gpu_check.json adam_timing",
                value=value,
                met=None if case is None else case["ours_x_floor"] <= case["target_x_floor"],
                missing=missing or (None if case else f"no {ISSUE_45_ADAM_CASE} case timed"),
                ours_ms=(case or {}).get("ours_ms"),
                floor_ms=(case or {}).get("floor_ms"),
            )
        )
    host, missing = run_findings(entries, 6, "default", "findings")
    if host is not None and not host.get("gpu_figures"):
        missing = "not a GPU figure: " + (host.get("note") or "run off the GPU")
    source = "step 6 host_table: bench --gpu-host-table"
    limit = f"a table twice the {(host or {}).get('memory_limit_mb', 512)} MiB TensorFlow may use"
    frozen = (host or {}).get("frozen_bit_for_bit") or {}
    figures.append(
        figure(
            3,
            f"{limit}, frozen_rows_on='host': frozen rows after the steps",
            "bit for bit",
            source,
            value="bit for bit" if frozen.get("met") else "changed" if frozen else None,
            met=frozen.get("met"),
            missing=missing,
        )
    )
    for key, name, target in (
        ("host_over_fits", "its step / the step with a table that fits", "<= 3x"),
        ("stock_cpu_over_host", "keras.layers.Embedding + Adam on /CPU:0 / its step", ">= 5x"),
    ):
        entry = (host or {}).get(key) or {}
        figures.append(
            figure(
                3,
                f"{limit}: {name}",
                target,
                source,
                value=entry.get("ratio"),
                met=entry.get("met"),
                missing=missing,
                step_ms=(host or {}).get("step_ms"),
            )
        )
    tests, missing = run_findings(entries, 3, "fused", "by_file")
    xla_tests = (tests or {}).get("tests/ops/test_xla_custom_call_gpu.py")
    measured = [f for f in figures if f["measured"]]
    return {
        "figures": figures,
        "met": sum(1 for f in measured if f["met"]),
        "not_met": sum(1 for f in measured if not f["met"]),
        "not_measured": len(figures) - len(measured),
        "all_met": bool(measured)
        and len(measured) == len(figures)
        and all(f["met"] for f in measured),
        "xla_custom_call_gpu_tests": xla_tests
        or {"missing": missing or "no test of tests/ops/test_xla_custom_call_gpu.py ran"},
    }


def issue_45_lines(section):
    lines = [
        f"issue #45: {section['met']} figures met, {section['not_met']} not met,"
        f" {section['not_measured']} not measured, of {len(section['figures'])}"
    ]
    for entry in section["figures"]:
        if entry["measured"]:
            verdict = "met" if entry["met"] else "NOT MET"
            value = entry["value"]
            shown = f"{value}x" if isinstance(value, (int, float)) else str(value)
            lines.append(f"  [{verdict}] {entry['name']}: {shown} (target {entry['target']})")
        else:
            lines.append(f"  [-] {entry['name']} (target {entry['target']}): {entry['missing']}")
    tests = section["xla_custom_call_gpu_tests"]
    counts = tests.get("missing") or ", ".join(f"{n} {w}" for w, n in tests.items())
    lines.append(f"  tests/ops/test_xla_custom_call_gpu.py (step 3): {counts}")
    return lines


# --- assembling
def tensorflow_section(steps, carry):
    if not any(step["needs_tensorflow"] for step in steps):
        return None
    section = {
        "command": E["DC_TF_COMMAND"],
        "budget_s": int(E["DC_TF_BUDGET"]),
        "env": "DEVICE_CHECK_BUDGET_TF",
        "state": "dry_run" if DRY else "pending",
        "dry_run": DRY,
    }
    if DRY:
        section["parts"] = carry
    try:
        if not DRY and os.path.getmtime(TF_STATE) >= STARTED - 1:
            with open(TF_STATE) as state:
                section.update(json.load(state))
    except (OSError, ValueError):
        pass
    return section


def run_entry(step, run, record):
    entry = {
        **run,
        "budget_s": None,
        "exit_code": None,
        "seconds": None,
        "timed_out": False,
        "skipped": None,
        "dry_run": DRY,
        "status": "dry_run" if DRY else "pending",
    }
    if record is None or DRY:
        return entry
    if record["kind"] != "run":
        entry.update(
            status="not_needed" if record["kind"] == "unneeded" else "skipped",
            skipped=record["reason"],
        )
        return entry
    seconds = record["end"] - record["start"]
    timed_out = record["rc"] in (124, 137) and seconds >= record["budget"] - 1
    entry.update(
        command=record["command"],
        budget_s=record["budget"],
        exit_code=record["rc"],
        seconds=round(seconds, 1),
        timed_out=timed_out,
        status="timed_out" if timed_out else "passed" if record["rc"] == 0 else "failed",
    )
    entry["parsed"] = PARSERS[step["number"]](run, record, log_text(record))  # kept by step_entry
    return entry


def step_entry(step, records):
    runs = [
        run_entry(step, run, records.get((str(step["number"]), run["label"])))
        for run in step["runs"]
    ]
    executed = [run for run in runs if run["exit_code"] is not None]
    statuses = {run["status"] for run in runs}
    if DRY:
        status = "dry_run"
    elif not executed:
        status = (
            "pending"
            if "pending" in statuses
            else "skipped"
            if "skipped" in statuses
            else "not_needed"
        )
    elif "timed_out" in statuses:
        status = "timed_out"
    elif "failed" in statuses:
        status = "failed"
    elif "pending" in statuses:
        status = "running"
    elif "skipped" in statuses:
        status = "incomplete"
    else:
        status = "passed"
    skipped = [run["skipped"] for run in runs if run["status"] == "skipped"]
    entry = {
        key: step[key]
        for key in ("number", "name", "title", "needs_tensorflow", "correctness", "budget_s", "env")
    }
    parsed = {run["label"]: run.pop("parsed") for run in runs if "parsed" in run}
    entry.update(
        {
            "commands": [run["command"] for run in step["runs"]],
            "dry_run": DRY,
            "status": status,
            "exit_code": next((r["exit_code"] for r in executed if r["exit_code"]), 0)
            if executed
            else None,
            "seconds": round(sum(r["seconds"] for r in executed), 1) if executed else None,
            "timed_out": any(r["timed_out"] for r in runs),
            "skipped": skipped[0] if skipped and not executed else None,
            "runs": runs,
            "parsed": parsed,
        }
    )
    return entry


def assemble(final):
    steps = read_plan()
    records = read_records()
    carry = carry_plan()
    needs_tf = any(step["needs_tensorflow"] for step in steps)
    entries = [step_entry(step, records) for step in steps]
    tensorflow = tensorflow_section(steps, carry)
    failed = [
        e["number"] for e in entries if e["correctness"] and e["status"] in ("failed", "timed_out")
    ]
    tf_failed = bool(tensorflow and tensorflow.get("state") == "failed")
    exit_code = 1 if failed or tf_failed else 0
    report = {
        "format": "device_check/1",
        "dry_run": DRY,
        "status": "dry_run"
        if DRY
        else ("failed" if exit_code else "passed")
        if final
        else "running",
        "exit_code": exit_code if final or DRY else None,
        "failed_steps": failed,
        "tensorflow_setup_failed": tf_failed,
        "started": iso(STARTED),
        "updated": iso(time.time()),
        "seconds": round(time.time() - STARTED, 1),
        "selected_steps": [e["number"] for e in entries],
        "seed": int(E["DC_SEED"]),
        "python": E["DC_PYTHON"],
        "budgets": {
            "total_s": TOTAL,
            "env": "DEVICE_CHECK_TOTAL_S",
            "tensorflow_setup_s": int(E["DC_TF_BUDGET"]),
            "steps": {str(e["number"]): e["budget_s"] for e in entries},
        },
        "machine": {"hostname": os.uname().nodename, "gpu": E.get("DC_GPU") or None},
        "out_dir": OUT,
        "log": LOG,
        "files": sorted(
            {f for f in OUR_FILES if os.path.exists(os.path.join(OUT, f))}
            | {"device_check.json", "device_check_summary.txt"}
        ),
        "tensorflow": tensorflow,
        "steps": entries,
        "issue_45": issue_45(entries),
    }
    if DRY:
        size = tree_bytes()
        report["device"] = {
            "calls": device_calls(carry, needs_tf),
            "tree_bytes": size,
            "stale_sources": stale_sources() if needs_tf else [],
        }
    write(report)
    return report


def write(report):
    with open(os.path.join(OUT, "device_check.json"), "w") as out:
        json.dump(report, out, indent=1)
    with open(os.path.join(OUT, "device_check_summary.txt"), "w") as out:
        out.write(summary(report))


def brief(step_number, label, parsed):
    if step_number == 1:
        return parsed.get("summary_line") or parsed.get("toolchain_note") or ""
    if step_number == 2:
        if "checks" in parsed:
            failed = parsed["failed_checks"]
            return f"{parsed['checks_passed']}/{parsed['checks']} checks passed" + (
                f"; failed: {', '.join(failed)}" if failed else ""
            )
        return parsed.get("result_line") or "no smoke-check result in the log"
    if step_number in (3, 4):
        if parsed.get("counted_from") is None:
            return "no pytest counts in the log"
        text = ", ".join(f"{n} {w}" for w, n in parsed["counts"].items() if w != "warnings")
        return text + ("" if parsed["counted_from"] == "pytest's last line" else " (cut short)")
    if step_number == 5:
        return "\n".join(parsed["lines"]) or parsed.get("error_line") or "no step-time lines"
    if step_number == 6:
        return "\n".join(parsed["lines"]) or parsed.get("error_line") or "no host-table lines"
    return ""


def summary(report):
    lines = [
        f"device_check {report['status'].upper()}"
        + (f" (exit {report['exit_code']})" if report["exit_code"] is not None else "")
        + f", {report['seconds']:.0f} s of {report['budgets']['total_s']} s,"
        + f" started {report['started']},"
        + f" GPU: {report['machine']['gpu'] or 'not seen (no nvidia-smi)'}, seed {report['seed']}"
    ]
    tf = report["tensorflow"]
    if tf:
        detail = tf.get("reason") or tf.get("line") or ""
        seconds = f", {tf['seconds']:.0f} s" if tf.get("seconds") is not None else ""
        lines.append(
            f"TensorFlow set-up: {tf['state']}{seconds}" + (f": {detail}" if detail else "")
        )
    for step in report["steps"]:
        seconds = f"{step['seconds']:.0f} s" if step["seconds"] is not None else "-"
        skipped = step["skipped"] or ""
        if tf and skipped.startswith("TensorFlow is not set up"):
            skipped = "TensorFlow is not set up (above)"
        lines.append(
            f"step {step['number']} {step['name']:<12} {step['status']:<10} {seconds:>6}"
            f" of {step['budget_s']} s" + (f"  skipped: {skipped}" if skipped else "")
        )
        for run in step["runs"] if step["status"] != "skipped" else ():
            if report["dry_run"]:
                lines.append(f"    $ {run['command']}")
                continue
            parsed = step["parsed"].get(run["label"])
            state = run["status"] + (
                f" (exit {run['exit_code']})" if run["exit_code"] not in (None, 0) else ""
            )
            text = (
                brief(step["number"], run["label"], parsed)
                if parsed is not None
                else run["skipped"] or ""
            )
            first, *more = text.split("\n")
            lines.append(f"    {run['label']:<8} {state:<14} {first}")
            lines += [f"    {'':<8} {'':<14} {line}" for line in more]
            if parsed and step["number"] in (3, 4) and parsed["failed_tests"]:
                shown = parsed["failed_tests"][:15]
                lines += [f"      FAILED {name}" for name in shown]
                if parsed["failed_tests_total"] > len(shown):
                    lines.append(
                        f"      ... {parsed['failed_tests_total'] - len(shown)}"
                        " more in device_check.json"
                    )
            if parsed and step["number"] == 1 and parsed.get("failures"):
                lines += [f"      {failure[:200]}" for failure in parsed["failures"][:5]]
    lines += issue_45_lines(report["issue_45"])
    lines.append(f"files in {report['out_dir']}: {', '.join(report['files'])}")
    return "\n".join(lines) + "\n"


# --- the dry run's listing
def dry_run():
    report = assemble(final=True)
    print(
        "device_check --dry-run: nothing runs here. On the GPU machine, in this order"
        + (
            ":"
            if E.get("DC_OUT_SET")
            else " (files shown under build/device_check/ go to $OUT there):"
        )
    )
    tf = report["tensorflow"]
    for step in report["steps"]:
        if (
            tf
            and step["needs_tensorflow"]
            and step["number"] == min(s["number"] for s in report["steps"] if s["needs_tensorflow"])
        ):
            print(
                f"\n  TensorFlow set-up, once, before step {step['number']}: "
                f"budget {tf['budget_s']} s "
                f"({tf['env']}); the environment on_device.sh sets up, captured for steps 2-6"
            )
            print(f"    $ {tf['command']}")
        where = (
            "with TensorFlow (on_device.sh's environment)"
            if step["needs_tensorflow"]
            else "the machine's Python, no TensorFlow"
        )
        kind = "correctness" if step["correctness"] else "figures"
        print(f"\n  step {step['number']} {step['name']}: {step['title']}")
        print(f"    budget {step['budget_s']} s ({step['env']}); {kind}; {where}")
        for run in step["runs"]:
            condition = "" if run["when"] == "always" else f"[only if {run['when']}] "
            print(f"    $ {condition}{run['command']}")
    carry = tf["parts"] if tf else None
    device = report["device"]
    if carry:
        print("\nFiles the calls carry (.gpu_tf/, made here by ../shared/gpu/pack.sh):")
        for file in carry["files"]:
            size = f"{file['bytes'] / MIB:7.1f} MiB" if file["bytes"] is not None else "      -    "
            print(f"  {file['path']:<22} {size}  {'present' if file['present'] else 'MISSING'}")
        if carry["parts_expected"] is None:
            print(
                f"  (no .gpu_tf/parts.txt: {carry['parts_assumed']} parts assumed,"
                " as ../shared/gpu/README.md measured;"
                f" make them with {carry['pack_command']})"
            )
        elif carry["missing"]:
            print(
                f"  missing: {', '.join(carry['missing'])}: "
                f"make them again with {carry['pack_command']}"
            )
        if device["stale_sources"]:
            newer = device["stale_sources"]
            print(
                f"  NOTE: {len(newer)} source files changed after the pack was made "
                f"({', '.join(newer[:5])}{', ...' if len(newer) > 5 else ''}): "
                "the device runs the partial_embedding installed when"
                " pack.sh ran; pip install . and pack.sh again to test them"
            )
    else:
        print("\nNo step needs TensorFlow: the call carries nothing.")
    tree = device["tree_bytes"]
    calls = device["calls"]
    # A missing part counts as a full one (pack.sh splits at 58 MiB), a missing small file as 4 KiB.
    sizes = {
        f["path"]: f["bytes"]
        if f["present"]
        else 58 * MIB
        if "/part" in f["path"] and f["path"][-1].isdigit()
        else 4096
        for f in (carry["files"] if carry else [])
    }
    if tree is not None:
        largest = max(tree + sum(sizes.get(p, 0) for p in call["carry"]) for call in calls)
        verdict = "fits" if largest <= CALL_LIMIT else "OVER THE LIMIT: carry less or ignore more"
        print(
            f"Working tree that travels with every call: {tree / MIB:.1f} MiB; the largest call: "
            f"{largest / MIB:.1f} MiB of 64 MiB ({verdict})"
        )
    print(
        "\nThe device calls, "
        + (
            "back to back (the machine goes back 30 s after a call, /tmp with it):"
            if len(calls) > 1
            else "one:"
        )
    )
    for number, call in enumerate(calls, 1):
        print(f"  {number}. run {json.dumps(call)}")
    start, copies = 35, 5 * (len(calls) - 1)
    estimate = start + copies + TOTAL + 30
    print(
        f"Device time: about {start} s to start + {copies} s of copies"
        f" + at most {TOTAL} s of checks"
        f" + 30 s idle = {estimate / 60:.1f} min of the session's 15;"
        " then give_back unless rerunning at once."
    )
    print(f"Back from $OUT (at most 7 files): {', '.join(OUR_FILES)}.")
    section = report["issue_45"]
    print(
        f"Issue #45: {len(section['figures'])} figures, each with its target, value and verdict,"
        " in device_check.json's issue_45 and at the end of device_check_summary.txt."
    )
    written = os.path.join(OUT, "device_check.json")
    if written.startswith(ROOT + os.sep):
        written = os.path.relpath(written, ROOT)
    print(f"\nWrote {written} (every step dry_run) and device_check_summary.txt.")


# --- TensorFlow's set-up
def tensorflow_state(argv):
    rc, start, end, budget, log_start, log_end, command = argv
    record = {"log": (int(log_start or 0), int(log_end or 0))}
    text = log_text(record) if rc != "absent" else ""
    store = "/tmp/pe_gpu_tf"  # on_device.sh's
    state = {
        "parts_on_machine": sorted(
            p for p in os.listdir(os.path.join(store, "parts")) if p.startswith("part")
        )
        if os.path.isdir(os.path.join(store, "parts"))
        else [],
        "unpacked_before": os.path.exists(os.path.join(store, "site", ".complete"))
        if rc == "absent"
        else None,
        "command": command,
        "exit_code": None if rc == "absent" else int(rc),
        "budget_s": int(budget),
        "seconds": round(float(end) - float(start), 1) if rc != "absent" else None,
        "timed_out": False,
        "line": last_line(text, "on_device.sh: TensorFlow"),
        "missing_libraries": [
            line.strip() for line in text.splitlines() if line.startswith("on_device.sh: no ")
        ],
    }
    if rc == "absent":
        state.update(
            state="skipped",
            reason=".gpu_tf/on_device.sh is not here: TensorFlow's parts were not carried "
            "(make them with ../shared/gpu/pack.sh, carry them as --dry-run lists)",
        )
    elif int(rc) == 3:
        state.update(
            state="skipped",
            reason="TensorFlow's parts are incomplete on this machine: "
            + (last_line(text, "on_device.sh:") or "on_device.sh exited 3").split(";")[0]
            + " (carry the missing ones first, back to back: see --dry-run)",
        )
    elif int(rc) in (124, 137) and state["seconds"] >= int(budget) - 1:
        state.update(
            state="failed",
            timed_out=True,
            reason=f"the set-up took longer than its {budget} s (DEVICE_CHECK_BUDGET_TF)",
        )
    elif int(rc) != 0:
        lines = [line for line in text.splitlines() if line.strip()]
        state.update(
            state="failed", reason=f"on_device.sh exited {rc}: {lines[-1] if lines else ''}"
        )
    else:
        env_json = E["DC_TF_ENV_JSON"]
        # The same Python started without on_device.sh: what differs is what
        # on_device.sh set up.
        try:
            with open(E["DC_BASE_ENV_JSON"]) as file:
                before = json.load(file)
        except (OSError, ValueError):
            before = dict(E)
        import_line = [
            line
            for line in text.splitlines()
            if line.strip() and not line.startswith("on_device.sh: no ")
        ]
        try:
            with open(env_json) as file:
                after = json.load(file)
        except (OSError, ValueError):
            after = None
        if after is None:
            state.update(
                state="failed", reason="on_device.sh ran but the environment was not captured"
            )
        elif not state["line"]:
            state.update(
                state="failed",
                reason="TensorFlow did not import: "
                + (import_line[-1] if import_line else "no output"),
            )
        elif "GPU" not in state["line"]:
            state.update(state="failed", reason="TensorFlow sees no GPU: " + state["line"])
        else:
            match = re.search(r"TensorFlow (\S+) sees", state["line"])
            state.update(state="ready", reason=None, version=match.group(1) if match else None)
            skip = {"_", "SHLVL", "PWD", "OLDPWD"}
            changed = sorted(k for k, v in after.items() if k not in skip and before.get(k) != v)
            with open(E["DC_TF_ENV_FILE"], "w") as file:
                file.write("".join(f"export {k}={shlex.quote(after[k])}\n" for k in changed))
            state["environment"] = changed
    with open(TF_STATE, "w") as file:
        json.dump(state, file, indent=1)
    print(f"{state['state']}\t{state.get('reason') or state.get('line') or ''}")


def toolchain(name):
    findings = fresh_json(name, STARTED)
    print(((findings or {}).get("build") or {}).get("toolchain") or "")


mode = sys.argv[1]
if mode == "dry-run":
    dry_run()
elif mode == "assemble":
    assemble(final=False)
elif mode == "final":
    report = assemble(final=True)
    print(summary(report), end="")
    sys.exit(report["exit_code"])
elif mode == "tensorflow":
    tensorflow_state(sys.argv[2:])
elif mode == "toolchain":
    toolchain(sys.argv[2])
