"""partial_embedding.trained_rows: save the trained rows, load them back, merge them."""

from __future__ import annotations

import json
import os
import struct
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding._internal import safetensors as safetensors_codec
from partial_embedding._internal.safetensors import write_file as _write_safetensors
from partial_embedding.trained_rows import TrainedRowsError
from pe_testing import (
    VALUE_DTYPE_NAMES,
    VALUE_DTYPES,
    assert_bits_equal,
    bits_equal,
    buffer_address,
    make_rng,
)

NUM_ROWS = 40
WIDTH = 3
NEW_IDS = np.arange(30, 40)  # the "new words"
TRAINED_FIRST = NEW_IDS[:6]  # trained before saving; the rest only after
SAFETENSORS_DTYPES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}


def _pretrained(seed: str, dtype: str = "float32", rows: int = NUM_ROWS) -> np.ndarray:
    values = make_rng("pretrained", seed).standard_normal((rows, WIDTH))
    return values.astype(tf.as_dtype(dtype).as_numpy_dtype)


def _layer(table: np.ndarray, trainable_ids=NEW_IDS) -> pe.PartialEmbedding:
    layer = pe.PartialEmbedding(
        table.shape[0],
        table.shape[1],
        weights=table,
        trainable_ids=trainable_ids,
        dtype=str(tf.as_dtype(table.dtype).name),
    )
    layer.build()
    return layer


def _optimizer(layer: pe.PartialEmbedding, compact: bool) -> pe.MaskedOptimizer:
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=compact)
    optimizer.build(layer.trainable_variables)
    return optimizer


def _batches(ids_pool: np.ndarray, count: int, seed: str) -> list[np.ndarray]:
    rng = make_rng("batches", seed)
    frozen = np.arange(0, 30)
    return [
        np.concatenate([rng.choice(ids_pool, 4), rng.choice(frozen, 3)]).astype(np.int32)
        for _ in range(count)
    ]


def _train(layer: pe.PartialEmbedding, optimizer: pe.MaskedOptimizer, batches) -> None:
    for batch in batches:
        with tf.GradientTape() as tape:
            outputs = tf.cast(layer(batch), tf.float32)
            loss = tf.reduce_sum(tf.square(outputs - 0.5))
        optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)


def _slot_values(
    optimizer: pe.MaskedOptimizer, layer: pe.PartialEmbedding
) -> dict[str, np.ndarray]:
    """Each slot as a full [V, D] array (compact slots expanded), for comparing."""
    from partial_embedding.trained_rows import _read_slots

    slots, _ = _read_slots(optimizer, layer.embeddings, np.arange(layer.embeddings.shape[0]))
    return slots


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=VALUE_DTYPE_NAMES)
def test_save_then_load_gives_identical_outputs(tmp_path, dtype):
    table = _pretrained("round trip", dtype.name)
    trained = _layer(table)
    _train(
        trained, pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), _batches(TRAINED_FIRST, 4, "a")
    )
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, trained)
    assert saved.ids.tolist() == NEW_IDS.tolist()

    fresh = _layer(table)
    mask_before = fresh.trainable_mask.numpy().copy()
    loaded = pe.load_trained_rows(path, fresh)
    assert_bits_equal(loaded.values, saved.values, "rows read back")
    assert_bits_equal(fresh.embeddings.numpy(), trained.embeddings.numpy(), "table after load")
    every_id = np.arange(NUM_ROWS)
    assert_bits_equal(fresh(every_id), trained(every_id), "outputs")
    # The mask is left as it was.
    assert np.array_equal(fresh.trainable_mask.numpy(), mask_before)


