// CUDA implementation of the TF-free MaskedScatterSub core. The algorithm is
// described in masked_scatter_sub_gpu.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cc/core/gpu_device_common.cuh"
#include "cc/core/gpu_launch.h"
#include "cc/core/masked_scatter_sub_gpu.h"

namespace partial_embedding {
namespace {

using gpu::kFullWarp;
using gpu::kNoBadPosition;
using gpu::kWarpSize;
using gpu::kWide;
constexpr int kApplyThreads = 256;
constexpr int kFinalizeThreads = 256;
constexpr int kFinalizeWarps = kFinalizeThreads / kWarpSize;
constexpr int64_t kMaxFinalizeBlocks = 2048;
// Update rows loaded ahead of their use in one warp, so several 16-byte loads
// per lane are in flight at once.
constexpr int kLoadsInFlight = 4;

template <typename T>
constexpr bool kHasFloatAtomics =
    std::is_same<T, float>::value || std::is_same<T, double>::value;

template <typename T, int VEC>
__device__ __forceinline__ void SubtractFromRow(
    T* dst, const typename Arith<T>::Compute (&amount)[VEC]) {
  using A = Arith<T>;
  T value[VEC];
  gpu::LoadVector<T, VEC>(dst, value);
#pragma unroll
  for (int i = 0; i < VEC; ++i)
    value[i] = A::Store(A::Load(value[i]) - amount[i]);
  gpu::StoreVector<T, VEC>(dst, value);
}

// Applies one run of equal rows that one warp summed inside its chunk.
template <typename T, typename KeyT, int VEC, bool kAtomicCrossing>
__device__ __forceinline__ void FlushPiece(
    T* var, int64_t row_size, int64_t col, bool active, KeyT row,
    bool first_in_chunk, bool last_in_chunk, KeyT row_before, KeyT row_after,
    const typename Arith<T>::Compute (&sum)[VEC],
    typename Arith<T>::Compute* partials, int64_t chunk_id) {
  using Acc = typename Arith<T>::Compute;
  const bool crossing = (first_in_chunk && row == row_before) ||
                        (last_in_chunk && row == row_after);
  if (!active) return;
  T* dst = var + static_cast<int64_t>(row) * row_size + col;
  if (!crossing) {
    // This warp owns every update of the row: write it once.
    SubtractFromRow<T, VEC>(dst, sum);
  } else if constexpr (kAtomicCrossing) {
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      atomicAdd(reinterpret_cast<Acc*>(dst) + i, -sum[i]);
  } else {
    // Slot 0: the run that begins at the chunk's start; slot 1: a run that
    // begins later and continues into the next chunk.
    const int slot = first_in_chunk ? 0 : 1;
    Acc* out = partials + (chunk_id * 2 + slot) * row_size + col;
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = sum[i];
  }
}

// Pass 3: one warp per chunk of sorted positions sums runs of equal rows.
template <typename T, typename KeyT, int VEC, bool kAtomicCrossing>
__global__ void __launch_bounds__(kApplyThreads) ApplyChunksKernel(
    T* __restrict__ var, int64_t row_size, const KeyT* __restrict__ keys,
    const uint32_t* __restrict__ positions, int64_t num_indices, KeyT sentinel,
    const T* __restrict__ updates, int chunk, int64_t num_chunks,
    typename Arith<T>::Compute* __restrict__ partials,
    unsigned long long* __restrict__ num_owners, int64_t* __restrict__ owners,
    const unsigned long long* __restrict__ bad_position) {
  using A = Arith<T>;
  using Acc = typename A::Compute;
  if (*bad_position != kNoBadPosition) return;
  const int64_t chunk_id =
      (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (chunk_id >= num_chunks) return;  // Uniform across the warp.
  const int64_t start = chunk_id * chunk;
  const int count =
      static_cast<int>(min(static_cast<int64_t>(chunk), num_indices - start));
  const KeyT my_key = lane < count ? keys[start + lane] : sentinel;
  const uint32_t my_position = lane < count ? positions[start + lane] : 0;
  // Sentinels sort last: the valid rows are a prefix of the chunk.
  const int num_valid = __popc(__ballot_sync(kFullWarp, my_key != sentinel));
  if (num_valid == 0) return;
  const KeyT row_before = start > 0 ? keys[start - 1] : sentinel;
  const KeyT row_after =
      start + count < num_indices ? keys[start + count] : sentinel;
  if constexpr (!kAtomicCrossing) {
    // List the chunks where a run that crosses into the next chunk begins:
    // AddPartialsKernel finishes those rows. The list's order does not matter.
    const KeyT first_row = __shfl_sync(kFullWarp, my_key, 0);
    const KeyT last_row = __shfl_sync(kFullWarp, my_key, count - 1);
    if (lane == 0 && num_valid == count && last_row == row_after &&
        (first_row != last_row || row_before != last_row)) {
      owners[atomicAdd(num_owners, 1ull)] = chunk_id;
    }
  }

  for (int64_t base = 0; base < row_size; base += kWarpSize * VEC) {
    const int64_t col = base + lane * VEC;
    const bool active = col < row_size;
    Acc sum[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) sum[i] = Acc(0);
    KeyT current = __shfl_sync(kFullWarp, my_key, 0);
    int run_start = 0;
    for (int t = 0; t < num_valid; t += kLoadsInFlight) {
      T loaded[kLoadsInFlight][VEC];
      KeyT rows[kLoadsInFlight];
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int source_lane = (t + u) % kWarpSize;
        rows[u] = __shfl_sync(kFullWarp, my_key, source_lane);
        const uint32_t position =
            __shfl_sync(kFullWarp, my_position, source_lane);
        if (active && t + u < num_valid) {
          gpu::LoadOnce<T, VEC>(updates + int64_t{position} * row_size + col,
                                loaded[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        if (t + u >= num_valid) break;
        if (rows[u] != current) {
          FlushPiece<T, KeyT, VEC, kAtomicCrossing>(
              var, row_size, col, active, current, run_start == 0, false,
              row_before, row_after, sum, partials, chunk_id);
          current = rows[u];
          run_start = t + u;
#pragma unroll
          for (int i = 0; i < VEC; ++i) sum[i] = Acc(0);
        }
        if (active) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) sum[i] += A::Load(loaded[u][i]);
        }
      }
    }
    FlushPiece<T, KeyT, VEC, kAtomicCrossing>(
        var, row_size, col, active, current, run_start == 0, num_valid == count,
        row_before, row_after, sum, partials, chunk_id);
  }
}

// Adds the partial sums of the crossing run that begins in chunk `chunk_id`,
// then writes its row once. Called by a whole block.
template <typename T, typename KeyT, int VEC>
__device__ void AddPartialsForRun(
    T* __restrict__ var, int64_t row_size, const KeyT* __restrict__ keys,
    int64_t num_indices, int chunk,
    const typename Arith<T>::Compute* __restrict__ partials, int64_t chunk_id,
    typename Arith<T>::Compute (&warp_sums)[kFinalizeWarps][kWarpSize * VEC]) {
  using Acc = typename Arith<T>::Compute;
  const int64_t start = chunk_id * chunk;
  const int64_t end = min(start + chunk, num_indices);
  const KeyT row = keys[end - 1];
  const int first_slot = keys[start] == row ? 0 : 1;
  // The run's last position: keys[low] == row and keys[high] != row.
  int64_t low = end;
  int64_t high = num_indices;
  while (high - low > 1) {
    const int64_t middle = low + (high - low) / 2;
    if (keys[middle] == row) {
      low = middle;
    } else {
      high = middle;
    }
  }
  const int64_t num_pieces = low / chunk - chunk_id + 1;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t base = 0; base < row_size; base += kWarpSize * VEC) {
    const int64_t col = base + lane * VEC;
    const bool active = col < row_size;
    Acc sum[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) sum[i] = Acc(0);
    if (active) {
      for (int64_t piece = warp; piece < num_pieces; piece += kFinalizeWarps) {
        const int slot = piece == 0 ? first_slot : 0;
        const Acc* src =
            partials + ((chunk_id + piece) * 2 + slot) * row_size + col;
#pragma unroll
        for (int i = 0; i < VEC; ++i) sum[i] += src[i];
      }
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) warp_sums[warp][lane * VEC + i] = sum[i];
    __syncthreads();
    if (warp == 0 && active) {
      Acc total[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) total[i] = Acc(0);
      for (int w = 0; w < kFinalizeWarps; ++w) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) total[i] += warp_sums[w][lane * VEC + i];
      }
      SubtractFromRow<T, VEC>(var + static_cast<int64_t>(row) * row_size + col,
                              total);
    }
    __syncthreads();
  }
}

