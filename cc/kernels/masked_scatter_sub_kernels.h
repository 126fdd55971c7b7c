// The device functor behind the MaskedScatterSub OpKernel: one template over
// <Device, T, Index>, specialized for the CPU in masked_scatter_sub_kernels.cc
// and for the GPU in masked_scatter_sub_kernels.cu.cc.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SCATTER_SUB_KERNELS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SCATTER_SUB_KERNELS_H_

#include <cstdint>

#include "cc/core/masked_scatter_sub.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace partial_embedding {

// The core's storage type for a TensorFlow element type (same bit layout).
template <typename T>
struct CoreType {
  using type = T;
};
template <>
struct CoreType<Eigen::half> {
  using type = Float16;
};
template <>
struct CoreType<Eigen::bfloat16> {
  using type = BFloat16;
};

// Everything one call needs, as raw pointers into tensors owned by the caller.
template <typename T, typename Index>
struct MaskedScatterSubArgs {
  T* var;
  int64_t num_rows;
  int64_t row_size;
  const Index* indices;
  int64_t num_indices;
  const T* updates;
  const bool* row_mask;
};

template <typename Device, typename T, typename Index>
struct MaskedScatterSubFunctor {
  // Validates every index, then applies the update. Sets *bad_position to
  // the first position whose index is outside [0, num_rows) and *bad_value to
  // that index (nothing is written then), or *bad_position to -1. A non-OK
  // status reports a device failure.
  absl::Status operator()(::tensorflow::OpKernelContext* ctx,
                          const MaskedScatterSubArgs<T, Index>& args,
                          int64_t* bad_position, int64_t* bad_value) const;
};

// Copies `bytes` bytes between two buffers on the device.
template <typename Device>
absl::Status CopyDeviceBuffer(::tensorflow::OpKernelContext* ctx, void* dst,
                              const void* src, int64_t bytes);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SCATTER_SUB_KERNELS_H_
