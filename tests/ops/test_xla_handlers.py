"""Where our XLA custom calls have handlers, as XLA's own registries see them.

* The FFI registry (XLA's ``FindHandler``, through
  ``xla_custom_call.handler_registered``): every target has a Host handler;
  a CUDA build has a CUDA handler for every target, and its tf2xla kernels are
  registered for ``XLA_GPU_JIT`` beside ``XLA_CPU_JIT``.
* ``build_tools/simt_xla_check.sh`` runs this file (and the custom calls'
  tests) with the emulator build loaded, whose Host handlers are the CUDA
  handlers' code: ``PE_EXPECT_XLA_HANDLERS=simt`` makes sure that build is
  the one in effect, so that run cannot pass on the CPU handlers by mistake.
"""

from __future__ import annotations

import os

import pytest
from tensorflow.python.framework import kernels

from partial_embedding import build_info
from partial_embedding.ops import xla_custom_call
from pe_testing import skip_without_xla_custom_calls

pytestmark = pytest.mark.usefixtures("on_cpu")

skip_without_xla_custom_calls()

_OPS = (
    "PartialEmbedding>MaskedScatterSub",
    "PartialEmbedding>MaskedSparseApplyRule",
    "PartialEmbedding>MaskedSparseApplyRuleWithSlotIndices",
)


def _xla_devices(op_name):
    return {kernel.device_type for kernel in kernels.get_registered_kernels_for_op(op_name).kernel}


def test_the_expected_build_is_in_effect():
    expected = os.environ.get("PE_EXPECT_XLA_HANDLERS")
    build = xla_custom_call.handler_build()
    assert build in ("cpu", "cpu+cuda", "simt")
    if expected:
        assert build == expected, f"PE_EXPECT_XLA_HANDLERS={expected}, loaded {build}"
    if build == "simt":
        assert os.environ.get(xla_custom_call.XLA_LIBRARY_ENVIRONMENT)


@pytest.mark.parametrize("target", xla_custom_call.TARGETS)
def test_every_target_has_a_host_handler(target):
    assert xla_custom_call.handler_registered(target, "Host")
    assert not xla_custom_call.handler_registered(target + "_missing", "Host")


@pytest.mark.parametrize("target", xla_custom_call.TARGETS)
def test_cuda_handlers_exactly_where_the_build_has_them(target):
    cuda = xla_custom_call.handler_build() == "cpu+cuda"
    assert xla_custom_call.handler_registered(target, "CUDA") == cuda
    if cuda and not os.environ.get(xla_custom_call.XLA_LIBRARY_ENVIRONMENT):
        # The packaged libraries are built together: CUDA in both or neither.
        assert build_info()["cuda"], "CUDA handlers in a build without CUDA kernels"


@pytest.mark.parametrize("op_name", _OPS)
def test_xla_kernels_registered_for_the_devices_with_handlers(op_name):
    # The probe of load_xla_custom_calls() compiled a function: TensorFlow has
    # registered the XLA compilation kernels of every backend it has.
    devices = _xla_devices(op_name)
    assert "XLA_CPU_JIT" in devices
    gpu_backend = "XLA_GPU_JIT" in _xla_devices("AddV2")
    cuda = xla_custom_call.handler_build() == "cpu+cuda"
    assert ("XLA_GPU_JIT" in devices) == (cuda and gpu_backend), devices


def test_gpu_variables_take_the_custom_call_only_when_chosen(monkeypatch):
    """A GPU variable compiles into the custom call only where the CUDA
    handlers are built and PARTIAL_EMBEDDING_GPU_FUSED=1; a CPU variable
    always (here, where no GPU exists, a variable placed on one is refused
    by TensorFlow, so the choice is checked on the device string)."""
    from partial_embedding.ops.xla_custom_call import _has_handlers

    class _OnGpu:
        device = "/job:localhost/replica:0/task:0/device:GPU:0"

    class _OnCpu:
        device = "/job:localhost/replica:0/task:0/device:CPU:0"

    monkeypatch.setenv("PARTIAL_EMBEDDING_GPU_FUSED", "1")
    cuda = xla_custom_call.handler_build() == "cpu+cuda"
    assert _has_handlers(_OnGpu()) == cuda
    assert _has_handlers(_OnCpu())
    monkeypatch.setenv("PARTIAL_EMBEDDING_GPU_FUSED", "0")
    assert not _has_handlers(_OnGpu())
    assert _has_handlers(_OnCpu())
