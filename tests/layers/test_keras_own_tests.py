"""Keras' own tests of ``Embedding`` and ``ReversibleEmbedding``, run against our layers.

Each test method of the installed ``keras/src/layers/core/embedding_test.py``
and ``reversible_embedding_test.py`` runs with ``PartialEmbedding`` /
``PartialReversibleEmbedding`` in place of Keras' class: the test module's
``layers`` is swapped for a stand-in that answers the one name with ours and
every other with Keras' own. A test that checks something we do differently
on purpose (docs/keras_differences.md) is an expected failure, strict, with
the error it must fail with and the reason; every other test must pass.

Keras wheels before 3.15 (3.13, 3.14) ship no tests: there the module is
skipped. A test that a Keras release lacks is simply not collected.
"""

from __future__ import annotations

import importlib
import re
import types
import unittest
from typing import Any, NamedTuple

import pytest
from keras.src import layers as keras_layers

import partial_embedding as pe

pytest.importorskip(
    "keras.src.layers.core.embedding_test",
    reason="this Keras wheel ships no tests (3.13 and 3.14 do not)",
)


class Suite(NamedTuple):
    module: str
    test_case: str
    keras_name: str
    ours: type


SUITES = (
    Suite("embedding_test", "EmbeddingTest", "Embedding", pe.PartialEmbedding),
    Suite(
        "reversible_embedding_test",
        "ReversibleEmbeddingTest",
        "ReversibleEmbedding",
        pe.PartialReversibleEmbedding,
    ),
)


class DesignChoice(NamedTuple):
    pattern: str
    raises: type[BaseException]
    reason: str


# First match wins: `test_int4_block_size_with_lora_*` fails on int4 before it
# reaches LoRA, `test_quantize_lora_integration_int4` on LoRA before int4.
DESIGN_CHOICES = (
    DesignChoice(
        r"^test_enable_lora_with_embeddings_constraint$",
        AssertionError,
        "LoRA is refused with any constraint, by our message instead of Keras' "
        "'incompatible with embedding constraints'",
    ),
    DesignChoice(
        r"^test_(enable_lora|lora_rank_argument|quantize_lora_integration)",
        ValueError,
        "LoRA is refused: a low-rank delta moves every row, frozen ones included",
    ),
    DesignChoice(
        # An unbuilt layer refuses quantize as Keras' does, before the mode.
        r"^(?!test_quantize_on_unbuilt_layer).*int4",
        NotImplementedError,
        "int4 is not supported: frozen rows are quantized to int8 only",
    ),
    DesignChoice(
        r"^test_legacy_load_own_variables$",
        NotImplementedError,
        "its int4 part: int4 is not supported (its float32 and int8 parts pass)",
    ),
    DesignChoice(
        r"^test_(embedding_basics|sparse|ragged)$",
        AssertionError,
        "trainable_mask is a non-trainable weight: the mask is state, saved with the table",
    ),
    DesignChoice(
        r"^test_quantize_(by_setting_dtype_policy|dtype_argument)_int8",
        AssertionError,
        "an int8 layer keeps its trainable rows in float: a trainable float store "
        "(and its row maps) next to Keras' int8 table and scales",
    ),
)


def _test_class(suite: Suite) -> type[unittest.TestCase]:
    module = importlib.import_module(f"keras.src.layers.core.{suite.module}")
    return getattr(module, suite.test_case)


def _cases() -> list[Any]:
    cases = []
    for suite in SUITES:
        test_class = _test_class(suite)
        for name in unittest.TestLoader().getTestCaseNames(test_class):
            # Keras' own marks (skipif on backends) hold for us too.
            marks = list(getattr(getattr(test_class, name), "pytestmark", []))
            choice = next((c for c in DESIGN_CHOICES if re.search(c.pattern, name)), None)
            if choice is not None:
                marks.append(
                    pytest.mark.xfail(raises=choice.raises, reason=choice.reason, strict=True)
                )
            cases.append(pytest.param(suite, name, marks=marks, id=f"{suite.module}::{name}"))
    return cases


def _layers_with(suite: Suite) -> types.ModuleType:
    """Keras' ``layers`` module, except that ``suite.keras_name`` is our class."""
    stand_in = types.ModuleType(keras_layers.__name__)
    stand_in.__getattr__ = lambda name: getattr(keras_layers, name)  # type: ignore[method-assign]
    setattr(stand_in, suite.keras_name, suite.ours)
    return stand_in


@pytest.mark.parametrize("suite, name", _cases())
def test_keras_own_test(suite: Suite, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    test_class = _test_class(suite)
    module = importlib.import_module(test_class.__module__)
    monkeypatch.setattr(module, "layers", _layers_with(suite))
    # debug() runs setUp, the test and the clean-ups, letting the test's own
    # exception through (unittest.SkipTest is a pytest skip).
    test_class(name).debug()
