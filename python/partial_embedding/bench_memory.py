"""Memory benchmark: ``python -m partial_embedding.bench --memory``.

How much memory training with a large embedding table takes, per phase, for
the same small model (ids mean-pooled into a ``Dense(1)``, mean squared
error, Adam) built four ways:

* ``partial``: ``PartialEmbedding`` + ``MaskedOptimizer(Adam)``, default
  initializer;
* ``partial_mmap``: the same with ``weights=np.load(path, mmap_mode="r")``
  (the ``.npy`` is written to a temporary folder first, by the parent
  process, and deleted after);
* ``keras``: stock ``keras.layers.Embedding`` + ``Adam``;
* ``stock_tf``: a ``tf.Variable`` table trained by lazy Adam written with
  stock TF ops (gathers and ``scatter_update``; see
  ``partial_embedding.bench_training``).

Each configuration runs in a fresh child process, so peaks never mix. The
parent samples the child's anonymous memory (``RssAnon`` of
``/proc/<pid>/status``) about every millisecond from outside it: a sampler
inside the child would stop whenever the child's own code holds the GIL and
miss the transients that matter most. The child tells the parent where each
phase begins (over a pipe, waiting for the answer, so the boundary is exact).
Figures are relative to the child's baseline: after importing TensorFlow,
Keras and this package and a tiny warm-up (the same variant at 64 rows).

Phases: ``construction`` (the layer, the model, compiling), ``first_step``
(the first training step: optimizer build, tracing), ``steady`` (the next
``--steps`` steps). Each phase's figure is the highest sample in it, over the
baseline, in MiB and as a multiple of the table's size; next to them the
bytes of the optimizer's variables as a multiple of the table.

Then the largest table that trains with Adam here, per variant: a line
``peak = fixed + per_table_byte * table`` through the measured points, solved
for a budget (``MemAvailable`` of ``/proc/meminfo``, or ``--budget-gib``)
less a safety margin, and confirmed by one run at that size (construction and
a few steps). A watchdog kills a run when ``MemAvailable`` falls under
``--min-available-gib`` and reports it as failed.

``measure_case`` returns a ``MemoryMeasurement``; ``run`` returns a
``MemoryBenchmark``; ``report`` prints one; ``write_svg`` draws one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import xml.sax.saxutils
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

import numpy as np

__all__ = [
    "LargestTable",
    "MemoryBenchmark",
    "MemoryCase",
    "MemoryMeasurement",
    "PHASES",
    "VARIANTS",
    "fit_peak_line",
    "main",
    "measure_case",
    "parse_args",
    "predict_largest",
    "report",
    "run",
    "write_svg",
]

VARIANTS = ("partial", "partial_mmap", "keras", "stock_tf")
# A self-check of the sampler, not a configuration: a table-sized NumPy
# array allocated, filled and freed at once (three times over).
TRANSIENT = "numpy_transient"
PHASES = ("construction", "first_step", "steady")
VARIANT_LABELS = {
    "partial": "PartialEmbedding + MaskedOptimizer(Adam)",
    "partial_mmap": 'the same, weights=np.load(..., mmap_mode="r")',
    "keras": "stock keras.layers.Embedding + Adam",
    "stock_tf": "stock TF ops, lazy Adam",
    TRANSIENT: "a table-sized NumPy array, allocated and freed",
}
MIB = 2**20
GIB = 2**30
_END = "end"


# -- what is measured -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MemoryCase:
    """One configuration, measured in a process of its own.

    Attributes:
      variant: One of ``VARIANTS`` (or ``"numpy_transient"``).
      vocab, width: The table is ``vocab x width`` float32.
      permitted_fraction: Fraction of rows that may learn (random, fixed seed).
      batch, ids_per_sample: Each step looks up ``batch x ids_per_sample`` ids,
        drawn among all rows.
      steps: Steps of the steady phase (after the first).
      seed: Seed of the permitted rows, the ids and the targets.
    """

    variant: str = "partial"
    vocab: int = 1_000_000
    width: int = 128
    permitted_fraction: float = 0.01
    batch: int = 256
    ids_per_sample: int = 16
    steps: int = 10
    seed: int = 0

    @property
    def table_bytes(self) -> int:
        return self.vocab * self.width * 4

    @property
    def label(self) -> str:
        return f"{self.variant} V={_short_count(self.vocab)}"


@dataclasses.dataclass
class MemoryMeasurement:
    """What one configuration took, over its process's baseline.

    Attributes:
      case: The configuration.
      status: ``"ok"``, or why the run did not finish (killed by the
        watchdog, a nonzero exit and the end of its stderr).
      baseline_anon_bytes: The child's ``RssAnon`` after imports and warm-up.
      baseline_rss_bytes: Its whole resident set then (what the process
        itself costs before any table).
      phase_peak_bytes: Per phase reached, the highest ``RssAnon`` sample
        over the baseline.
      phase_end_bytes: Per phase reached, ``RssAnon`` over the baseline when
        it ended (what it kept).
      optimizer_bytes: Sum over the optimizer's variables (None where the run
        did not get that far).
      samples: How many samples the parent took.
      seconds: Wall time of the child.
    """

    case: MemoryCase
    status: str = "ok"
    baseline_anon_bytes: int = 0
    baseline_rss_bytes: int = 0
    phase_peak_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    phase_end_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    optimizer_bytes: int | None = None
    samples: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def peak_bytes(self) -> int:
        """The highest sample over the baseline, any phase."""
        return max(self.phase_peak_bytes.values(), default=0)

    def multiple(self, phase: str | None = None) -> float:
        """A phase's peak (None: the highest) as a multiple of the table."""
        peak = self.peak_bytes if phase is None else self.phase_peak_bytes.get(phase, 0)
        return peak / self.case.table_bytes

    @property
    def optimizer_multiple(self) -> float | None:
        if self.optimizer_bytes is None:
            return None
        return self.optimizer_bytes / self.case.table_bytes

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryMeasurement:
        """The inverse of ``to_dict`` (its derived figures are recomputed)."""
        names = {field.name for field in dataclasses.fields(cls)} - {"case"}
        fields = {name: data[name] for name in names if name in data}
        return cls(case=MemoryCase(**data["case"]), **fields)

    def to_dict(self) -> dict[str, Any]:
        result = dataclasses.asdict(self)
        result["table_bytes"] = self.case.table_bytes
        result["peak_bytes"] = self.peak_bytes
        result["peak_multiple"] = self.multiple()
        result["phase_multiple"] = {p: self.multiple(p) for p in self.phase_peak_bytes}
        result["optimizer_multiple"] = self.optimizer_multiple
        return result


