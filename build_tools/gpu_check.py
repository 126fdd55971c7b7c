"""The GPU check's suite: one reference per rule, run through a back end.

Every rule is checked on fresh random inputs against one NumPy reference
(float64, or a model of the kernel's rounding steps), whichever back end
runs it:

* MaskedScatterSub against a float64 reference (every value dtype and index
  type, fast and deterministic mode, deterministic mode twice bit-identical,
  out-of-range detection, nothing written on a refusal; here);
* every rule of the fused optimizer table (MaskedSparseApplyRule: SGD to
  row-wise Adam; full-size and compact slots) against the CPU kernel, bit
  for bit (a row-wise rule's var and per-row slot within the bound of its
  row's sum of squares), refusals with the CPU kernel's messages and nothing
  written (gpu_check_rules.py);
* the quantized lookup (QuantizedLookup) bit for bit against NumPy and the
  CPU kernel (gpu_check_lookup.py);
* the bag gradient (MaskedEmbeddingBagGrad), and the bag forward pass on the
  CPU, against a float64 reference (gpu_check_bags.py).

The back ends, and where each runs (build_tools/gpu_check.sh is the command):

* GpuBackend, the TF-free kernel module's GPU entry points: on a GPU machine
  (CuPy or PyTorch, NumPy; no TensorFlow), then timing: MaskedScatterSub
  against a device-to-device copy (and PyTorch's ``index_add_`` where torch
  imports), the fused Adam rule against the memory floor, PyTorch's
  SparseAdam and a stock-op version, every rule against its floor, the
  quantized lookup and the bag
  gradient; with --simt, the same entry points of a module built on the SIMT
  emulator (CI, no GPU; the module's own device memory);
* TensorFlowBackend (--tensorflow-ops [--device /GPU:0]): the installed
  package's ops on ``tf.Variable``s on the device; TensorFlow is imported
  only then. ``--device /CPU:0`` runs it through the CPU op kernels;
* CpuBackend (--cpu-only): the module's CPU entry points, so CI exercises
  the references without a GPU.

--json writes the findings (checks, failures, timings, device, build) to a
file. bfloat16 travels as uint16 bit patterns (dtype="bfloat16"), so neither
ml_dtypes nor a bfloat16-capable array library is needed by the module runs.
"""

from __future__ import annotations

import argparse
import contextlib
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

from gpu_check_common import (
    INDEX_DTYPES,
    ITEMSIZE,
    STORAGE,
    UNIT_ROUNDOFF,
    VALUE_DTYPES,
    Failures,
    ModuleArrays,
    bits_equal,
    dtype_argument,
    float_to_bf16_bits,
    from_float,
    poison_bits,
    to_float64,
)
from gpu_check_lookup import lookup_checks, lookup_timing
from gpu_check_rules import cuda_milliseconds, import_torch, rule_checks, rule_timing

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
        counts = counts.reshape((-1,) + (1,) * (result.ndim - 1))
        roundings = counts + 1
        # The reference is no exact sum either: its `counts` float64
        # subtractions, in index order, each round too. A kernel that sums in
        # another order (a GPU's chunks, atomics) may then differ from it by
        # both errors; in float64 that is up to twice the kernel's own
        # bound, which a fresh seed on the SIMT emulator exceeded.
        reference_error = UNIT_ROUNDOFF["float64"] * counts * magnitude
        if rounds_once and self.value_dtype in ("float16", "bfloat16"):
            # float32 sum (and subtraction), then one rounding to the 16-bit
            # type; 2**-24 covers float16's subnormal spacing.
            bound = (
                UNIT_ROUNDOFF[self.value_dtype] * np.abs(result)
                + 2.0**-22 * roundings * magnitude
                + 2.0**-24
            )
            return result, bound + reference_error
        return result, UNIT_ROUNDOFF[self.value_dtype] * roundings * magnitude + reference_error

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
#
# A back end runs each rule on host arrays and hands the results back as host
# arrays; the sections (here and in gpu_check_rules/lookup/bags.py) hold the
# checks and the references, once for all three:
#
#   scatter_sub(problem, var, deterministic) -> (var after, refusal or None)
#   rule_step(problem, tables, indices, slot_indices, gradient, reference=False)
#       in place on host tables, also when refused (then it raises);
#       reference=True: the same step by the CPU kernel of the same front end
#   quantized_lookup(arrays, out, row_of, reference=False)   into out, row_of
#   bag_gradient(problem) -> (rows, values)
#   embedding_bag(params, ids, bags, num_bags, weights, combiner, value_dtype)
#
# and says how its kernels behave: rounds_once (16-bit scatter sums in
# float32, one rounding per row: the GPU kernels), rule_piece_size (None: a
# row's gradient rows summed in position order), bag_rows_ascending (the GPU
# bag gradient's order; the CPU's is first occurrence), checks_bag_forward
# (the forward pass has a CPU kernel only), on_gpu (its kernels are not the
# CPU ones, whose messages and bits it must then match), refusal(error_type)
# (what it raises where the module raises error_type), message(error) and
# front_end ("module" or "tensorflow": whose words a refusal's text is in),
# and holds the rule table (rules: the kernel module's RULES).


