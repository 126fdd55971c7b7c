"""``pe.DistributedEmbedding``: keras-rs's configs on our bag tables.

Checked against ``keras_rs.layers.DistributedEmbedding`` itself (the default
device path, CPU): the same outputs for dense, ragged and sparse ids with and
without weights, the same tables after training with every row trainable;
then what only ours has (the rows that learn, admission, per table), the
config and ``.keras`` round trips, and each bad argument named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

keras_rs = pytest.importorskip("keras_rs")

import partial_embedding as pe  # noqa: E402
from pe_testing import assert_bits_equal  # noqa: E402

BATCH = 4
#: Rows of the two tables in the training tests: 20 + 4 ids of "items" and
#: 4 x 3 of "tags" a batch.
TRAINING_VOCAB = (24, 12)
COMBINERS = ("mean", "sum", "sqrtn")


def _features(combiner="mean", vocab=TRAINING_VOCAB, dims=(4, 3), length=5, **table_kwargs):
    """Two tables: "items" serves two features (bags and single ids), "tags" one (ragged)."""
    items = keras_rs.layers.TableConfig(
        "items", vocabulary_size=vocab[0], embedding_dim=dims[0], combiner=combiner, **table_kwargs
    )
    tags = keras_rs.layers.TableConfig(
        "tags", vocabulary_size=vocab[1], embedding_dim=dims[1], combiner=combiner
    )
    return {
        "clicked": keras_rs.layers.FeatureConfig(
            "clicked", items, (BATCH, length), (BATCH, dims[0])
        ),
        "shown": keras_rs.layers.FeatureConfig("shown", items, (BATCH,), (BATCH, dims[0])),
        "nested": [keras_rs.layers.FeatureConfig("tags", tags, (BATCH, None), (BATCH, dims[1]))],
    }


def _ragged(rng, vocab, lengths):
    return tf.ragged.constant([list(rng.integers(0, vocab, n)) for n in lengths], dtype=tf.int32)


def _inputs(rng, kind="dense", vocab=(12, 9), length=5, with_weights=False, batch=BATCH):
    """Inputs (and weights) of ``_features``; ``kind`` is the bag feature's kind."""
    clicked = rng.integers(0, vocab[0], (batch, length)).astype(np.int32)
    clicked_weights = rng.uniform(0.25, 2.0, (batch, length)).astype(np.float32)
    if kind == "ragged":
        lengths = rng.integers(1, length + 1, batch)
        clicked = tf.RaggedTensor.from_tensor(clicked, lengths=lengths)
        clicked_weights = tf.RaggedTensor.from_tensor(clicked_weights, lengths=lengths)
    elif kind == "sparse":
        keep = rng.uniform(size=(batch, length)) < 0.6
        keep[:, 0] = True
        indices = np.argwhere(keep).astype(np.int64)
        shape = (batch, length)
        clicked = tf.SparseTensor(indices, clicked[keep], shape)
        clicked_weights = tf.SparseTensor(indices, clicked_weights[keep], shape)
    tags = _ragged(rng, vocab[1], rng.integers(1, 4, batch))
    inputs = {
        "clicked": clicked,
        "shown": rng.integers(0, vocab[0], batch).astype(np.int32),
        "nested": [tags],
    }
    if not with_weights:
        return inputs, None
    weights = {
        "clicked": clicked_weights,
        "shown": rng.uniform(0.25, 2.0, batch).astype(np.float32),
        "nested": [tf.ones_like(tags, dtype=tf.float32) * 1.5],
    }
    return inputs, weights


def _copy_tables(source, target):
    """Gives ``target`` (ours) the tables of ``source`` (keras-rs's)."""
    for name, table in source.get_embedding_tables().items():
        target.table_layer(name).embeddings.assign(table)


def _twins(features, **ours):
    """keras-rs's layer and ours, built, with the same tables."""
    reference = keras_rs.layers.DistributedEmbedding(features)
    layer = pe.DistributedEmbedding(features, **ours)
    inputs, _ = _inputs(np.random.default_rng(0), vocab=(9, 9))
    reference(inputs)
    layer(inputs)
    _copy_tables(reference, layer)
    return reference, layer


def _close(actual, expected, rtol=2e-6, atol=1e-6):
    keras.tree.map_structure(
        lambda a, e: np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol, atol),
        actual,
        expected,
    )


