"""MaskedOptimizer: stock Keras optimizers that update only permitted rows.

Stock Keras 3 optimizers on TensorFlow turn an embedding's sparse gradient into
dense updates (Adam, momentum SGD, RMSprop rewrite every row and every slot
each step) and apply weight decay to every row. ``MaskedOptimizer`` wraps such
an optimizer (like ``keras.optimizers.LossScaleOptimizer`` does) and, for each
*masked* variable, applies the wrapped optimizer's own per-row rule to the rows
that are both permitted by the variable's row mask and present in the
gradient, writing the variable and its slots in place through
:func:`partial_embedding.masked_scatter_sub`. Every other row, and every slot
entry of every other row, is left untouched bit for bit. The cost of a step is
proportional to the rows in the batch, not to the vocabulary.

Semantics for a masked variable (lazy, like TensorFlow's ``SparseApply*`` ops
and PyTorch's ``SparseAdam``):

* The gradient's duplicate row ids are summed first, then rows whose mask is
  false are dropped. What remains is the step's set of *updated rows*.
* Clipping (``clipnorm``, ``clipvalue``, ``global_clipnorm``) sees that
  deduplicated, permitted-only gradient, i.e. exactly the dense gradient of a
  table holding only the permitted rows.
* Weight decay (``weight_decay=``, ``AdamW``) applies to the updated rows only.
* Slots of rows not updated do not decay (a row absent from a batch keeps its
  Adam moments); bias correction uses the optimizer's global ``iterations``,
  as the wrapped optimizer does.
* A dense gradient (e.g. from a regularizer on the table) counts every
  permitted row as present: the step then equals the stock optimizer applied
  to the permitted rows, and costs O(vocabulary) like any dense gradient.

Consequently, when every permitted row is in every batch, training equals the
stock optimizer applied to a table holding only the permitted rows (to
float rounding: the in-place kernel subtracts ``old - new`` where the stock
rule assigns ``new``).

Keras' own sparse path differs from this for Adam, Adagrad and RMSprop when an
id repeats within a batch: it does not sum duplicates before squaring or
mixing the gradient into the moments. ``MaskedOptimizer`` follows the dense
(mathematically exact) gradient instead.

Optimizer state: by default (``compact_slots="auto"``) a masked variable of
which at most half the rows are permitted keeps slots for its permitted rows
only (one slot row per row that has trained, found through a ``[V]`` map),
with the same results bit for bit as Keras' full-size slots.

Masked variables are found without help: every variable carrying a
``_partial_embedding_row_mask`` attribute (set by
``partial_embedding.PartialEmbedding`` on its ``embeddings``), plus the ones
named in ``row_masks``. All other variables go to the wrapped optimizer
unchanged.

Optimizer state can be read and written by table row whatever its layout
(compact or full-size, sharded or not): ``MaskedOptimizer.slot_names``,
``slot_variable``, ``slot_rows``, ``slot_rows_present`` and
``assign_slot_rows``.

Inside the package: ``_masked_optimizer`` holds the wrapper's surface and
pipeline (the wrapped optimizer's ``apply``, with masked variables updated by
row), ``_delegation`` what it passes on to the wrapped optimizer,
``_mask_lookup`` which variables ``row_masks`` names, ``_gradients`` the
gradient helpers (scaling, replica sums, deduplication, clipping, loss-scaled
apply), ``_row_rules`` the registry of per-row rules (one entry per supported
optimizer), ``_slot_store`` the slots the wrapper makes itself (compact, per
shard, the XLA scratch) and reading or writing a slot's rows, ``_slot_api`` the
public slot methods, ``_compact_slots`` the compact optimizer slots and
``_sharded`` ``ShardedVariable`` tables. Every private Keras or TensorFlow
member the wrapper reaches is in ``partial_embedding._internal.framework_private``.
"""

from partial_embedding._internal.row_mask import ROW_MASK_ATTRIBUTE
from partial_embedding.optimizers._masked_optimizer import MaskedOptimizer
from partial_embedding.optimizers._row_rules import SUPPORTED_OPTIMIZERS

__all__ = ["MaskedOptimizer", "ROW_MASK_ATTRIBUTE", "SUPPORTED_OPTIMIZERS"]
