"""Keras layers of partial_embedding: embeddings in which only chosen rows learn.

``PartialEmbedding`` is a drop-in replacement for ``keras.layers.Embedding``
(TensorFlow backend) that keeps a boolean ``trainable_mask`` next to its table.
Its lookup is ``ops.masked_embedding_lookup``: the gradient of the table holds
only the rows the batch touches and that the mask permits, so frozen rows never
receive a gradient and plain SGD never writes them.
"""

from __future__ import annotations

import copy
import numbers
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.row_mask import (
    ROW_MASK_ATTRIBUTE,
    mask_changed,
)
from partial_embedding._internal.row_mask import (
    as_array as _as_array,
)
from partial_embedding._internal.row_mask import (
    ids_to_row_mask as _ids_to_row_mask,
)
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
)
from partial_embedding.ops import (
    entry_stop_gradients,
    masked_embedding_lookup,
    masked_reverse_projection,
    resolve_variable,
)

__all__ = ["PartialEmbedding", "PartialEmbeddingsUpdate", "PartialReversibleEmbedding"]


def _positive_int(value: Any, argument: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or int(value) <= 0:
        raise ValueError(
            f"`{argument}` must be a positive integer. Received: "
            f"{argument}={value!r} (of type {type(value).__name__})."
        )
    return int(value)


def _broadcastable_row_mask(row_mask: Any, rank: int) -> tf.Tensor:
    mask = tf.convert_to_tensor(row_mask)
    return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([rank - 1], tf.int32)], 0))


class _RowMaskedRegularizer:
    """Applies a regularizer whose gradient reaches permitted rows only.

    The penalty is computed over the whole table (as in Keras), so it is a
    per-step pass over the vocabulary; frozen rows get an exact zero gradient.
    """

    def __init__(self, regularizer: Any, row_mask: Any) -> None:
        self.regularizer = regularizer
        self.row_mask = row_mask

    def __call__(self, table: Any) -> Any:
        table = tf.convert_to_tensor(table)
        mask = _broadcastable_row_mask(self.row_mask, table.shape.rank)
        return self.regularizer(entry_stop_gradients(table, mask))


class _RowMaskedConstraint:
    """Applies a constraint to permitted rows; frozen rows are left as they are.

    It stands in for the user's constraint on the embeddings variable, where
    every Keras optimizer calls it after a step, so it presents itself as that
    constraint: ``isinstance``, ``==``, ``hash``, ``get_config`` and attribute
    reads answer as the wrapped object would. Only the call differs (it keeps
    frozen rows). ``wrapped`` is the user's object itself.
    """

    def __init__(self, constraint: Any, row_mask: Any) -> None:
        self.wrapped = constraint
        self.row_mask = row_mask

    def __call__(self, table: Any) -> tf.Tensor:
        table = tf.convert_to_tensor(table)
        mask = _broadcastable_row_mask(self.row_mask, table.shape.rank)
        return tf.where(mask, self.wrapped(table), table)

    # Kept for code that read the wrapped constraint under its old name.
    @property
    def constraint(self) -> Any:
        return self.wrapped

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self.wrapped)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class lacks (max_value, axis, ...).
        if name in ("wrapped", "row_mask"):
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _RowMaskedConstraint):
            other = other.wrapped
        return bool(self.wrapped == other)

    def __hash__(self) -> int:
        return hash(self.wrapped)

    def __repr__(self) -> str:
        return repr(self.wrapped)

    def __reduce__(self) -> tuple:
        # pickle and copy would otherwise build the wrapped class from ours.
        return (_RowMaskedConstraint, (self.wrapped, self.row_mask))

    def get_config(self) -> Any:
        return self.wrapped.get_config()


# -- building the table without table-sized transients -----------------------

# A table of at least this many bytes is created uninitialized and filled in
# row blocks by its initializer; a smaller one is made by Keras' add_weight as
# it always was (same values as a stock Embedding under the same seed). At
# this size add_weight's transients (about three tables) cost 192 MiB.
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

_BlockValues = Callable[[int, int, int, Any], Any]