class ModuleBackend:
    """What the kernel module's CPU and GPU back ends share."""

    front_end = "module"
    rounds_once = False
    on_gpu = False
    rule_piece_size = None
    bag_rows_ascending = False
    checks_bag_forward = False

    def __init__(self, kernels):
        self.kernels = kernels
        self.rules = getattr(kernels, "RULES", {})

    @staticmethod
    def refusal(error_type):
        return error_type

    @staticmethod
    def message(error) -> str:
        return str(error)

    def lacks(self, entry: str) -> str | None:
        """Why a rule cannot run: the module lacks ``entry``'s CPU (or, on a
        GPU, GPU) entry point."""
        for name in (entry + "_cpu", entry + "_gpu") if self.on_gpu else (entry + "_cpu",):
            if not hasattr(self.kernels, name):
                return f"the module has no {name}"
        return None

    def rule_cpu(self, problem, tables, indices, slot_indices, gradient) -> None:
        self.kernels.masked_sparse_apply_rule_cpu(
            problem.rule,
            tables["var"],
            [tables[name] for name in problem.slot_names],
            indices,
            slot_indices,
            gradient,
            problem.row_mask,
            problem.hyper,
            dtype=dtype_argument(problem.value_dtype),
        )

    def quantized_lookup_cpu(self, arrays, out, row_of) -> None:
        self.kernels.quantized_lookup_cpu(*arrays, out, row_of)

    def bag_gradient_cpu(self, problem):
        return self.kernels.masked_embedding_bag_grad_cpu(
            problem.grad,
            problem.ids,
            problem.bags,
            problem.factors,
            problem.row_mask,
            dtype=dtype_argument(problem.value_dtype),
        )


class CpuBackend(ModuleBackend):
    name = "cpu"
    checks_bag_forward = True

    def scatter_sub(self, problem, var, deterministic):
        del deterministic  # The CPU kernel is always deterministic.
        out = var.copy()
        try:
            self.kernels.masked_scatter_sub_cpu(
                out,
                problem.indices,
                problem.updates,
                problem.row_mask,
                dtype=dtype_argument(problem.value_dtype),
            )
        except IndexError as error:
            return out, error
        return out, None

    def rule_step(self, problem, tables, indices, slot_indices, gradient, reference=False):
        self.rule_cpu(problem, tables, indices, slot_indices, gradient)

    def quantized_lookup(self, arrays, out, row_of, reference=False) -> None:
        self.quantized_lookup_cpu(arrays, out, row_of)

    def bag_gradient(self, problem):
        return self.bag_gradient_cpu(problem)

    def embedding_bag(self, params, ids, bags, num_bags, weights, combiner, value_dtype):
        return self.kernels.embedding_bag_cpu(
            params,
            ids,
            bags,
            num_bags,
            weights=weights,
            combiner=combiner,
            dtype=dtype_argument(value_dtype),
        )


