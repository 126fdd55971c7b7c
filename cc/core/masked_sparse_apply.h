// TF-free core of the fused MaskedSparseApplyAdam kernel.
//
// One call applies a lazy Adam (or AdamW, or AMSGrad) step to the permitted
// rows of a [num_rows, row_size] table present in a raw (not deduplicated)
// sparse gradient, writing each such row of the variable and of its slots in
// one pass. Rows whose mask is false are never written, slots included; rows
// absent from the gradient are never touched.
//
// For every distinct permitted row r of `indices`, with g the sum of the
// gradient rows at the positions of r (added in position order, starting
// from zero, rounded after each addition as TensorFlow's segment sum does):
//
//   if weight_decay != 0:  var -= (var * weight_decay) * learning_rate
//   m_step = (g - m) * one_minus_beta_1;           m += m_step
//   v_step = (g * g - v) * one_minus_beta_2;       v += v_step
//   if amsgrad:            v_hat = max(v_hat, v);  denominator uses v_hat
//   var -= (m * alpha) / (sqrt(v or v_hat) + epsilon)
//
// Every operation rounds to the storage type, in this order, so the result is
// bit for bit what the same sequence of separate TensorFlow elementwise ops
// computes (16-bit types compute each operation in float and round, as
// TensorFlow's CPU kernels for half and bfloat16 do). The caller computes
// alpha = learning_rate * sqrt(1 - beta_2^t) / (1 - beta_1^t).
#ifndef PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_H_
#define PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_H_

#include <cstdint>
#include <vector>

#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"

namespace partial_embedding {

// Scalar hyperparameters of one Adam step, in the variable's storage type
// (TensorFlow hands them over as scalar tensors of that type).
template <typename T>
struct AdamHyperparameters {
  T learning_rate;
  T one_minus_beta_1;
  T one_minus_beta_2;
  T epsilon;
  T alpha;
  T weight_decay;  // Zero: no weight decay (the variable is not read for it).
};

// The tables of one step, as raw row-major pointers of [num_rows, row_size].
// v_hat is null unless AMSGrad is on.
template <typename T>
struct AdamTables {
  T* var;
  T* m;
  T* v;
  T* v_hat;
  int64_t num_rows;
  int64_t row_size;
};

// The distinct permitted rows of a gradient and where each occurs.
// Group g is row rows[g]; its positions are
// positions[starts[g]] .. positions[starts[g + 1] - 1], in increasing order.
// Groups are numbered in order of first occurrence.
struct RowGroups {
  std::vector<int64_t> rows;
  std::vector<int64_t> starts;
  std::vector<int64_t> positions;
  int64_t num_groups() const { return static_cast<int64_t>(rows.size()); }
};

// Groups the positions of `indices` by row, leaving out rows whose mask is
// false. Indices must already be validated (see FindFirstBadIndex). O(n).
template <typename Index>
void GroupPermittedRows(const Index* indices, int64_t num_indices,
                        const bool* row_mask, RowGroups* groups);

// Validates every index, groups, then applies the step on the CPU.
// `gradient` is [num_indices, row_size], in the position order of `indices`.
// Returns -1 on success, or the first position of `indices` outside
// [0, num_rows) (nothing is written then).
//
// Each shard owns a contiguous range of groups. Groups are distinct rows, and
// each row's result does not depend on how the groups were split: the result
// is the same bits for any thread count.
template <typename T, typename Index>
int64_t MaskedSparseApplyAdamCpu(const AdamTables<T>& tables,
                                 const Index* indices, int64_t num_indices,
                                 const T* gradient, const bool* row_mask,
                                 const AdamHyperparameters<T>& hyper,
                                 const CpuParallelism& parallelism);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_MASKED_SPARSE_APPLY_H_
