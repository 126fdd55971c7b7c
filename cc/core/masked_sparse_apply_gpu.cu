// CUDA implementation of the TF-free MaskedSparseApplyAdam core. The step and
// the algorithm are described in masked_sparse_apply_gpu.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "cc/core/adam_rule.h"
#include "cc/core/gpu_device_common.cuh"
#include "cc/core/gpu_launch.h"
#include "cc/core/masked_sparse_apply_gpu.h"

namespace partial_embedding {
namespace {

using gpu::kFullWarp;
using gpu::kNoBadPosition;
using gpu::kWarpSize;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kCheckThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
constexpr int kPiece = static_cast<int>(kGpuAdamPieceSize);
static_assert(kPiece == kWarpSize, "a piece's positions are one per lane");
// Gradient rows loaded ahead of their use in one warp, so several 16-byte
// loads per lane are in flight at once.
constexpr int kLoadsInFlight = 4;
// Pieces' sums loaded ahead in the warp that finishes a hot row: a Zipf
// batch's hottest row has thousands of pieces, added one after another, and
// the loads (from L2) must overlap for that chain to keep up.
template <int VEC>
constexpr int kSumsInFlight =
    64 / VEC > 32 ? 32 : (64 / VEC < 8 ? 8 : 64 / VEC);

// The workspace's first bytes: the error words, the counters, the
// hyperparameters written from the host, then the buffers (Layout).
enum ErrorWord {
  kBadIndex = 0,       // Smallest position of an index out of range.
  kBadSlotIndex = 1,   // Smallest position of a slot index out of range.
  kRowInTwoSlots = 2,  // (position << 32) | earlier: a row's second slot row.
  kSlotOfTwoRows = 3,  // (position << 32) | earlier: a shared slot row.
  kNumErrorWords = 4,
};
constexpr size_t kCountersOffset = kNumErrorWords * 8;  // num_hot, pieces.
constexpr size_t kNumRunsOffset = kCountersOffset + 8;
constexpr size_t kCountersBytes = 16;          // Zeroed per step.
constexpr size_t kHyperparametersOffset = 64;  // 6 values of at most 8 bytes.
static_assert(kHyperparametersOffset + 6 * 8 <= gpu::kWorkspaceAlignment,
              "the header fits before the first buffer");

// A row with more than kPiece occurrences, left to the piece kernels.
struct HotRun {
  uint32_t run;          // Its run number (index into the run arrays).
  uint32_t first_piece;  // Its pieces' sums are partials[first_piece ...].
  uint32_t num_pieces;
};

// ---------------------------------------------------------------------------
// The arithmetic of the shared step (adam_rule.h): one IEEE operation each,
// rounded to nearest, never contracted.

template <typename C>
struct Exact;
template <>
struct Exact<float> {
  static __device__ __forceinline__ float Add(float a, float b) {
    return __fadd_rn(a, b);
  }
  static __device__ __forceinline__ float Sub(float a, float b) {
    return __fsub_rn(a, b);
  }
  static __device__ __forceinline__ float Mul(float a, float b) {
    return __fmul_rn(a, b);
  }
  static __device__ __forceinline__ float Div(float a, float b) {
    return __fdiv_rn(a, b);
  }
  static __device__ __forceinline__ float Sqrt(float a) {
    return __fsqrt_rn(a);
  }
};
template <>
struct Exact<double> {
  static __device__ __forceinline__ double Add(double a, double b) {
    return __dadd_rn(a, b);
  }
  static __device__ __forceinline__ double Sub(double a, double b) {
    return __dsub_rn(a, b);
  }
  static __device__ __forceinline__ double Mul(double a, double b) {
    return __dmul_rn(a, b);
  }
  static __device__ __forceinline__ double Div(double a, double b) {
    return __ddiv_rn(a, b);
  }
  static __device__ __forceinline__ double Sqrt(double a) {
    return __dsqrt_rn(a);
  }
};

// The hyperparameters in the compute type, read from the device.
template <typename T>
__device__ __forceinline__ AdamConstants<T> ConstantsOf(
    const AdamHyperparameterPointers<T>& hyper) {
  return AdamConstants<T>(*hyper.learning_rate, *hyper.one_minus_beta_1,
                          *hyper.one_minus_beta_2, *hyper.epsilon, *hyper.alpha,
                          *hyper.weight_decay);
}

// The step on VEC elements of row `row` of var and row `slot_row` of the
// slots, from column `col`, given their summed gradient: the CPU core's
// UpdateRow, operation for operation.
template <typename T, int VEC, bool kAmsgrad>
__device__ __forceinline__ void UpdateSlice(
    const AdamTables<T>& tables, int64_t row, int64_t slot_row, int64_t col,
    const typename Arith<T>::Compute (&g)[VEC], const AdamConstants<T>& k) {
  T* var = tables.var + row * tables.row_size + col;
  T* m = tables.m + slot_row * tables.row_size + col;
  T* v = tables.v + slot_row * tables.row_size + col;
  T var_in[VEC], m_in[VEC], v_in[VEC], v_hat_in[VEC];
  gpu::LoadVector<T, VEC>(var, var_in);
  gpu::LoadVector<T, VEC>(m, m_in);
  gpu::LoadVector<T, VEC>(v, v_in);
  if constexpr (kAmsgrad) {
    gpu::LoadVector<T, VEC>(tables.v_hat + slot_row * tables.row_size + col,
                            v_hat_in);
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    AdamElementStep<T, Exact<typename Arith<T>::Compute>, kAmsgrad>(
        g[i], k, var_in[i], m_in[i], v_in[i], v_hat_in + i);
  }
  gpu::StoreVector<T, VEC>(m, m_in);
  gpu::StoreVector<T, VEC>(v, v_in);
  if constexpr (kAmsgrad) {
    gpu::StoreVector<T, VEC>(tables.v_hat + slot_row * tables.row_size + col,
                             v_hat_in);
  }
  gpu::StoreVector<T, VEC>(var, var_in);
}

// Adds to g the gradient rows at the positions one per lane (lanes
// [0, count), count <= 32), in lane order, rounding after each addition.
template <typename T, int VEC>
__device__ __forceinline__ void SumPiece(const T* __restrict__ gradient,
                                         int64_t row_size, int64_t col,
                                         bool active, uint32_t my_position,
                                         int count,
                                         typename Arith<T>::Compute (&g)[VEC]) {
  using A = Arith<T>;
  using E = Exact<typename A::Compute>;
  for (int t = 0; t < count; t += kLoadsInFlight) {
    T loaded[kLoadsInFlight][VEC];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const uint32_t position =
          __shfl_sync(kFullWarp, my_position, (t + u) % kWarpSize);
      if (active && t + u < count) {
        gpu::LoadOnce<T, VEC>(gradient + int64_t{position} * row_size + col,
                              loaded[u]);
      }
    }
    if (!active) continue;
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      if (t + u >= count) break;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        g[i] = Rounded<T>(E::Add(g[i], A::Load(loaded[u][i])));
      }
    }
  }
}

