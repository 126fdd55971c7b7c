// The GPU specializations of MaskedEmbeddingBagApplyRuleFunctor and of its
// compact-slot twin: TensorFlow's stream, the tensors' device pointers (the
// hyperparameters too: no copy to the host) and TensorFlow-allocated
// workspaces for the TF-free CUDA cores:
// the bag gradient's plan (embedding_bag_gpu.h), which checks every position
// and counts the distinct permitted rows (one synchronisation), then the
// fused step (embedding_bag_apply_gpu.h), whose workspace is sized by that
// count. With a slot map, the slot plan between them (one more
// synchronisation, and one to read the count) checks the map before any
// write; then the slots grow if full, the step runs and the map is written.
//
// No device code here: the host C++ compiler builds this file, and every CUDA
// call happens inside the cores (see masked_scatter_sub_kernels.cu.cc).
#if GOOGLE_CUDA

#include "cc/kernels/masked_embedding_bag_apply_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cc/core/embedding_bag_apply_gpu.h"
#include "cc/core/embedding_bag_gpu.h"
#include "cc/kernels/gpu_stream.h"

namespace partial_embedding {

using GPUDevice = Eigen::GpuDevice;

namespace {

constexpr char kOpName[] = "MaskedEmbeddingBagApplyRule";

// The bag gradient's plan, the first step of both functors: finds the stream
// and allocates the plan's workspace (in *plan), checks every position
// (*error: the first bad one) and counts the distinct permitted rows.
template <typename Index>
absl::Status PlanBagGradient(OpKernelContext* ctx,
                             const BagPositions<Index>& positions,
                             const bool* row_mask, GpuCall* plan,
                             int64_t* num_groups, BagInputError* error) {
  // The plan's scan runs over one more entry than there are ids.
  TF_RETURN_IF_ERROR(StartGpuCall(
      ctx, kOpName, "ids", "positions", positions.num_positions,
      kMaxGpuIndices - 1,
      [&](GpuStream stream, size_t* bytes) {
        return EmbeddingBagGradGpuWorkspaceBytes(
            positions.num_rows, positions.num_positions, stream, bytes);
      },
      plan));
  return GpuStatus(EmbeddingBagGradGpuPlan(
                       positions, row_mask, plan->workspace_data(),
                       plan->workspace_bytes, plan->stream, num_groups, error),
                   kOpName, "grouping the rows");
}

}  // namespace

template <typename T, typename Index>
struct MaskedEmbeddingBagApplyRuleFunctor<GPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const BagRuleStepArgs<T, Index>& args,
                          BagInputError* error) const {
    using CoreT = CoreOf<T>;
    *error = BagInputError();
    const BagPositions<Index>& positions = args.positions;
    GpuCall plan;
    int64_t num_groups = 0;
    TF_RETURN_IF_ERROR(PlanBagGradient(ctx, positions, args.row_mask, &plan,
                                       &num_groups, error));
    if (!error->ok() || num_groups == 0 || args.row_size == 0) {
      return absl::OkStatus();
    }
    size_t step_bytes = 0;
    TF_RETURN_IF_ERROR(
        GpuStatus(EmbeddingBagApplyRuleGpuWorkspaceBytes<CoreT, Index>(
                      args.num_rows, args.row_size, num_groups, 0, plan.stream,
                      &step_bytes),
                  kOpName, "sizing the step's workspace"));
    Tensor step;
    TF_RETURN_IF_ERROR(AllocateGpuWorkspace(ctx, step_bytes, &step));
    // Every position has passed: the buffers a reader still holds are copied
    // (on the device, in the same stream) before the step writes.
    TF_RETURN_IF_ERROR(CopySharedTables<GPUDevice>(ctx, *args.tables));
    // Both workspaces stay alive until the stream has run the step:
    // TensorFlow's GPU allocator orders their reuse on the same stream.
    return GpuStatus(
        EmbeddingBagApplyRuleGpuAsync<CoreT, Index>(
            args.rule,
            CoreTables<T>(*args.tables, args.rule, args.num_rows,
                          args.row_size),
            reinterpret_cast<const CoreT*>(args.grad), positions, args.factors,
            args.row_mask, reinterpret_cast<const CoreT*>(args.hyperparameters),
            num_groups, plan.workspace_data(), plan.workspace_bytes,
            step.data(), step_bytes, plan.stream),
        kOpName, "the GPU kernel");
  }
};

namespace {

// Replaces the value of slot variable `slot` by one of `rows` rows on the
// device: its rows first, then `initial` (the value Keras' build fills the
// slot with). Requires the lock.
template <typename T>
absl::Status GrowSlotOnGpu(OpKernelContext* ctx, Tensor* slot, int64_t rows,
                           T initial, GpuStream stream) {
  using CoreT = CoreOf<T>;
  TensorShape shape = slot->shape();
  shape.set_dim(0, rows);
  Tensor grown;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(slot->dtype(), shape, &grown));
  CoreT value;
  std::memcpy(&value, &initial, sizeof(value));
  TF_RETURN_IF_ERROR(
      GpuStatus(GrowSlotGpu<CoreT>(reinterpret_cast<const CoreT*>(slot->data()),
                                   slot->NumElements(),
                                   reinterpret_cast<CoreT*>(grown.data()),
                                   grown.NumElements(), value, stream),
                kOpName, "growing a slot"));
  *slot = grown;
  return absl::OkStatus();
}

}  // namespace

