"""partial_embedding.keras_hub: LoRA beside the new rows, MultiOptimizer, other task kinds."""

from __future__ import annotations

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras  # noqa: E402
from keras_hub_models import tiny_backbone, tiny_bert, tiny_gemma, tiny_gpt2  # noqa: E402

import partial_embedding as pe  # noqa: E402
import partial_embedding.keras_hub as pek  # noqa: E402

VOCAB, NEW, SEQ = 64, 3, 8


def _numpy(value: object) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value))


def _gemma_lm() -> object:
    backbone = tiny_gemma(VOCAB, 11)
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


@pytest.fixture(scope="module")
def gemma() -> object:
    return _gemma_lm()


def _data() -> tuple[dict, np.ndarray]:
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(8, SEQ)).astype("int32")
    ids[:, ::3] = np.arange(VOCAB, VOCAB + NEW)
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}, np.roll(ids, -1, axis=1)


def _loss() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _snapshot(model: object) -> dict[str, np.ndarray]:
    return {w.path: _numpy(w) for w in model.weights}


def test_lora_beside_the_new_rows_in_one_fit(gemma: object) -> None:
    model = pek.add_tokens(gemma, NEW, train_only_new=False).model
    model.backbone.enable_lora(2)
    # enable_lora freezes every layer of the backbone: let the table learn again.
    model.backbone.token_embedding.trainable = True
    trainable = sorted(w.path for w in model.trainable_weights)
    assert "token_embedding/embeddings" in trainable
    assert any("lora" in path for path in trainable), trainable
    before = _snapshot(model)
    optimizer = pe.MaskedOptimizer(keras.optimizers.AdamW(learning_rate=0.05))
    model.compile(optimizer=optimizer, loss=_loss(), jit_compile=False)
    inputs, labels = _data()
    model.fit(inputs, labels, batch_size=4, epochs=2, verbose=0)
    after = _snapshot(model)
    table_before, table_after = (
        before["token_embedding/embeddings"],
        after["token_embedding/embeddings"],
    )
    np.testing.assert_array_equal(table_after[:VOCAB], table_before[:VOCAB])
    assert np.all(np.any(table_after[VOCAB:] != table_before[VOCAB:], axis=1))
    lora_moved = [p for p in after if "lora_kernel_b" in p and np.any(after[p] != before[p])]
    assert lora_moved, "no LoRA weight moved"
    frozen = [p for p in after if p not in trainable and "lora" not in p]
    for path in frozen:
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)


def test_multi_optimizer_masked_for_the_table_stock_for_the_rest(gemma: object) -> None:
    assert hasattr(keras.optimizers, "MultiOptimizer")
    model = pek.add_tokens(gemma, NEW, train_only_new=False).model
    masked = pe.MaskedOptimizer(keras.optimizers.AdamW(learning_rate=0.05))
    routes = keras.optimizers.OptimizerMap(default_optimizer=keras.optimizers.SGD(0.01))
    routes["^token_embedding/.*"] = masked
    model.compile(
        optimizer=keras.optimizers.MultiOptimizer(routes), loss=_loss(), jit_compile=False
    )
    before = _snapshot(model)
    inputs, labels = _data()
    model.fit(inputs, labels, batch_size=4, epochs=1, verbose=0)
    after = _snapshot(model)
    table_before, table_after = (
        before["token_embedding/embeddings"],
        after["token_embedding/embeddings"],
    )
    np.testing.assert_array_equal(table_after[:VOCAB], table_before[:VOCAB])
    assert np.all(np.any(table_after[VOCAB:] != table_before[VOCAB:], axis=1))
    moved = [
        p for p in after if not p.startswith("token_embedding/") and np.any(after[p] != before[p])
    ]
    assert moved, "the stock optimizer moved nothing"
    table = model.backbone.token_embedding
    assert masked.compact_slot_rows(table.embeddings) == NEW


def test_gemma_reserved_ids_train_without_growing(gemma: object) -> None:
    reserved = [60, 61, 62, 63]
    added = pek.add_tokens(gemma, reserved, init=None)
    model = added.model
    assert model.backbone.token_embedding.input_dim == VOCAB
    before = _numpy(model.backbone.token_embedding.embeddings)
    np.testing.assert_array_equal(before, _numpy(gemma.backbone.token_embedding.embeddings))
    ids = np.random.default_rng(1).integers(1, VOCAB, size=(4, SEQ)).astype("int32")
    ids[:, 0] = 61
    model.compile(
        optimizer=pe.MaskedOptimizer(keras.optimizers.AdamW(0.05)), loss=_loss(), jit_compile=False
    )
    model.fit(
        {"token_ids": ids, "padding_mask": np.ones_like(ids)},
        np.roll(ids, -1, 1),
        epochs=1,
        verbose=0,
    )
    after = _numpy(model.backbone.token_embedding.embeddings)
    np.testing.assert_array_equal(after[:60], before[:60])
    assert np.all(np.any(after[60:] != before[60:], axis=1))


