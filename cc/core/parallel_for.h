// How a TF-free CPU core runs its shards: each front end hands the core's
// driver its own parallel-for (TensorFlow's CPU worker threads in the
// OpKernels, plain threads in the pybind11 module and the C++ tests). The
// drivers split their work so that the result is the same bits however many
// shards run, and however the parallel-for groups them onto threads.
#ifndef PARTIAL_EMBEDDING_CC_CORE_PARALLEL_FOR_H_
#define PARTIAL_EMBEDDING_CC_CORE_PARALLEL_FOR_H_

#include <cstdint>
#include <functional>

namespace partial_embedding {

// Runs shards [begin, end).
using ShardRange = std::function<void(int64_t begin, int64_t end)>;

// Calls `run(begin, end)` on ranges that together cover [0, num_shards)
// exactly once, possibly concurrently, and returns when every call has.
using ParallelFor =
    std::function<void(int64_t num_shards, const ShardRange& run)>;

// The threads a driver may use: how many are worth running at once, and how
// to run shards on them.
struct CpuParallelism {
  int max_threads = 1;
  ParallelFor parallel_for;
};

// Up to `max_threads` shards at once, one std::thread per shard beyond the
// first, which runs on the calling thread.
CpuParallelism PlainThreads(int max_threads);

// How many shards are worth running for an update of this size: one below a
// size where starting threads costs more than it saves; never more than
// max_threads.
int RecommendedShards(int64_t num_indices, int64_t row_size, int max_threads);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_PARALLEL_FOR_H_
