// The MaskedSparseApplyRule OpKernel, which also serves
// MaskedSparseApplyRuleWithSlotIndices (compact slots): looks the variable and
// its slots up, locks them in address order, checks shapes and dtypes, and
// hands raw pointers to the device's functor, which validates every index
// before the first write and keeps in-place writes safe for readers without
// copy-on-read mode. The CPU functor is here: the TF-free core's plan
// (validation and grouping) runs before any buffer is copied or moved. The
// GPU one is in masked_sparse_apply_kernels.cu.cc.
#include "cc/kernels/masked_sparse_apply_kernels.h"

#include <array>
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

// The message for a refused step, naming the argument, the positions and the
// values.
absl::Status PlanError(const RuleInputError& error,
                       const RuleErrorValues& values, const Tensor& indices,
                       int64_t num_rows, int64_t num_slot_rows) {
  using Kind = RuleInputError::Kind;
  const TensorShape& shape = indices.shape();
  const int64_t position = error.position;
  const int64_t earlier = error.earlier;
  switch (error.kind) {
    case Kind::kNone:
      return absl::OkStatus();
    case Kind::kIndexOutOfRange:
      return BadIndexError(shape, position, values.index_at_position, num_rows);
    case Kind::kSlotIndexOutOfRange:
      return absl::InvalidArgumentError(
          absl::StrCat("slot_indices", FormatIndexPosition(shape, position),
                       " = ", values.slot_at_position, " is not in [0, ",
                       num_slot_rows, "); nothing was written"));
    case Kind::kRowInTwoSlotRows:
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_indices: row ", values.index_at_position, " has slot row ",
          values.slot_at_earlier, " at slot_indices",
          FormatIndexPosition(shape, earlier), " and slot row ",
          values.slot_at_position, " at slot_indices",
          FormatIndexPosition(shape, position),
          "; every occurrence of a row must name the same slot row; nothing "
          "was written"));
    case Kind::kSlotRowOfTwoRows:
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_indices: rows ", values.index_at_earlier, " (indices",
          FormatIndexPosition(shape, earlier), ") and ",
          values.index_at_position, " (indices",
          FormatIndexPosition(shape, position), ") both have slot row ",
          values.slot_at_position,
          "; two permitted rows cannot share a slot row; nothing was "
          "written"));
  }
  return absl::InternalError("unknown plan error");
}

}  // namespace

// ---------------------------------------------------------------------------
// The CPU specialization: the core's plan, then its step on TensorFlow's
// worker threads.

template <typename T, typename Index>
struct MaskedSparseApplyRuleFunctor<CPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedSparseApplyRuleArgs<T, Index>& args,
                          RuleInputError* error,
                          RuleErrorValues* values) const {
    using CoreT = CoreOf<T>;
    SlotMap<Index> slot_map;
    slot_map.slot_indices = args.slot_indices;
    slot_map.num_slot_rows = args.num_slot_rows;
    // Validated and grouped before any table is copied or moved, so a failed
    // step leaves every buffer as it was.
    RowGroups groups;
    *error =
        PlanMaskedSparseApply(args.indices, args.num_indices, args.num_rows,
                              slot_map, args.row_mask, &groups);
    *values = ErrorValuesOf(*error, args.indices, args.slot_indices);
    if (!error->ok() || args.num_indices == 0 ||
        args.num_rows * args.row_size == 0) {
      return absl::OkStatus();
    }
    TF_RETURN_IF_ERROR(CopySharedTables<CPUDevice>(ctx, *args.tables));
    RuleHyperparameters<CoreT> hyper{};
    std::memcpy(hyper.values, args.hyperparameters,
                sizeof(CoreT) * InfoOf(args.rule).num_hyperparameters);
    ApplyPlannedRuleCpu(
        args.rule,
        CoreTables<T>(*args.tables, args.rule, args.num_rows, args.row_size),
        groups, args.num_indices, reinterpret_cast<const CoreT*>(args.grad),
        hyper, TfCpuParallelism(ctx));
    return absl::OkStatus();
  }
};

