"""MaskedOptimizer: stock Keras optimizers that update only permitted rows.

Stock Keras 3 optimizers on TensorFlow turn an embedding's sparse gradient into
dense updates (Adam, momentum SGD, RMSprop rewrite every row and every slot
each step) and apply weight decay to every row. ``MaskedOptimizer`` wraps such
an optimizer (like ``keras.optimizers.LossScaleOptimizer`` does) and, for each
*masked* variable, applies the wrapped optimizer's own per-row rule to the rows
that are both permitted by the variable's row mask and present in the
gradient, writing the variable and its slots in place through
:func:`partial_embedding.masked_scatter_sub`. Every other row, and every slot
entry of every other row, is left untouched bit for bit. The cost of a step is
proportional to the rows in the batch, not to the vocabulary.

Semantics for a masked variable (lazy, like TensorFlow's ``SparseApply*`` ops
and PyTorch's ``SparseAdam``):

* The gradient's duplicate row ids are summed first, then rows whose mask is
  false are dropped. What remains is the step's set of *updated rows*.
* Clipping (``clipnorm``, ``clipvalue``, ``global_clipnorm``) sees that
  deduplicated, permitted-only gradient, i.e. exactly the dense gradient of a
  table holding only the permitted rows.
* Weight decay (``weight_decay=``, ``AdamW``) applies to the updated rows only.
* Slots of rows not updated do not decay (a row absent from a batch keeps its
  Adam moments); bias correction uses the optimizer's global ``iterations``,
  as the wrapped optimizer does.
* A dense gradient (e.g. from a regularizer on the table) counts every
  permitted row as present: the step then equals the stock optimizer applied
  to the permitted rows, and costs O(vocabulary) like any dense gradient.

Consequently, when every permitted row is in every batch, training equals the
stock optimizer applied to a table holding only the permitted rows (to
float rounding: the in-place kernel subtracts ``old - new`` where the stock
rule assigns ``new``).

Keras' own sparse path differs from this for Adam, Adagrad and RMSprop when an
id repeats within a batch: it does not sum duplicates before squaring or
mixing the gradient into the moments. ``MaskedOptimizer`` follows the dense
(mathematically exact) gradient instead.

Masked variables are found without help: every variable carrying a
``_partial_embedding_row_mask`` attribute (set by
``partial_embedding.PartialEmbedding`` on its ``embeddings``), plus the ones
named in ``row_masks``. All other variables go to the wrapped optimizer
unchanged.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import keras
import tensorflow as tf
from keras import ops
from keras.src.utils import tracking

from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)
from partial_embedding.ops import (
    gather_rows,
    masked_scatter_sub,
    masked_sparse_apply_adam,
    resolve_variable,
)

__all__ = ["MaskedOptimizer", "ROW_MASK_ATTRIBUTE", "SUPPORTED_OPTIMIZERS"]

#: Attribute a layer sets on a Keras variable to make it masked.
ROW_MASK_ATTRIBUTE = "_partial_embedding_row_mask"

#: The inner optimizers whose per-row rule MaskedOptimizer implements.
SUPPORTED_OPTIMIZERS = (
    keras.optimizers.SGD,
    keras.optimizers.Adam,
    keras.optimizers.AdamW,
    keras.optimizers.Adagrad,
    keras.optimizers.RMSprop,
)
_SUPPORTED_NAMES = (
    "keras.optimizers.SGD (momentum, nesterov), Adam (amsgrad), AdamW, "
    "Adagrad and RMSprop (momentum, centered), optionally inside a "
    "keras.optimizers.LossScaleOptimizer"
)


def _is_variable_like(value: Any) -> bool:
    return isinstance(value, (tf.Variable, keras.Variable))


def _gather_rows(variable: Any, rows: tf.Tensor) -> tf.Tensor:
    """Rows of a (Keras or TF) variable, never switching it to copy-on-read."""
    return gather_rows(variable, rows)


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


class _RowMask:
    """A variable's row mask: a bool variable (changeable at run time) or tensor."""

    def __init__(self, mask: Any, variable: Any) -> None:
        self.source = mask
        if _is_variable_like(mask):
            self._variable = resolve_variable(mask, argument="row mask")
            dtype, shape = self._variable.dtype, self._variable.shape
        else:
            self._variable = None
            dtype, shape = tf.as_dtype(getattr(mask, "dtype", tf.bool)), None
            self._constant = tf.convert_to_tensor(mask, dtype=tf.bool)
            shape = self._constant.shape
        name = getattr(variable, "path", None) or getattr(variable, "name", "?")
        if dtype != tf.bool:
            raise PartialEmbeddingTypeError(
                f"row mask of variable {name}: dtype {tf.as_dtype(dtype).name} must be bool"
            )
        num_rows = variable.shape[0] if len(variable.shape) else None
        if shape.rank != 1 or (
            num_rows is not None and shape[0] is not None and shape[0] != num_rows
        ):
            raise PartialEmbeddingArgumentError(
                f"row mask of variable {name}: shape {shape} must be "
                f"[{num_rows}] (one entry per row of the variable of shape "
                f"{tuple(variable.shape)})"
            )

    def gather(self, rows: tf.Tensor) -> tf.Tensor:
        if self._variable is not None:
            return gather_rows(self._variable, rows)
        return tf.gather(self._constant, rows)

    def full(self) -> tf.Tensor:
        """The whole mask; a variable read aliases its buffer (no copy)."""
        if self._variable is not None:
            return self._variable.value()
        return self._constant


