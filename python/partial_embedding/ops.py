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
    "HUGE_PAGES_MIN_BYTES",
    "advise_huge_pages",
    "entry_stop_gradients",
    "gather_rows",
    "masked_embedding_lookup",
    "masked_scatter_sub",
    "masked_sparse_apply_adam",
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
    if isinstance(candidate, tf.Variable) and _is_distributed(candidate):
        # Its handle is the current replica's component, and only exists in a
        # replica context or a strategy's update() call.
        return candidate
    if isinstance(candidate, tf.Variable) and hasattr(candidate, "handle"):
        try:
            handle = candidate.handle
        except (AttributeError, ValueError, TypeError):
            handle = None
        if handle is not None and handle.dtype == tf.resource:
            return candidate
    raise PartialEmbeddingTypeError(
        f"{argument}: expected a resource tf.Variable or a Keras variable, got {type(ref).__name__}"
    )


def gather_rows(variable: Any, rows: Any) -> tf.Tensor:
    """Rows of a variable, without switching it into copy-on-read mode.

    ``tf.Variable.sparse_read`` (``ResourceGather``) puts a variable into
    copy-on-read mode for good: from then on every full read (saving,
    ``get_weights``, passing the whole mask to a kernel) copies the whole
    buffer, which costs 40 ms (up to ~0.85 s on slower 2-core VMs) per read
    of a 1M x 128 float32 table on this project's machines instead of ~1 ms.
    A ``ReadVariableOp`` that aliases the buffer followed by ``GatherV2`` reads
    only the rows and leaves the variable alone; the in-place kernel copies
    only if that alias is still held when it writes.

    >>> import tensorflow as tf
    >>> table = tf.Variable([[1.0], [2.0], [3.0]])
    >>> gather_rows(table, [2, 0]).numpy().tolist()
    [[3.0], [1.0]]
    """
    return tf.gather(resolve_variable(variable, argument="variable").value(), rows)


def _is_distributed(variable: Any) -> bool:
    """A tf.distribute variable with one component per device (MirroredVariable...)."""
    return isinstance(variable, tf.distribute.DistributedValues)


def _components(variable: Any) -> tuple:
    """The per-device components of a distributed variable."""
    return tuple(getattr(variable, "values", None) or variable._values)


def _has_current_component(variable: Any) -> bool:
    """Whether the current context picks one component (replica or update())."""
    try:
        _ = variable.handle
    except ValueError:
        return False
    return True


def _sharded_variable(ref: Any) -> Any | None:
    """The ``ShardedVariable`` behind ``ref`` (ParameterServerStrategy with a
    ``variable_partitioner``), or None."""
    candidate = getattr(ref, "_value", ref)
    variables = getattr(candidate, "variables", None)
    if (
        not isinstance(candidate, tf.Variable)
        and isinstance(variables, (list, tuple))
        and variables
        and all(isinstance(v, tf.Variable) for v in variables)
        and hasattr(candidate, "_var_offsets")
    ):
        return candidate
    return None


def _shard_row_starts(shards: Any) -> list[int]:
    """First global row of each shard: shards hold contiguous row ranges."""
    starts = [0]
    for shard in shards:
        starts.append(starts[-1] + int(shard.shape[0]))
    return starts


def _unwrap(value: Any) -> Any:
    inner = getattr(value, "_value", None)
    return inner if isinstance(inner, tf.Variable) or _sharded_variable(inner) else value


def _check_global_ids(flat_ids: tf.Tensor, num_rows: int, argument: str) -> tf.Operation | None:
    """Every id in [0, num_rows), checked before any shard is touched."""
    bad = tf.logical_or(flat_ids < 0, flat_ids >= num_rows)
    first_bad = tf.argmax(tf.cast(bad, tf.int32), output_type=flat_ids.dtype)
    if tf.executing_eagerly():
        if bool(tf.reduce_any(bad)):
            position = int(first_bad)
            raise tf.errors.InvalidArgumentError(
                None,
                None,
                f"{argument}[{position}] = {int(flat_ids[position])} is not in "
                f"[0, {num_rows}); nothing was written",
            )
        return None

    def message() -> tf.Tensor:
        return tf.strings.format(
            argument + "[{}] = {} is not in [0, " + str(num_rows) + "); nothing was written",
            (first_bad, tf.gather(flat_ids, first_bad)),
        )

    return tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(bad)),
        [tf.cond(tf.reduce_any(bad), message, lambda: tf.constant(""))],
    )


