// CUDA implementation of the TF-free MaskedEmbeddingBagGrad core: the same
// rows and values as the CPU core (embedding_bag.h), with rows in ascending
// order instead of first occurrence. Every pointer is a device pointer.
//
// Like masked_scatter_sub_gpu.h this header includes no CUDA header, so host
// code compiled by a plain C++ compiler (the TensorFlow kernel, the pybind11
// module) can call it; errors are cudaError_t values returned as int.
//
// How it works, in two calls because the number of rows is only known after
// the first: EmbeddingBagGradGpuPlan validates every position (recording the
// smallest bad position with atomicMin), keys each position by its row (a
// sentinel past the last row for pruned, frozen and bad positions), sorts
// (key, position) pairs with a stable radix sort over the key bits in use,
// flags the first position of each run of equal rows and scans the flags:
// the scan's total is the number of rows, which it copies to the host with
// the bad position (one synchronisation). EmbeddingBagGradGpuValues then
// gives each run a warp, which adds factor * grad[bag] over the run's
// positions in position order (the sort is stable) in float (double for
// double) and writes the row once: no atomics, the same bits on every run.
#ifndef PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_GPU_H_
#define PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_GPU_H_

#include <cstddef>
#include <cstdint>

#include "cc/core/embedding_bag.h"
#include "cc/core/gpu_common.h"

namespace partial_embedding {

// Bytes of device scratch memory the two calls need for these sizes, which
// must stay allocated from the first call until the second has run.
int EmbeddingBagGradGpuWorkspaceBytes(int64_t num_rows, int64_t num_positions,
                                      GpuStream stream, size_t* bytes);

// The first call: checks every position and groups the permitted ones by
// row; waits for `stream`. Sets *num_groups to the number of distinct
// permitted rows, or fills *error (then the second call must not be made).
// positions.ids and positions.bags and row_mask are device pointers.
template <typename Index>
int EmbeddingBagGradGpuPlan(const BagPositions<Index>& positions,
                            const bool* row_mask, void* workspace,
                            size_t workspace_bytes, GpuStream stream,
                            int64_t* num_groups, BagInputError* error);

// The second call: rows[g] and values[g] ([num_groups, row_size]) of the
// groups the plan in `workspace` found; enqueued on `stream` without waiting.
template <typename T, typename Index>
int EmbeddingBagGradGpuValues(const T* grad, int64_t row_size,
                              const BagPositions<Index>& positions,
                              const typename Arith<T>::Compute* factors,
                              int64_t num_groups, const void* workspace,
                              size_t workspace_bytes, Index* rows, T* values,
                              GpuStream stream);

// Each group's row and first (smallest) position, from the workspace of a
// successful plan (groups in the values call's order): rows[g] and
// first_positions[g] for g < num_groups; enqueued on `stream`. What the
// fused step's compact slots number new slot rows by: the CPU gives them in
// order of first occurrence.
template <typename Index>
int EmbeddingBagGradGpuGroupHeads(const BagPositions<Index>& positions,
                                  int64_t num_groups, const void* workspace,
                                  size_t workspace_bytes, Index* rows,
                                  uint32_t* first_positions, GpuStream stream);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_GPU_H_
