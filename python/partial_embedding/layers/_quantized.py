"""Frozen rows in int8, trainable rows in float: the quantized partial layers.

Keras quantizes an embedding (``layer.quantize("int8")``, ``model.quantize``,
an ``"int8_from_float32"`` dtype policy) into int8 rows with one float scale
per row, after which nothing trains. A quantized ``PartialEmbedding`` keeps
the same int8 rows and scales (the same quantizer, so the bytes agree with
Keras' bit for bit) and next to them a small float store:

* ``float_rows``: ``[capacity + 1, output_dim]`` in the layer's variable dtype,
  one row per table row that has been trainable since quantization (in the
  order rows got one), and a last row that no id ever trains (the sentinel
  that lookups of other ids point at, so their gradient is dropped);
* ``float_rows_mask``: bool ``[capacity + 1]``, which store rows learn now
  (the row-mask contract of ``MaskedOptimizer``: its rules, compact slots
  included, train the store as they train a table);
* ``float_row_ids`` / ``float_row_index``: int64 ``[capacity + 1]``, the
  table rows that have a store row, sorted (padded with ``input_dim``), and
  the store row of each: a lookup finds its rows with a binary search, no
  map of the vocabulary's size. (int64, not int32: TensorFlow keeps int32
  variables in host memory on a GPU, where an XLA step cannot reach them.)

A lookup returns the float row for ids with a store row and
``int8 / scale`` (Keras' formula) for the others; its gradient is an
``IndexedSlices`` over store rows only. ``freeze`` / ``unfreeze`` /
``set_trainable_ids`` assign to the masks (no retracing); a row unfrozen for
the first time gets a store row holding its dequantized values, and a row
frozen again keeps its store row and its trained values. When more rows learn
than the store has room for, it grows (by half, or to what is needed) as
compact optimizer slots do: its variables are made with an unknown number of
rows (``_internal.growable``), so steps traced before read the grown store;
``trainable_capacity`` follows. Under a ``tf.distribute`` strategy the store
cannot grow and its capacity stays as quantized.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.growable import grow_rows, is_growable, make_growable
from partial_embedding._internal.row_mask import ROW_MASK_ATTRIBUTE, mask_changed
from partial_embedding._internal.types import Table
from partial_embedding._internal.variables import (
    assign_host_rows,
    gather_rows,
    is_distributed,
    read_host_rows,
    sharded_variable,
)
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.layers import _host_frozen, _table_init
from partial_embedding.layers._row_masked import RowMaskedConstraint, RowMaskedRegularizer
from partial_embedding.layers._stock_weights import assign_table
from partial_embedding.ops.quantized import quantized_lookup

#: The modes a partial layer quantizes to.
QUANTIZED_MODES = ("int8",)

#: (first row, end row) -> those rows of the float table, as NumPy.
FloatBlocks = Callable[[int, int], np.ndarray]


def default_capacity(trainable: int, input_dim: int) -> int:
    """Store rows reserved when none are asked for: the trainable rows and a
    sixteenth again (at least 16 more), at most the vocabulary. Each spare
    row costs a float row and, once it trains, its optimizer slots."""
    return min(input_dim, trainable + max(trainable // 16, 16))


def checked_capacity(capacity: Any, trainable: int, input_dim: int) -> int:
    """``trainable_capacity`` as an int, or the default when None.

    Raises:
      PartialEmbeddingArgumentError: not an integer in ``[trainable, input_dim]``.
    """
    if capacity is None:
        return default_capacity(trainable, input_dim)
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise PartialEmbeddingArgumentError(
            f"trainable_capacity: must be an integer or None, got {capacity!r}"
        )
    if not trainable <= int(capacity) <= input_dim:
        raise PartialEmbeddingArgumentError(
            f"trainable_capacity: {capacity} is not in [{trainable}, {input_dim}] "
            f"({trainable} rows are trainable, the table has {input_dim})"
        )
    return int(capacity)


def check_mode(mode: Any) -> None:
    """Refuses quantization modes other than int8 before anything changes.

    Raises:
      NotImplementedError: ``int4``, ``float8``, ``gptq``, ``awq`` (Keras'
        ``model.quantize`` then warns and leaves the layer as it is).
      NotImplementedError: an unknown mode too (Keras' message; ``quantize``
        itself refuses one earlier, with Keras' ValueError).
    """
    if mode in QUANTIZED_MODES:
        return
    if mode in ("int4", "float8", "gptq", "awq"):
        raise NotImplementedError(
            f"quantize: mode={mode!r} is not supported by the partial layers; "
            f"they quantize frozen rows to {' or '.join(QUANTIZED_MODES)} only"
        )
    raise NotImplementedError(
        f"Invalid quantization mode. Expected one of {QUANTIZED_MODES}. "
        f"Received: quantization_mode={mode!r}"
    )


def check_strategy(variable: Any = None) -> None:
    """Refuses quantizing under ``ParameterServerStrategy`` (not supported yet).

    Raises:
      PartialEmbeddingArgumentError: a parameter-server strategy is in scope,
        or ``variable`` is sharded across parameter servers.
    """
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    under_ps = "ParameterServerStrategy" in type(strategy).__name__
    if under_ps or (variable is not None and sharded_variable(variable) is not None):
        raise PartialEmbeddingArgumentError(
            "quantize: int8 tables are not supported under ParameterServerStrategy "
            "yet (the table and its float store would live on parameter servers); "
            "quantize outside it, or keep the table in float"
        )


def check_float_table(dtype: Any, name: str) -> None:
    """Raises PartialEmbeddingArgumentError unless ``dtype`` is floating."""
    if not tf.as_dtype(dtype).is_floating:
        raise PartialEmbeddingArgumentError(
            f"quantize: layer {name!r} holds a {tf.as_dtype(dtype).name} table; only a "
            "floating-point table can be quantized"
        )


def weight_quantizer(config: Any) -> Any:
    """The quantizer Keras' ``Embedding.quantize`` would use under ``config``."""
    quantizer = getattr(config, "weight_quantizer", None)
    return quantizer if quantizer is not None else keras.quantizers.AbsMaxQuantizer(axis=-1)


def quantize_rows(quantizer: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, per-row scales) of float rows, as Keras quantizes a table.

    The quantizer reduces over each row alone, so quantizing a table in row
    blocks gives the bytes of one call on the whole table.
    """
    codes, scale = quantizer(rows, to_numpy=True)
    return np.asarray(codes), np.squeeze(np.asarray(scale), axis=-1)


def variable_blocks(variable: Any) -> FloatBlocks:
    """Row blocks of a float variable, read without copying it whole."""

    def rows(start: int, stop: int) -> np.ndarray:
        return read_host_rows(variable, np.arange(start, stop), "embeddings")

    return rows


def table_blocks(table: Table, dtype: Any) -> FloatBlocks:
    """Row blocks of an array or memory-mapped table, cast to ``dtype`` per block."""
    source = _table_init.table_like(table)

    def rows(start: int, stop: int) -> np.ndarray:
        return np.asarray(source[start:stop]).astype(dtype)

    return rows


def initializer_blocks(initializer: Any, shape: tuple[int, int], dtype: Any) -> FloatBlocks:
    """Row blocks of an initializer's values (per block where it can, else one call)."""
    per_block = _table_init.blockwise(initializer, shape)
    if per_block is None:
        whole = np.asarray(initializer(shape, dtype=dtype))
        return lambda start, stop: whole[start:stop]
    blocks = {start: block for block, start, _ in _table_init.row_blocks(shape[0], 4 * shape[1])}
    return lambda start, stop: np.asarray(per_block(blocks[start], start, stop, dtype))


#: A store's variables with one entry per store row (the sentinel last).
STORE_VARIABLES = ("float_rows", "float_rows_mask", "float_row_ids", "float_row_index")
#: The dtype of the store's maps (see the module docstring).
STORE_INDEX_DTYPE = "int64"


#: The names of a layer's store -> those of its untied output table's store
#: (``PartialReversibleEmbedding`` with ``tie_weights=False``).
REVERSE_NAMES = {
    "_embeddings": "reverse_embeddings",
    "embeddings_scale": "reverse_embeddings_scale",
    "float_rows": "reverse_float_rows",
    "float_rows_mask": "reverse_float_rows_mask",
    "float_row_ids": "reverse_float_row_ids",
    "float_row_index": "reverse_float_row_index",
    "trainable_mask": "reverse_trainable_mask",
}


class ReverseStore:
    """The untied output table of a layer, seen as this module sees a layer.

    Reads and writes of the store's names go to the layer's ``reverse_*``
    attributes; ``add_weight`` prefixes ``reverse_``; anything else is the
    layer's own. The output table has no regularizer or constraint (as in
    Keras).
    """

    embeddings_regularizer = None
    embeddings_constraint = None

    def __init__(self, layer: Any) -> None:
        object.__setattr__(self, "layer", layer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.layer, REVERSE_NAMES.get(name, name))

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in REVERSE_NAMES:
            raise AttributeError(f"ReverseStore: {name!r} is not a store attribute")
        setattr(self.layer, REVERSE_NAMES[name], value)

    def add_weight(self, *, name: str, **kwargs: Any) -> Any:
        return self.layer.add_weight(name=f"reverse_{name}", **kwargs)


def add_int8_weights(layer: Any, in_place: bool) -> None:
    """Creates the int8 table and its scales on ``layer``, on the frozen
    table's device (``_host_frozen.frozen_device``)."""
    with _host_frozen.frozen_device(layer):
        layer._embeddings = layer.add_weight(
            name="embeddings",
            shape=(layer.input_dim, layer.output_dim),
            initializer=_table_init.uninitialized if in_place else "zeros",
            dtype="int8",
            trainable=False,
        )
        layer.embeddings_scale = layer.add_weight(
            name="embeddings_scale", shape=(layer.input_dim,), initializer="ones", trainable=False
        )


def add_store_weights(layer: Any, capacity: int) -> None:
    """Creates the float store of ``capacity`` rows (and the sentinel) on
    ``layer``, without a device scope: on the layer's compute device."""
    layer.float_rows = layer.add_weight(
        name="float_rows", shape=(capacity + 1, layer.output_dim), initializer="zeros"
    )
    layer.float_rows_mask = layer.add_weight(
        name="float_rows_mask", shape=(capacity + 1,), initializer="zeros", dtype="bool",
        trainable=False,
    )  # fmt: skip
    padding = np.full([capacity + 1], layer.input_dim, STORE_INDEX_DTYPE)
    layer.float_row_ids = layer.add_weight(
        name="float_row_ids", shape=(capacity + 1,), initializer=lambda *_, **__: padding,
        dtype=STORE_INDEX_DTYPE, trainable=False,
    )  # fmt: skip
    layer.float_row_index = layer.add_weight(
        name="float_row_index", shape=(capacity + 1,),
        initializer=lambda *_, **__: np.full([capacity + 1], capacity, STORE_INDEX_DTYPE),
        dtype=STORE_INDEX_DTYPE, trainable=False,
    )  # fmt: skip
    for name in STORE_VARIABLES:
        make_growable(getattr(layer, name))
    setattr(layer.float_rows, ROW_MASK_ATTRIBUTE, layer.float_rows_mask)
    if layer.embeddings_regularizer is not None:
        layer.float_rows.regularizer = RowMaskedRegularizer(
            layer.embeddings_regularizer, layer.float_rows_mask
        )
    if layer.embeddings_constraint is not None:
        layer.float_rows.constraint = RowMaskedConstraint(
            layer.embeddings_constraint, layer.float_rows_mask
        )


def add_quantized_weights(layer: Any, capacity: int, in_place: bool) -> None:
    """Creates the int8 table, its scales and the float store on ``layer``.

    A host layout creates its store first and its frozen table after it, so
    that a float host layer quantized later (its float table replaced by the
    int8 one) holds its weights in the order of one built quantized.
    """
    if _host_frozen.on_host(layer):
        add_store_weights(layer, capacity)
        add_int8_weights(layer, in_place)
    else:
        add_int8_weights(layer, in_place)
        add_store_weights(layer, capacity)


def fill_quantized(layer: Any, blocks: FloatBlocks, quantizer: Any, in_place: bool) -> None:
    """Quantizes the float table ``blocks`` into ``layer``'s int8 rows, block by block.

    In place (eagerly, outside a strategy) each block is written into the
    variable; elsewhere the int8 table is gathered in NumPy (a quarter of the
    float table) and assigned once, as a strategy's variables need.
    """
    scales = np.empty([layer.input_dim], np.dtype(layer.embeddings_scale.dtype))
    codes_all = None if in_place else np.empty([layer.input_dim, layer.output_dim], np.int8)
    for _, start, stop in _table_init.row_blocks(layer.input_dim, 4 * layer.output_dim):
        codes, scale = quantize_rows(quantizer, blocks(start, stop))
        scales[start:stop] = scale
        if codes_all is None:
            _table_init.write_rows(layer._embeddings, start, stop, tf.constant(codes))
        else:
            codes_all[start:stop] = codes
    if codes_all is not None:
        layer._embeddings.assign(codes_all)
    layer.embeddings_scale.assign(scales)


def dequantized_rows(layer: Any, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` as a lookup of frozen rows returns them: Keras' formula
    for an int8 table, the rows as they are for a float one (a host layout's,
    ``_host_frozen``)."""
    if not is_int8(layer):
        rows = gather_rows(layer._embeddings, tf.constant(ids, tf.int64))
        return np.asarray(rows.numpy()).astype(layer.float_rows.dtype)
    # gather_rows: tf.gather on a variable (ResourceGather) would put it in
    # copy-on-read mode, and every later step would copy the int8 table.
    codes = gather_rows(layer._embeddings, tf.constant(ids, tf.int64))
    scale = gather_rows(layer.embeddings_scale, tf.constant(ids, tf.int64))
    values = keras.ops.divide(
        keras.ops.cast(codes, layer.compute_dtype), keras.ops.expand_dims(scale, axis=-1)
    )
    return np.asarray(keras.ops.convert_to_numpy(values)).astype(layer.float_rows.dtype)


def is_int8(layer: Any) -> bool:
    """Whether ``layer``'s frozen table is int8 (else float: a host layout's)."""
    return tf.as_dtype(layer._embeddings.dtype) == tf.int8


def rows_with_float(layer: Any) -> tuple[np.ndarray, np.ndarray]:
    """(table rows that have a store row, sorted; their store rows)."""
    ids = np.asarray(layer.float_row_ids.numpy())
    used = int(np.count_nonzero(ids < layer.input_dim))
    return ids[:used], np.asarray(layer.float_row_index.numpy())[:used]


def store_capacity(layer: Any) -> int:
    """Store rows a layer holds, less the sentinel."""
    return int(layer.float_rows.shape[0]) - 1


def missing_float_rows(layer: Any, mask: np.ndarray) -> np.ndarray:
    """Rows that ``mask`` permits and that have no store row yet.

    Raises:
      PartialEmbeddingArgumentError: more of them than free store rows, where
        the store cannot grow (under a ``tf.distribute`` strategy).
    """
    have, _ = rows_with_float(layer)
    missing = np.setdiff1d(np.flatnonzero(mask), have, assume_unique=True)
    free = store_capacity(layer) - len(have)
    if len(missing) > free and not can_grow(layer):
        raise PartialEmbeddingArgumentError(
            f"ids: {len(missing)} rows would learn for the first time since "
            f"quantization, and layer {layer.name!r} has {free} free float rows "
            f"(trainable_capacity={store_capacity(layer)}), which cannot grow here "
            "(a tf.distribute strategy's variables); nothing was changed. "
            "Quantize with a larger trainable_capacity."
        )
    return missing.astype(np.int64)


def stores_of(store: Any) -> list[Any]:
    """Every store of the layer ``store`` belongs to: the layer's own, and the
    untied output table's (they share ``trainable_capacity``)."""
    layer = store.layer if isinstance(store, ReverseStore) else store
    stores = [layer]
    if getattr(layer, "reverse_float_rows", None) is not None:
        stores.append(ReverseStore(layer))
    return stores


def can_grow(store: Any) -> bool:
    """Whether the stores of ``store``'s layer can grow (see ``grow_store``)."""
    return all(
        is_growable(getattr(each, name)) for each in stores_of(store) for name in STORE_VARIABLES
    )


def grow_store(store: Any, needed: int) -> None:
    """Grows every store of ``store``'s layer to hold ``needed`` rows (by
    half at least, as compact slots grow; at most one per vocabulary row),
    keeping each stored row where it is; ``trainable_capacity`` follows.

    The sentinel (the last row: no id has it, no step writes it) moves to
    the new end; the row it leaves is free. Optimizer slots that follow the
    store's rows grow when its mask changes (``mask_changed``).
    """
    capacity = store_capacity(store)
    if needed <= capacity:
        return
    stores = stores_of(store)
    layer = stores[0]
    new_capacity = min(int(layer.input_dim), max(int(needed), capacity + capacity // 2 + 1))
    for each in stores:
        _, index = rows_with_float(each)
        for name in STORE_VARIABLES:
            grow_rows(getattr(each, name), new_capacity + 1)
        # The padding of the index names the sentinel, which moved.
        padded_index = np.full([new_capacity + 1], new_capacity, STORE_INDEX_DTYPE)
        padded_index[: len(index)] = index
        each.float_row_index.assign(padded_index)
    layer.trainable_capacity = new_capacity
    for each in stores:
        mask_changed(each.float_rows_mask)


def add_float_rows(layer: Any, ids: np.ndarray, values: np.ndarray) -> None:
    """Gives rows ``ids`` (checked by ``missing_float_rows``) store rows holding ``values``."""
    if len(ids) == 0:
        return
    have, index = rows_with_float(layer)
    new_index = np.arange(len(have), len(have) + len(ids))
    if is_distributed(layer.float_rows.value):
        # A strategy's copies are written together by a whole assign (the
        # store is small; this runs eagerly, when rows first learn).
        store = np.array(layer.float_rows.numpy())
        store[new_index] = values
        layer.float_rows.assign(store)
    else:
        assign_host_rows(layer.float_rows, new_index, values, "float_rows")
    all_ids = np.concatenate([have, ids]).astype(STORE_INDEX_DTYPE)
    all_index = np.concatenate([index, new_index]).astype(STORE_INDEX_DTYPE)
    order = np.argsort(all_ids, kind="stable")
    padded_ids = np.full([store_capacity(layer) + 1], layer.input_dim, STORE_INDEX_DTYPE)
    padded_index = np.full([store_capacity(layer) + 1], store_capacity(layer), STORE_INDEX_DTYPE)
    padded_ids[: len(order)] = all_ids[order]
    padded_index[: len(order)] = all_index[order]
    layer.float_row_ids.assign(padded_ids)
    layer.float_row_index.assign(padded_index)


def sync_store_mask(layer: Any, mask: np.ndarray) -> None:
    """Sets which store rows learn from the table's ``mask``."""
    have, index = rows_with_float(layer)
    store_mask = np.zeros([store_capacity(layer) + 1], bool)
    store_mask[index] = mask[have]
    layer.float_rows_mask.assign(store_mask)
    mask_changed(layer.float_rows_mask)


def write_mask(layer: Any, mask: np.ndarray) -> None:
    """``layer``'s new row mask: store rows for newly permitted rows, then the masks."""
    missing = missing_float_rows(layer, mask)
    have, _ = rows_with_float(layer)
    grow_store(layer, len(have) + len(missing))
    add_float_rows(layer, missing, dequantized_rows(layer, missing))
    layer.trainable_mask.assign(mask)
    sync_store_mask(layer, mask)


def lookup(layer: Any, flat_ids: tf.Tensor) -> tf.Tensor:
    """Rows of flat ids: float rows where the id has one, else the frozen
    table's (dequantized int8; a host layout's are gathered on the host)."""
    if _host_frozen.on_host(layer):
        return _host_frozen.lookup(layer, flat_ids)
    if framework_private.in_stateless_scope():
        # model.stateless_call: every value comes from the scope, as tensors.
        def read(variable: Any) -> Any:
            return tf.convert_to_tensor(variable.value)
    else:

        def read(variable: Any) -> Any:
            return variable

    return quantized_lookup(
        read(layer._embeddings),
        read(layer.embeddings_scale),
        read(layer.float_rows),
        read(layer.float_rows_mask),
        read(layer.float_row_ids),
        read(layer.float_row_index),
        flat_ids,
        compute_dtype=layer.compute_dtype,
    )


def _float_values(table: Table | None, ids: np.ndarray, dtype: Any) -> np.ndarray | None:
    """Rows ``ids`` of a given float table (None without one)."""
    if table is None:
        return None
    return np.asarray(_table_init.table_like(table)[ids]).astype(dtype)


def initial_mask(layer: Any, mask: np.ndarray | None) -> np.ndarray | None:
    """The mask a quantized layer is built with: ``mask``; without one (every
    row learns) and with fewer float rows than rows, none: a layer made from
    its config alone has every row frozen until its weights are loaded."""
    capacity = layer.trainable_capacity
    if mask is None and capacity is not None and int(capacity) < layer.input_dim:
        return np.zeros([layer.input_dim], bool)
    return mask


def build_quantized(layer: Any, table: Table | None, mask: np.ndarray) -> None:
    """Builds ``layer`` quantized (an ``int8_from_*`` policy): from ``table``
    (array or memory-mapped, read in row blocks: no float table is held
    whole) or from its initializer, its trainable rows' floats from ``table``
    when given, else dequantized."""
    check_mode(layer.quantization_mode)
    check_strategy()
    check_float_table(layer.variable_dtype, layer.name)
    capacity = checked_capacity(
        layer.trainable_capacity, int(np.count_nonzero(mask)), layer.input_dim
    )
    # Recorded for get_config: a layer rebuilt from it gets the same shapes.
    layer.trainable_capacity = capacity
    in_place = _table_init.can_fill_in_place()
    add_quantized_weights(layer, capacity, in_place)
    shape = (layer.input_dim, layer.output_dim)
    if table is not None:
        blocks = table_blocks(table, layer.variable_dtype)
    else:
        blocks = initializer_blocks(layer.embeddings_initializer, shape, layer.variable_dtype)
    fill_quantized(layer, blocks, weight_quantizer(layer.quantization_config), in_place)
    trainable_ids = np.flatnonzero(mask)
    values = _float_values(table, trainable_ids, layer.variable_dtype)
    if values is None:
        values = dequantized_rows(layer, trainable_ids)
    add_float_rows(layer, trainable_ids, values)
    sync_store_mask(layer, mask)
    layer._is_quantized = True


def build_host_float(layer: Any, table: Table | None, mask: np.ndarray) -> None:
    """Builds a float host layout (``_host_frozen``): the store, then the
    frozen table on the host, made as a float layer's table is (from
    ``table`` or the initializer, in row blocks where it can) but not
    trainable; the rows of ``mask`` get store rows holding their values."""
    _host_frozen.check_strategy()
    capacity = checked_capacity(
        layer.trainable_capacity, int(np.count_nonzero(mask)), layer.input_dim
    )
    # Recorded for get_config: a layer rebuilt from it gets the same shapes.
    layer.trainable_capacity = capacity
    add_store_weights(layer, capacity)
    shape = (layer.input_dim, layer.output_dim)
    with _host_frozen.frozen_device(layer):
        layer._embeddings = _table_init.create_table(
            layer, shape, layer.embeddings_initializer, table, trainable=False
        )
    trainable_ids = np.flatnonzero(mask)
    add_float_rows(layer, trainable_ids, dequantized_rows(layer, trainable_ids))
    sync_store_mask(layer, mask)


def _quantize_host_float(layer: Any, mode: Any, config: Any, capacity: Any) -> None:
    """``quantize`` of a float host layout: the float frozen table is
    quantized in row blocks into an int8 one on the host and dropped; the
    store (and the optimizer's slots of it) stays as it is."""
    check_mode(mode)
    table = layer._embeddings
    check_float_table(table.dtype, layer.name)
    have, _ = rows_with_float(layer)
    if capacity is not None:
        grow_store(layer, checked_capacity(capacity, len(have), layer.input_dim))
    in_place = _table_init.can_fill_in_place()
    layer.quantization_config = config
    del layer.embeddings
    add_int8_weights(layer, in_place)
    fill_quantized(layer, variable_blocks(table), weight_quantizer(config), in_place)
    layer._is_quantized = True
    if layer.dtype_policy.quantization_mode is None:
        layer.dtype_policy = keras.dtype_policies.get(f"{mode}_from_{layer.dtype_policy.name}")


def quantize_built(layer: Any, mode: Any, config: Any, capacity: Any) -> None:
    """``layer.quantize(mode)`` of a built float layer: everything is checked
    first; the float table is then quantized in row blocks (its trainable
    rows copied into the store as they are) and dropped."""
    if _host_frozen.on_host(layer):
        _quantize_host_float(layer, mode, config, capacity)
        return
    check_mode(mode)
    table = layer.embeddings
    check_strategy(table)
    check_float_table(table.dtype, layer.name)
    mask = layer._current_mask()
    layer.trainable_capacity = checked_capacity(
        capacity if capacity is not None else layer.trainable_capacity,
        int(np.count_nonzero(mask)),
        layer.input_dim,
    )
    trainable_ids = np.flatnonzero(mask)
    values = read_host_rows(table, trainable_ids, "embeddings")
    in_place = _table_init.can_fill_in_place()
    layer.quantization_config = config
    del layer.embeddings
    add_quantized_weights(layer, layer.trainable_capacity, in_place)
    fill_quantized(layer, variable_blocks(table), weight_quantizer(config), in_place)
    add_float_rows(layer, trainable_ids, values)
    sync_store_mask(layer, mask)
    layer._is_quantized = True
    if layer.dtype_policy.quantization_mode is None:
        layer.dtype_policy = keras.dtype_policies.get(f"{mode}_from_{layer.dtype_policy.name}")


def load_stock(layer: Any, arrays: list[Any]) -> bool:
    """Loads a stock ``Embedding``'s saved table into a quantized ``layer``.

    ``[float table]`` is quantized (block by block) and its rows that have a
    store row are copied in as they are; ``[int8 table, scales]`` (a
    quantized stock ``Embedding``'s) is assigned, and rows with a store row
    get their dequantized values. Anything else: False, nothing changed.
    """
    shape = (layer.input_dim, layer.output_dim)
    have, _ = rows_with_float(layer)
    if len(arrays) == 1 and tuple(np.shape(arrays[0])) == shape:
        table = arrays[0]
        if not np.issubdtype(np.asarray(table[:1]).dtype, np.floating):
            return False
        if not is_int8(layer):
            # A float host layout: the table as it is, in row blocks.
            assign_table(layer._embeddings, table, shape, layer.name, "a stock Embedding's table")
            overwrite_float_rows(layer, have, _float_values(table, have, layer.variable_dtype))
            return True
        blocks = table_blocks(table, layer.variable_dtype)
        fill_quantized(layer, blocks, weight_quantizer(layer.quantization_config), in_place=False)
        values = _float_values(table, have, layer.variable_dtype)
    elif (
        len(arrays) == 2
        and is_int8(layer)
        and tuple(np.shape(arrays[0])) == shape
        and tuple(np.shape(arrays[1])) == (layer.input_dim,)
        and np.asarray(arrays[0][:1]).dtype == np.int8
    ):
        layer._embeddings.assign(np.asarray(arrays[0]))
        layer.embeddings_scale.assign(np.asarray(arrays[1]))
        values = dequantized_rows(layer, have)
    else:
        return False
    overwrite_float_rows(layer, have, values)
    return True


def overwrite_float_rows(layer: Any, ids: np.ndarray, values: Any) -> None:
    """Writes ``values`` into the store rows of rows ``ids`` (which have one)."""
    have, index = rows_with_float(layer)
    rows = index[np.searchsorted(have, ids)]
    store = np.array(layer.float_rows.numpy())
    store[rows] = values
    layer.float_rows.assign(store)
