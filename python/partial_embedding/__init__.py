"""partial_embedding: train only some rows of an embedding table.

Pretrained rows stay frozen bit for bit while new or out-of-vocabulary rows
learn, at the cost of the rows a batch touches, not of the whole vocabulary.
"""

from partial_embedding._version import REQUIRED_TENSORFLOW, __version__
from partial_embedding._version import check_keras_version as _check_keras_version

# Before anything that reaches into Keras: a Keras that TensorFlow itself
# refuses fails here. Any other imports; the private members the layers and the
# optimizer need are checked at construction (_internal/framework_private.py).
_check_keras_version()

from partial_embedding._build_info import build_info
from partial_embedding._loader import register_ops_on_import
from partial_embedding.errors import (
    PartialEmbeddingArgumentError,
    PartialEmbeddingTypeError,
    TensorFlowVersionError,
)
from partial_embedding.layers import (
    DistributedEmbedding,
    PartialEmbedding,
    PartialEmbeddingsUpdate,
    PartialReversibleEmbedding,
    RowAdmission,
)
from partial_embedding.ops import (
    advise_huge_pages,
    entry_stop_gradients,
    masked_embedding_lookup,
    masked_embedding_lookup_sparse,
    masked_scatter_sub,
)
from partial_embedding.optimizers import MaskedOptimizer, RowwiseAdagrad, RowwiseAdam
from partial_embedding.pretrained import PretrainedCoverage, PretrainedTable, table_from_pretrained
from partial_embedding.trained_rows import (
    TrainedRows,
    load_trained_rows,
    merge_trained_rows,
    read_trained_rows,
    save_trained_rows,
)

# Registers the op with TensorFlow, so that SavedModels using it load.
register_ops_on_import()

__all__ = [
    "DistributedEmbedding",
    "MaskedOptimizer",
    "RowwiseAdagrad",
    "RowwiseAdam",
    "REQUIRED_TENSORFLOW",
    "PartialEmbedding",
    "PartialEmbeddingArgumentError",
    "PartialEmbeddingTypeError",
    "PartialEmbeddingsUpdate",
    "PartialReversibleEmbedding",
    "PretrainedCoverage",
    "PretrainedTable",
    "RowAdmission",
    "TensorFlowVersionError",
    "TrainedRows",
    "__version__",
    "advise_huge_pages",
    "build_info",
    "entry_stop_gradients",
    "masked_embedding_lookup",
    "masked_embedding_lookup_sparse",
    "masked_scatter_sub",
    "load_trained_rows",
    "merge_trained_rows",
    "read_trained_rows",
    "save_trained_rows",
    "table_from_pretrained",
]
