// Op definition of PartialEmbedding>RowAdmissionObserve.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

REGISTER_OP("PartialEmbedding>RowAdmissionObserve")
    .Input("candidates: resource")
    .Input("admitted: resource")
    .Input("counts: resource")
    .Input("last_seen: resource")
    .Input("step: resource")
    .Input("admitted_count: resource")
    .Input("admitted_list: resource")
    .Input("evicted_rows: resource")
    .Input("evicted_count: resource")
    .Input("ids: Tindices")
    .Output("evicted: int64")
    .Attr("Tindices: {int32, int64}")
    .Attr("min_count: int >= 1")
    .Attr("capacity: int >= -1")
    .Attr("eviction: {'lfu', 'lru'}")
    .Attr("ignore_negative: bool = false")
    .SetIsStateful()
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Row admission's step for one training batch, in place, on the CPU: counts
the batch's candidate rows, admits those whose count reaches `min_count` and,
at the capacity, evicts admitted rows absent from the batch (rules and
tie-breaks: docs/row_admission.md). Every id is checked before anything is
written.

candidates: bool [V], the rows that may be admitted (read only).
admitted: bool [V], the rows admitted now.
counts: int64 [V], training batches each row appeared in since its count
  last started.
last_seen: int64 [V], the step of each row's last batch.
step: int64 scalar, the training batches so far (this op adds one).
admitted_count: int64 scalar, how many rows are admitted.
admitted_list: int64 [capacity], the admitted rows then -1 (with a capacity;
  else any int64 vector, untouched).
evicted_rows: int64 [R], the rows evicted since the optimizer last released
  their state (with a capacity; else untouched).
evicted_count: int64 scalar, how many were evicted since (may exceed R).
ids: the batch's ids, any shape, each in [0, V) (negative ones are no row
  with `ignore_negative`).
evicted: the rows this batch evicted.
min_count: batches a candidate must appear in to be admitted.
capacity: most rows admitted at once; -1 for no limit.
eviction: "lfu" or "lru".
ignore_negative: whether negative ids are padding (bags).
)doc");

}  // namespace partial_embedding
