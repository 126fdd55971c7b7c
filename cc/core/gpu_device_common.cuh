// Device code the CUDA cores share, included by their .cu files only: row
// loads and stores of 16 bytes, the first pass that validates every index and
// makes one sort key per position, and the radix sort that groups positions
// by row (stable, so each row's positions stay in increasing order).
//
// Kernels live in an anonymous namespace: every .cu file that includes this
// header gets its own copies, registered with its own fat binary.
#ifndef PARTIAL_EMBEDDING_CC_CORE_GPU_DEVICE_COMMON_CUH_
#define PARTIAL_EMBEDDING_CC_CORE_GPU_DEVICE_COMMON_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <initializer_list>

#include "cc/core/gpu_common.h"
#include "cc/core/gpu_launch.h"
#include "cc/core/row_update_common.h"

namespace partial_embedding {
namespace gpu {

constexpr unsigned kFullWarp = 0xffffffffu;
// The value of an error word no check has set (atomicMin only lowers it).
constexpr unsigned long long kNoBadPosition = ~0ull;
constexpr int kWarpSize = 32;
constexpr int kValidateThreads = 256;
constexpr int64_t kMaxValidateBlocks = 8192;
constexpr size_t kWorkspaceAlignment = 256;

inline size_t AlignUp(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment *
         kWorkspaceAlignment;
}

// What every core checks first: no size is negative and the positions fit
// 32 bits; then it runs on the device that owns `stream`.
inline cudaError_t CheckSizesOnStreamDevice(
    std::initializer_list<int64_t> sizes, int64_t num_indices,
    GpuStream stream) {
  for (const int64_t size : sizes) {
    if (size < 0) return cudaErrorInvalidValue;
  }
  if (num_indices > kMaxGpuIndices) return cudaErrorInvalidValue;
  return static_cast<cudaError_t>(SelectStreamDevice(stream));
}

// Blocks of `per_block` threads (or warps) for `items` threads (or warps),
// at least one and at most `max_blocks` (grid-stride loops do the rest).
inline unsigned BlocksFor(int64_t items, int per_block, int64_t max_blocks) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, max_blocks));
}

// Starts a call's header: `error_bytes` of error words at "none" (all ones;
// the checks only lower them with atomicMin), then `counter_bytes` of
// counters at zero.
inline cudaError_t ResetErrorWordsAndCounters(char* workspace,
                                              size_t error_bytes,
                                              size_t counter_bytes,
                                              cudaStream_t stream) {
  cudaError_t error = cudaMemsetAsync(workspace, 0xff, error_bytes, stream);
  if (error == cudaSuccess && counter_bytes > 0) {
    error = cudaMemsetAsync(workspace + error_bytes, 0, counter_bytes, stream);
  }
  return error;
}

// The protocol every core's entry points share. `prepare(&layout)` checks
// the sizes, selects the stream's device and lays the workspace out (its
// `total` bytes): WorkspaceBytesOf reports that size; StartCall refuses a
// missing or smaller workspace, then sets the call's error words to "none"
// and its counters to zero.
template <typename Layout, typename Prepare>
cudaError_t WorkspaceBytesOf(Prepare&& prepare, size_t* bytes) {
  Layout layout;
  const cudaError_t error = prepare(&layout);
  *bytes = layout.total;
  return error;
}

template <typename Layout, typename Prepare>
cudaError_t StartCall(void* workspace, size_t workspace_bytes,
                      size_t error_bytes, size_t counter_bytes,
                      cudaStream_t stream, Prepare&& prepare, Layout* layout) {
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const cudaError_t error = prepare(layout);
  if (error != cudaSuccess) return error;
  if (workspace_bytes < layout->total) return cudaErrorInvalidValue;
  return ResetErrorWordsAndCounters(static_cast<char*>(workspace), error_bytes,
                                    counter_bytes, stream);
}

// VEC elements per lane: 16 bytes when the rows allow it, else one element.
template <typename T, int VEC>
constexpr bool kWide = VEC * sizeof(T) == 16;

// Elements of T in 16 bytes.
template <typename T>
constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// Whether rows of `row_size` elements of T at these addresses can be moved
// in 16-byte pieces.
template <typename T>
inline bool RowsAre16ByteAligned(int64_t row_size,
                                 std::initializer_list<const void*> tables) {
  if ((static_cast<size_t>(row_size) * sizeof(T)) % 16 != 0) return false;
  for (const void* table : tables) {
    if (reinterpret_cast<uintptr_t>(table) % 16 != 0) return false;
  }
  return true;
}

// A 16-byte global load with the evict-first ("streaming") cache hint. Written
// as the PTX instruction that nvcc's __ldcs emits, because clang's CUDA headers
// have no __ldcs overload for uint4. The SIMT emulator (cc/simt/), which
// compiles this file as host C++, has no PTX: there it is a plain 16-byte load.
__device__ __forceinline__ uint4 LoadStreaming(const uint4* address) {
#if defined(PE_SIMT)
  return ::pe_simt::LoadStreaming(address);
#else
  uint4 value;
  asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)
      : "l"(address));
  return value;
