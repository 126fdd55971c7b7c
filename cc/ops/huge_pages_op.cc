// Op definition of PartialEmbedding>AdviseHugePages.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

namespace partial_embedding {

REGISTER_OP("PartialEmbedding>AdviseHugePages")
    .Input("resource: resource")
    .Output("advised: bool")
    .Attr("min_bytes: int = 33554432")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Moves a CPU resource variable's value into a buffer backed by transparent huge
pages (2 MiB) where Linux allows it; values, shape and dtype are unchanged.

Meant for large embedding tables and their optimizer slots: a training step
reads and writes a few thousand rows scattered over the table, and with 4 KiB
pages most of those accesses also miss the TLB. The op allocates a new buffer,
advises MADV_HUGEPAGE on it before the first write, copies the value and swaps
the buffer in under the variable's lock; readers holding the old buffer keep
their snapshot. MaskedScatterSub and MaskedSparseApplyAdam do the same (for
values of 32 MiB or more) the first time they write a CPU variable's buffer.

advised: true when the value was moved; false (and nothing done) when the
  value is smaller than `min_bytes`, was moved before or has no value yet,
  when the platform has no transparent huge pages or the kernel refused the
  advice (then for the rest of the process), or when the environment variable
  PARTIAL_EMBEDDING_HUGE_PAGES is "0".
  Whether the kernel then actually maps huge pages depends on
  /sys/kernel/mm/transparent_hugepage (not "never") and free memory.
min_bytes: smallest value (in bytes) worth moving.
)doc");

}  // namespace partial_embedding
