"""The floors a training step is measured against, and what follows from them.

Two floors are timed in the same interleaved rounds as the steps:

* ``head_only`` (and ``head_only_xla``, compiled with XLA): the same head and
  loss as the benchmark's model (mean pooling, ``Dense(1)``, MSE, Adam) fed
  rows already looked up, with no embedding at all. A step less its head-only
  floor is the embedding's own cost: the lookup, its gradient and the
  optimizer update of the table and its slots.
* ``bare_loop``: the fused lazy Adam of the TF-free kernel module
  (``partial_embedding._kernels.masked_sparse_apply_rule_cpu("adam", ...)``, the C++ loop
  the TF kernel calls) on NumPy arrays of the same shape, compact slots and
  row mask, fed each step's ids and gradient rows: the same Adam rows with no
  TensorFlow around them. Absent where the kernel module is not built.

An embedding cost is the difference of two noisy timings, so it is formed
only where the run resolves it (``resolved_difference``: both timed over at
least ``MIN_ROUNDS`` rounds, and the difference larger than their spreads
together); ``derived_figures`` turns what was timed together at each
vocabulary size into the costs and ratios the report prints.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from partial_embedding.bench._models import keras_step  # noqa: E402

#: The floors, timed with the steps at each vocabulary size.
FLOORS = ("head_only", "head_only_xla", "bare_loop")

#: The steps whose embedding cost is reported, and the floor each is measured against.
HEAD_FLOOR_OF = {"partial": "head_only", "partial_xla": "head_only_xla", "stock_tf": "head_only"}

#: The fewest interleaved rounds each of two timings needs before their
#: difference is formed: below it there is no spread to weigh the difference by.
MIN_ROUNDS = 3

#: How the report says why a difference is left out (``resolved_difference``).
UNRESOLVED_NOTE = (
    f"-: not resolved by this run; a difference of two timings is shown only where both were "
    f"timed over at least {MIN_ROUNDS} rounds and it exceeds their spreads "
    f"(median round - best round) together"
)


def adam_hyperparameters(optimizer: keras.optimizers.Adam | None = None) -> list[float]:
    """Keras' ``Adam`` (its defaults unless given) as the kernel module's rule
    ``"adam"`` takes it at step 1: learning_rate, weight_decay, 1 - beta_1,
    1 - beta_2, epsilon, alpha = lr * sqrt(1 - beta_2) / (1 - beta_1)."""
    adam = optimizer or keras.optimizers.Adam()
    lr, beta_1, beta_2 = float(adam.learning_rate), adam.beta_1, adam.beta_2
    alpha = lr * np.sqrt(1 - beta_2) / (1 - beta_1)
    return [lr, 0.0, 1 - beta_1, 1 - beta_2, adam.epsilon, float(alpha)]


def head_only_step(
    width: int, ids_per_sample: int, jit_compile: bool = False
) -> tuple[Callable[[tf.Tensor, tf.Tensor], tf.Tensor], list[Any]]:
    """The benchmark model's head and loss fed looked-up rows: a training step
    of ``rows [batch, ids_per_sample, width] -> mean -> Dense(1)``, MSE, Adam.

    Returns:
      The step (a ``tf.function`` of rows and targets returning the loss) and
      the objects it keeps alive.
    """
    rows = keras.Input((ids_per_sample, width), dtype="float32")
    pooled = keras.layers.GlobalAveragePooling1D()(rows)
    model = keras.Model(rows, keras.layers.Dense(1)(pooled))
    optimizer = keras.optimizers.Adam()
    return keras_step(model, optimizer, jit_compile), [model, optimizer]


def kernel_module() -> Any | None:
    """``partial_embedding._kernels``, or None where it is not built."""
    try:
        module = importlib.import_module("partial_embedding._kernels")
    except ImportError:
        return None
    return module if hasattr(module, "masked_sparse_apply_rule_cpu") else None


def _touched(shape: tuple[int, int], rng: np.random.Generator, scale: float) -> np.ndarray:
    """A float32 array of ``shape`` whose every page is written (as a
    TensorFlow variable's are), uniform in [-scale, scale) or zero."""
    array = np.empty(shape, np.float32)
    if scale:
        rng.random(out=array, dtype=np.float32)
        array -= 0.5
        array *= 2 * scale
    else:
        array.fill(0.0)
    return array


@dataclasses.dataclass
class BareLoop:
    """The fused lazy Adam loop alone, on NumPy arrays of its own.

    Calling it applies one Adam step (at step 1: ``alpha = lr * sqrt(1 -
    beta_2) / (1 - beta_1)``) to the permitted rows among ``ids`` in place,
    through ``_kernels.masked_sparse_apply_rule_cpu`` (rule ``"adam"``) with every core.

    Attributes:
      table: The ``[V, D]`` float32 table.
      first, second: Compact Adam moments, one slot row per permitted row
        (as ``MaskedOptimizer``'s compact slots hold).
      permitted: The row mask.
      slot_of_row: Each table row's slot row (frozen rows: 0, never written).
      kernels: The kernel module.
      hyperparameters: Keras' default ``Adam`` (``adam_hyperparameters``).
    """

    table: np.ndarray
    first: np.ndarray
    second: np.ndarray
    permitted: np.ndarray
    slot_of_row: np.ndarray
    kernels: Any
    hyperparameters: list[float] = dataclasses.field(default_factory=adam_hyperparameters)

    def __call__(self, ids: np.ndarray, slot_ids: np.ndarray, gradient: np.ndarray) -> None:
        """One step: ``ids`` (flat int32), their slot rows, their gradient rows."""
        self.kernels.masked_sparse_apply_rule_cpu(
            "adam",
            self.table,
            [self.first, self.second],
            ids,
            slot_ids,
            gradient,
            self.permitted,
            self.hyperparameters,
        )


def bare_loop_step(
    vocab: int, width: int, permitted: np.ndarray, rng: np.random.Generator
) -> BareLoop | None:
    """A ``BareLoop`` over a ``[vocab, width]`` table (every page written, as
    a TensorFlow variable's are) with zero moments; None where the kernel
    module is not built."""
    kernels = kernel_module()
    if kernels is None:
        return None
    permitted = np.ascontiguousarray(permitted, dtype=bool)
    num_permitted = int(permitted.sum())
    slot_of_row = np.zeros(vocab, np.int32)
    slot_of_row[permitted] = np.arange(num_permitted, dtype=np.int32)
    return BareLoop(
        table=_touched((vocab, width), rng, 0.05),
        first=_touched((max(1, num_permitted), width), rng, 0),
        second=_touched((max(1, num_permitted), width), rng, 0),
        permitted=permitted,
        slot_of_row=slot_of_row,
        kernels=kernels,
    )


def floor_runs(
    batches: list[tuple[tf.Tensor, tf.Tensor]],
    vocab: int,
    width: int,
    permitted: np.ndarray,
    rng: np.random.Generator,
    with_bare_loop: bool = True,
) -> tuple[dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]], list[Any]]:
    """The floors as interleaved runs fed the same batches as the steps.

    Args:
      batches: The steps' ``(ids [batch, ids_per_sample], targets)`` pairs.
      vocab: Rows of the bare loop's table.
      width: Row width of the looked-up rows and of the table.
      permitted: Its row mask (the steps' ``trainable_ids``).
      rng: Source of the looked-up rows and gradients (their values do not
        change the time).
      with_bare_loop: Build the bare loop too (its own table and slots).

    Returns:
      Name -> (function, argument tuples) for ``interleaved_rounds``, and the
      objects the functions keep alive.
    """
    batch, ids_per_sample = (int(size) for size in batches[0][0].shape)
    runs: dict[str, tuple[Callable[..., Any], list[tuple[Any, ...]]]] = {}
    kept: list[Any] = []
    row_batches = [
        (tf.constant(rng.normal(size=(batch, ids_per_sample, width)), tf.float32), target)
        for _, target in batches
    ]
    for name, jit_compile in (("head_only", False), ("head_only_xla", True)):
        head_step, objects = head_only_step(width, ids_per_sample, jit_compile)
        runs[name] = (head_step, row_batches)
        kept += objects
    bare = bare_loop_step(vocab, width, permitted, rng) if with_bare_loop else None
    if bare is not None:
        inputs = []
        for ids, _ in batches:
            flat = np.ascontiguousarray(ids.numpy().reshape(-1), dtype=np.int32)
            gradient = (rng.normal(size=(flat.size, width)) * 1e-3).astype(np.float32)
            inputs.append((flat, bare.slot_of_row[flat], gradient))
        runs["bare_loop"] = (bare, inputs)
    return runs, kept


