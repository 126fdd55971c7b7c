"""New tokens for a keras-hub model in one call: grow or reuse rows, train only them.

Needs the ``keras-hub`` extra (``pip install "tf-partial-embedding[keras-hub]"``);
``import partial_embedding`` does not import keras-hub, this module does.

* :func:`add_tokens` takes a keras-hub backbone or task model and gives back
  the same kind of model, its vocabulary grown (or not, for existing ids),
  every pretrained weight in place, and a ``PartialReversibleEmbedding`` (a
  ``PartialEmbedding`` for a plain ``Embedding``) as its ``token_embedding``
  that trains only the new rows.
* :func:`merge_into_preset` writes the trained rows into a preset that plain
  keras-hub loads with ``from_preset``.

Importing this module registers, for every backbone class of
``keras_hub.models``, the subclass a rebuilt model uses, so that its
``.keras`` file loads with ``keras.saving.load_model`` and no
``custom_objects`` (once this module is imported).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import keras
import numpy as np

from partial_embedding._internal.types import Initializer, KerasModel, NewTokens, PathLike
from partial_embedding._keras_hub import backbones, rebuild, tokens
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError
from partial_embedding.layers import PartialEmbedding, PartialReversibleEmbedding
from partial_embedding.trained_rows import merge_trained_rows

__all__ = ["AddedTokens", "add_tokens", "merge_into_preset"]

_NAMED_INITS = ("mean", "mean_cov", "subword_mean", "zeros")

backbones.register_all()


@dataclasses.dataclass(frozen=True, eq=False)
class AddedTokens:
    """What :func:`add_tokens` returns.

    Attributes:
      model: The rebuilt model, of the kind passed in.
      new_ids: int64, sorted: the rows that train (the new tokens' ids, or
        the ids passed); padding rows are not among them.
      tokens: The strings added, in order of ``new_ids``; None for a count
        or ids.
      init: The ``init`` used.
    """

    model: Any
    new_ids: np.ndarray
    tokens: list[str] | None
    init: Any


def _check_options(init: Any, pad_to_multiple_of: Any, request: tokens.NewTokens) -> None:
    """Raises for an ``init`` or ``pad_to_multiple_of`` that cannot apply."""
    subword_mean = isinstance(init, str) and init == "subword_mean"
    if subword_mean and request.tokens is None:
        raise PartialEmbeddingArgumentError(
            "init='subword_mean' needs new_tokens as strings (the tokenizer splits them)"
        )
    if isinstance(init, str) and init not in _NAMED_INITS:
        try:
            keras.initializers.get(init)
        except ValueError:
            raise PartialEmbeddingTypeError(
                f"init: must be one of {_NAMED_INITS} or a Keras initializer; got {init!r}"
            ) from None
    if pad_to_multiple_of is None:
        return
    if (
        isinstance(pad_to_multiple_of, bool)
        or not isinstance(pad_to_multiple_of, (int, np.integer))
        or pad_to_multiple_of <= 0
    ):
        raise PartialEmbeddingArgumentError(
            f"pad_to_multiple_of: must be a positive integer; got {pad_to_multiple_of!r}"
        )
    if request.ids is not None:
        raise PartialEmbeddingArgumentError(
            "pad_to_multiple_of: applies when rows are added, not to existing ids"
        )


def _table_init(init: Any, request: tokens.NewTokens, model: Any, extra_rows: int) -> Any:
    """``init`` as ``from_layer`` takes it (subword means become an array)."""
    if not (isinstance(init, str) and init == "subword_mean"):
        return init
    table = keras.ops.convert_to_numpy(rebuild.backbone_of(model).token_embedding.embeddings)
    rows = tokens.subword_rows(model.preprocessor, request.tokens or (), table)
    padding = np.broadcast_to(
        table.astype(np.float64).mean(axis=0), (extra_rows - len(rows), table.shape[1])
    )
    return np.concatenate([rows, padding])


def _new_preprocessor(model: Any, request: tokens.NewTokens, vocabulary_size: int) -> Any:
    preprocessor = getattr(model, "preprocessor", None)
    if request.tokens is None:
        return preprocessor
    tokenizer = tokens.extended_tokenizer(preprocessor, request.tokens, vocabulary_size)
    return tokens.extended_preprocessor(preprocessor, tokenizer)


def add_tokens(
    model: KerasModel,
    new_tokens: NewTokens,
    *,
    init: Initializer = "mean",
    pad_to_multiple_of: int | None = None,
    train_only_new: bool = True,
    seed: int | None = None,
) -> AddedTokens:
    """Adds tokens (or picks existing ones) to a keras-hub model and trains only their rows.

    The model passed in is not modified: a new one of the same class and
    configuration (but ``vocabulary_size``) is built, every pretrained weight
    copied into it bit for bit, with a partial token embedding whose
    ``trainable_mask`` permits exactly ``new_ids``. Train it with
    ``partial_embedding.MaskedOptimizer``. The contract (tokenizers, LoRA
    beside the new rows, saving): docs/keras_hub.md.

    Args:
      model: A ``keras_hub.models.Backbone`` with a stock ``token_embedding``
        (``ReversibleEmbedding`` or ``Embedding``), or a task model holding one.
      new_tokens: A count of rows to add; a list of token strings, added to
        the task's tokenizer; or a list of existing ids to train without
        growing (Gemma's unused tokens).
      init: How the rows that train start: ``"mean"``, ``"mean_cov"``,
        ``"subword_mean"``, ``"zeros"``, any Keras initializer, or, for
        existing ids only, None to keep their values.
      pad_to_multiple_of: Grow the table to a multiple of this; padding rows
        get ``init`` (``subword_mean``: the mean) and stay frozen.
      train_only_new: Freeze every other weight of the model (False: leave
        each weight's trainable flag as it was).
      seed: Seed of the ``"mean_cov"`` draws.

    Returns:
      An :class:`AddedTokens`.

    Raises:
      PartialEmbeddingTypeError: a model of another kind or without a
        ``token_embedding``; an unknown ``init``; a tokenizer that cannot
        take strings.
      PartialEmbeddingArgumentError: a count <= 0; an id out of range; a
        string already in the vocabulary; strings without a tokenizer.

    >>> import keras_hub, partial_embedding.keras_hub as pek
    >>> backbone = keras_hub.models.GPT2Backbone(
    ...     vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16)
    >>> added = pek.add_tokens(backbone, 3, pad_to_multiple_of=8)
    >>> added.model.token_embedding.input_dim, added.new_ids.tolist()
    (56, [50, 51, 52])
    >>> [w.path for w in added.model.trainable_weights]
    ['token_embedding/embeddings']
    """
    backbone = rebuild.backbone_of(model)
    stock_table = backbone.token_embedding
    vocabulary_size = stock_table.input_dim
    request = tokens.parse_new_tokens(new_tokens, vocabulary_size)
    _check_options(init, pad_to_multiple_of, request)
    preprocessor = _new_preprocessor(model, request, vocabulary_size)
    num_rows = vocabulary_size + request.count
    if pad_to_multiple_of:
        num_rows = math.ceil(num_rows / pad_to_multiple_of) * pad_to_multiple_of
    if request.ids is not None:
        new_ids = request.ids
    else:
        new_ids = np.arange(vocabulary_size, vocabulary_size + request.count, dtype=np.int64)
    reversible = isinstance(stock_table, keras.layers.ReversibleEmbedding)
    layer_class = PartialReversibleEmbedding if reversible else PartialEmbedding
    table = layer_class.from_layer(
        stock_table,
        extra_rows=num_rows - vocabulary_size,
        trainable_ids=new_ids,
        init=_table_init(init, request, model, num_rows - vocabulary_size),
        seed=seed,
    )
    rebuilt_backbone = rebuild.rebuild_backbone(backbone, table)
    rebuilt = rebuilt_backbone
    if model is not backbone:
        rebuilt = rebuild.rebuild_task(model, rebuilt_backbone, preprocessor)
    if train_only_new:
        rebuild.freeze_all_but_table(rebuilt, rebuilt_backbone)
    strings = None if request.tokens is None else list(request.tokens)
    return AddedTokens(rebuilt, new_ids, strings, init)


def _stock_backbone(backbone: Any, rows_file: PathLike) -> Any:
    """A plain keras-hub backbone with ``backbone``'s weights and the file's rows merged."""
    table_layer = backbone.token_embedding
    if not isinstance(table_layer, PartialEmbedding):
        raise PartialEmbeddingTypeError(
            "model: its token_embedding is not a partial layer (pass the model add_tokens returned)"
        )
    table = merge_trained_rows(keras.ops.convert_to_numpy(table_layer.embeddings), rows_file)
    stock_class = backbones.stock_class(type(backbone))
    stock = stock_class.from_config(backbone.get_config())
    stock_table = stock.token_embedding
    rebuild.copy_weights(
        backbone,
        stock,
        rebuild.table_variables(table_layer),
        rebuild.table_variables(stock_table),
    )
    stock_table.embeddings.assign(table)
    if isinstance(table_layer, PartialReversibleEmbedding) and not table_layer.tie_weights:
        reverse = keras.ops.convert_to_numpy(table_layer.reverse_embeddings)
        merged = merge_trained_rows(reverse, rows_file, reverse=True)
        stock_table.reverse_embeddings.assign(np.transpose(merged))
    return stock


def merge_into_preset(model: KerasModel, rows_file: PathLike, preset_dir: PathLike) -> str:
    """Writes a keras-hub preset of ``model`` with the trained rows of ``rows_file`` merged.

    The preset holds the plain keras-hub classes (a stock token embedding of
    ``V + K`` rows): ``keras_hub.models.Backbone.from_preset(preset_dir)``
    (or the task's class, with its tokenizer, for a task model) loads it
    where partial_embedding is not installed.

    Args:
      model: A model :func:`add_tokens` returned (its table holds the rows
        the file's rows were trained next to).
      rows_file: A file written by ``partial_embedding.save_trained_rows``
        from the model's ``token_embedding``.
      preset_dir: The directory to write (created if missing).

    Returns:
      ``preset_dir`` as a string.

    Raises:
      PartialEmbeddingTypeError: a model without a partial token embedding.
      partial_embedding.trained_rows.TrainedRowsError: the file does not fit
        the table (other rows differ, shape or dtype).
    """
    backbone = rebuild.backbone_of_rebuilt(model)
    stock = _stock_backbone(backbone, rows_file)
    preset_dir = os.fsdecode(preset_dir)
    if model is backbone:
        stock.save_to_preset(preset_dir)
        return preset_dir
    stock_task = rebuild.rebuild_task(model, stock, model.preprocessor)
    stock_task.save_to_preset(preset_dir)
    return preset_dir
