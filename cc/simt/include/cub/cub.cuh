// The SIMT emulator's CUB stand-ins, all of them.
#ifndef PE_SIMT_INCLUDE_CUB_CUB_CUH_
#define PE_SIMT_INCLUDE_CUB_CUB_CUH_

#include "device/device_radix_sort.cuh"
#include "device/device_run_length_encode.cuh"
#include "device/device_scan.cuh"
#include "util_type.cuh"

#endif  // PE_SIMT_INCLUDE_CUB_CUB_CUH_
