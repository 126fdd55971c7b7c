// The GPU OpKernels' shared helpers (gpu_stream.h). Host code: compiled by the
// host C++ compiler with TensorFlow's flags.
#if GOOGLE_CUDA

#include "cc/kernels/gpu_stream.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "xla/stream_executor/stream.h"

namespace partial_embedding {

absl::Status TfGpuStream(::tensorflow::OpKernelContext* ctx,
                         const char* op_name, GpuStream* stream) {
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

absl::Status GpuStatus(int error, const char* op_name, const char* what) {
  if (error == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(op_name, ": ", what,
                                          " failed: ", GpuErrorString(error),
                                          " (CUDA error ", error, ")"));
}

absl::Status AllocateGpuWorkspace(::tensorflow::OpKernelContext* ctx,
                                  size_t bytes,
                                  ::tensorflow::Tensor* workspace) {
  return ctx->allocate_temp(
      ::tensorflow::DT_INT8,
      ::tensorflow::TensorShape({static_cast<int64_t>(bytes)}), workspace);
}

absl::Status StartGpuCall(
    ::tensorflow::OpKernelContext* ctx, const char* op_name,
    const char* argument, const char* items, int64_t num_items,
    int64_t max_items,
    absl::FunctionRef<int(GpuStream, size_t*)> workspace_bytes, GpuCall* call) {
  if (num_items > max_items) {
    return absl::InvalidArgumentError(
        absl::StrCat(argument, ": ", num_items, " ", items,
                     " exceed the GPU kernel's limit of ", max_items));
  }
  TF_RETURN_IF_ERROR(TfGpuStream(ctx, op_name, &call->stream));
  TF_RETURN_IF_ERROR(
      GpuStatus(workspace_bytes(call->stream, &call->workspace_bytes), op_name,
                "sizing the workspace"));
  return AllocateGpuWorkspace(ctx, call->workspace_bytes, &call->workspace);
}

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