@pytest.mark.parametrize(
    "saved_compact, loaded_compact",
    [(True, True), (False, False), (True, False), (False, True)],
    ids=["compact", "full-size", "compact-to-full-size", "full-size-to-compact"],
)
def test_continued_training_is_identical_with_slots(tmp_path, saved_compact, loaded_compact):
    table = _pretrained("continued")
    trained = _layer(table)
    trained_optimizer = _optimizer(trained, saved_compact)
    assert trained_optimizer.has_compact_slots(trained.embeddings) == saved_compact
    before = _batches(TRAINED_FIRST, 5, "before")
    _train(trained, trained_optimizer, before)
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, trained, optimizer=trained_optimizer)
    assert sorted(saved.slots) == ["momentum", "velocity"]
    assert saved.iterations == 5
    # With compact slots, rows that never trained have no optimizer state:
    # the new rows the batches looked up have (random draws from
    # TRAINED_FIRST need not reach all of them).
    looked_up = np.concatenate(before)
    expected_present = np.isin(NEW_IDS, looked_up) if saved_compact else np.ones(10, bool)
    assert saved.slot_present.tolist() == expected_present.tolist()

    fresh = _layer(table)
    fresh_optimizer = _optimizer(fresh, loaded_compact)
    pe.load_trained_rows(path, fresh, optimizer=fresh_optimizer)
    assert int(fresh_optimizer.iterations.numpy()) == 5
    expected_slots = _slot_values(trained_optimizer, trained)
    for name, values in _slot_values(fresh_optimizer, fresh).items():
        assert_bits_equal(values, expected_slots[name], f"slot {name} after load")

    # Every new row (also those untrained so far) and some frozen ones.
    after = _batches(NEW_IDS, 6, "after")
    _train(trained, trained_optimizer, after)
    _train(fresh, fresh_optimizer, after)
    assert_bits_equal(fresh.embeddings.numpy(), trained.embeddings.numpy(), "table after training")
    expected_slots = _slot_values(trained_optimizer, trained)
    for name, values in _slot_values(fresh_optimizer, fresh).items():
        assert_bits_equal(values, expected_slots[name], f"slot {name} after training")


def test_without_restoring_slots_training_differs(tmp_path):
    # The check above is not vacuous: fresh slots give another result.
    table = _pretrained("vacuous")
    trained = _layer(table)
    optimizer = _optimizer(trained, True)
    _train(trained, optimizer, _batches(TRAINED_FIRST, 5, "before"))
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained)
    fresh = _layer(table)
    fresh_optimizer = _optimizer(fresh, True)
    pe.load_trained_rows(path, fresh)
    after = _batches(NEW_IDS, 3, "after")
    _train(trained, optimizer, after)
    _train(fresh, fresh_optimizer, after)
    assert not bits_equal(fresh.embeddings.numpy(), trained.embeddings.numpy())


def test_merge_serves_with_a_plain_embedding(tmp_path):
    table = _pretrained("merge")
    trained = _layer(table)
    _train(trained, pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), _batches(NEW_IDS, 4, "m"))
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained)
    before = table.copy()
    merged = pe.merge_trained_rows(table, path)
    assert_bits_equal(table, before, "the input table")
    serving = keras.layers.Embedding(NUM_ROWS, WIDTH, weights=[merged])
    every_id = np.arange(NUM_ROWS)
    assert_bits_equal(serving(every_id), trained(every_id), "plain Embedding outputs")


def test_merge_accepts_a_memmap(tmp_path):
    table = _pretrained("memmap")
    trained = _layer(table)
    _ = trained.embeddings.assign(table + 1.0 * trained.trainable_mask.numpy()[:, None])
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained)
    stored = np.lib.format.open_memmap(tmp_path / "t.npy", "w+", table.dtype, table.shape)
    stored[:] = table
    stored.flush()
    mapped = np.load(tmp_path / "t.npy", mmap_mode="r")
    merged = pe.merge_trained_rows(mapped, path)
    assert type(merged) is np.ndarray
    assert_bits_equal(merged, trained.embeddings.numpy(), "merged table")


def test_ids_override_and_metadata(tmp_path):
    table = _pretrained("ids")
    trained = _layer(table)
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, trained, ids=[33, 31], metadata={"vocab": "v2"})
    assert saved.ids.tolist() == [31, 33]
    read = pe.read_trained_rows(path)
    assert read.ids.tolist() == [31, 33]
    assert read.metadata["vocab"] == "v2"
    assert read.metadata["num_rows"] == str(NUM_ROWS)
    assert read.metadata["dtype"] == "float32"
    assert read.metadata["library_version"] == pe.__version__
    assert read.slots == {} and read.slot_present is None and read.iterations is None
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="reserved"):
        pe.save_trained_rows(path, trained, metadata={"dtype": "x"})


