"""Mutated trained-rows files: each one loads correctly or is refused with nothing written.

One real file (an untied reversible layer's rows and Adam slots) is mutated
2,400 ways (truncations, header sizes, byte flips, edits of the header's JSON
text and of its values, hostile tensor values) from a seeded generator, and
loaded onto one layer and optimizer. A load either succeeds, writing exactly
the rows the file holds, or raises ``TrainedRowsError`` with every variable of
the layer and optimizer bit-identical. ``pytest -s`` prints the outcomes.
"""

from __future__ import annotations

import collections
import json
import struct

import keras
import numpy as np
import pytest

import partial_embedding as pe
from partial_embedding.trained_rows import TrainedRowsError
from pe_testing import case_seed, make_rng

NUM_ROWS, WIDTH = 24, 3
TRAINABLE = [17, 19, 20, 23]
MUTATIONS_PER_KIND = 400
JUNK_NUMBERS = [
    "-1", "1.5", "1e3", "Infinity", "-Infinity", "NaN", '"4"', '"+40"', '"4_0"', "true", "null",
    "[]", "{}", "18446744073709551616", "9223372036854775808", "9" * 5000, "0", "4096",
]  # fmt: skip
JUNK_METADATA = [
    "", "-1", "+40", "4_0", "1e3", "NaN", "Infinity", "[3.0]", "[-3]", "[true]", "[\"a\"]", "{}",
    "[" * 5000 + "]" * 5000, "[[3]]", "[9223372036854775808]", "x" * 100, "int8", "float32",
    "[\"momentum\", \"momentum\"]", "[\"\"]", "3", "[3, 3]", "0" * 64, "F" * 64,
]  # fmt: skip


def _model(seed: int):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((NUM_ROWS, WIDTH)).astype(np.float32)
    layer = pe.PartialReversibleEmbedding(
        NUM_ROWS, WIDTH, weights=table, trainable_ids=TRAINABLE, tie_weights=False
    )
    layer.build()
    # Initialized by embeddings_initializer, unseeded: the same values every time instead.
    layer.reverse_embeddings.assign(rng.standard_normal((NUM_ROWS, WIDTH)).astype(np.float32))
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), compact_slots=False)
    optimizer.build(layer.trainable_variables)
    return layer, optimizer


def _state(layer, optimizer) -> list[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in [*layer.weights, *optimizer.variables]]


def _restore(layer, optimizer, state) -> None:
    for variable, values in zip([*layer.weights, *optimizer.variables], state):
        variable.assign(values)


def _pick(rng, choices):
    """One of ``choices`` (``rng.choice`` would turn them into one NumPy dtype)."""
    choices = list(choices)
    return choices[int(rng.integers(0, len(choices)))]


def _split(data: bytes) -> tuple[dict, bytes]:
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + size]), data[8 + size :]


def _join(header_text: bytes, body: bytes) -> bytes:
    return struct.pack("<Q", len(header_text)) + header_text + body


def _truncate(data, rng):
    return data[: int(rng.integers(0, len(data)))]


def _header_size(data, rng):
    (size,) = struct.unpack("<Q", data[:8])
    choices = [0, 1, 2, size - 1, size + 1, size + 8, len(data), 2**31, 2**63, 2**64 - 1]
    return struct.pack("<Q", _pick(rng, choices)) + data[8:]


def _flip_bytes(data, rng):
    mutated = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        position = int(rng.integers(0, len(data)))
        mutated[position] ^= int(rng.integers(1, 256))
    return bytes(mutated)


def _edit_numbers(data, rng):
    """Replaces one number of the header's JSON text with a junk token."""
    (size,) = struct.unpack("<Q", data[:8])
    text = data[8 : 8 + size].decode()
    starts = [i for i, c in enumerate(text) if c.isdigit() and not text[i - 1].isalnum()]
    start = int(_pick(rng, starts))
    end = start
    while end < len(text) and text[end].isdigit():
        end += 1
    edited = text[:start] + str(_pick(rng, JUNK_NUMBERS)) + text[end:]
    return _join(edited.encode(), data[8 + size :])


def _edit_header(data, rng):
    """Deletes, renames or replaces one entry or field of the header or its metadata."""
    header, body = _split(data)
    metadata = header["__metadata__"]
    if rng.random() < 0.5:
        key = str(_pick(rng, sorted(metadata)))
        action = rng.integers(0, 3)
        if action == 0:
            del metadata[key]
        else:
            metadata[key] = str(_pick(rng, JUNK_METADATA))
    else:
        name = str(_pick(rng, sorted(set(header) - {"__metadata__"})))
        entry = header[name]
        field = str(_pick(rng, ["dtype", "shape", "data_offsets", "delete", "rename", "extra"]))
        if field == "delete":
            del header[name]
        elif field == "rename":
            header[name + "_"] = header.pop(name)
        elif field == "extra":
            entry["extra"] = 1
        elif field == "dtype":
            entry["dtype"] = str(_pick(rng, ["F32", "F64", "I64", "I32", "BOOL", "U8", "X", ""]))
        else:
            values = entry[field]
            values.append(1) if rng.random() < 0.2 or not values else None
            index = int(rng.integers(0, len(values)))
            values[index] = int(_pick(rng, [0, 1, 2, 3, 4, 12, 48, 2**40, 2**62])) + values[index]
    if rng.random() < 0.1:
        header = {"nested": [[[[header]]]]}
    return _join(json.dumps(header).encode(), body)


