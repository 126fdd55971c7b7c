// The SIMT emulator's stand-in for cub::DeviceScan::ExclusiveSum, queued on
// the stream (in place allowed).
#ifndef PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_SCAN_CUH_
#define PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_SCAN_CUH_

#include "../util_type.cuh"

namespace cub {

struct DeviceScan {
  template <typename InputIt, typename OutputIt, typename NumItemsT>
  static cudaError_t ExclusiveSum(void* d_temp_storage,
                                  size_t& temp_storage_bytes, InputIt d_in,
                                  OutputIt d_out, NumItemsT num_items,
                                  cudaStream_t stream = 0,
                                  const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
    return simt_detail::TwoCallProtocol(
        "cub::DeviceScan::ExclusiveSum", d_temp_storage, temp_storage_bytes,
        num_items, stream, file, line, [=](const char* what, int64_t n) {
          if (!simt_detail::CheckRanges(what, n, d_in, d_out)) return;
          using T = simt_detail::ValueOf<InputIt>;
          T sum = T(0);
          InputIt in = d_in;
          OutputIt out = d_out;
          for (int64_t i = 0; i < n; ++i, ++in, ++out) {
            const T value = *in;  // Before the write: in place is allowed.
            *out = sum;
            sum = static_cast<T>(sum + value);
          }
        });
  }
};

}  // namespace cub

#endif  // PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_SCAN_CUH_
