"""The update rules the training benchmarks take: ``--optimizer NAME``.

``RULES`` names a factory of a fresh Keras optimizer for every rule that
``MaskedOptimizer`` has a fused kernel for: the per-id training step
(``bench._training``), the bag model (``bench._bags``) and the rule-quality
run (``bench._rule_quality``) build the optimizers of their Keras-optimizer
variants here (the floors' heads and the lazy Adam written out by hand keep Adam).
``adam`` (``Adam(1e-3)``) is the default and what the benchmarks timed before
they took a rule.

The learning rates are each rule's usual order for an embedding: the
adaptive rules at Keras' 1e-3, the Adagrad rules at 0.1 (Keras' Adagrad
starts its accumulator at 0.1, so its first steps are about ``lr * |g| /
0.32``; ``RowwiseAdagrad`` starts it at FBGEMM's 0, so its first step moves
each element of a row by about ``lr``), plain SGD at 0.1 and SGD with
momentum 0.9 at 0.01 (the same step in the long run). At 0.5, plain SGD's
steps of the head's bias overshot from one batch to the next and raised the
bag model's loss on some seeds. A step's time does not depend on them;
``bench._rule_quality`` reports the loss each reaches.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

from partial_embedding.optimizers import RowwiseAdagrad, RowwiseAdam  # noqa: E402

#: Each rule's name on the command line and a factory of a fresh optimizer.
RULES: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(1e-3),
    "rmsprop_momentum": lambda: keras.optimizers.RMSprop(1e-3, momentum=0.9),
    "rmsprop_centered": lambda: keras.optimizers.RMSprop(1e-3, centered=True),
    "adam": lambda: keras.optimizers.Adam(1e-3),
    "adamw": lambda: keras.optimizers.AdamW(1e-3),
    "amsgrad": lambda: keras.optimizers.Adam(1e-3, amsgrad=True),
    "rowwise_adagrad": lambda: RowwiseAdagrad(0.1),
    "rowwise_adam": lambda: RowwiseAdam(1e-3),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=1e-3),
}

#: The rule the benchmarks use unless told another.
DEFAULT_RULE = "adam"


def make_optimizer(rule: str) -> keras.optimizers.Optimizer:
    """A fresh optimizer of ``rule`` (one of ``RULES``).

    Raises:
      ValueError: ``rule`` is not one of ``RULES``.
    """
    if rule not in RULES:
        raise ValueError(f"unknown optimizer {rule!r}; choose from {', '.join(RULES)}")
    return RULES[rule]()


def adam_only_note(rule: str, left_out: Sequence[str]) -> str:
    """The line that says ``left_out``, lazy Adam written out by hand, is not
    timed under ``rule``.

    >>> adam_only_note("sgd", ["stock_tf", "the bare_loop floor"])
    '--optimizer sgd: stock_tf and the bare_loop floor are lazy Adam written out by hand; left out'
    """
    names = ", ".join(left_out[:-1]) + " and " + left_out[-1] if len(left_out) > 1 else left_out[0]
    verb = "are" if len(left_out) > 1 else "is"
    return f"--optimizer {rule}: {names} {verb} lazy Adam written out by hand; left out"
