"""MaskedOptimizer: stock Keras optimizers that update only permitted rows.

Stock Keras 3 optimizers on TensorFlow turn an embedding's sparse gradient into
dense updates (Adam, momentum SGD, RMSprop rewrite every row and every slot
each step) and apply weight decay to every row. ``MaskedOptimizer`` wraps such
an optimizer, as ``keras.optimizers.LossScaleOptimizer`` does, and applies the
wrapped optimizer's own rule to the rows of each masked variable that its row
mask permits and the gradient holds, in place: every other row, and its slots,
stay bit for bit, and a step costs in proportion to the rows in the batch. A
variable is masked when it carries ``ROW_MASK_ATTRIBUTE`` (as each
``PartialEmbedding``'s table does) or is named in ``row_masks``.

What a step does exactly (duplicate ids, clipping, weight decay, lazy slots)
and how to read the slots: docs/optimizers.md. ``RowwiseAdagrad`` and
``RowwiseAdam`` are Keras optimizers with one second moment per row, alone or
inside ``MaskedOptimizer``.
"""

from partial_embedding._internal.row_mask import ROW_MASK_ATTRIBUTE
from partial_embedding.optimizers._masked_optimizer import MaskedOptimizer
from partial_embedding.optimizers._row_rules import SUPPORTED_OPTIMIZERS
from partial_embedding.optimizers._rowwise import RowwiseAdagrad, RowwiseAdam

__all__ = [
    "MaskedOptimizer",
    "ROW_MASK_ATTRIBUTE",
    "RowwiseAdagrad",
    "RowwiseAdam",
    "SUPPORTED_OPTIMIZERS",
]
