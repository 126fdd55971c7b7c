// The SIMT emulator's stand-in for the CUDA driver API: the few driver calls
// that cc/core/gpu_common.cu reaches through cudaGetDriverEntryPoint. One
// context, on device 0, owns every stream.
#ifndef PE_SIMT_INCLUDE_CUDA_H_
#define PE_SIMT_INCLUDE_CUDA_H_

#include "cuda_runtime.h"

#define CUDA_VERSION 12050

typedef enum cudaError_enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
} CUresult;

typedef enum CUdriverProcAddressQueryResult_enum {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

typedef uint64_t cuuint64_t;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;

CUresult cuStreamGetCtx(CUstream stream, CUcontext* context);
CUresult cuCtxPushCurrent(CUcontext context);
CUresult cuCtxPopCurrent(CUcontext* context);
CUresult cuCtxGetDevice(CUdevice* device);
// cuGetProcAddress_v2's signature, which every CUDA 12 header maps it to.
CUresult cuGetProcAddress(const char* symbol, void** function, int cuda_version,
                          cuuint64_t flags,
                          CUdriverProcAddressQueryResult* status);

#endif  // PE_SIMT_INCLUDE_CUDA_H_
