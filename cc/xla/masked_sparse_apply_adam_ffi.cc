// The XLA CPU custom-call handlers behind
// PartialEmbedding>MaskedSparseApplyAdam under XLA (with and without AMSGrad):
// decode the buffers through XLA's typed FFI and run the same TF-free fused
// Adam driver as the TensorFlow kernel.
#include <cstdint>
#include <string>

#include "cc/core/masked_sparse_apply.h"
#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"
#include "cc/xla/custom_call_targets.h"
#include "cc/xla/ffi_common.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace partial_embedding {
namespace {

namespace ffi = ::xla::ffi;
using xla_ffi::CopyIfNotAliased;
using xla_ffi::GeometryOf;
using xla_ffi::IndexPosition;
using xla_ffi::PoolParallelism;
using xla_ffi::TableGeometry;

constexpr int kNumScalars = 6;

// One call's buffers, once the results sit in the tables' buffers.
struct AdamCall {
  void* var = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  void* v_hat = nullptr;  // Null without AMSGrad.
  TableGeometry geometry;
  const void* indices = nullptr;
  int64_t num_indices = 0;
  const void* grad = nullptr;
  const bool* row_mask = nullptr;
  const void* scalars[kNumScalars] = {};
};

template <typename T, typename Index>
ffi::Error ApplyAdam(const AdamCall& call, const ffi::AnyBuffer& indices,
                     const CpuParallelism& parallelism) {
  const AdamTables<T> tables{
      static_cast<T*>(call.var), static_cast<T*>(call.m),
      static_cast<T*>(call.v),   static_cast<T*>(call.v_hat),
      call.geometry.num_rows,    call.geometry.row_size};
  const auto scalar = [&call](int i) {
    return *static_cast<const T*>(call.scalars[i]);
  };
  const AdamHyperparameters<T> hyper{scalar(0), scalar(1), scalar(2),
                                     scalar(3), scalar(4), scalar(5)};
  const auto* index_data = static_cast<const Index*>(call.indices);
  const AdamInputError error = MaskedSparseApplyAdamCpu<T, Index>(
      tables, index_data, call.num_indices, SlotMap<Index>{},
      static_cast<const T*>(call.grad), call.row_mask, hyper, parallelism);
  if (error.ok()) return ffi::Error::Success();
  // Without slot indices the only possible failure is a row out of range.
  return ffi::Error::InvalidArgument(
      "indices" + IndexPosition(indices, error.position) + " = " +
      std::to_string(static_cast<int64_t>(index_data[error.position])) +
      " is not in [0, " + std::to_string(call.geometry.num_rows) +
      "); nothing was written");
}

template <typename T>
ffi::Error ApplyForIndexType(const AdamCall& call,
                             const ffi::AnyBuffer& indices,
                             const CpuParallelism& parallelism) {
  if (indices.element_type() == ffi::DataType::S64) {
    return ApplyAdam<T, int64_t>(call, indices, parallelism);
  }
  return ApplyAdam<T, int32_t>(call, indices, parallelism);
}

ffi::Error Dispatch(ffi::DataType dtype, const AdamCall& call,
                    const ffi::AnyBuffer& indices,
                    const CpuParallelism& parallelism) {
  const ffi::DataType index_type = indices.element_type();
  if (index_type != ffi::DataType::S32 && index_type != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument("indices: must be int32 or int64");
  }
  switch (dtype) {
    case ffi::DataType::F32:
      return ApplyForIndexType<float>(call, indices, parallelism);
    case ffi::DataType::F64:
      return ApplyForIndexType<double>(call, indices, parallelism);
    case ffi::DataType::F16:
      return ApplyForIndexType<Float16>(call, indices, parallelism);
    case ffi::DataType::BF16:
      return ApplyForIndexType<BFloat16>(call, indices, parallelism);
    default:
      return ffi::Error::InvalidArgument(
          "var: dtype must be float16, bfloat16, float32 or float64");
  }
}

AdamCall MakeCall(ffi::AnyBuffer var, ffi::AnyBuffer indices,
                  ffi::AnyBuffer grad, ffi::AnyBuffer row_mask,
                  const ffi::AnyBuffer (&scalars)[kNumScalars]) {
  AdamCall call;
  call.geometry = GeometryOf(var);
  call.indices = indices.untyped_data();
  call.num_indices = static_cast<int64_t>(indices.element_count());
  call.grad = grad.untyped_data();
  call.row_mask = static_cast<const bool*>(row_mask.untyped_data());
  for (int i = 0; i < kNumScalars; ++i) {
    call.scalars[i] = scalars[i].untyped_data();
  }
  return call;
}

ffi::Error AdamHost(ffi::ThreadPool pool, ffi::AnyBuffer var, ffi::AnyBuffer m,
                    ffi::AnyBuffer v, ffi::AnyBuffer indices,
                    ffi::AnyBuffer grad, ffi::AnyBuffer row_mask,
                    ffi::AnyBuffer learning_rate,
                    ffi::AnyBuffer one_minus_beta_1,
                    ffi::AnyBuffer one_minus_beta_2, ffi::AnyBuffer epsilon,
                    ffi::AnyBuffer alpha, ffi::AnyBuffer weight_decay,
                    ffi::Result<ffi::AnyBuffer> var_out,
                    ffi::Result<ffi::AnyBuffer> m_out,
                    ffi::Result<ffi::AnyBuffer> v_out) {
  CopyIfNotAliased(var, var_out);
  CopyIfNotAliased(m, m_out);
  CopyIfNotAliased(v, v_out);
  AdamCall call = MakeCall(var, indices, grad, row_mask,
                           {learning_rate, one_minus_beta_1, one_minus_beta_2,
                            epsilon, alpha, weight_decay});
  call.var = var_out->untyped_data();
  call.m = m_out->untyped_data();
  call.v = v_out->untyped_data();
  return Dispatch(var.element_type(), call, indices, PoolParallelism(pool));
}

ffi::Error AmsgradHost(
    ffi::ThreadPool pool, ffi::AnyBuffer var, ffi::AnyBuffer m,
    ffi::AnyBuffer v, ffi::AnyBuffer v_hat, ffi::AnyBuffer indices,
    ffi::AnyBuffer grad, ffi::AnyBuffer row_mask, ffi::AnyBuffer learning_rate,
    ffi::AnyBuffer one_minus_beta_1, ffi::AnyBuffer one_minus_beta_2,
    ffi::AnyBuffer epsilon, ffi::AnyBuffer alpha, ffi::AnyBuffer weight_decay,
    ffi::Result<ffi::AnyBuffer> var_out, ffi::Result<ffi::AnyBuffer> m_out,
    ffi::Result<ffi::AnyBuffer> v_out, ffi::Result<ffi::AnyBuffer> v_hat_out) {
  CopyIfNotAliased(var, var_out);
  CopyIfNotAliased(m, m_out);
  CopyIfNotAliased(v, v_out);
  CopyIfNotAliased(v_hat, v_hat_out);
  AdamCall call = MakeCall(var, indices, grad, row_mask,
                           {learning_rate, one_minus_beta_1, one_minus_beta_2,
                            epsilon, alpha, weight_decay});
  call.var = var_out->untyped_data();
  call.m = m_out->untyped_data();
  call.v = v_out->untyped_data();
  call.v_hat = v_hat_out->untyped_data();
  return Dispatch(var.element_type(), call, indices, PoolParallelism(pool));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kAdamHostHandler, AdamHost,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::AnyBuffer>()    // var
                           .Arg<ffi::AnyBuffer>()    // m
                           .Arg<ffi::AnyBuffer>()    // v
                           .Arg<ffi::AnyBuffer>()    // indices
                           .Arg<ffi::AnyBuffer>()    // grad
                           .Arg<ffi::AnyBuffer>()    // row_mask
                           .Arg<ffi::AnyBuffer>()    // learning_rate
                           .Arg<ffi::AnyBuffer>()    // one_minus_beta_1
                           .Arg<ffi::AnyBuffer>()    // one_minus_beta_2
                           .Arg<ffi::AnyBuffer>()    // epsilon
                           .Arg<ffi::AnyBuffer>()    // alpha
                           .Arg<ffi::AnyBuffer>()    // weight_decay
                           .Ret<ffi::AnyBuffer>()    // var, aliased
                           .Ret<ffi::AnyBuffer>()    // m, aliased
                           .Ret<ffi::AnyBuffer>());  // v, aliased

XLA_FFI_DEFINE_HANDLER(kAmsgradHostHandler, AmsgradHost,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::AnyBuffer>()    // var
                           .Arg<ffi::AnyBuffer>()    // m
                           .Arg<ffi::AnyBuffer>()    // v
                           .Arg<ffi::AnyBuffer>()    // v_hat
                           .Arg<ffi::AnyBuffer>()    // indices
                           .Arg<ffi::AnyBuffer>()    // grad
                           .Arg<ffi::AnyBuffer>()    // row_mask
                           .Arg<ffi::AnyBuffer>()    // learning_rate
                           .Arg<ffi::AnyBuffer>()    // one_minus_beta_1
                           .Arg<ffi::AnyBuffer>()    // one_minus_beta_2
                           .Arg<ffi::AnyBuffer>()    // epsilon
                           .Arg<ffi::AnyBuffer>()    // alpha
                           .Arg<ffi::AnyBuffer>()    // weight_decay
                           .Ret<ffi::AnyBuffer>()    // var, aliased
                           .Ret<ffi::AnyBuffer>()    // m, aliased
                           .Ret<ffi::AnyBuffer>()    // v, aliased
                           .Ret<ffi::AnyBuffer>());  // v_hat, aliased

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyAdamTarget,
                         kHostPlatform, kAdamHostHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyAmsgradTarget,
                         kHostPlatform, kAmsgradHostHandler);

}  // namespace partial_embedding
