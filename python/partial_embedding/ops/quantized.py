"""The lookup of a quantized partial table: int8 frozen rows, float trainable rows.

``quantized_lookup`` returns, for each id, its float store row when it has
one and ``float(int8 row) / scale`` (Keras' dequantization) otherwise. With
float32 it is one op (``PartialEmbedding>QuantizedLookup``: a binary search
and one pass over the batch's rows) on the CPU and, in a build with its CUDA
kernel, on a GPU; elsewhere (XLA, other float dtypes, a GPU without the
kernel, and functions traced for a SavedModel, which then serves without
this library) the same values from stock ops. Either way the gradient reaches the
store only, as an ``IndexedSlices`` over the store rows of permitted
occurrences.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from partial_embedding._build_info import gpu_fused_kernel_chosen
from partial_embedding._internal import framework_private
from partial_embedding._internal.context import in_xla_context, never_empty_across_replicas
from partial_embedding._internal.types import TensorLike
from partial_embedding._internal.variables import gather_rows, resolve_variable
from partial_embedding._loader import load_ops
from partial_embedding.ops.lookup import (
    entry_stop_gradients,
    masked_embedding_lookup,
    remember_uncompacted,
)

__all__ = ["quantized_lookup"]


def _fused_applies(store: Any, compute_dtype: tf.DType) -> bool:
    """Whether the one-op lookup gives the values: float32 throughout, the
    store on the CPU or, in a build with its CUDA kernel, a GPU."""
    device = getattr(store, "device", "") or ""
    return (
        not in_xla_context()
        # A SavedModel gets stock ops: it serves without this library.
        and not framework_private.in_save_context()
        and compute_dtype == tf.float32
        and tf.as_dtype(store.dtype) == tf.float32
        and ("GPU" not in device.upper() or gpu_fused_kernel_chosen("QuantizedLookup"))
    )


def _rows(source: Any, ids: tf.Tensor) -> tf.Tensor:
    """``source[ids]``; from a variable without putting it in copy-on-read mode."""
    if isinstance(source, tf.Variable) or hasattr(source, "assign"):
        return gather_rows(source, ids)
    return tf.gather(source, ids)


def stock_rows(codes: Any, scales: Any, flat_ids: tf.Tensor, compute_dtype: tf.DType) -> tf.Tensor:
    """Dequantized rows ``float(codes[ids]) / scales[ids]``, with stock ops."""
    rows = tf.cast(_rows(codes, flat_ids), compute_dtype)
    scale = _rows(scales, flat_ids)
    if scale.dtype != compute_dtype:
        # As Keras' ops.divide promotes: the wider of the two.
        wider = tf.float32 if tf.float32 in (scale.dtype, compute_dtype) else compute_dtype
        rows, scale = tf.cast(rows, wider), tf.cast(scale, wider)
    return rows / tf.expand_dims(scale, -1)


def store_rows_of(sorted_ids: tf.Tensor, index: tf.Tensor, flat_ids: tf.Tensor) -> tf.Tensor:
    """The store row of each id (of ``index``'s dtype); the sentinel's where it has none."""
    sentinel = tf.shape(sorted_ids, out_type=index.dtype)[0] - 1
    ids = tf.cast(flat_ids, sorted_ids.dtype)
    position = tf.minimum(
        tf.searchsorted(sorted_ids, ids, side="left", out_type=index.dtype), sentinel
    )
    has_row = tf.equal(tf.gather(sorted_ids, position), ids)
    return tf.where(has_row, tf.gather(index, position), sentinel)


def _value(source: Any) -> tf.Tensor:
    """The whole of a variable (an alias of its buffer) or tensor."""
    if isinstance(source, tf.Variable) or hasattr(source, "assign"):
        return resolve_variable(source, argument="variable").value()
    return tf.convert_to_tensor(source)


def _fused(
    codes: tf.Tensor,
    scales: tf.Tensor,
    store: tf.Variable,
    store_mask: Any,
    sorted_ids: tf.Tensor,
    index: tf.Tensor,
    flat_ids: tf.Tensor,
) -> tf.Tensor:
    """The one-op lookup; its gradient names the store rows of permitted occurrences."""
    store_value = store.value()
    # The op takes int32 ``[S]`` maps (a store's rows fit); the layer keeps
    # them in int64 variables, which stay on a GPU where int32 ones would not.
    rows, store_rows = load_ops().partial_embedding_quantized_lookup(
        codes=codes,
        scales=scales,
        store=store_value,
        sorted_ids=tf.cast(sorted_ids, tf.int32),
        store_index=tf.cast(index, tf.int32),
        ids=flat_ids,
    )
    permitted = tf.gather(tf.convert_to_tensor(store_mask), store_rows)

    @tf.custom_gradient
    def through_store(table: tf.Tensor) -> tuple[tf.Tensor, Any]:
        def gradient(upstream: tf.Tensor) -> tf.IndexedSlices:
            keep = tf.reshape(tf.where(permitted), [-1])
            values = tf.gather(upstream, keep)
            indices = tf.gather(store_rows, keep)
            # A fused optimizer kernel reads ``upstream`` in place and skips
            # the unpermitted occurrences itself (their store rows, the
            # sentinel's included, are false in the store mask).
            remember_uncompacted(values, indices, upstream, store_rows, keep)
            # Empty only when no occurrence is permitted: the first one's
            # store row (a frozen row's, or the sentinel) is not.
            values, indices = never_empty_across_replicas(values, indices, store_rows)
            return tf.IndexedSlices(values, indices, tf.shape(table, out_type=tf.int32))

        return rows, gradient

    return through_store(store_value)


@tf.autograph.experimental.do_not_convert
def quantized_lookup(
    codes: TensorLike,
    scales: TensorLike,
    store: Any,
    store_mask: Any,
    sorted_ids: TensorLike,
    store_index: TensorLike,
    flat_ids: TensorLike,
    compute_dtype: Any = tf.float32,
) -> tf.Tensor:
    """Rows of flat ids from a quantized partial table.

    Args:
      codes: int8 ``[V, D]`` (a variable or its value).
      scales: ``[V]``, one scale per row.
      store: The float store ``[S, D]`` (a variable: the gradient reaches it;
        or a tensor), its last row the sentinel no id has.
      store_mask: bool ``[S]``: store rows whose occurrences get a gradient.
      sorted_ids: int32 or int64 ``[S]``, the rows with a store row,
        ascending, padded with ``V``.
      store_index: ``[S]`` of the same dtype, the store row of each sorted id.
      flat_ids: ``[N]`` ids in ``[0, V)`` (an id outside raises
        ``InvalidArgumentError`` on CPU).
      compute_dtype: The dtype of the dequantized rows.

    Returns:
      ``[N, D]``: store rows where an id has one, dequantized rows elsewhere.
    """
    compute_dtype = tf.as_dtype(compute_dtype)
    flat_ids = tf.convert_to_tensor(flat_ids)
    sorted_ids = tf.convert_to_tensor(sorted_ids)
    index = tf.convert_to_tensor(store_index)
    store = getattr(store, "value", store) if not isinstance(store, tf.Variable) else store
    if isinstance(store, tf.Variable) and _fused_applies(store, compute_dtype):
        return _fused(
            _value(codes),
            _value(scales),
            store,
            store_mask,
            sorted_ids,
            index,
            flat_ids,
        )
    frozen = stock_rows(codes, scales, flat_ids, compute_dtype)
    store_rows = store_rows_of(sorted_ids, index, flat_ids)
    if isinstance(store, tf.Variable):
        trained = masked_embedding_lookup(store, store_rows, store_mask)
    else:
        permitted = tf.gather(tf.convert_to_tensor(store_mask), store_rows)
        trained = entry_stop_gradients(tf.gather(store, store_rows), tf.expand_dims(permitted, -1))
    has_row = tf.not_equal(store_rows, tf.shape(sorted_ids, out_type=store_rows.dtype)[0] - 1)
    return tf.where(tf.expand_dims(has_row, -1), tf.cast(trained, frozen.dtype), frozen)