// Pass 4: a block per row whose run crosses chunks (listed by pass 3 under
// the chunk where the run starts). Warp w adds partials w, w + W, ... in order,
// then warp 0 adds the W warp sums in order: a fixed order, so a bit-identical
// result.
template <typename T, typename KeyT, int VEC>
__global__ void __launch_bounds__(kFinalizeThreads)
    AddPartialsKernel(T* __restrict__ var, int64_t row_size,
                      const KeyT* __restrict__ keys, int64_t num_indices,
                      int chunk,
                      const typename Arith<T>::Compute* __restrict__ partials,
                      const unsigned long long* __restrict__ num_owners,
                      const int64_t* __restrict__ owners,
                      const unsigned long long* __restrict__ bad_position) {
  using Acc = typename Arith<T>::Compute;
  __shared__ Acc warp_sums[kFinalizeWarps][kWarpSize * VEC];
  if (*bad_position != kNoBadPosition) return;
  const int64_t num_runs = static_cast<int64_t>(*num_owners);
  for (int64_t run = blockIdx.x; run < num_runs; run += gridDim.x) {
    AddPartialsForRun<T, KeyT, VEC>(var, row_size, keys, num_indices, chunk,
                                    partials, owners[run], warp_sums);
  }
}

// ---------------------------------------------------------------------------
// Host side.

