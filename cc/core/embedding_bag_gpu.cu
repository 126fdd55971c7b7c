// CUDA implementation of the TF-free MaskedEmbeddingBagGrad core. The
// algorithm is described in embedding_bag_gpu.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_scan.cuh>
#include <vector>

#include "cc/core/embedding_bag_gpu.h"
#include "cc/core/gpu_device_common.cuh"

namespace partial_embedding {
namespace {

using gpu::kNoBadPosition;
using gpu::kWarpSize;
constexpr int kThreads = 256;
// Columns each lane adds per pass over a run's positions.
constexpr int kColumnsPerLane = 4;
constexpr int64_t kMaxBlocks = 8192;

// Where each buffer lives in the workspace. The first 256 bytes hold the bad
// position and the end of the permitted positions after the sort.
struct Layout {
  gpu::SortedPositionsLayout sort;
  size_t heads = 0;
  size_t run_of = 0;
  size_t run_starts = 0;
  size_t scan_scratch = 0;
  size_t scan_scratch_bytes = 0;
  size_t total = gpu::kWorkspaceAlignment;
};

cudaError_t ComputeLayout(int64_t num_rows, int64_t n, cudaStream_t stream,
                          Layout* layout) {
  *layout = Layout();
  if (n == 0) return cudaSuccess;
  size_t offset = gpu::kWorkspaceAlignment;
  cudaError_t error =
      gpu::LayOutSortedPositions(num_rows, n, stream, &offset, &layout->sort);
  if (error != cudaSuccess) return error;
  error = cub::DeviceScan::ExclusiveSum(nullptr, layout->scan_scratch_bytes,
                                        static_cast<const uint32_t*>(nullptr),
                                        static_cast<uint32_t*>(nullptr),
                                        static_cast<int>(n + 1), stream);
  if (error != cudaSuccess) return error;
  const size_t count = static_cast<size_t>(n);
  for (size_t* buffer :
       {&layout->heads, &layout->run_of, &layout->run_starts}) {
    *buffer = offset;
    offset += gpu::AlignUp((count + 1) * sizeof(uint32_t));
  }
  layout->scan_scratch = offset;
  offset += gpu::AlignUp(layout->scan_scratch_bytes);
  layout->total = offset;
  return cudaSuccess;
}

// Keys every position: its row where it is valid, unpruned and permitted,
// else `sentinel`; records the lowest bad position.
template <typename Index, typename KeyT>
__global__ void __launch_bounds__(kThreads)
    KeyKernel(const Index* __restrict__ ids, const int64_t* __restrict__ bags,
              int64_t n, int64_t num_bags, int64_t num_rows,
              const bool* __restrict__ row_mask, KeyT sentinel,
              KeyT* __restrict__ keys, uint32_t* __restrict__ positions,
              unsigned long long* __restrict__ bad_position) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t bag = bags[i];
    const int64_t id = static_cast<int64_t>(ids[i]);
    KeyT key = sentinel;
    if (bag < 0 || bag >= num_bags || id >= num_rows) {
      atomicMin(bad_position, static_cast<unsigned long long>(i));
    } else if (id >= 0 && row_mask[id]) {
      key = static_cast<KeyT>(id);
    }
    keys[i] = key;
    positions[i] = static_cast<uint32_t>(i);
  }
}

// heads[i] = 1 where sorted position i starts a run of a permitted row;
// heads[n] = 0 (the scan's total slot). Also records where the permitted
// positions end (the sentinels sort last).
template <typename KeyT>
__global__ void __launch_bounds__(kThreads)
    HeadsKernel(const KeyT* __restrict__ keys, int64_t n, KeyT sentinel,
                uint32_t* __restrict__ heads,
                unsigned long long* __restrict__ permitted_end) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i <= n;
       i += stride) {
    if (i == n) {
      heads[i] = 0;
      continue;
    }
    const KeyT key = keys[i];
    const bool permitted = key != sentinel;
    heads[i] = permitted && (i == 0 || keys[i - 1] != key) ? 1u : 0u;
    if (permitted && (i + 1 == n || keys[i + 1] == sentinel)) {
      *permitted_end = static_cast<unsigned long long>(i + 1);
    }
  }
}

// run_starts[run_of[i]] = i at every head.
__global__ void __launch_bounds__(kThreads)
    RunStartsKernel(const uint32_t* __restrict__ heads,
                    const uint32_t* __restrict__ run_of, int64_t n,
                    uint32_t* __restrict__ run_starts) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (heads[i] != 0) run_starts[run_of[i]] = static_cast<uint32_t>(i);
  }
}

