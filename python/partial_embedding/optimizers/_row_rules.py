"""The per-row rules MaskedOptimizer applies, one registry entry per optimizer.

Each rule mirrors its optimizer's stock ``update_step`` on the gathered rows of
one masked variable. Where the stock rule adds to (or subtracts from) a slot,
the in-place subtraction reproduces it exactly; where it assigns a new value,
``old - (old - new)`` may differ from ``new`` in the last bit.

``ROW_RULES`` is the one list of supported optimizers: the supported classes,
the names in the "cannot wrap" error come from it, and each entry names its
rule in the fused kernels' table (cc/core/row_rules.h, read through
``_internal.rule_table``), which gives its slots and the order of its
hyperparameters. Supporting another optimizer is one entry there and, for a
new rule, one in the table (plus, if its rule reads slots, their Keras
attributes in ``framework_private.SLOT_LISTS``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from partial_embedding._build_info import gpu_fused_kernel_chosen
from partial_embedding._internal import framework_private
from partial_embedding._internal import xla as _xla
from partial_embedding._internal.context import in_xla_context
from partial_embedding._internal.rule_inputs import complement
from partial_embedding._internal.rule_table import RULES, KernelRule
from partial_embedding.errors import PartialEmbeddingTypeError
from partial_embedding.ops import (
    SUPPORTED_DTYPES,
    gather_rows,
    masked_scatter_sub,
    resolve_variable,
    xla_custom_call,
)
from partial_embedding.ops.bags import bag_gradient_inputs
from partial_embedding.ops.fused import masked_embedding_bag_apply_rule, masked_sparse_apply_rule
from partial_embedding.ops.lookup import uncompacted_gradient
from partial_embedding.optimizers._compact_slots import CompactSlots, SlotSpec
from partial_embedding.optimizers._rowwise import RowwiseAdagrad, RowwiseAdam


class RowStep:
    """One masked variable's row update: what every rule starts from.

    Args:
      optimizer: The wrapped optimizer, whose hyperparameters and slots the
        rule uses.
      gradient: The rows to update (``indices``) and their gradient.
      variable: The masked variable.
      row_mask: Its whole bool ``[V]`` mask, for the in-place kernels.
      learning_rate: The optimizer's learning rate at this step.
      compact: The variable's compact slots, or None for Keras' own
        (full-size) slots.
      mask_variable: The variable ``row_mask`` was read from, or None (a
        fixed mask).
    """

    def __init__(
        self,
        optimizer: Any,
        gradient: tf.IndexedSlices,
        variable: Any,
        row_mask: tf.Tensor,
        learning_rate: Any,
        compact: CompactSlots | None = None,
        mask_variable: tf.Variable | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.variable = variable
        self.dtype = variable.dtype
        self.rows = gradient.indices
        self.gradient = ops.cast(gradient.values, self.dtype)
        self.learning_rate = ops.cast(learning_rate, self.dtype)
        self.row_mask = row_mask
        self.mask_variable = mask_variable
        self.compact = compact
        self._slot_rows: tf.Tensor | None = None
        #: Whether slot rows are still to be found (compact slots, not XLA).
        self._slot_rows_pending = False
        self._permitted: tf.Tensor | None = None
        self._slot_row_mask: tf.Tensor | None = None
        #: Under XLA: which rows this step writes (table and slots alike).
        self._write: tf.Tensor | None = None
        #: Under XLA: the scatter indices of the table and of the slots, the
        #: rows not written numbered ``_xla.SKIPPED_ROW`` (made once a step).
        self._table_targets: tf.Tensor | None = None
        self._slot_targets: tf.Tensor | None = None
        if in_xla_context():
            self._set_up_for_xla()
        else:
            # Found when first asked for (before any slot is read or
            # written): a fused kernel that finds them itself never adds
            # the ops (and their writes) to the graph.
            self._slot_rows_pending = compact is not None

    @property
    def slot_rows(self) -> tf.Tensor | None:
        """Each row's slot row (compact slots only; 0 for a frozen row); rows
        that have none get one the first time this is read."""
        self.find_slot_rows()
        return self._slot_rows

    def find_slot_rows(self) -> None:
        """Finds the slot rows (giving rows that have none one), once."""
        if self._slot_rows_pending:
            self._slot_rows_pending = False
            assert self.compact is not None
            # Frozen rows stay in the computation (zero gradient in the
            # composed rule): TensorFlow's vectorized elementwise kernels may
            # round an element differently at another position, so the rows
            # keep the positions they have with full-size slots. Only the
            # writes to the slots leave them out.
            self._permitted = tf.gather(self.row_mask, self.rows)
            self._slot_rows = self.compact.slot_rows(self.rows, self._permitted, self.row_mask)

    def _set_up_for_xla(self) -> None:
        """Static shapes: every row stays in the computation and only rows
        in ``_write`` (valid, permitted, with a slot row) are written."""
        variable = resolve_variable(self.variable, argument="variable")
        self.rows, _, self._write = _xla.valid_rows(
            self.rows,
            tf.shape(variable, out_type=self.rows.dtype)[0],
            lambda rows: tf.gather(self.row_mask, rows),
        )
        if self.compact is not None:
            self._slot_rows, has_slot = self.compact.xla_slot_rows(self.rows, self._write)
            self._write = has_slot
            self._slot_targets = _xla.write_targets(self.slot_rows, self._write)
        self._table_targets = _xla.write_targets(self.rows, self._write)

    def xla_slot_indices(self) -> tf.Tensor:
        """Under XLA: each position's slot row for a fused custom call (its
        own row with full-size slots), ``-1`` where the step must not write
        (an id outside ``[0, V)``, a frozen row, a row without a slot row):
        the custom call skips those positions."""
        assert self._write is not None
        slot_rows = self.rows if self.slot_rows is None else self.slot_rows
        return tf.where(self._write, slot_rows, tf.constant(-1, slot_rows.dtype))

    @property
    def empty(self) -> bool:
        """Statically known to update no row (eagerly: a batch of frozen rows)."""
        return self.rows.shape.num_elements() == 0

    def slot(self, name: str) -> Any:
        """The optimizer's slot ``name`` (e.g. ``"momentum"``) of the variable."""
        if self.compact is not None:
            return self.compact.slot(name)
        return framework_private.slot(self.optimizer, name, self.variable)

    def _compact_target(self, target: Any) -> bool:
        return self.compact is not None and self.compact.is_slot(target)

    def rows_of(self, variable: Any) -> tf.Tensor:
        """The updated rows of ``variable`` (the masked one or a slot)."""
        if self._compact_target(variable):
            slot_rows = self.slot_rows
            assert self.compact is not None and slot_rows is not None
            return self.compact.gather(variable, slot_rows)
        return gather_rows(variable, self.rows)

    def subtract(self, target: Any, amount: tf.Tensor) -> None:
        """``target[rows] -= amount`` in place, on permitted rows only."""
        amount = tf.cast(amount, self.dtype)
        if self._table_targets is not None:  # XLA
            targets = self._table_targets
            if self._compact_target(target):
                assert self._slot_targets is not None
                targets = self._slot_targets
            _xla.scatter_sub_at(resolve_variable(target), targets, amount)
            return
        if self._compact_target(target):
            slot_rows = self.slot_rows
            assert self.compact is not None and slot_rows is not None
            if self._slot_row_mask is None:
                # Once per step for all slots (after slot_rows, which may grow
                # them); only the composed rules write slots this way.
                self._slot_row_mask = self.compact.slot_row_mask()
            self.compact.subtract(
                target,
                tf.boolean_mask(slot_rows, self._permitted),
                tf.boolean_mask(amount, self._permitted),
                self._slot_row_mask,
            )
            return
        masked_scatter_sub(target, self.rows, amount, self.row_mask)

    def add(self, target: Any, amount: tf.Tensor) -> None:
        self.subtract(target, ops.negative(amount))

    def replace(self, target: Any, old: tf.Tensor, new: tf.Tensor) -> None:
        """Moves ``target``'s rows from ``old`` (their values) to ``new``."""
        self.subtract(target, ops.subtract(old, new))

    def weight_decay(self) -> tf.Tensor | None:
        """The optimizer's weight decay for this variable, or None."""
        optimizer = self.optimizer
        if optimizer.weight_decay is None or not framework_private.uses_weight_decay(
            optimizer, self.variable
        ):
            return None
        return tf.cast(optimizer.weight_decay, self.dtype)


