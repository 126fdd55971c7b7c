"""Row updates an XLA step skips for want of a compact slot row (issue #24,
item 4): counted, readable after the step, warned of at the next eager point;
none on the paths the library offers for changing a mask."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import partial_embedding as pe

VOCAB, WIDTH, LENGTH = 32, 4, 4


def _model(permitted):
    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted)
    model = keras.Sequential(
        [
            keras.Input((LENGTH,), dtype="int32"),
            layer,
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1))
    model.compile(optimizer=optimizer, loss="mse", jit_compile=True)
    return model, layer, optimizer


def _fit(model, ids):
    model.fit(ids, np.ones([len(ids), 1]), batch_size=len(ids), epochs=1, verbose=0)


def test_directly_assigned_mask_under_xla_counts_and_warns_of_skipped_updates():
    model, layer, optimizer = _model([0, 1])
    _fit(model, np.array([[0, 1, 0, 1], [1, 0, 1, 0]]))  # the shape of every batch below
    assert optimizer.skipped_row_updates == 0
    assert optimizer.compact_slot_rows(layer.embeddings) == 2
    # Rows 5..12 permitted by assigning the mask variable directly: the
    # slots (room for 2 rows) cannot grow inside the compiled step, and the
    # step is not retraced (same batch shape), so nothing reserves room.
    mask = np.zeros(VOCAB, bool)
    mask[[0, 1, *range(5, 13)]] = True
    layer.trainable_mask.assign(mask)
    before = layer.embeddings.numpy()
    with pytest.warns(RuntimeWarning, match=r"skipped \d+ row update"):
        _fit(model, np.array([[5, 6, 7, 8], [9, 10, 11, 12]]))
    skipped = optimizer.skipped_row_updates
    after = layer.embeddings.numpy()
    moved = np.flatnonzero(np.any(after != before, axis=1))
    # Each permitted row in the batch either found a slot row and moved, or
    # was counted as skipped and kept its bits.
    assert skipped > 0
    assert len(moved) + skipped == 8, (moved, skipped)
    assert set(moved) <= set(range(5, 13))
    # Warned once per new count: reading again does not warn.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert optimizer.skipped_row_updates == skipped
    # Not saved: no checkpoint or config entry.
    assert "skipped" not in str(optimizer.get_config())
    assert not any("skipped" in v.path for v in optimizer.variables)


def test_unfreeze_reserves_room_so_nothing_is_skipped():
    model, layer, optimizer = _model([0, 1])
    _fit(model, np.array([[0, 1, 0, 1], [1, 0, 1, 0]]))  # the shape of every batch below
    layer.unfreeze(range(5, 13))
    before = layer.embeddings.numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _fit(model, np.array([[5, 6, 7, 8], [9, 10, 11, 12]]))
    assert optimizer.skipped_row_updates == 0
    moved = np.flatnonzero(np.any(layer.embeddings.numpy() != before, axis=1))
    assert moved.tolist() == list(range(5, 13))
