"""``PartialReversibleEmbedding``: tied (or untied) input and output embeddings
in which only chosen rows learn."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.row_mask import ROW_MASK_ATTRIBUTE, ids_to_row_mask, mask_changed
from partial_embedding._internal.types import Initializer, RowIds, RowMask, Table
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.layers import (
    _arguments,
    _from_layer,
    _host_frozen,
    _quantized,
    _quantized_reverse,
)
from partial_embedding.layers._arguments import COMPUTE_DTYPE
from partial_embedding.layers.embedding import PartialEmbedding
from partial_embedding.ops import masked_reverse_projection

__all__ = ["PartialReversibleEmbedding"]


def _copy(mask: RowMask | None) -> RowMask | None:
    return None if mask is None else np.array(mask, dtype=bool)


def _initial_reverse_mask(
    reverse_trainable_ids: RowIds | None, tie_weights: bool, input_dim: int
) -> RowMask | None:
    """The mask ``reverse_trainable_ids`` gives (None when not given).

    Raises:
      PartialEmbeddingArgumentError: ids given with tied weights; an id
        outside ``[0, input_dim)``.
    """
    if reverse_trainable_ids is None:
        return None
    if tie_weights:
        raise PartialEmbeddingArgumentError(
            "PartialReversibleEmbedding: reverse_trainable_ids needs "
            "tie_weights=False (tied, the reverse projection uses the "
            "input table and its mask)"
        )
    return ids_to_row_mask(reverse_trainable_ids, "reverse_trainable_ids", input_dim)


@keras.saving.register_keras_serializable(package="partial_embedding")
class PartialReversibleEmbedding(PartialEmbedding):
    """A ``keras.layers.ReversibleEmbedding`` in which only chosen rows learn.

    For new tokens in a language model whose input and output embeddings are
    tied. ``layer(ids)`` is ``PartialEmbedding``'s lookup; ``layer(hidden,
    reverse=True)`` gives the logits ``hidden @ embeddings^T``
    (``[..., input_dim]``, in ``reverse_dtype``, soft-capped as in Keras),
    whose gradient for the table is a ``tf.IndexedSlices`` of the permitted
    rows only, never ``[V, D]``. With ``tie_weights=False`` the output table
    ``reverse_embeddings`` has its own mask, ``reverse_trainable_mask``, and
    is stored row-major ``[input_dim, output_dim]`` (a stock layer's weights
    load transposed). The contract, and the differences from Keras beyond
    ``PartialEmbedding``'s: docs/tied_embeddings.md.

    Args:
      input_dim: Number of rows (vocabulary size).
      output_dim: Width of each row.
      tie_weights: Whether the reverse projection uses ``embeddings``.
      trainable_ids: Row ids that learn (all others are frozen), or a bool
        mask of shape ``[input_dim]``.
      frozen_ids: Row ids that are frozen, or a bool mask (at most one of the two).
      embeddings_initializer: Initializer of the table(s).
      embeddings_regularizer: Regularizer of ``embeddings`` (permitted rows only).
      embeddings_constraint: Constraint of ``embeddings`` (permitted rows only).
      mask_zero: Whether id 0 is padding.
      reverse_dtype: The dtype of the reverse projection: ``"compute_dtype"``
        (the default; Keras' is None), a float dtype name, or None (the
        operands' promoted dtype).
      logit_soft_cap: If set, the logits become
        ``tanh(logits / logit_soft_cap) * logit_soft_cap``.
      weights: Initial ``embeddings`` (or ``[table, trainable_mask]``), as in
        ``PartialEmbedding``.
      reverse_trainable_ids: Untied only: the rows of ``reverse_embeddings``
        that learn (ids or a bool mask); None: the input table's initial ones.
      **kwargs: Base layer arguments (``name``, ``dtype``, ...) and
        ``PartialEmbedding``'s others; ``frozen_rows_on="host"`` with tied
        weights only (the frozen columns of the logits are computed on the
        host: docs/large_vocabularies.md).

    Raises:
      ValueError: as ``PartialEmbedding``; ``reverse_trainable_ids`` with
        tied weights; ``frozen_rows_on="host"`` untied; an id outside
        ``[0, input_dim)``.

    >>> import numpy as np, tensorflow as tf, partial_embedding as pe
    >>> layer = pe.PartialReversibleEmbedding(4, 2, trainable_ids=[3],
    ...                                       embeddings_initializer="ones")
    >>> hidden = np.array([[1.0, 2.0]], dtype="float32")
    >>> layer(hidden, reverse=True).numpy().tolist()
    [[3.0, 3.0, 3.0, 3.0]]
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(layer(hidden, reverse=True))
    >>> grad = tape.gradient(loss, layer.embeddings.value)
    >>> grad.indices.numpy().tolist(), grad.values.numpy().tolist()
    ([3], [[1.0, 2.0]])
    """

    # Saved files and Keras' registry name it by the module it had before
    # layers/ became a package.
    __module__ = "partial_embedding.layers"

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        *,
        tie_weights: bool = True,
        trainable_ids: RowIds | None = None,
        frozen_ids: RowIds | None = None,
        embeddings_initializer: Initializer = "uniform",
        embeddings_regularizer: Any = None,
        embeddings_constraint: Any = None,
        mask_zero: bool = False,
        reverse_dtype: Any = COMPUTE_DTYPE,
        logit_soft_cap: float | None = None,
        weights: Table | None = None,
        reverse_trainable_ids: RowIds | None = None,
        **kwargs: Any,
    ) -> None:
        # Checked before anything is allocated (PartialEmbedding checks the rest).
        if kwargs.pop("combiner", None) is not None:
            raise PartialEmbeddingArgumentError(
                "combiner: PartialReversibleEmbedding looks up one row per id (its "
                "reverse projection needs them); pool bags with PartialEmbedding(combiner=...)"
            )
        input_dim = _arguments.dimension(input_dim, "input_dim")
        output_dim = _arguments.dimension(output_dim, "output_dim")
        reverse_dtype = _arguments.reverse_dtype(reverse_dtype)
        initial_reverse_mask = _initial_reverse_mask(reverse_trainable_ids, tie_weights, input_dim)
        if not tie_weights and kwargs.get("frozen_rows_on", "device") == _host_frozen.HOST:
            raise PartialEmbeddingArgumentError(
                "frozen_rows_on: 'host' takes tied weights only for now (tie_weights=False "
                "would keep a second [V, D] table on the device); pass tie_weights=True"
            )
        initial = None
        if weights is not None:
            initial = _arguments.initial_weights(weights, input_dim, output_dim)
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
        self.reverse_dtype = reverse_dtype
        self.logit_soft_cap = logit_soft_cap
        # Without reverse_trainable_ids, the input table's initial mask
        # (None: every row learns).
        self._reverse_mask_given = reverse_trainable_ids is not None
        self._initial_reverse_mask: RowMask | None = (
            initial_reverse_mask if self._reverse_mask_given else _copy(self._initial_mask)
        )
        if initial is not None:
            self._build_with(*initial)

    def _build_with(self, table: Table, mask: RowMask | None) -> None:
        if mask is not None and not self._reverse_mask_given:
            self._initial_reverse_mask = _copy(mask)
        super()._build_with(table, mask)

    def _reserve_capacity(self) -> None:
        """Quantized at construction: the initial masks and one store capacity
        for both tables (recorded, so that the config rebuilds the same shapes)."""
        counts = []
        for attribute in ("_initial_mask", "_initial_reverse_mask"):
            mask = _quantized.initial_mask(self, getattr(self, attribute))
            setattr(self, attribute, mask)
            counts.append(self.input_dim if mask is None else int(np.count_nonzero(mask)))
        if self.tie_weights:
            counts.pop()
        self.trainable_capacity = _quantized.checked_capacity(
            self.trainable_capacity, max(counts), self.input_dim
        )

    def _build(self, table: Table | None) -> None:
        if self.built:
            return
        if self.quantization_mode is not None:
            self._reserve_capacity()
        super()._build(table)
        if self.tie_weights:
            return
        if self.quantization_mode is not None:
            self.reverse_trainable_mask = self._add_row_mask(
                "reverse_trainable_mask", self._initial_reverse_mask
            )
            _quantized_reverse.build_reverse(self, self._current_reverse_mask())
            return
        self.reverse_embeddings = self.add_weight(
            shape=(self.input_dim, self.output_dim),
            initializer=self.embeddings_initializer,
            name="reverse_embeddings",
            trainable=True,
        )
        self.reverse_trainable_mask = self._add_row_mask(
            "reverse_trainable_mask", self._initial_reverse_mask
        )
        setattr(self.reverse_embeddings, ROW_MASK_ATTRIBUTE, self.reverse_trainable_mask)

    # Its second argument is `reverse`, not PartialEmbedding's bag `weights`.
    def call(  # type: ignore[override]
        self, inputs: Any, reverse: bool = False, training: Any = None
    ) -> Any:
        if not reverse:
            return super().call(inputs, training=training)
        compute_dtype = (
            self.compute_dtype if self.reverse_dtype == COMPUTE_DTYPE else self.reverse_dtype
        )
        if self._has_store:
            store = self if self.tie_weights else _quantized.ReverseStore(self)
            logits = _quantized_reverse.reverse_logits(
                store, inputs, compute_dtype, self.quantization_config
            )
            return self._soft_capped(logits)
        if self.tie_weights:
            table, row_mask = self.embeddings, self._training_mask
        else:
            table, row_mask = self.reverse_embeddings, self.reverse_trainable_mask
        if framework_private.in_stateless_scope():
            # model.stateless_call: the variables' values come from the scope.
            table = tf.convert_to_tensor(table.value)
            row_mask = tf.convert_to_tensor(row_mask.value)
        logits = masked_reverse_projection(inputs, table, row_mask, compute_dtype)
        return self._soft_capped(logits)

    def _soft_capped(self, logits: Any) -> Any:
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
        """A partial layer configured as a stock ``keras.layers.ReversibleEmbedding``.

        As ``PartialEmbedding.from_layer``, and besides: ``tie_weights``,
        ``reverse_dtype`` and ``logit_soft_cap`` carry over; untied, the
        stock ``[output_dim, input_dim]`` output table is copied transposed
        into ``reverse_embeddings``, grown and filled by ``init`` the same way
        (its statistics from its own old rows), and ``trainable_ids`` apply
        to it too.

        Raises:
          PartialEmbeddingTypeError: ``stock_layer`` is not a
            ``keras.layers.ReversibleEmbedding``; an unknown ``init``.
          PartialEmbeddingArgumentError: as ``PartialEmbedding.from_layer``.

        >>> import keras, numpy as np, partial_embedding as pe
        >>> stock = keras.layers.ReversibleEmbedding(3, 2, embeddings_initializer="ones")
        >>> stock.build()
        >>> layer = pe.PartialReversibleEmbedding.from_layer(stock, extra_rows=2)
        >>> layer(np.ones([1, 2], "float32"), reverse=True).numpy().tolist()
        [[2.0, 2.0, 2.0, 2.0, 2.0]]
        >>> layer.trainable_ids.tolist()
        [3, 4]
        """
        return _from_layer.from_stock_layer(
            cls, stock_layer, extra_rows, trainable_ids, init, seed, reversible=True
        )

    # -- quantization ----------------------------------------------------

    @property
    def inputs_quantizer(self) -> Any:
        """The quantizer of the reverse projection's inputs (int8 only), as
        Keras' quantized ``ReversibleEmbedding`` has it; None when not quantized."""
        if self.quantization_mode is None:
            return None
        return _quantized_reverse.inputs_quantizer(self.quantization_config)

    def quantize(
        self,
        mode: str | None = None,
        type_check: bool = True,
        config: Any = None,
        *,
        trainable_capacity: int | None = None,
    ) -> None:
        """Stores frozen rows in int8 (per-row scale); trainable rows stay float.

        As ``PartialEmbedding.quantize``. Untied, ``reverse_embeddings`` is
        quantized the same way into its own int8 rows and scales
        (``reverse_embeddings``, ``reverse_embeddings_scale``: Keras' bytes
        transposed, as our float table is) and its own float store
        (``reverse_float_rows`` and its mask, ids and index) for the rows of
        ``reverse_trainable_mask``; both stores have ``trainable_capacity``
        rows (default: from the larger of the two masks).

        The reverse projection then gives, for a column whose row has no
        float store row, the logits Keras' quantized ``ReversibleEmbedding``
        computes (the inputs quantized by the activation quantizer, an
        integer matmul, divided by both scales: bit for bit Keras' with every
        row frozen), and for the other columns ``inputs @ float_row^T`` in
        ``reverse_dtype``. The table's gradient is an ``IndexedSlices`` of
        permitted float rows. The inputs' gradient is exact through the float
        columns and straight-through for the int8 ones (as if the dequantized
        table were a constant). Costs: the forward pass is Keras' (the int8
        rows are read whole, per call), plus one ``[..., capacity + 1]``
        float matmul, a ``[V]`` int32 map and a gather of the float columns;
        the backward pass builds the dequantized table, a ``[V, D]`` transient
        of the variable dtype, for ``dlogits @ table``. The int8 logits are
        Keras' cast to ``reverse_dtype`` (Keras ignores it; under
        ``mixed_bfloat16`` they come out in ``float32``).

        Raises:
          As ``PartialEmbedding.quantize``; nothing is changed on any error.
        """
        # (A dtype policy set to int8 sets the policy before calling this.)
        if (
            self.tie_weights
            or not self.built
            or not keras.backend.is_float_dtype(self.reverse_embeddings.dtype)
        ):
            super().quantize(mode, type_check, config, trainable_capacity=trainable_capacity)
            return
        _quantized.check_mode(mode)
        _quantized.check_strategy(self.reverse_embeddings)
        _quantized.check_float_table(self.reverse_embeddings.dtype, self.name)
        reverse_mask = self._current_reverse_mask()
        capacity = _quantized.checked_capacity(
            trainable_capacity if trainable_capacity is not None else self.trainable_capacity,
            max(len(self.trainable_ids), int(np.count_nonzero(reverse_mask))),
            self.input_dim,
        )
        super().quantize(mode, type_check, config, trainable_capacity=capacity)
        # Created again after the input table's store, so that the weights
        # are in the order a layer built quantized has them (saved files).
        del self.reverse_trainable_mask
        self.reverse_trainable_mask = self._add_row_mask("reverse_trainable_mask", reverse_mask)
        _quantized_reverse.quantize_reverse(self, reverse_mask)

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
        if self._initial_reverse_mask is None:
            return np.ones([self.input_dim], dtype=bool)
        return np.array(self._initial_reverse_mask, dtype=bool)

    def set_reverse_trainable_ids(self, ids: RowIds) -> None:
        """Untied: makes exactly rows ``ids`` of ``reverse_embeddings`` learn.

        Quantized, a row that learns for the first time gets a float row of
        the output table's store, holding its dequantized values.

        Raises:
          AttributeError: with tied weights.
          ValueError: an id outside ``[0, input_dim)``; quantized, more new
            rows than free float rows; nothing changes.
        """
        self._untied("set_reverse_trainable_ids")
        mask = ids_to_row_mask(ids, "ids", self.input_dim)
        if self.built and self.quantization_mode is not None:
            _quantized.write_mask(_quantized.ReverseStore(self), mask)
        elif self.built:
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
        ``[output_dim, input_dim]``: it is transposed into ours. Quantized and
        untied, it also takes a quantized stock layer's four arrays
        (``[int8, scales, reverse int8, reverse scales]``).
        """
        quantized_untied = self.built and not self.tie_weights and self.quantization_mode
        if quantized_untied and _quantized_reverse.load_stock_untied(self, list(weights)):
            return
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
        second transposed, and the masks are left as they are (a quantized
        layer also loads a quantized stock layer's four). Otherwise as
        ``PartialEmbedding.load_own_variables``.
        """
        quantized_untied = self.built and not self.tie_weights and self.quantization_mode
        if quantized_untied and len(store.keys()) in (2, 4):
            arrays = [store[key] for key in sorted(store.keys(), key=int)]
            if _quantized_reverse.load_stock_untied(self, arrays):
                return
        elif self.built and not self.tie_weights and len(store.keys()) == 2:
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
        config.pop("combiner", None)  # It takes none.
        return config
