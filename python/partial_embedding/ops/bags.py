"""Pooled lookups of bags of ids whose gradient reaches only permitted rows.

``masked_embedding_lookup_sparse`` is ``tf.nn.safe_embedding_lookup_sparse``
with a row mask: one vector per bag (the weighted sum, mean or sqrtn of its
rows), and a gradient that is an ``IndexedSlices`` over the batch's distinct
permitted rows, each summed straight from its bags' gradients, so no
``[ids, D]`` tensor is made on the way back. ``bags_from_sparse``,
``bags_from_ragged`` and ``bags_from_dense`` turn the kinds of input into the
flat ``Bags`` every path takes; ``lookup_bags`` runs one of them.

Where each path runs:

* CPU tables: two ops of the op library, ``EmbeddingBag`` (forward; it also
  checks every id and names the bag and place of a bad one) and
  ``MaskedEmbeddingBagGrad`` (the gradient), whose inputs are recorded
  (``bag_gradient_inputs``) so that ``MaskedOptimizer``'s Adam can take them
  instead, fused with the step (``ops.fused.masked_embedding_bag_apply_adam``).
* GPU tables: the forward pass from stock ops, the gradient from
  ``MaskedEmbeddingBagGrad`` (its GPU kernel where the library has CUDA).
* Functions traced for a SavedModel: stock ops only (rows gathered per id,
  frozen ones' gradient stopped), so that it serves without this library.
* XLA (``jit_compile=True``): stock ops with static shapes (see
  ``_xla_bag_sum``).
* A ``ShardedVariable``: each shard looks up its own ids, in its place.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal import xla as _xla
from partial_embedding._internal.context import in_xla_context, never_empty_across_replicas
from partial_embedding._internal.gradient_memo import GradientMemo
from partial_embedding._internal.types import RowMask, Variable
from partial_embedding._internal.variables import (
    gather_rows,
    masks_per_shard,
    on_each_device,
    shard_row_starts,
    sharded_variable,
)
from partial_embedding._loader import load_ops
from partial_embedding.ops._bag_inputs import (
    COMBINERS,
    Bags,
    bags_from_dense,
    bags_from_ragged,
    bags_from_sparse,
    bags_of,
    check_combiner,
)
from partial_embedding.ops.lookup import entry_stop_gradients, row_mask_source, table_variable
from partial_embedding.ops.quantized import stock_rows, store_rows_of

__all__ = [
    "COMBINERS",
    "BagGradientInputs",
    "Bags",
    "bag_gradient_inputs",
    "bags_from_dense",
    "bags_from_ragged",
    "bags_from_sparse",
    "check_combiner",
    "lookup_bags",
    "masked_embedding_lookup_sparse",
    "quantized_bag_sum",
    "tensor_bag_sum",
]


@tf.autograph.experimental.do_not_convert
def masked_embedding_lookup_sparse(
    params: Variable,
    sp_ids: tf.SparseTensor | tf.RaggedTensor,
    row_mask: RowMask,
    sp_weights: tf.SparseTensor | tf.RaggedTensor | None = None,
    combiner: str = "mean",
    name: str | None = None,
) -> tf.Tensor:
    """One vector per bag of ids; only rows where ``row_mask`` is true learn.

    The arguments of ``tf.nn.embedding_lookup_sparse`` plus the row mask. Bag
    ``b`` (row ``b`` of ``sp_ids``) gives ``sum_i w_i * params[id_i]`` over its
    ids (``w_i = 1`` without ``sp_weights``), divided by ``sum_i w_i`` for
    ``mean`` and by ``sqrt(sum_i w_i**2)`` for ``sqrtn``. Ids ``< 0`` are
    pruned and an empty bag gives zeros, as in
    ``tf.nn.safe_embedding_lookup_sparse``. The gradient with respect to
    ``params`` is a ``tf.IndexedSlices`` over the batch's distinct permitted
    rows, summed straight from the bags (no ``[number of ids, D]`` tensor).
    The contract (weights, precision, XLA, sharded tables): docs/bags.md.

    Args:
      params: A ``tf.Variable`` or Keras 3 variable ``[V, ...]`` of dtype
        float16, bfloat16, float32 or float64, or a ``ShardedVariable`` of one.
      sp_ids: The bags: a ``[B, M]`` ``tf.SparseTensor`` of int32 or int64
        ids in canonical order (row ``b`` is bag ``b``), or a ``[B, None]``
        ``tf.RaggedTensor``.
      row_mask: bool ``[V]``, true where a row may learn (tensor, array,
        list or variable; a variable is read when the step runs).
      sp_weights: None, or float weights of the same kind as ``sp_ids``
        with the same indices (row lengths).
      combiner: ``"sum"``, ``"mean"`` (the default) or ``"sqrtn"``.
      name: A name for the operation.

    Returns:
      ``[B] + params.shape[1:]``, of ``params``' dtype.

    Raises:
      PartialEmbeddingTypeError: ``params`` is not a variable; ``sp_ids`` or
        ``sp_weights`` of the wrong kind or dtype.
      PartialEmbeddingArgumentError: an unknown combiner; a mask or weights
        of the wrong shape.
      tf.errors.InvalidArgumentError: at run time, an id ``>= V``, named by
        its bag and place, before anything is computed (under XLA: pruned).

    >>> import tensorflow as tf, partial_embedding as pe
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    >>> ids = tf.ragged.constant([[0, 2], [], [1, 1, -1]])
    >>> with tf.GradientTape() as tape:
    ...     bags = pe.masked_embedding_lookup_sparse(
    ...         table, ids, row_mask=[True, False, True], combiner="mean")
    ...     loss = tf.reduce_sum(bags)
    >>> bags.numpy().tolist()
    [[2.0, 2.0], [0.0, 0.0], [2.0, 2.0]]
    >>> grad = tape.gradient(loss, table)
    >>> grad.indices.numpy().tolist(), grad.values.numpy().tolist()
    ([0, 2], [[0.5, 0.5], [0.5, 0.5]])
    """
    combiner = check_combiner(combiner)
    with tf.name_scope(name or "masked_embedding_lookup_sparse"):
        return lookup_bags(params, bags_of(sp_ids, sp_weights), row_mask, combiner)


@tf.autograph.experimental.do_not_convert
def lookup_bags(params: Variable, bags: Bags, row_mask: RowMask, combiner: str) -> tf.Tensor:
    """``masked_embedding_lookup_sparse`` of bags already made flat."""
    sharded = sharded_variable(params)
    if sharded is not None:
        return _lookup_per_shard(sharded, bags, row_mask, combiner)
    variable = table_variable(params)
    var_shape = variable.shape
    static_rows = var_shape[0] if var_shape.rank is not None else None
    mask_source = row_mask_source(row_mask, static_rows)
    result = _bag_sum(variable, mask_source, bags, combiner, checked=False)
    if var_shape.rank is not None:
        result.set_shape(tf.TensorShape([bags.static_num_bags]).concatenate(var_shape[1:]))
    return result


def _compute_dtype(dtype: tf.DType) -> tf.DType:
    """What the sums run in: float64 for float64 tables, else float32."""
    return tf.float64 if dtype == tf.float64 else tf.float32


def _kernel_applies(variable: tf.Variable) -> bool:
    """Whether the op library's forward op may run: a CPU table."""
    device = variable.device or ""
    return "GPU" not in device.upper()


