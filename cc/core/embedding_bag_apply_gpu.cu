// CUDA implementation of the fused bag backward + rule step: host code that
// chains the bag gradient's values call and the rule step on one stream, and
// the compact slots' slot rows (the design is described in
// embedding_bag_apply_gpu.h). Each half of the step keeps the one
// implementation its core has; the kernels here only number slot rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/device/device_scan.cuh>

#include "cc/core/embedding_bag_apply_gpu.h"
#include "cc/core/gpu_device_common.cuh"
#include "cc/core/masked_sparse_apply_gpu.h"

namespace partial_embedding {
namespace {

using gpu::AlignUp;

// Where each buffer lives in the workspace: the rule step's own workspace
// first (WriteGpuRuleHyperparameters writes into its header), then the rows
// and their summed gradients, which the step reads as its indices and
// gradient, and with compact slots each row's slot index.
struct Layout {
  size_t step_bytes = 0;
  size_t rows = 0;
  size_t values = 0;
  size_t slot_indices = 0;
  size_t total = 0;
};

template <typename T, typename Index>
cudaError_t ComputeLayout(int64_t num_rows, int64_t row_size,
                          int64_t num_groups, int64_t num_slot_rows,
                          GpuStream stream, Layout* layout) {
  *layout = Layout();
  if (num_rows < 0 || row_size < 0 || num_groups < 0 || num_slot_rows < 0) {
    return cudaErrorInvalidValue;
  }
  const auto error =
      static_cast<cudaError_t>(MaskedSparseApplyRuleGpuWorkspaceBytes<T>(
          num_rows, row_size, num_groups, num_slot_rows, stream,
          &layout->step_bytes));
  if (error != cudaSuccess) return error;
  const size_t groups = static_cast<size_t>(num_groups);
  layout->rows = AlignUp(layout->step_bytes);
  layout->values = layout->rows + AlignUp(groups * sizeof(Index));
  layout->slot_indices =
      layout->values +
      AlignUp(groups * static_cast<size_t>(row_size) * sizeof(T));
  layout->total = layout->slot_indices +
                  (num_slot_rows > 0 ? AlignUp(groups * sizeof(Index)) : 0);
  return cudaSuccess;
}

// --- compact slots: the slot plan
// ---------------------------------------------

using gpu::kNoBadPosition;
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;
// The slot plan's error words: the lowest first position of a row whose map
// value is not a slot row, and the lowest (first position << 32 | owner's
// first position) of a row whose slot row an earlier row has.
constexpr int kNotASlotRowWord = 0;
constexpr int kSharedSlotRowWord = 1;
constexpr size_t kErrorBytes = 2 * sizeof(unsigned long long);
// A group's slot row while it is planned: none in the map yet, or a map value
// that is not a slot row.
constexpr int64_t kNewSlotRow = -1;
constexpr int64_t kBadSlotRow = -2;

unsigned Blocks(int64_t items) {
  return gpu::BlocksFor(items, kThreads, kMaxBlocks);
}

// Where the slot plan keeps its buffers, after the error words. The groups'
// slot rows come first, at a place the step finds without the sizes.
struct SlotLayout {
  size_t slot_rows = gpu::kWorkspaceAlignment;  // int64_t [groups]
  size_t rows = 0;                              // Index [groups]
  size_t first_positions = 0;                   // uint32_t [groups]
  size_t is_new = 0;                            // uint32_t [positions + 1]
  size_t new_rank = 0;                          // uint32_t [positions + 1]
  size_t slot_at = 0;                           // int64_t [positions]
  size_t owner = 0;                             // uint32_t [owner_rows]
  size_t scan_scratch = 0;
  size_t scan_scratch_bytes = 0;
  int64_t owner_rows = 0;
  size_t total = 0;
};

template <typename Index>
cudaError_t ComputeSlotLayout(int64_t num_positions, int64_t num_groups,
                              int64_t num_slot_rows, int64_t rows_used,
                              GpuStream stream, SlotLayout* layout) {
  *layout = SlotLayout();
  const cudaError_t error = gpu::CheckSizesOnStreamDevice(
      {num_positions, num_groups, num_slot_rows, rows_used}, num_positions + 1,
      stream);
  if (error != cudaSuccess) return error;
  if (num_groups > num_positions) return cudaErrorInvalidValue;
  const auto scan = cub::DeviceScan::ExclusiveSum(
      nullptr, layout->scan_scratch_bytes,
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<int>(num_positions + 1), stream);
  if (scan != cudaSuccess) return scan;
  // Every slot row a group can name: the map's (below num_slot_rows) and the
  // new ones (below rows_used + num_groups).
  layout->owner_rows = std::max(num_slot_rows, rows_used + num_groups);
  const size_t groups = static_cast<size_t>(num_groups);
  const size_t positions = static_cast<size_t>(num_positions);
  size_t offset = layout->slot_rows + AlignUp(groups * sizeof(int64_t));
  layout->rows = offset;
  offset += AlignUp(groups * sizeof(Index));
  layout->first_positions = offset;
  offset += AlignUp(groups * sizeof(uint32_t));
  layout->is_new = offset;
  offset += AlignUp((positions + 1) * sizeof(uint32_t));
  layout->new_rank = offset;
  offset += AlignUp((positions + 1) * sizeof(uint32_t));
  layout->slot_at = offset;
  offset += AlignUp(positions * sizeof(int64_t));
  layout->owner = offset;
  offset += AlignUp(static_cast<size_t>(layout->owner_rows) * sizeof(uint32_t));
  layout->scan_scratch = offset;
  layout->total = offset + AlignUp(layout->scan_scratch_bytes);
  return cudaSuccess;
}

// Each group's slot row from the map (the CPU's test: a whole number below
// num_slot_rows, as a float), or kNewSlotRow with is_new set at its first
// position, or kBadSlotRow with the lowest such first position recorded.
template <typename Index>
__global__ void __launch_bounds__(kThreads)
    LookUpSlotRowsKernel(const float* __restrict__ slot_of_row,
                         const Index* __restrict__ rows,
                         const uint32_t* __restrict__ first_positions,
                         int64_t num_groups, int64_t num_slot_rows,
                         int64_t* __restrict__ slot_rows,
                         uint32_t* __restrict__ is_new,
                         unsigned long long* __restrict__ errors) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       g < num_groups; g += stride) {
    const float value = slot_of_row[static_cast<int64_t>(rows[g])];
    const uint32_t first = first_positions[g];
    if (value < 0.0f) {
      is_new[first] = 1;
      slot_rows[g] = kNewSlotRow;
    } else if (!(value < static_cast<float>(num_slot_rows)) ||
               value != floorf(value)) {
      atomicMin(errors + kNotASlotRowWord,
                static_cast<unsigned long long>(first));
      slot_rows[g] = kBadSlotRow;
    } else {
      slot_rows[g] = static_cast<int64_t>(value);
    }
  }
}

