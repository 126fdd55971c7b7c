"""Reuses a finished build of the compiled libraries when nothing it depends on changed.

``pip install .`` builds in a fresh isolated environment each time, with its own
copy of TensorFlow at a new path: CMake then sees new include paths and new
header times and compiles the op libraries again, although nothing changed.
So the built libraries are kept under ``build/pe-build-cache/<key>/`` in the
checkout, the key a hash of what the build reads: every file under ``cc/``,
``CMakeLists.txt``, ``build_tools/cmake/``, ``setup.py``, the version file
(which pins TensorFlow's minor release), this Python's tag, ``CMAKE_ARGS``,
``PE_KERNEL_MODULE_PYTHONS``, the compilers in the environment and which CUDA
tools are on ``PATH``. A second install of an unchanged checkout copies them and
builds nothing; and since it compiles nothing, it needs neither TensorFlow nor
CMake in its build environment (``build_tools/build_backend.py`` asks for them
only when the key has no build). ``PE_REBUILD=1`` builds anyway.

Used by ``setup.py`` and ``build_tools/build_backend.py``; standard library only.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

#: What the build reads, relative to the project root: folders walked whole, and files.
SOURCE_FOLDERS = ("cc", "build_tools/cmake", "build_tools/cuda12")
SOURCE_FILES = (
    "CMakeLists.txt",
    "setup.py",
    "build_tools/build_info.json.in",
    "build_tools/build_cache.py",
    "python/partial_embedding/_version.py",
)
#: Environment variables that change what is built.
ENVIRONMENT = ("CMAKE_ARGS", "PE_KERNEL_MODULE_PYTHONS", "CXX", "CC", "CXXFLAGS", "LDFLAGS")
#: Tools whose presence changes what PE_ENABLE_CUDA=AUTO builds.
CUDA_TOOLS = ("clang++-19", "nvcc", "fatbinary")
#: The files of a build: the extensions and the build description beside them.
OUTPUT_PATTERNS = ("_partial_embedding_ops.so", "_partial_embedding_xla.so", "_kernels*.so")
BUILD_INFO = "_build_info.json"
#: How many builds are kept (the newest by use).
KEEP = 3


def _compiler_version() -> str:
    compiler = os.environ.get("CXX") or shutil.which("c++") or "c++"
    try:
        result = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return "none"
    return result.stdout.splitlines()[0] if result.stdout else "none"


def build_key(root: Path, with_kernel_module: bool) -> str:
    """A hash of everything the build reads (see the module docstring)."""
    digest = hashlib.sha256()

    def add(label: str, value: bytes) -> None:
        digest.update(label.encode() + b"\0" + value + b"\0")

    paths = [root / name for name in SOURCE_FILES]
    for folder in SOURCE_FOLDERS:
        paths += sorted(path for path in (root / folder).rglob("*") if path.is_file())
    for path in paths:
        if path.is_file() and "__pycache__" not in path.parts:
            add(path.relative_to(root).as_posix(), path.read_bytes())
    add("python", f"{sys.implementation.cache_tag} {platform.machine()}".encode())
    add("kernel module", str(with_kernel_module).encode())
    for name in ENVIRONMENT:
        add(name, os.environ.get(name, "").encode())
    for tool in CUDA_TOOLS:
        add(tool, str(shutil.which(tool)).encode())
    add("compiler", _compiler_version().encode())
    return digest.hexdigest()[:24]


class BuildCache:
    """The kept build for one key, in ``<root>/build/pe-build-cache/<key>``."""

    def __init__(self, root: Path, with_kernel_module: bool) -> None:
        self.enabled = os.environ.get("PE_REBUILD", "0") != "1"
        self.folder = root / "build" / "pe-build-cache" / build_key(root, with_kernel_module)

    def _files(self, folder: Path) -> list[Path]:
        found: list[Path] = []
        for pattern in OUTPUT_PATTERNS:
            found += sorted(folder.glob(pattern))
        return found

    def available(self) -> bool:
        """Whether a finished build is kept for this key."""
        return (
            self.enabled
            and (self.folder / "complete").is_file()
            and bool(self._files(self.folder))
            and (self.folder / BUILD_INFO).is_file()
        )

    def restore(self, output_dir: Path, build_info_copy: Path | None = None) -> bool:
        """Copies the kept build into ``output_dir`` (and its build description
        to ``build_info_copy`` too, if given); False where none is kept."""
        if not self.available():
            return False
        output_dir.mkdir(parents=True, exist_ok=True)
        for path in [*self._files(self.folder), self.folder / BUILD_INFO]:
            shutil.copy2(path, output_dir / path.name)
        if build_info_copy is not None:
            shutil.copy2(self.folder / BUILD_INFO, build_info_copy)
        (self.folder / "complete").touch()
        print(f"partial_embedding: reusing the build kept in {self.folder} (PE_REBUILD=1 rebuilds)")
        return True

    def store(self, output_dir: Path, build_info: Path) -> None:
        """Keeps the build just made in ``output_dir`` (its description in
        ``build_info``); drops the oldest kept builds past ``KEEP``."""
        files = self._files(output_dir)
        if not self.enabled or not files or not build_info.is_file():
            return
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        for path in files:
            shutil.copy2(path, self.folder / path.name)
        shutil.copy2(build_info, self.folder / BUILD_INFO)
        (self.folder / "complete").touch()
        kept = sorted(
            (path for path in self.folder.parent.iterdir() if (path / "complete").is_file()),
            key=lambda path: (path / "complete").stat().st_mtime,
            reverse=True,
        )
        for old in kept[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
