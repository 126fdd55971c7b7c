"""The memory benchmark's parent: runs each case in a child process and samples it from outside."""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from partial_embedding.bench.memory_figures import (
    END,
    EXTRA_VARIANTS,
    GIB,
    MIB,
    PHASES,
    RUNNABLE_VARIANTS,
    VARIANTS,
    MemoryCase,
    MemoryMeasurement,
)

__all__ = [
    "measure_case",
    "memory_available_bytes",
    "memory_total_bytes",
]

# -- reading /proc ----------------------------------------------------------------


def _status_bytes(path: str, fields: Sequence[str]) -> dict[str, int]:
    """Fields of a ``/proc/.../status`` or ``/proc/meminfo`` file, in bytes
    (they are written in kB); missing fields are left out."""
    found = {}
    with open(path, "rb") as handle:
        for line in handle.read().decode("ascii", "replace").splitlines():
            name, _, rest = line.partition(":")
            if name in fields:
                found[name] = int(rest.split()[0]) * 1024
    return found


def memory_available_bytes() -> int:
    return _status_bytes("/proc/meminfo", ["MemAvailable"])["MemAvailable"]


def memory_total_bytes() -> int:
    return _status_bytes("/proc/meminfo", ["MemTotal"])["MemTotal"]


# -- the parent: sampling a child from outside -------------------------------------