// New groups take rows_used + their rank among the new groups in order of
// first position; every group's slot row is recorded at its first position,
// and each slot row's owner is the lowest first position naming it.
__global__ void __launch_bounds__(kThreads)
    AssignSlotRowsKernel(const uint32_t* __restrict__ first_positions,
                         const uint32_t* __restrict__ new_rank,
                         int64_t num_groups, int64_t rows_used,
                         int64_t owner_rows, int64_t* __restrict__ slot_rows,
                         int64_t* __restrict__ slot_at,
                         uint32_t* __restrict__ owner) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       g < num_groups; g += stride) {
    const uint32_t first = first_positions[g];
    int64_t slot_row = slot_rows[g];
    if (slot_row == kBadSlotRow) continue;
    if (slot_row == kNewSlotRow) slot_row = rows_used + new_rank[first];
    slot_rows[g] = slot_row;
    slot_at[first] = slot_row;
    if (slot_row < owner_rows) atomicMin(owner + slot_row, first);
  }
}

// A group whose slot row a group of a lower first position owns.
__global__ void __launch_bounds__(kThreads)
    SharedSlotRowsKernel(const uint32_t* __restrict__ first_positions,
                         const int64_t* __restrict__ slot_rows,
                         int64_t num_groups, int64_t owner_rows,
                         const uint32_t* __restrict__ owner,
                         unsigned long long* __restrict__ errors) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       g < num_groups; g += stride) {
    const int64_t slot_row = slot_rows[g];
    if (slot_row < 0 || slot_row >= owner_rows) continue;
    const uint32_t first = first_positions[g];
    const uint32_t first_owner = owner[slot_row];
    if (first_owner != first) {
      atomicMin(errors + kSharedSlotRowWord,
                (static_cast<unsigned long long>(first) << 32) | first_owner);
    }
  }
}

