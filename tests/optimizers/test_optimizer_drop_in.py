"""MaskedOptimizer as a drop-in for the optimizer it wraps (issue #14).

- ``exclude_from_weight_decay`` called on the wrapper takes effect, masked
  tables included, exactly as when called on the inner optimizer first.
- A row mask given as a NumPy array or a tensor survives every retrace of a
  training step (``model.fit`` then ``train_on_batch`` or a recompiled
  ``fit``; a ``tf.function`` loop traced for two batch sizes).
- ``clipnorm``, ``clipvalue`` and ``global_clipnorm`` read and set on the
  wrapper are the inner optimizer's, and a clipped step equals the inner
  optimizer's clipped step on the permitted rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import assert_bits_equal

VOCAB = 8
WIDTH = 3
FROZEN_ROWS = (0, 5)


def _row_mask() -> np.ndarray:
    mask = np.ones(VOCAB, bool)
    mask[list(FROZEN_ROWS)] = False
    return mask


# --- exclude_from_weight_decay ------------------------------------------------------

DECAYING = {
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.2),
    "sgd": lambda: keras.optimizers.SGD(0.05, weight_decay=0.2),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.5, weight_decay=0.2),
    "loss_scale_adamw": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.AdamW(0.05, weight_decay=0.2), initial_scale=4.0
    ),
}


def _decay_variables(rng: np.random.Generator) -> dict[str, keras.Variable]:
    """Two masked tables and a dense layer's kernel and bias, by name."""

    def variable(shape: tuple[int, ...], name: str) -> keras.Variable:
        return keras.Variable(rng.uniform(1.0, 2.0, shape).astype(np.float32), name=name)

    return {
        "excluded_table": variable((VOCAB, WIDTH), "excluded_table"),
        "decayed_table": variable((VOCAB, WIDTH), "decayed_table"),
        "excluded_kernel": variable((WIDTH, 2), "excluded_kernel"),
        "decayed_bias": variable((2,), "decayed_bias"),
    }


def _gradients(rng: np.random.Generator, zero: bool) -> list[Any]:
    """Gradients of ``_decay_variables``: sparse for the tables (a frozen row
    and a duplicate included), dense for the others."""

    def values(shape: tuple[int, ...]) -> tf.Tensor:
        drawn = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
        return tf.constant(np.zeros_like(drawn) if zero else drawn)

    ids = tf.constant([1, FROZEN_ROWS[0], 3, 1, 6])
    table_gradient = [
        tf.IndexedSlices(values((5, WIDTH)), ids, tf.constant([VOCAB, WIDTH])) for _ in range(2)
    ]
    return [*table_gradient, values((WIDTH, 2)), values((2,))]


def _train_with_exclusion(
    make_inner: Callable[[], Any],
    exclude: Callable[[Any, dict[str, keras.Variable]], None],
    on_wrapper: bool,
    zero_gradients: bool,
    rng_seed: int,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rng_seed)
    variables = _decay_variables(rng)
    masks = [(variables[name], _row_mask()) for name in ("excluded_table", "decayed_table")]
    inner = make_inner()
    if not on_wrapper:
        # On the optimizer that decays: Keras' LossScaleOptimizer keeps an
        # exclusion called on it to itself.
        decaying = (
            inner.inner_optimizer
            if isinstance(inner, keras.optimizers.LossScaleOptimizer)
            else inner
        )
        exclude(decaying, variables)
    optimizer = pe.MaskedOptimizer(inner, row_masks=masks)
    if on_wrapper:
        exclude(optimizer, variables)
    for _ in range(3):
        optimizer.apply(_gradients(rng, zero_gradients), list(variables.values()))
    return {name: variable.numpy() for name, variable in variables.items()}


EXCLUSIONS = {
    "var_list": lambda optimizer, variables: optimizer.exclude_from_weight_decay(
        var_list=[variables["excluded_table"], variables["excluded_kernel"]]
    ),
    "var_names": lambda optimizer, variables: optimizer.exclude_from_weight_decay(
        var_names=["excluded"]
    ),
}


@pytest.mark.parametrize("exclusion", sorted(EXCLUSIONS))
@pytest.mark.parametrize("rule", sorted(DECAYING))
def test_exclude_from_weight_decay_on_wrapper_equals_on_inner_first(rule, exclusion, rng):
    seed = int(rng.integers(2**31))
    for zero_gradients in (False, True):
        results = [
            _train_with_exclusion(
                DECAYING[rule], EXCLUSIONS[exclusion], on_wrapper, zero_gradients, seed
            )
            for on_wrapper in (False, True)
        ]
        for name in results[0]:
            assert_bits_equal(results[1][name], results[0][name], f"{name} ({zero_gradients=})")


