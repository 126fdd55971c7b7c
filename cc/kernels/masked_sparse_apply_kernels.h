// The device functor behind the MaskedSparseApplyAdam OpKernels: one template
// over <Device, T, Index>, specialized for the CPU in
// masked_sparse_apply_kernels.cc and for the GPU in
// masked_sparse_apply_kernels.cu.cc.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_KERNELS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_KERNELS_H_

#include <cstdint>

#include "cc/core/masked_sparse_apply.h"
#include "cc/kernels/in_place_update.h"
#include "cc/kernels/masked_sparse_apply_inputs.h"

namespace partial_embedding {

// One step's inputs, checked for shape and dtype, the variables locked.
template <typename T, typename Index>
struct MaskedSparseApplyAdamArgs {
  const VariableInputs* tables = nullptr;  // var, m, v (and v_hat).
  bool amsgrad = false;
  int64_t num_rows = 0;
  int64_t row_size = 0;
  const Index* indices = nullptr;
  int64_t num_indices = 0;
  // Null without a slot map (full-size slots).
  const Index* slot_indices = nullptr;
  int64_t num_slot_rows = 0;
  const T* grad = nullptr;
  const bool* row_mask = nullptr;
  // The scalar hyperparameters, in adam_input::kScalarNames' order, where the
  // device keeps them (host memory on the CPU, device memory on the GPU).
  const T* scalars[adam_input::kNumScalars] = {};
};

// The core's view of a TensorFlow scalar or table of T (same bit layout).
template <typename T>
using CoreOf = typename CoreType<T>::type;

// The core's tables: the variables' buffers as they are now (after
// CopySharedTables).
template <typename T>
AdamTables<CoreOf<T>> CoreTables(const VariableInputs& tables, bool amsgrad,
                                 int64_t num_rows, int64_t row_size) {
  auto table = [&](int i) {
    return reinterpret_cast<CoreOf<T>*>(tables.tensor(i)->flat<T>().data());
  };
  AdamTables<CoreOf<T>> core;
  core.var = table(adam_input::kVar);
  core.m = table(1);
  core.v = table(2);
  core.v_hat = amsgrad ? table(adam_input::kVHat) : nullptr;
  core.num_rows = num_rows;
  core.row_size = row_size;
  return core;
}

// Gives every table a buffer of its own where a reader still holds one.
template <typename Device>
absl::Status CopySharedTables(OpKernelContext* ctx,
                              const VariableInputs& tables) {
  for (int i = 0; i < tables.size(); ++i) {
    TF_RETURN_IF_ERROR(CopyIfShared<Device>(ctx, tables.tensor(i)));
  }
  return absl::OkStatus();
}

template <typename Device, typename T, typename Index>
struct MaskedSparseApplyAdamFunctor {
  // Checks every index and the slot map before the first write, gives the
  // tables buffers of their own where a reader still holds one, and applies
  // the step. A refused step sets *error (and *values, the index values its
  // message names) and writes nothing; a non-OK status is a device failure.
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedSparseApplyAdamArgs<T, Index>& args,
                          AdamInputError* error, AdamErrorValues* values) const;
};

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_MASKED_SPARSE_APPLY_KERNELS_H_
