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
* with ``optimizer=``: ``slot.<name>`` (``[N, D]``, or ``[N]`` for a per-row slot, one per
  slot of the optimizer's row rule, e.g. ``slot.momentum`` and ``slot.velocity`` for Adam),
  ``slot_present`` (bool ``[N]``: whether the row had optimizer state; a row
  that never trained with compact slots has none, and its ``slot.*`` rows hold
  the slot's initial value) and ``iterations`` (int64 ``[]``, the optimizer's
  step count, which Adam's bias correction reads);
* for a layer with its own output table (``reverse_embeddings`` and
  ``reverse_trainable_mask``), the same under the prefix ``reverse.``;
* metadata: the table's rows, width and dtype, the library version, and
  fingerprints of the table's other rows (every row not saved, in row order):
  ``other_rows_sha256``, a SHA-256 of their float bytes (little-endian), and
  ``other_rows_int8_sha256``, one of their int8 bytes and scales as Keras'
  ``AbsMaxQuantizer(axis=-1)`` quantizes them. Loading onto a table whose
  other rows differ (another pretrained table) is refused unless
  ``check=False``.

Quantized layers (``PartialEmbedding.quantize("int8")``) work the same way:
their rows are saved from (and loaded into) the float store, rows without a
store row get one, and their file carries only the int8 fingerprint, which a
float table checks by quantizing its own rows (see
``partial_embedding._trained_rows_tables``). :func:`merge_trained_rows` with
``quantized=True`` returns the int8 rows and scales instead of a float table.

Loading leaves ``trainable_mask`` as it is: which rows train next is the
caller's choice (``layer.set_trainable_ids(rows.ids)`` keeps training them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal, overload

import numpy as np
import tensorflow as tf

from partial_embedding._internal import safetensors as codec
from partial_embedding._internal.checks import checked_row_ids
from partial_embedding._internal.types import KerasLayer, KerasOptimizer, PathLike, RowIds, Table
from partial_embedding._trained_rows_tables import (
    METADATA_KEYS,
    FloatTable,
    QuantizedTable,
    fingerprint_mismatch,
    fingerprints_problem,
    main_table,
    merge_quantized,
    saved_compact_slots,
    saved_load_state,
)
from partial_embedding._version import __version__
from partial_embedding.errors import PartialEmbeddingArgumentError

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
#: The table dtypes a file may name (NumPy names, as ``tf.as_dtype(...).name`` spells them).
_TABLE_DTYPES = {dtype.name: dtype for dtype in codec.DTYPES.values()}
_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,18})")
_TABLE_KEYS = ("num_rows", "width", "dtype")
#: A table of rows, as trained_rows sees it (see _trained_rows_tables).
_Table = FloatTable | QuantizedTable


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


# -- the layer's tables and the optimizer's slots ----------------------------------------


def _tables(layer: Any) -> list[tuple[str, _Table, Any]]:
    """``(prefix, table, mask)`` for each masked table of ``layer``."""
    for attribute in ("embeddings", "trainable_mask"):
        if getattr(layer, attribute, None) is None:
            raise PartialEmbeddingArgumentError(
                f"layer: {type(layer).__name__} has no {attribute} (is it built?)"
            )
    mask = getattr(layer, "_training_mask", layer.trainable_mask)  # Admission: the admitted.
    tables: list[tuple[str, _Table, Any]] = [("", main_table(layer), mask)]
    reverse = getattr(layer, "reverse_embeddings", None)
    reverse_mask = getattr(layer, "reverse_trainable_mask", None)
    # Tied weights: one table, saved once.
    if reverse is not None and reverse_mask is not None and reverse is not layer.embeddings:
        tables.append((_REVERSE, FloatTable(reverse), reverse_mask))
    return tables


def _slot_names_of(optimizer: Any) -> list[str]:
    """The optimizer's slot names, once it is known to be a built MaskedOptimizer."""
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
    return list(optimizer.slot_names())


