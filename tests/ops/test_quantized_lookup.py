"""``quantized_lookup``: the one-op CPU path and the stock-op path (XLA, tensors)
against a float64 NumPy reference, ids checked, gradient on permitted store rows only."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from partial_embedding.ops import quantized_lookup

# These test the one-op CPU lookup (and the stock path next to it): on a machine with a GPU too.
pytestmark = pytest.mark.usefixtures("on_cpu")


def _problem(rng: np.random.Generator, index_dtype):
    rows, width = int(rng.integers(5, 60)), int(rng.integers(1, 20))
    codes = rng.integers(-127, 128, size=(rows, width)).astype(np.int8)
    scales = rng.uniform(0.5, 300.0, size=rows).astype(np.float32)
    with_float = np.sort(rng.choice(rows, size=int(rng.integers(0, rows // 2 + 1)), replace=False))
    capacity = len(with_float) + int(rng.integers(0, 4))
    store = rng.normal(size=(capacity + 1, width)).astype(np.float32)
    store_of = rng.permutation(capacity)[: len(with_float)]  # any store order
    sorted_ids = np.full(capacity + 1, rows, np.int32)
    index = np.full(capacity + 1, capacity, np.int32)
    sorted_ids[: len(with_float)] = with_float
    index[: len(with_float)] = store_of
    mask = rng.random(capacity + 1) < 0.6
    mask[-1] = False
    # Duplicates: draw from a few rows, among them rows with store rows.
    ids = rng.choice(rows, size=int(rng.integers(1, 40))).astype(index_dtype)
    return codes, scales, store, mask, sorted_ids, index, ids


def _reference(codes, scales, store, sorted_ids, index, ids):
    """float64 NumPy: float row where the id has one, else int8 / scale rounded once."""
    expected = (codes[ids].astype(np.float64) / scales[ids, None].astype(np.float64)).astype(
        np.float32
    )
    store_rows = np.full(len(ids), len(store) - 1)
    for position, row in enumerate(ids):
        hit = np.flatnonzero(sorted_ids == row)
        if hit.size:
            store_rows[position] = index[hit[0]]
            expected[position] = store[index[hit[0]]]
    return expected, store_rows


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("path", ["op", "xla", "tensors"])
def test_values_and_gradient_match_the_reference(rng, index_dtype, path) -> None:
    for _ in range(3):
        codes, scales, store, mask, sorted_ids, index, ids = _problem(rng, index_dtype)
        variable = tf.Variable(store)

        def run(variable=variable, codes=codes, scales=scales, mask=mask, sorted_ids=sorted_ids,
                index=index, ids=ids, store=store):  # fmt: skip
            with tf.GradientTape() as tape:
                source = variable
                if path == "tensors":
                    source = tf.convert_to_tensor(store)
                    tape.watch(source)
                rows = quantized_lookup(codes, scales, source, mask, sorted_ids, index, ids)
                loss = tf.reduce_sum(rows * tf.range(1.0, rows.shape[1] + 1.0))
            return rows, tape.gradient(loss, source)

        if path == "xla":
            rows, gradient = tf.function(run, jit_compile=True)()
        else:
            rows, gradient = run()
        expected, store_rows = _reference(codes, scales, store, sorted_ids, index, ids)
        np.testing.assert_array_equal(rows.numpy(), expected)
        dense = tf.convert_to_tensor(gradient).numpy()
        weights = np.arange(1.0, store.shape[1] + 1.0)
        reference = np.zeros_like(store, dtype=np.float64)
        for row in store_rows:
            if mask[row]:
                reference[row] += weights
        np.testing.assert_allclose(dense, reference)


def test_out_of_range_ids_are_named(rng) -> None:
    codes, scales, store, mask, sorted_ids, index, _ = _problem(rng, np.int64)
    rows = codes.shape[0]
    for bad in (rows, -1):
        ids = np.array([0, 1, bad, 2], np.int64) % max(rows, 1)
        ids[2] = bad
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=rf"ids\[2\] = {bad} is not in \[0, {rows}\)"
        ):
            quantized_lookup(codes, scales, tf.Variable(store), mask, sorted_ids, index, ids)