def test_untied_output_table_rows_travel_too(tmp_path):
    table = _pretrained("input")
    output_table = _pretrained("output")

    def tied_pair(output_ids):
        inputs, outputs = _layer(table), _layer(output_table, output_ids)
        return types.SimpleNamespace(
            embeddings=inputs.embeddings,
            trainable_mask=inputs.trainable_mask,
            reverse_embeddings=outputs.embeddings,
            reverse_trainable_mask=outputs.trainable_mask,
        )

    trained = tied_pair([1, 2])
    _ = trained.embeddings.assign(trained.embeddings.numpy() + 1)
    _ = trained.reverse_embeddings.assign(trained.reverse_embeddings.numpy() * 2)
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, trained)
    assert saved.reverse is not None and saved.reverse.ids.tolist() == [1, 2]
    fresh = tied_pair([1, 2])
    pe.load_trained_rows(path, fresh, check=False)
    expected = table.copy()
    expected[NEW_IDS] += 1
    assert_bits_equal(fresh.embeddings.numpy(), expected, "input table")
    expected_output = output_table.copy()
    expected_output[[1, 2]] *= 2
    assert_bits_equal(fresh.reverse_embeddings.numpy(), expected_output, "output table")
    merged = pe.merge_trained_rows(output_table, path, reverse=True, check=False)
    assert_bits_equal(merged, expected_output, "merged output table")


# -- size ---------------------------------------------------------------------------------


def test_file_for_100_new_tokens_is_at_most_1_percent_of_the_table(tmp_path):
    rows, width = 32_768, 64
    table = np.zeros((rows, width), np.float32)
    layer = pe.PartialEmbedding(
        rows, width, weights=table, trainable_ids=np.arange(rows - 100, rows)
    )
    layer.build()
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam())
    optimizer.build(layer.trainable_variables)
    rows_only = tmp_path / "rows.safetensors"
    with_slots = tmp_path / "rows_and_slots.safetensors"
    pe.save_trained_rows(rows_only, layer)
    pe.save_trained_rows(with_slots, layer, optimizer=optimizer)
    print(
        f"table {table.nbytes} B; rows {rows_only.stat().st_size} B; "
        f"rows + Adam slots {with_slots.stat().st_size} B"
    )
    assert rows_only.stat().st_size <= 0.01 * table.nbytes
    assert with_slots.stat().st_size <= 0.01 * table.nbytes


# -- refusals: nothing written -------------------------------------------------------------


def _trained_file(tmp_path, table, **save_arguments):
    trained = _layer(table)
    _ = trained.embeddings.assign(table + 1.0 * trained.trainable_mask.numpy()[:, None])
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained, **save_arguments)
    return path


def test_another_pretrained_table_is_refused(tmp_path):
    path = _trained_file(tmp_path, _pretrained("one"))
    other_table = _pretrained("another")
    other = _layer(other_table)
    with pytest.raises(TrainedRowsError, match="other rows differ"):
        pe.load_trained_rows(path, other)
    assert_bits_equal(other.embeddings.numpy(), other_table, "untouched table")
    with pytest.raises(TrainedRowsError, match="other rows differ"):
        pe.merge_trained_rows(other_table, path)
    # One changed bit of one frozen row is enough.
    nudged = _pretrained("one")
    nudged.view(np.uint32)[0, 0] ^= 1
    with pytest.raises(TrainedRowsError, match="other rows differ"):
        pe.merge_trained_rows(nudged, path)
    pe.load_trained_rows(path, other, check=False)
    assert_bits_equal(other.embeddings.numpy()[:30], other_table[:30], "frozen rows")


def read_safetensors(path):
    """Every tensor and the metadata of a safetensors file (through the codec)."""
    with open(path, "rb") as stream:
        header = safetensors_codec.read_header(stream, str(path))
        tensors = {
            name: safetensors_codec.read_tensor(stream, header, name, str(path))
            for name in header.tensors
        }
    return tensors, dict(header.metadata)


def _rewrite(path, change):
    """Rewrites a trained-rows file after ``change(tensors, metadata)``."""
    tensors, metadata = read_safetensors(path)
    change(tensors, metadata)
    _write_safetensors(path, tensors, metadata)


