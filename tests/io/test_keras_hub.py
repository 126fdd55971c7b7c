"""partial_embedding.keras_hub over three backbone families built from small configs.

GPT-2 (tied table, BytePair tokenizer), Llama (untied table) and BERT (an
encoder, WordPiece tokenizer) with random weights; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras  # noqa: E402
from keras_hub_models import tiny_bert, tiny_gpt2, tiny_llama  # noqa: E402

import partial_embedding as pe  # noqa: E402
import partial_embedding.keras_hub as pek  # noqa: E402

VOCAB = 96
NEW = 4
SEQ = 8


def _ids(batch: int = 4, high: int = VOCAB, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, high, size=(batch, SEQ)).astype("int32")


def _gpt2_backbone() -> object:
    return tiny_gpt2(VOCAB, 1, max_sequence_length=32, dropout=0.0)


def _llama_backbone() -> object:
    return tiny_llama(VOCAB, 2, tie_word_embeddings=False)


def _bert_backbone() -> object:
    return tiny_bert(VOCAB, 3, max_sequence_length=32, dropout=0.0)


def _lm_inputs(ids: np.ndarray) -> dict:
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}


def _bert_inputs(ids: np.ndarray) -> dict:
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}


FAMILIES = {
    "gpt2": (_gpt2_backbone, keras_hub.models.GPT2CausalLM, _lm_inputs),
    "llama": (_llama_backbone, keras_hub.models.LlamaCausalLM, _lm_inputs),
    "bert": (_bert_backbone, None, _bert_inputs),
}


def _task(family: str, backbone: object) -> object:
    _, task_class, _ = FAMILIES[family]
    if task_class is None:
        keras.utils.set_random_seed(4)
        return keras_hub.models.BertTextClassifier(backbone, num_classes=3, preprocessor=None)
    return task_class(backbone=backbone, preprocessor=None)


def _numpy(value: object) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value))


def _table(model: object) -> np.ndarray:
    backbone = getattr(model, "backbone", model)
    return _numpy(backbone.token_embedding.embeddings)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def grown(request: pytest.FixtureRequest) -> dict:
    """A family's original task model and the one add_tokens returned (count NEW)."""
    family = request.param
    original = _task(family, FAMILIES[family][0]())
    added = pek.add_tokens(original, NEW)
    return {"family": family, "original": original, "added": added}


def test_same_kind_same_config_partial_table(grown: dict) -> None:
    original, added = grown["original"], grown["added"]
    model = added.model
    assert type(model) is type(original)
    assert isinstance(model.backbone, type(original.backbone))
    old_config = original.backbone.get_config()
    new_config = model.backbone.get_config()
    assert new_config.pop("vocabulary_size") == VOCAB + NEW
    old_config.pop("vocabulary_size")
    new_config.pop("name"), old_config.pop("name")
    assert new_config == old_config
    table = model.backbone.token_embedding
    assert isinstance(table, pe.PartialReversibleEmbedding)
    assert table.tie_weights == original.backbone.token_embedding.tie_weights
    assert added.new_ids.tolist() == list(range(VOCAB, VOCAB + NEW))
    assert added.tokens is None and added.init == "mean"
    assert isinstance(added.new_ids, np.ndarray) and added.new_ids.dtype.kind == "i"
    with pytest.raises(dataclasses.FrozenInstanceError):
        added.init = "zeros"
    assert table.trainable_ids.tolist() == added.new_ids.tolist()
    # No discarded stock layer stays tracked.
    assert [layer.name for layer in model.backbone.layers].count("token_embedding") == 1


def test_every_pretrained_weight_in_place(grown: dict) -> None:
    original, model = grown["original"], grown["added"].model
    old_table = _table(original)
    new_table = _table(model)
    np.testing.assert_array_equal(new_table[:VOCAB], old_table)
    expected_mean = old_table.astype(np.float64).mean(axis=0).astype(np.float32)
    np.testing.assert_array_equal(new_table[VOCAB:], np.tile(expected_mean, (NEW, 1)))
    old_other = [w for w in original.weights if "token_embedding" not in w.path]
    new_other = [w for w in model.weights if "token_embedding" not in w.path]
    assert len(old_other) == len(new_other) > 0
    for old, new in zip(old_other, new_other, strict=True):
        np.testing.assert_array_equal(_numpy(new), _numpy(old), err_msg=old.path)
    old_layer = original.backbone.token_embedding
    if not old_layer.tie_weights:
        reverse = _numpy(model.backbone.token_embedding.reverse_embeddings)
        np.testing.assert_array_equal(reverse[:VOCAB], _numpy(old_layer.reverse_embeddings).T)


def test_only_the_table_trains(grown: dict) -> None:
    model = grown["added"].model
    paths = sorted(w.path for w in model.trainable_weights)
    expected = ["token_embedding/embeddings"]
    if not model.backbone.token_embedding.tie_weights:
        expected.append("token_embedding/reverse_embeddings")
    assert paths == sorted(expected)


