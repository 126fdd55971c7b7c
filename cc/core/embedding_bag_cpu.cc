// CPU implementation of the TF-free EmbeddingBag core and its gradient.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cc/core/embedding_bag.h"

namespace partial_embedding {
namespace {

// How many positions ahead a row is asked for: rows are scattered over
// tables much larger than the caches, so their misses should overlap. A
// 128-float row is 8 cache lines: 2 to 3 rows ahead was fastest on a 1M-row
// table (one thread, 4,096 ids: 0.52 ms against 0.58 for 8 ahead, 1.2 for
// none, and 0.58 for NumPy's take of the same rows without the sums).
constexpr int64_t kPrefetchDistance = 3;

template <typename T>
inline __attribute__((always_inline)) void PrefetchRowForReading(
    const T* table, int64_t row, int64_t row_size) {
  const char* begin = reinterpret_cast<const char*>(table + row * row_size);
  const int64_t row_bytes = row_size * static_cast<int64_t>(sizeof(T));
  for (int64_t byte = 0; byte < row_bytes; byte += 64) {
    __builtin_prefetch(begin + byte, 0);
  }
}

// Work below this many elements of a gradient row sum (cache-resident
// multiply-adds, a few nanoseconds each) is not worth a second thread.
constexpr int64_t kSumElementsPerShard = int64_t{1} << 20;

// sum[j] += f * src[j] over a row, in the compute type: kept apart (and
// restrict-qualified) so that it vectorizes.
template <typename T>
inline __attribute__((always_inline)) void AddScaledRow(
    typename Arith<T>::Compute* __restrict__ sum, const T* __restrict__ src,
    typename Arith<T>::Compute f, int64_t row_size) {
  for (int64_t j = 0; j < row_size; ++j) sum[j] += f * Arith<T>::Load(src[j]);
}

template <typename T>
inline __attribute__((always_inline)) void StoreRow(
    T* __restrict__ dst, const typename Arith<T>::Compute* __restrict__ sum,
    int64_t row_size) {
  for (int64_t j = 0; j < row_size; ++j) dst[j] = Arith<T>::Store(sum[j]);
}

// How many positions before `position` belong to `bag` (its place in it).
int64_t PlaceInBag(const int64_t* bags, int64_t position, int64_t bag) {
  int64_t place = 0;
  for (int64_t i = 0; i < position; ++i) place += bags[i] == bag ? 1 : 0;
  return place;
}

// The first position of each bag, for bags that never decrease: bag b holds
// positions starts[b] .. starts[b + 1] - 1.
std::vector<int64_t> BagStarts(const int64_t* bags, int64_t num_positions,
                               int64_t num_bags) {
  std::vector<int64_t> starts(static_cast<size_t>(num_bags + 1), 0);
  for (int64_t i = 0; i < num_positions; ++i) ++starts[bags[i] + 1];
  for (int64_t b = 0; b < num_bags; ++b) starts[b + 1] += starts[b];
  return starts;
}

// factors[i] = w[i] * scale[bags[i]] (0 for a pruned position), with the
// combiner's per-bag scale.
template <typename C, typename Index>
void ComputeFactors(const BagPositions<Index>& positions, const C* weights,
                    BagCombiner combiner, C* factors) {
  const int64_t n = positions.num_positions;
  const auto weight = [&](int64_t i) { return weights ? weights[i] : C(1); };
  if (combiner == BagCombiner::kSum) {
    for (int64_t i = 0; i < n; ++i) {
      factors[i] = positions.ids[i] < 0 ? C(0) : weight(i);
    }
    return;
  }
  std::vector<C> sums(static_cast<size_t>(positions.num_bags), C(0));
  for (int64_t i = 0; i < n; ++i) {
    if (positions.ids[i] < 0) continue;
    const C w = weight(i);
    sums[positions.bags[i]] += combiner == BagCombiner::kMean ? w : w * w;
  }
  for (C& sum : sums) {
    if (sum == C(0)) continue;  // div_no_nan: the bag's factors stay 0.
    sum = combiner == BagCombiner::kMean ? C(1) / sum : C(1) / std::sqrt(sum);
  }
  for (int64_t i = 0; i < n; ++i) {
    factors[i] =
        positions.ids[i] < 0 ? C(0) : weight(i) * sums[positions.bags[i]];
  }
}

// out[bag] for the bags [bag_begin, bag_end) of bags that never decrease.
template <typename T, typename Index>
void SumSortedBags(const T* params, int64_t row_size,
                   const BagPositions<Index>& positions,
                   const std::vector<int64_t>& starts,
                   const typename Arith<T>::Compute* factors, T* out,
                   int64_t bag_begin, int64_t bag_end) {
  using A = Arith<T>;
  using C = typename A::Compute;
  std::vector<C> sum(static_cast<size_t>(row_size));
  const Index* ids = positions.ids;
  // Rows are asked for across bag boundaries, up to the shard's last
  // position: a bag's first rows are then on their way while the bag before
  // it is summed (with 16 ids a bag, 3 in 16 rows were not asked for ahead).
  const int64_t shard_end = starts[bag_end];
  for (int64_t i = starts[bag_begin];
       i < std::min(shard_end, starts[bag_begin] + kPrefetchDistance); ++i) {
    if (ids[i] >= 0) {
      PrefetchRowForReading(params, static_cast<int64_t>(ids[i]), row_size);
    }
  }
  for (int64_t bag = bag_begin; bag < bag_end; ++bag) {
    std::fill(sum.begin(), sum.end(), C(0));
    const int64_t end = starts[bag + 1];
    for (int64_t i = starts[bag]; i < end; ++i) {
      if (i + kPrefetchDistance < shard_end &&
          ids[i + kPrefetchDistance] >= 0) {
        PrefetchRowForReading(
            params, static_cast<int64_t>(ids[i + kPrefetchDistance]), row_size);
      }
      const int64_t id = static_cast<int64_t>(ids[i]);
      if (id < 0) continue;
      AddScaledRow(sum.data(), params + id * row_size, factors[i], row_size);
    }
    StoreRow(out + bag * row_size, sum.data(), row_size);
  }
}

// out for bags in any order: one pass over the positions on one thread.
template <typename T, typename Index>
void SumUnsortedBags(const T* params, int64_t row_size,
                     const BagPositions<Index>& positions,
                     const typename Arith<T>::Compute* factors, T* out) {
  using A = Arith<T>;
  using C = typename A::Compute;
  std::vector<C> sums(static_cast<size_t>(positions.num_bags * row_size), C(0));
  for (int64_t i = 0; i < positions.num_positions; ++i) {
    const int64_t id = static_cast<int64_t>(positions.ids[i]);
    if (id < 0) continue;
    AddScaledRow(sums.data() + positions.bags[i] * row_size,
                 params + id * row_size, factors[i], row_size);
  }
  StoreRow(out, sums.data(), static_cast<int64_t>(sums.size()));
}

// Runs run(begin, end) over [0, count) in up to `shards` contiguous pieces.
template <typename Run>
void ForEachShard(int64_t count, int64_t shards,
                  const CpuParallelism& parallelism, Run&& run) {
  shards = std::max<int64_t>(1, std::min(shards, count));
  if (shards == 1) {
    run(int64_t{0}, count);
    return;
  }
  parallelism.parallel_for(shards, [&](int64_t begin, int64_t end) {
    for (int64_t shard = begin; shard < end; ++shard) {
      run(count * shard / shards, count * (shard + 1) / shards);
    }
  });
}

}  // namespace

template <typename Index>
BagInputError CheckBagPositions(const BagPositions<Index>& positions,
                                bool* sorted) {
  BagInputError error;
  bool never_decreasing = true;
  int64_t previous = 0;
  for (int64_t i = 0; i < positions.num_positions; ++i) {
    const int64_t bag = positions.bags[i];
    if (bag < 0 || bag >= positions.num_bags) {
      error.kind = BagInputError::Kind::kBagOutOfRange;
      error.position = i;
      error.value = bag;
      return error;
    }
    never_decreasing = never_decreasing && bag >= previous;
    previous = bag;
    const int64_t id = static_cast<int64_t>(positions.ids[i]);
    if (id >= positions.num_rows) {
      error.kind = BagInputError::Kind::kIdOutOfRange;
      error.position = i;
      error.value = id;
      error.bag = bag;
      error.place = PlaceInBag(positions.bags, i, bag);
      return error;
    }
  }
  if (sorted != nullptr) *sorted = never_decreasing;
  return error;
}

template <typename T, typename Index>
BagInputError EmbeddingBagCpu(const T* params, int64_t row_size,
                              const BagPositions<Index>& positions,
                              const typename Arith<T>::Compute* weights,
                              BagCombiner combiner, T* out,
                              typename Arith<T>::Compute* factors,
                              const CpuParallelism& parallelism) {
  bool sorted = true;
  const BagInputError error = CheckBagPositions(positions, &sorted);
  if (!error.ok()) return error;
  ComputeFactors(positions, weights, combiner, factors);
  if (positions.num_bags == 0 || row_size == 0) return error;
  if (!sorted) {
    SumUnsortedBags(params, row_size, positions, factors, out);
    return error;
  }
  const std::vector<int64_t> starts =
      BagStarts(positions.bags, positions.num_positions, positions.num_bags);
  const int64_t shards = RecommendedShards(positions.num_positions, row_size,
                                           parallelism.max_threads);
  ForEachShard(positions.num_bags, shards, parallelism,
               [&](int64_t begin, int64_t end) {
                 SumSortedBags(params, row_size, positions, starts, factors,
                               out, begin, end);
               });
  return error;
}

template <typename Index>
BagInputError PlanEmbeddingBagGrad(const BagPositions<Index>& positions,
                                   const bool* row_mask, RowGroups* groups) {
  const BagInputError error = CheckBagPositions(positions, nullptr);
  if (error.ok()) {
    // GroupPermittedRows leaves pruned (negative) ids out.
    GroupPermittedRows(positions.ids, positions.num_positions, row_mask,
                       groups);
  }
  return error;
}

template <typename T>
void EmbeddingBagGradValuesCpu(const T* grad, int64_t row_size,
                               const int64_t* bags,
                               const typename Arith<T>::Compute* factors,
                               const RowGroups& groups, T* values,
                               const CpuParallelism& parallelism) {
  using A = Arith<T>;
  using C = typename A::Compute;
  const int64_t num_groups = groups.num_groups();
  if (num_groups == 0 || row_size == 0) return;
  const int64_t work = static_cast<int64_t>(groups.positions.size()) * row_size;
  const int64_t shards = std::max<int64_t>(
      1,
      std::min<int64_t>(parallelism.max_threads, work / kSumElementsPerShard));
  ForEachShard(
      num_groups, shards, parallelism, [&](int64_t begin, int64_t end) {
        std::vector<C> sum(static_cast<size_t>(row_size));
        for (int64_t g = begin; g < end; ++g) {
          std::fill(sum.begin(), sum.end(), C(0));
          for (int64_t p = groups.starts[g]; p < groups.starts[g + 1]; ++p) {
            const int64_t position = groups.positions[p];
            AddScaledRow(sum.data(), grad + bags[position] * row_size,
                         factors[position], row_size);
          }
          StoreRow(values + g * row_size, sum.data(), row_size);
        }
      });
}

#define PE_INSTANTIATE_INDEX(Index)                                           \
  template BagInputError CheckBagPositions<Index>(const BagPositions<Index>&, \
                                                  bool*);                     \
  template BagInputError PlanEmbeddingBagGrad<Index>(                         \
      const BagPositions<Index>&, const bool*, RowGroups*);
PE_FOR_EACH_INDEX_TYPE(PE_INSTANTIATE_INDEX)
#undef PE_INSTANTIATE_INDEX

#define PE_INSTANTIATE_VALUES(T)                                            \
  template void EmbeddingBagGradValuesCpu<T>(                               \
      const T*, int64_t, const int64_t*, const typename Arith<T>::Compute*, \
      const RowGroups&, T*, const CpuParallelism&);
PE_FOR_EACH_CORE_TYPE(PE_INSTANTIATE_VALUES)
#undef PE_INSTANTIATE_VALUES

#define PE_INSTANTIATE(T, Index)                          \
  template BagInputError EmbeddingBagCpu<T, Index>(       \
      const T*, int64_t, const BagPositions<Index>&,      \
      const typename Arith<T>::Compute*, BagCombiner, T*, \
      typename Arith<T>::Compute*, const CpuParallelism&);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE

}  // namespace partial_embedding
