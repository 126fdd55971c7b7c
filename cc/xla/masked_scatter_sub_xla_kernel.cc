// The XLA lowering of PartialEmbedding>MaskedScatterSub on XLA's CPU backend
// (and its CUDA backend, where the CUDA handlers are built):
// instead of TensorFlow's stock scatter ops, the compiled cluster calls our
// own row update as a typed-FFI custom call whose result aliases the table,
// so the table is updated in place inside the cluster.
//
// The op itself is declared by the main op library
// (cc/ops/masked_scatter_sub_op.cc), which must be loaded first; this library
// only adds the XLA kernel and the handler (cc/xla/masked_scatter_sub_ffi.cc).
#include <string>

#include "cc/core/row_update_contract.h"
#include "cc/xla/custom_call_targets.h"
#include "cc/xla/xla_kernel_common.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"

namespace partial_embedding {
namespace scatter_sub_xla {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::TensorShape;
using ::tensorflow::XlaOpKernel;
using ::tensorflow::XlaOpKernelContext;
using xla_kernel::DimsOf;
using xla_kernel::InputDims;

constexpr int kResource = 0;
constexpr int kIndices = 1;
constexpr int kUpdates = 2;
constexpr int kRowMask = 3;

class MaskedScatterSubXlaOp : public XlaOpKernel {
 public:
  explicit MaskedScatterSubXlaOp(::tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
  }

  void Compile(XlaOpKernelContext* ctx) override {
    TensorShape table_shape;
    xla::XlaOp table;
    OP_REQUIRES_OK(
        ctx, ctx->ReadVariableInput(kResource, dtype_, &table_shape, &table));
    // The shapes are static inside a cluster: check the contract once, at
    // compile time, with the messages the TensorFlow kernel gives.
    RowUpdateShapes shapes;
    shapes.var = DimsOf(table_shape);
    OP_REQUIRES_OK(ctx, InputDims(ctx, kRowMask, &shapes.row_mask));
    OP_REQUIRES_OK(ctx, InputDims(ctx, kIndices, &shapes.indices));
    OP_REQUIRES_OK(ctx, InputDims(ctx, kUpdates, &shapes.values));
    shapes.var_name = "variable";
    const std::string problem =
        CheckRowUpdateShapes(shapes, ShapeNotation::kTensorFlow);
    OP_REQUIRES(ctx, problem.empty(), absl::InvalidArgumentError(problem));

    OP_REQUIRES_OK(ctx, xla_kernel::CustomCallUpdatingVariables(
                            ctx, kMaskedScatterSubTarget,
                            {table, ctx->Input(kIndices), ctx->Input(kUpdates),
                             ctx->Input(kRowMask)},
                            {kResource}, dtype_, table_shape));
  }

 private:
  DataType dtype_ = ::tensorflow::DT_INVALID;
};

// XLA_CPU_JIT always; XLA_GPU_JIT only where the CUDA handlers are built
// (PE_XLA_CUDA_HANDLERS): elsewhere a GPU cluster must keep failing to compile
// this op rather than find no handler at run time.
#define PE_REGISTER_SCATTER_SUB_XLA(DEVICE)                                   \
  REGISTER_XLA_OP(                                                            \
      Name("PartialEmbedding>MaskedScatterSub")                               \
          .Device(DEVICE)                                                     \
          .TypeConstraint("dtype",                                            \
                          {::tensorflow::DT_HALF, ::tensorflow::DT_BFLOAT16,  \
                           ::tensorflow::DT_FLOAT, ::tensorflow::DT_DOUBLE}), \
      MaskedScatterSubXlaOp)
PE_REGISTER_SCATTER_SUB_XLA(::tensorflow::DEVICE_CPU_XLA_JIT);
#if defined(PE_XLA_CUDA_HANDLERS)
PE_REGISTER_SCATTER_SUB_XLA(::tensorflow::DEVICE_GPU_XLA_JIT);
#endif
#undef PE_REGISTER_SCATTER_SUB_XLA

}  // namespace
}  // namespace scatter_sub_xla
}  // namespace partial_embedding
