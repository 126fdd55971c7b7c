"""A NumPy row mask leaves no copy of itself resident.

TensorFlow's CPU allocator with oneDNN (the x86 default) serves every
allocation of 256 KiB or more from a BFC pool that keeps what it was given.
A ``[V]`` bool copy of a NumPy mask made there stayed resident after the call
and, with a freshly built table filling the pool, made it add a region about
the table's size whose bookkeeping (8 bytes per 256 bytes) stays for the
life of the process: 1 + 4 * D / 32 bytes per row of a float32 ``[V, D]``
table, 17 at D = 128. Inside a ``tf.function`` a mask embedded as a graph
constant was held about nine times per trace. A subprocess (this file, run as
a script) measures RssAnon around both with ``malloc_trim(0)`` first, so only
memory that something still holds is counted; the in-process tests check the
values the converted masks give.
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import (
    CPU_ONLY_ENVIRONMENT,
    assert_bits_equal,
    masked_scatter_sub_reference,
    once_per_run,
    run_script_report,
    unit_roundoff,
)

# These test host memory: on a machine with a GPU too.
pytestmark = pytest.mark.usefixtures("on_cpu")

_ROWS = 2**22
_WIDTH = 16  # A 256 MiB table: the old code kept 1 + 2 bytes per row.


def _rss_anon() -> int:
    """Resident anonymous memory of this process, in bytes, after giving
    back what glibc's malloc keeps only for reuse."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def _unaligned_mask(rows: int) -> np.ndarray:
    """Every third row permitted, in an array that does not start at a
    64-byte boundary (as NumPy's large arrays usually do not)."""
    buffer = np.zeros(rows + 64, dtype=bool)
    start = 1 + (-buffer.ctypes.data % 64)
    mask = buffer[start : start + rows]
    mask[::3] = True
    return mask


def _memory_report() -> dict[str, Any]:
    """The subprocess side: growth after the first eager write with a NumPy
    mask, and after two traces of a function that captures one."""
    table = tf.Variable(tf.zeros([_ROWS, _WIDTH]))
    mask = _unaligned_mask(_ROWS)
    ids = np.array([0, 1, 3, 3], np.int32)
    updates = np.ones([4, _WIDTH], np.float32)
    before = _rss_anon()
    pe.masked_scatter_sub(table, ids, updates, mask)
    eager = _rss_anon() - before
    head = table[:4].numpy()

    # Any later allocation of 256 KiB or more may grow the pool: done here
    # by a tensor of our own, so that only the traces are measured below.
    del updates
    warm = tf.ones([2**20], tf.float32)
    del warm
    write = tf.function(lambda ids: pe.masked_scatter_sub(table, ids, tf.zeros([4, _WIDTH]), mask))
    before = _rss_anon()
    write(np.array([0, 1, 2, 3], np.int32))
    write(np.array([0, 1, 2, 3], np.int64))
    traced = _rss_anon() - before
    return {
        "eager_bytes_per_row": eager / _ROWS,
        "traced_bytes_per_row_per_trace": traced / _ROWS / 2,
        "head": head.tolist(),
    }


@pytest.fixture(scope="module")
def memory_report(tmp_path_factory) -> dict[str, Any]:
    # The huge-page collapse of the table is not what is measured here.
    return once_per_run(
        tmp_path_factory,
        "test_mask_memory.memory_report",
        lambda: run_script_report(
            __file__, {"PARTIAL_EMBEDDING_HUGE_PAGES": "0", **CPU_ONLY_ENVIRONMENT}
        ),
    )


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssAnon and glibc's malloc_trim")
def test_an_eager_write_keeps_no_copy_of_a_numpy_mask(memory_report: dict[str, Any]) -> None:
    # A copy of the mask kept anywhere is 1 byte per row; the pool's new
    # region cost 2 more at this width. Under half a byte per row (2 MiB at
    # this V) leaves room only for fixed-size bookkeeping.
    growth = memory_report["eager_bytes_per_row"]
    assert growth < 0.5, (
        f"RssAnon grew {growth:.2f} bytes per row after one masked_scatter_sub "
        "with a NumPy mask: a [V] copy of the mask (or allocator state of the "
        "table's size) stayed resident"
    )
    # Row 0 and row 3 (twice) are permitted, row 1 is frozen.
    expected = np.zeros([4, _WIDTH], np.float32)
    expected[0], expected[3] = -1, -2
    np.testing.assert_array_equal(np.asarray(memory_report["head"], np.float32), expected)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssAnon and glibc's malloc_trim")
