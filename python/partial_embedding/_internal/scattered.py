"""Small state variables written row by row with TensorFlow's scatter ops.

TensorFlow's ``ResourceScatter*`` kernels switch a variable into copy-on-read
mode for good (see ``variables.gather_rows``): a full read of it copies it from
then on. The counters of row admission and a compact slot store's free pool
are written this way (our in-place kernel takes float tables only), so they
are read only here, row by row (``ResourceGather``, which copies nothing),
and never whole inside a step.
"""

from __future__ import annotations

import tensorflow as tf

from partial_embedding._internal import xla as _xla
from partial_embedding._internal.context import in_xla_context


def read_rows(variable: tf.Variable, rows: tf.Tensor) -> tf.Tensor:
    """``variable[rows]``, a sparse read."""
    return tf.raw_ops.ResourceGather(resource=variable.handle, indices=rows, dtype=variable.dtype)


def write_rows_where(
    variable: tf.Variable, rows: tf.Tensor, values: tf.Tensor, where: tf.Tensor, add: bool = False
) -> None:
    """``variable[rows[i]] = values[i]`` (``+=`` with ``add``) where ``where[i]``.

    The rows written must be distinct and in range. Under XLA every position
    is passed and the others skipped (out-of-bounds rows, see
    ``xla.write_targets``); elsewhere the positions are selected first.
    """
    values = tf.cast(values, variable.dtype)
    if in_xla_context():
        rows = _xla.write_targets(rows, where)
    else:
        rows, values = tf.boolean_mask(rows, where), tf.boolean_mask(values, where)
    op = tf.raw_ops.ResourceScatterAdd if add else tf.raw_ops.ResourceScatterUpdate
    op(resource=variable.handle, indices=rows, updates=values)
