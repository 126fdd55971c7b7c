"""TensorFlow ops of partial_embedding: thin, validated wrappers.

Nothing here imports Keras; Keras variables are recognised by duck typing.
Import the public names from here; each lives in the module of its concept:

- ``scatter``: ``masked_scatter_sub``, the in-place row update.
- ``lookup``: ``masked_embedding_lookup`` with its gradient, and
  ``entry_stop_gradients``.
- ``bags``: ``masked_embedding_lookup_sparse``, pooled lookups of bags of
  ids whose gradient is summed straight into the distinct permitted rows.
- ``reverse``: ``masked_reverse_projection``, the tied output projection
  whose table gradient names only permitted rows.
- ``fused``: ``masked_sparse_apply_adam``, the fused optimizer rule.
- ``quantized``: ``quantized_lookup``, rows of an int8 table with float
  trainable rows.
- ``huge_pages``: ``advise_huge_pages`` and ``HUGE_PAGES_MIN_BYTES``.
- ``_variables``: ``resolve_variable``, ``gather_rows`` and how distributed
  variables split into components and shards.
- ``_checks``: argument checks shared by the wrappers; ``_context``: what a
  wrapper returns eagerly, in ``tf.function`` and in a v1 graph.
"""

# The dtypes the kernels implement: importable from here as before, not in __all__.
from partial_embedding._internal.checks import INDEX_DTYPES as INDEX_DTYPES
from partial_embedding._internal.checks import SUPPORTED_DTYPES as SUPPORTED_DTYPES
from partial_embedding._internal.variables import gather_rows, resolve_variable
from partial_embedding.ops.bags import masked_embedding_lookup_sparse
from partial_embedding.ops.fused import masked_sparse_apply_adam
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
    "masked_sparse_apply_adam",
    "quantized_lookup",
    "resolve_variable",
]
