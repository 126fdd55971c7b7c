// TF-free core of the MaskedScatterSub kernel.
//
// Nothing here includes TensorFlow or pybind11: the TensorFlow OpKernel and the
// pybind11 kernel module both call this driver over raw pointers, each with
// its own threads, which is what lets the GPU path be tested where TensorFlow
// is absent.
//
// Semantics, for every position i in [0, num_indices):
//   if row_mask[indices[i]]:  var[indices[i], :] -= updates[i, :]
// Rows whose mask is false are never written. Duplicate indices accumulate.
#ifndef PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_H_
#define PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_H_

#include <cstdint>

#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"

namespace partial_embedding {

// Validates, then updates `var` ([num_rows, row_size], row-major) in place on
// the CPU. Returns -1 on success, or the first bad position in `indices`
// (nothing is written then).
//
// Shard s owns the rows r with r % num_shards == s and applies their updates
// in the order of `indices`: every row's updates are applied in index order
// whatever the number of shards, so the result is the same bits for any
// thread count.
template <typename T, typename Index>
int64_t MaskedScatterSubCpu(T* var, int64_t num_rows, int64_t row_size,
                            const Index* indices, int64_t num_indices,
                            const T* updates, const bool* row_mask,
                            const CpuParallelism& parallelism);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_H_
