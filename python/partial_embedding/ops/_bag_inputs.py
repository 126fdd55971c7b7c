"""The bags of ``ops.bags``: ragged, sparse and padded dense ids as flat positions.

``Bags`` is what every path of ``masked_embedding_lookup_sparse`` takes: each
position's id and bag, its weight, and the number of bags. ``bags_from_*``
make it from the kinds of input and check them (kinds, dtypes, the weights'
structure).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from partial_embedding._internal.checks import index_tensor
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError

__all__ = [
    "COMBINERS",
    "Bags",
    "bags_from_dense",
    "bags_from_ragged",
    "bags_from_sparse",
    "bags_of",
    "check_combiner",
]

#: The combiners, as ``tf.nn.embedding_lookup_sparse`` names them.
COMBINERS = ("sum", "mean", "sqrtn")


class Bags(NamedTuple):
    """A batch of bags as flat positions.

    Attributes:
      ids: ``[N]`` int32 or int64 row ids; negative ones are pruned.
      bags: ``[N]`` int64, the bag of each position, never decreasing.
      weights: ``[N]`` float weights, or None (every weight 1).
      num_bags: int64 scalar ``B``.
      static_num_bags: ``B`` where it is known when tracing, else None.
    """

    ids: tf.Tensor
    bags: tf.Tensor
    weights: tf.Tensor | None
    num_bags: tf.Tensor
    static_num_bags: int | None


def check_combiner(combiner: Any) -> str:
    """``combiner`` if it is one of ``COMBINERS``.

    Raises:
      PartialEmbeddingArgumentError: it is not.
    """
    if not isinstance(combiner, str) or combiner not in COMBINERS:
        raise PartialEmbeddingArgumentError(
            f"combiner: {combiner!r} is not one of 'sum', 'mean' or 'sqrtn'"
        )
    return combiner


def _weights_tensor(weights: Any, argument: str) -> tf.Tensor:
    weights = tf.convert_to_tensor(weights)
    if not weights.dtype.is_floating:
        raise PartialEmbeddingTypeError(
            f"{argument}: dtype {weights.dtype.name} is not a floating-point type"
        )
    return weights


def bags_from_sparse(sp_ids: tf.SparseTensor, sp_weights: Any = None) -> Bags:
    """The bags of a ``[B, M]`` ``tf.SparseTensor`` of ids (row b: bag b), in
    canonical (row-major) order as ``tf.nn.embedding_lookup_sparse`` takes it;
    ``sp_weights`` a ``tf.SparseTensor`` with the same indices, or None."""
    ids = index_tensor(sp_ids.values, "sp_ids")
    shape = sp_ids.shape
    if shape.rank is not None and shape.rank != 2:
        raise PartialEmbeddingArgumentError(
            f"sp_ids: a SparseTensor of rank 2 ([bags, ids]) is needed, got shape {shape}"
        )
    weights = None
    if sp_weights is not None:
        if not isinstance(sp_weights, tf.SparseTensor):
            raise PartialEmbeddingTypeError(
                f"sp_weights: sp_ids is a SparseTensor, so sp_weights must be one too "
                f"(or None), got {type(sp_weights).__name__}"
            )
        weights = _weights_tensor(sp_weights.values, "sp_weights")
        if not weights.shape.is_compatible_with(ids.shape):
            raise PartialEmbeddingArgumentError(
                f"sp_weights: {weights.shape[0]} values for {ids.shape[0]} ids; "
                "it must have sp_ids' indices"
            )
        weights = _same_structure(
            weights, sp_ids.indices, sp_weights.indices, "sp_weights: must have sp_ids' indices"
        )
    num_bags = tf.cast(sp_ids.dense_shape[0], tf.int64)
    static = tf.get_static_value(sp_ids.dense_shape)
    return Bags(
        ids,
        tf.cast(sp_ids.indices[:, 0], tf.int64),
        weights,
        num_bags,
        None if static is None else int(static[0]),
    )


def bags_from_ragged(ids: tf.RaggedTensor, weights: Any = None) -> Bags:
    """The bags of a ``[B, None]`` ``tf.RaggedTensor`` of ids (row b: bag b);
    ``weights`` a ``tf.RaggedTensor`` with the same row lengths, or None."""
    if ids.ragged_rank != 1 or ids.shape.rank != 2:
        raise PartialEmbeddingArgumentError(
            f"sp_ids: a RaggedTensor of shape [bags, None] is needed, got shape {ids.shape}"
        )
    flat_ids = index_tensor(ids.values, "sp_ids")
    flat_weights = None
    if weights is not None:
        if not isinstance(weights, tf.RaggedTensor):
            raise PartialEmbeddingTypeError(
                f"sp_weights: sp_ids is a RaggedTensor, so sp_weights must be one too "
                f"(or None), got {type(weights).__name__}"
            )
        if weights.ragged_rank != 1 or weights.shape.rank != 2:
            raise PartialEmbeddingArgumentError(
                f"sp_weights: a RaggedTensor of shape [bags, None] is needed, got shape "
                f"{weights.shape}"
            )
        flat_weights = _same_structure(
            _weights_tensor(weights.values, "sp_weights"),
            ids.row_splits,
            weights.row_splits,
            "sp_weights: must have sp_ids' row lengths",
        )
    static = ids.shape[0]
    return Bags(
        flat_ids,
        tf.cast(ids.value_rowids(), tf.int64),
        flat_weights,
        tf.cast(ids.nrows(), tf.int64),
        static,
    )


def bags_from_dense(ids: tf.Tensor, padding: int | None = None, weights: Any = None) -> Bags:
    """The bags of ``[B, L]`` dense ids (row b: bag b), where ids equal to
    ``padding`` (if given) are left out, as negative ones are."""
    ids = index_tensor(ids, "ids")
    if ids.shape.rank is not None and ids.shape.rank != 2:
        raise PartialEmbeddingArgumentError(
            f"ids: dense ids of shape [bags, ids per bag] are needed, got shape {ids.shape}"
        )
    flat_ids = tf.reshape(ids, [-1])
    if padding is not None:
        flat_ids = tf.where(
            tf.equal(flat_ids, tf.cast(padding, ids.dtype)), tf.constant(-1, ids.dtype), flat_ids
        )
    shape = tf.shape(ids, out_type=tf.int64)
    # Row-major: position i is in bag i // L (two ops, where tf.repeat takes eight).
    bags = tf.math.floordiv(tf.range(shape[0] * shape[1]), tf.maximum(shape[1], 1))
    flat_weights = None
    if weights is not None:
        weights = _weights_tensor(weights, "weights")
        if not weights.shape.is_compatible_with(ids.shape):
            raise PartialEmbeddingArgumentError(
                f"weights: shape {weights.shape} must be the ids' shape {ids.shape}"
            )
        flat_weights = tf.reshape(weights, [-1])
    return Bags(flat_ids, bags, flat_weights, shape[0], ids.shape[0])


def _same_structure(
    weights: tf.Tensor, structure: tf.Tensor, weights_structure: tf.Tensor, message: str
) -> tf.Tensor:
    """``weights`` once ``weights_structure`` equals ``structure`` (the ids'
    indices or row splits); no check where they are the same tensor."""
    if weights_structure is structure:
        return weights
    if structure.shape.is_fully_defined() and weights_structure.shape.is_fully_defined():
        if structure.shape != weights_structure.shape:
            raise PartialEmbeddingArgumentError(message)
    same = tf.reduce_all(
        tf.equal(
            tf.reshape(tf.cast(structure, tf.int64), [-1]),
            tf.reshape(tf.cast(weights_structure, tf.int64), [-1]),
        )
    )
    if tf.executing_eagerly():
        if not bool(same):
            raise PartialEmbeddingArgumentError(message)
        return weights
    with tf.control_dependencies([tf.debugging.Assert(same, [message])]):
        return tf.identity(weights)


def bags_of(sp_ids: Any, sp_weights: Any) -> Bags:
    """The bags of ``masked_embedding_lookup_sparse``'s ``sp_ids`` and ``sp_weights``."""
    if isinstance(sp_ids, tf.SparseTensor):
        return bags_from_sparse(sp_ids, sp_weights)
    if isinstance(sp_ids, tf.RaggedTensor):
        return bags_from_ragged(sp_ids, sp_weights)
    raise PartialEmbeddingTypeError(
        f"sp_ids: expected a tf.SparseTensor or tf.RaggedTensor of ids, got "
        f"{type(sp_ids).__name__} (PartialEmbedding(combiner=...) also takes dense ids)"
    )
