"""Tests of partial_embedding.RowwiseAdagrad and partial_embedding.RowwiseAdam.

Both are Keras 3 optimizers whose second moment is kept per row (a slice
along a variable's first axis; per element for variables of rank 1):

- ``RowwiseAdagrad`` is FBGEMM's EXACT_ROWWISE_ADAGRAD: duplicate ids summed,
  ``G_r += mean_d(g_rd^2)``, ``w_r -= lr * g_r / (sqrt(G_r) + eps)``.
- ``RowwiseAdam`` is FBGEMM's PARTIAL_ROWWISE_ADAM: ``m`` per element, ``v``
  per row, bias-corrected with ``t = iterations + 1``; lazy for IndexedSlices
  gradients (rows not in the batch keep ``m``, ``v`` and ``w``).

What is checked, against the float64 NumPy reference below (:class:`Reference`):

- several steps with IndexedSlices gradients holding duplicate ids, in float32
  and float64, for variables of rank 1, 2 and 3, with int32 and int64 ids,
  eagerly, in a ``tf.function`` and under XLA: weights and slots match the
  reference after every step, and rows never in a batch keep their bits and
  their slots' initial values;
- dense gradients, including rows whose gradient is zero (RowwiseAdam's ``m``
  and ``v`` decay there; RowwiseAdagrad leaves them bit for bit);
- decoupled weight decay as Keras applies it (every row, before the rule);
- the slots' shapes, their order (``build``'s) and initial values;
- the signatures' defaults, ``get_config``/``from_config`` and Keras
  serialization;
- ``model.fit`` of a tiny Embedding model lowers its loss, and under
  RowwiseAdagrad the rows never looked up keep their bits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.optimizers import RowwiseAdagrad, RowwiseAdam
from pe_testing import as_numpy, assert_bits_equal

KINDS = ("adagrad", "adam")
OPTIMIZER_CLASSES: dict[str, type[keras.optimizers.Optimizer]] = {
    "adagrad": RowwiseAdagrad,
    "adam": RowwiseAdam,
}

#: (rtol, atol) of weights and slots against the float64 reference.
TOLERANCES = {"float32": (1e-5, 1e-5), "float64": (1e-12, 1e-14)}

#: A learning rate exact in float32: Keras keeps the learning rate in a
#: float32 variable, so a float64 variable sees exactly this value.
LEARNING_RATE = 0.0625
STEPS = 3
#: Rows of each sparse case that no batch ever holds.
COLD_ROWS = 2

#: Non-default hyperparameters of the sparse and weight-decay cases. An
#: epsilon this large tells apart where it goes (outside the root; for Adam
#: added to the bias-corrected root) also in float32.
SPARSE_HYPERPARAMETERS: dict[str, dict[str, float]] = {
    "adagrad": {"initial_accumulator_value": 0.125, "epsilon": 1e-3},
    "adam": {"beta_1": 0.8, "beta_2": 0.9, "epsilon": 1e-3},
}


# --- the float64 reference ---------------------------------------------------------


def _row_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a per-row slot: ``[V]`` for rank >= 2, else the variable's."""
    return shape[:1] if len(shape) >= 2 else shape


def _row_mean_square(grad: np.ndarray) -> np.ndarray:
    """``mean_d(g_rd^2)`` per row (per element for rank <= 1)."""
    if grad.ndim <= 1:
        return grad**2
    return np.mean(grad**2, axis=tuple(range(1, grad.ndim)))


def _per_row(values: np.ndarray, ndim: int) -> np.ndarray:
    """A per-row array broadcast against a variable of rank ``ndim``."""
    if ndim <= 1:
        return values
    return values.reshape(values.shape + (1,) * (ndim - 1))


