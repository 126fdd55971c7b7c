// The device functor behind the MaskedEmbeddingBagApplyRule OpKernel (full-
// size slots): one template over <Device, T, Index>, specialized for the CPU
// in masked_embedding_bag_apply_kernels.cc and for the GPU in
// masked_embedding_bag_apply_kernels.cu.cc. Both apply any rule of the table
// (cc/core/row_rules.h) to the permitted rows of a batch of bags.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_KERNELS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_KERNELS_H_

#include <algorithm>
#include <cstdint>

#include "cc/core/embedding_bag.h"
#include "cc/core/row_rules.h"
#include "cc/kernels/in_place_update.h"
#include "cc/kernels/masked_sparse_apply_kernels.h"

namespace partial_embedding {

// One step's inputs, checked for shape and dtype, the variables locked, as
// raw pointers where the device keeps them (ids, bags, grad, factors,
// row_mask and the hyperparameters: host memory on the CPU, device memory on
// the GPU).
template <typename T, typename Index>
struct BagRuleStepArgs {
  using Compute = typename Arith<CoreOf<T>>::Compute;
  const VariableInputs* tables = nullptr;  // var, then the rule's slots.
  Rule rule = Rule::kSgd;
  int64_t num_rows = 0;
  int64_t row_size = 0;
  BagPositions<Index> positions;
  const T* grad = nullptr;
  const Compute* factors = nullptr;
  const bool* row_mask = nullptr;
  // The rule's InfoOf(rule).num_hyperparameters values, in its order.
  const T* hyperparameters = nullptr;
};

// The most slot rows a float32 slot map holds exactly (MaskedOptimizer's
// MAX_SLOT_ROWS).
inline constexpr int64_t kMaxBagSlotRows = int64_t{1} << 24;

// The rows compact slots of `num_slot_rows` rows grow to when a step needs
// `needed`: by half at least, as CompactSlots grows them, at most
// kMaxBagSlotRows.
inline int64_t GrownSlotRows(int64_t needed, int64_t num_slot_rows) {
  const int64_t by_half = num_slot_rows + num_slot_rows / 2 + 1;
  return std::min(std::max(needed, by_half), kMaxBagSlotRows);
}

template <typename Device, typename T, typename Index>
struct MaskedEmbeddingBagApplyRuleFunctor {
  // Checks every position before the first write, gives the tables buffers
  // of their own where a reader still holds one, and applies the step. A
  // refused batch sets *error and writes nothing; a non-OK status is a
  // device or allocation failure.
  absl::Status operator()(OpKernelContext* ctx,
                          const BagRuleStepArgs<T, Index>& args,
                          BagInputError* error) const;
};

// The compact-slot step (MaskedEmbeddingBagApplyRuleWithSlotMap) on the GPU
// (the CPU's stays in its OpKernel): args.tables holds var, the rule's
// slots, slot_of_row and slot_rows_used; `slot_initial_values` (host
// memory) each slot's value in the rows it grows by. A refused batch sets
// *error, a refused map *slot_plan (with *num_slot_rows, the slots' rows,
// for its message); nothing is written then.
template <typename Device, typename T, typename Index>
struct MaskedEmbeddingBagApplyRuleWithSlotMapFunctor {
  absl::Status operator()(OpKernelContext* ctx,
                          const BagRuleStepArgs<T, Index>& args,
                          const T* slot_initial_values, BagInputError* error,
                          SlotMapPlan* slot_plan, int64_t* num_slot_rows) const;
};

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_KERNELS_H_