RowFunction = Callable[[RowStep], None]


class RowUpdate(NamedTuple):
    """The update chosen for one masked variable at one step."""

    apply: RowFunction
    #: A fused kernel sums duplicate rows and skips frozen ones itself, so it
    #: can take the raw sparse gradient.
    takes_raw_gradient: bool


@dataclasses.dataclass(frozen=True)
class RowRule:
    """How MaskedOptimizer updates a masked variable for one Keras optimizer.

    Attributes:
      optimizer: The Keras optimizer class (exactly; subclasses may change the
        rule, so they are not supported).
      options: The optimizer's options the rule follows, for the error text.
      rows: The rule on the gathered rows, as TensorFlow ops (weight decay is
        applied before it): the stock-op path.
      kernel_rule: The name, in the fused kernels' rule table
        (cc/core/row_rules.h), of an optimizer instance's rule.
    """

    optimizer: type
    options: str
    rows: RowFunction
    kernel_rule: Callable[[Any], str]

    def slots(self, optimizer: Any) -> tuple[SlotSpec, ...]:
        """The slots the rule reads for ``optimizer``, from the table (names
        as ``RowStep.slot`` takes them), with the value Keras' ``build``
        gives them (Adagrad's and Ftrl's ``initial_accumulator_value``, else
        0). Keras' Constant initializer rounds the value to float32 first,
        whatever the variable's dtype (0.1 is 0.10000000149 in a float64
        slot): so does this."""
        initial = float(np.float32(getattr(optimizer, "initial_accumulator_value", 0.0)))
        return tuple(
            SlotSpec(name, initial if name == "accumulator" else 0.0, per_row)
            for name, per_row in RULES[self.kernel_rule(optimizer)].slots
        )

    def update_for(self, gradient: Any, variable: Any) -> RowUpdate:
        """The update of ``variable`` at this step: the fused kernel where it
        applies (under XLA: its custom call), else weight decay and the rule
        as separate ops. The one place that chooses."""
        if fused_kernel_applies(gradient, variable):
            if not in_xla_context() or xla_custom_call.custom_calls_apply(variable):
                return RowUpdate(self._fused, takes_raw_gradient=True)
        return RowUpdate(self._composed, takes_raw_gradient=False)

    def _composed(self, step: RowStep) -> None:
        step.find_slot_rows()  # First: they may grow the slots.
        decay = step.weight_decay()
        if decay is not None:
            step.subtract(step.variable, step.rows_of(step.variable) * decay * step.learning_rate)
        self.rows(step)

    def _fused(self, step: RowStep) -> None:
        """Weight decay and the rule on the gradient's rows, one kernel: the
        table's rule for this optimizer, its slots and hyperparameters in the
        table's order. Under XLA the custom call; for a bag lookup's gradient
        on the CPU the fused bag backward + rule; else the per-id kernel,
        which sums duplicate rows and skips frozen ones itself."""
        rule = RULES[self.kernel_rule(step.optimizer)]
        slots = [step.slot(name) for name, _ in rule.slots]
        hyperparameters = {name: _HYPERPARAMETERS[name](step) for name in rule.hyperparameters}
        if in_xla_context():
            xla_custom_call.masked_sparse_apply_rule_custom_call(
                rule.name,
                step.variable,
                slots,
                step.rows,
                step.gradient,
                step.row_mask,
                hyperparameters,
                slot_indices=step.xla_slot_indices(),
            )
        elif not _bag_fused(step, rule, slots, hyperparameters, self.slots(step.optimizer)):
            rows, gradient, slot_rows = _uncompacted_rows(step)
            masked_sparse_apply_rule(
                rule.name,
                step.variable,
                slots,
                rows,
                gradient,
                step.row_mask,
                hyperparameters,
                slot_indices=slot_rows,
            )