@keras.saving.register_keras_serializable(package="partial_embedding")
class MaskedOptimizer(keras.optimizers.Optimizer):
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
    Per-step cost and temporaries are proportional to the rows in the batch;
    the slots themselves are table-sized variables, created once.

    A masked variable's constraint is applied to its permitted rows only,
    after each step; like any constraint it reads the whole table. Not
    supported: ``use_ema`` and ``gradient_accumulation_steps`` on the inner
    optimizer (rejected at construction).

    Under ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` the masked
    variables' gradients are summed over replicas first, then every copy of
    the variable and of its slots receives the same row update (through
    ``strategy.extended.update``, as Keras' own optimizers do). Masked
    ``ShardedVariable`` tables (``ParameterServerStrategy`` with a
    partitioner) are not supported here; use ``masked_scatter_sub`` on them.

    Args:
      inner: The optimizer to wrap: an instance (or a name / config accepted
        by ``keras.optimizers.get``) of a supported optimizer.
      row_masks: Optional extra masked variables: a mapping, or an iterable
        of ``(variable, mask)`` pairs. A key is a Keras variable or
        ``tf.Variable`` (Keras and TF variables are not hashable, so use the
        pair form, ``variable.ref()`` or the variable's ``path``/``name``
        string as a mapping key). A mask is a bool variable or tensor of
        shape ``[V]`` for a variable of ``V`` rows. Not saved with the
        optimizer's config (masks are model state): pass them again, or call
        :meth:`set_row_mask`, after loading.
      name: The optimizer's name.

    Raises:
      PartialEmbeddingTypeError: ``inner`` is not a supported optimizer.
      PartialEmbeddingArgumentError: ``inner`` uses ``use_ema`` or
        ``gradient_accumulation_steps``.

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
        if isinstance(inner, (str, dict)):
            inner = keras.optimizers.get(inner)
        rule = inner
        if isinstance(inner, keras.optimizers.LossScaleOptimizer):
            rule = inner.inner_optimizer
        if type(rule) not in SUPPORTED_OPTIMIZERS:
            raise PartialEmbeddingTypeError(
                f"MaskedOptimizer cannot wrap {type(rule).__name__}: it supports {_SUPPORTED_NAMES}"
            )
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
        self._loss_scale_optimizer = (
            inner if isinstance(inner, keras.optimizers.LossScaleOptimizer) else None
        )
        self._requested_masks: list[tuple[Any, Any]] = list(self._normalize_row_masks(row_masks))
        # _var_key(variable) -> _RowMask, filled at build.
        self._row_masks: dict[int, _RowMask] = {}

    # -- delegation, as LossScaleOptimizer does ------------------------------

    @property
    def variables(self) -> list[Any]:
        return self._variables + self.inner_optimizer.variables

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

    def scale_loss(self, loss: Any) -> Any:
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list: Any) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    # -- masks -----------------------------------------------------------------

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
        if hasattr(key, "deref") and not _is_variable_like(key):
            key = key.deref()
        if _is_variable_like(key):
            return self._var_key(key) == self._var_key(variable)
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
            self._resolve_masks(self._trainable_variables)

    def _resolve_masks(self, var_list: list[Any]) -> None:
        for variable in var_list:
            attached = getattr(variable, ROW_MASK_ATTRIBUTE, None)
            if attached is not None:
                self._row_masks[self._var_key(variable)] = _RowMask(attached, variable)
        for key, mask in self._requested_masks:
            found = [v for v in var_list if self._matches(key, v)]
            if not found:
                warnings.warn(
                    "MaskedOptimizer: a variable in row_masks is not among the "
                    "variables this optimizer trains; its mask is ignored",
                    stacklevel=3,
                )
            for variable in found:
                self._row_masks[self._var_key(variable)] = _RowMask(mask, variable)
        for variable in var_list:
            if self._var_key(variable) in self._row_masks:
                if len(variable.shape) < 1:
                    raise PartialEmbeddingArgumentError(
                        f"MaskedOptimizer: masked variable {variable.name} must have rank >= 1"
                    )

    def _row_mask_of(self, variable: Any) -> _RowMask | None:
        key = self._var_key(variable)
        if key not in self._row_masks:
            attached = getattr(variable, ROW_MASK_ATTRIBUTE, None)
            if attached is not None:
                self._row_masks[key] = _RowMask(attached, variable)
        return self._row_masks.get(key)

    def is_masked(self, variable: Any) -> bool:
        """Whether ``variable`` is trained row by row under a mask."""
        return self._row_mask_of(variable) is not None

    # -- build and apply -------------------------------------------------------

    @tracking.no_automatic_dependency_tracking
    def build(self, var_list: list[Any]) -> None:
        var_list = list(var_list)
        self.inner_optimizer.build(var_list)
        super().build(var_list)
        self._resolve_masks(var_list)

    def apply(self, grads: Any, trainable_variables: Any = None) -> None:
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                raise PartialEmbeddingArgumentError(
                    "MaskedOptimizer.apply: pass trainable_variables on the first "
                    "call (the optimizer is not built)"
                )
            trainable_variables = self._trainable_variables
        else:
            trainable_variables = list(trainable_variables)
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(trainable_variables)
                self.built = True
            self._check_variables_are_known(trainable_variables)
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
                if g is None or self._overwrite_variable_with_gradient(v)
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
            grads, variables = rule._filter_empty_gradients(grads, variables)
            grads, variables = rule._overwrite_variables_directly_with_gradients(grads, variables)
            if grads:
                if rule.loss_scale_factor is not None:
                    grads = [_divide_gradient(g, rule.loss_scale_factor) for g in grads]
                masks = [self._row_mask_of(v) for v in variables]
                grads = _all_reduce_masked_gradients(grads, masks)
                # The fused Adam kernel sums duplicates and skips frozen rows
                # itself: it takes the raw gradient unless clipping needs the
                # deduplicated one.
                grads = [
                    g
                    if mask is None or _takes_raw_gradient(rule, g, v)
                    else self._permitted_row_gradient(g, v, mask)
                    for g, v, mask in zip(grads, variables, masks)
                ]
                grads = self._clip_gradients_of(rule, grads)
                dense_pairs = [
                    (g, v) for g, v, mask in zip(grads, variables, masks) if mask is None
                ]
                if dense_pairs:
                    dense_grads, dense_vars = (list(x) for x in zip(*dense_pairs))
                    rule._apply_weight_decay(dense_vars)
                    rule._backend_update_step(dense_grads, dense_vars, rule.learning_rate)
                    for variable in dense_vars:
                        if variable.constraint is not None:
                            variable.assign(variable.constraint(variable))
                masked = [(g, v, mask) for g, v, mask in zip(grads, variables, masks) if mask]
                if masked:
                    self._update_masked_variables(rule, masked)
        rule._iterations.assign_add(1)

    def _update_masked_variables(self, rule: Any, masked: list[tuple[Any, Any, _RowMask]]) -> None:
        """The row updates; under a tf.distribute strategy, on every copy.

        In a replica context (``strategy.run``, ``model.fit``) the gradients
        are already summed over replicas, and the update goes through the
        strategy as Keras' own does (``merge_call`` when the strategy uses it,
        then ``extended.update``): it runs once per component of each
        mirrored variable, where ``masked_scatter_sub`` and the slots resolve
        to that component.
        """

        def update(gradient: Any, variable: Any, mask: _RowMask) -> None:
            # No row to update (eagerly, e.g. a batch of frozen ids only):
            # Keras' ops.add mistakes two [0, D] operands for a bias and
            # fails, and there is nothing to do.
            if gradient.indices.shape.num_elements() != 0:
                self._update_rows(rule, gradient, variable, mask, rule.learning_rate)
            if variable.constraint is not None:
                self._apply_masked_constraint(variable, mask)

        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            for gradient, variable, mask in masked:
                update(gradient, variable, mask)
            return

        def distributed_update(distribution: Any, gradients: list[Any]) -> None:
            for gradient, (_, variable, mask) in zip(gradients, masked):
                distribution.extended.update(
                    resolve_variable(variable),
                    lambda _, g, variable=variable, mask=mask: update(g, variable, mask),
                    args=(gradient,),
                    group=False,
                )

        tf.__internal__.distribute.interim.maybe_merge_call(
            distributed_update, tf.distribute.get_strategy(), [g for g, _, _ in masked]
        )

    @staticmethod
    def _permitted_row_gradient(gradient: Any, variable: Any, mask: _RowMask) -> tf.IndexedSlices:
        """Deduplicated gradient of the permitted rows, as IndexedSlices."""
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

    @staticmethod
    def _clip_gradients_of(rule: Any, grads: list[Any]) -> list[Any]:
        """The inner optimizer's clipping; global_clipnorm also for slices."""
        if rule.global_clipnorm and rule.global_clipnorm > 0:
            squared = [ops.sum(ops.square(_gradient_values(g))) for g in grads if g is not None]
            norm = ops.sqrt(ops.sum(ops.stack(squared)))
            clip_norm = rule.global_clipnorm
            scale = clip_norm * ops.minimum(1.0 / norm, 1.0 / clip_norm)
            scale = scale + (norm - norm)  # NaN for a non-finite norm, as Keras
            return [None if g is None else _scale_gradient(g, scale) for g in grads]
        return rule._clip_gradients(grads)

    def _update_rows(
        self,
        rule: Any,
        gradient: tf.IndexedSlices,
        variable: Any,
        mask: _RowMask,
        learning_rate: Any,
    ) -> None:
        """Weight decay and the rule's update, on the gradient's rows only."""
        if _fused_adam_applies(rule, gradient, variable):
            _adam_rows_fused(rule, gradient, variable, mask, learning_rate)
            return
        rows = gradient.indices
        row_mask = mask.full()
        dtype = variable.dtype

        def subtract(target: Any, amount: tf.Tensor) -> None:
            masked_scatter_sub(target, rows, tf.cast(amount, dtype), row_mask)

        if rule.weight_decay is not None and rule._use_weight_decay(variable):
            lr = tf.cast(learning_rate, dtype)
            decay = tf.cast(rule.weight_decay, dtype)
            subtract(variable, _gather_rows(variable, rows) * decay * lr)
        _ROW_RULES[type(rule)](rule, gradient.values, rows, variable, learning_rate, subtract)

    @staticmethod
    def _apply_masked_constraint(variable: Any, mask: _RowMask) -> None:
        """The variable's constraint, on permitted rows only (a pass over V).

        A constraint is a function of the whole table, so this costs what it
        costs in Keras; frozen rows keep their exact values.
        """
        table = tf.convert_to_tensor(resolve_variable(variable))
        permitted = tf.reshape(mask.full(), [-1] + [1] * (len(variable.shape) - 1))
        variable.assign(tf.where(permitted, variable.constraint(table), table))

    # -- serialization ----------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inner": keras.saving.serialize_keras_object(self.inner_optimizer),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> MaskedOptimizer:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner"), custom_objects=custom_objects
        )
        return cls(inner, **config)


# -- per-row rules ---------------------------------------------------------------
# Each mirrors the stock update_step, on gathered rows. Where the stock rule
# adds to (or subtracts from) a slot, the in-place subtraction reproduces it
# exactly; where it assigns a new value, ``old - (old - new)`` may differ from
# ``new`` in the last bit.


def _sgd_rows(
    rule: Any,
    gradient: tf.Tensor,
    rows: tf.Tensor,
    variable: Any,
    learning_rate: Any,
    subtract: Callable[[Any, tf.Tensor], None],
) -> None:
    lr = ops.cast(learning_rate, variable.dtype)
    gradient = ops.cast(gradient, variable.dtype)
    if rule.momentum == 0:
        subtract(variable, ops.multiply(gradient, lr))
        return
    momentum_slot = rule.momentums[rule._get_variable_index(variable)]
    momentum = ops.cast(rule.momentum, variable.dtype)
    old = _gather_rows(momentum_slot, rows)
    new = ops.subtract(ops.multiply(old, momentum), ops.multiply(gradient, lr))
    subtract(momentum_slot, ops.subtract(old, new))
    if rule.nesterov:
        step = ops.subtract(ops.multiply(new, momentum), ops.multiply(gradient, lr))
    else:
        step = new
    subtract(variable, ops.negative(step))


def _adam_rows(
    rule: Any,
    gradient: tf.Tensor,
    rows: tf.Tensor,
    variable: Any,
    learning_rate: Any,
    subtract: Callable[[Any, tf.Tensor], None],
) -> None:
    dtype = variable.dtype
    lr = ops.cast(learning_rate, dtype)
    gradient = ops.cast(gradient, dtype)
    index = rule._get_variable_index(variable)
    m_slot, v_slot = rule._momentums[index], rule._velocities[index]
    alpha = _adam_step_size(rule, dtype, lr)

    m_old = _gather_rows(m_slot, rows)
    v_old = _gather_rows(v_slot, rows)
    m_step = ops.multiply(ops.subtract(gradient, m_old), 1 - rule.beta_1)
    v_step = ops.multiply(ops.subtract(ops.square(gradient), v_old), 1 - rule.beta_2)
    subtract(m_slot, ops.negative(m_step))
    subtract(v_slot, ops.negative(v_step))
    m_new = ops.add(m_old, m_step)
    v_new = ops.add(v_old, v_step)
    if rule.amsgrad:
        v_hat_slot = rule._velocity_hats[index]
        v_hat_old = _gather_rows(v_hat_slot, rows)
        v_new = ops.maximum(v_hat_old, v_new)
        subtract(v_hat_slot, ops.subtract(v_hat_old, v_new))
    subtract(
        variable,
        ops.divide(ops.multiply(m_new, alpha), ops.add(ops.sqrt(v_new), rule.epsilon)),
    )


def _adam_step_size(rule: Any, dtype: Any, lr: tf.Tensor) -> tf.Tensor:
    """Adam's bias-corrected step size at the step about to be taken."""
    local_step = ops.cast(rule.iterations + 1, dtype)
    beta_1_power = ops.power(ops.cast(rule.beta_1, dtype), local_step)
    beta_2_power = ops.power(ops.cast(rule.beta_2, dtype), local_step)
    return lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)


# The fused kernel (``masked_sparse_apply_adam``) replaces _adam_rows, and the
# deduplication before it, where it can: Adam or AdamW, a sparse gradient of
# the variable's dtype, a variable on the CPU (the kernel has no GPU version).
# It computes exactly what the composed path computes (same operations, same
# order, same rounding), in one op instead of ~25.
_FUSED_RULES = (keras.optimizers.Adam, keras.optimizers.AdamW)
_FUSED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def _on_cpu(variable: tf.Variable) -> bool:
    if variable.device:
        return tf.DeviceSpec.from_string(variable.device).device_type == "CPU"
    # Not placed yet: it will go to a GPU if there is one.
    return not tf.config.list_logical_devices("GPU")


def _fused_adam_applies(rule: Any, gradient: Any, variable: Any) -> bool:
    """Whether the fused kernel can take this Adam step."""
    if type(rule) not in _FUSED_RULES or not isinstance(gradient, tf.IndexedSlices):
        return False
    dtype = tf.as_dtype(variable.dtype)
    if dtype not in _FUSED_DTYPES or gradient.values.dtype != dtype:
        return False
    try:
        resolved = resolve_variable(variable)
    except PartialEmbeddingTypeError:  # Not a single resource variable here.
        return False
    return _on_cpu(resolved)


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


def _takes_raw_gradient(rule: Any, gradient: Any, variable: Any) -> bool:
    """Whether the duplicates-summed, permitted-only gradient can be skipped.

    Clipping measures (clipnorm, global_clipnorm) or bounds (clipvalue) that
    gradient, so with clipping the composed deduplication stays; the fused
    kernel then gets the deduplicated gradient and still does the update.
    """
    clips = any(value for value in (rule.clipnorm, rule.clipvalue, rule.global_clipnorm))
    return not clips and _fused_adam_applies(rule, gradient, variable)


def _adam_rows_fused(
    rule: Any,
    gradient: tf.IndexedSlices,
    variable: Any,
    mask: Any,
    learning_rate: Any,
) -> None:
    """Weight decay and Adam (AMSGrad) on the gradient's rows, one kernel."""
    dtype = variable.dtype
    lr = ops.cast(learning_rate, dtype)
    if rule.weight_decay is not None and rule._use_weight_decay(variable):
        weight_decay = tf.cast(rule.weight_decay, dtype)  # as _update_rows
    else:
        weight_decay = 0.0
    index = rule._get_variable_index(variable)
    masked_sparse_apply_adam(
        variable,
        rule._momentums[index],
        rule._velocities[index],
        gradient.indices,
        gradient.values,
        mask.full(),
        learning_rate=lr,
        beta_1=rule.beta_1,
        beta_2=rule.beta_2,
        epsilon=rule.epsilon,
        alpha=_adam_step_size(rule, dtype, lr),
        weight_decay=weight_decay,
        v_hat=rule._velocity_hats[index] if rule.amsgrad else None,
    )


def _adagrad_rows(
    rule: Any,
    gradient: tf.Tensor,
    rows: tf.Tensor,
    variable: Any,
    learning_rate: Any,
    subtract: Callable[[Any, tf.Tensor], None],
) -> None:
    lr = ops.cast(learning_rate, variable.dtype)
    gradient = ops.cast(gradient, variable.dtype)
    accumulator = rule._accumulators[rule._get_variable_index(variable)]
    squared = ops.square(gradient)
    new = ops.add(_gather_rows(accumulator, rows), squared)
    subtract(accumulator, ops.negative(squared))
    subtract(
        variable,
        ops.divide(ops.multiply(lr, gradient), ops.sqrt(ops.add(new, rule.epsilon))),
    )


def _rmsprop_rows(
    rule: Any,
    gradient: tf.Tensor,
    rows: tf.Tensor,
    variable: Any,
    learning_rate: Any,
    subtract: Callable[[Any, tf.Tensor], None],
) -> None:
    lr = ops.cast(learning_rate, variable.dtype)
    gradient = ops.cast(gradient, variable.dtype)
    index = rule._get_variable_index(variable)
    rho = rule.rho
    velocity_slot = rule._velocities[index]
    velocity_old = _gather_rows(velocity_slot, rows)
    velocity = ops.add(ops.multiply(rho, velocity_old), ops.multiply(1 - rho, ops.square(gradient)))
    subtract(velocity_slot, ops.subtract(velocity_old, velocity))
    if rule.centered:
        average_slot = rule._average_gradients[index]
        average_old = _gather_rows(average_slot, rows)
        average = ops.add(ops.multiply(rho, average_old), ops.multiply(1 - rho, gradient))
        subtract(average_slot, ops.subtract(average_old, average))
        denominator = velocity - ops.square(average) + rule.epsilon
    else:
        denominator = ops.add(velocity, rule.epsilon)
    increment = ops.divide(ops.multiply(lr, gradient), ops.sqrt(denominator))
    if rule.momentum > 0:
        momentum_slot = rule._momentums[index]
        momentum_old = _gather_rows(momentum_slot, rows)
        momentum = ops.add(ops.multiply(rule.momentum, momentum_old), increment)
        subtract(momentum_slot, ops.subtract(momentum_old, momentum))
        subtract(variable, momentum)
    else:
        subtract(variable, increment)


_ROW_RULES = {
    keras.optimizers.SGD: _sgd_rows,
    keras.optimizers.Adam: _adam_rows,
    keras.optimizers.AdamW: _adam_rows,
    keras.optimizers.Adagrad: _adagrad_rows,
    keras.optimizers.RMSprop: _rmsprop_rows,
}
