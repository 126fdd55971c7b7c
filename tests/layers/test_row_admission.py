"""Row admission (``pe.RowAdmission``): the layer's counting, admission and
eviction decisions against a plain-Python reference, its arguments, its
saved state and its reads.

The reference below restates the rules of docs/row_admission.md one row at a
time; the layer must take the same decisions, step by step, over a Zipf id
stream, eagerly, in a ``tf.function`` and under XLA.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import assert_bits_equal


class AdmissionReference:
    """The admission rules, one row at a time."""

    def __init__(self, candidates, min_count, capacity, eviction):
        self.candidates = np.asarray(candidates, bool)
        self.min_count = min_count
        self.capacity = capacity
        self.eviction = eviction
        self.counts = np.zeros(len(candidates), np.int64)
        self.last_seen = np.zeros(len(candidates), np.int64)
        self.step = 0
        self.admitted: set[int] = set()

    def observe(self, ids):
        """One training batch; returns (admitted now, evicted now)."""
        self.step += 1
        rows = sorted({int(i) for i in np.ravel(ids) if self.candidates[i]})
        for row in rows:
            self.counts[row] += 1
            self.last_seen[row] = self.step
        wanting = [r for r in rows if r not in self.admitted and self.counts[r] >= self.min_count]
        evicted: list[int] = []
        if self.capacity is not None and len(wanting) > self.capacity - len(self.admitted):
            in_batch = set(rows)
            evictable = [r for r in self.admitted if r not in in_batch]
            if self.eviction == "lfu":
                evictable.sort(key=lambda r: (self.counts[r], self.last_seen[r], r))
            else:
                evictable.sort(key=lambda r: (self.last_seen[r], r))
            needed = len(wanting) - (self.capacity - len(self.admitted))
            evicted = evictable[: min(needed, len(evictable))]
            for row in evicted:
                self.admitted.remove(row)
                self.counts[row] = 0
            wanting.sort(key=lambda r: (-self.counts[r], r))
            wanting = wanting[: self.capacity - len(self.admitted)]
        self.admitted.update(wanting)
        return sorted(wanting), sorted(evicted)


def zipf_stream(rng, num_rows, steps, batch, exponent=1.3):
    """``steps`` batches of ``batch`` ids, Zipf-distributed over a random
    order of the rows (hot rows anywhere in the table)."""
    order = rng.permutation(num_rows)
    draws = rng.zipf(exponent, size=(steps, batch)) - 1
    return order[draws % num_rows]


def _state(layer):
    state = layer._admission_state
    return (
        np.asarray(state.admitted.numpy()),
        np.asarray(state.counts.numpy()),
        np.asarray(state.last_seen.numpy()),
    )


SETTINGS = [
    dict(min_count=1, capacity=None, eviction="lfu"),
    dict(min_count=3, capacity=None, eviction="lfu"),
    dict(min_count=2, capacity=20, eviction="lfu"),
    dict(min_count=2, capacity=20, eviction="lru"),
    dict(min_count=1, capacity=7, eviction="lru"),
    dict(min_count=4, capacity=40, eviction="lfu"),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_decisions_equal_the_reference_over_a_zipf_stream(setting, rng):
    num_rows, steps = 300, 1000
    candidates = rng.random(num_rows) < 0.7
    stream = zipf_stream(rng, num_rows, steps, 16)
    layer = pe.PartialEmbedding(
        num_rows, 2, trainable_ids=candidates, admission=pe.RowAdmission(**setting)
    )
    layer.build()
    reference = AdmissionReference(candidates, **setting)
    step = tf.function(lambda ids: layer(ids, training=True))
    evictions = 0
    for number, ids in enumerate(stream):
        step(tf.constant(ids, tf.int64 if number % 2 else tf.int32))
        _, evicted = reference.observe(ids)
        evictions += len(evicted)
        admitted, counts, last_seen = _state(layer)
        assert set(np.flatnonzero(admitted)) == reference.admitted, f"step {number + 1}"
        np.testing.assert_array_equal(counts, reference.counts, err_msg=f"step {number + 1}")
        np.testing.assert_array_equal(last_seen, reference.last_seen)
        if setting["capacity"] is not None:
            assert len(reference.admitted) <= setting["capacity"]
    state = layer._admission_state
    assert int(state.admitted_count.numpy()) == len(reference.admitted)
    if state.admitted_list is not None:
        listed = state.admitted_list.numpy()
        assert sorted(listed[listed >= 0].tolist()) == sorted(reference.admitted)
        assert np.all(listed[len(reference.admitted) :] == -1)
    if setting["capacity"] is not None and setting["capacity"] < 30:
        assert evictions > 0  # The stream exercised eviction.
    np.testing.assert_array_equal(layer.admitted_ids, sorted(reference.admitted))
    ids = np.arange(num_rows)
    np.testing.assert_array_equal(layer.row_counts(ids), reference.counts)


@pytest.mark.parametrize("eviction", ["lfu", "lru"])
def test_decisions_under_xla_and_eagerly_equal_the_reference(eviction, rng):
    num_rows, steps = 120, 150
    candidates = rng.random(num_rows) < 0.8
    stream = zipf_stream(rng, num_rows, steps, 12)
    setting = dict(min_count=2, capacity=9, eviction=eviction)
    layers = []
    for _ in range(2):
        layer = pe.PartialEmbedding(
            num_rows, 2, trainable_ids=candidates, admission=pe.RowAdmission(**setting)
        )
        layer.build()
        layers.append(layer)
    compiled = tf.function(lambda ids: layers[0](ids, training=True), jit_compile=True)
    reference = AdmissionReference(candidates, **setting)
    for ids in stream:
        compiled(tf.constant(ids))
        layers[1](ids, training=True)
        reference.observe(ids)
        for layer in layers:
            assert set(layer.admitted_ids.tolist()) == reference.admitted
    np.testing.assert_array_equal(layers[0].row_counts(np.arange(num_rows)), reference.counts)
    np.testing.assert_array_equal(layers[1].row_counts(np.arange(num_rows)), reference.counts)


def test_inference_calls_do_not_count():
    layer = pe.PartialEmbedding(10, 2, admission=pe.RowAdmission(min_count=1))
    layer(np.array([1, 2]))
    layer(np.array([1, 2]), training=False)
    assert layer.admitted_ids.tolist() == []
    assert layer.row_counts([1, 2]).tolist() == [0, 0]
    layer(np.array([1, 2, 2]), training=True)
    assert layer.admitted_ids.tolist() == [1, 2]
    assert layer.row_counts([1, 2]).tolist() == [1, 1]


def test_only_candidates_count_and_are_admitted():
    layer = pe.PartialEmbedding(6, 2, trainable_ids=[1, 2], admission=pe.RowAdmission())
    layer(np.array([0, 1, 3]), training=True)
    assert layer.admitted_ids.tolist() == [1]
    assert layer.row_counts(np.arange(6)).tolist() == [0, 1, 0, 0, 0, 0]
    layer.unfreeze([3])
    layer(np.array([[3, 3]]), training=True)
    assert layer.admitted_ids.tolist() == [1, 3]


def test_unadmitted_rows_get_no_gradient():
    layer = pe.PartialEmbedding(6, 2, admission=pe.RowAdmission(min_count=2))
    layer.build()
    ids = tf.constant([1, 2, 2])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids, training=True))
    gradient = tf.convert_to_tensor(tape.gradient(loss, layer.embeddings.value))
    assert np.count_nonzero(gradient.numpy()) == 0
    # Row 2 was seen twice in one batch: one batch, count 1.
    assert layer.row_counts([1, 2]).tolist() == [1, 1]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([2, 3]), training=True))
    gradient = tf.convert_to_tensor(tape.gradient(loss, layer.embeddings.value)).numpy()
    # Row 2's count reached 2 in this batch, which already trains it.
    assert np.flatnonzero(np.abs(gradient).sum(1)).tolist() == [2]


def test_freezing_an_admitted_row_makes_it_leave():
    layer = pe.PartialEmbedding(8, 2, admission=pe.RowAdmission(min_count=1, capacity=4))
    layer(np.array([1, 2, 3]), training=True)
    layer.freeze([2])
    assert layer.admitted_ids.tolist() == [1, 3]
    assert layer.row_counts([2]).tolist() == [0]
    state = layer._admission_state
    assert int(state.admitted_count.numpy()) == 2
    assert state.admitted_list.numpy().tolist() == [1, 3, -1, -1]
    # Not recorded as evicted: an optimizer's compact slots release it at
    # once, told of the mask change (tests/optimizers/test_row_admission_training.py).
    assert int(state.evicted_count.numpy()) == 0
    layer(np.array([2, 4, 5, 6]), training=False)
    layer(np.array([4, 5]), training=True)
    assert layer.admitted_ids.tolist() == [1, 3, 4, 5]


# -- bags, tied reversible, ragged -------------------------------------------------


def test_bag_ids_count_without_padding():
    layer = pe.PartialEmbedding(
        10, 2, combiner="sum", mask_zero=True, admission=pe.RowAdmission(min_count=1)
    )
    layer(np.array([[0, 3, 3], [4, 0, 0]]), training=True)
    assert layer.admitted_ids.tolist() == [3, 4]
    assert layer.row_counts([0, 3, 4]).tolist() == [0, 1, 1]
    ragged = tf.ragged.constant([[5], [6, 5]])
    layer(ragged, training=True)
    assert layer.admitted_ids.tolist() == [3, 4, 5, 6]


def test_ragged_ids_count():
    layer = pe.PartialEmbedding(10, 2, admission=pe.RowAdmission(min_count=1))
    layer(tf.ragged.constant([[1], [2, 1]]), training=True)
    assert layer.admitted_ids.tolist() == [1, 2]
    assert layer.row_counts([1, 2]).tolist() == [1, 1]


def test_tied_reversible_layer_admits_its_table():
    layer = pe.PartialReversibleEmbedding(
        8, 2, trainable_ids=[5, 6], admission=pe.RowAdmission(min_count=1)
    )
    layer.build()
    with tf.GradientTape() as tape:
        hidden = layer(np.array([[5, 1]]), training=True)
        logits = layer(hidden, reverse=True)
        loss = tf.reduce_sum(logits**2)
    gradient = tf.convert_to_tensor(tape.gradient(loss, layer.embeddings.value)).numpy()
    # Row 6 is a candidate but not admitted: no gradient from the logits either.
    assert np.flatnonzero(np.abs(gradient).sum(1)).tolist() == [5]
    assert layer.admitted_ids.tolist() == [5]


# -- arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, pattern",
    [
        (dict(min_count=0), r"min_count: must be >= 1, got 0"),
        (dict(min_count=-2), r"min_count: must be >= 1, got -2"),
        (dict(min_count=1.5), r"min_count: expected an integer >= 1, got 1.5"),
        (dict(min_count=True), r"min_count: expected an integer >= 1, got True"),
        (dict(capacity=0), r"capacity: must be >= 1, got 0"),
        (dict(capacity="10"), r"capacity: expected None or an integer >= 1, got '10'"),
        (dict(eviction="fifo"), r"eviction: expected one of \('lfu', 'lru'\), got 'fifo'"),
        (dict(on_evict="drop"), r"on_evict: expected one of \('keep', 'reinitialize'\)"),
    ],
)
def test_bad_arguments_are_named(arguments, pattern):
    with pytest.raises(ValueError, match=pattern):
        pe.RowAdmission(**arguments)


def test_admission_of_another_type_is_refused():
    with pytest.raises(TypeError, match=r"admission: expected None or a partial_embedding.Row"):
        pe.PartialEmbedding(4, 2, admission=3)


def test_an_id_out_of_range_writes_nothing():
    layer = pe.PartialEmbedding(6, 2, admission=pe.RowAdmission(min_count=1, capacity=3))
    layer(np.array([1]), training=True)
    before = [np.array(v.numpy()) for v in layer.weights]

    def eager(ids):
        return layer(ids, training=True)

    traced = tf.function(eager)
    # Eagerly admission's own message; in a graph whichever check runs first
    # (admission's bounds-checked read, or the lookup's).
    message = r"(6.* is not in \[0, 6\)|ids must be in \[0, V\))"
    for call in (eager, traced):
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
            call(tf.constant([2, 6, 3]))
        for variable, value in zip(layer.weights, before):
            assert_bits_equal(variable.numpy(), value, variable.name)
    with pytest.raises(ValueError, match=r"ids: id -1 \(at position 0\) is not in \[0, 6\)"):
        eager(tf.constant([-1]))


def test_int8_quantization_is_refused():
    layer = pe.PartialEmbedding(6, 2, admission=pe.RowAdmission())
    layer.build()
    with pytest.raises(ValueError, match="quantize: layer .* has row admission"):
        layer.quantize("int8")
    with pytest.raises(ValueError, match="admission: row admission does not take an int8"):
        pe.PartialEmbedding(
            6,
            2,
            admission=pe.RowAdmission(),
            quantization_config=keras.quantizers.Int8QuantizationConfig(),
        )


def test_reads_without_admission_are_refused():
    layer = pe.PartialEmbedding(6, 2)
    layer.build()
    with pytest.raises(ValueError, match="admitted_ids: layer .* has no row admission"):
        _ = layer.admitted_ids
    with pytest.raises(ValueError, match="row_counts: layer .* has no row admission"):
        layer.row_counts([1])
    admitted = pe.PartialEmbedding(6, 2, admission=pe.RowAdmission())
    admitted.build()
    with pytest.raises(ValueError, match=r"ids: id 6 .*not in \[0, 6\)"):
        admitted.row_counts([6])


# -- saving ------------------------------------------------------------------------


def test_reversible_layer_config_round_trip():
    policy = pe.RowAdmission(min_count=2, capacity=3)
    layer = pe.PartialReversibleEmbedding(10, 2, admission=policy)
    again = pe.PartialReversibleEmbedding.from_config(layer.get_config())
    assert again.admission == policy
    again(np.array([1, 2]), training=True)
    assert again.row_counts([1, 2]).tolist() == [1, 1]


def test_config_round_trip():
    policy = pe.RowAdmission(min_count=3, capacity=5, eviction="lru", on_evict="reinitialize")
    layer = pe.PartialEmbedding(10, 2, admission=policy)
    config = layer.get_config()
    assert config["admission"] == policy.get_config()
    again = pe.PartialEmbedding.from_config(config)
    assert again.admission == policy
    assert (
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(policy)) == policy
    )
    plain = pe.PartialEmbedding(10, 2).get_config()
    assert "admission" not in plain


def test_state_is_saved_by_keras_files_and_checkpoints(tmp_path, rng):
    stream = zipf_stream(rng, 40, 30, 6)

    def model():
        layer = pe.PartialEmbedding(
            40, 2, admission=pe.RowAdmission(min_count=2, capacity=6, eviction="lru")
        )
        return keras.Sequential([keras.Input((6,), dtype="int32"), layer]), layer

    original, layer = model()
    for ids in stream:
        layer(ids[None], training=True)
    path = tmp_path / "admission.keras"
    original.save(path)
    loaded = keras.saving.load_model(path)
    restored_layer = loaded.layers[0]
    checkpointed, checkpointed_layer = model()
    tf.train.Checkpoint(model=original).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=checkpointed).read(str(tmp_path / "ckpt")).assert_consumed()
    for other in (restored_layer, checkpointed_layer):
        assert other.admission == layer.admission
        for name in ("admitted", "counts", "last_seen", "step", "admitted_count", "admitted_list"):
            assert_bits_equal(
                getattr(other._admission_state, name).numpy(),
                getattr(layer._admission_state, name).numpy(),
                name,
            )
    more = zipf_stream(rng, 40, 10, 6)
    for ids in more:
        for each in (layer, restored_layer, checkpointed_layer):
            each(ids[None], training=True)
    for other in (restored_layer, checkpointed_layer):
        assert other.admitted_ids.tolist() == layer.admitted_ids.tolist()
        assert other.row_counts(np.arange(40)).tolist() == layer.row_counts(np.arange(40)).tolist()


@pytest.mark.parametrize("mode", ["eager", "xla"])
def test_reinitialize_redraws_evicted_rows(mode):
    layer = pe.PartialEmbedding(
        8,
        3,
        embeddings_initializer=keras.initializers.RandomNormal(seed=1),
        admission=pe.RowAdmission(min_count=1, capacity=1, on_evict="reinitialize"),
    )
    layer.build()
    layer.embeddings.assign(np.full((8, 3), 7.0, "float32"))

    def train(ids):
        layer(ids, training=True)

    call = train if mode == "eager" else tf.function(train, jit_compile=True)
    call(tf.constant([1]))
    call(tf.constant([2]))  # Evicts row 1.
    call(tf.constant([3]))  # Evicts row 2.
    table = layer.embeddings.numpy()
    assert layer.admitted_ids.tolist() == [3]
    for row in (1, 2):
        assert np.all(table[row] != 7.0) and np.all(np.abs(table[row]) < 1.0)
    assert not np.array_equal(table[1], table[2])  # Fresh draws at each eviction.
    for row in (0, 3, 4, 5, 6, 7):
        assert np.all(table[row] == 7.0)


@pytest.mark.gpu
@pytest.mark.parametrize("jit", [False, True])
def test_on_a_gpu_every_variable_is_there_and_decisions_match_the_cpu(jit, rng):
    """Every admission variable (and the record of evicted rows) on the GPU,
    a training step there, and the CPU's decisions."""
    num_rows = 200
    stream = zipf_stream(rng, num_rows, 60, 16)
    layers = {}
    for device in ("/GPU:0", "/CPU:0"):
        with tf.device(device):
            layer = pe.PartialEmbedding(
                num_rows, 4, admission=pe.RowAdmission(min_count=2, capacity=10)
            )
            layer.build()
            optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.01))

            @tf.function(jit_compile=jit)
            def step(ids, layer=layer, optimizer=optimizer):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(layer(ids, training=True) ** 2)
                grads = tape.gradient(loss, [layer.embeddings])
                optimizer.apply(grads, [layer.embeddings])

            for ids in stream:
                step(tf.constant(ids))
        layers[device] = layer
    gpu = layers["/GPU:0"]
    state = gpu._admission_state
    variables = [*gpu.weights, state.evicted_rows, state.evicted_count]
    for variable in variables:
        device = getattr(variable, "_value", variable).device  # A Keras variable's tf.Variable.
        assert "GPU" in device.upper(), (variable.name, device)
    cpu = layers["/CPU:0"]
    assert gpu.admitted_ids.tolist() == cpu.admitted_ids.tolist()
    assert (
        gpu.row_counts(np.arange(num_rows)).tolist() == cpu.row_counts(np.arange(num_rows)).tolist()
    )