// One warp per run: rows[run] and values[run] = sum of factor * grad[bag]
// over the run's positions, in position order.
template <typename T, typename Index, typename KeyT>
__global__ void __launch_bounds__(kThreads)
    ValuesKernel(const T* __restrict__ grad, int64_t row_size,
                 const int64_t* __restrict__ bags,
                 const typename Arith<T>::Compute* __restrict__ factors,
                 const KeyT* __restrict__ keys,
                 const uint32_t* __restrict__ positions,
                 const uint32_t* __restrict__ run_starts,
                 const unsigned long long* __restrict__ permitted_end,
                 int64_t num_runs, Index* __restrict__ rows,
                 T* __restrict__ values) {
  using A = Arith<T>;
  using C = typename A::Compute;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / kWarpSize);
  for (int64_t run =
           (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarpSize;
       run < num_runs; run += warps) {
    const int64_t begin = run_starts[run];
    const int64_t end = run + 1 < num_runs
                            ? static_cast<int64_t>(run_starts[run + 1])
                            : static_cast<int64_t>(*permitted_end);
    if (lane == 0) rows[run] = static_cast<Index>(keys[begin]);
    T* out = values + run * row_size;
    for (int64_t base = 0; base < row_size;
         base += kWarpSize * kColumnsPerLane) {
      C sum[kColumnsPerLane];
#pragma unroll
      for (int k = 0; k < kColumnsPerLane; ++k) sum[k] = C(0);
      for (int64_t p = begin; p < end; ++p) {
        const uint32_t position = positions[p];
        const C factor = factors[position];
        const T* src = grad + bags[position] * row_size;
#pragma unroll
        for (int k = 0; k < kColumnsPerLane; ++k) {
          const int64_t col = base + lane + k * kWarpSize;
          if (col < row_size) sum[k] += factor * A::Load(src[col]);
        }
      }
#pragma unroll
      for (int k = 0; k < kColumnsPerLane; ++k) {
        const int64_t col = base + lane + k * kWarpSize;
        if (col < row_size) out[col] = A::Store(sum[k]);
      }
    }
  }
}

// rows[run] and first_positions[run]: the key and the position at the
// run's start (the sort is stable, so its smallest position).
template <typename Index, typename KeyT>
__global__ void __launch_bounds__(kThreads)
    HeadsOfRunsKernel(const KeyT* __restrict__ keys,
                      const uint32_t* __restrict__ positions,
                      const uint32_t* __restrict__ run_starts, int64_t num_runs,
                      Index* __restrict__ rows,
                      uint32_t* __restrict__ first_positions) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t run = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       run < num_runs; run += stride) {
    const uint32_t start = run_starts[run];
    rows[run] = static_cast<Index>(keys[start]);
    first_positions[run] = positions[start];
  }
}

unsigned Blocks(int64_t items) {
  return gpu::BlocksFor(items, kThreads, kMaxBlocks);
}

cudaError_t Prepare(int64_t num_rows, int64_t n, GpuStream stream,
                    Layout* layout) {
  // The scan runs over n + 1 entries: they must fit the GPU's positions.
  const cudaError_t error =
      gpu::CheckSizesOnStreamDevice({num_rows, n}, n + 1, stream);
  if (error != cudaSuccess) return error;
  return ComputeLayout(num_rows, n, stream, layout);
}

template <typename Index, typename KeyT>
cudaError_t RunPlan(const BagPositions<Index>& p, const bool* row_mask,
                    const Layout& layout, char* workspace,
                    cudaStream_t stream) {
  auto* bad_position = reinterpret_cast<unsigned long long*>(workspace);
  auto* permitted_end = bad_position + 1;
  const KeyT sentinel = static_cast<KeyT>(p.num_rows);
  KeyT* keys[2] = {reinterpret_cast<KeyT*>(workspace + layout.sort.keys[0]),
                   reinterpret_cast<KeyT*>(workspace + layout.sort.keys[1])};
  uint32_t* positions[2] = {
      reinterpret_cast<uint32_t*>(workspace + layout.sort.positions[0]),
      reinterpret_cast<uint32_t*>(workspace + layout.sort.positions[1])};
  PE_LAUNCH(Blocks(p.num_positions), kThreads, 0, stream,
            KeyKernel<Index, KeyT>)(p.ids, p.bags, p.num_positions, p.num_bags,
                                    p.num_rows, row_mask, sentinel, keys[0],
                                    positions[0], bad_position);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  const KeyT* sorted_keys = nullptr;
  const uint32_t* sorted_positions = nullptr;
  error = gpu::SortPositionsByKey<KeyT>(
      workspace + layout.sort.scratch, layout.sort.scratch_bytes, keys,
      positions, p.num_positions, layout.sort.bits.end_bit, stream,
      &sorted_keys, &sorted_positions);
  if (error != cudaSuccess) return error;
  // The sorted buffers are always the first: copy back if cub ended in the
  // second, so the values call finds them without knowing.
  if (sorted_keys != keys[0]) {
    error =
        cudaMemcpyAsync(keys[0], sorted_keys, p.num_positions * sizeof(KeyT),
                        cudaMemcpyDeviceToDevice, stream);
    if (error == cudaSuccess) {
      error = cudaMemcpyAsync(positions[0], sorted_positions,
                              p.num_positions * sizeof(uint32_t),
                              cudaMemcpyDeviceToDevice, stream);
    }
    if (error != cudaSuccess) return error;
  }
  auto* heads = reinterpret_cast<uint32_t*>(workspace + layout.heads);
  auto* run_of = reinterpret_cast<uint32_t*>(workspace + layout.run_of);
  auto* run_starts = reinterpret_cast<uint32_t*>(workspace + layout.run_starts);
  PE_LAUNCH(Blocks(p.num_positions + 1), kThreads, 0, stream,
            HeadsKernel<KeyT>)(keys[0], p.num_positions, sentinel, heads,
                               permitted_end);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  size_t scan_bytes = layout.scan_scratch_bytes;
  error = cub::DeviceScan::ExclusiveSum(
      workspace + layout.scan_scratch, scan_bytes, heads, run_of,
      static_cast<int>(p.num_positions + 1), stream);
  if (error != cudaSuccess) return error;
  PE_LAUNCH(Blocks(p.num_positions), kThreads, 0, stream, RunStartsKernel)(
      heads, run_of, p.num_positions, run_starts);
  return cudaGetLastError();
}

