"""Experimental: ``masked_scatter_sub`` inside an XLA cluster as our own custom call.

Under XLA (``jit_compile=True``) TensorFlow compiles a function into one XLA
program, and our in-place kernels cannot run inside it: ``masked_scatter_sub``
then falls back to stock ops (see ``partial_embedding._internal.xla``). The
optional library ``_partial_embedding_xla.so`` (CMake option
``PE_ENABLE_XLA_FFI``) gives the op an XLA lowering on XLA's CPU backend: the
program calls the same TF-free row update the kernel uses, as a typed-FFI
custom call whose result aliases the table, so the table is updated in place
inside the cluster.

TensorFlow registers XLA kernels once per process, when it first traces or
compiles a function with ``jit_compile=True``; a library loaded later is
ignored. Importing this module loads the library (where it was built), so
import it before the first such function is traced.
``load_xla_custom_calls`` checks that the lowering is in effect.
"""

from __future__ import annotations

import os
import threading

import tensorflow as tf

from partial_embedding._internal.checks import (
    RowUpdateArguments,
    check_table_dtype,
    row_update_tensors,
)
from partial_embedding._internal.context import in_xla_context, update_result
from partial_embedding._internal.types import RowMask, TensorLike, Variable
from partial_embedding._internal.variables import is_distributed, resolve_variable
from partial_embedding._loader import load_ops
from partial_embedding.ops.scatter import masked_scatter_sub

__all__ = ["XLA_LIBRARY_FILE", "load_xla_custom_calls", "masked_scatter_sub_custom_call"]

#: The optional library's file name, next to the op library in the package.
XLA_LIBRARY_FILE = "_partial_embedding_xla.so"

_ARGUMENTS = RowUpdateArguments(
    table="ref",
    updates="updates",
    table_owner="the variable's",
    table_in_formula="variable",
    check_mask_rank=True,
)
_lock = threading.Lock()
_active: bool | None = None


def xla_library_path() -> str:
    """The path where the optional XLA custom-call library is looked for."""
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), XLA_LIBRARY_FILE)


def load_xla_custom_calls() -> bool:
    """Reports (once per process) whether the XLA custom call is in effect.

    The library itself was loaded when this module was imported. This
    compiles and runs one tiny update of a 1 x 1 CPU table with XLA and
    checks its result; the answer is kept for the process.

    Returns:
      True when ``masked_scatter_sub_custom_call`` inside an XLA cluster on
      the CPU runs our custom call. False when the library was not built
      (``PE_ENABLE_XLA_FFI=OFF``, the default) or could not load, or when
      this module was imported only after the process had traced or
      compiled a function with ``jit_compile=True`` (TensorFlow registers
      XLA kernels once, then).

    >>> from partial_embedding.ops import xla_custom_call
    >>> isinstance(xla_custom_call.load_xla_custom_calls(), bool)
    True
    """
    global _active
    with _lock:
        if _active is None:
            _active = _load_and_probe()
        return _active


def _load_library() -> bool:
    """Loads the op library (it declares the op), then ours, if it was built."""
    path = xla_library_path()
    if not os.path.exists(path):
        return False
    try:
        load_ops()
        tf.load_op_library(path)
    except (ImportError, tf.errors.NotFoundError):
        return False
    return True


# At import: the earlier, the likelier it is before the first XLA trace.
_loaded = _load_library()


def _load_and_probe() -> bool:
    if not _loaded:
        return False
    ops = load_ops()
    with tf.init_scope(), tf.device("/CPU:0"):
        table = tf.Variable([[0.0]])

        @tf.function(jit_compile=True, autograph=False)
        def update() -> None:
            ops.partial_embedding_masked_scatter_sub(
                resource=table.handle,
                indices=tf.constant([0]),
                updates=tf.constant([[1.0]]),
                row_mask=tf.constant([True]),
            )

        try:
            update()
        except tf.errors.InvalidArgumentError:
            return False  # "No registered ... OpKernel for XLA_CPU_JIT".
        return bool(table.numpy()[0, 0] == -1.0)


def _on_cpu(variable: tf.Variable) -> bool:
    return tf.DeviceSpec.from_string(variable.device).device_type == "CPU"


@tf.autograph.experimental.do_not_convert
def masked_scatter_sub_custom_call(
    ref: Variable,
    indices: TensorLike,
    updates: TensorLike,
    row_mask: RowMask,
    name: str | None = None,
) -> tf.Operation | None:
    """``masked_scatter_sub`` that runs as our custom call inside XLA on the CPU.

    The same update as ``partial_embedding.masked_scatter_sub``: for every
    position ``i`` of ``indices``, ``ref[indices[i]] -= updates[i]`` where
    ``row_mask[indices[i]]``; frozen rows keep their bits, duplicates
    accumulate in index order. Inside an XLA cluster, on a CPU variable, with
    the custom calls loaded (``load_xla_custom_calls()`` is True), it is
    compiled into a custom call over the same row-update code as the kernel,
    writing the table's buffer in place; there an index outside ``[0, V)``
    raises at run time, as the kernel does, and nothing is written.
    Everywhere else it is ``masked_scatter_sub`` itself (the kernel outside
    XLA, stock ops inside XLA).

    Args:
      ref: A ``tf.Variable`` or Keras 3 variable of rank >= 1 with ``V`` rows,
        of dtype float16, bfloat16, float32 or float64.
      indices: int32 or int64 row numbers, any shape.
      updates: ``indices.shape + ref.shape[1:]``, of ``ref``'s dtype.
      row_mask: bool ``[V]``; true where a row may be written.
      name: A name for the operation.

    Returns:
      The operation in ``tf.compat.v1`` graph mode; None eagerly and inside
      ``tf.function``.

    Raises:
      PartialEmbeddingArgumentError: a shape or dtype that is wrong before
        running. Nothing is written.
      tf.errors.InvalidArgumentError: at run time, an index outside
        ``[0, V)``, naming its position and value. Nothing is written.

    >>> import tensorflow as tf
    >>> from partial_embedding.ops import xla_custom_call as xcc
    >>> table = tf.Variable([[1.0], [2.0]])
    >>> xcc.masked_scatter_sub_custom_call(table, [0, 1], [[1.0], [1.0]], [True, False])
    >>> table.numpy().ravel().tolist()
    [0.0, 2.0]
    """
    if not in_xla_context():
        return masked_scatter_sub(ref, indices, updates, row_mask, name=name)
    variable = resolve_variable(ref)
    if is_distributed(variable) or not _on_cpu(variable) or not load_xla_custom_calls():
        return masked_scatter_sub(ref, indices, updates, row_mask, name=name)
    check_table_dtype(variable.dtype.base_dtype, "ref")
    with tf.name_scope(name or "masked_scatter_sub_custom_call"):
        indices, updates, row_mask = row_update_tensors(
            variable, indices, updates, row_mask, _ARGUMENTS
        )
        op = load_ops().partial_embedding_masked_scatter_sub(
            resource=variable.handle, indices=indices, updates=updates, row_mask=row_mask
        )
    return update_result(op)
