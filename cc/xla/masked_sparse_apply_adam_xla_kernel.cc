// The XLA lowering of PartialEmbedding>MaskedSparseApplyAdam on XLA's CPU
// backend: one typed-FFI custom call running the fused lazy Adam / AdamW /
// AMSGrad step over the variable and its slots, each result aliased to its
// table, so all of them are updated in place inside the cluster (instead of
// the stock path's deduplication, segment sum, slot gathers and scatters).
//
// The op is declared by the main op library (cc/ops/masked_sparse_apply_op.cc).
#include <string>
#include <vector>

#include "cc/core/row_update_contract.h"
#include "cc/kernels/masked_sparse_apply_inputs.h"
#include "cc/xla/custom_call_targets.h"
#include "cc/xla/xla_kernel_common.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"

namespace partial_embedding {
namespace adam_xla {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::TensorShape;
using ::tensorflow::XlaOpKernel;
using ::tensorflow::XlaOpKernelContext;
using xla_kernel::DimsOf;
using xla_kernel::InputDims;

using adam_input::kIndices;
using adam_input::kNumScalars;
using adam_input::kSlotIndices;
using adam_input::kTableNames;

// Reads var, m, v (and v_hat) into `operands` and their shapes into `shapes`,
// and checks the slots against the slot contract of
// cc/core/row_update_contract.h (full-size, or compact: [S] +
// var.shape[1:]).
absl::Status ReadTables(XlaOpKernelContext* ctx, DataType dtype, int num_tables,
                        bool compact, std::vector<xla::XlaOp>* operands,
                        std::vector<TensorShape>* shapes) {
  std::vector<SlotShape> slots;
  for (int table = 0; table < num_tables; ++table) {
    TensorShape shape;
    xla::XlaOp value;
    TF_RETURN_IF_ERROR(ctx->ReadVariableInput(table, dtype, &shape, &value));
    if (table > 0) slots.push_back({kTableNames[table], DimsOf(shape)});
    operands->push_back(value);
    shapes->push_back(shape);
  }
  const std::string problem = CheckSlotShapes(
      DimsOf((*shapes)[0]), slots, compact, ShapeNotation::kTensorFlow);
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(problem);
}

template <bool kWithSlotIndices>
class MaskedSparseApplyAdamXlaOp : public XlaOpKernel {
 public:
  explicit MaskedSparseApplyAdamXlaOp(::tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("amsgrad", &amsgrad_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    constexpr adam_input::LaterInputs kInputs(kWithSlotIndices);
    const int num_tables = amsgrad_ ? 4 : 3;
    std::vector<xla::XlaOp> operands;
    std::vector<TensorShape> shapes;
    OP_REQUIRES_OK(ctx, ReadTables(ctx, dtype_, num_tables, kWithSlotIndices,
                                   &operands, &shapes));
    std::vector<int> variables;
    for (int table = 0; table < num_tables; ++table) variables.push_back(table);
    RowUpdateShapes contract;
    contract.var = DimsOf(shapes[0]);
    OP_REQUIRES_OK(ctx, InputDims(ctx, kInputs.row_mask, &contract.row_mask));
    OP_REQUIRES_OK(ctx, InputDims(ctx, kIndices, &contract.indices));
    OP_REQUIRES_OK(ctx, InputDims(ctx, kInputs.grad, &contract.values));
    contract.values_name = "grad";
    const std::string problem =
        CheckRowUpdateShapes(contract, ShapeNotation::kTensorFlow);
    OP_REQUIRES(ctx, problem.empty(), absl::InvalidArgumentError(problem));
    operands.push_back(ctx->Input(kIndices));
    if (kWithSlotIndices) {
      Dims slot_dims;
      OP_REQUIRES_OK(ctx, InputDims(ctx, kSlotIndices, &slot_dims));
      const std::string slot_problem = CheckSlotIndicesShape(
          contract.indices, slot_dims, ShapeNotation::kTensorFlow);
      OP_REQUIRES(ctx, slot_problem.empty(),
                  absl::InvalidArgumentError(slot_problem));
      operands.push_back(ctx->Input(kSlotIndices));
    }
    operands.push_back(ctx->Input(kInputs.grad));
    operands.push_back(ctx->Input(kInputs.row_mask));
    for (int i = 0; i < kNumScalars; ++i) {
      Dims scalar;
      OP_REQUIRES_OK(ctx, InputDims(ctx, kInputs.first_scalar + i, &scalar));
      OP_REQUIRES(ctx, scalar.empty(),
                  absl::InvalidArgumentError(
                      std::string(adam_input::kScalarNames[i]) + ": shape " +
                      FormatDims(scalar, ShapeNotation::kTensorFlow) +
                      " must be a scalar"));
      operands.push_back(ctx->Input(kInputs.first_scalar + i));
    }
    OP_REQUIRES_OK(ctx,
                   xla_kernel::CustomCallUpdatingVariables(
                       ctx, Target(), operands, variables, dtype_, shapes));
  }

 private:
  const char* Target() const {
    if (kWithSlotIndices) {
      return amsgrad_ ? kMaskedSparseApplyAmsgradSlotsTarget
                      : kMaskedSparseApplyAdamSlotsTarget;
    }
    return amsgrad_ ? kMaskedSparseApplyAmsgradTarget
                    : kMaskedSparseApplyAdamTarget;
  }

  DataType dtype_ = ::tensorflow::DT_INVALID;
  bool amsgrad_ = false;
};

REGISTER_XLA_OP(Name("PartialEmbedding>MaskedSparseApplyAdam")
                    .Device(::tensorflow::DEVICE_CPU_XLA_JIT)
                    .TypeConstraint("dtype", {::tensorflow::DT_HALF,
                                              ::tensorflow::DT_BFLOAT16,
                                              ::tensorflow::DT_FLOAT,
                                              ::tensorflow::DT_DOUBLE}),
                MaskedSparseApplyAdamXlaOp<false>);

REGISTER_XLA_OP(Name("PartialEmbedding>MaskedSparseApplyAdamWithSlotIndices")
                    .Device(::tensorflow::DEVICE_CPU_XLA_JIT)
                    .TypeConstraint("dtype", {::tensorflow::DT_HALF,
                                              ::tensorflow::DT_BFLOAT16,
                                              ::tensorflow::DT_FLOAT,
                                              ::tensorflow::DT_DOUBLE}),
                MaskedSparseApplyAdamXlaOp<true>);

}  // namespace
}  // namespace adam_xla
}  // namespace partial_embedding
