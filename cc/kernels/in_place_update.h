// Helpers shared by the OpKernels that write a resource variable in place.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_IN_PLACE_UPDATE_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_IN_PLACE_UPDATE_H_

#include <cstdint>
#include <string>
#include <type_traits>

#include "cc/core/huge_pages.h"
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

// Moves the value of a CPU variable into a fresh buffer prepared for huge
// pages, unless it is smaller than min_bytes, huge pages are turned off, or
// the buffer was moved before. Sets *moved when it did. Requires the
// variable's exclusive lock.
absl::Status MoveToHugePages(::tensorflow::OpKernelContext* ctx,
                             ::tensorflow::Tensor* params, int64_t min_bytes,
                             bool* moved);

// Gives the variable a buffer of its own when a reader still holds the
// current one, so the reader's snapshot keeps its values. Never switches the
// variable into copy-on-read mode. Requires the variable's lock.
//
// On the CPU, a table of at least kHugePagesMinBytes also gets, the first time
// it passes here, a buffer of its own prepared for transparent huge pages (see
// cc/core/huge_pages.h): one copy, then rows scattered over it stop missing
// the TLB. PARTIAL_EMBEDDING_HUGE_PAGES=0 turns that off.
template <typename Device>
absl::Status CopyIfShared(::tensorflow::OpKernelContext* ctx,
                          ::tensorflow::Tensor* params) {
  if constexpr (std::is_same_v<Device, Eigen::ThreadPoolDevice>) {
    bool moved = false;
    TF_RETURN_IF_ERROR(
        MoveToHugePages(ctx, params, kHugePagesMinBytes, &moved));
    if (moved) return absl::OkStatus();
  }
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
