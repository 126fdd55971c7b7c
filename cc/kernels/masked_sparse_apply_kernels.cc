// The MaskedSparseApplyAdam OpKernel (CPU): looks the variable and its slots
// up, locks them in address order, validates every input before the first
// write, keeps in-place writes safe for readers without copy-on-read mode,
// and hands raw pointers to the TF-free core's driver.
#include <cstdint>
#include <cstring>

#include "absl/types/span.h"
#include "cc/core/masked_sparse_apply.h"
#include "cc/kernels/in_place_update.h"
#include "cc/ops/masked_sparse_apply_inputs.h"

namespace partial_embedding {

template <typename T, typename Index>
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
    // Reported before any table is copied or moved, so a failed step leaves
    // every buffer as it was (the driver checks again before it writes).
    const int64_t bad = FindFirstBadIndex(index_data, num_indices, num_rows);
    OP_REQUIRES(ctx, bad < 0,
                BadIndexError(indices.shape(), bad,
                              static_cast<int64_t>(index_data[bad]), num_rows));
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
      const T value = ctx->input(adam_input::kFirstScalar + i).scalar<T>()();
      CoreT core_value;
      std::memcpy(&core_value, &value, sizeof(value));
      return core_value;
    };
    // The scalar inputs come in the order of AdamHyperparameters' members.
    const AdamHyperparameters<CoreT> hyper{scalar(0), scalar(1), scalar(2),
                                           scalar(3), scalar(4), scalar(5)};
    MaskedSparseApplyAdamCpu(
        core_tables, index_data, num_indices,
        reinterpret_cast<const CoreT*>(
            ctx->input(adam_input::kGrad).flat<T>().data()),
        ctx->input(adam_input::kRowMask).flat<bool>().data(), hyper,
        TfCpuParallelism(ctx));
  }

 private:
  // The shapes, under the locks, before any write.
  absl::Status ValidateShapes(OpKernelContext* ctx,
                              const VariableInputs& tables) const {
    const TensorShape& var_shape = tables.tensor(adam_input::kVar)->shape();
    TF_RETURN_IF_ERROR(CheckHasRows("var", var_shape));
    for (int i = 1; i < tables.size(); ++i) {
      const TensorShape& shape = tables.tensor(i)->shape();
      if (shape != var_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            adam_input::kTableNames[i], ": shape ", shape.DebugString(),
            " does not match var's shape ", var_shape.DebugString()));
      }
    }
    TF_RETURN_IF_ERROR(
        CheckRowMaskAndValues(var_shape, ctx->input(adam_input::kRowMask),
                              ctx->input(adam_input::kIndices),
                              ctx->input(adam_input::kGrad), "grad", "var"));
    for (int i = 0; i < adam_input::kNumScalars; ++i) {
      const Tensor& scalar = ctx->input(adam_input::kFirstScalar + i);
      if (scalar.dims() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(adam_input::kScalarNames[i], ": shape ",
                         scalar.shape().DebugString(), " must be a scalar"));
      }
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
                          MaskedSparseApplyAdamOp<T, Index>);
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_CPU)
#undef PE_REGISTER_CPU

}  // namespace partial_embedding
