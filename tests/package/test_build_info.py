"""Tests of build_info(), the CPU-only-build warning and the GPU-kernel check."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding import _build_info, _loader

_KEYS = {
    "available", "path", "cuda", "cuda_setting", "cuda_reason", "cuda_fallback",
    "cuda_toolchain", "cuda_compiler", "cuda_line", "cuda_architectures", "cuda_sass",
    "cuda_ptx", "kernel_module_cuda", "cxx_compiler", "tensorflow_version",
    "tensorflow_definitions", "tensorflow_cxx11_abi", "build_type", "cmake_version",
}  # fmt: skip

_CPU_ONLY = {
    "available": True,
    "cuda": False,
    "cuda_reason": "PE_ENABLE_CUDA=AUTO fell back to CPU-only",
    "cuda_fallback": "the clang12 CUDA toolchain lacks: clang++",
}


def _installed_info() -> dict:
    info = pe.build_info()
    if not info["available"]:
        if os.environ.get("PE_EXPECT_INSTALLED_WHEEL") == "1":
            pytest.fail(f"the installed wheel has no {_build_info.BUILD_INFO_FILE}")
        pytest.skip("no _build_info.json next to the op library (the .so was copied, not built)")
    return info


def test_build_info_is_exported_and_has_every_documented_key():
    assert "build_info" in pe.__all__
    info = pe.build_info()
    assert set(info) == _KEYS
    documented = pe.build_info.__doc__ or ""
    assert all(f"``{key}``" in documented for key in _KEYS)


def test_build_info_matches_the_library_beside_it():
    info = _installed_info()
    assert info["path"] == _build_info.build_info_path()
    assert info["tensorflow_version"] == tf.__version__
    assert (
        "_GLIBCXX_USE_CXX11_ABI=" + info["tensorflow_cxx11_abi"] in (info["tensorflow_definitions"])
    )
    assert (
        info["build_type"]
        and info["cxx_compiler"]
        and info["cuda_setting"]
        in (
            "AUTO",
            "ON",
            "OFF",
        )
    )
    # The library holds CUDA fat binaries exactly when build_info says CUDA.
    library = Path(_loader.library_path()).read_bytes()
    assert (b".nv_fatbin" in library) == info["cuda"]
    if info["cuda"]:
        assert info["cuda_sass"] and info["cuda_compiler"] and not info["cuda_fallback"]
    else:
        assert info["cuda_sass"] == [] and info["cuda_ptx"] == [] and info["cuda_compiler"] == ""
        assert info["cuda_reason"]


def test_a_missing_or_broken_file_reads_as_unavailable(tmp_path):
    assert _build_info.read_build_info(str(tmp_path / "absent.json"))["available"] is False
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    info = _build_info.read_build_info(str(broken))
    assert info["available"] is False and info["cuda"] is False and set(info) == _KEYS


def test_sass_and_ptx_are_read_back(tmp_path):
    path = tmp_path / "info.json"
    recorded = {"cuda": True, "cuda_sass": ["sm_75", "sm_90"], "cuda_ptx": ["compute_90"]}
    path.write_text(json.dumps(recorded), encoding="utf-8")
    info = _build_info.read_build_info(str(path))
    assert info["available"] and info["cuda"] is True and info["path"] == str(path)
    assert info["cuda_sass"] == ["sm_75", "sm_90"] and info["cuda_ptx"] == ["compute_90"]
    assert info["tensorflow_version"] is None


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(_build_info, "_warned", False)
    return monkeypatch


def _fake_gpus(monkeypatch, count):
    devices = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(count)]
    seen = []

    def list_physical_devices(device_type=None):
        seen.append(device_type)
        return devices if device_type == "GPU" else []

    monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
    return seen


def test_cpu_only_build_on_a_gpu_machine_warns_once_naming_the_fix(fresh_warning):
    _fake_gpus(fresh_warning, 2)
    info = {**_build_info.read_build_info("/nonexistent"), **_CPU_ONLY}
    with pytest.warns(RuntimeWarning, match=r"sees 2 GPU.*no CUDA kernels.*clang\+\+.*clang-19"):
        assert _build_info.warn_if_gpu_without_cuda_kernels(info) is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _build_info.warn_if_gpu_without_cuda_kernels(info) is False


@pytest.mark.parametrize("gpus, cuda", [(0, False), (1, True)])
def test_no_warning_without_a_gpu_or_with_cuda_kernels(fresh_warning, gpus, cuda):
    seen = _fake_gpus(fresh_warning, gpus)
    info = {**_build_info.read_build_info("/nonexistent"), **_CPU_ONLY, "cuda": cuda}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _build_info.warn_if_gpu_without_cuda_kernels(info) is False
    # A CUDA build never asks TensorFlow about GPUs.
    assert seen == ([] if cuda else ["GPU"])


def test_import_time_registration_warns(fresh_warning):
    _fake_gpus(fresh_warning, 1)
    fresh_warning.setattr(_build_info, "build_info", lambda: {
        **_build_info.read_build_info("/nonexistent"), **_CPU_ONLY
    })  # fmt: skip
    with pytest.warns(RuntimeWarning, match="pip install --no-build-isolation"):
        _loader.register_ops_on_import()


def test_gpu_variable_without_a_gpu_kernel_is_a_clear_error(monkeypatch):
    cpu_only = {**_build_info.read_build_info("/nonexistent"), **_CPU_ONLY}
    monkeypatch.setattr(_build_info, "build_info", lambda: cpu_only)
    _build_info.check_gpu_kernel("MaskedScatterSub", "/job:localhost/replica:0/task:0/device:CPU:0")
    with pytest.raises(
        pe.PartialEmbeddingArgumentError,
        match=r"ref: the variable is on /device:GPU:0, but this build .*no CUDA kernels.*clang-19",
    ):
        _build_info.check_gpu_kernel("MaskedScatterSub", "/device:GPU:0", "ref")
    monkeypatch.setattr(_build_info, "build_info", lambda: {**cpu_only, "cuda": True})
    _build_info.check_gpu_kernel("MaskedScatterSub", "/device:GPU:0")
    for op_name in ("MaskedSparseApplyRule", "MaskedSparseApplyRuleWithSlotIndices"):
        _build_info.check_gpu_kernel(op_name, "/device:GPU:0")
    _build_info.check_gpu_kernel("QuantizedLookup", "/device:GPU:0")
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="has a CPU kernel only"):
        _build_info.check_gpu_kernel("AdviseHugePages", "/device:GPU:0")


def test_placement_check_reads_the_device_only_where_a_gpu_is_seen(monkeypatch):
    class OnGpu:
        @property
        def device(self) -> str:
            raise AssertionError("read the device where no GPU is seen")

    monkeypatch.setattr(_build_info, "_gpus_visible", False)
    _build_info.check_variable_placement("MaskedScatterSub", OnGpu(), "ref")

    class Placed:
        device = "/job:localhost/replica:0/task:0/device:GPU:0"

    monkeypatch.setattr(_build_info, "_gpus_visible", True)
    without_cuda = {**_build_info.build_info(), "cuda": False}
    monkeypatch.setattr(_build_info, "build_info", lambda: without_cuda)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match=r"ref: the variable is on .*GPU:0"):
        _build_info.check_variable_placement("MaskedScatterSub", Placed(), "ref")