def test_old_token_outputs_identical_before_training(grown: dict) -> None:
    family, original, model = grown["family"], grown["original"], grown["added"].model
    inputs = FAMILIES[family][2](_ids())
    hidden_old = _numpy(
        original.backbone(inputs)["sequence_output"]
        if family == "bert"
        else original.backbone(inputs)
    )
    hidden_new = _numpy(
        model.backbone(inputs)["sequence_output"] if family == "bert" else model.backbone(inputs)
    )
    np.testing.assert_array_equal(hidden_new, hidden_old)
    out_old, out_new = _numpy(original(inputs)), _numpy(model(inputs))
    if family == "bert":
        np.testing.assert_array_equal(out_new, out_old)
    else:
        # ops.masked_reverse_projection multiplies with transpose_b=True;
        # Keras transposes the table first: the same sums, rounded apart by
        # at most a few ulps (bounded in test_logits_match_stock_within_...).
        np.testing.assert_allclose(out_new[..., :VOCAB], out_old, rtol=0, atol=1e-6)


def test_logits_match_stock_within_float32_dot_product_rounding(grown: dict) -> None:
    """The reverse projection multiplies by the table with ``transpose_b``
    (no ``[D, V]`` copy of the table per step); Keras transposes the table
    first. oneDNN sums the same products in another order, so the logits may
    differ, but each by no more than a float32 dot product of D terms can:
    ``gamma(D + 1) * sum_i |h_i * w_i|`` (``gamma(n) = n u / (1 - n u)``)."""
    if grown["family"] == "bert":
        pytest.skip("a classifier has no reverse projection")
    original = grown["original"]
    stock = original.backbone.token_embedding
    # Keras' untied reverse table is [D, V]; the tied one is the [V, D] table.
    table = _numpy(stock.embeddings) if stock.tie_weights else _numpy(stock.reverse_embeddings).T
    table = table.astype(np.float64)
    for batch, length in [(1, 4), (4, SEQ), (3, 5)]:
        inputs = _lm_inputs(_ids(batch=batch)[:, :length])
        out_old = _numpy(original(inputs)).astype(np.float64)
        out_new = _numpy(grown["added"].model(inputs))[..., :VOCAB].astype(np.float64)
        hidden = _numpy(grown["added"].model.backbone(inputs)).astype(np.float64)
        terms = table.shape[1] + 1
        gamma = terms * 2.0**-24 / (1 - terms * 2.0**-24)
        # Both sides carry the rounding: twice the bound of one.
        bound = 2 * gamma * (np.abs(hidden) @ np.abs(table).T)
        assert np.all(np.abs(out_new - out_old) <= bound)


def _fit(model: object, family: str, optimizer: object, epochs: int = 2) -> None:
    ids = _ids(batch=8, high=VOCAB + NEW, seed=5)
    ids[:, ::2] = np.arange(VOCAB, VOCAB + NEW)  # every new token in every row
    inputs = FAMILIES[family][2](ids)
    if family == "bert":
        labels = np.arange(8) % 3
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        labels = np.roll(ids, -1, axis=1)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=False)
    model.fit(inputs, labels, batch_size=4, epochs=epochs, verbose=0)


