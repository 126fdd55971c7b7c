"""Tests of partial_embedding.advise_huge_pages and its use by the layer and
the optimizer.

Values must come through the advice bit for bit, and the first in-place write
of a large table must not hold a second copy of it: a subprocess (this file,
run as a script) samples its own RssAnon every millisecond around that write.
Whether the kernel really maps huge pages depends on the machine (THP setting,
MADV_COLLAPSE, free memory): the mapping is asserted only where a control
buffer, advised the same way through ctypes, gets huge pages in the same
process. Random values come from the seeded ``rng`` fixture, and ``tf.random``
ops from TensorFlow's seed, which conftest.py sets per test.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import threading
import time
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)
from pe_testing import (
    CPU_ONLY_ENVIRONMENT,
    bits,
    masked_scatter_sub_reference,
    once_per_run,
    run_script_report,
)

# These test huge pages of CPU buffers: on a machine with a GPU too.
pytestmark = pytest.mark.usefixtures("on_cpu")

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25


def _thp_setting() -> str | None:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            text = setting.read()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


# Where the kernel has no transparent huge pages at all, madvise refuses the
# advice and nothing is ever moved: the tests that expect a move skip there.
needs_thp = pytest.mark.skipif(
    _thp_setting() is None, reason="this kernel has no transparent huge pages"
)


def _control_gets_huge_pages() -> bool:
    """Whether a fresh anonymous buffer advised MADV_HUGEPAGE gets huge pages."""
    if _thp_setting() in (None, "never"):
        return False
    size = 4 * HUGE_PAGE
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        start = (address + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        libc = ctypes.CDLL(None, use_errno=True)
        length = ctypes.c_size_t(2 * HUGE_PAGE)
        if libc.madvise(ctypes.c_void_p(start), length, MADV_HUGEPAGE) != 0:
            return False
        buffer[start - address : start - address + 2 * HUGE_PAGE] = b"\1" * (2 * HUGE_PAGE)
        return _huge_kib_at(start) > 0
    finally:
        buffer.close()


def _huge_kib_at(address: int) -> int:
    """AnonHugePages (KiB) of the mapping that holds ``address``."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low <= address < high
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def _buffer_address(variable: Any) -> int:
    """Address of the variable's buffer (through DLPack, without a copy)."""
    capsule = tf.experimental.dlpack.to_dlpack(tf.convert_to_tensor(variable))

    class _Exporter:
        def __dlpack__(self, **_: Any) -> Any:
            return capsule

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    return int(np.from_dlpack(_Exporter()).ctypes.data)


