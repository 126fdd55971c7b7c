// The SIMT emulator's stand-in for cub::DeviceRadixSort::SortPairs: stable,
// by the key bits [begin_bit, end_bit) only, queued on the stream. With
// DoubleBuffers the half that holds the result is drawn from the seed (CUB
// picks it by its pass count) and the other half is scribbled over, so code
// that ignores `selector` fails on some seed.
#ifndef PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_RADIX_SORT_CUH_
#define PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_RADIX_SORT_CUH_

#include <algorithm>
#include <numeric>
#include <vector>

#include "../util_type.cuh"

namespace cub {
namespace simt_detail {

// Sorts n pairs from the inputs into the outputs (either may alias).
template <typename KeyT, typename ValueT>
void StableSortPairs(const KeyT* keys_in, const ValueT* values_in, int64_t n,
                     int begin_bit, int end_bit, KeyT* keys_out,
                     ValueT* values_out) {
  const int bits = end_bit - begin_bit;
  const KeyT digit_mask = bits >= static_cast<int>(sizeof(KeyT) * 8)
                              ? ~KeyT{0}
                              : static_cast<KeyT>((KeyT{1} << bits) - 1);
  std::vector<KeyT> keys(keys_in, keys_in + n);
  std::vector<ValueT> values(values_in, values_in + n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Stable: equal digits keep their positions' order.
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const KeyT digit_a = (keys[a] >> begin_bit) & digit_mask;
    const KeyT digit_b = (keys[b] >> begin_bit) & digit_mask;
    return digit_a != digit_b ? digit_a < digit_b : a < b;
  });
  for (int64_t i = 0; i < n; ++i) {
    keys_out[i] = keys[order[i]];
    values_out[i] = values[order[i]];
  }
}

template <typename KeyT>
cudaError_t CheckSortArguments(int64_t num_items, int begin_bit, int end_bit) {
  static_assert(std::is_integral_v<KeyT> && std::is_unsigned_v<KeyT>,
                "the SIMT SortPairs stand-in sorts unsigned integer keys");
  if (num_items < 0 || begin_bit < 0 ||
      end_bit > static_cast<int>(sizeof(KeyT) * 8) || begin_bit > end_bit) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace simt_detail

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes,
                               DoubleBuffer<KeyT>& d_keys,
                               DoubleBuffer<ValueT>& d_values,
                               NumItemsT num_items, int begin_bit = 0,
                               int end_bit = sizeof(KeyT) * 8,
                               cudaStream_t stream = 0,
                               const char* file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
    const auto n = static_cast<int64_t>(num_items);
    cudaError_t error =
        simt_detail::CheckSortArguments<KeyT>(n, begin_bit, end_bit);
    if (error != cudaSuccess) return error;
    if (simt_detail::SizeOnly(d_temp_storage, temp_storage_bytes, n, &error)) {
      return error;
    }
    const int flip = static_cast<int>(pe_simt::detail::RandomBits() & 1);
    KeyT* keys[2] = {d_keys.Current(), d_keys.Alternate()};
    ValueT* values[2] = {d_values.Current(), d_values.Alternate()};
    error = pe_simt::detail::Enqueue(
        stream, "cub::DeviceRadixSort::SortPairs", file, line, [=] {
          if (!simt_detail::Prepare(
                  "cub::DeviceRadixSort::SortPairs temp storage",
                  d_temp_storage, n)) {
            return;
          }
          for (int half = 0; half < 2; ++half) {
            if (!simt_detail::CheckRange(
                    keys[half], n, "cub::DeviceRadixSort::SortPairs keys") ||
                !simt_detail::CheckRange(
                    values[half], n,
                    "cub::DeviceRadixSort::SortPairs values")) {
              return;
            }
          }
          simt_detail::StableSortPairs(keys[0], values[0], n, begin_bit,
                                       end_bit, keys[flip], values[flip]);
          pe_simt::detail::Scribble(keys[flip ^ 1], sizeof(KeyT) * n);
          pe_simt::detail::Scribble(values[flip ^ 1], sizeof(ValueT) * n);
        });
    if (error == cudaSuccess) {
      d_keys.selector ^= flip;
      d_values.selector ^= flip;
    }
    return error;
  }

  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes,
                               const KeyT* d_keys_in, KeyT* d_keys_out,
                               const ValueT* d_values_in, ValueT* d_values_out,
                               NumItemsT num_items, int begin_bit = 0,
                               int end_bit = sizeof(KeyT) * 8,
                               cudaStream_t stream = 0,
                               const char* file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
    const auto n = static_cast<int64_t>(num_items);
    cudaError_t error =
        simt_detail::CheckSortArguments<KeyT>(n, begin_bit, end_bit);
    if (error != cudaSuccess) return error;
    if (simt_detail::SizeOnly(d_temp_storage, temp_storage_bytes, n, &error)) {
      return error;
    }
    return pe_simt::detail::Enqueue(
        stream, "cub::DeviceRadixSort::SortPairs", file, line, [=] {
          const char* what = "cub::DeviceRadixSort::SortPairs";
          if (!simt_detail::Prepare(what, d_temp_storage, n) ||
              !simt_detail::CheckRange(d_keys_in, n, what) ||
              !simt_detail::CheckRange(d_keys_out, n, what) ||
              !simt_detail::CheckRange(d_values_in, n, what) ||
              !simt_detail::CheckRange(d_values_out, n, what)) {
            return;
          }
          simt_detail::StableSortPairs(d_keys_in, d_values_in, n, begin_bit,
                                       end_bit, d_keys_out, d_values_out);
        });
  }
};

}  // namespace cub

#endif  // PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_RADIX_SORT_CUH_
