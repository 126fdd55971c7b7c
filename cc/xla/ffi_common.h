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
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "cc/core/parallel_for.h"
#include "cc/core/row_rules.h"
#include "cc/core/row_update_common.h"
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

// Calls `run(T{}, Index{})` with the core value type of `dtype` (float,
// double, Float16, BFloat16) and the index type of `index_type` (int32_t,
// int64_t), or returns the error naming the argument (`table_argument` for
// the dtype). The XLA kernels checked both while compiling; this guards the
// raw-pointer casts against a mismatched caller.
template <typename Run>
ffi::Error DispatchTypes(ffi::DataType dtype, ffi::DataType index_type,
                         const char* table_argument, const Run& run) {
  if (index_type != ffi::DataType::S32 && index_type != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument("indices: must be int32 or int64");
  }
  const auto with_index = [&](auto value) -> ffi::Error {
    if (index_type == ffi::DataType::S64) return run(value, int64_t{});
    return run(value, int32_t{});
  };
  switch (dtype) {
    case ffi::DataType::F32:
      return with_index(float{});
    case ffi::DataType::F64:
      return with_index(double{});
    case ffi::DataType::F16:
      return with_index(Float16{});
    case ffi::DataType::BF16:
      return with_index(BFloat16{});
    default:
      return ffi::Error::InvalidArgument(
          std::string(table_argument) +
          ": dtype must be float16, bfloat16, float32 or float64");
  }
}

// MaskedScatterSub's other operands: a bool row mask, updates of the table's
// dtype (the raw-pointer casts rely on both).
inline ffi::Error CheckScatterOperands(const ffi::AnyBuffer& table,
                                       const ffi::AnyBuffer& updates,
                                       const ffi::AnyBuffer& row_mask) {
  if (row_mask.element_type() != ffi::DataType::PRED ||
      updates.element_type() != table.element_type()) {
    return ffi::Error::InvalidArgument(
        "row_mask must be bool and updates of the table's dtype");
  }
  return ffi::Error::Success();
}

// One rule call's buffers (MaskedSparseApplyRule and its compact-slot twin),
// once the results sit in the tables' buffers: what the Host and the CUDA
// handlers decode alike.
struct RuleCall {
  Rule rule = Rule::kSgd;
  void* var = nullptr;
  void* slots[kMaxSlots] = {};  // The rule's, in its order; null past them.
  TableGeometry geometry;
  int64_t num_slot_rows = 0;
  const void* indices = nullptr;
  const void* slot_indices = nullptr;  // Null with full-size slots.
  int64_t num_indices = 0;
  const void* grad = nullptr;
  const bool* row_mask = nullptr;
  const void* hyperparameters = nullptr;  // The rule's count, in its order.
};

// Decodes a rule call. Operands: var, the rule's slots, indices,
// (slot_indices,) grad, row_mask, hyperparameters; results: var and the
// slots, each aliased to its operand. `bind(operand, result)` makes the
// result hold the operand's values (nothing to do when they are aliased) and
// returns an error on failure. Sets *dtype to var's element type and
// *indices to the indices operand.
template <typename Bind>
ffi::Error DecodeRuleCall(std::string_view rule_name, ffi::RemainingArgs args,
                          ffi::RemainingRets rets, bool with_slot_indices,
                          const Bind& bind, RuleCall* call,
                          ffi::DataType* dtype,
                          std::optional<ffi::AnyBuffer>* indices) {
  if (!RuleFromName(std::string(rule_name).c_str(), &call->rule)) {
    return ffi::Error::InvalidArgument("rule: '" + std::string(rule_name) +
                                       "' is not a rule of the table");
  }
  const RuleInfo& info = InfoOf(call->rule);
  const size_t num_tables = 1 + static_cast<size_t>(info.num_slots);
  const size_t num_inputs = with_slot_indices ? 5 : 4;
  if (rets.size() != num_tables || args.size() != num_tables + num_inputs) {
    return ffi::Error::InvalidArgument(
        "unexpected number of operands or results for rule '" +
        std::string(info.name) + "'");
  }
  for (size_t t = 0; t < num_tables; ++t) {
    auto operand = args.get<ffi::AnyBuffer>(t);
    auto result = rets.get<ffi::AnyBuffer>(t);
    if (!operand.has_value() || !result.has_value()) {
      return ffi::Error::InvalidArgument("the tables must be arrays");
    }
    ffi::Error error = bind(*operand, *result);
    if (error.failure()) return error;
    void* data = (*result)->untyped_data();
    if (t == 0) {
      call->var = data;
    } else {
      call->slots[t - 1] = data;
    }
  }
  const ffi::AnyBuffer var = *args.get<ffi::AnyBuffer>(0);
  *dtype = var.element_type();
  indices->emplace(*args.get<ffi::AnyBuffer>(num_tables));
  call->geometry = GeometryOf(var);
  // As the kernel: a rule without slots checks slot indices against [0, V).
  call->num_slot_rows = info.num_slots == 0
                            ? call->geometry.num_rows
                            : GeometryOf(*args.get<ffi::AnyBuffer>(1)).num_rows;
  call->indices = (*indices)->untyped_data();
  call->num_indices = static_cast<int64_t>((*indices)->element_count());
  size_t next = num_tables + 1;
  if (with_slot_indices) {
    call->slot_indices = args.get<ffi::AnyBuffer>(next++)->untyped_data();
  }
  call->grad = args.get<ffi::AnyBuffer>(next++)->untyped_data();
  call->row_mask = static_cast<const bool*>(
      args.get<ffi::AnyBuffer>(next++)->untyped_data());
  const ffi::AnyBuffer hyperparameters = *args.get<ffi::AnyBuffer>(next++);
  if (hyperparameters.element_count() !=
      static_cast<size_t>(info.num_hyperparameters)) {
    return ffi::Error::InvalidArgument(
        "hyperparameters: " + std::to_string(hyperparameters.element_count()) +
        " given; rule '" + std::string(info.name) + "' has " +
        std::to_string(info.num_hyperparameters));
  }
  call->hyperparameters = hyperparameters.untyped_data();
  return ffi::Error::Success();
}

}  // namespace xla_ffi
}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_XLA_FFI_COMMON_H_