@needs_thp
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16, tf.int64])
def test_values_come_through_bit_for_bit(rng: np.random.Generator, dtype: tf.DType) -> None:
    # At least 4 MiB (2-byte dtypes): wherever the allocator puts the buffer,
    # a whole huge page lies inside it to advise.
    rows = int(rng.integers(5 * HUGE_PAGE // 256, 7 * HUGE_PAGE // 256))
    values = rng.normal(size=(rows, 64)) * 100
    table = tf.Variable(tf.cast(values, dtype))
    before = bits(table)
    assert pe.advise_huge_pages(table, min_bytes=0) is True
    np.testing.assert_array_equal(bits(table), before)
    # The variable still works as a variable: reads, writes, masked updates.
    table.assign_add(tf.ones_like(table))
    expected = tf.cast(values, dtype) + tf.ones([], dtype)
    np.testing.assert_array_equal(bits(table), bits(expected))


@needs_thp
def test_a_reader_keeps_its_snapshot() -> None:
    table = tf.Variable(tf.random.normal([3 * HUGE_PAGE // 512, 128]))
    snapshot = tf.convert_to_tensor(table)
    before = bits(snapshot)
    assert pe.advise_huge_pages(table, min_bytes=0)
    table.assign(tf.zeros_like(table))
    np.testing.assert_array_equal(bits(snapshot), before)


@needs_thp
def test_masked_updates_after_the_move(rng: np.random.Generator) -> None:
    rows = 3 * HUGE_PAGE // (4 * 128)
    values = rng.normal(size=(rows, 128)).astype(np.float32)
    table = tf.Variable(values)
    assert pe.advise_huge_pages(table, min_bytes=0)
    ids = rng.integers(0, rows, 500)
    updates = rng.normal(size=(500, 128)).astype(np.float32)
    mask = rng.random(rows) < 0.5
    pe.masked_scatter_sub(table, ids, updates, mask)
    expected = masked_scatter_sub_reference(values, ids, updates, mask).result
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(table.numpy()[~mask], values[~mask])


def test_small_values_are_left_alone() -> None:
    table = tf.Variable(tf.random.normal([100, 8]))
    before = bits(table)
    assert pe.advise_huge_pages(table) is False
    assert pe.advise_huge_pages(table, min_bytes=100 * 8 * 4 + 1) is False
    np.testing.assert_array_equal(bits(table), before)


def test_a_buffer_without_a_whole_huge_page_is_left_alone() -> None:
    # Advised in place, only whole 2 MiB pages inside the buffer can become
    # huge pages: below 2 MiB there is none, whatever min_bytes says.
    table = tf.Variable(tf.ones([HUGE_PAGE // 4 - 1024, 1]))
    assert pe.advise_huge_pages(table, min_bytes=0) is False
    assert not np.any(table.numpy() != 1)


@needs_thp
def test_environment_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    table = tf.Variable(tf.random.normal([3 * HUGE_PAGE // 512, 128]))
    monkeypatch.setenv("PARTIAL_EMBEDDING_HUGE_PAGES", "0")
    assert pe.advise_huge_pages(table, min_bytes=0) is False
    monkeypatch.setenv("PARTIAL_EMBEDDING_HUGE_PAGES", "1")
    assert pe.advise_huge_pages(table, min_bytes=0) is True


@pytest.mark.parametrize("bad", [-1, 1.5, "big", True, None])
def test_bad_min_bytes(bad: Any) -> None:
    table = tf.Variable(tf.zeros([4, 2]))
    with pytest.raises(PartialEmbeddingArgumentError, match="min_bytes") as error:
        pe.advise_huge_pages(table, min_bytes=bad)
    assert repr(bad) in str(error.value) or str(bad) in str(error.value)
    assert isinstance(error.value, ValueError)


def test_not_a_variable() -> None:
    with pytest.raises(PartialEmbeddingTypeError, match="variable"):
        pe.advise_huge_pages(tf.zeros([4, 2]))


@needs_thp
def test_inside_a_function_it_runs_once_eagerly() -> None:
    table = tf.Variable(tf.random.normal([3 * HUGE_PAGE // 512, 128]))
    before = bits(table)
    results = []

    @tf.function
    def trace() -> tf.Tensor:
        results.append(pe.advise_huge_pages(table, min_bytes=0))
        return tf.reduce_sum(table)

    trace()
    assert results == [True]
    np.testing.assert_array_equal(bits(table), before)


@pytest.mark.skipif(not _control_gets_huge_pages(), reason="no transparent huge pages here")
def test_the_kernel_maps_huge_pages() -> None:
    table = tf.Variable(tf.random.normal([8 * HUGE_PAGE // 512, 128]))
    assert pe.advise_huge_pages(table, min_bytes=0)
    assert _huge_kib_at(_buffer_address(table) + 4 * HUGE_PAGE) > 0


@pytest.mark.skipif(not _control_gets_huge_pages(), reason="no transparent huge pages here")
def test_layer_and_optimizer_put_table_and_slots_on_huge_pages(rng: np.random.Generator) -> None:
    vocab, width = 70_000, 128  # 34 MiB: above the 32 MiB default
    permitted = rng.random(vocab) < 0.5
    layer = pe.PartialEmbedding(vocab, width, trainable_ids=np.flatnonzero(permitted))
    inputs = keras.Input((4,), dtype="int32")
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)[:, 0]))
    # Full-size slots: table-sized, so they go to huge pages too.
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.01), compact_slots=False)
    # The kernel path: Keras' "auto" picks XLA where a GPU is seen.
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
    before = layer.embeddings.numpy().copy()
    ids = rng.integers(0, vocab, (64, 4))
    model.fit(ids, rng.normal(size=(64, 1)), batch_size=16, epochs=1, verbose=0)
    after = layer.embeddings.numpy()
    np.testing.assert_array_equal(after[~permitted], before[~permitted])
    touched = np.unique(ids)
    assert not np.array_equal(
        after[touched[permitted[touched]]], before[touched[permitted[touched]]]
    )
    slots = [v for v in optimizer.inner_optimizer.variables if tuple(v.shape) == (vocab, width)]
    assert len(slots) == 2
    for variable in [layer.embeddings, *slots]:
        address = _buffer_address(variable)
        assert _huge_kib_at(address + 8 * HUGE_PAGE) > 0, variable.path
    for slot in slots:
        assert not np.any(slot.numpy()[~permitted])


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@needs_thp
def test_the_old_copy_does_not_stay_resident() -> None:
    # TensorFlow's oneDNN CPU allocator pools freed memory: the moved-from
    # buffer must give its pages back, or the table would be resident twice.
    table = tf.Variable(tf.random.normal([256 * 2**20 // 512, 128]))  # 256 MiB
    before_bits = bits(table[:1000])
    before = _rss_mib()
    assert pe.advise_huge_pages(table, min_bytes=0)
    growth = _rss_mib() - before
    assert growth < 128, f"resident memory grew by {growth:.0f} MiB for a 256 MiB table"
    np.testing.assert_array_equal(bits(table[:1000]), before_bits)


def test_arrays_the_variable_was_made_from_stay_untouched(rng: np.random.Generator) -> None:
    # The move gives the old buffer's pages back: it must never be memory
    # that someone else still sees, such as the NumPy array behind the
    # variable's initial value.
    # Above the kernels' 32 MiB threshold, so the first write moves it.
    array = rng.normal(size=(70_000 + int(rng.integers(0, 1000)), 128)).astype(np.float32)
    expected = array.copy()
    from_array = tf.Variable(array)
    from_tensor = tf.Variable(tf.constant(array))
    keep = np.zeros(array.shape[0], bool)
    keep[:5] = True
    for table in (from_array, from_tensor):
        pe.masked_scatter_sub(table, [1, 2], np.ones((2, 128), np.float32), keep)
        assert not pe.advise_huge_pages(table, min_bytes=0)  # moved already
        np.testing.assert_array_equal(table.numpy()[3:], expected[3:])
        np.testing.assert_array_equal(table.numpy()[1:3], expected[1:3] - 1)
    np.testing.assert_array_equal(array, expected)


def test_a_write_after_a_reader_copies_then_advises_the_copy() -> None:
    # A reader holds the table's buffer at its first in-place write: the
    # write gives the table a buffer of its own (the reader keeps its
    # snapshot), and that new buffer is the one advised.
    table = tf.Variable(tf.random.normal([70_000, 128]))  # 34 MiB
    snapshot = tf.convert_to_tensor(table)
    before = bits(snapshot)
    keep = np.ones(70_000, bool)
    pe.masked_scatter_sub(table, [0, 1], np.ones((2, 128), np.float32), keep)
    np.testing.assert_array_equal(bits(snapshot), before)
    np.testing.assert_array_equal(table.numpy()[:2], snapshot.numpy()[:2] - 1)
    np.testing.assert_array_equal(table.numpy()[2:], snapshot.numpy()[2:])
    assert not pe.advise_huge_pages(table, min_bytes=0)  # advised by the write


@needs_thp
def test_a_new_buffer_is_advised_again() -> None:
    table = tf.Variable(tf.random.normal([3 * HUGE_PAGE // 512, 128]))
    assert pe.advise_huge_pages(table, min_bytes=0) is True
    assert pe.advise_huge_pages(table, min_bytes=0) is False  # once per buffer
    # A reader holds the advised buffer, so the assignment brings a new one.
    snapshot = tf.convert_to_tensor(table)
    table.assign(tf.zeros_like(table))
    assert pe.advise_huge_pages(table, min_bytes=0) is True
    assert not np.any(table.numpy())
    assert np.any(snapshot.numpy())


# --- the first in-place write, in a fresh process --------------------------------

# 128 MiB: large enough that a second copy stands far above what the write
# itself allocates, small enough for any test machine.
_TABLE_MIB = 128
_WIDTH = 128


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def _control_collapse() -> str:
    """ "ok", or why MADV_COLLAPSE does not collapse a control buffer here."""
    if _thp_setting() in (None, "never"):
        return f"transparent huge pages: {_thp_setting()}"
    size = 4 * HUGE_PAGE
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        start = (address + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        buffer[start - address : start - address + 2 * HUGE_PAGE] = b"\1" * (2 * HUGE_PAGE)
        libc = ctypes.CDLL(None, use_errno=True)
        length = ctypes.c_size_t(2 * HUGE_PAGE)
        for advice in (MADV_HUGEPAGE, MADV_COLLAPSE):
            if libc.madvise(ctypes.c_void_p(start), length, advice) != 0:
                number = ctypes.get_errno()
                return f"madvise({advice}) refused: {errno.errorcode.get(number, number)}"
        if _huge_kib_at(start) < 2 * HUGE_PAGE // 1024:
            return "MADV_COLLAPSE succeeded, yet smaps shows no huge pages"
        return "ok"
    finally:
        buffer.close()


def _first_write_report() -> dict[str, Any]:
    """The subprocess side: RssAnon around the first in-place write of a
    fresh table, sampled every millisecond by a thread, then how much of the
    table's 2 MiB-aligned interior is on huge pages."""
    rows = _TABLE_MIB * 2**20 // (4 * _WIDTH)
    table = tf.Variable(tf.random.uniform([rows, _WIDTH], seed=1))
    row_mask = np.zeros(rows, bool)
    row_mask[:64] = True
    ids = np.arange(32)
    updates = np.ones((32, _WIDTH), np.float32)
    expected_head = table[:32].numpy() - 1
    time.sleep(0.1)
    baseline = _rss_anon_kib()
    peak = [baseline]
    samples = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_anon_kib())
            samples[0] += 1
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    time.sleep(0.02)
    pe.masked_scatter_sub(table, ids, updates, row_mask)
    time.sleep(0.02)
    done.set()
    sampler.join()
    peak_growth = peak[0] - baseline
    np.testing.assert_array_equal(table[:32].numpy(), expected_head)
    address = _buffer_address(table)
    begin = (address + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    end = (address + rows * _WIDTH * 4) & ~(HUGE_PAGE - 1)
    return {
        "table_kib": rows * _WIDTH * 4 // 1024,
        "peak_growth_kib": peak_growth,
        "samples": samples[0],
        "interior_kib": (end - begin) // 1024,
        "interior_huge_kib": _huge_kib_at(begin),
        "control": _control_collapse(),
        "advised": pe.advise_huge_pages(table, min_bytes=0) is False,
    }


@pytest.fixture(scope="module")
def first_write(tmp_path_factory) -> dict[str, Any]:
    return once_per_run(
        tmp_path_factory,
        "test_huge_pages.first_write",
        lambda: run_script_report(
            __file__, {"PARTIAL_EMBEDDING_HUGE_PAGES": "1", **CPU_ONLY_ENVIRONMENT}
        ),
    )


@pytest.mark.slow
def test_the_first_write_holds_no_second_copy(first_write: dict[str, Any]) -> None:
    # The advice works in place: at most a few MiB over the pre-write level,
    # where a move into a new buffer held the table twice for a moment.
    growth_mib = first_write["peak_growth_kib"] / 1024
    table_mib = first_write["table_kib"] / 1024
    assert first_write["samples"] > 0
    assert first_write["advised"], "the first write did not advise the table"
    assert growth_mib < table_mib / 8, (
        f"RssAnon peaked {growth_mib:.1f} MiB over the pre-write level at the first "
        f"write of a {table_mib:.0f} MiB table"
    )


def test_the_first_write_puts_the_table_on_huge_pages(first_write: dict[str, Any]) -> None:
    if first_write["control"] != "ok":
        pytest.skip(f"no huge pages through MADV_COLLAPSE here: {first_write['control']}")
    assert first_write["interior_huge_kib"] >= first_write["interior_kib"], first_write


if __name__ == "__main__":
    print(json.dumps(_first_write_report()))
