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
Advises a CPU resource variable's buffer for transparent huge pages (2 MiB)
in place: MADV_HUGEPAGE on its 2 MiB-aligned interior, then MADV_COLLAPSE
(Linux 6.1 and later), under the variable's lock. Nothing is copied; values,
shape, dtype and buffer are unchanged.

Meant for large embedding tables and their optimizer slots: a training step
reads and writes a few thousand rows scattered over the table, and with 4 KiB
pages most of those accesses also miss the TLB. MaskedScatterSub and
MaskedSparseApplyRule do the same (for values of 32 MiB or more) the first time
they write a CPU variable's buffer.

advised: true when this op advised the buffer now; false (nothing done) when
  the value is smaller than `min_bytes` or holds no whole 2 MiB page, was
  advised before or has no value yet, when the platform has no transparent
  huge pages or the kernel refused the advice, or when the environment
  variable PARTIAL_EMBEDDING_HUGE_PAGES is "0". Without MADV_COLLAPSE or a
  free huge page the buffer keeps its 4 KiB pages, wholly or in part.
min_bytes: smallest value (in bytes) worth advising.
)doc");

}  // namespace partial_embedding
