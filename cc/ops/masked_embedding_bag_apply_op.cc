// Declares PartialEmbedding>MaskedEmbeddingBagApplyRule and its compact-slot
// twin PartialEmbedding>MaskedEmbeddingBagApplyRuleWithSlotMap: the gradient
// of EmbeddingBag and any rule of the table (cc/core/row_rules.h) in one op.
// Attrs, shape functions that check the contract of
// cc/core/embedding_bag_contract.h on what the variables' handles and the
// inputs know, and documentation for every input.
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
absl::Status TableShapes(InferenceContext* c, Rule rule,
                         const bag_rule_input::Positions& inputs,
                         BagAdamShapes* shapes) {
  ::tensorflow::DataType dtype;
  TF_RETURN_IF_ERROR(c->GetAttr("dtype", &dtype));
  std::optional<Dims> var;
  TF_RETURN_IF_ERROR(VariableDims(c, bag_rule_input::kVar, "var", dtype, &var));
  TF_RETURN_IF_ERROR(RuleSlotShapes(c, rule, bag_rule_input::kFirstSlot, dtype,
                                    &shapes->slots));
  size_t rank = shapes->slots.empty() || shapes->slots[0].per_row
                    ? 1
                    : shapes->slots[0].dims.size();
  if (!shapes->grad.empty()) rank = shapes->grad.size();
  shapes->var = var.value_or(Dims(rank, kUnknownDim));
  if (inputs.slot_of_row < 0) return absl::OkStatus();
  std::optional<Dims> map, used;
  TF_RETURN_IF_ERROR(VariableDims(c, inputs.slot_of_row, "slot_of_row",
                                  ::tensorflow::DT_FLOAT, &map));
  TF_RETURN_IF_ERROR(VariableDims(c, inputs.slot_rows_used, "slot_rows_used",
                                  ::tensorflow::DT_INT64, &used));
  shapes->slot_of_row = map.value_or(Dims{kUnknownDim});
  shapes->slot_rows_used = used.value_or(Dims{});
  return absl::OkStatus();
}

template <bool kWithSlotMap>
absl::Status MaskedEmbeddingBagApplyRuleShape(InferenceContext* c) {
  Rule rule;
  TF_RETURN_IF_ERROR(RuleOfOpAttrs(c, &rule));
  const bag_rule_input::Positions inputs(InfoOf(rule).num_slots, kWithSlotMap);
  TF_RETURN_IF_ERROR(
      CheckHyperparametersInput(c, rule, inputs.hyperparameters));
  BagAdamShapes shapes;
  // grad of unknown rank: a rank >= 1 that fits var's; set after the tables.
  const std::optional<Dims> grad = KnownDims(c, c->input(inputs.grad));
  if (grad.has_value()) shapes.grad = *grad;
  TF_RETURN_IF_ERROR(TableShapes(c, rule, inputs, &shapes));
  if (!grad.has_value()) shapes.grad = Dims(shapes.var.size(), kUnknownDim);
  shapes.positions = {KnownDimsOr(c, c->input(inputs.ids), 1),
                      KnownDimsOr(c, c->input(inputs.bags), 1),
                      KnownDimsOr(c, c->input(inputs.factors), 1), "factors"};
  shapes.row_mask = KnownDimsOr(c, c->input(inputs.row_mask), 1);
  return ContractStatus(CheckBagAdamShapes(shapes, ShapeNotation::kTensorFlow));
}

}  // namespace