def _row_blocks(rows: int, row_bytes: int) -> Iterator[tuple[int, int, int]]:
    """(block index, first row, end row) of each block of about BLOCK_BYTES."""
    rows_per_block = max(1, BLOCK_BYTES // max(1, row_bytes))
    for index, start in enumerate(range(0, rows, rows_per_block)):
        yield index, start, min(rows, start + rows_per_block)


def _uninitialized(shape: Any, dtype: Any = None) -> tf.Tensor:
    # Never read before every row is written: its pages are fresh, so the
    # variable that adopts (or copies) it costs one table, filled in place.
    return tf.raw_ops.Empty(shape=list(shape), dtype=tf.as_dtype(dtype or "float32"), init=False)


def _reserve_block_memory() -> None:
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


def _blockwise(initializer: Any, shape: tuple[int, int]) -> _BlockValues | None:
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


def _can_fill_in_place() -> bool:
    # Under a tf.distribute strategy the table is a per-device variable and in
    # a stateless scope Keras defers its creation: there, Keras' plain path.
    return (
        tf.executing_eagerly()
        and not framework_private.in_stateless_scope()
        and not tf.distribute.has_strategy()
    )


def _write_rows(variable: tf.Variable, start: int, stop: int, values: Any) -> None:
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


def _copy_rows(variable: Any, table: Any) -> None:
    """Copies an array-like table (NumPy, memmap, ...) into ``variable`` in row blocks.

    A memory-mapped file is read a block at a time, never whole.
    """
    target = resolve_variable(variable, "embeddings")
    dtype = target.dtype
    row_bytes = dtype.size * int(np.prod(target.shape[1:]))
    for _, start, stop in _row_blocks(int(target.shape[0]), row_bytes):
        values = keras.ops.convert_to_tensor(np.asarray(table[start:stop]), dtype=dtype.name)
        _write_rows(target, start, stop, values)


def _table_like(table: Any) -> Any:
    """``table`` itself when rows can be sliced from it, else a NumPy array."""
    if isinstance(table, np.ndarray) or (
        hasattr(table, "shape")
        and hasattr(table, "dtype")
        and hasattr(table, "__getitem__")
        and not isinstance(table, (tf.Tensor, tf.Variable))
    ):
        return table
    return _as_array(table)


def _stock_embedding_table(store: Any) -> np.ndarray | None:
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
    has_path = getattr(store, "has_path", None)
    get = getattr(store, "get", None)
    if not isinstance(path, str) or has_path is None or get is None:
        return None
    parent, _, leaf = path.rpartition("/")
    if leaf != "partial_embedding":
        return None
    prefix = f"{parent}/" if parent else ""
    stock_path = f"{prefix}embedding"
    try:
        unambiguous = (
            has_path(f"{stock_path}/vars")
            and not has_path(f"{prefix}embedding_1")
            and not has_path(path)
        )
        if not unambiguous:
            return None
        stock_store = get(stock_path)
        try:
            if len(stock_store.keys()) != 1:
                return None
            return np.asarray(stock_store["0"])
        finally:
            # get() moves the shared store; put it back where Keras left it.
            get(path)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


@keras.saving.register_keras_serializable(package="partial_embedding")
class PartialEmbedding(framework_private.SaveableChildren, keras.layers.Layer):
    """An embedding layer in which only the rows chosen by a mask learn.

    The problem it solves: fine-tuning a model whose embedding table holds
    pretrained rows (which must stay as they are, bit for bit) and new rows
    (new words, out-of-vocabulary buckets) that must learn. A stock
    ``keras.layers.Embedding`` trains every row; the usual workarounds cost a
    pass over the whole vocabulary per step or give up on exact freezing. Here
    the lookup's gradient holds only the permitted rows the batch touched
    (``masked_embedding_lookup``), so with plain SGD frozen rows are never
    written.

    Which rows learn is a non-trainable bool variable, ``trainable_mask``,
    saved with the model. ``freeze``, ``unfreeze`` and ``set_trainable_ids``
    assign to it: the change applies from the next step, without retracing or
    recompiling.

    The mask is state, not configuration: like the table, it is a weight,
    saved and restored by ``model.save`` / ``load_model``, ``save_weights`` /
    ``load_weights`` and checkpoints, and copied with ``get_weights`` /
    ``set_weights``. ``get_config()`` names no row ids (``trainable_ids`` and
    ``frozen_ids`` are None in it, so its size does not grow with the
    vocabulary), and a layer made by ``from_config`` alone, or by
    ``keras.models.clone_model`` (which, as for any layer, also gives a freshly
    initialized table), has every row permitted, as a stock ``Embedding``'s
    rows all train. Copy the state into it with ``set_weights`` when you
    need the same rows frozen.

    Differences from ``keras.layers.Embedding``:

    * ``embeddings_regularizer``: the penalty is computed on the whole table as
      in Keras, but its gradient reaches permitted rows only.
    * ``embeddings_constraint``: applied to permitted rows only.
      ``layer.embeddings.constraint`` answers as the constraint you passed
      (``==``, ``isinstance``, its attributes and config; ``.wrapped`` is that
      very object), but calling it leaves frozen rows as they are.
    * ``lora_rank`` / ``lora_alpha`` and ``quantization_config`` are not
      supported (``ValueError``): a low-rank delta moves every row, and a
      quantized table cannot be trained.
    * Only the TensorFlow backend. Ids may be dense, a ``tf.SparseTensor``
      (a dense result in which absent entries hold row 0, as Keras gives) or
      a ``tf.RaggedTensor`` (a ragged result), ``int32``/``int64`` or
      castable; ids outside ``[0, input_dim)``, negative ones included (which
      Keras counts from the end), raise ``tf.errors.InvalidArgumentError`` on
      every device.
    * A stock ``Embedding``'s state loads into the table and leaves the mask
      as it is: ``set_weights([table])``, ``load_own_variables`` of its store,
      and ``load_weights`` of a stock model's ``.weights.h5`` (see
      ``load_own_variables``).
    * ``supports_jit`` is true: under ``model.compile(jit_compile=True)``
      (Keras' ``"auto"`` on a GPU) or ``tf.function(jit_compile=True)`` the
      lookup and ``MaskedOptimizer`` use stock ops with static shapes; there
      an id outside ``[0, input_dim)`` looks up a row of zeros and is never
      written, instead of raising (XLA has no run-time errors).

    Stateful optimizers (momentum, Adam, weight decay) can still move frozen
    rows through their own state; pair this layer with
    ``partial_embedding.MaskedOptimizer`` for those.

    Large tables are built without table-sized transients: the table is
    allocated once, uninitialized, and written in row blocks of about 4 MiB
    (``BLOCK_BYTES``), so building costs about one table of memory. This
    applies to ``weights=`` of any size and to initializers of tables of at
    least 64 MiB (``BLOCKED_INIT_MIN_BYTES``); a smaller table gets exactly
    what ``add_weight`` (and so a stock ``Embedding`` under the same seed)
    gives. Per block, ``zeros``, ``ones`` and a scalar ``Constant`` give
    exactly the values of one call; the random ones (``RandomUniform``,
    ``RandomNormal``, ``TruncatedNormal`` and the ``VarianceScaling`` family:
    Glorot, He, LeCun, with the fans of the whole table) draw each block with
    its own seed, derived from the initializer's seed and the block's index:
    the same distribution and the same numbers on every build with the same
    seed, but not the numbers of one unblocked call. Other initializers
    (``Orthogonal``, ``Identity``, your own callables), a build inside a
    ``tf.distribute`` strategy's scope, a stateless scope or a graph, go
    through ``add_weight`` as before (about three tables at the peak).

    Args:
      input_dim: Number of rows (vocabulary size).
      output_dim: Width of each row.
      trainable_ids: Row ids that learn (all others are frozen), or a bool mask
        of shape ``[input_dim]``.
      frozen_ids: Row ids that are frozen (all others learn), or a bool mask.
        Pass at most one of ``trainable_ids`` / ``frozen_ids``; with neither,
        every row learns.
      embeddings_initializer: Initializer of the table.
      embeddings_regularizer: Regularizer of the table (see above).
      embeddings_constraint: Constraint of the table (see above).
      mask_zero: Whether id 0 is padding, as in ``keras.layers.Embedding``.
      weights: Initial table, ``[input_dim, output_dim]`` (or a one-element
        list of it), or ``[table, trainable_mask]`` as from ``get_weights()``.
        The table may be a NumPy array or a memory-mapped ``.npy``
        (``np.load(path, mmap_mode="r")``): its shape is checked first, then
        it is copied in row blocks (cast to the variable's dtype per block),
        so a mapped file is never read whole into memory and a table larger
        than half the machine's memory loads.
      lora_rank: Not supported; must be None.
      lora_alpha: Not supported; must be None.
      quantization_config: Not supported; must be None.
      **kwargs: Base layer arguments (``name``, ``dtype``, ``trainable``,
        ``activity_regularizer``, ...).

    Raises:
      ValueError: both ``trainable_ids`` and ``frozen_ids``; an id outside
        ``[0, input_dim)``; a mask or ``weights`` of the wrong shape; an
        unsupported argument.

    >>> import numpy as np, keras, partial_embedding as pe
    >>> layer = pe.PartialEmbedding(4, 2, trainable_ids=[3],
    ...                             embeddings_initializer="ones")
    >>> model = keras.Sequential([layer])
    >>> model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    >>> _ = model.fit(np.array([[0, 3]]), np.zeros([1, 2, 2]), verbose=0)
    >>> layer.embeddings.numpy().tolist()
    [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.75, 0.75]]
    >>> layer.trainable_mask.numpy().tolist()
    [False, False, False, True]
    """

    built: bool

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        trainable_ids: Any = None,
        frozen_ids: Any = None,
        embeddings_initializer: Any = "uniform",
        embeddings_regularizer: Any = None,
        embeddings_constraint: Any = None,
        mask_zero: bool = False,
        weights: Any = None,
        lora_rank: int | None = None,
        lora_alpha: float | None = None,
        quantization_config: Any = None,
        **kwargs: Any,
    ) -> None:
        framework_private.check_framework()
        input_dim = _positive_int(input_dim, "input_dim")
        output_dim = _positive_int(output_dim, "output_dim")
        if trainable_ids is not None and frozen_ids is not None:
            raise PartialEmbeddingArgumentError(
                "PartialEmbedding: pass at most one of trainable_ids and frozen_ids, got both"
            )
        if lora_rank or lora_alpha is not None:
            raise ValueError(
                "PartialEmbedding does not support LoRA (lora_rank="
                f"{lora_rank!r}, lora_alpha={lora_alpha!r}): a low-rank delta "
                "changes every row, frozen ones included. Choose the rows that "
                "learn with trainable_ids or frozen_ids instead."
            )
        if quantization_config is not None:
            raise ValueError(
                "PartialEmbedding does not support quantization_config: a "
                "quantized table cannot be trained."
            )
        if kwargs.pop("input_length", None) is not None:
            warnings.warn(
                "Argument `input_length` is deprecated. Just remove it.",
                stacklevel=2,
            )
        if trainable_ids is not None:
            initial_mask = _ids_to_row_mask(trainable_ids, "trainable_ids", input_dim)
        elif frozen_ids is not None:
            initial_mask = ~_ids_to_row_mask(frozen_ids, "frozen_ids", input_dim)
        else:
            initial_mask = np.ones([input_dim], dtype=bool)
        super().__init__(**kwargs)
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.embeddings_constraint = keras.constraints.get(embeddings_constraint)
        self.mask_zero = mask_zero
        self.supports_masking = mask_zero
        self.autocast = False
        # The lookup and MaskedOptimizer have an XLA path.
        self.supports_jit = True
        self._initial_mask = initial_mask
        if weights is not None:
            table, mask = self._initial_weights(weights)
            if mask is not None:
                self._initial_mask = mask
            self._build(table)

    def _initial_weights(self, weights: Any) -> tuple[Any, np.ndarray | None]:
        """The table (checked, not read) and the mask (or None) in ``weights``."""
        if isinstance(weights, (list, tuple)) and len(weights) == 2:
            table, mask = weights
            mask = _ids_to_row_mask(mask, "weights[1]", self.input_dim)
        else:
            if isinstance(weights, (list, tuple)) and len(weights) == 1:
                weights = weights[0]
            table, mask = weights, None
        table = _table_like(table)
        expected = (self.input_dim, self.output_dim)
        if tuple(table.shape) != expected:
            raise PartialEmbeddingArgumentError(
                f"weights: the table must have shape {expected} (input_dim, "
                f"output_dim), got {tuple(table.shape)}"
            )
        return table, mask

    def build(self, input_shape: Any = None) -> None:
        self._build(None)

    def _build(self, table: Any) -> None:
        if self.built:
            return
        self._create_table(table)
        initial_mask = self._initial_mask
        self.trainable_mask = self.add_weight(
            shape=(self.input_dim,),
            initializer=lambda shape, dtype=None: initial_mask,
            dtype="bool",
            name="trainable_mask",
            trainable=False,
        )
        if self.embeddings_regularizer is not None:
            self.embeddings.regularizer = _RowMaskedRegularizer(
                self.embeddings_regularizer, self.trainable_mask
            )
        if self.embeddings_constraint is not None:
            self.embeddings.constraint = _RowMaskedConstraint(
                self.embeddings_constraint, self.trainable_mask
            )
        # Contract with MaskedOptimizer: it finds the mask through this.
        setattr(self.embeddings, ROW_MASK_ATTRIBUTE, self.trainable_mask)
        self.built = True

    def _create_table(self, table: Any) -> None:
        """Creates ``self.embeddings``, holding ``table`` or its initializer's values.

        Where it can (eagerly, outside a distribution strategy and a stateless
        scope), a given table and the initializer of a large one are written
        in row blocks into a variable created uninitialized: one table of
        memory, plus a block. Elsewhere, Keras' ``add_weight`` as before.
        """
        shape = (self.input_dim, self.output_dim)
        in_place = _can_fill_in_place()
        block_values = None
        if in_place and table is None:
            table_bytes = tf.as_dtype(self.variable_dtype).size * shape[0] * shape[1]
            if table_bytes >= BLOCKED_INIT_MIN_BYTES:
                block_values = _blockwise(self.embeddings_initializer, shape)
        if not in_place or (table is None and block_values is None):
            # Keras' own path (the table's values as a stock Embedding's).
            self.embeddings = self.add_weight(
                shape=shape,
                initializer=self.embeddings_initializer,
                name="embeddings",
                trainable=True,
            )
            if table is not None:
                self.embeddings.assign(np.asarray(table))
            return
        _reserve_block_memory()
        self.embeddings = self.add_weight(
            shape=shape,
            initializer=_uninitialized,
            name="embeddings",
            trainable=True,
        )
        if table is not None or block_values is None:
            _copy_rows(self.embeddings, table)
            return
        target = resolve_variable(self.embeddings, "embeddings")
        row_bytes = target.dtype.size * shape[1]
        for block, start, stop in _row_blocks(shape[0], row_bytes):
            values = block_values(block, start, stop, target.dtype.name)
            _write_rows(target, start, stop, tf.convert_to_tensor(values))

    def call(self, inputs: Any) -> Any:
        if isinstance(inputs, tf.SparseTensor):
            # As keras.layers.Embedding gives it: a dense result in which an
            # absent entry holds row 0 (Keras looks it up as default_id=0).
            inputs = tf.sparse.to_dense(tf.sparse.reorder(inputs))
        if isinstance(inputs, tf.RaggedTensor):
            # A ragged result with the ids' row partitions, as Keras gives.
            return inputs.with_flat_values(self._dense_lookup(inputs.flat_values))
        return self._dense_lookup(inputs)

    def _dense_lookup(self, inputs: Any) -> tf.Tensor:
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)
        if framework_private.in_stateless_scope():
            # model.stateless_call: the variables' values come from the scope,
            # so gather from those tensors and stop gradients per occurrence.
            table = tf.convert_to_tensor(self.embeddings.value)
            mask = tf.convert_to_tensor(self.trainable_mask.value)
            permitted = tf.gather(mask, inputs)
            outputs = entry_stop_gradients(tf.gather(table, inputs), tf.expand_dims(permitted, -1))
        else:
            try:
                outputs = masked_embedding_lookup(self.embeddings, inputs, self.trainable_mask)
            except PartialEmbeddingArgumentError as error:
                # Keras re-creates OpErrors with the (node_def, op, message)
                # constructor, which ours lacks: have it re-raise ours as is.
                framework_private.keep_error_as_raised(error)
                raise
        return tf.cast(outputs, self.compute_dtype)

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        if not self.mask_zero:
            return None
        return keras.ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*input_shape, self.output_dim)

    def compute_output_spec(self, inputs: Any) -> keras.KerasTensor:
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape),
            dtype=self.compute_dtype,
            ragged=getattr(inputs, "ragged", False),
        )

    # -- the mask --------------------------------------------------------

    def _current_mask(self) -> np.ndarray:
        if self.built and tf.executing_eagerly():
            return np.array(self.trainable_mask.numpy(), dtype=bool)
        return self._initial_mask.copy()

    def _write_mask(self, mask: np.ndarray) -> None:
        if self.built:
            self.trainable_mask.assign(mask)
            # Compact optimizer slots of XLA steps reserve room for new rows.
            mask_changed(self.trainable_mask)
        else:
            self._initial_mask = mask

    def freeze(self, ids: Any) -> None:
        """Freezes rows ``ids`` (integers in ``[0, input_dim)`` or a bool mask).

        Takes effect from the next step; traced functions are reused. Call it
        eagerly (e.g. from a callback), not inside a ``tf.function``.

        Raises:
          ValueError: an id outside ``[0, input_dim)``; nothing changes.
        """
        selected = _ids_to_row_mask(ids, "ids", self.input_dim)
        self._write_mask(self._current_mask() & ~selected)

    def unfreeze(self, ids: Any) -> None:
        """Lets rows ``ids`` learn again (integers or a bool mask).

        Raises:
          ValueError: an id outside ``[0, input_dim)``; nothing changes.
        """
        selected = _ids_to_row_mask(ids, "ids", self.input_dim)
        self._write_mask(self._current_mask() | selected)

    def set_trainable_ids(self, ids: Any) -> None:
        """Makes exactly rows ``ids`` learn and freezes all others.

        ``ids``: integers in ``[0, input_dim)`` or a bool mask of shape
        ``[input_dim]``.

        Raises:
          ValueError: an id outside ``[0, input_dim)`` or a mask of the wrong
            shape; nothing changes.
        """
        self._write_mask(_ids_to_row_mask(ids, "ids", self.input_dim))

    @property
    def trainable_ids(self) -> np.ndarray:
        """The ids of the rows that learn now, sorted (int64)."""
        return np.flatnonzero(self._current_mask()).astype(np.int64)

    @property
    def frozen_ids(self) -> np.ndarray:
        """The ids of the frozen rows now, sorted (int64)."""
        return np.flatnonzero(~self._current_mask()).astype(np.int64)

    # -- serialization ---------------------------------------------------

    def _assign_stock_table(self, table: Any, source: str) -> None:
        table = _table_like(table)
        expected = (self.input_dim, self.output_dim)
        if tuple(table.shape) != expected:
            raise ValueError(
                f"Layer {self.name} weight shape {expected} is not compatible "
                f"with provided weight shape {tuple(table.shape)} ({source})."
            )
        target = resolve_variable(self.embeddings, "embeddings")
        if _can_fill_in_place() and not isinstance(target, tf.distribute.DistributedValues):
            _copy_rows(self.embeddings, table)
        else:
            self.embeddings.assign(np.asarray(table))

    def set_weights(self, weights: Any) -> None:
        """Sets the table, or the table and the mask, from NumPy arrays.

        ``[table, trainable_mask]`` (as from ``get_weights()``) sets both.
        ``[table]`` (as from a stock ``keras.layers.Embedding``) sets the table
        and leaves the mask as it is (as constructed, unless ``freeze`` and
        its kin changed it since). The table is copied in row blocks.
        """
        if self.built and len(weights) == 1:
            self._assign_stock_table(weights[0], "a one-array list, the stock Embedding's")
            return
        if (
            self.built
            and len(weights) == 2
            and tuple(getattr(weights[0], "shape", ())) == (self.input_dim, self.output_dim)
            and tuple(getattr(weights[1], "shape", ())) == (self.input_dim,)
        ):
            self._assign_stock_table(weights[0], "weights[0]")
            self.trainable_mask.assign(weights[1])
            return
        # Anything else: Keras' checks and messages.
        super().set_weights(weights)

    def load_own_variables(self, store: Any) -> None:
        """Loads the table and mask, or a stock ``Embedding``'s table alone.

        A store with one variable comes from a stock
        ``keras.layers.Embedding``: the table is loaded and the mask is left
        as it is. In a ``Sequential`` or functional model, Keras files each
        layer under its class name, so a stock model's ``.weights.h5`` holds
        ``.../embedding`` where this layer looks for
        ``.../partial_embedding``; that entry is used when it is the only
        ``Embedding`` of its container in the file (never a guess between
        two). The table is copied into the variable in row blocks.
        """
        if self.built and len(store.keys()) == 1:
            self._assign_stock_table(store["0"], "a stock Embedding's saved table")
            return
        if self.built and len(store.keys()) == 2:
            table, mask = store["0"], store["1"]
            if np.shape(table) == (self.input_dim, self.output_dim) and np.shape(mask) == (
                self.input_dim,
            ):
                self._assign_stock_table(table, "the saved table")
                self.trainable_mask.assign(mask)
                return
        if self.built and len(store.keys()) == 0:
            stock_table = _stock_embedding_table(store)
            if stock_table is not None:
                self._assign_stock_table(stock_table, "a stock Embedding's saved table")
                return
        super().load_own_variables(store)

    def get_config(self) -> dict:
        base_config = super().get_config()
        # The mask is state (the saved weight trainable_mask), not config: a
        # config that listed row ids would grow with the vocabulary.
        config = {
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "trainable_ids": None,
            "frozen_ids": None,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            "embeddings_regularizer": keras.regularizers.serialize(self.embeddings_regularizer),
            "activity_regularizer": keras.regularizers.serialize(self.activity_regularizer),
            "embeddings_constraint": keras.constraints.serialize(self.embeddings_constraint),
            "mask_zero": self.mask_zero,
        }
        return {**base_config, **config}


