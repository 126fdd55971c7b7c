// The XLA lowering of PartialEmbedding>MaskedSparseApplyRule (and its
// compact-slot twin) on XLA's CPU backend: one typed-FFI custom call running
// the fused step of the op's rule (cc/core/row_rules.h) over the variable and
// its slots, each result aliased to its table, so all of them are updated in
// place inside the cluster (instead of the stock path's deduplication,
// segment sum, slot gathers and scatters). The rule travels as the call's
// attribute.
//
// The op is declared by the main op library (cc/ops/masked_sparse_apply_op.cc).
#include <string>
#include <vector>

#include "cc/core/row_rules.h"
#include "cc/core/row_update_contract.h"
#include "cc/kernels/masked_sparse_apply_inputs.h"
#include "cc/xla/custom_call_targets.h"
#include "cc/xla/xla_kernel_common.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"

namespace partial_embedding {
namespace rule_xla {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::TensorShape;
using ::tensorflow::XlaOpKernel;
using ::tensorflow::XlaOpKernelContext;
using xla_kernel::ContractStatus;
using xla_kernel::DimsOf;
using xla_kernel::InputDims;

// Reads var and the rule's slots into `operands` and their shapes into
// `shapes`, and checks the slots against the slot contract of
// cc/core/row_update_contract.h (full-size, or compact: [S] +
// var.shape[1:]; per-row slots [V] or [S]).
absl::Status ReadTables(XlaOpKernelContext* ctx, DataType dtype, Rule rule,
                        bool compact, std::vector<xla::XlaOp>* operands,
                        std::vector<TensorShape>* shapes) {
  const RuleInfo& info = InfoOf(rule);
  std::vector<SlotShape> slots;
  for (int table = 0; table <= info.num_slots; ++table) {
    TensorShape shape;
    xla::XlaOp value;
    TF_RETURN_IF_ERROR(ctx->ReadVariableInput(rule_input::kVar + table, dtype,
                                              &shape, &value));
    if (table > 0) {
      slots.push_back(
          {info.slot_names[table - 1], DimsOf(shape), info.per_row[table - 1]});
    }
    operands->push_back(value);
    shapes->push_back(shape);
  }
  return ContractStatus(CheckSlotShapes(DimsOf((*shapes)[0]), slots, compact,
                                        ShapeNotation::kTensorFlow));
}

template <bool kWithSlotIndices>
class MaskedSparseApplyRuleXlaOp : public XlaOpKernel {
 public:
  explicit MaskedSparseApplyRuleXlaOp(::tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
    std::string rule_name;
    int64_t num_slots = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &rule_name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots));
    OP_REQUIRES_OK(ctx,
                   ContractStatus(RuleOfAttrs(rule_name, num_slots, &rule_)));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    const RuleInfo& info = InfoOf(rule_);
    const rule_input::Positions inputs(info.num_slots, kWithSlotIndices);
    std::vector<xla::XlaOp> operands;
    std::vector<TensorShape> shapes;
    OP_REQUIRES_OK(ctx, ReadTables(ctx, dtype_, rule_, kWithSlotIndices,
                                   &operands, &shapes));
    std::vector<int> variables;
    for (int table = 0; table <= info.num_slots; ++table) {
      variables.push_back(rule_input::kVar + table);
    }
    RowUpdateShapes contract;
    contract.var = DimsOf(shapes[0]);
    OP_REQUIRES_OK(ctx, InputDims(ctx, inputs.row_mask, &contract.row_mask));
    OP_REQUIRES_OK(ctx, InputDims(ctx, inputs.indices, &contract.indices));
    OP_REQUIRES_OK(ctx, InputDims(ctx, inputs.grad, &contract.values));
    contract.values_name = "grad";
    OP_REQUIRES_OK(ctx, ContractStatus(CheckRowUpdateShapes(
                            contract, ShapeNotation::kTensorFlow)));
    operands.push_back(ctx->Input(inputs.indices));
    if (kWithSlotIndices) {
      Dims slot_dims;
      OP_REQUIRES_OK(ctx, InputDims(ctx, inputs.slot_indices, &slot_dims));
      OP_REQUIRES_OK(
          ctx, ContractStatus(CheckSlotIndicesShape(
                   contract.indices, slot_dims, ShapeNotation::kTensorFlow)));
      operands.push_back(ctx->Input(inputs.slot_indices));
    }
    operands.push_back(ctx->Input(inputs.grad));
    operands.push_back(ctx->Input(inputs.row_mask));
    Dims hyperparameter_dims;
    OP_REQUIRES_OK(
        ctx, InputDims(ctx, inputs.hyperparameters, &hyperparameter_dims));
    OP_REQUIRES_OK(
        ctx, ContractStatus(CheckHyperparametersShape(
                 rule_, hyperparameter_dims, ShapeNotation::kTensorFlow)));
    operands.push_back(ctx->Input(inputs.hyperparameters));
    // The FFI attributes, as the MLIR dictionary XLA's CPU runtime parses
    // from the call's backend_config once, when it builds the call frame.
    const std::string attributes =
        std::string("{") + kRuleAttribute + " = \"" + info.name + "\"}";
    OP_REQUIRES_OK(ctx, xla_kernel::CustomCallUpdatingVariables(
                            ctx,
                            kWithSlotIndices ? kMaskedSparseApplyRuleSlotsTarget
                                             : kMaskedSparseApplyRuleTarget,
                            operands, variables, dtype_, shapes, attributes));
  }

 private:
  DataType dtype_ = ::tensorflow::DT_INVALID;
  Rule rule_ = Rule::kSgd;
};

// XLA_CPU_JIT always; XLA_GPU_JIT only where the CUDA handlers are built
// (PE_XLA_CUDA_HANDLERS), as for MaskedScatterSub.
#define PE_REGISTER_RULE_XLA(DEVICE)                                          \
  REGISTER_XLA_OP(                                                            \
      Name("PartialEmbedding>MaskedSparseApplyRule")                          \
          .Device(DEVICE)                                                     \
          .TypeConstraint("dtype",                                            \
                          {::tensorflow::DT_HALF, ::tensorflow::DT_BFLOAT16,  \
                           ::tensorflow::DT_FLOAT, ::tensorflow::DT_DOUBLE}), \
      MaskedSparseApplyRuleXlaOp<false>);                                     \
  REGISTER_XLA_OP(                                                            \
      Name("PartialEmbedding>MaskedSparseApplyRuleWithSlotIndices")           \
          .Device(DEVICE)                                                     \
          .TypeConstraint("dtype",                                            \
                          {::tensorflow::DT_HALF, ::tensorflow::DT_BFLOAT16,  \
                           ::tensorflow::DT_FLOAT, ::tensorflow::DT_DOUBLE}), \
      MaskedSparseApplyRuleXlaOp<true>)
PE_REGISTER_RULE_XLA(::tensorflow::DEVICE_CPU_XLA_JIT);
#if defined(PE_XLA_CUDA_HANDLERS)
PE_REGISTER_RULE_XLA(::tensorflow::DEVICE_GPU_XLA_JIT);
#endif
#undef PE_REGISTER_RULE_XLA

}  // namespace
}  // namespace rule_xla
}  // namespace partial_embedding