class Reference:
    """RowwiseAdagrad or RowwiseAdam done in float64, as the spec states them.

    The hyperparameters are taken at full float64 precision (a float64
    variable must not see a float32-rounded epsilon or beta), except what
    Keras' base Optimizer itself rounds: the learning rate (a float32
    variable) and ``weight_decay`` (``tf.cast`` of a Python float).
    """

    def __init__(
        self,
        kind: str,
        weights: np.ndarray,
        learning_rate: float = LEARNING_RATE,
        weight_decay: float | None = None,
        initial_accumulator_value: float = 0.0,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float | None = None,
    ) -> None:
        self.kind = kind
        self.weights = np.array(weights, np.float64)
        # Keras keeps the learning rate in a float32 variable.
        self.learning_rate = float(np.float32(learning_rate))
        # Keras' tf.cast(weight_decay, variable.dtype) rounds the Python float
        # to float32 first, also for a float64 variable.
        self.weight_decay = None if weight_decay is None else float(np.float32(weight_decay))
        self.beta_1, self.beta_2 = beta_1, beta_2
        if epsilon is None:
            epsilon = 1e-8 if kind == "adagrad" else 1e-7
        self.epsilon = epsilon
        self.iterations = 0
        rows = _row_shape(self.weights.shape)
        self.accumulator = np.full(rows, initial_accumulator_value, np.float64)
        self.m = np.zeros(self.weights.shape, np.float64)
        self.v = np.zeros(rows, np.float64)

    def step(self, grad: np.ndarray, rows: np.ndarray | None = None) -> None:
        """One step with the dense gradient ``grad`` (duplicates already
        summed), updating the rows where ``rows`` is True (every row when
        None, as for a dense gradient)."""
        grad = np.asarray(grad, np.float64)
        if rows is None:
            rows = np.ones(_row_shape(grad.shape)[0], bool)
        if self.weight_decay is not None:
            self.weights -= self.weights * self.weight_decay * self.learning_rate
        self.iterations += 1
        g = grad[rows]
        mean_square = _row_mean_square(g)
        ndim = grad.ndim
        if self.kind == "adagrad":
            self.accumulator[rows] += mean_square
            denominator = np.sqrt(self.accumulator[rows]) + self.epsilon
            self.weights[rows] -= self.learning_rate * g / _per_row(denominator, ndim)
        else:
            t = self.iterations
            self.v[rows] = self.beta_2 * self.v[rows] + (1 - self.beta_2) * mean_square
            self.m[rows] = self.beta_1 * self.m[rows] + (1 - self.beta_1) * g
            m_hat = self.m[rows] / (1 - self.beta_1**t)
            denominator = np.sqrt(self.v[rows] / (1 - self.beta_2**t)) + self.epsilon
            self.weights[rows] -= self.learning_rate * m_hat / _per_row(denominator, ndim)

    def slots(self) -> dict[str, np.ndarray]:
        """The slots by the names :func:`optimizer_slots` gives them."""
        if self.kind == "adagrad":
            return {"accumulator": self.accumulator}
        return {"m": self.m, "v": self.v}


# --- helpers -------------------------------------------------------------------------


def make_optimizer(kind: str, **kwargs: Any) -> keras.optimizers.Optimizer:
    """A RowwiseAdagrad or RowwiseAdam at ``LEARNING_RATE`` unless told."""
    kwargs.setdefault("learning_rate", LEARNING_RATE)
    return OPTIMIZER_CLASSES[kind](**kwargs)


def optimizer_slots(optimizer: keras.optimizers.Optimizer, index: int = 0) -> dict[str, Any]:
    """The slot variables of the ``index``-th variable (``build``'s order)."""
    if isinstance(optimizer, RowwiseAdagrad):
        return {"accumulator": optimizer._accumulators[index]}
    return {"m": optimizer._momentums[index], "v": optimizer._velocities[index]}


def assert_matches(
    variable: Any,
    optimizer: keras.optimizers.Optimizer,
    reference: Reference,
    dtype: str,
    what: str,
) -> None:
    """The variable and its slots equal the reference within ``TOLERANCES``."""
    rtol, atol = TOLERANCES[dtype]
    actual = {"weights": variable, **optimizer_slots(optimizer)}
    expected = {"weights": reference.weights, **reference.slots()}
    for name, value in actual.items():
        array = as_numpy(value)
        assert array.shape == expected[name].shape, f"{what}: {name} shape"
        np.testing.assert_allclose(
            array.astype(np.float64), expected[name], rtol, atol, err_msg=f"{what}: {name}"
        )


def random_shape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    """A small shape of the given rank, with at least ``COLD_ROWS + 3`` rows."""
    rows = int(rng.integers(COLD_ROWS + 3, COLD_ROWS + 8))
    return (rows, *(int(n) for n in rng.integers(1, 4, size=rank - 1)))


