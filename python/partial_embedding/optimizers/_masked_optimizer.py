"""MaskedOptimizer's pipeline: the wrapped optimizer's apply(), masked
variables updated by row.

A step: filter empty gradients, unscale (loss scaling), sum the masked
variables' gradients over replicas, sum duplicate rows and zero frozen ones
(unless a fused kernel takes the raw gradient), clip, then update the other
variables with the wrapped optimizer's own step and the masked ones with
their row rule (``_row_rules``), in place.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import keras
import tensorflow as tf
from keras import ops

from partial_embedding._internal import framework_private as keras_internals
from partial_embedding._internal import xla as _xla
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.row_mask import (
    ROW_MASK_ATTRIBUTE,
    RowMask,
    is_variable_like,
    watch_mask,
)
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)
from partial_embedding.ops import resolve_variable
from partial_embedding.optimizers import _cluster as cluster
from partial_embedding.optimizers import _row_rules as row_rules
from partial_embedding.optimizers import _sharded as sharded
from partial_embedding.optimizers._compact_slots import (
    MAX_SLOT_ROWS,
    CompactSlots,
    SlotVariableState,
)

#: The values ``compact_slots`` takes.
COMPACT_SLOTS_CHOICES = ("auto", True, False)


def _scale_gradient(gradient: Any, factor: Any) -> Any:
    """``gradient * factor`` for a dense tensor or ``tf.IndexedSlices``."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            gradient.values * tf.cast(factor, gradient.values.dtype),
            gradient.indices,
            gradient.dense_shape,
        )
    return gradient * tf.cast(factor, gradient.dtype)


def _divide_gradient(gradient: Any, divisor: Any) -> Any:
    """``gradient / divisor`` for a dense tensor or ``tf.IndexedSlices``."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            ops.divide(gradient.values, divisor),
            gradient.indices,
            gradient.dense_shape,
        )
    return ops.divide(gradient, divisor)


def _gradient_values(gradient: Any) -> tf.Tensor:
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _all_reduce_masked_gradients(grads: list[Any], masks: list[Any]) -> list[Any]:
    """Sums the masked variables' gradients over replicas (in a replica
    context of a strategy with several): every replica then updates its copy
    with the same rows. Keras sums the other gradients itself, later."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return grads
    strategy = tf.distribute.get_strategy()
    positions = [i for i, (g, mask) in enumerate(zip(grads, masks)) if mask and g is not None]
    if strategy.num_replicas_in_sync == 1 or not positions:
        return grads
    reduced = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, [grads[i] for i in positions]
    )
    grads = list(grads)
    for position, gradient in zip(positions, reduced):
        grads[position] = gradient
    return grads


def _permitted_row_gradient(
    gradient: Any, variable: Any, mask: RowMask, owner_map: tf.Variable | None = None
) -> tf.IndexedSlices:
    """Deduplicated gradient of the permitted rows, as IndexedSlices
    (``owner_map``: the XLA path's scratch, see ``_xla.owner_segment_sum``)."""
    if in_xla_context():
        return _xla_permitted_row_gradient(gradient, variable, mask, owner_map)
    if isinstance(gradient, tf.IndexedSlices):
        rows, positions = tf.unique(gradient.indices)
        summed = tf.math.unsorted_segment_sum(gradient.values, positions, tf.shape(rows)[0])
    else:
        # A dense gradient speaks for every row: all permitted rows count
        # as present (O(V), as the dense gradient itself is).
        gradient = tf.convert_to_tensor(gradient)
        rows = tf.cast(tf.reshape(tf.where(mask.full()), [-1]), tf.int64)
        return tf.IndexedSlices(
            tf.gather(gradient, rows), rows, tf.shape(gradient, out_type=tf.int64)
        )
    # Frozen rows get a zero gradient instead of being dropped: cheaper
    # than compacting, invisible to clipping norms, and the in-place
    # kernel never writes them (nor their slots).
    permitted = tf.reshape(
        mask.gather(rows),
        tf.concat([tf.shape(rows), tf.ones([summed.shape.rank - 1], tf.int32)], 0),
    )
    return tf.IndexedSlices(
        tf.where(permitted, summed, tf.zeros([], summed.dtype)),
        rows,
        tf.shape(variable, out_type=rows.dtype)
        if gradient.dense_shape is None
        else tf.cast(gradient.dense_shape, rows.dtype),
    )


def _xla_permitted_row_gradient(
    gradient: Any, variable: Any, mask: RowMask, owner_map: tf.Variable | None = None
) -> tf.IndexedSlices:
    """``_permitted_row_gradient`` with static shapes, for XLA: the distinct
    rows (and padding rows numbered V) and their summed gradient, zero on
    frozen rows; a dense gradient keeps all V rows. ``owner_map``: see
    ``_xla.owner_segment_sum`` (None: sort instead)."""
    dense_shape = tf.shape(resolve_variable(variable), out_type=tf.int64)
    num_rows = dense_shape[0]
    if isinstance(gradient, tf.IndexedSlices):
        indices = tf.cast(gradient.indices, tf.int64)
        if owner_map is not None:
            rows, summed = _xla.owner_segment_sum(indices, gradient.values, num_rows, owner_map)
        else:
            rows, summed = _xla.sorted_segment_sum(indices, gradient.values, num_rows)
    else:
        summed = tf.convert_to_tensor(gradient)
        rows = tf.range(num_rows)
    # The padding rows (numbered V) stay as they are: RowStep writes none.
    _, _, permitted = _xla.valid_rows(rows, num_rows, mask.gather)
    return tf.IndexedSlices(_xla.where_rows(permitted, summed), rows, dense_shape)


