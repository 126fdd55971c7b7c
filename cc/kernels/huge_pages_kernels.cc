// The AdviseHugePages OpKernel (CPU): advises a variable's buffer for
// transparent huge pages where it lies and collapses it into them (no copy).
#include <cstdint>

#include "cc/kernels/in_place_update.h"

namespace partial_embedding {

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
    // nothing to advise: not an error, the caller may come back later.
    static constexpr const char* kVariableName[] = {"resource"};
    VariableInputs variable;
    if (!variable.LookUp(ctx, kVariableName).ok()) return;
    OrderedLocks<::tensorflow::mutex_lock> lock(variable);
    if (!variable.variable(0)->is_initialized) return;
    bool advised_now = false;
    OP_REQUIRES_OK(ctx, AdviseHugePages(ctx, variable.tensor(0), min_bytes_,
                                        &advised_now));
    advised->scalar<bool>()() = advised_now;
  }

 private:
  int64_t min_bytes_ = 0;
};

REGISTER_KERNEL_BUILDER(
    Name("PartialEmbedding>AdviseHugePages").Device(::tensorflow::DEVICE_CPU),
    AdviseHugePagesOp);

}  // namespace partial_embedding
