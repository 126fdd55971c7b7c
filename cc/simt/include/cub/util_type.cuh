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

// CUB's two calls, for the stand-in `what`: the first (a null
// d_temp_storage) only sets temp_storage_bytes; the second needs at least
// that much and queues `work(what, num_items)` on the stream. When it runs,
// the temp storage must be device memory, and is scribbled over first, as
// CUB's kernels use it.
template <typename NumItemsT, typename Work>
cudaError_t TwoCallProtocol(const char* what, void* d_temp_storage,
                            size_t& temp_storage_bytes, NumItemsT count,
                            cudaStream_t stream, const char* file, int line,
                            Work work) {
  const auto num_items = static_cast<int64_t>(count);
  const size_t needed = TempBytes(num_items);
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = needed;
    return cudaSuccess;
  }
  if (temp_storage_bytes < needed || num_items < 0) {
    return cudaErrorInvalidValue;
  }
  return pe_simt::detail::Enqueue(stream, what, file, line, [=] {
    if (!pe_simt::detail::CheckDeviceRange(d_temp_storage, needed, what)) {
      return;
    }
    pe_simt::detail::Scribble(d_temp_storage, needed);
    work(what, num_items);
  });
}

// Whether each pointer's `count` items are device memory (reported as a
// fault naming `what` if not); iterators that are not pointers pass.
template <typename... Iterators>
bool CheckRanges(const char* what, int64_t count, Iterators... iterators) {
  auto check = [&](auto it) {
    if constexpr (std::is_pointer_v<decltype(it)>) {
      using T = std::remove_pointer_t<decltype(it)>;
      return pe_simt::detail::CheckDeviceRange(
          it, sizeof(T) * static_cast<size_t>(count), what);
    } else {
      return true;
    }
  };
  return (check(iterators) && ...);
}

template <typename Iterator>
using ValueOf = typename std::iterator_traits<Iterator>::value_type;

}  // namespace simt_detail
}  // namespace cub

#endif  // PE_SIMT_INCLUDE_CUB_UTIL_TYPE_CUH_