def _set(name, value):
    def change(tensors, metadata):
        tensors[name] = value

    return change


BAD_FILES = {
    "id out of range": (_set("ids", np.arange(31, 41)), r"ids\[9\] = 40 is not in \[0, 40\)"),
    "negative id": (_set("ids", np.arange(-1, 9)), r"ids\[0\] = -1"),
    "repeated id": (_set("ids", np.array([30] * 10)), "repeat"),
    "int32 ids": (_set("ids", np.arange(30, 40, dtype=np.int32)), "not int64"),
    "rows shape": (_set("rows", np.zeros((10, 2), np.float32)), r"rows must be float32 \[10, 3\]"),
    "rows dtype": (_set("rows", np.zeros((10, 3), np.float64)), "rows must be float32"),
    "missing rows": (lambda tensors, metadata: tensors.pop("rows"), "rows must be"),
    "slot shape": (_set("slot.momentum", np.zeros((9, 3), np.float32)), "slot.momentum must"),
    "no format": (lambda tensors, metadata: metadata.pop("format"), "not a trained-rows file"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_fail_with_nothing_written(tmp_path, case):
    table = _pretrained("bad")
    trained = _layer(table)
    trained_optimizer = _optimizer(trained, True)
    _train(trained, trained_optimizer, _batches(TRAINED_FIRST, 2, "bad"))
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained, optimizer=trained_optimizer)
    change, message = BAD_FILES[case]
    _rewrite(path, change)
    fresh = _layer(table)
    optimizer = _optimizer(fresh, True)
    with pytest.raises(TrainedRowsError, match=message):
        pe.load_trained_rows(path, fresh, optimizer=optimizer)
    assert_bits_equal(fresh.embeddings.numpy(), table, "table")
    assert optimizer.compact_slot_rows(fresh.embeddings) == 0
    assert int(optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize(
    "layer_table",
    [np.zeros((NUM_ROWS + 1, WIDTH), np.float32), np.zeros((NUM_ROWS, WIDTH + 1), np.float32)],
    ids=["more rows", "wider"],
)
def test_a_table_of_another_shape_is_refused(tmp_path, layer_table):
    path = _trained_file(tmp_path, _pretrained("shape"))
    other = _layer(layer_table, trainable_ids=[1])
    with pytest.raises(TrainedRowsError, match=r"rows of a \[40, 3\] table"):
        pe.load_trained_rows(path, other)
    assert not np.any(other.embeddings.numpy())
    with pytest.raises(TrainedRowsError, match=r"rows of a \[40, 3\] table"):
        pe.merge_trained_rows(layer_table, path)


def test_a_table_of_another_dtype_is_refused(tmp_path):
    path = _trained_file(tmp_path, _pretrained("dtype"))
    other = _layer(_pretrained("dtype", "float64"))
    with pytest.raises(TrainedRowsError, match="rows of a float32 table; this table is float64"):
        pe.load_trained_rows(path, other)


def test_optimizer_mismatch_is_refused(tmp_path):
    table = _pretrained("optimizer")
    path = _trained_file(tmp_path, table)  # saved without slots
    fresh = _layer(table)
    optimizer = _optimizer(fresh, True)
    with pytest.raises(TrainedRowsError, match=r"holds optimizer slots \[\]"):
        pe.load_trained_rows(path, fresh, optimizer=optimizer)
    unbuilt = pe.MaskedOptimizer(keras.optimizers.Adam())
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="not built"):
        pe.save_trained_rows(path, fresh, optimizer=unbuilt)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="MaskedOptimizer"):
        pe.save_trained_rows(path, fresh, optimizer=keras.optimizers.Adam())
    assert_bits_equal(fresh.embeddings.numpy(), table, "table")


def test_bad_ids_to_save_are_refused(tmp_path):
    layer = _layer(_pretrained("save ids"))
    path = tmp_path / "rows.safetensors"
    with pytest.raises(TrainedRowsError, match=r"ids\[1\] = 40 is not in \[0, 40\)"):
        pe.save_trained_rows(path, layer, ids=[3, 40])
    with pytest.raises(TrainedRowsError, match="repeat"):
        pe.save_trained_rows(path, layer, ids=[3, 3])
    with pytest.raises(TrainedRowsError, match="1-D integer"):
        pe.save_trained_rows(path, layer, ids=[0.5])
    assert not path.exists()


