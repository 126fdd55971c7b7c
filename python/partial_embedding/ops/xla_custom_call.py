"""Experimental: our row updates inside an XLA cluster as our own custom calls.

Under XLA (``jit_compile=True``) TensorFlow compiles a function into one XLA
program, and our in-place kernels cannot run inside it: ``masked_scatter_sub``
then falls back to stock ops (see ``partial_embedding._internal.xla``). The
optional library ``_partial_embedding_xla.so`` (CMake option
``PE_ENABLE_XLA_FFI``) gives ``MaskedScatterSub`` and the fused
``MaskedSparseApplyRule`` (every optimizer rule of the table) XLA lowerings on
XLA's CPU backend: the program calls the same TF-free code the kernels use, as
typed-FFI custom calls whose results alias the variable and its slots, so they
are updated in place inside the cluster. A CUDA build adds the same custom
calls on XLA's CUDA backend (the CUDA core on XLA's stream), taken for GPU
variables where ``PARTIAL_EMBEDDING_GPU_FUSED=1`` (they have not run on a GPU
yet). Every one skips an index outside ``[0, V)``, as XLA's own scatters do.

TensorFlow registers XLA kernels once per process, when it first traces or
compiles a function with ``jit_compile=True``; a library loaded later is
ignored. Importing this module loads the library (where it was built), so
import it before the first such function is traced.
``load_xla_custom_calls`` checks that the lowering is in effect.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Mapping, Sequence

import tensorflow as tf

from partial_embedding._build_info import GPU_FUSED_ENVIRONMENT
from partial_embedding._internal.checks import (
    RowUpdateArguments,
    check_table_dtype,
    row_update_tensors,
)
from partial_embedding._internal.context import in_xla_context, update_result
from partial_embedding._internal.rule_inputs import rule_hyperparameters, slot_index_tensor
from partial_embedding._internal.rule_table import RULES
from partial_embedding._internal.types import RowMask, TensorLike, Variable
from partial_embedding._internal.variables import is_distributed, resolve_variable
from partial_embedding._loader import load_ops
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.ops.fused import masked_sparse_apply_rule
from partial_embedding.ops.scatter import masked_scatter_sub

__all__ = [
    "XLA_LIBRARY_ENVIRONMENT",
    "XLA_LIBRARY_FILE",
    "TARGETS",
    "custom_calls_apply",
    "handler_build",
    "handler_registered",
    "load_xla_custom_calls",
    "masked_scatter_sub_custom_call",
    "masked_sparse_apply_rule_custom_call",
]

#: The optional library's file name, next to the op library in the package.
XLA_LIBRARY_FILE = "_partial_embedding_xla.so"

#: Set to the path of another build of the library to load it instead (the
#: SIMT emulator build of ``build_tools/simt_xla_check.sh``, whose Host
#: handlers run the CUDA handlers' code on the emulator).
XLA_LIBRARY_ENVIRONMENT = "PARTIAL_EMBEDDING_XLA_LIBRARY"

#: The custom-call targets, as the library registers them.
TARGETS = (
    "partial_embedding_masked_scatter_sub",
    "partial_embedding_masked_sparse_apply_rule",
    "partial_embedding_masked_sparse_apply_rule_slots",
)

_ARGUMENTS = RowUpdateArguments(
    table="ref",
    updates="updates",
    table_owner="the variable's",
    table_in_formula="variable",
    check_mask_rank=True,
)
_RULE_ARGUMENTS = RowUpdateArguments(
    table="var",
    updates="grad",
    table_owner="var's",
    table_in_formula="var",
    check_mask_rank=True,
)
_lock = threading.Lock()
_active: bool | None = None


def xla_library_path() -> str:
    """The path where the optional XLA custom-call library is looked for:
    ``PARTIAL_EMBEDDING_XLA_LIBRARY`` where set, else next to the op library."""
    override = os.environ.get(XLA_LIBRARY_ENVIRONMENT)
    if override:
        return override
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), XLA_LIBRARY_FILE)


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The loaded library's exported C functions (the same handle TensorFlow
    loaded), or None where it did not load."""
    if not _loaded:
        return None
    library = ctypes.CDLL(xla_library_path())
    library.PartialEmbeddingXlaHandlerRegistered.restype = ctypes.c_int
    library.PartialEmbeddingXlaHandlerRegistered.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    library.PartialEmbeddingXlaHandlerBuild.restype = ctypes.c_char_p
    library.PartialEmbeddingXlaHandlerBuild.argtypes = []
    return library