#endif
}

// VEC elements from `src`, for rows read once (gradients, updates): streamed
// past the caches when they make 16 bytes.
template <typename T, int VEC>
__device__ __forceinline__ void LoadOnce(const T* src, T (&out)[VEC]) {
  if constexpr (kWide<T, VEC>) {
    const uint4 raw = LoadStreaming(reinterpret_cast<const uint4*>(src));
    memcpy(out, &raw, sizeof(raw));
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = src[i];
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void LoadVector(const T* src, T (&out)[VEC]) {
  if constexpr (kWide<T, VEC>) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    memcpy(out, &raw, sizeof(raw));
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = src[i];
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void StoreVector(T* dst, const T (&value)[VEC]) {
  if constexpr (kWide<T, VEC>) {
    uint4 raw;
    memcpy(&raw, value, sizeof(raw));
    *reinterpret_cast<uint4*>(dst) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) dst[i] = value[i];
  }
}

// How positions are sorted by row: 32-bit keys while the rows (and the
// sentinel, num_rows itself) fit, and only the key bits in use.
struct SortKeyBits {
  bool wide = false;  // 64-bit keys.
  int end_bit = 1;
};

// run(KeyT{}) with the sort key type `bits` chose.
template <typename Run>
cudaError_t WithSortKey(const SortKeyBits& bits, Run&& run) {
  return bits.wide ? run(uint64_t{0}) : run(uint32_t{0});
}

inline SortKeyBits SortKeyBitsFor(int64_t num_rows) {
  SortKeyBits bits;
  bits.wide = num_rows > int64_t{0xffffffff};
  while (bits.end_bit < 64 &&
         (static_cast<uint64_t>(num_rows) >> bits.end_bit) != 0) {
    ++bits.end_bit;
  }
  return bits;
}

template <typename KeyT>
cudaError_t SortScratchBytes(int64_t num_indices, int end_bit,
                             cudaStream_t stream, size_t* bytes) {
  cub::DoubleBuffer<KeyT> keys(nullptr, nullptr);
  cub::DoubleBuffer<uint32_t> positions(nullptr, nullptr);
  return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, keys, positions,
                                         static_cast<int>(num_indices), 0,
                                         end_bit, stream);
}

inline cudaError_t SortScratchBytes(int64_t num_indices, SortKeyBits bits,
                                    cudaStream_t stream, size_t* bytes) {
  return bits.wide ? SortScratchBytes<uint64_t>(num_indices, bits.end_bit,
                                                stream, bytes)
                   : SortScratchBytes<uint32_t>(num_indices, bits.end_bit,
                                                stream, bytes);
}

// Sorts (key, position) pairs by key, stably; *keys and *positions point at
// the buffers holding the result on return (either of each pair).
template <typename KeyT>
cudaError_t SortPositionsByKey(void* scratch, size_t scratch_bytes,
                               KeyT* (&keys)[2], uint32_t* (&positions)[2],
                               int64_t num_indices, int end_bit,
                               cudaStream_t stream, const KeyT** sorted_keys,
                               const uint32_t** sorted_positions) {
  cub::DoubleBuffer<KeyT> key_buffers(keys[0], keys[1]);
  cub::DoubleBuffer<uint32_t> position_buffers(positions[0], positions[1]);
  const cudaError_t error = cub::DeviceRadixSort::SortPairs(
      scratch, scratch_bytes, key_buffers, position_buffers,
      static_cast<int>(num_indices), 0, end_bit, stream);
  *sorted_keys = key_buffers.Current();
  *sorted_positions = position_buffers.Current();
  return error;
}

// Where the sort's buffers live in a core's workspace: two key and two
// position buffers (the sort's double buffers) and the sort's own scratch.
struct SortedPositionsLayout {
  SortKeyBits bits;
  size_t keys[2] = {0, 0};
  size_t positions[2] = {0, 0};
  size_t scratch = 0;
  size_t scratch_bytes = 0;
};

// Lays the sort's buffers out from *offset on (advancing it).
inline cudaError_t LayOutSortedPositions(int64_t num_rows, int64_t num_indices,
                                         cudaStream_t stream, size_t* offset,
                                         SortedPositionsLayout* layout) {
  layout->bits = SortKeyBitsFor(num_rows);
  const cudaError_t error = SortScratchBytes(num_indices, layout->bits, stream,
                                             &layout->scratch_bytes);
  if (error != cudaSuccess) return error;
  const size_t n = static_cast<size_t>(num_indices);
  const size_t key_bytes = layout->bits.wide ? 8 : 4;
  for (int i = 0; i < 2; ++i) {
    layout->keys[i] = *offset;
    *offset += AlignUp(n * key_bytes);
  }
  for (int i = 0; i < 2; ++i) {
    layout->positions[i] = *offset;
    *offset += AlignUp(n * sizeof(uint32_t));
  }
  layout->scratch = *offset;
  *offset += AlignUp(layout->scratch_bytes);
  return cudaSuccess;
}

namespace {

// The first pass: validates every index and builds one sort key per position:
// the row, or `sentinel` (num_rows) for frozen rows and bad indices, which
// sorts last. The smallest position of a bad index goes to *bad_position.
// With slot indices (not null), each is checked against [0, num_slot_rows)
// too, frozen rows' included, the smallest bad position going to
// *bad_slot_position. With BadIndices::kSkip (XLA, which has no run-time
// errors), a position whose index is outside [0, num_rows), or whose slot
// index is negative, is keyed like a frozen row and reported nowhere; a slot
// index past the slot rows is still reported.
template <typename Index, typename KeyT>
__global__ void __launch_bounds__(kValidateThreads)
    ValidateKernel(const Index* __restrict__ indices, int64_t num_indices,
                   int64_t num_rows, const bool* __restrict__ row_mask,
                   KeyT sentinel, KeyT* __restrict__ keys,
                   uint32_t* __restrict__ positions,
                   unsigned long long* __restrict__ bad_position,
                   const Index* __restrict__ slot_indices,
                   int64_t num_slot_rows,
                   unsigned long long* __restrict__ bad_slot_position,
                   bool skip_bad) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       i < num_indices; i += stride) {
    keys[i] = sentinel;
    positions[i] = static_cast<uint32_t>(i);
    const int64_t slot_row =
        slot_indices != nullptr ? static_cast<int64_t>(slot_indices[i]) : 0;
    if (skip_bad && slot_row < 0) continue;
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row < 0 || row >= num_rows) {
      if (!skip_bad) {
        atomicMin(bad_position, static_cast<unsigned long long>(i));
      }
    } else if (row_mask[row]) {
      keys[i] = static_cast<KeyT>(row);
    }
    if (slot_indices != nullptr &&
        (slot_row < 0 || slot_row >= num_slot_rows)) {
      atomicMin(bad_slot_position, static_cast<unsigned long long>(i));
    }
  }
}