@pytest.mark.parametrize("cut", [4, 12, -1])
def test_truncated_files_are_refused(tmp_path, cut):
    path = _trained_file(tmp_path, _pretrained("cut"))
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(TrainedRowsError):
        pe.read_trained_rows(path)


# -- the format -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=VALUE_DTYPE_NAMES)
def test_the_file_is_valid_safetensors(tmp_path, dtype):
    table = _pretrained("format", dtype.name)
    trained = _layer(table)
    optimizer = _optimizer(trained, True)
    _train(trained, optimizer, _batches(TRAINED_FIRST, 2, "format"))
    path = tmp_path / "rows.safetensors"
    saved = pe.save_trained_rows(path, trained, optimizer=optimizer)
    data = path.read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    assert (8 + header_size) % 8 == 0
    header = json.loads(data[8 : 8 + header_size])
    metadata = header.pop("__metadata__")
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    value_name = SAFETENSORS_DTYPES[dtype.name]
    expected = {
        "ids": ("I64", [10]),
        "rows": (value_name, [10, WIDTH]),
        "slot.momentum": (value_name, [10, WIDTH]),
        "slot.velocity": (value_name, [10, WIDTH]),
        "slot_present": ("BOOL", [10]),
        "iterations": ("I64", []),
    }
    assert {name: (e["dtype"], e["shape"]) for name, e in header.items()} == expected
    body = data[8 + header_size :]
    spans = sorted(tuple(e["data_offsets"]) for e in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(body)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    begin, end = header["ids"]["data_offsets"]
    assert np.frombuffer(body[begin:end], "<i8").tolist() == NEW_IDS.tolist()
    begin, end = header["rows"]["data_offsets"]
    raw_rows = np.frombuffer(body[begin:end], saved.values.dtype.newbyteorder("<"))
    assert_bits_equal(raw_rows.reshape(10, WIDTH), trained.embeddings.numpy()[NEW_IDS], "raw rows")


def test_the_safetensors_package_reads_it(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = _trained_file(tmp_path, _pretrained("package"))
    loaded = safetensors_numpy.load_file(str(path))
    saved = pe.read_trained_rows(path)
    assert loaded["ids"].tolist() == saved.ids.tolist()
    assert_bits_equal(loaded["rows"], saved.values, "rows")


# -- in place ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "full-size"])
def test_load_writes_in_place_and_leaves_reads_aliasing(tmp_path, compact):
    table = _pretrained("in place")
    trained = _layer(table)
    trained_optimizer = _optimizer(trained, compact)
    _train(trained, trained_optimizer, _batches(TRAINED_FIRST, 2, "in place"))
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained, optimizer=trained_optimizer)
    fresh = _layer(table)
    optimizer = _optimizer(fresh, compact)
    if compact:
        slot = optimizer.compact_slot_variables[-1]
        # Room for every saved row: the slots need not grow (which copies).
        assert int(tf.shape(slot)[0]) >= len(NEW_IDS)
    else:
        slot = [v for v in optimizer.variables if tuple(v.shape) == (NUM_ROWS, WIDTH)][-1]
    variables = [fresh.embeddings, slot]
    before = [buffer_address(v) for v in variables]
    pe.load_trained_rows(path, fresh, optimizer=optimizer)
    # The same buffer, and reads alias it (copy-on-read mode would copy each read).
    for variable, address in zip(variables, before):
        assert buffer_address(variable) == address
        assert buffer_address(variable) == address


def test_an_optimizer_without_the_table_or_an_unbuilt_layer_is_refused(tmp_path):
    table = _pretrained("foreign")
    layer = _layer(table)
    other = _layer(table)
    optimizer = _optimizer(other, False)
    path = tmp_path / "rows.safetensors"
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="has no slots for"):
        pe.save_trained_rows(path, layer, optimizer=optimizer)
    unbuilt = pe.PartialEmbedding(NUM_ROWS, WIDTH, trainable_ids=NEW_IDS)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="is it built"):
        pe.save_trained_rows(path, unbuilt)
    assert not path.exists()


# -- hostile files ------------------------------------------------------------------------------