def _num_rows(variable: tf.Variable, dtype: tf.DType) -> tf.Tensor:
    static = variable.shape[0] if variable.shape.rank is not None else None
    if static is not None:
        return tf.constant(static, dtype)
    return tf.cast(tf.shape(variable, out_type=tf.int64)[0], dtype)


def _full_mask(mask_source: tf.Variable | tf.Tensor) -> tf.Tensor:
    """The whole bool ``[V]`` mask (an aliasing read of a variable)."""
    if isinstance(mask_source, tf.Variable):
        return mask_source.value()
    return mask_source


def _bag_sum(
    variable: tf.Variable,
    mask_source: tf.Variable | tf.Tensor,
    bags: Bags,
    combiner: str,
    checked: bool,
) -> tf.Tensor:
    """The bags' vectors from one variable, by the path that applies.

    ``checked``: the ids are already known to be below V (the sharded and
    quantized paths check global ids first).
    """
    if in_xla_context():
        return _xla_bag_sum(variable, mask_source, bags, combiner)
    compute_dtype = _compute_dtype(variable.dtype)
    if framework_private.in_save_context():
        # Stock ops only, gradient included: the SavedModel serves (and
        # differentiates) where this library is not installed.
        return tensor_bag_sum(
            variable.value(), _full_mask(mask_source), bags, variable.dtype, combiner
        )
    if _kernel_applies(variable):
        return _kernel_bag_sum(variable, mask_source, bags, combiner, compute_dtype)
    ids = bags.ids
    if not checked:
        ids = checked_bag_ids(bags, _num_rows(variable, ids.dtype))
    factors = bag_factors(ids, bags, combiner, compute_dtype)
    return _stock_bag_sum(variable, mask_source, ids, bags, factors)


