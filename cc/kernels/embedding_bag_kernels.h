// The device functor behind the MaskedEmbeddingBagGrad OpKernel: one template
// over <Device, T, Index>, specialized for the CPU in embedding_bag_kernels.cc
// and for the GPU in embedding_bag_kernels.cu.cc.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_EMBEDDING_BAG_KERNELS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_EMBEDDING_BAG_KERNELS_H_

#include <cstdint>

#include "cc/core/embedding_bag.h"
#include "cc/kernels/in_place_update.h"

namespace partial_embedding {

// The inputs of one gradient, as raw pointers into the op's input tensors,
// in the core's types.
template <typename T, typename Index>
struct EmbeddingBagGradArgs {
  using Compute = typename Arith<T>::Compute;
  const T* grad;
  int64_t row_size;
  BagPositions<Index> positions;
  const Compute* factors;
  const bool* row_mask;
};

// The op's outputs: rows [U] and values [U] + row_shape.
constexpr int kBagGradRows = 0;
constexpr int kBagGradValues = 1;

template <typename Device, typename T, typename Index>
struct EmbeddingBagGradFunctor {
  // Checks every position, then allocates and fills the op's outputs. When
  // a position is refused, sets *error and allocates nothing. A non-OK
  // status reports a device or allocation failure.
  absl::Status operator()(OpKernelContext* ctx,
                          const EmbeddingBagGradArgs<T, Index>& args,
                          const TensorShape& row_shape,
                          BagInputError* error) const;
};

// The OpKernel's status for a refused batch.
absl::Status BagError(const BagInputError& error, int64_t num_rows,
                      int64_t num_bags);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_EMBEDDING_BAG_KERNELS_H_
