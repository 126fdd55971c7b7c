"""Variables whose number of rows grows in place.

A quantized layer's float store (and the masks and maps that go with it)
grows when more rows are unfrozen than it has room for, and so do the
full-size optimizer slots of that store. A Keras variable keeps a
``tf.Variable`` whose shape is fixed when it is made; :func:`make_growable`
makes that ``tf.Variable`` again, before anything has read it, with an
unknown number of rows (same value, name, dtype, trainability and device).
:func:`grow_rows` then assigns a longer value to the same variable: every
function traced since reads the new rows through the same handle, and an
XLA step compiles again for the new shape.

Variables of a ``tf.distribute`` strategy (mirrored, sharded) are not made
growable: their rows stay fixed.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.variables import is_distributed, sharded_variable

__all__ = [
    "GROWABLE_ATTRIBUTE",
    "GrowWithMask",
    "grow_rows",
    "is_growable",
    "make_growable",
    "num_rows",
]

#: Set (True) on a variable :func:`make_growable` re-made.
GROWABLE_ATTRIBUTE = "_partial_embedding_growable"


def _backing(variable: Any) -> tf.Variable:
    if isinstance(variable, tf.Variable):
        return variable
    return framework_private.keras_variable_backing(variable)


def make_growable(variable: Any, initial_value: Any = None) -> bool:
    """Makes a freshly made variable's rows growable; False (nothing changed)
    where it cannot be: a distributed or sharded variable, a Keras release
    without the internals this needs, or a variable made inside a function
    being traced (not initialized yet) without ``initial_value``.

    Args:
      variable: A Keras variable (its ``tf.Variable`` is replaced) or a
        ``tf.Variable`` made with an unknown first dimension already.
      initial_value: The value the variable was made with, as a scalar it
        is filled with; None: its value is read.
    """
    if getattr(variable, GROWABLE_ATTRIBUTE, False):
        return True
    if isinstance(variable, tf.Variable):
        if is_distributed(variable) or variable.shape.rank in (None, 0):
            return False
        if variable.shape[0] is not None:
            return False
        setattr(variable, GROWABLE_ATTRIBUTE, True)
        return True
    if not framework_private.has_keras_variable_internals(variable):
        return False
    inner = framework_private.keras_variable_backing(variable)
    if (
        not isinstance(inner, tf.Variable)
        or is_distributed(inner)
        or sharded_variable(variable) is not None
        or tf.distribute.has_strategy()
        or inner.shape.rank in (None, 0)
    ):
        return False
    shape = inner.shape
    if not shape.is_fully_defined():
        return False
    with tf.init_scope(), tf.device(inner.device):
        if initial_value is not None:
            value = tf.fill(shape, tf.cast(initial_value, inner.dtype))
            _release_unread(inner)
        else:
            # A variable made while a function was traced is initialized by
            # that function's first call: it has no value to read yet.
            if not inner.is_initialized():
                return False
            value = inner.read_value()
        grown = tf.Variable(
            value,
            shape=tf.TensorShape([None]).concatenate(inner.shape[1:]),
            trainable=inner.trainable,
            name=variable.name,
            dtype=inner.dtype,
        )
    framework_private.set_keras_variable_backing(variable, grown)
    setattr(variable, GROWABLE_ATTRIBUTE, True)
    return True


def _release_unread(inner: tf.Variable) -> None:
    """Empties a replaced variable that a traced function made and has not
    initialized yet (Keras builds an optimizer inside ``fit``'s first trace).

    ``tf.function`` keeps the variables its first trace made, with their
    initializers, for as long as the function lives, and initializes them
    after the trace: the replaced slot would hold a table-sized buffer no
    step reads. Given a value with no rows now, it counts as initialized, its
    initializer is skipped and it holds nothing. Called under ``init_scope``.
    """
    if inner.is_initialized():
        return
    empty = tf.zeros([0, *inner.shape[1:]], inner.dtype)
    tf.raw_ops.AssignVariableOp(resource=inner.handle, value=empty, validate_shape=False)


def is_growable(variable: Any) -> bool:
    """Whether :func:`make_growable` made ``variable``'s rows growable."""
    return bool(getattr(variable, GROWABLE_ATTRIBUTE, False))


def num_rows(variable: Any) -> int:
    """The rows ``variable`` holds now (read from its buffer, not its static shape)."""
    with tf.init_scope():
        return int(tf.shape(_backing(variable).value())[0])


def grow_rows(variable: Any, rows: int) -> None:
    """Appends copies of the last row of a growable ``variable`` until it
    holds ``rows`` rows (no change where it holds as many already).

    The last row of every variable grown here is one no step writes (a
    store's sentinel, its mask's false entry, a slot row no row owns), so
    its copies hold what new rows start with.
    """
    if not is_growable(variable):
        raise ValueError(f"variable {getattr(variable, 'name', variable)!r} is not growable")
    inner = _backing(variable)
    with tf.init_scope():
        value = inner.read_value()
        have = int(tf.shape(value)[0])
        if rows <= have:
            return
        last = tf.repeat(value[-1:], rows - have, axis=0)
        inner.assign(tf.concat([value, last], 0))
    if not isinstance(variable, tf.Variable):
        framework_private.set_keras_variable_shape(
            variable, (rows, *(int(size) for size in inner.shape[1:]))
        )


class GrowWithMask:
    """A watcher (``_internal.row_mask.watch_mask``) that grows ``variables``
    (the full-size optimizer slots of a growable table) to the rows of the
    table's mask when it is told the mask changed."""

    def __init__(self, variables: list[Any]) -> None:
        self.variables = list(variables)

    def mask_changed(self, mask_variable: Any) -> None:
        rows = num_rows(mask_variable)
        for variable in self.variables:
            grow_rows(variable, rows)
