// The inputs of PartialEmbedding>MaskedEmbeddingBagApplyAdam and
// PartialEmbedding>MaskedEmbeddingBagApplyAdamWithSlotMap by position, and
// the names errors give them: one list for the ops' shape functions and
// their kernel (ops -> kernels -> core, never the reverse).
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_INPUTS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_INPUTS_H_

namespace partial_embedding {
namespace bag_adam_input {

// var, m, v, v_hat: resource inputs 0 .. 3 (v_hat looked up only with
// amsgrad); with a slot map, slot_of_row and slot_rows_used follow.
inline constexpr int kVar = 0;
inline constexpr int kVHat = 3;
inline constexpr int kSlotOfRow = 4;
inline constexpr int kSlotRowsUsed = 5;
// The resources' names in errors, by position.
inline constexpr const char* kTableNames[kSlotRowsUsed + 1] = {
    "var", "m", "v", "v_hat", "slot_of_row", "slot_rows_used"};
inline constexpr int kNumScalars = 6;
inline constexpr const char* kScalarNames[kNumScalars] = {
    "learning_rate", "one_minus_beta_1", "one_minus_beta_2", "epsilon",
    "alpha",         "weight_decay"};

// The positions of the inputs after the resources.
struct LaterInputs {
  constexpr explicit LaterInputs(bool with_slot_map)
      : grad(with_slot_map ? kSlotRowsUsed + 1 : kVHat + 1),
        ids(grad + 1),
        bags(grad + 2),
        factors(grad + 3),
        row_mask(grad + 4),
        first_scalar(grad + 5) {}
  int grad;
  int ids;
  int bags;
  int factors;
  int row_mask;
  int first_scalar;
};

}  // namespace bag_adam_input
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_INPUTS_H_
