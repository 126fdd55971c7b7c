// The inputs of PartialEmbedding>MaskedEmbeddingBagApplyRule and
// PartialEmbedding>MaskedEmbeddingBagApplyRuleWithSlotMap by position: one
// list for the ops' shape functions and their kernel (ops -> kernels ->
// core, never the reverse).
//
// The inputs: var, the rule's slots (num_slots resources, in its order),
// with a slot map slot_of_row and slot_rows_used, then grad, ids, bags,
// factors, row_mask, hyperparameters and, with a slot map,
// slot_initial_values.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_INPUTS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_INPUTS_H_

namespace partial_embedding {
namespace bag_rule_input {

inline constexpr int kVar = 0;
inline constexpr int kFirstSlot = 1;

// The positions of the inputs after the slots.
struct Positions {
  constexpr Positions(int num_slots, bool with_slot_map)
      : slot_of_row(with_slot_map ? kFirstSlot + num_slots : -1),
        slot_rows_used(with_slot_map ? slot_of_row + 1 : -1),
        grad(kFirstSlot + num_slots + (with_slot_map ? 2 : 0)),
        ids(grad + 1),
        bags(grad + 2),
        factors(grad + 3),
        row_mask(grad + 4),
        hyperparameters(grad + 5),
        slot_initial_values(with_slot_map ? grad + 6 : -1) {}
  int slot_of_row;  // -1 without a slot map, as slot_rows_used.
  int slot_rows_used;
  int grad;
  int ids;
  int bags;
  int factors;
  int row_mask;
  int hyperparameters;
  int slot_initial_values;  // -1 without a slot map.
};

}  // namespace bag_rule_input
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_INPUTS_H_