def test_a_trace_holds_one_snapshot_of_a_numpy_mask(memory_report: dict[str, Any]) -> None:
    # Each trace keeps its snapshot of the mask (1 byte per row) as a
    # captured tensor; a graph constant was held about 9 times per trace.
    growth = memory_report["traced_bytes_per_row_per_trace"]
    assert growth < 2.5, (
        f"RssAnon grew {growth:.2f} bytes per row per trace of a function that "
        "captures a NumPy mask: the mask is held several times (a graph constant?)"
    )


@pytest.mark.parametrize(
    "layout", ["aligned", "unaligned", "strided", "read-only", "list", "two-dimensional"]
)
def test_host_masks_give_the_reference_result(layout: str, rng: np.random.Generator) -> None:
    rows = 257
    base = rng.random(2 * rows + 64) < 0.5
    if layout == "aligned":
        start = -base.ctypes.data % 64
        mask: Any = base[start : start + rows]
    elif layout == "unaligned":
        start = 1 + (-base.ctypes.data % 64)
        mask = base[start : start + rows]
    elif layout == "strided":
        mask = base[: 2 * rows : 2]
    elif layout == "read-only":
        mask = base[:rows].copy()
        mask.flags.writeable = False
    elif layout == "list":
        mask = base[:rows].tolist()
    else:
        mask = base[:rows]
    values = rng.standard_normal([rows, 3]).astype(np.float32)
    ids = rng.integers(0, rows, size=40).astype(np.int64)
    updates = rng.standard_normal([40, 3]).astype(np.float32)
    table = tf.Variable(values)
    if layout == "two-dimensional":
        with pytest.raises(pe.PartialEmbeddingArgumentError, match="row_mask: shape"):
            pe.masked_scatter_sub(table, ids, updates, mask.reshape(1, rows))
        return
    flat = np.asarray(mask, bool)
    pe.masked_scatter_sub(table, ids, updates, mask)
    reference = masked_scatter_sub_reference(values, ids, updates, flat)
    assert_bits_equal(table.numpy()[~flat], values[~flat], "frozen rows")
    # Each permitted update rounds once, by at most u times the largest
    # magnitude the row's running value reaches.
    bound = reference.hits[:, None] * reference.magnitude * unit_roundoff(tf.float32)
    assert np.all(np.abs(table.numpy() - reference.result) <= bound)


def test_an_eager_lookup_reads_the_mask_it_was_given(rng: np.random.Generator) -> None:
    rows = 300
    mask = _unaligned_mask(rows)
    table = tf.Variable(rng.standard_normal([rows, 2]).astype(np.float32))
    ids = np.array([0, 1, 3, 298, 297], np.int32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(pe.masked_embedding_lookup(table, ids, mask))
    gradient = tape.gradient(loss, table)
    assert gradient.indices.numpy().tolist() == [0, 3, 297]  # every third row


def test_a_traced_function_keeps_the_mask_of_its_trace() -> None:
    rows = 1000  # tf.function embeds captured tensors of < 128 entries.
    mask = np.zeros(rows, bool)
    mask[:50] = True
    table = tf.Variable(tf.zeros([rows, 1]))
    write = tf.function(lambda: pe.masked_scatter_sub(table, [10, 60], tf.ones([2, 1]), mask))
    write()
    mask[:] = ~mask  # After tracing: the function keeps the values it traced.
    write()
    assert table.numpy()[[10, 60], 0].tolist() == [-2.0, 0.0]
    graph = write.get_concrete_function().graph
    constants = [op for op in graph.get_operations() if op.type == "Const"]
    assert all(op.outputs[0].shape.num_elements() != rows for op in constants), (
        "the mask is embedded in the graph as a constant"
    )


if __name__ == "__main__":
    print(json.dumps(_memory_report()))
