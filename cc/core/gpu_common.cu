// Host side of what the CUDA cores share (gpu_common.h): finding the device
// of a stream, copies, error names.
#include <cuda.h>
#include <cuda_runtime.h>

#include "cc/core/gpu_common.h"

namespace partial_embedding {
namespace {

#if CUDART_VERSION >= 12080
cudaError_t GetStreamDevice(cudaStream_t stream, int* device) {
  return cudaStreamGetDevice(stream, device);
}
#else
// The CUDA 12.5 runtime (TensorFlow 2.21's) has no cudaStreamGetDevice: ask the
// driver which context owns the stream and which device that context is on.
// The driver calls come through the runtime's entry points, so nothing here
// links against libcuda.
//
// Each driver function is asked for by the CUDA version whose signature this
// file calls (kDriverAbiVersion), never "the newest the runtime knows":
// cudaGetDriverEntryPoint returns the newest ABI of a symbol up to the
// runtime's version, and from CUDA 12.5 on that is cuStreamGetCtx_v2, which
// takes a third (green context) pointer. Called with two arguments, the driver
// wrote through whatever the third register held: the segfault of the first
// GPU run under TensorFlow (its runtime is 12.5). cuGetProcAddress_v2 (CUDA
// 12.0) takes the version to match.
constexpr int kDriverAbiVersion = 12000;

struct StreamContextCalls {
  decltype(&cuStreamGetCtx) stream_get_ctx = nullptr;
  decltype(&cuCtxPushCurrent) push_current = nullptr;
  decltype(&cuCtxGetDevice) get_device = nullptr;
  decltype(&cuCtxPopCurrent) pop_current = nullptr;
  cudaError_t error = cudaSuccess;
};

StreamContextCalls LoadStreamContextCalls() {
  StreamContextCalls calls;
  // cuGetProcAddress is cuGetProcAddress_v2 in every CUDA 12 header and
  // runtime: the one entry point taken by the runtime's own version.
  decltype(&cuGetProcAddress) get_proc_address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  calls.error = cudaGetDriverEntryPoint(
      "cuGetProcAddress", reinterpret_cast<void**>(&get_proc_address),
      cudaEnableDefault, &found);
  if (calls.error == cudaSuccess &&
      (found != cudaDriverEntryPointSuccess || get_proc_address == nullptr)) {
    calls.error = cudaErrorSymbolNotFound;
  }
  const auto load = [&](const char* name, void** function) {
    if (calls.error != cudaSuccess) return;
    CUdriverProcAddressQueryResult status =
        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const CUresult result =
        get_proc_address(name, function, kDriverAbiVersion,
                         CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (result != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS ||
        *function == nullptr) {
      calls.error = cudaErrorSymbolNotFound;
    }
  };
  load("cuStreamGetCtx", reinterpret_cast<void**>(&calls.stream_get_ctx));
  load("cuCtxPushCurrent", reinterpret_cast<void**>(&calls.push_current));
  load("cuCtxGetDevice", reinterpret_cast<void**>(&calls.get_device));
  load("cuCtxPopCurrent", reinterpret_cast<void**>(&calls.pop_current));
  return calls;
}

cudaError_t GetStreamDevice(cudaStream_t stream, int* device) {
  static const StreamContextCalls calls = LoadStreamContextCalls();
  if (calls.error != cudaSuccess) return calls.error;
  CUcontext context = nullptr;
  if (calls.stream_get_ctx(stream, &context) != CUDA_SUCCESS ||
      calls.push_current(context) != CUDA_SUCCESS) {
    return cudaErrorInvalidResourceHandle;
  }
  CUdevice stream_device = 0;
  const CUresult got = calls.get_device(&stream_device);
  CUcontext popped = nullptr;
  calls.pop_current(&popped);
  if (got != CUDA_SUCCESS) return cudaErrorInvalidResourceHandle;
  *device = static_cast<int>(stream_device);
  return cudaSuccess;
}
#endif  // CUDART_VERSION >= 12080

}  // namespace

int SelectStreamDevice(GpuStream stream) {
  const cudaStream_t cuda_stream = stream;
  if (cuda_stream == nullptr || cuda_stream == cudaStreamLegacy ||
      cuda_stream == cudaStreamPerThread) {
    return cudaSuccess;
  }
  int stream_device = 0;
  cudaError_t error = GetStreamDevice(cuda_stream, &stream_device);
  if (error != cudaSuccess) return error;
  int current_device = 0;
  error = cudaGetDevice(&current_device);
  if (error != cudaSuccess) return error;
  return current_device == stream_device ? cudaSuccess
                                         : cudaSetDevice(stream_device);
}

int GpuCopyDeviceToDevice(void* dst, const void* src, int64_t bytes,
                          GpuStream stream) {
  if (bytes <= 0) return cudaSuccess;
  const int error = SelectStreamDevice(stream);
  if (error != cudaSuccess) return error;
  return cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                         cudaMemcpyDeviceToDevice, stream);
}

int GpuCopyToHostAndWait(void* dst, const void* src, int64_t bytes,
                         GpuStream stream) {
  if (bytes <= 0) return cudaSuccess;
  cudaError_t error = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                      cudaMemcpyDeviceToHost, stream);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  return error;
}

const char* GpuErrorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // namespace partial_embedding