def handler_registered(target: str, platform: str) -> bool:
    """Whether XLA's FFI registry holds a handler of ``target`` (one of
    ``TARGETS``) for ``platform`` (``"Host"``, ``"CUDA"``): XLA's own lookup,
    the one its runtime makes when it runs the call.

    >>> from partial_embedding.ops import xla_custom_call as xcc
    >>> isinstance(xcc.handler_registered(xcc.TARGETS[0], "Host"), bool)
    True
    """
    library = _library()
    if library is None:
        return False
    return bool(library.PartialEmbeddingXlaHandlerRegistered(target.encode(), platform.encode()))


def handler_build() -> str | None:
    """What runs behind the loaded library's handlers: ``"cpu"`` (the CPU
    cores on platform Host), ``"cpu+cuda"`` (and the CUDA handlers on
    platform CUDA) or ``"simt"`` (the CUDA handlers' code on the SIMT
    emulator, on platform Host); None where no library loaded."""
    library = _library()
    if library is None:
        return None
    return library.PartialEmbeddingXlaHandlerBuild().decode()


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


def _has_handlers(variable: tf.Variable) -> bool:
    """Whether our custom calls have handlers where ``variable`` lives: the
    CPU always (once loaded); a GPU where the CUDA handlers are registered and
    ``PARTIAL_EMBEDDING_GPU_FUSED=1`` (they have not run on a GPU yet)."""
    device_type = tf.DeviceSpec.from_string(variable.device).device_type
    if device_type == "CPU":
        return True
    return (
        device_type == "GPU"
        and os.environ.get(GPU_FUSED_ENVIRONMENT) == "1"
        and all(handler_registered(target, "CUDA") for target in TARGETS)
    )


def custom_calls_apply(variable: Variable) -> bool:
    """Whether an update of ``variable`` traced here compiles into our custom
    call: inside an XLA cluster, outside any ``tf.distribute`` strategy, on a
    single variable on the CPU (or on a GPU, where the CUDA handlers are built
    and ``PARTIAL_EMBEDDING_GPU_FUSED=1``), with the custom calls in effect
    (:func:`load_xla_custom_calls`)."""
    if not in_xla_context() or tf.distribute.has_strategy():
        return False
    try:
        resolved = resolve_variable(variable)
    except PartialEmbeddingTypeError:  # Not a single resource variable.
        return False
    return not is_distributed(resolved) and _has_handlers(resolved) and load_xla_custom_calls()


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
    writing the table's buffer in place; there an index outside ``[0, V)`` is
    skipped (XLA has no run-time errors; its own scatters skip such indices
    too) and the other positions are written.
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
      tf.errors.InvalidArgumentError: outside XLA only (the kernel), an
        index outside ``[0, V)``, naming its position and value. Nothing is
        written.

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
    if is_distributed(variable) or not _has_handlers(variable) or not load_xla_custom_calls():
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