// Fewer positions per warp for small updates, so they still fill the GPU.
int ChunkSize(int64_t num_indices) {
  if (num_indices >= (int64_t{1} << 20)) return 32;
  if (num_indices >= (int64_t{1} << 16)) return 16;
  return 8;
}

// Where each buffer lives in the workspace. The bad position is always first,
// so ReadGpuBadIndex needs no layout.
struct Layout {
  int chunk = 8;
  int64_t num_chunks = 0;
  bool use_partials = false;
  gpu::SortedPositionsLayout sort;
  size_t partials = 0;
  size_t owners = 0;
  size_t total = gpu::kWorkspaceAlignment;
};

template <typename T>
cudaError_t ComputeLayout(int64_t num_rows, int64_t row_size,
                          int64_t num_indices, bool deterministic,
                          cudaStream_t stream, Layout* layout) {
  using Acc = typename Arith<T>::Compute;
  *layout = Layout();
  if (num_indices == 0) return cudaSuccess;
  layout->chunk = ChunkSize(num_indices);
  layout->num_chunks = (num_indices + layout->chunk - 1) / layout->chunk;
  layout->use_partials = deterministic || !kHasFloatAtomics<T>;
  size_t offset = gpu::kWorkspaceAlignment;  // The bad position, the run count.
  const cudaError_t error = gpu::LayOutSortedPositions(
      num_rows, num_indices, stream, &offset, &layout->sort);
  if (error != cudaSuccess) return error;
  layout->partials = offset;
  if (layout->use_partials && row_size > 0) {
    offset += gpu::AlignUp(static_cast<size_t>(layout->num_chunks) * 2 *
                           static_cast<size_t>(row_size) * sizeof(Acc));
  }
  layout->owners = offset;
  if (layout->use_partials) {
    offset +=
        gpu::AlignUp(static_cast<size_t>(layout->num_chunks) * sizeof(int64_t));
  }
  layout->total = offset;
  return cudaSuccess;
}

