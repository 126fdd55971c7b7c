// CUDA implementation of the TF-free MaskedSparseApplyRule core: any rule of
// the table (row_rules.h) on the permitted rows of a raw sparse gradient.
//
// The step is the CPU core's (masked_sparse_apply.h): for every distinct
// permitted row r of `indices`, g = the sum of its gradient rows, then
// RowStatistic (row-wise rules) and ElementStep on each element, the same
// functions the CPU skeleton calls, with IEEE round-to-nearest intrinsics as
// their operations (never contracted into fused multiply-adds; 16-bit types
// compute each operation in float and round). Full-size or compact (slot
// map) slots; a per-row slot has one value a slot row. Frozen rows and their
// slots are never written; rows absent from `indices` are not touched. Every
// pointer is a device pointer, and so are the hyperparameters (TensorFlow
// keeps them in a tensor on the GPU; WriteGpuRuleHyperparameters puts host
// values in the workspace).
//
// The gradient sum. A row's occurrences, in position order, are cut into
// pieces of kGpuRulePieceSize; each piece is summed in position order from
// zero, rounding to the storage type after each addition, and the pieces'
// sums are added in piece order the same way. A row with at most
// kGpuRulePieceSize occurrences (one piece) therefore gets exactly the CPU
// core's sum, and with an element-wise rule its whole step is bit for bit the
// CPU core's; a hotter row's sum is grouped differently (within the usual
// summation bound of it). Either way the order is fixed: results are
// bit-identical from run to run.
//
// The row-wise rules' statistic. The mean of g * g over a row sums the same
// terms Rounded<T>(g_j * g_j) as the CPU in the compute type C, but each lane
// sums its own columns and the warp adds the lanes' sums in a tree, where the
// CPU adds them in RowMeanSquare's order (row_rules.h). Any two sums of the
// n = row_size non-negative terms are within (n - 1) u of their exact value
// (u: C's unit roundoff, 2^-24 for float and the 16-bit types, 2^-53 for
// double), so they differ by at most 2 (n - 1) u relative; the mean rounded
// to T may then differ by that and one unit in the last place of T, and what
// is computed from it by a few more roundings to T. Only what reads the
// statistic can differ from the CPU (the per-row slot and var); the
// element-wise slots (row-wise Adam's momentum) keep the CPU's bits.
//
// Validation before the first write: one pass checks every index against
// [0, num_rows) and every slot index (frozen rows' too) against
// [0, num_slot_rows); after the positions are grouped by row, the slot map is
// checked (each permitted row names one slot row; no two permitted rows share
// one). Every kernel that writes reads the four error words first and returns
// when one is set, so a refused step writes nothing. ReadGpuRuleInputError
// reports the same first failure, at the same positions, as the CPU core's
// plan.
//
// How it works: the validation pass makes a sort key per position (the row,
// or a sentinel for frozen rows and bad indices); a stable radix sort groups
// each row's positions in increasing order; a run-length encoding and a scan
// give each distinct row its first sorted position and its count. One warp
// per row sums its gradient rows with 16-byte loads and applies the rule to
// var and the slots in one pass (two over the gradient for a row-wise rule
// whose row is wider than one pass of the warp). A row with more than
// kGpuRulePieceSize occurrences is left to two further launches: one warp per
// piece writes the piece's sum, then one warp per such row adds the sums and
// applies the rule.
#ifndef PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_GPU_H_
#define PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_GPU_H_

#include <cstddef>
#include <cstdint>

#include "cc/core/gpu_common.h"
#include "cc/core/masked_sparse_apply.h"
#include "cc/core/row_rules.h"

namespace partial_embedding {

// Occurrences of a row summed by one warp in position order (see above).
constexpr int64_t kGpuRulePieceSize = 32;

// Bytes of device scratch memory a step of these sizes needs (any rule).
// num_slot_rows: the slots' rows with a slot map, 0 for full-size slots. Uses
// the device of `stream` (the current one for the null stream).
template <typename T>
int MaskedSparseApplyRuleGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                           int64_t num_indices,
                                           int64_t num_slot_rows,
                                           GpuStream stream, size_t* bytes);

// Copies host hyperparameters into a place of their own in `workspace` (its
// first bytes, which MaskedSparseApplyRuleGpuAsync never writes) and sets
// *device to them. Call before the step, on the same stream.
template <typename T>
int WriteGpuRuleHyperparameters(const RuleHyperparameters<T>& hyper,
                                void* workspace, GpuStream stream,
                                const T** device);

// Enqueues the whole step of `rule` on `stream` and returns without waiting;
// whether the inputs were refused is left in the workspace
// (ReadGpuRuleInputError). `tables.slots` in the rule's slot order;
// `hyperparameters` points at the rule's num_hyperparameters values on the
// device, in its order (only those are read). `workspace` must hold
// MaskedSparseApplyRuleGpuWorkspaceBytes bytes (for slot_map.num_slot_rows
// with a slot map, 0 without) and stay allocated until the work has run.
// `gradient` is [num_indices, row_size]. Pass `{}` as slot_map for full-size
// slots. With BadIndices::kSkip (XLA's custom calls) a position whose index is
// outside [0, num_rows), or whose slot index is negative, is skipped instead
// of refusing the step; the other checks still refuse it.
template <typename T, typename Index>
int MaskedSparseApplyRuleGpuAsync(Rule rule, const RuleTables<T>& tables,
                                  const Index* indices, int64_t num_indices,
                                  const SlotMap<Index>& slot_map,
                                  const T* gradient, const bool* row_mask,
                                  const T* hyperparameters, void* workspace,
                                  size_t workspace_bytes, GpuStream stream,
                                  BadIndices bad_indices = BadIndices::kRefuse);

// Waits for `stream`, then sets *error to the first failing check of the last
// step that used `workspace` (kind, position and earlier position as the CPU
// core's plan reports them) and *values to the index values at those
// positions, read from the device arrays `indices` and `slot_indices` (null
// without a slot map).
template <typename Index>
int ReadGpuRuleInputError(const void* workspace, const Index* indices,
                          const Index* slot_indices, GpuStream stream,
                          RuleInputError* error, RuleErrorValues* values);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_GPU_H_