def _header_and_body(path):
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return data[8 : 8 + size].decode(), data[8 + size :]


def _with_header(path, text, body):
    encoded = text.encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)


def _replace_in_header(old, new):
    def edit(path):
        text, body = _header_and_body(path)
        assert old in text, (old, text)
        _with_header(path, text.replace(old, new, 1), body)

    return edit


def _set_metadata(key, value):
    def edit(path):
        text, body = _header_and_body(path)
        header = json.loads(text)
        if value is None:
            del header["__metadata__"][key]
        else:
            header["__metadata__"][key] = value
        _with_header(path, json.dumps(header), body)

    return edit


HOSTILE_FILES = {
    "Infinity offset": (_replace_in_header('"data_offsets":[0,', '"data_offsets":[Infinity,'), "Infinity"),  # noqa: E501
    "NaN shape": (_replace_in_header('"shape":[10]', '"shape":[NaN]'), "NaN"),
    "dimension 2**64": (_replace_in_header('"shape":[10]', f'"shape":[{2**64}]'), r"not an integer in \[0, 2\*\*63\)|not an integer in"),  # noqa: E501
    "dimension 2**63": (_replace_in_header('"shape":[10]', f'"shape":[{2**63}]'), "not an integer in"),  # noqa: E501
    "5000 digits": (_replace_in_header('"shape":[10]', '"shape":[' + "9" * 5000 + "]"), "5000 digits"),  # noqa: E501
    "float shape": (_replace_in_header('"shape":[10]', '"shape":[10.0]'), "not an integer"),
    "string shape": (_replace_in_header('"shape":[10]', '"shape":["+10"]'), "not an integer"),
    "bool shape": (_replace_in_header('"shape":[10]', '"shape":[true]'), "not an integer"),
    "product overflows int64": (_replace_in_header('"shape":[10,3]', f'"shape":[{2**62},{2**62}]'), "bytes for shape"),  # noqa: E501
    "unknown dtype": (_replace_in_header('"dtype":"I64"', '"dtype":"I128"'), "dtype 'I128' is not one of"),  # noqa: E501
    "overlapping offsets": (_replace_in_header('"data_offsets":[0,', '"data_offsets":[8,'), "bytes for shape|overlap"),  # noqa: E501
    "deep header": (lambda path: _with_header(path, '{"a":' + "[" * 100_000 + "]" * 100_000 + "}", b""), "nested deeper"),  # noqa: E501
    "non-object header": (lambda path: _with_header(path, "[1, 2]", b""), "not a JSON object"),
    "non-JSON header": (lambda path: _with_header(path, "{not json}", b""), "not JSON"),
    "header size past the end": (lambda path: path.write_bytes(struct.pack("<Q", 2**63 + 5) + b"{}"), "header size"),  # noqa: E501
    "missing other_rows_sha256": (_set_metadata("other_rows_sha256", None), "'other_rows_sha256' is missing"),  # noqa: E501
    "+40 num_rows": (_set_metadata("num_rows", "+40"), "num_rows is '\\+40'"),
    "4_0 num_rows": (_set_metadata("num_rows", "4_0"), "num_rows is '4_0'"),
    "deep width": (_set_metadata("width", "[" * 5000 + "]" * 5000), "nested deeper"),
    "float width": (_set_metadata("width", "[3.0]"), "not an integer"),
    "huge width": (_set_metadata("width", f"[{2**64}]"), "not an integer"),
    "corrupt slot_names": (_set_metadata("slot_names", '["momentum", '), "slot_names' is not JSON"),
    "slot_names not a list": (_set_metadata("slot_names", '{"a": 1}'), "slot_names must be a JSON list"),  # noqa: E501
    "deep slot_names": (_set_metadata("slot_names", "[" * 5000 + "]" * 5000), "nested deeper"),
    "unknown table dtype": (_set_metadata("dtype", "complex64"), "dtype is 'complex64'"),
}  # fmt: skip


def _with_values(name, value):
    def change(tensors, metadata):
        tensors[name] = np.array(tensors[name], copy=True)
        tensors[name].reshape(-1)[0] = value

    return change


def _with_byte(name, value):
    def change(tensors, metadata):
        tensors[name] = np.array(tensors[name], copy=True)
        tensors[name].view(np.uint8)[0] = value

    return change


