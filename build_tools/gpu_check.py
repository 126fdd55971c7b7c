"""Checks and times the library's kernels through the _kernels module.

Run by build_tools/gpu_check.sh on a GPU machine (CuPy or PyTorch, NumPy; no
TensorFlow), on fresh random inputs:

* MaskedScatterSub on the GPU against a float64 NumPy reference (every value
  dtype and index type, fast and deterministic mode, deterministic mode twice
  bit-identical, out-of-range detection, nothing written on a refusal);
* the fused masked Adam step (MaskedSparseApplyAdam: Adam, AMSGrad, AdamW;
  full-size and compact slots) bit for bit against a NumPy model of its
  rounding steps and against the CPU kernel, refusals with the CPU kernel's
  messages and nothing written (gpu_check_adam.py);
* the quantized lookup (QuantizedLookup) bit for bit against NumPy and the
  CPU kernel (gpu_check_lookup.py);
* the bag gradient (MaskedEmbeddingBagGrad) on the GPU, and the bag forward
  pass on the CPU, against a float64 reference (gpu_check_bags.py);

then times MaskedScatterSub against a device-to-device copy (and PyTorch's
``index_add_`` where torch imports), the fused Adam step against the memory
floor, PyTorch's SparseAdam and a stock-op version, the quantized lookup and
the bag gradient.
With --cpu-only every correctness check runs through the CPU entry points, so
CI exercises this script's reference logic without a GPU. --json writes the
findings (checks, failures, timings, device, build) to a file.

bfloat16 travels as uint16 bit patterns (dtype="bfloat16"), so neither
ml_dtypes nor a bfloat16-capable array library is needed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
import traceback
import types
from pathlib import Path

import numpy as np

from gpu_check_adam import adam_checks, adam_timing, cuda_milliseconds, import_torch
from gpu_check_common import (
    INDEX_DTYPES,
    ITEMSIZE,
    STORAGE,
    UNIT_ROUNDOFF,
    VALUE_DTYPES,
    Failures,
    ModuleArrays,
    float_to_bf16_bits,
    from_float,
    poison_bits,
    to_float64,
)
from gpu_check_lookup import lookup_checks, lookup_timing

# --- the problem and its reference ---------------------------------------------


class Problem:
    """Host arrays for one call, with frozen rows poisoned."""

    def __init__(
        self,
        rng,
        value_dtype,
        index_dtype,
        num_rows,
        row_shape,
        num_indices,
        hot_fraction=0.0,
        distinct_rows=None,
    ):
        self.value_dtype = value_dtype
        self.var = from_float(rng.standard_normal((num_rows, *row_shape)), value_dtype)
        high = num_rows if distinct_rows is None else min(num_rows, distinct_rows)
        self.indices = rng.integers(0, high, size=num_indices).astype(index_dtype)
        if hot_fraction > 0:
            self.indices[rng.random(num_indices) < hot_fraction] = num_rows // 2
        self.updates = from_float(rng.standard_normal((num_indices, *row_shape)), value_dtype)
        self.row_mask = rng.random(num_rows) < 0.6
        self.row_mask[num_rows // 2] = True
        self.var[~self.row_mask] = poison_bits(value_dtype)

    def expected(self, rounds_once=False):
        """float64 result and a per-element error bound.

        rounds_once: 16-bit types sum a row's updates in float32 and round to
        the storage type once (the GPU kernels), which allows a much tighter
        bound than rounding after every update (the CPU kernel).
        """
        result = to_float64(self.var, self.value_dtype)
        magnitude = np.abs(result)
        rows = result.shape[0]
        flat = self.indices.reshape(-1)
        keep = self.row_mask[flat]
        updates = to_float64(self.updates, self.value_dtype).reshape(flat.size, -1)
        np.subtract.at(result.reshape(rows, -1), flat[keep], updates[keep])
        np.add.at(magnitude.reshape(rows, -1), flat[keep], np.abs(updates[keep]))
        counts = np.bincount(flat[keep], minlength=rows).astype(np.float64)
        roundings = (counts + 1).reshape((-1,) + (1,) * (result.ndim - 1))
        if rounds_once and self.value_dtype in ("float16", "bfloat16"):
            # float32 sum (and subtraction), then one rounding to the 16-bit
            # type; 2**-24 covers float16's subnormal spacing.
            bound = (
                UNIT_ROUNDOFF[self.value_dtype] * np.abs(result)
                + 2.0**-22 * roundings * magnitude
                + 2.0**-24
            )
            return result, bound
        return result, UNIT_ROUNDOFF[self.value_dtype] * roundings * magnitude

    def untouched_rows(self):
        untouched = ~self.row_mask
        untouched[np.setdiff1d(np.arange(self.var.shape[0]), self.indices)] = True
        return untouched


def compare(failures, name, problem, before, after, rounds_once=False):
    expected, bound = problem.expected(rounds_once)
    untouched = problem.untouched_rows()
    failures.check(
        np.array_equal(before[untouched].view(np.uint8), after[untouched].view(np.uint8)),
        f"{name}: a frozen or unindexed row changed",
    )
    error = np.abs(to_float64(after, problem.value_dtype) - expected)
    touched = ~untouched
    # Written as "not within" so that a NaN result counts as wrong.
    bad = ~(error <= bound) & touched.reshape((-1,) + (1,) * (error.ndim - 1))
    if bad.any():
        where = np.argwhere(bad)[0]
        failures.check(
            False,
            f"{name}: element {tuple(where)} off by {error[tuple(where)]:.3g} "
            f"(bound {bound[tuple(where)]:.3g})",
        )
    else:
        failures.check(True, "")


# --- back ends ---------------------------------------------------------------


class CpuBackend:
    name = "cpu"
    rounds_once = False  # 16-bit types round after every update.

    def __init__(self, kernels):
        self.kernels = kernels

    def run(self, problem, var, deterministic):
        del deterministic  # The CPU kernel is always deterministic.
        dtype = "bfloat16" if problem.value_dtype == "bfloat16" else None
        out = var.copy()
        self.kernels.masked_scatter_sub_cpu(
            out, problem.indices, problem.updates, problem.row_mask, dtype=dtype
        )
        return out


class GpuBackend:
    """The GPU entry points, on arrays of CuPy, else PyTorch, else the kernel
    module's own device memory (``arrays="module"``: no array library needed;
    the only choice on the SIMT emulator, whose device memory is the module's)."""

    rounds_once = True  # 16-bit types: float32 sums, one rounding per row.

    def __init__(self, kernels, arrays="auto"):
        self.kernels = kernels
        self.cupy = self.torch = self.module_arrays = None
        if arrays == "module":
            self.module_arrays = ModuleArrays(kernels)
            self.name = "simt" if getattr(kernels, "SIMT", False) else "module"
            return
        try:
            import cupy

            self.cupy = cupy
            self.name = "cupy"
        except ImportError:
            import torch

            self.torch = torch
            self.name = "torch"

    def to_device(self, array):
        if self.module_arrays is not None:
            return self.module_arrays.to_device(array)
        if self.cupy is not None:
            return self.cupy.asarray(array)
        if array.dtype == np.uint16:  # torch has no uint16 CUDA arrays to rely on.
            array = array.view(np.int16)
        return self.torch.from_numpy(np.ascontiguousarray(array)).cuda()

    def to_host(self, array, like):
        if self.module_arrays is not None:
            return self.module_arrays.to_host(array, like)
        if self.cupy is not None:
            return self.cupy.asnumpy(array)
        return array.cpu().numpy().view(like.dtype)

    def run(self, problem, var, deterministic):
        dtype = "bfloat16" if problem.value_dtype == "bfloat16" else None
        device_var = self.to_device(var)
        self.kernels.masked_scatter_sub_gpu(
            device_var,
            self.to_device(problem.indices),
            self.to_device(problem.updates),
            self.to_device(problem.row_mask),
            deterministic=deterministic,
            dtype=dtype,
        )
        return self.to_host(device_var, var)

    def empty(self, shape, dtype):
        if self.module_arrays is not None:
            return self.module_arrays.empty(shape, dtype)
        if self.cupy is not None:
            return self.cupy.empty(shape, dtype=dtype)
        torch_dtype = {
            np.float16: self.torch.float16,
            np.float32: self.torch.float32,
            np.float64: self.torch.float64,
            np.uint16: self.torch.int16,
            np.int32: self.torch.int32,
            np.int64: self.torch.int64,
            np.bool_: self.torch.bool,
            np.uint8: self.torch.uint8,
            np.int8: self.torch.int8,
        }[dtype]
        return self.torch.empty(shape, dtype=torch_dtype, device="cuda")


