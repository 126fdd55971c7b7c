"""Variables behind the ops' arguments, and how distributed ones split.

``resolve_variable`` finds the resource ``tf.Variable`` behind a TensorFlow or
Keras 3 variable; ``gather_rows`` reads rows of one without switching it into
copy-on-read mode. The private helpers take apart what tf.distribute builds:
a ``MirroredVariable``'s per-device components and a ``ShardedVariable``'s
shards (contiguous row ranges), with the row mask and the ids of each.
Keras variables are recognised by duck typing; nothing here imports Keras.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.checks import row_mask_tensor
from partial_embedding._internal.framework_private import sharded_variable
from partial_embedding.errors import PartialEmbeddingTypeError

__all__ = [
    "components",
    "gather_rows",
    "has_current_component",
    "assign_host_rows",
    "ids_per_shard",
    "is_distributed",
    "masks_per_component",
    "masks_per_shard",
    "on_each_device",
    "read_host_rows",
    "resolve_variable",
    "shard_row_starts",
    "sharded_variable",
]

_Result = TypeVar("_Result")


def resolve_variable(ref: Any, argument: str = "ref") -> tf.Variable:
    """Returns the resource-backed ``tf.Variable`` behind ``ref``.

    Accepts a ``tf.Variable`` (resource variable) or a Keras 3 variable on the
    TensorFlow backend, whose ``tf.Variable`` this returns.

    Args:
      ref: The variable.
      argument: The argument's name, for the error message.

    Returns:
      The ``tf.Variable``: ``ref`` itself, or the one a Keras variable keeps.

    Raises:
      PartialEmbeddingTypeError: ``ref`` is not such a variable.

    >>> import tensorflow as tf
    >>> table = tf.Variable([[1.0], [2.0]])
    >>> resolve_variable(table) is table
    True
    """
    candidate = ref
    # A Keras 3 variable keeps its tf.Variable in `_value` (`.value` may be an
    # autocast tensor inside a mixed-precision scope).
    inner = getattr(ref, "_value", None)
    if isinstance(inner, tf.Variable):
        candidate = inner
    if isinstance(candidate, tf.Variable) and is_distributed(candidate):
        # Its handle is the current replica's component, and only exists in a
        # replica context or a strategy's update() call.
        return candidate
    if isinstance(candidate, tf.Variable) and hasattr(candidate, "handle"):
        try:
            handle = candidate.handle
        except (AttributeError, ValueError, TypeError):
            handle = None
        if handle is not None and handle.dtype == tf.resource:
            return candidate
    raise PartialEmbeddingTypeError(
        f"{argument}: expected a resource tf.Variable or a Keras variable, got {type(ref).__name__}"
    )


def gather_rows(variable: Any, rows: Any) -> tf.Tensor:
    """Rows of a variable, without switching it into copy-on-read mode.

    ``tf.Variable.sparse_read`` (``ResourceGather``) puts a variable into
    copy-on-read mode for good: from then on every full read (saving,
    ``get_weights``, passing the whole mask to a kernel) copies the whole
    buffer, which costs 40 ms (up to ~0.85 s on slower 2-core VMs) per read
    of a 1M x 128 float32 table on this project's machines instead of ~1 ms.
    A ``ReadVariableOp`` that aliases the buffer followed by ``GatherV2`` reads
    only the rows and leaves the variable alone; the in-place kernel copies
    only if that alias is still held when it writes.

    Args:
      variable: A ``tf.Variable`` or Keras 3 variable.
      rows: Row numbers, any shape.

    Returns:
      ``tf.gather(variable, rows)``.

    Rows of one-byte integers (an int8 table) are gathered as wider floats
    of the same bits where the row's bytes allow (a reshape and two bitcasts,
    no copy): TensorFlow has no GPU ``GatherV2`` kernel for int8, and would
    otherwise run the gather on the host, copying the whole table there at
    every read. Rows of an odd number of bytes on a GPU are gathered by the
    variable's own ``ResourceGather`` instead. The result is the same.

    >>> import tensorflow as tf
    >>> table = tf.Variable([[1.0], [2.0], [3.0]])
    >>> gather_rows(table, [2, 0]).numpy().tolist()
    [[3.0], [1.0]]
    """
    resolved = resolve_variable(variable, argument="variable")
    value = resolved.value()
    carrier = _byte_row_carrier(value)
    if carrier is None:
        if value.dtype in _BYTE_DTYPES and "GPU" in (resolved.device or "").upper():
            # Rows of an odd number of bytes on a GPU: TensorFlow's GPU
            # ResourceGather takes int8, at the price of copy-on-read mode
            # (a full read of the table then copies it, on the device).
            return tf.raw_ops.ResourceGather(
                resource=resolved.handle, indices=rows, dtype=value.dtype
            )
        return tf.gather(value, rows)
    dtype, width = carrier
    rows = tf.convert_to_tensor(rows)
    row_shape = value.shape[1:].as_list()
    bytes_per_row = int(np.prod(row_shape))
    packed = tf.bitcast(tf.reshape(value, [-1, bytes_per_row // width, width]), dtype)
    gathered = tf.bitcast(tf.gather(packed, rows), value.dtype)
    return tf.reshape(gathered, tf.concat([tf.shape(rows), row_shape], 0))


#: One-byte dtypes whose rows :func:`gather_rows` moves as wider floats.
_BYTE_DTYPES = (tf.int8, tf.uint8)


def _byte_row_carrier(value: tf.Tensor) -> tuple[tf.DType, int] | None:
    """``(dtype, bytes)`` of the float that carries a one-byte table's rows
    in :func:`gather_rows` (float32 where a row's bytes split into fours,
    float16 into twos), or None for other tables."""
    if value.dtype not in _BYTE_DTYPES or value.shape.rank is None or value.shape.rank < 2:
        return None
    row_shape = value.shape[1:]
    if not row_shape.is_fully_defined():
        return None
    bytes_per_row = row_shape.num_elements()
    if bytes_per_row and bytes_per_row % 4 == 0:
        return tf.float32, 4
    if bytes_per_row and bytes_per_row % 2 == 0:
        return tf.float16, 2
    return None


def is_distributed(variable: Any) -> bool:
    """A tf.distribute variable with one component per device (MirroredVariable...)."""
    return isinstance(variable, tf.distribute.DistributedValues)


def components(variable: Any) -> tuple:
    """The per-device components of a distributed variable."""
    return framework_private.sharded_components(variable)


def has_current_component(variable: Any) -> bool:
    """Whether the current context picks one component (replica or update())."""
    try:
        _ = variable.handle
    except ValueError:
        return False
    return True


def shard_row_starts(shards: Any) -> list[int]:
    """First global row of each shard, then the number of rows: shards hold
    contiguous row ranges."""
    starts = [0]
    for shard in shards:
        starts.append(starts[-1] + int(shard.shape[0]))
    return starts


def _unwrap(value: Any) -> Any:
    """The tf.Variable or ShardedVariable a Keras variable keeps, else ``value``."""
    inner = getattr(value, "_value", None)
    return inner if isinstance(inner, tf.Variable) or sharded_variable(inner) else value


def masks_per_shard(row_mask: Any, starts: list[int]) -> list[Any]:
    """The row mask of each shard: a shard of a mask sharded alike, else a slice."""
    mask = _unwrap(row_mask)
    sharded = sharded_variable(mask)
    if sharded is not None:
        if shard_row_starts(sharded.variables) == starts:
            return list(sharded.variables)
        mask = tf.concat([tf.convert_to_tensor(v) for v in sharded.variables], 0)
    if isinstance(mask, tf.Variable):
        mask = mask.read_value()
    mask = row_mask_tensor(mask)
    return [mask[start:end] for start, end in zip(starts[:-1], starts[1:])]


def masks_per_component(row_mask: Any, count: int) -> list[Any]:
    """The row mask of each of ``count`` components: a component of a mask
    distributed alike, else the whole mask."""
    mask = _unwrap(row_mask)
    if is_distributed(mask) and len(components(mask)) == count:
        return list(components(mask))
    return [row_mask] * count


def ids_per_shard(
    flat_ids: tf.Tensor, starts: list[int]
) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """Which positions of ``flat_ids`` each shard owns, and their local ids.

    Args:
      flat_ids: Global row ids, rank 1, each in ``[0, starts[-1])``.
      starts: ``shard_row_starts`` of the shards.

    Returns:
      ``(positions, local_ids)``: for each shard, the int32 positions in
      ``flat_ids`` of its ids (in order) and those ids less the shard's start.
    """
    owner = tf.searchsorted(
        tf.constant(starts[1:-1], dtype=flat_ids.dtype),
        flat_ids,
        side="right",
        out_type=tf.int32,
    )
    positions = tf.dynamic_partition(
        tf.range(tf.size(flat_ids, out_type=tf.int32)), owner, len(starts) - 1
    )
    local_ids = [
        tf.gather(flat_ids, shard_positions) - tf.cast(start, flat_ids.dtype)
        for shard_positions, start in zip(positions, starts)
    ]
    return positions, local_ids


def on_each_device(
    parts: Sequence[tf.Variable],
    build: Callable[..., _Result],
    *per_part: Sequence[Any],
) -> list[_Result]:
    """``build(part, *args)`` for each part (shard or component), on its device.

    ``per_part`` holds sequences with one entry per part, passed in order.
    """
    results = []
    for part, *args in zip(parts, *per_part):
        with tf.device(part.device):
            results.append(build(part, *args))
    return results


def read_host_rows(variable: Any, ids: Any, argument: str = "variable") -> np.ndarray:
    """``variable[ids]`` as a NumPy array (the rows only), for host-side I/O."""
    target = resolve_variable(variable, argument)
    return np.asarray(gather_rows(target, tf.constant(ids, tf.int64)).numpy())


def assign_host_rows(variable: Any, ids: Any, values: Any, argument: str = "variable") -> None:
    """``variable[ids] = values`` in place, from host data (the rows only,
    not a copy of the table)."""
    if len(ids) == 0:
        return
    target = resolve_variable(variable, argument)
    tf.raw_ops.ResourceScatterUpdate(
        resource=target.handle,
        indices=tf.constant(ids, tf.int64),
        updates=tf.constant(values, dtype=target.dtype),
    )
    # The scatter op switches the variable into copy-on-read mode (every later
    # read would copy it whole); nothing else holds the buffer now.
    tf.raw_ops.DisableCopyOnRead(resource=target.handle)
