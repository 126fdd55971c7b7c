"""Rebuilding a keras-hub backbone or task model around a partial token embedding."""

from __future__ import annotations

import re
from typing import Any

import keras
import keras_hub
import numpy as np

from partial_embedding._keras_hub import backbones
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.layers import PartialEmbedding

__all__ = [
    "backbone_of",
    "backbone_of_rebuilt",
    "copy_weights",
    "freeze_all_but_table",
    "rebuild_backbone",
    "rebuild_task",
    "table_variables",
]


def _backbone(model: Any) -> Any:
    if isinstance(model, keras_hub.models.Task):
        return getattr(model, "backbone", None)
    if isinstance(model, keras_hub.models.Backbone):
        return model
    raise PartialEmbeddingTypeError(
        "model: must be a keras_hub.models.Backbone or a keras_hub.models.Task "
        f"holding one; got {type(model).__name__}"
    )


def backbone_of(model: Any) -> Any:
    """The backbone of a keras-hub backbone or task model, checked.

    Raises:
      PartialEmbeddingTypeError: neither kind, or no stock token embedding.
    """
    backbone = _backbone(model)
    table = getattr(backbone, "token_embedding", None)
    if isinstance(table, PartialEmbedding):
        raise PartialEmbeddingTypeError(
            f"model: {type(backbone).__name__}'s token_embedding is already a "
            f"{type(table).__name__} (add_tokens takes a model with a stock one)"
        )
    if not isinstance(table, keras.layers.Embedding):
        raise PartialEmbeddingTypeError(
            f"model: {type(backbone).__name__} has no token_embedding that is a "
            f"keras.layers.Embedding or ReversibleEmbedding (got {type(table).__name__})"
        )
    if "vocabulary_size" not in backbone.get_config():
        raise PartialEmbeddingTypeError(
            f"model: {type(backbone).__name__}'s config has no vocabulary_size to grow"
        )
    return backbone


def backbone_of_rebuilt(model: Any) -> Any:
    """The backbone of a model ``add_tokens`` returned, checked.

    Raises:
      PartialEmbeddingTypeError: neither kind, or no partial token embedding.
    """
    backbone = _backbone(model)
    if not isinstance(getattr(backbone, "token_embedding", None), PartialEmbedding):
        raise PartialEmbeddingTypeError(
            "model: its token_embedding is not a partial layer (pass the model add_tokens returned)"
        )
    return backbone


def table_variables(layer: Any) -> set[int]:
    """The ids of a token embedding's variables (tables and masks)."""
    return {id(variable) for variable in layer.weights}


def _others(model: Any, excluded: set[int]) -> list[Any]:
    return [variable for variable in model.weights if id(variable) not in excluded]


def _path_key(path: str) -> str:
    """``path`` without the numbers Keras appends to names it makes unique."""
    return "/".join(re.sub(r"_\d+$", "", part) for part in path.split("/"))


def copy_weights(
    old_model: Any, new_model: Any, excluded_old: set[int], excluded_new: set[int]
) -> None:
    """Copies every variable of ``old_model`` but ``excluded_old`` into ``new_model``'s.

    Both models come from the same constructor and configuration (but for
    the vocabulary size), so their other variables pair up in order; each
    pair must have the same path (but for the numbers Keras appends to make
    a layer name unique). A
    variable that grew with the vocabulary (a head's bias ``[V]``) gets the
    old values in its first rows and zeros after. Trainable flags carry over.

    Raises:
      PartialEmbeddingTypeError: the variables do not pair up by count, path
        or shape (the model builds something that depends on more than its
        configuration).
    """
    old_variables = _others(old_model, excluded_old)
    new_variables = _others(new_model, excluded_new)
    if len(old_variables) != len(new_variables):
        raise PartialEmbeddingTypeError(
            f"{type(old_model).__name__}: the rebuilt model has {len(new_variables)} "
            f"other variables, the original {len(old_variables)}"
        )
    for old, new in zip(old_variables, new_variables, strict=True):
        if _path_key(old.path) != _path_key(new.path):
            raise PartialEmbeddingTypeError(
                f"{type(old_model).__name__}: the rebuilt model's variable {new.path!r} "
                f"stands where the original has {old.path!r}"
            )
        values = keras.ops.convert_to_numpy(old)
        if tuple(old.shape) != tuple(new.shape):
            values = _grown_values(values, tuple(new.shape), old.path)
        new.assign(values)
        new.trainable = old.trainable


def _grown_values(values: np.ndarray, shape: tuple[int, ...], path: str) -> np.ndarray:
    grows = len(shape) == values.ndim and all(
        new >= old for new, old in zip(shape, values.shape, strict=True)
    )
    if not grows:
        raise PartialEmbeddingTypeError(
            f"{path}: shape {values.shape} does not pair with the rebuilt {shape}"
        )
    grown = np.zeros(shape, dtype=values.dtype)
    grown[tuple(slice(0, size) for size in values.shape)] = values
    return grown


def rebuild_backbone(backbone: Any, token_embedding: Any) -> Any:
    """A backbone of ``backbone``'s class and config around ``token_embedding``.

    Only ``vocabulary_size`` changes (to ``token_embedding.input_dim``);
    every other weight is copied.
    """
    config = {**backbone.get_config(), "vocabulary_size": token_embedding.input_dim}
    partial_class = backbones.partial_class(type(backbone))
    with backbones.prepared_token_embedding(token_embedding):
        rebuilt = partial_class.from_config(config)
    backbones.check_swapped(rebuilt, token_embedding)
    copy_weights(
        backbone,
        rebuilt,
        table_variables(backbone.token_embedding),
        table_variables(token_embedding),
    )
    return rebuilt


def rebuild_task(task: Any, backbone: Any, preprocessor: Any) -> Any:
    """A task of ``task``'s class and config around a rebuilt ``backbone``; head weights copied."""
    config = {**task.get_config(), "backbone": backbone, "preprocessor": preprocessor}
    try:
        task_class: Any = type(task)
        rebuilt = task_class.from_config(config)
    except (TypeError, ValueError) as error:
        raise PartialEmbeddingTypeError(
            f"model: {type(task).__name__} cannot be rebuilt from its config ({error})"
        ) from error
    copy_weights(
        task,
        rebuilt,
        {id(variable) for variable in task.backbone.weights},
        {id(variable) for variable in backbone.weights},
    )
    return rebuilt


def _all_layers(model: Any) -> list[Any]:
    return [layer for layer in model.layers if layer is not model]


def freeze_all_but_table(model: Any, backbone: Any) -> None:
    """Freezes every weight of ``model`` but those of ``backbone.token_embedding``.

    Raises:
      PartialEmbeddingArgumentError: a weight that could not be frozen
        (owned by the model itself rather than one of its layers).
    """
    table = backbone.token_embedding
    model.trainable = True
    backbone.trainable = True
    for layer in _all_layers(model) + _all_layers(backbone):
        if layer is not backbone and layer is not table:
            layer.trainable = False
    # Last: a head sharing the table (MaskedLMHead) froze it with itself.
    table.trainable = True
    allowed = table_variables(table)
    stray = [v.path for v in model.trainable_weights if id(v) not in allowed]
    if stray:
        raise PartialEmbeddingArgumentError(
            f"train_only_new=True: could not freeze {stray} (weights of the model itself)"
        )
