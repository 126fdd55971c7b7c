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

constexpr int kIndices = 4;
constexpr int kNumScalars = 6;
constexpr const char* kTableNames[] = {"var", "m", "v", "v_hat"};

// Input positions: with slot indices, slot_indices follows indices and every
// later input moves by one.
struct Inputs {
  constexpr explicit Inputs(bool with_slot_indices)
      : grad(with_slot_indices ? kIndices + 2 : kIndices + 1),
        row_mask(grad + 1),
        first_scalar(grad + 2) {}
  int grad;
  int row_mask;
  int first_scalar;
};

// Reads var, m, v (and v_hat) into `operands`; their shapes go to `shapes`.
// Full-size slots have var's shape; compact ones [S] + var.shape[1:], the
// same S for every slot.
absl::Status ReadTables(XlaOpKernelContext* ctx, DataType dtype, int num_tables,
                        bool compact, std::vector<xla::XlaOp>* operands,
                        std::vector<TensorShape>* shapes) {
  for (int table = 0; table < num_tables; ++table) {
    TensorShape shape;
    xla::XlaOp value;
    TF_RETURN_IF_ERROR(ctx->ReadVariableInput(table, dtype, &shape, &value));
    if (table > 0) {
      TensorShape expected =
          table == 1 || !compact ? (*shapes)[0] : (*shapes)[1];
      if (compact && table == 1 && shape.dims() >= 1 && expected.dims() >= 1) {
        expected.set_dim(0, shape.dim_size(0));
      }
      if (shape != expected) {
        return absl::InvalidArgumentError(
            std::string(kTableNames[table]) + ": shape " + shape.DebugString() +
            " must be " + expected.DebugString() +
            (compact ? " (slots: [S] + var.shape[1:])" : " (var's shape)"));
      }
    }
    operands->push_back(value);
    shapes->push_back(shape);
  }
  return absl::OkStatus();
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
    constexpr Inputs kInputs(kWithSlotIndices);
    const int num_tables = amsgrad_ ? 4 : 3;
    std::vector<xla::XlaOp> operands;
    std::vector<TensorShape> shapes;
    OP_REQUIRES_OK(ctx, ReadTables(ctx, dtype_, num_tables, kWithSlotIndices,
                                   &operands, &shapes));
    OP_REQUIRES(
        ctx,
        !kWithSlotIndices ||
            (shapes[1].dims() >= 1 && shapes[1].dim_size(0) >= 1),
        absl::InvalidArgumentError("m: the slots need at least one row"));
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
      OP_REQUIRES_OK(ctx, InputDims(ctx, kIndices + 1, &slot_dims));
      OP_REQUIRES(
          ctx, slot_dims == contract.indices,
          absl::InvalidArgumentError(
              "slot_indices: shape " +
              FormatDims(slot_dims, ShapeNotation::kTensorFlow) +
              " does not match indices' shape " +
              FormatDims(contract.indices, ShapeNotation::kTensorFlow)));
      operands.push_back(ctx->Input(kIndices + 1));
    }
    operands.push_back(ctx->Input(kInputs.grad));
    operands.push_back(ctx->Input(kInputs.row_mask));
    for (int i = 0; i < kNumScalars; ++i) {
      Dims scalar;
      OP_REQUIRES_OK(ctx, InputDims(ctx, kInputs.first_scalar + i, &scalar));
      OP_REQUIRES(ctx, scalar.empty(),
                  absl::InvalidArgumentError(
                      "the hyperparameters must be scalars; input " +
                      std::to_string(kInputs.first_scalar + i) + " has shape " +
                      FormatDims(scalar, ShapeNotation::kTensorFlow)));
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