# -- the rules --------------------------------------------------------------------


def _sgd_rows(step: RowStep) -> None:
    optimizer, gradient, lr = step.optimizer, step.gradient, step.learning_rate
    if optimizer.momentum == 0:
        step.subtract(step.variable, ops.multiply(gradient, lr))
        return
    momentum_slot = step.slot("momentum")
    momentum = ops.cast(optimizer.momentum, step.dtype)
    old = step.rows_of(momentum_slot)
    new = ops.subtract(ops.multiply(old, momentum), ops.multiply(gradient, lr))
    step.replace(momentum_slot, old, new)
    if optimizer.nesterov:
        step.add(
            step.variable,
            ops.subtract(ops.multiply(new, momentum), ops.multiply(gradient, lr)),
        )
    else:
        step.add(step.variable, new)


def _adam_step_size(optimizer: Any, dtype: Any, lr: tf.Tensor) -> tf.Tensor:
    """Adam's bias-corrected step size at the step about to be taken."""
    local_step = ops.cast(optimizer.iterations + 1, dtype)
    beta_1_power = ops.power(ops.cast(optimizer.beta_1, dtype), local_step)
    beta_2_power = ops.power(ops.cast(optimizer.beta_2, dtype), local_step)
    return lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)


def _adam_rows(step: RowStep) -> None:
    optimizer, gradient = step.optimizer, step.gradient
    m_slot, v_slot = step.slot("momentum"), step.slot("velocity")
    alpha = _adam_step_size(optimizer, step.dtype, step.learning_rate)

    m_old = step.rows_of(m_slot)
    v_old = step.rows_of(v_slot)
    m_step = ops.multiply(ops.subtract(gradient, m_old), 1 - optimizer.beta_1)
    v_step = ops.multiply(ops.subtract(ops.square(gradient), v_old), 1 - optimizer.beta_2)
    step.add(m_slot, m_step)
    step.add(v_slot, v_step)
    m_new = ops.add(m_old, m_step)
    v_new = ops.add(v_old, v_step)
    if optimizer.amsgrad:
        v_hat_slot = step.slot("velocity_hat")
        v_hat_old = step.rows_of(v_hat_slot)
        v_new = ops.maximum(v_hat_old, v_new)
        step.replace(v_hat_slot, v_hat_old, v_new)
    step.subtract(
        step.variable,
        ops.divide(ops.multiply(m_new, alpha), ops.add(ops.sqrt(v_new), optimizer.epsilon)),
    )


