"""Tiny keras-hub backbones with random weights for the keras_hub tests.

Each builder seeds Keras first, so a given seed and config give the same
weights every time; keyword overrides replace or extend the small defaults.
Import this module only after ``pytest.importorskip("keras_hub")``.
"""

from __future__ import annotations

from typing import Any

import keras
import keras_hub

# One layer, two heads, width 16: small enough to build and fit in a moment.
_MULTI_HEAD = {
    "num_layers": 1,
    "num_heads": 2,
    "hidden_dim": 16,
    "intermediate_dim": 32,
    "max_sequence_length": 16,
}
# The same sizes for the grouped-query families (two query heads share one key/value head).
_GROUPED_QUERY = {
    "num_layers": 1,
    "num_query_heads": 2,
    "num_key_value_heads": 1,
    "hidden_dim": 16,
    "intermediate_dim": 32,
}


def tiny_backbone(backbone_class: type, vocabulary_size: int, seed: int, **overrides: Any) -> Any:
    """Builds a one-layer multi-head backbone (GPT-2, BERT, BART, ESM...).

    Args:
        backbone_class: The keras-hub backbone class to build.
        vocabulary_size: Rows of the token table.
        seed: Passed to ``keras.utils.set_random_seed`` before building.
        **overrides: Config values that replace or extend the defaults.

    Returns:
        The backbone, with random weights.
    """
    keras.utils.set_random_seed(seed)
    return backbone_class(vocabulary_size=vocabulary_size, **{**_MULTI_HEAD, **overrides})


def tiny_gpt2(vocabulary_size: int, seed: int, **overrides: Any) -> Any:
    """A one-layer ``GPT2Backbone``; see ``tiny_backbone``."""
    return tiny_backbone(keras_hub.models.GPT2Backbone, vocabulary_size, seed, **overrides)


def tiny_bert(vocabulary_size: int, seed: int, **overrides: Any) -> Any:
    """A one-layer ``BertBackbone``; see ``tiny_backbone``."""
    return tiny_backbone(keras_hub.models.BertBackbone, vocabulary_size, seed, **overrides)


def _grouped_query(backbone_class: type, vocabulary_size: int, seed: int, **overrides: Any) -> Any:
    keras.utils.set_random_seed(seed)
    return backbone_class(vocabulary_size=vocabulary_size, **{**_GROUPED_QUERY, **overrides})


def tiny_llama(vocabulary_size: int, seed: int, **overrides: Any) -> Any:
    """A one-layer ``LlamaBackbone`` (grouped-query attention); see ``tiny_backbone``."""
    return _grouped_query(keras_hub.models.LlamaBackbone, vocabulary_size, seed, **overrides)


def tiny_gemma(vocabulary_size: int, seed: int, **overrides: Any) -> Any:
    """A one-layer ``GemmaBackbone`` with head width 8; see ``tiny_backbone``."""
    config = {"head_dim": 8, **overrides}
    return _grouped_query(keras_hub.models.GemmaBackbone, vocabulary_size, seed, **config)
