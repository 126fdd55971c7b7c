"""Argument checks shared by the op wrappers.

Dtypes of tables and indices, value conversion, the one check of a row
update's static shapes and the one row-mask conversion every wrapper calls,
and the check of global ids before a sharded table is touched. Every check
raises before anything is written.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)

__all__ = [
    "INDEX_DTYPES",
    "SUPPORTED_DTYPES",
    "RowUpdateArguments",
    "check_dtype_matches",
    "check_row_mask_dtype",
    "check_table_dtype",
    "checked_flat_ids",
    "checked_row_ids",
    "index_tensor",
    "row_mask_tensor",
    "row_update_tensors",
    "shape_text",
    "to_tensor_keeping_dtype",
]

SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
INDEX_DTYPES = (tf.int32, tf.int64)
# TensorFlow's kernels read a tensor's memory only at this alignment (its
# allocator's); a tensor over NumPy memory must start there too.
_TENSOR_ALIGNMENT = 64


@dataclasses.dataclass(frozen=True)
class RowUpdateArguments:
    """How a row-update wrapper names its arguments in its error messages.

    Attributes:
      table: The table argument, e.g. ``"ref"``.
      updates: The rows to apply, e.g. ``"updates"`` or ``"grad"``.
      table_owner: The table as owner of a dtype, e.g. ``"the variable's"``.
      table_in_formula: The table in ``indices.shape + <table>.shape[1:]``.
      check_mask_rank: Whether a mask of another rank than 1 is reported as
        such; if not, it is reported by the length it should have.
    """

    table: str
    updates: str
    table_owner: str
    table_in_formula: str
    check_mask_rank: bool


def shape_text(shape: tf.TensorShape) -> str:
    """Formats a shape the way the kernel's messages do: [3,4], ? if unknown."""
    if shape.rank is None:
        return "<unknown>"
    return "[" + ",".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


def index_tensor(value: Any, argument: str) -> tf.Tensor:
    """Converts row numbers; anything but int32/int64 is refused."""
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype not in INDEX_DTYPES:
        raise PartialEmbeddingTypeError(
            f"{argument}: dtype {tensor.dtype.name} is not an index type; use int32 or int64"
        )
    return tensor


def check_table_dtype(dtype: tf.DType, argument: str) -> None:
    """Refuses tables of a dtype the kernels do not implement."""
    if dtype not in SUPPORTED_DTYPES:
        raise PartialEmbeddingTypeError(
            f"{argument}: dtype {dtype.name} is not supported; use float16, bfloat16, "
            "float32 or float64"
        )


def check_dtype_matches(argument: str, dtype: tf.DType, expected: tf.DType, owner: str) -> None:
    """Refuses ``argument`` unless its dtype is ``expected``, ``owner``'s dtype."""
    if dtype != expected:
        raise PartialEmbeddingTypeError(
            f"{argument}: dtype {dtype.name} does not match {owner} dtype {expected.name}"
        )


def to_tensor_keeping_dtype(value: Any, default_dtype: tf.DType) -> tf.Tensor:
    """Converts `value`; python scalars and lists take `default_dtype`."""
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray, np.generic)) or hasattr(
        value, "dtype"
    ):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value, dtype=default_dtype)


def check_row_mask_dtype(dtype: tf.DType) -> None:
    """Refuses a row mask that is not bool."""
    if dtype != tf.bool:
        raise PartialEmbeddingTypeError(f"row_mask: dtype {dtype.name} must be bool")