// The map entries of the groups that took a new slot row, and the count.
template <typename Index>
__global__ void __launch_bounds__(kThreads)
    WriteSlotMapKernel(const Index* __restrict__ rows,
                       const uint32_t* __restrict__ first_positions,
                       const uint32_t* __restrict__ is_new,
                       const int64_t* __restrict__ slot_rows,
                       int64_t num_groups, int64_t rows_used_after,
                       float* __restrict__ slot_of_row,
                       int64_t* __restrict__ rows_used) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t thread = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (thread == 0) *rows_used = rows_used_after;
  for (int64_t g = thread; g < num_groups; g += stride) {
    if (is_new[first_positions[g]] != 0) {
      slot_of_row[static_cast<int64_t>(rows[g])] =
          static_cast<float>(slot_rows[g]);
    }
  }
}

// The step's slot indices (one per group) from the planned slot rows.
template <typename Index>
__global__ void __launch_bounds__(kThreads)
    SlotIndicesKernel(const int64_t* __restrict__ slot_rows, int64_t num_groups,
                      Index* __restrict__ slot_indices) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
       g < num_groups; g += stride) {
    slot_indices[g] = static_cast<Index>(slot_rows[g]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    GrowSlotFillKernel(T* __restrict__ data, int64_t count, T value) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    data[i] = value;
  }
}

template <typename Index>
int ReadIndexAt(const Index* ids, int64_t position, GpuStream stream,
                int64_t* value) {
  Index id = 0;
  const int error =
      GpuCopyToHostAndWait(&id, ids + position, sizeof(id), stream);
  *value = static_cast<int64_t>(id);
  return error;
}

}  // namespace

template <typename Index>
int EmbeddingBagSlotRowsGpuWorkspaceBytes(int64_t num_positions,
                                          int64_t num_groups,
                                          int64_t num_slot_rows,
                                          int64_t rows_used, GpuStream stream,
                                          size_t* bytes) {
  SlotLayout layout;
  const cudaError_t error = ComputeSlotLayout<Index>(
      num_positions, num_groups, num_slot_rows, rows_used, stream, &layout);
  *bytes = layout.total;
  return error;
}

