"""The fused ops' GPU kernels, and where they run.

On a GPU that TensorFlow sees (the ``gpu`` tests; skipped elsewhere):

* the GPU check's suite (``build_tools/gpu_check.py --tensorflow-ops``) on
  GPU variables: ``masked_scatter_sub`` (fast and deterministic),
  ``masked_sparse_apply_rule`` (Adam, AMSGrad, AdamW; full-size and compact
  slots), ``QuantizedLookup`` and the bag gradient against the suite's
  references, refusals with nothing written;
* ``model.fit`` with ``jit_compile=False`` and every variable on the GPU
  traces the fused ops (``bench._gpu_step.fit_check`` counts them) and
  trains; under XLA the GPU step
  takes the stock-op path (the custom calls are the CPU's only).

Without a GPU: in a CUDA build, TensorFlow's registry lists a GPU kernel for
exactly the ops ``_build_info.GPU_KERNEL_OPS`` names.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels as tf_kernels

from partial_embedding import _build_info
from partial_embedding._build_info import GPU_FUSED_ENVIRONMENT
from partial_embedding._loader import load_ops
from partial_embedding.bench._gpu_step import fit_check
from pe_testing import VALUE_DTYPES

BUILD_TOOLS = Path(__file__).resolve().parents[2] / "build_tools"


# -- without a GPU: the registry --------------------------------------------------


def test_gpu_kernels_are_registered_for_exactly_the_listed_ops():
    if not _build_info.build_info()["cuda"]:
        pytest.skip("a CPU-only build registers no GPU kernel")
    load_ops()
    all_ops = (
        "MaskedScatterSub",
        "MaskedSparseApplyRule",
        "MaskedSparseApplyRuleWithSlotIndices",
        "QuantizedLookup",
        "MaskedEmbeddingBagApplyRule",
        "MaskedEmbeddingBagApplyRuleWithSlotMap",
        "AdviseHugePages",
    )
    for op in all_ops:
        registered = tf_kernels.get_registered_kernels_for_op(f"PartialEmbedding>{op}").kernel
        gpu = [kernel for kernel in registered if kernel.device_type == "GPU"]
        if op not in _build_info.GPU_KERNEL_OPS:
            assert gpu == [], op
            continue
        # One per (dtype, index type) pair, or per index type.
        expected = 2 if op == "QuantizedLookup" else 2 * len(VALUE_DTYPES)
        assert len(gpu) == expected, (op, len(gpu))


# -- on a GPU -------------------------------------------------------------------------


@pytest.mark.gpu
def test_the_gpu_check_passes_through_the_ops_on_a_gpu():
    """build_tools/gpu_check.py's every correctness section and reference,
    run through the ops on GPU variables (``--tensorflow-ops --quick``)."""
    if not (BUILD_TOOLS / "gpu_check.py").exists():
        pytest.skip("needs the source tree's build_tools/")
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees no GPU")
    sys.path.insert(0, str(BUILD_TOOLS))
    try:
        gpu_check = importlib.import_module("gpu_check")
        assert gpu_check.main(["--tensorflow-ops", "--device", "/GPU:0", "--quick"]) == 0
    finally:
        sys.path.remove(str(BUILD_TOOLS))


@pytest.mark.gpu
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "int8"])
def test_fit_without_xla_on_a_gpu_takes_the_fused_kernels(rng, quantized, monkeypatch):
    monkeypatch.setenv(GPU_FUSED_ENVIRONMENT, "1")  # opt-in until measured on a GPU
    result = fit_check(False, quantized, rng, "/GPU:0")
    assert result["passed"], result
    traces = result["fused_op_traces"]
    assert traces.get("partial_embedding_masked_sparse_apply_rule", 0) > 0, traces
    if quantized:
        assert traces.get("partial_embedding_quantized_lookup", 0) > 0, traces


@pytest.mark.gpu
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "int8"])
def test_fit_on_a_gpu_takes_the_stock_op_path_without_the_opt_in(rng, quantized, monkeypatch):
    """The fused CUDA kernels have not run on a GPU yet: by default a step
    keeps the composed path that has."""
    monkeypatch.delenv(GPU_FUSED_ENVIRONMENT, raising=False)
    result = fit_check(False, quantized, rng, "/GPU:0")
    assert result["passed"], result
    assert sum(result["fused_op_traces"].values()) == 0, result


@pytest.mark.gpu
@pytest.mark.parametrize("jit_compile", ["auto", True])
@pytest.mark.parametrize("opted_in", [False, True])
def test_fit_under_xla_on_a_gpu_takes_the_custom_call_only_when_chosen(
    rng, jit_compile, opted_in, monkeypatch
):
    """Under XLA on a GPU (Keras' default there) the fused rule op, lowered to
    our CUDA custom call, is in the step only where the CUDA handlers are
    registered and PARTIAL_EMBEDDING_GPU_FUSED=1; else the stock-op path."""
    from partial_embedding.ops import xla_custom_call

    monkeypatch.setenv(GPU_FUSED_ENVIRONMENT, "1" if opted_in else "0")
    result = fit_check(jit_compile, False, rng, "/GPU:0")
    assert result["passed"], result
    cuda_handlers = all(
        xla_custom_call.handler_registered(target, "CUDA") for target in xla_custom_call.TARGETS
    )
    assert (sum(result["fused_op_traces"].values()) > 0) == (opted_in and cuda_handlers), result


def test_the_unmeasured_gpu_kernels_are_opt_in(monkeypatch):
    """Until they have run on a GPU, the fused rule, fused bag and
    quantized-lookup CUDA kernels are taken only with
    PARTIAL_EMBEDDING_GPU_FUSED=1; MaskedScatterSub's (run on an H200) whenever
    the build has it."""
    built = bool(_build_info.build_info()["cuda"])
    monkeypatch.delenv(GPU_FUSED_ENVIRONMENT, raising=False)
    assert _build_info.gpu_fused_kernel_chosen("MaskedScatterSub") == built
    for op_name in _build_info.OPT_IN_GPU_KERNEL_OPS:
        assert not _build_info.gpu_fused_kernel_chosen(op_name)
    monkeypatch.setenv(GPU_FUSED_ENVIRONMENT, "1")
    for op_name in _build_info.OPT_IN_GPU_KERNEL_OPS:
        assert _build_info.gpu_fused_kernel_chosen(op_name) == built