def row_mask_tensor(row_mask: Any) -> tf.Tensor:
    """The row mask as a bool tensor: lists become bool, other dtypes are refused.

    A mask held in host memory (a NumPy array, a list) is converted once,
    without a copy made by TensorFlow where that can be avoided:

    * Eagerly, a NumPy bool array is shared with the tensor through DLPack
      (the tensor keeps the array alive): the array itself where it is
      C-contiguous, writeable and 64-byte aligned, else one aligned copy made
      by NumPy, whose memory goes back to the system when the tensor goes.
      A copy made by TensorFlow would be a ``[V]`` allocation from its CPU
      allocator, which with oneDNN (the x86 default) takes every allocation
      of 256 KiB or more from a BFC pool that never returns memory: the
      copy's pages stay resident after the call, and where the pool is full
      (a large table was just created in it) the copy makes it add a region
      about the size of the table, whose bookkeeping (8 bytes per 256 bytes
      of region) stays resident for the life of the process: 16 bytes per
      row of a float32 table of 128 columns.
    * While a ``tf.function`` is traced, the mask is converted outside the
      trace (``tf.init_scope``) and captured as an eager tensor, a snapshot
      of its values at trace time as a constant would be. A constant in the
      graph would be stored in the function's GraphDef and copied into its
      FunctionDef, the runtime's function library and the kernel that holds
      it: about 9 bytes per row per trace, for as long as the function lives.
    """
    if _in_host_memory(row_mask):
        tensor = _host_mask_tensor(row_mask)
    else:
        tensor = to_tensor_keeping_dtype(row_mask, tf.bool)
    check_row_mask_dtype(tensor.dtype)
    return tensor


def _in_host_memory(value: Any) -> bool:
    """Whether ``value`` is a NumPy array or Python data, not a tensor or a
    variable (which TensorFlow already holds)."""
    return isinstance(value, (np.ndarray, np.generic, list, tuple, bool))


def _host_mask_tensor(row_mask: Any) -> tf.Tensor:
    """A host mask as an eager tensor: shared with a NumPy bool array where it
    can be, and made outside any trace (see ``row_mask_tensor``)."""
    if not tf.executing_eagerly():
        # In a tf.compat.v1 graph, init_scope stays in that graph: a constant.
        with tf.init_scope():
            return to_tensor_keeping_dtype(row_mask, tf.bool)
    shared = _shared_bool_tensor(row_mask)
    if shared is not None:
        return shared
    return to_tensor_keeping_dtype(row_mask, tf.bool)