BAD_VALUES = {
    "NaN row": (_with_values("rows", np.nan), "rows of row id 30 holds NaN or Inf"),
    "Inf slot": (_with_values("slot.velocity", np.inf), "slot.velocity of row id 30 holds NaN"),
    "negative iterations": (_set("iterations", np.asarray(-3, np.int64)), "iterations is -3"),
    "missing iterations": (lambda tensors, metadata: tensors.pop("iterations"), "iterations must be int64 \\[\\]"),  # noqa: E501
    "extra tensor": (_set("extra", np.zeros(3, np.float32)), "unexpected tensors \\['extra'\\]"),
    "unsorted ids": (_set("ids", np.arange(39, 29, -1)), "not sorted"),
    "slot_present byte 2": (_with_byte("slot_present", 2), "bytes other than 0 and 1"),
}  # fmt: skip


def _saved_with_slots(tmp_path, compact=True):
    table = _pretrained("hostile")
    trained = _layer(table)
    trained_optimizer = _optimizer(trained, compact)
    _train(trained, trained_optimizer, _batches(TRAINED_FIRST, 2, "hostile"))
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained, optimizer=trained_optimizer)
    return table, path


def _assert_refused_untouched(path, table, message, compact=True):
    fresh = _layer(table)
    optimizer = _optimizer(fresh, compact)
    before = [v.numpy().copy() for v in [*fresh.weights, *optimizer.variables]]
    with pytest.raises(TrainedRowsError, match=message) as raised:
        pe.load_trained_rows(path, fresh, optimizer=optimizer)
    assert str(path) in str(raised.value)
    after = [v.numpy() for v in [*fresh.weights, *optimizer.variables]]
    assert len(after) == len(before)
    for value, expected in zip(after, before):
        assert_bits_equal(value, expected, "a variable after a refused load")


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_hostile_headers_are_refused_with_one_clear_error(tmp_path, case):
    table, path = _saved_with_slots(tmp_path)
    edit, message = HOSTILE_FILES[case]
    edit(path)
    _assert_refused_untouched(path, table, message)


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_are_refused_with_nothing_written(tmp_path, case):
    table, path = _saved_with_slots(tmp_path)
    change, message = BAD_VALUES[case]
    _rewrite(path, change)
    _assert_refused_untouched(path, table, message)


def test_a_huge_sparse_file_or_header_is_refused_without_reading_it(tmp_path):
    import tracemalloc

    _, path = _saved_with_slots(tmp_path)
    original = path.stat().st_size
    with open(path, "r+b") as stream:
        stream.truncate(original + (3 << 29))  # 1.5 GiB more, sparse
    huge_header = tmp_path / "header.safetensors"
    with open(huge_header, "wb") as stream:
        stream.write(struct.pack("<Q", 100 << 20) + b"{" + b" " * 16)
        stream.truncate(8 + (100 << 20) + 64)
    # A header within the 1 MiB limit, of 400,000 numbers.
    many_values = tmp_path / "values.safetensors"
    _with_header(many_values, '{"a":[' + ",".join(["0"] * 400_000) + "]}", b"")
    tracemalloc.start()
    with pytest.raises(TrainedRowsError, match="bytes after the last tensor"):
        pe.read_trained_rows(path)
    with pytest.raises(TrainedRowsError, match="header size 104857600"):
        pe.read_trained_rows(huge_header)
    # Refused before it is parsed into 400,000 Python objects.
    with pytest.raises(TrainedRowsError, match="more than 65536 values"):
        pe.read_trained_rows(many_values)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 24 << 20, peak


# -- nothing written when the optimizer does not fit ----------------------------------------------


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "full-size"])
def test_an_optimizer_built_without_the_table_writes_nothing(tmp_path, compact):
    table, path = _saved_with_slots(tmp_path, compact)
    fresh = _layer(table)
    unrelated = keras.Variable(np.zeros((5, WIDTH), np.float32))
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=compact)
    optimizer.build([unrelated])
    before = [v.numpy().copy() for v in [*fresh.weights, *optimizer.variables]]
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="has no slots for"):
        pe.load_trained_rows(path, fresh, optimizer=optimizer)
    for value, expected in zip([*fresh.weights, *optimizer.variables], before):
        assert_bits_equal(value, expected, "a variable after a refused load")


