"""What the GPU check's modules share: the value dtypes, bfloat16 as uint16
bits, rounding as one operation in a dtype rounds, and the failure tally.

Imported by build_tools/gpu_check.py and its checks (gpu_check_rules.py,
gpu_check_lookup.py, gpu_check_bags.py); NumPy only.
"""

from __future__ import annotations

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


def dtype_argument(value_dtype: str) -> str | None:
    """The kernel module's dtype= argument: bfloat16 travels as uint16 bits."""
    return "bfloat16" if value_dtype == "bfloat16" else None


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


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bytes (NaNs and signed zeros included)."""
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)
    )


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


class Failures:
    def __init__(self):
        self.messages: list[str] = []
        self.checks = 0

    def check(self, condition: bool, message: str) -> None:
        self.checks += 1
        if not condition:
            self.messages.append(message)
            print(f"  FAIL: {message}", flush=True)


# --- device arrays through the kernel module -----------------------------------


class ModuleDeviceArray:
    """A C-contiguous device array in memory the kernel module allocated
    (cudaMalloc of its CUDA runtime: a GPU's, or the SIMT emulator's), handed
    to the module's GPU entry points through __cuda_array_interface__."""

    def __init__(self, kernels, shape, dtype):
        self.kernels = kernels
        self.shape = tuple(int(dim) for dim in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.pointer = kernels.device_alloc(self.nbytes)

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.pointer, False),
            "strides": None,
            "version": 3,
        }

    def __del__(self):
        pointer, self.pointer = getattr(self, "pointer", 0), 0
        if pointer:
            self.kernels.device_free(pointer)


class ModuleArrays:
    """to_device / to_host / empty over ModuleDeviceArray."""

    def __init__(self, kernels):
        self.kernels = kernels

    def to_device(self, array):
        array = np.ascontiguousarray(array)
        device = ModuleDeviceArray(self.kernels, array.shape, array.dtype)
        self.kernels.copy_to_device(device.pointer, array)
        return device

    def to_host(self, device, like):
        out = np.empty(device.shape, device.dtype)
        self.kernels.copy_to_host(out, device.pointer)
        return out.view(like.dtype)

    def empty(self, shape, dtype):
        return ModuleDeviceArray(self.kernels, shape, dtype)
