#include "cc/core/huge_pages.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#if defined(__linux__)
#include <sys/mman.h>
// Linux >= 6.1 has it; C libraries older than the kernel may not name it.
#if !defined(MADV_COLLAPSE)
#define MADV_COLLAPSE 25
#endif
#endif

namespace partial_embedding {
namespace {

// The advised buffers and how many owners recorded each.
std::mutex& AdvisedMutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

std::unordered_map<const void*, int>& Advised() {
  static auto* buffers = new std::unordered_map<const void*, int>;
  return *buffers;
}

// Set once the kernel refuses MADV_HUGEPAGE (built without transparent huge
// pages): from then on nothing is advised.
std::atomic<bool>& AdviceRefused() {
  static auto* refused = new std::atomic<bool>(false);
  return *refused;
}

#if defined(__linux__) && defined(MADV_HUGEPAGE)
// Whether the kernel knows MADV_COLLAPSE, asked once with an empty range: a
// kernel that has it accepts that and does nothing, an older one rejects the
// unknown advice with EINVAL.
bool KernelHasCollapse() {
  static const bool has_collapse = [] {
    alignas(4096) static char probe[4096];
    return madvise(probe, 0, MADV_COLLAPSE) == 0;
  }();
  return has_collapse;
}
#endif

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

HugePageInterior InteriorHugePages(const void* data, int64_t bytes) {
  HugePageInterior interior;
  if (data == nullptr || bytes <= 0) return interior;
  constexpr uintptr_t kHuge = static_cast<uintptr_t>(kHugePageBytes);
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t stop = start + static_cast<uintptr_t>(bytes);
  if (stop < start) return interior;  // Wraps around: not a real buffer.
  const uintptr_t begin = (start + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = stop & ~(kHuge - 1);
  if (begin < start || end <= begin) return interior;
  interior.begin = begin;
  interior.end = end;
  return interior;
}

bool CollapseUnavailable() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  return !KernelHasCollapse();
#else
  return true;
#endif
}

HugePageAdvice AdviseHugePagesInPlace(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const HugePageInterior interior = InteriorHugePages(data, bytes);
  if (interior.bytes() == 0) return HugePageAdvice::kNone;
  // The flag on the interior's mapping: huge pages for the faults and for
  // khugepaged from now on, whatever the collapse below achieves.
  if (madvise(reinterpret_cast<void*>(interior.begin),
              static_cast<size_t>(interior.bytes()), MADV_HUGEPAGE) != 0) {
    if (errno == EINVAL) AdviceRefused().store(true, std::memory_order_relaxed);
    return HugePageAdvice::kNone;
  }
  if (!KernelHasCollapse()) return HugePageAdvice::kAdvised;
  // The kernel copies the 512 small pages under each 2 MiB piece into a new
  // huge page and frees them, piece after piece: one free huge page at a
  // time, never a second table. One call for the whole interior: each call
  // first drains the per-CPU page lists on every CPU. Pieces whose pages are
  // busy for a moment are skipped (EAGAIN at the end); the first piece
  // without a free huge page ends the call (ENOMEM, or EBUSY at a cgroup's
  // limit): the rest stays on small pages rather than press on.
  const bool all_collapsed =
      madvise(reinterpret_cast<void*>(interior.begin),
              static_cast<size_t>(interior.bytes()), MADV_COLLAPSE) == 0;
  return all_collapsed ? HugePageAdvice::kCollapsed : HugePageAdvice::kAdvised;
#else
  (void)data;
  (void)bytes;
  return HugePageAdvice::kNone;
#endif
}

void RecordAdvisedBuffer(const void* data) {
  std::lock_guard<std::mutex> lock(AdvisedMutex());
  ++Advised()[data];
}

void ForgetAdvisedBuffer(const void* data) {
  std::lock_guard<std::mutex> lock(AdvisedMutex());
  auto found = Advised().find(data);
  if (found == Advised().end()) return;
  if (--found->second == 0) Advised().erase(found);
}

bool IsAdvisedBuffer(const void* data) {
  std::lock_guard<std::mutex> lock(AdvisedMutex());
  return Advised().count(data) != 0;
}

}  // namespace partial_embedding