template <typename T, typename KeyT, int VEC>
cudaError_t LaunchApply(T* var, int64_t row_size, const KeyT* keys,
                        const uint32_t* positions, int64_t num_indices,
                        KeyT sentinel, const T* updates, const Layout& layout,
                        typename Arith<T>::Compute* partials,
                        unsigned long long* num_owners, int64_t* owners,
                        const unsigned long long* bad_position,
                        cudaStream_t stream) {
  constexpr int kWarpsPerBlock = kApplyThreads / kWarpSize;
  const int64_t blocks =
      (layout.num_chunks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (layout.use_partials) {
    PE_LAUNCH(static_cast<unsigned>(blocks), kApplyThreads, 0, stream,
              ApplyChunksKernel<T, KeyT, VEC, false>)(
        var, row_size, keys, positions, num_indices, sentinel, updates,
        layout.chunk, layout.num_chunks, partials, num_owners, owners,
        bad_position);
    PE_LAUNCH(static_cast<unsigned>(
                  std::min<int64_t>(layout.num_chunks, kMaxFinalizeBlocks)),
              kFinalizeThreads, 0, stream, AddPartialsKernel<T, KeyT, VEC>)(
        var, row_size, keys, num_indices, layout.chunk, partials, num_owners,
        owners, bad_position);
  } else if constexpr (kHasFloatAtomics<T>) {
    PE_LAUNCH(static_cast<unsigned>(blocks), kApplyThreads, 0, stream,
              ApplyChunksKernel<T, KeyT, VEC, true>)(
        var, row_size, keys, positions, num_indices, sentinel, updates,
        layout.chunk, layout.num_chunks, partials, nullptr, nullptr,
        bad_position);
  }
  return cudaGetLastError();
}

template <typename T, typename Index, typename KeyT>
cudaError_t Run(T* var, int64_t num_rows, int64_t row_size,
                const Index* indices, int64_t num_indices, const T* updates,
                const bool* row_mask, const Layout& layout, char* workspace,
                BadIndices bad_indices, cudaStream_t stream) {
  using Acc = typename Arith<T>::Compute;
  auto* bad_position = reinterpret_cast<unsigned long long*>(workspace);
  const KeyT sentinel = static_cast<KeyT>(num_rows);
  const KeyT* sorted_keys = nullptr;
  const uint32_t* sorted_positions = nullptr;
  const cudaError_t error = gpu::ValidateAndSortPositions<Index, KeyT>(
      layout.sort, workspace, indices, num_indices, num_rows, row_mask,
      bad_position, nullptr, 0, nullptr, bad_indices == BadIndices::kSkip,
      /*validate_only=*/row_size == 0, stream, &sorted_keys, &sorted_positions);
  if (error != cudaSuccess || row_size == 0) return error;

  auto* partials = reinterpret_cast<Acc*>(workspace + layout.partials);
  auto* num_owners = bad_position + 1;
  auto* owners = reinterpret_cast<int64_t*>(workspace + layout.owners);
  const bool wide = gpu::RowsAre16ByteAligned<T>(row_size, {var, updates});
  auto launch = [&](auto vec) {
    return LaunchApply<T, KeyT, decltype(vec)::value>(
        var, row_size, sorted_keys, sorted_positions, num_indices, sentinel,
        updates, layout, partials, num_owners, owners, bad_position, stream);
  };
  return wide ? launch(std::integral_constant<int, gpu::kVec16<T>>())
              : launch(std::integral_constant<int, 1>());
}

// Checks the sizes, runs on the stream's device and lays the workspace out.
template <typename T>
cudaError_t Prepare(int64_t num_rows, int64_t row_size, int64_t num_indices,
                    bool deterministic, GpuStream stream, Layout* layout) {
  const cudaError_t error = gpu::CheckSizesOnStreamDevice(
      {num_rows, row_size, num_indices}, num_indices, stream);
  if (error != cudaSuccess) return error;
  return ComputeLayout<T>(num_rows, row_size, num_indices, deterministic,
                          stream, layout);
}

}  // namespace

template <typename T>
int MaskedScatterSubGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                      int64_t num_indices, bool deterministic,
                                      GpuStream stream, size_t* bytes) {
  return gpu::WorkspaceBytesOf<Layout>(
      [&](Layout* layout) {
        return Prepare<T>(num_rows, row_size, num_indices, deterministic,
                          stream, layout);
      },
      bytes);
}

