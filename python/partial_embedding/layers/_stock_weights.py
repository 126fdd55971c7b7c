"""A stock ``Embedding``'s table: found in a weights file, copied into ours."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.types import Table, Variable
from partial_embedding.layers._table_init import can_fill_in_place, copy_rows, table_like
from partial_embedding.ops import resolve_variable


def assign_table(
    variable: Variable, table: Table, expected: tuple[int, int], layer_name: str, source: str
) -> None:
    """Copies ``table`` (of shape ``expected``) into ``variable``, in row blocks where it can.

    Raises:
      ValueError: ``table`` is not of shape ``expected``, in Keras' words;
        ``variable`` is untouched.
    """
    table = table_like(table)
    if tuple(table.shape) != expected:
        raise ValueError(
            f"Layer {layer_name} weight shape {expected} is not compatible "
            f"with provided weight shape {tuple(table.shape)} ({source})."
        )
    target = resolve_variable(variable, "embeddings")
    if can_fill_in_place() and not isinstance(target, tf.distribute.DistributedValues):
        copy_rows(variable, table)
    else:
        variable.assign(np.asarray(table))


def _stock_entry(store: Any, path: str) -> str | None:
    """Where a stock ``Embedding`` standing for ``path``'s layer saved its table, or None."""
    parent, _, leaf = path.rpartition("/")
    if leaf != "partial_embedding":
        return None
    prefix = f"{parent}/" if parent else ""
    stock_path = f"{prefix}embedding"
    unambiguous = (
        framework_private.h5_has_path(store, f"{stock_path}/vars")
        and not framework_private.h5_has_path(store, f"{prefix}embedding_1")
        and not framework_private.h5_has_path(store, path)
    )
    return stock_path if unambiguous else None


def stock_embedding_table(store: Any) -> np.ndarray | None:
    """The table a stock ``Embedding`` saved where this layer found nothing.

    Keras' weights files name a container's layers by class
    (``layers/embedding``, ``layers/embedding_1``, ...), so a model in which
    a stock ``Embedding`` became a ``PartialEmbedding`` looks for
    ``layers/partial_embedding``. When this layer is the first
    ``PartialEmbedding`` of its container and the file holds exactly one stock
    ``embedding`` there (and no ``partial_embedding``), that entry is this
    layer's. Anything else: None, and Keras' own error follows. This reads the
    H5 store's current path, a private member; without it, None.
    """
    path = framework_private.h5_entry_path(store)
    if not isinstance(path, str) or not hasattr(store, "get"):
        return None
    try:
        stock_path = _stock_entry(store, path)
        if stock_path is None:
            return None
        stock_store = store.get(stock_path)
        try:
            if len(stock_store.keys()) != 1:
                return None
            return np.asarray(stock_store["0"])
        finally:
            # get() moves the shared store; put it back where Keras left it.
            store.get(path)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
