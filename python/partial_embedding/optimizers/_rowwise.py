"""Row-wise optimizers: one accumulator per row instead of one per element.

``RowwiseAdagrad`` is FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` and ``RowwiseAdam``
its ``PARTIAL_ROWWISE_ADAM``, as Keras 3 optimizers (TensorFlow backend): a
``[V, D]`` table keeps a ``[V]`` second moment, ``1/D`` of Adagrad's or
Adam's. They work alone on any variable and inside ``MaskedOptimizer``.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from keras import ops

from partial_embedding._internal import framework_private
from partial_embedding._internal.variables import gather_rows
from partial_embedding.optimizers._gradients import summed_rows


def _exact(value: float, dtype: Any) -> Any:
    """A Python float as a tensor of ``dtype`` without a float32 rounding on
    the way (``ops.cast`` of a Python float to float64 rounds it first)."""
    return ops.convert_to_tensor(value, dtype=dtype)


def _row_state_shape(variable: Any) -> tuple[int, ...]:
    """A per-row state's shape: ``[V]`` for a ``[V, ...]`` variable, the
    variable's own shape for rank <= 1 (a row is then one element)."""
    shape = tuple(variable.shape)
    return shape[:1] if len(shape) >= 2 else shape


def _row_mean_square(gradient: Any, rank: int) -> Any:
    """``mean_d(g_rd^2)`` over every axis but the first (rank >= 2), else
    ``g^2`` (rank <= 1: a row is one element)."""
    squared = ops.square(gradient)
    if rank < 2:
        return squared
    return ops.mean(squared, axis=tuple(range(1, rank)))


def _per_row(values: Any, rank: int) -> Any:
    """``values`` (one per row) shaped to broadcast against the rows."""
    if rank < 2:
        return values
    return ops.reshape(values, (-1,) + (1,) * (rank - 1))


def _state_name(variable: Any, name: str) -> str:
    """``name`` prefixed by the variable's path (a Keras variable) or name (a
    ``tf.Variable``), as Keras names an optimizer's slot variables."""
    owner = getattr(variable, "path", None) or str(variable.name).replace(":", "_")
    return f"{owner.replace('/', '_')}_{name}"


def _distinct_rows(gradient: Any, dtype: Any) -> tuple[tf.Tensor | None, tf.Tensor]:
    """A sparse gradient's distinct rows and their summed gradient, or (None,
    the dense gradient): in ``dtype``."""
    if isinstance(gradient, tf.IndexedSlices):
        rows, values = summed_rows(gradient)
        return rows, ops.cast(values, dtype)
    return None, ops.cast(gradient, dtype)


def _rows_of(state: Any, rows: tf.Tensor | None) -> Any:
    """The state's ``rows`` (all of it where ``rows`` is None)."""
    return state if rows is None else gather_rows(state, rows)


def _at(values: tf.Tensor, rows: tf.Tensor | None) -> Any:
    """``values`` for ``rows`` as an assignment takes them (dense for None)."""
    return values if rows is None else tf.IndexedSlices(values, rows)


class _RowwiseOptimizer(keras.optimizers.Optimizer):
    """What both row-wise optimizers share: per-row state variables."""

    def _add_row_variables(self, var_list: list[Any], name: str, initial_value: float) -> list:
        """One per-row state per variable, placed with it."""
        states = []
        for variable in var_list:
            reference = variable.value if isinstance(variable, keras.Variable) else variable
            with tf.distribute.get_strategy().extended.colocate_vars_with(reference):
                states.append(
                    self.add_variable(
                        shape=_row_state_shape(variable),
                        initializer=keras.initializers.Constant(initial_value),
                        dtype=variable.dtype,
                        name=_state_name(variable, name),
                    )
                )
        return states


