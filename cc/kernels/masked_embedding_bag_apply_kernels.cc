// The MaskedEmbeddingBagApplyRule OpKernel, which also serves
// MaskedEmbeddingBagApplyRuleWithSlotMap (compact slots): looks the
// variable, its slots (and the slot map) up, locks them in address order,
// checks the shape contract of cc/core/embedding_bag_contract.h, then the
// TF-free core plans the step (ids, bags, slot rows) before the first write
// and applies it in one pass. Full-size slots go through the device's functor
// (masked_embedding_bag_apply_kernels.h): the CPU one is here
// (ApplyPlannedBagRuleCpu), the GPU one in
// masked_embedding_bag_apply_kernels.cu.cc.
#include "cc/kernels/masked_embedding_bag_apply_kernels.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cc/core/embedding_bag.h"
#include "cc/core/embedding_bag_contract.h"
#include "cc/core/masked_sparse_apply.h"
#include "cc/kernels/embedding_bag_kernels.h"
#include "cc/kernels/in_place_update.h"
#include "cc/kernels/masked_embedding_bag_apply_inputs.h"

namespace partial_embedding {
namespace {

// The variables, in lookup order: var, the rule's slots, then the slot
// map's two.
constexpr int kMaxNames = 1 + kMaxSlots + 2;

absl::Status SlotMapError(const SlotMapPlan& plan, int64_t num_slot_rows) {
  using Kind = SlotMapPlan::Kind;
  switch (plan.kind) {
    case Kind::kNone:
      return absl::OkStatus();
    case Kind::kNotASlotRow:
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_of_row[", plan.row, "] = ", plan.map_value,
          " is not a slot row (a whole number in [0, ", num_slot_rows,
          "), or negative for none); nothing was written"));
    case Kind::kSlotRowOfTwoRows:
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_of_row: rows ", plan.other_row, " and ", plan.row,
          " both have slot row ", plan.slot_row,
          "; two permitted rows cannot share a slot row; nothing was "
          "written"));
    case Kind::kTooManySlotRows:
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_rows_used: ", plan.needed, " slot rows is not in [0, ",
          kMaxBagSlotRows,
          "] (compact optimizer slots hold at most that many rows; use "
          "MaskedOptimizer(..., compact_slots=False)); nothing was written"));
  }
  return absl::InternalError("unknown slot map error");
}

// Replaces the value of slot variable `slot` by one of `rows` rows: its rows
// first, then `initial` (the value Keras' build fills the slot with).
// Requires the lock.
template <typename T>
absl::Status GrowSlot(OpKernelContext* ctx, Tensor* slot, int64_t rows,
                      T initial) {
  TensorShape shape = slot->shape();
  shape.set_dim(0, rows);
  ::tensorflow::AllocatorAttributes attr;
  attr.set_gpu_compatible(true);
  attr.set_nic_compatible(true);
  Tensor grown;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(slot->dtype(), shape, &grown, attr));
  T* data = grown.flat<T>().data();
  const int64_t kept = slot->NumElements();
  if (kept > 0) std::memcpy(data, slot->data(), slot->TotalBytes());
  std::fill(data + kept, data + grown.NumElements(), initial);
  *slot = grown;
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// The CPU specialization: the core's plan, then its step on TensorFlow's
// worker threads.

template <typename T, typename Index>
struct MaskedEmbeddingBagApplyRuleFunctor<CPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const BagRuleStepArgs<T, Index>& args,
                          BagInputError* error) const {
    using CoreT = CoreOf<T>;
    // Validated and grouped before any table is copied or moved, so a
    // refused batch leaves every buffer as it was.
    RowGroups groups;
    *error = PlanEmbeddingBagGrad(args.positions, args.row_mask, &groups);
    if (!error->ok() || groups.num_groups() == 0 || args.row_size == 0) {
      return absl::OkStatus();
    }
    TF_RETURN_IF_ERROR(CopySharedTables<CPUDevice>(ctx, *args.tables));
    RuleHyperparameters<CoreT> hyper{};
    std::memcpy(hyper.values, args.hyperparameters,
                sizeof(CoreT) * InfoOf(args.rule).num_hyperparameters);
    ApplyPlannedBagRuleCpu<CoreT>(
        args.rule,
        CoreTables<T>(*args.tables, args.rule, args.num_rows, args.row_size),
        groups, reinterpret_cast<const CoreT*>(args.grad), args.positions.bags,
        args.factors, hyper, TfCpuParallelism(ctx));
    return absl::OkStatus();
  }
};