# --- correctness ---------------------------------------------------------------


def correctness(backend, rng, quick: bool, failures: Failures) -> None:
    shapes = [  # (rows, row shape, positions, hot fraction, distinct rows)
        (37, (5,), 50, 0.0, 8),  # Odd row size: one element per lane.
        (200, (64,), 300, 0.0, 40),  # 16-byte loads, few distinct rows.
        (100, (3, 43), 257, 0.2, None),  # Rank-3 var, a hot row.
        (500, (300,), 2000, 0.5, None),  # Wide rows, a hot row across chunks.
    ]
    if not quick:
        shapes.append((5000, (128,), 70000, 0.3, None))  # 16-position chunks.
        shapes.append((3000, (8,), 1 << 20, 0.05, None))  # 32-position chunks.
    for value_dtype in VALUE_DTYPES:
        for index_dtype in INDEX_DTYPES:
            for rows, row_shape, positions, hot, distinct in shapes:
                problem = Problem(
                    rng, value_dtype, index_dtype, rows, row_shape, positions, hot, distinct
                )
                for deterministic in (False, True):
                    name = (
                        f"{backend.name} {value_dtype} {np.dtype(index_dtype).name} "
                        f"var{(rows, *row_shape)} k={positions} "
                        f"{'deterministic' if deterministic else 'fast'}"
                    )
                    after = backend.run(problem, problem.var, deterministic)
                    compare(failures, name, problem, problem.var, after, backend.rounds_once)
            # Out of range: the first bad position is reported, nothing written.
            problem = Problem(rng, value_dtype, index_dtype, 64, (16,), 1000)
            problem.row_mask[:] = True
            problem.indices[[300, 301, 900]] = [64, -1, 10**6]
            for deterministic in (False, True):
                name = f"{backend.name} {value_dtype} {np.dtype(index_dtype).name} out of range"
                var = problem.var.copy()
                try:
                    backend.run(problem, var, deterministic)
                    failures.check(False, f"{name}: no IndexError")
                except IndexError as error:
                    failures.check(
                        "indices[300] = 64 is not in [0, 64)" in str(error),
                        f"{name}: wrong message {error}",
                    )
                if backend.name != "cpu":
                    continue
                failures.check(
                    np.array_equal(var.view(np.uint8), problem.var.view(np.uint8)),
                    f"{name}: var was written",
                )
            if backend.name != "cpu":
                check_gpu_nothing_written(backend, failures, problem, value_dtype, index_dtype)
    # Deterministic mode twice on the same inputs: bit-identical.
    for value_dtype in VALUE_DTYPES:
        problem = Problem(rng, value_dtype, np.int64, 2000, (96,), 20000 if quick else 200000, 0.4)
        first = backend.run(problem, problem.var, True)
        second = backend.run(problem, problem.var, True)
        failures.check(
            np.array_equal(first.view(np.uint8), second.view(np.uint8)),
            f"{backend.name} {value_dtype}: deterministic mode differs between runs",
        )
        compare(
            failures,
            f"{backend.name} {value_dtype} heavy duplicates deterministic",
            problem,
            problem.var,
            first,
            backend.rounds_once,
        )
    zero_size(backend, failures)