def _bag_fused(
    step: RowStep,
    rule: KernelRule,
    slots: list[Any],
    hyperparameters: dict[str, Any],
    specs: tuple[SlotSpec, ...],
) -> bool:
    """The fused step for the gradient of a bag lookup on a CPU table:
    ``masked_embedding_bag_apply_rule`` sums each permitted row's gradient
    from the bags' gradient itself and finds (or gives) the compact slot
    rows itself, so neither the gradient op nor the slot-row ops run. The
    same bits as the two ops; whether it ran.

    It applies where the gradient is exactly the one the bag lookup built
    (no clipping, loss scaling or cross-replica sum came between), kept rows
    by the mask this step uses, on a CPU table whose compact slots (if any)
    may grow, or (its CUDA kernel chosen) a GPU table with its slots (and
    slot map) on the GPU too.
    """
    inputs = bag_gradient_inputs(step.gradient, step.rows)
    if inputs is None or step.mask_variable is None:
        return False
    if not isinstance(inputs.mask_source, tf.Variable) or (
        resolve_variable(inputs.mask_source) is not resolve_variable(step.mask_variable)
    ):
        return False
    variable = resolve_variable(step.variable)
    compact = step.compact
    # The kernel gives slot rows from rows_used on: not from a free pool.
    if compact is not None and (
        compact.fixed_capacity or compact.follows_growth or compact.recycles
    ):
        return False
    targets = [variable, *slots]
    if compact is not None:
        targets += [compact.slot_of_row, compact.rows_used]
    on_gpu = {"GPU" in (resolve_variable(t).device or "").upper() for t in targets}
    op_name = "MaskedEmbeddingBagApplyRule" + ("" if compact is None else "WithSlotMap")
    # A GPU table: the CUDA kernel, where chosen, with every variable on the GPU.
    if True in on_gpu and not (on_gpu == {True} and gpu_fused_kernel_chosen(op_name)):
        return False
    initial = {spec.name: spec.initial_value for spec in specs}
    masked_embedding_bag_apply_rule(
        rule.name,
        variable,
        slots,
        inputs.grad,
        inputs.ids,
        inputs.bags,
        inputs.factors,
        step.row_mask,
        hyperparameters,
        **(
            {}
            if compact is None
            else {
                "slot_of_row": compact.slot_of_row,
                "slot_rows_used": compact.rows_used,
                "slot_initial_values": [initial[name] for name, _ in rule.slots],
            }
        ),
    )
    return True