@keras.saving.register_keras_serializable(package="partial_embedding")
class PartialEmbeddingsUpdate(PartialEmbedding):
    """The widely copied ``PartialEmbeddingsUpdate`` layer, done without the cost.

    The problem it solves: a model starts from a pretrained embedding matrix
    ``weights`` and only the rows ``indices_to_update`` may learn. The popular
    answer builds a ``[len_vocab, 1]`` mask and computes
    ``stop_gradient((1 - mask) * W) + mask * W`` on the whole table before every
    lookup: a pass over the vocabulary per step, a dense gradient, and frozen
    rows still updated (with zeros) by the optimizer. This class keeps that
    constructor but is a ``PartialEmbedding``: the lookup gathers only the
    batch's rows and frozen rows receive no gradient at all.

    As for ``PartialEmbedding``, the mask is a saved weight: ``get_config()``
    holds ``indices_to_update=None`` (and ``weights=None``), and a layer made
    from the config alone lets every row learn until its weights are loaded.

    Args:
      len_vocab: Number of rows.
      weights: The pretrained matrix, ``[len_vocab, output_dim]``. May be None
        only when ``output_dim`` is given (as when loading a saved model).
      indices_to_update: The row ids that learn (or a bool mask); None: all.
      **kwargs: Other ``PartialEmbedding`` arguments (``mask_zero``,
        ``output_dim``, ``name``, ``dtype``, ...).

    >>> import numpy as np, keras, partial_embedding as pe
    >>> pretrained = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    >>> layer = pe.PartialEmbeddingsUpdate(3, pretrained, [1])
    >>> model = keras.Sequential([layer])
    >>> model.compile(optimizer=keras.optimizers.SGD(0.25), loss="mse")
    >>> _ = model.fit(np.array([[0, 1, 2]]), np.zeros([1, 3, 2]), verbose=0)
    >>> layer.embeddings.numpy().tolist()
    [[1.0, 1.0], [1.8333333730697632, 1.8333333730697632], [3.0, 3.0]]
    """

    def __init__(
        self,
        len_vocab: int,
        weights: Any,
        indices_to_update: Any,
        **kwargs: Any,
    ) -> None:
        output_dim = kwargs.pop("output_dim", None)
        for argument in ("trainable_ids", "frozen_ids", "input_dim"):
            if argument in kwargs:
                raise TypeError(
                    f"PartialEmbeddingsUpdate: {argument} is not an argument; "
                    "use len_vocab and indices_to_update"
                )
        len_vocab = _positive_int(len_vocab, "len_vocab")
        if weights is not None:
            weights = _as_array(weights)
            if weights.ndim != 2 or weights.shape[0] != len_vocab:
                raise PartialEmbeddingArgumentError(
                    f"weights: must have shape ({len_vocab}, output_dim) "
                    f"(len_vocab rows), got {weights.shape}"
                )
            if output_dim is not None and output_dim != weights.shape[1]:
                raise PartialEmbeddingArgumentError(
                    f"output_dim: {output_dim} does not match weights of shape {weights.shape}"
                )
            output_dim = int(weights.shape[1])
        elif output_dim is None:
            raise PartialEmbeddingArgumentError(
                "weights: the pretrained matrix is required (or pass output_dim)"
            )
        if indices_to_update is not None:
            indices_to_update = _ids_to_row_mask(indices_to_update, "indices_to_update", len_vocab)
        super().__init__(
            len_vocab,
            output_dim,
            trainable_ids=indices_to_update,
            weights=weights,
            **kwargs,
        )

    def get_config(self) -> dict:
        config = super().get_config()
        config["len_vocab"] = config.pop("input_dim")
        config.pop("frozen_ids")
        config["indices_to_update"] = config.pop("trainable_ids")
        # The table and the mask are saved with the weights, not in the config.
        config["weights"] = None
        return config