def zero_size(backend, failures):
    """No positions, empty rows, no rows: nothing written, no device error."""
    for value_dtype in VALUE_DTYPES:
        for rows, row_shape, positions in ((16, (8,), 0), (16, (0,), 10), (0, (8,), 0)):
            var = from_float(np.ones((rows, *row_shape)), value_dtype)
            problem = types.SimpleNamespace(
                value_dtype=value_dtype,
                indices=np.arange(positions, dtype=np.int64) % max(rows, 1),
                updates=from_float(np.ones((positions, *row_shape)), value_dtype),
                row_mask=np.ones(rows, dtype=bool),
            )
            name = f"{backend.name} {value_dtype} var{(rows, *row_shape)} k={positions}"
            try:
                after = backend.run(problem, var, False)
                failures.check(
                    np.array_equal(after.view(np.uint8), var.view(np.uint8)), f"{name}: var changed"
                )
            except Exception as error:  # noqa: BLE001 - any error is a failure here.
                failures.check(False, f"{name}: raised {type(error).__name__}: {error}")


def check_gpu_nothing_written(backend, failures, problem, value_dtype, index_dtype):
    dtype = "bfloat16" if value_dtype == "bfloat16" else None
    for deterministic in (False, True):
        device_var = backend.to_device(problem.var)
        try:
            backend.kernels.masked_scatter_sub_gpu(
                device_var,
                backend.to_device(problem.indices),
                backend.to_device(problem.updates),
                backend.to_device(problem.row_mask),
                deterministic=deterministic,
                dtype=dtype,
            )
        except IndexError:
            pass
        after = backend.to_host(device_var, problem.var)
        failures.check(
            np.array_equal(after.view(np.uint8), problem.var.view(np.uint8)),
            f"gpu {value_dtype} {np.dtype(index_dtype).name} out of range: var was written",
        )