template <typename Index>
int EmbeddingBagSlotRowsGpuPlan(const BagPositions<Index>& positions,
                                const float* slot_of_row, int64_t rows_used,
                                int64_t num_slot_rows, int64_t max_slot_rows,
                                int64_t num_groups, const void* plan_workspace,
                                size_t plan_workspace_bytes, void* workspace,
                                size_t workspace_bytes, GpuStream stream,
                                SlotMapPlan* plan) {
  using Kind = SlotMapPlan::Kind;
  *plan = SlotMapPlan();
  // The CPU's first check, before any group is looked at.
  if (rows_used < 0 || rows_used > max_slot_rows) {
    plan->kind = Kind::kTooManySlotRows;
    plan->needed = rows_used;
    return cudaSuccess;
  }
  plan->rows_used_after = rows_used;
  if (num_groups == 0) return cudaSuccess;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  SlotLayout layout;
  cudaError_t error =
      ComputeSlotLayout<Index>(positions.num_positions, num_groups,
                               num_slot_rows, rows_used, stream, &layout);
  if (error != cudaSuccess) return error;
  if (workspace_bytes < layout.total) return cudaErrorInvalidValue;
  char* scratch = static_cast<char*>(workspace);
  auto* errors = reinterpret_cast<unsigned long long*>(scratch);
  auto* slot_rows = reinterpret_cast<int64_t*>(scratch + layout.slot_rows);
  auto* rows = reinterpret_cast<Index*>(scratch + layout.rows);
  auto* first_positions =
      reinterpret_cast<uint32_t*>(scratch + layout.first_positions);
  auto* is_new = reinterpret_cast<uint32_t*>(scratch + layout.is_new);
  auto* new_rank = reinterpret_cast<uint32_t*>(scratch + layout.new_rank);
  auto* slot_at = reinterpret_cast<int64_t*>(scratch + layout.slot_at);
  auto* owner = reinterpret_cast<uint32_t*>(scratch + layout.owner);
  const int64_t n = positions.num_positions;
  error = gpu::ResetErrorWordsAndCounters(scratch, kErrorBytes, 0, stream);
  if (error == cudaSuccess) {
    error = cudaMemsetAsync(is_new, 0, (n + 1) * sizeof(uint32_t), stream);
  }
  if (error == cudaSuccess) {
    error = cudaMemsetAsync(owner, 0xff, layout.owner_rows * sizeof(uint32_t),
                            stream);
  }
  if (error != cudaSuccess) return error;
  error = static_cast<cudaError_t>(EmbeddingBagGradGpuGroupHeads<Index>(
      positions, num_groups, plan_workspace, plan_workspace_bytes, rows,
      first_positions, stream));
  if (error != cudaSuccess) return error;
  PE_LAUNCH(Blocks(num_groups), kThreads, 0, stream,
            LookUpSlotRowsKernel<Index>)(slot_of_row, rows, first_positions,
                                         num_groups, num_slot_rows, slot_rows,
                                         is_new, errors);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  size_t scan_bytes = layout.scan_scratch_bytes;
  error = cub::DeviceScan::ExclusiveSum(scratch + layout.scan_scratch,
                                        scan_bytes, is_new, new_rank,
                                        static_cast<int>(n + 1), stream);
  if (error != cudaSuccess) return error;
  PE_LAUNCH(Blocks(num_groups), kThreads, 0, stream, AssignSlotRowsKernel)(
      first_positions, new_rank, num_groups, rows_used, layout.owner_rows,
      slot_rows, slot_at, owner);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  PE_LAUNCH(Blocks(num_groups), kThreads, 0, stream, SharedSlotRowsKernel)(
      first_positions, slot_rows, num_groups, layout.owner_rows, owner, errors);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  unsigned long long words[2] = {kNoBadPosition, kNoBadPosition};
  uint32_t num_new = 0;
  error = cudaMemcpyAsync(words, errors, sizeof(words), cudaMemcpyDeviceToHost,
                          stream);
  if (error == cudaSuccess) {
    error = cudaMemcpyAsync(&num_new, new_rank + n, sizeof(num_new),
                            cudaMemcpyDeviceToHost, stream);
  }
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (error != cudaSuccess) return error;
  // The CPU's checks in its order: a map value that is not a slot row (its
  // lowest group), too many slot rows, then a slot row of two rows.
  if (words[kNotASlotRowWord] != kNoBadPosition) {
    plan->kind = Kind::kNotASlotRow;
    float value = 0.0f;
    error = static_cast<cudaError_t>(ReadIndexAt(
        positions.ids, static_cast<int64_t>(words[kNotASlotRowWord]), stream,
        &plan->row));
    if (error == cudaSuccess) {
      error = static_cast<cudaError_t>(GpuCopyToHostAndWait(
          &value, slot_of_row + plan->row, sizeof(value), stream));
    }
    plan->map_value = static_cast<double>(value);
    plan->rows_used_after = 0;
    return error;
  }
  const int64_t next = rows_used + static_cast<int64_t>(num_new);
  if (next > max_slot_rows) {
    plan->kind = Kind::kTooManySlotRows;
    plan->needed = next;
    plan->rows_used_after = 0;
    return cudaSuccess;
  }
  if (words[kSharedSlotRowWord] != kNoBadPosition) {
    const int64_t position =
        static_cast<int64_t>(words[kSharedSlotRowWord] >> 32);
    const int64_t owner_position =
        static_cast<int64_t>(words[kSharedSlotRowWord] & 0xffffffffull);
    plan->kind = Kind::kSlotRowOfTwoRows;
    plan->rows_used_after = 0;
    error = static_cast<cudaError_t>(
        ReadIndexAt(positions.ids, position, stream, &plan->row));
    if (error == cudaSuccess) {
      error = static_cast<cudaError_t>(
          ReadIndexAt(positions.ids, owner_position, stream, &plan->other_row));
    }
    if (error == cudaSuccess) {
      error = static_cast<cudaError_t>(GpuCopyToHostAndWait(
          &plan->slot_row, slot_at + position, sizeof(plan->slot_row), stream));
    }
    return error;
  }
  plan->rows_used_after = next;
  return cudaSuccess;
}

