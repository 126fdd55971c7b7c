// The EmbeddingBag OpKernel (CPU) and the MaskedEmbeddingBagGrad OpKernel
// (CPU here, GPU in embedding_bag_kernels.cu.cc): the shape contract of
// cc/core/embedding_bag_contract.h, then raw pointers to the TF-free core,
// which checks every id before anything is written.
#include "cc/kernels/embedding_bag_kernels.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "cc/core/embedding_bag.h"
#include "cc/core/embedding_bag_contract.h"

namespace partial_embedding {

absl::Status BagError(const BagInputError& error, int64_t num_rows,
                      int64_t num_bags) {
  return absl::InvalidArgumentError(
      BagInputErrorMessage(error, num_rows, num_bags));
}

namespace {

// The product of a shape's dimensions after the first: the size of a row.
int64_t RowSize(const TensorShape& shape) {
  int64_t size = 1;
  for (int d = 1; d < shape.dims(); ++d) size *= shape.dim_size(d);
  return size;
}

absl::Status ParseCombiner(const std::string& name, BagCombiner* combiner) {
  if (name == "sum") {
    *combiner = BagCombiner::kSum;
  } else if (name == "mean") {
    *combiner = BagCombiner::kMean;
  } else if (name == "sqrtn") {
    *combiner = BagCombiner::kSqrtN;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("combiner: \"", name, "\" is not sum, mean or sqrtn"));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// EmbeddingBag (CPU).

template <typename T, typename Index>
class EmbeddingBagOp : public OpKernel {
 public:
  explicit EmbeddingBagOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string combiner;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
    OP_REQUIRES_OK(ctx, ParseCombiner(combiner, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    using CoreT = typename CoreType<T>::type;
    using C = typename Arith<CoreT>::Compute;
    const Tensor& params = ctx->input(0);
    const Tensor& ids = ctx->input(1);
    const Tensor& bags = ctx->input(2);
    const Tensor& num_bags = ctx->input(3);
    const Tensor& weights = ctx->input(4);
    std::optional<int64_t> num_bags_value;
    if (num_bags.dims() == 0) num_bags_value = num_bags.scalar<int64_t>()();
    const BagLookupShapes shapes{
        DimsOf(params.shape()),
        {DimsOf(ids.shape()), DimsOf(bags.shape()),
         OpWeights(DimsOf(weights.shape())), "weights"},
        DimsOf(num_bags.shape()),
        num_bags_value};
    OP_REQUIRES_OK(ctx, ContractStatus(CheckBagLookupShapes(
                            shapes, ShapeNotation::kTensorFlow)));
    BagPositions<Index> positions;
    positions.ids = ids.flat<Index>().data();
    positions.bags = bags.flat<int64_t>().data();
    positions.num_positions = ids.dim_size(0);
    positions.num_bags = num_bags.scalar<int64_t>()();
    positions.num_rows = params.dim_size(0);
    TensorShape output_shape = params.shape();
    output_shape.set_dim(0, positions.num_bags);
    Tensor* output = nullptr;
    Tensor* factors = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, output_shape, &output));
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(1, TensorShape({positions.num_positions}),
                                  &factors));
    const BagInputError error = EmbeddingBagCpu<CoreT, Index>(
        reinterpret_cast<const CoreT*>(params.flat<T>().data()),
        RowSize(params.shape()), positions,
        weights.NumElements() == 0 ? nullptr : weights.flat<C>().data(),
        combiner_, reinterpret_cast<CoreT*>(output->flat<T>().data()),
        factors->flat<C>().data(), TfCpuParallelism(ctx));
    OP_REQUIRES(ctx, error.ok(),
                BagError(error, positions.num_rows, positions.num_bags));
  }

 private:
  BagCombiner combiner_ = BagCombiner::kMean;
};

// ---------------------------------------------------------------------------
// MaskedEmbeddingBagGrad: the CPU functor.

template <typename T, typename Index>
struct EmbeddingBagGradFunctor<CPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const EmbeddingBagGradArgs<T, Index>& args,
                          const TensorShape& row_shape,
                          BagInputError* error) const {
    RowGroups groups;
    *error = PlanEmbeddingBagGrad(args.positions, args.row_mask, &groups);
    if (!error->ok()) return absl::OkStatus();
    const int64_t num_groups = groups.num_groups();
    Tensor* rows = nullptr;
    TF_RETURN_IF_ERROR(
        ctx->allocate_output(kBagGradRows, TensorShape({num_groups}), &rows));
    Index* row_data = rows->flat<Index>().data();
    for (int64_t g = 0; g < num_groups; ++g) {
      row_data[g] = static_cast<Index>(groups.rows[g]);
    }
    TensorShape values_shape({num_groups});
    values_shape.AppendShape(row_shape);
    Tensor* values = nullptr;
    TF_RETURN_IF_ERROR(
        ctx->allocate_output(kBagGradValues, values_shape, &values));
    EmbeddingBagGradValuesCpu<T>(
        args.grad, args.row_size, args.positions.bags, args.factors, groups,
        reinterpret_cast<T*>(values->data()), TfCpuParallelism(ctx));
    return absl::OkStatus();
  }
};