def sparse_batch(
    rng: np.random.Generator, shape: tuple[int, ...], hot_rows: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` ids drawn from ``hot_rows`` (at least one repeated) and their
    float64 gradient values."""
    ids = rng.choice(hot_rows, size=count)
    ids[-1] = ids[0]
    return ids, rng.standard_normal((count, *shape[1:]))


def summed_gradient(
    shape: tuple[int, ...], ids: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The dense gradient of IndexedSlices (duplicates summed) and which rows
    it holds."""
    dense = np.zeros(shape, np.float64)
    np.add.at(dense, ids, values)
    rows = np.zeros(shape[0], bool)
    rows[ids] = True
    return dense, rows


def sparse_applier(
    optimizer: keras.optimizers.Optimizer, variable: keras.Variable, mode: str
) -> Callable[[tf.Tensor, tf.Tensor], Any]:
    """Applies an IndexedSlices gradient of ``variable``: eagerly, in a
    ``tf.function`` (``"function"``) or in one compiled by XLA (``"xla"``)."""
    shape = tuple(variable.shape)

    def apply(values: tf.Tensor, indices: tf.Tensor) -> None:
        dense_shape = tf.constant(shape, dtype=indices.dtype)
        gradient = tf.IndexedSlices(values, indices, dense_shape)
        optimizer.apply_gradients([(gradient, variable)])

    if mode == "eager":
        return apply
    optimizer.build([variable])
    return tf.function(apply, jit_compile=mode == "xla")


def run_sparse_case(
    rng: np.random.Generator,
    kind: str,
    dtype: str,
    rank: int,
    index_dtype: tf.DType,
    mode: str = "eager",
    weight_decay: float | None = None,
) -> None:
    """``STEPS`` IndexedSlices steps against the reference, checked after
    every step; then the rows no batch held (and their slots) bit for bit."""
    shape = random_shape(rng, rank)
    hyperparameters = SPARSE_HYPERPARAMETERS[kind]
    initial = rng.standard_normal(shape).astype(dtype)
    variable = keras.Variable(initial, dtype=dtype)
    optimizer = make_optimizer(kind, weight_decay=weight_decay, **hyperparameters)
    reference = Reference(kind, initial, weight_decay=weight_decay, **hyperparameters)
    apply = sparse_applier(optimizer, variable, mode)
    cold = rng.choice(shape[0], size=COLD_ROWS, replace=False)
    hot = np.setdiff1d(np.arange(shape[0]), cold)
    count = int(rng.integers(3, 7))  # the same every step: one trace
    for step in range(STEPS):
        ids, values = sparse_batch(rng, shape, hot, count)
        values = values.astype(dtype)  # what the optimizer gets
        apply(tf.constant(values), tf.constant(ids, dtype=index_dtype))
        reference.step(*summed_gradient(shape, ids, values.astype(np.float64)))
        assert_matches(variable, optimizer, reference, dtype, f"step {step + 1}")
    assert int(as_numpy(optimizer.iterations)) == STEPS
    if weight_decay is None:
        assert_bits_equal(as_numpy(variable)[cold], initial[cold], "cold rows")
    else:  # Every row decays, the cold ones too.
        assert not np.any(as_numpy(variable)[cold] == initial[cold])
    initial_slots = {
        "accumulator": hyperparameters.get("initial_accumulator_value", 0.0),
        "m": 0.0,
        "v": 0.0,
    }
    for name, slot in optimizer_slots(optimizer).items():
        cold_slot = as_numpy(slot)[cold]
        assert_bits_equal(cold_slot, np.full_like(cold_slot, initial_slots[name]), name)


# --- sparse gradients ------------------------------------------------------------------


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
def test_sparse_steps_match_reference(
    rng: np.random.Generator, kind: str, dtype: str, rank: int, index_dtype: tf.DType
) -> None:
    run_sparse_case(rng, kind, dtype, rank, index_dtype)


@pytest.mark.parametrize(
    ("mode", "index_dtype"), [("function", tf.int32), ("xla", tf.int64)], ids=["function", "xla"]
)
@pytest.mark.parametrize("kind", KINDS)
def test_sparse_steps_in_tf_function(
    rng: np.random.Generator, kind: str, mode: str, index_dtype: tf.DType
) -> None:
    run_sparse_case(rng, kind, "float32", 2, index_dtype, mode=mode)


# --- dense gradients -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", KINDS)
def test_dense_steps_match_reference(rng: np.random.Generator, kind: str, dtype: str) -> None:
    """Default hyperparameters but the learning rate. Row 0's gradient is
    always zero, row 1's only after the first step, other rows' at random."""
    shape = (7, 3)
    initial = rng.standard_normal(shape).astype(dtype)
    variable = keras.Variable(initial, dtype=dtype)
    optimizer = make_optimizer(kind)
    optimizer.build([variable])  # to read the slots before the first step
    reference = Reference(kind, initial)
    for step in range(STEPS):
        grad = rng.standard_normal(shape).astype(dtype)
        zero = rng.random(shape[0]) < 0.3
        zero[:2] = False  # rows 0 and 1 follow their own pattern
        grad[zero] = 0
        grad[0] = 0
        if step > 0:
            grad[1] = 0
        weights_before = as_numpy(variable).copy()
        slots_before = {name: as_numpy(s).copy() for name, s in optimizer_slots(optimizer).items()}
        optimizer.apply_gradients([(tf.constant(grad), variable)])
        reference.step(grad)
        assert_matches(variable, optimizer, reference, dtype, f"step {step + 1}")
        weights = as_numpy(variable)
        assert_bits_equal(weights[0], initial[0], "row 0 (its gradient is always zero)")
        if kind == "adagrad" and step > 0:
            assert_bits_equal(weights[1], weights_before[1], "row 1 (zero gradient)")
        if kind == "adam" and step > 0:
            # A zero-gradient row's moments decay.
            rtol, atol = TOLERANCES[dtype]
            slots = optimizer_slots(optimizer)
            assert np.all(slots_before["m"][1] != 0) and slots_before["v"][1] > 0
            np.testing.assert_allclose(
                as_numpy(slots["m"])[1], 0.9 * slots_before["m"][1], rtol, atol
            )
            np.testing.assert_allclose(
                as_numpy(slots["v"])[1], 0.999 * slots_before["v"][1], rtol, atol
            )
            assert not np.array_equal(weights[1], weights_before[1]), "m moves row 1 still"


# --- weight decay ----------------------------------------------------------------------


@pytest.mark.parametrize("gradient", ["sparse", "dense"])
@pytest.mark.parametrize("kind", KINDS)
def test_weight_decay_is_decoupled(rng: np.random.Generator, kind: str, gradient: str) -> None:
    """``w -= w * weight_decay * lr`` on every row, then the rule."""
    if gradient == "sparse":
        run_sparse_case(rng, kind, "float64", 2, tf.int64, weight_decay=0.01)
        return
    shape = (5, 2)
    initial = rng.standard_normal(shape)
    variable = keras.Variable(initial, dtype="float64")
    optimizer = make_optimizer(kind, weight_decay=0.01)
    reference = Reference(kind, initial, weight_decay=0.01)
    for step in range(STEPS):
        grad = rng.standard_normal(shape)
        grad[0] = 0  # decays, and nothing else
        optimizer.apply_gradients([(tf.constant(grad), variable)])
        reference.step(grad)
        assert_matches(variable, optimizer, reference, "float64", f"step {step + 1}")
    # Row 0 only decays (Keras rounds weight_decay to float32 first).
    decay = (1 - float(np.float32(0.01)) * LEARNING_RATE) ** STEPS
    np.testing.assert_allclose(as_numpy(variable)[0], initial[0] * decay, rtol=1e-12)


# --- slots ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_slot_shapes_and_order(kind: str) -> None:
    """Per-row slots are ``[V]`` (per element for rank 1), ``m`` is the
    variable's shape; one per variable in ``build``'s order; all of them in
    ``optimizer.variables``; Adam's start at zero."""
    variables = [
        keras.Variable(np.zeros((5, 3), np.float32)),
        keras.Variable(np.zeros((4,), np.float32)),
        keras.Variable(np.zeros((6, 2, 3), np.float32)),
    ]
    optimizer = make_optimizer(kind)
    optimizer.build(variables)
    all_variables = {id(v) for v in optimizer.variables}
    for index, variable in enumerate(variables):
        shape = tuple(variable.shape)
        slots = optimizer_slots(optimizer, index)
        expected_shapes = {"accumulator": _row_shape(shape), "m": shape, "v": _row_shape(shape)}
        for name, slot in slots.items():
            assert tuple(slot.shape) == expected_shapes[name], (index, name)
            assert id(slot) in all_variables, (index, name)
            if kind == "adam":
                assert_bits_equal(slot, np.zeros(expected_shapes[name], np.float32), name)


@pytest.mark.parametrize("value", [None, 0.25])
def test_initial_accumulator_value(value: float | None) -> None:
    """The accumulator starts at ``initial_accumulator_value`` (default 0.0)."""
    variable = keras.Variable(np.ones((4, 3), np.float32))
    kwargs = {} if value is None else {"initial_accumulator_value": value}
    optimizer = make_optimizer("adagrad", **kwargs)
    optimizer.build([variable])
    expected = np.full((4,), 0.0 if value is None else value, np.float32)
    assert_bits_equal(optimizer._accumulators[0], expected, "accumulator")


# --- config, serialization, exports ---------------------------------------------------------


DEFAULTS: dict[str, dict[str, Any]] = {
    "adagrad": {
        "learning_rate": 0.001,
        "initial_accumulator_value": 0.0,
        "epsilon": 1e-8,
        "weight_decay": None,
        "clipnorm": None,
        "clipvalue": None,
        "global_clipnorm": None,
        "name": "rowwise_adagrad",
    },
    "adam": {
        "learning_rate": 0.001,
        "beta_1": 0.9,
        "beta_2": 0.999,
        "epsilon": 1e-7,
        "weight_decay": None,
        "clipnorm": None,
        "clipvalue": None,
        "global_clipnorm": None,
        "name": "rowwise_adam",
    },
}

CUSTOM: dict[str, dict[str, Any]] = {
    "adagrad": {
        "learning_rate": 0.25,
        "initial_accumulator_value": 0.5,
        "epsilon": 1e-4,
        "weight_decay": 0.01,
        "clipvalue": 0.75,
        "name": "my_adagrad",
    },
    "adam": {
        "learning_rate": 0.125,
        "beta_1": 0.5,
        "beta_2": 0.75,
        "epsilon": 1e-3,
        "weight_decay": 0.02,
        "global_clipnorm": 1.5,
        "name": "my_adam",
    },
}


def test_exports() -> None:
    assert pe.RowwiseAdagrad is RowwiseAdagrad
    assert pe.RowwiseAdam is RowwiseAdam
    assert issubclass(RowwiseAdagrad, keras.optimizers.Optimizer)
    assert issubclass(RowwiseAdam, keras.optimizers.Optimizer)


@pytest.mark.parametrize("kind", KINDS)
def test_defaults(kind: str) -> None:
    """The signature's defaults, and the config of a default instance."""
    parameters = inspect.signature(OPTIMIZER_CLASSES[kind]).parameters
    defaults = {name: p.default for name, p in parameters.items() if name != "kwargs"}
    assert defaults == DEFAULTS[kind]
    optimizer = OPTIMIZER_CLASSES[kind]()
    assert optimizer.name == DEFAULTS[kind]["name"]
    config = optimizer.get_config()
    for name, value in DEFAULTS[kind].items():
        if isinstance(value, float):
            assert config[name] == pytest.approx(value, rel=1e-7), name
        else:
            assert config[name] == value, name


def _one_step(optimizer: keras.optimizers.Optimizer) -> np.ndarray:
    """The weights after one step with a fixed IndexedSlices gradient."""
    variable = keras.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 7)
    gradient = tf.IndexedSlices(
        tf.constant([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0], [2.0, 2.0, 2.0]]),
        tf.constant([2, 0, 2]),
        tf.constant([4, 3]),
    )
    optimizer.apply_gradients([(gradient, variable)])
    return as_numpy(variable)


@pytest.mark.parametrize("kind", KINDS)
def test_config_round_trip(kind: str) -> None:
    """get_config/from_config, keras.optimizers.get and Keras serialization
    give back the hyperparameters, and an optimizer that steps the same."""
    cls = OPTIMIZER_CLASSES[kind]
    optimizer = cls(**CUSTOM[kind])
    config = optimizer.get_config()
    for name, value in CUSTOM[kind].items():
        assert config[name] == value, name  # all exact in float32
    for name in ("clipnorm", "clipvalue", "global_clipnorm"):
        assert config[name] == CUSTOM[kind].get(name), name

    serialized = keras.saving.serialize_keras_object(optimizer)
    restored = [
        cls.from_config(config),
        keras.saving.deserialize_keras_object(serialized),
        keras.optimizers.get(serialized),
        keras.optimizers.deserialize(serialized),
    ]
    expected_step = _one_step(cls(**CUSTOM[kind]))
    for other in restored:
        assert type(other) is cls
        assert other.get_config() == config
        assert_bits_equal(_one_step(other), expected_step, f"step of {type(other).__name__}")


# --- model.fit -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_model_fit(rng: np.random.Generator, kind: str) -> None:
    """A tiny Embedding + Dense model: the loss falls, and under
    RowwiseAdagrad the rows never looked up keep their bits."""
    vocabulary, width, length, samples, used_rows = 12, 4, 3, 16, 9
    ids = rng.integers(0, used_rows, size=(samples, length)).astype(np.int32)
    targets = rng.standard_normal((samples, 1)).astype(np.float32)
    embedding = keras.layers.Embedding(vocabulary, width)
    model = keras.Sequential(
        [
            keras.Input((length,), dtype="int32"),
            embedding,
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=make_optimizer(kind, learning_rate=0.05), loss="mse", jit_compile=False)
    table_before = as_numpy(embedding.embeddings).copy()
    history = model.fit(ids, targets, batch_size=8, epochs=4, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    table = as_numpy(embedding.embeddings)
    assert not np.array_equal(table[:used_rows], table_before[:used_rows])
    if kind == "adagrad":
        assert_bits_equal(table[used_rows:], table_before[used_rows:], "rows never looked up")
