"""Kernel and training-step benchmarks: ``python -m partial_embedding.bench``.

Times ``masked_scatter_sub`` against TensorFlow's built-in alternatives in the
same run, on the same inputs, and prints ratios (absolute times drift on busy
machines; ratios measured side by side, interleaved, drift much less).

Methods, each updating a [V, D] float32 table with k rows of updates:
  masked_scatter_sub      this library's in-place kernel
  scatter_sub             ``tf.Variable.scatter_sub`` (no mask; the built-in
                          sparse update, which also flips the variable into
                          copy-on-read mode)
  tensor_scatter_nd_sub   ``var.assign(tf.tensor_scatter_nd_sub(var, ...))``
  dense_mask              the gradient-masking workaround's update:
                          ``var.assign_sub(mask[:, None] * dense_update)``

Sections of a run:
  op        the methods above over sweeps of vocabulary size V, row width D,
            ids per step k, duplicate rate and permitted fraction (one factor
            at a time around a base point). The two dense methods cost
            O(V * D) per step; above --dense-limit elements they are skipped
            and the table says so.
  training  a Keras training step, PartialEmbedding + MaskedOptimizer(Adam)
            against stock keras.layers.Embedding + Adam and the other
            baselines of ``partial_embedding.bench_training``.
  gpu       where a GPU is present: through TensorFlow if it sees one, else
            through the TF-free kernel module ``partial_embedding._kernels``
            (CUDA build) on CuPy or PyTorch arrays; with the bandwidth the op
            reaches against a device-to-device copy of as many bytes.

Presets: ``--quick`` (seconds, for tests), ``--full`` (the default: about
five minutes on two cores). Grid flags (--rows, --width, --indices,
--duplicate-rate, --permitted) replace the preset's op sweeps by their
product. Output: a table per sweep, ``--json FILE`` for machines, ``--plot
FILE`` (PNG, needs matplotlib: ``pip install tf-partial-embedding[plot]``).

``--memory`` runs the memory benchmark instead (``partial_embedding.bench_memory``:
peak memory per phase, the largest table that trains); the other flags are
then its own (``--memory --help`` lists them).

The ratio printed next to a time, and ``ratio_vs`` in the JSON, is
masked_scatter_sub's time divided by that method's time: below 1.0 means
masked_scatter_sub is faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import numpy as np
import tensorflow as tf

from partial_embedding.ops import masked_scatter_sub

__all__ = [
    "GpuUnavailable",
    "OpCase",
    "OpTiming",
    "PRESETS",
    "Preset",
    "main",
    "measure_gpu",
    "measure_op_case",
    "parse_args",
    "run",
    "run_op_sweeps",
]

ALL_METHODS = ("masked_scatter_sub", "scatter_sub", "tensor_scatter_nd_sub", "dense_mask")
DENSE_METHODS = ("tensor_scatter_nd_sub", "dense_mask")
BASELINE = "masked_scatter_sub"


@dataclass
class OpCase:
    """One point of the op benchmark grid."""

    num_rows: int = 1_000_000
    width: int = 128
    num_indices: int = 4096
    duplicate_rate: float = 0.0
    permitted_fraction: float = 1.0
    dtype: str = "float32"


@dataclass(frozen=True)
class Preset:
    """How much a run measures."""

    name: str
    sweeps: tuple[tuple[str, tuple[OpCase, ...]], ...]
    rounds: int
    max_repeats: int
    target_seconds: float  # per method and point, all rounds together
    dense_limit: int  # V * D above which the dense methods are skipped
    training: dict[str, Any]
    gpu_sweeps: tuple[tuple[str, tuple[OpCase, ...]], ...]


def _sweep(base: OpCase, field: str, values: Iterable[Any]) -> tuple[OpCase, ...]:
    return tuple(dataclasses.replace(base, **{field: value}) for value in values)


_FULL_VOCAB_BASE = OpCase(num_rows=1_000_000, width=128, num_indices=4096, permitted_fraction=0.5)
_FULL_BASE = dataclasses.replace(_FULL_VOCAB_BASE, num_rows=100_000)
_QUICK_BASE = OpCase(num_rows=10_000, width=32, num_indices=256, permitted_fraction=0.5)

PRESETS = {
    "quick": Preset(
        name="quick",
        sweeps=(
            ("vocab", _sweep(_QUICK_BASE, "num_rows", [10_000, 40_000])),
            ("width", _sweep(_QUICK_BASE, "width", [8])),
            ("duplicates", _sweep(_QUICK_BASE, "duplicate_rate", [0.5])),
        ),
        rounds=3,
        max_repeats=20,
        target_seconds=0.05,
        dense_limit=1 << 20,
        training={
            "vocab": 20_000,
            "width": 16,
            "batch": 32,
            "ids_per_sample": 4,
            "permitted_fraction": 0.5,
            "steps": 3,
            "baseline_steps": 2,
            "warmup": 1,
            "scaling_vocabs": (),
            "seed": 0,
            "update_only_steps": 3,
        },
        gpu_sweeps=(("vocab", _sweep(_QUICK_BASE, "num_rows", [10_000, 40_000])),),
    ),
    "full": Preset(
        name="full",
        sweeps=(
            (
                "vocab",
                _sweep(
                    _FULL_VOCAB_BASE,
                    "num_rows",
                    [10_000, 30_000, 100_000, 300_000, 1_000_000, 4_000_000],
                ),
            ),
            ("width", _sweep(_FULL_BASE, "width", [16, 64, 512])),
            ("ids per step", _sweep(_FULL_BASE, "num_indices", [256, 65_536])),
            ("duplicates", _sweep(_FULL_BASE, "duplicate_rate", [0.5, 0.9])),
            ("permitted", _sweep(_FULL_BASE, "permitted_fraction", [0.01, 1.0])),
        ),
        rounds=5,
        max_repeats=200,
        target_seconds=1.0,
        dense_limit=1_000_000 * 128,
        # The setting of the training-step target in issue 5.
        training={
            "vocab": 1_000_000,
            "width": 128,
            "batch": 256,
            "ids_per_sample": 16,
            "permitted_fraction": 0.5,
            "steps": 50,
            "baseline_steps": 5,
            "warmup": 3,
            "scaling_vocabs": (100_000, 4_000_000),
            "seed": 0,
            "update_only_steps": 50,
        },
        gpu_sweeps=(
            (
                "vocab",
                _sweep(
                    _FULL_VOCAB_BASE,
                    "num_rows",
                    [10_000, 100_000, 1_000_000, 4_000_000, 16_000_000],
                ),
            ),
            (
                "ids per step",
                _sweep(_FULL_VOCAB_BASE, "num_indices", [256, 65_536, 1_048_576]),
            ),
        ),
    ),
}


# -- the op benchmark -----------------------------------------------------------


def _make_inputs(case: OpCase, seed: int) -> dict[str, tf.Tensor]:
    rng = np.random.default_rng(seed)
    distinct = max(1, int(round(case.num_indices * (1.0 - case.duplicate_rate))))
    pool = rng.choice(case.num_rows, size=min(distinct, case.num_rows), replace=False)
    indices = rng.choice(pool, size=case.num_indices)
    mask = rng.random(case.num_rows) < case.permitted_fraction
    updates = rng.standard_normal((case.num_indices, case.width), dtype=np.float32)
    return {
        "indices": tf.constant(indices, tf.int64),
        "updates": tf.constant(updates, case.dtype),
        "row_mask": tf.constant(mask),
    }


def _method_step(
    method: str, table: tf.Variable, inputs: dict[str, tf.Tensor]
) -> Callable[[], None]:
    indices, updates, row_mask = inputs["indices"], inputs["updates"], inputs["row_mask"]

    if method == "masked_scatter_sub":

        @tf.function
        def step() -> None:
            masked_scatter_sub(table, indices, updates, row_mask)

    elif method == "scatter_sub":
        slices = tf.IndexedSlices(updates, indices, tf.shape(table, out_type=tf.int64))

        @tf.function
        def step() -> None:
            table.scatter_sub(slices)

    elif method == "tensor_scatter_nd_sub":

        @tf.function
        def step() -> None:
            table.assign(tf.tensor_scatter_nd_sub(table, indices[:, None], updates))

    elif method == "dense_mask":

        @tf.function
        def step() -> None:
            dense = tf.scatter_nd(indices[:, None], updates, tf.shape(table, out_type=tf.int64))
            table.assign_sub(tf.cast(row_mask, table.dtype)[:, None] * dense)

    else:
        raise ValueError(f"method: unknown method {method!r}; choose from {ALL_METHODS}")
    return step


def _synchronizer(table: tf.Variable) -> Callable[[], None]:
    """Waits for the table's pending updates (GPU kernels run asynchronously).

    Gathers one row rather than reading the table: a full read would copy a
    table that scatter_sub switched into copy-on-read mode.
    """
    first_row = tf.constant([0], tf.int64)

    def wait() -> None:
        table.sparse_read(first_row).numpy()

    return wait


def _no_wait() -> None:
    pass


def _seconds_per_call(step: Callable[[], None], wait: Callable[[], None], count: int) -> float:
    """Runs ``step`` ``count`` times, waits for it, returns the seconds per call."""
    start = time.perf_counter()
    for _ in range(count):
        step()
    wait()
    return (time.perf_counter() - start) / count


def _fitting_repeats(
    step: Callable[[], None],
    wait: Callable[[], None],
    repeats: int,
    rounds: int,
    target_seconds: float | None,
) -> int:
    """At most ``repeats``, fewer where ``rounds`` rounds of them would take
    longer than ``target_seconds`` together."""
    if target_seconds is None:
        return repeats
    once = max(_seconds_per_call(step, wait, 1), 1e-7)
    return max(1, min(repeats, int(target_seconds / (rounds * once))))


def _time_methods(
    case: OpCase,
    methods: Sequence[str],
    repeats: int,
    rounds: int,
    seed: int,
    target_seconds: float | None,
    synchronize: bool,
) -> tuple[dict[str, float], dict[str, int]]:
    """Median seconds per step of each method, measured in interleaved
    rounds, and the repeats each ran per round."""
    inputs = _make_inputs(case, seed)
    initial = tf.random.stateless_normal(
        [case.num_rows, case.width], seed=[seed, 1], dtype=case.dtype
    )
    steps: dict[str, Callable[[], None]] = {}
    waits: dict[str, Callable[[], None]] = {}
    repeats_of: dict[str, int] = {}
    for method in methods:
        table = tf.Variable(initial)
        steps[method] = _method_step(method, table, inputs)
        waits[method] = _synchronizer(table) if synchronize else _no_wait
        steps[method]()  # trace and warm up
        waits[method]()
        repeats_of[method] = _fitting_repeats(
            steps[method], waits[method], repeats, rounds, target_seconds
        )
    del initial
    samples: dict[str, list[float]] = {method: [] for method in methods}
    for _ in range(rounds):
        for method in methods:
            samples[method].append(
                _seconds_per_call(steps[method], waits[method], repeats_of[method])
            )
    seconds = {method: statistics.median(values) for method, values in samples.items()}
    return seconds, repeats_of


def time_op_case(
    case: OpCase,
    methods: tuple[str, ...] = ("masked_scatter_sub", "scatter_sub"),
    repeats: int = 50,
    rounds: int = 5,
    seed: int = 0,
    target_seconds: float | None = None,
) -> dict[str, float]:
    """Median seconds per step of each method, measured interleaved in rounds.

    Each method updates its own copy of the table, so the built-in scatter's
    switch into copy-on-read mode cannot slow the others down. With
    ``target_seconds``, each method runs at most ``repeats`` steps per round,
    fewer where a step is slow, so that its rounds take about that long.
    """
    seconds, _ = _time_methods(case, methods, repeats, rounds, seed, target_seconds, False)
    return seconds


def _skip_reason(method: str, case: OpCase, dense_limit: int | None) -> str | None:
    if dense_limit is not None and method in DENSE_METHODS:
        if case.num_rows * case.width > dense_limit:
            return f"O(V*D) per step; skipped above V*D = {dense_limit:,}"
    return None


@dataclass(frozen=True)
class OpTiming:
    """How the op benchmark times each point (see ``run_op_benchmark``)."""

    repeats: int
    rounds: int
    target_seconds: float | None = None
    dense_limit: int | None = None


def measure_op_case(
    case: OpCase, methods: tuple[str, ...], timing: OpTiming, sweep: str = "grid"
) -> dict[str, Any]:
    """Times one point; returns its row (see ``run_op_benchmark``).

    ``methods`` must include ``BASELINE``, which the ratios divide.
    """
    skipped = {m: r for m in methods if (r := _skip_reason(m, case, timing.dense_limit))}
    timed_methods = tuple(m for m in methods if m not in skipped)
    measured, repeats_of = _time_methods(
        case, timed_methods, timing.repeats, timing.rounds, 0, timing.target_seconds, False
    )
    seconds: dict[str, float | None] = {m: measured.get(m) for m in methods}
    base = measured[BASELINE]
    return {
        **asdict(case),
        "sweep": sweep,
        "seconds": seconds,
        "ratio_vs": {m: (base / s if s else None) for m, s in seconds.items()},
        "repeats": repeats_of,
        "rounds": timing.rounds,
        "skipped": skipped,
    }


def _format_ms(seconds: float | None, ratio: float | None) -> str:
    if seconds is None:
        return "skipped"
    return f"{seconds * 1e3:9.3f}ms ({ratio:5.2f}x)"


def _op_table_heading(methods: Sequence[str], sweep: str) -> str:
    header = f"{'V':>9} {'D':>4} {'k':>7} {'dup':>4} {'perm':>4} " + " ".join(
        f"{m:>22}" for m in methods
    )
    return f"-- op sweep: {sweep}\n{header}\n"


def _op_table_line(row: dict[str, Any], methods: Sequence[str]) -> str:
    cells = [_format_ms(row["seconds"][m], row["ratio_vs"][m]) for m in methods]
    return (
        f"{row['num_rows']:>9} {row['width']:>4} {row['num_indices']:>7} "
        f"{row['duplicate_rate']:>4.2f} {row['permitted_fraction']:>4.2f} "
        + " ".join(f"{c:>22}" for c in cells)
        + "\n"
    )


def run_op_benchmark(
    cases: list[OpCase],
    methods: tuple[str, ...],
    repeats: int,
    rounds: int,
    *,
    target_seconds: float | None = None,
    dense_limit: int | None = None,
    sweep: str = "grid",
    stream: TextIO | None = None,
) -> list[dict]:
    """Times every case, prints a table with ratios, returns the rows.

    Each row holds the case, ``seconds`` per method (None where skipped),
    ``ratio_vs`` (masked_scatter_sub's seconds / the method's), ``repeats``
    and ``skipped`` (the reason, per skipped method).
    """
    stream = stream or sys.stdout
    methods = tuple(dict.fromkeys([BASELINE, *methods]))
    timing = OpTiming(repeats, rounds, target_seconds, dense_limit)
    stream.write(_op_table_heading(methods, sweep))
    rows = []
    for case in cases:
        rows.append(measure_op_case(case, methods, timing, sweep))
        stream.write(_op_table_line(rows[-1], methods))
        stream.flush()
    return rows


def run_op_sweeps(
    sweeps: Sequence[tuple[str, Sequence[OpCase]]],
    methods: tuple[str, ...],
    timing: OpTiming,
    stream: TextIO,
) -> list[dict]:
    """``run_op_benchmark`` over each sweep, then the ratios' legend; all rows."""
    rows = []
    for sweep_name, cases in sweeps:
        rows += run_op_benchmark(
            list(cases),
            methods,
            timing.repeats,
            timing.rounds,
            target_seconds=timing.target_seconds,
            dense_limit=timing.dense_limit,
            sweep=sweep_name,
            stream=stream,
        )
    stream.write(
        "(x) = masked_scatter_sub time / method time: below 1.0 means "
        "masked_scatter_sub is faster\n"
    )
    return rows


