"""The tables trained rows come from and go to: float, or int8 with a float store.

:mod:`partial_embedding.trained_rows` reads and writes every table through
one of two views, so that a rows file moves between a float model and a
quantized one (``PartialEmbedding.quantize("int8")``) in either direction:

* :class:`FloatTable`: a float variable, or an array-like table (merging).
  Rows are read and written in place; its fingerprints are computed from its
  float rows, the int8 one by quantizing them block by block as Keras'
  ``AbsMaxQuantizer(axis=-1)`` does (the bytes a quantized layer would hold).
* :class:`QuantizedTable`: a quantized layer. Rows are read from its float
  store where they have a store row, else dequantized (Keras' formula);
  writing gives a store row to each row without one (within the layer's
  ``trainable_capacity``). Its only fingerprint is the int8 one, from the
  int8 bytes and scales it holds.

Fingerprints, of the rows *not* saved (in row order, little-endian bytes):

* :data:`FLOAT_FINGERPRINT`: SHA-256 of the float rows;
* :data:`INT8_FINGERPRINT`: SHA-256 of the concatenated SHA-256 digests of the
  int8 rows and of their scales (cast to the table's float dtype).

Both are computed a block of rows at a time: no table is copied whole.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal import safetensors as codec
from partial_embedding._internal.variables import (
    assign_host_rows,
    read_host_rows,
    resolve_variable,
)
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.layers import _quantized

#: Metadata key (after the table's prefix) of the float fingerprint.
FLOAT_FINGERPRINT = "other_rows_sha256"
#: Metadata key (after the table's prefix) of the int8 fingerprint.
INT8_FINGERPRINT = "other_rows_int8_sha256"
#: Both, in the order a file's metadata lists them.
FINGERPRINTS = (FLOAT_FINGERPRINT, INT8_FINGERPRINT)
#: Metadata key (after the table's prefix) saying the rows come from a
#: quantized table ("int8"); absent for a float table.
QUANTIZATION = "quantization"
#: The keys of a table's metadata written here.
METADATA_KEYS = (*FINGERPRINTS, QUANTIZATION)
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: Bytes of float rows read (hashed, quantized) at a time.
_BLOCK_BYTES = 4 << 20


def row_blocks(num_rows: int, row_bytes: int) -> Iterator[tuple[int, int]]:
    """(first row, end row) of blocks of about ``_BLOCK_BYTES``."""
    block = max(_BLOCK_BYTES // max(row_bytes, 1), 1)
    for start in range(0, num_rows, block):
        yield start, min(start + block, num_rows)


def quantize(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, scales in the rows' dtype) as Keras quantizes an embedding."""
    codes, scales = _quantized.quantize_rows(_quantized.weight_quantizer(None), rows)
    return codes, scales.astype(rows.dtype)