def _uncompacted_rows(step: RowStep) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor | None]:
    """The step's rows, gradient and slot rows, for a fused kernel.

    Where the gradient is the one ``masked_embedding_lookup`` built in this
    graph, the kernel reads the lookup's whole upstream gradient in place of
    its copy of the permitted rows (the copy is then pruned): it skips the
    frozen rows' occurrences itself, and the permitted ones keep their order.
    Their slot rows go to their positions; the others get slot row 0 (only
    checked to be in range).
    """
    uncompacted = uncompacted_gradient(step.gradient, step.rows)
    if uncompacted is None:
        return step.rows, step.gradient, step.slot_rows
    gradient, rows, kept = uncompacted
    slot_rows = step.slot_rows
    if slot_rows is not None:
        slot_rows = tf.scatter_nd(
            tf.expand_dims(kept, 1), slot_rows, tf.shape(rows, out_type=kept.dtype)
        )
    return rows, gradient, slot_rows


def _adagrad_rows(step: RowStep) -> None:
    gradient = step.gradient
    accumulator = step.slot("accumulator")
    squared = ops.square(gradient)
    new = ops.add(step.rows_of(accumulator), squared)
    step.add(accumulator, squared)
    step.subtract(
        step.variable,
        ops.divide(
            ops.multiply(step.learning_rate, gradient),
            ops.sqrt(ops.add(new, step.optimizer.epsilon)),
        ),
    )


def _rmsprop_rows(step: RowStep) -> None:
    optimizer, gradient = step.optimizer, step.gradient
    rho = optimizer.rho
    velocity_slot = step.slot("velocity")
    velocity_old = step.rows_of(velocity_slot)
    velocity = ops.add(ops.multiply(rho, velocity_old), ops.multiply(1 - rho, ops.square(gradient)))
    step.replace(velocity_slot, velocity_old, velocity)
    if optimizer.centered:
        average_slot = step.slot("average_gradient")
        average_old = step.rows_of(average_slot)
        average = ops.add(ops.multiply(rho, average_old), ops.multiply(1 - rho, gradient))
        step.replace(average_slot, average_old, average)
        denominator = velocity - ops.square(average) + optimizer.epsilon
    else:
        denominator = ops.add(velocity, optimizer.epsilon)
    increment = ops.divide(ops.multiply(step.learning_rate, gradient), ops.sqrt(denominator))
    if optimizer.momentum > 0:
        momentum_slot = step.slot("momentum")
        momentum_old = step.rows_of(momentum_slot)
        momentum = ops.add(ops.multiply(optimizer.momentum, momentum_old), increment)
        step.replace(momentum_slot, momentum_old, momentum)
        step.subtract(step.variable, momentum)
    else:
        step.subtract(step.variable, increment)


def _rowwise_adagrad_rows(step: RowStep) -> None:
    accumulator = step.slot("accumulator")
    increment, decrement = step.optimizer.row_update(
        step.gradient, step.rows_of(accumulator), step.learning_rate, len(step.variable.shape)
    )
    step.add(accumulator, increment)
    step.subtract(step.variable, decrement)


