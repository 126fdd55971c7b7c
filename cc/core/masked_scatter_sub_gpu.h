// CUDA implementation of the TF-free MaskedScatterSub core.
//
// Same semantics as the CPU core (masked_scatter_sub.h): for every position i,
// if row_mask[indices[i]] then var[indices[i], :] -= updates[i, :]; frozen rows
// are never written; duplicates accumulate (Float16/BFloat16 sum duplicates in
// float32 and round once). Every pointer is a device pointer.
//
// This header includes no CUDA header, so host code compiled by a plain C++
// compiler (the TensorFlow kernel, the pybind11 module) can call the core.
// Errors are cudaError_t values returned as int (0 is success). Which CUDA
// runtime the core calls is the linking library's choice (CMakeLists.txt): the
// one TensorFlow loads (libtensorflow_framework.so.2 exports its API) in the
// default CUDA 12 build of the op library, libcudart.so.12 in the kernel
// module, or a static runtime kept private in the nvcc build. The core uses
// nothing newer than the CUDA 12.5 runtime API.
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

#include "cc/core/row_update_common.h"

// The same type as CUDA's cudaStream_t / CUstream.
struct CUstream_st;

namespace partial_embedding {

using GpuStream = CUstream_st*;

// The largest num_indices the GPU core accepts (positions are 32-bit there).
constexpr int64_t kMaxGpuIndices = (int64_t{1} << 31) - 1;

// Bytes of device scratch memory that MaskedScatterSubGpu(Async) needs for
// these sizes. Returns a cudaError_t value (0 on success). Uses the current
// device (or the device of `stream`, when it is not null).
template <typename T>
int MaskedScatterSubGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                      int64_t num_indices, bool deterministic,
                                      GpuStream stream, size_t* bytes);

// Enqueues the whole update on `stream` and returns without waiting. Whether
// an index was bad is left in the workspace: read it with ReadGpuBadIndex.
// `workspace` must hold at least MaskedScatterSubGpuWorkspaceBytes bytes and
// stay allocated until the work has run. var: [num_rows, row_size] row-major;
// updates: [num_indices, row_size]; row_mask: [num_rows].
template <typename T, typename Index>
int MaskedScatterSubGpuAsync(T* var, int64_t num_rows, int64_t row_size,
                             const Index* indices, int64_t num_indices,
                             const T* updates, const bool* row_mask,
                             bool deterministic, void* workspace,
                             size_t workspace_bytes, GpuStream stream);

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

// Enqueues a device-to-device copy of `bytes` bytes on `stream`.
int GpuCopyDeviceToDevice(void* dst, const void* src, int64_t bytes,
                          GpuStream stream);

// The CUDA runtime's name and description of an error code.
const char* GpuErrorString(int error);

// Makes the device that owns `stream` current on this thread (TensorFlow may
// call a kernel from a thread whose current device is another one); the
// default streams leave it as it is. For the other GPU cores.
int SelectGpuStreamDevice(GpuStream stream);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_GPU_H_