def _shared_bool_tensor(array: Any) -> tf.Tensor | None:
    """A tensor over host memory holding the NumPy bool ``array``: the array's
    own where TensorFlow can use it (C-contiguous, writeable, aligned as its
    kernels require), else one aligned NumPy copy; None for anything else or
    where DLPack refuses."""
    if not (isinstance(array, np.ndarray) and array.dtype == np.bool_ and array.size > 0):
        return None
    if not (
        array.flags.c_contiguous
        and array.flags.writeable
        and array.ctypes.data % _TENSOR_ALIGNMENT == 0
    ):
        array = _aligned_copy(array)
    try:
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    except (BufferError, TypeError, ValueError, tf.errors.InvalidArgumentError):
        return None


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` starting at a multiple of
    ``_TENSOR_ALIGNMENT`` bytes, in memory NumPy allocates (and frees with
    the last reference)."""
    buffer = np.empty(array.nbytes + _TENSOR_ALIGNMENT, dtype=np.uint8)
    start = -buffer.ctypes.data % _TENSOR_ALIGNMENT
    copy = buffer[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def row_update_tensors(
    table: tf.Variable,
    indices: Any,
    updates: Any,
    row_mask: Any,
    arguments: RowUpdateArguments,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Converts and checks the arguments of an update of ``table``'s rows.

    Returns:
      ``(indices, updates, row_mask)`` as tensors: int32 or int64 indices,
      updates of the table's dtype, a bool row mask.

    Raises:
      PartialEmbeddingTypeError: a dtype is wrong.
      PartialEmbeddingArgumentError: a shape already known to be wrong.
    """
    dtype = table.dtype.base_dtype
    indices = index_tensor(indices, "indices")
    updates = to_tensor_keeping_dtype(updates, dtype)
    check_dtype_matches(arguments.updates, updates.dtype, dtype, arguments.table_owner)
    row_mask = row_mask_tensor(row_mask)
    _check_row_update_shapes(table.shape, indices.shape, updates.shape, row_mask.shape, arguments)
    return indices, updates, row_mask


def _check_row_update_shapes(
    table_shape: tf.TensorShape,
    indices_shape: tf.TensorShape,
    updates_shape: tf.TensorShape,
    mask_shape: tf.TensorShape,
    arguments: RowUpdateArguments,
) -> None:
    """Raises for shapes that are already known to be wrong."""
    if table_shape.rank is not None and table_shape.rank < 1:
        raise PartialEmbeddingArgumentError(
            f"{arguments.table}: the variable must have rank >= 1, got shape "
            f"{shape_text(table_shape)}"
        )
    if arguments.check_mask_rank and mask_shape.rank is not None and mask_shape.rank != 1:
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {shape_text(mask_shape)} must be [V] (rank 1)"
        )
    if table_shape.rank is None:
        return
    num_rows = table_shape[0]
    if not mask_shape.is_compatible_with([num_rows]):
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {shape_text(mask_shape)} must be [{num_rows}] (one entry per "
            f"row of the variable of shape {shape_text(table_shape)})"
        )
    if indices_shape.rank is not None:
        expected = indices_shape.concatenate(table_shape[1:])
        if not updates_shape.is_compatible_with(expected):
            raise PartialEmbeddingArgumentError(
                f"{arguments.updates}: shape {shape_text(updates_shape)} must be "
                f"{shape_text(expected)} (indices.shape + {arguments.table_in_formula}"
                f".shape[1:]) for indices of shape {shape_text(indices_shape)} and a "
                f"variable of shape {shape_text(table_shape)}"
            )


def checked_flat_ids(ids: tf.Tensor, num_rows: int, argument: str) -> tf.Tensor:
    """``ids`` flattened, once every id is known to be in ``[0, num_rows)``.

    Checked before any shard of a sharded table is touched: eagerly it raises
    at once, in a graph the result depends on an assertion.

    Raises:
      tf.errors.InvalidArgumentError: an id outside ``[0, num_rows)``, named
        by its position and value.
    """
    flat_ids = tf.reshape(ids, [-1])
    check = _check_global_ids(flat_ids, num_rows, argument)
    with tf.control_dependencies([check] if check is not None else []):
        return tf.identity(flat_ids)


def _check_global_ids(flat_ids: tf.Tensor, num_rows: int, argument: str) -> tf.Operation | None:
    """Every id in [0, num_rows): raises eagerly, else returns an assertion."""
    bad = tf.logical_or(flat_ids < 0, flat_ids >= num_rows)
    first_bad = tf.argmax(tf.cast(bad, tf.int32), output_type=flat_ids.dtype)
    if tf.executing_eagerly():
        if bool(tf.reduce_any(bad)):
            position = int(first_bad)
            raise tf.errors.InvalidArgumentError(
                None,
                None,
                f"{argument}[{position}] = {int(flat_ids[position])} is not in "
                f"[0, {num_rows}); nothing was written",
            )
        return None

    def message() -> tf.Tensor:
        return tf.strings.format(
            argument + "[{}] = {} is not in [0, " + str(num_rows) + "); nothing was written",
            (first_bad, tf.gather(flat_ids, first_bad)),
        )

    return tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(bad)),
        [tf.cond(tf.reduce_any(bad), message, lambda: tf.constant(""))],
    )


def checked_row_ids(
    ids: Any,
    num_rows: int,
    argument: str = "ids",
    error: type[PartialEmbeddingArgumentError] = PartialEmbeddingArgumentError,
) -> np.ndarray:
    """``ids`` (host data: a list or NumPy array) as a 1-D int64 array of rows
    in ``[0, num_rows)``.

    Raises:
      error: not 1-D integers, or an id outside the range (the first named
        with its position and value).
    """
    array = np.asarray(ids)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise error(f"{argument}: expected a 1-D integer array, got {array.dtype} {array.shape}")
    array = array.astype(np.int64)
    bad = np.flatnonzero((array < 0) | (array >= num_rows))
    if bad.size:
        raise error(f"{argument}[{bad[0]}] = {array[bad[0]]} is not in [0, {num_rows})")
    return array
