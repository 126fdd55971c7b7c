"""TensorFlow ops of partial_embedding: thin, validated wrappers.

Nothing here imports Keras; Keras variables are recognised by duck typing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._loader import load_ops
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)

__all__ = [
    "entry_stop_gradients",
    "masked_embedding_lookup",
    "masked_scatter_sub",
    "resolve_variable",
]

SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
INDEX_DTYPES = (tf.int32, tf.int64)


def resolve_variable(ref: Any, argument: str = "ref") -> tf.Variable:
    """Returns the resource-backed ``tf.Variable`` behind ``ref``.

    Accepts a ``tf.Variable`` (resource variable) or a Keras 3 variable on the
    TensorFlow backend, whose ``tf.Variable`` this returns.

    Raises:
      PartialEmbeddingTypeError: ``ref`` is not such a variable.
    """
    candidate = ref
    # A Keras 3 variable keeps its tf.Variable in `_value` (`.value` may be an
    # autocast tensor inside a mixed-precision scope).
    inner = getattr(ref, "_value", None)
    if isinstance(inner, tf.Variable):
        candidate = inner
    if isinstance(candidate, tf.Variable) and hasattr(candidate, "handle"):
        try:
            handle = candidate.handle
        except (AttributeError, ValueError, TypeError):
            handle = None
        if handle is not None and handle.dtype == tf.resource:
            return candidate
    raise PartialEmbeddingTypeError(
        f"{argument}: expected a resource tf.Variable or a Keras variable, got "
        f"{type(ref).__name__}"
    )


def _to_tensor_keeping_dtype(value: Any, default_dtype: tf.DType) -> tf.Tensor:
    """Converts `value`; python scalars and lists take `default_dtype`."""
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray, np.generic)) or hasattr(
        value, "dtype"
    ):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value, dtype=default_dtype)


@tf.autograph.experimental.do_not_convert
def masked_scatter_sub(
    ref: Any,
    indices: Any,
    updates: Any,
    row_mask: Any,
    use_locking: bool = True,
    name: str | None = None,
) -> tf.Operation | None:
    """Subtracts ``updates`` from the permitted rows of ``ref``, in place.

    For every position ``i`` of ``indices``::

        if row_mask[indices[i]]:
            ref[indices[i], ...] -= updates[i, ...]

    Rows whose mask is false are never written, bit for bit. Duplicate indices
    accumulate. Every index is checked against ``[0, V)`` before anything is
    written, also where its row is frozen. The variable's buffer is updated in
    place (copied only if a reader still holds it) and is not switched into
    copy-on-read mode, so later full reads stay cheap.

    Args:
      ref: A ``tf.Variable`` or Keras 3 variable of rank >= 1 with ``V`` rows,
        of dtype float16, bfloat16, float32 or float64.
      indices: int32 or int64 row numbers, any shape.
      updates: ``indices.shape + ref.shape[1:]``, of ``ref``'s dtype.
      row_mask: bool, shape ``[V]``: a tensor, array or ``tf.Variable``; true
        where a row may be written.
      use_locking: If true (the default), the variable's lock is held
        exclusively for the whole update. If false, validation and any copy
        happen under the exclusive lock and the write under the shared lock:
        concurrent unlocked updates of the same row may interleave and lose
        increments (Hogwild-style).
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode; ``None`` eagerly and inside
      ``tf.function`` (where automatic control dependencies run it).

    Raises:
      PartialEmbeddingArgumentError: (a ``ValueError`` and a
        ``tf.errors.InvalidArgumentError``) a shape or dtype that is wrong
        before running. Nothing is written.
      tf.errors.InvalidArgumentError: at run time, an index outside
        ``[0, V)``, naming its position and value. Nothing is written.
      tf.errors.FailedPreconditionError or tf.errors.NotFoundError: the
        variable is not initialized.

    >>> import tensorflow as tf, partial_embedding as pe
    >>> table = tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    >>> pe.masked_scatter_sub(table, [0, 1, 1], tf.ones([3, 2]),
    ...                       row_mask=[True, False, True])
    >>> table.numpy().tolist()
    [[0.0, 0.0], [2.0, 2.0], [3.0, 3.0]]
    """
    variable = resolve_variable(ref)
    var_dtype = variable.dtype.base_dtype
    if var_dtype not in SUPPORTED_DTYPES:
        raise PartialEmbeddingTypeError(
            f"ref: dtype {var_dtype.name} is not supported; use float16, "
            "bfloat16, float32 or float64"
        )
    with tf.name_scope(name or "masked_scatter_sub"):
        indices = tf.convert_to_tensor(indices)
        if indices.dtype not in INDEX_DTYPES:
            raise PartialEmbeddingTypeError(
                f"indices: dtype {indices.dtype.name} is not an index type; use "
                "int32 or int64"
            )
        updates = _to_tensor_keeping_dtype(updates, var_dtype)
        if updates.dtype != var_dtype:
            raise PartialEmbeddingTypeError(
                f"updates: dtype {updates.dtype.name} does not match the "
                f"variable's dtype {var_dtype.name}"
            )
        row_mask = _to_tensor_keeping_dtype(row_mask, tf.bool)
        if row_mask.dtype != tf.bool:
            raise PartialEmbeddingTypeError(
                f"row_mask: dtype {row_mask.dtype.name} must be bool"
            )
        _check_static_shapes(variable.shape, indices.shape, updates.shape, row_mask.shape)
        op = load_ops().partial_embedding_masked_scatter_sub(
            resource=variable.handle,
            indices=indices,
            updates=updates,
            row_mask=row_mask,
            use_locking=use_locking,
        )
    # Inside tf.function the op runs through automatic control dependencies;
    # returning it there would make `return masked_scatter_sub(...)` fail.
    if tf.executing_eagerly() or tf.inside_function():
        return None
    return op


def _shape_text(shape: tf.TensorShape) -> str:
    """Formats a shape the way the kernel's messages do: [3,4], ? if unknown."""
    if shape.rank is None:
        return "<unknown>"
    return "[" + ",".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


