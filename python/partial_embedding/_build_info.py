"""What the installed op library was built with, and the CPU-only-build guards.

CMake writes ``_build_info.json`` next to the op library each time it links it
(``build_tools/cmake/PeBuildInfo.cmake``), so the file always describes the
library beside it and travels into the wheel with it. It is a build output:
never committed.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from typing import Any

from partial_embedding.errors import PartialEmbeddingArgumentError

BUILD_INFO_FILE = "_build_info.json"

#: The ops that have a GPU kernel when the library is built with CUDA (the
#: others run on the CPU only). TensorFlow's names, without the namespace.
GPU_KERNEL_OPS = frozenset(
    {
        "MaskedScatterSub",
        "MaskedSparseApplyRule",
        "MaskedSparseApplyRuleWithSlotIndices",
        "QuantizedLookup",
        "MaskedEmbeddingBagApplyRule",
        "MaskedEmbeddingBagApplyRuleWithSlotMap",
    }
)

#: How to get the CUDA kernels: the fix the CPU-only warnings name.
CUDA_BUILD_FIX = (
    "apt-get install clang-19; pip install -r build_tools/requirements-cuda12.txt; "
    "then, in the source tree, pip install --no-build-isolation . "
    '(CMAKE_ARGS="-DPE_ENABLE_CUDA=ON" turns a missing CUDA piece into a build error)'
)

# Every key build_info() returns, with its value where the file is missing.
_UNKNOWN: dict[str, Any] = {
    "available": False,
    "path": None,
    "cuda": False,
    "cuda_setting": None,
    "cuda_reason": None,
    "cuda_fallback": None,
    "cuda_toolchain": None,
    "cuda_compiler": None,
    "cuda_line": None,
    "cuda_architectures": [],
    "cuda_sass": [],
    "cuda_ptx": [],
    "kernel_module_cuda": False,
    "cxx_compiler": None,
    "tensorflow_version": None,
    "tensorflow_definitions": [],
    "tensorflow_cxx11_abi": None,
    "build_type": None,
    "cmake_version": None,
}

_warned_lock = threading.Lock()
_warned = False


def build_info_path() -> str:
    """Returns where the build description of the installed op library lives."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), BUILD_INFO_FILE)


def build_info() -> dict[str, Any]:
    """Describes how the installed op library was built.

    Read from ``_build_info.json``, which CMake writes beside the op library
    when it links it. A package used straight from a source tree that was
    never built has no such file: then ``available`` is False and the other
    keys hold None, False or an empty list.

    Returns:
      A new dict with these keys:

      - ``available`` (bool): the file was found and read.
      - ``path`` (str | None): the file read.
      - ``cuda`` (bool): the op library has CUDA kernels.
      - ``cuda_setting`` (str): ``PE_ENABLE_CUDA`` as configured: ``"AUTO"``
        (look for the toolchain), ``"ON"`` or ``"OFF"``.
      - ``cuda_reason`` (str): one line saying why CUDA is on or off.
      - ``cuda_fallback`` (str): with ``"AUTO"``, what the CUDA toolchain
        lacked when the build fell back to CPU-only; ``""`` otherwise.
      - ``cuda_toolchain`` (str): ``"clang12"`` (clang with the CUDA 12.5
        line) or ``"nvcc"``.
      - ``cuda_compiler`` (str): the CUDA compiler and its version line;
        ``""`` without CUDA.
      - ``cuda_line`` (str): the CUDA headers, ptxas release and runtime used;
        ``""`` without CUDA.
      - ``cuda_architectures`` (list[str]): CMake's architectures, e.g.
        ``["75-real", "80-real", "90"]``.
      - ``cuda_sass`` (list[str]): machine code targets, e.g. ``["sm_75",
        "sm_80", "sm_90"]``.
      - ``cuda_ptx`` (list[str]): PTX targets, e.g. ``["compute_90"]``.
      - ``kernel_module_cuda`` (bool): the pybind11 ``_kernels`` module has
        the CUDA kernels too.
      - ``cxx_compiler`` (str): the host C++ compiler, version and path.
      - ``tensorflow_version`` (str): the TensorFlow the op library was
        compiled against.
      - ``tensorflow_definitions`` (list[str]): TensorFlow's ``-D`` compile
        flags, e.g. ``"_GLIBCXX_USE_CXX11_ABI=1"``.
      - ``tensorflow_cxx11_abi`` (str): that ABI flag's value (``"1"``).
      - ``build_type`` (str): CMake's build type, e.g. ``"Release"``.
      - ``cmake_version`` (str): the CMake that configured the build.

    Example:
      >>> import partial_embedding as pe
      >>> info = pe.build_info()
      >>> isinstance(info["cuda"], bool), "tensorflow_version" in info
      (True, True)
    """
    return read_build_info(build_info_path())


def read_build_info(path: str) -> dict[str, Any]:
    """Reads a ``_build_info.json`` into build_info()'s dict (see there)."""
    info = {key: list(v) if isinstance(v, list) else v for key, v in _UNKNOWN.items()}
    try:
        with open(path, encoding="utf-8") as file:
            recorded = json.load(file)
    except (OSError, ValueError):
        return info
    if not isinstance(recorded, dict):
        return info
    for key in _UNKNOWN:
        if key in recorded:
            info[key] = recorded[key]
    info["available"] = True
    info["path"] = path
    info["cuda"] = bool(info["cuda"])
    info["kernel_module_cuda"] = bool(info["kernel_module_cuda"])
    return info


