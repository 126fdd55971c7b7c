// The MaskedScatterSub OpKernel: looks the variable up, validates every input
// before the first write, keeps in-place writes safe for readers without
// copy-on-read mode, and hands raw pointers to the TF-free core.
#include "cc/kernels/masked_scatter_sub_kernels.h"

#include <cstdint>

#include "cc/core/masked_scatter_sub.h"
#include "cc/kernels/in_place_update.h"

namespace partial_embedding {
namespace {

constexpr int kIndices = 1;
constexpr int kUpdates = 2;
constexpr int kRowMask = 3;

}  // namespace

// ---------------------------------------------------------------------------
// The CPU specialization: the core's driver on TensorFlow's worker threads.

template <typename T, typename Index>
struct MaskedScatterSubFunctor<CPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedScatterSubArgs<T, Index>& args,
                          int64_t* bad_position, int64_t* bad_value) const {
    using CoreT = typename CoreType<T>::type;
    *bad_position =
        MaskedScatterSubCpu(reinterpret_cast<CoreT*>(args.var), args.num_rows,
                            args.row_size, args.indices, args.num_indices,
                            reinterpret_cast<const CoreT*>(args.updates),
                            args.row_mask, TfCpuParallelism(ctx));
    *bad_value = *bad_position >= 0
                     ? static_cast<int64_t>(args.indices[*bad_position])
                     : 0;
    return absl::OkStatus();
  }
};

// ---------------------------------------------------------------------------
// The OpKernel.

template <typename Device, typename T, typename Index>
class MaskedScatterSubOp : public OpKernel {
 public:
  explicit MaskedScatterSubOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_locking", &use_locking_));
  }

  void Compute(OpKernelContext* ctx) override {
    static constexpr const char* kVariableName[] = {"resource"};
    VariableInputs variable;
    OP_REQUIRES_OK(ctx, variable.LookUp(ctx, kVariableName));

    if (!use_locking_) {
      TensorShape validated_shape;
      {
        OrderedLocks<::tensorflow::mutex_lock> lock(variable);
        OP_REQUIRES_OK(ctx, ValidateAndPrepare(ctx, variable));
        validated_shape = variable.tensor(0)->shape();
      }
      {
        OrderedLocks<::tensorflow::tf_shared_lock> lock(variable);
        Tensor* params = variable.tensor(0);
        // A reader may have taken the buffer between the two locks, or a
        // writer replaced it; then fall through to the exclusive path.
        if (variable.variable(0)->is_initialized && params->RefCountIsOne() &&
            params->dtype() == DataTypeToEnum<T>::value &&
            params->shape() == validated_shape) {
          Apply(ctx, params);
          return;
        }
      }
    }
    OrderedLocks<::tensorflow::mutex_lock> lock(variable);
    OP_REQUIRES_OK(ctx, ValidateAndPrepare(ctx, variable));
    Apply(ctx, variable.tensor(0));
  }

 private:
  // Checks everything but the index values (the functor checks those before
  // it writes), then makes sure no reader shares the buffer.
  absl::Status ValidateAndPrepare(OpKernelContext* ctx,
                                  const VariableInputs& variable) {
    TF_RETURN_IF_ERROR(variable.CheckInitializedAndDtype(
        DataTypeToEnum<T>::value, /*dtype_source=*/"updates"));
    Tensor* params = variable.tensor(0);
    TF_RETURN_IF_ERROR(CheckHasRows("resource", params->shape()));
    TF_RETURN_IF_ERROR(CheckRowMaskAndValues(
        params->shape(), ctx->input(kRowMask), ctx->input(kIndices),
        ctx->input(kUpdates), "updates", "variable"));
    // A reader still holding the buffer keeps its snapshot.
    return CopyIfShared<Device>(ctx, params);
  }

  void Apply(OpKernelContext* ctx, Tensor* params) {
    const Tensor& indices = ctx->input(kIndices);
    const Tensor& updates = ctx->input(kUpdates);
    const Tensor& row_mask = ctx->input(kRowMask);
    MaskedScatterSubArgs<T, Index> args;
    args.var = params->flat<T>().data();
    args.num_rows = params->dim_size(0);
    args.row_size =
        args.num_rows == 0 ? 0 : params->NumElements() / args.num_rows;
    args.indices = indices.flat<Index>().data();
    args.num_indices = indices.NumElements();
    args.updates = updates.flat<T>().data();
    args.row_mask = row_mask.flat<bool>().data();
    if (args.num_indices == 0) return;
    int64_t bad_position = -1;
    int64_t bad_value = 0;
    OP_REQUIRES_OK(ctx, MaskedScatterSubFunctor<Device, T, Index>()(
                            ctx, args, &bad_position, &bad_value));
    OP_REQUIRES(
        ctx, bad_position < 0,
        BadIndexError(indices.shape(), bad_position, bad_value, args.num_rows));
  }

  bool use_locking_ = true;
};

#define PE_REGISTER_CPU(T, Index)                                   \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedScatterSub") \
                              .Device(::tensorflow::DEVICE_CPU)     \
                              .TypeConstraint<T>("dtype")           \
                              .TypeConstraint<Index>("Tindices"),   \
                          MaskedScatterSubOp<CPUDevice, T, Index>);
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_CPU)
#undef PE_REGISTER_CPU

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;

// The GPU functors are instantiated in masked_scatter_sub_kernels.cu.cc.
#define PE_REGISTER_GPU(T, Index)                                      \
  extern template struct MaskedScatterSubFunctor<GPUDevice, T, Index>; \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedScatterSub")    \
                              .Device(::tensorflow::DEVICE_GPU)        \
                              .HostMemory("resource")                  \
                              .TypeConstraint<T>("dtype")              \
                              .TypeConstraint<Index>("Tindices"),      \
                          MaskedScatterSubOp<GPUDevice, T, Index>);
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_GPU)
#undef PE_REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace partial_embedding
