"""A strict safetensors codec: parse and check the header first, then read only what it declares.

The format: an 8-byte little-endian header size, a JSON object (tensor name ->
``{"dtype", "shape", "data_offsets"}``, plus an optional ``"__metadata__"``
object of strings), then the tensors' bytes, back to back. Files may come from
anywhere, so reading never trusts a number before checking it: the header size
against the file size and :data:`MAX_HEADER_BYTES`, the JSON's nesting depth
and number of values before it is parsed, every integer for its type and range
(no floats, booleans, ``Infinity`` or 5,000-digit numbers), every tensor's
bytes against its dtype and shape, the tensors tiling the data exactly. Only
then are tensors read, one at a time, by seeking to them. Every problem raises
:class:`SafetensorsError` naming the file.

Writing goes through a fresh temporary file in the target's directory
(``tempfile.mkstemp``: never an existing path or a planted symlink), flushed
and ``fsync``-ed, then ``os.replace``-d onto the target, and removed on any
failure: readers see the old file or the new one, never a part.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import struct
import tempfile
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from partial_embedding.errors import PartialEmbeddingArgumentError

#: safetensors' dtype names, as its specification spells them.
DTYPES: dict[str, np.dtype] = {
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
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
#: Our headers are a few kilobytes; user metadata may add some. The reference
#: implementation allows 100 MB, which Python's JSON parser turns into tens of
#: millions of objects.
MAX_HEADER_BYTES = 1 << 20
#: At most this many JSON values in a header (commas and colons outside strings).
MAX_HEADER_VALUES = 1 << 16
#: A header is an object of objects of arrays.
MAX_HEADER_DEPTH = 3
_INT64_LIMIT = 2**63
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}


class SafetensorsError(PartialEmbeddingArgumentError):
    """A file that is not well-formed safetensors."""


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header declares it (checked against the file)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclasses.dataclass(frozen=True)
class Header:
    """A checked header: the tensors, the metadata and where the data starts."""

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int


class _Refused(ValueError):
    """A JSON value our parser refuses (raised inside ``json.loads`` hooks)."""


def _refuse_constant(text: str) -> Any:
    raise _Refused(f"{text} is not a number this format allows")


def _strict_int(text: str) -> int:
    # 20 characters: any int64 and its sign; longer is refused before int().
    if len(text) > 20:
        raise _Refused(f"an integer of {len(text)} digits")
    return int(text)


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise _Refused(f"the key {name!r} repeats")
        result[name] = value
    return result


def _outside_strings(text: bytes) -> np.ndarray:
    """The bytes of ``text`` outside JSON strings (exact for valid JSON), in linear time."""
    data = np.frombuffer(text, dtype=np.uint8)
    # int32: a header is at most MAX_HEADER_BYTES long.
    positions = np.arange(data.size, dtype=np.int32)
    last_other = np.maximum.accumulate(np.where(data == ord("\\"), np.int32(-1), positions))
    quotes = np.flatnonzero(data == ord('"'))
    # A quote is escaped when an odd number of backslashes precede it.
    preceding = quotes[quotes > 0] - 1
    escaped = np.zeros(quotes.size, dtype=bool)
    escaped[quotes > 0] = (preceding - last_other[preceding]) % 2 == 1
    quotes = quotes[~escaped]
    del positions, last_other
    # Between an opening quote and its closing one (both included).
    toggles = np.zeros(data.size + 1, dtype=np.int8)
    toggles[quotes] = 1
    inside = (np.cumsum(toggles[:-1], dtype=np.int32) % 2 == 1) | (toggles[:-1] == 1)
    return data[~inside]


def parse_json(text: bytes, max_depth: int, where: str, what: str) -> Any:
    """``json.loads`` with nesting, size and number checks made before parsing.

    Args:
      text: UTF-8 JSON.
      max_depth: The deepest nesting of arrays and objects allowed.
      where: The file, for messages.
      what: What the text is (``"the header"``, ``"metadata 'width'"``).

    Raises:
      SafetensorsError: Not UTF-8, not JSON, nested deeper than ``max_depth``,
        more than :data:`MAX_HEADER_VALUES` values, a repeated key, NaN or
        Infinity, or an integer of more than 20 characters.
    """
    structure = _outside_strings(text)
    opening = (structure == ord("[")) | (structure == ord("{"))
    closing = (structure == ord("]")) | (structure == ord("}"))
    depth = np.cumsum(opening.astype(np.int64) - closing.astype(np.int64))
    if depth.size and int(depth.max()) > max_depth:
        raise SafetensorsError(f"{where}: {what} is nested deeper than {max_depth} levels")
    separators = int(np.count_nonzero((structure == ord(",")) | (structure == ord(":"))))
    if separators > MAX_HEADER_VALUES:
        raise SafetensorsError(f"{where}: {what} holds more than {MAX_HEADER_VALUES} values")
    try:
        return json.loads(
            text.decode("utf-8"),
            parse_int=_strict_int,
            parse_constant=_refuse_constant,
            object_pairs_hook=_unique_object,
        )
    except UnicodeDecodeError:
        raise SafetensorsError(f"{where}: {what} is not UTF-8") from None
    except json.JSONDecodeError as error:
        raise SafetensorsError(f"{where}: {what} is not JSON ({error})") from None
    except (_Refused, ValueError, RecursionError) as error:
        raise SafetensorsError(f"{where}: {what}: {error}") from None


def check_int(value: Any, where: str, what: str, limit: int = _INT64_LIMIT) -> int:
    """``value`` if it is a JSON integer in ``[0, limit)``; no bool, float or string."""
    if type(value) is not int or not 0 <= value < limit:
        raise SafetensorsError(f"{where}: {what} is {value!r}, not an integer in [0, {limit})")
    return value


def metadata_json(metadata: Mapping[str, str], key: str, where: str) -> Any:
    """The JSON in the metadata string ``metadata[key]``: numbers and strings, one level deep."""
    text = metadata[key].encode("utf-8", "surrogatepass")
    return parse_json(text, 1, where, f"metadata {key!r}")


def require_finite(values: np.ndarray, ids: np.ndarray, where: str, what: str) -> None:
    """Refuses NaN or Inf in ``values`` (one row per id), naming the first row's id."""
    if values.dtype.kind in "biu":
        return
    # One flag per row, whatever the row's shape (empty rows, or no rows, are finite).
    finite = np.isfinite(values).all(axis=tuple(range(1, values.ndim)))
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise SafetensorsError(
            f"{where}: {what} of row id {int(ids[row])} holds NaN or Inf; trained-rows "
            "files refuse them (they would spread NaN through training)"
        )


