"""Checks and times the library's kernels through the _kernels module.

Run by build_tools/gpu_check.sh on a GPU machine (CuPy or PyTorch, NumPy; no
TensorFlow): MaskedScatterSub on the GPU against a float64 NumPy reference on
fresh random inputs (every value dtype and index type, fast and deterministic
mode, deterministic mode twice bit-identical, out-of-range detection), then a
timing table against a device-to-device copy. MaskedSparseApplyAdam, with
full-size and with compact slots (slot_indices), has no GPU kernel: its CPU
core is checked bit for bit against a NumPy model of the same rounding steps.
The bag gradient (MaskedEmbeddingBagGrad) on the GPU, and the bag forward pass
on the CPU, are checked by gpu_check_bags.py, called from here.
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
import sys
import time
import types
from pathlib import Path

import numpy as np

VALUE_DTYPES = ("float16", "bfloat16", "float32", "float64")
INDEX_DTYPES = (np.int32, np.int64)
UNIT_ROUNDOFF = {
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
}
STORAGE = {
    "float16": np.float16,
    "bfloat16": np.uint16,
    "float32": np.float32,
    "float64": np.float64,
}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


# --- bfloat16 as uint16 bits -------------------------------------------------


def bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits, to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    return ((bits + rounding) >> 16).astype(np.uint16)


def to_float64(array: np.ndarray, value_dtype: str) -> np.ndarray:
    if value_dtype == "bfloat16":
        return bf16_bits_to_float(array).astype(np.float64)
    return array.astype(np.float64)


def from_float(values: np.ndarray, value_dtype: str) -> np.ndarray:
    if value_dtype == "bfloat16":
        return float_to_bf16_bits(values.astype(np.float32))
    return values.astype(STORAGE[value_dtype])


def poison_bits(value_dtype: str) -> np.ndarray:
    """A distinctive value near 1/3: subtracting any update would change it."""
    pattern = {
        "float16": np.uint16(0x3555),
        "bfloat16": np.uint16(0x3EAB),
        "float32": np.uint32(0x3EAAAAA5),
        "float64": np.uint64(0x3FD5555555555AB5),
    }[value_dtype]
    return np.array(pattern).view(STORAGE[value_dtype])


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


class Failures:
    def __init__(self):
        self.messages: list[str] = []
        self.checks = 0

    def check(self, condition: bool, message: str) -> None:
        self.checks += 1
        if not condition:
            self.messages.append(message)
            print(f"  FAIL: {message}", flush=True)


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
    rounds_once = True  # 16-bit types: float32 sums, one rounding per row.

    def __init__(self, kernels):
        self.kernels = kernels
        try:
            import cupy

            self.cupy, self.torch = cupy, None
            self.name = "cupy"
        except ImportError:
            import torch

            self.cupy, self.torch = None, torch
            self.name = "torch"

    def to_device(self, array):
        if self.cupy is not None:
            return self.cupy.asarray(array)
        if array.dtype == np.uint16:  # torch has no uint16 CUDA arrays to rely on.
            array = array.view(np.int16)
        return self.torch.from_numpy(np.ascontiguousarray(array)).cuda()

    def to_host(self, array, like):
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
        }[dtype]
        return self.torch.empty(shape, dtype=torch_dtype, device="cuda")


# --- correctness ---------------------------------------------------------------


def correctness(backend, rng, quick: bool) -> Failures:
    failures = Failures()
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
    return failures


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


# --- MaskedSparseApplyAdam (CPU core; full-size and compact slots) ---------------


def round_to(values: np.ndarray, value_dtype: str) -> np.ndarray:
    """float64 values rounded as one operation in value_dtype rounds them.

    16-bit types compute in float32 and round the float32 result, as the core
    (and TensorFlow's CPU kernels) do.
    """
    values = np.asarray(values, np.float64)
    if value_dtype == "float64":
        return values
    as_float32 = values.astype(np.float32)
    if value_dtype == "float32":
        return as_float32.astype(np.float64)
    return to_float64(from_float(as_float32, value_dtype), value_dtype)


def adam_reference(var, m, v, v_hat, indices, slot_rows, gradient, row_mask, hyper, value_dtype):
    """One step of the core's arithmetic on float64 copies (see masked_sparse_apply.h)."""
    var, m, v = var.copy(), m.copy(), v.copy()
    v_hat = None if v_hat is None else v_hat.copy()
    lr, one_minus_beta_1, one_minus_beta_2, epsilon, alpha, weight_decay = hyper

    def r(x):
        return round_to(x, value_dtype)

    flat = indices.reshape(-1)
    for row in dict.fromkeys(flat.tolist()):
        if not row_mask[row]:
            continue
        positions = np.flatnonzero(flat == row)
        slot = row if slot_rows is None else int(slot_rows[positions[0]])
        g = np.zeros(var.shape[1:])
        for position in positions:
            g = r(g + gradient[position])
        x = var[row]
        if weight_decay != 0:
            x = r(x - r(r(x * weight_decay) * lr))
        m_new = r(m[slot] + r(r(g - m[slot]) * one_minus_beta_1))
        v_new = r(v[slot] + r(r(r(g * g) - v[slot]) * one_minus_beta_2))
        second = v_new
        if v_hat is not None:
            second = np.maximum(v_hat[slot], v_new)
            v_hat[slot] = second
        m[slot], v[slot] = m_new, v_new
        var[row] = r(x - r(r(m_new * alpha) / r(r(np.sqrt(second)) + epsilon)))
    return var, m, v, v_hat


def adam_problem(rng, value_dtype, index_dtype, compact, amsgrad, weight_decay):
    rows, row_shape, positions = 60, (2, 9), 150
    indices = rng.integers(0, 25, size=positions).astype(index_dtype)  # duplicates
    row_mask = rng.random(rows) < 0.6
    num_slot_rows = rows
    slot_indices = None
    if compact:
        permitted = np.unique(indices[row_mask[indices]])
        num_slot_rows = len(permitted) + 3
        slot_of_row = dict(zip(permitted.tolist(), rng.permutation(num_slot_rows).tolist()))
        slot_indices = np.array(
            [slot_of_row.get(int(i), int(rng.integers(num_slot_rows))) for i in indices],
            dtype=index_dtype,
        )

    def table(shape, scale=1.0, positive=False):
        values = rng.standard_normal(shape) * scale
        return from_float(np.abs(values) if positive else values, value_dtype)

    slot_shape = (num_slot_rows, *row_shape)
    arrays = {
        "var": table((rows, *row_shape)),
        "m": table(slot_shape, 0.1),
        "v": table(slot_shape, 0.01, positive=True),
        "v_hat": table(slot_shape, 0.01, positive=True) if amsgrad else None,
        "gradient": table((positions, *row_shape)),
    }
    hyper = [
        float(round_to(np.array([x]), value_dtype)[0])
        for x in (0.01, 0.1, 0.001, 1e-3, 0.0123, weight_decay)
    ]
    return arrays, indices, slot_indices, row_mask, hyper


def run_adam(kernels, out, indices, row_mask, hyper, slot_indices, dtype) -> None:
    """One fused Adam step of the CPU core on the arrays of ``out``, in place."""
    kernels.masked_sparse_apply_adam_cpu(
        out["var"],
        out["m"],
        out["v"],
        indices,
        out["gradient"],
        row_mask,
        learning_rate=hyper[0],
        one_minus_beta_1=hyper[1],
        one_minus_beta_2=hyper[2],
        epsilon=hyper[3],
        alpha=hyper[4],
        weight_decay=hyper[5],
        v_hat=out["v_hat"],
        slot_indices=slot_indices,
        dtype=dtype,
    )


def adam_checks(kernels, rng, failures: Failures) -> None:
    if not hasattr(kernels, "masked_sparse_apply_adam_cpu"):
        failures.check(False, "the module has no masked_sparse_apply_adam_cpu")
        return
    for value_dtype in VALUE_DTYPES:
        dtype = "bfloat16" if value_dtype == "bfloat16" else None
        for index_dtype in INDEX_DTYPES:
            for compact, amsgrad, weight_decay in (
                (False, False, 0.0),
                (False, True, 0.004),
                (True, False, 0.0),
                (True, True, 0.004),
            ):
                arrays, indices, slot_indices, row_mask, hyper = adam_problem(
                    rng, value_dtype, index_dtype, compact, amsgrad, weight_decay
                )
                name = (
                    f"cpu adam {value_dtype} {np.dtype(index_dtype).name} "
                    f"{'compact' if compact else 'full-size'} slots"
                    f"{' amsgrad' if amsgrad else ''}{' weight decay' if weight_decay else ''}"
                )
                out = {k: None if a is None else a.copy() for k, a in arrays.items()}
                run_adam(kernels, out, indices, row_mask, hyper, slot_indices, dtype)
                expected = adam_reference(
                    *(
                        None if arrays[k] is None else to_float64(arrays[k], value_dtype)
                        for k in ("var", "m", "v", "v_hat")
                    ),
                    indices,
                    slot_indices,
                    to_float64(arrays["gradient"], value_dtype),
                    row_mask,
                    hyper,
                    value_dtype,
                )
                for key, want in zip(("var", "m", "v", "v_hat"), expected):
                    if want is None:
                        continue
                    got = from_float(want, value_dtype)
                    failures.check(
                        np.array_equal(out[key].view(np.uint8), got.view(np.uint8)),
                        f"{name}: {key} differs from the NumPy model bit for bit",
                    )
            # A compact-slot step refused before any write.
            arrays, indices, slot_indices, row_mask, hyper = adam_problem(
                rng, value_dtype, index_dtype, True, False, 0.0
            )
            for broken, error_type, text in (
                ("out of range", IndexError, "is not in [0, "),
                ("two slot rows", ValueError, "different slot rows"),
            ):
                bad = slot_indices.copy()
                permitted = np.flatnonzero(row_mask[indices])
                if broken == "out of range":
                    bad[permitted[-1]] = arrays["m"].shape[0]
                else:
                    row = indices[permitted[0]]
                    repeats = np.flatnonzero(indices == row)
                    if len(repeats) < 2:
                        continue
                    bad[repeats[-1]] = (bad[repeats[0]] + 1) % arrays["m"].shape[0]
                out = {k: None if a is None else a.copy() for k, a in arrays.items()}
                name = f"cpu adam {value_dtype} {np.dtype(index_dtype).name} slot map {broken}"
                try:
                    run_adam(kernels, out, indices, row_mask, hyper, bad, dtype)
                    failures.check(False, f"{name}: no {error_type.__name__}")
                except error_type as error:
                    failures.check(text in str(error), f"{name}: wrong message {error}")
                for key in ("var", "m", "v"):
                    failures.check(
                        np.array_equal(out[key].view(np.uint8), arrays[key].view(np.uint8)),
                        f"{name}: {key} was written",
                    )


# --- timing --------------------------------------------------------------------


def timing(backend, rng, quick: bool, max_table_gb: float) -> tuple[list[str], dict]:
    kernels = backend.kernels
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
        del var, updates, indices, row_mask
    return rows_out, summary


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


# --- main ----------------------------------------------------------------------


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
    parser.add_argument("--quick", action="store_true", help="fewer and smaller cases")
    parser.add_argument(
        "--max-table-gb", type=float, default=4.5, help="skip timing cases whose table is larger"
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
    if args.cpu_only:
        backend = CpuBackend(kernels)
    else:
        if not getattr(kernels, "HAS_CUDA", False) or not kernels.cuda_device_available():
            print("gpu_check: FAIL: the module has no CUDA support or sees no GPU")
            return 2
        backend = GpuBackend(kernels)
        print(f"gpu_check: {kernels.cuda_device_description()} (arrays via {backend.name})")

    failures = correctness(backend, rng, args.quick)
    adam_checks(kernels, rng, failures)
    gpu_check_bags.bag_checks(backend, rng, failures, args.quick)
    print(
        f"correctness: {failures.checks - len(failures.messages)}/{failures.checks} checks passed "
        f"({time.perf_counter() - started:.1f} s)",
        flush=True,
    )
    summary = None
    timing_rows: list[str] = []
    if not args.cpu_only:
        timing_rows, summary = timing(backend, rng, args.quick, args.max_table_gb)
        timing_rows += gpu_check_bags.bag_timing(backend, rng, args.quick, summary["copy_gbps"])

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
            "build": build,
            "checks": failures.checks,
            "failures": failures.messages,
            "timing_table": timing_rows,
            "timing_summary": summary,
            "seconds": elapsed,
        }
        with open(args.json, "w") as json_file:
            json.dump(findings, json_file, indent=2)
        print(f"gpu_check: findings written to {args.json}")
    return 0 if not failures.messages else 1


if __name__ == "__main__":
    sys.exit(main())
