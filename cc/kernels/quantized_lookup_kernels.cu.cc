// The GPU specialization of QuantizedLookupFunctor: TensorFlow's stream and a
// TensorFlow-allocated workspace for the TF-free CUDA core, then the core's
// verdict on the ids. No device code here (see
// masked_scatter_sub_kernels.cu.cc).
#if GOOGLE_CUDA

#include "cc/kernels/quantized_lookup_kernels.h"

#include <cstdint>
#include <limits>

#include "cc/core/quantized_lookup_gpu.h"
#include "cc/kernels/gpu_stream.h"

namespace partial_embedding {

using GPUDevice = Eigen::GpuDevice;

namespace {

constexpr char kOpName[] = "QuantizedLookup";

}  // namespace

template <typename Index>
struct QuantizedLookupFunctor<GPUDevice, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const QuantizedLookupInputs<Index>& in, float* rows,
                          int32_t* store_rows, int64_t* bad_position,
                          int64_t* bad_value) const {
    *bad_position = -1;
    *bad_value = 0;
    GpuCall call;
    TF_RETURN_IF_ERROR(StartGpuCall(
        ctx, kOpName, "ids", "ids", in.num_ids,
        std::numeric_limits<int64_t>::max(),
        [](GpuStream, size_t* bytes) {
          *bytes = kQuantizedLookupGpuWorkspaceBytes;
          return 0;
        },
        &call));
    TF_RETURN_IF_ERROR(
        GpuStatus(QuantizedLookupGpuAsync(in, rows, store_rows,
                                          call.workspace_data(), call.stream),
                  kOpName, "the GPU kernel"));
    // Waits for the stream: the workspace stays alive until the lookup ran.
    return GpuStatus(
        ReadGpuQuantizedLookupError(call.workspace_data(), in.ids, in.num_ids,
                                    call.stream, bad_position, bad_value),
        kOpName, "reading the lookup's checks");
  }
};

template struct QuantizedLookupFunctor<GPUDevice, int32_t>;
template struct QuantizedLookupFunctor<GPUDevice, int64_t>;

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