@dataclasses.dataclass
class LargestTable:
    """The largest table of one variant that should train within a budget.

    ``peak = fixed_bytes + per_table_byte * table_bytes`` is the line through
    the measured points; the prediction leaves ``margin`` of the budget free
    and the process's baseline resident set (``process_bytes``) aside.
    ``rows_at_memory_total`` is the same arithmetic for a budget of the
    whole ``MemTotal`` (a prediction only). ``confirmation`` is the run at
    ``rows`` (None where not run).
    """

    variant: str
    width: int
    per_table_byte: float
    fixed_bytes: float
    process_bytes: int
    budget_bytes: int
    margin: float
    rows: int
    memory_total_bytes: int
    rows_at_memory_total: int = 0
    confirmation: MemoryMeasurement | None = None

    @property
    def table_bytes(self) -> int:
        return self.rows * self.width * 4

    @property
    def fraction_of_memory(self) -> float:
        """The table's size as a fraction of the machine's ``MemTotal``."""
        return self.table_bytes / self.memory_total_bytes if self.memory_total_bytes else 0.0

    @property
    def confirmed(self) -> bool | None:
        return None if self.confirmation is None else self.confirmation.ok

    def to_dict(self) -> dict[str, Any]:
        result = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "confirmation"
        }
        result["table_bytes"] = self.table_bytes
        result["fraction_of_memory"] = self.fraction_of_memory
        result["confirmed"] = self.confirmed
        result["confirmation"] = self.confirmation.to_dict() if self.confirmation else None
        return result