def _rowwise_adam_rows(step: RowStep) -> None:
    m_slot, v_slot = step.slot("momentum"), step.slot("velocity")
    m_step, v_step, decrement = step.optimizer.row_update(
        step.gradient,
        step.rows_of(m_slot),
        step.rows_of(v_slot),
        step.learning_rate,
        len(step.variable.shape),
    )
    step.add(m_slot, m_step)
    step.add(v_slot, v_step)
    step.subtract(step.variable, decrement)


def _ftrl_two_l2(step: RowStep) -> tf.Tensor:
    """FTRL's ``2 * (l2 + beta / (2 * lr))`` in the variable's dtype, each
    operation rounded as Ftrl.update_step rounds it."""
    optimizer = step.optimizer
    l2 = optimizer.l2_regularization_strength + optimizer.beta / (2.0 * step.learning_rate)
    return 2 * l2


def _ftrl_rows(step: RowStep) -> None:
    optimizer, gradient, lr = step.optimizer, step.gradient, step.learning_rate
    accumulator_slot, linear_slot = step.slot("accumulator"), step.slot("linear")
    power = -optimizer.learning_rate_power
    l1 = optimizer.l1_regularization_strength
    x = step.rows_of(step.variable)
    accumulator = step.rows_of(accumulator_slot)
    linear_old = step.rows_of(linear_slot)
    squared = ops.square(gradient)
    updated = ops.add(accumulator, squared)
    power_new = ops.power(updated, power)
    sigma = ops.divide(ops.subtract(power_new, ops.power(accumulator, power)), lr)
    shrunk = ops.add(gradient, ops.multiply(2 * optimizer.l2_shrinkage_regularization_strength, x))
    linear_step = ops.subtract(shrunk, ops.multiply(sigma, x))
    linear = ops.add(linear_old, linear_step)
    quadratic = ops.add(ops.divide(power_new, lr), _ftrl_two_l2(step))
    x_new = ops.divide(ops.subtract(ops.clip(linear, -l1, l1), linear), quadratic)
    step.add(linear_slot, linear_step)
    step.add(accumulator_slot, squared)
    step.replace(step.variable, x, x_new)


# -- the kernel rule and hyperparameters of each optimizer ------------------------


def _sgd_kernel(optimizer: Any) -> str:
    if optimizer.momentum == 0:
        return "sgd"
    return "nesterov" if optimizer.nesterov else "momentum"


def _rmsprop_kernel(optimizer: Any) -> str:
    return (
        "rmsprop"
        + ("_centered" if optimizer.centered else "")
        + ("_momentum" if optimizer.momentum > 0 else "")
    )


def _weight_decay(step: RowStep) -> Any:
    decay = step.weight_decay()
    return 0.0 if decay is None else decay


def _momentum(step: RowStep) -> Any:
    """SGD casts its momentum (``ops.cast``: a Python number through
    float32); RMSprop multiplies by the Python number."""
    momentum = step.optimizer.momentum
    if isinstance(step.optimizer, keras.optimizers.SGD):
        return tf.cast(momentum, step.dtype)
    return momentum


#: Each hyperparameter of the kernels' table, as the optimizer's own
#: update_step rounds it (Python numbers are rounded once to the variable's
#: dtype by the op wrapper).
_HYPERPARAMETERS: dict[str, Callable[[RowStep], Any]] = {
    "learning_rate": lambda step: step.learning_rate,
    "weight_decay": _weight_decay,
    "momentum": _momentum,
    "epsilon": lambda step: step.optimizer.epsilon,
    "rho": lambda step: step.optimizer.rho,
    "one_minus_rho": lambda step: complement(step.optimizer.rho),
    "one_minus_beta_1": lambda step: complement(step.optimizer.beta_1),
    "one_minus_beta_2": lambda step: complement(step.optimizer.beta_2),
    "alpha": lambda step: _adam_step_size(step.optimizer, step.dtype, step.learning_rate),
    "one_minus_beta_1_power": lambda step: step.optimizer.corrections(step.dtype)[0],
    "one_minus_beta_2_power": lambda step: step.optimizer.corrections(step.dtype)[1],
    "l1": lambda step: step.optimizer.l1_regularization_strength,
    "two_l2_shrinkage": lambda step: 2 * step.optimizer.l2_shrinkage_regularization_strength,
    "two_l2": _ftrl_two_l2,
    "power": lambda step: -step.optimizer.learning_rate_power,
}


