// What the OpKernels that write resource variables in place share: the
// TensorFlow names they use, the core's types, the variable lookup and
// locking, the input checks, TensorFlow's thread pool as the core's
// parallel-for, and keeping in-place writes safe for readers.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_IN_PLACE_UPDATE_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_IN_PLACE_UPDATE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/types/span.h"
#include "cc/core/huge_pages.h"
#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"
#include "cc/core/row_update_contract.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace partial_embedding {

// The kernels' own names for what they use of TensorFlow (internal to
// cc/kernels).
using ::tensorflow::DataType;
using ::tensorflow::DataTypeString;
using ::tensorflow::DataTypeToEnum;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;
using CPUDevice = Eigen::ThreadPoolDevice;

// The core's storage type for a TensorFlow element type (same bit layout).
template <typename T>
struct CoreType {
  using type = T;
};
template <>
struct CoreType<Eigen::half> {
  using type = Float16;
};
template <>
struct CoreType<Eigen::bfloat16> {
  using type = BFloat16;
};

// Calls M(T, Index) for every TensorFlow value type and index type the
// in-place ops are registered for.
// clang-format off: one (type, index type) pair a line.
#define PE_FOR_EACH_VALUE_AND_INDEX_TYPE(M) \
  M(Eigen::half, int32_t)                   \
  M(Eigen::half, int64_t)                   \
  M(Eigen::bfloat16, int32_t)               \
  M(Eigen::bfloat16, int64_t)               \
  M(float, int32_t)                         \
  M(float, int64_t)                         \
  M(double, int32_t)                        \
  M(double, int64_t)
// clang-format on

// The CPU device's worker threads as the core's parallel-for: every shard
// gets a thread of its own.
CpuParallelism TfCpuParallelism(OpKernelContext* ctx);

// The resource variables behind an in-place kernel's leading inputs.
class VariableInputs {
 public:
  static constexpr int kMaxVariables = 9;

  // Looks up the variables of inputs 0 .. names.size() - 1 (or of the inputs
  // numbered `inputs`, one per name), named `names` in errors (the names
  // must outlive this object). Fails when one has no value yet, or when two
  // inputs are the same variable (each needs its own, and its lock would be
  // taken twice); then holds no variable.
  absl::Status LookUp(OpKernelContext* ctx, absl::Span<const char* const> names,
                      absl::Span<const int> inputs = {});

  // Checks, in input order, that each variable has a value and holds
  // `dtype`. Requires the locks. A wrong dtype is blamed on the variable, or,
  // where `dtype_source` is given, on that input (the op's dtype comes from
  // it).
  absl::Status CheckInitializedAndDtype(
      DataType dtype, const char* dtype_source = nullptr) const;

  // The same check with a dtype per variable (`dtypes`, one per variable).
  absl::Status CheckInitializedAndDtypes(
      absl::Span<const DataType> dtypes) const;

  // The variables sorted by address: the order their locks are taken in.
  std::array<Var*, kMaxVariables> InLockOrder() const;

  int size() const { return static_cast<int>(names_.size()); }
  const char* name(int i) const { return names_[i]; }
  Var* variable(int i) const { return variables_[i].get(); }
  Tensor* tensor(int i) const { return variables_[i]->tensor(); }

 private:
  std::array<::tensorflow::core::RefCountPtr<Var>, kMaxVariables> variables_;
  absl::Span<const char* const> names_;
};

// Holds the mutex of every variable in `variables`, taken in address order
// so that two kernels locking overlapping sets never wait on each other in a
// cycle, and releases them when it goes. Lock: ::tensorflow::mutex_lock
// (exclusive) or ::tensorflow::tf_shared_lock.
template <typename Lock>
class OrderedLocks {
 public:
  explicit OrderedLocks(const VariableInputs& variables) {
    const std::array<Var*, VariableInputs::kMaxVariables> order =
        variables.InLockOrder();
    for (int i = 0; i < variables.size(); ++i) {
      locks_[i].emplace(*order[i]->mu());
    }
  }

 private:
  std::array<std::optional<Lock>, VariableInputs::kMaxVariables> locks_;
};

// A shape's dimensions, as the shape contracts of cc/core take them.
Dims DimsOf(const TensorShape& shape);

// A shape contract's message (empty when the shapes satisfy it) as the
// kernels' status: InvalidArgument with the contract's text.
absl::Status ContractStatus(const std::string& message);

// Checks that the variable `var_name` has rows: rank >= 1.
absl::Status CheckHasRows(const char* var_name, const TensorShape& var_shape);