// The run arrays: run r is row unique[r] (a sentinel for the frozen and bad
// positions, which sort last), its sorted positions start at offsets[r] and
// number counts[r].
struct Runs {
  const void* unique = nullptr;
  bool wide_keys = false;
  uint64_t sentinel = 0;
  const uint32_t* counts = nullptr;
  const uint32_t* offsets = nullptr;
  const uint32_t* num_runs = nullptr;
  const uint32_t* positions = nullptr;  // Sorted.

  __device__ __forceinline__ uint64_t Row(uint32_t run) const {
    return wide_keys ? static_cast<const uint64_t*>(unique)[run]
                     : static_cast<const uint32_t*>(unique)[run];
  }
};

// Where a row's slots are: its own row, or slot_indices[first position].
struct SlotRows {
  const void* slot_indices = nullptr;  // Null: full-size slots.
  bool wide = false;                   // int64 slot indices.

  __device__ __forceinline__ int64_t Of(uint64_t row,
                                        uint32_t first_position) const {
    if (slot_indices == nullptr) return static_cast<int64_t>(row);
    return wide ? static_cast<const int64_t*>(slot_indices)[first_position]
                : static_cast<const int32_t*>(slot_indices)[first_position];
  }
};

// The rows with more than kPiece occurrences and their pieces' sums.
template <typename Acc>
struct HotRows {
  uint32_t* num_hot = nullptr;
  uint32_t* num_pieces = nullptr;
  HotRun* runs = nullptr;
  uint32_t* piece_owner = nullptr;  // The hot run of each piece.
  Acc* partials = nullptr;          // [pieces, row_size].
};