def _mask_slices(row_mask: Any, starts: list[int]) -> list[Any]:
    """The row mask of each shard: a shard of a mask sharded alike, else a slice."""
    mask = _unwrap(row_mask)
    sharded = _sharded_variable(mask)
    if sharded is not None:
        if _shard_row_starts(sharded.variables) == starts:
            return list(sharded.variables)
        mask = tf.concat([tf.convert_to_tensor(v) for v in sharded.variables], 0)
    if isinstance(mask, tf.Variable):
        mask = mask.read_value()
    mask = _to_tensor_keeping_dtype(mask, tf.bool)
    return [mask[start:end] for start, end in zip(starts[:-1], starts[1:])]


def _sharded_masked_scatter_sub(
    table: Any,
    indices: Any,
    updates: Any,
    row_mask: Any,
    use_locking: bool,
    name: str | None,
) -> tf.Operation | None:
    """masked_scatter_sub on a ShardedVariable: each shard gets its own rows."""
    shards = list(table.variables)
    starts = _shard_row_starts(shards)
    num_rows = starts[-1]
    with tf.name_scope(name or "masked_scatter_sub"):
        indices = _index_tensor(indices, "indices")
        updates = _to_tensor_keeping_dtype(updates, shards[0].dtype.base_dtype)
        masks = _mask_slices(row_mask, starts)
        row_shape = shards[0].shape[1:]
        flat_ids = tf.reshape(indices, [-1])
        flat_updates = tf.reshape(
            updates, tf.concat([[-1], tf.shape(updates)[indices.shape.rank :]], 0)
        )
        check = _check_global_ids(flat_ids, num_rows, "indices")
        with tf.control_dependencies([check] if check is not None else []):
            flat_ids = tf.identity(flat_ids)
        ops = []
        for shard, mask, start, end in zip(shards, masks, starts[:-1], starts[1:]):
            in_shard = tf.reshape(tf.where((flat_ids >= start) & (flat_ids < end)), [-1])
            with tf.device(shard.device):
                op = masked_scatter_sub(
                    shard,
                    tf.gather(flat_ids, in_shard) - tf.cast(start, flat_ids.dtype),
                    tf.ensure_shape(tf.gather(flat_updates, in_shard), [None, *row_shape]),
                    mask,
                    use_locking=use_locking,
                )
            ops.append(op)
    if tf.executing_eagerly() or tf.inside_function():
        return None
    return tf.group(ops)


def _per_component_masked_scatter_sub(
    variable: Any,
    indices: Any,
    updates: Any,
    row_mask: Any,
    use_locking: bool,
    name: str | None,
) -> tf.Operation | None:
    """masked_scatter_sub on every component of a distributed variable
    (cross-replica context): the copies stay identical."""
    mask = _unwrap(row_mask)
    components = _components(variable)
    masks = (
        _components(mask)
        if _is_distributed(mask) and len(_components(mask)) == len(components)
        else [row_mask] * len(components)
    )
    ops = []
    for component, component_mask in zip(components, masks):
        with tf.device(component.device):
            ops.append(
                masked_scatter_sub(component, indices, updates, component_mask, use_locking, name)
            )
    if tf.executing_eagerly() or tf.inside_function():
        return None
    return tf.group(ops)


def _index_tensor(value: Any, argument: str) -> tf.Tensor:
    """Converts row numbers; anything but int32/int64 is refused."""
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype not in INDEX_DTYPES:
        raise PartialEmbeddingTypeError(
            f"{argument}: dtype {tensor.dtype.name} is not an index type; use int32 or int64"
        )
    return tensor