class _Int8Digest:
    """The int8 fingerprint, fed a block of (int8 rows, scales) at a time."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.codes = hashlib.sha256()
        self.scales = hashlib.sha256()

    def update(self, codes: np.ndarray, scales: np.ndarray) -> None:
        self.codes.update(codes.astype(np.int8).tobytes())
        self.scales.update(codec.little_endian_bytes(scales.astype(self.dtype)))

    def hexdigest(self) -> str:
        return hashlib.sha256(self.codes.digest() + self.scales.digest()).hexdigest()


def _kept(num_rows: int, excluded_ids: np.ndarray) -> np.ndarray:
    kept = np.ones(num_rows, dtype=bool)
    kept[excluded_ids] = False
    return kept


def _numpy_dtype(dtype: Any) -> np.dtype:
    return np.dtype(tf.as_dtype(dtype).as_numpy_dtype)


class FloatTable:
    """A float table: a layer's variable or an array-like ``[V, ...]``."""

    quantized = False

    def __init__(self, table: Any) -> None:
        self.is_variable = isinstance(table, (tf.Variable, keras.Variable))
        self.table = resolve_variable(table, "embeddings") if self.is_variable else table
        self.variable = table
        self.shape = tuple(int(n) for n in table.shape)
        self.dtype = _numpy_dtype(table.dtype)

    def block(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop``, as NumPy."""
        if self.is_variable:
            return np.asarray(self.table.value()[start:stop].numpy())
        return np.asarray(self.table[start:stop])

    def read(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids``, as NumPy (the rows only)."""
        if self.is_variable:
            return read_host_rows(self.table, ids)
        return np.asarray(self.table[ids])

    def metadata(self, saved_ids: np.ndarray) -> dict[str, str]:
        """What a file says of the table's other rows (those not in ``saved_ids``)."""
        return self.fingerprints(saved_ids, FINGERPRINTS)

    def fingerprints(self, excluded_ids: np.ndarray, keys: Iterable[str]) -> dict[str, str]:
        """The fingerprints named by ``keys`` of the rows not in ``excluded_ids``."""
        keys = list(keys)
        kept = _kept(self.shape[0], excluded_ids)
        float_digest = hashlib.sha256()
        int8_digest = _Int8Digest(self.dtype)
        row_bytes = int(np.prod(self.shape[1:])) * self.dtype.itemsize
        for start, stop in row_blocks(self.shape[0], row_bytes):
            rows = self.block(start, stop)[kept[start:stop]]
            if FLOAT_FINGERPRINT in keys:
                float_digest.update(codec.little_endian_bytes(rows))
            if INT8_FINGERPRINT in keys and len(rows):
                int8_digest.update(*quantize(rows.reshape(len(rows), -1)))
        digests = {FLOAT_FINGERPRINT: float_digest.hexdigest()}
        if INT8_FINGERPRINT in keys:
            digests[INT8_FINGERPRINT] = int8_digest.hexdigest()
        return {key: digests[key] for key in keys}

    def slot_rows(self, ids: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
        """(the variable the optimizer trains, its rows for ``ids``, which ids have one)."""
        return self.variable, ids, np.ones(len(ids), dtype=bool)

    def capacity_problem(self, ids: np.ndarray) -> str | None:
        """None: every row of a float table can be written."""
        del ids
        return None

    def write(self, ids: np.ndarray, values: np.ndarray) -> None:
        """``table[ids] = values``, in place."""
        assign_host_rows(self.table, ids, values)

    def written_slot_rows(self, ids: np.ndarray) -> tuple[Any, np.ndarray]:
        """(the variable the optimizer trains, the rows of it whose slots a
        load of rows ``ids`` writes)."""
        return self.variable, ids

    def saved_state(self, ids: np.ndarray) -> Callable[[], None]:
        """What :meth:`write` of rows ``ids`` changes, kept: call the result to put it back."""
        kept = self.read(ids)
        return lambda: self.write(ids, kept)


class _LookedUpRows:
    """A store layer's rows as its lookups return them, sliced in row blocks
    (the array-like a :class:`FloatTable` fingerprints)."""

    def __init__(self, table: QuantizedTable) -> None:
        self.table = table
        self.shape = table.shape
        self.dtype = table.dtype

    def __getitem__(self, rows: slice) -> np.ndarray:
        return self.table.read(np.arange(self.shape[0])[rows])


class QuantizedTable:
    """A layer with a float store beside a frozen table: int8 rows and scales
    (quantized), or a float table (``frozen_rows_on="host"``, ``quantized``
    False: fingerprinted as a float table, from the rows as looked up)."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.shape = (int(layer.input_dim), int(layer.output_dim))
        self.dtype = _numpy_dtype(layer.float_rows.dtype)
        self.variable = layer.float_rows
        self.quantized = _quantized.is_int8(layer)

    def _store_rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(store row of each id, the sentinel where it has none; whether it has one)."""
        have, index = _quantized.rows_with_float(self.layer)
        position = np.minimum(np.searchsorted(have, ids), max(len(have) - 1, 0))
        has = np.zeros(len(ids), dtype=bool)
        if len(have):
            has = have[position] == ids
        rows = np.full(len(ids), _quantized.store_capacity(self.layer), np.int64)
        rows[has] = index[position[has]]
        return rows, has

    def read(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` as lookups return them: float store rows, else dequantized."""
        store_rows, has = self._store_rows(ids)
        values = np.empty((len(ids), self.shape[1]), self.dtype)
        values[has] = read_host_rows(self.layer.float_rows, store_rows[has], "float_rows")
        values[~has] = _quantized.dequantized_rows(self.layer, ids[~has])
        return values

    def metadata(self, saved_ids: np.ndarray) -> dict[str, str]:
        """What a file says of the table's other rows (those not in ``saved_ids``)."""
        if not self.quantized:
            return self.fingerprints(saved_ids, FINGERPRINTS)
        return {QUANTIZATION: "int8", **self.fingerprints(saved_ids, [INT8_FINGERPRINT])}

    def fingerprints(self, excluded_ids: np.ndarray, keys: Iterable[str]) -> dict[str, str]:
        """The int8 fingerprint (when ``keys`` names it): a quantized table has
        no other; a float frozen table's are a float table's."""
        if not self.quantized:
            return FloatTable(_LookedUpRows(self)).fingerprints(excluded_ids, keys)
        if INT8_FINGERPRINT not in keys:
            return {}
        kept = _kept(self.shape[0], excluded_ids)
        digest = _Int8Digest(self.dtype)
        codes = resolve_variable(self.layer.embeddings, "embeddings")
        scales = np.asarray(self.layer.embeddings_scale.numpy())
        for start, stop in row_blocks(self.shape[0], 4 * self.shape[1]):
            block = np.asarray(codes.value()[start:stop].numpy())
            digest.update(block[kept[start:stop]], scales[start:stop][kept[start:stop]])
        return {INT8_FINGERPRINT: digest.hexdigest()}

    def slot_rows(self, ids: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
        """The float store, the store rows of ``ids`` (the sentinel where
        none: it never learns, so its slots hold their initial values) and
        which ids have one."""
        store_rows, has = self._store_rows(ids)
        return self.layer.float_rows, store_rows, has

    def capacity_problem(self, ids: np.ndarray) -> str | None:
        """Why rows ``ids`` cannot all get store rows; None when they can."""
        have, _ = _quantized.rows_with_float(self.layer)
        missing = int(np.count_nonzero(~np.isin(ids, have)))
        free = _quantized.store_capacity(self.layer) - len(have)
        if missing <= free:
            return None
        return (
            f"{missing} of its rows have no float row in quantized layer "
            f"{self.layer.name!r}, which has {free} free (trainable_capacity="
            f"{_quantized.store_capacity(self.layer)}); quantize with a larger "
            "trainable_capacity"
        )

    def write(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Writes rows ``ids`` into the store (checked by :meth:`capacity_problem`)."""
        _, has = self._store_rows(ids)
        _quantized.overwrite_float_rows(self.layer, ids[has], values[has])
        _quantized.add_float_rows(self.layer, ids[~has], values[~has])
        # New store rows learn as the table's mask says (it is unchanged).
        _quantized.sync_store_mask(self.layer, np.asarray(self.layer.trainable_mask.numpy()))

    def written_slot_rows(self, ids: np.ndarray) -> tuple[Any, np.ndarray]:
        """(the float store, the store rows whose slots a load of rows ``ids``
        writes: those ids have, and the free ones :meth:`write` gives the others)."""
        store_rows, has = self._store_rows(ids)
        used = len(_quantized.rows_with_float(self.layer)[0])
        new_rows = np.arange(used, used + int(np.count_nonzero(~has)), dtype=np.int64)
        return self.layer.float_rows, np.concatenate([store_rows[has], new_rows])

    def saved_state(self, ids: np.ndarray) -> Callable[[], None]:
        """The store (small: the rows that train), kept whole: :meth:`write`
        moves its bookkeeping too. Call the result to put it back."""
        del ids
        kept = {name: getattr(self.layer, name).numpy() for name in _quantized.STORE_VARIABLES}

        def restore() -> None:
            for name, value in kept.items():
                getattr(self.layer, name).assign(value)
            _quantized.sync_store_mask(self.layer, np.asarray(self.layer.trainable_mask.numpy()))

        return restore


def saved_compact_slots(optimizer: Any) -> Callable[[], None]:
    """The optimizer's compact slots, kept whole (they hold the rows that
    train: small beside the table): a load gives rows slot rows, which only
    this takes back. Call the result to put them back."""
    kept = [(variable, variable.numpy()) for variable in optimizer.compact_slot_variables]

    def restore() -> None:
        for variable, value in kept:
            variable.assign(value)

    return restore


def saved_load_state(
    table: FloatTable | QuantizedTable, ids: np.ndarray, optimizer: Any
) -> Callable[[], None]:
    """What loading rows ``ids`` into ``table`` (and ``optimizer``'s slots)
    changes, kept: call the result to put it back."""
    restore_table = table.saved_state(ids)
    if optimizer is None:
        return restore_table
    variable, slot_rows = table.written_slot_rows(ids)
    present = optimizer.slot_rows_present(variable, slot_rows)
    slots = {
        name: optimizer.slot_rows(variable, name, slot_rows) for name in optimizer.slot_names()
    }

    def restore() -> None:
        for name, values in slots.items():
            optimizer.assign_slot_rows(variable, name, slot_rows, values, present)
        restore_table()

    return restore


def fingerprints_problem(metadata: Mapping[str, str], prefix: str) -> str | None:
    """What is wrong with a file's fingerprints of a table; None when nothing.

    Rows from a float table carry the float fingerprint (and, unless written
    before int8 tables, the int8 one); rows from a quantized table (its
    ``quantization`` is ``"int8"``) the int8 one only. Each is 64 lowercase
    hex digits.
    """
    mode = metadata.get(prefix + QUANTIZATION)
    if mode not in (None, "int8"):
        return f"{prefix}{QUANTIZATION} is {mode[:40]!r}, not 'int8'"
    required = prefix + (INT8_FINGERPRINT if mode else FLOAT_FINGERPRINT)
    if required not in metadata:
        return f"{required!r} is missing"
    for key in (prefix + key for key in FINGERPRINTS):
        if key in metadata and not _SHA256.fullmatch(metadata[key]):
            return f"{key} is not 64 lowercase hex digits"
    return None


def fingerprint_mismatch(
    table: FloatTable | QuantizedTable, ids: np.ndarray, metadata: Mapping[str, str], prefix: str
) -> str | None:
    """Why ``table``'s rows other than ``ids`` are not those the file's were
    trained with; None when they are.

    A quantized table checks the int8 fingerprint; a float one the float
    fingerprint, or the int8 one when the file (from a quantized table) has
    no other.
    """
    keys = [key for key in FINGERPRINTS if prefix + key in metadata]
    if table.quantized:
        if INT8_FINGERPRINT not in keys:
            return (
                f"the file has no int8 fingerprint of the other rows ({prefix}"
                f"{INT8_FINGERPRINT}; written by an older version?), which a quantized "
                "table is checked against"
            )
        keys = [INT8_FINGERPRINT]
    key = keys[0]
    if table.fingerprints(ids, [key])[key] == metadata[prefix + key]:
        return None
    kind = "int8 bytes and scales" if key == INT8_FINGERPRINT else "values"
    return (
        "this table's other rows differ from those of the table the rows were trained on "
        f"(another pretrained table?; compared by their {kind})"
    )


def merge_quantized(
    table: Any, ids: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, scales) of ``table`` with rows ``ids`` replaced by ``values``.

    Quantized a block of rows at a time, as Keras quantizes a table: only
    the int8 result and one float block are ever held.
    """
    num_rows, width = int(table.shape[0]), int(np.prod(table.shape[1:]))
    dtype = values.dtype
    codes = np.empty((num_rows, width), np.int8)
    scales = np.empty(num_rows, dtype)
    for start, stop in row_blocks(num_rows, width * dtype.itemsize):
        block = np.array(table[start:stop], dtype=dtype).reshape(stop - start, width)
        inside = (ids >= start) & (ids < stop)
        block[ids[inside] - start] = values[inside].reshape(-1, width)
        codes[start:stop], scales[start:stop] = quantize(block)
    return codes.reshape(table.shape), scales


def main_table(layer: Any) -> FloatTable | QuantizedTable:
    """The view of ``layer.embeddings``: quantized when ``layer`` is, or a
    float store beside a frozen table (``frozen_rows_on="host"``)."""
    if getattr(layer, "frozen_rows_on", None) == "host":
        return QuantizedTable(layer)
    if getattr(layer, "quantization_mode", None) is None:
        return FloatTable(layer.embeddings)
    if getattr(layer, "float_rows", None) is None:
        raise PartialEmbeddingArgumentError(
            f"layer: {type(layer).__name__} is quantized "
            f"({layer.quantization_mode}) without a float store (float_rows); only "
            "quantized partial_embedding layers have one"
        )
    return QuantizedTable(layer)