# --- timing --------------------------------------------------------------------


def timing(backend, rng, quick: bool, max_table_gb: float) -> tuple[list[str], dict]:
    kernels = backend.kernels
    torch = import_torch()
    copy_bytes = 1 << 30
    src = backend.empty((copy_bytes,), np.uint8)
    dst = backend.empty((copy_bytes,), np.uint8)
    copy_ms = kernels.time_device_copy_gpu(dst, src, warmup=3, repeats=20)
    copy_gbps = 2 * copy_bytes / copy_ms / 1e6
    del src, dst
    print(f"device-to-device copy of 1 GiB: {copy_ms:.3f} ms, {copy_gbps:.0f} GB/s (read + write)")

    cases = [  # (value dtype, rows, row size, positions, duplicates)
        ("float32", 1 << 17, 128, 1 << 12, "few"),
        ("float32", 1 << 20, 128, 1 << 16, "few"),
        ("float32", 1 << 20, 128, 1 << 19, "few"),
        ("float32", 1 << 23, 128, 1 << 19, "few"),
        ("float32", 1 << 23, 128, 1 << 21, "few"),
        ("float32", 1 << 23, 128, 1 << 19, "hot 50%"),
        ("float16", 1 << 23, 128, 1 << 20, "few"),
        ("bfloat16", 1 << 23, 128, 1 << 20, "few"),
        ("float64", 1 << 22, 128, 1 << 19, "few"),
    ]
    if quick:
        cases = cases[:3]
    rows_out = []
    summary = {"copy_gbps": copy_gbps, "fraction": [], "det_ratio": []}
    header = (
        f"{'dtype':9} {'mode':13} {'rows':>9} {'D':>4} {'k':>8} {'dups':8} "
        f"{'table GB':>8} {'ms':>8} {'GB moved':>8} {'GB/s':>7} {'of copy':>7}"
    )
    rows_out.append(header)
    for value_dtype, rows, row_size, positions, dups in cases:
        itemsize = ITEMSIZE[value_dtype]
        table_gb = rows * row_size * itemsize / 1e9
        if table_gb > max_table_gb:
            continue
        storage = STORAGE[value_dtype]
        var = backend.empty((rows, row_size), storage)
        updates = backend.empty((positions, row_size), storage)
        fill(backend, var, 0.5, value_dtype)
        fill(backend, updates, 1e-3, value_dtype)
        host_indices = rng.choice(rows, size=positions, replace=False).astype(np.int32)
        if dups != "few":
            host_indices[rng.random(positions) < 0.5] = rows // 3
        indices = backend.to_device(host_indices)
        row_mask = backend.to_device(np.ones(rows, dtype=bool))
        dtype = "bfloat16" if value_dtype == "bfloat16" else None
        moved = positions * row_size * itemsize * 3 + positions * 4 + positions
        times = {}
        for deterministic in (False, True):
            ms = kernels.time_masked_scatter_sub_gpu(
                var,
                indices,
                updates,
                row_mask,
                deterministic=deterministic,
                warmup=2,
                repeats=10,
                dtype=dtype,
            )
            times[deterministic] = ms
            gbps = moved / ms / 1e6
            mode = "deterministic" if deterministic else "fast"
            rows_out.append(
                f"{value_dtype:9} {mode:13} {rows:9d} {row_size:4d} {positions:8d} {dups:8} "
                f"{table_gb:8.2f} {ms:8.3f} {moved / 1e9:8.3f} {gbps:7.0f} {gbps / copy_gbps:7.1%}"
            )
            print(rows_out[-1], flush=True)
            if positions * row_size >= 64 << 20 and dups == "few":
                summary["fraction"].append(gbps / copy_gbps)
        summary["det_ratio"].append(times[True] / times[False])
        if torch is not None and value_dtype in ("float32", "float16", "float64"):
            ms = index_add_milliseconds(torch, host_indices, rows, row_size, value_dtype)
            torch.cuda.empty_cache()
            rows_out.append(
                f"{value_dtype:9} {'torch index_add_':16} {rows:6d} {row_size:4d} {positions:8d} "
                f"{dups:8} {table_gb:8.2f} {ms:8.3f}  ({ms / min(times.values()):.2f}x ours)"
            )
            print(rows_out[-1], flush=True)
        del var, updates, indices, row_mask
    return rows_out, summary