# --- the same outputs as keras-rs ----------------------------------------------------


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("kind", ["dense", "ragged", "sparse"])
@pytest.mark.parametrize("with_weights", [False, True])
def test_outputs_equal_keras_rs(rng, combiner, kind, with_weights):
    reference, layer = _twins(_features(combiner))
    inputs, weights = _inputs(rng, kind, with_weights=with_weights)
    expected = reference(inputs, weights)
    actual = layer(inputs, weights)
    assert keras.tree.map_structure(lambda x: tuple(x.shape), actual) == {
        "clicked": (BATCH, 4),
        "shown": (BATCH, 4),
        "nested": [(BATCH, 3)],
    }
    _close(actual, expected)


def test_preprocess_then_call_equals_call(rng):
    _, layer = _twins(_features())
    inputs, weights = _inputs(rng, "ragged", with_weights=True)
    preprocessed = layer.preprocess(inputs, weights)
    assert list(preprocessed) == ["preprocessed_inputs_per_placement"]
    _close(layer(preprocessed), layer(inputs, weights), rtol=0, atol=0)


def test_compute_output_shape_and_embedding_tables():
    reference, layer = _twins(_features())
    shapes = {"clicked": (BATCH, 5), "shown": (BATCH,), "nested": [(BATCH, None)]}
    assert layer.compute_output_shape(shapes) == reference.compute_output_shape(shapes)
    ours, theirs = layer.get_embedding_tables(), reference.get_embedding_tables()
    assert sorted(ours) == sorted(theirs) == ["items", "tags"]
    for name in ours:
        assert_bits_equal(ours[name], theirs[name], name)


def test_functional_model_with_keras_inputs(rng):
    layer = pe.DistributedEmbedding(_features())
    inputs = {
        "clicked": keras.Input((5,), batch_size=BATCH, dtype="int32", name="clicked"),
        "shown": keras.Input((), batch_size=BATCH, dtype="int32", name="shown"),
        "nested": [keras.Input((None,), batch_size=BATCH, dtype="int32", ragged=True)],
    }
    outputs = layer(inputs)
    assert tuple(outputs["nested"][0].shape) == (BATCH, 3)
    head = keras.layers.Concatenate()([outputs["clicked"], outputs["shown"], outputs["nested"][0]])
    model = keras.Model(inputs, keras.layers.Dense(1)(head))
    model.compile(pe.MaskedOptimizer(keras.optimizers.Adam()), "mse")
    data, _ = _inputs(rng)
    assert np.isfinite(model.train_on_batch(data, np.zeros((BATCH, 1))))


# --- training: the same tables as keras-rs with every row trainable ------------------


def _model(layer):
    """A Dense(1) head over the concatenated features, as a subclassed model."""

    class Ranker(keras.Model):
        def __init__(self):
            super().__init__()
            self.embedding = layer
            self.head = keras.layers.Dense(1, kernel_initializer="ones")

        def call(self, inputs, training=None):
            out = self.embedding(inputs, training=training)
            pooled = [out["clicked"], out["shown"], out["nested"][0]]
            return self.head(keras.ops.concatenate(pooled, 1))

    return Ranker()


def _batches(rng, steps):
    """Batches in which every row of both tables (``TRAINING_VOCAB``) occurs
    exactly once at each step: Keras' lazy and dense Adam then agree, and so do
    its Adagrad and Adam on a gradient with repeated ids (keras-rs's) and ours
    on the summed rows (see docs/keras_rs.md)."""
    batches = []
    for _ in range(steps):
        items = rng.permutation(TRAINING_VOCAB[0]).astype(np.int32)
        tags = rng.permutation(TRAINING_VOCAB[1]).astype(np.int32).reshape(BATCH, 3)
        inputs = {
            "clicked": items[: BATCH * 5].reshape(BATCH, 5),
            "shown": items[BATCH * 5 :],
            "nested": [tf.RaggedTensor.from_tensor(tags)],
        }
        batches.append((inputs, rng.normal(size=(BATCH, 1)).astype(np.float32)))
    return batches


def _train(layer, optimizer, batches):
    layer(batches[0][0])  # built eagerly: not a training batch
    model = _model(layer)
    model.compile(optimizer, "mse")
    for inputs, targets in batches:
        model.train_on_batch(inputs, targets)
    return {name: np.asarray(table) for name, table in layer.get_embedding_tables().items()}


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.SGD(0.1),
        lambda: keras.optimizers.Adagrad(0.1),
        lambda: keras.optimizers.Adam(0.01),
    ],
    ids=["sgd", "adagrad", "adam"],
)
@pytest.mark.parametrize("combiner", COMBINERS)
def test_training_equals_keras_rs_with_every_row_trainable(rng, make, combiner):
    reference, layer = _twins(_features(combiner, vocab=TRAINING_VOCAB))
    initial = {name: np.asarray(t) for name, t in reference.get_embedding_tables().items()}
    batches = _batches(rng, 5)
    expected = _train(reference, make(), batches)
    actual = _train(layer, pe.MaskedOptimizer(make()), batches)
    for name in expected:
        assert (np.abs(expected[name] - initial[name]).max(axis=1) > 0).all(), name
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=2e-6)


