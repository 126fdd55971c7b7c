// Declares PartialEmbedding>MaskedSparseApplyAdam: attrs, a strict shape
// function and documentation for every input.
#include "cc/ops/masked_sparse_apply_inputs.h"
#include "cc/ops/row_update_shapes.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

absl::Status MaskedSparseApplyAdamShape(InferenceContext* c) {
  for (int i = 0; i < adam_input::kNumScalars; ++i) {
    ShapeHandle scalar;
    if (!c->WithRank(c->input(adam_input::kFirstScalar + i), 0, &scalar).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(adam_input::kScalarNames[i], ": shape ",
                       c->DebugString(c->input(adam_input::kFirstScalar + i)),
                       " must be a scalar"));
    }
  }
  ShapeHandle row_mask;
  if (!c->WithRank(c->input(adam_input::kRowMask), 1, &row_mask).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_mask: shape ", c->DebugString(c->input(adam_input::kRowMask)),
        " must be [V] (rank 1)"));
  }
  bool amsgrad = false;
  TF_RETURN_IF_ERROR(c->GetAttr("amsgrad", &amsgrad));
  ::tensorflow::DataType dtype;
  TF_RETURN_IF_ERROR(c->GetAttr("dtype", &dtype));

  // The tables' shapes, where the handles know them: all must agree.
  ShapeHandle var_shape = c->UnknownShape();
  for (int i = adam_input::kVar; i <= adam_input::kVHat; ++i) {
    if (i == adam_input::kVHat && !amsgrad) break;
    const auto* handle_data = c->input_handle_shapes_and_types(i);
    if (handle_data == nullptr || handle_data->empty()) continue;
    const auto& table = (*handle_data)[0];
    if (table.dtype != ::tensorflow::DT_INVALID && table.dtype != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          adam_input::kTableNames[i], ": dtype ",
          ::tensorflow::DataTypeString(table.dtype), " does not match dtype ",
          ::tensorflow::DataTypeString(dtype)));
    }
    if (!c->Merge(var_shape, table.shape, &var_shape).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          adam_input::kTableNames[i], ": shape ", c->DebugString(table.shape),
          " does not match the other tables' shape ",
          c->DebugString(var_shape)));
    }
  }
  if (!c->RankKnown(var_shape)) return absl::OkStatus();
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(var_shape, 1, &var_shape));
  return CheckRowMaskAndValues(c, var_shape, row_mask,
                               c->input(adam_input::kIndices),
                               c->input(adam_input::kGrad), "grad", "var");
}

}  // namespace

REGISTER_OP("PartialEmbedding>MaskedSparseApplyAdam")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("v_hat: resource")
    .Input("indices: Tindices")
    .Input("grad: dtype")
    .Input("row_mask: bool")
    .Input("learning_rate: dtype")
    .Input("one_minus_beta_1: dtype")
    .Input("one_minus_beta_2: dtype")
    .Input("epsilon: dtype")
    .Input("alpha: dtype")
    .Input("weight_decay: dtype")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("amsgrad: bool = false")
    .Attr("use_locking: bool = true")
    .SetShapeFn(MaskedSparseApplyAdamShape)
    .Doc(R"doc(
Lazy Adam / AdamW / AMSGrad step on the permitted rows of a sparse gradient,
in place, one pass per row over the variable and its slots.

The gradient is raw: `grad[i, ...]` belongs to row `indices[i]`, and a row may
occur several times. For every distinct row r of `indices` with
`row_mask[r]` true, g = the sum of its gradient rows (in position order) and:

  if weight_decay != 0: var[r] -= (var[r] * weight_decay) * learning_rate
  m[r] += (g - m[r]) * one_minus_beta_1
  v[r] += (g * g - v[r]) * one_minus_beta_2
  if amsgrad: v_hat[r] = max(v_hat[r], v[r]), used below instead of v[r]
  var[r] -= (m[r] * alpha) / (sqrt(v[r]) + epsilon)

each operation rounded to `dtype` in this order, so the result equals the
same sequence of TensorFlow elementwise ops bit for bit. Rows whose mask is
false are never written, nor are their slots; rows absent from `indices` are
not touched. Every index is checked against [0, V) before anything is
written. The buffers are written in place, copied first only where a reader
still holds one; no variable is put into copy-on-read mode.

var: The variable, a resource of rank >= 1 with V rows.
m: The first-moment slot, of var's shape and dtype.
v: The second-moment slot, of var's shape and dtype.
v_hat: The running maximum of v (AMSGrad), of var's shape and dtype. Read
  and written only when `amsgrad` is true; otherwise it is not looked up
  (pass any resource, e.g. v).
indices: Row numbers, any shape, each in [0, V); duplicates allowed.
grad: `indices.shape + var.shape[1:]`: the gradient rows, by position.
row_mask: bool `[V]`; true where a row (and its slots) may be written.
learning_rate: Scalar; used by weight decay only.
one_minus_beta_1: Scalar `1 - beta_1`.
one_minus_beta_2: Scalar `1 - beta_2`.
epsilon: Scalar added to the square root of the second moment.
alpha: Scalar step size with bias correction,
  `learning_rate * sqrt(1 - beta_2^t) / (1 - beta_1^t)`.
weight_decay: Scalar decoupled weight decay; 0 for none.
amsgrad: Whether to keep and use the running maximum `v_hat`.
use_locking: Accepted for the signature of TF's apply ops; the variables'
  locks are always held exclusively for the whole update (taken in address
  order, so concurrent steps cannot deadlock).
)doc");

}  // namespace partial_embedding
