"""Small state variables written row by row with TensorFlow's scatter ops.

TensorFlow's ``ResourceScatter*`` kernels switch a variable into copy-on-read
mode for good (see ``variables.gather_rows``): a full read of it copies it from
then on. The counters of row admission and a compact slot store's free pool
are written this way (our in-place kernel takes float tables only), so they
are read only here, row by row (``ResourceGather``, which copies nothing),
and never whole inside a step.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal import xla as _xla
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.variables import ids_per_shard, shard_row_starts


def read_rows(variable: Any, rows: tf.Tensor) -> tf.Tensor:
    """``variable[rows]``, a sparse read (of each shard's rows, for a
    ``ShardedVariable``)."""
    sharded = framework_private.sharded_variable(variable)
    if sharded is not None:
        shards = list(sharded.variables)
        positions, local = ids_per_shard(rows, shard_row_starts(shards))
        parts = []
        for shard, shard_rows in zip(shards, local):
            with tf.device(shard.device):
                parts.append(read_rows(shard, shard_rows))
        return tf.dynamic_stitch(positions, parts)
    return tf.raw_ops.ResourceGather(resource=variable.handle, indices=rows, dtype=variable.dtype)


def write_rows_where(
    variable: Any, rows: tf.Tensor, values: tf.Tensor, where: tf.Tensor, add: bool = False
) -> None:
    """``variable[rows[i]] = values[i]`` (``+=`` with ``add``) where ``where[i]``.

    The rows written must be distinct and in range. Under XLA every position
    is passed and the others skipped (out-of-bounds rows, see
    ``xla.write_targets``); elsewhere the positions are selected first.
    """
    values = tf.cast(values, variable.dtype)
    sharded = framework_private.sharded_variable(variable)
    if sharded is not None:
        # Each shard takes its rows, on its device (ParameterServerStrategy:
        # no XLA).
        rows, values = tf.boolean_mask(rows, where), tf.boolean_mask(values, where)
        shards = list(sharded.variables)
        positions, local = ids_per_shard(rows, shard_row_starts(shards))
        for shard, shard_positions, shard_rows in zip(shards, positions, local):
            with tf.device(shard.device):
                shard_values = tf.gather(values, shard_positions)
                everywhere = tf.ones(tf.shape(shard_rows), tf.bool)
                write_rows_where(shard, shard_rows, shard_values, everywhere, add)
        return
    if in_xla_context():
        rows = _xla.write_targets(rows, where)
    else:
        rows, values = tf.boolean_mask(rows, where), tf.boolean_mask(values, where)
    op = tf.raw_ops.ResourceScatterAdd if add else tf.raw_ops.ResourceScatterUpdate
    op(resource=variable.handle, indices=rows, updates=values)
