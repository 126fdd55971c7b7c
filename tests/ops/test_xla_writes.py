"""The XLA path's writes (``_internal.xla``): a scatter whose rows that may
not be written are numbered -1, which XLA skips, and the owner-map
deduplication that adds only the repeated occurrences of a row to its owner.

Rows that are not written keep their exact bits (``-0.0``, infinities and
NaNs included) even when their amounts are NaN; written rows and summed
values equal float64 NumPy references.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding._internal import xla as _xla
from pe_testing import assert_bits_equal, assert_within_rounding

SPECIALS = np.array([-0.0, np.inf, -np.inf, np.nan], np.float32)


def _table_with_specials(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    table = rng.normal(size=(rows, width)).astype(np.float32)
    picks = rng.random(table.shape) < 0.2
    table[picks] = rng.choice(SPECIALS, size=int(picks.sum()))
    return table


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_skipped_rows_keep_their_bits_and_written_rows_accumulate(rng, index_dtype):
    rows_count, width, count = 30, 5, 60
    start = _table_with_specials(rng, rows_count, width)
    variable = tf.Variable(start)
    rows = rng.integers(0, rows_count, size=count)  # many repeats
    write = rng.random(count) < 0.5
    amounts = rng.normal(size=(count, width)).astype(np.float32)
    amounts[~write] = np.nan  # would poison any row they reached

    @tf.function(jit_compile=True)
    def step(rows, amounts, write):
        _xla.scatter_sub_at(variable, _xla.write_targets(rows, write), amounts)

    step(tf.constant(rows, index_dtype), tf.constant(amounts), tf.constant(write))
    result = variable.numpy()
    written = np.unique(rows[write])
    untouched = np.setdiff1d(np.arange(rows_count), written)
    assert_bits_equal(result[untouched], start[untouched], "rows not written")
    expected = start.astype(np.float64)
    np.subtract.at(expected, rows[write], amounts[write].astype(np.float64))
    np.testing.assert_allclose(result[written], expected[written], rtol=1e-5, atol=1e-5)


def test_write_targets_numbers_the_rows_not_written_minus_one():
    targets = _xla.write_targets(tf.constant([4, 7, 2], tf.int64), tf.constant([True, False, True]))
    assert targets.dtype == tf.int64
    assert targets.numpy().tolist() == [4, _xla.SKIPPED_ROW, 2]


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_owner_map_sums_each_row_once_when_every_id_repeats(rng, index_dtype):
    """Heavy repeats (a handful of rows, some ids out of range): each valid
    row is owned by exactly one of its occurrences, which holds the float64
    sum of all of them; every other position is padding with zero values."""
    rows_count, count = 6, 200
    ids = rng.integers(-1, rows_count + 1, size=count)
    values = rng.normal(size=(count, 3))
    # int64 as the library's: an int32 variable stays on the host next to a GPU.
    owner_map = tf.Variable(tf.fill([rows_count + 1], tf.constant(-5, tf.int64)))  # stale

    @tf.function(jit_compile=True)
    def deduplicate(ids, values):
        return _xla.owner_segment_sum(ids, values, rows_count, owner_map)

    rows, summed = (t.numpy() for t in deduplicate(tf.constant(ids, index_dtype), values))
    real = rows < rows_count
    valid_ids = ids[(ids >= 0) & (ids < rows_count)]
    assert sorted(rows[real].tolist()) == sorted(set(valid_ids.tolist()))
    assert np.all(rows[~real] == rows_count)
    assert np.all(summed[~real] == 0)
    for position in np.flatnonzero(real):
        terms = values[ids == rows[position]]
        # The exact sum (math.fsum, rounded once); the kernel's k - 1 additions
        # in any order err by at most gamma(k - 1) * sum |values|, which a
        # relative tolerance misses where the mixed-sign values cancel.
        expected = np.array([math.fsum(column) for column in terms.T])
        assert_within_rounding(
            summed[position],
            expected,
            np.abs(terms).sum(axis=0),
            len(terms),
            "float64",
            f"row {rows[position]}",
        )
        assert ids[position] == rows[position]  # the owner is an occurrence
