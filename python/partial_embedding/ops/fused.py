"""Fused optimizer rules: one op per step for the permitted rows.

``masked_sparse_apply_rule`` applies any rule of the table
(cc/core/row_rules.h) lazily: the step ``MaskedOptimizer`` runs without XLA,
on the CPU and (with the CUDA kernels) on a GPU. ``masked_embedding_bag_apply_rule``
fuses a bag lookup's gradient into it (CPU; on a GPU too, opt-in, see
docs/bags.md).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import tensorflow as tf

from partial_embedding._build_info import (
    GPU_FUSED_ENVIRONMENT,
    check_variable_placement,
    gpu_fused_kernel_chosen,
    gpu_kernel_available,
)
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
from partial_embedding._internal.rule_inputs import rule_hyperparameters, slot_index_tensor
from partial_embedding._internal.rule_table import RULES, KernelRule
from partial_embedding._internal.types import RowMask, Scalar, TensorLike, Variable
from partial_embedding._internal.variables import resolve_variable
from partial_embedding._loader import load_ops
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError

__all__ = ["masked_embedding_bag_apply_rule", "masked_sparse_apply_rule"]

_ARGUMENTS = RowUpdateArguments(
    table="var",
    updates="grad",
    table_owner="var's",
    table_in_formula="var",
    check_mask_rank=False,
)


@tf.autograph.experimental.do_not_convert
def masked_sparse_apply_rule(
    rule: str,
    var: Variable,
    slots: Sequence[Variable],
    indices: TensorLike,
    grad: TensorLike,
    row_mask: RowMask,
    hyperparameters: Mapping[str, Scalar],
    *,
    slot_indices: TensorLike = None,
    use_locking: bool = True,
    name: str | None = None,
) -> tf.Operation | None:
    """One optimizer rule, lazily, on the permitted rows of a sparse gradient, fused.

    One op sums the gradient rows of each row id, skips rows whose mask is
    false, and updates the other rows of ``var`` and of its ``slots`` in
    place. Element-wise rules give Keras' ``update_step`` bit for bit (FTRL
    within its ``pow``, which may differ from TensorFlow's in the last bit); the
    rules and their formulas: docs/optimizers.md.

    Args:
      rule: A rule of the table (``partial_embedding._internal.rule_table``):
        ``"sgd"``, ``"momentum"``, ``"nesterov"``, ``"adagrad"``,
        ``"rmsprop"`` (``_momentum``, ``_centered``, ``_centered_momentum``),
        ``"adam"``, ``"amsgrad"``, ``"rowwise_adagrad"``, ``"rowwise_adam"``,
        ``"ftrl"``.
      var: The table, a ``tf.Variable`` or Keras 3 variable ``[V, ...]`` of
        dtype float16, bfloat16, float32 or float64.
      slots: The rule's slots in its order: ``var``'s shape, ``[V]`` for a
        per-row slot; or ``[S] + var.shape[1:]`` (``[S]``) with
        ``slot_indices``.
      indices: int32 or int64 row ids, any shape; duplicates allowed.
      grad: ``indices.shape + var.shape[1:]``, of ``var``'s dtype.
      row_mask: bool ``[V]``; true where a row may be written.
      hyperparameters: The rule's hyperparameters by name, each a Python
        number (rounded once to ``var``'s dtype) or a scalar tensor;
        ``weight_decay`` may be left out (0: none).
      slot_indices: None, or each position's slot row (compact slots).
      use_locking: Accepted; the locks are always held.
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode, else ``None``.

    Raises:
      PartialEmbeddingArgumentError: An unknown rule, the wrong slots or
        hyperparameters, a bad shape or index; nothing is written.

    >>> import tensorflow as tf
    >>> from partial_embedding.ops import masked_sparse_apply_rule
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0]], dtype=tf.float64)
    >>> accumulator = tf.Variable(tf.zeros([2], tf.float64))
    >>> masked_sparse_apply_rule(
    ...     "rowwise_adagrad", table, [accumulator], [0, 1, 0],
    ...     tf.ones([3, 2], tf.float64), [True, False],
    ...     {"learning_rate": 0.5, "epsilon": 0.0})
    >>> table.numpy().tolist(), accumulator.numpy().tolist()
    ([[0.5, 0.5], [2.0, 2.0]], [4.0, 0.0])
    """
    kernel_rule = _kernel_rule(rule)
    if in_xla_context():
        raise PartialEmbeddingArgumentError(
            "masked_sparse_apply_rule has no XLA version (jit_compile=True): compile "
            "without XLA, or let MaskedOptimizer apply the rule, which uses its XLA "
            "custom call or stock ops under XLA"
        )
    table = resolve_variable(var, "var")
    dtype = table.dtype.base_dtype
    check_table_dtype(dtype, "var")
    slot_variables = _slot_variables(table, kernel_rule, slots, compact=slot_indices is not None)
    with tf.name_scope(name or f"masked_sparse_apply_{rule}"):
        indices, grad, row_mask = row_update_tensors(table, indices, grad, row_mask, _ARGUMENTS)
        inputs = dict(
            var=table.handle,
            slots=[slot.handle for slot in slot_variables],
            indices=indices,
            grad=grad,
            row_mask=row_mask,
            hyperparameters=rule_hyperparameters(kernel_rule, dtype, hyperparameters),
            rule=rule,
            use_locking=use_locking,
        )
        check_variable_placement("MaskedSparseApplyRule", table, "var")
        ops = load_ops()
        with _op_errors_as_argument_errors():
            if slot_indices is None:
                op = ops.partial_embedding_masked_sparse_apply_rule(**inputs)
            else:
                op = ops.partial_embedding_masked_sparse_apply_rule_with_slot_indices(
                    slot_indices=slot_index_tensor(slot_indices, indices), **inputs
                )
    return update_result(op)


@tf.autograph.experimental.do_not_convert
def masked_embedding_bag_apply_rule(
    rule: str,
    var: Variable,
    slots: Sequence[Variable],
    grad: TensorLike,
    ids: TensorLike,
    bags: TensorLike,
    factors: TensorLike,
    row_mask: RowMask,
    hyperparameters: Mapping[str, Scalar],
    *,
    slot_of_row: Variable | None = None,
    slot_rows_used: Variable | None = None,
    slot_initial_values: Sequence[float] | None = None,
    name: str | None = None,
) -> tf.Operation | None:
    """The bag gradient and a rule's lazy step of its rows, fused.

    One op in place of ``MaskedEmbeddingBagGrad`` and
    :func:`masked_sparse_apply_rule`, bit for bit the same: each permitted
    id's gradient ``sum_i factors[i] * grad[bags[i]]`` is summed where the
    rule uses it, never written out.

    Args:
      rule: A rule of the table, as :func:`masked_sparse_apply_rule` takes it.
      var: The table, a ``tf.Variable`` or Keras 3 variable ``[V, ...]``, on
        the CPU; or on a GPU, with the slots (and the slot map) there too,
        where the build has the CUDA kernel and ``PARTIAL_EMBEDDING_GPU_FUSED=1``
        (it has not run on a GPU yet; docs/bags.md).
      slots: The rule's slots in its order: ``var``'s shape (``[V]`` per
        row), or ``[S] + var.shape[1:]`` (``[S]``) with a slot map.
      grad: ``[B] + var.shape[1:]``, the bags' gradient, of ``var``'s dtype.
      ids: int32 or int64 ``[N]``, each ``< V`` (negative: pruned).
      bags: int64 ``[N]``, each position's bag in ``[0, B)``.
      factors: ``[N]``, the bag lookup's factors (float64 for a float64
        table, else float32).
      row_mask: bool ``[V]``; true where a row may be written.
      hyperparameters: As :func:`masked_sparse_apply_rule` takes them.
      slot_of_row, slot_rows_used: The slot map (float32 ``[V]``, int64
        scalar), or None (both) for full-size slots.
      slot_initial_values: With a slot map: each slot's value in the rows
        it grows by (default 0 for every slot).
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode, else ``None``.

    >>> import tensorflow as tf
    >>> from partial_embedding.ops.fused import masked_embedding_bag_apply_rule
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], dtype=tf.float64)
    >>> masked_embedding_bag_apply_rule(
    ...     "sgd", table, [], grad=tf.ones([2, 2], tf.float64), ids=[0, 1, 0],
    ...     bags=tf.constant([0, 0, 1], tf.int64), factors=[0.5, 0.5, 1.0],
    ...     row_mask=[True, False, True], hyperparameters={"learning_rate": 0.1})
    >>> table.numpy().round(4).tolist()
    [[0.85, 0.85], [2.0, 2.0], [3.0, 3.0]]
    """
    kernel_rule = _kernel_rule(rule)
    if in_xla_context():
        raise PartialEmbeddingArgumentError(
            "masked_embedding_bag_apply_rule has no XLA version (jit_compile=True)"
        )
    if (slot_of_row is None) != (slot_rows_used is None):
        raise PartialEmbeddingArgumentError(
            "slot_of_row and slot_rows_used: give both (compact slots) or neither"
        )
    table = resolve_variable(var, "var")
    dtype = table.dtype.base_dtype
    check_table_dtype(dtype, "var")
    slot_variables = _slot_variables(table, kernel_rule, slots, compact=slot_of_row is not None)
    if "GPU" in (table.device or "").upper():
        slot_map = {"slot_of_row": slot_of_row, "slot_rows_used": slot_rows_used}
        _check_bag_gpu_step(table, kernel_rule, slot_variables, slot_map)
    with tf.name_scope(name or f"masked_embedding_bag_apply_{rule}"):
        inputs = dict(
            var=table.handle,
            slots=[slot.handle for slot in slot_variables],
            **_bag_tensors(dtype, grad, ids, bags, factors),
            row_mask=row_mask_tensor(row_mask),
            hyperparameters=rule_hyperparameters(kernel_rule, dtype, hyperparameters),
            rule=rule,
        )
        ops = load_ops()
        with _op_errors_as_argument_errors():
            if slot_of_row is None:
                op = ops.partial_embedding_masked_embedding_bag_apply_rule(**inputs)
            else:
                initial = [0.0] * len(slot_variables)
                if slot_initial_values is not None:
                    initial = list(slot_initial_values)
                op = ops.partial_embedding_masked_embedding_bag_apply_rule_with_slot_map(
                    slot_of_row=resolve_variable(slot_of_row, "slot_of_row").handle,
                    slot_rows_used=resolve_variable(slot_rows_used, "slot_rows_used").handle,
                    slot_initial_values=tf.constant(initial, dtype, shape=[len(initial)]),
                    **inputs,
                )
    return update_result(op)


def _check_bag_gpu_step(
    table: tf.Variable,
    kernel_rule: KernelRule,
    slot_variables: Sequence[tf.Variable],
    slot_map: Mapping[str, Variable | None],
) -> None:
    """A GPU table's fused bag step takes the CUDA kernel where it is chosen
    (built, and opted in until it has run on a GPU), with the step's other
    variables (the slots, and the slot map where ``slot_map``'s are given) on
    a GPU too: the kernel reads them where var is."""
    compact = slot_map["slot_of_row"] is not None
    variables = list(zip((name for name, _ in kernel_rule.slots), slot_variables))
    if compact:
        variables += [(name, resolve_variable(v, name)) for name, v in slot_map.items()]
    op_name = "MaskedEmbeddingBagApplyRule" + ("WithSlotMap" if compact else "")
    if not gpu_kernel_available(op_name):
        why = "this build of the op library has no CUDA kernel for it: it runs on the CPU only"
    elif not gpu_fused_kernel_chosen(op_name):
        why = (
            "its CUDA kernel has not run on a GPU yet and is taken only with "
            f"{GPU_FUSED_ENVIRONMENT}=1; else place var on the CPU"
        )
    else:
        for argument, variable in variables:
            if "GPU" not in (variable.device or "").upper():
                raise PartialEmbeddingArgumentError(
                    f"{argument}: on {variable.device or 'no device'}, but var is on "
                    f"{table.device}; the GPU kernel needs it on var's GPU"
                )
        return
    raise PartialEmbeddingArgumentError(
        f"var: masked_embedding_bag_apply_rule: var is on {table.device}, but {why}"
    )


def _kernel_rule(rule: Any) -> KernelRule:
    """The table's entry for ``rule``, or a clear error."""
    kernel_rule = RULES.get(rule) if isinstance(rule, str) else None
    if kernel_rule is None:
        raise PartialEmbeddingArgumentError(
            f"rule: {rule!r} is not a rule of the table ({', '.join(RULES)})"
        )
    return kernel_rule


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
    table: tf.Variable, rule: KernelRule, slots: Sequence[Any], compact: bool
) -> list[tf.Variable]:
    """The variables behind ``slots``: as many as the rule has, each of
    ``table``'s dtype and, unless ``compact``, its shape (``[V]`` per row).
    Compact slots' shapes are the op's to check (one rule, one message:
    cc/core/row_update_contract.h)."""
    if isinstance(slots, (tf.Variable, str)) or len(slots) != len(rule.slots):
        count = 1 if isinstance(slots, (tf.Variable, str)) else len(slots)
        names = ", ".join(name for name, _ in rule.slots) or "none"
        raise PartialEmbeddingArgumentError(
            f"slots: {count} given; rule {rule.name!r} has {len(rule.slots)} ({names})"
        )
    dtype = table.dtype.base_dtype
    variables = []
    for (argument, per_row), slot in zip(rule.slots, slots):
        variable = resolve_variable(slot, argument)
        check_dtype_matches(argument, variable.dtype.base_dtype, dtype, _ARGUMENTS.table_owner)
        expected = table.shape[:1] if per_row else table.shape
        if not compact and not variable.shape.is_compatible_with(expected):
            raise PartialEmbeddingArgumentError(
                f"{argument}: shape {shape_text(variable.shape)} does not match "
                + ("[V], one value per row of var: " if per_row else "var's shape ")
                + shape_text(expected)
            )
        variables.append(variable)
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
