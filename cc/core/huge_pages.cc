#include "cc/core/huge_pages.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace partial_embedding {
namespace {

// The live buffers: a table is moved once, and a buffer freed and reused at
// the same address is never taken for a moved one (it leaves the set first).
std::mutex& LiveMutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

std::unordered_set<const void*>& Live() {
  static auto* buffers = new std::unordered_set<const void*>;
  return *buffers;
}

// Set once the kernel refuses MADV_HUGEPAGE (built without transparent huge
// pages): from then on no table-sized buffer is allocated only to be freed
// again at every in-place write.
std::atomic<bool>& AdviceRefused() {
  static auto* refused = new std::atomic<bool>(false);
  return *refused;
}

}  // namespace

bool HugePagesEnabled() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (AdviceRefused().load(std::memory_order_relaxed)) return false;
  const char* setting = std::getenv("PARTIAL_EMBEDDING_HUGE_PAGES");
  return setting == nullptr || std::strcmp(setting, "0") != 0;
#else
  return false;
#endif
}

void* AllocateHugePageBuffer(int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes <= 0) return nullptr;
  const size_t rounded = static_cast<size_t>((bytes + kHugePageBytes - 1) /
                                             kHugePageBytes * kHugePageBytes);
  void* data = std::aligned_alloc(static_cast<size_t>(kHugePageBytes), rounded);
  if (data == nullptr) return nullptr;
  if (madvise(data, rounded, MADV_HUGEPAGE) != 0) {
    AdviceRefused().store(true, std::memory_order_relaxed);
    std::free(data);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(LiveMutex());
  Live().insert(data);
  return data;
#else
  (void)bytes;
  return nullptr;
#endif
}

void FreeHugePageBuffer(void* data) {
  if (data == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(LiveMutex());
    Live().erase(data);
  }
  std::free(data);
}

void ReleasePhysicalPages(void* data, int64_t bytes) {
#if defined(__linux__)
  if (data == nullptr || bytes <= 0) return;
  constexpr uintptr_t kPage = 4096;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kPage - 1) & ~(kPage - 1);
  const uintptr_t last = (begin + static_cast<uintptr_t>(bytes)) & ~(kPage - 1);
  if (last > first) {
    madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
#else
  (void)data;
  (void)bytes;
#endif
}

bool IsHugePageBuffer(const void* data) {
  std::lock_guard<std::mutex> lock(LiveMutex());
  return Live().count(data) != 0;
}

}  // namespace partial_embedding
