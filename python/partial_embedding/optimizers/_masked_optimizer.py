"""MaskedOptimizer: its constructor, its configuration and its saved state.

What it does is in its parts, each a mixin: ``_mask_lookup`` (which
variables are masked, by what), ``_slot_placement`` (``build``: where each
variable's slots live), ``_apply`` (the step), ``_slot_api`` (the public slot
methods) and ``_delegation`` (what is passed on to the wrapped optimizer).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import keras
import tensorflow as tf

from partial_embedding._internal import framework_private
from partial_embedding._internal.row_mask import RowMask
from partial_embedding._internal.types import KerasOptimizer, Variable
from partial_embedding._internal.types import RowMask as RowMaskLike
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.optimizers import _row_rules as row_rules
from partial_embedding.optimizers import _slot_store as slot_store
from partial_embedding.optimizers._apply import ApplyPipeline
from partial_embedding.optimizers._delegation import Delegation
from partial_embedding.optimizers._mask_lookup import MaskLookup, normalize_row_masks
from partial_embedding.optimizers._slot_api import SlotAPI
from partial_embedding.optimizers._slot_placement import SlotPlacement
from partial_embedding.optimizers._slot_store import (
    COMPACT_KEY,
    COMPACT_SLOTS_CHOICES,
    SlotStore,
    StoreHidingKeys,
    check_compact_arguments,
)

__all__ = ["COMPACT_SLOTS_CHOICES", "MaskedOptimizer"]


@keras.saving.register_keras_serializable(package="partial_embedding")
class MaskedOptimizer(
    framework_private.SaveableChildren,
    ApplyPipeline,
    SlotPlacement,
    MaskLookup,
    SlotAPI,
    Delegation,
    keras.optimizers.Optimizer,
):
    """Wraps a stock Keras optimizer so masked tables train only permitted rows.

    For every masked variable (each ``PartialEmbedding``'s ``embeddings``,
    found automatically, plus those in ``row_masks``) a step updates only the
    rows its mask permits and the batch holds, with the wrapped optimizer's
    own rule and hyperparameters, writing the variable and its slots in
    place; every other row keeps its bits. The update is lazy, like TF's
    ``SparseApply*`` ops: a row absent from a batch keeps its moments. Other
    variables go to the wrapped optimizer unchanged. By default a table of
    which at most half the rows are permitted gets compact slots, holding
    those rows only. Clipping, weight decay, loss scaling, XLA, distribution
    strategies and saving: see docs/optimizers.md.

    Args:
      inner: The optimizer to wrap: ``SGD``, ``Adam``, ``AdamW``, ``Adagrad``
        or ``RMSprop`` (an instance, or a name or config for
        ``keras.optimizers.get``), or a ``LossScaleOptimizer`` around one.
      row_masks: Extra masked variables: a mapping, or ``(variable, mask)``
        pairs; a mask is a bool ``[V]`` variable (which may change during
        training), tensor or array. Not in the config: pass it again, or call
        :meth:`set_row_mask`, after loading.
      name: The optimizer's name.
      compact_slots: ``"auto"`` (compact where at most half the rows are
        permitted at build), ``True`` or ``False``.
      slot_capacity: Slot rows each compact table allocates at build
        (default: its permitted rows then; at least 1).
      compact_variable_indices: Set by ``from_config``; leave it None.

    Raises:
      PartialEmbeddingTypeError: ``inner`` is not a supported optimizer.
      PartialEmbeddingArgumentError: ``inner`` uses ``use_ema`` or
        ``gradient_accumulation_steps``, or ``compact_slots`` or
        ``slot_capacity`` is not a valid value.
      ImportError: the installed Keras lacks a private member the wrapper
        relies on (the message names them all).

    >>> import numpy as np, keras, tensorflow as tf, partial_embedding as pe
    >>> table = keras.Variable(np.ones((4, 2), "float32"))
    >>> mask = keras.Variable([True, False, True, False], trainable=False)
    >>> optimizer = pe.MaskedOptimizer(keras.optimizers.SGD(0.5),
    ...                                row_masks=[(table, mask)])
    >>> grad = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([0, 1, 0]),
    ...                         tf.constant([4, 2]))
    >>> optimizer.apply([grad], [table])
    >>> table.numpy().tolist()
    [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    """

    built: bool

    def __init__(
        self,
        inner: KerasOptimizer | str | dict[str, Any],
        row_masks: Mapping[Any, RowMaskLike] | Iterable[tuple[Variable, RowMaskLike]] | None = None,
        name: str | None = None,
        *,
        compact_slots: bool | str = "auto",
        slot_capacity: int | None = None,
        compact_variable_indices: Iterable[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if keras.backend.backend() != "tensorflow":
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer needs the TensorFlow backend of Keras, got "
                f"{keras.backend.backend()!r}"
            )
        if kwargs:
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer does not take optimizer arguments "
                f"({', '.join(sorted(kwargs))}); set them on the inner optimizer"
            )
        check_compact_arguments(compact_slots, slot_capacity)
        if isinstance(inner, (str, dict)):
            inner = keras.optimizers.get(inner)
        framework_private.check_keras_internals(inner)
        base_optimizer = inner
        if isinstance(inner, keras.optimizers.LossScaleOptimizer):
            base_optimizer = inner.inner_optimizer
        row_rule = row_rules.row_rule_for(base_optimizer)
        if base_optimizer.use_ema:
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer does not support use_ema=True on the inner "
                "optimizer (the moving average would rewrite every row each step)"
            )
        if base_optimizer.gradient_accumulation_steps:
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer does not support gradient_accumulation_steps on "
                "the inner optimizer"
            )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner
        self._base_optimizer = base_optimizer
        self._row_rule = row_rule
        self._loss_scale_optimizer = (
            inner if isinstance(inner, keras.optimizers.LossScaleOptimizer) else None
        )
        self._requested_masks: list[tuple[Any, Any]] = list(normalize_row_masks(row_masks))
        # var_key(variable) -> RowMask, filled at build.
        self._row_masks: dict[int, RowMask] = {}
        self.compact_slots = compact_slots
        self.slot_capacity = slot_capacity
        # Positions (in the list the optimizer is built with) of the variables
        # with compact slots, as saved in a config: a model being loaded
        # builds the slots it saved, whatever its masks hold before their
        # values are loaded. None: decide at build.
        self._saved_compact_indices = slot_store.compact_indices(compact_variable_indices)
        # The slots this wrapper makes itself (compact, per shard) and the
        # XLA scratch, in a holder neither Keras nor TensorFlow tracks; its
        # two variable containers are tracked here, under the attribute
        # names that fix their checkpoint keys.
        self._slot_store = SlotStore()
        self._skipped_updates_warned = 0
        self._compact_slot_state = self._slot_store.compact_state
        self._shard_slot_state = self._slot_store.shard_state

    def _key(self, variable: Any) -> Any:
        """The key of ``variable`` (the same for every copy of a mirrored one)."""
        return framework_private.var_key(self, variable)

    # -- serialization ----------------------------------------------------------

    @property
    def compact_slot_variables(self) -> list[tf.Variable]:
        """The variables of the compact slots, in build order.

        Per masked variable with compact slots: its row -> slot-row map
        (float32 ``[V]``, ``-1`` for a row without a slot row), the number of
        slot rows used, then one ``[capacity] + row_shape`` variable per slot
        (the row count grows during training, so its static shape is
        ``[None] + row_shape``). Not in ``variables``; ``tf.train.Checkpoint``,
        SavedModel and ``.keras`` files save them.
        """
        return list(self._slot_store.compact_variables)

    def save_own_variables(self, store: Any) -> None:
        """Saves ``variables`` as Keras does, then the compact slots
        (keys ``compact_0``, ``compact_1``, ...)."""
        super().save_own_variables(store)
        self._slot_store.save(store)

    def load_own_variables(self, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved."""
        compact_keys = {k for k in store.keys() if k.startswith(COMPACT_KEY)}
        super().load_own_variables(StoreHidingKeys(store, compact_keys))
        if not self._slot_store.load(store):
            warnings.warn(
                f"Skipping the compact slots of optimizer '{self.name}': it has "
                f"{len(self._slot_store.compact_variables)} compact slot variables whereas "
                f"the saved optimizer has {len(compact_keys)}.",
                stacklevel=2,
            )

    def get_config(self) -> dict[str, Any]:
        if self.built:
            compact_indices: list[int] | None = [
                i
                for i, v in enumerate(framework_private.trainable_variables(self))
                if self.has_compact_slots(v)
            ]
        else:
            compact_indices = self._saved_compact_indices
        return {
            "name": self.name,
            "inner": keras.saving.serialize_keras_object(self.inner_optimizer),
            "compact_slots": self.compact_slots,
            "slot_capacity": self.slot_capacity,
            "compact_variable_indices": compact_indices,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> MaskedOptimizer:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner"), custom_objects=custom_objects
        )
        return cls(inner, **config)


# Its public home: Keras' serialized configs name this module, and doctest
# finds the class' example there.
MaskedOptimizer.__module__ = "partial_embedding.optimizers"