@dataclasses.dataclass
class MemoryBenchmark:
    """A whole run: the machine, each configuration, the largest tables."""

    machine: dict[str, Any]
    measurements: list[MemoryMeasurement]
    largest: dict[str, LargestTable] = dataclasses.field(default_factory=dict)

    @property
    def largest_ratio(self) -> float | None:
        """Rows of ours (``partial``) over rows of stock Keras, where both exist."""
        ours, stock = self.largest.get("partial"), self.largest.get("keras")
        if ours is None or stock is None or stock.rows <= 0:
            return None
        return ours.rows / stock.rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "phases": list(PHASES),
            "measurements": [m.to_dict() for m in self.measurements],
            "largest": {name: table.to_dict() for name, table in self.largest.items()},
            "largest_ratio_partial_over_keras": self.largest_ratio,
        }


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
        "partial_embedding.bench_memory",
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
    """For ``partial_mmap``: a ``.npy`` of the table, written in row blocks by
    this process (file pages, not the child's anonymous memory), deleted
    after."""
    if case.variant != "partial_mmap":
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
    if case.variant not in (*VARIANTS, TRANSIENT):
        raise ValueError(f"variant: unknown {case.variant!r}; choose from {VARIANTS}")
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
        samples=sampler.samples,
        seconds=time.perf_counter() - started,
    )
    if sampler.killed_for_memory:
        measurement.status = (
            f"killed: MemAvailable fell under {min_available_bytes / GIB:.1f} GiB "
            f"in phase {sampler.phase}"
        )
    elif returncode != 0:
        measurement.status = f"failed: exit {returncode} in phase {sampler.phase}: {error_tail}"
    elif sampler.phase != _END:
        measurement.status = f"failed: ended in phase {sampler.phase}"
    return measurement


# -- the child: one configuration ----------------------------------------------------


class _PhaseMarker:
    """The child's end of the pipes: announces a phase, waits for the answer."""

    def __init__(self, markers: int, acks: int) -> None:
        self.markers = markers
        self.acks = os.fdopen(acks, "rb")

    def __call__(self, phase: str) -> None:
        os.write(self.markers, f"phase {phase}\n".encode())
        self.acks.readline()

    def result(self, figures: dict[str, Any]) -> None:
        os.write(self.markers, f"result {json.dumps(figures)}\n".encode())


def _variables_bytes(variables: Sequence[Any]) -> int:
    import tensorflow as tf

    unique = {id(v): v for v in variables}
    # The current size (compact slots grow: their static row count is None),
    # without reading the values.
    return sum(int(tf.size(v)) * tf.as_dtype(v.dtype).size for v in unique.values())


def _training_data(case: MemoryCase) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([case.seed, 1])
    count = case.batch * (case.steps + 1)
    ids = rng.integers(0, case.vocab, (count, case.ids_per_sample), dtype=np.int32)
    return ids, rng.standard_normal((count, 1)).astype(np.float32)


def _permitted_rows(case: MemoryCase) -> np.ndarray:
    rng = np.random.default_rng([case.seed, 0])
    count = max(1, int(round(case.vocab * case.permitted_fraction)))
    return np.sort(rng.choice(case.vocab, size=count, replace=False))


def _run_keras_case(case: MemoryCase, mark: Callable[[str], None], weights_path: str | None) -> int:
    """Builds, compiles and fits the pooling model; returns its optimizer's bytes."""
    import keras

    from partial_embedding.bench_training import _pooled_model
    from partial_embedding.layers import PartialEmbedding
    from partial_embedding.optimizers import MaskedOptimizer

    ids, targets = _training_data(case)
    permitted = _permitted_rows(case)
    mark("construction")
    optimizer: Any
    if case.variant == "keras":
        embedding: Any = keras.layers.Embedding(case.vocab, case.width)
        optimizer = keras.optimizers.Adam()
    else:
        weights = None if weights_path is None else np.load(weights_path, mmap_mode="r")
        embedding = PartialEmbedding(
            case.vocab, case.width, trainable_ids=permitted, weights=weights
        )
        optimizer = MaskedOptimizer(keras.optimizers.Adam())
    model = _pooled_model(embedding, case.ids_per_sample)
    model.compile(optimizer=optimizer, loss="mse")
    mark("first_step")
    first = slice(0, case.batch)
    model.fit(ids[first], targets[first], batch_size=case.batch, epochs=1, verbose=0)
    mark("steady")
    rest = slice(case.batch, None)
    if case.steps:
        model.fit(
            ids[rest], targets[rest], batch_size=case.batch, epochs=1, shuffle=False, verbose=0
        )
    mark(_END)
    # MaskedOptimizer's compact slots are not among `variables`.
    return _variables_bytes(
        [*optimizer.variables, *getattr(optimizer, "compact_slot_variables", [])]
    )


