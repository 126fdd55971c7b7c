// The MaskedSparseApplyAdam OpKernel (CPU), which also serves
// MaskedSparseApplyAdamWithSlotIndices (compact slots): looks the variable and
// its slots up, locks them in address order, validates every input before the
// first write, keeps in-place writes safe for readers without copy-on-read
// mode, and hands raw pointers to the TF-free core, whose plan (validation
// and grouping) runs before any buffer is copied or moved.
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cc/core/masked_sparse_apply.h"
#include "cc/kernels/in_place_update.h"
#include "cc/kernels/masked_sparse_apply_inputs.h"

namespace partial_embedding {
namespace {

// The message for a refused plan, naming the argument, the positions and the
// values.
template <typename Index>
absl::Status PlanError(const AdamInputError& error, const Tensor& indices,
                       const Index* index_data, const Index* slot_data,
                       int64_t num_rows, int64_t num_slot_rows) {
  using Kind = AdamInputError::Kind;
  const TensorShape& shape = indices.shape();
  const int64_t position = error.position;
  const int64_t earlier = error.earlier;
  switch (error.kind) {
    case Kind::kNone:
      return absl::OkStatus();
    case Kind::kIndexOutOfRange:
      return BadIndexError(shape, position,
                           static_cast<int64_t>(index_data[position]),
                           num_rows);
    case Kind::kSlotIndexOutOfRange:
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_indices", FormatIndexPosition(shape, position), " = ",
          static_cast<int64_t>(slot_data[position]), " is not in [0, ",
          num_slot_rows, "); nothing was written"));
    case Kind::kRowInTwoSlotRows:
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_indices: row ", static_cast<int64_t>(index_data[position]),
          " has slot row ", static_cast<int64_t>(slot_data[earlier]),
          " at slot_indices", FormatIndexPosition(shape, earlier),
          " and slot row ", static_cast<int64_t>(slot_data[position]),
          " at slot_indices", FormatIndexPosition(shape, position),
          "; every occurrence of a row must name the same slot row; nothing "
          "was written"));
    case Kind::kSlotRowOfTwoRows:
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_indices: rows ", static_cast<int64_t>(index_data[earlier]),
          " (indices", FormatIndexPosition(shape, earlier), ") and ",
          static_cast<int64_t>(index_data[position]), " (indices",
          FormatIndexPosition(shape, position), ") both have slot row ",
          static_cast<int64_t>(slot_data[position]),
          "; two permitted rows cannot share a slot row; nothing was "
          "written"));
  }
  return absl::InternalError("unknown plan error");
}

}  // namespace

