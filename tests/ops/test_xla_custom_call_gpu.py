"""The XLA custom calls' CUDA handlers on a GPU, against the CPU kernel.

With ``PARTIAL_EMBEDDING_GPU_FUSED=1`` and a CUDA build of the XLA library, an
update of a GPU variable inside ``tf.function(jit_compile=True)`` compiles
into our custom call on XLA's CUDA backend (ops/xla_custom_call.py, docs/xla.md).
Here, on GPU variables: ``masked_scatter_sub_custom_call`` and
``masked_sparse_apply_rule_custom_call`` (full-size and compact slots; Adam,
row-wise Adam and SGD) compile to the custom call and give the CPU kernel's
result (bit for bit for the element-wise rules, whose rows have at most two
updates, summed in either order to the same bits; within
``pe_testing.assert_rule_step_as_the_kernel``'s bound for row-wise Adam, whose
row statistic the GPU sums in another order); ids outside ``[0, V)`` are
skipped and the rest written; frozen rows keep their bits. Then
``model.fit(jit_compile=True)`` with ``MaskedOptimizer(Adam)`` and the table on
the GPU: frozen rows bit for bit, the rest as a CPU run within rtol 1e-5.

The CPU versions: test_xla_custom_call.py, test_xla_custom_call_slots.py.
Skipped without a GPU, without the opt-in (build_tools/device_check.sh's step 3
sets it), or where the CUDA handlers were not built.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
import pe_testing
from partial_embedding._build_info import GPU_FUSED_ENVIRONMENT
from partial_embedding._internal.rule_table import RULES
from partial_embedding.bench._gpu_step import FUSED_OPS, fused_op_calls
from partial_embedding.ops import xla_custom_call
from pe_testing import (
    assert_bits_equal,
    assert_rule_tables_as_the_kernel,
    bits_equal,
    fused_hyperparameters,
    fused_slot_values,
    make_rng,
    masked_fit_problem,
    skip_without_xla_custom_calls,
)

pytestmark = pytest.mark.gpu

skip_without_xla_custom_calls()
if not all(xla_custom_call.handler_registered(t, "CUDA") for t in xla_custom_call.TARGETS):
    pytest.skip("the XLA library has no CUDA handlers (a CPU build)", allow_module_level=True)
if os.environ.get(GPU_FUSED_ENVIRONMENT) != "1":
    pytest.skip(
        f"the CUDA custom calls are taken only with {GPU_FUSED_ENVIRONMENT}=1",
        allow_module_level=True,
    )

GPU, CPU = "/GPU:0", "/CPU:0"
_NUM_ROWS, _WIDTH, _COUNT, _SLOT_ROWS = 64, 5, 24, 20
_RULES = ("adam", "rowwise_adam", "sgd")
_SCATTER_TARGET = 'custom_call_target="partial_embedding_masked_scatter_sub"'
_RULE_TARGET = 'custom_call_target="partial_embedding_masked_sparse_apply_rule"'
_SLOTS_TARGET = 'custom_call_target="partial_embedding_masked_sparse_apply_rule_slots"'


def _variables(tables: list[np.ndarray], device: str) -> list[tf.Variable]:
    with tf.device(device):
        return [tf.Variable(table) for table in tables]


def _ids(rng: np.random.Generator, pair: bool = True) -> np.ndarray:
    """Distinct rows, but for one pair where ``pair``: no row has more than
    two updates, whose sum has the same bits in either order."""
    ids = rng.permutation(_NUM_ROWS)[:_COUNT].astype(np.int32)
    if pair:
        ids[1] = ids[0]
    return ids


def _mask(rng: np.random.Generator, ids: np.ndarray) -> np.ndarray:
    mask = rng.random(_NUM_ROWS) < 0.5
    mask[ids[0]] = True
    return mask


def _with_bad_ids(ids: np.ndarray) -> np.ndarray:
    """Three positions outside ``[0, V)``; returns the kept positions."""
    ids[[5, 9, 17]] = [_NUM_ROWS, -1, np.iinfo(ids.dtype).max]
    return (ids >= 0) & (ids < _NUM_ROWS)


def _jit_on_gpu(function):
    compiled = tf.function(function, jit_compile=True)

    def run(*arguments):
        with tf.device(GPU):
            return compiled(*arguments)

    run.compiled = compiled
    return run


def _hlo(run, *arguments) -> str:
    with tf.device(GPU):
        return run.compiled.experimental_get_compiler_ir(*arguments)(stage="hlo")


# -- masked_scatter_sub ------------------------------------------------------------------


def _scatter(variable):
    def update(ids, updates, mask):
        xla_custom_call.masked_scatter_sub_custom_call(variable, ids, updates, mask)

    return update


@pytest.mark.parametrize("bad_ids", [False, True], ids=["valid", "bad_ids"])
def test_scatter_sub_on_a_gpu_is_the_custom_call_and_the_cpu_kernels_bits(bad_ids):
    """Distinct ids: the CUDA core sums a row's updates before subtracting
    them, the CPU subtracts them in turn (the next test)."""
    rng = make_rng("xla scatter sub on a gpu", bad_ids)
    table = rng.standard_normal([_NUM_ROWS, _WIDTH]).astype(np.float32)
    ids = _ids(rng, pair=False)
    updates = rng.standard_normal([_COUNT, _WIDTH]).astype(np.float32)
    mask = _mask(rng, ids)
    kept = _with_bad_ids(ids) if bad_ids else np.ones(_COUNT, bool)
    (on_gpu,), (on_cpu,) = _variables([table], GPU), _variables([table], CPU)
    assert "GPU" in on_gpu.device
    run = _jit_on_gpu(_scatter(on_gpu))
    hlo = _hlo(run, ids, updates, mask)
    assert _SCATTER_TARGET in hlo and "scatter(" not in hlo
    run(ids, updates, mask)
    with tf.device(CPU):
        _scatter(on_cpu)(ids[kept], updates[kept], mask)  # the kernel, outside XLA
    assert_bits_equal(on_gpu.numpy(), on_cpu.numpy(), "the GPU custom call against the kernel")
    assert_bits_equal(on_gpu.numpy()[~mask], table[~mask], "frozen rows")
    assert not bits_equal(on_gpu.numpy()[ids[0]], table[ids[0]]), "nothing was written"


def test_scatter_sub_on_a_gpu_accumulates_duplicates_within_rounding():
    rng = make_rng("xla scatter sub on a gpu, duplicates")
    table = rng.standard_normal([_NUM_ROWS, _WIDTH]).astype(np.float32)
    ids = rng.integers(0, 8, _COUNT).astype(np.int32)  # many duplicates
    updates = rng.standard_normal([_COUNT, _WIDTH]).astype(np.float32)
    mask = _mask(rng, ids)
    (on_gpu,) = _variables([table], GPU)
    _jit_on_gpu(_scatter(on_gpu))(ids, updates, mask)
    expected = pe_testing.masked_scatter_sub_reference(table, ids, updates, mask).result
    np.testing.assert_allclose(on_gpu.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert_bits_equal(on_gpu.numpy()[~mask], table[~mask], "frozen rows")


# -- the fused rule step, full-size and compact slots -------------------------------------


def _rule_step(rule, variables, slot_indices=False):
    hyperparameters = fused_hyperparameters(RULES[rule].hyperparameters)

    def step(ids, grad, mask, *slot_rows):
        xla_custom_call.masked_sparse_apply_rule_custom_call(
            rule, variables[0], variables[1:], ids, grad, mask, hyperparameters,
            slot_indices=slot_rows[0] if slot_indices else None,
        )  # fmt: skip

    return step


def _rule_case(rule, compact, bad_ids):
    rng = make_rng("xla rule on a gpu", rule, compact, bad_ids)
    table = rng.standard_normal([_NUM_ROWS, _WIDTH]).astype(np.float32)
    ids = _ids(rng)
    grad = rng.standard_normal([_COUNT, _WIDTH]).astype(np.float32)
    if not compact:
        mask = _mask(rng, ids)
        slots = fused_slot_values(RULES[rule].slots, rng, _NUM_ROWS, _WIDTH, np.float32)
        kept = _with_bad_ids(ids) if bad_ids else np.ones(_COUNT, bool)
        return [table, *slots], ids, grad, mask, kept, ()
    mask = np.zeros(_NUM_ROWS, bool)
    permitted = rng.choice(_NUM_ROWS, _SLOT_ROWS, replace=False)
    permitted[0] = ids[0]
    mask[permitted] = True
    slot_of_row = np.zeros(_NUM_ROWS, np.int32)
    slot_of_row[np.unique(permitted)] = rng.permutation(_SLOT_ROWS)[: len(np.unique(permitted))]
    slots = fused_slot_values(RULES[rule].slots, rng, _SLOT_ROWS, _WIDTH, np.float32)
    kept = np.ones(_COUNT, bool)
    if bad_ids:
        kept = _with_bad_ids(ids)
    slot_indices = np.where(kept, slot_of_row[np.clip(ids, 0, _NUM_ROWS - 1)], -1).astype(np.int32)
    slot_indices[~mask[np.clip(ids, 0, _NUM_ROWS - 1)]] = -1  # as the optimizer's XLA path does
    if bad_ids:
        slot_indices[17] = 0  # an id outside [0, V) with a valid slot row: skipped too
    kept &= slot_indices >= 0
    if bad_ids:
        kept[17] = False
    return [table, *slots], ids, grad, mask, kept, (slot_indices,)


@pytest.mark.parametrize("bad_ids", [False, True], ids=["valid", "bad_ids"])
@pytest.mark.parametrize("compact", [False, True], ids=["full_slots", "compact_slots"])
@pytest.mark.parametrize("rule", _RULES)
def test_rule_on_a_gpu_is_the_custom_call_and_the_cpu_kernels_result(rule, compact, bad_ids):
    tables, ids, grad, mask, kept, slot_rows = _rule_case(rule, compact, bad_ids)
    on_gpu, on_cpu = _variables(tables, GPU), _variables(tables, CPU)
    assert all("GPU" in variable.device for variable in on_gpu)
    run = _jit_on_gpu(_rule_step(rule, on_gpu, compact))
    hlo = _hlo(run, ids, grad, mask, *slot_rows)
    target = _SLOTS_TARGET if compact else _RULE_TARGET
    assert hlo.count(target) == 1, hlo[-2000:]
    assert "scatter(" not in hlo and "sort(" not in hlo
    run(ids, grad, mask, *slot_rows)
    with tf.device(CPU):  # the kernel, outside XLA, on the kept positions
        _rule_step(rule, on_cpu, compact)(
            ids[kept], grad[kept], mask, *(rows[kept] for rows in slot_rows)
        )
    assert_rule_tables_as_the_kernel(rule, on_gpu, on_cpu, tables, cuda=True)
    assert_bits_equal(on_gpu[0].numpy()[~mask], tables[0][~mask], f"{rule}: frozen rows")
    if not compact:
        for got, before in zip(on_gpu[1:], tables[1:]):
            assert_bits_equal(got.numpy()[~mask], before[~mask], f"{rule}: frozen rows' slots")
    assert not bits_equal(on_gpu[0].numpy()[ids[0]], tables[0][ids[0]]), "not stepped"


# -- model.fit under XLA with the table on the GPU ----------------------------------------


def _fit(device, table, permitted, x, y):
    vocab, width = table.shape
    with tf.device(device):
        layer = pe.PartialEmbedding(vocab, width, weights=table, trainable_ids=permitted)
        model = keras.Sequential(
            [
                keras.Input((x.shape[1],), dtype="int32"),
                layer,
                keras.layers.GlobalAveragePooling1D(),
                # The same starting head in both runs.
                keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(7)),
            ]
        )
        model.compile(
            optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.01)),
            loss="mse",
            jit_compile=True,
        )
        with fused_op_calls() as calls:
            history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    return layer, model, history.history["loss"], calls


def test_fit_under_xla_with_the_table_on_a_gpu_matches_a_cpu_run(rng):
    table, permitted, x, y = masked_fit_problem(rng, 400, 8, 6, 128)
    gpu_layer, _, gpu_losses, calls = _fit(GPU, table, permitted, x, y)
    assert "GPU" in gpu_layer.embeddings.value.device
    # Under XLA the fused op is reached only through the custom call.
    assert sum(calls[name] for name in FUSED_OPS) > 0, dict(calls)
    cpu_layer, _, cpu_losses, _ = _fit(CPU, table, permitted, x, y)
    got, want = gpu_layer.embeddings.numpy(), cpu_layer.embeddings.numpy()
    assert_bits_equal(got[~permitted], table[~permitted], "frozen rows after fit on the GPU")
    assert not np.array_equal(got[permitted], table[permitted]), "nothing trained"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-5)
