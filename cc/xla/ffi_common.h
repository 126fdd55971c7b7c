// What the typed-FFI handlers of cc/xla share: a table's geometry, sharding
// on XLA's intra-op thread pool, and how an index position is written in
// error messages. Header-only FFI API only (no TensorFlow).
#ifndef PARTIAL_EMBEDDING_CC_XLA_FFI_COMMON_H_
#define PARTIAL_EMBEDDING_CC_XLA_FFI_COMMON_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cc/core/parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace partial_embedding {
namespace xla_ffi {

namespace ffi = ::xla::ffi;

// Rows of `table` and the number of elements in one row.
struct TableGeometry {
  int64_t num_rows = 0;
  int64_t row_size = 1;
};

inline TableGeometry GeometryOf(const ffi::AnyBuffer& table) {
  TableGeometry geometry;
  const auto dims = table.dimensions();
  geometry.num_rows = dims.size() == 0 ? 0 : dims[0];
  for (size_t d = 1; d < dims.size(); ++d) geometry.row_size *= dims[d];
  return geometry;
}

// Shards on XLA's intra-op thread pool. The calling thread claims shards
// too, and waits only for shards already running, so the update finishes
// even when every pool thread is busy (or the pool is absent: then Schedule
// runs each task inline, and the helpers find nothing left to claim).
struct ShardCounter {
  std::atomic<int64_t> next{0};
  int64_t finished = 0;
  std::mutex mu;
  std::condition_variable all_finished;
};

inline CpuParallelism PoolParallelism(ffi::ThreadPool& pool) {
  CpuParallelism parallelism;
  parallelism.max_threads =
      static_cast<int>(std::max<int64_t>(1, pool.num_threads()));
  parallelism.parallel_for = [&pool](int64_t num_shards,
                                     const ShardRange& run) {
    auto counter = std::make_shared<ShardCounter>();
    // A helper that starts after every shard was claimed touches only the
    // counter: `run` is used solely for claimed shards, which the caller
    // waits for.
    auto claim_shards = [counter, num_shards, &run] {
      for (int64_t shard = counter->next.fetch_add(1); shard < num_shards;
           shard = counter->next.fetch_add(1)) {
        run(shard, shard + 1);
        std::lock_guard<std::mutex> lock(counter->mu);
        if (++counter->finished == num_shards)
          counter->all_finished.notify_all();
      }
    };
    for (int64_t helper = 1; helper < num_shards; ++helper) {
      auto task = claim_shards;
      pool.Schedule(std::move(task));
    }
    claim_shards();
    std::unique_lock<std::mutex> lock(counter->mu);
    counter->all_finished.wait(lock,
                               [&] { return counter->finished == num_shards; });
  };
  return parallelism;
}

// "[i, j]": the position of flat element `position` in `indices`, written as
// the TensorFlow kernel writes it.
inline std::string IndexPosition(const ffi::AnyBuffer& indices,
                                 int64_t position) {
  const auto dims = indices.dimensions();
  std::string coords;
  for (size_t d = dims.size(); d-- > 0;) {
    const int64_t size = dims[d] > 0 ? dims[d] : 1;
    coords =
        std::to_string(position % size) + (coords.empty() ? "" : ", ") + coords;
    position /= size;
  }
  return "[" + coords + "]";
}

// A result aliased to its operand arrives in the operand's buffer; copy
// only if a future XLA ever gives the result a buffer of its own.
inline void CopyIfNotAliased(const ffi::AnyBuffer& operand,
                             ffi::Result<ffi::AnyBuffer>& result) {
  if (result->untyped_data() != operand.untyped_data()) {
    std::memcpy(result->untyped_data(), operand.untyped_data(),
                operand.size_bytes());
  }
}

}  // namespace xla_ffi
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_XLA_FFI_COMMON_H_
