"""Row admission in training (``pe.RowAdmission`` with ``MaskedOptimizer``):

* ``min_count=1`` without a capacity gives the plain layer's bits over a ``fit``;
* rows never admitted, and evicted rows (``on_evict="keep"``), keep their bits
  from the step they stopped training, and have no optimizer state;
* with ``capacity=C`` compact slots never hold more than C rows, and their
  free pool is reused;
* saving and restoring mid-stream continues exactly as the uninterrupted run.

``MirroredStrategy``: test_row_admission_mirrored.py.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import partial_embedding as pe
from pe_testing import assert_bits_equal, seed_frameworks, sharding_creator

VOCAB = 80
WIDTH = 3
IDS = 5
BATCH = 4


def _stream(rng, steps, vocab=VOCAB):
    order = rng.permutation(vocab)
    draws = (rng.zipf(1.4, size=(steps * BATCH, IDS)) - 1) % vocab
    x = order[draws].astype("int32")
    y = rng.normal(size=(steps * BATCH, 1)).astype("float32")
    return x, y


def _model(admission, candidates, table, combiner=None):
    seed_frameworks("test_row_admission_training", "model")
    layer = pe.PartialEmbedding(
        VOCAB,
        WIDTH,
        trainable_ids=candidates,
        weights=table,
        admission=admission,
        combiner=combiner,
    )
    layers = [keras.Input((IDS,), dtype="int32"), layer]
    if combiner is None:
        layers.append(keras.layers.Flatten())
    layers.append(keras.layers.Dense(1, kernel_initializer="ones", use_bias=False))
    return keras.Sequential(layers), layer


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.05),
    "sgd_momentum_wd": lambda: keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.2),
}


#: Every optimizer in every mode; compact and full-size slots rotate over
#: them, so that each optimizer and each mode meets both.
MIN_COUNT_ONE_CASES = [
    (optimizer, mode, (i + j) % 2 == 0)
    for i, optimizer in enumerate(sorted(OPTIMIZERS))
    for j, mode in enumerate(["eager", "graph", "xla"])
]


@pytest.mark.parametrize(("optimizer", "mode", "compact"), MIN_COUNT_ONE_CASES)
def test_min_count_one_equals_the_plain_layer(optimizer, mode, compact, rng):
    candidates = np.flatnonzero(rng.random(VOCAB) < 0.4)
    table = rng.normal(size=(VOCAB, WIDTH)).astype("float32")
    x, y = _stream(rng, 12)
    tables = []
    for admission in (None, pe.RowAdmission(min_count=1)):
        model, layer = _model(admission, candidates, table)
        model.compile(
            optimizer=pe.MaskedOptimizer(OPTIMIZERS[optimizer](), compact_slots=compact),
            loss="mse",
            run_eagerly=mode == "eager",
            jit_compile=mode == "xla",
        )
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        tables.append(layer.embeddings.numpy())
    assert not np.array_equal(tables[0], table)  # Something trained.
    assert_bits_equal(tables[1], tables[0], "table with min_count=1")


def test_min_count_one_equals_the_plain_bag_layer(rng):
    candidates = np.flatnonzero(rng.random(VOCAB) < 0.5)
    table = rng.normal(size=(VOCAB, WIDTH)).astype("float32")
    x, y = _stream(rng, 10)
    tables = []
    for admission in (None, pe.RowAdmission(min_count=1)):
        model, layer = _model(admission, candidates, table, combiner="mean")
        model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), loss="mse")
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        tables.append(layer.embeddings.numpy())
    assert_bits_equal(tables[1], tables[0], "bag table with min_count=1")


def _slot_state(optimizer, layer, rows):
    """Each row's optimizer state: (present, values of every slot)."""
    variable = layer.embeddings
    present = optimizer.slot_rows_present(variable, rows)
    values = [optimizer.slot_rows(variable, name, rows) for name in optimizer.slot_names()]
    return present, values


@pytest.mark.parametrize("eviction", ["lfu", "lru"])
@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("jit", [False, True])
def test_unadmitted_and_evicted_rows_keep_their_bits_and_have_no_state(eviction, compact, jit, rng):
    candidates = np.flatnonzero(rng.random(VOCAB) < 0.6)
    table = rng.normal(size=(VOCAB, WIDTH)).astype("float32")
    capacity = 6
    model, layer = _model(
        pe.RowAdmission(min_count=2, capacity=capacity, eviction=eviction), candidates, table
    )
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=compact)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    x, y = _stream(rng, 40)
    admitted_before: set[int] = set()
    # Each row's value when it last stopped training (or its initial value).
    frozen_value = {row: table[row].copy() for row in range(VOCAB)}
    evictions = 0
    for step in range(40):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        model.train_on_batch(x[batch], y[batch])
        admitted = set(layer.admitted_ids.tolist())
        values = layer.embeddings.numpy()
        assert len(admitted) <= capacity
        for row in admitted_before - admitted:
            evictions += 1
            frozen_value[row] = values[row].copy()
        for row in set(range(VOCAB)) - admitted:
            assert_bits_equal(values[row], frozen_value[row], f"row {row} at step {step}")
        rows = np.array(sorted(set(range(VOCAB)) - admitted))
        present, slots = _slot_state(optimizer, layer, rows)
        if compact:
            assert not present.any(), rows[present]
            assert optimizer.compact_slot_rows(layer.embeddings) <= capacity
        for slot in slots:
            assert np.all(slot == 0.0), "a row that does not train holds optimizer state"
        admitted_before = admitted
    assert evictions > 0


