"""Tests of ``python -m partial_embedding.demo`` in a reduced size.

The data tests need the two files that gensim's wheel ships; without gensim
they are skipped (the message test below still runs).
"""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import pytest

from partial_embedding import demo
from partial_embedding.demo import _data as data
from partial_embedding.demo import _sentiment as sentiment
from partial_embedding.demo import _training as training


@pytest.fixture(scope="module")
def data_dir():
    try:
        return data.find_data_dir()
    except data.DemoDataError as error:
        pytest.skip(f"the demo's data is not installed: {error}")


def test_check_frozen_rows_sees_one_flipped_bit():
    reference = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    reference[7, 2] = 0.0
    frozen = np.ones(50, dtype=bool)
    frozen[40:] = False
    final = reference.copy()
    final[45] += 1.0  # a trainable row: counted as updated, not as moved
    assert training.check_frozen_rows(reference, final, frozen).passed

    codes = (reference * 100).astype(np.int8)
    changed_codes = codes.copy()
    changed_codes[45] += 1
    assert training.check_frozen_rows(codes, changed_codes, frozen).passed
    changed_codes[2, 0] ^= 1  # one bit of an int8 frozen row
    assert training.check_frozen_rows(codes, changed_codes, frozen).moved_rows == [2]

    final[3, 1] = np.nextafter(final[3, 1], np.float32(np.inf))
    final[7, 2] = -0.0  # equal as a value, different bits
    proof = training.check_frozen_rows(reference, final, frozen)
    assert not proof.passed
    assert proof.moved_rows == [3, 7]
    assert proof.updated_rows == 1
    assert proof.digest_before != proof.digest_after


def test_build_table_maps_the_vocabulary_with_table_from_pretrained():
    words = ["good", "bad", "film"]
    vectors = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5
    sentences = [["good", "plot"], ["bad", "acting", "plot"]]
    table = data.build_table(words, vectors, sentences, vocab_size=10, seed=0)

    # padding, 3 pretrained, 4 synthetic, then the 2 review words the vectors lack
    assert table.num_rows == 10 and table.num_synthetic == 4
    assert table.new_words == ["acting", "plot"]
    np.testing.assert_array_equal(table.new_ids, [8, 9])
    assert table.word_ids["acting"] == 8 and table.word_ids["film"] == 3
    assert table.table.dtype == np.float32
    np.testing.assert_array_equal(table.table[0].view(np.uint32), [0, 0])
    np.testing.assert_array_equal(table.table[1:4].view(np.uint32), vectors.view(np.uint32))
    assert np.all(table.table[4:] != 0)

    coverage = table.coverage
    assert coverage is not None
    assert (coverage.num_tokens, coverage.num_pretrained, coverage.num_new) == (6, 3, 3)
    assert coverage.reserved == ("",)
    assert coverage.missing_examples == ("acting", "plot")