def _run_stock_tf_case(case: MemoryCase, mark: Callable[[str], None]) -> int:
    import tensorflow as tf

    from partial_embedding.bench_training import _stock_tf_step

    ids, targets = _training_data(case)
    row_mask = np.zeros(case.vocab, dtype=bool)
    row_mask[_permitted_rows(case)] = True
    mark("construction")
    step, holders = _stock_tf_step(case.vocab, case.width, row_mask, case.ids_per_sample)
    mark("first_step")
    for i in range(case.steps + 1):
        if i == 1:
            mark("steady")
        batch = slice(i * case.batch, (i + 1) * case.batch)
        step(tf.constant(ids[batch]), tf.constant(targets[batch])).numpy()
    if case.steps == 0:
        mark("steady")
    mark(_END)
    # The lazy Adam's two moments, its step count, and the head's optimizer.
    first, second, _mask, step_count, _head, head_optimizer = holders[1:]
    return _variables_bytes([first, second, step_count, *head_optimizer.variables])


def _run_transient(case: MemoryCase, mark: Callable[[str], None]) -> int:
    mark("construction")
    # Three times, each freed at once: a sampler that a busy machine holds
    # back for a moment still gets a chance at one of them.
    for _ in range(3):
        table = np.ones((case.vocab, case.width), dtype=np.float32)
        del table
    mark("first_step")
    mark("steady")
    mark(_END)
    return 0


def _warm_up(case: MemoryCase) -> None:
    """The same variant at 64 rows, two steps: loads what TF and Keras load
    lazily, so the baseline already holds it."""
    import gc

    import keras

    tiny = dataclasses.replace(case, vocab=64, batch=4, steps=1)
    if case.variant == "stock_tf":
        _run_stock_tf_case(tiny, lambda phase: None)
    elif case.variant != TRANSIENT:
        _run_keras_case(dataclasses.replace(tiny, variant="partial"), lambda phase: None, None)
        _run_keras_case(dataclasses.replace(tiny, variant="keras"), lambda phase: None, None)
    keras.backend.clear_session()
    gc.collect()