template <typename Index>
int EmbeddingBagWriteSlotMapGpu(int64_t num_positions, int64_t num_groups,
                                int64_t rows_used_after, const void* workspace,
                                size_t workspace_bytes, float* slot_of_row,
                                int64_t* rows_used, GpuStream stream) {
  const auto selected = static_cast<cudaError_t>(SelectStreamDevice(stream));
  if (selected != cudaSuccess) return selected;
  if (num_groups == 0) {
    return cudaMemcpyAsync(rows_used, &rows_used_after, sizeof(int64_t),
                           cudaMemcpyHostToDevice, stream);
  }
  // The layout's offsets before the owner array do not depend on the slot
  // rows: any count gives them.
  SlotLayout layout;
  const cudaError_t error = ComputeSlotLayout<Index>(num_positions, num_groups,
                                                     0, 0, stream, &layout);
  if (error != cudaSuccess) return error;
  if (workspace == nullptr || workspace_bytes < layout.owner) {
    return cudaErrorInvalidValue;
  }
  const char* scratch = static_cast<const char*>(workspace);
  PE_LAUNCH(Blocks(num_groups), kThreads, 0, stream, WriteSlotMapKernel<Index>)(
      reinterpret_cast<const Index*>(scratch + layout.rows),
      reinterpret_cast<const uint32_t*>(scratch + layout.first_positions),
      reinterpret_cast<const uint32_t*>(scratch + layout.is_new),
      reinterpret_cast<const int64_t*>(scratch + layout.slot_rows), num_groups,
      rows_used_after, slot_of_row, rows_used);
  return cudaGetLastError();
}

template <typename T>
int GrowSlotGpu(const T* old, int64_t old_count, T* grown, int64_t new_count,
                T initial, GpuStream stream) {
  if (old_count < 0 || new_count < old_count) return cudaErrorInvalidValue;
  const auto selected = static_cast<cudaError_t>(SelectStreamDevice(stream));
  if (selected != cudaSuccess) return selected;
  if (old_count > 0) {
    const cudaError_t error = cudaMemcpyAsync(grown, old, old_count * sizeof(T),
                                              cudaMemcpyDeviceToDevice, stream);
    if (error != cudaSuccess) return error;
  }
  if (new_count == old_count) return cudaSuccess;
  PE_LAUNCH(Blocks(new_count - old_count), kThreads, 0, stream,
            GrowSlotFillKernel<T>)(grown + old_count, new_count - old_count,
                                   initial);
  return cudaGetLastError();
}

template <typename T, typename Index>
int EmbeddingBagApplyRuleGpuWorkspaceBytes(int64_t num_rows, int64_t row_size,
                                           int64_t num_groups,
                                           int64_t num_slot_rows,
                                           GpuStream stream, size_t* bytes) {
  Layout layout;
  const cudaError_t error = ComputeLayout<T, Index>(
      num_rows, row_size, num_groups, num_slot_rows, stream, &layout);
  *bytes = layout.total;
  return error;
}