REGISTER_OP("PartialEmbedding>MaskedEmbeddingBagApplyRule")
    .Input("var: resource")
    .Input("slots: num_slots * resource")
    .Input("grad: dtype")
    .Input("ids: Tindices")
    .Input("bags: int64")
    .Input("factors: Tcompute")
    .Input("row_mask: bool")
    .Input("hyperparameters: dtype")
    .Attr("rule: string")
    .Attr("num_slots: int >= 0")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tcompute: {float, double}")
    .SetShapeFn(MaskedEmbeddingBagApplyRuleShape<false>)
    .Doc(R"doc(
MaskedEmbeddingBagGrad followed by MaskedSparseApplyRule, in one pass: a rule
of the table on the permitted rows of a batch of bags, each row's gradient
summed straight from the bags' gradient, never written out.

For every distinct id r among the unpruned positions with `row_mask[r]`
true, g = `sum_i factors[i] * grad[bags[i]]` over the positions of r (in
position order, in Tcompute, rounded to dtype once: MaskedEmbeddingBagGrad's
value for r), then MaskedSparseApplyRule's step on row r of var and of its
slots, with the same operations, order and rounding: the result is bit for
bit that of the two ops. Frozen and pruned ids write nothing; rows absent
from the batch are not touched. Every id and bag is checked before anything
is written. The buffers are written in place, copied first only where a
reader still holds one. CPU only.

var: The variable, a resource of rank >= 1 with V rows.
slots: The rule's slots, in its order: var's shape, or [V] for a per-row slot.
grad: `[B] + var.shape[1:]`, the gradient of EmbeddingBag's output.
ids: `[N]` row ids, each < V (negative: pruned).
bags: `[N]`, the bag of each position, in [0, B).
factors: `[N]`, EmbeddingBag's factors output.
row_mask: bool `[V]`; true where a row (and its slots) may be written.
hyperparameters: The rule's hyperparameters, a vector in its order.
rule: The rule's name in the table.
num_slots: How many slots the rule has.
)doc");

REGISTER_OP("PartialEmbedding>MaskedEmbeddingBagApplyRuleWithSlotMap")
    .Input("var: resource")
    .Input("slots: num_slots * resource")
    .Input("slot_of_row: resource")
    .Input("slot_rows_used: resource")
    .Input("grad: dtype")
    .Input("ids: Tindices")
    .Input("bags: int64")
    .Input("factors: Tcompute")
    .Input("row_mask: bool")
    .Input("hyperparameters: dtype")
    .Input("slot_initial_values: dtype")
    .Attr("rule: string")
    .Attr("num_slots: int >= 0")
    .Attr("dtype: {half, bfloat16, float, double}")
    .Attr("Tindices: {int32, int64}")
    .Attr("Tcompute: {float, double}")
    .SetShapeFn(MaskedEmbeddingBagApplyRuleShape<true>)
    .Doc(R"doc(
MaskedEmbeddingBagApplyRule with compact slots, as MaskedOptimizer keeps
them. The slots hold S >= 1 slot rows, `slot_of_row` maps a row to its slot
row (-1: none yet) and `slot_rows_used` counts the slot rows taken.

A permitted row of the batch without a slot row takes the next free one
(`slot_rows_used`, then up), in order of first occurrence; when more are
needed than the slots have rows, they grow to max(needed, S + S / 2 + 1)
rows (at most 2^24), keeping their values, the new rows filled with
`slot_initial_values` (one value a slot, as Keras' build fills them). Then
each permitted row r with slot row s takes the step of
MaskedEmbeddingBagApplyRule with slot row s: the result, the map and the count
are bit for bit those of MaskedEmbeddingBagGrad, MaskedOptimizer's slot-row
assignment and MaskedSparseApplyRuleWithSlotIndices. Before anything is
written, every id and bag is checked, every slot row the map gives a
permitted row of the batch must be a whole number in [0, S), and no two
permitted rows may share one.

var: The variable, a resource of rank >= 1 with V rows.
slots: The rule's slots, in its order: [S] + var.shape[1:], or [S] per row.
slot_of_row: float32 `[V]` variable: each row's slot row, negative for none.
slot_rows_used: int64 scalar variable: how many slot rows are taken.
grad: `[B] + var.shape[1:]`, the gradient of EmbeddingBag's output.
ids: `[N]` row ids, each < V (negative: pruned).
bags: `[N]`, the bag of each position, in [0, B).
factors: `[N]`, EmbeddingBag's factors output.
row_mask: bool `[V]`; true where a row (and its slot row) may be written.
hyperparameters: The rule's hyperparameters, a vector in its order.
slot_initial_values: `[num_slots]`: the value of each slot's new rows.
rule: The rule's name in the table.
num_slots: How many slots the rule has.
)doc");

}  // namespace partial_embedding