class GpuBackend(ModuleBackend):
    """The GPU entry points, on arrays of CuPy, else PyTorch, else the kernel
    module's own device memory (``arrays="module"``: no array library needed;
    the only choice on the SIMT emulator, whose device memory is the module's)."""

    rounds_once = True  # 16-bit types: float32 sums, one rounding per row.
    on_gpu = True
    bag_rows_ascending = True

    def __init__(self, kernels, arrays="auto"):
        super().__init__(kernels)
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

    @property
    def rule_piece_size(self):
        return int(self.kernels.RULE_GPU_PIECE_SIZE)

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

    def scatter_sub(self, problem, var, deterministic):
        device_var = self.to_device(var)
        error = None
        try:
            self.kernels.masked_scatter_sub_gpu(
                device_var,
                self.to_device(problem.indices),
                self.to_device(problem.updates),
                self.to_device(problem.row_mask),
                deterministic=deterministic,
                dtype=dtype_argument(problem.value_dtype),
            )
        except IndexError as raised:
            error = raised
        return self.to_host(device_var, var), error

    def rule_step(self, problem, tables, indices, slot_indices, gradient, reference=False):
        if reference:
            self.rule_cpu(problem, tables, indices, slot_indices, gradient)
            return
        device = {k: self.to_device(a) for k, a in tables.items()}
        try:
            self.kernels.masked_sparse_apply_rule_gpu(
                problem.rule,
                device["var"],
                [device[name] for name in problem.slot_names],
                self.to_device(indices),
                None if slot_indices is None else self.to_device(slot_indices),
                self.to_device(gradient),
                self.to_device(problem.row_mask),
                problem.hyper,
                dtype=dtype_argument(problem.value_dtype),
            )
        finally:
            for key, array in device.items():
                tables[key][...] = self.to_host(array, tables[key])

    def quantized_lookup(self, arrays, out, row_of, reference=False) -> None:
        if reference:
            self.quantized_lookup_cpu(arrays, out, row_of)
            return
        device_out, device_row_of = self.to_device(out), self.to_device(row_of)
        try:
            self.kernels.quantized_lookup_gpu(
                *(self.to_device(a) for a in arrays), device_out, device_row_of
            )
        finally:
            out[...] = self.to_host(device_out, out)
            row_of[...] = self.to_host(device_row_of, row_of)

    def bag_gradient(self, problem):
        n = problem.ids.size
        rows = self.empty((n,), problem.ids.dtype.type)
        values = self.empty((n, problem.grad.shape[1]), STORAGE[problem.value_dtype])
        count = self.kernels.masked_embedding_bag_grad_gpu(
            self.to_device(problem.grad),
            self.to_device(problem.ids),
            self.to_device(problem.bags),
            self.to_device(problem.factors),
            self.to_device(problem.row_mask),
            rows,
            values,
            dtype=dtype_argument(problem.value_dtype),
        )
        return self.to_host(rows, problem.ids)[:count], self.to_host(values, problem.grad)[:count]


