// The device functor behind the MaskedEmbeddingBagApplyRule OpKernel (full-
// size slots): one template over <Device, T, Index>, specialized for the CPU
// in masked_embedding_bag_apply_kernels.cc and for the GPU in
// masked_embedding_bag_apply_kernels.cu.cc. Both apply any rule of the table
// (cc/core/row_rules.h) to the permitted rows of a batch of bags.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_KERNELS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_KERNELS_H_

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

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_EMBEDDING_BAG_APPLY_KERNELS_H_
