// Helpers shared by the OpKernels that write a resource variable in place.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_IN_PLACE_UPDATE_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_IN_PLACE_UPDATE_H_

#include <cstdint>
#include <string>

#include "cc/kernels/masked_scatter_sub_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace partial_embedding {

template <>
absl::Status CopyDeviceBuffer<Eigen::ThreadPoolDevice>(
    ::tensorflow::OpKernelContext* ctx, void* dst, const void* src,
    int64_t bytes);

// "[3]" for a rank-1 shape, "[1, 2]" for the flat position 3 of a [2, 2]
// shape: how error messages name the position of a bad index.
std::string FormatIndexPosition(const ::tensorflow::TensorShape& shape,
                                int64_t flat);

// Gives the variable a buffer of its own when a reader still holds the
// current one, so the reader's snapshot keeps its values. Never switches the
// variable into copy-on-read mode. Requires the variable's lock.
template <typename Device>
absl::Status CopyIfShared(::tensorflow::OpKernelContext* ctx,
                          ::tensorflow::Tensor* params) {
  if (params->RefCountIsOne()) return absl::OkStatus();
  ::tensorflow::Tensor copy;
  ::tensorflow::AllocatorAttributes attr;
  attr.set_gpu_compatible(true);
  attr.set_nic_compatible(true);
  TF_RETURN_IF_ERROR(
      ctx->allocate_temp(params->dtype(), params->shape(), &copy, attr));
  TF_RETURN_IF_ERROR(CopyDeviceBuffer<Device>(ctx, copy.data(), params->data(),
                                              params->TotalBytes()));
  *params = copy;
  return absl::OkStatus();
}

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_IN_PLACE_UPDATE_H_