def index_add_milliseconds(torch, host_indices, rows, row_size, value_dtype) -> float:
    """PyTorch's masked scatter-subtract: the kept rows' updates, index_add_."""
    dtype = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}[
        value_dtype
    ]
    var = torch.full((rows, row_size), 0.5, dtype=dtype, device="cuda")
    updates = torch.full((len(host_indices), row_size), 1e-3, dtype=dtype, device="cuda")
    indices = torch.from_numpy(host_indices.astype(np.int64)).cuda()
    mask = torch.ones(rows, dtype=torch.bool, device="cuda")

    def step():
        keep = mask[indices]
        var.index_add_(0, indices[keep], updates[keep], alpha=-1)

    return cuda_milliseconds(torch, step)


def fill(backend, array, value, value_dtype):
    if value_dtype == "bfloat16":
        bits = int(float_to_bf16_bits(np.array([value], np.float32))[0])
        if backend.cupy is not None:
            array.fill(np.uint16(bits))
        else:
            array.fill_(bits - (1 << 16) if bits >= 1 << 15 else bits)
    elif backend.cupy is not None:
        array.fill(value)
    else:
        array.fill_(value)


# --- the SIMT emulator: what ran ------------------------------------------------


class KernelTally(Failures):
    """Failures that also count, per kernel, the launches the emulator ran and
    the checks that looked at their results (each check is credited to every
    kernel launched since the check before it)."""

    def __init__(self, kernels):
        super().__init__()
        self.kernels = kernels
        self.seen = kernels.simt_launch_counts()
        self.per_kernel: dict[str, int] = {}

    def check(self, condition: bool, message: str) -> None:
        super().check(condition, message)
        counts = self.kernels.simt_launch_counts()
        for name, launches in counts.items():
            if launches > self.seen.get(name, 0):
                self.per_kernel[name] = self.per_kernel.get(name, 0) + 1
        self.seen = counts


