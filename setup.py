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

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "build_tools"))
import build_cache  # noqa: E402


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


def kernel_module_pythons() -> list[tuple[str, str]]:
    """``(python tag, interpreter)`` for each interpreter named in
    ``PE_KERNEL_MODULE_PYTHONS`` (paths separated by ``os.pathsep``): other
    CPython versions to build the pybind11 kernel module for, beside the one
    running the build. The TensorFlow libraries are the same for every Python;
    only the kernel module is per Python, so one wheel can carry one for each
    (see docs/wheels.md)."""
    found: dict[str, str] = {}
    for interpreter in filter(
        None, os.environ.get("PE_KERNEL_MODULE_PYTHONS", "").split(os.pathsep)
    ):
        result = subprocess.run(
            [interpreter, "-c", PYTHON_TAG_CODE], capture_output=True, text=True, check=False
        )
        tag = result.stdout.strip()
        if result.returncode != 0 or not tag.startswith("cp"):
            raise SystemExit(
                f"PE_KERNEL_MODULE_PYTHONS: {interpreter!r} is not a CPython interpreter "
                f"that runs ({result.stderr.strip() or tag})"
            )
        if tag != THIS_PYTHON_TAG:
            found.setdefault(tag, interpreter)
    return sorted(found.items(), key=lambda item: int(item[0][2:]))


PYTHON_TAG_CODE = (
    "import sys; print(('cp' if sys.implementation.name == 'cpython' else 'other') "
    "+ '%d%d' % sys.version_info[:2])"
)
THIS_PYTHON_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"


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
        in_place = getattr(self, "editable_mode", False) or self.inplace
        with_kernel_module = KERNELS_EXTENSION in [extension.name for extension in self.extensions]
        # An unchanged checkout reuses its last build (build_tools/build_cache.py).
        cache = build_cache.BuildCache(ROOT, with_kernel_module)
        build_info_copy = ROOT / "python" / "partial_embedding" / "_build_info.json"
        if cache.restore(output_dir, build_info_copy if in_place else None):
            report_cpu_only_fallback(output_dir / "_build_info.json")
            return
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
            if KERNELS_EXTENSION in [extension.name for extension in self.extensions]:
                # The same build compiles the kernel module for each other
                # Python too, sharing the TF-free core (CMakeLists.txt).
                others = [interpreter for _, interpreter in kernel_module_pythons()]
                configure.append(f"-DPE_KERNEL_MODULE_PYTHONS={';'.join(others)}")
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build_temp), "--parallel", jobs], check=True)
        report_cpu_only_fallback(build_temp / "_build_info.json")
        cache.store(output_dir, build_temp / "_build_info.json")
        if in_place:
            # An editable install copies only the extensions back into the
            # source tree: build_info() reads this file beside them.
            shutil.copy2(build_temp / "_build_info.json", build_info_copy)


class KernelModuleWheel(bdist_wheel):
    """Tags the wheel for every CPython it carries a kernel module for."""

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, platform = super().get_tag()
        others = [tag for tag, _ in kernel_module_pythons()]
        if not others or not self.distribution.has_ext_modules():
            return python, abi, platform
        # The op libraries link TensorFlow, not Python: any CPython whose
        # TensorFlow loads them can use them; the kernel module is per version.
        tags = sorted({python, *others}, key=lambda tag: int(tag[2:]))
        return ".".join(tags), "none", platform


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
    python_requires=">=3.10",
    package_dir={"": "python"},
    packages=find_packages("python"),
    # The kernel module (CPU microbenchmarks, GPU tests without TensorFlow) is
    # built whenever pybind11 is importable, as it is in an isolated build.
    ext_modules=[CMakeExtension(OPS_EXTENSION)]
    + ([CMakeExtension(KERNELS_EXTENSION)] if pybind11_cmake_dir() else [])
    + ([CMakeExtension(XLA_EXTENSION)] if xla_custom_calls_requested() else []),
    cmdclass={"build_ext": CMakeBuild, "bdist_wheel": KernelModuleWheel},
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
            "keras-rs>=0.4; python_version >= '3.11'",
        ],
        "plot": ["matplotlib"],
        "demo": ["gensim"],
        "keras-hub": ["keras-hub>=0.32", "tensorflow-text"],
        # keras-rs itself needs Python >= 3.11 (pe.DistributedEmbedding).
        "keras-rs": ["keras-rs>=0.4; python_version >= '3.11'"],
    },
    zip_safe=False,
)