// The place of position `position` in its bag: how many earlier positions
// hold the same bag (read on the host; only for an error message).
int PlaceOnHost(const int64_t* bags, int64_t position, int64_t bag,
                cudaStream_t stream, int64_t* place) {
  std::vector<int64_t> host(static_cast<size_t>(position + 1));
  cudaError_t error =
      cudaMemcpyAsync(host.data(), bags, host.size() * sizeof(int64_t),
                      cudaMemcpyDeviceToHost, stream);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  *place = 0;
  for (int64_t i = 0; i < position; ++i) *place += host[i] == bag ? 1 : 0;
  return error;
}

}  // namespace

int EmbeddingBagGradGpuWorkspaceBytes(int64_t num_rows, int64_t num_positions,
                                      GpuStream stream, size_t* bytes) {
  return gpu::WorkspaceBytesOf<Layout>(
      [&](Layout* layout) {
        return Prepare(num_rows, num_positions, stream, layout);
      },
      bytes);
}

template <typename Index>
int EmbeddingBagGradGpuPlan(const BagPositions<Index>& positions,
                            const bool* row_mask, void* workspace,
                            size_t workspace_bytes, GpuStream stream,
                            int64_t* num_groups, BagInputError* bag_error) {
  *num_groups = 0;
  *bag_error = BagInputError();
  // The bad position starts at "none" (all ones), the permitted end at 0.
  Layout layout;
  cudaError_t error = gpu::StartCall(
      workspace, workspace_bytes, sizeof(unsigned long long),
      sizeof(unsigned long long), stream,
      [&](Layout* out) {
        return Prepare(positions.num_rows, positions.num_positions, stream,
                       out);
      },
      &layout);
  char* scratch = static_cast<char*>(workspace);
  if (error != cudaSuccess || positions.num_positions == 0) {
    return error == cudaSuccess ? cudaStreamSynchronize(stream) : error;
  }
  error = gpu::WithSortKey(layout.sort.bits, [&](auto key) {
    return RunPlan<Index, decltype(key)>(positions, row_mask, layout, scratch,
                                         stream);
  });
  if (error != cudaSuccess) return error;
  unsigned long long bad = kNoBadPosition;
  uint32_t runs = 0;
  error = cudaMemcpyAsync(&bad, scratch, sizeof(bad), cudaMemcpyDeviceToHost,
                          stream);
  if (error == cudaSuccess) {
    error = cudaMemcpyAsync(
        &runs,
        scratch + layout.run_of + positions.num_positions * sizeof(uint32_t),
        sizeof(runs), cudaMemcpyDeviceToHost, stream);
  }
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (error != cudaSuccess) return error;
  if (bad == kNoBadPosition) {
    *num_groups = runs;
    return cudaSuccess;
  }
  // Which check failed, at the lowest bad position.
  const int64_t position = static_cast<int64_t>(bad);
  int64_t bag = 0;
  Index id = 0;
  error = cudaMemcpyAsync(&bag, positions.bags + position, sizeof(bag),
                          cudaMemcpyDeviceToHost, stream);
  if (error == cudaSuccess) {
    error = cudaMemcpyAsync(&id, positions.ids + position, sizeof(id),
                            cudaMemcpyDeviceToHost, stream);
  }
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (error != cudaSuccess) return error;
  bag_error->position = position;
  if (bag < 0 || bag >= positions.num_bags) {
    bag_error->kind = BagInputError::Kind::kBagOutOfRange;
    bag_error->value = bag;
    return cudaSuccess;
  }
  bag_error->kind = BagInputError::Kind::kIdOutOfRange;
  bag_error->value = static_cast<int64_t>(id);
  bag_error->bag = bag;
  return PlaceOnHost(positions.bags, position, bag, stream, &bag_error->place);
}

