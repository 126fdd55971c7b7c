// CUDA implementation of the TF-free MaskedSparseApplyRule core: the CUDA
// skeleton that applies any rule of the table (row_rules.h). The step and the
// algorithm are described in masked_sparse_apply_gpu.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "cc/core/gpu_device_common.cuh"
#include "cc/core/gpu_launch.h"
#include "cc/core/masked_sparse_apply_gpu.h"
#include "cc/core/row_rules.h"

namespace partial_embedding {
namespace {

using gpu::kFullWarp;
using gpu::kNoBadPosition;
using gpu::kWarpSize;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr int kCheckThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
constexpr int kPiece = static_cast<int>(kGpuRulePieceSize);
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
constexpr size_t kCountersBytes = 16;  // Zeroed per step.
constexpr size_t kHyperparametersOffset = 64;
static_assert(kHyperparametersOffset + kMaxHyperparameters * 8 <=
                  gpu::kWorkspaceAlignment,
              "the header fits before the first buffer");

// A row with more than kPiece occurrences, left to the piece kernels.
struct HotRun {
  uint32_t run;          // Its run number (index into the run arrays).
  uint32_t first_piece;  // Its pieces' sums are partials[first_piece ...].
  uint32_t num_pieces;
};

// ---------------------------------------------------------------------------
// The rules' arithmetic (row_rules.h's Ops): one IEEE operation each, rounded
// to nearest, never contracted.
#define PE_DEVICE static __device__ __forceinline__
struct Exact {
  PE_DEVICE float Add(float a, float b) { return __fadd_rn(a, b); }
  PE_DEVICE double Add(double a, double b) { return __dadd_rn(a, b); }
  PE_DEVICE float Sub(float a, float b) { return __fsub_rn(a, b); }
  PE_DEVICE double Sub(double a, double b) { return __dsub_rn(a, b); }
  PE_DEVICE float Mul(float a, float b) { return __fmul_rn(a, b); }
  PE_DEVICE double Mul(double a, double b) { return __dmul_rn(a, b); }
  PE_DEVICE float Div(float a, float b) { return __fdiv_rn(a, b); }
  PE_DEVICE double Div(double a, double b) { return __ddiv_rn(a, b); }
  PE_DEVICE float Sqrt(float a) { return __fsqrt_rn(a); }
  PE_DEVICE double Sqrt(double a) { return __dsqrt_rn(a); }
  // CUDA's pow: within 4 ulp (powf) and 2 ulp (pow), not rounded once.
  PE_DEVICE float Pow(float a, float b) { return powf(a, b); }
  PE_DEVICE double Pow(double a, double b) { return pow(a, b); }
};
#undef PE_DEVICE

// What device code reads of kRule's row of the table, as constants (the
// table itself, with its strings, stays on the host): its hyperparameter
// count, and bit s set where slot s is per element.
constexpr unsigned PerElementSlots(const RuleInfo& info) {
  unsigned bits = 0;
  for (int s = 0; s < info.num_slots; ++s)
    bits |= info.per_row[s] ? 0 : 1u << s;
  return bits;
}
template <Rule kRule>
constexpr int kNumHyperparameters =
    kRuleTable[static_cast<int>(kRule)].num_hyperparameters;
template <Rule kRule>
constexpr unsigned kPerElementSlots =
    PerElementSlots(kRuleTable[static_cast<int>(kRule)]);
static_assert(kMaxSlots == 3, "UpdateSlice names each slot");

// The rule's hyperparameters in the compute type, read from the device (only
// the rule's own: the caller's vector may end there).
template <typename T, Rule kRule>
__device__ __forceinline__ RuleConstants<T> ConstantsOf(
    const T* __restrict__ hyper) {
  T values[kMaxHyperparameters] = {};
#pragma unroll
  for (int i = 0; i < kNumHyperparameters<kRule>; ++i) values[i] = hyper[i];
  return RuleConstants<T>(values);
}

// ElementStep on VEC elements of row `row` of var and row `slot_row` of the
// per-element slots, from column `col`, given their summed gradient and the
// row's statistic: the CPU skeleton's UpdateRow, operation for operation.
template <typename T, int VEC, Rule kRule>
__device__ __forceinline__ void UpdateSlice(
    const RuleTables<T>& tables, int64_t row, int64_t slot_row, int64_t col,
    const typename Arith<T>::Compute (&g)[VEC],
    typename Arith<T>::Compute statistic, const RuleConstants<T>& k) {
  constexpr unsigned kPerElement = kPerElementSlots<kRule>;
  T* var = tables.var + row * tables.row_size + col;
  T* slot[kMaxSlots] = {};
  T var_in[VEC];
  T slot_in[kMaxSlots][VEC];
  gpu::LoadVector<T, VEC>(var, var_in);
#pragma unroll
  for (int s = 0; s < kMaxSlots; ++s) {
    if (kPerElement & (1u << s)) {
      slot[s] = tables.slots[s] + slot_row * tables.row_size + col;
      gpu::LoadVector<T, VEC>(slot[s], slot_in[s]);
    }
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    T* const element[kMaxSlots] = {&slot_in[0][i], &slot_in[1][i],
                                   &slot_in[2][i]};
    ElementStep<kRule, T, Exact>(k, g[i], statistic, var_in[i], element);
  }
#pragma unroll
  for (int s = 0; s < kMaxSlots; ++s) {
    if (kPerElement & (1u << s)) gpu::StoreVector<T, VEC>(slot[s], slot_in[s]);
  }
  gpu::StoreVector<T, VEC>(var, var_in);
}

// Sets g to the sum of the gradient rows at the positions one per lane
// (lanes [0, count), count <= 32), in lane order from zero, rounding after
// each addition.
template <typename T, int VEC>
__device__ __forceinline__ void SumPiece(const T* __restrict__ gradient,
                                         int64_t row_size, int64_t col,
                                         bool active, uint32_t my_position,
                                         int count,
                                         typename Arith<T>::Compute (&g)[VEC]) {
  using A = Arith<T>;
#pragma unroll
  for (int i = 0; i < VEC; ++i) g[i] = typename A::Compute(0);
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
        g[i] = Rounded<T>(Exact::Add(g[i], A::Load(loaded[u][i])));
      }
    }
  }
}

