// The custom-call target names that the XLA kernels (cc/xla/*_xla_kernel.cc)
// emit and the FFI handlers (cc/xla/*_ffi.cc) register under. Both sides
// include this header so that they cannot drift apart.
#ifndef PARTIAL_EMBEDDING_CC_XLA_CUSTOM_CALL_TARGETS_H_
#define PARTIAL_EMBEDDING_CC_XLA_CUSTOM_CALL_TARGETS_H_

namespace partial_embedding {

// table[indices[i]] -= updates[i] where row_mask[indices[i]], in place.
// Operands: table [V, ...], indices (any shape), updates, row_mask [V] (pred).
// Result: the table, aliased to operand 0.
inline constexpr char kMaskedScatterSubTarget[] =
    "partial_embedding_masked_scatter_sub";

// The fused lazy Adam / AdamW step (MaskedSparseApplyAdam). Operands: var, m,
// v, indices, grad, row_mask, then six scalars (learning_rate,
// one_minus_beta_1, one_minus_beta_2, epsilon, alpha, weight_decay). Result:
// the tuple (var, m, v), element i aliased to operand i.
inline constexpr char kMaskedSparseApplyAdamTarget[] =
    "partial_embedding_masked_sparse_apply_adam";
// The same with AMSGrad: v_hat follows v among the operands and the results.
inline constexpr char kMaskedSparseApplyAmsgradTarget[] =
    "partial_embedding_masked_sparse_apply_amsgrad";

// The fused step with compact slots (MaskedSparseApplyAdamWithSlotIndices):
// slot_indices follows indices among the operands; the slots have S rows.
// Under XLA a position whose slot index is negative is skipped: its row is
// neither checked nor written (the optimizer's XLA path numbers ids outside
// [0, V), and rows that found no free slot row, so).
inline constexpr char kMaskedSparseApplyAdamSlotsTarget[] =
    "partial_embedding_masked_sparse_apply_adam_slots";
inline constexpr char kMaskedSparseApplyAmsgradSlotsTarget[] =
    "partial_embedding_masked_sparse_apply_amsgrad_slots";

// The platform the handlers are registered for: XLA's CPU backend.
inline constexpr char kHostPlatform[] = "Host";

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_XLA_CUSTOM_CALL_TARGETS_H_
