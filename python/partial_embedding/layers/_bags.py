"""``PartialEmbedding(combiner=...)``: one vector per bag of ids.

The layer's ``call(ids, weights=None)`` with a combiner: ragged, sparse or
padded dense ids become flat bags (``ops.bags``), which its table (or, once
quantized, its int8 rows and float store) sums into one row per bag. The
gradient reaches the permitted rows only, summed from the bags' gradients
(``masked_embedding_lookup_sparse``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.ops.bags import (
    COMBINERS,
    Bags,
    bags_from_dense,
    bags_from_ragged,
    bags_from_sparse,
    lookup_bags,
    quantized_bag_sum,
    tensor_bag_sum,
)

__all__ = ["bag_call", "checked_combiner", "layer_bags"]


def checked_combiner(combiner: Any) -> str | None:
    """``combiner`` if it is None or one of ``COMBINERS``.

    Raises:
      ValueError (PartialEmbeddingArgumentError): it is neither.
    """
    if combiner is None or (isinstance(combiner, str) and combiner in COMBINERS):
        return combiner
    raise PartialEmbeddingArgumentError(
        f"combiner: {combiner!r} is not None, 'sum', 'mean' or 'sqrtn'"
    )


def _integer_ids(ids: Any) -> Any:
    """Ids as int32/int64 (other dtypes cast to int32, as the layer's lookup does)."""
    if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        if ids.dtype not in (tf.int32, tf.int64):
            return tf.cast(ids, tf.int32)
        return ids
    ids = tf.convert_to_tensor(ids)
    return ids if ids.dtype in (tf.int32, tf.int64) else tf.cast(ids, tf.int32)


def layer_bags(layer: Any, ids: Any, weights: Any) -> Bags:
    """The bags of the layer's input: rows of ragged, sparse or dense ids;
    padding (id 0 with ``mask_zero``) left out of dense ones."""
    ids = _integer_ids(ids)
    if isinstance(ids, tf.SparseTensor):
        return bags_from_sparse(ids, weights)
    if isinstance(ids, tf.RaggedTensor):
        return bags_from_ragged(ids, weights)
    if isinstance(weights, (tf.SparseTensor, tf.RaggedTensor)):
        raise PartialEmbeddingTypeError(
            f"weights: dense ids take dense weights of their shape, got {type(weights).__name__}"
        )
    return bags_from_dense(ids, padding=0 if layer.mask_zero else None, weights=weights)


def bag_call(layer: Any, ids: Any, weights: Any, training: Any = None) -> tf.Tensor:
    """The output ``[B, output_dim]`` of ``layer`` (a ``PartialEmbedding``
    with a combiner) for ``ids`` and ``weights``; a training call counts the
    bags' ids for row admission (padding and pruned ids left out)."""
    bags = layer_bags(layer, ids, weights)
    layer._observe(bags.ids, training, ignore_negative=True)
    combiner = layer.combiner
    if layer.quantization_mode is not None:
        return _quantized_bags(layer, bags, combiner)
    if framework_private.in_stateless_scope():
        # model.stateless_call: the variables' values come from the scope.
        return tensor_bag_sum(
            layer.embeddings.value,
            layer._training_mask.value,
            bags,
            layer.compute_dtype,
            combiner,
        )
    try:
        outputs = lookup_bags(layer.embeddings, bags, layer._training_mask, combiner)
    except PartialEmbeddingArgumentError as error:
        framework_private.keep_error_as_raised(error)
        raise
    return tf.cast(outputs, layer.compute_dtype)


def _quantized_bags(layer: Any, bags: Bags, combiner: str) -> tf.Tensor:
    """Bags of a quantized layer: float store rows where an id has one, int8
    rows elsewhere (``ops.bags.quantized_bag_sum``)."""
    stateless = framework_private.in_stateless_scope()

    def read(variable: Any) -> Any:
        return tf.convert_to_tensor(variable.value) if stateless else variable

    return quantized_bag_sum(
        read(layer._embeddings),
        read(layer.embeddings_scale),
        read(layer.float_rows),
        read(layer.float_rows_mask),
        read(layer.float_row_ids),
        read(layer.float_row_index),
        bags,
        combiner,
        layer.input_dim,
        layer.compute_dtype,
    )