def _child_main(spec_json: str, markers: int, acks: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import partial_embedding  # noqa: F401

    spec = json.loads(spec_json)
    weights_path = spec.pop("weights_path", None)
    case = MemoryCase(**spec)
    mark = _PhaseMarker(markers, acks)
    _warm_up(case)
    if case.variant == TRANSIENT:
        optimizer_bytes = _run_transient(case, mark)
    elif case.variant == "stock_tf":
        optimizer_bytes = _run_stock_tf_case(case, mark)
    else:
        optimizer_bytes = _run_keras_case(case, mark, weights_path)
    mark.result({"optimizer_bytes": optimizer_bytes})


# -- the largest table ------------------------------------------------------------------


def fit_peak_line(points: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """``(fixed, per_table_byte)`` of ``peak = fixed + per_table_byte * table``.

    ``points`` are ``(table_bytes, peak_bytes)``. With one point, or where the
    least-squares slope is not positive (noise between close sizes), the line
    goes through the origin and the largest point: the cautious choice.

    >>> fixed, per_table_byte = fit_peak_line([(100, 600), (200, 1100)])
    >>> round(fixed), round(per_table_byte, 6)
    (100, 5.0)
    """
    if not points:
        raise ValueError("points: need at least one (table_bytes, peak_bytes)")
    tables = np.array([p[0] for p in points], dtype=np.float64)
    peaks = np.array([p[1] for p in points], dtype=np.float64)
    if len(set(tables.tolist())) >= 2:
        slope, intercept = np.polyfit(tables, peaks, 1)
        if slope > 0:
            return max(0.0, float(intercept)), float(slope)
    largest = int(np.argmax(tables))
    return 0.0, float(peaks[largest] / tables[largest])


def predict_largest(
    variant: str,
    points: Sequence[tuple[int, int]],
    *,
    width: int,
    process_bytes: int,
    budget_bytes: int,
    memory_total_bytes: int,
    margin: float = 0.1,
    row_multiple: int = 1024,
) -> LargestTable:
    """The largest ``rows x width`` float32 table whose predicted peak fits.

    ``budget * (1 - margin) >= process_bytes + fixed + per_table_byte * table``,
    with the line of ``fit_peak_line(points)``; rows are rounded down to a
    multiple of ``row_multiple`` (0 where nothing fits).

    >>> gib = 2**30
    >>> largest = predict_largest(
    ...     "partial", [(gib, 5 * gib)], width=128, process_bytes=0,
    ...     budget_bytes=10 * gib, memory_total_bytes=20 * gib, margin=0.1,
    ... )
    >>> round(largest.table_bytes / gib, 3), round(largest.fraction_of_memory, 3)
    (1.8, 0.09)
    """
    fixed, per_table_byte = fit_peak_line(points)

    def fitting_rows(budget: int) -> int:
        usable = budget * (1.0 - margin) - process_bytes - fixed
        table_bytes = max(0.0, usable / per_table_byte)
        return int(table_bytes // (width * 4)) // row_multiple * row_multiple

    return LargestTable(
        variant=variant,
        width=width,
        per_table_byte=per_table_byte,
        fixed_bytes=fixed,
        process_bytes=process_bytes,
        budget_bytes=budget_bytes,
        margin=margin,
        rows=fitting_rows(budget_bytes),
        memory_total_bytes=memory_total_bytes,
        rows_at_memory_total=fitting_rows(memory_total_bytes),
    )


# -- printing and drawing -------------------------------------------------------------


def _short_count(count: int) -> str:
    if count % 1_000_000 == 0:
        return f"{count // 1_000_000}M"
    if count % 1_000 == 0:
        return f"{count // 1_000}k"
    if count > 1 and count & (count - 1) == 0:
        return f"2^{count.bit_length() - 1}"
    return f"{count:,}"


def _mib(value: float) -> str:
    return f"{value / MIB:9.1f}"


def report_measurement(measurement: MemoryMeasurement, stream: TextIO) -> None:
    case = measurement.case
    cells = []
    for phase in PHASES:
        if phase in measurement.phase_peak_bytes:
            cells.append(
                f"{_mib(measurement.phase_peak_bytes[phase])} {measurement.multiple(phase):5.2f}x"
            )
        else:
            cells.append(f"{'-':>16}")
    optimizer = measurement.optimizer_multiple
    stream.write(
        f"{case.variant:<15} {case.vocab:>10,} {case.table_bytes / MIB:9.1f} "
        + " ".join(cells)
        + f" {measurement.multiple():6.2f}x"
        + (f" {optimizer:6.2f}x" if optimizer is not None else f" {'-':>7}")
        + ("" if measurement.ok else f"  {measurement.status.splitlines()[0][:120]}")
        + "\n"
    )
    stream.flush()


def report_heading(stream: TextIO) -> None:
    phases = " ".join(f"{phase + ' MiB, x':>16}" for phase in PHASES)
    stream.write(
        "peak RssAnon over the process's baseline, per phase (MiB, x table)\n"
        f"{'variant':<15} {'V':>10} {'table MiB':>9} {phases} {'peak':>7} {'opt.var':>7}\n"
    )


def report_largest(largest: LargestTable, stream: TextIO) -> None:
    confirmation = {None: "not run", True: "confirmed", False: "FAILED"}[largest.confirmed]
    if largest.confirmation is not None and not largest.confirmation.ok:
        confirmation += f" ({largest.confirmation.status.splitlines()[0][:100]})"
    stream.write(
        f"{largest.variant:<15} {largest.per_table_byte:5.2f} x table + "
        f"{(largest.fixed_bytes + largest.process_bytes) / MIB:7.0f} MiB -> "
        f"{largest.rows:>12,} rows = {largest.table_bytes / GIB:6.2f} GiB table "
        f"({largest.fraction_of_memory:5.1%} of MemTotal), budget "
        f"{largest.budget_bytes / GIB:.1f} GiB: {confirmation}; for all of MemTotal: "
        f"{largest.rows_at_memory_total:,} rows\n"
    )


def report(benchmark: MemoryBenchmark, stream: TextIO | None = None) -> None:
    """Prints a whole run."""
    stream = stream or sys.stdout
    report_heading(stream)
    for measurement in benchmark.measurements:
        report_measurement(measurement, stream)
    if benchmark.largest:
        stream.write("largest table that trains with Adam (predicted, then one run):\n")
        for largest in benchmark.largest.values():
            report_largest(largest, stream)
    if benchmark.largest_ratio is not None:
        stream.write(f"largest table, ours / stock Keras: {benchmark.largest_ratio:.2f}x\n")


_PHASE_COLORS = {"construction": "#4e79a7", "first_step": "#f28e2b", "steady": "#59a14f"}


def write_svg(
    measurements: Sequence[MemoryMeasurement], path: str, title: str = "", target: float = 1.3
) -> None:
    """A bar chart: per configuration, one bar per phase, its peak as a
    multiple of the table; a dashed line at ``target``. Written by hand, no
    plotting library needed. Each bar is a ``rect`` of class ``bar`` with
    ``data-config`` and ``data-phase`` attributes."""
    left, top, bar_width, gap, plot_height = 60, 40, 18, 24, 260
    group_width = bar_width * len(PHASES) + gap
    width = left + group_width * max(1, len(measurements)) + 20
    height = top + plot_height + 110
    top_value = max([target, *(m.multiple(p) for m in measurements for p in PHASES)])
    top_value = math.ceil(top_value + 0.5)

    def y_of(value: float) -> float:
        return top + plot_height * (1 - value / top_value)

    escape = xml.sax.saxutils.quoteattr
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="13">'
        f"{xml.sax.saxutils.escape(title or 'Peak anonymous memory over baseline, x table')}"
        "</text>",
    ]
    for tick in range(0, top_value + 1):
        y = y_of(tick)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}x</text>'
        )
    for index, measurement in enumerate(measurements):
        x0 = left + gap / 2 + index * group_width
        for number, phase in enumerate(PHASES):
            value = measurement.multiple(phase)
            y = y_of(value)
            parts.append(
                f'<rect class="bar" data-config={escape(measurement.case.label)} '
                f"data-phase={escape(phase)} "
                f'x="{x0 + number * bar_width:.1f}" y="{y:.1f}" width="{bar_width - 2}" '
                f'height="{top + plot_height - y:.1f}" fill="{_PHASE_COLORS[phase]}">'
                f"<title>{xml.sax.saxutils.escape(measurement.case.label)}, {phase}: "
                f"{value:.2f}x table</title></rect>"
                f'<text x="{x0 + number * bar_width + (bar_width - 2) / 2:.1f}" '
                f'y="{y - 3:.1f}" text-anchor="middle" font-size="8">{value:.1f}</text>'
            )
        label_x = x0 + bar_width * len(PHASES) / 2
        label_y = top + plot_height + 14
        parts.append(
            f'<text x="{label_x:.1f}" y="{label_y}" text-anchor="end" '
            f'transform="rotate(-30 {label_x:.1f} {label_y})">'
            f"{xml.sax.saxutils.escape(measurement.case.label)}</text>"
        )
    y = y_of(target)
    parts.append(
        f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#c00" '
        f'stroke-dasharray="5,4"/><text x="{width - 12}" y="{y - 4:.1f}" text-anchor="end" '
        f'fill="#c00">target {target:g}x</text>'
    )
    for number, phase in enumerate(PHASES):
        x = left + number * 110
        parts.append(
            f'<rect x="{x}" y="{height - 18}" width="10" height="10" '
            f'fill="{_PHASE_COLORS[phase]}"/><text x="{x + 14}" y="{height - 9}">{phase}</text>'
        )
    parts.append("</svg>\n")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(parts))