def _reversible(table, output_table):
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS, WIDTH, weights=table, trainable_ids=NEW_IDS, tie_weights=False
    )
    layer.build()
    layer.reverse_embeddings.assign(output_table)
    return layer


def test_an_untied_reversible_layer_is_not_partly_written(tmp_path):
    table, output_table = _pretrained("untied in"), _pretrained("untied out")
    trained = _reversible(table, output_table)
    optimizer = _optimizer(trained, False)
    _train(trained, optimizer, _batches(TRAINED_FIRST, 2, "untied"))
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, trained, optimizer=optimizer)
    fresh = _reversible(table, output_table)
    # Built with the input table only: the output table has no slots.
    partial_optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=False)
    partial_optimizer.build([fresh.embeddings])
    before = [v.numpy().copy() for v in [*fresh.weights, *partial_optimizer.variables]]
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="reverse_embeddings"):
        pe.load_trained_rows(path, fresh, optimizer=partial_optimizer)
    for value, expected in zip([*fresh.weights, *partial_optimizer.variables], before):
        assert_bits_equal(value, expected, "a variable after a refused load")
    # With the right optimizer it loads: both tables and their slots.
    full_optimizer = _optimizer(fresh, False)
    pe.load_trained_rows(path, fresh, optimizer=full_optimizer)
    assert_bits_equal(fresh.reverse_embeddings.numpy(), trained.reverse_embeddings.numpy(), "out")
    assert_bits_equal(fresh.embeddings.numpy(), trained.embeddings.numpy(), "in")


# -- saving ---------------------------------------------------------------------------------------


def test_saving_never_follows_a_planted_symlink_and_leaves_no_temporary(tmp_path):
    layer = _layer(_pretrained("symlink"))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path = tmp_path / "rows.safetensors"
    (tmp_path / "rows.safetensors.partial").symlink_to(victim)
    pe.save_trained_rows(path, layer)
    assert victim.read_text() == "keep me"
    assert pe.read_trained_rows(path).ids.tolist() == NEW_IDS.tolist()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rows.safetensors",
        "rows.safetensors.partial",
        "victim.txt",
    ]


def test_saving_onto_a_directory_fails_clearly_and_leaves_nothing(tmp_path):
    layer = _layer(_pretrained("directory"))
    target = tmp_path / "rows"
    target.mkdir()
    with pytest.raises(TrainedRowsError, match="is a directory"):
        pe.save_trained_rows(target, layer)
    assert [p.name for p in tmp_path.iterdir()] == ["rows"]
    assert list(target.iterdir()) == []


def test_a_failed_write_removes_its_temporary_file(tmp_path, monkeypatch):
    layer = _layer(_pretrained("failed write"))

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        pe.save_trained_rows(tmp_path / "rows.safetensors", layer)
    assert list(tmp_path.iterdir()) == []


def test_bytes_and_pathlike_paths_work(tmp_path):
    layer = _layer(_pretrained("paths"))
    as_bytes = os.fsencode(tmp_path / "bytes.safetensors")
    pe.save_trained_rows(as_bytes, layer)
    pe.save_trained_rows(tmp_path / "pathlike.safetensors", layer)
    for path in (as_bytes, tmp_path / "pathlike.safetensors", str(tmp_path / "bytes.safetensors")):
        assert pe.read_trained_rows(path).ids.tolist() == NEW_IDS.tolist()
        pe.load_trained_rows(path, _layer(_pretrained("paths")))
    mode = os.stat(as_bytes).st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_concurrent_saves_to_one_path_both_succeed(tmp_path):
    import threading

    path = tmp_path / "rows.safetensors"
    layers = [_layer(_pretrained("concurrent")), _layer(_pretrained("concurrent"), [1, 2])]
    errors = []

    def save(layer):
        try:
            for _ in range(10):
                pe.save_trained_rows(path, layer)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=save, args=(layer,)) for layer in layers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert pe.read_trained_rows(path).ids.tolist() in (NEW_IDS.tolist(), [1, 2])
    assert [p.name for p in tmp_path.iterdir()] == ["rows.safetensors"]
