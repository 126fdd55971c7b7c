"""Building a partial layer from a stock Keras embedding: ``from_layer``.

The stock layer's configuration carries over (name, dtype policy,
initializer, regularizer, constraint, ``mask_zero``, and for a reversible one
``tie_weights``, ``reverse_dtype`` and ``logit_soft_cap``); its table is
copied bit for bit into the first ``input_dim`` rows, and ``extra_rows`` new
rows are filled by one of the initializations below.

Initializations of new rows (``init``), computed in float64 from the rows
that stay as they are ("the old rows") and cast to the table's dtype:

* ``"mean"``: every new row is the mean of the old rows;
* ``"mean_cov"``: each new row is drawn from the normal distribution with the
  old rows' mean and (population) covariance; Hugging Face's
  ``resize_token_embeddings`` uses the same mean but a covariance scaled by
  1e-9, which makes the rows nearly equal;
* ``"zeros"``;
* an array ``[num_new_rows, output_dim]``: those values;
* any Keras initializer (a name or an object), called with the shape
  ``[num_new_rows, output_dim]``;
* None: the rows keep the values they have (only meaningful when no row is
  added).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from partial_embedding._internal.row_mask import ids_to_row_mask
from partial_embedding._internal.types import Initializer, RowIds
from partial_embedding.errors import PartialEmbeddingArgumentError, PartialEmbeddingTypeError

__all__ = ["NAMED_INITS", "from_stock_layer", "initial_rows", "partial_layer_arguments"]

NAMED_INITS = ("mean", "mean_cov", "zeros")


def _mean_and_covariance(old_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = old_rows.mean(axis=0)
    centered = old_rows - mean
    return mean, centered.T @ centered / old_rows.shape[0]


def _normal_samples(old_rows: np.ndarray, count: int, seed: int | None) -> np.ndarray:
    """``count`` draws from N(mean, covariance) of ``old_rows`` (float64)."""
    mean, covariance = _mean_and_covariance(old_rows)
    # An eigen decomposition works for a singular covariance too (fewer old
    # rows than columns), where a Cholesky factor does not exist.
    eigenvalues, eigenvectors = np.linalg.eigh(covariance)
    scale = np.sqrt(np.clip(eigenvalues, 0.0, None))
    normal = np.random.default_rng(seed).standard_normal((count, mean.shape[0]))
    return mean + (normal * scale) @ eigenvectors.T


def initial_rows(
    init: Initializer | np.ndarray | None,
    old_rows: np.ndarray,
    count: int,
    width: int,
    seed: int | None = None,
) -> np.ndarray | None:
    """The values of ``count`` new rows by ``init`` (float64), or None to keep them.

    Args:
      init: See the module docstring.
      old_rows: ``[N, width]``, the rows the statistics come from.
      count: Number of rows to initialize.
      width: Row width.
      seed: Seed of ``"mean_cov"`` draws.

    Raises:
      PartialEmbeddingArgumentError: ``"mean"``/``"mean_cov"`` without old
        rows; an array of the wrong shape.
      PartialEmbeddingTypeError: an ``init`` that is none of the above.
    """
    if init is None:
        return None
    if isinstance(init, str) and init in ("mean", "mean_cov"):
        if old_rows.shape[0] == 0:
            raise PartialEmbeddingArgumentError(
                f"init={init!r}: there are no old rows to take the statistics of"
            )
        old = np.asarray(old_rows, dtype=np.float64)
        if init == "mean":
            return np.broadcast_to(old.mean(axis=0), (count, width)).copy()
        return _normal_samples(old, count, seed)
    if isinstance(init, str) and init == "zeros":
        return np.zeros((count, width), dtype=np.float64)
    if isinstance(init, np.ndarray):
        if init.shape != (count, width):
            raise PartialEmbeddingArgumentError(
                f"init: an array must have shape {(count, width)} (one row per "
                f"new row); got shape {init.shape}"
            )
        return np.asarray(init, dtype=np.float64)
    try:
        initializer = keras.initializers.get(init)
    except (ValueError, TypeError) as error:
        raise PartialEmbeddingTypeError(
            f"init: must be one of {NAMED_INITS}, an array, None or a Keras "
            f"initializer; got init={init!r} ({error})"
        ) from None
    return np.asarray(keras.ops.convert_to_numpy(initializer((count, width))), np.float64)


def partial_layer_arguments(stock_layer: Any, reversible: bool) -> dict[str, Any]:
    """The constructor arguments of a partial layer configured as ``stock_layer``.

    Raises:
      PartialEmbeddingTypeError: not a stock Keras embedding of the right kind.
      PartialEmbeddingArgumentError: LoRA enabled or quantized.
    """
    expected = keras.layers.ReversibleEmbedding if reversible else keras.layers.Embedding
    if not isinstance(stock_layer, expected) or (
        not reversible and isinstance(stock_layer, keras.layers.ReversibleEmbedding)
    ):
        suggestion = "" if reversible else " (use PartialReversibleEmbedding.from_layer)"
        raise PartialEmbeddingTypeError(
            f"from_layer: stock_layer must be a keras.layers.{expected.__name__}"
            f"{suggestion}; got {type(stock_layer).__name__}"
        )
    if getattr(stock_layer, "lora_enabled", False) or stock_layer.quantization_mode:
        raise PartialEmbeddingArgumentError(
            f"from_layer: layer {stock_layer.name!r} has LoRA or quantization enabled; "
            "a partial layer takes a plain float table"
        )
    arguments: dict[str, Any] = {
        "input_dim": stock_layer.input_dim,
        "output_dim": stock_layer.output_dim,
        "embeddings_initializer": stock_layer.embeddings_initializer,
        "embeddings_regularizer": stock_layer.embeddings_regularizer,
        "embeddings_constraint": stock_layer.embeddings_constraint,
        "mask_zero": stock_layer.mask_zero,
        "activity_regularizer": stock_layer.activity_regularizer,
        "name": stock_layer.name,
        "dtype": stock_layer.dtype_policy,
        "trainable": stock_layer.trainable,
    }
    if reversible:
        arguments.update(
            tie_weights=stock_layer.tie_weights,
            reverse_dtype=stock_layer.reverse_dtype,
            logit_soft_cap=stock_layer.logit_soft_cap,
        )
    return arguments


def _grown(
    table: np.ndarray,
    extra_rows: int,
    rows_to_fill: np.ndarray,
    init: Any,
    seed: int | None,
) -> np.ndarray:
    """``table`` with ``extra_rows`` appended and ``rows_to_fill`` set by ``init``."""
    num_rows, width = table.shape
    grown = np.empty((num_rows + extra_rows, width), dtype=table.dtype)
    grown[:num_rows] = table
    grown[num_rows:] = 0
    kept = np.ones(num_rows + extra_rows, dtype=bool)
    kept[rows_to_fill] = False
    kept[num_rows:] = False
    values = initial_rows(init, grown[kept], len(rows_to_fill), width, seed)
    if values is not None:
        grown[rows_to_fill] = values.astype(table.dtype)
    return grown


def _check_counts(extra_rows: Any, init: Any) -> int:
    if isinstance(extra_rows, bool) or not isinstance(extra_rows, (int, np.integer)):
        raise PartialEmbeddingTypeError(
            f"from_layer: extra_rows must be an integer; got extra_rows={extra_rows!r}"
        )
    if extra_rows < 0:
        raise PartialEmbeddingArgumentError(
            f"from_layer: extra_rows must be >= 0; got extra_rows={extra_rows}"
        )
    if extra_rows and init is None:
        raise PartialEmbeddingArgumentError(
            "from_layer: init=None keeps rows as they are; new rows need an init"
        )
    return int(extra_rows)


def from_stock_layer(
    cls: Any,
    stock_layer: Any,
    extra_rows: int,
    trainable_ids: RowIds | None,
    init: Any,
    seed: int | None,
    reversible: bool,
) -> Any:
    """The body of ``from_layer`` for ``cls`` (see its docstring)."""
    arguments = partial_layer_arguments(stock_layer, reversible)
    extra_rows = _check_counts(extra_rows, init)
    num_rows = arguments["input_dim"] + extra_rows
    arguments["input_dim"] = num_rows
    if trainable_ids is None:
        trainable = np.arange(num_rows - extra_rows, num_rows, dtype=np.int64)
        fill = trainable
    else:
        mask = ids_to_row_mask(trainable_ids, "trainable_ids", num_rows)
        trainable = np.flatnonzero(mask).astype(np.int64)
        # Old rows chosen to train keep their values unless no row is added.
        fill = trainable if extra_rows == 0 else np.arange(num_rows - extra_rows, num_rows)
    if not stock_layer.built:
        return cls(trainable_ids=trainable, **arguments)
    table = np.asarray(keras.ops.convert_to_numpy(stock_layer.embeddings))
    layer = cls(
        trainable_ids=trainable,
        weights=_grown(table, extra_rows, fill, init, seed),
        **arguments,
    )
    if reversible and not stock_layer.tie_weights:
        reverse = np.transpose(keras.ops.convert_to_numpy(stock_layer.reverse_embeddings))
        seed_of_reverse = None if seed is None else seed + 1
        layer.reverse_embeddings.assign(_grown(reverse, extra_rows, fill, init, seed_of_reverse))
        layer.set_reverse_trainable_ids(trainable)
    return layer