// Checks the row-update contract of cc/core/row_update_contract.h: for a
// variable of shape `var_shape` (V rows), `row_mask` is [V] and `values`
// (named `values_name`) is indices.shape + var_shape[1:]. `var_name` names
// the variable in errors.
absl::Status CheckRowMaskAndValues(const TensorShape& var_shape,
                                   const Tensor& row_mask,
                                   const Tensor& indices, const Tensor& values,
                                   const char* values_name,
                                   const char* var_name);

// Checks the slots of a rule's step, variables 1 .. num_slots of `tables`
// (variable 0 is var), against the slot contract of
// cc/core/row_update_contract.h: var's shape ([V] per row), or, when
// `compact`, [S] + var.shape[1:] ([S] per row) with one S >= 1 for every
// slot. `rule` says which slots are per row.
absl::Status CheckSlotTables(const VariableInputs& tables, Rule rule,
                             bool compact);

// Checks that the inputs first, first + 1, ... (named `names`: an Adam
// step's hyperparameters) are scalars.
absl::Status CheckScalarInputs(OpKernelContext* ctx, int first,
                               absl::Span<const char* const> names);

// Checks that slot_indices has indices' shape (the same contract).
absl::Status CheckSlotIndices(const Tensor& indices,
                              const Tensor& slot_indices);

// "[3]" for a rank-1 shape, "[1, 2]" for the flat position 3 of a [2, 2]
// shape: how error messages name the position of a bad index.
std::string FormatIndexPosition(const TensorShape& shape, int64_t flat);

// The error for indices' flat position `position` holding `value`, outside
// [0, num_rows).
absl::Status BadIndexError(const TensorShape& indices_shape, int64_t position,
                           int64_t value, int64_t num_rows);

// Copies `bytes` bytes between two buffers on the device.
template <typename Device>
absl::Status CopyDeviceBuffer(OpKernelContext* ctx, void* dst, const void* src,
                              int64_t bytes);
template <>
absl::Status CopyDeviceBuffer<CPUDevice>(OpKernelContext* ctx, void* dst,
                                         const void* src, int64_t bytes);
#if GOOGLE_CUDA
// Defined in masked_scatter_sub_kernels.cu.cc.
template <>
absl::Status CopyDeviceBuffer<Eigen::GpuDevice>(OpKernelContext* ctx, void* dst,
                                                const void* src, int64_t bytes);
#endif

// Advises the buffer of a CPU variable's value for huge pages in place (see
// cc/core/huge_pages.h) and collapses it into them, unless the value is
// smaller than min_bytes, huge pages are turned off, or this buffer was
// advised before. Never copies the value. Sets *advised when it advised the
// buffer now. Requires the variable's exclusive lock.
absl::Status AdviseHugePages(OpKernelContext* ctx, Tensor* params,
                             int64_t min_bytes, bool* advised);

// The name of AdviseHugePages before it stopped moving values (*moved: the
// buffer was advised now).
inline absl::Status MoveToHugePages(OpKernelContext* ctx, Tensor* params,
                                    int64_t min_bytes, bool* moved) {
  return AdviseHugePages(ctx, params, min_bytes, moved);
}

// Gives the variable a buffer of its own when a reader still holds the
// current one, so the reader's snapshot keeps its values. Never switches the
// variable into copy-on-read mode. Requires the variable's lock.
//
// On the CPU, a table of at least kHugePagesMinBytes is also advised for
// transparent huge pages in place the first time its buffer passes here (see
// cc/core/huge_pages.h): no copy, then rows scattered over it stop missing
// the TLB. PARTIAL_EMBEDDING_HUGE_PAGES=0 turns that off.
template <typename Device>
absl::Status CopyIfShared(OpKernelContext* ctx, Tensor* params) {
  if (!params->RefCountIsOne()) {
    Tensor copy;
    ::tensorflow::AllocatorAttributes attr;
    attr.set_gpu_compatible(true);
    attr.set_nic_compatible(true);
    TF_RETURN_IF_ERROR(
        ctx->allocate_temp(params->dtype(), params->shape(), &copy, attr));
    TF_RETURN_IF_ERROR(CopyDeviceBuffer<Device>(
        ctx, copy.data(), params->data(), params->TotalBytes()));
    *params = copy;
  }
  if constexpr (std::is_same_v<Device, CPUDevice>) {
    // After the copy above, so the buffer advised is the one the variable
    // keeps.
    bool advised = false;
    TF_RETURN_IF_ERROR(
        AdviseHugePages(ctx, params, kHugePagesMinBytes, &advised));
  }
  return absl::OkStatus();
}

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_IN_PLACE_UPDATE_H_
