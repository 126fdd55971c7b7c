// Plain-thread parallel-for and the shard count shared by the CPU cores.
#include "cc/core/parallel_for.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace partial_embedding {

CpuParallelism PlainThreads(int max_threads) {
  CpuParallelism parallelism;
  parallelism.max_threads = std::max(max_threads, 1);
  parallelism.parallel_for = [](int64_t num_shards, const ShardRange& run) {
    std::vector<std::thread> workers;
    workers.reserve(static_cast<size_t>(std::max<int64_t>(num_shards - 1, 0)));
    for (int64_t shard = 1; shard < num_shards; ++shard) {
      workers.emplace_back([&run, shard] { run(shard, shard + 1); });
    }
    if (num_shards > 0) run(0, 1);
    for (std::thread& worker : workers) worker.join();
  };
  return parallelism;
}

int RecommendedShards(int64_t num_indices, int64_t row_size, int max_threads) {
  // Below ~64K elements one thread finishes before others could start.
  constexpr int64_t kElementsPerShard = 1 << 16;
  const int64_t work = num_indices * std::max<int64_t>(row_size, 1);
  const int64_t by_work = std::max<int64_t>(1, work / kElementsPerShard);
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(max_threads, by_work)));
}

}  // namespace partial_embedding
