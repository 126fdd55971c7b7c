// The AdviseHugePages OpKernel (CPU): copies a variable's value into a fresh
// buffer prepared for transparent huge pages and swaps it in.
#include <cstdint>

#include "cc/kernels/in_place_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace partial_embedding {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;

class AdviseHugePagesOp : public OpKernel {
 public:
  explicit AdviseHugePagesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_bytes", &min_bytes_));
    OP_REQUIRES(ctx, min_bytes_ >= 0,
                absl::InvalidArgumentError(
                    absl::StrCat("min_bytes: must be >= 0, got ", min_bytes_)));
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor* advised = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &advised));
    advised->scalar<bool>()() = false;
    // A variable without a value yet (created, initializer not run) has
    // nothing to move: not an error, the caller may come back later.
    ::tensorflow::core::RefCountPtr<Var> variable;
    if (!::tensorflow::LookupResource(
             ctx, ::tensorflow::HandleFromInput(ctx, 0), &variable)
             .ok()) {
      return;
    }
    ::tensorflow::mutex_lock lock(*variable->mu());
    if (!variable->is_initialized) return;
    bool moved = false;
    OP_REQUIRES_OK(
        ctx, MoveToHugePages(ctx, variable->tensor(), min_bytes_, &moved));
    advised->scalar<bool>()() = moved;
  }

 private:
  int64_t min_bytes_ = 0;
};

REGISTER_KERNEL_BUILDER(
    Name("PartialEmbedding>AdviseHugePages").Device(::tensorflow::DEVICE_CPU),
    AdviseHugePagesOp);

}  // namespace partial_embedding