def resolved_difference(step: dict[str, float], floor: dict[str, float]) -> float | None:
    """``step`` less ``floor`` (best rounds, ms), or None where the run cannot
    resolve it: either was timed over fewer than ``MIN_ROUNDS`` rounds, or the
    difference is no larger than the two timings' spreads (median round less
    best round) together, so noise alone could make it.

    >>> timed = {"step_ms": 2.0, "median_step_ms": 2.1, "rounds": 5}
    >>> floor = {"step_ms": 1.0, "median_step_ms": 1.1, "rounds": 5}
    >>> round(resolved_difference(timed, floor), 3)
    1.0
    >>> resolved_difference({**timed, "rounds": 1}, floor) is None
    True
    """
    if min(step.get("rounds", 0), floor.get("rounds", 0)) < MIN_ROUNDS:
        return None
    difference = step["step_ms"] - floor["step_ms"]
    spread = (step["median_step_ms"] - step["step_ms"]) + (
        floor["median_step_ms"] - floor["step_ms"]
    )
    return difference if difference > spread else None


def embedding_costs(figures: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each step less its head-only floor (``HEAD_FLOOR_OF``): the embedding's
    own cost in ms, for the steps and floors timed together, where the run
    resolves it (``resolved_difference``)."""
    costs = {}
    for variant, floor in HEAD_FLOOR_OF.items():
        if floor not in figures:
            floor = "head_only"
        if variant in figures and floor in figures:
            cost = resolved_difference(figures[variant], figures[floor])
            if cost is not None:
                costs[variant] = cost
    return costs


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``; None where either is missing or the
    denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


#: ``derived_figures``' keys with what each is, in the report's order.
DERIVED = (
    ("partial_embedding_ms", "partial embedding cost (ms)"),
    ("stock_tf_over_partial_embedding", "stock_tf / partial embedding cost"),
    ("partial_embedding_over_bare_loop", "partial embedding cost / bare loop"),
    ("xla_over_partial_step", "partial_xla step / partial step"),
)


def derived_figures(by_vocab: dict[int, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The embedding costs and ratios that follow from what was timed together at each V.

    Returns:
      ``DERIVED``' keys, each ``{V: figure}`` (a figure None where it cannot
      be formed: a cost the run did not resolve, a missing timing), and
      ``"partial_step_flatness"`` and ``"partial_xla_step_flatness"``:
      step(largest V) / step(smallest V) (None below two sizes).
    """
    result: dict[str, Any] = {key: {} for key, _ in DERIVED}
    for vocab, figures in sorted(by_vocab.items()):
        costs = embedding_costs(figures)
        bare = figures.get("bare_loop", {}).get("step_ms")
        step = {
            name: figures[name]["step_ms"] for name in ("partial", "partial_xla") if name in figures
        }
        result["partial_embedding_ms"][vocab] = costs.get("partial")
        result["stock_tf_over_partial_embedding"][vocab] = ratio(
            costs.get("stock_tf"), costs.get("partial")
        )
        result["partial_embedding_over_bare_loop"][vocab] = ratio(costs.get("partial"), bare)
        result["xla_over_partial_step"][vocab] = ratio(step.get("partial_xla"), step.get("partial"))
    for name in ("partial", "partial_xla"):
        steps = {v: f[name]["step_ms"] for v, f in by_vocab.items() if name in f}
        result[f"{name}_step_flatness"] = (
            steps[max(steps)] / steps[min(steps)] if len(steps) >= 2 else None
        )
    return result
