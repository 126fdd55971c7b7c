// The MaskedSparseApplyAdam OpKernel (CPU): looks the variable and its slots
// up, locks them in address order, validates every input before the first
// write, keeps in-place writes safe for readers without copy-on-read mode,
// and hands raw pointers to the TF-free core.
#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <string>

#include "cc/core/masked_scatter_sub.h"
#include "cc/core/masked_sparse_apply.h"
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

namespace {

constexpr int kMaxTables = 4;  // var, m, v, v_hat
constexpr int kIndices = 4;
constexpr int kGrad = 5;
constexpr int kRowMask = 6;
constexpr int kFirstScalar = 7;
constexpr int kNumScalars = 6;
constexpr std::array<const char*, kMaxTables> kTableNames = {"var", "m", "v",
                                                             "v_hat"};
constexpr std::array<const char*, kNumScalars> kScalarNames = {
    "learning_rate", "one_minus_beta_1", "one_minus_beta_2", "epsilon",
    "alpha",         "weight_decay"};

}  // namespace

template <typename T, typename Index>
class MaskedSparseApplyAdamOp : public OpKernel {
 public:
  explicit MaskedSparseApplyAdamOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("amsgrad", &amsgrad_));
    // use_locking is accepted but the locks are always held: see the op doc.
  }

  void Compute(OpKernelContext* ctx) override {
    const int num_tables = amsgrad_ ? 4 : 3;
    std::array<::tensorflow::core::RefCountPtr<Var>, kMaxTables> tables;
    for (int i = 0; i < num_tables; ++i) {
      const absl::Status lookup = ::tensorflow::LookupResource(
          ctx, ::tensorflow::HandleFromInput(ctx, i), &tables[i]);
      OP_REQUIRES(ctx, lookup.ok(),
                  absl::NotFoundError(absl::StrCat(
                      kTableNames[i],
                      ": the variable is not initialized (no value has been "
                      "assigned to it yet): ",
                      lookup.message())));
    }
    for (int i = 0; i < num_tables; ++i) {
      for (int j = i + 1; j < num_tables; ++j) {
        OP_REQUIRES(ctx, tables[i].get() != tables[j].get(),
                    absl::InvalidArgumentError(absl::StrCat(
                        kTableNames[i], " and ", kTableNames[j],
                        " are the same variable; each needs its own")));
      }
    }
    // Locks taken in address order: two steps locking overlapping sets can
    // never wait on each other in a cycle.
    std::array<Var*, kMaxTables> order{};
    for (int i = 0; i < num_tables; ++i) order[i] = tables[i].get();
    std::sort(order.begin(), order.begin() + num_tables);
    std::array<std::optional<::tensorflow::mutex_lock>, kMaxTables> locks;
    for (int i = 0; i < num_tables; ++i) locks[i].emplace(*order[i]->mu());

    OP_REQUIRES_OK(ctx, Validate(ctx, tables, num_tables));
    const Tensor& indices = ctx->input(kIndices);
    const Tensor& grad = ctx->input(kGrad);
    const Tensor& row_mask = ctx->input(kRowMask);
    Tensor* var = tables[0]->tensor();
    const int64_t num_rows = var->dim_size(0);
    const int64_t num_indices = indices.NumElements();
    const Index* index_data = indices.flat<Index>().data();
    const int64_t bad = FindFirstBadIndex(index_data, num_indices, num_rows);
    OP_REQUIRES(ctx, bad < 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "indices", FormatIndexPosition(indices.shape(), bad), " = ",
                    bad < 0 ? 0 : static_cast<int64_t>(index_data[bad]),
                    " is not in [0, ", num_rows, "); nothing was written")));
    if (num_indices == 0 || var->NumElements() == 0) return;
    for (int i = 0; i < num_tables; ++i) {
      OP_REQUIRES_OK(ctx, CopyIfShared<CPUDevice>(ctx, tables[i]->tensor()));
    }

    using CoreT = typename CoreType<T>::type;
    AdamTables<CoreT> core_tables;
    core_tables.var =
        reinterpret_cast<CoreT*>(tables[0]->tensor()->flat<T>().data());
    core_tables.m =
        reinterpret_cast<CoreT*>(tables[1]->tensor()->flat<T>().data());
    core_tables.v =
        reinterpret_cast<CoreT*>(tables[2]->tensor()->flat<T>().data());
    core_tables.v_hat =
        amsgrad_
            ? reinterpret_cast<CoreT*>(tables[3]->tensor()->flat<T>().data())
            : nullptr;
    core_tables.num_rows = num_rows;
    core_tables.row_size = var->NumElements() / num_rows;
    std::array<CoreT, kNumScalars> scalars;
    for (int i = 0; i < kNumScalars; ++i) {
      const T value = ctx->input(kFirstScalar + i).scalar<T>()();
      std::memcpy(&scalars[i], &value, sizeof(value));
    }
    AdamHyperparameters<CoreT> hyper;
    hyper.learning_rate = scalars[0];
    hyper.one_minus_beta_1 = scalars[1];
    hyper.one_minus_beta_2 = scalars[2];
    hyper.epsilon = scalars[3];
    hyper.alpha = scalars[4];
    hyper.weight_decay = scalars[5];
    const auto* gradient =
        reinterpret_cast<const CoreT*>(grad.flat<T>().data());

    RowGroups groups;
    GroupPermittedRows(index_data, num_indices, row_mask.flat<bool>().data(),
                       &groups);
    const int64_t num_groups = groups.num_groups();
    if (num_groups == 0) return;
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t num_shards =
        std::min<int64_t>(RecommendedShards(num_indices, core_tables.row_size,
                                            workers.num_threads),
                          num_groups);
    // Each shard owns a contiguous range of groups (distinct rows): the
    // result is the same for any number of shards.
    auto run_shards = [&](int64_t begin, int64_t end) {
      for (int64_t shard = begin; shard < end; ++shard) {
        MaskedSparseApplyAdamGroups(core_tables, gradient, groups, hyper,
                                    num_groups * shard / num_shards,
                                    num_groups * (shard + 1) / num_shards);
      }
    };
    if (num_shards == 1) {
      run_shards(0, 1);
    } else {
      // A cost this high gives every shard a thread of its own.
      constexpr int64_t kCostPerShard = int64_t{1} << 40;
      ::tensorflow::Shard(static_cast<int>(num_shards), workers.workers,
                          num_shards, kCostPerShard, run_shards);
    }
  }

 private:
  // Everything but the index values, under the locks, before any write.
  absl::Status Validate(OpKernelContext* ctx,
                        const std::array<::tensorflow::core::RefCountPtr<Var>,
                                         kMaxTables>& tables,
                        int num_tables) const {
    for (int i = 0; i < num_tables; ++i) {
      if (!tables[i]->is_initialized) {
        return absl::FailedPreconditionError(absl::StrCat(
            kTableNames[i],
            ": the variable is not initialized (no value has been assigned to "
            "it yet)"));
      }
      const Tensor* table = tables[i]->tensor();
      if (table->dtype() != DataTypeToEnum<T>::value) {
        return absl::InvalidArgumentError(absl::StrCat(
            kTableNames[i], ": dtype ", DataTypeString(table->dtype()),
            " does not match dtype ",
            DataTypeString(DataTypeToEnum<T>::value)));
      }
    }
    const Tensor* var = tables[0]->tensor();
    if (var->dims() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("var: the variable must have rank >= 1, got shape ",
                       var->shape().DebugString()));
    }
    for (int i = 1; i < num_tables; ++i) {
      if (tables[i]->tensor()->shape() != var->shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            kTableNames[i], ": shape ",
            tables[i]->tensor()->shape().DebugString(),
            " does not match var's shape ", var->shape().DebugString()));
      }
    }
    const int64_t num_rows = var->dim_size(0);
    const Tensor& indices = ctx->input(kIndices);
    const Tensor& grad = ctx->input(kGrad);
    const Tensor& row_mask = ctx->input(kRowMask);
    if (row_mask.dims() != 1 || row_mask.dim_size(0) != num_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row_mask: shape ", row_mask.shape().DebugString(), " must be [",
          num_rows, "] (one entry per row of the variable of shape ",
          var->shape().DebugString(), ")"));
    }
    TensorShape expected_grad = indices.shape();
    for (int d = 1; d < var->dims(); ++d)
      expected_grad.AddDim(var->dim_size(d));
    if (grad.shape() != expected_grad) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grad: shape ", grad.shape().DebugString(), " must be ",
          expected_grad.DebugString(),
          " (indices.shape + var.shape[1:]) for indices of shape ",
          indices.shape().DebugString(), " and a variable of shape ",
          var->shape().DebugString()));
    }
    for (int i = 0; i < kNumScalars; ++i) {
      const Tensor& scalar = ctx->input(kFirstScalar + i);
      if (scalar.dims() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(kScalarNames[i], ": shape ",
                         scalar.shape().DebugString(), " must be a scalar"));
      }
    }
    return absl::OkStatus();
  }

  bool amsgrad_ = false;
};

#define PE_REGISTER_CPU(T, Index)                                        \
  REGISTER_KERNEL_BUILDER(Name("PartialEmbedding>MaskedSparseApplyAdam") \
                              .Device(::tensorflow::DEVICE_CPU)          \
                              .TypeConstraint<T>("dtype")                \
                              .TypeConstraint<Index>("Tindices"),        \
                          MaskedSparseApplyAdamOp<T, Index>);
#define PE_REGISTER_CPU_ALL_INDICES(T) \
  PE_REGISTER_CPU(T, int32_t)          \
  PE_REGISTER_CPU(T, int64_t)
PE_REGISTER_CPU_ALL_INDICES(Eigen::half)
PE_REGISTER_CPU_ALL_INDICES(Eigen::bfloat16)
PE_REGISTER_CPU_ALL_INDICES(float)
PE_REGISTER_CPU_ALL_INDICES(double)
#undef PE_REGISTER_CPU_ALL_INDICES
#undef PE_REGISTER_CPU

}  // namespace partial_embedding
