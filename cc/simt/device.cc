// The SIMT emulator's one device: its properties, the error names, and the
// driver calls reached through cudaGetDriverEntryPoint (one context, on
// device 0, owns every stream).
#include <cstring>
#include <mutex>
#include <vector>

#include "include/cuda.h"
#include "runtime_internal.h"

struct CUctx_st {
  int device = 0;
};

namespace {

CUctx_st the_context;
thread_local std::vector<CUcontext> pushed_contexts;

struct ErrorText {
  cudaError_t error;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError",
     "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue",
     "invalid pitch argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer",
     "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice",
     "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice",
     "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
     "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound",
     "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure",
     "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* FindError(cudaError_t error) {
  for (const ErrorText& entry : kErrors) {
    if (entry.error == error) return &entry;
  }
  return nullptr;
}

cudaError_t CheckDevice(int device) {
  return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

}  // namespace

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* found = FindError(error);
  return found != nullptr ? found->name : "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* found = FindError(error);
  return found != nullptr ? found->text : "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return CheckDevice(device); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return cudaErrorInvalidValue;
  if (CheckDevice(device) != cudaSuccess) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof(*prop));
  std::strcpy(prop->name, "SIMT emulator");
  prop->totalGlobalMem = size_t{16} << 30;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->clockRate = 1000000;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 8;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->memoryBusWidth = 256;
  prop->l2CacheSize = 4 << 20;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr,
                                   int device) {
  if (value == nullptr) return cudaErrorInvalidValue;
  if (CheckDevice(device) != cudaSuccess) return cudaErrorInvalidDevice;
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = prop.maxThreadsPerBlock;
      break;
    case cudaDevAttrMaxBlockDimX:
      *value = prop.maxThreadsDim[0];
      break;
    case cudaDevAttrMaxGridDimX:
      *value = prop.maxGridSize[0];
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(prop.sharedMemPerBlock);
      break;
    case cudaDevAttrWarpSize:
      *value = prop.warpSize;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = prop.multiProcessorCount;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = prop.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = prop.minor;
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return cudaErrorInvalidValue;
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  return cudaDriverGetVersion(version);
}

CUresult cuStreamGetCtx(CUstream stream, CUcontext* context) {
  int device = 0;
  if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (cudaStreamGetDevice(stream, &device) != cudaSuccess) {
    cudaGetLastError();  // A driver call leaves the runtime's error alone.
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *context = &the_context;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext context) {
  if (context != &the_context) return CUDA_ERROR_INVALID_CONTEXT;
  pushed_contexts.push_back(context);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* context) {
  if (pushed_contexts.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (context != nullptr) *context = pushed_contexts.back();
  pushed_contexts.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = the_context.device;
  return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char* symbol, void** function, int, cuuint64_t,
                          CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || function == nullptr) return CUDA_ERROR_INVALID_VALUE;
  struct Entry {
    const char* name;
    void* function;
  };
  const Entry entries[] = {
      {"cuStreamGetCtx", reinterpret_cast<void*>(&cuStreamGetCtx)},
      {"cuCtxPushCurrent", reinterpret_cast<void*>(&cuCtxPushCurrent)},
      {"cuCtxPopCurrent", reinterpret_cast<void*>(&cuCtxPopCurrent)},
      {"cuCtxGetDevice", reinterpret_cast<void*>(&cuCtxGetDevice)},
      {"cuGetProcAddress", reinterpret_cast<void*>(&cuGetProcAddress)},
  };
  *function = nullptr;
  for (const Entry& entry : entries) {
    if (std::strcmp(entry.name, symbol) == 0) *function = entry.function;
  }
  if (status != nullptr) {
    *status = *function != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
                                   : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return *function != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** function,
                                    unsigned long long,
                                    cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || function == nullptr) return cudaErrorInvalidValue;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  cuGetProcAddress(symbol, function, CUDART_VERSION, 0, &found);
  if (status != nullptr) {
    *status = found == CU_GET_PROC_ADDRESS_SUCCESS
                  ? cudaDriverEntryPointSuccess
                  : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}