template <typename T, typename Index>
struct MaskedEmbeddingBagApplyRuleWithSlotMapFunctor<GPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const BagRuleStepArgs<T, Index>& args,
                          const T* slot_initial_values, BagInputError* error,
                          SlotMapPlan* slot_plan,
                          int64_t* num_slot_rows) const {
    using CoreT = CoreOf<T>;
    *error = BagInputError();
    *slot_plan = SlotMapPlan();
    const VariableInputs& tables = *args.tables;
    const int num_slots = InfoOf(args.rule).num_slots;
    Tensor* slot_of_row = tables.tensor(1 + num_slots);
    Tensor* rows_used = tables.tensor(2 + num_slots);
    // Without slots (plain SGD) the map's slot rows are only counted.
    int64_t slot_rows =
        num_slots > 0 ? tables.tensor(1)->dim_size(0) : kMaxBagSlotRows;
    *num_slot_rows = slot_rows;
    const BagPositions<Index>& positions = args.positions;
    GpuCall plan;
    int64_t num_groups = 0;
    TF_RETURN_IF_ERROR(PlanBagGradient(ctx, positions, args.row_mask, &plan,
                                       &num_groups, error));
    if (!error->ok()) return absl::OkStatus();
    // The count lives with the variable, on the device.
    int64_t used = 0;
    TF_RETURN_IF_ERROR(
        GpuStatus(GpuCopyToHostAndWait(&used, rows_used->data(), sizeof(used),
                                       plan.stream),
                  kOpName, "reading slot_rows_used"));
    size_t slot_bytes = 0;
    TF_RETURN_IF_ERROR(
        GpuStatus(EmbeddingBagSlotRowsGpuWorkspaceBytes<Index>(
                      positions.num_positions, num_groups, slot_rows,
                      std::clamp<int64_t>(used, 0, kMaxBagSlotRows),
                      plan.stream, &slot_bytes),
                  kOpName, "sizing the slot plan's workspace"));
    Tensor slot_workspace;
    TF_RETURN_IF_ERROR(AllocateGpuWorkspace(ctx, slot_bytes, &slot_workspace));
    TF_RETURN_IF_ERROR(GpuStatus(
        EmbeddingBagSlotRowsGpuPlan<Index>(
            positions, slot_of_row->flat<float>().data(), used, slot_rows,
            kMaxBagSlotRows, num_groups, plan.workspace_data(),
            plan.workspace_bytes, slot_workspace.data(), slot_bytes,
            plan.stream, slot_plan),
        kOpName, "planning the slot rows"));
    if (!slot_plan->ok() || num_groups == 0 || args.row_size == 0) {
      return absl::OkStatus();
    }
    // Writes from here on: every check has passed.
    const int64_t needed = slot_plan->rows_used_after;
    if (needed > slot_rows) {
      const int64_t rows = GrownSlotRows(needed, slot_rows);
      for (int i = 1; i <= num_slots; ++i) {
        TF_RETURN_IF_ERROR(GrowSlotOnGpu(ctx, tables.tensor(i), rows,
                                         slot_initial_values[i - 1],
                                         plan.stream));
      }
      slot_rows = rows;
    }
    TF_RETURN_IF_ERROR(CopySharedTables<GPUDevice>(ctx, tables));
    // A rule without slots steps var alone: nothing to map in the step.
    BagSlotRows step_slots;
    if (num_slots > 0) {
      step_slots = {slot_workspace.data(), slot_bytes, slot_rows};
    }
    size_t step_bytes = 0;
    TF_RETURN_IF_ERROR(
        GpuStatus(EmbeddingBagApplyRuleGpuWorkspaceBytes<CoreT, Index>(
                      args.num_rows, args.row_size, num_groups,
                      step_slots.num_slot_rows, plan.stream, &step_bytes),
                  kOpName, "sizing the step's workspace"));
    Tensor step;
    TF_RETURN_IF_ERROR(AllocateGpuWorkspace(ctx, step_bytes, &step));
    TF_RETURN_IF_ERROR(GpuStatus(
        EmbeddingBagApplyRuleGpuAsync<CoreT, Index>(
            args.rule,
            CoreTables<T>(tables, args.rule, args.num_rows, args.row_size),
            reinterpret_cast<const CoreT*>(args.grad), positions, args.factors,
            args.row_mask, reinterpret_cast<const CoreT*>(args.hyperparameters),
            num_groups, plan.workspace_data(), plan.workspace_bytes,
            step.data(), step_bytes, plan.stream, step_slots),
        kOpName, "the GPU kernel"));
    // The workspaces stay alive until the stream has run these: TensorFlow's
    // GPU allocator orders their reuse on the same stream.
    return GpuStatus(
        EmbeddingBagWriteSlotMapGpu<Index>(
            positions.num_positions, num_groups, needed, slot_workspace.data(),
            slot_bytes, tables.tensor(1 + num_slots)->flat<float>().data(),
            tables.tensor(2 + num_slots)->flat<int64_t>().data(), plan.stream),
        kOpName, "writing the slot map");
  }
};

#define PE_INSTANTIATE_GPU(T, Index)                                          \
  template struct MaskedEmbeddingBagApplyRuleFunctor<GPUDevice, T, Index>;    \
  template struct MaskedEmbeddingBagApplyRuleWithSlotMapFunctor<GPUDevice, T, \
                                                                Index>;
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_INSTANTIATE_GPU)
#undef PE_INSTANTIATE_GPU

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