__device__ __forceinline__ bool Refused(
    const unsigned long long* __restrict__ errors) {
  return (errors[kBadIndex] & errors[kBadSlotIndex] & errors[kRowInTwoSlots] &
          errors[kSlotOfTwoRows]) != kNoBadPosition;
}

// One warp per distinct permitted row: sums its gradient rows and applies the
// step, or, for a hot row, records its pieces for the kernels below.
template <typename T, int VEC, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads)
    ApplyRunsKernel(AdamTables<T> tables, const T* __restrict__ gradient,
                    AdamHyperparameterPointers<T> hyper, Runs runs,
                    SlotRows slots, HotRows<typename Arith<T>::Compute> hot,
                    const unsigned long long* __restrict__ errors) {
  using C = typename Arith<T>::Compute;
  if (Refused(errors)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t num_warps = int64_t{gridDim.x} * kWarpsPerBlock;
  const uint32_t num_runs = *runs.num_runs;
  const AdamConstants<T> constants = ConstantsOf(hyper);
  for (int64_t run =
           (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarpSize;
       run < num_runs; run += num_warps) {
    const uint64_t row = runs.Row(static_cast<uint32_t>(run));
    if (row == runs.sentinel) continue;  // Uniform across the warp.
    const uint32_t start = runs.offsets[run];
    const uint32_t count = runs.counts[run];
    if (count > static_cast<uint32_t>(kPiece)) {
      const uint32_t num_pieces = (count + kPiece - 1) / kPiece;
      uint32_t index = 0;
      uint32_t first_piece = 0;
      if (lane == 0) {
        index = atomicAdd(hot.num_hot, 1u);
        first_piece = atomicAdd(hot.num_pieces, num_pieces);
        hot.runs[index] =
            HotRun{static_cast<uint32_t>(run), first_piece, num_pieces};
      }
      index = __shfl_sync(kFullWarp, index, 0);
      first_piece = __shfl_sync(kFullWarp, first_piece, 0);
      for (uint32_t piece = lane; piece < num_pieces; piece += kWarpSize) {
        hot.piece_owner[first_piece + piece] = index;
      }
      continue;
    }
    const uint32_t my_position =
        lane < static_cast<int>(count) ? runs.positions[start + lane] : 0;
    const int64_t slot_row =
        slots.Of(row, __shfl_sync(kFullWarp, my_position, 0));
    for (int64_t base = 0; base < tables.row_size; base += kWarpSize * VEC) {
      const int64_t col = base + lane * VEC;
      const bool active = col < tables.row_size;
      C g[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) g[i] = C(0);
      SumPiece<T, VEC>(gradient, tables.row_size, col, active, my_position,
                       static_cast<int>(count), g);
      if (active) {
        UpdateSlice<T, VEC, kAmsgrad>(tables, static_cast<int64_t>(row),
                                      slot_row, col, g, constants);
      }
    }
  }
}

// One warp per piece of a hot row: its sum, into partials[piece].
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    SumHotPiecesKernel(int64_t row_size, const T* __restrict__ gradient,
                       Runs runs, HotRows<typename Arith<T>::Compute> hot,
                       const unsigned long long* __restrict__ errors) {
  using C = typename Arith<T>::Compute;
  if (Refused(errors)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t num_warps = int64_t{gridDim.x} * kWarpsPerBlock;
  const uint32_t num_pieces = *hot.num_pieces;
  for (int64_t piece =
           (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarpSize;
       piece < num_pieces; piece += num_warps) {
    const HotRun owner = hot.runs[hot.piece_owner[piece]];
    const uint32_t in_run = static_cast<uint32_t>(piece) - owner.first_piece;
    const uint32_t start = runs.offsets[owner.run] + in_run * kPiece;
    const int count =
        static_cast<int>(min(static_cast<uint32_t>(kPiece),
                             runs.counts[owner.run] - in_run * kPiece));
    const uint32_t my_position =
        lane < count ? runs.positions[start + lane] : 0;
    C* out = hot.partials + piece * row_size;
    for (int64_t base = 0; base < row_size; base += kWarpSize * VEC) {
      const int64_t col = base + lane * VEC;
      const bool active = col < row_size;
      C g[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) g[i] = C(0);
      SumPiece<T, VEC>(gradient, row_size, col, active, my_position, count, g);
      if (active) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[col + i] = g[i];
      }
    }
  }
}

// One warp per hot row: adds its pieces' sums in piece order, then applies the
// step.
template <typename T, int VEC, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads)
    FinishHotRowsKernel(AdamTables<T> tables,
                        AdamHyperparameterPointers<T> hyper, Runs runs,
                        SlotRows slots, HotRows<typename Arith<T>::Compute> hot,
                        const unsigned long long* __restrict__ errors) {
  using C = typename Arith<T>::Compute;
  using E = Exact<C>;
  if (Refused(errors)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t num_warps = int64_t{gridDim.x} * kWarpsPerBlock;
  const uint32_t num_hot = *hot.num_hot;
  const AdamConstants<T> constants = ConstantsOf(hyper);
  const int64_t row_size = tables.row_size;
  for (int64_t index =
           (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarpSize;
       index < num_hot; index += num_warps) {
    const HotRun hot_run = hot.runs[index];
    const uint64_t row = runs.Row(hot_run.run);
    const int64_t slot_row =
        slots.Of(row, runs.positions[runs.offsets[hot_run.run]]);
    const C* sums = hot.partials + int64_t{hot_run.first_piece} * row_size;
    for (int64_t base = 0; base < row_size; base += kWarpSize * VEC) {
      const int64_t col = base + lane * VEC;
      if (col >= row_size) continue;
      C g[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) g[i] = C(0);
      constexpr int kAhead = kSumsInFlight<VEC>;
      uint32_t piece = 0;
      for (; piece + kAhead <= hot_run.num_pieces; piece += kAhead) {
        C loaded[kAhead][VEC];
#pragma unroll
        for (int u = 0; u < kAhead; ++u) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            loaded[u][i] = sums[int64_t{piece + u} * row_size + col + i];
          }
        }
#pragma unroll
        for (int u = 0; u < kAhead; ++u) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            g[i] = Rounded<T>(E::Add(g[i], loaded[u][i]));
          }
        }
      }
      for (; piece < hot_run.num_pieces; ++piece) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          g[i] = Rounded<T>(
              E::Add(g[i], sums[int64_t{piece} * row_size + col + i]));
        }
      }
      UpdateSlice<T, VEC, kAmsgrad>(tables, static_cast<int64_t>(row), slot_row,
                                    col, g, constants);
    }
  }
}