def test_table_optimizer_is_not_used(rng):
    """``TableConfig.optimizer`` is kept in the config, not used (as keras-rs off
    SparseCore): the model's optimizer alone trains the table."""
    huge_sgd = keras.optimizers.SGD(learning_rate=1e4)
    plain = _features(vocab=TRAINING_VOCAB)
    with_optimizer = _features(vocab=TRAINING_VOCAB, optimizer=huge_sgd)
    _, first = _twins(plain)
    _, second = _twins(with_optimizer)
    _copy_tables_between(first, second)
    batches = _batches(rng, 3)
    expected = _train(first, pe.MaskedOptimizer(keras.optimizers.Adam(0.01)), batches)
    actual = _train(second, pe.MaskedOptimizer(keras.optimizers.Adam(0.01)), batches)
    for name in expected:
        assert_bits_equal(actual[name], expected[name], name)
    config = second.get_config()["tables"][0]
    assert config["optimizer"]["class_name"] == "SGD"


def _copy_tables_between(source, target):
    for name, table in source.get_embedding_tables().items():
        target.table_layer(name).embeddings.assign(table)


# --- the rows that learn, per table ---------------------------------------------------


def test_frozen_rows_stay_bit_for_bit_under_adam(rng):
    layer = pe.DistributedEmbedding(_features(), trainable_ids={"items": [2, 5, 7]})
    batches = _batches(rng, 4)
    layer(batches[0][0])
    before = {name: np.asarray(t) for name, t in layer.get_embedding_tables().items()}
    after = _train(layer, pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), batches)
    frozen = np.setdiff1d(np.arange(TRAINING_VOCAB[0]), [2, 5, 7])
    assert_bits_equal(after["items"][frozen], before["items"][frozen], "frozen rows")
    assert not np.array_equal(after["items"][[2, 5, 7]], before["items"][[2, 5, 7]])
    # "tags" was left out of trainable_ids: every row of it learns.
    assert (np.abs(after["tags"] - before["tags"]).max(axis=1) > 0).all()
    assert layer.table_layer("items").trainable_ids.tolist() == [2, 5, 7]


def test_admission_per_table(rng):
    admission = pe.RowAdmission(min_count=2)
    layer = pe.DistributedEmbedding(_features(), admission={"tags": admission})
    assert layer.table_layer("tags").admission is admission
    assert layer.table_layer("items").admission is None
    batches = _batches(rng, 1)
    _train(layer, pe.MaskedOptimizer(keras.optimizers.SGD(0.1)), batches)
    assert layer.table_layer("tags").admitted_ids.tolist() == []
    _train(layer, pe.MaskedOptimizer(keras.optimizers.SGD(0.1)), batches)
    assert layer.table_layer("tags").admitted_ids.tolist() == list(range(TRAINING_VOCAB[1]))
    config = layer.get_config()
    assert config["admission"] == {"tags": admission.get_config()}
    restored = pe.DistributedEmbedding.from_config(json.loads(json.dumps(config)))
    assert restored.table_layer("tags").admission.get_config() == admission.get_config()


# --- configs and files ------------------------------------------------------------------


def test_config_round_trip_keeps_a_shared_table(rng):
    layer = pe.DistributedEmbedding(_features("sqrtn"))
    config = json.loads(json.dumps(layer.get_config()))
    assert len(config["tables"]) == 2
    restored = pe.DistributedEmbedding.from_config(config)
    features = restored.feature_configs
    assert features["clicked"].table is features["shown"].table
    assert features["clicked"].table.combiner == "sqrtn"
    assert features["nested"][0].table.name == "tags"
    assert restored.get_config() == layer.get_config() | {"name": restored.name}
    # keras-rs reads our config and we read keras-rs's.
    theirs = keras_rs.layers.DistributedEmbedding.from_config(config)
    assert theirs.get_config()["tables"] == config["tables"]
    again = pe.DistributedEmbedding.from_config(theirs.get_config())
    assert again.feature_configs["clicked"].table is again.feature_configs["shown"].table
    inputs, _ = _inputs(rng)
    restored(inputs)
    _copy_tables_between(layer, restored)
    _close(restored(inputs), layer(inputs), rtol=0, atol=0)


