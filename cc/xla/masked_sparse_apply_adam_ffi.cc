// The XLA CPU custom-call handlers behind
// PartialEmbedding>MaskedSparseApplyAdam under XLA (with and without AMSGrad):
// decode the buffers through XLA's typed FFI and run the same TF-free fused
// Adam driver as the TensorFlow kernel.
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/masked_sparse_apply.h"
#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"
#include "cc/kernels/masked_sparse_apply_inputs.h"
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

// The scalar hyperparameters: the op's, in its order, after the other
// operands.
using adam_input::kNumScalars;

// One call's buffers, once the results sit in the tables' buffers.
struct AdamCall {
  void* var = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  void* v_hat = nullptr;  // Null without AMSGrad.
  TableGeometry geometry;
  int64_t num_slot_rows = 0;
  const void* indices = nullptr;
  const void* slot_indices = nullptr;  // Null with full-size slots.
  int64_t num_indices = 0;
  const void* grad = nullptr;
  const bool* row_mask = nullptr;
  const void* scalars[kNumScalars] = {};
};

// The message for a refused plan, as the TensorFlow kernel words it.
template <typename Index>
std::string PlanErrorMessage(const AdamInputError& error,
                             const ffi::AnyBuffer& indices,
                             const AdamCall& call) {
  using Kind = AdamInputError::Kind;
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

// Plans the step. With slot indices, a position whose slot index is negative
// is left out before planning (its row is neither checked nor written); the
// plan's positions, and an error's, are then mapped back to the call's.
template <typename Index>
AdamInputError PlanSkipping(const AdamCall& call, RowGroups* groups) {
  const auto* rows = static_cast<const Index*>(call.indices);
  const auto* slots = static_cast<const Index*>(call.slot_indices);
  const int64_t n = call.num_indices;
  const int64_t num_rows = call.geometry.num_rows;
  if (slots == nullptr) {
    return PlanMaskedSparseApplyAdam<Index>(rows, n, num_rows, SlotMap<Index>{},
                                            call.row_mask, groups);
  }
  int64_t first_skipped = 0;
  while (first_skipped < n && slots[first_skipped] >= 0) ++first_skipped;
  if (first_skipped == n) {  // Nothing skipped: the kernel's own plan.
    return PlanMaskedSparseApplyAdam<Index>(
        rows, n, num_rows, SlotMap<Index>{slots, call.num_slot_rows},
        call.row_mask, groups);
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
  AdamInputError error = PlanMaskedSparseApplyAdam<Index>(
      kept_rows.data(), static_cast<int64_t>(kept_rows.size()), num_rows,
      SlotMap<Index>{kept_slots.data(), call.num_slot_rows}, call.row_mask,
      groups);
  for (int64_t& position : groups->positions) position = original[position];
  if (error.position >= 0) error.position = original[error.position];
  if (error.earlier >= 0) error.earlier = original[error.earlier];
  return error;
}

template <typename T, typename Index>
ffi::Error ApplyAdam(const AdamCall& call, const ffi::AnyBuffer& indices,
                     const CpuParallelism& parallelism) {
  const AdamTables<T> tables{
      static_cast<T*>(call.var), static_cast<T*>(call.m),
      static_cast<T*>(call.v),   static_cast<T*>(call.v_hat),
      call.geometry.num_rows,    call.geometry.row_size};
  const auto scalar = [&call](int i) {
    return *static_cast<const T*>(call.scalars[i]);
  };
  const AdamHyperparameters<T> hyper{scalar(0), scalar(1), scalar(2),
                                     scalar(3), scalar(4), scalar(5)};
  RowGroups groups;
  const AdamInputError error = PlanSkipping<Index>(call, &groups);
  if (!error.ok()) {
    return ffi::Error::InvalidArgument(
        PlanErrorMessage<Index>(error, indices, call));
  }
  ApplyPlannedAdamCpu<T>(tables, groups, call.num_indices,
                         static_cast<const T*>(call.grad), hyper, parallelism);
  return ffi::Error::Success();
}

template <typename T>
ffi::Error ApplyForIndexType(const AdamCall& call,
                             const ffi::AnyBuffer& indices,
                             const CpuParallelism& parallelism) {
  if (indices.element_type() == ffi::DataType::S64) {
    return ApplyAdam<T, int64_t>(call, indices, parallelism);
  }
  return ApplyAdam<T, int32_t>(call, indices, parallelism);
}

ffi::Error Dispatch(ffi::DataType dtype, const AdamCall& call,
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

// The tables as operands and results: var, m, v and, with AMSGrad, v_hat.
// Every result aliases its operand; the call writes the results' buffers.
ffi::Error RunCall(ffi::ThreadPool& pool, ffi::RemainingArgs args,
                   ffi::RemainingRets rets, bool with_slot_indices) {
  const size_t num_tables = rets.size();
  const size_t num_inputs = with_slot_indices ? 4 : 3;
  if (args.size() != num_tables + num_inputs + kNumScalars) {
    return ffi::Error::InvalidArgument("unexpected number of operands");
  }
  AdamCall call;
  void* tables[4] = {};
  for (size_t t = 0; t < num_tables; ++t) {
    auto operand = args.get<ffi::AnyBuffer>(t);
    auto result = rets.get<ffi::AnyBuffer>(t);
    if (!operand.has_value() || !result.has_value()) {
      return ffi::Error::InvalidArgument("the tables must be arrays");
    }
    CopyIfNotAliased(*operand, *result);
    tables[t] = (*result)->untyped_data();
    if (t == 1) call.num_slot_rows = GeometryOf(*operand).num_rows;
  }
  call.var = tables[0];
  call.m = tables[1];
  call.v = tables[2];
  call.v_hat = tables[3];
  ffi::AnyBuffer var = *args.get<ffi::AnyBuffer>(0);
  ffi::AnyBuffer indices = *args.get<ffi::AnyBuffer>(num_tables);
  call.geometry = GeometryOf(var);
  call.indices = indices.untyped_data();
  call.num_indices = static_cast<int64_t>(indices.element_count());
  size_t next = num_tables + 1;
  if (with_slot_indices) {
    call.slot_indices = args.get<ffi::AnyBuffer>(next++)->untyped_data();
  }
  call.grad = args.get<ffi::AnyBuffer>(next++)->untyped_data();
  call.row_mask = static_cast<const bool*>(
      args.get<ffi::AnyBuffer>(next++)->untyped_data());
  for (int i = 0; i < kNumScalars; ++i) {
    call.scalars[i] = args.get<ffi::AnyBuffer>(next++)->untyped_data();
  }
  return Dispatch(var.element_type(), call, indices, PoolParallelism(pool));
}

ffi::Error FullSlotsHost(ffi::ThreadPool pool, ffi::RemainingArgs args,
                         ffi::RemainingRets rets) {
  return RunCall(pool, args, rets, /*with_slot_indices=*/false);
}

ffi::Error CompactSlotsHost(ffi::ThreadPool pool, ffi::RemainingArgs args,
                            ffi::RemainingRets rets) {
  return RunCall(pool, args, rets, /*with_slot_indices=*/true);
}

}  // namespace

// Operands: the tables (3, or 4 with AMSGrad), indices, (slot_indices,) grad,
// row_mask, six scalars; results: the tables, each aliased to its operand.
XLA_FFI_DEFINE_HANDLER(
    kFullSlotsHostHandler, FullSlotsHost,
    ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().RemainingArgs().RemainingRets());
XLA_FFI_DEFINE_HANDLER(
    kCompactSlotsHostHandler, CompactSlotsHost,
    ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().RemainingArgs().RemainingRets());

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyAdamTarget,
                         kHostPlatform, kFullSlotsHostHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyAmsgradTarget,
                         kHostPlatform, kFullSlotsHostHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyAdamSlotsTarget,
                         kHostPlatform, kCompactSlotsHostHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyAmsgradSlotsTarget,
                         kHostPlatform, kCompactSlotsHostHandler);

}  // namespace partial_embedding
