// The GPU specialization of EmbeddingBagGradFunctor: TensorFlow's stream, a
// TensorFlow-allocated workspace and outputs for the TF-free CUDA core. Like
// masked_scatter_sub_kernels.cu.cc it holds no device code.
#if GOOGLE_CUDA

#include "cc/kernels/embedding_bag_kernels.h"

#include <cstdint>

#include "cc/core/embedding_bag_gpu.h"
#include "cc/kernels/gpu_stream.h"

namespace partial_embedding {

using GPUDevice = Eigen::GpuDevice;

namespace {

constexpr char kOpName[] = "MaskedEmbeddingBagGrad";

}  // namespace

template <typename T, typename Index>
struct EmbeddingBagGradFunctor<GPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const EmbeddingBagGradArgs<T, Index>& args,
                          const TensorShape& row_shape,
                          BagInputError* error) const {
    const BagPositions<Index>& positions = args.positions;
    // The core's scan runs over one more entry than there are ids.
    GpuCall call;
    TF_RETURN_IF_ERROR(StartGpuCall(
        ctx, kOpName, "sp_ids", "ids", positions.num_positions,
        kMaxGpuIndices - 1,
        [&](GpuStream stream, size_t* bytes) {
          return EmbeddingBagGradGpuWorkspaceBytes(
              positions.num_rows, positions.num_positions, stream, bytes);
        },
        &call));
    int64_t num_groups = 0;
    TF_RETURN_IF_ERROR(GpuStatus(
        EmbeddingBagGradGpuPlan(positions, args.row_mask, call.workspace_data(),
                                call.workspace_bytes, call.stream, &num_groups,
                                error),
        kOpName, "grouping the rows"));
    if (!error->ok()) return absl::OkStatus();
    Tensor* rows = nullptr;
    TF_RETURN_IF_ERROR(
        ctx->allocate_output(kBagGradRows, TensorShape({num_groups}), &rows));
    TensorShape values_shape({num_groups});
    values_shape.AppendShape(row_shape);
    Tensor* values = nullptr;
    TF_RETURN_IF_ERROR(
        ctx->allocate_output(kBagGradValues, values_shape, &values));
    // The workspace stays alive until the stream has run the values kernel:
    // TensorFlow's GPU allocator orders its reuse on the same stream.
    return GpuStatus(EmbeddingBagGradGpuValues(
                         args.grad, args.row_size, positions, args.factors,
                         num_groups, call.workspace_data(),
                         call.workspace_bytes, rows->flat<Index>().data(),
                         reinterpret_cast<T*>(values->data()), call.stream),
                     kOpName, "summing the rows");
  }
};

#define PE_INSTANTIATE_GPU(T, Index) \
  template struct EmbeddingBagGradFunctor<GPUDevice, CoreType<T>::type, Index>;
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_INSTANTIATE_GPU)
#undef PE_INSTANTIATE_GPU

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
