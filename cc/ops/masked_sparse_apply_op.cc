// Declares PartialEmbedding>MaskedSparseApplyAdam and its compact-slot twin
// PartialEmbedding>MaskedSparseApplyAdamWithSlotIndices: attrs, strict shape
// functions and documentation for every input.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/row_update_contract.h"
#include "cc/kernels/masked_sparse_apply_inputs.h"
#include "cc/ops/row_update_shapes.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// The slots in the op with slot indices: of var's dtype, and the compact-slot
// contract of cc/core/row_update_contract.h on the dimensions known so far.
absl::Status CheckCompactSlots(InferenceContext* c, bool amsgrad,
                               ::tensorflow::DataType dtype,
                               ShapeHandle var_shape) {
  std::vector<SlotShape> slots;
  for (int i = adam_input::kVar + 1; i <= adam_input::kVHat; ++i) {
    if (i == adam_input::kVHat && !amsgrad) break;
    const char* name = adam_input::kTableNames[i];
    std::optional<Dims> dims;
    TF_RETURN_IF_ERROR(VariableDims(c, i, name, dtype, &dims));
    if (dims.has_value()) slots.push_back({name, *std::move(dims)});
  }
  if (slots.empty()) return absl::OkStatus();
  // A var of unknown rank constrains nothing yet: every dimension unknown,
  // of the first slot's rank.
  const Dims var = KnownDimsOr(c, var_shape, slots[0].dims.size());
  return ContractStatus(CheckSlotShapes(var, slots, /*compact=*/true,
                                        ShapeNotation::kTensorFlow));
}

template <bool kWithSlotIndices>
absl::Status MaskedSparseApplyAdamShape(InferenceContext* c) {
  constexpr adam_input::LaterInputs kInputs(kWithSlotIndices);
  TF_RETURN_IF_ERROR(
      CheckScalarShapes(c, kInputs.first_scalar, adam_input::kScalarNames));
  ShapeHandle row_mask;
  if (!c->WithRank(c->input(kInputs.row_mask), 1, &row_mask).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_mask: shape ", c->DebugString(c->input(kInputs.row_mask)),
        " must be [V] (rank 1)"));
  }
  if constexpr (kWithSlotIndices) {
    const std::optional<Dims> indices =
        KnownDims(c, c->input(adam_input::kIndices));
    const std::optional<Dims> slot_indices =
        KnownDims(c, c->input(adam_input::kSlotIndices));
    if (indices.has_value() && slot_indices.has_value()) {
      TF_RETURN_IF_ERROR(ContractStatus(CheckSlotIndicesShape(
          *indices, *slot_indices, ShapeNotation::kTensorFlow)));
    }
  }
  bool amsgrad = false;
  TF_RETURN_IF_ERROR(c->GetAttr("amsgrad", &amsgrad));
  ::tensorflow::DataType dtype;
  TF_RETURN_IF_ERROR(c->GetAttr("dtype", &dtype));

  // The tables' shapes, where the handles know them: all must agree, or,
  // with slot indices, the slots must agree with each other and with var's
  // row shape.
  ShapeHandle var_shape = c->UnknownShape();
  const int last_same_shape =
      kWithSlotIndices ? adam_input::kVar : adam_input::kVHat;
  for (int i = adam_input::kVar; i <= last_same_shape; ++i) {
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
  if (c->RankKnown(var_shape)) {
    TF_RETURN_IF_ERROR(c->WithRankAtLeast(var_shape, 1, &var_shape));
  }
  if constexpr (kWithSlotIndices) {
    TF_RETURN_IF_ERROR(CheckCompactSlots(c, amsgrad, dtype, var_shape));
  }
  if (!c->RankKnown(var_shape)) return absl::OkStatus();
  return CheckRowMaskAndValues(c, var_shape, row_mask,
                               c->input(adam_input::kIndices),
                               c->input(kInputs.grad), "grad", "var");
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
    .SetShapeFn(MaskedSparseApplyAdamShape<false>)
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

On a GPU (a build with the CUDA kernels), g is summed in pieces of 32
occurrences, each in position order, then piece by piece: a row occurring at
most 32 times gets exactly the CPU kernel's result, a hotter row a fixed
grouping of the same sum. Results are bit-identical from run to run.

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

REGISTER_OP("PartialEmbedding>MaskedSparseApplyAdamWithSlotIndices")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("v_hat: resource")
    .Input("indices: Tindices")
    .Input("slot_indices: Tindices")
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
    .SetShapeFn(MaskedSparseApplyAdamShape<true>)
    .Doc(R"doc(
MaskedSparseApplyAdam with compact slots: the slots of the row at position k
of `indices` are row `slot_indices[k]` of m, v (and v_hat), which may have
any number S >= 1 of rows (S may be much less than V: one slot row for each
row that can be permitted).

For every distinct row r of `indices` with `row_mask[r]` true, with s its
slot row and g the sum of its gradient rows (in position order):

  if weight_decay != 0: var[r] -= (var[r] * weight_decay) * learning_rate
  m[s] += (g - m[s]) * one_minus_beta_1
  v[s] += (g * g - v[s]) * one_minus_beta_2
  if amsgrad: v_hat[s] = max(v_hat[s], v[s]), used below instead of v[s]
  var[r] -= (m[s] * alpha) / (sqrt(v[s]) + epsilon)

with the same operations, order and rounding as MaskedSparseApplyAdam, which
this equals bit for bit when m, v and v_hat hold, at each slot row, the full-
size slots' row it stands for. Frozen rows (and their slot rows) are not
written. Before anything is written, every index is checked against [0, V),
every slot index (frozen rows' too) against [0, S), every occurrence of a
permitted row must name the same slot row, and two permitted rows must not
name the same slot row. On a GPU, g is summed as MaskedSparseApplyAdam sums
it there.

var: The variable, a resource of rank >= 1 with V rows.
m: The first-moment slots, [S] + var.shape[1:], of var's dtype.
v: The second-moment slots, of m's shape and var's dtype.
v_hat: The running maximum of v (AMSGrad), of m's shape and var's dtype. Read
  and written only when `amsgrad` is true; otherwise it is not looked up
  (pass any resource, e.g. v).
indices: Row numbers of var, any shape, each in [0, V); duplicates allowed.
slot_indices: indices' shape and dtype: the slot row of each position, each
  in [0, S).
grad: `indices.shape + var.shape[1:]`: the gradient rows, by position.
row_mask: bool `[V]`; true where a row (and its slot row) may be written.
learning_rate: Scalar; used by weight decay only.
one_minus_beta_1: Scalar `1 - beta_1`.
one_minus_beta_2: Scalar `1 - beta_2`.
epsilon: Scalar added to the square root of the second moment.
alpha: Scalar step size with bias correction,
  `learning_rate * sqrt(1 - beta_2^t) / (1 - beta_1^t)`.
weight_decay: Scalar decoupled weight decay; 0 for none.
amsgrad: Whether to keep and use the running maximum `v_hat`.
use_locking: Accepted for the signature of TF's apply ops; the variables'
  locks are always held exclusively for the whole update.
)doc");

}  // namespace partial_embedding
