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
    const auto n = static_cast<int64_t>(num_items);
    cudaError_t error = cudaSuccess;
    if (simt_detail::SizeOnly(d_temp_storage, temp_storage_bytes, n, &error)) {
      return error;
    }
    return pe_simt::detail::Enqueue(
        stream, "cub::DeviceRunLengthEncode::Encode", file, line, [=] {
          const char* what = "cub::DeviceRunLengthEncode::Encode";
          if (!simt_detail::Prepare(what, d_temp_storage, n) ||
              !simt_detail::CheckRange(d_in, n, what) ||
              !simt_detail::CheckRange(d_num_runs_out, 1, what)) {
            return;
          }
          using Key = simt_detail::ValueOf<InputIt>;
          using Count = simt_detail::ValueOf<LengthsOutputIt>;
          int64_t runs = 0;
          for (int64_t i = 0; i < n;) {
            const Key key = d_in[i];
            int64_t j = i + 1;
            while (j < n && d_in[j] == key) ++j;
            if (!simt_detail::CheckRange(d_unique_out + runs, 1, what) ||
                !simt_detail::CheckRange(d_counts_out + runs, 1, what)) {
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
