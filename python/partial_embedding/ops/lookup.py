"""Lookups whose gradient reaches only some entries.

``masked_embedding_lookup`` gathers rows of a table and sends the gradient
only to the permitted ones (through a custom gradient, per shard on a
``ShardedVariable``); ``entry_stop_gradients`` lets gradients through only
where a mask is true, on any tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._internal import xla as _xla
from partial_embedding._internal.checks import (
    check_row_mask_dtype,
    check_table_dtype,
    checked_flat_ids,
    index_tensor,
    row_mask_tensor,
)
from partial_embedding._internal.context import in_xla_context, never_empty_across_replicas
from partial_embedding._internal.gradient_memo import GradientMemo
from partial_embedding._internal.types import RowMask, TensorLike, Variable
from partial_embedding._internal.variables import (
    gather_rows,
    ids_per_shard,
    masks_per_shard,
    on_each_device,
    resolve_variable,
    shard_row_starts,
    sharded_variable,
)
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)

__all__ = ["entry_stop_gradients", "masked_embedding_lookup"]


@tf.autograph.experimental.do_not_convert
def masked_embedding_lookup(
    params: Variable, ids: TensorLike, row_mask: RowMask, name: str | None = None
) -> tf.Tensor:
    """Looks up rows of ``params``; only rows where ``row_mask`` is true learn.

    The forward pass equals ``tf.gather(params, ids)`` and reads only those
    rows (the variable is not switched into copy-on-read mode). The gradient
    with respect to ``params`` is a ``tf.IndexedSlices`` that holds only the
    occurrences of ``ids`` whose row is permitted, so ``tf.GradientTape`` loops
    and sparse optimizers never touch a frozen row. Nothing of the
    vocabulary's size is built. The contract (under XLA, on mirrored and
    sharded variables): docs/training_some_rows.md, "Reference".

    Args:
      params: A ``tf.Variable`` or Keras 3 variable, ``[V, ...]``, of dtype
        float16, bfloat16, float32 or float64, or a ``ShardedVariable`` of one.
      ids: int32 or int64 row numbers in ``[0, V)``, any shape.
      row_mask: bool ``[V]``, true where a row may learn: a tensor, array,
        list, ``tf.Variable`` or Keras variable (gathered from, never read
        whole: a changed mask applies on the next call without retracing).
      name: A name for the operation.

    Returns:
      A tensor of ``params``' dtype and shape ``ids.shape + params.shape[1:]``.

    Raises:
      PartialEmbeddingTypeError: ``params`` is not a variable, or a dtype is
        wrong.
      PartialEmbeddingArgumentError: ``row_mask`` is not of shape ``[V]``.
      tf.errors.InvalidArgumentError: at run time, an id outside ``[0, V)``
        (under XLA: a row of zeros instead).

    >>> import tensorflow as tf, partial_embedding as pe
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    >>> with tf.GradientTape() as tape:
    ...     rows = pe.masked_embedding_lookup(table, [2, 0, 2],
    ...                                       row_mask=[True, True, False])
    ...     loss = tf.reduce_sum(rows)
    >>> rows.numpy().tolist()
    [[3.0, 3.0], [1.0, 1.0], [3.0, 3.0]]
    >>> grad = tape.gradient(loss, table)
    >>> grad.indices.numpy().tolist(), grad.values.numpy().tolist()
    ([0], [[1.0, 1.0]])
    """
    sharded = sharded_variable(params)
    if sharded is not None:
        return _lookup_per_shard(sharded, ids, row_mask, name)
    return _lookup(params, ids, row_mask, name)


@tf.autograph.experimental.do_not_convert
def _lookup(params: Any, ids: Any, row_mask: Any, name: str | None) -> tf.Tensor:
    """masked_embedding_lookup on one variable."""
    variable = table_variable(params)
    var_shape = variable.shape
    static_rows = var_shape[0] if var_shape.rank is not None else None
    with tf.name_scope(name or "masked_embedding_lookup"):
        ids = index_tensor(ids, "ids")
        mask_source = row_mask_source(row_mask, static_rows)
        if static_rows is not None:
            num_rows = tf.constant(static_rows, dtype=ids.dtype)
        else:
            num_rows = tf.cast(tf.shape(variable, out_type=tf.int64)[0], ids.dtype)
        if in_xla_context():
            rows = _xla_gather_permitted(variable, tf.reshape(ids, [-1]), mask_source, num_rows)
        else:
            flat_ids = _checked_ids(tf.reshape(ids, [-1]), num_rows)
            flat_ids, permitted = _mask_at(mask_source, flat_ids, num_rows)
            rows = _gather_permitted(variable.value(), flat_ids, permitted)
        result = tf.reshape(rows, tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))
        if var_shape.rank is not None:
            result.set_shape(ids.shape.concatenate(var_shape[1:]))
        return result


@tf.autograph.experimental.do_not_convert
def _lookup_per_shard(table: Any, ids: Any, row_mask: Any, name: str | None) -> tf.Tensor:
    """masked_embedding_lookup on a ShardedVariable: each id is looked up (and
    its gradient sent) in the shard that owns its row, with a local id."""
    shards = list(table.variables)
    starts = shard_row_starts(shards)
    with tf.name_scope(name or "masked_embedding_lookup"):
        ids = index_tensor(ids, "ids")
        masks = masks_per_shard(row_mask, starts)
        flat_ids = checked_flat_ids(ids, starts[-1], "ids")
        positions, local_ids = ids_per_shard(flat_ids, starts)

        def look_up_shard(shard: tf.Variable, mask: Any, shard_ids: tf.Tensor) -> tf.Tensor:
            return _lookup(shard, shard_ids, mask, None)

        rows = on_each_device(shards, look_up_shard, masks, local_ids)
        stitched = tf.dynamic_stitch(positions, rows)
        result = tf.reshape(stitched, tf.concat([tf.shape(ids), tf.shape(stitched)[1:]], 0))
        result.set_shape(ids.shape.concatenate(shards[0].shape[1:]))
        return result


def table_variable(params: Any) -> tf.Variable:
    """The variable behind ``params``, once its dtype and rank are known good."""
    variable = resolve_variable(params, "params")
    check_table_dtype(variable.dtype.base_dtype, "params")
    var_shape = variable.shape
    if var_shape.rank is not None and var_shape.rank < 1:
        raise PartialEmbeddingArgumentError(
            f"params: the variable must have rank >= 1, got shape {var_shape}"
        )
    return variable


def row_mask_source(row_mask: Any, num_rows: int | None) -> tf.Variable | tf.Tensor:
    """Returns a variable to gather from (no full read) or a bool tensor."""
    try:
        source = resolve_variable(row_mask, "row_mask")
    except PartialEmbeddingTypeError:
        # Python lists: infer the dtype (so that [1, 0] is reported, not cast).
        source = row_mask_tensor(row_mask if hasattr(row_mask, "dtype") else np.asarray(row_mask))
    else:
        check_row_mask_dtype(source.dtype.base_dtype)
    mask_shape = source.shape
    if mask_shape.rank is not None and mask_shape.rank != 1:
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {mask_shape} must be [V] (rank 1, one entry per row)"
        )
    if num_rows is not None and not mask_shape.is_compatible_with([num_rows]):
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {mask_shape} must be [{num_rows}] (one entry per row of params)"
        )
    return source


def _checked_ids(flat_ids: tf.Tensor, num_rows: tf.Tensor) -> tf.Tensor:
    """``flat_ids``, once each is known to be in ``[0, num_rows)``."""
    # Checked here so that every device (GPU gathers do not check) and the
    # mask gather report the same clear error.
    checks = [
        tf.debugging.assert_non_negative(
            flat_ids,
            message="masked_embedding_lookup: ids must be in [0, V), "
            "V = the number of rows of params; found a negative id",
            summarize=8,
        ),
        tf.debugging.assert_less(
            flat_ids,
            num_rows,
            message="masked_embedding_lookup: ids must be in [0, V), "
            "V = the number of rows of params (y below); found an id >= V",
            summarize=8,
        ),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(flat_ids)


def _mask_at(
    mask_source: tf.Variable | tf.Tensor, flat_ids: tf.Tensor, num_rows: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """``(flat_ids, the mask at flat_ids)``; where the mask's length is only
    known at run time, the returned ids depend on its check."""
    if isinstance(mask_source, tf.Variable):
        return flat_ids, gather_rows(mask_source, flat_ids)
    if mask_source.shape.rank is None or mask_source.shape[0] is None:
        mask_ok = tf.debugging.assert_equal(
            tf.cast(tf.size(mask_source), num_rows.dtype),
            num_rows,
            message="row_mask: must have one entry per row of params",
        )
        with tf.control_dependencies([mask_ok]):
            flat_ids = tf.identity(flat_ids)
    return flat_ids, tf.gather(mask_source, flat_ids)


def _gather_permitted(table: tf.Tensor, flat_ids: tf.Tensor, permitted: tf.Tensor) -> tf.Tensor:
    """``tf.gather(table, flat_ids)``, whose gradient keeps only the permitted
    occurrences (frozen ones are dropped, not zeroed)."""

    @tf.custom_gradient
    def gather_permitted(table: tf.Tensor) -> tuple[tf.Tensor, Any]:
        def gradient(upstream: tf.Tensor) -> tf.IndexedSlices:
            keep = tf.reshape(tf.where(permitted), [-1])
            values = tf.gather(upstream, keep)
            indices = tf.gather(flat_ids, keep)
            remember_uncompacted(values, indices, upstream, flat_ids, keep)
            # Empty only when no id is permitted: the first id is frozen.
            values, indices = never_empty_across_replicas(values, indices, flat_ids)
            return tf.IndexedSlices(values, indices, tf.shape(table, out_type=flat_ids.dtype))

        return tf.gather(table, flat_ids), gradient

    return gather_permitted(table)


#: The lookup's upstream gradient, ids and kept positions, for each gradient
#: it built in a graph.
_UNCOMPACTED = GradientMemo()


def remember_uncompacted(
    values: tf.Tensor,
    indices: tf.Tensor,
    upstream: tf.Tensor,
    flat_ids: tf.Tensor,
    keep: tf.Tensor,
) -> None:
    """Records what ``uncompacted_gradient`` returns for ``(values,
    indices)``; only in a graph, where the compacting gathers are left out
    (pruned) when nothing else reads them."""
    _UNCOMPACTED.remember(values, indices, upstream, flat_ids, keep)


def uncompacted_gradient(
    values: tf.Tensor, indices: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor] | None:
    """The gradient ``masked_embedding_lookup`` compacted into ``(values,
    indices)``, before it dropped the frozen rows' occurrences.

    For a consumer that skips frozen rows itself (the fused optimizer
    kernels): it can read the lookup's upstream gradient in place instead of
    a copy of its permitted rows. The permitted occurrences keep their order,
    so sums over them are the same.

    Args:
      values: The ``values`` of a gradient with respect to the table.
      indices: Its ``indices``.

    Returns:
      ``(all_values, all_ids, kept)``, ``[N] + row_shape``, ``[N]`` and
      ``[K]`` int64, with ``values == tf.gather(all_values, kept)`` and
      ``indices == tf.gather(all_ids, kept)``; None unless both are exactly
      the tensors the lookup's gradient built in the current graph.
    """
    inputs = _UNCOMPACTED.recall(values, indices)
    if inputs is None:
        return None
    all_values, all_ids, kept = inputs
    return all_values, all_ids, kept


def _xla_gather_permitted(
    variable: tf.Variable,
    flat_ids: tf.Tensor,
    mask_source: tf.Variable | tf.Tensor,
    num_rows: tf.Tensor,
) -> tf.Tensor:
    """The XLA path of the lookup: static shapes, no run-time error.

    An id outside ``[0, V)`` gives a row of zeros and no gradient (its
    occurrence in the gradient names row ``V``, which no update writes). The
    gradient holds every occurrence; a frozen row's are zero.
    """
    rows, valid, permitted = _xla.valid_rows(
        flat_ids,
        num_rows,
        lambda rows: (
            gather_rows(mask_source, rows)
            if isinstance(mask_source, tf.Variable)
            else tf.gather(mask_source, rows)
        ),
    )
    table = variable.value()
    # A bad id is gathered from row 0, but its gradient names row V, so that
    # row 0 takes no step when the batch does not hold it.
    gradient_rows = _xla.gradient_rows(rows, valid, num_rows)

    @tf.custom_gradient
    def gather_valid(table: tf.Tensor) -> tuple[tf.Tensor, Any]:
        def gradient(upstream: tf.Tensor) -> tf.IndexedSlices:
            return tf.IndexedSlices(
                _xla.where_rows(permitted, upstream),
                gradient_rows,
                tf.shape(table, out_type=rows.dtype),
            )

        return _xla.where_rows(valid, tf.gather(table, rows)), gradient

    return gather_valid(table)


@tf.autograph.experimental.do_not_convert
def entry_stop_gradients(target: TensorLike, mask: RowMask) -> tf.Tensor:
    """Returns ``target`` unchanged; gradients flow only where ``mask`` is true.

    The problem it solves: training only some entries of a tensor, e.g. the
    rows of an embedding lookup that belong to new words. The widely copied
    answer is ``stop_gradient((1 - mask) * target) + mask * target``, which
    rounds nothing for finite values but turns ``inf`` into ``nan`` and, when
    applied to the whole embedding table, costs a pass over the vocabulary
    every step. This function selects instead of multiplying, so the forward
    value is ``target`` bit for bit, and it works on whatever tensor it is
    given: apply it to the looked-up rows, not to the table.

    Where ``mask`` is false the gradient is exactly zero, but it is still
    there: an optimizer with momentum or weight decay may still move those
    entries. To drop frozen rows from an embedding gradient altogether, use
    ``masked_embedding_lookup``.

    Args:
      target: A floating-point tensor.
      mask: A tensor broadcastable to ``target``'s shape: bool, or numbers
        where non-zero means true.

    Returns:
      A tensor equal to ``target``.

    >>> import tensorflow as tf, partial_embedding as pe
    >>> x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(x)
    ...     y = pe.entry_stop_gradients(x, [[True], [False]])
    ...     loss = tf.reduce_sum(3.0 * y)
    >>> tape.gradient(loss, x).numpy().tolist()
    [[3.0, 3.0], [0.0, 0.0]]
    """
    with tf.name_scope("entry_stop_gradients"):
        target = tf.convert_to_tensor(target)
        mask = tf.convert_to_tensor(mask)
        if mask.dtype != tf.bool:
            mask = tf.not_equal(mask, tf.zeros([], dtype=mask.dtype))
        return tf.where(mask, target, tf.stop_gradient(target))
