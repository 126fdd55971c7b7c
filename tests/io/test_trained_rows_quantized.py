"""Trained rows with quantized layers: float <-> int8 files, fingerprints, merging.

References: the float layer the rows were trained in (values bit for bit),
Keras' own quantized ``Embedding`` on the merged float table (int8 bytes and
scales bit for bit) and a float64 NumPy reading of the int8 rows.
"""

from __future__ import annotations

import tracemalloc

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding import _trained_rows_tables
from partial_embedding._internal import safetensors as codec
from partial_embedding.trained_rows import TrainedRowsError
from pe_testing import assert_bits_equal, make_rng

NUM_ROWS = 48
WIDTH = 4
NEW_IDS = np.arange(40, 48)
QUANTIZED_STATE = (
    "_embeddings",
    "embeddings_scale",
    "trainable_mask",
    "float_rows",
    "float_rows_mask",
    "float_row_ids",
    "float_row_index",
)


def _pretrained(seed: str) -> np.ndarray:
    return make_rng("quantized rows", seed).standard_normal((NUM_ROWS, WIDTH)).astype(np.float32)


def _float_layer(table: np.ndarray, ids=NEW_IDS) -> pe.PartialEmbedding:
    layer = pe.PartialEmbedding(NUM_ROWS, WIDTH, weights=table, trainable_ids=ids)
    layer.build()
    return layer


def _int8_layer(table: np.ndarray, ids=NEW_IDS, capacity: int | None = None):
    layer = pe.PartialEmbedding(
        NUM_ROWS,
        WIDTH,
        weights=table,
        trainable_ids=ids,
        dtype="int8_from_float32",
        trainable_capacity=capacity,
    )
    layer.build()
    return layer


def _optimizer(layer: pe.PartialEmbedding) -> pe.MaskedOptimizer:
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=True)
    optimizer.build(layer.trainable_variables)
    return optimizer


def _train(layer, optimizer, steps: int, seed: str, pool=NEW_IDS) -> np.ndarray:
    """Trains on ``steps`` random batches; returns every id they looked up."""
    rng = make_rng("batches", seed)
    looked_up = []
    for _ in range(steps):
        batch = np.concatenate([rng.choice(pool, 3), rng.choice(40, 3)]).astype(np.int32)
        looked_up.append(batch)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(batch) - 0.5))
        optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
    return np.concatenate(looked_up)


def _state(layer) -> dict[str, np.ndarray]:
    if layer.quantization_mode is None:
        return {"embeddings": layer.embeddings.numpy().copy()}
    return {name: getattr(layer, name).numpy().copy() for name in QUANTIZED_STATE}


def _assert_state(layer, before: dict[str, np.ndarray], what: str) -> None:
    for name, value in _state(layer).items():
        assert_bits_equal(value, before[name], f"{what}: {name}")


def _dequantized(layer, ids) -> np.ndarray:
    """float64 NumPy reading of int8 rows: codes / scale."""
    codes = layer.embeddings.numpy()[ids].astype(np.float64)
    return codes / layer.embeddings_scale.numpy()[ids].astype(np.float64)[:, None]


def _rewrite(path, drop=(), update=None) -> None:
    """The file at ``path`` again, without metadata keys ``drop``, with ``update``."""
    with open(path, "rb") as stream:
        header = codec.read_header(stream, str(path))
        tensors = {name: codec.read_tensor(stream, header, name, "") for name in header.tensors}
    metadata = {k: v for k, v in header.metadata.items() if k not in drop}
    codec.write_file(path, tensors, {**metadata, **(update or {})})


# -- round trips ------------------------------------------------------------------------


