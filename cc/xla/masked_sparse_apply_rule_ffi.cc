// The XLA CPU custom-call handlers behind
// PartialEmbedding>MaskedSparseApplyRule (and its compact-slot twin) under XLA:
// decode the buffers and the rule through XLA's typed FFI and run the same
// TF-free fused driver as the TensorFlow kernel, for any rule of the table
// (cc/core/row_rules.h).
#include <cstdint>
#include <cstring>
#include <optional>
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
using xla_ffi::DecodeRuleCall;
using xla_ffi::DispatchTypes;
using xla_ffi::IndexPosition;
using xla_ffi::PoolParallelism;
using xla_ffi::RuleCall;
using xla_ffi::TableGeometry;

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

// Whether the custom call skips position i (XLA has no run-time errors, and
// its own scatters skip such indices): its index is outside [0, V), or, with
// slot indices, its slot index is negative (its row is then not checked).
template <typename Index>
bool Skipped(const RuleCall& call, const Index* rows, const Index* slots,
             int64_t i) {
  if (slots != nullptr && slots[i] < 0) return true;
  const auto row = static_cast<int64_t>(rows[i]);
  return row < 0 || row >= call.geometry.num_rows;
}

// Plans the step over the positions not skipped; the plan's positions, and
// an error's, are then mapped back to the call's. With none skipped it is the
// kernel's own plan.
template <typename Index>
RuleInputError PlanSkipping(const RuleCall& call, RowGroups* groups) {
  const auto* rows = static_cast<const Index*>(call.indices);
  const auto* slots = static_cast<const Index*>(call.slot_indices);
  const int64_t n = call.num_indices;
  int64_t first_skipped = 0;
  while (first_skipped < n && !Skipped(call, rows, slots, first_skipped)) {
    ++first_skipped;
  }
  if (first_skipped == n) return Plan<Index>(call, rows, slots, n, groups);
  std::vector<Index> kept_rows;
  std::vector<Index> kept_slots;
  std::vector<int64_t> original;
  for (int64_t i = 0; i < n; ++i) {
    if (Skipped(call, rows, slots, i)) continue;
    kept_rows.push_back(rows[i]);
    if (slots != nullptr) kept_slots.push_back(slots[i]);
    original.push_back(i);
  }
  RuleInputError error = Plan<Index>(
      call, kept_rows.data(), slots != nullptr ? kept_slots.data() : nullptr,
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

// Decodes the call (xla_ffi::DecodeRuleCall) and runs it on XLA's pool.
ffi::Error RunCall(ffi::ThreadPool& pool, std::string_view rule_name,
                   ffi::RemainingArgs args, ffi::RemainingRets rets,
                   bool with_slot_indices) {
  RuleCall call;
  ffi::DataType dtype = ffi::DataType::INVALID;
  std::optional<ffi::AnyBuffer> indices;
  ffi::Error error = DecodeRuleCall(
      rule_name, args, rets, with_slot_indices,
      [](const ffi::AnyBuffer& operand, ffi::Result<ffi::AnyBuffer>& result) {
        CopyIfNotAliased(operand, result);
        return ffi::Error::Success();
      },
      &call, &dtype, &indices);
  if (error.failure()) return error;
  const CpuParallelism parallelism = PoolParallelism(pool);
  return DispatchTypes(dtype, indices->element_type(), "var",
                       [&](auto value, auto index) {
                         return ApplyRule<decltype(value), decltype(index)>(
                             call, *indices, parallelism);
                       });
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
