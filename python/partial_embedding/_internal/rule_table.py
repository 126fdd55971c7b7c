"""The fused kernels' rule table, as Python reads it.

``cc/core/row_rules.h`` declares every rule once: its slots (per element or
per row) and its hyperparameters, in the order the kernels take them. This is
that table for the op wrappers and ``MaskedOptimizer``; a test checks it
against the header entry by entry.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["RULES", "KernelRule"]


class KernelRule(NamedTuple):
    """One rule of the table."""

    name: str
    #: The slots in the kernel's order: (name, per_row).
    slots: tuple[tuple[str, bool], ...]
    #: The hyperparameters in the kernel's order (learning_rate and
    #: weight_decay first).
    hyperparameters: tuple[str, ...]


_COMMON = ("learning_rate", "weight_decay")
_RMSPROP = _COMMON + ("rho", "one_minus_rho", "epsilon")
_ADAM = _COMMON + ("one_minus_beta_1", "one_minus_beta_2", "epsilon", "alpha")
_ELEMENT = False
_ROW = True

#: The table, by name, in the header's order.
RULES: dict[str, KernelRule] = {
    rule.name: rule
    for rule in (
        KernelRule("sgd", (), _COMMON),
        KernelRule("momentum", (("momentum", _ELEMENT),), _COMMON + ("momentum",)),
        KernelRule("nesterov", (("momentum", _ELEMENT),), _COMMON + ("momentum",)),
        KernelRule("adagrad", (("accumulator", _ELEMENT),), _COMMON + ("epsilon",)),
        KernelRule("rmsprop", (("velocity", _ELEMENT),), _RMSPROP),
        KernelRule(
            "rmsprop_momentum",
            (("velocity", _ELEMENT), ("momentum", _ELEMENT)),
            _RMSPROP + ("momentum",),
        ),
        KernelRule(
            "rmsprop_centered", (("velocity", _ELEMENT), ("average_gradient", _ELEMENT)), _RMSPROP
        ),
        KernelRule(
            "rmsprop_centered_momentum",
            (("velocity", _ELEMENT), ("momentum", _ELEMENT), ("average_gradient", _ELEMENT)),
            _RMSPROP + ("momentum",),
        ),
        KernelRule("adam", (("momentum", _ELEMENT), ("velocity", _ELEMENT)), _ADAM),
        KernelRule(
            "amsgrad",
            (("momentum", _ELEMENT), ("velocity", _ELEMENT), ("velocity_hat", _ELEMENT)),
            _ADAM,
        ),
        KernelRule("rowwise_adagrad", (("accumulator", _ROW),), _COMMON + ("epsilon",)),
        KernelRule(
            "rowwise_adam",
            (("momentum", _ELEMENT), ("velocity", _ROW)),
            _COMMON
            + (
                "one_minus_beta_1",
                "one_minus_beta_2",
                "epsilon",
                "one_minus_beta_1_power",
                "one_minus_beta_2_power",
            ),
        ),
        KernelRule(
            "ftrl",
            (("accumulator", _ELEMENT), ("linear", _ELEMENT)),
            _COMMON + ("l1", "two_l2_shrinkage", "two_l2", "power"),
        ),
    )
}