def _reserve_slot_rows(slots: CompactSlots, mask: RowMask) -> None:
    """Room in ``slots`` for every row ``mask`` permits now (see
    ``CompactSlots.reserve``); none for a mask with no value yet."""
    values = mask.values()
    if values is not None:
        slots.reserve(values)


def _clip_gradients(rule: Any, grads: list[Any]) -> list[Any]:
    """The inner optimizer's clipping; global_clipnorm also for slices."""
    if rule.global_clipnorm and rule.global_clipnorm > 0:
        squared = [ops.sum(ops.square(_gradient_values(g))) for g in grads if g is not None]
        norm = ops.sqrt(ops.sum(ops.stack(squared)))
        clip_norm = rule.global_clipnorm
        scale = clip_norm * ops.minimum(1.0 / norm, 1.0 / clip_norm)
        scale = scale + (norm - norm)  # NaN for a non-finite norm, as Keras
        return [None if g is None else _scale_gradient(g, scale) for g in grads]
    return keras_internals.clip_gradients(rule, grads)


def _apply_masked_constraint(variable: Any, mask: RowMask) -> None:
    """The variable's constraint, on permitted rows only (a pass over V).

    A constraint is a function of the whole table, so this costs what it
    costs in Keras; frozen rows keep their exact values.
    """
    table = tf.convert_to_tensor(resolve_variable(variable))
    permitted = tf.reshape(mask.full(), [-1] + [1] * (len(variable.shape) - 1))
    variable.assign(tf.where(permitted, variable.constraint(table), table))