def test_keras_file_round_trip(rng, tmp_path):
    layer = pe.DistributedEmbedding(
        _features(), trainable_ids={"items": [1, 3]}, admission={"tags": pe.RowAdmission()}
    )
    inputs = {
        "clicked": keras.Input((5,), batch_size=BATCH, dtype="int32", name="clicked"),
        "shown": keras.Input((), batch_size=BATCH, dtype="int32", name="shown"),
        "nested": [keras.Input((None,), batch_size=BATCH, dtype="int32", ragged=True)],
    }
    out = layer(inputs)
    head = keras.layers.Concatenate()([out["clicked"], out["shown"], out["nested"][0]])
    model = keras.Model(inputs, keras.layers.Dense(1)(head))
    model.compile(pe.MaskedOptimizer(keras.optimizers.Adam(0.05)), "mse")
    for data, targets in _batches(rng, 2):
        model.train_on_batch(data, targets)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    loaded_layer = next(x for x in loaded.layers if isinstance(x, pe.DistributedEmbedding))
    assert loaded_layer.table_layer("items").trainable_ids.tolist() == [1, 3]
    assert loaded_layer.table_layer("tags").admitted_ids.tolist() == list(range(TRAINING_VOCAB[1]))
    for name, table in layer.get_embedding_tables().items():
        assert_bits_equal(loaded_layer.get_embedding_tables()[name], table, name)
    data, _ = _batches(rng, 1)[0]
    np.testing.assert_array_equal(loaded.predict(data, verbose=0), model.predict(data, verbose=0))


# --- bad input, named ---------------------------------------------------------------------


def test_unknown_table_in_trainable_ids_or_admission():
    for argument, value in (("trainable_ids", [1]), ("admission", pe.RowAdmission())):
        with pytest.raises(pe.PartialEmbeddingArgumentError, match=f"{argument}: .*'itemz'"):
            pe.DistributedEmbedding(_features(), **{argument: {"itemz": value}})
    with pytest.raises(pe.PartialEmbeddingTypeError, match="trainable_ids: must be a dict"):
        pe.DistributedEmbedding(_features(), trainable_ids=[1, 2])


def test_bad_trainable_id_names_its_table():
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="table 'items'"):
        pe.DistributedEmbedding(_features(), trainable_ids={"items": [TRAINING_VOCAB[0]]})


def test_sparsecore_placement_is_refused_naming_the_table():
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="table 'items'.*'sparsecore'"):
        pe.DistributedEmbedding(_features(placement="sparsecore"))
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="placement 'tpu'"):
        pe.DistributedEmbedding(_features(placement="tpu"))
    # "auto" and "default_device" are the model's device.
    pe.DistributedEmbedding(_features(placement="default_device"))


def test_wrong_input_structure_is_named(rng):
    layer = pe.DistributedEmbedding(_features())
    inputs, _ = _inputs(rng)
    with pytest.raises(pe.PartialEmbeddingTypeError, match=r"inputs: .*keys \['clicked'\]"):
        layer({"clicked": inputs["clicked"]})
    layer(inputs)
    bad_weights = {"clicked": np.ones((BATCH, 5), "float32")}
    with pytest.raises(pe.PartialEmbeddingTypeError, match="weights: must have the structure"):
        layer(inputs, bad_weights)


def test_wrong_shapes_and_ranks_are_named(rng):
    inputs, _ = _inputs(rng)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="feature 'clicked' has shape"):
        pe.DistributedEmbedding(_features())({**inputs, "clicked": np.zeros((BATCH, 6), "int32")})
    layer = pe.DistributedEmbedding(_features())
    layer(inputs)
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="'clicked' has ids of rank 3"):
        layer({**inputs, "clicked": np.zeros((BATCH, 5, 2), "int32")})


def test_bad_configs_are_named():
    table = keras_rs.layers.TableConfig("t", vocabulary_size=4, embedding_dim=2)
    twin = keras_rs.layers.TableConfig("t", vocabulary_size=4, embedding_dim=2)
    features = [
        keras_rs.layers.FeatureConfig("a", table, (2,), (2, 2)),
        keras_rs.layers.FeatureConfig("b", twin, (2,), (2, 2)),
    ]
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="two different TableConfig"):
        pe.DistributedEmbedding(features)
    with pytest.raises(pe.PartialEmbeddingTypeError, match="'1' is a str"):
        pe.DistributedEmbedding([features[0], "b"])
    bad = keras_rs.layers.TableConfig("t", vocabulary_size=4, embedding_dim=2, combiner="max")
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="table 't'.*'max'"):
        pe.DistributedEmbedding([keras_rs.layers.FeatureConfig("a", bad, (2,), (2, 2))])
    with pytest.raises(pe.PartialEmbeddingArgumentError, match="update_stats"):
        pe.DistributedEmbedding(features[:1], update_stats=True)


