// Helpers shared by the OpKernels that write a resource variable in place.
#include "cc/kernels/in_place_update.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/huge_pages.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/util/work_sharder.h"

namespace partial_embedding {

std::string FormatIndexPosition(const ::tensorflow::TensorShape& shape,
                                int64_t flat) {
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

namespace {

// A tensor buffer from AllocateHugePageBuffer, freed when the last tensor
// holding it goes.
class HugePageTensorBuffer : public ::tensorflow::TensorBuffer {
 public:
  HugePageTensorBuffer(void* data, size_t size)
      : ::tensorflow::TensorBuffer(data), size_(size) {}
  ~HugePageTensorBuffer() override { FreeHugePageBuffer(data()); }

  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(
      ::tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size_));
    proto->set_allocator_name("partial_embedding_huge_pages");
  }

 private:
  size_t size_;
};

}  // namespace

absl::Status MoveToHugePages(::tensorflow::OpKernelContext* ctx,
                             ::tensorflow::Tensor* params, int64_t min_bytes,
                             bool* moved) {
  *moved = false;
  const int64_t bytes = static_cast<int64_t>(params->TotalBytes());
  if (!HugePagesEnabled() || bytes < min_bytes || bytes < kHugePageBytes ||
      !::tensorflow::DataTypeCanUseMemcpy(params->dtype()) ||
      IsHugePageBuffer(params->data())) {
    return absl::OkStatus();
  }
  void* data = AllocateHugePageBuffer(bytes);
  if (data == nullptr) return absl::OkStatus();  // Keeps the old buffer.
  // The copy faults every huge page in (the kernel zeroes each first): in
  // 2 MiB pieces over the worker threads.
  const char* source = static_cast<const char*>(params->data());
  char* target = static_cast<char*>(data);
  const int64_t pieces = (bytes + kHugePageBytes - 1) / kHugePageBytes;
  const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers.num_threads, workers.workers, pieces,
      /*cost_per_unit=*/kHugePageBytes, [&](int64_t begin, int64_t end) {
        const int64_t from = begin * kHugePageBytes;
        const int64_t to = std::min(end * kHugePageBytes, bytes);
        std::memcpy(target + from, source + from,
                    static_cast<size_t>(to - from));
      });
  ::tensorflow::core::RefCountPtr<::tensorflow::TensorBuffer> buffer(
      new HugePageTensorBuffer(data, static_cast<size_t>(bytes)));
  ::tensorflow::Tensor old = *params;
  *params =
      ::tensorflow::Tensor(params->dtype(), params->shape(), std::move(buffer));
  // Nobody else reads the old buffer: give its pages back before it returns
  // to TensorFlow's allocator, which may pool it (oneDNN's CPU allocator
  // does) and keep a second copy of the table resident.
  if (old.RefCountIsOne()) ReleasePhysicalPages(old.data(), bytes);
  *moved = true;
  return absl::OkStatus();
}

}  // namespace partial_embedding
