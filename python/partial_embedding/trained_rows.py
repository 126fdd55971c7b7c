"""Trained rows out and back in: only the rows that learned, in a safetensors file.

A vocabulary extension trains a few hundred rows of a table of many thousands;
shipping it should not mean shipping the table. :func:`save_trained_rows`
writes the trained rows of a :class:`~partial_embedding.PartialEmbedding`
(their ids and values and, optionally, their optimizer slots) to a
`safetensors <https://huggingface.co/docs/safetensors>`_ file;
:func:`load_trained_rows` writes them back into a layer built on the same
pretrained table (in place, checked before the first write);
:func:`merge_trained_rows` returns a plain table with the rows replaced, for
serving with ``keras.layers.Embedding``; :func:`read_trained_rows` reads the
file alone.

The file (written and read here, without the ``safetensors`` package) holds:

* ``ids``: int64 ``[N]``, the rows saved (sorted, no repeats);
* ``rows``: ``[N, D]`` of the table's dtype, their values;
* with ``optimizer=``: ``slot.<name>`` (``[N, D]``, one per slot of the
  optimizer's row rule, e.g. ``slot.momentum`` and ``slot.velocity`` for Adam),
  ``slot_present`` (bool ``[N]``: whether the row had optimizer state; a row
  that never trained with compact slots has none, and its ``slot.*`` rows hold
  the slot's initial value) and ``iterations`` (int64 ``[]``, the optimizer's
  step count, which Adam's bias correction reads);
* for a layer with its own output table (``reverse_embeddings`` and
  ``reverse_trainable_mask``), the same under the prefix ``reverse.``;
* metadata: the table's rows, width and dtype, the library version, and a
  SHA-256 of the table's other rows (every row not saved, in row order, as
  little-endian bytes). Loading onto a table whose other rows differ (another
  pretrained table) is refused unless ``check=False``.

Loading leaves ``trainable_mask`` as it is: which rows train next is the
caller's choice (``layer.set_trainable_ids(rows.ids)`` keeps training them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import types
from collections.abc import Mapping
from typing import Any

import keras
import ml_dtypes
import numpy as np
import tensorflow as tf

from partial_embedding._version import __version__
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.ops import gather_rows, resolve_variable

__all__ = [
    "TrainedRows",
    "TrainedRowsError",
    "load_trained_rows",
    "merge_trained_rows",
    "read_trained_rows",
    "save_trained_rows",
]

_FORMAT = "partial_embedding.trained_rows"
_FORMAT_VERSION = "1"
_REVERSE = "reverse."
#: safetensors' dtype names, as its specification spells them.
_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16),
    "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
#: Rows hashed per block: the table is never copied whole.
_HASH_BLOCK_BYTES = 64 << 20
_MAX_HEADER_BYTES = 100 << 20


class TrainedRowsError(PartialEmbeddingArgumentError):
    """A trained-rows file is malformed, or does not fit the table it is loaded onto."""


@dataclasses.dataclass
class TrainedRows:
    """The rows of one table as a trained-rows file holds them.

    Attributes:
      ids: int64 ``[N]``, the row ids (sorted, no repeats).
      values: ``[N, D]``, their values, in the table's dtype.
      slots: Slot name -> ``[N, D]`` optimizer state of those rows (empty
        when saved without an optimizer).
      slot_present: bool ``[N]``: which rows had optimizer state (None when
        saved without an optimizer).
      iterations: The optimizer's step count when saved (None without one).
      metadata: The file's metadata (str -> str).
      reverse: The output table's rows, for a layer with untied output
        embeddings; None otherwise.

    >>> import tempfile, os, numpy as np
    >>> import partial_embedding as pe
    >>> layer = pe.PartialEmbedding(5, 2, weights=np.ones((5, 2), "float32"), trainable_ids=[3, 4])
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.safetensors")
    >>> rows = pe.save_trained_rows(path, layer, metadata={"vocabulary": "v2"})
    >>> rows.ids.tolist(), rows.values.shape, rows.metadata["num_rows"], rows.metadata["vocabulary"]
    ([3, 4], (2, 2), '5', 'v2')
    """

    ids: np.ndarray
    values: np.ndarray
    slots: dict[str, np.ndarray]
    slot_present: np.ndarray | None
    iterations: int | None
    metadata: dict[str, str]
    reverse: TrainedRows | None = None


# -- the safetensors format --------------------------------------------------------


def _little_endian(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it makes a scalar 1-D.
    array = np.asarray(array, order="C")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


def _write_safetensors(path: Any, tensors: Mapping[str, np.ndarray], metadata: dict) -> None:
    header: dict[str, Any] = {"__metadata__": metadata}
    payloads = []
    offset = 0
    for name in sorted(tensors):
        array = _little_endian(tensors[name])
        dtype_name = _DTYPE_NAMES.get(array.dtype.newbyteorder("="))
        if dtype_name is None:
            raise TrainedRowsError(f"tensor {name!r}: dtype {array.dtype} has no safetensors name")
        size = array.nbytes
        header[name] = {
            "dtype": dtype_name,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + size],
        }
        payloads.append(array)
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Padded with spaces so that the data starts 8-byte aligned, as the
    # reference writer does.
    encoded += b" " * (-len(encoded) % 8)
    temporary = f"{os.fspath(path)}.partial"
    with open(temporary, "wb") as stream:
        stream.write(struct.pack("<Q", len(encoded)))
        stream.write(encoded)
        for array in payloads:
            stream.write(array.tobytes())
    os.replace(temporary, path)


def _read_safetensors(path: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with open(path, "rb") as stream:
        data = stream.read()
    where = f"{os.fspath(path)}"
    if len(data) < 8:
        raise TrainedRowsError(f"{where}: not a safetensors file ({len(data)} bytes)")
    (header_size,) = struct.unpack("<Q", data[:8])
    if header_size > min(len(data) - 8, _MAX_HEADER_BYTES):
        raise TrainedRowsError(f"{where}: header size {header_size} does not fit the file")
    try:
        header = json.loads(data[8 : 8 + header_size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TrainedRowsError(f"{where}: the header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise TrainedRowsError(f"{where}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise TrainedRowsError(f"{where}: __metadata__ must map strings to strings")
    buffer = memoryview(data)[8 + header_size :]
    tensors: dict[str, np.ndarray] = {}
    spans = []
    for name, entry in header.items():
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = tuple(int(n) for n in entry["shape"])
            begin, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise TrainedRowsError(f"{where}: tensor {name!r}: bad entry {entry!r}") from None
        expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= len(buffer):
            raise TrainedRowsError(f"{where}: tensor {name!r}: bad shape or offsets {entry!r}")
        if end - begin != expected:
            raise TrainedRowsError(
                f"{where}: tensor {name!r}: {end - begin} bytes for shape {list(shape)} "
                f"of {entry['dtype']} ({expected} expected)"
            )
        spans.append((begin, end, name))
        tensors[name] = (
            np.frombuffer(buffer[begin:end], dtype=dtype.newbyteorder("<")).reshape(shape).copy()
        )
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise TrainedRowsError(f"{where}: tensor {name!r} does not follow the previous one")
        position = end
    if position != len(buffer):
        raise TrainedRowsError(f"{where}: {len(buffer) - position} bytes after the last tensor")
    return tensors, metadata


# -- reading and writing variables ---------------------------------------------------


def _variable_dtype(variable: Any) -> np.dtype:
    return np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype)


def _read_rows(variable: Any, ids: np.ndarray) -> np.ndarray:
    target = resolve_variable(variable, "variable")
    return np.asarray(gather_rows(target, tf.constant(ids, tf.int64)).numpy())


def _write_rows(variable: Any, ids: np.ndarray, values: np.ndarray) -> None:
    """``variable[ids] = values`` in place (the rows only, not a copy of the table)."""
    if len(ids) == 0:
        return
    target = resolve_variable(variable, "variable")
    tf.raw_ops.ResourceScatterUpdate(
        resource=target.handle,
        indices=tf.constant(ids, tf.int64),
        updates=tf.constant(values, dtype=target.dtype),
    )
    # The scatter op switches the variable into copy-on-read mode (every later
    # read would copy it whole); nothing else holds the buffer now.
    tf.raw_ops.DisableCopyOnRead(resource=target.handle)


def _table_fingerprint(table: Any, excluded_ids: np.ndarray) -> str:
    """SHA-256 of every row of ``table`` not in ``excluded_ids``, in row order.

    ``table``: a variable or an array-like of rows; read a block at a time.
    """
    is_variable = isinstance(table, (tf.Variable, keras.Variable))
    if is_variable:
        table = resolve_variable(table, "embeddings")
    num_rows = int(table.shape[0])
    excluded = np.zeros(num_rows, dtype=bool)
    excluded[excluded_ids] = True
    row_bytes = max(int(np.prod(table.shape[1:])) * _variable_dtype(table).itemsize, 1)
    block = max(_HASH_BLOCK_BYTES // row_bytes, 1)
    digest = hashlib.sha256()
    for start in range(0, num_rows, block):
        stop = min(start + block, num_rows)
        if is_variable:
            rows = table.value()[start:stop].numpy()
        else:
            rows = np.asarray(table[start:stop])
        digest.update(_little_endian(rows[~excluded[start:stop]]).tobytes())
    return digest.hexdigest()


# -- the layer's tables and the optimizer's slots ----------------------------------------


def _tables(layer: Any) -> list[tuple[str, Any, Any]]:
    """``(prefix, table, mask)`` for each masked table of ``layer``."""
    for attribute in ("embeddings", "trainable_mask"):
        if getattr(layer, attribute, None) is None:
            raise PartialEmbeddingArgumentError(
                f"layer: {type(layer).__name__} has no {attribute} (is it built?)"
            )
    tables = [("", layer.embeddings, layer.trainable_mask)]
    reverse = getattr(layer, "reverse_embeddings", None)
    reverse_mask = getattr(layer, "reverse_trainable_mask", None)
    # Tied weights: one table, saved once.
    if reverse is not None and reverse_mask is not None and reverse is not layer.embeddings:
        tables.append((_REVERSE, reverse, reverse_mask))
    return tables


def _slot_specs(optimizer: Any) -> tuple[Any, ...]:
    """The optimizer's slots (each with a ``name``), once it is known to be a
    built MaskedOptimizer."""
    from partial_embedding.optimizers import MaskedOptimizer

    if not isinstance(optimizer, MaskedOptimizer):
        raise PartialEmbeddingArgumentError(
            "optimizer: expected a partial_embedding.MaskedOptimizer, got "
            f"{type(optimizer).__name__}"
        )
    if not optimizer.built:
        raise PartialEmbeddingArgumentError(
            "optimizer: not built yet; call optimizer.build(model.trainable_variables) first"
        )
    return tuple(types.SimpleNamespace(name=name) for name in optimizer.slot_names())


def _read_slots(
    optimizer: Any, variable: Any, ids: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    specs = _slot_specs(optimizer)
    present = optimizer.slot_rows_present(variable, ids)
    slots = {spec.name: optimizer.slot_rows(variable, spec.name, ids) for spec in specs}
    return slots, present


def _write_slots(optimizer: Any, variable: Any, rows: TrainedRows) -> None:
    # Rows the file has no state for but that have a slot row here go back to
    # the initial value, as the file says.
    present = np.asarray(rows.slot_present, dtype=bool)
    for spec in _slot_specs(optimizer):
        optimizer.assign_slot_rows(variable, spec.name, rows.ids, rows.slots[spec.name], present)


# -- the public functions ---------------------------------------------------------------


def _as_ids(ids: Any, num_rows: int, where: str) -> np.ndarray:
    array = np.asarray(ids)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise TrainedRowsError(
            f"{where}: expected a 1-D integer array, got {array.dtype} {array.shape}"
        )
    array = array.astype(np.int64)
    bad = np.flatnonzero((array < 0) | (array >= num_rows))
    if bad.size:
        raise TrainedRowsError(f"{where}[{bad[0]}] = {array[bad[0]]} is not in [0, {num_rows})")
    if np.unique(array).size != array.size:
        raise TrainedRowsError(f"{where}: ids repeat")
    return array


def save_trained_rows(
    path: Any,
    layer: Any,
    *,
    optimizer: Any = None,
    ids: Any = None,
    metadata: Mapping[str, str] | None = None,
) -> TrainedRows:
    """Writes the trained rows of ``layer`` (and their optimizer slots) to ``path``.

    Args:
      path: Where to write the safetensors file (replaced atomically).
      layer: A built :class:`~partial_embedding.PartialEmbedding` (or any
        layer with ``embeddings`` and ``trainable_mask``; with
        ``reverse_embeddings`` and ``reverse_trainable_mask`` too, those rows
        are saved under ``reverse.``).
      optimizer: A built :class:`~partial_embedding.MaskedOptimizer`: also
        save the rows' optimizer slots (compact or full-size) and its step
        count.
      ids: The rows to save; default: the rows ``trainable_mask`` permits now.
      metadata: Extra ``str -> str`` metadata for the file.

    Returns:
      The :class:`TrainedRows` written.

    >>> import tempfile, os, numpy as np
    >>> import partial_embedding as pe
    >>> layer = pe.PartialEmbedding(6, 2, weights=np.zeros((6, 2), "float32"), trainable_ids=[4, 5])
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.safetensors")
    >>> pe.save_trained_rows(path, layer).ids.tolist()
    [4, 5]
    """
    if metadata is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in dict(metadata).items()
    ):
        raise PartialEmbeddingArgumentError("metadata: must map strings to strings")
    tensors: dict[str, np.ndarray] = {}
    file_metadata: dict[str, str] = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "library_version": __version__,
    }
    parts: list[TrainedRows] = []
    iterations = None if optimizer is None else int(np.asarray(optimizer.iterations))
    for prefix, table, mask in _tables(layer):
        num_rows = int(table.shape[0])
        if prefix or ids is None:
            chosen = np.flatnonzero(np.asarray(mask.numpy(), dtype=bool)).astype(np.int64)
        else:
            chosen = np.sort(_as_ids(ids, num_rows, "ids"))
        values = _read_rows(table, chosen)
        tensors[f"{prefix}ids"] = chosen
        tensors[f"{prefix}rows"] = values
        slots: dict[str, np.ndarray] = {}
        present = None
        if optimizer is not None:
            slots, present = _read_slots(optimizer, table, chosen)
            for name, slot_values in slots.items():
                tensors[f"{prefix}slot.{name}"] = slot_values
            tensors[f"{prefix}slot_present"] = present
        file_metadata.update(
            {
                f"{prefix}num_rows": str(num_rows),
                f"{prefix}width": json.dumps(list(table.shape[1:])),
                f"{prefix}dtype": tf.as_dtype(table.dtype).name,
                f"{prefix}other_rows_sha256": _table_fingerprint(table, chosen),
            }
        )
        parts.append(TrainedRows(chosen, values, slots, present, iterations, {}))
    if optimizer is not None:
        tensors["iterations"] = np.asarray(iterations, dtype=np.int64)
        file_metadata["slot_names"] = json.dumps(list(parts[0].slots))
        file_metadata["optimizer"] = type(optimizer.base_optimizer).__name__
    for key, value in dict(metadata or {}).items():
        if key in file_metadata:
            raise PartialEmbeddingArgumentError(f"metadata: {key!r} is a reserved key")
        file_metadata[key] = value
    _write_safetensors(path, tensors, file_metadata)
    result = parts[0]
    result.metadata = file_metadata
    if len(parts) > 1:
        result.reverse = dataclasses.replace(parts[1], metadata=file_metadata)
    return result


def read_trained_rows(path: Any) -> TrainedRows:
    """Reads a file written by :func:`save_trained_rows`, checking its layout.

    >>> import tempfile, os, numpy as np
    >>> import partial_embedding as pe
    >>> layer = pe.PartialEmbedding(6, 2, weights=np.ones((6, 2), "float32"), trainable_ids=[5])
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.safetensors")
    >>> _ = pe.save_trained_rows(path, layer, metadata={"note": "new words"})
    >>> rows = pe.read_trained_rows(path)
    >>> rows.ids.tolist(), rows.values.tolist(), rows.metadata["note"]
    ([5], [[1.0, 1.0]], 'new words')
    """
    tensors, metadata = _read_safetensors(path)
    where = os.fspath(path)
    if metadata.get("format") != _FORMAT:
        raise TrainedRowsError(f"{where}: not a trained-rows file (metadata format is missing)")
    if metadata.get("format_version") != _FORMAT_VERSION:
        raise TrainedRowsError(
            f"{where}: format version {metadata.get('format_version')!r}; this library reads "
            f"{_FORMAT_VERSION!r}"
        )
    iterations = tensors.get("iterations")
    if iterations is not None and (iterations.shape != () or iterations.dtype != np.int64):
        raise TrainedRowsError(f"{where}: iterations must be an int64 scalar")
    slot_names = json.loads(metadata.get("slot_names", "[]"))
    parts = []
    for prefix in ("", _REVERSE):
        if f"{prefix}ids" not in tensors:
            continue
        try:
            num_rows = int(metadata[f"{prefix}num_rows"])
            width = tuple(json.loads(metadata[f"{prefix}width"]))
            dtype = np.dtype(tf.as_dtype(metadata[f"{prefix}dtype"]).as_numpy_dtype)
        except (KeyError, TypeError, ValueError) as error:
            raise TrainedRowsError(f"{where}: bad metadata for {prefix}rows ({error})") from None
        ids = tensors[f"{prefix}ids"]
        if ids.dtype != np.int64:
            raise TrainedRowsError(f"{where}: {prefix}ids is {ids.dtype}, not int64")
        ids = _as_ids(ids, num_rows, f"{where}: {prefix}ids")
        shape = (len(ids), *width)
        values = tensors[f"{prefix}rows"] if f"{prefix}rows" in tensors else None
        if values is None or values.shape != shape or values.dtype != dtype:
            raise TrainedRowsError(
                f"{where}: {prefix}rows must be {dtype.name} {list(shape)}, got "
                f"{None if values is None else (values.dtype.name, list(values.shape))}"
            )
        slots = {}
        present = None
        if slot_names:
            present = tensors.get(f"{prefix}slot_present")
            if present is None or present.shape != (len(ids),) or present.dtype != np.bool_:
                raise TrainedRowsError(f"{where}: {prefix}slot_present must be bool [{len(ids)}]")
            for name in slot_names:
                slot = tensors.get(f"{prefix}slot.{name}")
                if slot is None or slot.shape != shape or slot.dtype != dtype:
                    raise TrainedRowsError(
                        f"{where}: {prefix}slot.{name} must be {dtype.name} {list(shape)}"
                    )
                slots[name] = slot
        parts.append(
            TrainedRows(
                ids,
                values,
                slots,
                present,
                None if iterations is None else int(iterations),
                metadata,
            )
        )
    if not parts or f"{_REVERSE}ids" in tensors and len(parts) == 1:
        raise TrainedRowsError(f"{where}: no ids tensor")
    result = parts[0]
    result.reverse = parts[1] if len(parts) > 1 else None
    return result


def _check_fits(rows: TrainedRows, table: Any, prefix: str, where: str, check: bool) -> None:
    metadata = rows.metadata
    shape = tuple(int(n) for n in table.shape)
    saved = (int(metadata[f"{prefix}num_rows"]), *json.loads(metadata[f"{prefix}width"]))
    if shape != saved:
        raise TrainedRowsError(
            f"{where}: rows of a {list(saved)} table; this table is {list(shape)}"
        )
    dtype = _variable_dtype(table)
    if rows.values.dtype != dtype:
        raise TrainedRowsError(
            f"{where}: rows of a {rows.values.dtype.name} table; this table is {dtype.name}"
        )
    if check and _table_fingerprint(table, rows.ids) != metadata[f"{prefix}other_rows_sha256"]:
        raise TrainedRowsError(
            f"{where}: this table's other rows differ from those of the table the rows were "
            "trained on (another pretrained table?); pass check=False to load anyway"
        )


def load_trained_rows(
    path: Any, layer: Any, *, optimizer: Any = None, check: bool = True
) -> TrainedRows:
    """Writes the rows of a trained-rows file into ``layer``'s table, in place.

    Everything is checked before the first write: the table's shape and
    dtype, the ids, and (``check=True``) that the table's other rows are
    those the rows were trained with. ``trainable_mask`` is left as it is.

    Args:
      path: A file written by :func:`save_trained_rows`.
      layer: The layer to write into (as for :func:`save_trained_rows`).
      optimizer: A built :class:`~partial_embedding.MaskedOptimizer`: also
        restore the rows' slots and its step count (``iterations``). The
        file must have been saved with an optimizer of the same kind.
      check: Refuse a table whose other rows differ from the saved ones.

    Returns:
      The :class:`TrainedRows` written.

    >>> import tempfile, os, numpy as np
    >>> import partial_embedding as pe
    >>> table = np.zeros((6, 2), "float32")
    >>> trained = pe.PartialEmbedding(6, 2, weights=table, trainable_ids=[5])
    >>> # Rows 0-4 change too: not the table the file's rows fit.
    >>> _ = trained.embeddings.assign(np.full((6, 2), 7.0, "float32"))
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.safetensors")
    >>> _ = pe.save_trained_rows(path, trained)
    >>> fresh = pe.PartialEmbedding(6, 2, weights=table, trainable_ids=[5])
    >>> pe.load_trained_rows(path, fresh)
    Traceback (most recent call last):
    ...
    partial_embedding.trained_rows.TrainedRowsError: ...other rows differ...
    >>> _ = pe.load_trained_rows(path, fresh, check=False)
    >>> fresh.embeddings.numpy()[4:].tolist()
    [[0.0, 0.0], [7.0, 7.0]]
    """
    rows = read_trained_rows(path)
    where = os.fspath(path)
    tables = _tables(layer)
    parts = [rows] if rows.reverse is None else [rows, rows.reverse]
    if len(parts) != len(tables):
        raise TrainedRowsError(
            f"{where}: holds {len(parts)} table(s) of rows; the layer has {len(tables)}"
        )
    if optimizer is not None:
        specs = _slot_specs(optimizer)
        names = [spec.name for spec in specs]
        if list(rows.slots) != names:
            raise TrainedRowsError(
                f"{where}: holds optimizer slots {list(rows.slots)}; the optimizer has {names}"
            )
    for part, (prefix, table, _) in zip(parts, tables):
        _check_fits(part, table, prefix, where, check)
    for part, (_, table, _) in zip(parts, tables):
        _write_rows(table, part.ids, part.values)
        if optimizer is not None:
            _write_slots(optimizer, table, part)
    if optimizer is not None and rows.iterations is not None:
        optimizer.iterations.assign(rows.iterations)
    return rows


def merge_trained_rows(
    table: Any, path: Any, *, reverse: bool = False, check: bool = True
) -> np.ndarray:
    """A copy of ``table`` with the rows of a trained-rows file in place.

    For serving with a plain ``keras.layers.Embedding``; ``table`` (a NumPy
    array or memmap) is not modified.

    Args:
      table: The pretrained ``[V, D]`` table the rows were trained on.
      path: A file written by :func:`save_trained_rows`.
      reverse: Merge the output table's rows (``reverse.``) instead.
      check: Refuse a table whose other rows differ from the saved ones.

    >>> import tempfile, os, numpy as np
    >>> import partial_embedding as pe
    >>> table = np.zeros((4, 2), "float32")
    >>> layer = pe.PartialEmbedding(4, 2, weights=table, trainable_ids=[3])
    >>> _ = layer.embeddings.assign(table + [[0, 0], [0, 0], [0, 0], [1, 2]])
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.safetensors")
    >>> _ = pe.save_trained_rows(path, layer)
    >>> pe.merge_trained_rows(table, path)[3].tolist(), table[3].tolist()
    ([1.0, 2.0], [0.0, 0.0])
    """
    rows = read_trained_rows(path)
    where = os.fspath(path)
    prefix = ""
    if reverse:
        if rows.reverse is None:
            raise TrainedRowsError(f"{where}: holds no output-table (reverse.) rows")
        rows, prefix = rows.reverse, _REVERSE
    _check_fits(rows, table, prefix, where, check)
    merged = np.array(table, copy=True)
    merged[rows.ids] = rows.values
    return merged