class _ChildSampler:
    """Samples a child's ``RssAnon`` about every ``interval`` seconds until it
    exits, attributing each sample to the phase the child last announced.

    The child writes ``phase NAME`` lines to ``markers`` and waits for a line
    on ``acks``; the sampler answers after one more sample, so each sample
    belongs to exactly one phase. The first phase (``construction``) fixes
    the baseline. A ``result JSON`` line carries the child's own figures.
    """

    def __init__(
        self,
        process: subprocess.Popen,
        markers: int,
        acks: int,
        interval: float,
        min_available_bytes: int,
    ) -> None:
        self.process = process
        self.markers = markers
        self.acks = acks
        self.interval = interval
        self.min_available_bytes = min_available_bytes
        self.status_path = f"/proc/{process.pid}/status"
        self.phase = "setup"
        self.baseline: dict[str, int] | None = None
        self.peaks: dict[str, int] = {}
        self.ends: dict[str, int] = {}
        self.samples = 0
        self.killed_for_memory = False
        self.child_result: dict[str, Any] = {}
        self._buffer = b""

    def _sample(self) -> dict[str, int] | None:
        try:
            values = _status_bytes(self.status_path, ["RssAnon", "VmRSS"])
        except (OSError, ValueError):
            return None  # the child has just exited
        if "RssAnon" not in values:
            return None
        self.samples += 1
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), values["RssAnon"])
        return values

    def _handle(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind == "result":
            self.child_result = json.loads(rest)
            return
        values = self._sample()
        if values is not None:
            self.ends[self.phase] = values["RssAnon"]
            if self.baseline is None and rest == PHASES[0]:
                self.baseline = values
        self.phase = rest
        os.write(self.acks, b"ok\n")

    def _read_markers(self) -> bool:
        """Handles what the child wrote; False once it closed its end."""
        chunk = os.read(self.markers, 65536)
        if not chunk:
            return False
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._handle(line.decode())
        return True

    def run(self) -> None:
        open_pipe = True
        checks = 0
        while self.process.poll() is None:
            self._sample()
            checks += 1
            if checks % 16 == 0 and memory_available_bytes() < self.min_available_bytes:
                self.killed_for_memory = True
                self.process.send_signal(signal.SIGKILL)
                break
            if open_pipe:
                ready, _, _ = select.select([self.markers], [], [], self.interval)
                if ready:
                    open_pipe = self._read_markers()
            else:
                time.sleep(self.interval)
        while open_pipe and select.select([self.markers], [], [], 0)[0]:
            open_pipe = self._read_markers()

    def over_baseline(self, values: dict[str, int]) -> dict[str, int]:
        base = self.baseline["RssAnon"] if self.baseline else 0
        return {p: max(0, v - base) for p, v in values.items() if p in PHASES}


def _child_command(case: MemoryCase, markers: int, acks: int, weights_path: str | None) -> list:
    spec = dataclasses.asdict(case)
    spec["weights_path"] = weights_path
    return [
        sys.executable,
        "-m",
        "partial_embedding.bench.memory",
        "--child",
        json.dumps(spec),
        "--marker-fd",
        str(markers),
        "--ack-fd",
        str(acks),
    ]


def _child_environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [package_root, *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return environment


@contextmanager
def _weights_file(case: MemoryCase) -> Iterator[str | None]:
    """For ``partial_mmap`` and ``int8_mmap``: a ``.npy`` of the table, written in row blocks by
    this process (file pages, not the child's anonymous memory), deleted
    after."""
    if case.variant not in ("partial_mmap", "int8_mmap"):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="pe_bench_memory_") as folder:
        path = os.path.join(folder, "table.npy")
        table = np.lib.format.open_memmap(
            path, mode="w+", dtype=np.float32, shape=(case.vocab, case.width)
        )
        rng = np.random.default_rng(case.seed)
        block = max(1, (64 * MIB) // (case.width * 4))
        for start in range(0, case.vocab, block):
            stop = min(case.vocab, start + block)
            table[start:stop] = rng.uniform(-0.05, 0.05, (stop - start, case.width))
        table.flush()
        del table
        yield path


def measure_case(
    case: MemoryCase,
    *,
    interval: float = 0.001,
    min_available_bytes: int = GIB // 2,
    timeout: float | None = None,
) -> MemoryMeasurement:
    """Runs ``case`` in a fresh child process and returns what it took.

    The parent samples the child's ``RssAnon`` every ``interval`` seconds and
    kills it (status ``"killed: ..."``) when ``MemAvailable`` falls under
    ``min_available_bytes`` or after ``timeout`` seconds.
    """
    if case.variant not in RUNNABLE_VARIANTS:
        known = (*VARIANTS, *EXTRA_VARIANTS)
        raise ValueError(f"variant: unknown {case.variant!r}; choose from {known}")
    with _weights_file(case) as weights_path:
        markers_read, markers_write = os.pipe()
        acks_read, acks_write = os.pipe()
        started = time.perf_counter()
        with tempfile.TemporaryFile() as stderr:
            try:
                process = subprocess.Popen(
                    _child_command(case, markers_write, acks_read, weights_path),
                    pass_fds=(markers_write, acks_read),
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=_child_environment(),
                )
            finally:
                os.close(markers_write)
                os.close(acks_read)
            sampler = _ChildSampler(
                process, markers_read, acks_write, interval, min_available_bytes
            )
            timer = None
            if timeout is not None:
                import threading

                timer = threading.Timer(timeout, process.kill)
                timer.start()
            try:
                sampler.run()
                returncode = process.wait()
            finally:
                if timer is not None:
                    timer.cancel()
                os.close(markers_read)
                os.close(acks_write)
            stderr.seek(0)
            error_tail = stderr.read().decode(errors="replace")[-2000:]
    measurement = MemoryMeasurement(
        case=case,
        baseline_anon_bytes=sampler.baseline["RssAnon"] if sampler.baseline else 0,
        baseline_rss_bytes=sampler.baseline.get("VmRSS", 0) if sampler.baseline else 0,
        phase_peak_bytes=sampler.over_baseline(sampler.peaks),
        phase_end_bytes=sampler.over_baseline(sampler.ends),
        optimizer_bytes=sampler.child_result.get("optimizer_bytes"),
        child_figures={k: v for k, v in sampler.child_result.items() if k != "optimizer_bytes"},
        samples=sampler.samples,
        seconds=time.perf_counter() - started,
    )
    measurement.status = _status(sampler, returncode, error_tail, min_available_bytes)
    return measurement


def _status(
    sampler: _ChildSampler, returncode: int, error_tail: str, min_available_bytes: int
) -> str:
    """``"ok"``, or why the child did not finish."""
    if sampler.killed_for_memory:
        return (
            f"killed: MemAvailable fell under {min_available_bytes / GIB:.1f} GiB "
            f"in phase {sampler.phase}"
        )
    if returncode != 0:
        return f"failed: exit {returncode} in phase {sampler.phase}: {error_tail}"
    if sampler.phase != END:
        return f"failed: ended in phase {sampler.phase}"
    return "ok"
