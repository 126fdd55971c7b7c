"""Transparent huge pages for large CPU tables.

``advise_huge_pages`` advises a variable's buffer ``MADV_HUGEPAGE`` where it
lies and has the kernel collapse it into huge pages (``MADV_COLLAPSE``), as the
in-place kernels do themselves for tables of ``HUGE_PAGES_MIN_BYTES`` or more.
Nothing is copied.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._internal.types import Variable
from partial_embedding._internal.variables import is_distributed, resolve_variable
from partial_embedding._loader import load_ops
from partial_embedding.errors import PartialEmbeddingArgumentError

__all__ = ["HUGE_PAGES_MIN_BYTES", "advise_huge_pages"]

#: Smallest value the in-place kernels advise for huge pages: 32 MiB.
HUGE_PAGES_MIN_BYTES = 32 * 2**20


def advise_huge_pages(variable: Variable, min_bytes: int = HUGE_PAGES_MIN_BYTES) -> bool:
    """Backs a large CPU variable with transparent huge pages (Linux), in place.

    Advises the variable's buffer where it lies: ``MADV_HUGEPAGE`` on its
    2 MiB-aligned interior, then ``MADV_COLLAPSE`` (Linux 6.1 and later), so
    that the scattered row reads and writes of a training step stop missing
    the TLB. Values, shape, dtype and the buffer are unchanged and nothing is
    copied. The in-place kernels (hence ``MaskedOptimizer``) already do this
    the first time they write a CPU table or slot of 32 MiB or more; call it
    for a large table that is only read, or to pay for the collapse when you
    choose. ``PARTIAL_EMBEDDING_HUGE_PAGES=0`` turns both off. Runs eagerly,
    also while a ``tf.function`` is traced. Costs and conditions:
    docs/large_vocabularies.md, "Huge pages".

    Args:
      variable: A ``tf.Variable`` or Keras 3 variable.
      min_bytes: Smallest value size worth advising (default 32 MiB).

    Returns:
      True when this call advised the buffer (it is on huge pages where the
      collapse found the memory for them). False, doing nothing, for a value
      smaller than ``min_bytes`` or without a whole 2 MiB page inside, a
      buffer advised before, a variable without a value, not on the CPU or
      distributed, a platform without transparent huge pages, or
      ``PARTIAL_EMBEDDING_HUGE_PAGES=0``.

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
