// The SIMT emulator's stand-in for CUB's DoubleBuffer, and what the stand-in
// device algorithms share: the two-call temp-storage protocol and checks.
#ifndef PE_SIMT_INCLUDE_CUB_UTIL_TYPE_CUH_
#define PE_SIMT_INCLUDE_CUB_UTIL_TYPE_CUH_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "../simt_runtime.h"

namespace cub {

template <typename T>
struct DoubleBuffer {
  T* d_buffers[2];
  int selector;

  DoubleBuffer() : d_buffers{nullptr, nullptr}, selector(0) {}
  DoubleBuffer(T* d_current, T* d_alternate)
      : d_buffers{d_current, d_alternate}, selector(0) {}
  T* Current() { return d_buffers[selector]; }
  T* Alternate() { return d_buffers[selector ^ 1]; }
};

namespace simt_detail {

// What a stand-in asks of its temp storage: a size, so that callers must
// keep CUB's protocol (ask, allocate, call again).
inline size_t TempBytes(int64_t num_items) {
  return 256 + 8 * static_cast<size_t>(num_items < 0 ? 0 : num_items);
}

// The protocol's first call only sets the size; the second needs at least
// that much.
inline bool SizeOnly(void* d_temp_storage, size_t& temp_storage_bytes,
                     int64_t num_items, cudaError_t* error) {
  const size_t needed = TempBytes(num_items);
  *error = cudaSuccess;
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = needed;
    return true;
  }
  if (temp_storage_bytes < needed || num_items < 0) {
    *error = cudaErrorInvalidValue;
    return true;
  }
  return false;
}

// At run time: the temp storage and every pointer argument must be device
// memory; the temp storage is scribbled over, as CUB's kernels use it.
inline bool Prepare(const char* what, void* d_temp_storage, int64_t num_items) {
  const size_t bytes = TempBytes(num_items);
  if (!pe_simt::detail::CheckDeviceRange(d_temp_storage, bytes, what)) {
    return false;
  }
  pe_simt::detail::Scribble(d_temp_storage, bytes);
  return true;
}

template <typename Iterator>
bool CheckRange(Iterator it, int64_t count, const char* what) {
  if constexpr (std::is_pointer_v<Iterator>) {
    using T = std::remove_pointer_t<Iterator>;
    return pe_simt::detail::CheckDeviceRange(
        it, sizeof(T) * static_cast<size_t>(count), what);
  } else {
    return true;
  }
}

template <typename Iterator>
using ValueOf = typename std::iterator_traits<Iterator>::value_type;

}  // namespace simt_detail
}  // namespace cub

#endif  // PE_SIMT_INCLUDE_CUB_UTIL_TYPE_CUH_
