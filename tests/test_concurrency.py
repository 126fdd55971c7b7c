"""Concurrent updates of one variable from several Python threads."""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf

import partial_embedding as pe

NUM_ROWS, WIDTH = 64, 32
THREADS, STEPS_PER_THREAD, BATCH = 4, 25, 512


def _workload(seed: int):
    """Integer-valued updates: their float32 sums are exact in any order."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, NUM_ROWS, size=(THREADS, STEPS_PER_THREAD, BATCH))
    updates = rng.integers(1, 4, size=(THREADS, STEPS_PER_THREAD, BATCH, WIDTH)).astype(np.float32)
    mask = rng.random(NUM_ROWS) < 0.75
    expected = np.zeros((NUM_ROWS, WIDTH), np.float64)
    for t in range(THREADS):
        for s in range(STEPS_PER_THREAD):
            for position, row in enumerate(indices[t, s]):
                if mask[row]:
                    expected[row] -= updates[t, s, position]
    return indices, updates, mask, expected


def _run_threads(target) -> None:
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


def test_locked_updates_from_threads_lose_nothing():
    indices, updates, mask, expected = _workload(np.random.SeedSequence().entropy % 2**32)
    variable = tf.Variable(tf.zeros([NUM_ROWS, WIDTH]))
    mask_tensor = tf.constant(mask)

    def worker(t: int) -> None:
        for s in range(STEPS_PER_THREAD):
            pe.masked_scatter_sub(
                variable, indices[t, s], updates[t, s], mask_tensor, use_locking=True
            )

    _run_threads(worker)
    np.testing.assert_array_equal(variable.numpy(), expected)
    assert np.all(variable.numpy()[~mask] == 0)


def test_locked_updates_from_parallel_tf_functions_lose_nothing():
    indices, updates, mask, expected = _workload(np.random.SeedSequence().entropy % 2**32)
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


def test_unlocked_updates_keep_frozen_rows_and_bounds():
    """use_locking=False may lose increments (documented) but never frozen rows."""
    indices, updates, mask, expected = _workload(np.random.SeedSequence().entropy % 2**32)
    variable = tf.Variable(tf.zeros([NUM_ROWS, WIDTH]))
    mask_tensor = tf.constant(mask)

    def worker(t: int) -> None:
        for s in range(STEPS_PER_THREAD):
            pe.masked_scatter_sub(
                variable, indices[t, s], updates[t, s], mask_tensor, use_locking=False
            )

    _run_threads(worker)
    result = variable.numpy()
    np.testing.assert_array_equal(result[~mask], 0)
    # Every update is positive, so each value lies between the full sum and 0.
    assert np.all(result <= 0)
    assert np.all(result >= expected)
