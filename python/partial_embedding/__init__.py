"""partial_embedding: train only some rows of an embedding table.

Pretrained rows stay frozen bit for bit while new or out-of-vocabulary rows
learn, at the cost of the rows a batch touches, not of the whole vocabulary.
"""

from partial_embedding._version import REQUIRED_TENSORFLOW, __version__
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
    TensorFlowVersionError,
)
from partial_embedding.ops import masked_scatter_sub

__all__ = [
    "REQUIRED_TENSORFLOW",
    "PartialEmbeddingArgumentError",
    "PartialEmbeddingTypeError",
    "TensorFlowVersionError",
    "__version__",
    "masked_scatter_sub",
]