# -- the training-step benchmark -------------------------------------------------


def _training_function() -> Callable[..., dict] | None:
    """``bench_training.run_benchmark``, or None where that module is absent."""
    try:
        module = importlib.import_module("partial_embedding.bench_training")
    except ImportError:
        return None
    function = getattr(module, "run_benchmark", None)
    return function if callable(function) else None


def _optional_cell(value: float | None, spec: str, width: int) -> str:
    return f"{'n/a' if value is None else format(value, spec):>{width}}"


def report_training(result: dict[str, Any], stream: TextIO) -> None:
    """Prints ``bench_training.run_benchmark``'s figures as a table."""
    partial_ms = result["variants"]["partial"]["step_ms"]
    stream.write(
        f"{'variant':<18} {'ms/step':>10} {'x partial':>10} {'peak MiB':>9} "
        f"{'TF tmp MiB':>10} {'steps':>6}\n"
    )
    for variant, figures in result["variants"].items():
        stream.write(
            f"{variant:<18} {figures['step_ms']:10.3f} {figures['step_ms'] / partial_ms:10.2f} "
            f"{_optional_cell(figures.get('peak_rss_growth_mib'), '9.1f', 9)} "
            f"{_optional_cell(figures.get('peak_step_alloc_mib'), '10.1f', 10)} "
            f"{figures['steps']:>6}\n"
        )
    update_only = result.get("update_only") or {}
    if update_only:
        stream.write(
            f"optimizer update alone: partial {update_only['partial']:.3f} ms, "
            f"stock_tf {update_only['stock_tf']:.3f} ms "
            f"({update_only['stock_tf_over_partial']:.1f}x)\n"
        )
    if "partial_xla" in update_only:
        stream.write(
            f"optimizer update alone under XLA: partial_xla {update_only['partial_xla']:.3f} ms "
            f"({update_only['partial_xla_over_partial']:.2f}x partial)\n"
        )
    xla_scaling = result.get("xla_scaling") or {}
    xla_over_partial = result.get("xla_over_partial_by_vocab") or {}
    for vocab, step_ms in sorted(result.get("scaling", {}).items()):
        line = f"partial at V = {vocab:>10,}: {step_ms:8.3f} ms/step"
        if vocab in xla_scaling and vocab in xla_over_partial:
            line += (
                f", partial_xla {xla_scaling[vocab]:8.3f} ms/step "
                f"({xla_over_partial[vocab]:.2f}x partial)"
            )
        stream.write(line + "\n")
    for name, key in (("partial", "scaling_ratio"), ("partial_xla", "xla_scaling_ratio")):
        if result.get(key) is not None:
            stream.write(f"{name} step time, largest V / smallest V: {result[key]:.2f}x\n")
    stream.flush()