template <typename T, typename Index>
int EmbeddingBagGradGpuValues(const T* grad, int64_t row_size,
                              const BagPositions<Index>& positions,
                              const typename Arith<T>::Compute* factors,
                              int64_t num_groups, const void* workspace,
                              size_t workspace_bytes, Index* rows, T* values,
                              GpuStream stream) {
  if (num_groups == 0) return cudaSuccess;
  Layout layout;
  cudaError_t error =
      Prepare(positions.num_rows, positions.num_positions, stream, &layout);
  if (error != cudaSuccess) return error;
  if (workspace_bytes < layout.total) return cudaErrorInvalidValue;
  const char* scratch = static_cast<const char*>(workspace);
  const auto* permitted_end =
      reinterpret_cast<const unsigned long long*>(scratch) + 1;
  const auto* positions_sorted =
      reinterpret_cast<const uint32_t*>(scratch + layout.sort.positions[0]);
  const auto* run_starts =
      reinterpret_cast<const uint32_t*>(scratch + layout.run_starts);
  const unsigned blocks =
      gpu::BlocksFor(num_groups, kThreads / kWarpSize, kMaxBlocks);
  if (layout.sort.bits.wide) {
    PE_LAUNCH(blocks, kThreads, 0, stream, ValuesKernel<T, Index, uint64_t>)(
        grad, row_size, positions.bags, factors,
        reinterpret_cast<const uint64_t*>(scratch + layout.sort.keys[0]),
        positions_sorted, run_starts, permitted_end, num_groups, rows, values);
  } else {
    PE_LAUNCH(blocks, kThreads, 0, stream, ValuesKernel<T, Index, uint32_t>)(
        grad, row_size, positions.bags, factors,
        reinterpret_cast<const uint32_t*>(scratch + layout.sort.keys[0]),
        positions_sorted, run_starts, permitted_end, num_groups, rows, values);
  }
  return cudaGetLastError();
}

template <typename Index>
int EmbeddingBagGradGpuGroupHeads(const BagPositions<Index>& positions,
                                  int64_t num_groups, const void* workspace,
                                  size_t workspace_bytes, Index* rows,
                                  uint32_t* first_positions, GpuStream stream) {
  if (num_groups == 0) return cudaSuccess;
  Layout layout;
  cudaError_t error =
      Prepare(positions.num_rows, positions.num_positions, stream, &layout);
  if (error != cudaSuccess) return error;
  if (workspace_bytes < layout.total || num_groups > positions.num_positions) {
    return cudaErrorInvalidValue;
  }
  const char* scratch = static_cast<const char*>(workspace);
  const auto* sorted =
      reinterpret_cast<const uint32_t*>(scratch + layout.sort.positions[0]);
  const auto* run_starts =
      reinterpret_cast<const uint32_t*>(scratch + layout.run_starts);
  if (layout.sort.bits.wide) {
    PE_LAUNCH(Blocks(num_groups), kThreads, 0, stream,
              HeadsOfRunsKernel<Index, uint64_t>)(
        reinterpret_cast<const uint64_t*>(scratch + layout.sort.keys[0]),
        sorted, run_starts, num_groups, rows, first_positions);
  } else {
    PE_LAUNCH(Blocks(num_groups), kThreads, 0, stream,
              HeadsOfRunsKernel<Index, uint32_t>)(
        reinterpret_cast<const uint32_t*>(scratch + layout.sort.keys[0]),
        sorted, run_starts, num_groups, rows, first_positions);
  }
  return cudaGetLastError();
}

#define PE_INSTANTIATE_PLAN(Index)                                       \
  template int EmbeddingBagGradGpuPlan<Index>(                           \
      const BagPositions<Index>&, const bool*, void*, size_t, GpuStream, \
      int64_t*, BagInputError*);                                         \
  template int EmbeddingBagGradGpuGroupHeads<Index>(                     \
      const BagPositions<Index>&, int64_t, const void*, size_t, Index*,  \
      uint32_t*, GpuStream);
PE_FOR_EACH_INDEX_TYPE(PE_INSTANTIATE_PLAN)
#undef PE_INSTANTIATE_PLAN

#define PE_INSTANTIATE(T, Index)                                               \
  template int EmbeddingBagGradGpuValues<T, Index>(                            \
      const T*, int64_t, const BagPositions<Index>&,                           \
      const typename Arith<T>::Compute*, int64_t, const void*, size_t, Index*, \
      T*, GpuStream);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE

}  // namespace partial_embedding
