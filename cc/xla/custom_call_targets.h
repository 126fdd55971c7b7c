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

// The fused step of any rule of the table (cc/core/row_rules.h), the lowering
// of MaskedSparseApplyRule. Operands: var, the rule's slots (in its order),
// indices, grad, row_mask, hyperparameters (a vector, in the rule's order).
// Attribute (backend_config): rule, the rule's name in the table. Result: var
// alone, or the tuple (var, slots...), element i aliased to operand i.
inline constexpr char kMaskedSparseApplyRuleTarget[] =
    "partial_embedding_masked_sparse_apply_rule";

// The same with compact slots (MaskedSparseApplyRuleWithSlotIndices):
// slot_indices follows indices among the operands; the slots have S rows.
// Under XLA a position whose slot index is negative is skipped: its row is
// neither checked nor written (the optimizer's XLA path numbers ids outside
// [0, V), and rows that found no free slot row, so).
//
// Every target skips a position whose index is outside [0, V) (XLA has no
// run-time errors; its own scatters skip such indices too).
inline constexpr char kMaskedSparseApplyRuleSlotsTarget[] =
    "partial_embedding_masked_sparse_apply_rule_slots";

// The name of the custom calls' attribute that holds the rule's name.
inline constexpr char kRuleAttribute[] = "rule";

// The platforms the handlers are registered for: XLA's CPU backend (the CPU
// handlers, or in an emulator build the CUDA handlers' code) and XLA's CUDA
// backend (cc/xla/masked_row_updates_gpu_ffi.cc).
inline constexpr char kHostPlatform[] = "Host";
inline constexpr char kCudaPlatform[] = "CUDA";

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_XLA_CUSTOM_CALL_TARGETS_H_