def test_float_rows_load_into_a_quantized_layer(tmp_path):
    table = _pretrained("float to int8")
    trained = _float_layer(table)
    _train(trained, _optimizer(trained), 4, "float")
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, trained)
    assert "other_rows_sha256" in saved.metadata
    assert "other_rows_int8_sha256" in saved.metadata
    assert "quantization" not in saved.metadata

    # Only two of the saved rows are trainable (and have float rows) here.
    quantized = _int8_layer(table, ids=NEW_IDS[:2], capacity=10)
    frozen_bytes = quantized.embeddings.numpy().copy()
    frozen_scales = quantized.embeddings_scale.numpy().copy()
    mask_before = quantized.trainable_mask.numpy().copy()
    pe.load_trained_rows(path, quantized)
    # Every saved row now reads its trained float values, bit for bit.
    assert_bits_equal(quantized(NEW_IDS), trained(NEW_IDS), "saved rows")
    assert_bits_equal(quantized(NEW_IDS), saved.values, "saved rows against the file")
    used_ids = quantized.float_row_ids.numpy()
    assert used_ids[: len(NEW_IDS)].tolist() == NEW_IDS.tolist()
    assert np.all(used_ids[len(NEW_IDS) :] == NUM_ROWS)
    # The int8 rows, scales and mask are untouched; frozen lookups are codes / scale.
    assert_bits_equal(quantized.embeddings.numpy(), frozen_bytes, "int8 rows")
    assert_bits_equal(quantized.embeddings_scale.numpy(), frozen_scales, "scales")
    assert np.array_equal(quantized.trainable_mask.numpy(), mask_before)
    store_mask = quantized.float_rows_mask.numpy()
    assert np.count_nonzero(store_mask) == 2
    frozen_ids = np.arange(40)
    np.testing.assert_allclose(
        quantized(frozen_ids).numpy(), _dequantized(quantized, frozen_ids), rtol=2**-23
    )


def test_quantized_rows_load_into_a_float_layer(tmp_path):
    table = _pretrained("int8 to float")
    trained = _int8_layer(table)
    _train(trained, _optimizer(trained), 4, "int8")
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, trained)
    # The float store's rows, as lookups give them.
    assert saved.values.dtype == np.float32
    assert_bits_equal(saved.values, trained(NEW_IDS), "saved values")
    assert not np.array_equal(saved.values, table[NEW_IDS])  # they trained
    assert saved.metadata["quantization"] == "int8"
    assert "other_rows_sha256" not in saved.metadata

    fresh = _float_layer(table)
    pe.load_trained_rows(path, fresh)
    expected = table.copy()
    expected[NEW_IDS] = saved.values
    assert_bits_equal(fresh.embeddings.numpy(), expected, "float table after load")


def test_quantized_to_quantized_with_slots_continues_identically(tmp_path):
    table = _pretrained("int8 to int8")
    trained = _int8_layer(table)
    trained_optimizer = _optimizer(trained)
    looked_up = _train(trained, trained_optimizer, 5, "before", pool=NEW_IDS[:5])
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, trained, optimizer=trained_optimizer)
    # State for exactly the new rows the batches looked up (the random draws
    # need not reach every id of the pool, and may reach others).
    assert saved.slot_present.tolist() == np.isin(NEW_IDS, looked_up).tolist()
    assert saved.iterations == 5

    fresh = _int8_layer(table)
    fresh_optimizer = _optimizer(fresh)
    pe.load_trained_rows(path, fresh, optimizer=fresh_optimizer)
    assert int(fresh_optimizer.iterations.numpy()) == 5
    _train(trained, trained_optimizer, 4, "after")
    _train(fresh, fresh_optimizer, 4, "after")
    for name in QUANTIZED_STATE:
        assert_bits_equal(getattr(fresh, name), getattr(trained, name), f"{name} after training")
    every_id = np.arange(NUM_ROWS)
    assert_bits_equal(fresh(every_id), trained(every_id), "outputs after training")


def test_rows_without_state_load_into_a_layer_with_no_trainable_rows(tmp_path):
    table = _pretrained("no store rows yet")
    trained = _int8_layer(table)
    _train(trained, _optimizer(trained), 3, "a")
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained)
    fresh = _int8_layer(table, ids=[], capacity=len(NEW_IDS))
    pe.load_trained_rows(path, fresh)
    assert_bits_equal(fresh(NEW_IDS), trained(NEW_IDS), "loaded rows")
    assert not np.any(fresh.trainable_mask.numpy())
    assert not np.any(fresh.float_rows_mask.numpy())


