// TF-free core of the EmbeddingBag op and of its gradient,
// MaskedEmbeddingBagGrad: pooled lookups of bags of ids.
//
// A batch of bags is a flat list of positions: position i holds the row id
// ids[i] and belongs to bag bags[i], in [0, num_bags). An id < 0 is pruned
// (it counts for nothing, as in tf.nn.safe_embedding_lookup_sparse); an id
// >= num_rows is refused. Each bag's vector is
//
//   out[b] = sum over the unpruned positions i of bag b of f[i] *
//   params[ids[i]]
//
// with f[i] = w[i] * scale[b] (w[i] = 1 without weights) and the combiner's
// scale: 1 for kSum, 1 / sum(w) for kMean, 1 / sqrt(sum(w^2)) for kSqrtN,
// summed over the bag's unpruned positions; 0 where that sum is 0 (an empty
// bag gives zeros, as TensorFlow's div_no_nan does).
//
// The gradient with respect to params, given the gradient `grad` of out
// ([num_bags, row_size]), is sparse: one row per distinct permitted id (its
// row_mask entry true), groups numbered by first occurrence:
//
//   values[g] = sum over the positions i of row rows[g] of f[i] * grad[bags[i]]
//
// Frozen ids and pruned positions contribute nothing; no [positions,
// row_size] array is made. Both sums run in the compute type (float for the
// 16-bit types and float, double for double), in position order, and round
// to the storage type once.
//
// Nothing here includes TensorFlow or pybind11.
#ifndef PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_H_
#define PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_H_

#include <cstdint>
#include <string>

#include "cc/core/masked_sparse_apply.h"
#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"

namespace partial_embedding {

enum class BagCombiner { kSum, kMean, kSqrtN };

// The positions of one batch of bags.
template <typename Index>
struct BagPositions {
  const Index* ids = nullptr;
  const int64_t* bags = nullptr;
  int64_t num_positions = 0;
  int64_t num_bags = 0;
  int64_t num_rows = 0;  // V: ids must be < V.
};

// Why a batch was refused (nothing is written then).
struct BagInputError {
  enum class Kind {
    kNone,
    // ids[position] = value is not < num_rows.
    kIdOutOfRange,
    // bags[position] = value is not in [0, num_bags).
    kBagOutOfRange,
  };
  Kind kind = Kind::kNone;
  int64_t position = -1;
  int64_t value = 0;
  // For kIdOutOfRange: the bag of the position and the id's place in it
  // (how many positions of the same bag come before it).
  int64_t bag = -1;
  int64_t place = -1;
  bool ok() const { return kind == Kind::kNone; }
};

// The message for a refused batch, as every front end gives it: the public
// argument of the ids is sp_ids, and a bag's ids are numbered from 0
// ("sp_ids: bag 3, position 2 = 10 is not in [0, 10)").
inline std::string BagInputErrorMessage(const BagInputError& error,
                                        int64_t num_rows, int64_t num_bags) {
  if (error.kind == BagInputError::Kind::kBagOutOfRange) {
    return "bags[" + std::to_string(error.position) +
           "] = " + std::to_string(error.value) + " is not in [0, " +
           std::to_string(num_bags) + ")";
  }
  return "sp_ids: bag " + std::to_string(error.bag) + ", position " +
         std::to_string(error.place) + " = " + std::to_string(error.value) +
         " is not in [0, " + std::to_string(num_rows) + ")";
}

// Checks every id (< num_rows; negative ones are pruned, not refused) and
// every bag, reporting the lowest bad position. Sets *sorted to whether the
// bags never decrease. O(num_positions).
template <typename Index>
BagInputError CheckBagPositions(const BagPositions<Index>& positions,
                                bool* sorted);

// The forward pass on the CPU. params: [num_rows, row_size]; weights:
// [num_positions] or null (every weight 1); out: [num_bags, row_size];
// factors: [num_positions], receives f[i] (0 for pruned positions), which
// the gradient takes. Nothing is written when the inputs are refused.
template <typename T, typename Index>
BagInputError EmbeddingBagCpu(const T* params, int64_t row_size,
                              const BagPositions<Index>& positions,
                              const typename Arith<T>::Compute* weights,
                              BagCombiner combiner, T* out,
                              typename Arith<T>::Compute* factors,
                              const CpuParallelism& parallelism);

// The first half of the gradient, which writes nothing: checks the
// positions as CheckBagPositions does and groups the unpruned positions of
// permitted rows by row (see RowGroups). groups->num_groups() rows come out.
template <typename Index>
BagInputError PlanEmbeddingBagGrad(const BagPositions<Index>& positions,
                                   const bool* row_mask, RowGroups* groups);

// The second half: values ([num_groups, row_size]) of a successful plan's
// groups. grad: [num_bags, row_size]; factors: [num_positions].
template <typename T>
void EmbeddingBagGradValuesCpu(const T* grad, int64_t row_size,
                               const int64_t* bags,
                               const typename Arith<T>::Compute* factors,
                               const RowGroups& groups, T* values,
                               const CpuParallelism& parallelism);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_EMBEDDING_BAG_H_