def _kernel_bag_sum(
    variable: tf.Variable,
    mask_source: tf.Variable | tf.Tensor,
    bags: Bags,
    combiner: str,
    compute_dtype: tf.DType,
) -> tf.Tensor:
    """The CPU path: EmbeddingBag forward, MaskedEmbeddingBagGrad backward."""
    ops = load_ops()
    weights = (
        tf.zeros([0], compute_dtype)
        if bags.weights is None
        else tf.cast(bags.weights, compute_dtype)
    )
    table = variable.value()

    @tf.custom_gradient
    def embedding_bag(table: tf.Tensor) -> tuple[tf.Tensor, Any]:
        output, factors = ops.partial_embedding_embedding_bag(
            params=table,
            ids=bags.ids,
            bags=bags.bags,
            num_bags=bags.num_bags,
            weights=weights,
            combiner=combiner,
        )

        def gradient(upstream: tf.Tensor) -> tf.IndexedSlices:
            return _sparse_gradient(table, upstream, bags, factors, mask_source, remember=True)

        return output, gradient

    return embedding_bag(table)


def _sparse_gradient(
    table: tf.Tensor,
    upstream: tf.Tensor,
    bags: Bags,
    factors: tf.Tensor,
    mask_source: tf.Variable | tf.Tensor,
    remember: bool = False,
) -> tf.IndexedSlices:
    """MaskedEmbeddingBagGrad: the distinct permitted rows and their sums.

    ``remember``: record the op's inputs for ``bag_gradient_inputs`` (the
    CPU path, where the fused bag backward + Adam can take them instead).
    """
    grad = tf.cast(upstream, table.dtype)
    rows, values = load_ops().partial_embedding_masked_embedding_bag_grad(
        grad=grad,
        ids=bags.ids,
        bags=bags.bags,
        factors=factors,
        row_mask=_full_mask(mask_source),
    )
    # Empty only when no id is permitted: every unpruned id is then frozen.
    unpruned = (
        tf.boolean_mask(bags.ids, bags.ids >= 0) if tf.distribute.has_strategy() else bags.ids
    )
    values, rows = never_empty_across_replicas(values, rows, unpruned)
    if remember:
        _remember_bag_gradient(
            values, rows, BagGradientInputs(grad, bags.ids, bags.bags, factors, mask_source)
        )
    return tf.IndexedSlices(values, rows, tf.shape(table, out_type=rows.dtype))


class BagGradientInputs(NamedTuple):
    """What ``MaskedEmbeddingBagGrad`` made a bag gradient from.

    Attributes:
      grad: ``[B] + row_shape``, the bags' gradient, of the table's dtype.
      ids: ``[N]`` the ids of every position (negative: pruned).
      bags: ``[N]`` int64, the bag of each position.
      factors: ``[N]``, ``EmbeddingBag``'s factors.
      mask_source: The row mask the gradient kept rows by: a variable (read
        when the step runs) or a bool tensor.
    """

    grad: tf.Tensor
    ids: tf.Tensor
    bags: tf.Tensor
    factors: tf.Tensor
    mask_source: Any


#: The bag gradient op's inputs, for each bag gradient built in a graph.
_BAG_GRADIENTS = GradientMemo()


def _remember_bag_gradient(values: tf.Tensor, rows: tf.Tensor, inputs: BagGradientInputs) -> None:
    """Records what ``bag_gradient_inputs`` returns for ``(values, rows)``;
    only in a graph, where the gradient op is left out (pruned) when nothing
    else reads its outputs."""
    _BAG_GRADIENTS.remember(values, rows, *inputs)


def bag_gradient_inputs(values: Any, indices: Any) -> BagGradientInputs | None:
    """The inputs ``MaskedEmbeddingBagGrad`` made ``(values, indices)`` from.

    For a consumer that can sum each row's gradient from the bags itself
    (the fused bag backward + Adam): it then reads the bags' gradient in
    place, and the gradient op, left without readers, is pruned from the
    graph.

    Returns:
      The inputs, where ``values`` and ``indices`` are exactly the tensors a
      CPU table's bag lookup built in the current graph; else None.
    """
    inputs = _BAG_GRADIENTS.recall(values, indices)
    return None if inputs is None else BagGradientInputs(*inputs)