def _check_static_shapes(
    var_shape: tf.TensorShape,
    indices_shape: tf.TensorShape,
    updates_shape: tf.TensorShape,
    mask_shape: tf.TensorShape,
) -> None:
    """Raises for shapes that are already known to be wrong."""
    if var_shape.rank is not None and var_shape.rank < 1:
        raise PartialEmbeddingArgumentError(
            f"ref: the variable must have rank >= 1, got shape {_shape_text(var_shape)}"
        )
    if mask_shape.rank is not None and mask_shape.rank != 1:
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {_shape_text(mask_shape)} must be [V] (rank 1)"
        )
    if var_shape.rank is None:
        return
    num_rows = var_shape[0]
    if mask_shape.rank == 1 and not mask_shape.is_compatible_with([num_rows]):
        raise PartialEmbeddingArgumentError(
            f"row_mask: shape {_shape_text(mask_shape)} must be [{num_rows}] (one entry per "
            f"row of the variable of shape {_shape_text(var_shape)})"
        )
    if indices_shape.rank is not None:
        expected = indices_shape.concatenate(var_shape[1:])
        if not updates_shape.is_compatible_with(expected):
            raise PartialEmbeddingArgumentError(
                f"updates: shape {_shape_text(updates_shape)} must be {_shape_text(expected)} "
                f"(indices.shape + variable.shape[1:]) for indices of shape "
                f"{_shape_text(indices_shape)} and a variable of shape {_shape_text(var_shape)}"
            )


def _in_xla_context() -> bool:
    """True while tracing for XLA (``jit_compile=True``)."""
    # TensorFlow has no public predicate for this; the private one has kept its
    # name since TF 1.x. Without it we only lose the clearer error message.
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover
        return False
    graph = tf.compat.v1.get_default_graph()
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def _row_mask_source(row_mask: Any, num_rows: int | None) -> tf.Variable | tf.Tensor:
    """Returns a variable to gather from (no full read) or a bool tensor."""
    try:
        mask_variable = resolve_variable(row_mask, "row_mask")
    except PartialEmbeddingTypeError:
        mask_variable = None
    if mask_variable is not None:
        source = mask_variable
        dtype = mask_variable.dtype.base_dtype
    elif hasattr(row_mask, "dtype"):
        source = tf.convert_to_tensor(row_mask)
        dtype = source.dtype
    else:
        # Python lists: infer the dtype (so that [1, 0] is reported, not cast).
        source = tf.convert_to_tensor(np.asarray(row_mask))
        dtype = source.dtype
    if dtype != tf.bool:
        raise PartialEmbeddingTypeError(f"row_mask: dtype {dtype.name} must be bool")
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


