// The device functor behind the MaskedSparseApplyRule OpKernels: one
// template over <Device, T, Index>, specialized for the CPU in
// masked_sparse_apply_kernels.cc and for the GPU in
// masked_sparse_apply_kernels.cu.cc. Both apply any rule of the table
// (cc/core/row_rules.h).
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_KERNELS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_KERNELS_H_

#include <cstdint>

#include "cc/core/masked_sparse_apply.h"
#include "cc/core/row_rules.h"
#include "cc/kernels/in_place_update.h"
#include "cc/kernels/masked_sparse_apply_inputs.h"

namespace partial_embedding {

// One step's inputs, checked for shape and dtype, the variables locked.
template <typename T, typename Index>
struct MaskedSparseApplyRuleArgs {
  const VariableInputs* tables = nullptr;  // var, then the rule's slots.
  Rule rule = Rule::kSgd;
  int64_t num_rows = 0;
  int64_t row_size = 0;
  const Index* indices = nullptr;
  int64_t num_indices = 0;
  // Null without a slot map (full-size slots).
  const Index* slot_indices = nullptr;
  int64_t num_slot_rows = 0;
  const T* grad = nullptr;
  const bool* row_mask = nullptr;
  // The rule's hyperparameters (InfoOf(rule).num_hyperparameters values, in
  // its order), where the device keeps them (host memory on the CPU, device
  // memory on the GPU).
  const T* hyperparameters = nullptr;
};

// The core's view of a TensorFlow scalar or table of T (same bit layout).
template <typename T>
using CoreOf = typename CoreType<T>::type;

// The core's tables: the variables' buffers as they are now (after
// CopySharedTables): var, then the rule's slots in its order.
template <typename T>
RuleTables<CoreOf<T>> CoreTables(const VariableInputs& tables, Rule rule,
                                 int64_t num_rows, int64_t row_size) {
  auto table = [&](int i) {
    return reinterpret_cast<CoreOf<T>*>(tables.tensor(i)->flat<T>().data());
  };
  RuleTables<CoreOf<T>> core;
  core.var = table(rule_input::kVar);
  for (int i = 0; i < InfoOf(rule).num_slots; ++i) {
    core.slots[i] = table(rule_input::kFirstSlot + i);
  }
  core.num_rows = num_rows;
  core.row_size = row_size;
  return core;
}

// Gives every table a buffer of its own where a reader still holds one.
template <typename Device>
absl::Status CopySharedTables(OpKernelContext* ctx,
                              const VariableInputs& tables) {
  for (int i = 0; i < tables.size(); ++i) {
    TF_RETURN_IF_ERROR(CopyIfShared<Device>(ctx, tables.tensor(i)));
  }
  return absl::OkStatus();
}

template <typename Device, typename T, typename Index>
struct MaskedSparseApplyRuleFunctor {
  // Checks every index and the slot map before the first write, gives the
  // tables buffers of their own where a reader still holds one, and applies
  // the step. A refused step sets *error (and *values, the index values its
  // message names) and writes nothing; a non-OK status is a device failure.
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedSparseApplyRuleArgs<T, Index>& args,
                          RuleInputError* error, RuleErrorValues* values) const;
};

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_KERNELS_H_