_COMPUTE_DTYPE = "compute_dtype"


@keras.saving.register_keras_serializable(package="partial_embedding")
class PartialReversibleEmbedding(PartialEmbedding):
    """A ``keras.layers.ReversibleEmbedding`` in which only chosen rows learn.

    The problem it solves: adding tokens to a language model whose input and
    output embeddings are tied. Through a plain reverse projection
    (``hidden @ embeddings^T``) every row of the table gets a gradient, so
    every row moves and every row's optimizer state is kept. Here the lookup
    is ``PartialEmbedding``'s and the reverse projection is
    ``ops.masked_reverse_projection``: the table's gradient from the logits is
    a ``tf.IndexedSlices`` of the permitted rows only
    (``dlogits[:, permitted]^T @ hidden``, never a ``[V, D]`` tensor). The two
    gradients of a tied table add up as ``IndexedSlices``; with
    ``partial_embedding.MaskedOptimizer`` only permitted rows and their slots
    are touched.

    ``layer(ids)`` is the lookup; ``layer(hidden, reverse=True)`` gives the
    logits ``[..., input_dim]``: ``hidden @ embeddings^T`` computed in
    ``reverse_dtype``, then, with ``logit_soft_cap``,
    ``tanh(logits / cap) * cap``, as Keras does.

    With ``tie_weights=False`` the output projection has a table of its own,
    ``reverse_embeddings``, with its own mask ``reverse_trainable_mask`` (the
    input table's initial rows unless ``reverse_trainable_ids`` is given).
    Unlike Keras' ``reverse_embeddings`` of shape ``[output_dim, input_dim]``,
    ours is stored row-major, ``[input_dim, output_dim]``, so that a row mask
    applies to it: ``set_weights`` with a stock layer's two arrays
    (``[embeddings, reverse_embeddings]``) transposes the second, and
    ``load_own_variables`` of a stock layer's store does too. It is
    initialized with ``embeddings_initializer`` at our shape (an initializer
    that depends on fans sees them swapped relative to Keras). It has no
    regularizer or constraint, as in Keras.

    Differences from ``keras.layers.ReversibleEmbedding`` beyond those of
    ``PartialEmbedding``: ``reverse_dtype`` defaults to ``"compute_dtype"``
    (the layer's compute dtype; Keras' default None, also accepted, means the
    promoted dtype of the operands); no quantization; the reverse projection
    of ids masked with ``mask_zero`` sets no Keras mask on the logits
    (``compute_mask`` gives a mask for integer inputs only).

    Args:
      input_dim: Number of rows (vocabulary size).
      output_dim: Width of each row.
      tie_weights: Whether the reverse projection uses ``embeddings``.
      trainable_ids: Row ids that learn (all others are frozen), or a bool
        mask of shape ``[input_dim]``.
      frozen_ids: Row ids that are frozen (all others learn), or a bool mask.
      embeddings_initializer: Initializer of the table(s).
      embeddings_regularizer: Regularizer of ``embeddings`` (as in
        ``PartialEmbedding``).
      embeddings_constraint: Constraint of ``embeddings`` (as in
        ``PartialEmbedding``).
      mask_zero: Whether id 0 is padding.
      reverse_dtype: The dtype of the reverse projection: ``"compute_dtype"``,
        a dtype name, or None (the operands' promoted dtype).
      logit_soft_cap: If set, the logits become
        ``tanh(logits / logit_soft_cap) * logit_soft_cap``.
      weights: Initial ``embeddings`` (or ``[table, trainable_mask]``), as in
        ``PartialEmbedding``.
      reverse_trainable_ids: Untied only: the rows of ``reverse_embeddings``
        that learn (ids or a bool mask); None: the input table's initial ones.
      **kwargs: Base layer arguments (``name``, ``dtype``, ...).

    Raises:
      ValueError: as ``PartialEmbedding``; ``reverse_trainable_ids`` with
        tied weights; an id outside ``[0, input_dim)``.

    >>> import numpy as np, keras, partial_embedding as pe
    >>> layer = pe.PartialReversibleEmbedding(4, 2, trainable_ids=[3],
    ...                                       embeddings_initializer="ones")
    >>> hidden = np.array([[1.0, 2.0]], dtype="float32")
    >>> layer(hidden, reverse=True).numpy().tolist()
    [[3.0, 3.0, 3.0, 3.0]]
    >>> import tensorflow as tf
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(layer(hidden, reverse=True))
    >>> grad = tape.gradient(loss, layer.embeddings.value)
    >>> grad.indices.numpy().tolist(), grad.values.numpy().tolist()
    ([3], [[1.0, 2.0]])
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        tie_weights: bool = True,
        trainable_ids: Any = None,
        frozen_ids: Any = None,
        embeddings_initializer: Any = "uniform",
        embeddings_regularizer: Any = None,
        embeddings_constraint: Any = None,
        mask_zero: bool = False,
        reverse_dtype: Any = _COMPUTE_DTYPE,
        logit_soft_cap: float | None = None,
        weights: Any = None,
        reverse_trainable_ids: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            input_dim,
            output_dim,
            trainable_ids=trainable_ids,
            frozen_ids=frozen_ids,
            embeddings_initializer=embeddings_initializer,
            embeddings_regularizer=embeddings_regularizer,
            embeddings_constraint=embeddings_constraint,
            mask_zero=mask_zero,
            **kwargs,
        )
        self.tie_weights = bool(tie_weights)
        if reverse_dtype is not None and reverse_dtype != _COMPUTE_DTYPE:
            reverse_dtype = tf.as_dtype(reverse_dtype).name
        self.reverse_dtype = reverse_dtype
        self.logit_soft_cap = logit_soft_cap
        if reverse_trainable_ids is not None:
            if self.tie_weights:
                raise PartialEmbeddingArgumentError(
                    "PartialReversibleEmbedding: reverse_trainable_ids needs "
                    "tie_weights=False (tied, the reverse projection uses the "
                    "input table and its mask)"
                )
            self._initial_reverse_mask = _ids_to_row_mask(
                reverse_trainable_ids, "reverse_trainable_ids", self.input_dim
            )
        else:
            self._initial_reverse_mask = self._initial_mask.copy()
        if weights is not None:
            table, mask = self._initial_weights(weights)
            if mask is not None:
                self._initial_mask = mask
                if reverse_trainable_ids is None:
                    self._initial_reverse_mask = mask.copy()
            self._build(table)

    def _build(self, table: Any) -> None:
        if self.built:
            return
        super()._build(table)
        if self.tie_weights:
            return
        self.reverse_embeddings = self.add_weight(
            shape=(self.input_dim, self.output_dim),
            initializer=self.embeddings_initializer,
            name="reverse_embeddings",
            trainable=True,
        )
        initial_reverse_mask = self._initial_reverse_mask
        self.reverse_trainable_mask = self.add_weight(
            shape=(self.input_dim,),
            initializer=lambda shape, dtype=None: initial_reverse_mask,
            dtype="bool",
            name="reverse_trainable_mask",
            trainable=False,
        )
        setattr(self.reverse_embeddings, ROW_MASK_ATTRIBUTE, self.reverse_trainable_mask)

    def call(self, inputs: Any, reverse: bool = False) -> Any:
        if not reverse:
            return super().call(inputs)
        if self.tie_weights:
            table, row_mask = self.embeddings, self.trainable_mask
        else:
            table, row_mask = self.reverse_embeddings, self.reverse_trainable_mask
        if framework_private.in_stateless_scope():
            # model.stateless_call: the variables' values come from the scope.
            table = tf.convert_to_tensor(table.value)
            row_mask = tf.convert_to_tensor(row_mask.value)
        compute_dtype = (
            self.compute_dtype if self.reverse_dtype == _COMPUTE_DTYPE else self.reverse_dtype
        )
        logits = masked_reverse_projection(inputs, table, row_mask, compute_dtype)
        if self.logit_soft_cap is not None:
            soft_cap = self.logit_soft_cap
            logits = keras.ops.multiply(
                keras.ops.tanh(keras.ops.divide(logits, soft_cap)), soft_cap
            )
        return logits

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        # Ids give the padding mask; hidden states (reverse=True) give none.
        if not keras.backend.is_int_dtype(keras.backend.standardize_dtype(inputs.dtype)):
            return None
        return super().compute_mask(inputs, mask)

    def compute_output_shape(self, input_shape: Any, reverse: bool = False) -> tuple:
        if reverse:
            return (*tuple(input_shape)[:-1], self.input_dim)
        return super().compute_output_shape(input_shape)

    def compute_output_spec(self, inputs: Any, reverse: bool = False) -> keras.KerasTensor:
        if not reverse:
            return super().compute_output_spec(inputs)
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape, reverse=True), dtype=self.compute_dtype
        )

    # -- the mask of the untied output table ------------------------------

    def _untied(self, what: str) -> None:
        if self.tie_weights:
            raise AttributeError(
                f"PartialReversibleEmbedding: {what} exists only with "
                "tie_weights=False (tied, the reverse projection uses the "
                "input table and its mask)"
            )

    def _current_reverse_mask(self) -> np.ndarray:
        if self.built and tf.executing_eagerly():
            return np.array(self.reverse_trainable_mask.numpy(), dtype=bool)
        return self._initial_reverse_mask.copy()

    def set_reverse_trainable_ids(self, ids: Any) -> None:
        """Untied: makes exactly rows ``ids`` of ``reverse_embeddings`` learn.

        Raises:
          AttributeError: with tied weights.
          ValueError: an id outside ``[0, input_dim)``; nothing changes.
        """
        self._untied("set_reverse_trainable_ids")
        mask = _ids_to_row_mask(ids, "ids", self.input_dim)
        if self.built:
            self.reverse_trainable_mask.assign(mask)
            mask_changed(self.reverse_trainable_mask)
        else:
            self._initial_reverse_mask = mask

    @property
    def reverse_trainable_ids(self) -> np.ndarray:
        """Untied: the ids of the rows of ``reverse_embeddings`` that learn now."""
        self._untied("reverse_trainable_ids")
        return np.flatnonzero(self._current_reverse_mask()).astype(np.int64)

    # -- serialization ---------------------------------------------------

    def set_weights(self, weights: Any) -> None:
        """Sets the tables (and masks) from NumPy arrays.

        Besides ``PartialEmbedding``'s forms and ``get_weights()``' own list,
        an untied layer takes a stock ``ReversibleEmbedding``'s two arrays,
        ``[embeddings, reverse_embeddings]`` with the second of shape
        ``[output_dim, input_dim]``: it is transposed into ours.
        """
        stock_reverse_shape = (self.output_dim, self.input_dim)
        if (
            self.built
            and not self.tie_weights
            and len(weights) == 2
            and tuple(getattr(weights[0], "shape", ())) == (self.input_dim, self.output_dim)
            and tuple(getattr(weights[1], "shape", ())) == stock_reverse_shape
        ):
            self._assign_stock_table(weights[0], "weights[0]")
            self.reverse_embeddings.assign(np.transpose(np.asarray(weights[1])))
            return
        super().set_weights(weights)

    def load_own_variables(self, store: Any) -> None:
        """Loads this layer's saved variables, or a stock layer's.

        A stock untied ``ReversibleEmbedding`` saves two arrays (the table and
        its ``[output_dim, input_dim]`` reverse table): they load with the
        second transposed, and the masks are left as they are. Otherwise as
        ``PartialEmbedding.load_own_variables``.
        """
        if self.built and not self.tie_weights and len(store.keys()) == 2:
            table, reverse_table = store["0"], store["1"]
            if np.shape(table) == (self.input_dim, self.output_dim) and np.shape(reverse_table) == (
                self.output_dim,
                self.input_dim,
            ):
                self._assign_stock_table(table, "a stock ReversibleEmbedding's saved table")
                self.reverse_embeddings.assign(np.transpose(np.asarray(reverse_table)))
                return
        super().load_own_variables(store)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "tie_weights": self.tie_weights,
                "reverse_dtype": self.reverse_dtype,
                "logit_soft_cap": self.logit_soft_cap,
                # A weight (reverse_trainable_mask), not config.
                "reverse_trainable_ids": None,
            }
        )
        return config