def source_kernels(root: Path) -> list[str]:
    """The __global__ functions of cc/core/*.cu and *.cuh."""
    names = set()
    pattern = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)")
    for path in sorted((root / "cc" / "core").glob("*.cu*")):
        names.update(pattern.findall(path.read_text()))
    return sorted(names)


def simt_report(kernels, tally: KernelTally) -> dict:
    """Prints launches and checks per kernel; every kernel of cc/core must have
    run and been checked, and the emulator must have reported no fault."""
    launches = tally.kernels.simt_launch_counts()
    report = {}
    print(f"{'kernel':28} {'launches':>9} {'checks':>7}")
    for name in source_kernels(Path(__file__).resolve().parents[1]):
        entry = {"launches": launches.get(name, 0), "checks": tally.per_kernel.get(name, 0)}
        report[name] = entry
        print(f"{name:28} {entry['launches']:9d} {entry['checks']:7d}")
        tally.check(
            entry["launches"] > 0 and entry["checks"] > 0,
            f"simt: kernel {name} never ran under a check",
        )
    faults = kernels.simt_fault_count()
    tally.check(faults == 0, f"simt: the emulator reported {faults} fault(s) (see its simt: lines)")
    return report


# --- main ----------------------------------------------------------------------


def in_section(failures: Failures, name: str, run, *args):
    """run(*args); an exception (a device error, say) fails the section and
    lets the later ones run, so the JSON is still written."""
    try:
        return run(*args)
    except Exception as error:  # noqa: BLE001 - reported as a failure.
        traceback.print_exc()
        failures.check(False, f"{name}: raised {type(error).__name__}: {error}")
        return None