@pytest.fixture(scope="module")
def trained(grown: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The grown model after fit with MaskedOptimizer(AdamW), its rows file and optimizer."""
    model = grown["added"].model
    before = [_numpy(w) for w in model.weights]
    optimizer = pe.MaskedOptimizer(keras.optimizers.AdamW(learning_rate=0.05, weight_decay=0.1))
    _fit(model, grown["family"], optimizer)
    rows_file = str(tmp_path_factory.mktemp("rows") / "rows.safetensors")
    pe.save_trained_rows(rows_file, model.backbone.token_embedding, optimizer=optimizer)
    return {**grown, "before": before, "optimizer": optimizer, "rows_file": rows_file}


def test_fit_moves_new_rows_only(trained: dict) -> None:
    model = trained["added"].model
    for old, weight in zip(trained["before"], model.weights, strict=True):
        new = _numpy(weight)
        if weight.path.startswith("token_embedding/") and "mask" not in weight.path:
            np.testing.assert_array_equal(new[:VOCAB], old[:VOCAB], err_msg=weight.path)
            assert np.all(np.any(new[VOCAB:] != old[VOCAB:], axis=1)), weight.path
        else:
            np.testing.assert_array_equal(new, old, err_msg=weight.path)


def test_optimizer_state_proportional_to_new_rows(trained: dict) -> None:
    optimizer, table = trained["optimizer"], trained["added"].model.backbone.token_embedding
    assert optimizer.has_compact_slots(table.embeddings)
    assert optimizer.compact_slot_rows(table.embeddings) == NEW
    width = table.output_dim
    compact = [_numpy(v).shape for v in optimizer.compact_slot_variables if len(v.shape) == 2]
    # AdamW: two slots (m, v) of NEW rows per table (two tables untied),
    # none of the table's size.
    tables = 1 if table.tie_weights else 2
    assert compact == [(NEW, width)] * (2 * tables), compact
    full_size = [v.path for v in optimizer.variables if tuple(v.shape) == (VOCAB + NEW, width)]
    assert full_size == []


def test_rows_file_to_fresh_model_bit_identical(trained: dict) -> None:
    family = trained["family"]
    fresh = pek.add_tokens(trained["original"], NEW).model
    pe.load_trained_rows(trained["rows_file"], fresh.backbone.token_embedding)
    inputs = FAMILIES[family][2](_ids(high=VOCAB + NEW, seed=7))
    np.testing.assert_array_equal(_numpy(fresh(inputs)), _numpy(trained["added"].model(inputs)))


_PLAIN_KERAS_HUB = textwrap.dedent(
    """
    import sys, importlib.abc
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "partial_embedding":
                raise ImportError("partial_embedding is blocked in this process")
            return None
    sys.meta_path.insert(0, Blocker())
    import numpy as np, keras, keras_hub
    preset, kind, ids_file, out = sys.argv[1:5]
    model = getattr(keras_hub.models, kind).from_preset(preset, preprocessor=None)
    ids = np.load(ids_file)
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    if "Bert" in kind:
        inputs["segment_ids"] = np.zeros_like(ids)
    backbone_out = model.backbone(inputs)
    if isinstance(backbone_out, dict):
        backbone_out = backbone_out["sequence_output"]
    np.savez(out, outputs=keras.ops.convert_to_numpy(model(inputs)),
             hidden=keras.ops.convert_to_numpy(backbone_out),
             table=keras.ops.convert_to_numpy(model.backbone.token_embedding.embeddings))
    assert type(model.backbone.token_embedding) is keras.layers.ReversibleEmbedding
    assert "partial_embedding" not in sys.modules
    """
)


def test_merged_preset_loads_in_plain_keras_hub(trained: dict, tmp_path: object) -> None:
    family, model = trained["family"], trained["added"].model
    preset = pek.merge_into_preset(model, trained["rows_file"], tmp_path / "preset")
    ids = _ids(high=VOCAB + NEW, seed=9)
    np.save(tmp_path / "ids.npy", ids)
    script = tmp_path / "plain.py"
    script.write_text(_PLAIN_KERAS_HUB)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            preset,
            type(model).__name__,
            str(tmp_path / "ids.npy"),
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plain = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(plain["table"], _table(model))
    inputs = FAMILIES[family][2](ids)
    hidden = model.backbone(inputs)
    hidden = _numpy(hidden["sequence_output"] if family == "bert" else hidden)
    np.testing.assert_array_equal(plain["hidden"], hidden)
    if family == "bert":
        np.testing.assert_array_equal(plain["outputs"], _numpy(model(inputs)))
    else:
        np.testing.assert_allclose(plain["outputs"], _numpy(model(inputs)), rtol=0, atol=1e-6)


def test_keras_file_round_trip_without_custom_objects(trained: dict, tmp_path: object) -> None:
    family, model = trained["family"], trained["added"].model
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is type(model)
    table = loaded.backbone.token_embedding
    assert isinstance(table, pe.PartialReversibleEmbedding)
    assert table.trainable_ids.tolist() == list(range(VOCAB, VOCAB + NEW))
    inputs = FAMILIES[family][2](_ids(high=VOCAB + NEW, seed=11))
    np.testing.assert_array_equal(_numpy(loaded(inputs)), _numpy(model(inputs)))


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def test_importing_the_library_does_not_import_keras_hub() -> None:
    result = _run_python(
        "import sys, partial_embedding\n"
        "assert 'keras_hub' not in sys.modules, 'keras_hub imported'\n"
        "blocked = {'keras_hub': None}\n"
        "sys.modules.update(blocked)\n"
        "try:\n"
        "    import partial_embedding.keras_hub\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'pip install "tf-partial-embedding[keras-hub]"' in result.stdout


def test_keras_file_loads_in_a_fresh_process(trained: dict, tmp_path: object) -> None:
    if trained["family"] != "gpt2":
        pytest.skip("one family is enough for the fresh-process load")
    model = trained["added"].model
    path, ids_path, out = tmp_path / "m.keras", tmp_path / "ids.npy", tmp_path / "out.npy"
    model.save(str(path))
    ids = _ids(high=VOCAB + NEW, seed=13)
    np.save(ids_path, ids)
    result = _run_python(
        "import numpy as np, keras, partial_embedding.keras_hub\n"
        f"model = keras.saving.load_model({str(path)!r})\n"
        f"ids = np.load({str(ids_path)!r})\n"
        "logits = model({'token_ids': ids, 'padding_mask': np.ones_like(ids)})\n"
        f"np.save({str(out)!r}, keras.ops.convert_to_numpy(logits))\n"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_array_equal(np.load(out), _numpy(model(_lm_inputs(ids))))