def test_saving_rows_without_float_rows_gives_their_dequantized_values(tmp_path):
    table = _pretrained("frozen rows saved")
    layer = _int8_layer(table)
    optimizer = _optimizer(layer)
    _train(layer, optimizer, 3, "a", pool=NEW_IDS[:1])
    ids = np.array([2, 17, NEW_IDS[0], NEW_IDS[1]])
    saved = pe.save_trained_rows(tmp_path / "rows.safetensors", layer, optimizer=optimizer, ids=ids)
    np.testing.assert_allclose(saved.values[:2], _dequantized(layer, ids[:2]), rtol=2**-23)
    assert_bits_equal(saved.values, layer(ids), "saved values")
    # Only the row that trained has optimizer state; the others' slots are Adam's zeros.
    assert saved.slot_present.tolist() == [False, False, True, False]
    for name, values in saved.slots.items():
        assert not np.any(values[[0, 1, 3]]), name
        assert np.any(values[2]), name


# -- refusals -----------------------------------------------------------------------------


def test_another_pretrained_table_is_refused_either_way(tmp_path):
    float_file, int8_file = tmp_path / "float.safetensors", tmp_path / "int8.safetensors"
    table, other_table = _pretrained("one"), _pretrained("another")
    pe.save_trained_rows(float_file, _float_layer(table))
    pe.save_trained_rows(int8_file, _int8_layer(table))

    for layer in (_int8_layer(other_table), _float_layer(other_table)):
        before = _state(layer)
        for path in (float_file, int8_file):
            with pytest.raises(TrainedRowsError, match="other rows differ"):
                pe.load_trained_rows(path, layer)
            _assert_state(layer, before, f"after refusing {path.name}")
    with pytest.raises(TrainedRowsError, match="int8 bytes and scales"):
        pe.merge_trained_rows(other_table, int8_file, quantized=True)

    # One changed bit of one frozen row changes its int8 row or its scale.
    nudged = table.copy()
    nudged[0, np.argmax(np.abs(nudged[0]))] *= 1.01
    with pytest.raises(TrainedRowsError, match="other rows differ"):
        pe.load_trained_rows(float_file, _int8_layer(nudged))
    # A frozen row times 2: the same int8 bytes, only its scale differs.
    doubled = table.copy()
    doubled[3] *= 2
    doubled_layer = _int8_layer(doubled)
    assert_bits_equal(doubled_layer.embeddings, _int8_layer(table).embeddings, "int8 rows")
    with pytest.raises(TrainedRowsError, match="other rows differ"):
        pe.load_trained_rows(float_file, doubled_layer)
    # check=False loads anyway.
    layer = _int8_layer(other_table)
    pe.load_trained_rows(int8_file, layer, check=False)
    assert_bits_equal(layer(NEW_IDS), table[NEW_IDS], "loaded without the check")


def test_a_file_without_the_int8_fingerprint(tmp_path):
    table = _pretrained("old file")
    path = tmp_path / "old.safetensors"
    saved = pe.save_trained_rows(path, _float_layer(table))
    _rewrite(path, drop=["other_rows_int8_sha256"])
    # A float layer checks it as before.
    pe.load_trained_rows(path, _float_layer(table))
    quantized = _int8_layer(table)
    before = _state(quantized)
    with pytest.raises(TrainedRowsError, match="no int8 fingerprint.*check=False"):
        pe.load_trained_rows(path, quantized)
    _assert_state(quantized, before, "refused")
    pe.load_trained_rows(path, quantized, check=False)
    assert_bits_equal(quantized(NEW_IDS), saved.values, "loaded without the check")


@pytest.mark.parametrize(
    "drop, update, message",
    [
        (["other_rows_int8_sha256"], {}, "'other_rows_int8_sha256' is missing"),
        ([], {"quantization": "int4"}, "quantization is 'int4'"),
        ([], {"other_rows_int8_sha256": "AB" * 32}, "not 64 lowercase hex"),
    ],
    ids=["missing", "unknown mode", "not hex"],
)
def test_bad_int8_metadata_is_refused(tmp_path, drop, update, message):
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, _int8_layer(_pretrained("bad metadata")))
    _rewrite(path, drop=drop, update=update)
    with pytest.raises(TrainedRowsError, match=message):
        pe.read_trained_rows(path)


def test_more_rows_than_free_float_rows_is_refused(tmp_path):
    table = _pretrained("capacity")
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, _float_layer(table))
    layer = _int8_layer(table, ids=NEW_IDS[:2], capacity=4)
    before = _state(layer)
    with pytest.raises(TrainedRowsError, match="6 of its rows have no float row.*2 free"):
        pe.load_trained_rows(path, layer, check=False)
    _assert_state(layer, before, "refused")
    with pytest.raises(ValueError, match="reserved key"):
        pe.save_trained_rows(path, layer, metadata={"quantization": "int8"})


