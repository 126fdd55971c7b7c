// What the GPU specializations of our OpKernels share: TensorFlow's CUDA
// stream for the op, as the raw handle the TF-free cores take, and the status
// of a core's CUDA error. Only TensorFlow types cross this header; no CUDA
// header is included (the cores run every CUDA call themselves).
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_

#if GOOGLE_CUDA

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "cc/core/gpu_common.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace partial_embedding {

// The CUDA stream TensorFlow runs `ctx`'s op on; `op_name` names the op in
// the error when there is none.
absl::Status TfGpuStream(::tensorflow::OpKernelContext* ctx,
                         const char* op_name, GpuStream* stream);

// OK for 0, else an internal error naming the op, what failed and the CUDA
// error.
absl::Status GpuStatus(int error, const char* op_name, const char* what);

// A TensorFlow-allocated device buffer of `bytes` bytes for a core's
// workspace (TensorFlow's GPU allocator orders its reuse on the op's stream).
absl::Status AllocateGpuWorkspace(::tensorflow::OpKernelContext* ctx,
                                  size_t bytes,
                                  ::tensorflow::Tensor* workspace);

// What a GPU kernel hands its core: TensorFlow's stream and a workspace.
struct GpuCall {
  GpuStream stream = nullptr;
  ::tensorflow::Tensor workspace;
  size_t workspace_bytes = 0;
  void* workspace_data() { return workspace.data(); }
};

// Every GPU kernel's preamble: refuses more than `max_items` items of the
// input `argument` ("indices: 3000000000 positions exceed the GPU kernel's
// limit of 2147483647", `items` naming them), finds the op's stream, asks the
// core how large a workspace it needs (`workspace_bytes(stream, &bytes)`, a
// CUDA error code) and allocates it.
absl::Status StartGpuCall(
    ::tensorflow::OpKernelContext* ctx, const char* op_name,
    const char* argument, const char* items, int64_t num_items,
    int64_t max_items,
    absl::FunctionRef<int(GpuStream, size_t*)> workspace_bytes, GpuCall* call);

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
#endif  // PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_