// ---------------------------------------------------------------------------
// The OpKernel. kWithSlotIndices: the op with a slot_indices input (compact
// slots).
template <typename Device, typename T, typename Index, bool kWithSlotIndices>
class MaskedSparseApplyRuleOp : public OpKernel {
 public:
  explicit MaskedSparseApplyRuleOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), inputs_(0, kWithSlotIndices) {
    std::string name;
    int64_t num_slots = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots));
    OP_REQUIRES_OK(ctx, ContractStatus(RuleOfAttrs(name, num_slots, &rule_)));
    inputs_ = rule_input::Positions(InfoOf(rule_).num_slots, kWithSlotIndices);
    // use_locking is accepted but the locks are always held: see the op doc.
  }

  void Compute(OpKernelContext* ctx) override {
    const RuleInfo& info = InfoOf(rule_);
    std::array<const char*, 1 + kMaxSlots> names = {"var"};
    for (int i = 0; i < info.num_slots; ++i) names[i + 1] = info.slot_names[i];
    VariableInputs tables;
    OP_REQUIRES_OK(
        ctx, tables.LookUp(
                 ctx, absl::MakeConstSpan(names.data(), 1 + info.num_slots)));
    OrderedLocks<::tensorflow::mutex_lock> locks(tables);
    OP_REQUIRES_OK(ctx,
                   tables.CheckInitializedAndDtype(DataTypeToEnum<T>::value));
    OP_REQUIRES_OK(ctx, ValidateShapes(ctx, tables));

    const Tensor& indices = ctx->input(inputs_.indices);
    const Tensor* var = tables.tensor(rule_input::kVar);
    MaskedSparseApplyRuleArgs<T, Index> args;
    args.tables = &tables;
    args.rule = rule_;
    args.num_rows = var->dim_size(0);
    args.row_size = args.num_rows == 0 ? 0 : var->NumElements() / args.num_rows;
    args.indices = indices.flat<Index>().data();
    args.num_indices = indices.NumElements();
    args.num_slot_rows =
        info.num_slots == 0 ? args.num_rows : tables.tensor(1)->dim_size(0);
    if constexpr (kWithSlotIndices) {
      args.slot_indices = ctx->input(inputs_.slot_indices).flat<Index>().data();
    }
    args.grad = ctx->input(inputs_.grad).flat<T>().data();
    args.row_mask = ctx->input(inputs_.row_mask).flat<bool>().data();
    args.hyperparameters = ctx->input(inputs_.hyperparameters).flat<T>().data();
    RuleInputError error;
    RuleErrorValues values;
    OP_REQUIRES_OK(ctx, MaskedSparseApplyRuleFunctor<Device, T, Index>()(
                            ctx, args, &error, &values));
    OP_REQUIRES_OK(ctx, PlanError(error, values, indices, args.num_rows,
                                  args.num_slot_rows));
  }

 private:
  // The shapes, under the locks, before any write.
  absl::Status ValidateShapes(OpKernelContext* ctx,
                              const VariableInputs& tables) const {
    const TensorShape& var_shape = tables.tensor(rule_input::kVar)->shape();
    TF_RETURN_IF_ERROR(CheckHasRows("var", var_shape));
    TF_RETURN_IF_ERROR(CheckSlotTables(tables, rule_, kWithSlotIndices));
    if constexpr (kWithSlotIndices) {
      TF_RETURN_IF_ERROR(CheckSlotIndices(ctx->input(inputs_.indices),
                                          ctx->input(inputs_.slot_indices)));
    }
    TF_RETURN_IF_ERROR(CheckRowMaskAndValues(
        var_shape, ctx->input(inputs_.row_mask), ctx->input(inputs_.indices),
        ctx->input(inputs_.grad), "grad", "var"));
    return ContractStatus(CheckHyperparametersShape(
        rule_, DimsOf(ctx->input(inputs_.hyperparameters).shape()),
        ShapeNotation::kTensorFlow));
  }

  Rule rule_ = Rule::kSgd;
  rule_input::Positions inputs_;
};

#define PE_REGISTER(DEVICE_TYPE, DeviceT, T, Index, ...)                      \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedSparseApplyRule")      \
                              .Device(DEVICE_TYPE)                            \
                              .TypeConstraint<T>("dtype")                     \
                              .TypeConstraint<Index>("Tindices") __VA_ARGS__, \
                          MaskedSparseApplyRuleOp<DeviceT, T, Index, false>); \
  REGISTER_KERNEL_BUILDER(                                                    \
      Name("PartialEmbedding>MaskedSparseApplyRuleWithSlotIndices")           \
          .Device(DEVICE_TYPE)                                                \
          .TypeConstraint<T>("dtype")                                         \
          .TypeConstraint<Index>("Tindices") __VA_ARGS__,                     \
      MaskedSparseApplyRuleOp<DeviceT, T, Index, true>);
#define PE_REGISTER_CPU(T, Index) \
  PE_REGISTER(::tensorflow::DEVICE_CPU, CPUDevice, T, Index, )
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_CPU)
#undef PE_REGISTER_CPU

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;

// The GPU functors are instantiated in masked_sparse_apply_kernels.cu.cc. The
// resource handles stay in host memory; indices, gradient, mask and the
// hyperparameters are read on the device.
#define PE_REGISTER_GPU(T, Index)                                           \
  extern template struct MaskedSparseApplyRuleFunctor<GPUDevice, T, Index>; \
  PE_REGISTER(::tensorflow::DEVICE_GPU, GPUDevice, T, Index,                \
              .HostMemory("var").HostMemory("slots"))
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_GPU)
#undef PE_REGISTER_GPU
#endif  // GOOGLE_CUDA
#undef PE_REGISTER

}  // namespace partial_embedding
