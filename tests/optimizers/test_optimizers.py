"""Tests of partial_embedding.MaskedOptimizer.

The reference for permitted rows is the stock Keras optimizer applied to a
table that holds only the permitted rows, fed a dense gradient (duplicates
summed), with every permitted row present in every batch, in every table dtype
(within ``TOLERANCES``). Frozen rows and their optimizer slots must come
through ``model.fit`` bit for bit.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
)
from pe_testing import VALUE_DTYPE_NAMES, assert_bits_equal, global_dtype_policy, rotated_cases

VOCAB = 14
WIDTH = 3
IDS_PER_SAMPLE = 5
BATCH = 4
STEPS_PER_EPOCH = 3

RULES = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.8, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.02),
    "adam_amsgrad": lambda: keras.optimizers.Adam(0.02, amsgrad=True),
    # A beta_2 below 1 also in bfloat16 (see _adam_cannot_step).
    "adam_beta_2_0.99": lambda: keras.optimizers.Adam(0.02, beta_2=0.99),
    "adamw": lambda: keras.optimizers.AdamW(0.02, weight_decay=0.2),
    "adagrad": lambda: keras.optimizers.Adagrad(0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "rmsprop_momentum_centered": lambda: keras.optimizers.RMSprop(
        0.01, momentum=0.5, centered=True
    ),
    # Hyperparameters the wrapper must honour as the inner optimizer does.
    "adam_schedule_clipnorm": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5), clipnorm=0.3
    ),
    "sgd_momentum_clipvalue": lambda: keras.optimizers.SGD(0.05, momentum=0.9, clipvalue=0.02),
    "rmsprop_global_clipnorm": lambda: keras.optimizers.RMSprop(0.01, global_clipnorm=0.1),
    "adam_weight_decay": lambda: keras.optimizers.Adam(0.02, weight_decay=0.3),
    "adagrad_weight_decay": lambda: keras.optimizers.Adagrad(0.05, weight_decay=0.3),
}


#: (rtol, atol) of the permitted rows, their slots and the head against the
#: reference, by the model's dtype. Frozen rows and their slots are compared
#: bit for bit in every dtype. float64 has float32's tolerances scaled by the
#: ratio of their epsilons. In float16 and bfloat16 the reference's one-hot
#: matmul sums the gradient of a row's duplicate ids in float32 and rounds
#: once, while MaskedOptimizer sums them in the 16-bit type, rounding after
#: each addition (as tf.math.unsorted_segment_sum and the fused Adam kernel
#: do): about one summed gradient entry in six is an ulp off, which then goes
#: through the slots, the table and the head. Hence 5 to 10 ulps relative
#: and 2 ulps at 1.0 absolute (one ulp of the table's largest values, in
#: [2, 4)); across seeds the largest deviation seen is a quarter of that.
TOLERANCES = {
    "float16": (1e-2, 2e-3),
    "bfloat16": (4e-2, 1.6e-2),
    "float32": (1e-5, 1e-6),
    "float64": (2e-14, 2e-15),
}


def _assert_close(actual, expected, dtype: str, what: str = "") -> None:
    rtol, atol = TOLERANCES[dtype]
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol, atol, err_msg=what
    )


class _SubTableLookup(keras.layers.Layer):
    """Reference lookup: frozen rows constant, permitted rows a [P, D] table.

    The lookup of the sub-table is a one-hot matmul, so its gradient is dense
    (duplicates summed), which is what the stock optimizers handle exactly.
    """

    def __init__(self, table: np.ndarray, permitted: np.ndarray) -> None:
        super().__init__()
        self._frozen = tf.constant(np.where(permitted[:, None], 0.0, table), self.compute_dtype)
        remap = np.full(len(permitted), -1, np.int32)
        remap[np.flatnonzero(permitted)] = np.arange(permitted.sum(), dtype=np.int32)
        self._remap = tf.constant(remap)
        self._size = int(permitted.sum())
        self.sub_table = self.add_weight(
            shape=(self._size, table.shape[1]),
            initializer=keras.initializers.Constant(table[permitted]),
            name="sub_table",
        )

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        one_hot = tf.one_hot(tf.gather(self._remap, ids), self._size, dtype=self.compute_dtype)
        return tf.einsum("bls,sd->bld", one_hot, self.sub_table) + tf.gather(self._frozen, ids)


def _head(name: str) -> list[keras.layers.Layer]:
    return [keras.layers.Flatten(), keras.layers.Dense(1, name=name)]


def _model(lookup: keras.layers.Layer) -> keras.Model:
    inputs = keras.Input((IDS_PER_SAMPLE,), dtype="int32")
    outputs = inputs
    for layer in [lookup, *_head("head")]:
        outputs = layer(outputs)
    return keras.Model(inputs, outputs)


def _problem(rng: np.random.Generator, steps: int = STEPS_PER_EPOCH):
    """A table, a mask, and batches that each hold every permitted id.

    Each batch also holds frozen ids and duplicates.
    """
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    permitted = np.zeros(VOCAB, bool)
    permitted[rng.choice(VOCAB, VOCAB // 2, replace=False)] = True
    batches = []
    for _ in range(steps):
        ids = rng.integers(0, VOCAB, BATCH * IDS_PER_SAMPLE)
        ids[: permitted.sum()] = np.flatnonzero(permitted)
        ids[permitted.sum()] = ids[0]  # a duplicate of a permitted id
        ids[permitted.sum() + 1] = np.flatnonzero(~permitted)[0]  # a frozen id
        batches.append(rng.permutation(ids).reshape(BATCH, IDS_PER_SAMPLE))
    x = np.concatenate(batches).astype(np.int32)
    y = rng.normal(size=(len(x), 1)).astype(np.float32)
    return table, permitted, x, y


def _embedding_slots(optimizer: keras.optimizers.Optimizer, shape) -> list:
    return [v for v in optimizer.variables if tuple(v.shape) == tuple(shape)]


def _initial_slot(name: str, dtype: str) -> np.ndarray:
    """A slot's initial value as Keras sets it: its Constant initializer
    casts the Python number with ``tf.cast``, which makes it a float32 tensor
    first (a float64 accumulator starts at float32(0.1))."""
    return tf.cast(0.1 if "accumulator" in name else 0.0, dtype).numpy()


def _adam_cannot_step(optimizer: keras.optimizers.Optimizer, dtype: str) -> bool:
    """Keras computes Adam's bias correction in the variable's dtype: where
    ``beta_2`` rounds to 1 (0.999 in bfloat16) the step size is 0, so stock
    Adam, and MaskedOptimizer with it, never move the table (weight decay
    aside)."""
    return (
        isinstance(optimizer, keras.optimizers.Adam)
        and not optimizer.weight_decay
        and float(tf.cast(optimizer.beta_2, dtype)) == 1.0
    )


#: The epsilon of the rules that divide by a root in 16-bit runs. Keras'
#: default (1e-7) lies below float16's normal range (6.1e-5): a second moment
#: that underflows to 0 turns the step into up to ``lr * |m| / 1e-7``, so two
#: computations equal in exact arithmetic (the masked table and the
#: sub-table) part by orders of magnitude on a rounding, and the blown-up
#: loss then overflows g**2 (|g| > 256). With 1e-3 the step stays bounded
#: and the comparison measures the library, not float16's range.
SIXTEEN_BIT_EPSILON = 1e-3


def _rule(rule_name: str, dtype: str) -> keras.optimizers.Optimizer:
    """``RULES[rule_name]`` for a run in ``dtype`` (see SIXTEEN_BIT_EPSILON)."""
    optimizer = RULES[rule_name]()
    if dtype in ("float16", "bfloat16") and hasattr(optimizer, "epsilon"):
        optimizer.epsilon = SIXTEEN_BIT_EPSILON
    return optimizer


def _train_pair(rule_name: str, rng: np.random.Generator, dtype: str, epochs: int = 2):
    """Trains the masked model and the sub-table reference on the same data,
    both in ``dtype``."""
    table, permitted, x, y = _problem(rng)
    table = table.astype(tf.as_dtype(dtype).as_numpy_dtype)
    with global_dtype_policy(dtype):
        layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table)
        masked_model = _model(layer)
        reference_model = _model(_SubTableLookup(table, permitted))
    reference_model.get_layer("head").set_weights(masked_model.get_layer("head").get_weights())
    # Full-size slots, whose frozen rows this checks; compact slots are
    # checked against these bit for bit in test_compact_slots.py.
    optimizer = pe.MaskedOptimizer(_rule(rule_name, dtype), compact_slots=False)
    masked_model.compile(optimizer=optimizer, loss="mse")
    masked_model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)

    # The reference trains eagerly (no tracing: keeps the test file fast),
    # on the same batches with the same loss.
    reference_optimizer = _rule(rule_name, dtype)
    loss_fn = keras.losses.MeanSquaredError()
    variables = reference_model.trainable_variables
    for _ in range(epochs):
        for start in range(0, len(x), BATCH):
            with tf.GradientTape() as tape:
                loss = loss_fn(y[start : start + BATCH], reference_model(x[start : start + BATCH]))
            reference_optimizer.apply(tape.gradient(loss, variables), variables)
    return table, permitted, layer, masked_model, reference_model, reference_optimizer


#: Each option meets one 16-bit and one wider dtype, and every dtype about
#: half the options (every rule x dtype pair runs in test_fused_rules.py);
#: Adam also in bfloat16, where beta_2 rounds to 1 and it cannot step, and
#: the option whose beta_2 stays below 1 there.
SUB_TABLE_CASES = rotated_cases(
    sorted(RULES),
    VALUE_DTYPE_NAMES,
    include={"adam": ["bfloat16"], "adam_beta_2_0.99": ["bfloat16"]},
)


@pytest.mark.parametrize(("rule_name", "dtype"), SUB_TABLE_CASES)
def test_frozen_rows_exact_and_permitted_rows_match_stock_on_sub_table(rule_name, dtype, rng):
    table, permitted, layer, masked_model, reference_model, reference_optimizer = _train_pair(
        rule_name, rng, dtype
    )
    optimizer = masked_model.optimizer
    trained = layer.embeddings.numpy()

    # Frozen rows and every slot entry of frozen rows: bit for bit.
    assert_bits_equal(trained[~permitted], table[~permitted])
    slots = _embedding_slots(optimizer, table.shape)
    reference_slots = _embedding_slots(reference_optimizer, (permitted.sum(), WIDTH))
    assert len(slots) == len(reference_slots)
    for slot in slots:
        frozen_part = slot.numpy()[~permitted]
        expected = np.full_like(frozen_part, _initial_slot(slot.name, dtype))
        assert_bits_equal(frozen_part, expected, slot.name)

    # Permitted rows, their slots and the head: as the stock optimizer on the
    # sub-table of permitted rows.
    sub_table = reference_model.layers[1].sub_table.numpy()
    if _adam_cannot_step(reference_optimizer, dtype):
        assert_bits_equal(trained[permitted], table[permitted])
    else:
        assert not np.array_equal(trained[permitted], table[permitted])
    _assert_close(trained[permitted], sub_table, dtype, "table")
    for slot, reference_slot in zip(slots, reference_slots):
        _assert_close(slot.numpy()[permitted], reference_slot.numpy(), dtype, slot.name)
    for ours, theirs in zip(
        masked_model.get_layer("head").get_weights(),
        reference_model.get_layer("head").get_weights(),
    ):
        _assert_close(ours, theirs, dtype, "head")
    assert int(optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH
    assert int(optimizer.iterations.numpy()) == int(reference_optimizer.iterations.numpy())


def test_rows_absent_from_the_batch_keep_values_and_slots(rng):
    table, permitted, x, y = _problem(rng)
    absent = np.flatnonzero(permitted)[0]
    x = np.where(x == absent, np.flatnonzero(permitted)[1], x).astype(np.int32)
    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table)
    model = _model(layer)
    model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.AdamW(0.02)), loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_bits_equal(layer.embeddings.numpy()[absent], table[absent])
    for slot in _embedding_slots(model.optimizer, table.shape):
        assert not slot.numpy()[absent].any(), slot.name


def test_mask_change_mid_training_takes_effect_without_retracing(rng):
    table, permitted, x, y = _problem(rng)
    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table)
    model = _model(layer)
    model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.02)), loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    train_function = model.train_function

    newly_frozen = np.flatnonzero(permitted)[0]
    newly_permitted = np.flatnonzero(~permitted)[0]  # present in every batch
    layer.freeze([newly_frozen])
    layer.unfreeze([newly_permitted])
    before = layer.embeddings.numpy()
    slots_before = [s.numpy() for s in _embedding_slots(model.optimizer, table.shape)]

    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert model.train_function is train_function
    after = layer.embeddings.numpy()
    assert_bits_equal(after[newly_frozen], before[newly_frozen])
    assert not np.array_equal(after[newly_permitted], before[newly_permitted])
    still_frozen = ~permitted
    still_frozen[newly_permitted] = False
    assert_bits_equal(after[still_frozen], table[still_frozen])
    for slot, old in zip(_embedding_slots(model.optimizer, table.shape), slots_before):
        assert_bits_equal(slot.numpy()[newly_frozen], old[newly_frozen])
        assert slot.numpy()[newly_permitted].any()


@pytest.mark.parametrize("rule_name", ["adamw"])
def test_unmasked_variables_train_exactly_as_with_the_inner_optimizer(rule_name, rng):
    table, _, x, y = _problem(rng)
    weights = None
    results = []
    for wrap in (False, True):
        model = _model(keras.layers.Embedding(VOCAB, WIDTH, weights=[table]))
        if weights is None:
            weights = model.get_weights()
        model.set_weights(weights)
        inner = RULES[rule_name]()
        model.compile(optimizer=pe.MaskedOptimizer(inner) if wrap else inner, loss="mse")
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        results.append(model.get_weights() + [v.numpy() for v in inner.variables])
    assert len(results[0]) == len(results[1])
    for plain, wrapped in zip(*results):
        np.testing.assert_array_equal(plain, wrapped)


def test_row_masks_on_a_keras_embedding_match_partial_embedding(rng):
    table, permitted, x, y = _problem(rng)
    mask = tf.Variable(permitted, trainable=False)
    embedding = keras.layers.Embedding(VOCAB, WIDTH, weights=[table])
    keras_model = _model(embedding)
    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table)
    partial_model = _model(layer)
    partial_model.get_layer("head").set_weights(keras_model.get_layer("head").get_weights())
    keras_model.compile(
        optimizer=pe.MaskedOptimizer(
            keras.optimizers.Adam(0.02, clipnorm=0.5),
            row_masks=[(embedding.embeddings, mask)],
        ),
        loss="mse",
    )
    partial_model.compile(
        optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.02, clipnorm=0.5)),
        loss="mse",
    )
    for model in (keras_model, partial_model):
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    trained = embedding.embeddings.numpy()
    assert_bits_equal(trained[~permitted], table[~permitted])
    # The Keras lookup also sends frozen rows' gradient to the head, so the
    # heads differ slightly only through rounding: the row updates agree.
    np.testing.assert_allclose(trained, layer.embeddings.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key_kind", ["pair", "ref", "path"])
def test_row_masks_forms_and_dense_gradient(key_kind, rng):
    initial = rng.normal(size=(6, 2)).astype(np.float32)
    table = keras.Variable(initial, name="table")
    permitted = np.array([True, False, True, False, True, True])
    key = {"pair": None, "ref": table.value.ref(), "path": table.path}[key_kind]
    row_masks = [(table, permitted)] if key is None else {key: permitted}
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), row_masks=row_masks)
    # A dense gradient: every permitted row counts as present.
    optimizer.apply([tf.constant(rng.normal(size=(6, 2)), tf.float32)], [table])
    assert optimizer.is_masked(table)
    after = table.numpy()
    assert_bits_equal(after[~permitted], initial[~permitted])
    assert (after[permitted] != initial[permitted]).all()


def test_loss_scale_optimizer_inside_and_around_match_plain(rng):
    """Power-of-two loss scaling is exact in float32: all three agree."""
    table, permitted, x, y = _problem(rng)
    results = []
    head = None
    for kind in ("plain", "inside", "around"):
        layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table)
        model = _model(layer)
        if head is None:
            head = model.get_layer("head").get_weights()
        model.get_layer("head").set_weights(head)
        inner = keras.optimizers.Adam(0.02)
        if kind == "plain":
            optimizer = pe.MaskedOptimizer(inner)
        elif kind == "inside":
            optimizer = pe.MaskedOptimizer(keras.optimizers.LossScaleOptimizer(inner))
        else:
            optimizer = keras.optimizers.LossScaleOptimizer(pe.MaskedOptimizer(inner))
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        assert int(optimizer.iterations.numpy()) == STEPS_PER_EPOCH
        results.append(layer.embeddings.numpy())
    for trained in results:
        assert_bits_equal(trained[~permitted], table[~permitted])
        np.testing.assert_allclose(trained, results[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("placement", ["around", "inside"])
def test_mixed_float16_keeps_frozen_rows_exact(placement, rng):
    table, permitted, x, y = _problem(rng)
    with global_dtype_policy("mixed_float16"):
        layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table)
        model = _model(layer)
        inner = keras.optimizers.Adam(0.02)
        if placement == "around":
            # What compile does by itself, with a small scale: no skipped steps.
            optimizer = keras.optimizers.LossScaleOptimizer(
                pe.MaskedOptimizer(inner), initial_scale=8.0
            )
        else:
            optimizer = pe.MaskedOptimizer(
                keras.optimizers.LossScaleOptimizer(inner, initial_scale=8.0)
            )
        model.compile(optimizer=optimizer, loss="mse", auto_scale_loss=False)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        wrapped = _model(pe.PartialEmbedding(VOCAB, WIDTH))
        wrapped.compile(optimizer=pe.MaskedOptimizer("adam"), loss="mse")
        assert isinstance(wrapped.optimizer, keras.optimizers.LossScaleOptimizer)
    trained = layer.embeddings.numpy()
    assert_bits_equal(trained[~permitted], table[~permitted])
    assert not np.array_equal(trained[permitted], table[permitted])
    assert int(optimizer.iterations.numpy()) == STEPS_PER_EPOCH


def test_save_and_load_resumes_training(tmp_path, rng):
    table, permitted, x, y = _problem(rng)
    layer = pe.PartialEmbedding(VOCAB, WIDTH, trainable_ids=permitted, weights=table)
    model = _model(layer)
    model.compile(
        optimizer=pe.MaskedOptimizer(keras.optimizers.AdamW(0.02, weight_decay=0.1)),
        loss="mse",
    )
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)

    assert isinstance(loaded.optimizer, pe.MaskedOptimizer)
    assert isinstance(loaded.optimizer.inner_optimizer, keras.optimizers.AdamW)
    assert int(loaded.optimizer.iterations.numpy()) == STEPS_PER_EPOCH
    assert len(loaded.optimizer.variables) == len(model.optimizer.variables)
    for ours, theirs in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())

    for m in (model, loaded):
        m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for ours, theirs in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    resumed = loaded.layers[1].embeddings.numpy()
    assert_bits_equal(resumed[~permitted], table[~permitted])
    assert int(loaded.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH


def test_config_round_trip():
    optimizer = pe.MaskedOptimizer(
        keras.optimizers.RMSprop(0.03, momentum=0.2, centered=True, clipnorm=1.5),
        name="masked",
    )
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored, pe.MaskedOptimizer)
    assert restored.name == "masked"
    inner = restored.inner_optimizer
    assert isinstance(inner, keras.optimizers.RMSprop)
    assert (inner.momentum, inner.centered, inner.clipnorm) == (0.2, True, 1.5)
    assert restored.get_config() == optimizer.get_config()
    assert isinstance(pe.MaskedOptimizer("adam").inner_optimizer, keras.optimizers.Adam)


class _MyAdam(keras.optimizers.Adam):
    pass


@pytest.mark.parametrize(
    "make_inner",
    [
        lambda: keras.optimizers.Lion(),
        lambda: keras.optimizers.Adadelta(),
        lambda: _MyAdam(),
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Nadam()),
    ],
)
def test_unsupported_inner_optimizer_is_rejected_naming_the_supported(make_inner):
    with pytest.raises(PartialEmbeddingTypeError, match="SGD.*Adam.*AdamW.*Adagrad.*RMSprop"):
        pe.MaskedOptimizer(make_inner())


def test_unsupported_options_are_rejected():
    with pytest.raises(PartialEmbeddingArgumentError, match="use_ema"):
        pe.MaskedOptimizer(keras.optimizers.Adam(use_ema=True))
    with pytest.raises(PartialEmbeddingArgumentError, match="gradient_accumulation"):
        pe.MaskedOptimizer(keras.optimizers.Adam(gradient_accumulation_steps=2))
    table = keras.Variable(np.zeros((4, 2), np.float32))
    optimizer = pe.MaskedOptimizer(keras.optimizers.SGD(), row_masks=[(table, np.ones(3, bool))])
    with pytest.raises(PartialEmbeddingArgumentError, match="shape"):
        optimizer.build([table])
