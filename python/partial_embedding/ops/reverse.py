"""The reverse projection of a tied embedding, whose table gradient is sparse.

``masked_reverse_projection`` computes ``hidden @ table^T`` (the logits of a
language model whose output layer reuses its input embeddings). Through a
plain matmul the table's gradient is a dense ``[V, D]`` tensor: every row
moves and every row's optimizer state is kept. Here it is a
``tf.IndexedSlices`` of the permitted rows only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._internal import xla as _xla
from partial_embedding._internal.checks import (
    check_row_mask_dtype,
    check_table_dtype,
    row_mask_tensor,
)
from partial_embedding._internal.context import in_xla_context, never_empty_across_replicas
from partial_embedding._internal.types import RowMask, TensorLike, Variable
from partial_embedding._internal.variables import resolve_variable
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)

__all__ = ["masked_reverse_projection"]


@tf.autograph.experimental.do_not_convert
def masked_reverse_projection(
    hidden: TensorLike,
    params: Variable,
    row_mask: RowMask,
    compute_dtype: Any = None,
    name: str | None = None,
) -> tf.Tensor:
    """Returns ``hidden @ params^T``; only rows where ``row_mask`` is true learn.

    The matmul of a tied output projection: ``hidden`` ``[..., D]`` and a
    table ``[V, D]`` give logits ``[..., V]``. The gradient with respect to
    ``params`` is a ``tf.IndexedSlices`` of the permitted rows only (sorted),
    ``dlogits[:, permitted]^T @ hidden``: no ``[V, D]`` tensor is built (under
    XLA, where the count of permitted rows may not shape a tensor, a dense one
    with zero frozen rows). The contract: docs/tied_embeddings.md, "Reference".

    Args:
      hidden: A floating-point tensor ``[..., D]``.
      params: The table ``[V, D]``: a ``tf.Variable``, a Keras 3 variable
        (read without switching it into copy-on-read mode) or a tensor.
      row_mask: bool ``[V]``, true where a row may learn (tensor, array,
        ``tf.Variable`` or Keras variable), read at run time.
      compute_dtype: The dtype of the matmul and of the result, or None (the
        promoted type of the two operands).
      name: A name for the operation.

    Returns:
      The logits, ``hidden.shape[:-1] + [V]``, of ``compute_dtype``.

    Raises:
      PartialEmbeddingTypeError: a dtype is wrong.
      PartialEmbeddingArgumentError: a shape is wrong.

    >>> import tensorflow as tf, partial_embedding as pe
    >>> table = tf.Variable([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> hidden = tf.constant([[2.0, 3.0]])
    >>> with tf.GradientTape() as tape:
    ...     logits = pe.ops.masked_reverse_projection(
    ...         hidden, table, row_mask=[False, False, True])
    ...     loss = tf.reduce_sum(logits)
    >>> logits.numpy().tolist()
    [[2.0, 3.0, 5.0]]
    >>> grad = tape.gradient(loss, table)
    >>> grad.indices.numpy().tolist(), grad.values.numpy().tolist()
    ([2], [[2.0, 3.0]])
    """
    with tf.name_scope(name or "masked_reverse_projection"):
        table = _table_tensor(params)
        mask = _mask_tensor(row_mask)
        hidden = tf.convert_to_tensor(hidden)
        if not hidden.dtype.is_floating:
            raise PartialEmbeddingTypeError(
                f"hidden: must be a floating-point tensor, got dtype {hidden.dtype.name}"
            )
        _check_shapes(hidden.shape, table.shape, mask.shape)
        if compute_dtype is None:
            dtype = tf.as_dtype(
                np.result_type(hidden.dtype.as_numpy_dtype, table.dtype.as_numpy_dtype)
            )
        else:
            dtype = tf.as_dtype(compute_dtype)
        width = tf.shape(table)[1]
        flat_hidden = tf.reshape(hidden, tf.stack([-1, width]))
        flat_logits = _project(flat_hidden, table, mask, dtype, in_xla_context())
        logits = tf.reshape(flat_logits, tf.concat([tf.shape(hidden)[:-1], tf.shape(table)[:1]], 0))
        logits.set_shape(hidden.shape[:-1].concatenate(table.shape[:1]))
        return logits


def _table_tensor(params: Any) -> tf.Tensor:
    if isinstance(params, tf.Tensor):
        table = params
    else:
        try:
            variable = resolve_variable(params, "params")
        except PartialEmbeddingTypeError:
            table = tf.convert_to_tensor(params)
        else:
            # An aliasing read: no copy of the table, no copy-on-read mode.
            table = variable.value()
    check_table_dtype(table.dtype.base_dtype, "params")
    return table


def _mask_tensor(row_mask: Any) -> tf.Tensor:
    try:
        variable = resolve_variable(row_mask, "row_mask")
    except PartialEmbeddingTypeError:
        # Python lists: infer the dtype (so that [1, 0] is reported, not cast).
        return row_mask_tensor(row_mask if hasattr(row_mask, "dtype") else np.asarray(row_mask))
    mask = variable.value()
    check_row_mask_dtype(mask.dtype.base_dtype)
    return mask


def _check_shapes(hidden: tf.TensorShape, table: tf.TensorShape, mask: tf.TensorShape) -> None:
    if table.rank is not None and table.rank != 2:
        raise PartialEmbeddingArgumentError(
            f"params: the table must have shape [V, D] (rank 2), got {table}"
        )
    if hidden.rank is not None and hidden.rank < 1:
        raise PartialEmbeddingArgumentError(
            f"hidden: must have shape [..., D] (rank >= 1), got {hidden}"
        )
    if hidden.rank is not None and table.rank is not None:
        if not hidden[-1:].is_compatible_with(table[1:]):
            raise PartialEmbeddingArgumentError(
                f"hidden: the last dimension ({hidden[-1]}) must equal the "
                f"table's width D = {table[1]} (params of shape {table})"
            )
    if mask.rank is not None and mask.rank != 1:
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {mask} must be [V] (rank 1, one entry per row)"
        )
    if table.rank is not None and not mask.is_compatible_with(table[:1]):
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {mask} must be [{table[0]}] (one entry per row of params)"
        )


def _project(
    flat_hidden: tf.Tensor, table: tf.Tensor, mask: tf.Tensor, dtype: tf.DType, xla: bool
) -> tf.Tensor:
    """``flat_hidden @ table^T`` in ``dtype``, with the sparse table gradient
    (under XLA: a dense one, zero on frozen rows)."""
    hidden_dtype = flat_hidden.dtype
    table_dtype = table.dtype

    @tf.custom_gradient
    def project(flat_hidden: tf.Tensor, table: tf.Tensor) -> tuple[tf.Tensor, Any]:
        hidden_cast = tf.cast(flat_hidden, dtype)
        table_cast = tf.cast(table, dtype)
        logits = tf.matmul(hidden_cast, table_cast, transpose_b=True)

        def gradient(upstream: tf.Tensor) -> tuple[tf.Tensor, tf.IndexedSlices]:
            upstream = tf.cast(upstream, dtype)
            hidden_grad = tf.cast(tf.matmul(upstream, table_cast), hidden_dtype)
            if xla:
                # Static shapes: every row's gradient, frozen rows' zeroed.
                values = tf.matmul(upstream, hidden_cast, transpose_a=True)
                return hidden_grad, _xla.where_rows(mask, tf.cast(values, table_dtype))
            permitted = tf.reshape(tf.where(mask), [-1])
            # [N, P]^T @ [N, D]: only the permitted rows' gradient is formed.
            permitted_upstream = tf.gather(upstream, permitted, axis=1)
            values = tf.matmul(permitted_upstream, hidden_cast, transpose_a=True)
            # Empty only when every row is frozen: then the zero row is row 0's.
            values, rows = never_empty_across_replicas(
                tf.cast(values, table_dtype), permitted, permitted
            )
            table_grad = tf.IndexedSlices(values, rows, tf.shape(table, out_type=tf.int64))
            return hidden_grad, table_grad

        return logits, gradient

    return project(flat_hidden, table)