template <typename T, typename Index>
int EmbeddingBagApplyRuleGpuAsync(
    Rule rule, const RuleTables<T>& tables, const T* grad,
    const BagPositions<Index>& positions,
    const typename Arith<T>::Compute* factors, const bool* row_mask,
    const T* hyperparameters, int64_t num_groups, const void* plan_workspace,
    size_t plan_workspace_bytes, void* workspace, size_t workspace_bytes,
    GpuStream stream, const BagSlotRows& slot_rows) {
  // The plan grouped ids of a table of positions.num_rows rows: the step
  // must write that table.
  const bool compact = slot_rows.workspace != nullptr;
  if (positions.num_rows != tables.num_rows ||
      static_cast<uint32_t>(rule) >= static_cast<uint32_t>(kNumRules) ||
      (compact && slot_rows.num_slot_rows <= 0)) {
    return cudaErrorInvalidValue;
  }
  if (num_groups == 0 || tables.row_size == 0) return cudaSuccess;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const int64_t num_slot_rows = compact ? slot_rows.num_slot_rows : 0;
  Layout layout;
  cudaError_t error =
      ComputeLayout<T, Index>(tables.num_rows, tables.row_size, num_groups,
                              num_slot_rows, stream, &layout);
  if (error != cudaSuccess) return error;
  if (workspace_bytes < layout.total) return cudaErrorInvalidValue;
  char* scratch = static_cast<char*>(workspace);
  auto* rows = reinterpret_cast<Index*>(scratch + layout.rows);
  auto* values = reinterpret_cast<T*>(scratch + layout.values);
  error = static_cast<cudaError_t>(EmbeddingBagGradGpuValues<T, Index>(
      grad, tables.row_size, positions, factors, num_groups, plan_workspace,
      plan_workspace_bytes, rows, values, stream));
  if (error != cudaSuccess) return error;
  SlotMap<Index> slot_map;
  if (compact) {
    // The slot plan's slot rows lie at its first buffer, one per group in
    // the order the values call writes the rows.
    SlotLayout slot_layout;
    if (slot_rows.workspace_bytes <
        slot_layout.slot_rows + num_groups * sizeof(int64_t)) {
      return cudaErrorInvalidValue;
    }
    auto* slot_indices =
        reinterpret_cast<Index*>(scratch + layout.slot_indices);
    PE_LAUNCH(Blocks(num_groups), kThreads, 0, stream,
              SlotIndicesKernel<Index>)(
        reinterpret_cast<const int64_t*>(
            static_cast<const char*>(slot_rows.workspace) +
            slot_layout.slot_rows),
        num_groups, slot_indices);
    error = cudaGetLastError();
    if (error != cudaSuccess) return error;
    slot_map.slot_indices = slot_indices;
    slot_map.num_slot_rows = num_slot_rows;
  }
  // The rows are distinct, in range and permitted, and their slot rows
  // distinct and in range: the step's own checks pass, so nobody needs to
  // read its error words.
  return MaskedSparseApplyRuleGpuAsync<T, Index>(
      rule, tables, rows, num_groups, slot_map, values, row_mask,
      hyperparameters, workspace, layout.step_bytes, stream);
}

#define PE_INSTANTIATE(T, Index)                                         \
  template int EmbeddingBagApplyRuleGpuWorkspaceBytes<T, Index>(         \
      int64_t, int64_t, int64_t, int64_t, GpuStream, size_t*);           \
  template int EmbeddingBagApplyRuleGpuAsync<T, Index>(                  \
      Rule, const RuleTables<T>&, const T*, const BagPositions<Index>&,  \
      const typename Arith<T>::Compute*, const bool*, const T*, int64_t, \
      const void*, size_t, void*, size_t, GpuStream, const BagSlotRows&);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE

#define PE_INSTANTIATE_SLOTS(Index)                                            \
  template int EmbeddingBagSlotRowsGpuWorkspaceBytes<Index>(                   \
      int64_t, int64_t, int64_t, int64_t, GpuStream, size_t*);                 \
  template int EmbeddingBagSlotRowsGpuPlan<Index>(                             \
      const BagPositions<Index>&, const float*, int64_t, int64_t, int64_t,     \
      int64_t, const void*, size_t, void*, size_t, GpuStream, SlotMapPlan*);   \
  template int EmbeddingBagWriteSlotMapGpu<Index>(int64_t, int64_t, int64_t,   \
                                                  const void*, size_t, float*, \
                                                  int64_t*, GpuStream);
PE_FOR_EACH_INDEX_TYPE(PE_INSTANTIATE_SLOTS)
#undef PE_INSTANTIATE_SLOTS

#define PE_INSTANTIATE_GROW(T) \
  template int GrowSlotGpu<T>(const T*, int64_t, T*, int64_t, T, GpuStream);
PE_FOR_EACH_CORE_TYPE(PE_INSTANTIATE_GROW)
#undef PE_INSTANTIATE_GROW

}  // namespace partial_embedding