@tf.autograph.experimental.do_not_convert
def masked_sparse_apply_rule_custom_call(
    rule: str,
    var: Variable,
    slots: Sequence[Variable],
    indices: TensorLike,
    grad: TensorLike,
    row_mask: RowMask,
    hyperparameters: Mapping[str, TensorLike],
    *,
    slot_indices: TensorLike = None,
    name: str | None = None,
) -> tf.Operation | None:
    """``masked_sparse_apply_rule`` that also runs inside XLA, as our custom call.

    The fused step of one optimizer rule of the table
    (``partial_embedding.ops.masked_sparse_apply_rule``): the same arguments,
    the same bits, full-size or compact slots. Outside XLA it is that
    function. Inside an XLA cluster, where that function refuses to run, the
    step compiles into one custom call over the same fused code, the rule its
    attribute, writing ``var`` and its slots in place; there a position whose
    index is outside ``[0, V)``, or whose slot index is negative, is skipped
    (neither checked nor written): XLA has no run-time errors, and the
    optimizer's XLA path leaves out frozen rows and rows without a slot row
    so. The contract: docs/xla.md.

    Args:
      rule, var, slots, indices, grad, row_mask, hyperparameters, name: As in
        ``masked_sparse_apply_rule``; ``var`` a single variable on the CPU
        (or on a GPU, see :func:`custom_calls_apply`).
      slot_indices: None (full-size slots), or the slot row of each position
        of ``indices`` (compact slots); under XLA, negative: skip the position.

    Returns:
      The operation in ``tf.compat.v1`` graph mode; None eagerly and inside
      ``tf.function``.

    Raises:
      PartialEmbeddingArgumentError: an unknown rule, or a shape or dtype that
        is wrong before running; or, inside XLA, the custom calls are not in
        effect (``load_xla_custom_calls()`` is False) or ``var`` is not a
        single variable where the custom calls have handlers. Nothing is
        written.
      tf.errors.InvalidArgumentError: at run time, inside XLA, slot indices
        that break the slot map (a slot index past the slot rows, a row
        with two slot rows, a slot row of two rows); outside XLA, as
        ``masked_sparse_apply_rule``. Nothing is written.

    >>> import tensorflow as tf
    >>> from partial_embedding.ops import xla_custom_call as xcc
    >>> table = tf.Variable([[1.0], [2.0]])
    >>> momentum = tf.Variable([[0.0]])
    >>> xcc.masked_sparse_apply_rule_custom_call(
    ...     "momentum", table, [momentum], [1], [[1.0]], [True, True],
    ...     {"learning_rate": 0.5, "momentum": 0.9}, slot_indices=[0])
    >>> table.numpy().ravel().tolist(), momentum.numpy().ravel().tolist()
    ([1.0, 1.5], [-0.5])
    """
    if not in_xla_context():
        return masked_sparse_apply_rule(
            rule, var, slots, indices, grad, row_mask, hyperparameters,
            slot_indices=slot_indices, name=name,
        )  # fmt: skip
    if not custom_calls_apply(var):
        raise PartialEmbeddingArgumentError(
            "masked_sparse_apply_rule_custom_call under XLA needs the XLA custom-call "
            "library loaded before the first jit_compile trace (load_xla_custom_calls() "
            "is False) and a single CPU variable as var (a GPU one where the CUDA handlers "
            "are built and PARTIAL_EMBEDDING_GPU_FUSED=1), outside a tf.distribute strategy"
        )
    kernel_rule = RULES.get(rule) if isinstance(rule, str) else None
    if kernel_rule is None:
        raise PartialEmbeddingArgumentError(
            f"rule: {rule!r} is not a rule of the table ({', '.join(RULES)})"
        )
    table = resolve_variable(var, "var")
    dtype = table.dtype.base_dtype
    check_table_dtype(dtype, "var")
    # The op's shape function checks the slots' count, shapes and dtypes.
    names = [slot_name for slot_name, _ in kernel_rule.slots]
    names += [f"slots[{i}]" for i in range(len(names), len(slots))]
    slot_variables = [resolve_variable(slot, slot_name) for slot, slot_name in zip(slots, names)]
    with tf.name_scope(name or "masked_sparse_apply_rule_custom_call"):
        indices, grad, row_mask = row_update_tensors(
            table, indices, grad, row_mask, _RULE_ARGUMENTS
        )
        inputs = dict(
            var=table.handle,
            slots=[slot.handle for slot in slot_variables],
            indices=indices,
            grad=grad,
            row_mask=row_mask,
            hyperparameters=rule_hyperparameters(kernel_rule, dtype, hyperparameters),
            rule=rule,
        )
        if slot_indices is None:
            op = load_ops().partial_embedding_masked_sparse_apply_rule(**inputs)
        else:
            op = load_ops().partial_embedding_masked_sparse_apply_rule_with_slot_indices(
                slot_indices=slot_index_tensor(slot_indices, indices), **inputs
            )
    return update_result(op)