def checked_bag_ids(bags: Bags, num_rows: tf.Tensor) -> tf.Tensor:
    """``bags.ids`` once each is known to be below ``num_rows``, for the
    paths of stock ops; the error names the bag and place of the first bad
    one, as the op library's does."""
    ids = bags.ids
    bad = ids >= num_rows

    def message() -> tf.Tensor:
        position = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
        bag = bags.bags[position]
        # Bags never decrease: the bag's first position is how many come before it.
        place = position - tf.reduce_sum(tf.cast(bags.bags < bag, tf.int64))
        return tf.strings.format(
            "sp_ids: bag {}, position {} = {} is not in [0, {})",
            (bag, place, ids[position], num_rows),
        )

    any_bad = tf.reduce_any(bad)
    if tf.executing_eagerly():
        if bool(any_bad):
            raise tf.errors.InvalidArgumentError(None, None, message().numpy().decode())
        return ids
    check = tf.debugging.Assert(
        tf.logical_not(any_bad), [tf.cond(any_bad, message, lambda: tf.constant(""))]
    )
    with tf.control_dependencies([check]):
        return tf.identity(ids)


def bag_factors(ids: tf.Tensor, bags: Bags, combiner: str, compute_dtype: tf.DType) -> tf.Tensor:
    """Each position's factor ``w_i * scale[bag]`` with stock ops (0 for a
    pruned id): what ``EmbeddingBag`` outputs as ``factors``."""
    kept = ids >= 0
    if bags.weights is None:
        weights = tf.cast(kept, compute_dtype)
    else:
        weights = tf.where(kept, tf.cast(bags.weights, compute_dtype), tf.zeros([], compute_dtype))
    if combiner == "sum":
        return weights
    terms = weights if combiner == "mean" else tf.square(weights)
    sums = tf.math.unsorted_segment_sum(terms, bags.bags, bags.num_bags)
    if combiner == "sqrtn":
        sums = tf.sqrt(sums)
    scale = tf.math.divide_no_nan(tf.ones([], compute_dtype), sums)
    return weights * tf.gather(scale, bags.bags)


def _row_shaped(factors: tf.Tensor, rank: int) -> tf.Tensor:
    """``factors`` ``[N]`` reshaped to broadcast over rows of rank ``rank - 1``."""
    return tf.reshape(factors, tf.concat([tf.shape(factors), tf.ones([rank - 1], tf.int32)], 0))


def _stock_bag_sum(
    variable: tf.Variable,
    mask_source: tf.Variable | tf.Tensor,
    ids: tf.Tensor,
    bags: Bags,
    factors: tf.Tensor,
) -> tf.Tensor:
    """The forward pass from stock ops (GPU tables), with
    MaskedEmbeddingBagGrad as the gradient. ``ids`` must be below V."""
    table = variable.value()

    @tf.custom_gradient
    def embedding_bag(table: tf.Tensor) -> tuple[tf.Tensor, Any]:
        rows = tf.gather(table, tf.maximum(ids, 0))
        weighted = tf.cast(rows, factors.dtype) * _row_shaped(factors, rows.shape.rank)
        output = tf.math.unsorted_segment_sum(weighted, bags.bags, bags.num_bags)

        def gradient(upstream: tf.Tensor) -> tf.IndexedSlices:
            checked = Bags(ids, bags.bags, bags.weights, bags.num_bags, bags.static_num_bags)
            return _sparse_gradient(table, upstream, checked, factors, mask_source)

        return tf.cast(output, table.dtype), gradient

    return embedding_bag(table)