@pytest.mark.parametrize("exclusion", sorted(EXCLUSIONS))
@pytest.mark.parametrize("rule", sorted(DECAYING))
def test_excluded_variables_do_not_decay(rule, exclusion, rng):
    """With zero gradients only weight decay moves a variable: the excluded
    ones stay as they were, the others (their permitted rows) shrink."""
    seed = int(rng.integers(2**31))
    initial = {
        name: variable.numpy()
        for name, variable in _decay_variables(np.random.default_rng(seed)).items()
    }
    trained = _train_with_exclusion(DECAYING[rule], EXCLUSIONS[exclusion], True, True, seed)
    permitted = _row_mask()
    assert_bits_equal(trained["excluded_table"], initial["excluded_table"], "excluded table")
    assert_bits_equal(trained["excluded_kernel"], initial["excluded_kernel"], "excluded kernel")
    assert_bits_equal(
        trained["decayed_table"][~permitted], initial["decayed_table"][~permitted], "frozen rows"
    )
    # Weight decay touches only the rows a step updates (those in the gradient).
    updated = sorted({1, 3, 6})
    assert np.all(trained["decayed_table"][updated] < initial["decayed_table"][updated])
    assert np.all(trained["decayed_bias"] < initial["decayed_bias"])


def test_exclude_from_weight_decay_after_build_is_rejected():
    table = keras.Variable(np.ones((VOCAB, WIDTH), np.float32))
    optimizer = pe.MaskedOptimizer(keras.optimizers.AdamW(0.1), row_masks=[(table, _row_mask())])
    optimizer.build([table])
    with pytest.raises(ValueError, match="before the optimizer is built"):
        optimizer.exclude_from_weight_decay(var_list=[table])


# --- row masks given as NumPy arrays or tensors -------------------------------------

MASK_FORMS = {
    "numpy": _row_mask,
    "tensor": lambda: tf.constant(_row_mask()),
    "variable": lambda: keras.Variable(_row_mask(), trainable=False),
}


def _embedding_model() -> tuple[keras.Model, keras.layers.Embedding]:
    ids = keras.Input((4,), dtype="int32")
    embedding = keras.layers.Embedding(VOCAB, WIDTH)
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(embedding(ids)))
    return keras.Model(ids, outputs), embedding


def _fit_data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    # Every row, frozen ones included, occurs in the batches.
    ids = np.concatenate([np.arange(VOCAB), rng.integers(0, VOCAB, 36 - VOCAB)])
    return ids.reshape(9, 4).astype(np.int32), rng.normal(size=(9, 1)).astype(np.float32)


def _fit_and_retrace(mask_form: str, clipnorm: float | None, seed: int) -> tuple[np.ndarray, ...]:
    keras.utils.set_random_seed(seed)
    model, embedding = _embedding_model()
    initial = embedding.embeddings.numpy()
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.Adam(0.05, clipnorm=clipnorm),
        row_masks=[(embedding.embeddings, MASK_FORMS[mask_form]())],
    )
    model.compile(optimizer, "mse")
    ids, targets = _fit_data(np.random.default_rng(seed))
    model.fit(ids, targets, batch_size=4, epochs=2, verbose=0, shuffle=False)
    model.evaluate(ids, targets, verbose=0)
    # A second trace of a training step: train_on_batch builds its own.
    model.train_on_batch(ids, targets)
    # And a recompiled fit traces again.
    model.compile(optimizer, "mse", jit_compile=False)
    model.fit(ids, targets, batch_size=4, epochs=1, verbose=0, shuffle=False)
    return initial, embedding.embeddings.numpy(), model.layers[-1].kernel.numpy()


@pytest.mark.parametrize("clipnorm", [None, 1.0], ids=["no_clip", "clipnorm"])
@pytest.mark.parametrize("mask_form", ["numpy", "tensor"])
def test_constant_row_mask_survives_retraces_of_fit(mask_form, clipnorm, rng):
    seed = int(rng.integers(2**31))
    initial, trained, head = _fit_and_retrace(mask_form, clipnorm, seed)
    frozen = list(FROZEN_ROWS)
    assert_bits_equal(trained[frozen], initial[frozen], "frozen rows")
    permitted = _row_mask()
    assert np.all(np.any(trained[permitted] != initial[permitted], axis=1))
    # The same training as with the mask given as a variable.
    _, trained_by_variable, head_by_variable = _fit_and_retrace("variable", clipnorm, seed)
    assert_bits_equal(trained, trained_by_variable, "table")
    assert_bits_equal(head, head_by_variable, "head")


