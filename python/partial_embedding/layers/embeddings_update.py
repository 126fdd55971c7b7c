"""``PartialEmbeddingsUpdate``: the widely copied pretrained-matrix layer, done right."""

from __future__ import annotations

from typing import Any

import keras

from partial_embedding._internal.row_mask import ids_to_row_mask
from partial_embedding._internal.types import RowIds, Table
from partial_embedding.errors import PartialEmbeddingArgumentError
from partial_embedding.layers import _arguments
from partial_embedding.layers.embedding import PartialEmbedding

__all__ = ["PartialEmbeddingsUpdate"]


@keras.saving.register_keras_serializable(package="partial_embedding")
class PartialEmbeddingsUpdate(PartialEmbedding):
    """The widely copied ``PartialEmbeddingsUpdate`` layer, done without the cost.

    The problem it solves: a model starts from a pretrained embedding matrix
    ``weights`` and only the rows ``indices_to_update`` may learn. The popular
    answer builds a ``[len_vocab, 1]`` mask and computes
    ``stop_gradient((1 - mask) * W) + mask * W`` on the whole table before every
    lookup: a pass over the vocabulary per step, a dense gradient, and frozen
    rows still updated (with zeros) by the optimizer. This class keeps that
    constructor but is a ``PartialEmbedding``: the lookup gathers only the
    batch's rows and frozen rows receive no gradient at all.

    As for ``PartialEmbedding``, the mask is a saved weight: ``get_config()``
    holds ``indices_to_update=None`` (and ``weights=None``), and a layer made
    from the config alone lets every row learn until its weights are loaded.

    Args:
      len_vocab: Number of rows.
      weights: The pretrained matrix, ``[len_vocab, output_dim]``. May be None
        only when ``output_dim`` is given (as when loading a saved model).
      indices_to_update: The row ids that learn (or a bool mask); None: all.
      **kwargs: Other ``PartialEmbedding`` arguments (``mask_zero``,
        ``output_dim``, ``name``, ``dtype``, ...).

    >>> import numpy as np, keras, partial_embedding as pe
    >>> pretrained = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    >>> layer = pe.PartialEmbeddingsUpdate(3, pretrained, [1])
    >>> model = keras.Sequential([layer])
    >>> model.compile(optimizer=keras.optimizers.SGD(0.25), loss="mse")
    >>> _ = model.fit(np.array([[0, 1, 2]]), np.zeros([1, 3, 2]), verbose=0)
    >>> layer.embeddings.numpy().tolist()
    [[1.0, 1.0], [1.8333333730697632, 1.8333333730697632], [3.0, 3.0]]
    """

    # Saved files and Keras' registry name it by the module it had before
    # layers/ became a package.
    __module__ = "partial_embedding.layers"

    def __init__(
        self,
        len_vocab: int,
        weights: Table | None,
        indices_to_update: RowIds | None,
        **kwargs: Any,
    ) -> None:
        output_dim = kwargs.pop("output_dim", None)
        for argument in ("trainable_ids", "frozen_ids", "input_dim"):
            if argument in kwargs:
                raise TypeError(
                    f"PartialEmbeddingsUpdate: {argument} is not an argument; "
                    "use len_vocab and indices_to_update"
                )
        len_vocab = _arguments.dimension(len_vocab, "len_vocab")
        weights, output_dim = _pretrained_matrix(weights, len_vocab, output_dim)
        if indices_to_update is not None:
            indices_to_update = ids_to_row_mask(indices_to_update, "indices_to_update", len_vocab)
        super().__init__(
            len_vocab,
            output_dim,
            trainable_ids=indices_to_update,
            weights=weights,
            **kwargs,
        )

    def get_config(self) -> dict:
        config = super().get_config()
        config["len_vocab"] = config.pop("input_dim")
        config.pop("frozen_ids")
        config["indices_to_update"] = config.pop("trainable_ids")
        # The table and the mask are saved with the weights, not in the config.
        config["weights"] = None
        return config


def _pretrained_matrix(
    weights: Table | None, len_vocab: int, output_dim: Any
) -> tuple[Table | None, int]:
    """``PartialEmbeddingsUpdate``'s ``weights`` (as an array) and its table's width.

    The width is ``weights``' or, without them, ``output_dim``.

    Raises:
      PartialEmbeddingArgumentError: ``weights`` without ``len_vocab`` rows,
        not a matrix, or of another width than ``output_dim``; neither given.
    """
    if weights is None:
        if output_dim is None:
            raise PartialEmbeddingArgumentError(
                "weights: the pretrained matrix is required (or pass output_dim)"
            )
        return None, _arguments.dimension(output_dim, "output_dim")
    table = _arguments.as_table(weights, "weights")
    shape = tuple(table.shape)
    if len(shape) != 2 or shape[0] != len_vocab:
        raise PartialEmbeddingArgumentError(
            f"weights: must have shape ({len_vocab}, output_dim) (len_vocab rows), got {shape}"
        )
    if output_dim is not None and output_dim != shape[1]:
        raise PartialEmbeddingArgumentError(
            f"output_dim: {output_dim} does not match weights of shape {shape}"
        )
    return table, int(shape[1])