def _xla_bag_sum(
    variable: tf.Variable,
    mask_source: tf.Variable | tf.Tensor,
    bags: Bags,
    combiner: str,
) -> tf.Tensor:
    """The XLA path: stock ops with static shapes, no run-time error.

    An id outside ``[0, V)`` is pruned. The gradient is ``S @ grad`` over
    every row (``S[row, bag]``: the sum of the bag's factors of that
    permitted row) where the table has no more rows than there are ids,
    else one row per id (zero for frozen and pruned ones); never a
    per-id copy of the bags' gradients followed by a sum.
    """
    num_rows = _num_rows(variable, bags.ids.dtype)
    rows, valid, permitted = _xla.valid_rows(
        bags.ids,
        num_rows,
        lambda rows: (
            gather_rows(mask_source, rows)
            if isinstance(mask_source, tf.Variable)
            else tf.gather(mask_source, rows)
        ),
    )
    compute_dtype = _compute_dtype(variable.dtype)
    factors = bag_factors(tf.where(valid, rows, -1), bags, combiner, compute_dtype)
    learning = tf.where(permitted, factors, tf.zeros([], compute_dtype))
    static_rows = variable.shape[0] if variable.shape.rank is not None else None
    static_ids = bags.ids.shape[0]
    per_row = static_rows is not None and static_ids is not None and static_rows <= static_ids
    num_rows = _num_rows(variable, rows.dtype)
    table = variable.value()

    @tf.custom_gradient
    def embedding_bag(table: tf.Tensor) -> tuple[tf.Tensor, Any]:
        gathered = tf.cast(tf.gather(table, rows), compute_dtype)
        weighted = gathered * _row_shaped(factors, gathered.shape.rank)
        output = tf.math.unsorted_segment_sum(weighted, bags.bags, bags.num_bags)

        def gradient(upstream: tf.Tensor) -> tf.IndexedSlices:
            upstream = tf.cast(upstream, compute_dtype)
            if per_row:
                return _xla_gradient_per_row(table, upstream, rows, permitted, bags, learning)
            values = tf.gather(upstream, bags.bags) * _row_shaped(learning, upstream.shape.rank)
            # Frozen, pruned and bad ids name no row (V: out of range, which
            # XLA's scatters and MaskedOptimizer skip), so that no row the
            # batch does not train takes a step with a zero gradient.
            return tf.IndexedSlices(
                tf.cast(values, table.dtype),
                _xla.gradient_rows(rows, permitted, num_rows),
                tf.shape(table, out_type=rows.dtype),
            )

        return tf.cast(output, table.dtype), gradient

    return embedding_bag(table)


def _xla_gradient_per_row(
    table: tf.Tensor,
    upstream: tf.Tensor,
    rows: tf.Tensor,
    permitted: tf.Tensor,
    bags: Bags,
    learning: tf.Tensor,
) -> tf.IndexedSlices:
    """``S @ upstream`` over every row of the table: ``S[r, b]`` sums the
    factors of row r's permitted occurrences in bag b. Rows the batch does
    not train are numbered V (out of range: skipped), so that they take no
    step with a zero gradient."""
    num_rows = tf.shape(table, out_type=tf.int64)[0]
    rows = tf.cast(rows, tf.int64)
    matrix = tf.scatter_nd(
        tf.stack([rows, bags.bags], axis=1), learning, tf.stack([num_rows, bags.num_bags])
    )
    flat = tf.reshape(upstream, tf.stack([bags.num_bags, -1]))
    values = tf.reshape(tf.matmul(matrix, flat), tf.shape(table))
    trained = tf.scatter_nd(
        tf.expand_dims(rows, 1), tf.cast(permitted, tf.int32), tf.expand_dims(num_rows, 0)
    )
    indices = _xla.gradient_rows(tf.range(num_rows), trained > 0, num_rows)
    return tf.IndexedSlices(
        tf.cast(values, table.dtype),
        tf.cast(indices, bags.ids.dtype),
        tf.shape(table, out_type=bags.ids.dtype),
    )


@tf.autograph.experimental.do_not_convert
def _lookup_per_shard(sharded: Any, bags: Bags, row_mask: Any, combiner: str) -> tf.Tensor:
    """``lookup_bags`` on a ShardedVariable: every id is checked against the
    whole table, the factors are the whole bags', and each shard adds its own
    ids' rows into the bags (local ids), on its device."""
    shards = list(sharded.variables)
    starts = shard_row_starts(shards)
    masks = masks_per_shard(row_mask, starts)
    ids = checked_bag_ids(bags, tf.constant(starts[-1], bags.ids.dtype))
    factors = bag_factors(ids, bags, combiner, _compute_dtype(shards[0].dtype))
    owner = tf.searchsorted(
        tf.constant(starts[1:-1], dtype=ids.dtype), ids, side="right", out_type=tf.int32
    )
    positions = tf.dynamic_partition(tf.range(tf.size(ids, out_type=tf.int32)), owner, len(shards))

    def shard_bags(
        shard: tf.Variable, mask: Any, shard_positions: tf.Tensor, start: int
    ) -> tf.Tensor:
        # A negative id goes to the first shard and stays negative there: pruned.
        local = Bags(
            tf.gather(ids, shard_positions) - tf.cast(start, ids.dtype),
            tf.gather(bags.bags, shard_positions),
            tf.gather(factors, shard_positions),
            bags.num_bags,
            bags.static_num_bags,
        )
        source = row_mask_source(mask, shard.shape[0])
        return _bag_sum(shard, source, local, "sum", checked=True)

    parts = on_each_device(shards, shard_bags, masks, positions, starts[:-1])
    result = tf.add_n(parts)
    result.set_shape(tf.TensorShape([bags.static_num_bags]).concatenate(shards[0].shape[1:]))
    return result