// ---------------------------------------------------------------------------
// MaskedEmbeddingBagGrad: the OpKernel.

template <typename Device, typename T, typename Index>
class MaskedEmbeddingBagGradOp : public OpKernel {
 public:
  explicit MaskedEmbeddingBagGradOp(OpKernelConstruction* ctx)
      : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    using CoreT = typename CoreType<T>::type;
    using C = typename Arith<CoreT>::Compute;
    const Tensor& grad = ctx->input(0);
    const Tensor& ids = ctx->input(1);
    const Tensor& bags = ctx->input(2);
    const Tensor& factors = ctx->input(3);
    const Tensor& row_mask = ctx->input(4);
    const BagGradShapes shapes{DimsOf(grad.shape()),
                               {DimsOf(ids.shape()), DimsOf(bags.shape()),
                                DimsOf(factors.shape()), "factors"},
                               DimsOf(row_mask.shape())};
    OP_REQUIRES_OK(ctx, ContractStatus(CheckBagGradShapes(
                            shapes, ShapeNotation::kTensorFlow)));
    TensorShape row_shape = grad.shape();
    row_shape.RemoveDim(0);
    EmbeddingBagGradArgs<CoreT, Index> args;
    args.grad = reinterpret_cast<const CoreT*>(grad.flat<T>().data());
    args.row_size = row_shape.num_elements();
    args.positions.ids = ids.flat<Index>().data();
    args.positions.bags = bags.flat<int64_t>().data();
    args.positions.num_positions = ids.dim_size(0);
    args.positions.num_bags = grad.dim_size(0);
    args.positions.num_rows = row_mask.dim_size(0);
    args.factors = factors.flat<C>().data();
    args.row_mask = row_mask.flat<bool>().data();
    BagInputError error;
    OP_REQUIRES_OK(ctx, EmbeddingBagGradFunctor<Device, CoreT, Index>()(
                            ctx, args, row_shape, &error));
    OP_REQUIRES(
        ctx, error.ok(),
        BagError(error, args.positions.num_rows, args.positions.num_bags));
  }
};

// The compute type of a TensorFlow value type: float, or double for double.
template <typename T>
using ComputeOf = typename Arith<typename CoreType<T>::type>::Compute;

#define PE_REGISTER_CPU(T, Index)                                         \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>EmbeddingBag")           \
                              .Device(::tensorflow::DEVICE_CPU)           \
                              .TypeConstraint<T>("dtype")                 \
                              .TypeConstraint<Index>("Tindices")          \
                              .TypeConstraint<ComputeOf<T>>("Tcompute")   \
                              .HostMemory("num_bags"),                    \
                          EmbeddingBagOp<T, Index>);                      \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedEmbeddingBagGrad") \
                              .Device(::tensorflow::DEVICE_CPU)           \
                              .TypeConstraint<T>("dtype")                 \
                              .TypeConstraint<Index>("Tindices")          \
                              .TypeConstraint<ComputeOf<T>>("Tcompute"),  \
                          MaskedEmbeddingBagGradOp<CPUDevice, T, Index>);
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_CPU)
#undef PE_REGISTER_CPU

#if GOOGLE_CUDA
using GPUDevice = Eigen::GpuDevice;

// The GPU functors are instantiated in embedding_bag_kernels.cu.cc.
#define PE_REGISTER_GPU(T, Index)                                              \
  extern template struct EmbeddingBagGradFunctor<GPUDevice, CoreType<T>::type, \
                                                 Index>;                       \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedEmbeddingBagGrad")      \
                              .Device(::tensorflow::DEVICE_GPU)                \
                              .TypeConstraint<T>("dtype")                      \
                              .TypeConstraint<Index>("Tindices")               \
                              .TypeConstraint<ComputeOf<T>>("Tcompute"),       \
                          MaskedEmbeddingBagGradOp<GPUDevice, T, Index>);
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_REGISTER_GPU)
#undef PE_REGISTER_GPU
#endif  // GOOGLE_CUDA

}  // namespace partial_embedding