@pytest.mark.parametrize("clipnorm", [None, 1.0], ids=["no_clip", "clipnorm"])
@pytest.mark.parametrize("mask_form", ["numpy", "tensor"])
def test_constant_row_mask_in_tf_function_loop_traced_twice(mask_form, clipnorm, rng):
    table = keras.Variable(rng.normal(size=(VOCAB, WIDTH)).astype(np.float32))
    initial = table.numpy()
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.5, clipnorm=clipnorm),
        row_masks=[(table, MASK_FORMS[mask_form]())],
    )

    @tf.function
    def step(ids: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.gather(table, ids) - 3.0))
        optimizer.apply(tape.gradient(loss, [table]), [table])

    all_ids = np.arange(VOCAB, dtype=np.int32)
    for ids in (all_ids, all_ids[:5], all_ids, all_ids[:5]):  # two input signatures
        step(tf.constant(ids))
    # Two signatures (the first call, which builds the optimizer, may trace twice).
    assert step.experimental_get_tracing_count() >= 2
    frozen = list(FROZEN_ROWS)
    assert_bits_equal(table.numpy()[frozen], initial[frozen], "frozen rows")
    permitted = _row_mask()
    assert np.all(np.any(table.numpy()[permitted] != initial[permitted], axis=1))


# --- clipnorm, clipvalue, global_clipnorm --------------------------------------------

CLIP_OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm")


@pytest.mark.parametrize("loss_scale", [False, True], ids=["plain", "loss_scale"])
@pytest.mark.parametrize("option", CLIP_OPTIONS)
def test_clip_options_read_the_inner_optimizer(option, loss_scale):
    inner = keras.optimizers.SGD(1.0, **{option: 0.1})
    wrapped = keras.optimizers.LossScaleOptimizer(inner) if loss_scale else inner
    optimizer = pe.MaskedOptimizer(wrapped)
    for name in CLIP_OPTIONS:
        assert getattr(optimizer, name) == (0.1 if name == option else None), name
    # Setting one on the wrapper sets it on the optimizer whose rule runs.
    setattr(optimizer, option, 0.25)
    assert getattr(inner, option) == 0.25
    assert getattr(optimizer, option) == 0.25


def _clipped_step_variables(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    # Integer-valued gradients: every sum of squares is exact, so the norms
    # do not depend on the order of summation.
    table_values = rng.integers(-3, 4, (6, WIDTH)).astype(np.float32)
    bias = rng.integers(-3, 4, (WIDTH,)).astype(np.float32)
    return table_values, bias


@pytest.mark.parametrize("set_on_wrapper", [False, True], ids=["constructor", "wrapper_setter"])
@pytest.mark.parametrize(
    "option, value", [("clipnorm", 1.5), ("clipvalue", 0.5), ("global_clipnorm", 2.0)]
)
def test_clipped_step_equals_inner_clipped_step_on_permitted_rows(
    option, value, set_on_wrapper, rng
):
    initial_table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    initial_bias = rng.normal(size=(WIDTH,)).astype(np.float32)
    gradient_values, bias_gradient = _clipped_step_variables(rng)
    # Unique ids, one of them frozen: the wrapper clips the permitted rows'
    # gradient, so the reference is fed the gradient with the frozen row zeroed.
    ids = np.array([1, 2, FROZEN_ROWS[1], 4, 6, 7])
    permitted = _row_mask()
    reference_gradient = np.zeros((VOCAB, WIDTH), np.float32)
    reference_gradient[ids] = gradient_values * permitted[ids][:, None]

    table = keras.Variable(initial_table)
    bias = keras.Variable(initial_bias)
    inner = (
        keras.optimizers.SGD(0.1)
        if set_on_wrapper
        else keras.optimizers.SGD(0.1, **{option: value})
    )
    optimizer = pe.MaskedOptimizer(inner, row_masks=[(table, _row_mask())])
    if set_on_wrapper:
        setattr(optimizer, option, value)
    optimizer.apply(
        [
            tf.IndexedSlices(
                tf.constant(gradient_values), tf.constant(ids), tf.constant([VOCAB, WIDTH])
            ),
            tf.constant(bias_gradient),
        ],
        [table, bias],
    )

    reference_table = keras.Variable(initial_table)
    reference_bias = keras.Variable(initial_bias)
    keras.optimizers.SGD(0.1, **{option: value}).apply(
        [tf.constant(reference_gradient), tf.constant(bias_gradient)],
        [reference_table, reference_bias],
    )
    assert_bits_equal(
        table.numpy()[permitted], reference_table.numpy()[permitted], "permitted rows"
    )
    assert_bits_equal(table.numpy()[~permitted], initial_table[~permitted], "frozen rows")
    assert_bits_equal(bias.numpy(), reference_bias.numpy(), "bias")
    # The clipping did something: an unclipped step differs.
    unclipped = keras.Variable(initial_table)
    keras.optimizers.SGD(0.1).apply([tf.constant(reference_gradient)], [unclipped])
    assert not np.array_equal(unclipped.numpy()[permitted], table.numpy()[permitted])
