"""The op benchmark on a GPU: through TensorFlow, or through the TF-free kernel module.

``measure_gpu`` returns the figures (or raises ``GpuUnavailable``);
``report_gpu`` prints them; ``run_gpu_section`` does both for ``kernels``.
"""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, TextIO

import numpy as np
import tensorflow as tf

from partial_embedding.bench._op_timing import (
    ALL_METHODS,
    BASELINE,
    OpCase,
    Preset,
    make_inputs,
    seconds_per_call,
    skip_reason,
    synchronizer,
    time_methods,
)

__all__ = ["GpuUnavailable", "measure_gpu", "moved_bytes", "report_gpu", "run_gpu_section"]

# -- the GPU benchmark ----------------------------------------------------------


def moved_bytes(case: OpCase, inputs: dict[str, np.ndarray], itemsize: int) -> int:
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
    return {key: value.numpy() for key, value in make_inputs(case, seed).items()}


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
    wait = synchronizer(target)
    samples = [seconds_per_call(copy, wait, preset.max_repeats) for _ in range(preset.rounds)]
    return statistics.median(samples) * 1e3


def _gpu_through_tensorflow(cases: Sequence[OpCase], preset: Preset) -> list[dict]:
    rows = []
    with tf.device("/GPU:0"):
        for case in cases:
            methods = tuple(m for m in ALL_METHODS if not skip_reason(m, case, preset.dense_limit))
            seconds, _ = time_methods(
                case, methods, preset.max_repeats, preset.rounds, 0, preset.target_seconds, True
            )
            moved = moved_bytes(case, _numpy_inputs(case, 0), np.dtype(case.dtype).itemsize)
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
        moved = moved_bytes(case, host, 4)
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
