"""Building a table without table-sized transients: block-wise, in place.

A table of at least ``BLOCKED_INIT_MIN_BYTES`` (or any table given as
values) is created uninitialized and written in row blocks of about
``BLOCK_BYTES``; a smaller table is made by Keras' ``add_weight`` as a stock
``Embedding``'s is (same values under the same seed).
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.row_mask import as_array
from partial_embedding._internal.types import Table, Variable
from partial_embedding.ops import resolve_variable

# At this size add_weight's transients (about three tables) cost 192 MiB.
BLOCKED_INIT_MIN_BYTES = 64 * 2**20

# Rows are initialized or copied this many bytes at a time. A block's
# transients (a random initializer makes about three) stay far below a table.
BLOCK_BYTES = 4 * 2**20

# Initializers whose value at a row depends only on the row's block and seed:
# deterministic ones give exactly the values of one call; seeded random ones
# get one seed per block (below). Exact types only: a subclass may override
# __call__.
_CONSTANT_INITIALIZERS = (
    keras.initializers.Zeros,
    keras.initializers.Ones,
    keras.initializers.Constant,
)
_SEEDED_INITIALIZERS = (
    keras.initializers.RandomUniform,
    keras.initializers.RandomNormal,
    keras.initializers.TruncatedNormal,
    keras.initializers.VarianceScaling,
    keras.initializers.GlorotUniform,
    keras.initializers.GlorotNormal,
    keras.initializers.HeUniform,
    keras.initializers.HeNormal,
    keras.initializers.LecunUniform,
    keras.initializers.LecunNormal,
)

#: (block index, first row, end row, dtype name) -> the rows' values.
BlockValues = Callable[[int, int, int, Any], Any]


def row_blocks(rows: int, row_bytes: int) -> Iterator[tuple[int, int, int]]:
    """(block index, first row, end row) of each block of about BLOCK_BYTES."""
    rows_per_block = max(1, BLOCK_BYTES // max(1, row_bytes))
    for index, start in enumerate(range(0, rows, rows_per_block)):
        yield index, start, min(rows, start + rows_per_block)


def uninitialized(shape: Any, dtype: Any = None) -> tf.Tensor:
    # Never read before every row is written: its pages are fresh, so the
    # variable that adopts (or copies) it costs one table, filled in place.
    return tf.raw_ops.Empty(shape=list(shape), dtype=tf.as_dtype(dtype or "float32"), init=False)


def reserve_block_memory() -> None:
    """Has the allocator hold room for a few blocks before the table exists.

    TensorFlow's CPU allocator with oneDNN (the default on x86) is a BFC pool
    that grows by regions at least as large as its last one and keeps
    bookkeeping of 1/32 of each region's size. Created after the table, the
    first block would open a table-sized region (1/32 of a table in
    bookkeeping); created before it, a small free region takes every block.
    """
    scratch = tf.raw_ops.Empty(shape=[4 * BLOCK_BYTES], dtype=tf.uint8, init=False)
    del scratch


def _seed_entropy(seed: Any) -> list[int]:
    """Non-negative integers that stand for an initializer's seed (one draw)."""
    if isinstance(seed, keras.random.SeedGenerator):
        # One draw, as one unblocked call would take.
        seed = [int(part) for part in np.asarray(seed.next()).reshape(-1)]
    elif isinstance(seed, numbers.Integral):
        seed = [int(seed)]
    else:
        return []
    return [part & 0xFFFFFFFFFFFFFFFF for part in seed]


def _block_seed(entropy: list[int], block: int) -> int:
    state = np.random.SeedSequence([*entropy, block]).generate_state(1, np.uint32)
    return int(state[0]) >> 1


def _fan(shape: tuple[int, ...], initializer: Any) -> float:
    """The fan a VarianceScaling initializer divides its scale by, for shape."""
    input_axes = getattr(initializer, "input_axes", None)
    output_axes = getattr(initializer, "output_axes", None)
    if input_axes is not None and output_axes is not None:
        fan_in = int(np.prod([shape[axis] for axis in input_axes]))
        fan_out = int(np.prod([shape[axis] for axis in output_axes]))
    else:
        fan_in, fan_out = shape[0], shape[1]
    if initializer.mode == "fan_in":
        return max(1.0, fan_in)
    if initializer.mode == "fan_out":
        return max(1.0, fan_out)
    return max(1.0, (fan_in + fan_out) / 2.0)


