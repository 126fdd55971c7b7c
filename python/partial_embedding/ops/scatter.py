"""``masked_scatter_sub``: subtract rows from the permitted rows of a table, in place.

One variable goes straight to the op. A ``ShardedVariable`` is split: every
global id is checked, then each shard receives its own rows with local ids.
A ``MirroredVariable`` in a cross-replica context is written in every
component alike.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from partial_embedding._build_info import check_variable_placement
from partial_embedding._internal import xla as _xla
from partial_embedding._internal.checks import (
    RowUpdateArguments,
    check_table_dtype,
    checked_flat_ids,
    index_tensor,
    row_update_tensors,
    to_tensor_keeping_dtype,
)
from partial_embedding._internal.context import in_xla_context, update_result
from partial_embedding._internal.types import RowMask, TensorLike, Variable
from partial_embedding._internal.variables import (
    components,
    has_current_component,
    ids_per_shard,
    is_distributed,
    masks_per_component,
    masks_per_shard,
    on_each_device,
    resolve_variable,
    shard_row_starts,
    sharded_variable,
)
from partial_embedding._loader import load_ops

__all__ = ["masked_scatter_sub"]

_ARGUMENTS = RowUpdateArguments(
    table="ref",
    updates="updates",
    table_owner="the variable's",
    table_in_formula="variable",
    check_mask_rank=True,
)


@tf.autograph.experimental.do_not_convert
def masked_scatter_sub(
    ref: Variable,
    indices: TensorLike,
    updates: TensorLike,
    row_mask: RowMask,
    use_locking: bool = True,
    name: str | None = None,
) -> tf.Operation | None:
    """Subtracts ``updates`` from the permitted rows of ``ref``, in place.

    For every position ``i`` of ``indices``::

        if row_mask[indices[i]]:
            ref[indices[i], ...] -= updates[i, ...]

    Rows whose mask is false are never written, bit for bit; duplicate indices
    accumulate; every index is checked against ``[0, V)`` before anything is
    written. The buffer is updated in place and never switched into
    copy-on-read mode. The contract (under XLA, on mirrored and sharded
    variables, locking): docs/training_some_rows.md, "Reference".

    Args:
      ref: A ``tf.Variable`` or Keras 3 variable of rank >= 1 with ``V`` rows,
        of dtype float16, bfloat16, float32 or float64; or a distributed one.
      indices: int32 or int64 row numbers, any shape.
      updates: ``indices.shape + ref.shape[1:]``, of ``ref``'s dtype.
      row_mask: bool ``[V]``, true where a row may be written: a tensor, array
        or ``tf.Variable``.
      use_locking: If true (the default), the variable's lock is held
        exclusively for the whole update; if false, the write runs under the
        shared lock (concurrent updates of a row may lose increments).
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode; ``None`` eagerly and inside
      ``tf.function`` (where automatic control dependencies run it).

    Raises:
      PartialEmbeddingArgumentError: (a ``ValueError`` and a
        ``tf.errors.InvalidArgumentError``) a wrong shape or dtype.
      tf.errors.InvalidArgumentError: at run time, an index outside
        ``[0, V)``, naming its position and value. Nothing is written.
      tf.errors.FailedPreconditionError or tf.errors.NotFoundError: the
        variable is not initialized.

    >>> import tensorflow as tf, partial_embedding as pe
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    >>> pe.masked_scatter_sub(table, [0, 1, 1], tf.ones([3, 2]),
    ...                       row_mask=[True, False, True])
    >>> table.numpy().tolist()
    [[0.0, 0.0], [2.0, 2.0], [3.0, 3.0]]
    """
    sharded = sharded_variable(ref)
    if sharded is not None:
        return _scatter_sub_per_shard(sharded, indices, updates, row_mask, use_locking, name)
    variable = resolve_variable(ref)
    if is_distributed(variable) and not has_current_component(variable):
        return _scatter_sub_per_component(variable, indices, updates, row_mask, use_locking, name)
    check_table_dtype(variable.dtype.base_dtype, "ref")
    with tf.name_scope(name or "masked_scatter_sub"):
        indices, updates, row_mask = row_update_tensors(
            variable, indices, updates, row_mask, _ARGUMENTS
        )
        if in_xla_context():
            return update_result(_xla_scatter_sub(variable, indices, updates, row_mask))
        check_variable_placement("MaskedScatterSub", variable, "ref")
        op = load_ops().partial_embedding_masked_scatter_sub(
            resource=variable.handle,
            indices=indices,
            updates=updates,
            row_mask=row_mask,
            use_locking=use_locking,
        )
    return update_result(op)


def _xla_scatter_sub(
    variable: tf.Variable, indices: tf.Tensor, updates: tf.Tensor, row_mask: tf.Tensor
) -> tf.Operation:
    """The XLA path: stock ops, static shapes; ids outside ``[0, V)`` and
    frozen rows are never written."""
    flat_ids = tf.reshape(indices, [-1])
    flat_updates = tf.reshape(
        updates, tf.concat([[-1], tf.shape(updates)[indices.shape.rank :]], 0)
    )
    rows, _, write = _xla.valid_rows(
        flat_ids,
        tf.shape(row_mask, out_type=flat_ids.dtype)[0],
        lambda rows: tf.gather(row_mask, rows),
    )
    return _xla.scatter_sub_where(variable, rows, flat_updates, write)


def _scatter_sub_per_shard(
    table: Any,
    indices: Any,
    updates: Any,
    row_mask: Any,
    use_locking: bool,
    name: str | None,
) -> tf.Operation | None:
    """masked_scatter_sub on a ShardedVariable: each shard gets its own rows."""
    shards = list(table.variables)
    starts = shard_row_starts(shards)
    row_shape = shards[0].shape[1:]
    with tf.name_scope(name or "masked_scatter_sub"):
        indices = index_tensor(indices, "indices")
        updates = to_tensor_keeping_dtype(updates, shards[0].dtype.base_dtype)
        masks = masks_per_shard(row_mask, starts)
        flat_ids = checked_flat_ids(indices, starts[-1], "indices")
        flat_updates = tf.reshape(
            updates, tf.concat([[-1], tf.shape(updates)[indices.shape.rank :]], 0)
        )

        def write_shard(
            shard: tf.Variable, mask: Any, positions: tf.Tensor, local_ids: tf.Tensor
        ) -> tf.Operation | None:
            rows = tf.ensure_shape(tf.gather(flat_updates, positions), [None, *row_shape])
            return masked_scatter_sub(shard, local_ids, rows, mask, use_locking=use_locking)

        ops = on_each_device(shards, write_shard, masks, *ids_per_shard(flat_ids, starts))
    return update_result(ops)


def _scatter_sub_per_component(
    variable: Any,
    indices: Any,
    updates: Any,
    row_mask: Any,
    use_locking: bool,
    name: str | None,
) -> tf.Operation | None:
    """masked_scatter_sub on every component of a distributed variable
    (cross-replica context): the copies stay identical."""
    parts = components(variable)

    def write_component(component: tf.Variable, mask: Any) -> tf.Operation | None:
        return masked_scatter_sub(component, indices, updates, mask, use_locking, name)

    return update_result(
        on_each_device(parts, write_component, masks_per_component(row_mask, len(parts)))
    )
