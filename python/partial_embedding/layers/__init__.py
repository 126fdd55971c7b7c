"""Keras layers of partial_embedding: embeddings in which only chosen rows learn.

``PartialEmbedding`` (``embedding.py``) is a drop-in replacement for
``keras.layers.Embedding`` (TensorFlow backend) that keeps a boolean
``trainable_mask`` next to its table; ``PartialEmbeddingsUpdate``
(``embeddings_update.py``) is its pretrained-matrix constructor; ``PartialReversibleEmbedding``
(``reversible_embedding.py``) is the drop-in for
``keras.layers.ReversibleEmbedding``. The private modules build tables in row
blocks (``_table_init``), restrict a regularizer or constraint to permitted
rows (``_row_masked``), read a stock ``Embedding``'s saved table
(``_stock_weights``) and check constructor arguments (``_arguments``).

Every class here names ``partial_embedding.layers`` as its module, as it did
before this was a package, so that saved models load unchanged.
"""

from partial_embedding.layers.embedding import PartialEmbedding
from partial_embedding.layers.embeddings_update import PartialEmbeddingsUpdate
from partial_embedding.layers.reversible_embedding import PartialReversibleEmbedding

__all__ = ["PartialEmbedding", "PartialEmbeddingsUpdate", "PartialReversibleEmbedding"]
