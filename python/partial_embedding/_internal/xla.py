"""The XLA path: the library's row updates and lookups with static shapes.

Inside a function compiled with XLA (``jit_compile=True``, which Keras uses
by default on a GPU) the custom kernels cannot run and no shape may depend
on the data. Everything here is built from stock TensorFlow ops that XLA
compiles, and keeps the kernel path's semantics:

* A write to a variable is one stock ``ResourceScatterSub`` whose rows that
  may not be written are numbered ``-1`` (:func:`write_targets`): XLA's
  scatter skips an update whose index is out of bounds (the semantics JAX's
  ``mode="drop"`` rests on), so frozen rows and their slots are never
  touched and keep their exact bits, and the skipped updates cost next to
  nothing (no pass zeroing their amounts). Duplicates accumulate. XLA
  updates the variable's buffer in place: nothing table-sized is copied per
  step.
* Ids outside ``[0, V)`` cannot raise at run time under XLA. They are
  never written (their amount is zeroed and their row number replaced by a
  valid one), and a lookup returns a row of zeros for them, as TensorFlow's
  GPU gather does.
* Deduplication gives each distinct id one slot of ``[N]`` and sums its
  values there: ``[N]`` in, ``[N]`` out, padding rows numbered ``V`` (out of
  range, so never written) where no id landed. With an *owner map* (an int64
  ``[V + 1]`` scratch variable) it needs no sort: every occurrence writes its
  position at its row, and reads back the position that stayed, the same for
  all occurrences of a row; the occurrence whose position stayed owns the
  row, and only the other occurrences (few) are added to it by a scatter
  whose other updates are skipped. Without one it sorts the ids (XLA's CPU
  sort is the slowest part of the step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = [
    "gradient_rows",
    "in_range",
    "owner_segment_sum",
    "scatter_sub_at",
    "scatter_sub_where",
    "sorted_segment_sum",
    "update_at",
    "valid_rows",
    "where_rows",
    "write_targets",
]

#: The row number of an update XLA's scatter skips (out of bounds).
SKIPPED_ROW = -1


def in_range(ids: tf.Tensor, num_rows: Any) -> tf.Tensor:
    """Bool: each id is in ``[0, num_rows)``."""
    num_rows = tf.cast(num_rows, ids.dtype)
    return tf.logical_and(ids >= 0, ids < num_rows)


def valid_rows(
    ids: tf.Tensor, num_rows: Any, mask_at: Callable[[tf.Tensor], tf.Tensor]
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """What every XLA path needs to know of its ids, with static shapes.

    Args:
      ids: Row ids ``[N]``, any of them possibly outside ``[0, num_rows)``.
      num_rows: ``V``.
      mask_at: Gathers the row mask at row ids.

    Returns:
      ``(rows, valid, permitted)``: ``ids`` with row 0 (a row every non-empty
      table has) in place of each id outside ``[0, V)``, so that they can be
      gathered from and scattered to; whether each id is in ``[0, V)``; and
      whether it is also permitted by the mask.
    """
    valid = in_range(ids, num_rows)
    rows = tf.where(valid, ids, tf.zeros([], ids.dtype))
    return rows, valid, tf.logical_and(valid, mask_at(rows))


def where_rows(condition: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """``values`` (``[N, ...]``) where ``condition`` (``[N]``), else ``+0``."""
    shape = tf.concat([tf.shape(condition), tf.ones([values.shape.rank - 1], tf.int32)], 0)
    return tf.where(tf.reshape(condition, shape), values, tf.zeros([], values.dtype))


def gradient_rows(rows: tf.Tensor, trains: tf.Tensor, num_rows: Any) -> tf.Tensor:
    """``rows`` where ``trains``, else ``num_rows`` (row V, past the last
    one): the indices of a gradient taken under XLA whose other entries train
    no row. XLA's scatters and ``MaskedOptimizer``'s XLA step skip row V, so
    no row takes a step with a zero gradient from them; outside XLA an index
    V is refused like any other bad one."""
    return tf.where(trains, rows, tf.cast(num_rows, rows.dtype))


def write_targets(rows: tf.Tensor, write: tf.Tensor) -> tf.Tensor:
    """``rows`` where ``write``, else :data:`SKIPPED_ROW`: the indices of a
    scatter that writes only the rows in ``write`` (see
    :func:`scatter_sub_at`)."""
    return tf.where(write, rows, tf.constant(SKIPPED_ROW, rows.dtype))


def scatter_sub_at(variable: tf.Variable, targets: tf.Tensor, amount: tf.Tensor) -> tf.Operation:
    """``variable[targets[i]] -= amount[i]`` for every ``targets[i] >= 0``,
    under XLA; rows numbered :data:`SKIPPED_ROW` (:func:`write_targets`) are
    skipped (XLA's scatter skips out-of-bounds updates), so every other row
    keeps its bits."""
    return tf.raw_ops.ResourceScatterSub(
        resource=variable.handle, indices=targets, updates=tf.cast(amount, variable.dtype)
    )


def update_at(variable: tf.Variable, targets: tf.Tensor, values: tf.Tensor) -> tf.Operation:
    """``variable[targets[i]] = values[i]`` for every ``targets[i] >= 0``,
    under XLA (rows numbered :data:`SKIPPED_ROW` are skipped); with
    duplicate targets one of their values stays."""
    return tf.raw_ops.ResourceScatterUpdate(
        resource=variable.handle, indices=targets, updates=tf.cast(values, variable.dtype)
    )


def scatter_sub_where(
    variable: tf.Variable, rows: tf.Tensor, amount: tf.Tensor, write: tf.Tensor
) -> tf.Operation:
    """``variable[rows[i]] -= amount[i]`` where ``write[i]``, under XLA; the
    other rows are never touched. ``rows`` must be valid where ``write``."""
    return scatter_sub_at(variable, write_targets(rows, write), amount)


def sorted_segment_sum(
    ids: tf.Tensor, values: tf.Tensor, num_rows: Any
) -> tuple[tf.Tensor, tf.Tensor]:
    """Deduplicates a sparse gradient with static shapes.

    Args:
      ids: ``[N]`` row ids, duplicates allowed (out-of-range ones are
        dropped: they become padding).
      values: ``[N, ...]``.
      num_rows: ``V``.

    Returns:
      ``(rows, summed)``: ``rows`` ``[N]`` holds each distinct valid id once,
      ascending, followed by padding rows numbered ``V``; ``summed[j]`` is the
      sum of the values of ``rows[j]`` (zero for padding).
    """
    count = tf.shape(ids)[0]
    num_rows = tf.cast(num_rows, ids.dtype)
    valid = in_range(ids, num_rows)
    # Out-of-range ids sort last as V and are summed into padding.
    keys = tf.where(valid, ids, num_rows)
    order = tf.argsort(keys, stable=True)
    sorted_keys = tf.gather(keys, order)
    starts = tf.concat([tf.ones([1], tf.bool), tf.not_equal(sorted_keys[1:], sorted_keys[:-1])], 0)
    segments = tf.cumsum(tf.cast(starts, tf.int32)) - 1
    summed = tf.math.unsorted_segment_sum(tf.gather(values, order), segments, count)
    # Each segment's key; segments past the last one keep V.
    rows = tf.tensor_scatter_nd_update(
        tf.fill([count], num_rows), tf.expand_dims(segments, 1), sorted_keys
    )
    keep = rows < num_rows
    return rows, where_rows(keep, summed)


def owner_segment_sum(
    ids: tf.Tensor, values: tf.Tensor, num_rows: Any, owner_map: tf.Variable
) -> tuple[tf.Tensor, tf.Tensor]:
    """:func:`sorted_segment_sum` without a sort, through ``owner_map``.

    Args:
      ids: ``[N]`` row ids, duplicates allowed (out-of-range ones are
        dropped: they become padding).
      values: ``[N, ...]``.
      num_rows: ``V``.
      owner_map: An int64 ``[V + 1]`` scratch variable (its values before the
        call do not matter; entry ``V`` collects the out-of-range ids). int64,
        not int32: TensorFlow keeps int32 variables in host memory on a GPU,
        where an XLA step cannot reach them.

    Returns:
      ``(rows, summed)``: ``rows`` ``[N]`` holds each distinct valid id once
      (at the position of one of its occurrences, in no particular order)
      and padding rows numbered ``V`` elsewhere; ``summed[j]`` is the sum of
      the values of ``rows[j]`` (zero for padding).
    """
    count = tf.shape(ids)[0]
    num_rows = tf.cast(num_rows, ids.dtype)
    valid = in_range(ids, num_rows)
    keys = tf.where(valid, ids, num_rows)
    positions = tf.range(count, dtype=owner_map.dtype)
    # Duplicates write different positions; whichever stays, every
    # occurrence of the row reads the same one back: it owns the row.
    tf.raw_ops.ResourceScatterUpdate(resource=owner_map.handle, indices=keys, updates=positions)
    owners = tf.raw_ops.ResourceGather(
        resource=owner_map.handle, indices=keys, dtype=owner_map.dtype
    )
    owns = tf.logical_and(tf.equal(owners, positions), valid)
    # The owner keeps its values; the other occurrences of a valid row (few)
    # are added to it, every other update of the scatter is skipped.
    others = write_targets(owners, tf.logical_and(valid, tf.logical_not(owns)))
    summed = tf.tensor_scatter_nd_add(where_rows(owns, values), tf.expand_dims(others, 1), values)
    return tf.where(owns, keys, num_rows), summed
