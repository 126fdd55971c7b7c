// The XLA CPU custom-call handlers behind
// PartialEmbedding>MaskedSparseApplyRule (and its compact-slot twin) under XLA:
// decode the buffers and the rule through XLA's typed FFI and run the same
// TF-free fused driver as the TensorFlow kernel, for any rule of the table
// (cc/core/row_rules.h).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/masked_sparse_apply.h"
#include "cc/core/parallel_for.h"
#include "cc/core/row_rules.h"
#include "cc/core/row_update_common.h"
#include "cc/xla/custom_call_targets.h"
#include "cc/xla/ffi_common.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace partial_embedding {
namespace {

namespace ffi = ::xla::ffi;
using xla_ffi::CopyIfNotAliased;
using xla_ffi::GeometryOf;
using xla_ffi::IndexPosition;
using xla_ffi::PoolParallelism;
using xla_ffi::TableGeometry;

// One call's buffers, once the results sit in the tables' buffers.
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

// The message for a refused plan, as the TensorFlow kernel words it.
template <typename Index>
std::string PlanErrorMessage(const RuleInputError& error,
                             const ffi::AnyBuffer& indices,
                             const RuleCall& call) {
  using Kind = RuleInputError::Kind;
  const auto* rows = static_cast<const Index*>(call.indices);
  const auto* slots = static_cast<const Index*>(call.slot_indices);
  const auto at = [&indices](int64_t position) {
    return IndexPosition(indices, position);
  };
  const auto str = [](auto value) {
    return std::to_string(static_cast<int64_t>(value));
  };
  const int64_t p = error.position;
  const int64_t e = error.earlier;
  switch (error.kind) {
    case Kind::kIndexOutOfRange:
      return "indices" + at(p) + " = " + str(rows[p]) + " is not in [0, " +
             str(call.geometry.num_rows) + "); nothing was written";
    case Kind::kSlotIndexOutOfRange:
      return "slot_indices" + at(p) + " = " + str(slots[p]) +
             " is not in [0, " + str(call.num_slot_rows) +
             "); nothing was written";
    case Kind::kRowInTwoSlotRows:
      return "slot_indices: row " + str(rows[p]) + " has slot row " +
             str(slots[e]) + " at slot_indices" + at(e) + " and slot row " +
             str(slots[p]) + " at slot_indices" + at(p) +
             "; every occurrence of a row must name the same slot row; "
             "nothing was written";
    case Kind::kSlotRowOfTwoRows:
      return "slot_indices: rows " + str(rows[e]) + " (indices" + at(e) +
             ") and " + str(rows[p]) + " (indices" + at(p) +
             ") both have slot row " + str(slots[p]) +
             "; two permitted rows cannot share a slot row; nothing was "
             "written";
    case Kind::kNone:
      break;
  }
  return "unknown plan error";
}

// The kernel's plan of the step over `rows` (and `slots`: null with
// full-size slots).
template <typename Index>
RuleInputError Plan(const RuleCall& call, const Index* rows, const Index* slots,
                    int64_t n, RowGroups* groups) {
  return PlanMaskedSparseApply<Index>(rows, n, call.geometry.num_rows,
                                      SlotMap<Index>{slots, call.num_slot_rows},
                                      call.row_mask, groups);
}

// Plans the step. With slot indices, a position whose slot index is negative
// is left out before planning (its row is neither checked nor written); the
// plan's positions, and an error's, are then mapped back to the call's.
template <typename Index>
RuleInputError PlanSkipping(const RuleCall& call, RowGroups* groups) {
  const auto* rows = static_cast<const Index*>(call.indices);
  const auto* slots = static_cast<const Index*>(call.slot_indices);
  const int64_t n = call.num_indices;
  int64_t first_skipped = 0;
  while (slots != nullptr && first_skipped < n && slots[first_skipped] >= 0) {
    ++first_skipped;
  }
  if (slots == nullptr || first_skipped == n) {  // The kernel's own plan.
    return Plan<Index>(call, rows, slots, n, groups);
  }
  std::vector<Index> kept_rows;
  std::vector<Index> kept_slots;
  std::vector<int64_t> original;
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;
    kept_rows.push_back(rows[i]);
    kept_slots.push_back(slots[i]);
    original.push_back(i);
  }
  RuleInputError error =
      Plan<Index>(call, kept_rows.data(), kept_slots.data(),
                  static_cast<int64_t>(kept_rows.size()), groups);
  for (int64_t& position : groups->positions) position = original[position];
  if (error.position >= 0) error.position = original[error.position];
  if (error.earlier >= 0) error.earlier = original[error.earlier];
  return error;
}

template <typename T, typename Index>
ffi::Error ApplyRule(const RuleCall& call, const ffi::AnyBuffer& indices,
                     const CpuParallelism& parallelism) {
  RuleTables<T> tables;
  tables.var = static_cast<T*>(call.var);
  for (int i = 0; i < kMaxSlots; ++i) {
    tables.slots[i] = static_cast<T*>(call.slots[i]);
  }
  tables.num_rows = call.geometry.num_rows;
  tables.row_size = call.geometry.row_size;
  RuleHyperparameters<T> hyper{};
  std::memcpy(hyper.values, call.hyperparameters,
              sizeof(T) * InfoOf(call.rule).num_hyperparameters);
  RowGroups groups;
  const RuleInputError error = PlanSkipping<Index>(call, &groups);
  if (!error.ok()) {
    return ffi::Error::InvalidArgument(
        PlanErrorMessage<Index>(error, indices, call));
  }
  ApplyPlannedRuleCpu<T>(call.rule, tables, groups, call.num_indices,
                         static_cast<const T*>(call.grad), hyper, parallelism);
  return ffi::Error::Success();
}