// The first sorted position of the run that holds sorted position i.
template <typename KeyT>
__device__ int64_t RunStart(const KeyT* __restrict__ keys, int64_t i) {
  const KeyT key = keys[i];
  int64_t low = 0;
  int64_t high = i;  // keys[high] == key.
  while (low < high) {
    const int64_t middle = low + (high - low) / 2;
    if (keys[middle] < key) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  return low;
}

__device__ __forceinline__ unsigned long long Pack(uint32_t position,
                                                   uint32_t earlier) {
  return (static_cast<unsigned long long>(position) << 32) | earlier;
}

// The slot map's checks, first half (one thread per sorted position): a
// position whose slot row differs from the previous position's of the same
// row reports itself and the row's first position (the lowest such position
// of a row is its first that disagrees with the first occurrence); each
// row's first position claims its slot row (the lowest claim wins).
template <typename Index, typename KeyT>
__global__ void __launch_bounds__(kCheckThreads)
    CheckSlotRowsKernel(const KeyT* __restrict__ keys,
                        const uint32_t* __restrict__ positions,
                        int64_t num_indices, KeyT sentinel,
                        const Index* __restrict__ slot_indices,
                        uint32_t* __restrict__ claims,
                        unsigned long long* __restrict__ errors) {
  if (errors[kBadIndex] != kNoBadPosition ||
      errors[kBadSlotIndex] != kNoBadPosition) {
    return;  // Slot indices may be out of range: claims would be too.
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       i < num_indices; i += stride) {
    const KeyT key = keys[i];
    if (key == sentinel) continue;
    const uint32_t position = positions[i];
    const Index slot_row = slot_indices[position];
    if (i == 0 || keys[i - 1] != key) {
      atomicMin(claims + slot_row, position);
    } else if (slot_indices[positions[i - 1]] != slot_row) {
      atomicMin(errors + kRowInTwoSlots,
                Pack(position, positions[RunStart(keys, i)]));
    }
  }
}

// Second half: a row's first position that lost its slot row's claim reports
// itself and the winner (the lowest such position is the first row, in order
// of first occurrence, to find its slot row taken).
template <typename Index, typename KeyT>
__global__ void __launch_bounds__(kCheckThreads)
    CheckSlotOwnersKernel(const KeyT* __restrict__ keys,
                          const uint32_t* __restrict__ positions,
                          int64_t num_indices, KeyT sentinel,
                          const Index* __restrict__ slot_indices,
                          const uint32_t* __restrict__ claims,
                          unsigned long long* __restrict__ errors) {
  if (errors[kBadIndex] != kNoBadPosition ||
      errors[kBadSlotIndex] != kNoBadPosition) {
    return;
  }
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       i < num_indices; i += stride) {
    const KeyT key = keys[i];
    if (key == sentinel || (i > 0 && keys[i - 1] == key)) continue;
    const uint32_t position = positions[i];
    const uint32_t owner = claims[slot_indices[position]];
    if (owner != position) {
      atomicMin(errors + kSlotOfTwoRows, Pack(position, owner));
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.

// Where each buffer lives in the workspace, after the header.
struct Layout {
  gpu::SortedPositionsLayout sort;
  size_t unique = 0;
  size_t counts = 0;
  size_t offsets = 0;
  size_t encode_scratch = 0;
  size_t encode_scratch_bytes = 0;
  size_t scan_scratch = 0;
  size_t scan_scratch_bytes = 0;
  size_t claims = 0;
  size_t hot_runs = 0;
  size_t piece_owner = 0;
  size_t partials = 0;
  int64_t max_hot = 0;
  int64_t max_pieces = 0;
  size_t total = gpu::kWorkspaceAlignment;
};

template <typename KeyT>
cudaError_t CubScratchBytes(int64_t num_indices, cudaStream_t stream,
                            Layout* layout) {
  const int n = static_cast<int>(num_indices);
  cudaError_t error = cub::DeviceRunLengthEncode::Encode(
      nullptr, layout->encode_scratch_bytes, static_cast<const KeyT*>(nullptr),
      static_cast<KeyT*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<uint32_t*>(nullptr), n, stream);
  if (error != cudaSuccess) return error;
  return cub::DeviceScan::ExclusiveSum(nullptr, layout->scan_scratch_bytes,
                                       static_cast<const uint32_t*>(nullptr),
                                       static_cast<uint32_t*>(nullptr), n,
                                       stream);
}

template <typename T>
cudaError_t ComputeLayout(int64_t num_rows, int64_t row_size,
                          int64_t num_indices, int64_t num_slot_rows,
                          cudaStream_t stream, Layout* layout) {
  using Acc = typename Arith<T>::Compute;
  *layout = Layout();
  if (num_indices == 0) return cudaSuccess;
  size_t offset = gpu::kWorkspaceAlignment;  // The header.
  cudaError_t error = gpu::LayOutSortedPositions(num_rows, num_indices, stream,
                                                 &offset, &layout->sort);
  if (error != cudaSuccess) return error;
  error = layout->sort.bits.wide
              ? CubScratchBytes<uint64_t>(num_indices, stream, layout)
              : CubScratchBytes<uint32_t>(num_indices, stream, layout);
  if (error != cudaSuccess) return error;
  const size_t n = static_cast<size_t>(num_indices);
  const auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset += gpu::AlignUp(bytes);
    return at;
  };
  layout->unique = take(n * (layout->sort.bits.wide ? 8 : 4));
  layout->counts = take(n * sizeof(uint32_t));
  layout->offsets = take(n * sizeof(uint32_t));
  layout->encode_scratch = take(layout->encode_scratch_bytes);
  layout->scan_scratch = take(layout->scan_scratch_bytes);
  layout->claims = take(static_cast<size_t>(num_slot_rows) * sizeof(uint32_t));
  // A hot row has more than kPiece occurrences, and ceil(count / kPiece)
  // pieces: at most n / kPiece + (number of hot rows) in all.
  layout->max_hot = num_indices / (kPiece + 1) + 1;
  layout->max_pieces = num_indices / kPiece + layout->max_hot;
  layout->hot_runs =
      take(static_cast<size_t>(layout->max_hot) * sizeof(HotRun));
  layout->piece_owner =
      take(static_cast<size_t>(layout->max_pieces) * sizeof(uint32_t));
  layout->partials = take(static_cast<size_t>(layout->max_pieces) *
                          static_cast<size_t>(row_size) * sizeof(Acc));
  layout->total = offset;
  return cudaSuccess;
}

unsigned BlocksFor(int64_t warps_or_threads, int per_block) {
  return gpu::BlocksFor(warps_or_threads, per_block, kMaxBlocks);
}

template <typename T, int VEC, bool kAmsgrad>
cudaError_t LaunchApply(const AdamTables<T>& tables, const T* gradient,
                        const AdamHyperparameterPointers<T>& hyper,
                        const Runs& runs, const SlotRows& slots,
                        const HotRows<typename Arith<T>::Compute>& hot,
                        const Layout& layout, int64_t num_indices,
                        const unsigned long long* errors, cudaStream_t stream) {
  PE_LAUNCH(BlocksFor(num_indices, kWarpsPerBlock), kThreads, 0, stream,
            ApplyRunsKernel<T, VEC, kAmsgrad>)(tables, gradient, hyper, runs,
                                               slots, hot, errors);
  PE_LAUNCH(BlocksFor(layout.max_pieces, kWarpsPerBlock), kThreads, 0, stream,
            SumHotPiecesKernel<T, VEC>)(tables.row_size, gradient, runs, hot,
                                        errors);
  PE_LAUNCH(BlocksFor(layout.max_hot, kWarpsPerBlock), kThreads, 0, stream,
            FinishHotRowsKernel<T, VEC, kAmsgrad>)(tables, hyper, runs, slots,
                                                   hot, errors);
  return cudaGetLastError();
}

template <typename T, typename Index, typename KeyT>
cudaError_t Run(const AdamTables<T>& tables, const Index* indices,
                int64_t num_indices, const SlotMap<Index>& slot_map,
                const T* gradient, const bool* row_mask,
                const AdamHyperparameterPointers<T>& hyper,
                const Layout& layout, char* workspace, cudaStream_t stream) {
  using Acc = typename Arith<T>::Compute;
  auto* errors = reinterpret_cast<unsigned long long*>(workspace);
  const KeyT sentinel = static_cast<KeyT>(tables.num_rows);
  const KeyT* keys = nullptr;
  const uint32_t* positions = nullptr;
  cudaError_t error = gpu::ValidateAndSortPositions<Index, KeyT>(
      layout.sort, workspace, indices, num_indices, tables.num_rows, row_mask,
      errors + kBadIndex, slot_map.slot_indices, slot_map.num_slot_rows,
      errors + kBadSlotIndex, /*validate_only=*/false, stream, &keys,
      &positions);
  if (error != cudaSuccess) return error;

  auto* unique = reinterpret_cast<KeyT*>(workspace + layout.unique);
  auto* counts = reinterpret_cast<uint32_t*>(workspace + layout.counts);
  auto* offsets = reinterpret_cast<uint32_t*>(workspace + layout.offsets);
  auto* num_runs = reinterpret_cast<uint32_t*>(workspace + kNumRunsOffset);
  const int n = static_cast<int>(num_indices);
  // The scan below reads every count: the ones past the last run are zero.
  error = cudaMemsetAsync(counts, 0, num_indices * sizeof(uint32_t), stream);
  if (error != cudaSuccess) return error;
  size_t scratch_bytes = layout.encode_scratch_bytes;
  error = cub::DeviceRunLengthEncode::Encode(workspace + layout.encode_scratch,
                                             scratch_bytes, keys, unique,
                                             counts, num_runs, n, stream);
  if (error != cudaSuccess) return error;
  scratch_bytes = layout.scan_scratch_bytes;
  error =
      cub::DeviceScan::ExclusiveSum(workspace + layout.scan_scratch,
                                    scratch_bytes, counts, offsets, n, stream);
  if (error != cudaSuccess) return error;

  if (slot_map.slot_indices != nullptr) {
    auto* claims = reinterpret_cast<uint32_t*>(workspace + layout.claims);
    error = cudaMemsetAsync(claims, 0xff,
                            slot_map.num_slot_rows * sizeof(uint32_t), stream);
    if (error != cudaSuccess) return error;
    const unsigned blocks = BlocksFor(num_indices, kCheckThreads);
    PE_LAUNCH(blocks, kCheckThreads, 0, stream,
              CheckSlotRowsKernel<Index, KeyT>)(keys, positions, num_indices,
                                                sentinel, slot_map.slot_indices,
                                                claims, errors);
    PE_LAUNCH(blocks, kCheckThreads, 0, stream,
              CheckSlotOwnersKernel<Index, KeyT>)(
        keys, positions, num_indices, sentinel, slot_map.slot_indices, claims,
        errors);
    error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  if (tables.row_size == 0) return cudaSuccess;

  Runs runs;
  runs.unique = unique;
  runs.wide_keys = sizeof(KeyT) == 8;
  runs.sentinel = static_cast<uint64_t>(sentinel);
  runs.counts = counts;
  runs.offsets = offsets;
  runs.num_runs = num_runs;
  runs.positions = positions;
  SlotRows slots;
  slots.slot_indices = slot_map.slot_indices;
  slots.wide = sizeof(Index) == 8;
  HotRows<Acc> hot;
  hot.num_hot = reinterpret_cast<uint32_t*>(workspace + kCountersOffset);
  hot.num_pieces = hot.num_hot + 1;
  hot.runs = reinterpret_cast<HotRun*>(workspace + layout.hot_runs);
  hot.piece_owner = reinterpret_cast<uint32_t*>(workspace + layout.piece_owner);
  hot.partials = reinterpret_cast<Acc*>(workspace + layout.partials);

  const bool wide = gpu::RowsAre16ByteAligned<T>(
      tables.row_size, {tables.var, tables.m, tables.v, gradient,
                        tables.v_hat == nullptr ? tables.var : tables.v_hat});
  auto launch = [&](auto vec, auto amsgrad) {
    return LaunchApply<T, decltype(vec)::value, decltype(amsgrad)::value>(
        tables, gradient, hyper, runs, slots, hot, layout, num_indices, errors,
        stream);
  };
  using Wide = std::integral_constant<int, gpu::kVec16<T>>;
  using Narrow = std::integral_constant<int, 1>;
  if (tables.v_hat != nullptr) {
    return wide ? launch(Wide(), std::true_type())
                : launch(Narrow(), std::true_type());
  }
  return wide ? launch(Wide(), std::false_type())
              : launch(Narrow(), std::false_type());
}

// Checks the sizes, runs on the stream's device and lays the workspace out.
template <typename T>
cudaError_t Prepare(int64_t num_rows, int64_t row_size, int64_t num_indices,
                    int64_t num_slot_rows, GpuStream stream, Layout* layout) {
  const cudaError_t error = gpu::CheckSizesOnStreamDevice(
      {num_rows, row_size, num_indices, num_slot_rows}, num_indices, stream);
  if (error != cudaSuccess) return error;
  return ComputeLayout<T>(num_rows, row_size, num_indices, num_slot_rows,
                          stream, layout);
}

}  // namespace

template <typename T>
int MaskedSparseApplyAdamGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                           int64_t num_indices,
                                           int64_t num_slot_rows,
                                           GpuStream stream, size_t* bytes) {
  return gpu::WorkspaceBytesOf<Layout>(
      [&](Layout* layout) {
        return Prepare<T>(num_rows, row_size, num_indices, num_slot_rows,
                          stream, layout);
      },
      bytes);
}

template <typename T>
int WriteGpuAdamHyperparameters(const AdamHyperparameters<T>& hyper,
                                void* workspace, GpuStream stream,
                                AdamHyperparameterPointers<T>* pointers) {
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const T values[6] = {hyper.learning_rate,
                       hyper.one_minus_beta_1,
                       hyper.one_minus_beta_2,
                       hyper.epsilon,
                       hyper.alpha,
                       hyper.weight_decay};
  T* device = reinterpret_cast<T*>(static_cast<char*>(workspace) +
                                   kHyperparametersOffset);
  const auto error = static_cast<cudaError_t>(SelectStreamDevice(stream));
  if (error != cudaSuccess) return error;
  *pointers = AdamHyperparameterPointers<T>{device,     device + 1, device + 2,
                                            device + 3, device + 4, device + 5};
  // The values are staged before the call returns (pageable host memory).
  return cudaMemcpyAsync(device, values, sizeof(values), cudaMemcpyHostToDevice,
                         stream);
}

template <typename T, typename Index>
int MaskedSparseApplyAdamGpuAsync(const AdamTables<T>& tables,
                                  const Index* indices, int64_t num_indices,
                                  const SlotMap<Index>& slot_map,
                                  const T* gradient, const bool* row_mask,
                                  const AdamHyperparameterPointers<T>& hyper,
                                  void* workspace, size_t workspace_bytes,
                                  GpuStream stream) {
  const bool compact = slot_map.slot_indices != nullptr;
  // The error words start at "none" (all ones), the counters at zero.
  Layout layout;
  const cudaError_t error = gpu::StartCall(
      workspace, workspace_bytes, kCountersOffset, kCountersBytes, stream,
      [&](Layout* out) {
        return Prepare<T>(tables.num_rows, tables.row_size, num_indices,
                          compact ? slot_map.num_slot_rows : 0, stream, out);
      },
      &layout);
  if (error != cudaSuccess || num_indices == 0) return error;
  SlotMap<Index> map = slot_map;
  if (!compact) map.num_slot_rows = 0;
  return gpu::WithSortKey(layout.sort.bits, [&](auto key) {
    return Run<T, Index, decltype(key)>(tables, indices, num_indices, map,
                                        gradient, row_mask, hyper, layout,
                                        static_cast<char*>(workspace), stream);
  });
}

template <typename Index>
int ReadGpuAdamInputError(const void* workspace, const Index* indices,
                          const Index* slot_indices, GpuStream stream,
                          AdamInputError* error, AdamErrorValues* values) {
  using Kind = AdamInputError::Kind;
  *error = AdamInputError();
  *values = AdamErrorValues();
  int status = SelectStreamDevice(stream);
  if (status != cudaSuccess) return status;
  unsigned long long words[kNumErrorWords];
  status = GpuCopyToHostAndWait(words, workspace, sizeof(words), stream);
  if (status != cudaSuccess) return status;
  if (words[kBadIndex] != kNoBadPosition) {
    error->kind = Kind::kIndexOutOfRange;
    error->position = static_cast<int64_t>(words[kBadIndex]);
  } else if (words[kBadSlotIndex] != kNoBadPosition) {
    error->kind = Kind::kSlotIndexOutOfRange;
    error->position = static_cast<int64_t>(words[kBadSlotIndex]);
  } else {
    for (const auto& [word, kind] :
         {std::pair{kRowInTwoSlots, Kind::kRowInTwoSlotRows},
          std::pair{kSlotOfTwoRows, Kind::kSlotRowOfTwoRows}}) {
      if (words[word] == kNoBadPosition) continue;
      error->kind = kind;
      error->position = static_cast<int64_t>(words[word] >> 32);
      error->earlier = static_cast<int64_t>(words[word] & 0xffffffffu);
      break;
    }
  }
  if (error->ok()) return cudaSuccess;
  const auto read = [&](const Index* data, int64_t position, int64_t* out) {
    if (data == nullptr || position < 0 || status != cudaSuccess) return;
    Index value = 0;
    status =
        GpuCopyToHostAndWait(&value, data + position, sizeof(Index), stream);
    *out = static_cast<int64_t>(value);
  };
  read(indices, error->position, &values->index_at_position);
  read(indices, error->earlier, &values->index_at_earlier);
  read(slot_indices, error->position, &values->slot_at_position);
  read(slot_indices, error->earlier, &values->slot_at_earlier);
  return status;
}

#define PE_INSTANTIATE(T, Index)                                          \
  template int MaskedSparseApplyAdamGpuAsync<T, Index>(                   \
      const AdamTables<T>&, const Index*, int64_t, const SlotMap<Index>&, \
      const T*, const bool*, const AdamHyperparameterPointers<T>&, void*, \
      size_t, GpuStream);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE
#define PE_INSTANTIATE_TYPE(T)                                               \
  template int MaskedSparseApplyAdamGpuWorkspaceBytes<T>(                    \
      int64_t, int64_t, int64_t, int64_t, GpuStream, size_t*);               \
  template int WriteGpuAdamHyperparameters<T>(const AdamHyperparameters<T>&, \
                                              void*, GpuStream,              \
                                              AdamHyperparameterPointers<T>*);
PE_FOR_EACH_CORE_TYPE(PE_INSTANTIATE_TYPE)
#undef PE_INSTANTIATE_TYPE
#define PE_INSTANTIATE_READ(Index)                                         \
  template int ReadGpuAdamInputError<Index>(                               \
      const void*, const Index*, const Index*, GpuStream, AdamInputError*, \
      AdamErrorValues*);
PE_FOR_EACH_INDEX_TYPE(PE_INSTANTIATE_READ)
#undef PE_INSTANTIATE_READ

}  // namespace partial_embedding