# -- the command line ---------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench --memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--vocabs", default="1000000,4000000", help="comma-separated V")
    parser.add_argument("--dim", type=int, default=128, help="row width D")
    parser.add_argument("--steps", type=int, default=10, help="steps of the steady phase")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ids-per-sample", type=int, default=16)
    parser.add_argument("--permitted", type=float, default=0.01, help="fraction permitted")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {VARIANTS}"
    )
    parser.add_argument("--skip-largest", action="store_true", help="no largest-table section")
    parser.add_argument(
        "--confirm",
        default="partial,keras",
        help="variants whose predicted largest table is confirmed by a run ('' for none)",
    )
    parser.add_argument(
        "--budget-gib", type=float, help="memory to predict for (default: MemAvailable now)"
    )
    parser.add_argument("--margin", type=float, default=0.1, help="of the budget, kept free")
    parser.add_argument(
        "--min-available-gib",
        type=float,
        default=0.5,
        help="kill a run when MemAvailable falls under this",
    )
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--svg", help="write a bar chart of the peaks to this SVG file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--marker-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ack-fd", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _describe_machine() -> dict[str, Any]:
    import platform

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_total_bytes": memory_total_bytes(),
        "memory_available_bytes_at_start": memory_available_bytes(),
    }


def _cases(args: argparse.Namespace) -> list[MemoryCase]:
    vocabs = [int(v) for v in args.vocabs.split(",") if v]
    variants = [v for v in args.variants.split(",") if v]
    return [
        MemoryCase(
            variant=variant,
            vocab=vocab,
            width=args.dim,
            permitted_fraction=args.permitted,
            batch=args.batch,
            ids_per_sample=args.ids_per_sample,
            steps=args.steps,
        )
        for vocab in vocabs
        for variant in variants
    ]


