// The inputs of PartialEmbedding>MaskedSparseApplyAdam by position, and the
// names errors give them: one list for the op's shape function and its kernel.
#ifndef PARTIAL_EMBEDDING_CC_OPS_MASKED_SPARSE_APPLY_INPUTS_H_
#define PARTIAL_EMBEDDING_CC_OPS_MASKED_SPARSE_APPLY_INPUTS_H_

namespace partial_embedding {
namespace adam_input {

// var, m, v, v_hat: the resource inputs 0 .. 3 (v_hat only with amsgrad).
inline constexpr int kMaxTables = 4;
inline constexpr const char* kTableNames[kMaxTables] = {"var", "m", "v",
                                                        "v_hat"};
inline constexpr int kVar = 0;
inline constexpr int kVHat = 3;
inline constexpr int kIndices = 4;
inline constexpr int kGrad = 5;
inline constexpr int kRowMask = 6;
// The scalar hyperparameters, in this order from input kFirstScalar on.
inline constexpr int kFirstScalar = 7;
inline constexpr int kNumScalars = 6;
inline constexpr const char* kScalarNames[kNumScalars] = {
    "learning_rate", "one_minus_beta_1", "one_minus_beta_2", "epsilon",
    "alpha",         "weight_decay"};

}  // namespace adam_input
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_OPS_MASKED_SPARSE_APPLY_INPUTS_H_
