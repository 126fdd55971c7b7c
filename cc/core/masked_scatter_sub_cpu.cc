// CPU implementation of the TF-free MaskedScatterSub core.
#include "cc/core/masked_scatter_sub.h"

namespace partial_embedding {
namespace {

// Applies the update to the rows r with r % num_shards == shard, in the order
// of `indices`. Indices must already be validated.
template <typename T, typename Index>
void ApplyShard(T* var, int64_t row_size, const Index* indices,
                int64_t num_indices, const T* updates, const bool* row_mask,
                int64_t shard, int64_t num_shards) {
  using A = Arith<T>;
  for (int64_t i = 0; i < num_indices; ++i) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (num_shards > 1 && row % num_shards != shard) continue;
    if (!row_mask[row]) continue;
    T* __restrict__ dst = var + row * row_size;
    const T* __restrict__ src = updates + i * row_size;
    for (int64_t j = 0; j < row_size; ++j) {
      dst[j] = A::Store(A::Load(dst[j]) - A::Load(src[j]));
    }
  }
}

}  // namespace

template <typename T, typename Index>
int64_t MaskedScatterSubCpu(T* var, int64_t num_rows, int64_t row_size,
                            const Index* indices, int64_t num_indices,
                            const T* updates, const bool* row_mask,
                            const CpuParallelism& parallelism) {
  const int64_t bad = FindFirstBadIndex(indices, num_indices, num_rows);
  if (bad >= 0) return bad;
  const int64_t num_shards =
      RecommendedShards(num_indices, row_size, parallelism.max_threads);
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t shard = begin; shard < end; ++shard) {
      ApplyShard(var, row_size, indices, num_indices, updates, row_mask, shard,
                 num_shards);
    }
  };
  if (num_shards == 1) {
    run(0, 1);
  } else {
    parallelism.parallel_for(num_shards, run);
  }
  return -1;
}

#define PE_INSTANTIATE(T, Index)                                          \
  template int64_t MaskedScatterSubCpu<T, Index>(                         \
      T*, int64_t, int64_t, const Index*, int64_t, const T*, const bool*, \
      const CpuParallelism&);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE

}  // namespace partial_embedding
