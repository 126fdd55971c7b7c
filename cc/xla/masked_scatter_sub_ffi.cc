// The XLA CPU custom-call handler behind PartialEmbedding>MaskedScatterSub
// under XLA: decodes the call's buffers through XLA's typed FFI and hands raw
// pointers to the same TF-free core the TensorFlow kernel calls.
//
// Only the header-only FFI API (xla/ffi/api/ffi.h) is used here; the one
// symbol it needs at run time, XLA_FFI_GetApi, is exported by
// libtensorflow_framework.so.2, whose handler registry the XLA CPU runtime
// in libtensorflow_cc.so.2 searches.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cc/core/masked_scatter_sub.h"
#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"
#include "cc/xla/custom_call_targets.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace partial_embedding {
namespace {

namespace ffi = ::xla::ffi;

// Rows of `table` and the number of elements in one row.
struct TableGeometry {
  int64_t num_rows = 0;
  int64_t row_size = 1;
};

TableGeometry GeometryOf(const ffi::AnyBuffer& table) {
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

CpuParallelism PoolParallelism(ffi::ThreadPool& pool) {
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
std::string IndexPosition(const ffi::AnyBuffer& indices, int64_t position) {
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

template <typename T, typename Index>
int64_t RunCore(ffi::AnyBuffer table, ffi::AnyBuffer indices,
                ffi::AnyBuffer updates, ffi::AnyBuffer row_mask,
                ffi::Result<ffi::AnyBuffer> out,
                const CpuParallelism& parallelism, int64_t* bad_value) {
  const TableGeometry geometry = GeometryOf(table);
  // The result aliases the table, so XLA hands both the same buffer; copy
  // only if a future XLA ever gives the result a buffer of its own.
  if (out->untyped_data() != table.untyped_data()) {
    std::memcpy(out->untyped_data(), table.untyped_data(), table.size_bytes());
  }
  const auto* index_data = static_cast<const Index*>(indices.untyped_data());
  const int64_t bad_position = MaskedScatterSubCpu(
      static_cast<T*>(out->untyped_data()), geometry.num_rows,
      geometry.row_size, index_data,
      static_cast<int64_t>(indices.element_count()),
      static_cast<const T*>(updates.untyped_data()),
      static_cast<const bool*>(row_mask.untyped_data()), parallelism);
  *bad_value =
      bad_position >= 0 ? static_cast<int64_t>(index_data[bad_position]) : 0;
  return bad_position;
}

template <typename T>
int64_t RunForIndexType(ffi::AnyBuffer table, ffi::AnyBuffer indices,
                        ffi::AnyBuffer updates, ffi::AnyBuffer row_mask,
                        ffi::Result<ffi::AnyBuffer> out,
                        const CpuParallelism& parallelism, int64_t* bad_value) {
  if (indices.element_type() == ffi::DataType::S64) {
    return RunCore<T, int64_t>(table, indices, updates, row_mask, out,
                               parallelism, bad_value);
  }
  return RunCore<T, int32_t>(table, indices, updates, row_mask, out,
                             parallelism, bad_value);
}

ffi::Error MaskedScatterSubHost(ffi::ThreadPool pool, ffi::AnyBuffer table,
                                ffi::AnyBuffer indices, ffi::AnyBuffer updates,
                                ffi::AnyBuffer row_mask,
                                ffi::Result<ffi::AnyBuffer> out) {
  // The XLA kernel has checked shapes and dtypes while compiling; these
  // checks guard the raw-pointer casts below against a mismatched caller.
  const ffi::DataType index_type = indices.element_type();
  if (index_type != ffi::DataType::S32 && index_type != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument("indices: must be int32 or int64");
  }
  if (row_mask.element_type() != ffi::DataType::PRED ||
      updates.element_type() != table.element_type()) {
    return ffi::Error::InvalidArgument(
        "row_mask must be bool and updates of the table's dtype");
  }
  const CpuParallelism parallelism = PoolParallelism(pool);
  int64_t bad_value = 0;
  int64_t bad_position = -1;
  switch (table.element_type()) {
    case ffi::DataType::F32:
      bad_position = RunForIndexType<float>(table, indices, updates, row_mask,
                                            out, parallelism, &bad_value);
      break;
    case ffi::DataType::F64:
      bad_position = RunForIndexType<double>(table, indices, updates, row_mask,
                                             out, parallelism, &bad_value);
      break;
    case ffi::DataType::F16:
      bad_position = RunForIndexType<Float16>(table, indices, updates, row_mask,
                                              out, parallelism, &bad_value);
      break;
    case ffi::DataType::BF16:
      bad_position = RunForIndexType<BFloat16>(
          table, indices, updates, row_mask, out, parallelism, &bad_value);
      break;
    default:
      return ffi::Error::InvalidArgument(
          "table: dtype must be float16, bfloat16, float32 or float64");
  }
  if (bad_position >= 0) {
    return ffi::Error::InvalidArgument(
        "indices" + IndexPosition(indices, bad_position) + " = " +
        std::to_string(bad_value) + " is not in [0, " +
        std::to_string(GeometryOf(table).num_rows) + "); nothing was written");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kMaskedScatterSubHostHandler, MaskedScatterSubHost,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()   // XLA's intra-op pool
                           .Arg<ffi::AnyBuffer>()    // table
                           .Arg<ffi::AnyBuffer>()    // indices
                           .Arg<ffi::AnyBuffer>()    // updates
                           .Arg<ffi::AnyBuffer>()    // row_mask
                           .Ret<ffi::AnyBuffer>());  // table, aliased

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedScatterSubTarget,
                         kHostPlatform, kMaskedScatterSubHostHandler);

}  // namespace partial_embedding
