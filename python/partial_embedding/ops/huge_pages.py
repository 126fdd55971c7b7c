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
    """Backs a large CPU variable with transparent huge pages (Linux).

    A training step of a large embedding reads and writes a few thousand rows
    scattered over the table and its optimizer slots. With the usual 4 KiB
    pages nearly every such access also misses the TLB and walks the page
    table; with 2 MiB pages most do not. This advises the variable's buffer
    where it lies: ``MADV_HUGEPAGE`` on its 2 MiB-aligned interior (the
    partial pages at either end stay small), then ``MADV_COLLAPSE`` (Linux
    6.1 and later), which has the kernel move the small pages under each
    2 MiB piece into one huge page, piece after piece. Values, shape, dtype
    and the buffer itself are unchanged, and nothing is copied: the process
    needs one free huge page at a time, never a second table.

    The in-place kernels (``masked_scatter_sub``, ``masked_sparse_apply_adam``,
    hence ``MaskedOptimizer``) already do this, with ``min_bytes`` = 32 MiB,
    the first time they write a CPU table or slot. Call it for a large table
    that is only read, or to pay for the collapse at a time of your choosing.
    The environment variable ``PARTIAL_EMBEDDING_HUGE_PAGES=0`` turns both
    off.

    A buffer is advised once. A later assignment of a whole new value (a
    checkpoint restore, ``assign``) may bring a new buffer, which the next
    in-place write advises again. The collapse costs about what one copy of
    the table would, once (on this project's 2-core VM 0.3 to 1.4 s for a
    512 MiB table, 3.4 to 5.2 s for 2 GiB). Where the kernel has no ``MADV_COLLAPSE``, or
    no free huge page when asked (short of memory), the advice stays and the
    table keeps its 4 KiB pages for now (the kernel's ``khugepaged`` may
    collapse it later); it is never copied to get huge pages. Whether the
    kernel maps huge pages at all depends on
    ``/sys/kernel/mm/transparent_hugepage`` (not ``never``) and on free
    memory: ``AnonHugePages`` in ``/proc/self/smaps`` shows it.

    Runs eagerly, also when called while tracing a ``tf.function``.

    Args:
      variable: A ``tf.Variable`` or Keras 3 variable.
      min_bytes: Smallest value size worth advising (default 32 MiB).

    Returns:
      True when this call advised the variable's buffer for huge pages (and
      asked the kernel to collapse it): the buffer is now advised, though it
      is on huge pages only where the collapse found the memory for them.
      False (nothing done) for a value smaller than ``min_bytes`` or without
      a whole 2 MiB page inside, a buffer advised before, a variable without
      a value yet, on another device than the CPU or distributed over
      several, a platform without transparent huge pages (or whose kernel
      refused the advice), or ``PARTIAL_EMBEDDING_HUGE_PAGES=0``.

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
