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

// Both SortPairs overloads: sorts the inputs into the outputs when the stream
// runs, then scribbles over the spare keys and values (if not null: the
// DoubleBuffers' half that does not hold the result).
template <typename KeyT, typename ValueT>
cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes,
                      const KeyT* keys_in, KeyT* keys_out,
                      const ValueT* values_in, ValueT* values_out,
                      KeyT* spare_keys, ValueT* spare_values, int64_t n,
                      int begin_bit, int end_bit, cudaStream_t stream,
                      const char* file, int line) {
  static_assert(std::is_integral_v<KeyT> && std::is_unsigned_v<KeyT>,
                "the SIMT SortPairs stand-in sorts unsigned integer keys");
  if (n < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(KeyT) * 8) ||
      begin_bit > end_bit) {
    return cudaErrorInvalidValue;
  }
  return TwoCallProtocol(
      "cub::DeviceRadixSort::SortPairs", d_temp_storage, temp_storage_bytes, n,
      stream, file, line, [=](const char* what, int64_t) {
        if (!CheckRanges(what, n, keys_in, keys_out, values_in, values_out) ||
            (spare_keys != nullptr &&
             !CheckRanges(what, n, spare_keys, spare_values))) {
          return;
        }
        StableSortPairs(keys_in, values_in, n, begin_bit, end_bit, keys_out,
                        values_out);
        if (spare_keys != nullptr) {
          pe_simt::detail::Scribble(spare_keys, sizeof(KeyT) * n);
          pe_simt::detail::Scribble(spare_values, sizeof(ValueT) * n);
        }
      });
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
    // Which half holds the result: drawn for the call that queues the sort.
    const int flip = d_temp_storage == nullptr
                         ? 0
                         : static_cast<int>(pe_simt::detail::RandomBits() & 1);
    KeyT* keys[2] = {d_keys.Current(), d_keys.Alternate()};
    ValueT* values[2] = {d_values.Current(), d_values.Alternate()};
    const cudaError_t error = simt_detail::SortPairs(
        d_temp_storage, temp_storage_bytes, keys[0], keys[flip], values[0],
        values[flip], keys[flip ^ 1], values[flip ^ 1],
        static_cast<int64_t>(num_items), begin_bit, end_bit, stream, file,
        line);
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
    return simt_detail::SortPairs<KeyT, ValueT>(
        d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, d_values_in,
        d_values_out, nullptr, nullptr, static_cast<int64_t>(num_items),
        begin_bit, end_bit, stream, file, line);
  }
};

}  // namespace cub

#endif  // PE_SIMT_INCLUDE_CUB_DEVICE_DEVICE_RADIX_SORT_CUH_
