"""Concurrent updates of one variable from several Python threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import tensorflow as tf

import partial_embedding as pe
from pe_testing import masked_scatter_sub_reference

NUM_ROWS, WIDTH = 64, 32
THREADS, STEPS_PER_THREAD, BATCH = 4, 25, 512


class _Workload(NamedTuple):
    indices: np.ndarray  # [THREADS, STEPS_PER_THREAD, BATCH]
    updates: np.ndarray  # [THREADS, STEPS_PER_THREAD, BATCH, WIDTH]
    mask: np.ndarray  # [NUM_ROWS]
    expected: np.ndarray  # every update applied to a table of zeros, in float64


def _workload(rng: np.random.Generator) -> _Workload:
    """Integer-valued updates: their float32 sums are exact in any order."""
    indices = rng.integers(0, NUM_ROWS, size=(THREADS, STEPS_PER_THREAD, BATCH))
    updates = rng.integers(1, 4, size=(THREADS, STEPS_PER_THREAD, BATCH, WIDTH)).astype(np.float32)
    mask = rng.random(NUM_ROWS) < 0.75
    zeros = np.zeros((NUM_ROWS, WIDTH))
    expected = masked_scatter_sub_reference(zeros, indices, updates, mask).result
    return _Workload(indices, updates, mask, expected)


def _run_threads(target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def guarded(t: int) -> None:
        try:
            target(t)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def _update_from_threads(workload: _Workload, use_locking: bool) -> np.ndarray:
    """Each thread applies its own steps of the workload to one shared table."""
    variable = tf.Variable(tf.zeros([NUM_ROWS, WIDTH]))
    mask_tensor = tf.constant(workload.mask)

    def worker(t: int) -> None:
        for s in range(STEPS_PER_THREAD):
            pe.masked_scatter_sub(
                variable,
                workload.indices[t, s],
                workload.updates[t, s],
                mask_tensor,
                use_locking=use_locking,
            )

    _run_threads(worker)
    return variable.numpy()


def test_locked_updates_from_threads_lose_nothing(rng):
    workload = _workload(rng)
    result = _update_from_threads(workload, use_locking=True)
    np.testing.assert_array_equal(result, workload.expected)
    assert np.all(result[~workload.mask] == 0)


def test_locked_updates_from_parallel_tf_functions_lose_nothing(rng):
    indices, updates, mask, expected = _workload(rng)
    variable = tf.Variable(tf.zeros([NUM_ROWS, WIDTH]))
    mask_tensor = tf.constant(mask)

    @tf.function
    def step(i, u):
        pe.masked_scatter_sub(variable, i, u, mask_tensor)

    def worker(t: int) -> None:
        for s in range(STEPS_PER_THREAD):
            step(tf.constant(indices[t, s]), tf.constant(updates[t, s]))

    _run_threads(worker)
    np.testing.assert_array_equal(variable.numpy(), expected)


def test_reads_during_updates_see_whole_snapshots():
    """A reader's snapshot never changes after it was taken."""
    variable = tf.Variable(tf.zeros([NUM_ROWS, WIDTH]))
    mask = tf.ones([NUM_ROWS], tf.bool)
    ones = tf.ones([NUM_ROWS, WIDTH])
    all_rows = tf.range(NUM_ROWS)
    stop = threading.Event()
    snapshots: list[tuple[tf.Tensor, np.ndarray]] = []

    def reader() -> None:
        while not stop.is_set():
            snapshot = variable.read_value()
            snapshots.append((snapshot, snapshot.numpy().copy()))

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(200):
        pe.masked_scatter_sub(variable, all_rows, ones, mask)
    stop.set()
    thread.join()
    assert snapshots
    for snapshot, copy_at_read in snapshots:
        np.testing.assert_array_equal(snapshot.numpy(), copy_at_read)
    np.testing.assert_array_equal(variable.numpy(), -200 * np.ones([NUM_ROWS, WIDTH]))


def test_unlocked_updates_keep_frozen_rows_and_bounds(rng):
    """use_locking=False may lose increments (documented) but never frozen rows."""
    workload = _workload(rng)
    result = _update_from_threads(workload, use_locking=False)
    np.testing.assert_array_equal(result[~workload.mask], 0)
    # Every update is positive, so each value lies between the full sum and 0.
    assert np.all(result <= 0)
    assert np.all(result >= workload.expected)