def run_training_section(settings: dict[str, Any], stream: TextIO) -> dict | None:
    """Times a Keras training step through ``bench_training.run_benchmark``.

    Prints each variant's step time, its ratio to PartialEmbedding +
    MaskedOptimizer, its peak memory growth, and PartialEmbedding's step time
    at other vocabulary sizes. Returns run_benchmark's dict, or None (with a
    note) where bench_training is not available.
    """
    function = _training_function()
    if function is None:
        stream.write("-- training step: partial_embedding.bench_training is absent; skipped\n")
        return None
    stream.write(
        f"-- training step: V = {settings['vocab']:,}, D = {settings['width']}, batch "
        f"{settings['batch']} x {settings['ids_per_sample']} ids, "
        f"{settings['permitted_fraction']:.0%} of rows permitted, Adam\n"
    )
    stream.flush()
    result = function(verbose=False, **settings)
    report_training(result, stream)
    return result


# -- the GPU benchmark ----------------------------------------------------------


def _moved_bytes(case: OpCase, inputs: dict[str, np.ndarray], itemsize: int) -> int:
    """The fewest bytes a masked scatter of these inputs must read and write.

    Every id and its mask entry are read; each permitted occurrence's update
    row is read; each distinct permitted row of the table is read and written.
    """
    indices, row_mask = inputs["indices"], inputs["row_mask"]
    permitted = row_mask[indices]
    distinct_rows = np.unique(indices[permitted]).size
    row_bytes = case.width * itemsize
    return int(
        indices.size * (indices.itemsize + 1)
        + int(permitted.sum()) * row_bytes
        + 2 * distinct_rows * row_bytes
    )


