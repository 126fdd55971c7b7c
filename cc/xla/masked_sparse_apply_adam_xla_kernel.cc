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
namespace {

using ::tensorflow::DataType;
using ::tensorflow::TensorShape;
using ::tensorflow::XlaOpKernel;
using ::tensorflow::XlaOpKernelContext;
using xla_kernel::DimsOf;
using xla_kernel::InputDims;

constexpr int kIndices = 4;
constexpr int kGrad = 5;
constexpr int kRowMask = 6;
constexpr int kFirstScalar = 7;
constexpr int kNumScalars = 6;
constexpr const char* kTableNames[] = {"var", "m", "v", "v_hat"};

class MaskedSparseApplyAdamXlaOp : public XlaOpKernel {
 public:
  explicit MaskedSparseApplyAdamXlaOp(::tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("amsgrad", &amsgrad_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    const int num_tables = amsgrad_ ? 4 : 3;
    std::vector<xla::XlaOp> operands;
    std::vector<int> variables;
    TensorShape var_shape;
    for (int table = 0; table < num_tables; ++table) {
      TensorShape shape;
      xla::XlaOp value;
      OP_REQUIRES_OK(ctx,
                     ctx->ReadVariableInput(table, dtype_, &shape, &value));
      if (table == 0) var_shape = shape;
      OP_REQUIRES(ctx, shape == var_shape,
                  absl::InvalidArgumentError(std::string(kTableNames[table]) +
                                             ": shape " + shape.DebugString() +
                                             " must be var's shape " +
                                             var_shape.DebugString()));
      operands.push_back(value);
      variables.push_back(table);
    }
    RowUpdateShapes shapes;
    shapes.var = DimsOf(var_shape);
    OP_REQUIRES_OK(ctx, InputDims(ctx, kRowMask, &shapes.row_mask));
    OP_REQUIRES_OK(ctx, InputDims(ctx, kIndices, &shapes.indices));
    OP_REQUIRES_OK(ctx, InputDims(ctx, kGrad, &shapes.values));
    shapes.values_name = "grad";
    const std::string problem =
        CheckRowUpdateShapes(shapes, ShapeNotation::kTensorFlow);
    OP_REQUIRES(ctx, problem.empty(), absl::InvalidArgumentError(problem));
    for (int input : {kIndices, kGrad, kRowMask}) {
      operands.push_back(ctx->Input(input));
    }
    for (int i = 0; i < kNumScalars; ++i) {
      Dims scalar;
      OP_REQUIRES_OK(ctx, InputDims(ctx, kFirstScalar + i, &scalar));
      OP_REQUIRES(ctx, scalar.empty(),
                  absl::InvalidArgumentError(
                      "the hyperparameters must be scalars; input " +
                      std::to_string(kFirstScalar + i) + " has shape " +
                      FormatDims(scalar, ShapeNotation::kTensorFlow)));
      operands.push_back(ctx->Input(kFirstScalar + i));
    }
    OP_REQUIRES_OK(ctx, xla_kernel::CustomCallUpdatingVariables(
                            ctx,
                            amsgrad_ ? kMaskedSparseApplyAmsgradTarget
                                     : kMaskedSparseApplyAdamTarget,
                            operands, variables, dtype_, var_shape));
  }

 private:
  DataType dtype_ = ::tensorflow::DT_INVALID;
  bool amsgrad_ = false;
};

REGISTER_XLA_OP(Name("PartialEmbedding>MaskedSparseApplyAdam")
                    .Device(::tensorflow::DEVICE_CPU_XLA_JIT)
                    .TypeConstraint("dtype", {::tensorflow::DT_HALF,
                                              ::tensorflow::DT_BFLOAT16,
                                              ::tensorflow::DT_FLOAT,
                                              ::tensorflow::DT_DOUBLE}),
                MaskedSparseApplyAdamXlaOp);

}  // namespace
}  // namespace partial_embedding