def test_masked_lm_head_bias_grows_with_old_values() -> None:
    backbone = tiny_bert(VOCAB, 12)
    task = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    inputs = {
        "token_ids": np.ones((1, SEQ), "int32"),
        "segment_ids": np.zeros((1, SEQ), "int32"),
        "padding_mask": np.ones((1, SEQ), "int32"),
        "mask_positions": np.array([[1, 2]]),
    }
    before = _numpy(task(inputs))
    bias = [w for w in task.weights if tuple(w.shape) == (VOCAB,)]
    assert bias
    bias[0].assign(np.linspace(-1, 1, VOCAB).astype("float32"))
    before = _numpy(task(inputs))
    model = pek.add_tokens(task, NEW).model
    assert type(model) is keras_hub.models.BertMaskedLM
    new_bias = [
        w for w in model.weights if tuple(w.shape) == (VOCAB + NEW,) and "mask" not in w.path
    ]
    assert len(new_bias) == 1
    np.testing.assert_array_equal(_numpy(new_bias[0])[:VOCAB], _numpy(bias[0]))
    np.testing.assert_array_equal(_numpy(new_bias[0])[VOCAB:], np.zeros(NEW))
    np.testing.assert_allclose(_numpy(model(inputs))[..., :VOCAB], before, rtol=0, atol=1e-5)
    assert sorted(w.path for w in model.trainable_weights) == ["token_embedding/embeddings"]


def test_seq2seq_lm_keeps_its_kind() -> None:
    backbone = tiny_backbone(keras_hub.models.BartBackbone, VOCAB, 13)
    task = keras_hub.models.BartSeq2SeqLM(backbone=backbone, preprocessor=None)
    model = pek.add_tokens(task, NEW).model
    assert type(model) is keras_hub.models.BartSeq2SeqLM
    table = model.backbone.token_embedding
    assert type(table) is pe.PartialReversibleEmbedding
    assert table.trainable_ids.tolist() == [VOCAB, VOCAB + 1, VOCAB + 2]


def test_plain_embedding_backbone_gets_partial_embedding() -> None:
    backbone = tiny_backbone(keras_hub.models.ESMBackbone, VOCAB, 14)
    model = pek.add_tokens(backbone, NEW).model
    table = model.token_embedding
    assert type(table) is pe.PartialEmbedding
    assert table.trainable_ids.tolist() == [VOCAB, VOCAB + 1, VOCAB + 2]
    ids = np.random.default_rng(2).integers(1, VOCAB, size=(2, SEQ)).astype("int32")
    inputs = {"token_ids": ids}
    np.testing.assert_array_equal(_numpy(model(inputs)), _numpy(backbone(inputs)))


def test_weights_pair_up_by_path_or_the_rebuild_is_refused() -> None:
    from partial_embedding._keras_hub import rebuild

    def model(name: str, width: int = 2) -> keras.Model:
        inputs = keras.Input((3,))
        return keras.Model(inputs, keras.layers.Dense(width, name=name)(inputs))

    source, same, renamed = model("head"), model("head"), model("other")
    source.layers[-1].kernel.assign(np.arange(6, dtype="float32").reshape(3, 2))
    rebuild.copy_weights(source, same, set(), set())
    np.testing.assert_array_equal(_numpy(same.layers[-1].kernel), _numpy(source.layers[-1].kernel))
    with pytest.raises(pe.PartialEmbeddingTypeError, match="stands where the original has"):
        rebuild.copy_weights(source, renamed, set(), set())
    with pytest.raises(pe.PartialEmbeddingTypeError, match="does not pair with"):
        rebuild.copy_weights(model("head", 3), model("head", 2), set(), set())


def test_fit_under_xla_freezes_old_rows_and_lowers_the_loss() -> None:
    backbone = tiny_gpt2(VOCAB, 15)
    model = pek.add_tokens(keras_hub.models.GPT2CausalLM(backbone, preprocessor=None), NEW).model
    before = _numpy(model.backbone.token_embedding.embeddings)
    model.compile(
        optimizer=pe.MaskedOptimizer(keras.optimizers.AdamW(0.05)), loss=_loss(), jit_compile=True
    )
    inputs, labels = _data()
    history = model.fit(inputs, labels, batch_size=4, epochs=3, verbose=0)
    after = _numpy(model.backbone.token_embedding.embeddings)
    np.testing.assert_array_equal(after[:VOCAB], before[:VOCAB])
    assert np.all(np.any(after[VOCAB:] != before[VOCAB:], axis=1))
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