def _edit_values(data, rng):
    """Writes a hostile value into one tensor's bytes: ids out of range, NaN, a negative step."""
    header, body = _split(data)
    name = str(_pick(rng, sorted(set(header) - {"__metadata__"})))
    begin, end = header[name]["data_offsets"]
    dtype = {"I64": "<i8", "F32": "<f4", "BOOL": "u1"}[header[name]["dtype"]]
    values = np.frombuffer(body[begin:end], dtype=dtype).copy()
    if values.size:
        junk = {"<i8": [-1, NUM_ROWS, 2**62, -(2**63)], "<f4": [np.nan, np.inf, -np.inf, 7.0]}
        position = int(rng.integers(0, values.size))
        values[position] = _pick(rng, junk.get(dtype, [2, 255, 0]))
    (size,) = struct.unpack("<Q", data[:8])
    return data[: 8 + size] + body[:begin] + values.tobytes() + body[end:]


MUTATIONS = {
    "truncate": _truncate,
    "header size": _header_size,
    "flip bytes": _flip_bytes,
    "edit numbers": _edit_numbers,
    "edit header": _edit_header,
    "edit values": _edit_values,
}


def _check_loaded(layer, optimizer, before, path) -> None:
    rows = pe.read_trained_rows(path)
    state = _state(layer, optimizer)
    assert rows.reverse is not None
    for part, index in [(rows, 0), (rows.reverse, 1)]:  # layer.weights: the two tables first
        expected = before[index].copy()
        expected[part.ids] = part.values
        assert np.array_equal(state[index], expected, equal_nan=False)
    assert int(optimizer.iterations.numpy()) == rows.iterations


def test_every_mutated_file_loads_correctly_or_is_refused_untouched(tmp_path):
    layer, optimizer = _model(case_seed("fuzz model"))
    # "Trained" rows that differ from the table, in both tables.
    for table, mask in [
        (layer.embeddings, layer.trainable_mask),
        (layer.reverse_embeddings, layer.reverse_trainable_mask),
    ]:
        table.assign(table.numpy() + 0.5 * mask.numpy()[:, None])
    optimizer.iterations.assign(7)
    original = tmp_path / "original.safetensors"
    pe.save_trained_rows(original, layer, optimizer=optimizer)
    data = original.read_bytes()
    fresh_layer, fresh_optimizer = _model(case_seed("fuzz model"))
    before = _state(fresh_layer, fresh_optimizer)
    rng = make_rng("fuzz mutations")
    path = tmp_path / "mutated.safetensors"
    outcomes: collections.Counter = collections.Counter()
    for kind, mutate in sorted(MUTATIONS.items()) * MUTATIONS_PER_KIND:
        path.write_bytes(mutate(data, rng))
        try:
            pe.load_trained_rows(path, fresh_layer, optimizer=fresh_optimizer)
        except TrainedRowsError as error:
            assert str(path) in str(error)
            after = _state(fresh_layer, fresh_optimizer)
            assert all(a.tobytes() == b.tobytes() for a, b in zip(after, before)), (kind, error)
            outcomes[kind, "refused"] += 1
            continue
        _check_loaded(fresh_layer, fresh_optimizer, before, path)
        _restore(fresh_layer, fresh_optimizer, before)
        outcomes[kind, "loaded"] += 1
    total = sum(outcomes.values())
    print(f"\n{total} mutated files:")
    for (kind, outcome), count in sorted(outcomes.items()):
        print(f"  {kind:13s} {outcome:8s} {count}")
    assert total == len(MUTATIONS) * MUTATIONS_PER_KIND >= 2000
    # Both outcomes are reached: every kind is refused sometimes, and files
    # whose changed bytes are still valid values load.
    assert all(outcomes[kind, "refused"] > 0 for kind in MUTATIONS)
    assert outcomes["edit values", "loaded"] > 0 and outcomes["flip bytes", "loaded"] > 0


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_mutations_are_deterministic(kind):
    data = bytes(range(256)) * 2
    header = json.dumps(
        {"__metadata__": {"a": "1"}, "t": {"dtype": "I64", "shape": [4], "data_offsets": [0, 32]}}
    ).encode()
    data = _join(header, np.arange(4, dtype="<i8").tobytes())
    first = MUTATIONS[kind](data, np.random.default_rng(case_seed("deterministic", kind)))
    second = MUTATIONS[kind](data, np.random.default_rng(case_seed("deterministic", kind)))
    assert first == second
