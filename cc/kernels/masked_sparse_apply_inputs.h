// The inputs of PartialEmbedding>MaskedSparseApplyAdam and
// PartialEmbedding>MaskedSparseApplyAdamWithSlotIndices by position, and the
// names errors give them: one list for the ops' shape functions and their
// kernel. It lives with the kernel and the ops include it (ops -> kernels ->
// core, never the reverse).
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_INPUTS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_INPUTS_H_

namespace partial_embedding {
namespace adam_input {

// var, m, v, v_hat: the resource inputs 0 .. 3 (v_hat only with amsgrad).
inline constexpr int kMaxTables = 4;
inline constexpr const char* kTableNames[kMaxTables] = {"var", "m", "v",
                                                        "v_hat"};
inline constexpr int kVar = 0;
inline constexpr int kVHat = 3;
inline constexpr int kIndices = 4;
// Only in the op with slot indices, which has every later input one place
// further on.
inline constexpr int kSlotIndices = 5;
inline constexpr int kNumScalars = 6;
inline constexpr const char* kScalarNames[kNumScalars] = {
    "learning_rate", "one_minus_beta_1", "one_minus_beta_2", "epsilon",
    "alpha",         "weight_decay"};

// The positions of the inputs after `indices` (and `slot_indices`); the
// scalar hyperparameters follow in kScalarNames' order from first_scalar on.
struct LaterInputs {
  constexpr explicit LaterInputs(bool with_slot_indices)
      : grad(with_slot_indices ? kSlotIndices + 1 : kIndices + 1),
        row_mask(grad + 1),
        first_scalar(grad + 2) {}
  int grad;
  int row_mask;
  int first_scalar;
};

}  // namespace adam_input
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_INPUTS_H_
