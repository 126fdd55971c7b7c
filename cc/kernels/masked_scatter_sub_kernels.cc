// The MaskedScatterSub OpKernel: looks the variable up, validates every input
// before the first write, keeps in-place writes safe for readers without
// copy-on-read mode, and hands raw pointers to the TF-free core.
#include "cc/kernels/masked_scatter_sub_kernels.h"

#include <cstring>
#include <limits>
#include <string>

#include "cc/core/masked_scatter_sub.h"
#include "cc/kernels/in_place_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace partial_embedding {

using ::tensorflow::DataTypeString;
using ::tensorflow::DataTypeToEnum;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;
using CPUDevice = Eigen::ThreadPoolDevice;

// ---------------------------------------------------------------------------
// CPU specializations.

template <typename T, typename Index>
struct MaskedScatterSubFunctor<CPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedScatterSubArgs<T, Index>& args,
                          int64_t* bad_position, int64_t* bad_value) const {
    using CoreT = typename CoreType<T>::type;
    *bad_position =
        FindFirstBadIndex(args.indices, args.num_indices, args.num_rows);
    if (*bad_position >= 0) {
      *bad_value = static_cast<int64_t>(args.indices[*bad_position]);
      return absl::OkStatus();
    }
    auto* var = reinterpret_cast<CoreT*>(args.var);
    const auto* updates = reinterpret_cast<const CoreT*>(args.updates);
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    const int num_shards =
        RecommendedShards(args.num_indices, args.row_size, workers.num_threads);
    auto run_shards = [&](int64_t begin, int64_t end) {
      for (int64_t shard = begin; shard < end; ++shard) {
        MaskedScatterSubShard(var, args.row_size, args.indices,
                              args.num_indices, updates, args.row_mask,
                              static_cast<int>(shard), num_shards);
      }
    };
    if (num_shards == 1) {
      run_shards(0, 1);
    } else {
      // A cost this high gives every shard a thread of its own.
      constexpr int64_t kCostPerShard = int64_t{1} << 40;
      ::tensorflow::Shard(num_shards, workers.workers, num_shards,
                          kCostPerShard, run_shards);
    }
    return absl::OkStatus();
  }
};

template <>
absl::Status CopyDeviceBuffer<CPUDevice>(OpKernelContext*, void* dst,
                                         const void* src, int64_t bytes) {
  std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The OpKernel.

template <typename Device, typename T, typename Index>
class MaskedScatterSubOp : public OpKernel {
 public:
  explicit MaskedScatterSubOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_locking", &use_locking_));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::core::RefCountPtr<Var> variable;
    const absl::Status lookup = ::tensorflow::LookupResource(
        ctx, ::tensorflow::HandleFromInput(ctx, 0), &variable);
    OP_REQUIRES(ctx, lookup.ok(),
                absl::NotFoundError(absl::StrCat(
                    "resource: the variable is not initialized (no value has "
                    "been assigned to it yet): ",
                    lookup.message())));

    if (!use_locking_) {
      TensorShape validated_shape;
      {
        ::tensorflow::mutex_lock lock(*variable->mu());
        OP_REQUIRES_OK(ctx, ValidateAndPrepare(ctx, variable.get()));
        validated_shape = variable->tensor()->shape();
      }
      {
        ::tensorflow::tf_shared_lock lock(*variable->mu());
        Tensor* params = variable->tensor();
        // A reader may have taken the buffer between the two locks, or a
        // writer replaced it; then fall through to the exclusive path.
        if (variable->is_initialized && params->RefCountIsOne() &&
            params->dtype() == DataTypeToEnum<T>::value &&
            params->shape() == validated_shape) {
          Apply(ctx, params);
          return;
        }
      }
    }
    ::tensorflow::mutex_lock lock(*variable->mu());
    OP_REQUIRES_OK(ctx, ValidateAndPrepare(ctx, variable.get()));
    Apply(ctx, variable->tensor());
  }

 private:
  // Checks everything but the index values (the functor checks those before
  // it writes), then makes sure no reader shares the buffer.
  absl::Status ValidateAndPrepare(OpKernelContext* ctx, Var* variable) {
    if (!variable->is_initialized) {
      return absl::FailedPreconditionError(
          "resource: the variable is not initialized (no value has been "
          "assigned to it yet)");
    }
    Tensor* params = variable->tensor();
    const Tensor& indices = ctx->input(1);
    const Tensor& updates = ctx->input(2);
    const Tensor& row_mask = ctx->input(3);
    if (params->dtype() != DataTypeToEnum<T>::value) {
      return absl::InvalidArgumentError(absl::StrCat(
          "updates: dtype ", DataTypeString(DataTypeToEnum<T>::value),
          " does not match the variable's dtype ",
          DataTypeString(params->dtype())));
    }
    if (params->dims() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("resource: the variable must have rank >= 1, got shape ",
                       params->shape().DebugString()));
    }
    const int64_t num_rows = params->dim_size(0);
    if (row_mask.dims() != 1 || row_mask.dim_size(0) != num_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row_mask: shape ", row_mask.shape().DebugString(), " must be [",
          num_rows, "] (one entry per row of the variable of shape ",
          params->shape().DebugString(), ")"));
    }
    TensorShape expected_updates = indices.shape();
    for (int d = 1; d < params->dims(); ++d) {
      expected_updates.AddDim(params->dim_size(d));
    }
    if (updates.shape() != expected_updates) {
      return absl::InvalidArgumentError(absl::StrCat(
          "updates: shape ", updates.shape().DebugString(), " must be ",
          expected_updates.DebugString(),
          " (indices.shape + variable.shape[1:]) for indices of shape ",
          indices.shape().DebugString(), " and a variable of shape ",
          params->shape().DebugString()));
    }
    // A reader still holding the buffer keeps its snapshot.
    TF_RETURN_IF_ERROR(CopyIfShared<Device>(ctx, params));
    return absl::OkStatus();
  }

  void Apply(OpKernelContext* ctx, Tensor* params) {
    const Tensor& indices = ctx->input(1);
    const Tensor& updates = ctx->input(2);
    const Tensor& row_mask = ctx->input(3);
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
        absl::InvalidArgumentError(absl::StrCat(
            "indices", FormatIndexPosition(indices.shape(), bad_position),
            " = ", bad_value, " is not in [0, ", args.num_rows,
            "); nothing was written")));
  }

  bool use_locking_ = true;
};

