// The GPU specialization of MaskedScatterSubFunctor: hands TensorFlow's own
// stream and a TensorFlow-allocated workspace to the TF-free CUDA core.
//
// This file holds no device code, so it is compiled by the host C++ compiler:
// every CUDA call happens inside the core, and only a raw stream and pointers
// cross into it. The core's runtime calls bind to the runtime TensorFlow loads
// in the CUDA 12 line (libtensorflow_framework.so.2 exports its API), or to a
// static runtime kept private to this library in the nvcc build (see
// CMakeLists.txt).
#if GOOGLE_CUDA

#include "cc/kernels/masked_scatter_sub_kernels.h"

#include <cstdint>

#include "cc/core/masked_scatter_sub_gpu.h"
#include "cc/kernels/gpu_stream.h"
#include "tensorflow/core/util/determinism.h"

namespace partial_embedding {

using GPUDevice = Eigen::GpuDevice;

namespace {

constexpr char kOpName[] = "MaskedScatterSub";

}  // namespace

template <typename T, typename Index>
struct MaskedScatterSubFunctor<GPUDevice, T, Index> {
  absl::Status operator()(OpKernelContext* ctx,
                          const MaskedScatterSubArgs<T, Index>& args,
                          int64_t* bad_position, int64_t* bad_value) const {
    using CoreT = typename CoreType<T>::type;
    *bad_position = -1;
    *bad_value = 0;
    const bool deterministic = ::tensorflow::OpDeterminismRequired();
    GpuCall call;
    TF_RETURN_IF_ERROR(StartGpuCall(
        ctx, kOpName, "indices", "positions", args.num_indices, kMaxGpuIndices,
        [&](GpuStream stream, size_t* bytes) {
          return MaskedScatterSubGpuWorkspaceBytes<CoreT>(
              args.num_rows, args.row_size, args.num_indices, deterministic,
              stream, bytes);
        },
        &call));
    // The core waits for the stream before returning.
    return GpuStatus(
        MaskedScatterSubGpu(reinterpret_cast<CoreT*>(args.var), args.num_rows,
                            args.row_size, args.indices, args.num_indices,
                            reinterpret_cast<const CoreT*>(args.updates),
                            args.row_mask, deterministic, call.workspace_data(),
                            call.workspace_bytes, call.stream, bad_position,
                            bad_value),
        kOpName, "the GPU kernel");
  }
};

template <>
absl::Status CopyDeviceBuffer<GPUDevice>(OpKernelContext* ctx, void* dst,
                                         const void* src, int64_t bytes) {
  GpuStream stream = nullptr;
  TF_RETURN_IF_ERROR(TfGpuStream(ctx, "copying a variable", &stream));
  return GpuStatus(GpuCopyDeviceToDevice(dst, src, bytes, stream),
                   "copying a variable", "the device-to-device copy");
}

#define PE_INSTANTIATE_GPU(T, Index) \
  template struct MaskedScatterSubFunctor<GPUDevice, T, Index>;
PE_FOR_EACH_VALUE_AND_INDEX_TYPE(PE_INSTANTIATE_GPU)
#undef PE_INSTANTIATE_GPU

}  // namespace partial_embedding

#endif  // GOOGLE_CUDA
