// CPU implementation of the TF-free MaskedScatterSub core.
#include <algorithm>
#include <thread>
#include <vector>

#include "cc/core/masked_scatter_sub.h"

namespace partial_embedding {

template <typename Index>
int64_t FindFirstBadIndex(const Index* indices, int64_t num_indices,
                          int64_t num_rows) {
  for (int64_t i = 0; i < num_indices; ++i) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row < 0 || row >= num_rows) return i;
  }
  return -1;
}

template <typename T, typename Index>
void MaskedScatterSubShard(T* var, int64_t row_size, const Index* indices,
                           int64_t num_indices, const T* updates,
                           const bool* row_mask, int shard, int num_shards) {
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

int RecommendedShards(int64_t num_indices, int64_t row_size, int max_threads) {
  // Below ~64K elements one thread finishes before others could start.
  constexpr int64_t kElementsPerShard = 1 << 16;
  const int64_t work = num_indices * std::max<int64_t>(row_size, 1);
  const int64_t by_work = std::max<int64_t>(1, work / kElementsPerShard);
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(max_threads, by_work)));
}

template <typename T, typename Index>
int64_t MaskedScatterSubCpu(T* var, int64_t num_rows, int64_t row_size,
                            const Index* indices, int64_t num_indices,
                            const T* updates, const bool* row_mask,
                            int max_threads) {
  const int64_t bad = FindFirstBadIndex(indices, num_indices, num_rows);
  if (bad >= 0) return bad;
  const int num_shards = RecommendedShards(num_indices, row_size, max_threads);
  if (num_shards == 1) {
    MaskedScatterSubShard(var, row_size, indices, num_indices, updates,
                          row_mask, 0, 1);
    return -1;
  }
  std::vector<std::thread> workers;
  workers.reserve(num_shards - 1);
  for (int shard = 1; shard < num_shards; ++shard) {
    workers.emplace_back([=] {
      MaskedScatterSubShard(var, row_size, indices, num_indices, updates,
                            row_mask, shard, num_shards);
    });
  }
  MaskedScatterSubShard(var, row_size, indices, num_indices, updates, row_mask,
                        0, num_shards);
  for (std::thread& worker : workers) worker.join();
  return -1;
}

#define PE_INSTANTIATE_INDEX(Index) \
  template int64_t FindFirstBadIndex<Index>(const Index*, int64_t, int64_t);
PE_INSTANTIATE_INDEX(int32_t)
PE_INSTANTIATE_INDEX(int64_t)
#undef PE_INSTANTIATE_INDEX

#define PE_INSTANTIATE(T, Index)                                            \
  template void MaskedScatterSubShard<T, Index>(                            \
      T*, int64_t, const Index*, int64_t, const T*, const bool*, int, int); \
  template int64_t MaskedScatterSubCpu<T, Index>(T*, int64_t, int64_t,      \
                                                 const Index*, int64_t,     \
                                                 const T*, const bool*, int);
#define PE_INSTANTIATE_ALL_INDICES(T) \
  PE_INSTANTIATE(T, int32_t)          \
  PE_INSTANTIATE(T, int64_t)
PE_INSTANTIATE_ALL_INDICES(Float16)
PE_INSTANTIATE_ALL_INDICES(BFloat16)
PE_INSTANTIATE_ALL_INDICES(float)
PE_INSTANTIATE_ALL_INDICES(double)
#undef PE_INSTANTIATE_ALL_INDICES
#undef PE_INSTANTIATE

}  // namespace partial_embedding
