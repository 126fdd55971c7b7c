// What the GPU specializations of our OpKernels share: TensorFlow's CUDA
// stream for the op, as the raw handle the TF-free cores take, and the status
// of a core's CUDA error. Only TensorFlow types cross this header; no CUDA
// header is included (the cores run every CUDA call themselves).
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_

#if GOOGLE_CUDA

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

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
#endif  // PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_