@pytest.mark.parametrize("jit", [False, True])
def test_compact_slots_hold_at_most_the_capacity(jit, rng):
    """Over a 1,000-step Zipf stream the slots' rows stay within the
    capacity plus one growth step, and the free pool is reused."""
    vocab, capacity, steps = 400, 24, 1000
    layer = pe.PartialEmbedding(vocab, 2, admission=pe.RowAdmission(min_count=2, capacity=capacity))
    layer.build()
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.01), compact_slots=True)
    order = rng.permutation(vocab)
    stream = order[(rng.zipf(1.2, size=(steps, 16)) - 1) % vocab]

    @tf.function(jit_compile=jit)
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids, training=True) ** 2)
        optimizer.apply(tape.gradient(loss, [layer.embeddings]), [layer.embeddings])

    slots = None
    most_in_use = 0
    evicted = 0
    admitted_before = set()
    for ids in stream:
        step(tf.constant(ids))
        if slots is None:
            slots = optimizer._slot_store.compact[optimizer._key(layer.embeddings)]
        in_use = optimizer.compact_slot_rows(layer.embeddings)
        most_in_use = max(most_in_use, in_use)
        assert in_use <= capacity
        # The slots never grow beyond one growth step past the capacity.
        assert int(slots.capacity().numpy()) <= capacity + capacity // 2 + 1
        admitted = set(layer.admitted_ids.tolist())
        evicted += len(admitted_before - admitted)
        admitted_before = admitted
    assert most_in_use == capacity
    assert evicted > capacity  # Slot rows were given back and reused.
    # Every slot row in use belongs to exactly one admitted row.
    row_map = slots.slot_of_row.numpy()
    mapped = row_map[row_map >= 0].astype(int)
    assert len(set(mapped.tolist())) == len(mapped) == in_use
    assert set(np.flatnonzero(row_map >= 0).tolist()) <= admitted_before


@pytest.mark.parametrize("saving", ["keras", "checkpoint"])
def test_restored_mid_stream_continues_as_the_uninterrupted_run(saving, tmp_path, rng):
    candidates = np.flatnonzero(rng.random(VOCAB) < 0.7)
    table = rng.normal(size=(VOCAB, WIDTH)).astype("float32")
    x, y = _stream(rng, 30)
    admission = pe.RowAdmission(min_count=2, capacity=8, eviction="lfu")

    def build():
        model, layer = _model(admission, candidates, table)
        model.compile(optimizer=pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), loss="mse")
        return model, layer

    uninterrupted, layer = build()
    uninterrupted.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)

    first, _ = build()
    half = 15 * BATCH
    first.fit(x[:half], y[:half], batch_size=BATCH, shuffle=False, verbose=0)
    if saving == "keras":
        first.save(tmp_path / "half.keras")
        second = keras.saving.load_model(tmp_path / "half.keras")
    else:
        tf.train.Checkpoint(model=first, optimizer=first.optimizer).write(str(tmp_path / "half"))
        second, _ = build()
        second.optimizer.build(second.trainable_variables)
        tf.train.Checkpoint(model=second, optimizer=second.optimizer).read(
            str(tmp_path / "half")
        ).assert_existing_objects_matched()
    second.fit(x[half:], y[half:], batch_size=BATCH, shuffle=False, verbose=0)
    resumed = second.layers[0]
    assert resumed.admitted_ids.tolist() == layer.admitted_ids.tolist()
    assert (
        resumed.row_counts(np.arange(VOCAB)).tolist() == layer.row_counts(np.arange(VOCAB)).tolist()
    )
    assert_bits_equal(resumed.embeddings.numpy(), layer.embeddings.numpy(), "resumed table")