def _entry(name: str, entry: Any, data_size: int, where: str) -> TensorEntry:
    what = f"tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise SafetensorsError(f"{where}: {what} must be an object with {sorted(_ENTRY_KEYS)}")
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise SafetensorsError(
            f"{where}: {what}: dtype {entry['dtype']!r} is not one of {sorted(DTYPES)}"
        )
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
        raise SafetensorsError(f"{where}: {what}: shape or data_offsets is not a list of integers")
    dimensions = tuple(check_int(n, where, f"{what}: a dimension") for n in shape)
    begin, end = (check_int(n, where, f"{what}: an offset") for n in offsets)
    nbytes = dtype.itemsize
    for dimension in dimensions:
        nbytes *= dimension  # Python integers: no overflow
    if not begin <= end <= data_size:
        raise SafetensorsError(
            f"{where}: {what}: data_offsets [{begin}, {end}] do not fit the {data_size} data bytes"
        )
    if end - begin != nbytes:
        raise SafetensorsError(
            f"{where}: {what}: {end - begin} bytes for shape {list(dimensions)} of "
            f"{entry['dtype']} ({nbytes} expected)"
        )
    return TensorEntry(dtype, dimensions, begin, end)


def _check_tiling(tensors: dict[str, TensorEntry], data_size: int, where: str) -> None:
    """The tensors cover the data exactly, in some order, without gaps or overlaps."""
    position = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != position:
            raise SafetensorsError(
                f"{where}: tensor {name!r} starts at byte {entry.begin}, not {position} "
                "(tensors overlap or leave a gap)"
            )
        position = entry.end
    if position != data_size:
        raise SafetensorsError(f"{where}: {data_size - position} bytes after the last tensor")