namespace {

// ---------------------------------------------------------------------------
// The OpKernel. kWithSlotMap: the op with a slot map (compact slots): on the
// CPU its step is ComputeWithSlotMap, on the GPU the slot-map functor.
template <typename Device, typename T, typename Index, bool kWithSlotMap>
class MaskedEmbeddingBagApplyRuleOp : public OpKernel {
 public:
  explicit MaskedEmbeddingBagApplyRuleOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), inputs_(0, kWithSlotMap) {
    std::string name;
    int64_t num_slots = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots));
    OP_REQUIRES_OK(ctx, ContractStatus(RuleOfAttrs(name, num_slots, &rule_)));
    inputs_ = bag_rule_input::Positions(InfoOf(rule_).num_slots, kWithSlotMap);
  }

  void Compute(OpKernelContext* ctx) override {
    const RuleInfo& info = InfoOf(rule_);
    const int num_slots = info.num_slots;
    std::array<const char*, kMaxNames> names = {"var"};
    std::array<int, kMaxNames> input_of = {bag_rule_input::kVar};
    std::array<DataType, kMaxNames> dtypes;
    int count = 1 + num_slots;
    for (int i = 0; i < count; ++i) {
      if (i > 0) names[i] = info.slot_names[i - 1];
      input_of[i] = i;
      dtypes[i] = DataTypeToEnum<T>::value;
    }
    if constexpr (kWithSlotMap) {
      names[count] = "slot_of_row";
      input_of[count] = inputs_.slot_of_row;
      dtypes[count++] = ::tensorflow::DT_FLOAT;
      names[count] = "slot_rows_used";
      input_of[count] = inputs_.slot_rows_used;
      dtypes[count++] = ::tensorflow::DT_INT64;
    }
    VariableInputs tables;
    OP_REQUIRES_OK(ctx,
                   tables.LookUp(ctx, absl::MakeConstSpan(names.data(), count),
                                 absl::MakeConstSpan(input_of.data(), count)));
    OrderedLocks<::tensorflow::mutex_lock> locks(tables);
    OP_REQUIRES_OK(ctx, tables.CheckInitializedAndDtypes(
                            absl::MakeConstSpan(dtypes.data(), count)));

    const Tensor& grad = ctx->input(inputs_.grad);
    const Tensor& ids = ctx->input(inputs_.ids);
    const Tensor& bags = ctx->input(inputs_.bags);
    const TensorShape& var_shape = tables.tensor(bag_rule_input::kVar)->shape();
    OP_REQUIRES_OK(ctx, ValidateShapes(ctx, tables, num_slots));
    const int64_t num_rows = var_shape.dim_size(0);
    const int64_t row_size =
        num_rows == 0
            ? 0
            : tables.tensor(bag_rule_input::kVar)->NumElements() / num_rows;

    BagPositions<Index> positions;
    positions.ids = ids.flat<Index>().data();
    positions.bags = bags.flat<int64_t>().data();
    positions.num_positions = ids.dim_size(0);
    positions.num_bags = grad.dim_size(0);
    positions.num_rows = num_rows;
    if constexpr (!kWithSlotMap) {
      BagInputError bag_error;
      OP_REQUIRES_OK(
          ctx,
          MaskedEmbeddingBagApplyRuleFunctor<Device, T, Index>()(
              ctx, StepArgs(ctx, tables, positions, row_size), &bag_error));
      OP_REQUIRES(ctx, bag_error.ok(),
                  BagError(bag_error, num_rows, positions.num_bags));
    } else if constexpr (std::is_same_v<Device, CPUDevice>) {
      ComputeWithSlotMap(ctx, tables, num_slots, count, positions, row_size);
    } else {
      BagInputError bag_error;
      SlotMapPlan slot_plan;
      int64_t num_slot_rows = 0;
      OP_REQUIRES_OK(
          ctx,
          MaskedEmbeddingBagApplyRuleWithSlotMapFunctor<Device, T, Index>()(
              ctx, StepArgs(ctx, tables, positions, row_size),
              ctx->input(inputs_.slot_initial_values).flat<T>().data(),
              &bag_error, &slot_plan, &num_slot_rows));
      OP_REQUIRES(ctx, bag_error.ok(),
                  BagError(bag_error, num_rows, positions.num_bags));
      OP_REQUIRES_OK(ctx, SlotMapError(slot_plan, num_slot_rows));
    }
  }

 private:
  // What the device's functor takes: the tables, the rule and the inputs'
  // data.
  BagRuleStepArgs<T, Index> StepArgs(OpKernelContext* ctx,
                                     const VariableInputs& tables,
                                     const BagPositions<Index>& positions,
                                     int64_t row_size) const {
    using C = typename BagRuleStepArgs<T, Index>::Compute;
    BagRuleStepArgs<T, Index> args;
    args.tables = &tables;
    args.rule = rule_;
    args.num_rows = positions.num_rows;
    args.row_size = row_size;
    args.positions = positions;
    args.grad = ctx->input(inputs_.grad).flat<T>().data();
    args.factors = ctx->input(inputs_.factors).flat<C>().data();
    args.row_mask = ctx->input(inputs_.row_mask).flat<bool>().data();
    args.hyperparameters = ctx->input(inputs_.hyperparameters).flat<T>().data();
    return args;
  }

  // The compact-slot step on the CPU: the bag plan, then the slot rows from
  // the map (growing the slots where more rows are needed), then the step.
  void ComputeWithSlotMap(OpKernelContext* ctx, const VariableInputs& tables,
                          int num_slots, int count,
                          const BagPositions<Index>& positions,
                          int64_t row_size) {
    using CoreT = typename CoreType<T>::type;
    using C = typename Arith<CoreT>::Compute;
    const RuleInfo& info = InfoOf(rule_);
    const int64_t num_rows = positions.num_rows;
    const Tensor& grad = ctx->input(inputs_.grad);
    const Tensor& factors = ctx->input(inputs_.factors);
    const Tensor& row_mask = ctx->input(inputs_.row_mask);
    RowGroups groups;
    const BagInputError bag_error =
        PlanEmbeddingBagGrad(positions, row_mask.flat<bool>().data(), &groups);
    OP_REQUIRES(ctx, bag_error.ok(),
                BagError(bag_error, num_rows, positions.num_bags));

    // Without slots (plain SGD) a slot map has nothing to map: the slot rows
    // are only counted.
    int64_t num_slot_rows =
        num_slots > 0 ? tables.tensor(1)->dim_size(0) : kMaxBagSlotRows;
    Tensor* slot_of_row = tables.tensor(1 + num_slots);
    Tensor* rows_used = tables.tensor(2 + num_slots);
    const SlotMapPlan slot_plan = PlanSlotRowsFromMap(
        slot_of_row->flat<float>().data(), rows_used->scalar<int64_t>()(),
        num_slot_rows, kMaxBagSlotRows, &groups);
    OP_REQUIRES_OK(ctx, SlotMapError(slot_plan, num_slot_rows));
    if (groups.num_groups() == 0 || row_size == 0) return;

    // Writes from here on: every check has passed.
    const int64_t needed = slot_plan.rows_used_after;
    if (needed > num_slot_rows) {
      const int64_t rows = GrownSlotRows(needed, num_slot_rows);
      const T* initial =
          ctx->input(inputs_.slot_initial_values).flat<T>().data();
      for (int i = 1; i <= num_slots; ++i) {
        OP_REQUIRES_OK(ctx,
                       GrowSlot(ctx, tables.tensor(i), rows, initial[i - 1]));
      }
      num_slot_rows = rows;
    }
    for (int i = 0; i < count; ++i) {
      OP_REQUIRES_OK(ctx, CopyIfShared<CPUDevice>(ctx, tables.tensor(i)));
    }
    float* map = tables.tensor(1 + num_slots)->flat<float>().data();
    for (const int64_t g : slot_plan.new_groups) {
      map[groups.rows[g]] = static_cast<float>(groups.slot_rows[g]);
    }
    tables.tensor(2 + num_slots)->scalar<int64_t>()() =
        slot_plan.rows_used_after;
    RuleHyperparameters<CoreT> hyper{};
    std::memcpy(hyper.values, ctx->input(inputs_.hyperparameters).data(),
                sizeof(CoreT) * info.num_hyperparameters);
    RuleTables<CoreT> core;
    core.var = reinterpret_cast<CoreT*>(tables.tensor(0)->flat<T>().data());
    for (int i = 0; i < num_slots; ++i) {
      core.slots[i] =
          reinterpret_cast<CoreT*>(tables.tensor(1 + i)->flat<T>().data());
    }
    core.num_rows = num_rows;
    core.row_size = row_size;
    ApplyPlannedBagRuleCpu<CoreT>(
        rule_, core, groups,
        reinterpret_cast<const CoreT*>(grad.flat<T>().data()), positions.bags,
        factors.flat<C>().data(), hyper, TfCpuParallelism(ctx));
  }

  // The shape contract of cc/core/embedding_bag_contract.h and the
  // hyperparameters', under the locks, before any write.
  absl::Status ValidateShapes(OpKernelContext* ctx,
                              const VariableInputs& tables,
                              int num_slots) const {
    const auto input = [ctx](int i) { return DimsOf(ctx->input(i).shape()); };
    BagAdamShapes shapes;
    shapes.var = DimsOf(tables.tensor(bag_rule_input::kVar)->shape());
    for (int i = 1; i <= num_slots; ++i) {
      shapes.slots.push_back({tables.name(i), DimsOf(tables.tensor(i)->shape()),
                              InfoOf(rule_).per_row[i - 1]});
    }
    if constexpr (kWithSlotMap) {
      shapes.slot_of_row = DimsOf(tables.tensor(1 + num_slots)->shape());
      shapes.slot_rows_used = DimsOf(tables.tensor(2 + num_slots)->shape());
    }
    shapes.grad = input(inputs_.grad);
    shapes.positions = {input(inputs_.ids), input(inputs_.bags),
                        input(inputs_.factors), "factors"};
    shapes.row_mask = input(inputs_.row_mask);
    TF_RETURN_IF_ERROR(
        ContractStatus(CheckBagAdamShapes(shapes, ShapeNotation::kTensorFlow)));
    if constexpr (kWithSlotMap) {
      const Dims initial = input(inputs_.slot_initial_values);
      if (!CompatibleDims(initial, Dims{num_slots})) {
        return absl::InvalidArgumentError(
            absl::StrCat("slot_initial_values: shape ",
                         FormatDims(initial, ShapeNotation::kTensorFlow),
                         " must be [", num_slots, "] (one value a slot)"));
      }
    }
    return ContractStatus(CheckHyperparametersShape(
        rule_, input(inputs_.hyperparameters), ShapeNotation::kTensorFlow));
  }

  Rule rule_ = Rule::kSgd;
  bag_rule_input::Positions inputs_;
};

