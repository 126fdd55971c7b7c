// The QuantizedLookup OpKernel: checks shapes, hands raw pointers to the
// device's functor (the TF-free core's CPU driver here, its CUDA version in
// quantized_lookup_kernels.cu.cc), and names the first bad id.
#include "cc/kernels/quantized_lookup_kernels.h"

#include <cstdint>

#include "cc/core/quantized_lookup.h"
#include "cc/kernels/in_place_update.h"

namespace partial_embedding {

template <typename Index>
struct QuantizedLookupFunctor<CPUDevice, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const QuantizedLookupInputs<Index>& in, float* rows,
                          int32_t* store_rows, int64_t* bad_position,
                          int64_t* bad_value) const {
    *bad_position =
        QuantizedLookupCpu(in, rows, store_rows, TfCpuParallelism(ctx));
    *bad_value = *bad_position >= 0 && *bad_position < in.num_ids
                     ? static_cast<int64_t>(in.ids[*bad_position])
                     : 0;
    return absl::OkStatus();
  }
};

template <typename Device, typename Index>
class QuantizedLookupOp : public OpKernel {
 public:
  explicit QuantizedLookupOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes = ctx->input(0);
    const Tensor& scales = ctx->input(1);
    const Tensor& store = ctx->input(2);
    const Tensor& sorted_ids = ctx->input(3);
    const Tensor& store_index = ctx->input(4);
    const Tensor& ids = ctx->input(5);
    OP_REQUIRES_OK(
        ctx, CheckShapes(codes, scales, store, sorted_ids, store_index, ids));
    const int64_t num_ids = ids.dim_size(0);
    Tensor* rows = nullptr;
    Tensor* store_rows = nullptr;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(0, TensorShape({num_ids, codes.dim_size(1)}),
                                  &rows));
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(1, TensorShape({num_ids}), &store_rows));
    QuantizedLookupInputs<Index> in;
    in.codes = codes.flat<int8_t>().data();
    in.scales = scales.flat<float>().data();
    in.num_rows = codes.dim_size(0);
    in.width = codes.dim_size(1);
    in.store = store.flat<float>().data();
    in.store_rows = store.dim_size(0);
    in.sorted_ids = sorted_ids.flat<int32_t>().data();
    in.store_index = store_index.flat<int32_t>().data();
    in.ids = ids.flat<Index>().data();
    in.num_ids = num_ids;
    int64_t bad = -1;
    int64_t bad_value = 0;
    OP_REQUIRES_OK(ctx,
                   QuantizedLookupFunctor<Device, Index>()(
                       ctx, in, rows->flat<float>().data(),
                       store_rows->flat<int32_t>().data(), &bad, &bad_value));
    OP_REQUIRES(ctx, bad != num_ids,
                absl::InvalidArgumentError(
                    "store_index: a store row outside [0, store rows)"));
    OP_REQUIRES(ctx, bad < 0,
                absl::InvalidArgumentError(
                    absl::StrCat("ids[", bad, "] = ", bad_value,
                                 " is not in [0, ", in.num_rows, ")")));
  }

 private:
  static absl::Status CheckShapes(const Tensor& codes, const Tensor& scales,
                                  const Tensor& store, const Tensor& sorted_ids,
                                  const Tensor& store_index,
                                  const Tensor& ids) {
    if (codes.dims() != 2 || scales.dims() != 1 || store.dims() != 2 ||
        sorted_ids.dims() != 1 || store_index.dims() != 1 || ids.dims() != 1) {
      return absl::InvalidArgumentError(
          "QuantizedLookup: codes and store must be matrices; scales, "
          "sorted_ids, store_index and ids vectors");
    }
    if (scales.dim_size(0) != codes.dim_size(0) ||
        store.dim_size(1) != codes.dim_size(1) || store.dim_size(0) < 1 ||
        sorted_ids.dim_size(0) != store.dim_size(0) ||
        store_index.dim_size(0) != store.dim_size(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "QuantizedLookup: shapes do not agree: codes ",
          codes.shape().DebugString(), ", scales ",
          scales.shape().DebugString(), ", store ", store.shape().DebugString(),
          ", sorted_ids ", sorted_ids.shape().DebugString(), ", store_index ",
          store_index.shape().DebugString()));
    }
    return absl::OkStatus();
  }
};

#define PE_REGISTER_QUANTIZED_LOOKUP(Index)                        \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>QuantizedLookup") \
                              .Device(::tensorflow::DEVICE_CPU)    \
                              .TypeConstraint<Index>("Tindices"),  \
                          QuantizedLookupOp<CPUDevice, Index>);
PE_REGISTER_QUANTIZED_LOOKUP(int32_t)
PE_REGISTER_QUANTIZED_LOOKUP(int64_t)
#undef PE_REGISTER_QUANTIZED_LOOKUP

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;

// The GPU functors are instantiated in quantized_lookup_kernels.cu.cc. Every
// input and output stays in device memory: only the batch's rows are read.
#define PE_REGISTER_QUANTIZED_LOOKUP_GPU(Index)                    \
  extern template struct QuantizedLookupFunctor<GPUDevice, Index>; \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>QuantizedLookup") \
                              .Device(::tensorflow::DEVICE_GPU)    \
                              .TypeConstraint<Index>("Tindices"),  \
                          QuantizedLookupOp<GPUDevice, Index>);
PE_REGISTER_QUANTIZED_LOOKUP_GPU(int32_t)
PE_REGISTER_QUANTIZED_LOOKUP_GPU(int64_t)
#undef PE_REGISTER_QUANTIZED_LOOKUP_GPU
#endif  // GOOGLE_CUDA

}  // namespace partial_embedding