def _check_table_dtype(dtype: tf.DType, argument: str) -> None:
    """Refuses tables of a dtype the kernels do not implement."""
    if dtype not in SUPPORTED_DTYPES:
        raise PartialEmbeddingTypeError(
            f"{argument}: dtype {dtype.name} is not supported; use float16, bfloat16, "
            "float32 or float64"
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

    Distributed variables: a ``MirroredVariable`` (``MirroredStrategy``,
    ``MultiWorkerMirroredStrategy``) is written in its current component in a
    replica context or inside ``strategy.extended.update``, and in every
    local component in a cross-replica context. A ``ShardedVariable``
    (``ParameterServerStrategy`` with a ``variable_partitioner``) takes
    global row ids: every id is checked against ``[0, V)`` first, then each
    shard receives its own rows with local ids (shards hold contiguous row
    ranges) and the matching slice of ``row_mask``. The shards are written
    one after the other, each under its own lock.

    Args:
      ref: A ``tf.Variable`` or Keras 3 variable of rank >= 1 with ``V`` rows,
        of dtype float16, bfloat16, float32 or float64; or a distributed one
        (see above).
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
    sharded = _sharded_variable(ref)
    if sharded is not None:
        return _sharded_masked_scatter_sub(sharded, indices, updates, row_mask, use_locking, name)
    variable = resolve_variable(ref)
    if _is_distributed(variable) and not _has_current_component(variable):
        return _per_component_masked_scatter_sub(
            variable, indices, updates, row_mask, use_locking, name
        )
    var_dtype = variable.dtype.base_dtype
    _check_table_dtype(var_dtype, "ref")
    with tf.name_scope(name or "masked_scatter_sub"):
        indices = _index_tensor(indices, "indices")
        updates = _to_tensor_keeping_dtype(updates, var_dtype)
        if updates.dtype != var_dtype:
            raise PartialEmbeddingTypeError(
                f"updates: dtype {updates.dtype.name} does not match the "
                f"variable's dtype {var_dtype.name}"
            )
        row_mask = _to_tensor_keeping_dtype(row_mask, tf.bool)
        if row_mask.dtype != tf.bool:
            raise PartialEmbeddingTypeError(f"row_mask: dtype {row_mask.dtype.name} must be bool")
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

    On a ``ShardedVariable`` (``ParameterServerStrategy`` with a
    ``variable_partitioner``) each id is looked up in the shard that owns its
    row, with a local id, so each shard's gradient is an ``IndexedSlices`` of
    its own rows: take the gradient with respect to ``table.variables``.
    A ``MirroredVariable`` is read in the current replica's component.

    Args:
      params: A ``tf.Variable`` or Keras 3 variable, ``[V, ...]``, of dtype
        float16, bfloat16, float32 or float64, or a ``ShardedVariable`` of one.
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
        sharded = _sharded_variable(params)
        if sharded is not None:
            return _sharded_masked_embedding_lookup(sharded, ids, row_mask, name)
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
    _check_table_dtype(var_dtype, "params")
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
        ids = _index_tensor(ids, "ids")
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
            permitted = gather_rows(mask_source, flat_ids)
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
        # One gather of the batch's rows; the gradient keeps only the
        # occurrences of permitted rows (frozen ones are dropped, not zeroed).
        table = variable.value()

        @tf.custom_gradient
        def gather_permitted(table: tf.Tensor) -> tuple[tf.Tensor, Any]:
            def gradient(upstream: tf.Tensor) -> tf.IndexedSlices:
                keep = tf.reshape(tf.where(permitted), [-1])
                return tf.IndexedSlices(
                    tf.gather(upstream, keep),
                    tf.gather(flat_ids, keep),
                    tf.shape(table, out_type=flat_ids.dtype),
                )

            return tf.gather(table, flat_ids), gradient

        rows = gather_permitted(table)
        # The positions cover 0..size-1 exactly, so rows is [size, ...].
        output_shape = tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0)
        result = tf.reshape(rows, output_shape)
        if var_shape.rank is not None:
            result.set_shape(ids.shape.concatenate(var_shape[1:]))
        return result