def quantized_bag_sum(
    codes: Any,
    scales: Any,
    store: Any,
    store_mask: Any,
    sorted_ids: Any,
    store_index: Any,
    bags: Bags,
    combiner: str,
    num_rows: int,
    compute_dtype: Any,
) -> tf.Tensor:
    """The bags' vectors from a quantized partial table (``ops.quantized``):
    ids with a float store row sum their store rows, through
    ``lookup_bags`` on the store (so the gradient reaches the store's
    permitted rows only, summed from the bags), the others their dequantized
    int8 rows (no gradient).

    Args:
      codes, scales, store, store_mask, sorted_ids, store_index: As
        ``quantized_lookup`` takes them (the store a variable, or a tensor in a
        stateless call, where frozen occurrences are stopped instead).
      bags: The bags, ids in the table's numbering.
      combiner: One of ``COMBINERS``.
      num_rows: The table's rows ``V``.
      compute_dtype: The dtype of the result.

    Returns:
      ``[B, D]`` of ``compute_dtype``.
    """
    compute_dtype = tf.as_dtype(compute_dtype)
    ids = bags.ids
    if not in_xla_context():
        ids = checked_bag_ids(bags, tf.constant(num_rows, ids.dtype))
    valid = tf.logical_and(ids >= 0, ids < num_rows)
    sum_dtype = _compute_dtype(compute_dtype)
    factors = bag_factors(tf.where(valid, ids, -1), bags, combiner, sum_dtype)
    safe = tf.where(valid, ids, tf.zeros([], ids.dtype))
    sorted_ids = tf.convert_to_tensor(sorted_ids)
    store_rows = store_rows_of(sorted_ids, tf.convert_to_tensor(store_index), safe)
    has_row = tf.logical_and(
        valid, tf.not_equal(store_rows, tf.shape(sorted_ids, out_type=store_rows.dtype)[0] - 1)
    )
    in_store = Bags(
        tf.where(has_row, store_rows, -1), bags.bags, factors, bags.num_bags, bags.static_num_bags
    )
    if isinstance(store, tf.Variable) or hasattr(store, "assign"):
        trained = lookup_bags(store, in_store, store_mask, "sum")
    else:
        trained = tensor_bag_sum(store, store_mask, in_store, sum_dtype)
    frozen_factors = tf.where(has_row, tf.zeros([], sum_dtype), factors)
    dequantized = tf.cast(stock_rows(codes, scales, safe, sum_dtype), sum_dtype)
    frozen = tf.math.unsorted_segment_sum(
        dequantized * _row_shaped(frozen_factors, dequantized.shape.rank),
        bags.bags,
        bags.num_bags,
    )
    return tf.cast(tf.cast(trained, sum_dtype) + frozen, compute_dtype)


def tensor_bag_sum(
    table: Any, row_mask: Any, bags: Bags, compute_dtype: Any, combiner: str = "sum"
) -> tf.Tensor:
    """The bags' vectors from a table given as a tensor (``model.stateless_call``
    reads variables as tensors): rows gathered per id, their gradient stopped
    where the mask is false (``entry_stop_gradients``), then summed into the
    bags. ``bags.weights`` are the weights of ``combiner``."""
    table = tf.convert_to_tensor(table)
    compute_dtype = tf.as_dtype(compute_dtype)
    factors = bag_factors(bags.ids, bags, combiner, _compute_dtype(compute_dtype))
    safe = tf.maximum(bags.ids, 0)
    permitted = tf.gather(tf.convert_to_tensor(row_mask), safe)
    rows = entry_stop_gradients(tf.gather(table, safe), tf.expand_dims(permitted, -1))
    rows = tf.cast(rows, factors.dtype)
    summed = tf.math.unsorted_segment_sum(
        rows * _row_shaped(factors, rows.shape.rank), bags.bags, bags.num_bags
    )
    return tf.cast(summed, compute_dtype)
