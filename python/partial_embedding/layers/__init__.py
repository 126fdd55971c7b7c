"""Keras layers of partial_embedding: embeddings in which only chosen rows learn.

Every class here names ``partial_embedding.layers`` as its module, as it did
before this was a package, so that saved models load unchanged.
"""

from partial_embedding.layers._admission import RowAdmission
from partial_embedding.layers.distributed_embedding import DistributedEmbedding
from partial_embedding.layers.embedding import PartialEmbedding
from partial_embedding.layers.embeddings_update import PartialEmbeddingsUpdate
from partial_embedding.layers.reversible_embedding import PartialReversibleEmbedding

__all__ = [
    "DistributedEmbedding",
    "PartialEmbedding",
    "PartialEmbeddingsUpdate",
    "PartialReversibleEmbedding",
    "RowAdmission",
]
