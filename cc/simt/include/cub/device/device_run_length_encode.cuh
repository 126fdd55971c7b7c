// The SIMT emulator's stand-in for cub::DeviceRunLengthEncode::Encode, queued
// on the stream: writes only the runs' entries and the run count.
#ifndef PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_RUN_LENGTH_ENCODE_CUH_
#define PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_RUN_LENGTH_ENCODE_CUH_

#include "../util_type.cuh"

namespace cub {

struct DeviceRunLengthEncode {
  template <typename InputIt, typename UniqueOutputIt, typename LengthsOutputIt,
            typename NumRunsOutputIt, typename NumItemsT>
  static cudaError_t Encode(void* d_temp_storage, size_t& temp_storage_bytes,
                            InputIt d_in, UniqueOutputIt d_unique_out,
                            LengthsOutputIt d_counts_out,
                            NumRunsOutputIt d_num_runs_out, NumItemsT num_items,
                            cudaStream_t stream = 0,
                            const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
    return simt_detail::TwoCallProtocol(
        "cub::DeviceRunLengthEncode::Encode", d_temp_storage,
        temp_storage_bytes, num_items, stream, file, line,
        [=](const char* what, int64_t n) {
          if (!simt_detail::CheckRanges(what, n, d_in) ||
              !simt_detail::CheckRanges(what, 1, d_num_runs_out)) {
            return;
          }
          using Key = simt_detail::ValueOf<InputIt>;
          using Count = simt_detail::ValueOf<LengthsOutputIt>;
          int64_t runs = 0;
          for (int64_t i = 0; i < n;) {
            const Key key = d_in[i];
            int64_t j = i + 1;
            while (j < n && d_in[j] == key) ++j;
            if (!simt_detail::CheckRanges(what, 1, d_unique_out + runs,
                                          d_counts_out + runs)) {
              return;
            }
            d_unique_out[runs] = key;
            d_counts_out[runs] = static_cast<Count>(j - i);
            ++runs;
            i = j;
          }
          using Runs = simt_detail::ValueOf<NumRunsOutputIt>;
          *d_num_runs_out = static_cast<Runs>(runs);
        });
  }
};

}  // namespace cub

#endif  // PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_RUN_LENGTH_ENCODE_CUH_