# -- merging ------------------------------------------------------------------------------


def _keras_quantized(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    reference = keras.layers.Embedding(*table.shape, weights=table)
    reference.quantize("int8")
    return reference._embeddings.numpy(), reference.embeddings_scale.numpy()


@pytest.mark.parametrize("source", ["float", "int8"])
@pytest.mark.parametrize("block_rows", [None, 5], ids=["one block", "blocks of 5"])
def test_merge_float_and_quantized(tmp_path, monkeypatch, source, block_rows):
    table = _pretrained("merge")
    layer = _float_layer(table) if source == "float" else _int8_layer(table)
    _train(layer, _optimizer(layer), 4, "merge")
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, layer)
    if block_rows is not None:
        monkeypatch.setattr(_trained_rows_tables, "_BLOCK_BYTES", block_rows * WIDTH * 4)
    mapped_path = tmp_path / "table.npy"
    np.save(mapped_path, table)
    mapped = np.load(mapped_path, mmap_mode="r")

    merged = pe.merge_trained_rows(mapped, path)
    expected = table.astype(np.float64)
    expected[NEW_IDS] = saved.values
    assert merged.dtype == np.float32
    assert_bits_equal(merged, expected.astype(np.float32), "float merge")

    codes, scales = pe.merge_trained_rows(mapped, path, quantized=True)
    keras_codes, keras_scales = _keras_quantized(expected.astype(np.float32))
    assert codes.dtype == np.int8 and codes.shape == (NUM_ROWS, WIDTH)
    assert scales.dtype == np.float32 and scales.shape == (NUM_ROWS,)
    assert_bits_equal(codes, keras_codes, "int8 rows")
    assert_bits_equal(scales, keras_scales, "scales")
    # float64 reading: each row's largest value maps to +-127, every value
    # within half a step of its float value.
    step = 1.0 / scales.astype(np.float64)[:, None]
    assert np.all(np.abs(codes.astype(np.float64) * step - expected) <= 0.5 * step * (1 + 1e-6))
    assert np.all(np.abs(codes).max(axis=1) == 127)
    # The frozen rows are those a quantized layer of the table holds.
    frozen = _int8_layer(table)
    assert_bits_equal(codes[:40], frozen.embeddings.numpy()[:40], "frozen int8 rows")
    assert_bits_equal(scales[:40], frozen.embeddings_scale.numpy()[:40], "frozen scales")
    assert_bits_equal(np.asarray(mapped), table, "table unchanged")


def test_merge_refuses_a_non_bool_quantized(tmp_path):
    table = _pretrained("merge flag")
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, _float_layer(table))
    with pytest.raises(ValueError, match="quantized: must be a bool"):
        pe.merge_trained_rows(table, path, quantized="int8")


def test_quantized_merge_never_holds_the_float_table(tmp_path, monkeypatch):
    rows, width = 1 << 16, 16  # 4 MiB of float32, merged in 64 KiB blocks
    table_path = tmp_path / "table.npy"
    np.save(table_path, make_rng("big table").standard_normal((rows, width)).astype(np.float32))
    table = np.load(table_path, mmap_mode="r")
    layer = pe.PartialEmbedding(rows, width, weights=table, trainable_ids=[7, rows - 1])
    layer.build()
    rows_path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(rows_path, layer)
    monkeypatch.setattr(_trained_rows_tables, "_BLOCK_BYTES", 64 << 10)
    tracemalloc.start()
    try:
        codes, scales = pe.merge_trained_rows(table, rows_path, quantized=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The int8 result (1 MiB) and its scales (256 KiB), blocks of 64 KiB.
    assert peak < 0.45 * table.nbytes, f"peak {peak} of a {table.nbytes}-byte float table"
    assert codes.nbytes + scales.nbytes < peak
    reference_codes, reference_scales = _trained_rows_tables.quantize(np.asarray(table[:9]))
    assert_bits_equal(codes[:7], reference_codes[:7], "first rows")
    assert_bits_equal(scales[8], reference_scales[8], "a frozen row's scale")
    assert_bits_equal(codes[7], _trained_rows_tables.quantize(saved.values[:1])[0][0], "row 7")