def _read_slots(
    optimizer: Any, variable: Any, ids: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    names = _slot_names_of(optimizer)
    present = optimizer.slot_rows_present(variable, ids)
    slots = {name: optimizer.slot_rows(variable, name, ids) for name in names}
    return slots, present


def _table_slots(
    optimizer: Any, table: _Table, ids: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The slots of rows ``ids`` of ``table``; a row of a quantized table
    without a store row has no state (it never trained since quantization)."""
    variable, rows, has_row = table.slot_rows(ids)
    slots, present = _read_slots(optimizer, variable, rows)
    return slots, np.logical_and(present, has_row)


def _write_slots(optimizer: Any, table: _Table, rows: TrainedRows) -> None:
    # Rows the file has no state for but that have a slot row here go back to
    # the initial value, as the file says. (Every row has a table row now.)
    variable, slot_rows, _ = table.slot_rows(rows.ids)
    present = np.asarray(rows.slot_present, dtype=bool)
    for name in _slot_names_of(optimizer):
        optimizer.assign_slot_rows(variable, name, slot_rows, rows.slots[name], present)


# -- the public functions ---------------------------------------------------------------


def _as_ids(ids: Any, num_rows: int, where: str) -> np.ndarray:
    array = checked_row_ids(ids, num_rows, where, TrainedRowsError)
    if np.unique(array).size != array.size:
        raise TrainedRowsError(f"{where}: ids repeat")
    return array


def save_trained_rows(
    path: PathLike | bytes,
    layer: KerasLayer,
    *,
    optimizer: KerasOptimizer = None,
    ids: RowIds = None,
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
    codec.path_text(path)  # a bad path fails before any work
    user_metadata = _user_metadata(metadata)
    tensors: dict[str, np.ndarray] = {}
    file_metadata: dict[str, str] = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "library_version": __version__,
    }
    parts: list[TrainedRows] = []
    iterations = None if optimizer is None else int(np.asarray(optimizer.iterations))
    for prefix, table, mask in _tables(layer):
        num_rows = table.shape[0]
        if prefix or ids is None:
            chosen = np.flatnonzero(np.asarray(mask.numpy(), dtype=bool)).astype(np.int64)
        else:
            chosen = np.sort(_as_ids(ids, num_rows, "ids"))
        values = table.read(chosen)
        codec.require_finite(values, chosen, "layer", f"{prefix}embeddings")
        tensors[f"{prefix}ids"] = chosen
        tensors[f"{prefix}rows"] = values
        slots: dict[str, np.ndarray] = {}
        present = None
        if optimizer is not None:
            slots, present = _table_slots(optimizer, table, chosen)
            for name, slot_values in slots.items():
                codec.require_finite(
                    slot_values, chosen, "optimizer", f"slot {name} of {prefix}embeddings"
                )
                tensors[f"{prefix}slot.{name}"] = slot_values
            tensors[f"{prefix}slot_present"] = present
        file_metadata.update(
            {
                f"{prefix}num_rows": str(num_rows),
                f"{prefix}width": json.dumps([int(n) for n in table.shape[1:]]),
                f"{prefix}dtype": tf.as_dtype(table.dtype).name,
            }
        )
        file_metadata.update({prefix + key: value for key, value in table.metadata(chosen).items()})
        parts.append(TrainedRows(chosen, values, slots, present, iterations, {}))
    if optimizer is not None:
        tensors["iterations"] = np.asarray(iterations, dtype=np.int64)
        file_metadata["slot_names"] = json.dumps(list(parts[0].slots))
        file_metadata["optimizer"] = type(optimizer.base_optimizer).__name__
    file_metadata.update(user_metadata)
    with _as_trained_rows_error():
        codec.write_file(path, tensors, file_metadata)
    result = parts[0]
    result.metadata = file_metadata
    if len(parts) > 1:
        result.reverse = dataclasses.replace(parts[1], metadata=file_metadata)
    return result


def _user_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """``metadata`` checked: strings to strings, none of the keys this module writes."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
    ):
        raise PartialEmbeddingArgumentError("metadata: must map strings to strings")
    reserved = {"format", "format_version", "library_version", "slot_names", "optimizer"}
    reserved |= {
        prefix + key for prefix in ("", _REVERSE) for key in (*_TABLE_KEYS, *METADATA_KEYS)
    }
    for key in metadata:
        if key in reserved:
            raise PartialEmbeddingArgumentError(f"metadata: {key!r} is a reserved key")
    return dict(metadata)


@contextlib.contextmanager
def _as_trained_rows_error() -> Iterator[None]:
    """The codec's errors, raised as :class:`TrainedRowsError`."""
    try:
        yield
    except codec.SafetensorsError as error:
        raise TrainedRowsError(str(error)) from None


@dataclasses.dataclass(frozen=True)
class _TableLayout:
    """One table's part of a file, as its header and metadata declare it."""

    prefix: str
    num_rows: int
    width: tuple[int, ...]
    dtype: np.dtype
    count: int


def _table_layout(header: codec.Header, prefix: str, where: str) -> _TableLayout:
    metadata = header.metadata
    missing = [prefix + key for key in _TABLE_KEYS if prefix + key not in metadata]
    num_rows = metadata.get(f"{prefix}num_rows", "")
    if missing or not _DECIMAL.fullmatch(num_rows) or int(num_rows) >= 2**63:
        problem = (
            f"{missing[0]!r} is missing" if missing else f"{prefix}num_rows is {num_rows[:40]!r}"
        )
        raise TrainedRowsError(f"{where}: metadata {problem} (num_rows: a decimal below 2**63)")
    width = codec.metadata_json(metadata, f"{prefix}width", where)
    if not isinstance(width, list):
        raise TrainedRowsError(f"{where}: metadata {prefix}width is not a JSON list of integers")
    dims = tuple(codec.check_int(n, where, f"metadata {prefix}width: a dimension") for n in width)
    dtype = _TABLE_DTYPES.get(metadata[f"{prefix}dtype"])
    if dtype is None:
        raise TrainedRowsError(
            f"{where}: metadata {prefix}dtype is {metadata[f'{prefix}dtype'][:40]!r}, not one "
            f"of {sorted(_TABLE_DTYPES)}"
        )
    fingerprints = fingerprints_problem(metadata, prefix)
    if fingerprints is not None:
        raise TrainedRowsError(f"{where}: metadata {fingerprints}")
    ids = header.tensors[f"{prefix}ids"]
    if ids.dtype != np.int64 or len(ids.shape) != 1:
        raise TrainedRowsError(
            f"{where}: {prefix}ids is {ids.dtype.name} {list(ids.shape)}, not int64 [N]"
        )
    if ids.shape[0] > int(num_rows):
        raise TrainedRowsError(f"{where}: {ids.shape[0]} {prefix}ids for {num_rows} rows")
    return _TableLayout(prefix, int(num_rows), dims, dtype, ids.shape[0])


def _slot_names(metadata: Mapping[str, str], where: str) -> list[str] | None:
    """The saved slot names; None when the file holds no optimizer state."""
    if "slot_names" not in metadata:
        return None
    names = codec.metadata_json(metadata, "slot_names", where)
    if (
        not isinstance(names, list)
        or not all(isinstance(name, str) and name for name in names)
        or len(set(names)) != len(names)
    ):
        raise TrainedRowsError(
            f"{where}: metadata slot_names must be a JSON list of distinct non-empty strings, "
            f"got {metadata['slot_names'][:80]!r}"
        )
    return names


def _expected_tensors(
    tables: list[_TableLayout], slot_names: list[str] | None
) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    expected: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for table in tables:
        prefix, shape = table.prefix, (table.count, *table.width)
        expected[f"{prefix}ids"] = (np.dtype(np.int64), (table.count,))
        expected[f"{prefix}rows"] = (table.dtype, shape)
        if slot_names is not None:
            expected[f"{prefix}slot_present"] = (np.dtype(np.bool_), (table.count,))
            for name in slot_names:
                expected[f"{prefix}slot.{name}"] = (table.dtype, shape)
    if slot_names is not None:
        expected["iterations"] = (np.dtype(np.int64), ())
    return expected


def _file_layout(header: codec.Header, where: str) -> tuple[list[_TableLayout], list[str] | None]:
    """Checks everything the header says before any tensor is read."""
    metadata = header.metadata
    if metadata.get("format") != _FORMAT:
        raise TrainedRowsError(f"{where}: not a trained-rows file (metadata format is missing)")
    if metadata.get("format_version") != _FORMAT_VERSION:
        raise TrainedRowsError(
            f"{where}: format version {metadata.get('format_version', '')[:40]!r}; this library "
            f"reads {_FORMAT_VERSION!r}"
        )
    if "ids" not in header.tensors:
        raise TrainedRowsError(f"{where}: no ids tensor")
    prefixes = ["", _REVERSE] if f"{_REVERSE}ids" in header.tensors else [""]
    tables = [_table_layout(header, prefix, where) for prefix in prefixes]
    slot_names = _slot_names(metadata, where)
    expected = _expected_tensors(tables, slot_names)
    for name, (dtype, shape) in expected.items():
        entry = header.tensors.get(name)
        shapes = [shape, shape[:1]] if name.rpartition("slot.")[1] else [shape]  # or per row
        if entry is None or entry.dtype != dtype or entry.shape not in shapes:
            found = "no such tensor" if entry is None else f"{entry.dtype.name} {list(entry.shape)}"
            wanted = f"{dtype.name} {' or '.join(str(list(s)) for s in shapes)}"
            raise TrainedRowsError(f"{where}: {name} must be {wanted}; the file has {found}")
    unexpected = sorted(set(header.tensors) - set(expected))
    if unexpected:
        raise TrainedRowsError(f"{where}: unexpected tensors {unexpected[:5]}")
    return tables, slot_names


def _read_part(
    stream: Any,
    header: codec.Header,
    table: _TableLayout,
    slot_names: list[str] | None,
    where: str,
) -> TrainedRows:
    prefix = table.prefix

    def read(name: str) -> np.ndarray:
        return codec.read_tensor(stream, header, prefix + name, where)

    ids = _as_ids(read("ids"), table.num_rows, f"{where}: {prefix}ids")
    if np.any(np.diff(ids) <= 0):
        raise TrainedRowsError(f"{where}: {prefix}ids are not sorted")
    values = read("rows")
    codec.require_finite(values, ids, where, f"{prefix}rows")
    slots: dict[str, np.ndarray] = {}
    present = None
    if slot_names is not None:
        present = read("slot_present")
        if np.any(present.view(np.uint8) > 1):
            raise TrainedRowsError(f"{where}: {prefix}slot_present holds bytes other than 0 and 1")
        for name in slot_names:
            slots[name] = read(f"slot.{name}")
            codec.require_finite(slots[name], ids, where, f"{prefix}slot.{name}")
    return TrainedRows(ids, values, slots, present, None, dict(header.metadata))


def read_trained_rows(path: PathLike | bytes) -> TrainedRows:
    """Reads a file written by :func:`save_trained_rows`, checking everything.

    The header is read and checked first (its size against the file's, its
    JSON, every tensor's dtype, shape and bytes, the metadata); then only the
    tensors it declares are read, and checked (ids in range, sorted and
    distinct; no NaN or Inf in rows or slots; a step count >= 0). Anything
    wrong raises :class:`TrainedRowsError` naming the file.

    >>> import tempfile, os, numpy as np
    >>> import partial_embedding as pe
    >>> layer = pe.PartialEmbedding(6, 2, weights=np.ones((6, 2), "float32"), trainable_ids=[5])
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.safetensors")
    >>> _ = pe.save_trained_rows(path, layer, metadata={"note": "new words"})
    >>> rows = pe.read_trained_rows(path)
    >>> rows.ids.tolist(), rows.values.tolist(), rows.metadata["note"]
    ([5], [[1.0, 1.0]], 'new words')
    """
    where = codec.path_text(path)
    try:
        stream = open(path, "rb")  # closed by the with statement below
    except OSError as error:
        raise TrainedRowsError(f"path: cannot read {where!r}: {error.strerror or error}") from error
    with _as_trained_rows_error(), stream:
        header = codec.read_header(stream, where)
        tables, slot_names = _file_layout(header, where)
        parts = [_read_part(stream, header, table, slot_names, where) for table in tables]
        iterations = None
        if slot_names is not None:
            iterations = int(codec.read_tensor(stream, header, "iterations", where))
            if iterations < 0:
                raise TrainedRowsError(f"{where}: iterations is {iterations}, below 0")
    for part in parts:
        part.iterations = iterations
    result = parts[0]
    result.reverse = parts[1] if len(parts) > 1 else None
    return result


def _check_fits(rows: TrainedRows, table: _Table, prefix: str, where: str, check: bool) -> None:
    metadata = rows.metadata
    shape = table.shape
    # Checked by read_trained_rows.
    saved = (int(metadata[f"{prefix}num_rows"]), *json.loads(metadata[f"{prefix}width"]))
    if shape != saved:
        raise TrainedRowsError(
            f"{where}: rows of a {list(saved)} table; this table is {list(shape)}"
        )
    if rows.values.dtype != table.dtype:
        raise TrainedRowsError(
            f"{where}: rows of a {rows.values.dtype.name} table; this table is "
            f"{table.dtype.name}" + (" (its float rows)" if table.quantized else "")
        )
    problem = table.capacity_problem(rows.ids)
    if problem is not None:
        raise TrainedRowsError(f"{where}: {problem}; nothing was written")
    problem = fingerprint_mismatch(table, rows.ids, rows.metadata, prefix) if check else None
    if problem is not None:
        raise TrainedRowsError(f"{where}: {problem}; pass check=False to load anyway")


def _check_load(
    rows: TrainedRows, layer: Any, optimizer: Any, where: str, check: bool
) -> list[tuple[TrainedRows, _Table]]:
    """Everything :func:`load_trained_rows` checks before its first write."""
    tables = _tables(layer)
    parts = [rows] if rows.reverse is None else [rows, rows.reverse]
    if len(parts) != len(tables):
        raise TrainedRowsError(
            f"{where}: holds {len(parts)} table(s) of rows; the layer has {len(tables)}"
        )
    for part, (prefix, table, _) in zip(parts, tables):
        _check_fits(part, table, prefix, where, check)
    if optimizer is not None:
        names = _slot_names_of(optimizer)
        if list(rows.slots) != names:
            raise TrainedRowsError(
                f"{where}: holds optimizer slots {list(rows.slots)}; the optimizer has {names}"
            )
        if rows.slot_present is None or rows.iterations is None:
            raise TrainedRowsError(f"{where}: holds no optimizer state (saved without optimizer=)")
        for part, (_, table, _) in zip(parts, tables):
            # A read of the same rows' slots: fails here, before anything is
            # written, when the optimizer was not built with this table.
            _table_slots(optimizer, table, part.ids)
    return [(part, table) for part, (_, table, _) in zip(parts, tables)]


def load_trained_rows(
    path: PathLike | bytes,
    layer: KerasLayer,
    *,
    optimizer: KerasOptimizer = None,
    check: bool = True,
) -> TrainedRows:
    """Writes the rows of a trained-rows file into ``layer``'s table, in place.

    Everything is checked before the first write: the table's shape and
    dtype, the ids, and (``check=True``) that the table's other rows are
    those the rows were trained with. ``trainable_mask`` is left as it is.
    A write that fails midway (after the checks) puts back what the load had
    written: the rows, their slots and the step count are as before.
    Into a quantized layer the rows go to its float store: a row without a
    store row gets one (more of them than free store rows: refused), and the
    int8 fingerprint is checked.

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
    checked = _check_load(rows, layer, optimizer, codec.path_text(path), check)
    # Put back in reverse order: the compact slots whole, last.
    restores = [] if optimizer is None else [saved_compact_slots(optimizer)]
    restores += [saved_load_state(table, part.ids, optimizer) for part, table in checked]
    try:
        for part, table in checked:
            table.write(part.ids, part.values)
            if optimizer is not None:
                _write_slots(optimizer, table, part)
        if optimizer is not None and rows.iterations is not None:
            optimizer.iterations.assign(rows.iterations)
    except BaseException:
        # A write failed midway: the rows, their slots and the step count go
        # back to what they were (the step count is written last).
        for restore in reversed(restores):
            restore()
        raise
    return rows


@overload
def merge_trained_rows(
    table: Table,
    path: PathLike,
    *,
    reverse: bool = ...,
    check: bool = ...,
    quantized: Literal[False] = ...,
) -> np.ndarray: ...


@overload
def merge_trained_rows(
    table: Table,
    path: PathLike,
    *,
    reverse: bool = ...,
    check: bool = ...,
    quantized: Literal[True],
) -> tuple[np.ndarray, np.ndarray]: ...


def merge_trained_rows(
    table: Table,
    path: PathLike,
    *,
    reverse: bool = False,
    check: bool = True,
    quantized: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """A copy of ``table`` with the rows of a trained-rows file in place.

    For serving with a plain ``keras.layers.Embedding``; ``table`` (a NumPy
    array or memmap) is not modified. With ``quantized=True`` the merged
    table comes back as Keras' quantized ``Embedding`` holds it, int8 rows
    and per-row scales (``AbsMaxQuantizer(axis=-1)``, the trained rows
    quantized like the others), computed a block of rows at a time: the float
    table is never copied whole.

    Args:
      table: The pretrained float ``[V, D]`` table the rows were trained on
        (also for rows saved from a quantized layer).
      path: A file written by :func:`save_trained_rows`.
      reverse: Merge the output table's rows (``reverse.``) instead.
      check: Refuse a table whose other rows differ from the saved ones.
      quantized: Return ``(int8 [V, D], scales [V])`` instead of a float table.

    Returns:
      The merged float table, or ``(int8 rows, scales)`` (``quantized=True``;
      a quantized ``keras.layers.Embedding``'s ``set_weights`` takes them).

    >>> import tempfile, os, numpy as np
    >>> import partial_embedding as pe
    >>> table = np.zeros((4, 2), "float32")
    >>> layer = pe.PartialEmbedding(4, 2, weights=table, trainable_ids=[3])
    >>> _ = layer.embeddings.assign(table + [[0, 0], [0, 0], [0, 0], [1, 2]])
    >>> path = os.path.join(tempfile.mkdtemp(), "rows.safetensors")
    >>> _ = pe.save_trained_rows(path, layer)
    >>> pe.merge_trained_rows(table, path)[3].tolist(), table[3].tolist()
    ([1.0, 2.0], [0.0, 0.0])
    >>> codes, scales = pe.merge_trained_rows(table, path, quantized=True)
    >>> codes[3].tolist(), codes.dtype.name, scales.shape
    ([64, 127], 'int8', (4,))
    """
    rows = read_trained_rows(path)
    where = codec.path_text(path)
    if not isinstance(quantized, (bool, np.bool_)):
        raise PartialEmbeddingArgumentError(f"quantized: must be a bool, got {quantized!r}")
    if not hasattr(table, "shape"):
        table = np.asarray(table)
    prefix = ""
    if reverse:
        if rows.reverse is None:
            raise TrainedRowsError(f"{where}: holds no output-table (reverse.) rows")
        rows, prefix = rows.reverse, _REVERSE
    _check_fits(rows, FloatTable(table), prefix, where, check)
    if quantized:
        return merge_quantized(table, rows.ids, rows.values)
    merged = np.array(table, copy=True)
    merged[rows.ids] = rows.values
    return merged