template <typename T, typename Index>
int MaskedScatterSubGpuAsync(T* var, int64_t num_rows, int64_t row_size,
                             const Index* indices, int64_t num_indices,
                             const T* updates, const bool* row_mask,
                             bool deterministic, void* workspace,
                             size_t workspace_bytes, GpuStream stream,
                             BadIndices bad_indices) {
  // The bad position starts at "none" (all ones), the crossing-run count at 0.
  Layout layout;
  const cudaError_t error = gpu::StartCall(
      workspace, workspace_bytes, sizeof(unsigned long long),
      sizeof(unsigned long long), stream,
      [&](Layout* out) {
        return Prepare<T>(num_rows, row_size, num_indices, deterministic,
                          stream, out);
      },
      &layout);
  if (error != cudaSuccess || num_indices == 0) return error;
  return gpu::WithSortKey(layout.sort.bits, [&](auto key) {
    return Run<T, Index, decltype(key)>(
        var, num_rows, row_size, indices, num_indices, updates, row_mask,
        layout, static_cast<char*>(workspace), bad_indices, stream);
  });
}

template <typename Index>
int ReadGpuBadIndex(const void* workspace, const Index* indices,
                    GpuStream stream, int64_t* bad_position,
                    int64_t* bad_value) {
  *bad_position = -1;
  *bad_value = 0;
  auto error = static_cast<cudaError_t>(SelectStreamDevice(stream));
  if (error != cudaSuccess) return error;
  unsigned long long position = kNoBadPosition;
  error = static_cast<cudaError_t>(
      GpuCopyToHostAndWait(&position, workspace, sizeof(position), stream));
  if (error != cudaSuccess || position == kNoBadPosition) return error;
  Index value = 0;
  error = static_cast<cudaError_t>(
      GpuCopyToHostAndWait(&value, indices + position, sizeof(Index), stream));
  *bad_position = static_cast<int64_t>(position);
  *bad_value = static_cast<int64_t>(value);
  return error;
}

template <typename T, typename Index>
int MaskedScatterSubGpu(T* var, int64_t num_rows, int64_t row_size,
                        const Index* indices, int64_t num_indices,
                        const T* updates, const bool* row_mask,
                        bool deterministic, void* workspace,
                        size_t workspace_bytes, GpuStream stream,
                        int64_t* bad_position, int64_t* bad_value) {
  *bad_position = -1;
  *bad_value = 0;
  const int error = MaskedScatterSubGpuAsync(
      var, num_rows, row_size, indices, num_indices, updates, row_mask,
      deterministic, workspace, workspace_bytes, stream);
  if (error != cudaSuccess) return error;
  return ReadGpuBadIndex(workspace, indices, stream, bad_position, bad_value);
}

#define PE_INSTANTIATE(T, Index)                                          \
  template int MaskedScatterSubGpuAsync<T, Index>(                        \
      T*, int64_t, int64_t, const Index*, int64_t, const T*, const bool*, \
      bool, void*, size_t, GpuStream, BadIndices);                        \
  template int MaskedScatterSubGpu<T, Index>(                             \
      T*, int64_t, int64_t, const Index*, int64_t, const T*, const bool*, \
      bool, void*, size_t, GpuStream, int64_t*, int64_t*);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE
#define PE_INSTANTIATE_WORKSPACE(T)                                            \
  template int MaskedScatterSubGpuWorkspaceBytes<T>(int64_t, int64_t, int64_t, \
                                                    bool, GpuStream, size_t*);
PE_FOR_EACH_CORE_TYPE(PE_INSTANTIATE_WORKSPACE)
#undef PE_INSTANTIATE_WORKSPACE
#define PE_INSTANTIATE_READ(Index)                                          \
  template int ReadGpuBadIndex<Index>(const void*, const Index*, GpuStream, \
                                      int64_t*, int64_t*);
PE_FOR_EACH_INDEX_TYPE(PE_INSTANTIATE_READ)
#undef PE_INSTANTIATE_READ

}  // namespace partial_embedding
