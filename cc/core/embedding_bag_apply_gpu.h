// CUDA implementation of the fused bag backward + rule step
// (MaskedEmbeddingBagApplyRule's TF-free core on the GPU): the bags' gradient
// goes straight into the permitted rows of the table and their slots, with
// any rule of the table (row_rules.h). Full-size slots. Every pointer is a
// device pointer, the hyperparameters' too (see WriteGpuRuleHyperparameters).
//
// It composes the two GPU cores that already hold each half, so each keeps
// one implementation: EmbeddingBagGradGpuPlan (embedding_bag_gpu.h) checks
// every position and groups the permitted ones by row, reporting the number
// of distinct rows U (its one synchronisation); then
// EmbeddingBagApplyRuleGpuAsync has EmbeddingBagGradGpuValues write each
// row's gradient (factor * grad[bag] over the row's positions, in position
// order, in the compute type, rounded to T once: exactly the CPU's BagRows)
// into a [U, row_size] buffer of the workspace, and
// MaskedSparseApplyRuleGpuAsync apply the rule to those U distinct rows.
//
// What matches the CPU kernel (ApplyPlannedBagRuleCpu). Each row occurs once
// in the second call's indices, so its gradient sum is one piece:
// 0 + g rounded to T, which is g (a zero's sign aside: a 16-bit g that
// rounds to -0 becomes +0, the only way the two inputs of the step can
// differ). So an element-wise rule gives the CPU kernel's bits in var and
// every slot, for every value type; a row-wise rule gives its element-wise
// slots the CPU's bits and var and its per-row slot within the bound
// masked_sparse_apply_gpu.h states for the row's statistic. Frozen rows,
// rows absent from the bags and their slots are never written. The rows are
// in ascending order here (first occurrence on the CPU): distinct rows, so
// the order does not change any result.
//
// Validation before the first write: the plan refuses a bag out of
// [0, num_bags) or an id >= num_rows at the lowest bad position, as the CPU
// plan does (BagInputError), and writes nothing; the step is only made after
// a plan that refused nothing, and then cannot refuse (its rows are distinct,
// in range and permitted).
#ifndef PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_APPLY_GPU_H_
#define PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_APPLY_GPU_H_

#include <cstddef>
#include <cstdint>

#include "cc/core/embedding_bag.h"
#include "cc/core/embedding_bag_gpu.h"
#include "cc/core/gpu_common.h"
#include "cc/core/masked_sparse_apply.h"
#include "cc/core/row_rules.h"

namespace partial_embedding {

// Bytes of device scratch memory the step needs for `num_groups` rows (the
// plan's count) of a [num_rows, row_size] table of T with Index rows. Its
// first bytes are MaskedSparseApplyRuleGpuAsync's workspace, so
// WriteGpuRuleHyperparameters may put host hyperparameters there.
template <typename T, typename Index>
int EmbeddingBagApplyRuleGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                           int64_t num_groups, GpuStream stream,
                                           size_t* bytes);

// Enqueues the step on `stream` and returns without waiting. `positions`,
// `row_mask`, `num_groups` and `plan_workspace` are those of a successful
// EmbeddingBagGradGpuPlan (which must not be reused before this step has
// run); grad is [num_bags, row_size], factors [num_positions] (the forward
// pass's); `tables` full-size (var [num_rows, row_size], the rule's slots in
// its order); `hyperparameters` the rule's values on the device, in its
// order. `workspace` holds EmbeddingBagApplyRuleGpuWorkspaceBytes bytes and
// stays allocated until the step has run.
template <typename T, typename Index>
int EmbeddingBagApplyRuleGpuAsync(Rule rule, const RuleTables<T>& tables,
                                  const T* grad,
                                  const BagPositions<Index>& positions,
                                  const typename Arith<T>::Compute* factors,
                                  const bool* row_mask,
                                  const T* hyperparameters, int64_t num_groups,
                                  const void* plan_workspace,
                                  size_t plan_workspace_bytes, void* workspace,
                                  size_t workspace_bytes, GpuStream stream);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_APPLY_GPU_H_