def _numpy_inputs(case: OpCase, seed: int) -> dict[str, np.ndarray]:
    return {key: value.numpy() for key, value in _make_inputs(case, seed).items()}


def _gpu_row(case: OpCase, backend: str, op_ms: float, copy_ms: float, moved: int) -> dict:
    return {
        **asdict(case),
        "backend": backend,
        "op_ms": op_ms,
        "copy_ms": copy_ms,
        "moved_bytes": moved,
        "op_GBps": moved / (op_ms * 1e-3) / 1e9,
        "copy_GBps": moved / (copy_ms * 1e-3) / 1e9,
        "fraction_of_copy": copy_ms / op_ms,
    }


def _tf_copy_ms(moved: int, preset: Preset) -> float:
    """Median ms of a copy of as many bytes as the op must move (half read,
    half written), through TensorFlow on the current device."""
    source = tf.Variable(tf.zeros([max(1, moved // 8)], tf.float32))
    target = tf.Variable(tf.zeros([max(1, moved // 8)], tf.float32))

    @tf.function
    def copy() -> None:
        target.assign(source)

    copy()
    wait = _synchronizer(target)
    samples = [_seconds_per_call(copy, wait, preset.max_repeats) for _ in range(preset.rounds)]
    return statistics.median(samples) * 1e3


def _gpu_through_tensorflow(cases: Sequence[OpCase], preset: Preset) -> list[dict]:
    rows = []
    with tf.device("/GPU:0"):
        for case in cases:
            methods = tuple(m for m in ALL_METHODS if not _skip_reason(m, case, preset.dense_limit))
            seconds, _ = _time_methods(
                case, methods, preset.max_repeats, preset.rounds, 0, preset.target_seconds, True
            )
            moved = _moved_bytes(case, _numpy_inputs(case, 0), np.dtype(case.dtype).itemsize)
            copy_ms = _tf_copy_ms(moved, preset)
            row = _gpu_row(case, "tensorflow", seconds[BASELINE] * 1e3, copy_ms, moved)
            row["seconds"] = seconds
            rows.append(row)
    return rows


def _gpu_array_library() -> tuple[str, Any] | None:
    for name in ("cupy", "torch"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if name == "torch" and not module.cuda.is_available():
            continue
        return name, module
    return None


def _gpu_through_kernel_module(cases: Sequence[OpCase], kernels: Any, preset: Preset) -> list[dict]:
    found = _gpu_array_library()
    if found is None:
        raise RuntimeError("the kernel module needs CuPy or PyTorch (CUDA) for device arrays")
    library_name, library = found

    def to_device(array: np.ndarray) -> Any:
        if library_name == "cupy":
            return library.asarray(array)
        return library.from_numpy(np.ascontiguousarray(array)).cuda()

    def zeros(count: int) -> Any:
        if library_name == "cupy":
            return library.zeros(count, dtype=library.float32)
        return library.zeros(count, dtype=library.float32, device="cuda")

    rows = []
    for case in cases:
        host = _numpy_inputs(case, 0)
        rng = np.random.default_rng(1)
        table = to_device(rng.standard_normal((case.num_rows, case.width), dtype=np.float32))
        indices, updates, row_mask = (
            to_device(host[k]) for k in ("indices", "updates", "row_mask")
        )
        op_ms = kernels.time_masked_scatter_sub_gpu(
            table, indices, updates, row_mask, warmup=3, repeats=preset.max_repeats
        )
        moved = _moved_bytes(case, host, 4)
        source, target = zeros(max(1, moved // 8)), zeros(max(1, moved // 8))
        copy_ms = kernels.time_device_copy_gpu(target, source, warmup=3, repeats=preset.max_repeats)
        rows.append(_gpu_row(case, f"_kernels ({library_name})", op_ms, copy_ms, moved))
        del table, indices, updates, row_mask, source, target
    return rows


class GpuUnavailable(RuntimeError):
    """There is no GPU to time the op on (the message says why)."""


def _cuda_kernel_module() -> Any:
    """``partial_embedding._kernels`` where it has CUDA and sees a GPU.

    Raises:
      GpuUnavailable: it is absent, built without CUDA, or sees no GPU.
    """
    try:
        kernels = importlib.import_module("partial_embedding._kernels")
    except ImportError:
        kernels = None
    if kernels is None or not getattr(kernels, "HAS_CUDA", False):
        raise GpuUnavailable("TensorFlow sees no GPU and _kernels has no CUDA")
    if not kernels.cuda_device_available():
        raise GpuUnavailable("_kernels has CUDA but sees no GPU")
    return kernels


def measure_gpu(preset: Preset) -> dict[str, Any]:
    """Times the op on a GPU: through TensorFlow where it sees one, else
    through the kernel module; returns ``{"device": ..., "rows": [...]}``.

    Raises:
      GpuUnavailable: neither TensorFlow nor the kernel module sees a GPU.
    """
    cases = [case for _, sweep_cases in preset.gpu_sweeps for case in sweep_cases]
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        description = str(tf.config.experimental.get_device_details(gpus[0]))
        return {"device": description, "rows": _gpu_through_tensorflow(cases, preset)}
    kernels = _cuda_kernel_module()
    description = kernels.cuda_device_description()
    return {"device": description, "rows": _gpu_through_kernel_module(cases, kernels, preset)}


def report_gpu(gpu: dict[str, Any], stream: TextIO) -> None:
    """Prints ``measure_gpu``'s rows: the op's time and bandwidth against a copy's."""
    stream.write(f"-- gpu: {gpu['device']}\n")
    stream.write(
        f"{'V':>10} {'D':>4} {'k':>8} {'op ms':>9} {'GB/s':>8} {'copy ms':>9} {'copy GB/s':>9} "
        f"{'of copy':>7}\n"
    )
    for row in gpu["rows"]:
        stream.write(
            f"{row['num_rows']:>10} {row['width']:>4} {row['num_indices']:>8} "
            f"{row['op_ms']:9.4f} {row['op_GBps']:8.1f} {row['copy_ms']:9.4f} "
            f"{row['copy_GBps']:9.1f} {row['fraction_of_copy']:7.2f}\n"
        )


def run_gpu_section(preset: Preset, stream: TextIO) -> dict[str, Any] | None:
    """Times the op on a GPU where there is one; None (and a note) otherwise."""
    try:
        gpu = measure_gpu(preset)
    except GpuUnavailable as reason:
        stream.write(f"-- gpu: {reason}; skipped\n")
        return None
    report_gpu(gpu, stream)
    return gpu


# -- machine, plot, command line ------------------------------------------------


def describe_machine() -> dict[str, Any]:
    """The facts a reader needs to weigh the figures."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable_cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable_cores = os.cpu_count() or 0
    return {
        "cpu_model": model,
        "usable_cores": usable_cores,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads() or "default",
        # Other processes' load skews absolute times (ratios less so).
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _log_axes(axes: Any, ticker: Any) -> None:
    axes.set_xscale("log")
    axes.set_yscale("log")
    # Plain numbers on the axes: "0.1, 1, 10 ms" reads better than 10^-1.
    axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axes.set_xlabel("vocabulary size V (rows)")
    axes.grid(True, which="both", alpha=0.3)


def _plot_op_panel(axes: Any, op_rows: list[dict], title: str, ticker: Any) -> None:
    """Time per update step against V, one line per method (the vocab sweep)."""
    rows = [row for row in op_rows if row["sweep"] == "vocab"] or op_rows
    rows = sorted(rows, key=lambda row: row["num_rows"])
    methods = list(dict.fromkeys(m for row in rows for m in row["seconds"]))
    for method in methods:
        points = [
            (row["num_rows"], row["seconds"][method] * 1e3)
            for row in rows
            if row["seconds"].get(method) is not None
        ]
        if points:
            xs, ys = zip(*points)
            axes.plot(xs, ys, marker="o", label=method)
    _log_axes(axes, ticker)
    axes.set_ylabel("time per update step (ms)")
    if rows:
        first = rows[0]
        axes.set_title(
            title
            or f"update op: D = {first['width']}, k = {first['num_indices']:,} ids, "
            f"{first['permitted_fraction']:.0%} of rows permitted"
        )
    axes.legend()


def _plot_training_panel(axes: Any, training: dict, ticker: Any) -> None:
    """Training step time: ``partial`` (and ``partial_xla``) at every V it was
    timed at, the other variants at the comparison's V."""
    config = training["config"]
    lines = {
        "partial": ("scaling", "partial (PartialEmbedding + MaskedOptimizer)"),
        "partial_xla": ("xla_scaling", "partial_xla (the same, jit_compile=True)"),
    }
    for key, label in lines.values():
        scaling = sorted((int(v), ms) for v, ms in (training.get(key) or {}).items())
        if scaling:
            xs, ys = zip(*scaling)
            axes.plot(xs, ys, marker="o", label=label)
    for variant, figures in training["variants"].items():
        if variant not in lines or not training.get(lines[variant][0]):
            axes.plot([config["vocab"]], [figures["step_ms"]], marker="s", ls="", label=variant)
    _log_axes(axes, ticker)
    axes.set_ylabel("time per training step (ms)")
    axes.set_title(
        f"Keras training step, Adam: D = {config['width']}, batch {config['batch']} x "
        f"{config['ids_per_sample']} ids"
    )
    # Between the fast variants (bottom) and the dense ones (top).
    axes.legend(loc="center right")


def write_plot(
    op_rows: list[dict],
    path: str,
    title: str = "",
    training: dict | None = None,
    machine: dict | None = None,
) -> bool:
    """Time per step against V, log-log, one line per method (the vocab sweep).

    With ``training`` (bench_training's dict), a second panel shows the
    training step: PartialEmbedding + MaskedOptimizer at every V it was timed
    at, the other variants at the comparison's V. Returns False (and writes
    nothing) where matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    panels = 2 if training else 1
    figure, all_axes = plt.subplots(1, panels, figsize=(7 * panels, 4.8), dpi=110, squeeze=False)
    _plot_op_panel(all_axes[0][0], op_rows, title, matplotlib.ticker)
    if training:
        _plot_training_panel(all_axes[0][1], training, matplotlib.ticker)
    if machine:
        figure.suptitle(
            f"CPU: {machine['cpu_model']}, {machine['usable_cores']} cores, "
            f"TensorFlow {machine['tensorflow']}",
            fontsize="medium",
        )
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True


def _custom_grid(args: argparse.Namespace) -> list[OpCase] | None:
    given = [args.rows, args.width, args.indices, args.duplicate_rate, args.permitted]
    if all(value is None for value in given):
        return None
    defaults = OpCase()
    return [
        OpCase(v, d, k, dup, perm)
        for v in args.rows or [defaults.num_rows]
        for d in args.width or [defaults.width]
        for k in args.indices or [defaults.num_indices]
        for dup in args.duplicate_rate or [defaults.duplicate_rate]
        for perm in args.permitted or [defaults.permitted_fraction]
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m partial_embedding.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="a few seconds (for tests)")
    preset.add_argument("--full", action="store_true", help="the default grid (minutes)")
    parser.add_argument("--rows", type=int, nargs="+", help="vocabulary sizes V")
    parser.add_argument("--width", type=int, nargs="+", help="row widths D")
    parser.add_argument("--indices", type=int, nargs="+", help="indices per update k")
    parser.add_argument("--duplicate-rate", type=float, nargs="+")
    parser.add_argument("--permitted", type=float, nargs="+", help="fraction of rows permitted")
    parser.add_argument("--methods", nargs="+", default=list(ALL_METHODS), choices=ALL_METHODS)
    parser.add_argument("--repeats", type=int, help="most steps per round and method")
    parser.add_argument("--rounds", type=int)
    parser.add_argument(
        "--target-seconds",
        type=float,
        help="time per method and point; slow methods run fewer repeats (0: always --repeats)",
    )
    parser.add_argument(
        "--dense-limit", type=int, help="skip the dense methods above this V * D (0: never)"
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="run the memory benchmark instead (its own flags: --memory --help)",
    )
    parser.add_argument("--no-op", action="store_true", help="skip the op benchmark")
    parser.add_argument("--no-training", action="store_true", help="skip the training step")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU section")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--plot", help="also write a PNG plot (needs matplotlib)")
    return parser.parse_args(argv)


def _op_timing(args: argparse.Namespace, preset: Preset) -> OpTiming:
    """The preset's timing, with what the flags replace (0: no target, no limit)."""
    target = preset.target_seconds if args.target_seconds is None else args.target_seconds
    dense_limit = preset.dense_limit if args.dense_limit is None else args.dense_limit
    return OpTiming(
        repeats=args.repeats or preset.max_repeats,
        rounds=args.rounds or preset.rounds,
        target_seconds=target or None,
        dense_limit=dense_limit or None,
    )


def _write_outputs(result: dict[str, Any], args: argparse.Namespace, stream: TextIO) -> None:
    """``--json`` and ``--plot``, where asked for."""
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2, default=str)
    if not args.plot:
        return
    if not result["op"]:
        stream.write("--plot: no op results to plot\n")
    elif not write_plot(
        result["op"], args.plot, training=result.get("training"), machine=result["machine"]
    ):
        stream.write(
            "--plot: matplotlib is not installed; pip install 'tf-partial-embedding[plot]'\n"
        )


def run(args: argparse.Namespace, stream: TextIO | None = None) -> dict[str, Any]:
    """Runs the sections the arguments ask for; returns what the JSON holds."""
    stream = stream or sys.stdout
    preset = PRESETS["quick" if args.quick else "full"]
    machine = describe_machine()
    stream.write(
        f"partial_embedding bench ({preset.name}): {machine['cpu_model']}, "
        f"{machine['usable_cores']} usable cores, TensorFlow {machine['tensorflow']}\n"
    )
    custom = _custom_grid(args)
    result: dict[str, Any] = {
        "preset": preset.name if custom is None else "custom",
        "machine": machine,
        "ratio_definition": "ratio_vs[m] = seconds['masked_scatter_sub'] / seconds[m]",
        "op": [],
    }
    started = time.perf_counter()
    if not args.no_op:
        sweeps = (("grid", tuple(custom)),) if custom is not None else preset.sweeps
        methods = tuple(dict.fromkeys([BASELINE, *args.methods]))
        result["op"] = run_op_sweeps(sweeps, methods, _op_timing(args, preset), stream)
    if not args.no_training:
        result["training"] = run_training_section(preset.training, stream)
    if not args.no_gpu:
        result["gpu"] = run_gpu_section(preset, stream)
    result["total_seconds"] = time.perf_counter() - started
    if hasattr(os, "getloadavg"):
        result["machine"]["load_average_at_end"] = list(os.getloadavg())
    _write_outputs(result, args, stream)
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--memory" in argv:
        from partial_embedding import bench_memory

        bench_memory.main([arg for arg in argv if arg != "--memory"])
        return
    run(parse_args(argv))


if __name__ == "__main__":
    main()
