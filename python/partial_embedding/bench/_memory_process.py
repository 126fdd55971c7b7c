"""One case of the memory benchmark in a process of its own, from both ends.

The parent (``measure_case``) starts a child (this module as ``__main__``),
samples the child's anonymous memory (``RssAnon`` of ``/proc/<pid>/status``)
about every millisecond from outside it, and attributes each sample to the
phase the child last announced. The child builds and trains one
``MemoryCase``, announcing each phase over a pipe and waiting for the answer,
so each sample belongs to exactly one phase; its last line carries its own
figures. Both ends of that protocol live here.
"""

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from partial_embedding.bench._models import INT8_VARIANTS

VARIANTS = ("partial", "partial_mmap", "keras", "stock_tf", "int8_quantize", "int8_mmap")
#: Known to the benchmark but not run by default: an int8 layer built from
#: its initializer (no float file), for the largest tables.
EXTRA_VARIANTS = ("int8_init",)
# A self-check of the sampler, not a configuration: a table-sized NumPy
# array allocated, filled and freed at once (three times over).
TRANSIENT = "numpy_transient"
#: Every name ``--variants`` and ``measure_case`` take.
RUNNABLE_VARIANTS = (*VARIANTS, *EXTRA_VARIANTS, TRANSIENT)
PHASES = ("construction", "first_step", "steady")
VARIANT_LABELS = {
    "partial": "PartialEmbedding + MaskedOptimizer(Adam)",
    "partial_mmap": 'the same, weights=np.load(..., mmap_mode="r")',
    "keras": "stock keras.layers.Embedding + Adam",
    "stock_tf": "stock TF ops, lazy Adam",
    "int8_quantize": 'PartialEmbedding, then layer.quantize("int8")',
    "int8_mmap": 'PartialEmbedding(dtype="int8_from_float32", weights=np.load(mmap))',
    "int8_init": 'PartialEmbedding(dtype="int8_from_float32"), initializer',
    TRANSIENT: "a table-sized NumPy array, allocated and freed",
}
MIB = 2**20
GIB = 2**30
#: The phase a child announces when it has finished.
END = "end"


def short_count(count: int) -> str:
    if count % 1_000_000 == 0:
        return f"{count // 1_000_000}M"
    if count % 1_000 == 0:
        return f"{count // 1_000}k"
    if count > 1 and count & (count - 1) == 0:
        return f"2^{count.bit_length() - 1}"
    return f"{count:,}"


@dataclasses.dataclass(frozen=True)
class MemoryCase:
    """One configuration, measured in a process of its own.

    Attributes:
      variant: One of ``VARIANTS`` or ``EXTRA_VARIANTS`` (or ``"numpy_transient"``).
      vocab, width: The table is ``vocab x width`` float32 (int8 variants
        hold it in int8, but their figures are multiples of the float32 table).
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
        return f"{self.variant} V={short_count(self.vocab)}"


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
      child_figures: What the child reported of itself: the bytes of each
        variable of the layer and the optimizer, the allocators' figures at
        the end, and for int8 variants whether a sample of frozen rows kept
        its int8 bytes and scales.
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
    child_figures: dict[str, Any] = dataclasses.field(default_factory=dict)

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
    def steady_multiple(self) -> float:
        """What the process still held after the steady steps (``RssAnon``
        when the steady phase ended, over the baseline), x table."""
        return self.phase_end_bytes.get("steady", 0) / self.case.table_bytes

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
        result["steady_multiple"] = self.steady_multiple
        return result


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
        __name__ if __name__ != "__main__" else "partial_embedding.bench._memory_process",
        json.dumps(spec),
        str(markers),
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


def _make_embedding(case: MemoryCase, permitted: np.ndarray, weights: Any) -> tuple[Any, Any]:
    """The case's embedding layer and its optimizer."""
    import keras

    from partial_embedding.layers import PartialEmbedding
    from partial_embedding.optimizers import MaskedOptimizer

    if case.variant == "keras":
        return keras.layers.Embedding(case.vocab, case.width), keras.optimizers.Adam()
    if case.variant in INT8_VARIANTS:
        from partial_embedding.bench._models import int8_embedding

        embedding = int8_embedding(case.variant, case.vocab, case.width, permitted, weights)
    else:
        embedding = PartialEmbedding(
            case.vocab, case.width, trainable_ids=permitted, weights=weights
        )
    return embedding, MaskedOptimizer(keras.optimizers.Adam())


