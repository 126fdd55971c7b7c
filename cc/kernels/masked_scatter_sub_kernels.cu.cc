// The GPU specialization of MaskedScatterSubFunctor: hands TensorFlow's own
// stream and a TensorFlow-allocated workspace to the TF-free CUDA core.
//
// This file holds no device code, so it is compiled by the host C++ compiler:
// every CUDA call happens inside the core, whose statically linked CUDA
// runtime stays private to this library (see CMakeLists.txt). That keeps this
// library off the CUDA runtime that libtensorflow_framework exports.
#if GOOGLE_CUDA

#include "cc/kernels/masked_scatter_sub_kernels.h"

#include <cstdint>

#include "cc/core/masked_scatter_sub_gpu.h"
#include "cc/kernels/gpu_stream.h"
#include "tensorflow/core/util/determinism.h"
#include "xla/stream_executor/stream.h"

namespace partial_embedding {

using GPUDevice = Eigen::GpuDevice;

absl::Status TfCudaStream(OpKernelContext* ctx, const char* op_name,
                          GpuStream* stream) {
  const ::tensorflow::DeviceContext* device_context = ctx->op_device_context();
  if (device_context == nullptr || device_context->stream() == nullptr) {
    return absl::InternalError(
        absl::StrCat(op_name, ": no GPU stream for this op"));
  }
  *stream = static_cast<GpuStream>(
      device_context->stream()->platform_specific_handle().stream);
  if (*stream == nullptr) {
    return absl::InternalError(
        absl::StrCat(op_name, ": the GPU stream has no CUDA handle"));
  }
  return absl::OkStatus();
}

absl::Status CudaStatus(int error, const char* op_name, const char* what) {
  if (error == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(op_name, ": ", what,
                                          " failed: ", GpuErrorString(error),
                                          " (CUDA error ", error, ")"));
}

namespace {

constexpr char kOpName[] = "MaskedScatterSub";

}  // namespace

template <typename T, typename Index>
struct MaskedScatterSubFunctor<GPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedScatterSubArgs<T, Index>& args,
                          int64_t* bad_position, int64_t* bad_value) const {
    using CoreT = typename CoreType<T>::type;
    *bad_position = -1;
    *bad_value = 0;
    if (args.num_indices > kMaxGpuIndices) {
      return absl::InvalidArgumentError(
          absl::StrCat("indices: ", args.num_indices,
                       " positions exceed the GPU kernel's "
                       "limit of ",
                       kMaxGpuIndices));
    }
    GpuStream stream = nullptr;
    TF_RETURN_IF_ERROR(TfCudaStream(ctx, kOpName, &stream));
    const bool deterministic = ::tensorflow::OpDeterminismRequired();
    size_t workspace_bytes = 0;
    TF_RETURN_IF_ERROR(
        CudaStatus(MaskedScatterSubGpuWorkspaceBytes<CoreT>(
                       args.num_rows, args.row_size, args.num_indices,
                       deterministic, stream, &workspace_bytes),
                   kOpName, "sizing the workspace"));
    // TensorFlow's GPU allocator orders this buffer's reuse on the same
    // stream, and the core waits for the stream before returning anyway.
    Tensor workspace;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        ::tensorflow::DT_INT8,
        TensorShape({static_cast<int64_t>(workspace_bytes)}), &workspace));
    return CudaStatus(
        MaskedScatterSubGpu(reinterpret_cast<CoreT*>(args.var), args.num_rows,
                            args.row_size, args.indices, args.num_indices,
                            reinterpret_cast<const CoreT*>(args.updates),
                            args.row_mask, deterministic, workspace.data(),
                            workspace_bytes, stream, bad_position, bad_value),
        kOpName, "the GPU kernel");
  }
};

template <>
absl::Status CopyDeviceBuffer<GPUDevice>(OpKernelContext* ctx, void* dst,
                                         const void* src, int64_t bytes) {
  GpuStream stream = nullptr;
  TF_RETURN_IF_ERROR(TfCudaStream(ctx, kOpName, &stream));
  return CudaStatus(GpuCopyDeviceToDevice(dst, src, bytes, stream), kOpName,
                    "copying the variable");
}

#define PE_INSTANTIATE_GPU(T, Index) \
  template struct MaskedScatterSubFunctor<GPUDevice, T, Index>;
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_INSTANTIATE_GPU)
#undef PE_INSTANTIATE_GPU

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
