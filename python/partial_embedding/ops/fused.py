"""Fused optimizer rules: one op per step for the permitted rows.

``masked_sparse_apply_adam`` is the lazy Adam (AdamW, AMSGrad) step that
``MaskedOptimizer`` runs without XLA, on the CPU and (with the CUDA kernels)
on a GPU; its hyperparameters are converted here as Keras' own rules round
them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
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
    """Lazy Adam (AdamW, AMSGrad) step on the permitted rows of a sparse gradient, fused.

    One op sums the gradient rows of each row id, skips rows whose mask is
    false, and updates the other rows of ``var``, ``m``, ``v`` (and ``v_hat``)
    in place, bit for bit as the separate TensorFlow ops would. The step, the
    compact slots and the errors: docs/ops.md.

    Args:
      var: The table, a ``tf.Variable`` or Keras 3 variable ``[V, ...]`` of
        dtype float16, bfloat16, float32 or float64.
      m, v: The moment slots: ``var``'s shape, or ``[S] + var.shape[1:]``
        with ``slot_indices``.
      indices: int32 or int64 row ids, any shape; duplicates allowed.
      grad: ``indices.shape + var.shape[1:]``, of ``var``'s dtype.
      row_mask: bool ``[V]``; true where a row may be written.
      learning_rate, beta_1, beta_2, epsilon: Adam's scalars.
      alpha: The step size with bias correction.
      weight_decay: Decoupled weight decay; 0 for none.
      v_hat: The AMSGrad slot, of ``m``'s shape, or None for Adam.
      slot_indices: None, or each position's slot row (compact slots).
      use_locking: Accepted; the locks are always held.
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode, else ``None``.

    >>> import tensorflow as tf
    >>> from partial_embedding.ops import masked_sparse_apply_adam
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=tf.float64)
    >>> m = tf.Variable(tf.zeros([1, 2], tf.float64))
    >>> v = tf.Variable(tf.zeros([1, 2], tf.float64))
    >>> masked_sparse_apply_adam(table, m, v, [0, 1, 0], tf.ones([3, 2], tf.float64),
    ...                          [True, False, True], learning_rate=0.1,
    ...                          beta_1=0.9, beta_2=0.999, epsilon=1e-7,
    ...                          alpha=0.1, slot_indices=[0, 0, 0])
    >>> table.numpy().round(4).tolist(), m.numpy().round(4).tolist()
    ([[0.6838, 0.6838], [2.0, 2.0], [3.0, 3.0]], [[0.2, 0.2]])
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
        with _op_errors_as_argument_errors():
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

    One op in place of ``MaskedEmbeddingBagGrad`` and
    :func:`masked_sparse_apply_adam`, bit for bit the same: each permitted
    id's gradient ``sum_i factors[i] * grad[bags[i]]`` is summed where the step
    uses it. The step, the compact slots and the errors:
    docs/ops.md.

    Args:
      var: The table, a CPU ``tf.Variable`` or Keras 3 variable ``[V, ...]``.
      m, v: The moments: ``var``'s shape, or ``[S] + var.shape[1:]`` with a
        slot map.
      grad: ``[B] + var.shape[1:]``, the bags' gradient, of ``var``'s dtype.
      ids: int32 or int64 ``[N]``, each ``< V`` (negative: pruned).
      bags: int64 ``[N]``, each position's bag in ``[0, B)``.
      factors: ``[N]``, the bag lookup's factors (float64 for a float64
        table, else float32).
      row_mask: bool ``[V]``; true where a row may be written.
      learning_rate, beta_1, beta_2, epsilon, alpha, weight_decay: As
        :func:`masked_sparse_apply_adam` takes them.
      v_hat: The AMSGrad slot, or None for Adam.
      slot_of_row, slot_rows_used: The slot map (float32 ``[V]``, int64
        scalar), or None (both) for full-size slots.
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode, else ``None``.

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
    >>> table.numpy().round(4).tolist(), m.numpy().round(4).tolist()
    ([[0.6838, 0.6838], [2.0, 2.0], [3.0, 3.0]], [[0.15, 0.15]])
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
        with _op_errors_as_argument_errors():
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
    and, unless ``compact``, its shape. Compact slots' shapes are the op's to
    check (one rule, one message: cc/core/row_update_contract.h)."""
    dtype = table.dtype.base_dtype
    variables = {}
    for argument, slot in slots.items():
        variable = resolve_variable(slot, argument)
        check_dtype_matches(argument, variable.dtype.base_dtype, dtype, _ARGUMENTS.table_owner)
        if not compact and not variable.shape.is_compatible_with(table.shape):
            raise PartialEmbeddingArgumentError(
                f"{argument}: shape {shape_text(variable.shape)} does not match var's "
                f"shape {shape_text(table.shape)}"
            )
        variables[argument] = variable
    return variables


# TensorFlow's wrapping of an op's own message: eagerly a
# "{{function_node ...}} " prefix and an " [Op:...]" suffix; from a shape
# function while tracing, a " for '{{node ...}} ...' with input shapes" tail.
_OP_MESSAGE_WRAPPING = re.compile(
    r"^\{\{function_node [^}]*\}\}\s*|\s*(\[Op:| for '\{\{node ).*$", re.S
)


@contextlib.contextmanager
def _op_errors_as_argument_errors() -> Iterator[None]:
    """Raises what the fused op refuses while it is built (its shape function)
    or run eagerly (its kernel) as ``PartialEmbeddingArgumentError``, with the
    op's message: the error class the wrappers' own checks raise, and both
    classes TensorFlow would give (every such refusal comes before any
    write)."""
    try:
        yield
    except (tf.errors.InvalidArgumentError, ValueError) as error:
        if isinstance(error, PartialEmbeddingArgumentError):
            raise
        text = error.message if isinstance(error, tf.errors.OpError) else str(error)
        raise PartialEmbeddingArgumentError(_OP_MESSAGE_WRAPPING.sub("", text)) from error