@tf.autograph.experimental.do_not_convert
def _sharded_masked_embedding_lookup(
    table: Any, ids: Any, row_mask: Any, name: str | None
) -> tf.Tensor:
    """masked_embedding_lookup on a ShardedVariable: each id is looked up (and
    its gradient sent) in the shard that owns its row, with a local id."""
    shards = list(table.variables)
    starts = _shard_row_starts(shards)
    with tf.name_scope(name or "masked_embedding_lookup"):
        ids = _index_tensor(ids, "ids")
        masks = _mask_slices(row_mask, starts)
        flat_ids = tf.reshape(ids, [-1])
        check = _check_global_ids(flat_ids, starts[-1], "ids")
        with tf.control_dependencies([check] if check is not None else []):
            flat_ids = tf.identity(flat_ids)
        owner = tf.searchsorted(
            tf.constant(starts[1:-1], dtype=flat_ids.dtype),
            flat_ids,
            side="right",
            out_type=tf.int32,
        )
        positions = tf.dynamic_partition(
            tf.range(tf.size(flat_ids, out_type=tf.int32)), owner, len(shards)
        )
        rows = []
        for shard, mask, start, shard_positions in zip(shards, masks, starts, positions):
            local_ids = tf.gather(flat_ids, shard_positions) - tf.cast(start, flat_ids.dtype)
            with tf.device(shard.device):
                rows.append(_masked_embedding_lookup(shard, local_ids, mask, None))
        stitched = tf.dynamic_stitch(positions, rows)
        result = tf.reshape(stitched, tf.concat([tf.shape(ids), tf.shape(stitched)[1:]], 0))
        result.set_shape(ids.shape.concatenate(shards[0].shape[1:]))
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


def _hyperparameter(value: Any, dtype: tf.DType) -> tf.Tensor:
    """A scalar of ``dtype``: Python numbers round once, tensors are cast."""
    if isinstance(value, (int, float)):
        return tf.convert_to_tensor(value, dtype=dtype)
    return tf.cast(value, dtype)


def _complement(beta: Any, dtype: tf.DType) -> tf.Tensor:
    """``1 - beta`` as Keras' rules compute it: in Python for Python numbers."""
    if isinstance(beta, (int, float)):
        return tf.convert_to_tensor(1 - beta, dtype=dtype)
    return 1 - tf.cast(beta, dtype)