def test_freezing_admitted_rows_releases_their_compact_slots(rng):
    layer = pe.PartialEmbedding(20, 2, admission=pe.RowAdmission(min_count=1, capacity=5))
    layer.build()
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.1), compact_slots=True)

    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant(ids), training=True) ** 2)
        optimizer.apply(tape.gradient(loss, [layer.embeddings]), [layer.embeddings])

    step([1, 2, 3])
    assert optimizer.compact_slot_rows(layer.embeddings) == 3
    layer.freeze([2])
    assert optimizer.compact_slot_rows(layer.embeddings) == 2
    present = optimizer.slot_rows_present(layer.embeddings, [1, 2, 3])
    assert present.tolist() == [True, False, True]
    step([4, 5])
    # Row 4 or 5 took the freed slot row: still three rows of slots.
    slots = optimizer._slot_store.compact[optimizer._key(layer.embeddings)]
    assert int(slots.rows_used.numpy()) == 4
    assert optimizer.compact_slot_rows(layer.embeddings) == 4
    for name in optimizer.slot_names():
        assert np.all(optimizer.slot_rows(layer.embeddings, name, [4, 5]) != 0)


def test_save_trained_rows_ships_the_admitted_rows(tmp_path, rng):
    layer = pe.PartialEmbedding(
        30,
        2,
        weights=rng.normal(size=(30, 2)).astype("float32"),
        admission=pe.RowAdmission(min_count=2),
    )
    layer(np.array([1, 2]), training=True)
    layer(np.array([2, 3]), training=True)
    path = tmp_path / "rows.safetensors"
    pe.save_trained_rows(path, layer)
    rows = pe.read_trained_rows(path)
    assert rows.ids.tolist() == [2]


@pytest.mark.parametrize("compact", [True, False])
def test_a_sharded_table_counts_beside_its_shards_and_matches_one_variable(compact, rng):
    """A layer whose ``[V]`` variables a partitioner splits (as
    ParameterServerStrategy does): the counters are split like the table,
    and admission, eviction, release and the update equal one variable's."""
    shard_rows = (30, 25, 25)
    candidates = np.flatnonzero(rng.random(VOCAB) < 0.7)
    table = rng.normal(size=(VOCAB, WIDTH)).astype("float32")
    x, _ = _stream(rng, 25)
    admission = pe.RowAdmission(min_count=2, capacity=6)
    results = []
    for sharded in (True, False):
        creator = sharding_creator(VOCAB, shard_rows) if sharded else None
        with tf.variable_creator_scope(creator or (lambda next_creator, **kw: next_creator(**kw))):
            layer = pe.PartialEmbedding(
                VOCAB,
                WIDTH,
                embeddings_initializer=keras.initializers.Constant(table),
                trainable_ids=candidates,
                admission=admission,
            )
            layer.build()
        optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(0.05), compact_slots=compact)
        optimizer.build([layer.embeddings])
        sources = optimizer.gradient_sources([layer.embeddings])
        for step in range(25):
            with tf.GradientTape() as tape:
                rows = layer(x[step * BATCH : (step + 1) * BATCH], training=True)
                loss = tf.reduce_sum(tf.square(rows - 1.0))
            optimizer.apply(tape.gradient(loss, sources), [layer.embeddings])
        if sharded:
            state = layer._admission_state
            for variable in (layer.embeddings, state.counts, state.last_seen, state.admitted):
                shards = getattr(variable, "_value", variable).variables
                assert [int(s.shape[0]) for s in shards] == list(shard_rows)
        values = (
            np.concatenate([v.numpy() for v in layer.embeddings._value.variables])
            if sharded
            else layer.embeddings.numpy()
        )
        unadmitted = np.setdiff1d(np.arange(VOCAB), layer.admitted_ids)
        present = optimizer.slot_rows_present(layer.embeddings, unadmitted)
        moments = [
            optimizer.slot_rows(layer.embeddings, name, unadmitted)
            for name in optimizer.slot_names()
        ]
        results.append((layer.admitted_ids, layer.row_counts(np.arange(VOCAB)), values))
        assert not present.any() if compact else True
        for moment in moments:
            assert np.all(moment == 0.0)
    (ids_a, counts_a, table_a), (ids_b, counts_b, table_b) = results
    assert ids_a.tolist() == ids_b.tolist() and len(ids_a) == 6
    assert counts_a.tolist() == counts_b.tolist()
    assert_bits_equal(table_a, table_b, "sharded table")


def test_fixed_slot_stores_smaller_than_the_capacity_are_refused(rng):
    creator = sharding_creator(VOCAB, (40, 40))
    with tf.variable_creator_scope(creator):
        layer = pe.PartialEmbedding(VOCAB, WIDTH, admission=pe.RowAdmission(capacity=12))
        layer.build()
    optimizer = pe.MaskedOptimizer(keras.optimizers.Adam(), compact_slots=True, slot_capacity=5)
    with pytest.raises(ValueError, match=r"slot_capacity: 5 slot rows .* 12 rows .*capacity=12"):
        optimizer.build([layer.embeddings])
