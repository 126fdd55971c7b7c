"""PE_ENABLE_CUDA across configures of one build folder (issue 24, item 3).

A folder first configured without the CUDA pieces must not stay CPU-only once
they are installed: only an explicit PE_ENABLE_CUDA=OFF sticks. Each test
configures a scratch folder (no compiling; neither the op library nor the
kernel module is asked for, so TensorFlow is not imported) and reads the
cache and the _build_info.json CMake writes there.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed"),
    pytest.mark.skipif(
        not (ROOT / "CMakeLists.txt").is_file(), reason="needs the source tree (CMakeLists.txt)"
    ),
]


def _configure(build: Path, *options: str) -> str:
    """Configures `build` and returns CMake's output; fails the test on an error."""
    command = [
        "cmake", "-S", str(ROOT), "-B", str(build),
        f"-DPython3_EXECUTABLE={sys.executable}",
        "-DPE_BUILD_TF_OPS=OFF", "-DPE_BUILD_KERNEL_MODULE=OFF",
        f"-DPE_OUTPUT_DIR={build / 'out'}", *options,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def _cached(build: Path, name: str) -> tuple[str, str]:
    """The cache entry `name` as (type, value)."""
    text = (build / "CMakeCache.txt").read_text(encoding="utf-8")
    match = re.search(rf"^{name}:(\w+)=(.*)$", text, re.M)
    assert match, f"{name} is not in the cache"
    return match.group(1), match.group(2)


def _info(build: Path) -> dict:
    return json.loads((build / "_build_info.json").read_text(encoding="utf-8"))


def _hide_ptxas(tmp_path: Path) -> str:
    """An option that makes the CUDA 12 line miss ptxas: a folder without it."""
    empty = tmp_path / "no-ptxas"
    empty.mkdir(exist_ok=True)
    return f"-DPE_CUDA12_NVCC_DIR={empty}"


def test_explicit_off_stays_off(tmp_path):
    build = tmp_path / "build"
    output = _configure(build, "-DPE_ENABLE_CUDA=OFF")
    assert "CPU-ONLY BUILD" not in output
    assert _cached(build, "PE_ENABLE_CUDA")[1] == "OFF"
    output = _configure(build)
    assert _cached(build, "PE_ENABLE_CUDA")[1] == "OFF"
    info = _info(build)
    assert info["cuda"] is False and info["cuda_setting"] == "OFF"
    assert info["cuda_reason"] == "PE_ENABLE_CUDA=OFF was given" and info["cuda_fallback"] == ""
    assert "PE_CUDA_ENABLED=OFF (PE_ENABLE_CUDA=OFF was given)" in output


def test_a_fallback_is_loud_and_not_cached(tmp_path):
    build = tmp_path / "build"
    output = _configure(build, _hide_ptxas(tmp_path))
    assert "CMake Warning" in output and "CPU-ONLY BUILD" in output
    assert "nvidia-cuda-nvcc-cu12" in output
    info = _info(build)
    assert info["cuda"] is False and info["cuda_setting"] == "AUTO"
    assert "ptxas" in info["cuda_fallback"] and "PE_CUDA12_NVCC_DIR=" in info["cuda_fallback"]
    # What detection found is not what the cache keeps: AUTO stays AUTO.
    assert _cached(build, "PE_ENABLE_CUDA") == ("STRING", "AUTO")
    cache = (build / "CMakeCache.txt").read_text(encoding="utf-8")
    assert "PE_CUDA_ENABLED" not in cache


def test_a_cache_from_before_auto_is_redetected(tmp_path):
    build = tmp_path / "build"
    _configure(build, _hide_ptxas(tmp_path))
    # What option(PE_ENABLE_CUDA ... OFF) left in a folder before AUTO existed.
    cache_file = build / "CMakeCache.txt"
    cache = cache_file.read_text(encoding="utf-8")
    cache = re.sub(r"^PE_ENABLE_CUDA:STRING=AUTO$", "PE_ENABLE_CUDA:BOOL=OFF", cache, flags=re.M)
    cache_file.write_text(cache, encoding="utf-8")
    output = _configure(build)
    assert "comes from an older configure of this folder: re-detecting" in output
    assert _cached(build, "PE_ENABLE_CUDA") == ("STRING", "AUTO")
    assert _info(build)["cuda_setting"] == "AUTO"


def _cuda12_line_missing() -> str:
    missing = []
    if not any(shutil.which(name) for name in ("clang++-19", "clang++-20", "clang++-18")):
        missing.append("clang-19")
    for package in ("nvidia.cuda_nvcc", "nvidia.cuda_cccl", "tensorflow"):
        try:
            found = importlib.util.find_spec(package) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(package)
    if not (shutil.which("fatbinary") or Path("/usr/local/cuda/bin/fatbinary").exists()):
        missing.append("fatbinary")
    return ", ".join(missing)


@pytest.mark.skipif(
    bool(_cuda12_line_missing()),
    reason=f"the CUDA 12 line is not installed here (lacks {_cuda12_line_missing()})",
)
def test_hidden_then_visible_turns_cuda_on(tmp_path):
    build = tmp_path / "build"
    _configure(build, _hide_ptxas(tmp_path))
    assert _info(build)["cuda"] is False
    # The pieces appear (here: the ptxas folder is no longer overridden).
    output = _configure(build, "-DPE_CUDA12_NVCC_DIR=")
    assert "CPU-ONLY BUILD" not in output
    info = _info(build)
    assert info["cuda"] is True and info["cuda_setting"] == "AUTO"
    assert info["cuda_sass"] == ["sm_75", "sm_80", "sm_90"] and info["cuda_ptx"] == ["compute_90"]
    assert "PE_CUDA_ENABLED=ON" in output


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc) on PATH")
def test_nvcc_hidden_then_visible_turns_cuda_on(tmp_path, monkeypatch):
    build = tmp_path / "build"
    # check_language(CUDA) caches a compiler it did not find as NOTFOUND: the
    # next configure must look again all the same.
    monkeypatch.setenv("CUDACXX", str(tmp_path / "no-nvcc" / "nvcc"))
    output = _configure(build, "-DPE_CUDA_TOOLCHAIN=nvcc")
    assert "CPU-ONLY BUILD" in output and _info(build)["cuda"] is False
    monkeypatch.delenv("CUDACXX")
    output = _configure(build)
    assert "CPU-ONLY BUILD" not in output
    info = _info(build)
    assert info["cuda"] is True and info["cuda_toolchain"] == "nvcc"
    assert info["cuda_setting"] == "AUTO" and info["cuda_ptx"] == ["compute_90"]
