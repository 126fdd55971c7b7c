"""Fused optimizer rules: one op per step for the permitted rows.

``masked_sparse_apply_adam`` is the lazy Adam (AdamW, AMSGrad) step that
``MaskedOptimizer`` runs without XLA, on the CPU and (with the CUDA kernels)
on a GPU; its hyperparameters are converted here as Keras' own rules round
them.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from partial_embedding._build_info import check_variable_placement
from partial_embedding._internal.adam_inputs import adam_scalars, slot_index_tensor
from partial_embedding._internal.checks import (
    RowUpdateArguments,
    check_dtype_matches,
    check_table_dtype,
    index_tensor,
    row_mask_tensor,
    row_update_tensors,
    shape_text,
    to_tensor_keeping_dtype,
)
from partial_embedding._internal.context import in_xla_context, update_result
from partial_embedding._internal.types import RowMask, Scalar, TensorLike, Variable
from partial_embedding._internal.variables import resolve_variable
from partial_embedding._loader import load_ops
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError

__all__ = ["masked_embedding_bag_apply_adam", "masked_sparse_apply_adam"]

_ARGUMENTS = RowUpdateArguments(
    table="var",
    updates="grad",
    table_owner="var's",
    table_in_formula="var",
    check_mask_rank=False,
)


@tf.autograph.experimental.do_not_convert
def masked_sparse_apply_adam(
    var: Variable,
    m: Variable,
    v: Variable,
    indices: TensorLike,
    grad: TensorLike,
    row_mask: RowMask,
    *,
    learning_rate: Scalar,
    beta_1: Scalar,
    beta_2: Scalar,
    epsilon: Scalar,
    alpha: Scalar,
    weight_decay: Scalar = 0.0,
    v_hat: Variable | None = None,
    slot_indices: TensorLike = None,
    use_locking: bool = True,
    name: str | None = None,
) -> tf.Operation | None:
    """Lazy Adam step on the permitted rows of a raw sparse gradient, fused.

    The kernel behind ``MaskedOptimizer``'s Adam and AdamW: one op that
    sums the gradient rows of each distinct row id (in position order), skips
    rows whose mask is false (the variable and its slots stay untouched, bit
    for bit), and updates each remaining row of ``var``, ``m``, ``v`` (and
    ``v_hat``) in one pass::

        if weight_decay != 0: var[r] -= (var[r] * weight_decay) * learning_rate
        m[r] += (g - m[r]) * (1 - beta_1)
        v[r] += (g * g - v[r]) * (1 - beta_2)
        if v_hat is not None: v_hat[r] = max(v_hat[r], v[r])  # used below
        var[r] -= (m[r] * alpha) / (sqrt(v[r]) + epsilon)

    Each operation rounds to the variable's dtype in this order, so the result
    is bit for bit that of the same separate TensorFlow ops. Rows absent from
    ``indices`` are not touched (the update is lazy, like TF's
    ``SparseApplyAdam`` and PyTorch's ``SparseAdam``). Every index is checked
    against ``[0, V)`` before anything is written. Buffers are written in
    place (copied only where a reader still holds one), never switched into
    copy-on-read mode. The variables live on the CPU or, in a build with the
    CUDA kernels, on a GPU. On a GPU a row's gradient rows are summed in
    pieces of 32 occurrences (in position order within a piece, then piece by
    piece): a row with at most 32 gets the CPU kernel's bits, a hotter one a
    fixed grouping of the same sum; results are bit-identical from run to run.

    Compact slots: given ``slot_indices`` (the slot row of each position of
    ``indices``), ``m``, ``v`` and ``v_hat`` have ``S`` rows, any ``S >= 1``
    (e.g. one per row that may ever be permitted, far fewer than ``V``), and
    row ``r`` at position ``k`` uses slot row ``s = slot_indices[k]``: the
    same step with ``m[s]``, ``v[s]``, ``v_hat[s]`` in place of ``m[r]``,
    ``v[r]``, ``v_hat[r]``, bit for bit what full-size slots holding those
    values give. Every occurrence of a permitted row must name the same slot
    row and two permitted rows must not share one; frozen rows' slot indices
    are only checked to lie in ``[0, S)``.

    Hyperparameters may be tensors, so changing values (learning-rate
    schedules, the step count in ``alpha``) do not retrace. Python numbers are
    converted to the variable's dtype directly; ``1 - beta`` of a Python
    ``beta`` is computed in Python, as Keras' Adam does.

    Args:
      var: A ``tf.Variable`` or Keras 3 variable, ``[V, ...]``, of dtype
        float16, bfloat16, float32 or float64.
      m, v: The first and second moment slots: variables of ``var``'s dtype
        and shape, or, with ``slot_indices``, of shape ``[S] + var.shape[1:]``.
      indices: int32 or int64 row numbers, any shape; duplicates allowed.
      grad: ``indices.shape + var.shape[1:]``, of ``var``'s dtype: the raw
        gradient rows, e.g. a ``tf.IndexedSlices``' ``values``.
      row_mask: bool ``[V]`` (tensor, array or variable); true where a row
        may be written.
      learning_rate: Scalar; used by weight decay only (``alpha`` carries the
        step size).
      beta_1, beta_2: Scalar moment decay rates.
      epsilon: Scalar added to the square root of the second moment.
      alpha: Scalar step size with bias correction,
        ``learning_rate * sqrt(1 - beta_2**t) / (1 - beta_1**t)``.
      weight_decay: Scalar decoupled weight decay; 0 (the default) for none.
      v_hat: The AMSGrad slot (running maximum of ``v``), of ``m``'s shape,
        or None for Adam.
      slot_indices: None (each row's slots are its own row), or the slot row
        of each position: ``indices``' shape and dtype, each in ``[0, S)``.
      use_locking: Accepted for symmetry with TF's apply ops; the variables'
        locks are always held for the whole update (taken in address order).
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode; ``None`` eagerly and inside
      ``tf.function``.

    Raises:
      PartialEmbeddingTypeError: a variable is not a resource variable, or a
        dtype is wrong.
      PartialEmbeddingArgumentError: a shape already known to be wrong, or
        the call is being compiled with XLA (the fused kernel has no XLA
        version; ``MaskedOptimizer`` uses its composed rule there).
      tf.errors.InvalidArgumentError: at run time, an index outside
        ``[0, V)``, a slot index outside ``[0, S)``, a row given two slot
        rows or two rows given one, a shape or dtype mismatch, or the same
        variable passed twice. Nothing is written.
      tf.errors.FailedPreconditionError or tf.errors.NotFoundError: a variable
        is not initialized.

    >>> import tensorflow as tf
    >>> from partial_embedding.ops import masked_sparse_apply_adam
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=tf.float64)
    >>> m = tf.Variable(tf.zeros([3, 2], tf.float64))
    >>> v = tf.Variable(tf.zeros([3, 2], tf.float64))
    >>> grad = tf.ones([3, 2], tf.float64)
    >>> masked_sparse_apply_adam(table, m, v, [0, 1, 0], grad,
    ...                          [True, False, True], learning_rate=0.1,
    ...                          beta_1=0.9, beta_2=0.999, epsilon=1e-7,
    ...                          alpha=0.1)
    >>> table.numpy().round(4).tolist()
    [[0.6838, 0.6838], [2.0, 2.0], [3.0, 3.0]]
    >>> m.numpy().round(4).tolist()
    [[0.2, 0.2], [0.0, 0.0], [0.0, 0.0]]

    The same step with compact slots: one slot row for row 0 (row 1 is
    frozen; its slot index only needs to be in range).

    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=tf.float64)
    >>> m = tf.Variable(tf.zeros([1, 2], tf.float64))
    >>> v = tf.Variable(tf.zeros([1, 2], tf.float64))
    >>> masked_sparse_apply_adam(table, m, v, [0, 1, 0], grad,
    ...                          [True, False, True], learning_rate=0.1,
    ...                          beta_1=0.9, beta_2=0.999, epsilon=1e-7,
    ...                          alpha=0.1, slot_indices=[0, 0, 0])
    >>> table.numpy().round(4).tolist()
    [[0.6838, 0.6838], [2.0, 2.0], [3.0, 3.0]]
    >>> m.numpy().round(4).tolist()
    [[0.2, 0.2]]
    """
    if in_xla_context():
        raise PartialEmbeddingArgumentError(
            "masked_sparse_apply_adam has no XLA version (jit_compile=True): "
            "compile without XLA, or let MaskedOptimizer(keras.optimizers.Adam()) "
            "apply Adam, which uses stock ops under XLA"
        )
    table = resolve_variable(var, "var")
    dtype = table.dtype.base_dtype
    check_table_dtype(dtype, "var")
    slots = _slot_variables(
        table,
        {"m": m, "v": v} if v_hat is None else {"m": m, "v": v, "v_hat": v_hat},
        compact=slot_indices is not None,
    )
    with tf.name_scope(name or "masked_sparse_apply_adam"):
        indices, grad, row_mask = row_update_tensors(table, indices, grad, row_mask, _ARGUMENTS)
        scalars = adam_scalars(dtype, learning_rate, beta_1, beta_2, epsilon, alpha, weight_decay)
        inputs = dict(
            var=table.handle,
            m=slots["m"].handle,
            v=slots["v"].handle,
            # Without AMSGrad the kernel does not look v_hat up; v fills the slot.
            v_hat=slots.get("v_hat", slots["v"]).handle,
            indices=indices,
            grad=grad,
            row_mask=row_mask,
            amsgrad=v_hat is not None,
            use_locking=use_locking,
            **scalars,
        )
        check_variable_placement("MaskedSparseApplyAdam", table, "var")
        ops = load_ops()
        if slot_indices is None:
            op = ops.partial_embedding_masked_sparse_apply_adam(**inputs)
        else:
            op = ops.partial_embedding_masked_sparse_apply_adam_with_slot_indices(
                slot_indices=slot_index_tensor(slot_indices, indices), **inputs
            )
    return update_result(op)


@tf.autograph.experimental.do_not_convert
def masked_embedding_bag_apply_adam(
    var: Variable,
    m: Variable,
    v: Variable,
    grad: TensorLike,
    ids: TensorLike,
    bags: TensorLike,
    factors: TensorLike,
    row_mask: RowMask,
    *,
    learning_rate: Scalar,
    beta_1: Scalar,
    beta_2: Scalar,
    epsilon: Scalar,
    alpha: Scalar,
    weight_decay: Scalar = 0.0,
    v_hat: Variable | None = None,
    slot_of_row: Variable | None = None,
    slot_rows_used: Variable | None = None,
    name: str | None = None,
) -> tf.Operation | None:
    """The bag gradient and the lazy Adam step of its rows, fused (CPU).

    What ``MaskedOptimizer`` runs for a CPU table looked up by
    ``masked_embedding_lookup_sparse`` (Adam, AdamW, AMSGrad, no clipping):
    one op in place of ``MaskedEmbeddingBagGrad`` and
    :func:`masked_sparse_apply_adam`. Each distinct permitted id's gradient
    ``sum_i factors[i] * grad[bags[i]]`` (over its positions, in position
    order) is summed where the step uses it and never written out; the
    result is bit for bit that of the two ops.

    Compact slots (``slot_of_row`` and ``slot_rows_used`` given, as
    ``MaskedOptimizer`` keeps them): ``m``, ``v`` (and ``v_hat``) hold ``S``
    slot rows, ``slot_of_row`` (float32 ``[V]``) gives each row its slot row
    (negative: none yet) and ``slot_rows_used`` (int64 scalar) counts those
    taken. A permitted row of the batch without a slot row takes the next
    free one, in order of first occurrence, with zero moments; the slots grow
    (by half, or to what is needed) when full (make them with rows of unknown
    number, ``shape=[None, ...]``, as ``MaskedOptimizer``'s are). Every id, bag and slot row is
    checked before anything is written.

    Args:
      var: The table, a CPU ``tf.Variable`` or Keras 3 variable ``[V, ...]``.
      m, v: The moments: of ``var``'s shape, or ``[S] + var.shape[1:]``
        with a slot map.
      grad: ``[B] + var.shape[1:]``, the bags' gradient, of ``var``'s dtype.
      ids: int32 or int64 ``[N]``, each ``< V`` (negative: pruned).
      bags: int64 ``[N]``, each position's bag in ``[0, B)``.
      factors: ``[N]``, the bag lookup's factors (float32; float64 for a
        float64 table).
      row_mask: bool ``[V]``; true where a row may be written.
      learning_rate, beta_1, beta_2, epsilon, alpha, weight_decay: As
        :func:`masked_sparse_apply_adam` takes them.
      v_hat: The AMSGrad slot, or None for Adam.
      slot_of_row, slot_rows_used: The slot map, or None (both) for
        full-size slots.
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode; ``None`` eagerly and
      inside ``tf.function``.

    Raises:
      PartialEmbeddingTypeError: a variable is not a resource variable, or a
        dtype is wrong.
      PartialEmbeddingArgumentError: a shape already known to be wrong; only
        one of ``slot_of_row`` and ``slot_rows_used``; under XLA.
      tf.errors.InvalidArgumentError: at run time, an id ``>= V`` (named by
        its bag and place), a bag out of range, a slot row out of range or
        shared; nothing is written.

    >>> import tensorflow as tf
    >>> from partial_embedding.ops.fused import masked_embedding_bag_apply_adam
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=tf.float64)
    >>> m = tf.Variable(tf.zeros([1, 2], tf.float64))
    >>> v = tf.Variable(tf.zeros([1, 2], tf.float64))
    >>> slot_of_row = tf.Variable([-1.0, -1.0, -1.0])
    >>> used = tf.Variable(0, dtype=tf.int64)
    >>> masked_embedding_bag_apply_adam(
    ...     table, m, v, grad=tf.ones([2, 2], tf.float64), ids=[0, 1, 0],
    ...     bags=tf.constant([0, 0, 1], tf.int64), factors=[0.5, 0.5, 1.0],
    ...     row_mask=[True, False, True], learning_rate=0.1, beta_1=0.9,
    ...     beta_2=0.999, epsilon=1e-7, alpha=0.1, slot_of_row=slot_of_row,
    ...     slot_rows_used=used)
    >>> table.numpy().round(4).tolist()
    [[0.6838, 0.6838], [2.0, 2.0], [3.0, 3.0]]
    >>> m.numpy().round(4).tolist()
    [[0.15, 0.15]]
    >>> slot_of_row.numpy().tolist(), int(used.numpy())
    ([0.0, -1.0, -1.0], 1)
    """
    table, slots = _bag_variables(var, m, v, v_hat, slot_of_row, slot_rows_used)
    dtype = table.dtype.base_dtype
    with tf.name_scope(name or "masked_embedding_bag_apply_adam"):
        inputs = dict(
            var=table.handle,
            m=slots["m"].handle,
            v=slots["v"].handle,
            # Without AMSGrad the kernel does not look v_hat up; v fills the slot.
            v_hat=slots.get("v_hat", slots["v"]).handle,
            **_bag_tensors(dtype, grad, ids, bags, factors),
            row_mask=row_mask_tensor(row_mask),
            amsgrad=v_hat is not None,
            **adam_scalars(dtype, learning_rate, beta_1, beta_2, epsilon, alpha, weight_decay),
        )
        ops = load_ops()
        if slot_of_row is None:
            op = ops.partial_embedding_masked_embedding_bag_apply_adam(**inputs)
        else:
            op = ops.partial_embedding_masked_embedding_bag_apply_adam_with_slot_map(
                slot_of_row=resolve_variable(slot_of_row, "slot_of_row").handle,
                slot_rows_used=resolve_variable(slot_rows_used, "slot_rows_used").handle,
                **inputs,
            )
    return update_result(op)


def _bag_variables(
    var: Any, m: Any, v: Any, v_hat: Any, slot_of_row: Any, slot_rows_used: Any
) -> tuple[tf.Variable, dict[str, tf.Variable]]:
    """The fused bag op's table and slots, checked: not under XLA, a CPU
    table of a supported dtype, slots of its shape (or compact ones with
    both parts of the slot map)."""
    if in_xla_context():
        raise PartialEmbeddingArgumentError(
            "masked_embedding_bag_apply_adam has no XLA version (jit_compile=True)"
        )
    if (slot_of_row is None) != (slot_rows_used is None):
        raise PartialEmbeddingArgumentError(
            "slot_of_row and slot_rows_used: give both (compact slots) or neither"
        )
    table = resolve_variable(var, "var")
    check_table_dtype(table.dtype.base_dtype, "var")
    if "GPU" in (table.device or "").upper():
        raise PartialEmbeddingArgumentError(
            f"var: masked_embedding_bag_apply_adam runs on the CPU only; var is on {table.device}"
        )
    slots = _slot_variables(
        table,
        {"m": m, "v": v} if v_hat is None else {"m": m, "v": v, "v_hat": v_hat},
        compact=slot_of_row is not None,
    )
    return table, slots


def _bag_tensors(
    dtype: tf.DType, grad: Any, ids: Any, bags: Any, factors: Any
) -> dict[str, tf.Tensor]:
    """The bag gradient's inputs of the fused bag op, converted and checked:
    grad of the table's dtype, int32/int64 ids, int64 bags, factors of the
    compute dtype (float64 for float64 tables, else float32)."""
    grad = to_tensor_keeping_dtype(grad, dtype)
    check_dtype_matches("grad", grad.dtype.base_dtype, dtype, _ARGUMENTS.table_owner)
    compute_dtype = tf.float64 if dtype == tf.float64 else tf.float32
    factors = to_tensor_keeping_dtype(factors, compute_dtype)
    check_dtype_matches("factors", factors.dtype.base_dtype, compute_dtype, "the compute")
    bags = to_tensor_keeping_dtype(bags, tf.int64)
    if bags.dtype != tf.int64:
        raise PartialEmbeddingTypeError(f"bags: dtype {bags.dtype.name} must be int64")
    return {"grad": grad, "ids": index_tensor(ids, "ids"), "bags": bags, "factors": factors}


def _slot_variables(
    table: tf.Variable, slots: dict[str, Any], compact: bool
) -> dict[str, tf.Variable]:
    """The variables behind ``slots``, each checked to have ``table``'s dtype
    and shape, or, when ``compact``, ``[S] + table.shape[1:]`` with the same
    ``S >= 1`` for all."""
    dtype = table.dtype.base_dtype
    variables = {}
    first: tuple[str, tf.TensorShape] | None = None
    for argument, slot in slots.items():
        variable = resolve_variable(slot, argument)
        check_dtype_matches(argument, variable.dtype.base_dtype, dtype, _ARGUMENTS.table_owner)
        shape = variable.shape
        if not compact:
            if not shape.is_compatible_with(table.shape):
                raise PartialEmbeddingArgumentError(
                    f"{argument}: shape {shape_text(shape)} does not match var's "
                    f"shape {shape_text(table.shape)}"
                )
        elif shape.rank is not None and table.shape.rank is not None:
            _check_compact_slot_shape(argument, shape, table.shape, first)
            if first is None:
                first = (argument, shape)
        variables[argument] = variable
    return variables


def _check_compact_slot_shape(
    argument: str,
    shape: tf.TensorShape,
    table_shape: tf.TensorShape,
    first: tuple[str, tf.TensorShape] | None,
) -> None:
    """Raises unless ``shape`` is ``[S] + table_shape[1:]`` with ``S >= 1``
    and the first slot's ``S``; messages as the kernel's."""
    if shape.rank == 0:
        raise PartialEmbeddingArgumentError(
            f"{argument}: shape {shape_text(shape)} must be [S] + var.shape[1:] with S >= 1"
        )
    if shape[0] == 0:
        raise PartialEmbeddingArgumentError(
            f"{argument}: shape {shape_text(shape)} has no slot row (S must be >= 1)"
        )
    if table_shape.rank >= 1 and not shape[1:].is_compatible_with(table_shape[1:]):
        raise PartialEmbeddingArgumentError(
            f"{argument}: shape {shape_text(shape)} does not have var's row shape "
            f"(var.shape[1:] = {shape_text(table_shape[1:])})"
        )
    if first is not None and not shape.is_compatible_with(first[1]):
        raise PartialEmbeddingArgumentError(
            f"{argument}: shape {shape_text(shape)} does not match {first[0]}'s shape "
            f"{shape_text(first[1])} (every slot has the same S rows)"
        )