@keras.saving.register_keras_serializable(package="partial_embedding")
class RowwiseAdagrad(_RowwiseOptimizer):
    """Adagrad with one accumulator per row (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``).

    For a variable of rank >= 2, a row is a slice along the first axis; a
    batch's duplicate ids are summed first, then each row ``r`` in the
    gradient takes::

        G_r <- G_r + mean_d(g_rd ** 2)
        w_r <- w_r - learning_rate * g_r / (sqrt(G_r) + epsilon)

    For rank <= 1 the same holds per element. A row without gradient keeps
    its value and accumulator, so sparse and dense gradients give the same
    result. ``weight_decay`` is decoupled, applied by Keras before the rule.

    Args:
      learning_rate: A float, a schedule or a callable.
      initial_accumulator_value: Every ``G_r``'s starting value (>= 0).
      epsilon: Added to the root, outside it.
      weight_decay, clipnorm, clipvalue, global_clipnorm: As Keras' optimizers
        take them; ``**kwargs`` passes the rest of Keras' common arguments.
      name: The optimizer's name.

    Example:

    >>> import keras, partial_embedding as pe
    >>> model = keras.Sequential([keras.layers.Embedding(1000, 16)])
    >>> model.compile(optimizer=pe.RowwiseAdagrad(0.05), loss="mse")

    Its state is ``1/D`` of Adagrad's: docs/optimizers.md.
    """

    #: The slot lists ``build`` creates, by the slot's name in the row rules
    #: (``framework_private.slot_lists_of``).
    SLOT_LISTS = {"accumulator": ("_accumulators", None)}

    def __init__(
        self,
        learning_rate: Any = 0.001,
        initial_accumulator_value: float = 0.0,
        epsilon: float = 1e-8,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        name: str = "rowwise_adagrad",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            name=name,
            **kwargs,
        )
        self.initial_accumulator_value = initial_accumulator_value
        self.epsilon = epsilon

    def build(self, var_list: list[Any]) -> None:
        if self.built:
            return
        super().build(var_list)
        self._accumulators = self._add_row_variables(
            var_list, "accumulator", self.initial_accumulator_value
        )

    def row_update(
        self, gradient: Any, accumulator: Any, learning_rate: Any, rank: int
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The rule on some rows, written once (``update_step`` and
        ``MaskedOptimizer``'s row rule apply it): their summed gradient and
        accumulators in; the accumulators' increment and the rows'
        decrement out."""
        mean_square = _row_mean_square(gradient, rank)
        epsilon = _exact(self.epsilon, gradient.dtype)
        root = tf.add(tf.sqrt(tf.add(accumulator, mean_square)), epsilon)
        return mean_square, tf.divide(tf.multiply(learning_rate, gradient), _per_row(root, rank))

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        rows, values = _distinct_rows(gradient, variable.dtype)
        accumulator = framework_private.slot(self, "accumulator", variable)
        increment, decrement = self.row_update(
            values,
            _rows_of(accumulator, rows),
            ops.cast(learning_rate, variable.dtype),
            len(variable.shape),
        )
        self.assign_add(accumulator, _at(increment, rows))
        self.assign_sub(variable, _at(decrement, rows))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "initial_accumulator_value": self.initial_accumulator_value,
                "epsilon": self.epsilon,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="partial_embedding")
class RowwiseAdam(_RowwiseOptimizer):
    """Adam with its second moment per row (FBGEMM's ``PARTIAL_ROWWISE_ADAM``).

    The first moment ``m`` is per element, the second ``v`` per row (a slice
    along the first axis; per element for rank <= 1). With ``t`` the step
    about to be taken (``iterations + 1``, as Keras' Adam counts), a batch's
    duplicate ids summed first, each row ``r`` in the gradient takes::

        v_r <- beta_2 * v_r + (1 - beta_2) * mean_d(g_rd ** 2)
        m   <- beta_1 * m + (1 - beta_1) * g
        w   <- w - lr * (m / (1 - beta_1**t)) / (sqrt(v_r / (1 - beta_2**t)) + epsilon)

    A sparse gradient updates lazily: rows not in it keep ``w``, ``m`` and
    ``v``. A dense gradient updates every row. ``weight_decay`` is
    decoupled, applied by Keras before the rule.

    Args:
      learning_rate: A float, a schedule or a callable.
      beta_1, beta_2: The moments' decay rates.
      epsilon: Added to the root, outside it.
      weight_decay, clipnorm, clipvalue, global_clipnorm: As Keras' optimizers
        take them; ``**kwargs`` passes the rest of Keras' common arguments.
      name: The optimizer's name.

    Example:

    >>> import keras, partial_embedding as pe
    >>> model = keras.Sequential([keras.layers.Embedding(1000, 16)])
    >>> model.compile(optimizer=pe.RowwiseAdam(1e-3), loss="mse")

    Its state is ``D + 1`` values a row against Adam's ``2 D``: docs/optimizers.md.
    """

    #: The slot lists ``build`` creates (``framework_private.slot_lists_of``).
    SLOT_LISTS = {"momentum": ("_momentums", None), "velocity": ("_velocities", None)}

    def __init__(
        self,
        learning_rate: Any = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        weight_decay: float | None = None,
        clipnorm: float | None = None,
        clipvalue: float | None = None,
        global_clipnorm: float | None = None,
        name: str = "rowwise_adam",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            name=name,
            **kwargs,
        )
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def build(self, var_list: list[Any]) -> None:
        if self.built:
            return
        super().build(var_list)
        self._momentums = [
            self.add_variable_from_reference(variable, "momentum") for variable in var_list
        ]
        self._velocities = self._add_row_variables(var_list, "velocity", 0.0)

    def corrections(self, dtype: Any) -> tuple[Any, Any]:
        """``1 - beta_1**t`` and ``1 - beta_2**t`` at the step about to be taken."""
        step = ops.cast(self.iterations + 1, dtype)
        beta_1_power = ops.power(_exact(self.beta_1, dtype), step)
        beta_2_power = ops.power(_exact(self.beta_2, dtype), step)
        return 1 - beta_1_power, 1 - beta_2_power

    def row_update(
        self, gradient: Any, m: Any, v: Any, learning_rate: Any, rank: int
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The rule on some rows, written once (``update_step`` and
        ``MaskedOptimizer``'s row rule apply it): their summed gradient,
        ``m`` and ``v`` in; the increments of ``m`` and ``v`` and the rows'
        decrement out."""
        first, second = self.corrections(gradient.dtype)
        m_step = tf.multiply(tf.subtract(gradient, m), 1 - self.beta_1)
        v_step = tf.multiply(tf.subtract(_row_mean_square(gradient, rank), v), 1 - self.beta_2)
        m_new, v_new = tf.add(m, m_step), tf.add(v, v_step)
        denominator = tf.add(tf.sqrt(tf.divide(v_new, second)), self.epsilon)
        decrement = tf.divide(
            tf.multiply(learning_rate, tf.divide(m_new, first)), _per_row(denominator, rank)
        )
        return m_step, v_step, decrement

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        rows, values = _distinct_rows(gradient, variable.dtype)
        m_slot = framework_private.slot(self, "momentum", variable)
        v_slot = framework_private.slot(self, "velocity", variable)
        m_step, v_step, decrement = self.row_update(
            values,
            _rows_of(m_slot, rows),
            _rows_of(v_slot, rows),
            ops.cast(learning_rate, variable.dtype),
            len(variable.shape),
        )
        self.assign_add(m_slot, _at(m_step, rows))
        self.assign_add(v_slot, _at(v_step, rows))
        self.assign_sub(variable, _at(decrement, rows))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon})
        return config