@tf.autograph.experimental.do_not_convert
def masked_sparse_apply_adam(
    var: Any,
    m: Any,
    v: Any,
    indices: Any,
    grad: Any,
    row_mask: Any,
    *,
    learning_rate: Any,
    beta_1: Any,
    beta_2: Any,
    epsilon: Any,
    alpha: Any,
    weight_decay: Any = 0.0,
    v_hat: Any = None,
    use_locking: bool = True,
    name: str | None = None,
) -> tf.Operation | None:
    """Lazy Adam step on the permitted rows of a raw sparse gradient, fused.

    The CPU kernel behind ``MaskedOptimizer``'s Adam and AdamW: one op that
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
    copy-on-read mode. CPU only: the variables must live on the CPU.

    Hyperparameters may be tensors, so changing values (learning-rate
    schedules, the step count in ``alpha``) do not retrace. Python numbers are
    converted to the variable's dtype directly; ``1 - beta`` of a Python
    ``beta`` is computed in Python, as Keras' Adam does.

    Args:
      var: A ``tf.Variable`` or Keras 3 variable, ``[V, ...]``, of dtype
        float16, bfloat16, float32 or float64.
      m, v: The first and second moment slots: variables of ``var``'s shape
        and dtype.
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
      v_hat: The AMSGrad slot (running maximum of ``v``), or None for Adam.
      use_locking: Accepted for symmetry with TF's apply ops; the variables'
        locks are always held for the whole update (taken in address order).
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode; ``None`` eagerly and inside
      ``tf.function``.

    Raises:
      PartialEmbeddingTypeError: a variable is not a resource variable, or a
        dtype is wrong.
      PartialEmbeddingArgumentError: a shape already known to be wrong.
      tf.errors.InvalidArgumentError: at run time, an index outside
        ``[0, V)``, a shape or dtype mismatch, or the same variable passed
        twice. Nothing is written.
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
    """
    table = resolve_variable(var, "var")
    dtype = table.dtype.base_dtype
    _check_table_dtype(dtype, "var")
    slots = {"m": m, "v": v} if v_hat is None else {"m": m, "v": v, "v_hat": v_hat}
    slot_variables = {}
    for argument, slot in slots.items():
        slot_variable = resolve_variable(slot, argument)
        if slot_variable.dtype.base_dtype != dtype:
            raise PartialEmbeddingTypeError(
                f"{argument}: dtype {slot_variable.dtype.base_dtype.name} does not match "
                f"var's dtype {dtype.name}"
            )
        if not slot_variable.shape.is_compatible_with(table.shape):
            raise PartialEmbeddingArgumentError(
                f"{argument}: shape {_shape_text(slot_variable.shape)} does not match var's "
                f"shape {_shape_text(table.shape)}"
            )
        slot_variables[argument] = slot_variable
    with tf.name_scope(name or "masked_sparse_apply_adam"):
        indices = _index_tensor(indices, "indices")
        grad = _to_tensor_keeping_dtype(grad, dtype)
        if grad.dtype != dtype:
            raise PartialEmbeddingTypeError(
                f"grad: dtype {grad.dtype.name} does not match var's dtype {dtype.name}"
            )
        row_mask = _to_tensor_keeping_dtype(row_mask, tf.bool)
        if row_mask.dtype != tf.bool:
            raise PartialEmbeddingTypeError(f"row_mask: dtype {row_mask.dtype.name} must be bool")
        var_shape = table.shape
        if var_shape.rank is not None:
            if var_shape.rank < 1:
                raise PartialEmbeddingArgumentError(
                    f"var: the variable must have rank >= 1, got shape {_shape_text(var_shape)}"
                )
            if not row_mask.shape.is_compatible_with([var_shape[0]]):
                raise PartialEmbeddingArgumentError(
                    f"row_mask: shape {_shape_text(row_mask.shape)} must be [{var_shape[0]}] "
                    f"(one entry per row of the variable of shape {_shape_text(var_shape)})"
                )
            if indices.shape.rank is not None:
                expected = indices.shape.concatenate(var_shape[1:])
                if not grad.shape.is_compatible_with(expected):
                    raise PartialEmbeddingArgumentError(
                        f"grad: shape {_shape_text(grad.shape)} must be {_shape_text(expected)} "
                        f"(indices.shape + var.shape[1:]) for indices of shape "
                        f"{_shape_text(indices.shape)} and a variable of shape "
                        f"{_shape_text(var_shape)}"
                    )
        scalars = {
            "learning_rate": _hyperparameter(learning_rate, dtype),
            "one_minus_beta_1": _complement(beta_1, dtype),
            "one_minus_beta_2": _complement(beta_2, dtype),
            "epsilon": _hyperparameter(epsilon, dtype),
            "alpha": _hyperparameter(alpha, dtype),
            "weight_decay": _hyperparameter(weight_decay, dtype),
        }
        for argument, scalar in scalars.items():
            if scalar.shape.rank is not None and scalar.shape.rank != 0:
                raise PartialEmbeddingArgumentError(
                    f"{argument}: shape {_shape_text(scalar.shape)} must be a scalar"
                )
        # Without AMSGrad the kernel does not look v_hat up; v fills the slot.
        v_hat_handle = slot_variables.get("v_hat", slot_variables["v"]).handle
        op = load_ops().partial_embedding_masked_sparse_apply_adam(
            var=table.handle,
            m=slot_variables["m"].handle,
            v=slot_variables["v"].handle,
            v_hat=v_hat_handle,
            indices=indices,
            grad=grad,
            row_mask=row_mask,
            amsgrad=v_hat is not None,
            use_locking=use_locking,
            **scalars,
        )
    if tf.executing_eagerly() or tf.inside_function():
        return None
    return op


