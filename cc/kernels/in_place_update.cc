// Helpers shared by the OpKernels that write a resource variable in place.
#include "cc/kernels/in_place_update.h"

#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/row_update_contract.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/util/work_sharder.h"

namespace partial_embedding {

CpuParallelism TfCpuParallelism(OpKernelContext* ctx) {
  const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
  CpuParallelism parallelism;
  parallelism.max_threads = workers.num_threads;
  parallelism.parallel_for = [pool = workers.workers](int64_t num_shards,
                                                      const ShardRange& run) {
    // A cost this high gives every shard a thread of its own.
    constexpr int64_t kCostPerShard = int64_t{1} << 40;
    ::tensorflow::Shard(static_cast<int>(num_shards), pool, num_shards,
                        kCostPerShard, run);
  };
  return parallelism;
}

absl::Status VariableInputs::LookUp(OpKernelContext* ctx,
                                    absl::Span<const char* const> names,
                                    absl::Span<const int> inputs) {
  if (names.size() > kMaxVariables ||
      (!inputs.empty() && inputs.size() != names.size())) {
    return absl::InternalError("VariableInputs: too many variables");
  }
  const int count = static_cast<int>(names.size());
  for (int i = 0; i < count; ++i) {
    const int input = inputs.empty() ? i : inputs[i];
    const absl::Status lookup = ::tensorflow::LookupResource(
        ctx, ::tensorflow::HandleFromInput(ctx, input), &variables_[i]);
    if (!lookup.ok()) {
      return absl::NotFoundError(absl::StrCat(
          names[i],
          ": the variable is not initialized (no value has been assigned to "
          "it yet): ",
          lookup.message()));
    }
  }
  for (int i = 0; i < count; ++i) {
    for (int j = i + 1; j < count; ++j) {
      if (variables_[i].get() == variables_[j].get()) {
        return absl::InvalidArgumentError(
            absl::StrCat(names[i], " and ", names[j],
                         " are the same variable; each needs its own"));
      }
    }
  }
  names_ = names;
  return absl::OkStatus();
}

absl::Status VariableInputs::CheckInitializedAndDtype(
    DataType dtype, const char* dtype_source) const {
  for (int i = 0; i < size(); ++i) {
    if (!variables_[i]->is_initialized) {
      return absl::FailedPreconditionError(absl::StrCat(
          names_[i],
          ": the variable is not initialized (no value has been assigned to "
          "it yet)"));
    }
    const DataType held = tensor(i)->dtype();
    if (held == dtype) continue;
    if (dtype_source != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          dtype_source, ": dtype ", DataTypeString(dtype),
          " does not match the variable's dtype ", DataTypeString(held)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(names_[i], ": dtype ", DataTypeString(held),
                     " does not match dtype ", DataTypeString(dtype)));
  }
  return absl::OkStatus();
}

absl::Status VariableInputs::CheckInitializedAndDtypes(
    absl::Span<const DataType> dtypes) const {
  if (static_cast<int>(dtypes.size()) != size()) {
    return absl::InternalError("VariableInputs: one dtype per variable");
  }
  for (int i = 0; i < size(); ++i) {
    if (!variables_[i]->is_initialized) {
      return absl::FailedPreconditionError(absl::StrCat(
          names_[i],
          ": the variable is not initialized (no value has been assigned to "
          "it yet)"));
    }
    const DataType held = tensor(i)->dtype();
    if (held != dtypes[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(names_[i], ": dtype ", DataTypeString(held),
                       " does not match dtype ", DataTypeString(dtypes[i])));
    }
  }
  return absl::OkStatus();
}

std::array<Var*, VariableInputs::kMaxVariables> VariableInputs::InLockOrder()
    const {
  // An insertion sort: at most kMaxVariables elements (std::sort draws a false
  // -Warray-bounds from g++ 12 here).
  std::array<Var*, kMaxVariables> order{};
  for (int i = 0; i < size(); ++i) {
    int j = i;
    for (; j > 0 && std::less<Var*>()(variables_[i].get(), order[j - 1]); --j) {
      order[j] = order[j - 1];
    }
    order[j] = variables_[i].get();
  }
  return order;
}

absl::Status CheckHasRows(const char* var_name, const TensorShape& var_shape) {
  if (var_shape.dims() >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(var_name, ": the variable must have rank >= 1, got shape ",
                   var_shape.DebugString()));
}

Dims DimsOf(const TensorShape& shape) {
  const auto sizes = shape.dim_sizes();
  return Dims(sizes.begin(), sizes.end());
}

absl::Status ContractStatus(const std::string& message) {
  if (message.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(message);
}

absl::Status CheckRowMaskAndValues(const TensorShape& var_shape,
                                   const Tensor& row_mask,
                                   const Tensor& indices, const Tensor& values,
                                   const char* values_name,
                                   const char* var_name) {
  RowUpdateShapes shapes{DimsOf(var_shape),
                         DimsOf(row_mask.shape()),
                         DimsOf(indices.shape()),
                         DimsOf(values.shape()),
                         var_name,
                         values_name};
  return ContractStatus(
      CheckRowUpdateShapes(shapes, ShapeNotation::kTensorFlow));
}

absl::Status CheckSlotTables(const VariableInputs& tables, Rule rule,
                             bool compact) {
  std::vector<SlotShape> slots;
  for (int i = 1; i < tables.size(); ++i) {
    slots.push_back({tables.name(i), DimsOf(tables.tensor(i)->shape()),
                     InfoOf(rule).per_row[i - 1]});
  }
  return ContractStatus(CheckSlotShapes(DimsOf(tables.tensor(0)->shape()),
                                        slots, compact,
                                        ShapeNotation::kTensorFlow));
}

absl::Status CheckScalarInputs(OpKernelContext* ctx, int first,
                               absl::Span<const char* const> names) {
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    TF_RETURN_IF_ERROR(ContractStatus(
        CheckScalarShape(names[i], DimsOf(ctx->input(first + i).shape()),
                         ShapeNotation::kTensorFlow)));
  }
  return absl::OkStatus();
}

absl::Status CheckSlotIndices(const Tensor& indices,
                              const Tensor& slot_indices) {
  return ContractStatus(CheckSlotIndicesShape(DimsOf(indices.shape()),
                                              DimsOf(slot_indices.shape()),
                                              ShapeNotation::kTensorFlow));
}

// "[3]" for a rank-1 shape, "[1, 2]" for the flat position 3 of a [2, 2]
// shape: how error messages name the position of a bad index.
std::string FormatIndexPosition(const TensorShape& shape, int64_t flat) {
  if (shape.dims() <= 1) return absl::StrCat("[", flat, "]");
  std::string coords;
  for (int d = shape.dims() - 1; d >= 0; --d) {
    const int64_t size = shape.dim_size(d);
    coords =
        absl::StrCat(flat % size, d == shape.dims() - 1 ? "" : ", ", coords);
    flat /= size;
  }
  return absl::StrCat("[", coords, "]");
}

absl::Status BadIndexError(const TensorShape& indices_shape, int64_t position,
                           int64_t value, int64_t num_rows) {
  return absl::InvalidArgumentError(absl::StrCat(
      "indices", FormatIndexPosition(indices_shape, position), " = ", value,
      " is not in [0, ", num_rows, "); nothing was written"));
}

template <>
absl::Status CopyDeviceBuffer<CPUDevice>(OpKernelContext*, void* dst,
                                         const void* src, int64_t bytes) {
  std::memcpy(dst, src, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

namespace {

// The buffer of a value advised for huge pages: the same memory as the
// tensor it holds (no copy), recorded as advised while it lives. A later
// assignment of a new value drops it, and the new buffer is advised anew. The
// held tensor's buffer stays the root, so a reader still holding that buffer
// keeps RefCountIsOne false and the next in-place write copies first.
class AdvisedTensorBuffer : public ::tensorflow::TensorBuffer {
 public:
  explicit AdvisedTensorBuffer(const Tensor& value)
      : ::tensorflow::TensorBuffer(value.data()), value_(value) {
    RecordAdvisedBuffer(data());
  }
  // Forgotten before the held value (and with it the memory) goes.
  ~AdvisedTensorBuffer() override { ForgetAdvisedBuffer(data()); }

  size_t size() const override { return held()->size(); }
  TensorBuffer* root_buffer() override {
    return ::tensorflow::DMAHelper::buffer(&value_)->root_buffer();
  }
  void FillAllocationDescription(
      ::tensorflow::AllocationDescription* proto) const override {
    held()->FillAllocationDescription(proto);
  }
  bool OwnsMemory() const override { return held()->OwnsMemory(); }
  ::tensorflow::AllocatorMemoryType GetMemoryType() const override {
    return held()->GetMemoryType();
  }

 private:
  const TensorBuffer* held() const {
    return ::tensorflow::DMAHelper::buffer(&value_);
  }

  Tensor value_;
};

}  // namespace

absl::Status AdviseHugePages(OpKernelContext*, Tensor* params,
                             int64_t min_bytes, bool* advised) {
  *advised = false;
  const int64_t bytes = static_cast<int64_t>(params->TotalBytes());
  if (!HugePagesEnabled() || bytes < min_bytes || bytes < kHugePageBytes ||
      !::tensorflow::DataTypeCanUseMemcpy(params->dtype()) ||
      ::tensorflow::DMAHelper::buffer(params) == nullptr ||
      IsAdvisedBuffer(params->data())) {
    return absl::OkStatus();
  }
  if (AdviseHugePagesInPlace(params->data(), bytes) == HugePageAdvice::kNone) {
    return absl::OkStatus();
  }
  // Remembered whether or not the collapse went through: a buffer left on
  // small pages for want of memory is not asked again at every write.
  ::tensorflow::core::RefCountPtr<::tensorflow::TensorBuffer> buffer(
      new AdvisedTensorBuffer(*params));
  *params = Tensor(params->dtype(), params->shape(), std::move(buffer));
  *advised = true;
  return absl::OkStatus();
}

}  // namespace partial_embedding