def _adam_kernel(optimizer: Any) -> str:
    return "amsgrad" if optimizer.amsgrad else "adam"


#: The supported optimizers and their rules.
ROW_RULES: tuple[RowRule, ...] = (
    RowRule(keras.optimizers.SGD, "momentum, nesterov", _sgd_rows, _sgd_kernel),
    RowRule(keras.optimizers.Adam, "amsgrad", _adam_rows, _adam_kernel),
    RowRule(keras.optimizers.AdamW, "", _adam_rows, _adam_kernel),
    RowRule(keras.optimizers.Adagrad, "", _adagrad_rows, lambda _: "adagrad"),
    RowRule(keras.optimizers.RMSprop, "momentum, centered", _rmsprop_rows, _rmsprop_kernel),
    RowRule(RowwiseAdagrad, "", _rowwise_adagrad_rows, lambda _: "rowwise_adagrad"),
    RowRule(RowwiseAdam, "", _rowwise_adam_rows, lambda _: "rowwise_adam"),
    RowRule(
        keras.optimizers.Ftrl,
        "learning_rate_power, l1, l2, l2_shrinkage, beta",
        _ftrl_rows,
        lambda _: "ftrl",
    ),
)

#: The inner optimizers whose per-row rule MaskedOptimizer implements.
SUPPORTED_OPTIMIZERS: tuple[type, ...] = tuple(rule.optimizer for rule in ROW_RULES)
_RULE_OF = {rule.optimizer: rule for rule in ROW_RULES}


def _supported_names() -> str:
    def home(cls: type) -> str:
        own = cls.__module__.startswith("partial_embedding")
        return ("partial_embedding." if own else "keras.optimizers.") + cls.__name__

    names = [
        home(rule.optimizer) + (f" ({rule.options})" if rule.options else "") for rule in ROW_RULES
    ]
    return (
        f"{', '.join(names[:-1])} and {names[-1]}, optionally "
        "inside a keras.optimizers.LossScaleOptimizer"
    )


def row_rule_for(optimizer: Any) -> RowRule:
    """The entry of ``optimizer``'s class.

    Raises:
      PartialEmbeddingTypeError: ``optimizer`` is not of a supported class.
    """
    rule = _RULE_OF.get(type(optimizer))
    if rule is None:
        raise PartialEmbeddingTypeError(
            f"MaskedOptimizer cannot wrap {type(optimizer).__name__}: "
            f"it supports {_supported_names()}"
        )
    return rule


# -- where the fused kernels apply ------------------------------------------------


def _fused_kernel_device(variable: Any) -> bool:
    """Whether every copy of ``variable`` lives (or will live) where the fused
    kernels run: the CPU, or a GPU in a build with their CUDA kernels."""
    copies = tf.distribute.get_strategy().experimental_local_results(variable)
    for copy in copies:
        if copy.device:
            device_type = tf.DeviceSpec.from_string(copy.device).device_type
        elif tf.config.list_logical_devices("GPU"):
            device_type = "GPU"  # Not placed yet: it will go to the GPU.
        else:
            device_type = "CPU"
        if device_type == "GPU" and gpu_fused_kernel_chosen("MaskedSparseApplyRule"):
            continue
        if device_type != "CPU":
            return False
    return True


def fused_kernel_applies(gradient: Any, variable: Any) -> bool:
    """Whether a fused kernel can take this step of ``variable``: a gradient
    of the variable's dtype, a variable on the CPU or (in a build with the
    CUDA kernels) a GPU."""
    dtype = tf.as_dtype(variable.dtype)
    if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values
    else:
        values = tf.convert_to_tensor(gradient)
    if dtype not in SUPPORTED_DTYPES or values.dtype != dtype:
        return False
    try:
        resolved = resolve_variable(variable)
    except PartialEmbeddingTypeError:  # Not a single resource variable here.
        return False
    return _fused_kernel_device(resolved)
