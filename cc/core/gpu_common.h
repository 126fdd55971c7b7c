// What every TF-free CUDA core shares on the host side: the stream type, the
// size limit, running on a stream's device, copies and error names.
//
// This header includes no CUDA header, so host code compiled by a plain C++
// compiler (the TensorFlow kernels, the pybind11 module) can call the cores.
// Errors are cudaError_t values returned as int (0 is success). Which CUDA
// runtime the cores call is the linking library's choice (CMakeLists.txt): the
// one TensorFlow loads (libtensorflow_framework.so.2 exports its API) in the
// default CUDA 12 build of the op library, libcudart.so.12 in the kernel
// module, or a static runtime kept private in the nvcc build. The cores use
// nothing newer than the CUDA 12.5 runtime API.
#ifndef PARTIAL_EMBEDDING_CC_CORE_GPU_COMMON_H_
#define PARTIAL_EMBEDDING_CC_CORE_GPU_COMMON_H_

#include <cstdint>

// The same type as CUDA's cudaStream_t / CUstream.
struct CUstream_st;

namespace partial_embedding {

using GpuStream = CUstream_st*;

// The largest num_indices the GPU cores accept (positions are 32-bit there).
constexpr int64_t kMaxGpuIndices = (int64_t{1} << 31) - 1;

// Makes the device that owns `stream` current on this thread (TensorFlow may
// call from a thread whose current device is another one). The null, legacy
// and per-thread streams keep the current device.
int SelectStreamDevice(GpuStream stream);

// Enqueues a device-to-device copy of `bytes` bytes on `stream`.
int GpuCopyDeviceToDevice(void* dst, const void* src, int64_t bytes,
                          GpuStream stream);

// Copies `bytes` bytes from the device to the host and waits for `stream`.
int GpuCopyToHostAndWait(void* dst, const void* src, int64_t bytes,
                         GpuStream stream);

// The CUDA runtime's name and description of an error code.
const char* GpuErrorString(int error);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_GPU_COMMON_H_
