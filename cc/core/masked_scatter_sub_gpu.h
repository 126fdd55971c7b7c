// CUDA implementation of the TF-free MaskedScatterSub core.
//
// Same semantics as the CPU core (masked_scatter_sub.h): for every position i,
// if row_mask[indices[i]] then var[indices[i], :] -= updates[i, :]; frozen rows
// are never written; duplicates accumulate (Float16/BFloat16 sum duplicates in
// float32 and round once). Every pointer is a device pointer.
//
// This header includes no CUDA header (see gpu_common.h for the stream type,
// the error codes and which CUDA runtime the core calls).
//
// How it works: a first pass validates every index (recording the smallest bad
// position with atomicMin on the device) and builds a sort key per position
// (the row, or a sentinel past the last row for frozen rows). A radix sort over
// only the key bits in use groups duplicates; the sort is stable, so each row's
// updates stay in position order. The sorted positions are cut into chunks of
// at most 32; one warp per chunk reads each update row once with 16-byte loads
// and sums runs of equal rows in registers. A row whose run lies inside one
// chunk is written once, without atomics. A run that crosses chunk boundaries
// (a heavily duplicated row) leaves one partial sum per chunk, which a second
// kernel adds in a fixed order with a whole block per row. In fast mode,
// float32/float64 partials are instead added to the row with atomics (at most
// two per chunk, so a hot row is never serialised on per-update atomics).
// Deterministic mode never uses float atomics: results are bit-identical from
// run to run for the same inputs. If any index is bad, every kernel after the
// validation pass returns early and nothing is written.
#ifndef PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_GPU_H_
#define PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_GPU_H_

#include <cstddef>
#include <cstdint>

#include "cc/core/gpu_common.h"
#include "cc/core/row_update_common.h"

namespace partial_embedding {

// Bytes of device scratch memory that MaskedScatterSubGpu(Async) needs for
// these sizes. Returns a cudaError_t value (0 on success). Uses the current
// device (or the device of `stream`, when it is not null).
template <typename T>
int MaskedScatterSubGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                      int64_t num_indices, bool deterministic,
                                      GpuStream stream, size_t* bytes);

// Enqueues the whole update on `stream` and returns without waiting. Whether
// an index was bad is left in the workspace: read it with ReadGpuBadIndex.
// With BadIndices::kSkip a bad index is skipped instead (nothing is reported
// and the valid positions are written), so no wait is needed.
// `workspace` must hold at least MaskedScatterSubGpuWorkspaceBytes bytes and
// stay allocated until the work has run. var: [num_rows, row_size] row-major;
// updates: [num_indices, row_size]; row_mask: [num_rows].
template <typename T, typename Index>
int MaskedScatterSubGpuAsync(T* var, int64_t num_rows, int64_t row_size,
                             const Index* indices, int64_t num_indices,
                             const T* updates, const bool* row_mask,
                             bool deterministic, void* workspace,
                             size_t workspace_bytes, GpuStream stream,
                             BadIndices bad_indices = BadIndices::kRefuse);

// Waits for `stream`, then sets *bad_position to the first position whose
// index was out of range in the last MaskedScatterSubGpuAsync call that used
// `workspace`, and *bad_value to that index; or *bad_position to -1.
template <typename Index>
int ReadGpuBadIndex(const void* workspace, const Index* indices,
                    GpuStream stream, int64_t* bad_position,
                    int64_t* bad_value);

// MaskedScatterSubGpuAsync followed by ReadGpuBadIndex.
template <typename T, typename Index>
int MaskedScatterSubGpu(T* var, int64_t num_rows, int64_t row_size,
                        const Index* indices, int64_t num_indices,
                        const T* updates, const bool* row_mask,
                        bool deterministic, void* workspace,
                        size_t workspace_bytes, GpuStream stream,
                        int64_t* bad_position, int64_t* bad_value);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_GPU_H_
