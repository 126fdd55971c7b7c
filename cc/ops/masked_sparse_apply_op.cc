// Declares PartialEmbedding>MaskedSparseApplyRule and its compact-slot twin
// PartialEmbedding>MaskedSparseApplyRuleWithSlotIndices: any rule of the
// table (cc/core/row_rules.h) on the permitted rows of a sparse gradient.
// Attrs, strict shape functions and documentation for every input.
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

template <bool kWithSlotIndices>
absl::Status MaskedSparseApplyRuleShape(InferenceContext* c) {
  Rule rule;
  TF_RETURN_IF_ERROR(RuleOfOpAttrs(c, &rule));
  const RuleInfo& info = InfoOf(rule);
  const rule_input::Positions inputs(info.num_slots, kWithSlotIndices);
  TF_RETURN_IF_ERROR(
      CheckHyperparametersInput(c, rule, inputs.hyperparameters));
  ShapeHandle row_mask;
  if (!c->WithRank(c->input(inputs.row_mask), 1, &row_mask).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_mask: shape ", c->DebugString(c->input(inputs.row_mask)),
        " must be [V] (rank 1)"));
  }
  if constexpr (kWithSlotIndices) {
    const std::optional<Dims> indices = KnownDims(c, c->input(inputs.indices));
    const std::optional<Dims> slot_indices =
        KnownDims(c, c->input(inputs.slot_indices));
    if (indices.has_value() && slot_indices.has_value()) {
      TF_RETURN_IF_ERROR(ContractStatus(CheckSlotIndicesShape(
          *indices, *slot_indices, ShapeNotation::kTensorFlow)));
    }
  }
  ::tensorflow::DataType dtype;
  TF_RETURN_IF_ERROR(c->GetAttr("dtype", &dtype));
  std::optional<Dims> var_dims;
  TF_RETURN_IF_ERROR(
      VariableDims(c, rule_input::kVar, "var", dtype, &var_dims));
  std::vector<SlotShape> slots;
  TF_RETURN_IF_ERROR(
      RuleSlotShapes(c, rule, rule_input::kFirstSlot, dtype, &slots));
  if (!slots.empty()) {
    const size_t rank = var_dims.has_value() ? var_dims->size()
                        : slots[0].per_row   ? 1
                                             : slots[0].dims.size();
    TF_RETURN_IF_ERROR(ContractStatus(
        CheckSlotShapes(var_dims.value_or(Dims(rank, kUnknownDim)), slots,
                        kWithSlotIndices, ShapeNotation::kTensorFlow)));
  }
  if (!var_dims.has_value()) return absl::OkStatus();
  if (var_dims->empty()) {
    return absl::InvalidArgumentError(
        "var: shape [] must have rank >= 1 (rows first)");
  }
  const ShapeHandle var_shape = (*c->input_handle_shapes_and_types(0))[0].shape;
  return CheckRowMaskAndValues(c, var_shape, row_mask, c->input(inputs.indices),
                               c->input(inputs.grad), "grad", "var");
}

}  // namespace

REGISTER_OP("PartialEmbedding>MaskedSparseApplyRule")
    .Input("var: resource")
    .Input("slots: num_slots * resource")
    .Input("indices: Tindices")
    .Input("grad: dtype")
    .Input("row_mask: bool")
    .Input("hyperparameters: dtype")
    .Attr("rule: string")
    .Attr("num_slots: int >= 0")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("use_locking: bool = true")
    .SetShapeFn(MaskedSparseApplyRuleShape<false>)
    .Doc(R"doc(
One optimizer rule of the table (cc/core/row_rules.h: SGD, momentum,
Nesterov, Adagrad, RMSprop and its momentum / centered forms, Adam, AMSGrad,
row-wise Adagrad, row-wise Adam), lazily, on the permitted rows of a sparse
gradient, in place, one pass per row over the variable and its slots.

The gradient is raw: `grad[i, ...]` belongs to row `indices[i]`, and a row may
occur several times. For every distinct row r of `indices` with
`row_mask[r]` true, g = the sum of its gradient rows (in position order, from
zero, rounded after each addition), then weight decay
(`var[r] -= (var[r] * weight_decay) * learning_rate` where weight_decay is
not 0) and the rule's update of var[r] and of its slots' row r. Each operation
rounds to `dtype` in Keras' order, so an element-wise rule equals Keras'
update_step as separate TensorFlow ops bit for bit; the row-wise rules' mean
of g * g over a row is summed in column order. docs/optimizers.md gives every
rule's formula. Rows whose mask is false are never written, nor are their
slots; rows absent from `indices` are not touched. Every index is checked
against [0, V) before anything is written. The buffers are written in place,
copied first only where a reader still holds one.

On a GPU (a build with the CUDA kernels), g is summed in pieces of 32
occurrences, each in position order, then piece by piece.

var: The variable, a resource of rank >= 1 with V rows.
slots: The rule's slots, in its order: var's shape (per element) or [V] (per
  row), of var's dtype.
indices: Row numbers, any shape, each in [0, V); duplicates allowed.
grad: `indices.shape + var.shape[1:]`: the gradient rows, by position.
row_mask: bool `[V]`; true where a row (and its slots) may be written.
hyperparameters: The rule's hyperparameters, a vector in its order
  (learning_rate and weight_decay first), rounded as Keras rounds them.
rule: The rule's name in the table.
num_slots: How many slots the rule has.
use_locking: Accepted for the signature of TF's apply ops; the variables'
  locks are always held exclusively for the whole update (taken in address
  order, so concurrent steps cannot deadlock).
)doc");

REGISTER_OP("PartialEmbedding>MaskedSparseApplyRuleWithSlotIndices")
    .Input("var: resource")
    .Input("slots: num_slots * resource")
    .Input("indices: Tindices")
    .Input("slot_indices: Tindices")
    .Input("grad: dtype")
    .Input("row_mask: bool")
    .Input("hyperparameters: dtype")
    .Attr("rule: string")
    .Attr("num_slots: int >= 0")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("use_locking: bool = true")
    .SetShapeFn(MaskedSparseApplyRuleShape<true>)
    .Doc(R"doc(
MaskedSparseApplyRule with compact slots: the slots of the row at position k
of `indices` are row `slot_indices[k]` of each slot, which may have any number
S >= 1 of rows (S may be much less than V: one slot row for each row that can
be permitted). The same operations, order and rounding as
MaskedSparseApplyRule, which this equals bit for bit when the slots hold, at
each slot row, the full-size slots' row it stands for. Frozen rows (and their
slot rows) are not written. Before anything is written, every index is checked
against [0, V), every slot index (frozen rows' too) against [0, S), every
occurrence of a permitted row must name the same slot row, and two permitted
rows must not name the same slot row.

var: The variable, a resource of rank >= 1 with V rows.
slots: The rule's slots, in its order: [S] + var.shape[1:] (per element) or
  [S] (per row), of var's dtype.
indices: Row numbers of var, any shape, each in [0, V); duplicates allowed.
slot_indices: indices' shape and dtype: the slot row of each position, each
  in [0, S).
grad: `indices.shape + var.shape[1:]`: the gradient rows, by position.
row_mask: bool `[V]`; true where a row (and its slot row) may be written.
hyperparameters: The rule's hyperparameters, a vector in its order.
rule: The rule's name in the table.
num_slots: How many slots the rule has.
use_locking: Accepted; the locks are always held.
)doc");

}  // namespace partial_embedding