# --- keras-rs is optional -------------------------------------------------------------------


def test_without_keras_rs_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_rs", None)
    with pytest.raises(ImportError, match=r"tf-partial-embedding\[keras-rs\]"):
        pe.DistributedEmbedding({})


def test_importing_the_package_does_not_import_keras_rs():
    code = "import sys, partial_embedding; print('keras_rs' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"


# --- a shared table: one bag lookup, the fused step -------------------------------------


def test_every_table_takes_the_fused_bag_step(rng, monkeypatch):
    """Both tables run MaskedOptimizer's fused bag gradient + rule: "tags" (one
    feature) and "items", whose two features are one bag lookup (docs/keras_rs.md)."""
    from partial_embedding.optimizers import _row_rules

    fused: list[tuple[str, bool]] = []
    real = _row_rules._bag_fused

    def spy(step, *arguments):
        table = {4: "items", 3: "tags"}[int(step.variable.shape[1])]  # _features' dims
        fused.append((table, real(step, *arguments)))
        return fused[-1][1]

    monkeypatch.setattr(_row_rules, "_bag_fused", spy)
    layer = pe.DistributedEmbedding(_features())
    _train(layer, pe.MaskedOptimizer(keras.optimizers.Adam()), _batches(rng, 2))
    assert sorted(fused) == [("items", True)] * 2 + [("tags", True)] * 2


def _per_feature(layer, bag_inputs, training):
    """A shared table looked up once per feature (the path before one bag lookup)."""
    return [layer(ids, weights, training=training) for ids, weights in bag_inputs]


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("kind", ["dense", "ragged", "sparse"])
@pytest.mark.parametrize("with_weights", [False, True])
def test_a_shared_table_gives_the_per_feature_outputs_bit_for_bit(
    rng, monkeypatch, combiner, kind, with_weights
):
    from partial_embedding.layers import distributed_embedding

    _, layer = _twins(_features(combiner))
    inputs, weights = _inputs(rng, kind, with_weights=with_weights)
    # With weights and a combiner other than "sum", "shown" (one id a bag)
    # pools without its weights: "items" then has one feature with weights
    # and one without (which the shared lookup gives weights of 1).
    actual = layer(inputs, weights)
    # In a graph with an unknown batch size too (the sizes of the split are tensors).
    relaxed = tf.function(layer, reduce_retracing=True)
    for batch in (BATCH + 2, BATCH + 1):
        relaxed(*_inputs(rng, kind, with_weights=with_weights, batch=batch))
    relaxed_actual = relaxed(inputs, weights)
    monkeypatch.setattr(distributed_embedding, "_shared_lookup", _per_feature)
    expected = layer(inputs, weights)
    keras.tree.map_structure(assert_bits_equal, actual, expected)
    keras.tree.map_structure(assert_bits_equal, relaxed_actual, expected)


@pytest.mark.parametrize(
    "make",
    [lambda: keras.optimizers.Adam(0.05), lambda: keras.optimizers.Ftrl(0.1)],
    ids=["adam", "ftrl"],
)
def test_a_shared_table_trains_as_per_feature_lookups(rng, monkeypatch, make):
    """Within float32 rounding of the gradient's sum (the fused step sums a
    row's occurrences in another order); frozen rows bit for bit."""
    from partial_embedding.layers import distributed_embedding

    trainable = {"items": [0, 2, 5, 7, 11, 19, 23]}
    _, fused = _twins(_features(), trainable_ids=trainable)
    _, split = _twins(_features(), trainable_ids=trainable)
    _copy_tables_between(fused, split)
    before = {name: np.asarray(t) for name, t in fused.get_embedding_tables().items()}
    batches = _batches(rng, 4)
    # Ids repeated within a batch, across the two features of "items".
    for inputs, _ in batches:
        inputs["shown"] = inputs["clicked"][:, 0].copy()
    actual = _train(fused, pe.MaskedOptimizer(make()), batches)
    monkeypatch.setattr(distributed_embedding, "_shared_lookup", _per_feature)
    expected = _train(split, pe.MaskedOptimizer(make()), batches)
    frozen = np.setdiff1d(np.arange(TRAINING_VOCAB[0]), trainable["items"])
    assert_bits_equal(actual["items"][frozen], before["items"][frozen], "frozen rows")
    assert_bits_equal(expected["items"][frozen], before["items"][frozen], "frozen rows")
    for name in expected:
        moved = np.abs(actual[name] - before[name]).max(axis=1) > 0
        assert moved.sum() >= (7 if name == "items" else TRAINING_VOCAB[1]), name
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6)
