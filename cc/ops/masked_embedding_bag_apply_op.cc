// Declares PartialEmbedding>MaskedEmbeddingBagApplyAdam and its compact-slot
// twin PartialEmbedding>MaskedEmbeddingBagApplyAdamWithSlotMap: the gradient
// of EmbeddingBag and the lazy Adam step in one op. Attrs, shape functions
// that check the contract of cc/core/embedding_bag_contract.h on what the
// variables' handles and the inputs know, and documentation for every input.
#include <cstddef>
#include <optional>
#include <utility>

#include "cc/core/embedding_bag_contract.h"
#include "cc/kernels/masked_embedding_bag_apply_inputs.h"
#include "cc/ops/row_update_shapes.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace partial_embedding {

using ::tensorflow::shape_inference::InferenceContext;

namespace {

// The tables as far as their handles know them: var, the slots, and with
// a slot map, slot_of_row and slot_rows_used (unknown ones as the contract
// wants them). A var of unknown rank takes grad's, else the first slot's.
absl::Status TableShapes(InferenceContext* c, bool with_slot_map,
                         BagAdamShapes* shapes) {
  bool amsgrad = false;
  TF_RETURN_IF_ERROR(c->GetAttr("amsgrad", &amsgrad));
  ::tensorflow::DataType dtype;
  TF_RETURN_IF_ERROR(c->GetAttr("dtype", &dtype));
  std::optional<Dims> var;
  using bag_adam_input::kTableNames;
  TF_RETURN_IF_ERROR(VariableDims(
      c, bag_adam_input::kVar, kTableNames[bag_adam_input::kVar], dtype, &var));
  for (int i = bag_adam_input::kVar + 1; i <= bag_adam_input::kVHat; ++i) {
    if (i == bag_adam_input::kVHat && !amsgrad) break;
    const char* name = kTableNames[i];
    std::optional<Dims> dims;
    TF_RETURN_IF_ERROR(VariableDims(c, i, name, dtype, &dims));
    if (dims.has_value()) shapes->slots.push_back({name, *std::move(dims)});
  }
  size_t rank = shapes->slots.empty() ? 1 : shapes->slots[0].dims.size();
  if (!shapes->grad.empty()) rank = shapes->grad.size();
  shapes->var = var.value_or(Dims(rank, kUnknownDim));
  if (!with_slot_map) return absl::OkStatus();
  std::optional<Dims> map, used;
  TF_RETURN_IF_ERROR(VariableDims(c, bag_adam_input::kSlotOfRow,
                                  kTableNames[bag_adam_input::kSlotOfRow],
                                  ::tensorflow::DT_FLOAT, &map));
  TF_RETURN_IF_ERROR(VariableDims(c, bag_adam_input::kSlotRowsUsed,
                                  kTableNames[bag_adam_input::kSlotRowsUsed],
                                  ::tensorflow::DT_INT64, &used));
  shapes->slot_of_row = map.value_or(Dims{kUnknownDim});
  shapes->slot_rows_used = used.value_or(Dims{});
  return absl::OkStatus();
}

template <bool kWithSlotMap>
absl::Status MaskedEmbeddingBagApplyAdamShape(InferenceContext* c) {
  constexpr bag_adam_input::LaterInputs kInputs(kWithSlotMap);
  TF_RETURN_IF_ERROR(
      CheckScalarShapes(c, kInputs.first_scalar, bag_adam_input::kScalarNames));
  BagAdamShapes shapes;
  // grad of unknown rank: a rank >= 1 that fits var's; set after the tables.
  const std::optional<Dims> grad = KnownDims(c, c->input(kInputs.grad));
  if (grad.has_value()) shapes.grad = *grad;
  TF_RETURN_IF_ERROR(TableShapes(c, kWithSlotMap, &shapes));
  if (!grad.has_value()) shapes.grad = Dims(shapes.var.size(), kUnknownDim);
  shapes.positions = {KnownDimsOr(c, c->input(kInputs.ids), 1),
                      KnownDimsOr(c, c->input(kInputs.bags), 1),
                      KnownDimsOr(c, c->input(kInputs.factors), 1), "factors"};
  shapes.row_mask = KnownDimsOr(c, c->input(kInputs.row_mask), 1);
  return ContractStatus(CheckBagAdamShapes(shapes, ShapeNotation::kTensorFlow));
}

}  // namespace

REGISTER_OP("PartialEmbedding>MaskedEmbeddingBagApplyAdam")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("v_hat: resource")
    .Input("grad: dtype")
    .Input("ids: Tindices")
    .Input("bags: int64")
    .Input("factors: Tcompute")
    .Input("row_mask: bool")
    .Input("learning_rate: dtype")
    .Input("one_minus_beta_1: dtype")
    .Input("one_minus_beta_2: dtype")
    .Input("epsilon: dtype")
    .Input("alpha: dtype")
    .Input("weight_decay: dtype")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tcompute: {float, double}")
    .Attr("amsgrad: bool = false")
    .SetShapeFn(MaskedEmbeddingBagApplyAdamShape<false>)
    .Doc(R"doc(
MaskedEmbeddingBagGrad followed by MaskedSparseApplyAdam, in one pass: the
lazy Adam / AdamW / AMSGrad step of the permitted rows of a batch of bags,
each row's gradient summed straight from the bags' gradient, never written
out.

For every distinct id r among the unpruned positions with `row_mask[r]`
true, g = `sum_i factors[i] * grad[bags[i]]` over the positions of r (in
position order, in Tcompute, rounded to dtype once: MaskedEmbeddingBagGrad's
value for r), then MaskedSparseApplyAdam's step on row r of var, m, v (and
v_hat), with the same operations, order and rounding: the result is bit for
bit that of the two ops. Frozen and pruned ids write nothing; rows absent
from the batch are not touched. Every id and bag is checked before anything
is written. The buffers are written in place, copied first only where a
reader still holds one. CPU only.

