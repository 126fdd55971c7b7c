// CUDA implementation of the TF-free quantized lookup; see
// quantized_lookup_gpu.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cc/core/gpu_device_common.cuh"
#include "cc/core/gpu_launch.h"
#include "cc/core/quantized_lookup_gpu.h"

namespace partial_embedding {
namespace {

using gpu::kNoBadPosition;
using gpu::kWarpSize;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

// Error words: the smallest position of a bad id; any bad store index.
enum ErrorWord { kBadId = 0, kBadStoreIndex = 1, kNumErrorWords = 2 };

template <typename Index>
__global__ void __launch_bounds__(kThreads)
    CheckIdsKernel(QuantizedLookupInputs<Index> in,
                   unsigned long long* __restrict__ errors) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < in.num_ids; i += stride) {
    const int64_t id = static_cast<int64_t>(in.ids[i]);
    if (id < 0 || id >= in.num_rows) {
      atomicMin(errors + kBadId, static_cast<unsigned long long>(i));
    }
  }
  for (int64_t k = first; k < in.store_rows; k += stride) {
    const int32_t row = in.store_index[k];
    if (row < 0 || row >= in.store_rows) {
      atomicMin(errors + kBadStoreIndex, 0ull);
    }
  }
}

// One warp per id.
template <typename Index>
__global__ void __launch_bounds__(kThreads)
    LookUpKernel(QuantizedLookupInputs<Index> in, float* __restrict__ out,
                 int32_t* __restrict__ row_of,
                 const unsigned long long* __restrict__ errors) {
  if ((errors[kBadId] & errors[kBadStoreIndex]) != kNoBadPosition) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t num_warps = int64_t{gridDim.x} * kWarpsPerBlock;
  const int64_t width = in.width;
  for (int64_t i = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarpSize;
       i < in.num_ids; i += num_warps) {
    const int64_t id = static_cast<int64_t>(in.ids[i]);
    int32_t store_row = 0;
    if (lane == 0) {
      store_row = StoreRowOf(in, id);
      row_of[i] = store_row;
    }
    store_row = __shfl_sync(gpu::kFullWarp, store_row, 0);
    float* target = out + i * width;
    if (store_row != in.store_rows - 1) {
      const float* source = in.store + int64_t{store_row} * width;
      for (int64_t j = lane; j < width; j += kWarpSize) target[j] = source[j];
      continue;
    }
    const int8_t* codes = in.codes + id * width;
    const float scale = in.scales[id];
    for (int64_t j = lane; j < width; j += kWarpSize) {
      target[j] = __fdiv_rn(static_cast<float>(codes[j]), scale);
    }
  }
}

unsigned BlocksFor(int64_t items, int per_block) {
  return gpu::BlocksFor(items, per_block, kMaxBlocks);
}

}  // namespace

template <typename Index>
int QuantizedLookupGpuAsync(const QuantizedLookupInputs<Index>& in, float* out,
                            int32_t* row_of, void* workspace,
                            GpuStream stream) {
  if (workspace == nullptr || in.num_ids < 0 || in.num_rows < 0 ||
      in.width < 0 || in.store_rows < 1) {
    return cudaErrorInvalidValue;
  }
  auto error = static_cast<cudaError_t>(SelectStreamDevice(stream));
  if (error != cudaSuccess) return error;
  auto* errors = static_cast<unsigned long long*>(workspace);
  error = gpu::ResetErrorWordsAndCounters(static_cast<char*>(workspace),
                                          kNumErrorWords * sizeof(*errors), 0,
                                          stream);
  if (error != cudaSuccess) return error;
  PE_LAUNCH(BlocksFor(std::max(in.num_ids, in.store_rows), kThreads), kThreads,
            0, stream, CheckIdsKernel<Index>)(in, errors);
  if (in.num_ids > 0) {
    PE_LAUNCH(BlocksFor(in.num_ids, kWarpsPerBlock), kThreads, 0, stream,
              LookUpKernel<Index>)(in, out, row_of, errors);
  }
  return cudaGetLastError();
}

template <typename Index>
int ReadGpuQuantizedLookupError(const void* workspace, const Index* ids,
                                int64_t num_ids, GpuStream stream,
                                int64_t* bad_position, int64_t* bad_value) {
  *bad_position = -1;
  *bad_value = 0;
  int status = SelectStreamDevice(stream);
  if (status != cudaSuccess) return status;
  unsigned long long words[kNumErrorWords];
  status = GpuCopyToHostAndWait(words, workspace, sizeof(words), stream);
  if (status != cudaSuccess) return status;
  if (words[kBadId] != kNoBadPosition) {
    *bad_position = static_cast<int64_t>(words[kBadId]);
    Index value = 0;
    status = GpuCopyToHostAndWait(&value, ids + *bad_position, sizeof(value),
                                  stream);
    *bad_value = static_cast<int64_t>(value);
  } else if (words[kBadStoreIndex] != kNoBadPosition) {
    *bad_position = num_ids;
  }
  return status;
}

#define PE_INSTANTIATE(Index)                                       \
  template int QuantizedLookupGpuAsync<Index>(                      \
      const QuantizedLookupInputs<Index>&, float*, int32_t*, void*, \
      GpuStream);                                                   \
  template int ReadGpuQuantizedLookupError<Index>(                  \
      const void*, const Index*, int64_t, GpuStream, int64_t*, int64_t*);
PE_FOR_EACH_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE

}  // namespace partial_embedding
