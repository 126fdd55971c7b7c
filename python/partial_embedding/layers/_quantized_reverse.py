"""The reverse projection of a quantized ``PartialReversibleEmbedding``.

Logits of a quantized layer have two kinds of columns:

* a column whose table row has no float store row is computed from the int8
  table as Keras' quantized ``ReversibleEmbedding`` computes it: the inputs
  are quantized by the activation quantizer (absmax over the last axis by
  default), multiplied with the int8 rows in integers, cast, and divided by
  ``inputs_scale * scale``; with every row frozen the logits are Keras' bit
  for bit on the same weights;
* a column whose row has a store row is ``inputs @ float_rows[store row]^T``
  in float (``ops.masked_reverse_projection`` over the store, so the table's
  gradient is an ``IndexedSlices`` of permitted store rows only).

The gradient with respect to the inputs passes through the float columns
exactly and through the int8 columns as if the dequantized table were a
constant (straight-through: the rounding of the inputs is ignored).

The untied output table is quantized into the same kind of store under the
names Keras gives it (``reverse_embeddings`` int8, ``reverse_embeddings_scale``)
and ``reverse_float_rows`` and its kin; it is kept row-major ``[V, D]`` (Keras
keeps ``[D, V]``; its bytes are the transpose of ours), so that
``_quantized``'s functions work on it through ``_quantized.ReverseStore``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.variables import read_host_rows
from partial_embedding.layers import _host_frozen, _quantized, _table_init
from partial_embedding.ops import masked_reverse_projection

#: A device scope to run in (``_host_frozen.frozen_device`` of a layer).
Placement = Callable[[], AbstractContextManager[None]]


def inputs_quantizer(config: Any) -> Any:
    """The quantizer Keras' quantized ``ReversibleEmbedding`` applies to the
    inputs of its reverse projection under ``config`` (None: none)."""
    if config is None:
        return keras.quantizers.AbsMaxQuantizer(axis=-1)
    return getattr(config, "activation_quantizer", None)


def fill_store(layer: Any, store: Any, blocks: Any, mask: np.ndarray, values: Any) -> None:
    """Creates ``store``'s weights, quantizes ``blocks`` into them and gives the
    rows of ``mask`` store rows holding ``values`` (None: dequantized)."""
    in_place = _table_init.can_fill_in_place()
    if in_place:
        _table_init.reserve_block_memory()
    _quantized.add_quantized_weights(store, int(layer.trainable_capacity), in_place)
    quantizer = _quantized.weight_quantizer(layer.quantization_config)
    _quantized.fill_quantized(store, blocks, quantizer, in_place)
    trainable_ids = np.flatnonzero(mask)
    if values is None:
        values = _quantized.dequantized_rows(store, trainable_ids)
    _quantized.add_float_rows(store, trainable_ids, values)
    _quantized.sync_store_mask(store, mask)


def build_reverse(layer: Any, mask: np.ndarray) -> None:
    """Builds the untied output table quantized (an ``int8_from_*`` policy),
    from ``embeddings_initializer`` as the float layer initializes it."""
    shape = (layer.input_dim, layer.output_dim)
    blocks = _quantized.initializer_blocks(
        layer.embeddings_initializer, shape, layer.variable_dtype
    )
    fill_store(layer, _quantized.ReverseStore(layer), blocks, mask, None)


def quantize_reverse(layer: Any, mask: np.ndarray) -> None:
    """Quantizes the built float ``reverse_embeddings`` (checked by the caller):
    its rows of ``mask`` are copied into the store as they are."""
    table = layer.reverse_embeddings
    trainable_ids = np.flatnonzero(mask)
    values = read_host_rows(table, trainable_ids, "reverse_embeddings")
    del layer.reverse_embeddings
    fill_store(
        layer, _quantized.ReverseStore(layer), _quantized.variable_blocks(table), mask, values
    )


def _read(variable: Any) -> Any:
    if framework_private.in_stateless_scope():
        # model.stateless_call: every value comes from the scope, as tensors.
        return tf.convert_to_tensor(variable.value)
    return variable


def int8_logits(
    inputs: tf.Tensor,
    codes: tf.Tensor,
    scale: tf.Tensor,
    quantizer: Any,
    compute_dtype: Any,
    placement: Placement = contextlib.nullcontext,
) -> tf.Tensor:
    """Keras' quantized reverse projection, ``[..., V]``, with a straight-through
    gradient for ``inputs``: ``dlogits @ (int8 / scale)``.

    As Keras computes it in a layer of compute dtype ``compute_dtype``: the
    inputs quantized as they come, the integer logits cast to
    ``compute_dtype`` and divided by ``inputs_scale * scale``, the scales
    read as ``compute_dtype`` (Keras autocasts them), with Keras' type
    promotion (under ``mixed_bfloat16`` the result is ``float32``).
    Both directions run in ``placement()`` (the frozen table's device).
    """

    @tf.custom_gradient
    def project(hidden: tf.Tensor) -> Any:
        with placement():
            logits = forward(hidden)

        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            with placement():
                # The dequantized table: a [V, D] transient of the scales' dtype.
                dequantized = tf.cast(codes, scale.dtype) / tf.expand_dims(scale, -1)
                upstream = tf.cast(upstream, scale.dtype)
                return tf.cast(keras.ops.matmul(upstream, dequantized), hidden.dtype)

        return logits, gradient

    def forward(hidden: tf.Tensor) -> tf.Tensor:
        if quantizer is not None:
            quantized, inputs_scale = quantizer(hidden)
        else:
            quantized, inputs_scale = hidden, keras.ops.ones((1,), dtype=compute_dtype)
        logits = keras.ops.matmul(quantized, keras.ops.transpose(codes))
        logits = keras.ops.cast(logits, compute_dtype)
        read_scale = tf.cast(scale, compute_dtype)
        return keras.ops.divide(logits, keras.ops.multiply(inputs_scale, read_scale))

    return project(inputs)


def frozen_float_logits(
    inputs: tf.Tensor, table: tf.Tensor, dtype: tf.DType, placement: Placement
) -> tf.Tensor:
    """``inputs @ table^T`` in ``dtype`` for a float frozen table (a host
    layout's), both directions in ``placement()``: the table never leaves
    its device, only ``[..., D]`` and ``[..., V]`` cross. The table gets no
    gradient (it is frozen)."""
    # Static (a variable's shape): a shape op on another device than the
    # table's could copy it there.
    rows, width = int(table.shape[0]), int(table.shape[1])

    @tf.custom_gradient
    def project(hidden: tf.Tensor) -> Any:
        with placement():
            flat = tf.cast(tf.reshape(hidden, [-1, width]), dtype)
            logits = tf.matmul(flat, tf.cast(table, dtype), transpose_b=True)
            logits = tf.reshape(logits, tf.concat([tf.shape(hidden)[:-1], [rows]], 0))

        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            with placement():
                flat_upstream = tf.cast(tf.reshape(upstream, [-1, rows]), dtype)
                flat_grad = tf.matmul(flat_upstream, tf.cast(table, dtype))
                return tf.cast(tf.reshape(flat_grad, tf.shape(hidden)), hidden.dtype)

        return logits, gradient

    return project(inputs)


def column_store_rows(ids: tf.Tensor, index: tf.Tensor, input_dim: int) -> tf.Tensor:
    """Per table row, its store row plus one (0: none), int32 ``[input_dim]``.

    Built per call from the store's ``[capacity + 1]`` ids (their padding,
    ``input_dim``, lands on a slot that is cut off).
    """
    positions = tf.scatter_nd(tf.expand_dims(ids, -1), index + 1, [input_dim + 1])
    return positions[:input_dim]


def reverse_logits(store: Any, inputs: Any, dtype: Any, config: Any) -> tf.Tensor:
    """Logits ``[..., V]`` of a quantized table (``store``: the layer itself
    when tied, a ``ReverseStore`` when not), in ``dtype`` (None: the promoted
    dtype of ``inputs`` and the float store); the int8 columns are Keras'
    cast to ``dtype``."""
    inputs = tf.convert_to_tensor(inputs)
    float_rows = _read(store.float_rows)
    if dtype is None:
        dtype = keras.backend.result_type(
            keras.backend.standardize_dtype(inputs.dtype),
            keras.backend.standardize_dtype(float_rows.dtype),
        )
    dtype = tf.as_dtype(dtype)
    float_logits = masked_reverse_projection(
        inputs, float_rows, _read(store.float_rows_mask), dtype
    )
    table = tf.convert_to_tensor(_read(store._embeddings))

    def placement() -> AbstractContextManager[None]:
        return _host_frozen.frozen_device(store)

    if _quantized.is_int8(store):
        scale = tf.convert_to_tensor(_read(store.embeddings_scale))
        quantizer = inputs_quantizer(config)
        frozen_logits = int8_logits(inputs, table, scale, quantizer, store.compute_dtype, placement)
    else:
        frozen_logits = frozen_float_logits(inputs, table, dtype, placement)
    frozen_logits = tf.cast(frozen_logits, dtype)
    positions = column_store_rows(
        tf.convert_to_tensor(_read(store.float_row_ids)),
        tf.convert_to_tensor(_read(store.float_row_index)),
        int(store.input_dim),
    )
    gathered = tf.gather(float_logits, tf.maximum(positions - 1, 0), axis=-1)
    return tf.where(positions > 0, gathered, frozen_logits)


def _stock_fits(layer: Any, arrays: list[Any]) -> bool:
    """Whether ``_quantized.load_stock`` takes ``arrays`` (checked before any write)."""
    shape = (layer.input_dim, layer.output_dim)
    if not arrays or tuple(np.shape(arrays[0])) != shape:
        return False
    first = np.asarray(arrays[0][:1]).dtype
    if len(arrays) == 1:
        return bool(np.issubdtype(first, np.floating))
    return (
        len(arrays) == 2 and first == np.int8 and tuple(np.shape(arrays[1])) == (layer.input_dim,)
    )


def load_stock_untied(layer: Any, arrays: list[Any]) -> bool:
    """Loads a stock untied ``ReversibleEmbedding``'s arrays into a quantized layer.

    ``[table, reverse table]`` (float; the reverse table ``[D, V]``, Keras'
    layout) are quantized; ``[int8, scales, reverse int8 [D, V], reverse
    scales]`` (a quantized stock layer's) are assigned, the reverse bytes
    transposed. Rows with float rows get the float (or dequantized) values.
    Anything else: False, nothing changed.
    """
    half = len(arrays) // 2
    if len(arrays) not in (2, 4):
        return False
    if tuple(np.shape(arrays[half])) != (layer.output_dim, layer.input_dim):
        return False
    forward = list(arrays[:half])
    reverse = [np.transpose(np.asarray(arrays[half])), *arrays[half + 1 :]]
    if not (_stock_fits(layer, forward) and _stock_fits(layer, reverse)):
        return False
    _quantized.load_stock(layer, forward)
    _quantized.load_stock(_quantized.ReverseStore(layer), reverse)
    return True
