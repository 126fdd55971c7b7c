"""Transparent huge pages for large CPU tables.

``advise_huge_pages`` moves a variable's value into a buffer advised
``MADV_HUGEPAGE``, as the in-place kernels do themselves for tables of
``HUGE_PAGES_MIN_BYTES`` or more.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._loader import load_ops
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.ops._variables import is_distributed, resolve_variable

__all__ = ["HUGE_PAGES_MIN_BYTES", "advise_huge_pages"]

#: Smallest value the in-place kernels move into huge pages: 32 MiB.
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
    _check_min_bytes(min_bytes)
    resolved = resolve_variable(variable, argument="variable")
    if is_distributed(resolved):
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


def _check_min_bytes(min_bytes: Any) -> None:
    """Refuses anything but an int >= 0."""
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, (int, np.integer)):
        raise PartialEmbeddingArgumentError(
            f"min_bytes: expected an int >= 0, got {type(min_bytes).__name__} {min_bytes!r}"
        )
    if min_bytes < 0:
        raise PartialEmbeddingArgumentError(f"min_bytes: must be >= 0, got {min_bytes}")