def _visible_gpus() -> list[Any]:
    # Imported here: the package imports TensorFlow before this runs anyway.
    import tensorflow as tf

    try:
        return list(tf.config.list_physical_devices("GPU"))
    except Exception:  # noqa: BLE001 - a broken CUDA setup must not break import.
        return []


def warn_if_gpu_without_cuda_kernels(info: dict[str, Any] | None = None) -> bool:
    """Warns, once per process, when TensorFlow sees a GPU the op library cannot use.

    Args:
      info: a build_info() dict; read from the installed package when None.

    Returns:
      True when the warning was issued by this call.
    """
    global _warned
    info = build_info() if info is None else info
    if not info["available"] or info["cuda"]:
        return False
    with _warned_lock:
        if _warned:
            return False
        gpus = _visible_gpus()
        if not gpus:
            return False
        _warned = True
    why = info["cuda_fallback"] or info["cuda_reason"] or "built without CUDA"
    warnings.warn(
        f"partial_embedding: TensorFlow sees {len(gpus)} GPU(s), but this build of the "
        f"op library has no CUDA kernels ({why}); masked updates of variables on a "
        f"GPU will fail. To build with CUDA: {CUDA_BUILD_FIX}. "
        "partial_embedding.build_info() describes the build.",
        RuntimeWarning,
        stacklevel=2,
    )
    return True


_gpus_visible: bool | None = None


def gpus_visible() -> bool:
    """Whether TensorFlow sees a GPU (asked once: the answer cannot change
    once TensorFlow has initialized its devices). Lets the op wrappers skip
    :func:`check_gpu_kernel` on a machine without one."""
    global _gpus_visible
    if _gpus_visible is None:
        _gpus_visible = bool(_visible_gpus())
    return _gpus_visible


def check_gpu_kernel(op_name: str, device: str, argument: str = "variable") -> None:
    """Refuses to place `op_name` on a GPU device where it has no GPU kernel.

    Args:
      op_name: TensorFlow's name of the op, without the ``PartialEmbedding>``
        namespace (e.g. ``"MaskedScatterSub"``).
      device: the device string of the variable the op updates.
      argument: the argument that holds the variable, named in the error.

    Raises:
      PartialEmbeddingArgumentError: the device is a GPU and this build has no
        GPU kernel for the op.
    """
    if "GPU" not in device.upper():
        return
    info = build_info()
    if info["cuda"] and op_name in GPU_KERNEL_OPS:
        return
    if not info["cuda"]:
        why = (
            "this build of the op library has no CUDA kernels "
            f"({info['cuda_fallback'] or info['cuda_reason'] or 'built without CUDA'}); "
            f"to build with CUDA: {CUDA_BUILD_FIX}"
        )
    else:
        why = f"{op_name} has a CPU kernel only; place the variable on the CPU"
    raise PartialEmbeddingArgumentError(f"{argument}: the variable is on {device}, but {why}")


def gpu_kernel_available(op_name: str) -> bool:
    """Whether this build has a GPU kernel for ``op_name`` (TensorFlow's name,
    without the ``PartialEmbedding>`` namespace)."""
    return op_name in GPU_KERNEL_OPS and bool(build_info()["cuda"])


#: Set to 1 to route GPU variables to the fused CUDA kernels (see
#: :func:`gpu_fused_kernel_chosen`).
GPU_FUSED_ENVIRONMENT = "PARTIAL_EMBEDDING_GPU_FUSED"

#: The GPU kernels a step takes only where ``GPU_FUSED_ENVIRONMENT`` is 1:
#: they have not run on a GPU yet (their checks pass through the CPU kernels).
OPT_IN_GPU_KERNEL_OPS = frozenset(
    {
        "MaskedSparseApplyRule",
        "MaskedSparseApplyRuleWithSlotIndices",
        "QuantizedLookup",
        "MaskedEmbeddingBagApplyRule",
        "MaskedEmbeddingBagApplyRuleWithSlotMap",
    }
)


def gpu_fused_kernel_chosen(op_name: str) -> bool:
    """Whether a step traced now sends a GPU variable to ``op_name``'s CUDA
    kernel rather than to composed stock ops: where the build has the kernel
    and, for the kernels not yet run on a GPU (``OPT_IN_GPU_KERNEL_OPS``),
    where ``PARTIAL_EMBEDDING_GPU_FUSED=1``."""
    if not gpu_kernel_available(op_name):
        return False
    return op_name not in OPT_IN_GPU_KERNEL_OPS or os.environ.get(GPU_FUSED_ENVIRONMENT) == "1"


def check_variable_placement(op_name: str, variable: Any, argument: str) -> None:
    """:func:`check_gpu_kernel` for ``variable``'s device, where TensorFlow sees
    a GPU at all (elsewhere no variable can be on one, and reading the device
    is skipped: the op wrappers call this on every update)."""
    if gpus_visible():
        check_gpu_kernel(op_name, variable.device, argument)