def read_header(stream: io.BufferedIOBase, where: str) -> Header:
    """Reads and checks the header of the safetensors file open as ``stream``.

    Reads the header's bytes only (after checking their count against the
    file's size and :data:`MAX_HEADER_BYTES`), never the tensors.
    """
    file_size = os.fstat(stream.fileno()).st_size
    prefix = stream.read(8)
    if len(prefix) < 8:
        raise SafetensorsError(f"{where}: not a safetensors file ({file_size} bytes)")
    (header_size,) = struct.unpack("<Q", prefix)
    if not 2 <= header_size <= min(file_size - 8, MAX_HEADER_BYTES):
        raise SafetensorsError(
            f"{where}: header size {header_size} does not fit the file ({file_size} bytes; "
            f"at most {MAX_HEADER_BYTES} header bytes are read)"
        )
    text = stream.read(header_size)
    if len(text) != header_size or not text.startswith(b"{"):
        raise SafetensorsError(f"{where}: the header is not a JSON object")
    header = parse_json(text, MAX_HEADER_DEPTH, where, "the header")
    if not isinstance(header, dict):
        raise SafetensorsError(f"{where}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(value, str) for value in metadata.values()
    ):
        raise SafetensorsError(f"{where}: __metadata__ must map strings to strings")
    data_size = file_size - 8 - header_size
    tensors = {name: _entry(name, entry, data_size, where) for name, entry in header.items()}
    _check_tiling(tensors, data_size, where)
    return Header(tensors, metadata, 8 + header_size)


def read_tensor(stream: io.BufferedIOBase, header: Header, name: str, where: str) -> np.ndarray:
    """The tensor ``name`` (a writable array of its own), read from ``stream``."""
    entry = header.tensors[name]
    buffer = bytearray(entry.end - entry.begin)
    stream.seek(header.data_start + entry.begin)
    if stream.readinto(buffer) != len(buffer):
        raise SafetensorsError(f"{where}: tensor {name!r}: the file ended early (truncated?)")
    array = np.frombuffer(buffer, dtype=entry.dtype.newbyteorder("<")).reshape(entry.shape)
    return array.astype(entry.dtype, copy=False)


def _little_endian(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it makes a scalar 1-D.
    array = np.asarray(array, order="C")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


def little_endian_bytes(array: np.ndarray) -> bytes:
    """``array``'s values as little-endian bytes in C order."""
    return _little_endian(array).tobytes()


def _encode(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> list[bytes]:
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    payloads = []
    offset = 0
    for name in sorted(tensors):
        array = _little_endian(tensors[name])
        dtype_name = _DTYPE_NAMES.get(array.dtype.newbyteorder("="))
        if dtype_name is None:
            raise SafetensorsError(f"tensor {name!r}: dtype {array.dtype} has no safetensors name")
        header[name] = {
            "dtype": dtype_name,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        payloads.append(array.tobytes())
        offset += array.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Padded with spaces so that the data starts 8-byte aligned, as the
    # reference writer does.
    encoded += b" " * (-len(encoded) % 8)
    return [struct.pack("<Q", len(encoded)), encoded, *payloads]


def _new_file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file (mkstemp makes 0o600)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def path_text(path: Any) -> str:
    """``path`` (``str``, ``bytes`` or ``os.PathLike``) as text, for messages."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise PartialEmbeddingArgumentError(
            f"path: expected a str, bytes or os.PathLike, got {type(path).__name__}"
        ) from None


def write_file(path: Any, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    """Writes a safetensors file at ``path`` atomically (see the module's docstring).

    Args:
      path: ``str``, ``bytes`` or ``os.PathLike``; an existing file is replaced.
      tensors: Name -> array, of dtypes in :data:`DTYPES`.
      metadata: ``str -> str``.

    Raises:
      SafetensorsError: ``path`` is a directory, or a dtype has no safetensors name.
      OSError: The directory cannot be written (nothing is left behind).
    """
    target = path_text(path)
    if os.path.isdir(target):
        raise SafetensorsError(f"path: {target!r} is a directory, not a file name")
    chunks = _encode(tensors, metadata)
    directory, name = os.path.split(target)
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{name}.", suffix=".tmp", dir=directory or os.curdir
    )
    try:
        with os.fdopen(descriptor, "wb") as stream:
            for chunk in chunks:
                stream.write(chunk)
            stream.flush()
            os.fchmod(stream.fileno(), _new_file_mode())
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