template <typename T>
ffi::Error ApplyForIndexType(const RuleCall& call,
                             const ffi::AnyBuffer& indices,
                             const CpuParallelism& parallelism) {
  if (indices.element_type() == ffi::DataType::S64) {
    return ApplyRule<T, int64_t>(call, indices, parallelism);
  }
  return ApplyRule<T, int32_t>(call, indices, parallelism);
}

ffi::Error Dispatch(ffi::DataType dtype, const RuleCall& call,
                    const ffi::AnyBuffer& indices,
                    const CpuParallelism& parallelism) {
  const ffi::DataType index_type = indices.element_type();
  if (index_type != ffi::DataType::S32 && index_type != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument("indices: must be int32 or int64");
  }
  switch (dtype) {
    case ffi::DataType::F32:
      return ApplyForIndexType<float>(call, indices, parallelism);
    case ffi::DataType::F64:
      return ApplyForIndexType<double>(call, indices, parallelism);
    case ffi::DataType::F16:
      return ApplyForIndexType<Float16>(call, indices, parallelism);
    case ffi::DataType::BF16:
      return ApplyForIndexType<BFloat16>(call, indices, parallelism);
    default:
      return ffi::Error::InvalidArgument(
          "var: dtype must be float16, bfloat16, float32 or float64");
  }
}

// The tables as operands and results: var, then the rule's slots. Every
// result aliases its operand; the call writes the results' buffers.
ffi::Error RunCall(ffi::ThreadPool& pool, std::string_view rule_name,
                   ffi::RemainingArgs args, ffi::RemainingRets rets,
                   bool with_slot_indices) {
  RuleCall call;
  if (!RuleFromName(std::string(rule_name).c_str(), &call.rule)) {
    return ffi::Error::InvalidArgument("rule: '" + std::string(rule_name) +
                                       "' is not a rule of the table");
  }
  const RuleInfo& info = InfoOf(call.rule);
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
    CopyIfNotAliased(*operand, *result);
    void* data = (*result)->untyped_data();
    if (t == 0) {
      call.var = data;
    } else {
      call.slots[t - 1] = data;
    }
  }
  ffi::AnyBuffer var = *args.get<ffi::AnyBuffer>(0);
  ffi::AnyBuffer indices = *args.get<ffi::AnyBuffer>(num_tables);
  call.geometry = GeometryOf(var);
  // As the kernel: a rule without slots checks slot indices against [0, V).
  call.num_slot_rows = info.num_slots == 0
                           ? call.geometry.num_rows
                           : GeometryOf(*args.get<ffi::AnyBuffer>(1)).num_rows;
  call.indices = indices.untyped_data();
  call.num_indices = static_cast<int64_t>(indices.element_count());
  size_t next = num_tables + 1;
  if (with_slot_indices) {
    call.slot_indices = args.get<ffi::AnyBuffer>(next++)->untyped_data();
  }
  call.grad = args.get<ffi::AnyBuffer>(next++)->untyped_data();
  call.row_mask = static_cast<const bool*>(
      args.get<ffi::AnyBuffer>(next++)->untyped_data());
  ffi::AnyBuffer hyperparameters = *args.get<ffi::AnyBuffer>(next++);
  if (hyperparameters.element_count() !=
      static_cast<size_t>(info.num_hyperparameters)) {
    return ffi::Error::InvalidArgument(
        "hyperparameters: " + std::to_string(hyperparameters.element_count()) +
        " given; rule '" + std::string(info.name) + "' has " +
        std::to_string(info.num_hyperparameters));
  }
  call.hyperparameters = hyperparameters.untyped_data();
  return Dispatch(var.element_type(), call, indices, PoolParallelism(pool));
}

ffi::Error FullSlotsHost(ffi::ThreadPool pool, std::string_view rule,
                         ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return RunCall(pool, rule, args, rets, /*with_slot_indices=*/false);
}

ffi::Error CompactSlotsHost(ffi::ThreadPool pool, std::string_view rule,
                            ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return RunCall(pool, rule, args, rets, /*with_slot_indices=*/true);
}

}  // namespace

// Attribute: the rule's name. Operands: var, the rule's slots, indices,
// (slot_indices,) grad, row_mask, hyperparameters; results: var and the
// slots, each aliased to its operand.
XLA_FFI_DEFINE_HANDLER(kFullSlotsHostHandler, FullSlotsHost,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Attr<std::string_view>(kRuleAttribute)
                           .RemainingArgs()
                           .RemainingRets());
XLA_FFI_DEFINE_HANDLER(kCompactSlotsHostHandler, CompactSlotsHost,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Attr<std::string_view>(kRuleAttribute)
                           .RemainingArgs()
                           .RemainingRets());

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyRuleTarget,
                         kHostPlatform, kFullSlotsHostHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyRuleSlotsTarget,
                         kHostPlatform, kCompactSlotsHostHandler);

}  // namespace partial_embedding
