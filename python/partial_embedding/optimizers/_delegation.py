"""What a MaskedOptimizer passes on to the optimizer it wraps, as Keras'
``LossScaleOptimizer`` does: variables, learning rate, iterations, loss
scaling, clipping options, weight-decay exclusions."""

from __future__ import annotations

from typing import Any

from partial_embedding._internal.types import KerasOptimizer


def _base_optimizer_option(name: str) -> property:
    """A property reading and setting the base optimizer's option ``name``
    (None, and nothing set, before the base optimizer is known: the base
    constructor's own assignments come first)."""

    def read(self: Any) -> Any:
        base_optimizer = getattr(self, "_base_optimizer", None)
        return None if base_optimizer is None else getattr(base_optimizer, name)

    def write(self: Any, value: Any) -> None:
        base_optimizer = getattr(self, "_base_optimizer", None)
        if base_optimizer is not None:
            setattr(base_optimizer, name, value)

    return property(read, write, doc=f"The base optimizer's ``{name}``.")


class Delegation:
    """The wrapper's options and state that live on the optimizers it wraps
    (a mixin of ``MaskedOptimizer``): ``inner_optimizer`` (the wrapped one)
    and ``_base_optimizer`` (the one whose rule runs: the inner one, or the
    one inside an inner ``LossScaleOptimizer``)."""

    inner_optimizer: KerasOptimizer
    _base_optimizer: KerasOptimizer
    built: bool

    @property
    def variables(self) -> list[Any]:
        """The wrapper's own variables (those Keras' optimizer keeps), then
        the inner optimizer's."""
        own = super().variables  # type: ignore[misc]
        return list(own) + self.inner_optimizer.variables

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
        base_optimizer = getattr(self, "_base_optimizer", None)
        return None if base_optimizer is None else base_optimizer.loss_scale_factor

    @loss_scale_factor.setter
    def loss_scale_factor(self, value: Any) -> None:
        # A LossScaleOptimizer around us sets None here so that gradients are
        # not unscaled twice: pass that on to the optimizer that unscales. The
        # base constructor's own assignment (always None) comes before
        # `_base_optimizer` exists and has nothing to configure.
        base_optimizer = getattr(self, "_base_optimizer", None)
        if base_optimizer is not None:
            base_optimizer.loss_scale_factor = value

    # The clipping options live on the optimizer whose base_optimizer runs (the inner
    # one, or the one inside an inner LossScaleOptimizer), where the pipeline
    # reads them: reading or setting them here reads or sets them there.
    clipnorm = _base_optimizer_option("clipnorm")
    clipvalue = _base_optimizer_option("clipvalue")
    global_clipnorm = _base_optimizer_option("global_clipnorm")

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
        self._base_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    def scale_loss(self, loss: Any) -> Any:
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list: Any) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)