class TensorFlowBackend:
    """The installed package's TensorFlow ops on ``tf.Variable``s placed on
    ``device`` (``/GPU:0``; ``/CPU:0`` runs the CPU op kernels): the same
    rules as the module's entry points, through the op wrapper
    ``masked_scatter_sub`` and the raw ops (MaskedSparseApplyRule and its
    compact-slot twin, QuantizedLookup, MaskedEmbeddingBagGrad,
    EmbeddingBag) where the public functions wrap them in more. TensorFlow is imported
    here only: the other back ends run where it is absent. An op without a
    GPU kernel (the bag ops) runs on the CPU, as TensorFlow would place it.
    """

    front_end = "tensorflow"

    def __init__(self, device: str = "/GPU:0"):
        import tensorflow as tf

        from partial_embedding import _build_info, _kernels
        from partial_embedding._loader import load_ops
        from partial_embedding.ops import masked_scatter_sub

        self.tf, self.ops, self.device = tf, load_ops(), device
        self.masked_scatter_sub = masked_scatter_sub
        # The rule table, and how the GPU kernel sums a row's occurrences
        # (cc/core/masked_sparse_apply_gpu.h), from the package's own module.
        self.rules = getattr(_kernels, "RULES", {})
        self.device_type = tf.DeviceSpec.from_string(device).device_type
        self.on_gpu = self.device_type == "GPU"
        self.name = "tf " + device.strip("/")
        self.rounds_once = self.on_gpu
        self.rule_piece_size = _kernels.RULE_GPU_PIECE_SIZE if self.on_gpu else None
        bags_on_gpu = self.on_gpu and _build_info.gpu_kernel_available("MaskedEmbeddingBagGrad")
        self.bag_device = device if bags_on_gpu else "/CPU:0"
        self.bag_rows_ascending = bags_on_gpu
        self.checks_bag_forward = not self.on_gpu

    def refusal(self, error_type):
        del error_type  # The ops raise InvalidArgumentError for every refusal.
        return self.tf.errors.InvalidArgumentError

    @staticmethod
    def message(error) -> str:
        """The kernel's own text, without TensorFlow's function-node prefix
        and op suffix."""
        text = getattr(error, "message", str(error))
        text = re.sub(r"^\{\{[^}]*\}\}\s*", "", text)
        return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.DOTALL)

    @staticmethod
    def lacks(entry: str) -> str | None:
        del entry  # The op library has every op.
        return None

    def _value(self, array):
        """A host array as TensorFlow takes it (bfloat16 from its bits)."""
        return array.view(self.tf.bfloat16.as_numpy_dtype) if array.dtype == np.uint16 else array

    @staticmethod
    def _host(value, like):
        return np.asarray(value.numpy()).view(like.dtype)

    def _placed(self, value, device):
        """``value`` (a variable or an op's output) when it is on ``device``'s type."""
        where = self.tf.DeviceSpec.from_string(value.device).device_type
        if where != self.tf.DeviceSpec.from_string(device).device_type:
            raise RuntimeError(f"{self.name}: placed on {value.device}, not on {device}")
        return value

    def _variable(self, array, device=None):
        device = device or self.device
        with self.tf.device(device):
            return self._placed(self.tf.Variable(self._value(array)), device)

    @contextlib.contextmanager
    def _determinism(self, deterministic: bool):
        """MaskedScatterSub's GPU kernel takes its deterministic path where
        TensorFlow's op determinism is on."""
        from tensorflow.python.framework import config

        was = config.is_op_determinism_enabled()
        if deterministic != was:
            config.enable_op_determinism() if deterministic else config.disable_op_determinism()
        try:
            yield
        finally:
            if deterministic != was:
                config.enable_op_determinism() if was else config.disable_op_determinism()

    def scatter_sub(self, problem, var, deterministic):
        table = self._variable(var)
        error = None
        try:
            with self._determinism(deterministic), self.tf.device(self.device):
                self.masked_scatter_sub(
                    table, problem.indices, self._value(problem.updates), problem.row_mask
                )
        except self.tf.errors.InvalidArgumentError as raised:
            error = raised
        return self._host(table, var), error

    def rule_step(self, problem, tables, indices, slot_indices, gradient, reference=False):
        device = "/CPU:0" if reference else self.device
        variables = {k: self._variable(a, device) for k, a in tables.items()}
        inputs = dict(
            var=variables["var"].handle,
            slots=[variables[name].handle for name in problem.slot_names],
            indices=indices,
            grad=self._value(gradient),
            row_mask=problem.row_mask,
            hyperparameters=self._value(from_float(np.array(problem.hyper), problem.value_dtype)),
            rule=problem.rule,
        )
        try:
            with self.tf.device(device):
                if slot_indices is None:
                    self.ops.partial_embedding_masked_sparse_apply_rule(**inputs)
                else:
                    self.ops.partial_embedding_masked_sparse_apply_rule_with_slot_indices(
                        slot_indices=slot_indices, **inputs
                    )
        finally:
            for key, variable in variables.items():
                tables[key][...] = self._host(variable, tables[key])

    def quantized_lookup(self, arrays, out, row_of, reference=False) -> None:
        device = "/CPU:0" if reference else self.device
        codes, scales, store, sorted_ids, store_index, ids = arrays
        with self.tf.device(device):
            rows, store_rows = self.ops.partial_embedding_quantized_lookup(
                codes=codes,
                scales=scales,
                store=store,
                sorted_ids=sorted_ids,
                store_index=store_index,
                ids=ids,
            )
        out[...] = self._placed(rows, device).numpy()
        row_of[...] = store_rows.numpy()

    def bag_gradient(self, problem, device=None):
        device = device or self.bag_device
        with self.tf.device(device):
            rows, values = self.ops.partial_embedding_masked_embedding_bag_grad(
                grad=self._value(problem.grad),
                ids=problem.ids,
                bags=problem.bags,
                factors=problem.factors,
                row_mask=problem.row_mask,
            )
        return rows.numpy(), self._host(self._placed(values, device), problem.grad)

    def embedding_bag(self, params, ids, bags, num_bags, weights, combiner, value_dtype):
        del value_dtype  # params' dtype says it.
        with self.tf.device("/CPU:0"):
            out, factors = self.ops.partial_embedding_embedding_bag(
                params=self._value(params),
                ids=ids,
                bags=bags,
                num_bags=num_bags,
                weights=weights,
                combiner=combiner,
            )
        return self._host(out, params), factors.numpy()


# --- correctness ---------------------------------------------------------------