def test_missing_gensim_gives_a_clear_message(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def without_gensim(name, *args, **kwargs):
        return None if name == "gensim" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", without_gensim)
    with pytest.raises(data.DemoDataError, match=r"pip install gensim"):
        data.find_data_dir()
    assert demo.main(["--epochs", "1"]) == 2


def test_data_files_parse_as_documented(data_dir):
    words, vectors = data.load_word_vectors(data_dir / data.PRETRAINED_FILE)
    assert vectors.shape == (1762, 10) and vectors.dtype == np.float32
    assert words[:3] == ["the", "to", "of"]
    sentences, labels = data.load_labeled_sentences(data_dir / data.REVIEWS_FILE)
    assert len(sentences) == 200
    assert labels.sum() == 100  # 100 positive, 100 negative
    assert all(sentences)

    gensim_models = pytest.importorskip("gensim.models")
    loaded = gensim_models.KeyedVectors.load_word2vec_format(str(data_dir / data.PRETRAINED_FILE))
    assert loaded.index_to_key == words
    np.testing.assert_array_equal(loaded.vectors.view(np.uint32), vectors.view(np.uint32))


def test_demo_trains_new_rows_only_and_proves_it(data_dir):
    args = sentiment.parse_args(
        ["--vocab-size", "20000", "--epochs", "6", "--baseline-steps", "3", "--seed", "3"]
    )
    output = io.StringIO()
    result = sentiment.run_demo(args, stream=output)
    text = output.getvalue()

    assert result["proof_passed"], text
    assert result["frozen_rows_moved"] == 0
    assert result["vocab_size"] == 20000
    assert result["rows_frozen"] == 20000 - result["new_rows"]
    assert 0 < result["rows_updated"] <= result["rows_trainable"] == result["new_rows"]
    assert result["digest_before"] == result["digest_after"]
    assert result["slots_checked"], "Adam's slots of the table should have been checked"
    losses = result["epoch_losses"]
    assert len(losses) == 6
    assert losses[-1] < 0.9 * losses[0], losses
    # The stock layer trains every row it sees: pretrained rows move there.
    assert result["stock_frozen_rows_moved"] > 0
    assert result["stock_step_ms"] > 0 and result["step_ms"] > 0
    assert "PASSED: all" in text and "loss curve" in text and "keras.layers.Embedding" in text
    # The coverage report of pe.table_from_pretrained over padding, pretrained and new words.
    real_rows = 1 + result["pretrained_rows"] + result["new_rows"]
    assert result["pretrained_fraction"] == pytest.approx(result["pretrained_rows"] / real_rows)
    assert f"{real_rows:,} rows: {result['pretrained_rows']:,} (" in text
    assert f"1 reserved ('') and {result['new_rows']:,} missing tokens" in text


def test_demo_fails_loudly_when_a_frozen_row_moved(data_dir, monkeypatch, capsys):
    real_train = sentiment.train

    def train_then_tamper(**kwargs):
        run = real_train(**kwargs)
        run.final_table[1, 0] = np.nextafter(run.final_table[1, 0], np.float32(np.inf))
        return run

    monkeypatch.setattr(sentiment, "train", train_then_tamper)
    status = demo.main(["--vocab-size", "0", "--epochs", "1", "--no-baseline"])
    captured = capsys.readouterr()
    assert status == 1
    assert "FROZEN-ROW PROOF FAILED" in captured.err
    assert "PASSED" not in captured.out


def test_demo_with_int8_prints_both_accuracies_and_proves_the_int8_rows(data_dir):
    args = sentiment.parse_args(
        ["--vocab-size", "5000", "--epochs", "4", "--no-baseline", "--int8", "--seed", "1"]
    )
    output = io.StringIO()
    result = sentiment.run_demo(args, stream=output)
    text = output.getvalue()

    assert result["int8_proof_passed"] and result["all_proofs_passed"], text
    assert result["int8_frozen_rows_moved"] == 0
    assert 0.0 <= result["int8_test_accuracy"] <= 1.0
    losses = result["int8_epoch_losses"]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    line = next(line for line in text.splitlines() if line.startswith("held-out accuracy"))
    assert f"float frozen rows {result['test_accuracy']:.3f}" in line
    assert f"int8 frozen rows {result['int8_test_accuracy']:.3f}" in line
    assert "int8 rows unchanged, scales unchanged" in text


def test_demo_fails_loudly_when_an_int8_frozen_row_moved(data_dir, monkeypatch, capsys):
    real_train = sentiment.train

    def train_then_tamper(**kwargs):
        run = real_train(**kwargs)
        for _, proof in run.quantized_checks:
            proof.moved_rows.append(1)
        return run

    monkeypatch.setattr(sentiment, "train", train_then_tamper)
    status = demo.main(["--vocab-size", "0", "--epochs", "1", "--no-baseline", "--int8"])
    captured = capsys.readouterr()
    assert status == 1
    assert "FROZEN-ROW PROOF FAILED (int8)" in captured.err