HUGE_PAGES_MIN_BYTES = 32 * 2**20


def advise_huge_pages(variable: Any, min_bytes: int = HUGE_PAGES_MIN_BYTES) -> bool:
    """Backs a large CPU variable with transparent huge pages (Linux).

    A training step of a large embedding reads and writes a few thousand rows
    scattered over the table and its optimizer slots. With the usual 4 KiB
    pages nearly every such access also misses the TLB and walks the page
    table; with 2 MiB pages most do not. This moves the variable's value into
    a fresh buffer advised ``MADV_HUGEPAGE`` before its first write (values,
    shape and dtype unchanged; readers holding the old buffer keep their
    snapshot).

    The in-place kernels (``masked_scatter_sub``, ``masked_sparse_apply_adam``,
    hence ``MaskedOptimizer``) already do this, with ``min_bytes`` = 32 MiB,
    the first time they write a CPU table or slot. Call it for a large table
    that is only read, or to pay the copy at a time of your choosing. The
    environment variable ``PARTIAL_EMBEDDING_HUGE_PAGES=0`` turns both off.

    The move costs one copy of the value, once per buffer (on this project's
    2-core VM about 0.2 s per 512 MiB table, up to 0.6 s when half the
    machine's memory is in use: the kernel zeroes each huge page first), and
    while it runs the old and the new buffer both exist. Afterwards the old
    buffer's pages go back to the system, also where TensorFlow's allocator
    keeps the buffer itself pooled. A later assignment of a whole new value (a
    checkpoint restore, ``assign``) brings an ordinary buffer, which the next
    in-place write moves again. Whether the kernel maps huge pages in the end
    depends on ``/sys/kernel/mm/transparent_hugepage`` (anything but
    ``never``) and on free memory.

    Runs eagerly, also when called while tracing a ``tf.function``.

    Args:
      variable: A ``tf.Variable`` or Keras 3 variable.
      min_bytes: Smallest value size worth moving (default 32 MiB).

    Returns:
      True when the value was moved; False (nothing done) for a value smaller
      than ``min_bytes``, one moved before, a variable without a value yet, on
      another device than the CPU or distributed over several, a platform
      without transparent huge pages, or ``PARTIAL_EMBEDDING_HUGE_PAGES=0``.

    Raises:
      PartialEmbeddingArgumentError: ``min_bytes`` is not an int >= 0.
      PartialEmbeddingTypeError: ``variable`` is not a variable.

    >>> import tensorflow as tf, partial_embedding as pe
    >>> table = tf.Variable(tf.reshape(tf.range(6.0), [3, 2]))
    >>> pe.advise_huge_pages(table)  # 24 bytes: not worth it
    False
    >>> table.numpy().tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    """
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, (int, np.integer)):
        raise PartialEmbeddingArgumentError(
            f"min_bytes: expected an int >= 0, got {type(min_bytes).__name__} {min_bytes!r}"
        )
    if min_bytes < 0:
        raise PartialEmbeddingArgumentError(f"min_bytes: must be >= 0, got {min_bytes}")
    resolved = resolve_variable(variable, argument="variable")
    if _is_distributed(resolved):
        return False
    with tf.init_scope():
        device = resolved.device
        if device and tf.DeviceSpec.from_string(device).device_type != "CPU":
            return False
        if resolved.shape.num_elements() is None:
            return False
        nbytes = resolved.shape.num_elements() * resolved.dtype.size
        if nbytes < max(int(min_bytes), 1):
            return False
        with tf.device(device or "/CPU:0"):
            advised = load_ops().partial_embedding_advise_huge_pages(
                resource=resolved.handle, min_bytes=int(min_bytes)
            )
        return bool(advised.numpy())
