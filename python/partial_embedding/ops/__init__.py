"""TensorFlow ops of partial_embedding: thin, validated wrappers.

Nothing here imports Keras; Keras variables are recognised by duck typing.
Import the public names from here (docs/api.md describes each).
"""

# The dtypes the kernels implement: importable from here as before, not in __all__.
from partial_embedding._internal.checks import INDEX_DTYPES as INDEX_DTYPES
from partial_embedding._internal.checks import SUPPORTED_DTYPES as SUPPORTED_DTYPES
from partial_embedding._internal.variables import gather_rows, resolve_variable
from partial_embedding.ops.bags import masked_embedding_lookup_sparse
from partial_embedding.ops.fused import masked_sparse_apply_rule
from partial_embedding.ops.huge_pages import HUGE_PAGES_MIN_BYTES, advise_huge_pages
from partial_embedding.ops.lookup import entry_stop_gradients, masked_embedding_lookup
from partial_embedding.ops.quantized import quantized_lookup
from partial_embedding.ops.reverse import masked_reverse_projection
from partial_embedding.ops.scatter import masked_scatter_sub

# Imported for its side effect: the optional XLA custom-call library must load
# before the process first compiles a function with XLA.
from partial_embedding.ops import xla_custom_call  # noqa: E402, F401  isort: skip

__all__ = [
    "HUGE_PAGES_MIN_BYTES",
    "advise_huge_pages",
    "entry_stop_gradients",
    "gather_rows",
    "masked_embedding_lookup",
    "masked_embedding_lookup_sparse",
    "masked_reverse_projection",
    "masked_scatter_sub",
    "masked_sparse_apply_rule",
    "quantized_lookup",
    "resolve_variable",
]
