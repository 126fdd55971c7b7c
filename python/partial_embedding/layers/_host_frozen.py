"""Frozen rows in host memory: ``PartialEmbedding(..., frozen_rows_on="host")``.

The layout is the int8 layout's (``_quantized``): a frozen ``[V, D]`` table
that no step writes, and a compact float store of the rows that learn
(``float_rows`` and its mask, ids and index), trained by ``MaskedOptimizer``
through the row-mask contract. With ``frozen_rows_on="host"`` the frozen
table is float (or int8 with its scales, after ``quantize("int8")``) and its
variables are created under ``tf.device(HOST_DEVICE)``; the store's
variables, and so the optimizer's slots of the store, are created without a
device scope, on the layer's compute device (a GPU when there is one).

A lookup gathers the batch's frozen rows on the host (int8 rows are
dequantized there too) and copies only those rows to the compute device,
where the store's rows are gathered and the two are merged. The gradient
reaches the store only, so the update never leaves the compute device.

Under a ``tf.distribute`` strategy the strategy creates every variable
where it places its replicas (``MirroredStrategy`` ignores device scopes):
the layout and its values are the same, the frozen table's placement is
the strategy's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.variables import gather_rows
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.ops import entry_stop_gradients, masked_embedding_lookup
from partial_embedding.ops.quantized import stock_rows, store_rows_of

#: The value of ``frozen_rows_on`` that keeps the frozen table in host memory.
HOST = "host"
#: Where a host layout's frozen table lives.
HOST_DEVICE = "/CPU:0"


def on_host(layer: Any) -> bool:
    """Whether ``layer`` (or a ``_quantized.ReverseStore`` of it) keeps its
    frozen rows in host memory."""
    return getattr(layer, "frozen_rows_on", None) == HOST


@contextlib.contextmanager
def frozen_device(layer: Any) -> Iterator[None]:
    """The device scope of ``layer``'s frozen table: the host's for a host
    layout, none (the default placement) otherwise."""
    if on_host(layer):
        with tf.device(HOST_DEVICE):
            yield
    else:
        yield


def check_strategy() -> None:
    """Refuses a host layout under ``ParameterServerStrategy`` (not supported).

    Raises:
      PartialEmbeddingArgumentError: a parameter-server strategy is in scope.
    """
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    if "ParameterServerStrategy" in type(strategy).__name__:
        raise PartialEmbeddingArgumentError(
            "frozen_rows_on: 'host' is not supported under ParameterServerStrategy "
            "(the table lives on the parameter servers there); use frozen_rows_on='device'"
        )


def _read(variable: Any) -> Any:
    if framework_private.in_stateless_scope():
        # model.stateless_call: every value comes from the scope, as tensors.
        return tf.convert_to_tensor(variable.value)
    return variable


def _rows(source: Any, ids: tf.Tensor) -> tf.Tensor:
    if isinstance(source, tf.Tensor):
        return tf.gather(source, ids)
    return gather_rows(source, ids)


def frozen_lookup(layer: Any, flat_ids: tf.Tensor) -> tf.Tensor:
    """The frozen table's rows of ``flat_ids`` in the compute dtype, gathered
    (and dequantized, int8) on the frozen table's device: only ``[N, D]``
    leaves it."""
    table = _read(layer._embeddings)
    with frozen_device(layer):
        if tf.as_dtype(layer._embeddings.dtype) == tf.int8:
            scales = _read(layer.embeddings_scale)
            return stock_rows(table, scales, flat_ids, tf.as_dtype(layer.compute_dtype))
        return tf.cast(_rows(table, flat_ids), layer.compute_dtype)


def lookup(layer: Any, flat_ids: tf.Tensor) -> tf.Tensor:
    """Rows of flat ids of a host layout: store rows where an id has one, the
    frozen table's (gathered on the host) elsewhere; the gradient is an
    ``IndexedSlices`` over the store rows of permitted occurrences."""
    frozen = frozen_lookup(layer, flat_ids)
    sorted_ids = tf.convert_to_tensor(_read(layer.float_row_ids))
    store_rows = store_rows_of(
        sorted_ids, tf.convert_to_tensor(_read(layer.float_row_index)), flat_ids
    )
    store, store_mask = _read(layer.float_rows), _read(layer.float_rows_mask)
    if isinstance(store, tf.Tensor):
        permitted = tf.gather(store_mask, store_rows)
        trained = entry_stop_gradients(tf.gather(store, store_rows), tf.expand_dims(permitted, -1))
    else:
        trained = masked_embedding_lookup(store, store_rows, store_mask)
    sentinel = tf.shape(sorted_ids, out_type=store_rows.dtype)[0] - 1
    has_row = tf.not_equal(store_rows, sentinel)
    return tf.where(tf.expand_dims(has_row, -1), tf.cast(trained, frozen.dtype), frozen)