// Sets g to the sum of a hot row's pieces' sums (`sums`, [num_pieces,
// row_size]) at VEC columns from `col`, in piece order from zero, rounding
// after each addition.
template <typename T, int VEC>
__device__ __forceinline__ void AddPieceSums(
    const typename Arith<T>::Compute* __restrict__ sums, int64_t row_size,
    uint32_t num_pieces, int64_t col, bool active,
    typename Arith<T>::Compute (&g)[VEC]) {
  using C = typename Arith<T>::Compute;
  constexpr int kAhead = kSumsInFlight<VEC>;
#pragma unroll
  for (int i = 0; i < VEC; ++i) g[i] = C(0);
  for (uint32_t piece = 0; active && piece < num_pieces; piece += kAhead) {
    C loaded[kAhead][VEC];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        loaded[u][i] = piece + u < num_pieces
                           ? sums[int64_t{piece + u} * row_size + col + i]
                           : C(0);
      }
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        if (piece + u < num_pieces) {
          g[i] = Rounded<T>(Exact::Add(g[i], loaded[u][i]));
        }
      }
    }
  }
}

// kRule on row `row` of var and `slot_row` of the slots, by one warp.
// sum(col, active, g) sets g to the summed gradient of the VEC columns from
// col (every lane calls it; active is false past the row's end). A row-wise
// rule first reduces g * g over the row, as the CPU skeleton does but in a
// tree (see masked_sparse_apply_gpu.h); a row wider than one pass of the warp
// has its gradient summed again for the step.
template <typename T, int VEC, Rule kRule, typename Sum>
__device__ __forceinline__ void ApplyRow(const RuleTables<T>& tables,
                                         int64_t row, int64_t slot_row,
                                         const RuleConstants<T>& k, int lane,
                                         const Sum& sum) {
  using C = typename Arith<T>::Compute;
  constexpr int64_t kPass = kWarpSize * VEC;
  const int64_t row_size = tables.row_size;
  C g[VEC] = {};  // Set by sum(); zeroed for GCC's -Wmaybe-uninitialized
                  // (emulator builds).
  C statistic = C(0);
  if constexpr (IsRowwise(kRule)) {
    C squares = C(0);
    for (int64_t base = 0; base < row_size; base += kPass) {
      const int64_t col = base + lane * VEC;
      sum(col, col < row_size, g);
      if (col >= row_size) continue;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        squares = Exact::Add(squares, Rounded<T>(Exact::Mul(g[i], g[i])));
      }
    }
    // Every lane ends with the same bits: each step adds a pair both ways.
#pragma unroll
    for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) {
      squares = Exact::Add(squares, __shfl_xor_sync(kFullWarp, squares, lanes));
    }
    const C mean_square =
        Rounded<T>(Exact::Div(squares, static_cast<C>(row_size)));
    // The per-row slot: a row-wise rule's last.
    constexpr int kRowSlot = kRuleTable[static_cast<int>(kRule)].num_slots - 1;
    if (lane == 0) {
      statistic = RowStatistic<kRule, T, Exact>(
          k, mean_square, tables.slots[kRowSlot] + slot_row);
    }
    statistic = __shfl_sync(kFullWarp, statistic, 0);
  }
  for (int64_t base = 0; base < row_size; base += kPass) {
    const int64_t col = base + lane * VEC;
    if (!IsRowwise(kRule) || row_size > kPass) sum(col, col < row_size, g);
    if (col < row_size) {
      UpdateSlice<T, VEC, kRule>(tables, row, slot_row, col, g, statistic, k);
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
// rule, or, for a hot row, records its pieces for SumHotPiecesKernel. With
// `hot_pass`, one warp per hot row instead: adds its pieces' sums in piece
// order and applies the rule.
template <typename T, int VEC, Rule kRule>
__global__ void __launch_bounds__(kThreads)
    ApplyRowsKernel(RuleTables<T> tables, const T* __restrict__ gradient,
                    const T* __restrict__ hyper, Runs runs, SlotRows slots,
                    HotRows<typename Arith<T>::Compute> hot, bool hot_pass,
                    const unsigned long long* __restrict__ errors) {
  using C = typename Arith<T>::Compute;
  if (Refused(errors)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t num_warps = int64_t{gridDim.x} * kWarpsPerBlock;
  const uint32_t num_items = hot_pass ? *hot.num_hot : *runs.num_runs;
  const RuleConstants<T> k = ConstantsOf<T, kRule>(hyper);
  const int64_t row_size = tables.row_size;
  for (int64_t item =
           (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarpSize;
       item < num_items; item += num_warps) {
    if (hot_pass) {
      const HotRun hot_run = hot.runs[item];
      const int64_t row = static_cast<int64_t>(runs.Row(hot_run.run));
      const C* sums = hot.partials + int64_t{hot_run.first_piece} * row_size;
      ApplyRow<T, VEC, kRule>(
          tables, row, slots.Of(row, runs.positions[runs.offsets[hot_run.run]]),
          k, lane, [&](int64_t col, bool active, C(&g)[VEC]) {
            AddPieceSums<T, VEC>(sums, row_size, hot_run.num_pieces, col,
                                 active, g);
          });
      continue;
    }
    const uint64_t row = runs.Row(static_cast<uint32_t>(item));
    if (row == runs.sentinel) continue;  // Uniform across the warp.
    const uint32_t start = runs.offsets[item];
    const uint32_t count = runs.counts[item];
    if (count > static_cast<uint32_t>(kPiece)) {
      const uint32_t num_pieces = (count + kPiece - 1) / kPiece;
      uint32_t index = 0;
      uint32_t first_piece = 0;
      if (lane == 0) {
        index = atomicAdd(hot.num_hot, 1u);
        first_piece = atomicAdd(hot.num_pieces, num_pieces);
        hot.runs[index] =
            HotRun{static_cast<uint32_t>(item), first_piece, num_pieces};
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
    ApplyRow<T, VEC, kRule>(tables, static_cast<int64_t>(row), slot_row, k,
                            lane, [&](int64_t col, bool active, C(&g)[VEC]) {
                              SumPiece<T, VEC>(gradient, row_size, col, active,
                                               my_position,
                                               static_cast<int>(count), g);
                            });
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
      SumPiece<T, VEC>(gradient, row_size, col, active, my_position, count, g);
      if (active) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[col + i] = g[i];
      }
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

// The slot map's checks, one thread per sorted position, in two launches.
// First (!owners): a position whose slot row differs from the previous
// position's of the same row reports itself and the row's first position
// (the lowest such position of a row is its first that disagrees with the
// first occurrence); each row's first position claims its slot row (the
// lowest claim wins). Then (owners): a row's first position that lost its
// slot row's claim reports itself and the winner (the lowest such position is
// the first row, in order of first occurrence, to find its slot row taken).
template <typename Index, typename KeyT>
__global__ void __launch_bounds__(kCheckThreads)
    CheckSlotMapKernel(const KeyT* __restrict__ keys,
                       const uint32_t* __restrict__ positions,
                       int64_t num_indices, KeyT sentinel,
                       const Index* __restrict__ slot_indices,
                       uint32_t* __restrict__ claims, bool owners,
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
    const bool first = i == 0 || keys[i - 1] != key;
    if (owners) {
      const uint32_t owner = first ? claims[slot_row] : position;
      if (owner != position) {
        atomicMin(errors + kSlotOfTwoRows, Pack(position, owner));
      }
    } else if (first) {
      atomicMin(claims + slot_row, position);
    } else if (slot_indices[positions[i - 1]] != slot_row) {
      atomicMin(errors + kRowInTwoSlots,
                Pack(position, positions[RunStart(keys, i)]));
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

// The rule's launches (the cold rows, the hot rows' pieces, the hot rows),
// 16 bytes a lane where var, the gradient and every per-element slot allow.
template <typename T>
cudaError_t LaunchRule(Rule rule, const RuleTables<T>& tables,
                       const T* gradient, const T* hyper, const Runs& runs,
                       const SlotRows& slots,
                       const HotRows<typename Arith<T>::Compute>& hot,
                       const Layout& layout, int64_t num_indices,
                       const unsigned long long* errors, cudaStream_t stream) {
  const RuleInfo& info = InfoOf(rule);
  const auto element_slot = [&](int s) -> const void* {
    return s < info.num_slots && !info.per_row[s] ? tables.slots[s]
                                                  : tables.var;
  };
  const bool wide = gpu::RowsAre16ByteAligned<T>(
      tables.row_size, {tables.var, gradient, element_slot(0), element_slot(1),
                        element_slot(2)});
  const auto launch = [&](auto vec, auto kind) {
    constexpr int VEC = decltype(vec)::value;
    constexpr Rule kRule = decltype(kind)::value;
    PE_LAUNCH(BlocksFor(num_indices, kWarpsPerBlock), kThreads, 0, stream,
              ApplyRowsKernel<T, VEC, kRule>)(tables, gradient, hyper, runs,
                                              slots, hot, false, errors);
    PE_LAUNCH(BlocksFor(layout.max_pieces, kWarpsPerBlock), kThreads, 0, stream,
              SumHotPiecesKernel<T, VEC>)(tables.row_size, gradient, runs, hot,
                                          errors);
    PE_LAUNCH(BlocksFor(layout.max_hot, kWarpsPerBlock), kThreads, 0, stream,
              ApplyRowsKernel<T, VEC, kRule>)(tables, gradient, hyper, runs,
                                              slots, hot, true, errors);
  };
  DispatchRule(rule, [&](auto kind) {
    if (wide) {
      launch(std::integral_constant<int, gpu::kVec16<T>>(), kind);
    } else {
      launch(std::integral_constant<int, 1>(), kind);
    }
  });
  return cudaGetLastError();
}

template <typename T, typename Index, typename KeyT>
cudaError_t Run(Rule rule, const RuleTables<T>& tables, const Index* indices,
                int64_t num_indices, const SlotMap<Index>& slot_map,
                const T* gradient, const bool* row_mask, const T* hyper,
                const Layout& layout, char* workspace, BadIndices bad_indices,
                cudaStream_t stream) {
  using Acc = typename Arith<T>::Compute;
  auto* errors = reinterpret_cast<unsigned long long*>(workspace);
  const KeyT sentinel = static_cast<KeyT>(tables.num_rows);
  const KeyT* keys = nullptr;
  const uint32_t* positions = nullptr;
  cudaError_t error = gpu::ValidateAndSortPositions<Index, KeyT>(
      layout.sort, workspace, indices, num_indices, tables.num_rows, row_mask,
      errors + kBadIndex, slot_map.slot_indices, slot_map.num_slot_rows,
      errors + kBadSlotIndex, bad_indices == BadIndices::kSkip,
      /*validate_only=*/false, stream, &keys, &positions);
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
    for (const bool owners : {false, true}) {
      PE_LAUNCH(BlocksFor(num_indices, kCheckThreads), kCheckThreads, 0, stream,
                CheckSlotMapKernel<Index, KeyT>)(
          keys, positions, num_indices, sentinel, slot_map.slot_indices, claims,
          owners, errors);
    }
    error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  if (tables.row_size == 0) return cudaSuccess;

  const Runs runs{unique,   sizeof(KeyT) == 8, static_cast<uint64_t>(sentinel),
                  counts,   offsets,           num_runs,
                  positions};
  const SlotRows slots{slot_map.slot_indices, sizeof(Index) == 8};
  auto* num_hot = reinterpret_cast<uint32_t*>(workspace + kCountersOffset);
  const HotRows<Acc> hot{
      num_hot, num_hot + 1,
      reinterpret_cast<HotRun*>(workspace + layout.hot_runs),
      reinterpret_cast<uint32_t*>(workspace + layout.piece_owner),
      reinterpret_cast<Acc*>(workspace + layout.partials)};
  return LaunchRule<T>(rule, tables, gradient, hyper, runs, slots, hot, layout,
                       num_indices, errors, stream);
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
int MaskedSparseApplyRuleGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
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
int WriteGpuRuleHyperparameters(const RuleHyperparameters<T>& hyper,
                                void* workspace, GpuStream stream,
                                const T** device) {
  if (workspace == nullptr) return cudaErrorInvalidValue;
  T* values = reinterpret_cast<T*>(static_cast<char*>(workspace) +
                                   kHyperparametersOffset);
  const auto error = static_cast<cudaError_t>(SelectStreamDevice(stream));
  if (error != cudaSuccess) return error;
  *device = values;
  // The values are staged before the call returns (pageable host memory).
  return cudaMemcpyAsync(values, hyper.values, sizeof(hyper.values),
                         cudaMemcpyHostToDevice, stream);
}

template <typename T, typename Index>
int MaskedSparseApplyRuleGpuAsync(Rule rule, const RuleTables<T>& tables,
                                  const Index* indices, int64_t num_indices,
                                  const SlotMap<Index>& slot_map,
                                  const T* gradient, const bool* row_mask,
                                  const T* hyperparameters, void* workspace,
                                  size_t workspace_bytes, GpuStream stream,
                                  BadIndices bad_indices) {
  if (static_cast<uint32_t>(rule) >= static_cast<uint32_t>(kNumRules)) {
    return cudaErrorInvalidValue;
  }
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
    return Run<T, Index, decltype(key)>(rule, tables, indices, num_indices, map,
                                        gradient, row_mask, hyperparameters,
                                        layout, static_cast<char*>(workspace),
                                        bad_indices, stream);
  });
}

template <typename Index>
int ReadGpuRuleInputError(const void* workspace, const Index* indices,
                          const Index* slot_indices, GpuStream stream,
                          RuleInputError* error, RuleErrorValues* values) {
  using Kind = RuleInputError::Kind;
  *error = RuleInputError();
  *values = RuleErrorValues();
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

#define PE_INSTANTIATE(T, Index)                                             \
  template int MaskedSparseApplyRuleGpuAsync<T, Index>(                      \
      Rule, const RuleTables<T>&, const Index*, int64_t,                     \
      const SlotMap<Index>&, const T*, const bool*, const T*, void*, size_t, \
      GpuStream, BadIndices);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE
#define PE_INSTANTIATE_TYPE(T)                                               \
  template int MaskedSparseApplyRuleGpuWorkspaceBytes<T>(                    \
      int64_t, int64_t, int64_t, int64_t, GpuStream, size_t*);               \
  template int WriteGpuRuleHyperparameters<T>(const RuleHyperparameters<T>&, \
                                              void*, GpuStream, const T**);
PE_FOR_EACH_CORE_TYPE(PE_INSTANTIATE_TYPE)
#undef PE_INSTANTIATE_TYPE
#define PE_INSTANTIATE_READ(Index)                                         \
  template int ReadGpuRuleInputError<Index>(                               \
      const void*, const Index*, const Index*, GpuStream, RuleInputError*, \
      RuleErrorValues*);
PE_FOR_EACH_INDEX_TYPE(PE_INSTANTIATE_READ)
#undef PE_INSTANTIATE_READ

}  // namespace partial_embedding