// The compute type of a TensorFlow value type: float, or double for double.
template <typename T>
using ComputeOf = typename Arith<typename CoreType<T>::type>::Compute;

}  // namespace

#define PE_REGISTER(DEVICE_TYPE, DeviceT, T, Index, ...)         \
  REGISTER_KERNEL_BUILDER(                                       \
      Name("PartialEmbedding>MaskedEmbeddingBagApplyRule")       \
          .Device(DEVICE_TYPE)                                   \
          .TypeConstraint<T>("dtype")                            \
          .TypeConstraint<Index>("Tindices")                     \
          .TypeConstraint<ComputeOf<T>>("Tcompute") __VA_ARGS__, \
      MaskedEmbeddingBagApplyRuleOp<DeviceT, T, Index, false>);
#define PE_REGISTER_CPU(T, Index)                                     \
  PE_REGISTER(::tensorflow::DEVICE_CPU, CPUDevice, T, Index, )        \
  REGISTER_KERNEL_BUILDER(                                            \
      Name("PartialEmbedding>MaskedEmbeddingBagApplyRuleWithSlotMap") \
          .Device(::tensorflow::DEVICE_CPU)                           \
          .TypeConstraint<T>("dtype")                                 \
          .TypeConstraint<Index>("Tindices")                          \
          .TypeConstraint<ComputeOf<T>>("Tcompute"),                  \
      MaskedEmbeddingBagApplyRuleOp<CPUDevice, T, Index, true>);
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_CPU)
#undef PE_REGISTER_CPU

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;

