// The inputs of PartialEmbedding>MaskedSparseApplyRule and
// PartialEmbedding>MaskedSparseApplyRuleWithSlotIndices by position: one
// list for the ops' shape functions, their kernels (CPU and GPU) and their
// XLA lowering. It lives with the kernel and the ops include it (ops ->
// kernels -> core, never the reverse).
//
// The inputs: var, the rule's slots (num_slots resources, in the rule's
// order, cc/core/row_rules.h), indices, (slot_indices,) grad, row_mask and
// hyperparameters (a vector of the rule's hyperparameters, in its order).
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_INPUTS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_INPUTS_H_

namespace partial_embedding {
namespace rule_input {

inline constexpr int kVar = 0;
inline constexpr int kFirstSlot = 1;

// The positions of the inputs after the slots.
struct Positions {
  constexpr Positions(int num_slots, bool with_slot_indices)
      : indices(kFirstSlot + num_slots),
        slot_indices(with_slot_indices ? indices + 1 : -1),
        grad(indices + (with_slot_indices ? 2 : 1)),
        row_mask(grad + 1),
        hyperparameters(grad + 2) {}
  int indices;
  int slot_indices;  // -1 without slot indices.
  int grad;
  int row_mask;
  int hyperparameters;
};

}  // namespace rule_input
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_INPUTS_H_
