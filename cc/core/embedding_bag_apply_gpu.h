// CUDA implementation of the fused bag backward + rule step
// (MaskedEmbeddingBagApplyRule's TF-free core on the GPU): the bags' gradient
// goes straight into the permitted rows of the table and their slots, with
// any rule of the table (row_rules.h), with full-size or compact (slot map)
// slots. Every pointer is a device pointer, the hyperparameters' too (see
// WriteGpuRuleHyperparameters).
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
// plan does (BagInputError), and writes nothing; with compact slots so does
// the slot plan (below) for the map; the step is only made after plans that
// refused nothing, and then cannot refuse (its rows are distinct, in range
// and permitted, their slot rows distinct and in range).
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

// Compact slots kept as a map (MaskedOptimizer's float32 `slot_of_row` [V],
// -1 where a row has none yet, and the count of slot rows taken): between
// the plan and the step, EmbeddingBagSlotRowsGpuPlan gives every group its
// slot row as PlanSlotRowsFromMap does on the CPU (masked_sparse_apply.h):
// the map's, or for a row without one the next free one, numbered in order
// of first occurrence (each group's first position, flagged and scanned over
// the positions), with the CPU's checks in its order and the same report
// (SlotMapPlan; new_groups stays empty). It writes nothing but its
// workspace; EmbeddingBagWriteSlotMapGpu then writes the new map entries and
// the count, once the caller has made room (the slots grown to
// rows_used_after rows, GrowSlotGpu).

// Bytes of the slot plan's workspace: `num_slot_rows` the slots' rows now,
// `rows_used` the map's count (read on the host).
template <typename Index>
int EmbeddingBagSlotRowsGpuWorkspaceBytes(int64_t num_positions,
                                          int64_t num_groups,
                                          int64_t num_slot_rows,
                                          int64_t rows_used, GpuStream stream,
                                          size_t* bytes);

// Plans the slot rows of a successful EmbeddingBagGradGpuPlan's groups and
// waits for `stream`; *plan says whether the map refused the step.
template <typename Index>
int EmbeddingBagSlotRowsGpuPlan(const BagPositions<Index>& positions,
                                const float* slot_of_row, int64_t rows_used,
                                int64_t num_slot_rows, int64_t max_slot_rows,
                                int64_t num_groups, const void* plan_workspace,
                                size_t plan_workspace_bytes, void* workspace,
                                size_t workspace_bytes, GpuStream stream,
                                SlotMapPlan* plan);

// Writes slot_of_row[row] for the rows that took a new slot row and
// *rows_used = rows_used_after (device pointers), after a slot plan that
// refused nothing; enqueued on `stream`.
template <typename Index>
int EmbeddingBagWriteSlotMapGpu(int64_t num_positions, int64_t num_groups,
                                int64_t rows_used_after, const void* workspace,
                                size_t workspace_bytes, float* slot_of_row,
                                int64_t* rows_used, GpuStream stream);

// Fills grown[0, old_count) from old (device arrays; old may be null when
// old_count is 0) and grown[old_count, new_count) with `initial`: a slot
// grown to more rows, its new rows at the slot's initial value. Enqueued.
template <typename T>
int GrowSlotGpu(const T* old, int64_t old_count, T* grown, int64_t new_count,
                T initial, GpuStream stream);

// Bytes of device scratch memory the step needs for `num_groups` rows (the
// plan's count) of a [num_rows, row_size] table of T with Index rows, and
// `num_slot_rows` slot rows with a slot map (0 for full-size slots). Its
// first bytes are MaskedSparseApplyRuleGpuAsync's workspace, so
// WriteGpuRuleHyperparameters may put host hyperparameters there.
template <typename T, typename Index>
int EmbeddingBagApplyRuleGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                           int64_t num_groups,
                                           int64_t num_slot_rows,
                                           GpuStream stream, size_t* bytes);

// Where the step finds each group's slot row: the workspace of a slot plan
// that refused nothing, and the slots' rows (after growing). Default: full-
// size slots.
struct BagSlotRows {
  const void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int64_t num_slot_rows = 0;
};

// Enqueues the step on `stream` and returns without waiting. `positions`,
// `row_mask`, `num_groups` and `plan_workspace` are those of a successful
// EmbeddingBagGradGpuPlan (which must not be reused before this step has
// run); grad is [num_bags, row_size], factors [num_positions] (the forward
// pass's); `tables` var [num_rows, row_size] and the rule's slots in its
// order, full-size, or with `slot_rows` (a slot plan's, whose workspace
// too stays allocated until the step has run) slot_rows.num_slot_rows rows;
// `hyperparameters` the rule's values on the device, in its order.
// `workspace` holds EmbeddingBagApplyRuleGpuWorkspaceBytes bytes and stays
// allocated until the step has run.
template <typename T, typename Index>
int EmbeddingBagApplyRuleGpuAsync(
    Rule rule, const RuleTables<T>& tables, const T* grad,
    const BagPositions<Index>& positions,
    const typename Arith<T>::Compute* factors, const bool* row_mask,
    const T* hyperparameters, int64_t num_groups, const void* plan_workspace,
    size_t plan_workspace_bytes, void* workspace, size_t workspace_bytes,
    GpuStream stream, const BagSlotRows& slot_rows = {});

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_APPLY_GPU_H_