def _largest_section(
    measurements: Sequence[MemoryMeasurement], args: argparse.Namespace, stream: TextIO
) -> dict[str, LargestTable]:
    largest = {}
    confirm = [v for v in args.confirm.split(",") if v]
    total = memory_total_bytes()
    for variant in dict.fromkeys(m.case.variant for m in measurements):
        done = [m for m in measurements if m.case.variant == variant and m.ok]
        if not done:
            continue
        budget = int(args.budget_gib * GIB) if args.budget_gib else memory_available_bytes()
        table = predict_largest(
            variant,
            [(m.case.table_bytes, m.peak_bytes) for m in done],
            width=done[0].case.width,
            process_bytes=max(m.baseline_rss_bytes for m in done),
            budget_bytes=budget,
            memory_total_bytes=total,
            margin=args.margin,
        )
        if variant in confirm and table.rows > 0:
            case = dataclasses.replace(done[0].case, vocab=table.rows, steps=3)
            table.confirmation = measure_case(
                case, min_available_bytes=int(args.min_available_gib * GIB)
            )
        report_largest(table, stream)
        largest[variant] = table
    return largest


def run(args: argparse.Namespace, stream: TextIO | None = None) -> MemoryBenchmark:
    """Measures every configuration (one child each), then the largest
    tables; prints as it goes and returns the results."""
    stream = stream or sys.stdout
    machine = _describe_machine()
    stream.write(
        f"partial_embedding memory benchmark: {machine['cpus']} CPUs, "
        f"MemTotal {machine['memory_total_bytes'] / GIB:.1f} GiB, "
        f"MemAvailable {machine['memory_available_bytes_at_start'] / GIB:.1f} GiB\n"
    )
    report_heading(stream)
    measurements = []
    for case in _cases(args):
        measurements.append(
            measure_case(case, min_available_bytes=int(args.min_available_gib * GIB))
        )
        report_measurement(measurements[-1], stream)
    benchmark = MemoryBenchmark(machine=machine, measurements=measurements)
    if not args.skip_largest:
        stream.write("largest table that trains with Adam (predicted, then one run):\n")
        benchmark.largest = _largest_section(measurements, args, stream)
        if benchmark.largest_ratio is not None:
            stream.write(f"largest table, ours / stock Keras: {benchmark.largest_ratio:.2f}x\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(benchmark.to_dict(), handle, indent=2)
    if args.svg:
        first = measurements[0].case if measurements else MemoryCase()
        write_svg(
            measurements,
            args.svg,
            title=f"Peak RssAnon over the baseline per phase, x table: D = {first.width} "
            f"float32, {first.permitted_fraction:.0%} of rows permitted, Adam",
        )
    return benchmark


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        _child_main(args.child, args.marker_fd, args.ack_fd)
        return
    run(args)


if __name__ == "__main__":
    main()
