// The GPU specialization of MaskedEmbeddingBagApplyRuleFunctor: TensorFlow's
// stream, the tensors' device pointers (the hyperparameters too: no copy to
// the host) and TensorFlow-allocated workspaces for the TF-free CUDA cores:
// the bag gradient's plan (embedding_bag_gpu.h), which checks every position
// and counts the distinct permitted rows (one synchronisation), then the
// fused step (embedding_bag_apply_gpu.h), whose workspace is sized by that
// count.
//
// No device code here: the host C++ compiler builds this file, and every CUDA
// call happens inside the cores (see masked_scatter_sub_kernels.cu.cc).
#if GOOGLE_CUDA

#include "cc/kernels/masked_embedding_bag_apply_kernels.h"

#include <cstdint>

#include "cc/core/embedding_bag_apply_gpu.h"
#include "cc/core/embedding_bag_gpu.h"
#include "cc/kernels/gpu_stream.h"

namespace partial_embedding {

using GPUDevice = Eigen::GpuDevice;

namespace {

constexpr char kOpName[] = "MaskedEmbeddingBagApplyRule";

}  // namespace

template <typename T, typename Index>
struct MaskedEmbeddingBagApplyRuleFunctor<GPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const BagRuleStepArgs<T, Index>& args,
                          BagInputError* error) const {
    using CoreT = CoreOf<T>;
    *error = BagInputError();
    const BagPositions<Index>& positions = args.positions;
    // The plan's scan runs over one more entry than there are ids.
    GpuCall plan;
    TF_RETURN_IF_ERROR(StartGpuCall(
        ctx, kOpName, "ids", "positions", positions.num_positions,
        kMaxGpuIndices - 1,
        [&](GpuStream stream, size_t* bytes) {
          return EmbeddingBagGradGpuWorkspaceBytes(
              positions.num_rows, positions.num_positions, stream, bytes);
        },
        &plan));
    int64_t num_groups = 0;
    TF_RETURN_IF_ERROR(GpuStatus(
        EmbeddingBagGradGpuPlan(positions, args.row_mask, plan.workspace_data(),
                                plan.workspace_bytes, plan.stream, &num_groups,
                                error),
        kOpName, "grouping the rows"));
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

#define PE_INSTANTIATE_GPU(T, Index) \
  template struct MaskedEmbeddingBagApplyRuleFunctor<GPUDevice, T, Index>;
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_INSTANTIATE_GPU)
#undef PE_INSTANTIATE_GPU

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
