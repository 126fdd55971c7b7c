// What the GPU functors share: TensorFlow's CUDA stream for an op, and a
// CUDA error code (from a TF-free GPU core) as a status naming the op.
// Defined in masked_scatter_sub_kernels.cu.cc; only with GOOGLE_CUDA.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_

#if GOOGLE_CUDA

#include "cc/core/masked_scatter_sub_gpu.h"
#include "cc/kernels/in_place_update.h"

namespace partial_embedding {

// The CUDA stream TensorFlow runs `op_name`'s kernel on.
absl::Status TfCudaStream(OpKernelContext* ctx, const char* op_name,
                          GpuStream* stream);

// OK for 0; else an internal error "<op_name>: <what> failed: ...".
absl::Status CudaStatus(int error, const char* op_name, const char* what);

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_GPU_STREAM_H_