@keras.saving.register_keras_serializable(package="partial_embedding")
class MaskedOptimizer(keras_internals.SaveableChildren, keras.optimizers.Optimizer):
    """Wraps a stock Keras optimizer so masked tables train only permitted rows.

    For every masked variable (the ``embeddings`` of each
    ``partial_embedding.PartialEmbedding``, found automatically, plus those in
    ``row_masks``), a step updates only the rows that are both permitted by the
    mask and present in the gradient (duplicate ids summed first), with the
    wrapped optimizer's own rule and hyperparameters: learning rate (and
    schedule), ``iterations`` and bias correction, weight decay (applied only
    to the updated rows), ``clipnorm`` / ``clipvalue`` / ``global_clipnorm``,
    ``loss_scale_factor``. The variable and its slots are written in place by
    :func:`partial_embedding.masked_scatter_sub`; all other rows of the
    variable and of its slots stay bit-identical. All other variables are
    updated by the wrapped optimizer exactly as without the wrapper.

    The update is *lazy* (like TF's ``SparseApply*`` ops and PyTorch's
    ``SparseAdam``): a row absent from a batch keeps its moments. When every
    permitted row is present in every batch, the result equals the stock
    optimizer applied to a table holding only the permitted rows.

    Supported inner optimizers: ``SGD`` (momentum, nesterov), ``Adam``
    (amsgrad), ``AdamW``, ``Adagrad``, ``RMSprop`` (momentum, centered), or a
    ``LossScaleOptimizer`` around one of them. Keras wraps the optimizer in a
    ``LossScaleOptimizer`` itself under a ``mixed_float16`` policy; with a
    ``LossScaleOptimizer`` *inside* compile with ``auto_scale_loss=False`` so
    the loss is not scaled twice. (Keras' ``LossScaleOptimizer`` *around* the
    wrapper checks gradients with a dense ``isfinite``, one table-sized
    temporary per step; inside, the check looks at the gradient's rows only.)

    A row mask that is a variable (as PartialEmbedding's ``trainable_mask``)
    may be changed at any time; the next step uses it, without retracing.
    Per-step cost and temporaries are proportional to the rows in the batch.

    Under XLA (``model.compile(jit_compile=True)``, ``tf.function(
    jit_compile=True)``) every rule runs on stock ops with static shapes:
    duplicate rows summed by a sort, each variable and slot written by one
    ``ResourceScatterSub`` in which rows that may not change receive
    ``x - 0`` (their bits kept). Results equal the kernel path's up to
    rounding. Compact slots cannot grow inside an XLA step: room is reserved
    eagerly when the step is traced and when ``PartialEmbedding``'s
    ``freeze`` / ``unfreeze`` / ``set_trainable_ids`` or :meth:`set_row_mask`
    change a mask; a row that still finds none (a mask variable assigned
    directly) skips its update until room is made.

    *Compact slots* (``compact_slots``): by default, a masked variable of
    which at most half the rows are permitted when the optimizer is built
    gets slots that hold only its permitted rows (Adam at 1 % permitted: 2 %
    of the table instead of 200 %), plus a float32 ``[V]`` map from a row to
    its slot row (``V`` values). A permitted row takes a slot row the first
    time a step updates it, holding the slot's initial value, so results are
    bit for bit those of full-size slots. A frozen row keeps its slot row,
    untouched, and resumes from it when unfrozen (as with full-size slots).
    When more rows have trained than the slots hold (``freeze`` /
    ``unfreeze`` / ``set_trainable_ids`` made more rows permitted), the slots
    grow inside the step, by half or to what is needed, keeping their
    values: no retracing, no error; slot rows are never given back. Compact
    slots are not in ``variables`` (see :attr:`compact_slot_variables`); they
    are saved and restored by ``tf.train.Checkpoint``, SavedModel and
    ``.keras`` files. ``compact_slots=False`` gives Keras' own full-size
    slots; ``True`` makes them compact at any permitted share. Rules without
    slots (``SGD`` without momentum) need neither.

    The wrapper's ``clipnorm``, ``clipvalue`` and ``global_clipnorm`` are the
    inner optimizer's (reading or setting them here reads or sets them there),
    and :meth:`exclude_from_weight_decay` excludes variables, masked ones
    included, as when called on the inner optimizer before wrapping.

    A masked variable's constraint is applied to its permitted rows only,
    after each step; like any constraint it reads the whole table. Not
    supported: ``use_ema`` and ``gradient_accumulation_steps`` on the inner
    optimizer (rejected at construction).

    Under ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` the masked
    variables' gradients are summed over replicas first, then every copy of
    the variable and of its slots receives the same row update (through
    ``strategy.extended.update``, as Keras' own optimizers do).

    Under ``ParameterServerStrategy`` a masked table that the
    ``variable_partitioner`` split (a ``ShardedVariable``; its mask split
    alike or not) gets each shard's slots on the shard's parameter server,
    made at ``build``, and each shard's rows (local ids) updated there. Take
    the gradient with respect to :meth:`gradient_sources`; ``apply`` takes a
    sharded table's per-shard gradients as its gradient. Compact slots of a
    sharded table have a fixed number of rows per shard (``slot_capacity``,
    by default half as many again as the shard's permitted rows at build,
    plus one): a step that needs more fails. A sharded table may not have a
    constraint.

    Args:
      inner: The optimizer to wrap: an instance (or a name / config accepted
        by ``keras.optimizers.get``) of a supported optimizer.
      row_masks: Optional extra masked variables: a mapping, or an iterable
        of ``(variable, mask)`` pairs. A key is a Keras variable or
        ``tf.Variable`` (Keras and TF variables are not hashable, so use the
        pair form, ``variable.ref()`` or the variable's ``path``/``name``
        string as a mapping key). A mask is a bool variable, tensor or NumPy
        array of shape ``[V]`` for a variable of ``V`` rows (a tensor or
        array is fixed; it serves every trace of a training step). Not saved
        with the optimizer's config (masks are model state): pass them again,
        or call :meth:`set_row_mask`, after loading.
      name: The optimizer's name.
      compact_slots: ``"auto"`` (the default: compact where at most half the
        rows are permitted at build), ``True`` or ``False``.
      slot_capacity: Slot rows each compact variable allocates at build
        (default: its permitted rows then; at least 1). They grow as needed;
        on a sharded table: each shard's slot rows, for good.
      compact_variable_indices: Which of the variables the optimizer is built
        with get compact slots, by position: set by ``from_config`` so that a
        loaded model rebuilds the slots it saved (its masks are loaded only
        later). Leave it None.

    Raises:
      PartialEmbeddingTypeError: ``inner`` is not a supported optimizer.
      PartialEmbeddingArgumentError: ``inner`` uses ``use_ema`` or
        ``gradient_accumulation_steps``; ``compact_slots`` is not ``"auto"``,
        ``True`` or ``False``; ``slot_capacity`` is not None or an int in
        ``[1, 2**24]``.
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
        inner: Any,
        row_masks: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None = None,
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
        _check_compact_arguments(compact_slots, slot_capacity)
        if isinstance(inner, (str, dict)):
            inner = keras.optimizers.get(inner)
        keras_internals.check_keras_internals(inner)
        keras_internals.check_framework()
        rule = inner
        if isinstance(inner, keras.optimizers.LossScaleOptimizer):
            rule = inner.inner_optimizer
        row_rule = row_rules.row_rule_for(rule)
        if rule.use_ema:
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer does not support use_ema=True on the inner "
                "optimizer (the moving average would rewrite every row each step)"
            )
        if rule.gradient_accumulation_steps:
            raise PartialEmbeddingArgumentError(
                "MaskedOptimizer does not support gradient_accumulation_steps on "
                "the inner optimizer"
            )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner
        self._rule = rule
        self._row_rule = row_rule
        self._loss_scale_optimizer = (
            inner if isinstance(inner, keras.optimizers.LossScaleOptimizer) else None
        )
        self._requested_masks: list[tuple[Any, Any]] = list(self._normalize_row_masks(row_masks))
        # var_key(variable) -> RowMask, filled at build.
        self._row_masks: dict[int, RowMask] = {}
        self.compact_slots = compact_slots
        self.slot_capacity = slot_capacity
        # Positions (in the list the optimizer is built with) of the variables
        # with compact slots, as saved in a config: a model being loaded
        # builds the slots it saved, whatever its masks hold before their
        # values are loaded. None: decide at build.
        self._saved_compact_indices = (
            None
            if compact_variable_indices is None
            else sorted(int(i) for i in compact_variable_indices)
        )
        # var_key(variable) -> its compact slots, filled at build.
        self._compact: dict[Any, CompactSlots] = {}
        # Their variables, in build order, and a tracked container for them
        # (assigned here, so TensorFlow tracks it for checkpoints and
        # SavedModel; Keras' list tracking is invisible to TensorFlow).
        self._compact_slot_variables: list[Any] = []
        self._compact_slot_state = SlotVariableState("compact_slots")
        # var_key -> the XLA path's dedup scratch (made when a step is first
        # traced for XLA), in a plain holder: neither Keras nor TensorFlow
        # tracks it, so it is not among `variables` and not saved.
        self._owner_maps = _Untracked()
        # ShardedVariable tables: var_key -> each shard's slots (see _sharded),
        # their variables, and a tracked container for them.
        self._sharded_slots: dict[Any, sharded.ShardedSlots] = {}
        self._shard_slot_variables: list[Any] = []
        self._shard_slot_state = SlotVariableState("shard_slots")

    # -- delegation, as LossScaleOptimizer does ------------------------------

    @property
    def variables(self) -> list[Any]:
        return super().variables + self.inner_optimizer.variables

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    @property
    def loss_scale_factor(self) -> Any:
        rule = getattr(self, "_rule", None)
        return None if rule is None else rule.loss_scale_factor

    @loss_scale_factor.setter
    def loss_scale_factor(self, value: Any) -> None:
        # A LossScaleOptimizer around us sets None here so that gradients are
        # not unscaled twice: pass that on to the optimizer that unscales. The
        # base constructor's own assignment (always None) comes before
        # `_rule` exists and has nothing to configure.
        rule = getattr(self, "_rule", None)
        if rule is not None:
            rule.loss_scale_factor = value

    # The clipping options live on the optimizer whose rule runs (the inner
    # one, or the one inside an inner LossScaleOptimizer), where the pipeline
    # reads them: reading or setting them here reads or sets them there. The
    # base constructor's own assignments (always None) come before `_rule`
    # exists and have nothing to configure.

    @property
    def clipnorm(self) -> Any:
        return self._rule_option("clipnorm")

    @clipnorm.setter
    def clipnorm(self, value: Any) -> None:
        self._set_rule_option("clipnorm", value)

    @property
    def clipvalue(self) -> Any:
        return self._rule_option("clipvalue")

    @clipvalue.setter
    def clipvalue(self, value: Any) -> None:
        self._set_rule_option("clipvalue", value)

    @property
    def global_clipnorm(self) -> Any:
        return self._rule_option("global_clipnorm")

    @global_clipnorm.setter
    def global_clipnorm(self, value: Any) -> None:
        self._set_rule_option("global_clipnorm", value)

    def _rule_option(self, name: str) -> Any:
        rule = getattr(self, "_rule", None)
        return None if rule is None else getattr(rule, name)

    def _set_rule_option(self, name: str, value: Any) -> None:
        rule = getattr(self, "_rule", None)
        if rule is not None:
            setattr(rule, name, value)

    def exclude_from_weight_decay(
        self, var_list: list[Any] | None = None, var_names: list[str] | None = None
    ) -> None:
        """Excludes variables from the inner optimizer's weight decay.

        The same as calling it on the inner optimizer before wrapping: the
        excluded variables, masked ones included, do not decay. Call it
        before the optimizer is built.

        Args:
          var_list: Variables to exclude.
          var_names: Strings; a variable whose name contains one is excluded.

        Raises:
          ValueError: the optimizer is already built.
        """
        if self.built:
            raise ValueError(
                "exclude_from_weight_decay() can only be configured before the optimizer is built"
            )
        self._rule.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    def scale_loss(self, loss: Any) -> Any:
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list: Any) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    # -- masks -----------------------------------------------------------------

    def _key(self, variable: Any) -> Any:
        """The key of ``variable`` (the same for every copy of a mirrored one)."""
        return keras_internals.var_key(self, variable)

    @staticmethod
    def _normalize_row_masks(row_masks: Any) -> Iterable[tuple[Any, Any]]:
        if row_masks is None:
            return []
        if isinstance(row_masks, Mapping):
            return list(row_masks.items())
        pairs = []
        for pair in row_masks:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise PartialEmbeddingArgumentError(
                    "row_masks: expected a mapping or (variable, mask) pairs, got "
                    f"an item of type {type(pair).__name__}"
                )
            pairs.append(tuple(pair))
        return pairs

    def _matches(self, key: Any, variable: Any) -> bool:
        if isinstance(key, str):
            return key in (getattr(variable, "path", None), variable.name)
        if hasattr(key, "deref") and not is_variable_like(key):
            key = key.deref()
        if is_variable_like(key):
            return self._key(key) == self._key(variable)
        raise PartialEmbeddingTypeError(
            "row_masks: a key must be a Keras variable, a tf.Variable, "
            f"variable.ref() or a variable path/name, got {type(key).__name__}"
        )

    def set_row_mask(self, variable: Any, row_mask: Any) -> None:
        """Makes ``variable`` masked by ``row_mask`` (bool ``[V]``).

        Call it before the first training step (or before ``fit`` builds its
        train function): a traced step keeps the variables it was traced
        with. To change which rows are permitted later, assign to the mask
        variable instead.
        """
        self._requested_masks.append((variable, row_mask))
        if self.built:
            self._resolve_masks(keras_internals.trainable_variables(self))
            for key, slots in self._compact.items():
                self._watch_mask_of(key, slots)

    def _resolve_masks(self, var_list: list[Any]) -> None:
        for variable in var_list:
            attached = getattr(variable, ROW_MASK_ATTRIBUTE, None)
            if attached is not None:
                self._row_masks[self._key(variable)] = sharded.row_mask_for(attached, variable)
        for key, mask in self._requested_masks:
            found = [v for v in var_list if self._matches(key, v)]
            if not found:
                warnings.warn(
                    "MaskedOptimizer: a variable in row_masks is not among the "
                    "variables this optimizer trains; its mask is ignored",
                    stacklevel=3,
                )
            for variable in found:
                self._row_masks[self._key(variable)] = sharded.row_mask_for(mask, variable)
        for variable in var_list:
            if self._key(variable) in self._row_masks:
                if len(variable.shape) < 1:
                    raise PartialEmbeddingArgumentError(
                        f"MaskedOptimizer: masked variable {variable.name} must have rank >= 1"
                    )

    def _row_mask_of(self, variable: Any) -> RowMask | None:
        key = self._key(variable)
        if key not in self._row_masks:
            attached = getattr(variable, ROW_MASK_ATTRIBUTE, None)
            if attached is not None:
                self._row_masks[key] = sharded.row_mask_for(attached, variable)
        return self._row_masks.get(key)

    def is_masked(self, variable: Any) -> bool:
        """Whether ``variable`` is trained row by row under a mask."""
        return self._row_mask_of(variable) is not None

    # -- build and apply -------------------------------------------------------

    @keras_internals.no_automatic_dependency_tracking
    def build(self, var_list: list[Any]) -> None:
        var_list = list(var_list)
        cluster.check_in_process_servers(tf.distribute.get_strategy())
        self._resolve_masks(var_list)
        compact = [v for i, v in enumerate(var_list) if self._wants_compact_slots(v, i)]
        # A masked ShardedVariable table gets slots per shard, made here.
        shard_tables = [
            v for v in var_list if self._key(v) in self._row_masks and sharded.is_sharded(v)
        ]
        own_keys = {self._key(v) for v in compact + shard_tables}
        # The wrapped optimizer makes full-size slots for the others only.
        self.inner_optimizer.build([v for v in var_list if self._key(v) not in own_keys])
        keras_internals.check_built(self.inner_optimizer)
        super().build(var_list)
        self._build_shard_slots(shard_tables, {self._key(v) for v in compact})
        compact = [v for v in compact if not sharded.is_sharded(v)]
        for variable in compact:
            fixed_rows = self._fixed_slot_rows(variable)
            slots = CompactSlots(
                variable,
                self._row_rule.slots(self._rule),
                self._initial_slot_rows(variable) if fixed_rows is None else fixed_rows,
                name=f"{self.name}/{_variable_path(variable)}",
                fixed_capacity=fixed_rows is not None,
            )
            self._compact[self._key(variable)] = slots
            self._watch_mask_of(self._key(variable), slots)
            # Not among `variables` (Keras counts and names those, and the
            # slots' row count is not static); saved with them all the same.
            for slot_variable in slots.variables:
                self._compact_slot_state.track(slot_variable)
                self._compact_slot_variables.append(slot_variable)

    def _build_shard_slots(self, tables: list[Any], compact_keys: set[Any]) -> None:
        """Each shard's slots of the masked ShardedVariable ``tables``."""
        for table in tables:
            sharded.check_constraint(table)
            key = self._key(table)
            slots = sharded.ShardedSlots(
                table,
                self._row_rule.slots(self._rule),
                compact=key in compact_keys,
                capacity=self.slot_capacity,
                row_mask=self._row_masks[key],  # type: ignore[arg-type]
                name=f"{self.name}/{_variable_path(table)}",
            )
            self._sharded_slots[key] = slots
            for slot_variable in slots.variables:
                self._shard_slot_state.track(slot_variable)
                self._shard_slot_variables.append(slot_variable)

    def _wants_compact_slots(self, variable: Any, position: int) -> bool:
        """Whether ``variable`` (at ``position`` in the built list) gets
        compact slots (see ``compact_slots``)."""
        mask = self._row_masks.get(self._key(variable))
        if mask is None or not self._row_rule.slots(self._rule):
            return False
        if self._saved_compact_indices is not None:
            return position in self._saved_compact_indices
        if self.compact_slots == "auto":
            permitted = mask.count_permitted()
            return permitted is not None and 2 * permitted <= int(variable.shape[0])
        return bool(self.compact_slots)

    def _initial_slot_rows(self, variable: Any) -> int:
        if self.slot_capacity is not None:
            return int(self.slot_capacity)
        if self._saved_compact_indices is not None:
            return 1  # A model being loaded: its saved slots replace these.
        permitted = self._row_masks[self._key(variable)].count_permitted()
        return min(max(permitted or 1, 1), MAX_SLOT_ROWS)

    def _fixed_slot_rows(self, variable: Any) -> int | None:
        """The fixed slot rows of ``variable``'s compact slots where they
        cannot grow (on a parameter server, see ``_cluster``); else None."""
        if not cluster.needs_fixed_capacity(variable):
            return None
        permitted = self._row_masks[self._key(variable)].count_permitted() or 0
        return cluster.fixed_slot_rows(permitted, self.slot_capacity, MAX_SLOT_ROWS)

    def compact_slot_rows(self, variable: Any) -> int | None:
        """How many slot rows ``variable``'s compact slots use now.

        One per permitted row that a step has updated (frozen or not since);
        None when ``variable`` has no compact slots (not masked, full-size
        slots, or the optimizer is not built yet).
        """
        shard_slots = self._sharded_slots.get(self._key(variable))
        if shard_slots is not None:
            return shard_slots.slot_rows_used() if shard_slots.is_compact else None
        slots = self._compact.get(self._key(variable))
        return None if slots is None else int(slots.rows_used.numpy())

    def has_compact_slots(self, variable: Any) -> bool:
        """Whether ``variable``'s optimizer slots hold only its trained rows."""
        shard_slots = self._sharded_slots.get(self._key(variable))
        if shard_slots is not None:
            return shard_slots.is_compact
        return self._key(variable) in self._compact

    @staticmethod
    def gradient_sources(variables: Iterable[Any]) -> list[Any]:
        """What to take a tape's gradient with respect to, for :meth:`apply`.

        A Keras variable holding a ``ShardedVariable`` (a table split by
        ``ParameterServerStrategy``'s ``variable_partitioner``) becomes the
        list of its shards, in row order; any other variable stays itself.
        ``tf.GradientTape`` cannot differentiate with respect to such a Keras
        variable, and gives one gradient per shard (local row ids) with
        respect to the shards; ``apply`` takes that list in the table's place:
        ``grads = tape.gradient(loss, MaskedOptimizer.gradient_sources(vs))``
        then ``optimizer.apply(grads, vs)``.

        >>> import keras, partial_embedding as pe
        >>> weights = [keras.Variable([[1.0]]), keras.Variable([2.0])]
        >>> pe.MaskedOptimizer.gradient_sources(weights) == weights
        True
        """
        return sharded.gradient_sources(list(variables))

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                raise PartialEmbeddingArgumentError(
                    "MaskedOptimizer.apply: pass trainable_variables on the first "
                    "call (the optimizer is not built)"
                )
            trainable_variables = keras_internals.trainable_variables(self)
        else:
            trainable_variables = list(trainable_variables)
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(trainable_variables)
                self.built = True
            keras_internals.check_variables_are_known(self, trainable_variables)
        if any(isinstance(g, (list, tuple)) for g in grads):
            # A sharded table's gradient: one gradient per shard.
            grads = [
                sharded.global_gradient(g, v) if isinstance(g, (list, tuple)) else g
                for g, v in zip(grads, trainable_variables, strict=True)
            ]
        if not grads:
            return
        if self._loss_scale_optimizer is None:
            self._apply_with_rule(grads, trainable_variables)
        else:
            self._apply_with_loss_scale(grads, trainable_variables)

    def _apply_with_loss_scale(self, grads: list[Any], variables: list[Any]) -> None:
        """LossScaleOptimizer's dynamic scaling, with a row-sized finite check."""
        lso: Any = self._loss_scale_optimizer
        present = [_gradient_values(g) for g in grads if g is not None]
        finite = ops.all(ops.convert_to_tensor([ops.all(ops.isfinite(v)) for v in present]))

        def finite_step() -> None:
            scale = lso.dynamic_scale
            unscaled = [
                g
                if g is None or keras_internals.overwrites_with_gradient(self, v)
                else _divide_gradient(g, scale)
                for g, v in zip(grads, variables)
            ]
            self._apply_with_rule(unscaled, variables)

            def upscale() -> None:
                lso.step_counter.assign(0)
                lso.dynamic_scale.assign(ops.multiply(lso.dynamic_scale, 2.0))

            def increment() -> None:
                lso.step_counter.assign_add(1)

            ops.cond(
                ops.equal(lso.step_counter, lso.dynamic_growth_steps - 1),
                upscale,
                increment,
            )

        def skip_step() -> None:
            lso.step_counter.assign(0)
            lso.dynamic_scale.assign(ops.multiply(lso.dynamic_scale, 0.5))

        ops.cond(finite, finite_step, skip_step)

    def _apply_with_rule(self, grads: list[Any], variables: list[Any]) -> None:
        """The stock apply() pipeline, with masked variables updated by row."""
        rule = self._rule
        with keras.name_scope(rule.name, caller=rule):
            grads, variables = keras_internals.filter_empty_gradients(rule, grads, variables)
            grads, variables = keras_internals.overwrite_variables_directly_with_gradients(
                rule, grads, variables
            )
            if grads:
                if rule.loss_scale_factor is not None:
                    grads = [_divide_gradient(g, rule.loss_scale_factor) for g in grads]
                masks = [self._row_mask_of(v) for v in variables]
                grads = _all_reduce_masked_gradients(grads, masks)
                grads, masked = self._choose_row_updates(grads, variables, masks)
                grads = _clip_gradients(rule, grads)
                dense_pairs = [
                    (g, v) for g, v, mask in zip(grads, variables, masks) if mask is None
                ]
                if dense_pairs:
                    dense_grads, dense_vars = (list(x) for x in zip(*dense_pairs))
                    keras_internals.apply_weight_decay(rule, dense_vars)
                    keras_internals.backend_update_step(
                        rule, dense_grads, dense_vars, rule.learning_rate
                    )
                    for variable in dense_vars:
                        if variable.constraint is not None:
                            variable.assign(variable.constraint(variable))
                if masked:
                    self._update_masked_variables(
                        rule,
                        [(grads[p], variables[p], mask, update) for p, mask, update in masked],
                    )
        rule.iterations.assign_add(1)

    def _choose_row_updates(
        self, grads: list[Any], variables: list[Any], masks: list[RowMask | None]
    ) -> tuple[list[Any], list[tuple[int, RowMask, row_rules.RowUpdate]]]:
        """Chooses each masked variable's update, once, and gives it the
        gradient it takes: the raw sparse gradient where a fused kernel takes
        it, else the deduplicated gradient of the permitted rows.

        Returns the gradients and, per masked variable, its position, mask and
        update.
        """
        rule = self._rule
        masked = [
            (
                position,
                mask,
                self._row_rule.update_for(grads[position], variable),
            )
            for position, (variable, mask) in enumerate(zip(variables, masks))
            if mask is not None
        ]
        # Clipping measures (clipnorm, global_clipnorm) or bounds (clipvalue)
        # the deduplicated, permitted-only gradient: a fused kernel takes the
        # raw gradient only without clipping.
        clips = any(value for value in (rule.clipnorm, rule.clipvalue, rule.global_clipnorm))
        grads = list(grads)
        for position, mask, update in masked:
            gradient = grads[position]
            raw = isinstance(gradient, tf.IndexedSlices) and not clips
            if not (raw and update.takes_raw_gradient):
                grads[position] = _permitted_row_gradient(
                    gradient, variables[position], mask, self._xla_owner_map(variables[position])
                )
        return grads, masked

    def _update_masked_variables(
        self, rule: Any, masked: list[tuple[Any, Any, RowMask, row_rules.RowUpdate]]
    ) -> None:
        """The row updates; under a tf.distribute strategy, on every copy.

        In a replica context (``strategy.run``, ``model.fit``) the gradients
        are already summed over replicas, and the update goes through the
        strategy as Keras' own does (``merge_call`` when the strategy uses it,
        then ``extended.update``): it runs once per component of each
        mirrored variable, where ``masked_scatter_sub`` and the slots resolve
        to that component.
        """

        if in_xla_context():
            self._reserve_slot_rows_for_xla([(v, mask) for _, v, mask, _ in masked])

        def update(
            gradient: Any, variable: Any, mask: RowMask, row_update: row_rules.RowUpdate
        ) -> None:
            step = row_rules.RowStep(
                rule,
                gradient,
                variable,
                mask.full(),
                rule.learning_rate,
                compact=self._compact.get(self._key(variable)),
            )
            # No row to update (eagerly, e.g. a batch of frozen ids only):
            # Keras' ops.add mistakes two [0, D] operands for a bias and
            # fails, and there is nothing to do.
            if not step.empty:
                row_update.apply(step)
            if variable.constraint is not None:
                _apply_masked_constraint(variable, mask)

        # A ShardedVariable table: each shard updated on its own device, in
        # this context (ParameterServerStrategy has one replica per worker).
        for gradient, variable, mask, _ in masked:
            shard_slots = self._sharded_slots.get(self._key(variable))
            if shard_slots is not None:
                shard_slots.apply(
                    rule,
                    self._row_rule,
                    gradient,
                    mask,  # type: ignore[arg-type]
                    rule.learning_rate,
                    variable,
                )
        masked = [m for m in masked if self._key(m[1]) not in self._sharded_slots]
        if not masked:
            return
        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            for gradient, variable, mask, row_update in masked:
                update(gradient, variable, mask, row_update)
            return

        def distributed_update(distribution: Any, gradients: list[Any]) -> None:
            for gradient, (_, variable, mask, row_update) in zip(gradients, masked):
                distribution.extended.update(
                    resolve_variable(variable),
                    lambda _, g, v=variable, m=mask, u=row_update: update(g, v, m, u),
                    args=(gradient,),
                    group=False,
                )

        keras_internals.maybe_merge_call(
            distributed_update, tf.distribute.get_strategy(), [g for g, _, _, _ in masked]
        )

    def _xla_owner_map(self, variable: Any) -> tf.Variable | None:
        """Under XLA, ``variable``'s int32 ``[V + 1]`` scratch for deduplicating
        without a sort (made once, eagerly, next to it; not saved: its values
        never outlive a step); None elsewhere, or for a table of unknown
        size or one distributed over devices."""
        if not in_xla_context() or sharded.is_sharded(variable):
            return None
        key = self._key(variable)
        if key not in self._owner_maps.maps:
            try:
                target = resolve_variable(variable)
            except PartialEmbeddingTypeError:
                return None
            num_rows = target.shape[0] if target.shape.rank else None
            if num_rows is None or tf.distribute.has_strategy():
                return None
            with tf.init_scope(), tf.device(target.device):
                self._owner_maps.maps[key] = tf.Variable(
                    tf.zeros([num_rows + 1], tf.int32),
                    trainable=False,
                    name="xla_owner_map",
                )
        return self._owner_maps.maps[key]

    def _reserve_slot_rows_for_xla(self, masked: list[tuple[Any, RowMask]]) -> None:
        """While a step is traced for XLA (which cannot grow compact slots
        inside it): room, now, for every permitted row without a slot row."""
        for variable, mask in masked:
            slots = self._compact.get(self._key(variable))
            if slots is not None:
                slots.used_under_xla = True
                _reserve_slot_rows(slots, mask)

    def _watch_mask_of(self, key: Any, slots: CompactSlots) -> None:
        """Lets changes of the mask of the variable ``key`` reserve room in its
        compact ``slots`` (see ``mask_changed``), and reserves it now if a
        step was traced for XLA."""
        mask = self._row_masks[key]
        if mask.variable is not None:
            watch_mask(mask.variable, slots)
        if slots.used_under_xla:
            _reserve_slot_rows(slots, mask)

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
        return list(self._compact_slot_variables)

    def save_own_variables(self, store: Any) -> None:
        """Saves ``variables`` as Keras does, then the compact slots
        (keys ``compact_0``, ``compact_1``, ...)."""
        super().save_own_variables(store)
        for i, variable in enumerate(self._compact_slot_variables):
            store[f"{_COMPACT_KEY}{i}"] = variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved."""
        keys = list(store.keys())
        compact_keys = [k for k in keys if k.startswith(_COMPACT_KEY)]
        super().load_own_variables(_StoreWithout(store, set(compact_keys)))
        if len(compact_keys) != len(self._compact_slot_variables):
            warnings.warn(
                f"Skipping the compact slots of optimizer '{self.name}': it has "
                f"{len(self._compact_slot_variables)} compact slot variables whereas "
                f"the saved optimizer has {len(compact_keys)}.",
                stacklevel=2,
            )
            return
        for i, variable in enumerate(self._compact_slot_variables):
            variable.assign(store[f"{_COMPACT_KEY}{i}"])

    def get_config(self) -> dict[str, Any]:
        if self.built:
            compact_indices: list[int] | None = [
                i
                for i, v in enumerate(keras_internals.trainable_variables(self))
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
        # A config without the key comes from version 0.1, whose optimizer
        # state holds full-size slots: load it as such.
        config.setdefault("compact_slots", False)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner"), custom_objects=custom_objects
        )
        return cls(inner, **config)


_COMPACT_KEY = "compact_"


class _Untracked:
    """Holds variables out of sight of Keras' and TensorFlow's tracking."""

    def __init__(self) -> None:
        self.maps: dict[Any, tf.Variable] = {}


class _StoreWithout:
    """A Keras variable store seen without some of its keys."""

    def __init__(self, store: Any, hidden: set[str]) -> None:
        self._store = store
        self._hidden = hidden

    def keys(self) -> list[str]:
        return [k for k in self._store.keys() if k not in self._hidden]

    def __getitem__(self, key: str) -> Any:
        return self._store[key]


def _variable_path(variable: Any) -> str:
    return str(getattr(variable, "path", None) or variable.name)


def _check_compact_arguments(compact_slots: Any, slot_capacity: Any) -> None:
    if not any(
        compact_slots is choice or (isinstance(compact_slots, str) and compact_slots == choice)
        for choice in COMPACT_SLOTS_CHOICES
    ):
        raise PartialEmbeddingArgumentError(
            f'compact_slots: expected "auto", True or False, got {compact_slots!r}'
        )
    if slot_capacity is not None and (
        isinstance(slot_capacity, bool)
        or not isinstance(slot_capacity, numbers.Integral)
        or not 1 <= int(slot_capacity) <= MAX_SLOT_ROWS
    ):
        raise PartialEmbeddingArgumentError(
            f"slot_capacity: expected None or an int in [1, {MAX_SLOT_ROWS}], got {slot_capacity!r}"
        )


# Its public home: Keras' serialized configs name this module, and doctest
# finds the class' example there.
MaskedOptimizer.__module__ = "partial_embedding.optimizers"