def masked_embedding_lookup(
    params: Any, ids: Any, row_mask: Any, name: str | None = None
) -> tf.Tensor:
    """Looks up rows of ``params``; only rows where ``row_mask`` is true learn.

    The forward pass equals ``tf.gather(params, ids)`` and gathers straight
    from the variable (``ResourceGather``): the table is never read whole. The
    gradient with respect to ``params`` is a ``tf.IndexedSlices`` (dense shape:
    the table's shape) that holds only the occurrences of ``ids`` whose row is
    permitted; occurrences of frozen rows are dropped, not zeroed. So
    ``tf.GradientTape`` loops and the ``tf.compat.v1.train`` optimizers
    (sparse updates) never touch a frozen row, and optimizer slots of frozen
    rows never see a gradient. Nothing of the vocabulary's size is built: the
    mask is only gathered at ``ids``.

    The gradient is TensorFlow's own registered gradients of ``ResourceGather``
    and ``DynamicStitch``: the permitted and the frozen occurrences are gathered
    separately and the frozen ones under ``tf.stop_gradient``. That works the
    same eagerly, in ``tf.function``, with ``tf.gradients`` and in a
    ``tf.compat.v1`` graph, with no special case for variables. It does not
    compile with XLA (``jit_compile=True``): data-dependent shapes.

    Args:
      params: A ``tf.Variable`` or Keras 3 variable, ``[V, ...]``, of dtype
        float16, bfloat16, float32 or float64.
      ids: int32 or int64 row numbers in ``[0, V)``, any shape.
      row_mask: bool ``[V]``, true where a row may learn: a tensor, array,
        list, ``tf.Variable`` or Keras variable. Variables are gathered from,
        never read whole, so a changed mask takes effect on the next call
        without retracing.
      name: A name for the operation.

    Returns:
      A tensor of ``params``' dtype and shape ``ids.shape + params.shape[1:]``.

    Raises:
      PartialEmbeddingTypeError: ``params`` is not a variable, or a dtype is
        wrong.
      PartialEmbeddingArgumentError: ``row_mask`` is not of shape ``[V]``, or
        the call is being compiled with XLA.
      tf.errors.InvalidArgumentError: at run time, an id outside ``[0, V)``.

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
    try:
        return _masked_embedding_lookup(params, ids, row_mask, name)
    except PartialEmbeddingArgumentError as error:
        # Inside tf.function, AutoGraph would re-raise our error as a
        # StagingError; let it through with its own type.
        error.ag_pass_through = True
        raise


@tf.autograph.experimental.do_not_convert
def _masked_embedding_lookup(params: Any, ids: Any, row_mask: Any, name: str | None) -> tf.Tensor:
    variable = resolve_variable(params, "params")
    var_dtype = variable.dtype.base_dtype
    if var_dtype not in SUPPORTED_DTYPES:
        raise PartialEmbeddingTypeError(
            f"params: dtype {var_dtype.name} is not supported; use float16, "
            "bfloat16, float32 or float64"
        )
    var_shape = variable.shape
    if var_shape.rank is not None and var_shape.rank < 1:
        raise PartialEmbeddingArgumentError(
            f"params: the variable must have rank >= 1, got shape {var_shape}"
        )
    static_rows = var_shape[0] if var_shape.rank is not None else None
    if _in_xla_context():
        raise PartialEmbeddingArgumentError(
            "masked_embedding_lookup does not support XLA compilation "
            "(jit_compile=True): the number of permitted occurrences is only "
            "known at run time. Compile without XLA, e.g. "
            "model.compile(..., jit_compile=False) or "
            "tf.function(jit_compile=False)."
        )
    with tf.name_scope(name or "masked_embedding_lookup"):
        ids = tf.convert_to_tensor(ids)
        if ids.dtype not in INDEX_DTYPES:
            raise PartialEmbeddingTypeError(
                f"ids: dtype {ids.dtype.name} is not an index type; use int32 or int64"
            )
        mask_source = _row_mask_source(row_mask, static_rows)
        if static_rows is not None:
            num_rows = tf.constant(static_rows, dtype=ids.dtype)
        else:
            num_rows = tf.cast(tf.shape(variable, out_type=tf.int64)[0], ids.dtype)
        flat_ids = tf.reshape(ids, [-1])
        # Checked here so that every device (GPU gathers do not check) and the
        # mask gather below report the same clear error.
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
            flat_ids = tf.identity(flat_ids)
        if isinstance(mask_source, tf.Variable):
            permitted = mask_source.sparse_read(flat_ids)
        else:
            if mask_source.shape.rank is None or mask_source.shape[0] is None:
                mask_ok = tf.debugging.assert_equal(
                    tf.cast(tf.size(mask_source), ids.dtype),
                    num_rows,
                    message="row_mask: must have one entry per row of params",
                )
                with tf.control_dependencies([mask_ok]):
                    flat_ids = tf.identity(flat_ids)
            permitted = tf.gather(mask_source, flat_ids)
        partitions = tf.cast(permitted, tf.int32)
        frozen_ids, permitted_ids = tf.dynamic_partition(flat_ids, partitions, 2)
        frozen_positions, permitted_positions = tf.dynamic_partition(
            tf.range(tf.size(flat_ids, out_type=tf.int32)), partitions, 2
        )
        frozen_rows = tf.stop_gradient(variable.sparse_read(frozen_ids))
        permitted_rows = variable.sparse_read(permitted_ids)
        rows = tf.dynamic_stitch(
            [frozen_positions, permitted_positions], [frozen_rows, permitted_rows]
        )
        # The positions cover 0..size-1 exactly, so rows is [size, ...].
        output_shape = tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0)
        result = tf.reshape(rows, output_shape)
        if var_shape.rank is not None:
            result.set_shape(ids.shape.concatenate(var_shape[1:]))
        return result


def entry_stop_gradients(target: Any, mask: Any) -> tf.Tensor:
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
