// The device functor behind the MaskedScatterSub OpKernel: one template over
// <Device, T, Index>, specialized for the CPU in masked_scatter_sub_kernels.cc
// and for the GPU in masked_scatter_sub_kernels.cu.cc.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SCATTER_SUB_KERNELS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SCATTER_SUB_KERNELS_H_

#include <cstdint>

#include "cc/kernels/in_place_update.h"

namespace partial_embedding {

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
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedScatterSubArgs<T, Index>& args,
                          int64_t* bad_position, int64_t* bad_value) const;
};

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SCATTER_SUB_KERNELS_H_