#define PE_REGISTER_CPU(T, Index)                                   \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedScatterSub") \
                              .Device(::tensorflow::DEVICE_CPU)     \
                              .TypeConstraint<T>("dtype")           \
                              .TypeConstraint<Index>("Tindices"),   \
                          MaskedScatterSubOp<CPUDevice, T, Index>);
#define PE_REGISTER_CPU_ALL_INDICES(T) \
  PE_REGISTER_CPU(T, int32_t)          \
  PE_REGISTER_CPU(T, int64_t)
PE_REGISTER_CPU_ALL_INDICES(Eigen::half)
PE_REGISTER_CPU_ALL_INDICES(Eigen::bfloat16)
PE_REGISTER_CPU_ALL_INDICES(float)
PE_REGISTER_CPU_ALL_INDICES(double)
#undef PE_REGISTER_CPU_ALL_INDICES
#undef PE_REGISTER_CPU

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;

// Defined in masked_scatter_sub_kernels.cu.cc.
template <>
absl::Status CopyDeviceBuffer<GPUDevice>(OpKernelContext* ctx, void* dst,
                                         const void* src, int64_t bytes);

#define PE_DECLARE_GPU(T, Index) \
  extern template struct MaskedScatterSubFunctor<GPUDevice, T, Index>;
#define PE_REGISTER_GPU(T, Index)                                   \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedScatterSub") \
                              .Device(::tensorflow::DEVICE_GPU)     \
                              .HostMemory("resource")               \
                              .TypeConstraint<T>("dtype")           \
                              .TypeConstraint<Index>("Tindices"),   \
                          MaskedScatterSubOp<GPUDevice, T, Index>);
#define PE_GPU_ALL(T)         \
  PE_DECLARE_GPU(T, int32_t)  \
  PE_DECLARE_GPU(T, int64_t)  \
  PE_REGISTER_GPU(T, int32_t) \
  PE_REGISTER_GPU(T, int64_t)
PE_GPU_ALL(Eigen::half)
PE_GPU_ALL(Eigen::bfloat16)
PE_GPU_ALL(float)
PE_GPU_ALL(double)
#undef PE_GPU_ALL
#undef PE_REGISTER_GPU
#undef PE_DECLARE_GPU
#endif  // GOOGLE_CUDA

}  // namespace partial_embedding
