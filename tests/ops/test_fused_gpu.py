"""The fused ops' GPU kernels against their CPU kernels, and where they run.

On a GPU that TensorFlow sees (the ``gpu`` tests; skipped elsewhere):

* ``masked_sparse_apply_adam`` on GPU variables equals the CPU kernel bit for
  bit, every dtype, index type and variant (Adam, AMSGrad, AdamW; full-size
  and compact slots), with duplicate ids and frozen rows. The GPU sums a row's
  occurrences in pieces of 32: rows with at most 32 get the CPU's bits by
  construction; a row with more is checked on exact (dyadic) gradients, whose
  sum every grouping gives exactly;
* a refused step (an index or slot index out of range) gives the CPU kernel's
  message and writes nothing;
* ``QuantizedLookup`` on the GPU gives the CPU kernel's rows and store rows;
* ``model.fit`` with ``jit_compile=False`` and every variable on the GPU
  traces the fused ops (``bench.gpu_step.fit_check`` counts them) and
  trains; under XLA the GPU step
  takes the stock-op path (the custom calls are the CPU's only).

Without a GPU: in a CUDA build, TensorFlow's registry lists a GPU kernel for
exactly the ops ``_build_info.GPU_KERNEL_OPS`` names.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels as tf_kernels

from partial_embedding import _build_info
from partial_embedding._build_info import GPU_FUSED_ENVIRONMENT
from partial_embedding._loader import load_ops
from partial_embedding.bench.gpu_step import fit_check
from partial_embedding.ops import masked_sparse_apply_adam
from pe_testing import INDEX_DTYPES, VALUE_DTYPES, assert_bits_equal, numpy_dtype

VARIANTS = {
    "adam": dict(amsgrad=False, weight_decay=0.0),
    "amsgrad": dict(amsgrad=True, weight_decay=0.0),
    "adamw": dict(amsgrad=False, weight_decay=0.05),
}


# -- without a GPU: the registry --------------------------------------------------


def test_gpu_kernels_are_registered_for_exactly_the_listed_ops():
    if not _build_info.build_info()["cuda"]:
        pytest.skip("a CPU-only build registers no GPU kernel")
    load_ops()
    all_ops = (
        "MaskedScatterSub",
        "MaskedSparseApplyAdam",
        "MaskedSparseApplyAdamWithSlotIndices",
        "QuantizedLookup",
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


def _tables(rng, dtype, rows, slot_rows, width, amsgrad):
    def table(count, scale=1.0, positive=False):
        values = rng.normal(size=(count, width)) * scale
        return (np.abs(values) if positive else values).astype(numpy_dtype(dtype))

    return {
        "var": table(rows),
        "m": table(slot_rows, 0.1),
        "v": table(slot_rows, 0.01, positive=True),
        "v_hat": table(slot_rows, 0.01, positive=True) if amsgrad else None,
    }


def _step(device, values, indices, grad, mask, slot_indices, dtype, variant):
    with tf.device(device):
        variables = {k: None if v is None else tf.Variable(v) for k, v in values.items()}
        masked_sparse_apply_adam(
            variables["var"],
            variables["m"],
            variables["v"],
            indices,
            grad,
            mask,
            learning_rate=0.01,
            beta_1=0.9,
            beta_2=0.999,
            epsilon=1e-3,
            alpha=0.0123,
            weight_decay=VARIANTS[variant]["weight_decay"],
            v_hat=variables["v_hat"],
            slot_indices=slot_indices,
        )
    assert "GPU" not in device or "GPU" in variables["var"].device
    return {k: None if v is None else v.numpy() for k, v in variables.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("compact", [False, True], ids=["full_size", "compact"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("hot", [False, True], ids=["warm", "hot"])
def test_gpu_adam_equals_the_cpu_kernel(rng, dtype, index_dtype, variant, compact, hot):
    if hot and dtype in (tf.float16, tf.bfloat16):
        pytest.skip("16-bit sums of many dyadic values round: the grouping shows")
    rows, width = 300, 9 if variant == "adam" else 16
    indices = rng.integers(0, 120, size=400)  # Up to ~10 occurrences a row.
    mask = rng.random(rows) < 0.6
    grad = rng.normal(size=(400, width))
    if hot:
        hot_row = 200
        mask[hot_row] = True
        indices = np.concatenate([indices, np.full(137, hot_row)])
        rng.shuffle(indices)
        grad = rng.integers(-8, 8, size=(len(indices), width)) / 16.0
    slot_rows, slot_indices = rows, None
    if compact:
        permitted = np.unique(indices[mask[indices]])
        slot_rows = len(permitted) + 2
        slot_of = dict(zip(permitted.tolist(), rng.permutation(slot_rows).tolist()))
        slot_indices = tf.constant([slot_of.get(int(i), 0) for i in indices], dtype=index_dtype)
    values = _tables(rng, dtype, rows, slot_rows, width, VARIANTS[variant]["amsgrad"])
    arguments = (
        tf.constant(indices, dtype=index_dtype),
        tf.constant(grad.astype(numpy_dtype(dtype))),
        tf.constant(mask),
        slot_indices,
        dtype,
        variant,
    )
    on_cpu = _step("/CPU:0", values, *arguments)
    on_gpu = _step("/GPU:0", values, *arguments)
    for key, expected in on_cpu.items():
        if expected is not None:
            assert_bits_equal(on_gpu[key], expected, key)
    frozen = np.setdiff1d(np.arange(rows), indices[mask[indices]])
    assert_bits_equal(on_gpu["var"][frozen], values["var"][frozen], "frozen rows")


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("broken", ["index", "slot_index"])
def test_gpu_adam_refuses_as_the_cpu_kernel_does_and_writes_nothing(rng, index_dtype, broken):
    rows, width = 50, 8
    indices = rng.integers(0, rows, size=60)
    slot_indices = indices.copy()  # Each row its own slot row.
    if broken == "index":
        indices[17] = rows
    else:
        slot_indices[23] = rows + 5
    values = _tables(rng, tf.float32, rows, rows, width, False)
    arguments = (
        tf.constant(indices, dtype=index_dtype),
        tf.constant(rng.normal(size=(60, width)).astype(np.float32)),
        tf.ones([rows], tf.bool),
        tf.constant(slot_indices, dtype=index_dtype),
        tf.float32,
        "adam",
    )
    messages = {}
    for device in ("/CPU:0", "/GPU:0"):
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            _step(device, values, *arguments)
        messages[device] = raised.value.message
    assert messages["/GPU:0"] == messages["/CPU:0"]
    assert "nothing was written" in messages["/GPU:0"]


def _lookup(device, rng_state, index_dtype, bad_id=False):
    rng = np.random.default_rng(rng_state)
    num_rows, width, store_rows = 700, 24, 33
    trained = np.sort(rng.choice(num_rows, size=store_rows - 1, replace=False))
    ids = rng.integers(0, num_rows, size=500)
    ids[::4] = rng.choice(trained, size=len(ids[::4]))
    if bad_id:
        ids[9] = num_rows
    with tf.device(device):
        rows, store_rows_of = load_ops().partial_embedding_quantized_lookup(
            codes=tf.constant(rng.integers(-127, 128, size=(num_rows, width)), tf.int8),
            scales=tf.constant(rng.uniform(0.5, 100, size=num_rows), tf.float32),
            store=tf.constant(rng.normal(size=(store_rows, width)), tf.float32),
            sorted_ids=tf.constant(np.append(trained, num_rows), tf.int32),
            store_index=tf.constant(
                np.append(rng.permutation(store_rows - 1), store_rows - 1), tf.int32
            ),  # fmt: skip
            ids=tf.constant(ids, index_dtype),
        )
    return rows.numpy(), store_rows_of.numpy()


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=lambda d: d.name)
def test_gpu_quantized_lookup_equals_the_cpu_kernel(index_dtype):
    on_cpu = _lookup("/CPU:0", 7, index_dtype)
    on_gpu = _lookup("/GPU:0", 7, index_dtype)
    assert_bits_equal(on_gpu[0], on_cpu[0], "rows")
    assert_bits_equal(on_gpu[1], on_cpu[1], "store rows")
    messages = []
    for device in ("/CPU:0", "/GPU:0"):
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            _lookup(device, 7, index_dtype, bad_id=True)
        messages.append(raised.value.message)
    assert messages[0] == messages[1] and "ids[9] = 700 is not in [0, 700)" in messages[0]


@pytest.mark.gpu
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "int8"])
def test_fit_without_xla_on_a_gpu_takes_the_fused_kernels(rng, quantized, monkeypatch):
    monkeypatch.setenv(GPU_FUSED_ENVIRONMENT, "1")  # opt-in until measured on a GPU
    result = fit_check(False, quantized, rng, "/GPU:0")
    assert result["passed"], result
    traces = result["fused_op_traces"]
    assert traces.get("partial_embedding_masked_sparse_apply_adam", 0) > 0, traces
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
def test_fit_under_xla_on_a_gpu_takes_the_stock_op_path(rng, jit_compile, monkeypatch):
    """The XLA custom calls run on the CPU only: under XLA on a GPU (Keras'
    default there), the fused ops stay out of the step, opted in or not."""
    monkeypatch.setenv(GPU_FUSED_ENVIRONMENT, "1")
    result = fit_check(jit_compile, False, rng, "/GPU:0")
    assert result["passed"], result
    assert sum(result["fused_op_traces"].values()) == 0, result


def test_the_unmeasured_gpu_kernels_are_opt_in(monkeypatch):
    """Until they have run on a GPU, the fused Adam and quantized-lookup CUDA
    kernels are taken only with PARTIAL_EMBEDDING_GPU_FUSED=1; MaskedScatterSub's
    (run on an H200) whenever the build has it."""
    built = bool(_build_info.build_info()["cuda"])
    monkeypatch.delenv(GPU_FUSED_ENVIRONMENT, raising=False)
    assert _build_info.gpu_fused_kernel_chosen("MaskedScatterSub") == built
    for op_name in _build_info.OPT_IN_GPU_KERNEL_OPS:
        assert not _build_info.gpu_fused_kernel_chosen(op_name)
    monkeypatch.setenv(GPU_FUSED_ENVIRONMENT, "1")
    for op_name in _build_info.OPT_IN_GPU_KERNEL_OPS:
        assert _build_info.gpu_fused_kernel_chosen(op_name) == built