def _run_keras_case(case: MemoryCase, mark: Callable[[str], None], weights: Any) -> dict[str, Any]:
    """Builds, compiles and fits the pooling model; returns the child's own
    figures: its optimizer's bytes, each variable's bytes, the allocators'
    figures and (int8) whether a sample of frozen rows kept its bytes."""
    from partial_embedding.bench._models import (
        FrozenSample,
        allocator_figures,
        pooled_model,
        variable_bytes,
    )

    ids, targets = _training_data(case)
    permitted = _permitted_rows(case)
    mark("construction")
    embedding, optimizer = _make_embedding(case, permitted, weights)
    model = pooled_model(embedding, case.ids_per_sample)
    model.compile(optimizer=optimizer, loss="mse")
    sample = FrozenSample(embedding, seed=case.seed) if case.variant in INT8_VARIANTS else None
    mark("first_step")
    first = slice(0, case.batch)
    model.fit(ids[first], targets[first], batch_size=case.batch, epochs=1, verbose=0)
    mark("steady")
    rest = slice(case.batch, None)
    if case.steps:
        model.fit(
            ids[rest], targets[rest], batch_size=case.batch, epochs=1, shuffle=False, verbose=0
        )
    mark(END)
    # MaskedOptimizer's compact slots are not among `variables`.
    optimizer_variables = [
        *optimizer.variables,
        *getattr(optimizer, "compact_slot_variables", []),
    ]
    figures: dict[str, Any] = {
        "optimizer_bytes": _variables_bytes(optimizer_variables),
        "layer_variables": variable_bytes(embedding.variables),
        "optimizer_variables": variable_bytes(optimizer_variables),
        "allocator": allocator_figures(),
    }
    if sample is not None:
        figures.update(
            frozen_sample_rows=len(sample.ids), frozen_sample_unchanged=sample.unchanged()
        )
    return figures


def _run_stock_tf_case(case: MemoryCase, mark: Callable[[str], None]) -> dict[str, Any]:
    import tensorflow as tf

    from partial_embedding.bench._models import stock_tf_step

    ids, targets = _training_data(case)
    row_mask = np.zeros(case.vocab, dtype=bool)
    row_mask[_permitted_rows(case)] = True
    mark("construction")
    step, holders = stock_tf_step(case.vocab, case.width, row_mask, case.ids_per_sample)
    mark("first_step")
    for i in range(case.steps + 1):
        if i == 1:
            mark("steady")
        batch = slice(i * case.batch, (i + 1) * case.batch)
        step(tf.constant(ids[batch]), tf.constant(targets[batch])).numpy()
    if case.steps == 0:
        mark("steady")
    mark(END)
    # The lazy Adam's two moments, its step count, and the head's optimizer.
    first, second, _mask, step_count, _head, head_optimizer = holders[1:]
    variables = [first, second, step_count, *head_optimizer.variables]
    return {"optimizer_bytes": _variables_bytes(variables)}


def _run_transient(case: MemoryCase, mark: Callable[[str], None]) -> dict[str, Any]:
    mark("construction")
    # Three times, each freed at once: a sampler that a busy machine holds
    # back for a moment still gets a chance at one of them.
    for _ in range(3):
        table = np.ones((case.vocab, case.width), dtype=np.float32)
        del table
    mark("first_step")
    mark("steady")
    mark(END)
    return {"optimizer_bytes": 0}


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
        if case.variant in INT8_VARIANTS:
            table = np.zeros((tiny.vocab, tiny.width), np.float32) + 0.01
            _run_keras_case(tiny, lambda phase: None, table)
    keras.backend.clear_session()
    gc.collect()


def child_main(spec_json: str, markers: int, acks: int) -> None:
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
        figures = _run_transient(case, mark)
    elif case.variant == "stock_tf":
        figures = _run_stock_tf_case(case, mark)
    else:
        weights = None if weights_path is None else np.load(weights_path, mmap_mode="r")
        figures = _run_keras_case(case, mark, weights)
    mark.result(figures)


if __name__ == "__main__":
    child_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
