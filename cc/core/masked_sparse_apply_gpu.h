// CUDA implementation of the TF-free MaskedSparseApplyAdam core.
//
// The step is the CPU core's (masked_sparse_apply.h): for every distinct
// permitted row r of `indices`, g = the sum of its gradient rows, then weight
// decay, m, v, v_hat and var, every operation rounded to the storage type in
// the CPU core's order (IEEE round-to-nearest intrinsics, never contracted
// into fused multiply-adds; 16-bit types compute each operation in float and
// round). Full-size or compact (slot map) slots; frozen rows and their slots
// are never written; rows absent from `indices` are not touched. Every pointer
// is a device pointer, and so are the hyperparameters (TensorFlow keeps them
// in scalar tensors on the GPU; WriteGpuAdamHyperparameters puts host values
// there).
//
// The gradient sum. A row's occurrences, in position order, are cut into
// pieces of kGpuAdamPieceSize; each piece is summed in position order from
// zero, rounding to the storage type after each addition, and the pieces'
// sums are added in piece order the same way. A row with at most
// kGpuAdamPieceSize occurrences (one piece) therefore gets exactly the CPU
// core's sum, and its whole step is bit for bit the CPU core's; a hotter row's
// sum is grouped differently (within the usual summation bound of it). Either
// way the order is fixed: results are bit-identical from run to run.
//
// Validation before the first write: one pass checks every index against
// [0, num_rows) and every slot index (frozen rows' too) against
// [0, num_slot_rows); after the positions are grouped by row, the slot map is
// checked (each permitted row names one slot row; no two permitted rows share
// one). Every kernel that writes reads the four error words first and returns
// when one is set, so a refused step writes nothing. ReadGpuAdamInputError
// reports the same first failure, at the same positions, as the CPU core's
// plan.
//
// How it works: the validation pass makes a sort key per position (the row,
// or a sentinel for frozen rows and bad indices); a stable radix sort groups
// each row's positions in increasing order; a run-length encoding and a scan
// give each distinct row its first sorted position and its count. One warp
// per row sums its gradient rows with 16-byte loads and applies the step to
// var, m, v (and v_hat) in one pass. A row with more than kGpuAdamPieceSize
// occurrences is left to two further kernels: one warp per piece writes the
// piece's sum, then one warp per such row adds the sums and applies the step.
#ifndef PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_GPU_H_
#define PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_GPU_H_

#include <cstddef>
#include <cstdint>

#include "cc/core/gpu_common.h"
#include "cc/core/masked_sparse_apply.h"

namespace partial_embedding {

// Occurrences of a row summed by one warp in position order (see above).
constexpr int64_t kGpuAdamPieceSize = 32;

// The scalar hyperparameters of one step, each a device pointer to one value
// of the storage type, in AdamHyperparameters' order and meaning.
template <typename T>
struct AdamHyperparameterPointers {
  const T* learning_rate = nullptr;
  const T* one_minus_beta_1 = nullptr;
  const T* one_minus_beta_2 = nullptr;
  const T* epsilon = nullptr;
  const T* alpha = nullptr;
  const T* weight_decay = nullptr;
};

// Bytes of device scratch memory a step of these sizes needs. num_slot_rows:
// the slots' rows with a slot map, 0 for full-size slots. Uses the device of
// `stream` (the current one for the null stream).
template <typename T>
int MaskedSparseApplyAdamGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                           int64_t num_indices,
                                           int64_t num_slot_rows,
                                           GpuStream stream, size_t* bytes);

// Copies host hyperparameters into a place of their own in `workspace` (the
// first bytes, which MaskedSparseApplyAdamGpuAsync never writes) and points
// *pointers at them. Call before the step, on the same stream.
template <typename T>
int WriteGpuAdamHyperparameters(const AdamHyperparameters<T>& hyper,
                                void* workspace, GpuStream stream,
                                AdamHyperparameterPointers<T>* pointers);

// Enqueues the whole step on `stream` and returns without waiting; whether
// the inputs were refused is left in the workspace (ReadGpuAdamInputError).
// `workspace` must hold MaskedSparseApplyAdamGpuWorkspaceBytes bytes (for
// slot_map.num_slot_rows with a slot map, 0 without) and stay allocated until
// the work has run. `gradient` is [num_indices, row_size]. Pass `{}` as
// slot_map for full-size slots.
template <typename T, typename Index>
int MaskedSparseApplyAdamGpuAsync(const AdamTables<T>& tables,
                                  const Index* indices, int64_t num_indices,
                                  const SlotMap<Index>& slot_map,
                                  const T* gradient, const bool* row_mask,
                                  const AdamHyperparameterPointers<T>& hyper,
                                  void* workspace, size_t workspace_bytes,
                                  GpuStream stream);

// Waits for `stream`, then sets *error to the first failing check of the last
// step that used `workspace` (kind, position and earlier position as the CPU
// core's plan reports them) and *values to the index values at those
// positions, read from the device arrays `indices` and `slot_indices` (null
// without a slot map).
template <typename Index>
int ReadGpuAdamInputError(const void* workspace, const Index* indices,
                          const Index* slot_indices, GpuStream stream,
                          AdamInputError* error, AdamErrorValues* values);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_GPU_H_