// kWithSlotIndices: the op with a slot_indices input (compact slots).
template <typename T, typename Index, bool kWithSlotIndices>
class MaskedSparseApplyAdamOp : public OpKernel {
 public:
  explicit MaskedSparseApplyAdamOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("amsgrad", &amsgrad_));
    // use_locking is accepted but the locks are always held: see the op doc.
  }

  void Compute(OpKernelContext* ctx) override {
    VariableInputs tables;
    OP_REQUIRES_OK(
        ctx, tables.LookUp(ctx, absl::MakeConstSpan(adam_input::kTableNames,
                                                    amsgrad_ ? 4 : 3)));
    OrderedLocks<::tensorflow::mutex_lock> locks(tables);
    OP_REQUIRES_OK(ctx,
                   tables.CheckInitializedAndDtype(DataTypeToEnum<T>::value));
    OP_REQUIRES_OK(ctx, ValidateShapes(ctx, tables));

    const Tensor& indices = ctx->input(adam_input::kIndices);
    const Index* index_data = indices.flat<Index>().data();
    const int64_t num_indices = indices.NumElements();
    const Tensor* var = tables.tensor(adam_input::kVar);
    const int64_t num_rows = var->dim_size(0);
    const int64_t num_slot_rows = tables.tensor(1)->dim_size(0);
    SlotMap<Index> slot_map;
    if constexpr (kWithSlotIndices) {
      slot_map.slot_indices =
          ctx->input(adam_input::kSlotIndices).flat<Index>().data();
      slot_map.num_slot_rows = num_slot_rows;
    }
    // Validated and grouped before any table is copied or moved, so a failed
    // step leaves every buffer as it was.
    RowGroups groups;
    const AdamInputError error = PlanMaskedSparseApplyAdam(
        index_data, num_indices, num_rows, slot_map,
        ctx->input(kInputs.row_mask).flat<bool>().data(), &groups);
    OP_REQUIRES_OK(ctx,
                   PlanError(error, indices, index_data, slot_map.slot_indices,
                             num_rows, num_slot_rows));
    if (num_indices == 0 || var->NumElements() == 0) return;
    for (int i = 0; i < tables.size(); ++i) {
      OP_REQUIRES_OK(ctx, CopyIfShared<CPUDevice>(ctx, tables.tensor(i)));
    }

    using CoreT = typename CoreType<T>::type;
    auto table = [&](int i) {
      return reinterpret_cast<CoreT*>(tables.tensor(i)->flat<T>().data());
    };
    AdamTables<CoreT> core_tables;
    core_tables.var = table(0);
    core_tables.m = table(1);
    core_tables.v = table(2);
    core_tables.v_hat = amsgrad_ ? table(3) : nullptr;
    core_tables.num_rows = num_rows;
    core_tables.row_size = var->NumElements() / num_rows;
    auto scalar = [&](int i) {
      const T value = ctx->input(kInputs.first_scalar + i).scalar<T>()();
      CoreT core_value;
      std::memcpy(&core_value, &value, sizeof(value));
      return core_value;
    };
    // The scalar inputs come in the order of AdamHyperparameters' members.
    const AdamHyperparameters<CoreT> hyper{scalar(0), scalar(1), scalar(2),
                                           scalar(3), scalar(4), scalar(5)};
    ApplyPlannedAdamCpu(core_tables, groups, num_indices,
                        reinterpret_cast<const CoreT*>(
                            ctx->input(kInputs.grad).flat<T>().data()),
                        hyper, TfCpuParallelism(ctx));
  }

 private:
  static constexpr adam_input::LaterInputs kInputs{kWithSlotIndices};

  // The shapes, under the locks, before any write.
  absl::Status ValidateShapes(OpKernelContext* ctx,
                              const VariableInputs& tables) const {
    const TensorShape& var_shape = tables.tensor(adam_input::kVar)->shape();
    TF_RETURN_IF_ERROR(CheckHasRows("var", var_shape));
    if constexpr (kWithSlotIndices) {
      TF_RETURN_IF_ERROR(ValidateSlotShapes(ctx, tables, var_shape));
    } else {
      for (int i = 1; i < tables.size(); ++i) {
        const TensorShape& shape = tables.tensor(i)->shape();
        if (shape != var_shape) {
          return absl::InvalidArgumentError(absl::StrCat(
              adam_input::kTableNames[i], ": shape ", shape.DebugString(),
              " does not match var's shape ", var_shape.DebugString()));
        }
      }
    }
    TF_RETURN_IF_ERROR(
        CheckRowMaskAndValues(var_shape, ctx->input(kInputs.row_mask),
                              ctx->input(adam_input::kIndices),
                              ctx->input(kInputs.grad), "grad", "var"));
    for (int i = 0; i < adam_input::kNumScalars; ++i) {
      const Tensor& scalar = ctx->input(kInputs.first_scalar + i);
      if (scalar.dims() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(adam_input::kScalarNames[i], ": shape ",
                         scalar.shape().DebugString(), " must be a scalar"));
      }
    }
    return absl::OkStatus();
  }

  // Compact slots: every slot [S] + var.shape[1:] with the same S >= 1, and
  // slot_indices of indices' shape.
  static absl::Status ValidateSlotShapes(OpKernelContext* ctx,
                                         const VariableInputs& tables,
                                         const TensorShape& var_shape) {
    TensorShape row_shape = var_shape;
    row_shape.RemoveDim(0);
    const TensorShape& first_slot_shape = tables.tensor(1)->shape();
    for (int i = 1; i < tables.size(); ++i) {
      const char* name = adam_input::kTableNames[i];
      const TensorShape& shape = tables.tensor(i)->shape();
      if (shape.dims() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": shape ", shape.DebugString(),
                         " must be [S] + var.shape[1:] with S >= 1"));
      }
      if (shape.dim_size(0) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": shape ", shape.DebugString(),
                         " has no slot row (S must be >= 1)"));
      }
      TensorShape slot_row_shape = shape;
      slot_row_shape.RemoveDim(0);
      if (slot_row_shape != row_shape) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": shape ", shape.DebugString(),
                         " does not have var's row shape (var.shape[1:] = ",
                         row_shape.DebugString(), ")"));
      }
      if (shape != first_slot_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": shape ", shape.DebugString(), " does not match m's shape ",
            first_slot_shape.DebugString(),
            " (every slot has the same S rows)"));
      }
    }
    const Tensor& indices = ctx->input(adam_input::kIndices);
    const Tensor& slot_indices = ctx->input(adam_input::kSlotIndices);
    if (slot_indices.shape() != indices.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_indices: shape ", slot_indices.shape().DebugString(),
          " does not match indices' shape ", indices.shape().DebugString()));
    }
    return absl::OkStatus();
  }

  bool amsgrad_ = false;
};

#define PE_REGISTER_CPU(T, Index)                                        \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedSparseApplyAdam") \
                              .Device(::tensorflow::DEVICE_CPU)          \
                              .TypeConstraint<T>("dtype")                \
                              .TypeConstraint<Index>("Tindices"),        \
                          MaskedSparseApplyAdamOp<T, Index, false>);     \
  REGISTER_KERNEL_BUILDER(                                               \
      Name("PartialEmbedding>MaskedSparseApplyAdamWithSlotIndices")      \
          .Device(::tensorflow::DEVICE_CPU)                              \
          .TypeConstraint<T>("dtype")                                    \
          .TypeConstraint<Index>("Tindices"),                            \
      MaskedSparseApplyAdamOp<T, Index, true>);
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_CPU)
#undef PE_REGISTER_CPU

}  // namespace partial_embedding
