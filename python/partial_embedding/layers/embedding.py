"""Keras layers of partial_embedding: embeddings in which only chosen rows learn.

``PartialEmbedding`` is a drop-in replacement for ``keras.layers.Embedding``
(TensorFlow backend) that keeps a boolean ``trainable_mask`` next to its table.
Its lookup is ``ops.masked_embedding_lookup``: the gradient of the table holds
only the rows the batch touches and that the mask permits, so frozen rows never
receive a gradient and plain SGD never writes them.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.row_mask import ROW_MASK_ATTRIBUTE, ids_to_row_mask, mask_changed
from partial_embedding._internal.types import Initializer, RowIds, RowMask, Table, TensorLike
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.layers import _arguments, _bags, _from_layer, _host_frozen, _quantized
from partial_embedding.layers._admission import AdmissionState, RowAdmission, checked_admission
from partial_embedding.layers._row_masked import RowMaskedConstraint, RowMaskedRegularizer
from partial_embedding.layers._stock_weights import assign_table, stock_embedding_table
from partial_embedding.layers._table_init import create_table
from partial_embedding.ops import entry_stop_gradients, masked_embedding_lookup

__all__ = ["PartialEmbedding"]


def _lora_refusal(argument: str, rank: Any, lora_alpha: Any) -> str:
    return (
        f"PartialEmbedding does not support LoRA ({argument}={rank!r}, "
        f"lora_alpha={lora_alpha!r}): a low-rank delta changes every row, frozen "
        "ones included. Choose the rows that learn with trainable_ids or "
        "frozen_ids instead."
    )


def _refuse_unsupported(
    lora_rank: int | None,
    lora_alpha: float | None,
    quantization_config: Any,
    kwargs: dict[str, Any],
) -> None:
    """Refuses LoRA and quantization configs other than int8; drops Keras'
    deprecated ``input_length``."""
    if lora_rank or lora_alpha is not None:
        raise ValueError(_lora_refusal("lora_rank", lora_rank, lora_alpha))
    if quantization_config is not None:
        mode = getattr(quantization_config, "mode", None)
        if mode not in _quantized.QUANTIZED_MODES:
            raise ValueError(
                "quantization_config: PartialEmbedding takes a keras.quantizers."
                "QuantizationConfig of mode 'int8' (e.g. Int8QuantizationConfig(); "
                f"frozen rows in int8, trainable rows in float), got {quantization_config!r}"
            )
    if kwargs.pop("input_length", None) is not None:
        warnings.warn(
            "Argument `input_length` is deprecated. Just remove it.",
            stacklevel=3,
        )


def _refuse_with_host(frozen_rows_on: str, combiner: str | None, admission: Any) -> None:
    """Refuses what a host layout does not take yet: bags and row admission."""
    if frozen_rows_on != _host_frozen.HOST:
        return
    for argument, value in (("combiner", combiner), ("admission", admission)):
        if value is not None:
            raise PartialEmbeddingArgumentError(
                f"frozen_rows_on: 'host' does not take {argument} yet ({argument}={value!r}); "
                "pass one of the two"
            )


@keras.saving.register_keras_serializable(package="partial_embedding")
class PartialEmbedding(framework_private.SaveableChildren, keras.layers.Layer):
    """An embedding layer in which only the rows chosen by a mask learn.

    A drop-in for ``keras.layers.Embedding`` (TensorFlow backend) that keeps a
    non-trainable bool weight, ``trainable_mask``, next to its table. The
    lookup's gradient holds only the permitted rows the batch touched, so SGD
    never writes a frozen row; for momentum, Adam or weight decay pair it with
    ``partial_embedding.MaskedOptimizer``. ``freeze``, ``unfreeze`` and
    ``set_trainable_ids`` change the mask from the next step, without
    retracing. The contract (the mask as saved state, sparse and ragged ids,
    stock weights, building in row blocks) is in docs/training_some_rows.md;
    where it differs from Keras, docs/keras_differences.md.

    Args:
      input_dim: Number of rows (vocabulary size).
      output_dim: Width of each row.
      trainable_ids: Row ids that learn (all others are frozen), or a bool
        mask of shape ``[input_dim]``.
      frozen_ids: Row ids that are frozen, or a bool mask. At most one of the
        two; with neither, every row learns.
      embeddings_initializer: Initializer of the table.
      embeddings_regularizer: Regularizer of the table (permitted rows only).
      embeddings_constraint: Constraint of the table (permitted rows only).
      mask_zero: Whether id 0 is padding, as in ``keras.layers.Embedding``.
      weights: Initial table ``[input_dim, output_dim]`` (an array, a
        memory-mapped ``.npy`` or its path, copied in row blocks), a
        one-element list of it, or ``[table, trainable_mask]``.
      lora_rank: Not supported; must be None.
      lora_alpha: Not supported; must be None.
      quantization_config: None, or an int8 ``keras.quantizers.QuantizationConfig``
        (docs/int8_frozen_rows.md).
      trainable_capacity: Float rows a quantized layer reserves for the rows
        that learn; None: the default rule.
      combiner: None (one row per id), or ``"sum"``, ``"mean"`` or
        ``"sqrtn"``: one vector per bag of ids (docs/bags.md).
      admission: None, or a ``partial_embedding.RowAdmission``: the
        permitted rows are then candidates, each trained once training
        batches have shown it ``min_count`` times, at most ``capacity`` at
        once (docs/row_admission.md).
      frozen_rows_on: ``"device"`` (the default: one table, on the layer's
        device) or ``"host"``: the frozen ``[V, D]`` table (float, or int8
        after ``quantize``) is created on ``/CPU:0``, the rows that learn
        in a compact float store (``float_rows``, its mask, ids and index;
        ``MaskedOptimizer``'s slots of it) on the compute device; a lookup
        copies only the batch's frozen rows there
        (docs/large_vocabularies.md).
      **kwargs: Base layer arguments (``name``, ``dtype``, ``trainable``, ...).

    Raises:
      ValueError: both ``trainable_ids`` and ``frozen_ids``, an id outside
        ``[0, input_dim)``, a wrong shape or an unsupported argument, named
        with its value (from ``from_config``: a ``TypeError``, as in Keras).

    >>> import numpy as np, keras, partial_embedding as pe
    >>> layer = pe.PartialEmbedding(4, 2, trainable_ids=[3],
    ...                             embeddings_initializer="ones")
    >>> model = keras.Sequential([layer])
    >>> model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    >>> _ = model.fit(np.array([[0, 3]]), np.zeros([1, 2, 2]), verbose=0)
    >>> layer.embeddings.numpy().tolist()
    [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.75, 0.75]]
    """

    # Saved files and Keras' registry name it by the module it had before
    # layers/ became a package.
    __module__ = "partial_embedding.layers"

    built: bool
    _embeddings: Any

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        trainable_ids: RowIds | None = None,
        frozen_ids: RowIds | None = None,
        embeddings_initializer: Initializer = "uniform",
        embeddings_regularizer: Any = None,
        embeddings_constraint: Any = None,
        mask_zero: bool = False,
        weights: Table | None = None,
        lora_rank: int | None = None,
        lora_alpha: float | None = None,
        quantization_config: Any = None,
        trainable_capacity: int | None = None,
        combiner: str | None = None,
        admission: RowAdmission | None = None,
        frozen_rows_on: str = "device",
        **kwargs: Any,
    ) -> None:
        framework_private.check_framework()
        # Every argument is checked before anything the size of the table
        # (or of its mask) exists.
        input_dim = _arguments.dimension(input_dim, "input_dim")
        output_dim = _arguments.dimension(output_dim, "output_dim")
        _refuse_unsupported(lora_rank, lora_alpha, quantization_config, kwargs)
        combiner = _bags.checked_combiner(combiner)
        admission = checked_admission(admission)
        frozen_rows_on = _arguments.frozen_rows_on(frozen_rows_on)
        _refuse_with_host(frozen_rows_on, combiner, admission)
        if admission is not None and quantization_config is not None:
            raise PartialEmbeddingArgumentError(
                "admission: row admission does not take an int8 layer yet "
                f"(quantization_config={quantization_config!r}); pass one of the two"
            )
        initial_mask = _arguments.initial_mask(trainable_ids, frozen_ids, input_dim)
        initial = None
        if weights is not None:
            initial = _arguments.initial_weights(weights, input_dim, output_dim)
        initializer = keras.initializers.get(embeddings_initializer)
        regularizer = keras.regularizers.get(embeddings_regularizer)
        constraint = keras.constraints.get(embeddings_constraint)
        super().__init__(**kwargs)
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.embeddings_initializer = initializer
        self.embeddings_regularizer = regularizer
        self.embeddings_constraint = constraint
        self.mask_zero = mask_zero
        self.combiner = combiner
        self.admission = admission
        #: The admission's state once built (``layers._admission``), else None.
        self._admission_state: AdmissionState | None = None
        # A bag's vector has no time steps to mask.
        self.supports_masking = mask_zero and combiner is None
        self.quantization_config = quantization_config
        # Float rows a quantized layer reserves (None: by the rule of
        # _quantized.default_capacity when it is quantized).
        self.trainable_capacity = trainable_capacity
        self.frozen_rows_on = frozen_rows_on
        self.autocast = False
        # The lookup and MaskedOptimizer have an XLA path.
        self.supports_jit = True
        # None until a mask is set: every row learns (no [V] array before build).
        self._initial_mask: RowMask | None = initial_mask
        if initial is not None:
            self._build_with(*initial)

    def _build_with(self, table: Table, mask: RowMask | None) -> None:
        """Builds from ``weights``' table and mask (None: the mask as constructed)."""
        if mask is not None:
            self._initial_mask = mask
        self._build(table)

    def build(self, input_shape: Any = None) -> None:
        self._build(None)

    def _add_row_mask(self, name: str, initial_mask: RowMask | None) -> Any:
        """A non-trainable bool ``[input_dim]`` weight holding ``initial_mask`` (None: all True)."""

        def initializer(shape: Any, dtype: Any = None) -> Any:
            return np.ones(shape, dtype=bool) if initial_mask is None else initial_mask

        return self.add_weight(
            shape=(self.input_dim,),
            initializer=initializer,
            dtype="bool",
            name=name,
            trainable=False,
        )

    @property
    def _has_store(self) -> bool:
        """Whether the rows that learn live in a float store beside a frozen
        table (int8, or with ``frozen_rows_on="host"``: ``_quantized``)."""
        return self.quantization_mode is not None or _host_frozen.on_host(self)

    def _build(self, table: Table | None) -> None:
        if self.built:
            return
        if self._has_store:
            self._initial_mask = _quantized.initial_mask(self, self._initial_mask)
            self.trainable_mask = self._add_row_mask("trainable_mask", self._initial_mask)
            if self.quantization_mode is not None:
                _quantized.build_quantized(self, table, self._current_mask())
            else:
                _quantized.build_host_float(self, table, self._current_mask())
            self.embeddings = self._embeddings
            self.built = True
            return
        shape = (self.input_dim, self.output_dim)
        self.embeddings = create_table(self, shape, self.embeddings_initializer, table)
        # Keras' Embedding keeps its table as _embeddings too (tests and
        # tools read it there).
        self._embeddings = self.embeddings
        self.trainable_mask = self._add_row_mask("trainable_mask", self._initial_mask)
        if self.admission is not None:
            self._admission_state = AdmissionState(self, self.admission)
        if self.embeddings_regularizer is not None:
            self.embeddings.regularizer = RowMaskedRegularizer(
                self.embeddings_regularizer, self._training_mask
            )
        if self.embeddings_constraint is not None:
            self.embeddings.constraint = RowMaskedConstraint(
                self.embeddings_constraint, self._training_mask
            )
        # Contract with MaskedOptimizer: it finds the mask through this.
        setattr(self.embeddings, ROW_MASK_ATTRIBUTE, self._training_mask)
        self.built = True

    @property
    def _training_mask(self) -> Any:
        """The row mask the lookup, the gradient and the optimizer use: the
        admitted rows with admission, else ``trainable_mask``."""
        state = self._admission_state
        return self.trainable_mask if state is None else state.admitted

    def _observe(self, ids: Any, training: Any, ignore_negative: bool = False) -> None:
        """Counts a training batch's ids for row admission (if any)."""
        state = self._admission_state
        if state is None or not training or framework_private.in_stateless_scope():
            return
        state.observe(ids, ignore_negative=ignore_negative)

    def call(
        self, inputs: TensorLike, weights: TensorLike | None = None, training: Any = None
    ) -> Any:
        if self.combiner is not None:
            return _bags.bag_call(self, inputs, weights, training)
        if weights is not None:
            raise PartialEmbeddingArgumentError(
                "weights: only a layer with a combiner takes weights (one per id of a bag)"
            )
        if isinstance(inputs, tf.SparseTensor):
            # As keras.layers.Embedding gives it: a dense result in which an
            # absent entry holds row 0 (Keras looks it up as default_id=0).
            inputs = tf.sparse.to_dense(tf.sparse.reorder(inputs))
        if isinstance(inputs, tf.RaggedTensor):
            # A ragged result with the ids' row partitions, as Keras gives.
            self._observe(inputs.flat_values, training)
            return inputs.with_flat_values(self._dense_lookup(inputs.flat_values))
        self._observe(inputs, training)
        return self._dense_lookup(inputs)

    def _dense_lookup(self, inputs: TensorLike) -> tf.Tensor:
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype not in (tf.int32, tf.int64):
            inputs = tf.cast(inputs, tf.int32)
        if self._has_store:
            rows = _quantized.lookup(self, tf.reshape(inputs, [-1]))
            shape = tf.concat([tf.shape(inputs), [self.output_dim]], 0)
            outputs = tf.reshape(rows, shape)
        elif framework_private.in_stateless_scope():
            # model.stateless_call: the variables' values come from the scope,
            # so gather from those tensors and stop gradients per occurrence.
            table = tf.convert_to_tensor(self.embeddings.value)
            mask = tf.convert_to_tensor(self._training_mask.value)
            permitted = tf.gather(mask, inputs)
            outputs = entry_stop_gradients(tf.gather(table, inputs), tf.expand_dims(permitted, -1))
        else:
            try:
                outputs = masked_embedding_lookup(self.embeddings, inputs, self._training_mask)
            except PartialEmbeddingArgumentError as error:
                # Keras re-creates OpErrors with the (node_def, op, message)
                # constructor, which ours lacks: have it re-raise ours as is.
                framework_private.keep_error_as_raised(error)
                raise
        return tf.cast(outputs, self.compute_dtype)

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        if not self.mask_zero or self.combiner is not None:
            return None
        return keras.ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape: Any, weights_shape: Any = None) -> tuple:
        if self.combiner is not None:
            return (input_shape[0], self.output_dim)
        return (*input_shape, self.output_dim)

    def compute_output_spec(self, inputs: Any, weights: Any = None) -> keras.KerasTensor:
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape),
            dtype=self.compute_dtype,
            ragged=self.combiner is None and getattr(inputs, "ragged", False),
        )

    # -- the mask --------------------------------------------------------

    def _current_mask(self) -> np.ndarray:
        if self.built and tf.executing_eagerly():
            return np.array(self.trainable_mask.numpy(), dtype=bool)
        if self._initial_mask is None:
            return np.ones([self.input_dim], dtype=bool)
        return np.array(self._initial_mask, dtype=bool)

    def _write_mask(self, mask: np.ndarray) -> None:
        if self.built and self._has_store:
            _quantized.write_mask(self, mask)
        elif self.built:
            self.trainable_mask.assign(mask)
            state = self._admission_state
            if state is not None:
                state.candidates_changed(mask)
            # Compact optimizer slots of XLA steps reserve room for new rows.
            mask_changed(self._training_mask)
        else:
            self._initial_mask = mask

    def freeze(self, ids: RowIds) -> None:
        """Freezes rows ``ids`` (integers in ``[0, input_dim)`` or a bool mask).

        Takes effect from the next step; traced functions are reused. Call it
        eagerly (e.g. from a callback), not inside a ``tf.function``.

        Raises:
          ValueError: an id outside ``[0, input_dim)``; nothing changes.
        """
        selected = ids_to_row_mask(ids, "ids", self.input_dim)
        self._write_mask(self._current_mask() & ~selected)

    def unfreeze(self, ids: RowIds) -> None:
        """Lets rows ``ids`` learn again (integers or a bool mask).

        Raises:
          ValueError: an id outside ``[0, input_dim)``; nothing changes.
        """
        selected = ids_to_row_mask(ids, "ids", self.input_dim)
        self._write_mask(self._current_mask() | selected)

    def set_trainable_ids(self, ids: RowIds) -> None:
        """Makes exactly rows ``ids`` learn and freezes all others.

        ``ids``: integers in ``[0, input_dim)`` or a bool mask of shape
        ``[input_dim]``.

        Raises:
          ValueError: an id outside ``[0, input_dim)`` or a mask of the wrong
            shape; nothing changes.
        """
        self._write_mask(ids_to_row_mask(ids, "ids", self.input_dim))

    @property
    def trainable_ids(self) -> np.ndarray:
        """The ids of the rows that learn now, sorted (int64)."""
        return np.flatnonzero(self._current_mask()).astype(np.int64)

    @property
    def frozen_ids(self) -> np.ndarray:
        """The ids of the frozen rows now, sorted (int64)."""
        return np.flatnonzero(~self._current_mask()).astype(np.int64)

    # -- row admission -----------------------------------------------------

    def _built_admission(self, what: str) -> AdmissionState:
        if self.admission is None:
            raise PartialEmbeddingArgumentError(
                f"{what}: layer {self.name} has no row admission (pass "
                "admission=partial_embedding.RowAdmission(...))"
            )
        if self._admission_state is None:
            raise PartialEmbeddingArgumentError(f"{what}: layer {self.name} is not built")
        return self._admission_state

    @property
    def admitted_ids(self) -> np.ndarray:
        """The ids of the rows admitted now, sorted (int64); with row
        admission only (these are the rows that train)."""
        return self._built_admission("admitted_ids").admitted_ids()

    def row_counts(self, ids: RowIds) -> np.ndarray:
        """How many training batches each of ``ids`` appeared in since its
        count last started (int64, ``ids``' shape); with row admission only.

        Raises:
          ValueError: an id outside ``[0, input_dim)``; no admission.
        """
        return self._built_admission("row_counts").row_counts(ids)

    # -- quantization ----------------------------------------------------

    def quantize(
        self,
        mode: str | None = None,
        type_check: bool = True,
        config: Any = None,
        *,
        trainable_capacity: int | None = None,
    ) -> None:
        """Stores frozen rows in int8 (per-row scale); trainable rows stay float.

        Keras' entry point (also reached through ``model.quantize("int8")`` and
        an ``"int8_from_float32"`` dtype policy). The int8 rows and scales are
        those Keras' ``Embedding.quantize`` computes (same quantizer, row by
        row, in blocks). Every row permitted now gets a float store row holding
        its float values; rows unfrozen later get one holding their
        dequantized values. See ``partial_embedding.layers._quantized``.

        Args:
          mode: ``"int8"``. ``"int4"`` and the other Keras modes raise
            ``NotImplementedError`` (``model.quantize`` then warns and skips
            the layer).
          type_check: As in Keras: refuse subclasses unless False.
          config: A ``keras.quantizers.Int8QuantizationConfig`` (its weight
            quantizer is used), or None.
          trainable_capacity: Float rows to reserve for rows that learn
            (now and later); default: the trainable rows and a sixteenth more
            (at least 16), at most ``input_dim``. Unfreezing more rows later
            grows the store (by half, or to what is needed), except under a
            ``tf.distribute`` strategy, where it raises.

        Raises:
          ValueError: unbuilt, already quantized, unknown mode (Keras' checks).
          NotImplementedError: a subclass with ``type_check``; int4 and others.
          PartialEmbeddingArgumentError: an integer table; a bad
            ``trainable_capacity``. Nothing is changed on any error.
        """
        if self.admission is not None:
            raise PartialEmbeddingArgumentError(
                f"quantize: layer {self.name} has row admission ({self.admission!r}), "
                "which does not take an int8 table yet"
            )
        if type_check and type(self).__module__ != "partial_embedding.layers":
            raise NotImplementedError(
                f"Layer {type(self).__name__} does not have a `quantize()` method "
                "implemented (a subclass of a partial layer: pass type_check=False)."
            )
        _quantized.quantize_built(self, mode, config, trainable_capacity)
        self.embeddings = self._embeddings

    def enable_lora(
        self,
        rank: int,
        lora_alpha: float | None = None,
        a_initializer: Any = "he_uniform",
        b_initializer: Any = "zeros",
    ) -> None:
        """Refuses Keras' LoRA entry point (``Embedding.enable_lora``), clearly.

        A low-rank delta ``A @ B`` moves every row, frozen ones included, which
        is what this layer exists to prevent: choose the rows that learn with
        ``trainable_ids`` / ``unfreeze`` instead. Defined (not left missing)
        so that a call names the reason instead of an ``AttributeError``;
        keras-hub's ``Backbone.enable_lora(rank, target_layer_names=[...])``
        naming this layer raises it too (other target layers are unaffected
        when this one is not named).

        Raises:
          ValueError: always; nothing is changed.
        """
        del a_initializer, b_initializer
        raise ValueError(_lora_refusal("rank", rank, lora_alpha))

    def quantized_call(self, *args: Any, **kwargs: Any) -> Any:
        # Keras routes quantized layers here; ours look up as call() does.
        _quantized.check_mode(self.quantization_mode)
        return self.call(*args, **kwargs)

    def quantized_build(self, input_shape: Any, mode: str, config: Any = None) -> None:
        _quantized.check_mode(mode)
        self.build(input_shape)

    # -- serialization ---------------------------------------------------

    def _assign_stock_table(self, table: Table, source: str) -> None:
        expected = (self.input_dim, self.output_dim)
        assign_table(self.embeddings, table, expected, self.name, source)

    def set_weights(self, weights: Any) -> None:
        """Sets the table, or the table and the mask, from NumPy arrays.

        ``[table, trainable_mask]`` (as from ``get_weights()``) sets both.
        ``[table]`` (as from a stock ``keras.layers.Embedding``) sets the table
        and leaves the mask as it is (as constructed, unless ``freeze`` and
        its kin changed it since). The table is copied in row blocks.
        A quantized layer takes its weights in ``get_weights()``' order, a
        stock ``Embedding``'s ``[table]`` (quantized, its trainable rows kept
        in float) or a quantized stock ``Embedding``'s ``[int8, scales]``.
        """
        if self._has_store:
            if not (self.built and _quantized.load_stock(self, list(weights))):
                keras.layers.Layer.set_weights(self, weights)
            return
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
        two). The table is copied into the variable in row blocks. A
        quantized layer loads what a quantized layer saved, or what a stock
        ``Embedding`` (float or quantized) saved, as ``set_weights`` takes it.
        """
        if self._has_store:
            arrays = [store[key] for key in sorted(store.keys(), key=int)] if self.built else []
            if not (len(arrays) <= 2 and _quantized.load_stock(self, arrays)):
                keras.layers.Layer.load_own_variables(self, store)
            return
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
            stock_table = stock_embedding_table(store)
            if stock_table is not None:
                self._assign_stock_table(stock_table, "a stock Embedding's saved table")
                return
        super().load_own_variables(store)

    @classmethod
    def from_layer(
        cls,
        stock_layer: Any,
        *,
        extra_rows: int = 0,
        trainable_ids: RowIds | None = None,
        init: Any = "mean",
        seed: int | None = None,
    ) -> Any:
        """A partial layer configured as a stock ``keras.layers.Embedding``, holding its table.

        The general way in for any Keras model that holds a stock embedding:
        its configuration carries over (name, dtype policy, initializer,
        regularizer, constraint, ``mask_zero``, ``trainable``), its rows are
        copied bit for bit, and ``extra_rows`` rows are appended.

        Args:
          stock_layer: A ``keras.layers.Embedding`` (not a
            ``ReversibleEmbedding``: see
            ``PartialReversibleEmbedding.from_layer``). Unbuilt, only its
            configuration is used.
          extra_rows: Rows appended after the stock layer's ``input_dim``.
          trainable_ids: The rows that learn (ids or a bool mask over the
            grown table); default: the appended rows.
          init: How appended rows are filled: ``"mean"`` (the mean of the old
            rows), ``"mean_cov"`` (draws from the old rows' mean and
            covariance), ``"zeros"``, an array ``[extra_rows, output_dim]``,
            or any Keras initializer. With ``extra_rows=0`` it fills the
            ``trainable_ids`` rows instead (their statistics taken from the
            others), and None keeps them as they are.
          seed: Seed of ``"mean_cov"`` draws.

        Returns:
          The new, built layer (unbuilt when ``stock_layer`` is).

        Raises:
          PartialEmbeddingTypeError: ``stock_layer`` of another kind; an
            unknown ``init``.
          PartialEmbeddingArgumentError: ``extra_rows < 0``; an id outside the
            grown table; LoRA or quantization on ``stock_layer``.

        >>> import keras, numpy as np, partial_embedding as pe
        >>> stock = keras.layers.Embedding(3, 2, embeddings_initializer="ones")
        >>> stock.build()
        >>> layer = pe.PartialEmbedding.from_layer(stock, extra_rows=1, init="zeros")
        >>> layer.embeddings.numpy().tolist(), layer.trainable_ids.tolist()
        ([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]], [3])
        """
        return _from_layer.from_stock_layer(
            cls, stock_layer, extra_rows, trainable_ids, init, seed, reversible=False
        )

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
            "combiner": self.combiner,
            "frozen_rows_on": self.frozen_rows_on,
        }
        if self.admission is not None:
            config["admission"] = self.admission.get_config()
        if self._has_store:
            config["trainable_capacity"] = self.trainable_capacity
        if self.quantization_mode is not None:
            config["quantization_config"] = keras.saving.serialize_keras_object(
                self.quantization_config
            )
        return {**base_config, **config}

    @classmethod
    def from_config(cls, config: dict) -> Any:
        config = dict(config)
        if isinstance(config.get("quantization_config"), dict):
            config["quantization_config"] = keras.saving.deserialize_keras_object(
                config["quantization_config"]
            )
        return _arguments.from_config_as_keras(super().from_config, config, cls.__name__)