// The GPU functors are instantiated in
// masked_embedding_bag_apply_kernels.cu.cc. The resource handles and the
// slots' initial values stay in host memory; grad, ids, bags, factors,
// row_mask and the hyperparameters are read on the device, and so are the
// variables' values (the slot map and its count too).
#define PE_REGISTER_GPU(T, Index)                                         \
  extern template struct MaskedEmbeddingBagApplyRuleFunctor<GPUDevice, T, \
                                                            Index>;       \
  extern template struct MaskedEmbeddingBagApplyRuleWithSlotMapFunctor<   \
      GPUDevice, T, Index>;                                               \
  PE_REGISTER(::tensorflow::DEVICE_GPU, GPUDevice, T, Index,              \
              .HostMemory("var").HostMemory("slots"))                     \
  REGISTER_KERNEL_BUILDER(                                                \
      Name("PartialEmbedding>MaskedEmbeddingBagApplyRuleWithSlotMap")     \
          .Device(::tensorflow::DEVICE_GPU)                               \
          .TypeConstraint<T>("dtype")                                     \
          .TypeConstraint<Index>("Tindices")                              \
          .TypeConstraint<ComputeOf<T>>("Tcompute")                       \
          .HostMemory("var")                                              \
          .HostMemory("slots")                                            \
          .HostMemory("slot_of_row")                                      \
          .HostMemory("slot_rows_used")                                   \
          .HostMemory("slot_initial_values"),                             \
      MaskedEmbeddingBagApplyRuleOp<GPUDevice, T, Index, true>);
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_GPU)
#undef PE_REGISTER_GPU
#endif  // GOOGLE_CUDA
#undef PE_REGISTER

}  // namespace partial_embedding