template <typename Index, typename KeyT>
cudaError_t LaunchValidate(const Index* indices, int64_t num_indices,
                           int64_t num_rows, const bool* row_mask, KeyT* keys,
                           uint32_t* positions,
                           unsigned long long* bad_position,
                           const Index* slot_indices, int64_t num_slot_rows,
                           unsigned long long* bad_slot_position, bool skip_bad,
                           cudaStream_t stream) {
  const int64_t blocks =
      std::min<int64_t>((num_indices + kValidateThreads - 1) / kValidateThreads,
                        kMaxValidateBlocks);
  PE_LAUNCH(static_cast<unsigned>(blocks), kValidateThreads, 0, stream,
            ValidateKernel<Index, KeyT>)(
      indices, num_indices, num_rows, row_mask, static_cast<KeyT>(num_rows),
      keys, positions, bad_position, slot_indices, num_slot_rows,
      bad_slot_position, skip_bad);
  return cudaGetLastError();
}

// The validation pass, then (unless `validate_only`) the sort: on return
// *sorted_keys and *sorted_positions hold the positions grouped by row (rows
// ascending, frozen rows and bad indices last under the sentinel), each row's
// positions in increasing order.
template <typename Index, typename KeyT>
cudaError_t ValidateAndSortPositions(
    const SortedPositionsLayout& layout, char* workspace, const Index* indices,
    int64_t num_indices, int64_t num_rows, const bool* row_mask,
    unsigned long long* bad_position, const Index* slot_indices,
    int64_t num_slot_rows, unsigned long long* bad_slot_position, bool skip_bad,
    bool validate_only, cudaStream_t stream, const KeyT** sorted_keys,
    const uint32_t** sorted_positions) {
  KeyT* keys[2] = {reinterpret_cast<KeyT*>(workspace + layout.keys[0]),
                   reinterpret_cast<KeyT*>(workspace + layout.keys[1])};
  uint32_t* positions[2] = {
      reinterpret_cast<uint32_t*>(workspace + layout.positions[0]),
      reinterpret_cast<uint32_t*>(workspace + layout.positions[1])};
  *sorted_keys = keys[0];
  *sorted_positions = positions[0];
  cudaError_t error = LaunchValidate<Index, KeyT>(
      indices, num_indices, num_rows, row_mask, keys[0], positions[0],
      bad_position, slot_indices, num_slot_rows, bad_slot_position, skip_bad,
      stream);
  if (error != cudaSuccess || validate_only) return error;
  return SortPositionsByKey<KeyT>(
      workspace + layout.scratch, layout.scratch_bytes, keys, positions,
      num_indices, layout.bits.end_bit, stream, sorted_keys, sorted_positions);
}

}  // namespace
}  // namespace gpu
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_GPU_DEVICE_COMMON_CUH_