def load_kernels(module_dir: str | None):
    if module_dir is None:
        from partial_embedding import _kernels  # Needs the package's imports.

        return _kernels
    candidates = sorted(Path(module_dir).glob("_kernels*.so"))
    if not candidates:
        sys.exit(f"gpu_check: no _kernels*.so in {module_dir}")
    spec = importlib.util.spec_from_file_location("_kernels", candidates[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    import gpu_check_bags  # Next to this file; it uses this module's helpers.

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--module-dir",
        help="directory holding _kernels*.so (default: import partial_embedding._kernels)",
    )
    parser.add_argument(
        "--cpu-only", action="store_true", help="check the CPU entry point only (no GPU needed)"
    )
    parser.add_argument(
        "--simt",
        action="store_true",
        help="check the GPU entry points of a kernel module built on the SIMT emulator "
        "(gpu_check.sh --simt builds one); --seed also seeds the emulator's schedules",
    )
    parser.add_argument("--quick", action="store_true", help="fewer and smaller cases")
    parser.add_argument(
        "--max-table-gb", type=float, default=4.5, help="skip timing cases whose table is larger"
    )
    parser.add_argument(
        "--max-adam-gb",
        type=float,
        default=40.0,
        help="skip fused Adam timing cases whose three tables are larger",
    )
    parser.add_argument(
        "--seed",
        default="0",
        help='an integer (default 0: the same inputs every run) or "random" (fresh, printed)',
    )
    parser.add_argument("--json", help="write the findings to this file")
    parser.add_argument(
        "--build-info", help="a JSON file describing the build (gpu_check.sh writes one)"
    )
    args = parser.parse_args(argv)

    started = time.perf_counter()
    kernels = load_kernels(args.module_dir)
    if args.seed == "random":
        seed = int(np.random.SeedSequence().entropy % 2**32)
    else:
        try:
            seed = int(args.seed)
        except ValueError:
            parser.error(f"--seed: expected an integer or 'random', got {args.seed!r}")
    rng = np.random.default_rng(seed)
    print(f"gpu_check: seed {seed}")
    failures = Failures()
    if args.cpu_only:
        backend = CpuBackend(kernels)
    elif args.simt:
        if not getattr(kernels, "SIMT", False):
            print("gpu_check: FAIL: --simt needs a kernel module built with PE_SIMT=ON")
            return 2
        kernels.simt_set_seed(seed)
        backend = GpuBackend(kernels, arrays="module")
        failures = KernelTally(kernels)
        print(f"gpu_check: {kernels.cuda_device_description()}, PE_SIMT_SEED={seed}")
    else:
        if not getattr(kernels, "HAS_CUDA", False) or not kernels.cuda_device_available():
            print("gpu_check: FAIL: the module has no CUDA support or sees no GPU")
            return 2
        backend = GpuBackend(kernels)
        print(f"gpu_check: {kernels.cuda_device_description()} (arrays via {backend.name})")

    in_section(failures, "MaskedScatterSub", correctness, backend, rng, args.quick, failures)
    in_section(failures, "fused Adam", adam_checks, backend, rng, failures, args.quick)
    in_section(failures, "quantized lookup", lookup_checks, backend, rng, failures)
    in_section(failures, "bags", gpu_check_bags.bag_checks, backend, rng, failures, args.quick)
    print(
        f"correctness: {failures.checks - len(failures.messages)}/{failures.checks} checks passed "
        f"({time.perf_counter() - started:.1f} s)",
        flush=True,
    )
    simt_kernels = simt_report(kernels, failures) if args.simt else None
    summary = None
    timing_rows: list[str] = []
    adam_summary = None
    if not args.cpu_only and not args.simt:
        timed = in_section(
            failures, "MaskedScatterSub timing", timing, backend, rng, args.quick, args.max_table_gb
        )
        if timed is not None:
            timing_rows, summary = timed
        copy_gbps = summary["copy_gbps"] if summary else 4200.0
        timed = in_section(
            failures,
            "fused Adam timing",
            adam_timing,
            backend,
            rng,
            copy_gbps,
            args.quick,
            args.max_adam_gb,
        )
        if timed is not None:
            timing_rows += timed[0]
            adam_summary = timed[1]
        lookup_line = in_section(
            failures, "quantized lookup timing", lookup_timing, backend, rng, copy_gbps
        )
        if lookup_line is not None:
            print(lookup_line)
            timing_rows.append(lookup_line)
        bag_rows = in_section(
            failures, "bag timing", gpu_check_bags.bag_timing, backend, rng, args.quick, copy_gbps
        )
        timing_rows += bag_rows or []

    elapsed = time.perf_counter() - started
    status = "PASS" if not failures.messages else "FAIL"
    line = (
        f"gpu_check {status}: {backend.name}, {failures.checks - len(failures.messages)}/"
        f"{failures.checks} correctness checks, seed {seed}"
    )
    if summary is not None:
        line += f", copy {summary['copy_gbps']:.0f} GB/s"
        if summary["fraction"]:
            line += (
                f", fast mode at k*D>=64M: {min(summary['fraction']):.0%}-"
                f"{max(summary['fraction']):.0%} of copy (target 70%)"
            )
        if summary["det_ratio"]:
            line += f", deterministic/fast time: max {max(summary['det_ratio']):.2f}x (target <2x)"
    for entry in adam_summary or ():
        line += (
            f", adam {entry['case']}: {entry['ours_x_floor']:.2f}x floor "
            f"(target {entry['target_x_floor']:.1f}x)"
        )
    line += f", {elapsed:.0f} s"
    print(line)
    if args.json:
        build = None
        if args.build_info and os.path.exists(args.build_info):
            with open(args.build_info) as build_file:
                build = json.load(build_file)
        findings = {
            "status": status,
            "summary": line,
            "seed": seed,
            "backend": backend.name,
            "device": None if args.cpu_only else kernels.cuda_device_description(),
            "simt_kernels": simt_kernels,
            "build": build,
            "checks": failures.checks,
            "failures": failures.messages,
            "timing_table": timing_rows,
            "timing_summary": summary,
            "adam_timing": adam_summary,
            "seconds": elapsed,
        }
        with open(args.json, "w") as json_file:
            json.dump(findings, json_file, indent=2)
        print(f"gpu_check: findings written to {args.json}")
    return 0 if not failures.messages else 1


if __name__ == "__main__":
    sys.exit(main())