def blockwise(
    initializer: keras.initializers.Initializer, shape: tuple[int, int]
) -> BlockValues | None:
    """A function (block, start, stop, dtype) -> the rows start:stop, or None.

    Constant initializers give the rows one call would. A seeded random one is
    called per block with its own seed, derived from the initializer's seed
    (its int, or one draw of its SeedGenerator) and the block's index: the
    same distribution, not the same numbers as one call, and the same numbers
    on every build with the same seed. VarianceScaling keeps the full table's
    fans. Anything else (Orthogonal, Identity, a custom callable): None.
    """
    kind = type(initializer)
    if kind in _CONSTANT_INITIALIZERS:
        if kind is keras.initializers.Constant and np.ndim(initializer.value) != 0:
            return None

        def constant_rows(block: int, start: int, stop: int, dtype: Any) -> Any:
            return initializer((stop - start, *shape[1:]), dtype=dtype)

        return constant_rows
    if kind not in _SEEDED_INITIALIZERS:
        return None
    entropy = _seed_entropy(getattr(initializer, "seed", None))
    if not entropy:
        return None

    def random_rows(block: int, start: int, stop: int, dtype: Any) -> Any:
        block_shape = (stop - start, *shape[1:])
        part = copy.copy(initializer)
        part.seed = _block_seed(entropy, block)
        if isinstance(initializer, keras.initializers.VarianceScaling):
            # The block divides by its own fan: scale it so that the result
            # is the full table's variance.
            part.scale = initializer.scale * _fan(block_shape, part) / _fan(shape, part)
        return part(block_shape, dtype=dtype)

    return random_rows


def can_fill_in_place() -> bool:
    """Whether a table can be created uninitialized and written in blocks."""
    # Under a tf.distribute strategy the table is a per-device variable and in
    # a stateless scope Keras defers its creation: there, Keras' plain path.
    return (
        tf.executing_eagerly()
        and not framework_private.in_stateless_scope()
        and not tf.distribute.has_strategy()
    )


def write_rows(variable: tf.Variable, start: int, stop: int, values: Any) -> None:
    """Writes ``values`` into rows ``start:stop`` of ``variable``, in place."""
    # In place while nobody else holds the buffer (as at construction).
    width = int(variable.shape[1])
    tf.raw_ops.ResourceStridedSliceAssign(
        ref=variable.handle,
        begin=tf.constant([start, 0], tf.int64),
        end=tf.constant([stop, width], tf.int64),
        strides=tf.constant([1, 1], tf.int64),
        value=values,
    )
    # That op switches the variable into copy-on-read mode (every later read
    # would copy the whole table, also each training step's lookup); nothing
    # else holds the buffer now, so switch it back off.
    tf.raw_ops.DisableCopyOnRead(resource=variable.handle)


def copy_rows(variable: Variable, table: Table) -> None:
    """Copies an array-like table (NumPy, memmap, ...) into ``variable`` in row blocks.

    A memory-mapped file is read a block at a time, never whole.
    """
    target = resolve_variable(variable, "embeddings")
    dtype = target.dtype
    row_bytes = dtype.size * int(np.prod(target.shape[1:]))
    for _, start, stop in row_blocks(int(target.shape[0]), row_bytes):
        values = keras.ops.convert_to_tensor(np.asarray(table[start:stop]), dtype=dtype.name)
        write_rows(target, start, stop, values)


def table_like(table: Table) -> Any:
    """``table`` itself when rows can be sliced from it, else a NumPy array."""
    if isinstance(table, np.ndarray) or (
        hasattr(table, "shape")
        and hasattr(table, "dtype")
        and hasattr(table, "__getitem__")
        and not isinstance(table, (tf.Tensor, tf.Variable))
    ):
        return table
    return as_array(table)


def _fill_with_initializer(variable: Variable, block_values: BlockValues) -> None:
    target = resolve_variable(variable, "embeddings")
    rows, width = int(target.shape[0]), int(target.shape[1])
    for block, start, stop in row_blocks(rows, target.dtype.size * width):
        values = block_values(block, start, stop, target.dtype.name)
        write_rows(target, start, stop, tf.convert_to_tensor(values))


def create_table(
    layer: keras.layers.Layer,
    shape: tuple[int, int],
    initializer: keras.initializers.Initializer,
    table: Table | None,
    trainable: bool = True,
) -> Variable:
    """Creates ``layer``'s ``embeddings``: ``table``, or its initializer's values.

    Where it can (eagerly, outside a distribution strategy and a stateless
    scope), a given table and the initializer of a large one are written in
    row blocks into a variable created uninitialized: one table of memory,
    plus a block. Elsewhere, Keras' ``add_weight`` as before.

    Returns:
      The new variable (already tracked by ``layer``).
    """
    in_place = can_fill_in_place()
    block_values = None
    if in_place and table is None:
        table_bytes = tf.as_dtype(layer.variable_dtype).size * shape[0] * shape[1]
        if table_bytes >= BLOCKED_INIT_MIN_BYTES:
            block_values = blockwise(initializer, shape)
    if not in_place or (table is None and block_values is None):
        # Keras' own path (the table's values as a stock Embedding's).
        variable = layer.add_weight(
            shape=shape, initializer=initializer, name="embeddings", trainable=trainable
        )
        if table is not None:
            variable.assign(np.asarray(table))
        return variable
    reserve_block_memory()
    variable = layer.add_weight(
        shape=shape, initializer=uninitialized, name="embeddings", trainable=trainable
    )
    if table is not None or block_values is None:
        copy_rows(variable, table)
    else:
        _fill_with_initializer(variable, block_values)
    return variable