def scatter(backend, problem, var, deterministic):
    """The back end's MaskedScatterSub result; its refusal raised."""
    after, error = backend.scatter_sub(problem, var, deterministic)
    if error is not None:
        raise error
    return after


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
                    after = scatter(backend, problem, problem.var, deterministic)
                    compare(failures, name, problem, problem.var, after, backend.rounds_once)
            # Out of range: the first bad position is reported, nothing written.
            problem = Problem(rng, value_dtype, index_dtype, 64, (16,), 1000)
            problem.row_mask[:] = True
            problem.indices[[300, 301, 900]] = [64, -1, 10**6]
            for deterministic in (False, True):
                name = f"{backend.name} {value_dtype} {np.dtype(index_dtype).name} out of range"
                after, error = backend.scatter_sub(problem, problem.var, deterministic)
                failures.check(
                    error is not None
                    and "indices[300] = 64 is not in [0, 64)" in backend.message(error),
                    f"{name}: wrong or no refusal {error}",
                )
                failures.check(bits_equal(after, problem.var), f"{name}: var was written")
    # Deterministic mode twice on the same inputs: bit-identical.
    for value_dtype in VALUE_DTYPES:
        problem = Problem(rng, value_dtype, np.int64, 2000, (96,), 20000 if quick else 200000, 0.4)
        first = scatter(backend, problem, problem.var, True)
        second = scatter(backend, problem, problem.var, True)
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
                after = scatter(backend, problem, var, False)
                failures.check(
                    np.array_equal(after.view(np.uint8), var.view(np.uint8)), f"{name}: var changed"
                )
            except Exception as error:  # noqa: BLE001 - any error is a failure here.
                failures.check(False, f"{name}: raised {type(error).__name__}: {error}")


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
        dtype = dtype_argument(value_dtype)
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
    parser.add_argument(
        "--tensorflow-ops",
        action="store_true",
        help="check the installed package's TensorFlow ops on variables on --device instead "
        "(needs TensorFlow; no timing)",
    )
    parser.add_argument(
        "--device",
        default="/GPU:0",
        help="with --tensorflow-ops: where the variables live (default /GPU:0; /CPU:0 runs the "
        "same checks through the CPU op kernels)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer and smaller cases")
    parser.add_argument(
        "--max-table-gb", type=float, default=4.5, help="skip timing cases whose table is larger"
    )
    parser.add_argument(
        "--max-adam-gb",
        type=float,
        default=40.0,
        help="skip fused Adam rule timing cases whose three tables are larger",
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
    kernels = None if args.tensorflow_ops else load_kernels(args.module_dir)
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
    device = None
    if args.tensorflow_ops:
        backend = TensorFlowBackend(args.device)
        tf = backend.tf
        if backend.on_gpu and not tf.config.list_physical_devices("GPU"):
            print("gpu_check: FAIL: TensorFlow sees no GPU")
            return 2
        device = args.device
        print(f"gpu_check: TensorFlow {tf.__version__}, the package's ops on {device}")
    elif args.cpu_only:
        backend = CpuBackend(kernels)
    elif args.simt:
        if not getattr(kernels, "SIMT", False):
            print("gpu_check: FAIL: --simt needs a kernel module built with PE_SIMT=ON")
            return 2
        kernels.simt_set_seed(seed)
        backend = GpuBackend(kernels, arrays="module")
        failures = KernelTally(kernels)
        device = kernels.cuda_device_description()
        print(f"gpu_check: {kernels.cuda_device_description()}, PE_SIMT_SEED={seed}")
    else:
        if not getattr(kernels, "HAS_CUDA", False) or not kernels.cuda_device_available():
            print("gpu_check: FAIL: the module has no CUDA support or sees no GPU")
            return 2
        backend = GpuBackend(kernels)
        device = kernels.cuda_device_description()
        print(f"gpu_check: {kernels.cuda_device_description()} (arrays via {backend.name})")

    in_section(failures, "MaskedScatterSub", correctness, backend, rng, args.quick, failures)
    in_section(failures, "fused rules", rule_checks, backend, rng, failures, args.quick)
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
    if isinstance(backend, GpuBackend) and not args.simt:
        timed = in_section(
            failures, "MaskedScatterSub timing", timing, backend, rng, args.quick, args.max_table_gb
        )
        if timed is not None:
            timing_rows, summary = timed
        copy_gbps = summary["copy_gbps"] if summary else 4200.0
        timed = in_section(
            failures,
            "fused rule timing",
            rule_timing,
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
            "device": device,
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
