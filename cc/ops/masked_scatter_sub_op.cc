// Declares PartialEmbedding>MaskedScatterSub: attrs, a strict shape function
// and documentation for every input.
#include "cc/ops/row_update_shapes.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

absl::Status MaskedScatterSubShape(InferenceContext* c) {
  ShapeHandle indices = c->input(1);
  ShapeHandle updates = c->input(2);
  ShapeHandle row_mask;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &row_mask));

  const auto* handle_data = c->input_handle_shapes_and_types(0);
  if (handle_data == nullptr || handle_data->empty()) {
    return absl::OkStatus();  // Variable shape unknown until run time.
  }
  const auto& variable = (*handle_data)[0];
  if (variable.dtype != ::tensorflow::DT_INVALID) {
    ::tensorflow::DataType updates_dtype;
    TF_RETURN_IF_ERROR(c->GetAttr("dtype", &updates_dtype));
    if (variable.dtype != updates_dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "updates: dtype ", ::tensorflow::DataTypeString(updates_dtype),
          " does not match the variable's dtype ",
          ::tensorflow::DataTypeString(variable.dtype)));
    }
  }
  ShapeHandle var_shape;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(variable.shape, 1, &var_shape));

  return CheckRowMaskAndValues(c, var_shape, row_mask, indices, updates,
                               "updates", "variable");
}

}  // namespace

REGISTER_OP("PartialEmbedding>MaskedScatterSub")
    .Input("resource: resource")
    .Input("indices: Tindices")
    .Input("updates: dtype")
    .Input("row_mask: bool")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("use_locking: bool = true")
    .SetShapeFn(MaskedScatterSubShape)
    .Doc(R"doc(
Subtracts `updates` from the permitted rows of a resource variable, in place.

For every position i of `indices`:
  `var[indices[i], ...] -= updates[i, ...]` if `row_mask[indices[i]]`.
Rows whose mask is false are never written; duplicate indices accumulate in
index order. Every index is checked against [0, V) before anything is written,
also where its row is frozen. The variable's buffer is written in place; it is
copied first only when a reader still holds it, and the variable is never put
into copy-on-read mode.

resource: A resource variable of rank >= 1 with V rows.
indices: Row numbers, any shape, each in [0, V).
updates: `indices.shape + var.shape[1:]`, of the variable's dtype.
row_mask: bool `[V]`; true where a row may be written.
use_locking: If true, the variable's lock is held exclusively for the whole
  update. If false, validation and any copy happen under the exclusive lock
  and the write under the shared lock: concurrent unlocked updates of the same
  row may interleave and lose increments (Hogwild-style).
)doc");

}  // namespace partial_embedding
