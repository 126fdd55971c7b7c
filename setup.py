"""Builds tf-partial-embedding: the op library is compiled by CMake.

Compiler and linker flags for TensorFlow come from ``tf.sysconfig`` only (see
build_tools/cmake/FindTensorFlow.cmake). Extra CMake arguments may be passed in
the ``CMAKE_ARGS`` environment variable, e.g. ``-DPE_ENABLE_CUDA=ON``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def read_version() -> dict[str, str]:
    namespace: dict[str, str] = {}
    exec((ROOT / "python/partial_embedding/_version.py").read_text(), namespace)
    return namespace


OPS_EXTENSION = "partial_embedding._partial_embedding_ops"
KERNELS_EXTENSION = "partial_embedding._kernels"
XLA_EXTENSION = "partial_embedding._partial_embedding_xla"


def xla_custom_calls_requested() -> bool:
    """Whether the XLA custom-call library is built: yes unless CMAKE_ARGS says
    -DPE_ENABLE_XLA_FFI=OFF (it makes MaskedOptimizer's jit_compile=True steps
    on the CPU one custom call; it needs libtensorflow_cc.so.2 and tf2xla's
    headers, which the TensorFlow wheel ships)."""
    return "-DPE_ENABLE_XLA_FFI=OFF" not in shlex.split(os.environ.get("CMAKE_ARGS", ""))


def pybind11_cmake_dir() -> str | None:
    """pybind11's CMake directory, or None when pybind11 is not installed."""
    try:
        import pybind11
    except ImportError:
        return None
    return str(pybind11.get_cmake_dir())


class CMakeExtension(Extension):
    """An extension whose shared library CMake builds; it has no sources here."""

    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds the CMake project into the package directory."""

    def get_ext_filename(self, fullname: str) -> str:
        # The op library is loaded with tf.load_op_library, not imported, so it
        # keeps a plain name (no Python ABI suffix) that the loader can find.
        if fullname in (OPS_EXTENSION, XLA_EXTENSION):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        # One CMake project builds every extension at once.
        if getattr(self, "_cmake_done", False):
            return
        self._cmake_done = True
        output_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_temp = Path(self.build_temp).resolve() / "cmake"
        build_temp.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build_temp),
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DPE_OUTPUT_DIR={output_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
            # No build RPATH naming this machine's TensorFlow directory: the op
            # library finds libtensorflow_framework.so.2 already loaded by
            # `import tensorflow`, which always comes first.
            "-DCMAKE_SKIP_BUILD_RPATH=ON",
            # Look for the CUDA toolchain at every build, whatever an earlier
            # configure of this build folder found; an explicit
            # -DPE_ENABLE_CUDA=ON/OFF in CMAKE_ARGS comes later and wins.
            "-DPE_ENABLE_CUDA=AUTO",
        ]
        if xla_custom_calls_requested():
            # Before CMAKE_ARGS: an explicit -DPE_ENABLE_XLA_FFI=OFF there wins.
            configure.append("-DPE_ENABLE_XLA_FFI=ON")
        pybind11_dir = pybind11_cmake_dir()
        if pybind11_dir is None:
            configure.append("-DPE_BUILD_KERNEL_MODULE=OFF")
        else:
            configure += ["-DPE_BUILD_KERNEL_MODULE=ON", f"-Dpybind11_DIR={pybind11_dir}"]
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build_temp), "--parallel", jobs], check=True)
        report_cpu_only_fallback(build_temp / "_build_info.json")
        if getattr(self, "editable_mode", False) or self.inplace:
            # An editable install copies only the extensions back into the
            # source tree: build_info() reads this file beside them.
            shutil.copy2(build_temp / "_build_info.json", ROOT / "python" / "partial_embedding")


def report_cpu_only_fallback(info_file: Path) -> None:
    """Repeats CMake's CPU-only warning at the end of the build's output."""
    try:
        info = json.loads(info_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not info.get("cuda") and info.get("cuda_fallback"):
        print(
            f"WARNING: partial_embedding was built CPU-only: {info['cuda_fallback']}. "
            "partial_embedding.build_info() says so too.",
            file=sys.stderr,
        )


def minor_line(release: str) -> str:
    """The requirement for one minor release line: "2.21" -> ">=2.21,<2.22"."""
    major, minor = release.split(".")
    return f">={major}.{minor},<{major}.{int(minor) + 1}"


versions = read_version()

setup(
    name="tf-partial-embedding",
    version=versions["__version__"],
    description=(
        "TensorFlow ops, a Keras layer and optimizer wrapper that train only "
        "some rows of an embedding table, in place"
    ),
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    package_dir={"": "python"},
    packages=find_packages("python"),
    # The kernel module (CPU microbenchmarks, GPU tests without TensorFlow) is
    # built whenever pybind11 is importable, as it is in an isolated build.
    ext_modules=[CMakeExtension(OPS_EXTENSION)]
    + ([CMakeExtension(KERNELS_EXTENSION)] if pybind11_cmake_dir() else [])
    + ([CMakeExtension(XLA_EXTENSION)] if xla_custom_calls_requested() else []),
    cmdclass={"build_ext": CMakeBuild},
    # The op library loads into one TensorFlow minor release only; any Keras 3
    # that TensorFlow accepts installs (the private members the wrappers need
    # are checked at construction; CI tests _version.TESTED_KERAS_LINES).
    install_requires=[
        f"tensorflow{minor_line(versions['REQUIRED_TENSORFLOW'])}",
        f"keras>={versions['MIN_KERAS']},<4",
        "numpy",
    ],
    extras_require={
        "test": [
            "pytest",
            "pytest-xdist",
            "hypothesis",
            "gensim",
            "matplotlib",
            "keras-hub>=0.32",
            "tensorflow-text",
        ],
        "plot": ["matplotlib"],
        "demo": ["gensim"],
        "keras-hub": ["keras-hub>=0.32", "tensorflow-text"],
    },
    zip_safe=False,
)