var: The variable, a resource of rank >= 1 with V rows.
m: The first-moment slot, of var's shape and dtype.
v: The second-moment slot, of var's shape and dtype.
v_hat: The running maximum of v (AMSGrad), of var's shape and dtype. Looked
  up only when `amsgrad` is true (otherwise pass any resource, e.g. v).
grad: `[B] + var.shape[1:]`, the gradient of EmbeddingBag's output.
ids: `[N]` row ids, each < V (negative: pruned).
bags: `[N]`, the bag of each position, in [0, B).
factors: `[N]`, EmbeddingBag's factors output.
row_mask: bool `[V]`; true where a row (and its slots) may be written.
learning_rate: Scalar; used by weight decay only.
one_minus_beta_1: Scalar `1 - beta_1`.
one_minus_beta_2: Scalar `1 - beta_2`.
epsilon: Scalar added to the square root of the second moment.
alpha: Scalar step size with bias correction,
  `learning_rate * sqrt(1 - beta_2^t) / (1 - beta_1^t)`.
weight_decay: Scalar decoupled weight decay; 0 for none.
amsgrad: Whether to keep and use the running maximum `v_hat`.
)doc");

REGISTER_OP("PartialEmbedding>MaskedEmbeddingBagApplyAdamWithSlotMap")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("v_hat: resource")
    .Input("slot_of_row: resource")
    .Input("slot_rows_used: resource")
    .Input("grad: dtype")
    .Input("ids: Tindices")
    .Input("bags: int64")
    .Input("factors: Tcompute")
    .Input("row_mask: bool")
    .Input("learning_rate: dtype")
    .Input("one_minus_beta_1: dtype")
    .Input("one_minus_beta_2: dtype")
    .Input("epsilon: dtype")
    .Input("alpha: dtype")
    .Input("weight_decay: dtype")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tcompute: {float, double}")
    .Attr("amsgrad: bool = false")
    .SetShapeFn(MaskedEmbeddingBagApplyAdamShape<true>)
    .Doc(R"doc(
MaskedEmbeddingBagApplyAdam with compact slots, as MaskedOptimizer keeps
them. m, v (and v_hat) hold S >= 1 slot rows, `slot_of_row` maps a row to its
slot row (-1: none yet) and `slot_rows_used` counts the slot rows taken.

A permitted row of the batch without a slot row takes the next free one
(`slot_rows_used`, then up), in order of first occurrence, filled with zeros
(Adam's initial slot value); when more are needed than m has rows, m, v and
v_hat grow to max(needed, S + S / 2 + 1) rows (at most 2^24), keeping their
values. Then each permitted row r with slot row s takes the step of
MaskedEmbeddingBagApplyAdam with m[s], v[s], v_hat[s]: the result, the map and
the count are bit for bit those of MaskedEmbeddingBagGrad, MaskedOptimizer's
slot-row assignment and MaskedSparseApplyAdamWithSlotIndices. Before anything
is written, every id and bag is checked, every slot row the map gives a
permitted row of the batch must be a whole number in [0, S), and no two
permitted rows may share one.

var: The variable, a resource of rank >= 1 with V rows.
m: The first-moment slots, [S] + var.shape[1:], of var's dtype.
v: The second-moment slots, of m's shape and var's dtype.
v_hat: The running maximum of v (AMSGrad), of m's shape and var's dtype.
  Looked up only when `amsgrad` is true (otherwise pass any resource).
slot_of_row: float32 `[V]` variable: each row's slot row, negative for none.
slot_rows_used: int64 scalar variable: how many slot rows are taken.
grad: `[B] + var.shape[1:]`, the gradient of EmbeddingBag's output.
ids: `[N]` row ids, each < V (negative: pruned).
bags: `[N]`, the bag of each position, in [0, B).
factors: `[N]`, EmbeddingBag's factors output.
row_mask: bool `[V]`; true where a row (and its slot row) may be written.
learning_rate: Scalar; used by weight decay only.
one_minus_beta_1: Scalar `1 - beta_1`.
one_minus_beta_2: Scalar `1 - beta_2`.
epsilon: Scalar added to the square root of the second moment.
alpha: Scalar step size with bias correction,
  `learning_rate * sqrt(1 - beta_2^t) / (1 - beta_1^t)`.
weight_decay: Scalar decoupled weight decay; 0 for none.
amsgrad: Whether to keep and use the running maximum `v_hat`.
)doc");

}  // namespace partial_embedding
