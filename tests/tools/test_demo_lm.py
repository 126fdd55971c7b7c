"""The language-model demo: new tokens of a tied model learn, old rows stay, the rows round-trip."""

from __future__ import annotations

import io

import numpy as np
import pytest

from partial_embedding.demo import _lm as demo_lm


def test_vocabulary_has_the_pretrained_rows_then_the_new_tokens():
    vocabulary = demo_lm.build_vocabulary(new_tokens=25)
    assert vocabulary.size == demo_lm.PRETRAINED_ROWS + 25
    assert vocabulary.pretrained_rows == demo_lm.PRETRAINED_ROWS
    np.testing.assert_array_equal(
        vocabulary.new_ids, np.arange(demo_lm.PRETRAINED_ROWS, demo_lm.PRETRAINED_ROWS + 25)
    )
    # The new tokens are words of the text that the pretrained rows lack.
    new_words = set(vocabulary.tokens[demo_lm.PRETRAINED_ROWS :])
    assert not new_words & set(vocabulary.tokens[: demo_lm.PRETRAINED_ROWS])
    assert (vocabulary.ids >= demo_lm.PRETRAINED_ROWS).any()


@pytest.mark.slow
def test_demo_trains_new_tokens_only_and_round_trips_them():
    args = demo_lm.parse_args(
        ["--lm", "--new-tokens", "20", "--width", "16", "--epochs", "2", "--length", "16"]
    )
    result = demo_lm.run_lm_demo(args, stream=None)
    assert result.old_rows_moved == 0
    assert 0 < result.new_rows_moved <= 20
    assert result.outputs_identical, result.max_output_difference
    assert result.losses[-1] < result.losses[0], result.losses
    # 20 trained rows of a 32,788-row table: far below 1 % of its bytes.
    assert result.file_bytes <= 0.01 * result.table_bytes
    assert result.passed
    text = io.StringIO()
    demo_lm.report(result, text)
    assert "PASSED" in text.getvalue()
