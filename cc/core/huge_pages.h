// Transparent huge pages for large embedding tables (Linux; elsewhere nothing
// is advised and tables keep their ordinary pages).
//
// A training step touches a few thousand rows scattered over tables of many
// gigabytes: with 4 KiB pages nearly every row access also misses the TLB and
// walks the page table. Backing a table with 2 MiB pages removes most of those
// walks. Huge pages only change how the kernel maps the memory, never its
// contents.
//
// A table is advised where it lies: no second buffer, no copy. The kernel
// collapses the small pages under each 2 MiB-aligned piece into one huge page
// (MADV_COLLAPSE), one piece at a time, so the process needs one free huge
// page at a time, never a second table.
#ifndef PARTIAL_EMBEDDING_CC_CORE_HUGE_PAGES_H_
#define PARTIAL_EMBEDDING_CC_CORE_HUGE_PAGES_H_

#include <cstdint>

namespace partial_embedding {

// Size of a transparent huge page on x86-64 and most aarch64 kernels.
constexpr int64_t kHugePageBytes = int64_t{2} << 20;

// Tables at least this large are advised by the in-place kernels the first
// time they write them.
constexpr int64_t kHugePagesMinBytes = int64_t{32} << 20;

// False when the environment variable PARTIAL_EMBEDDING_HUGE_PAGES is "0",
// on a platform without transparent huge pages, and for the rest of the
// process once the kernel has refused the MADV_HUGEPAGE advice.
bool HugePagesEnabled();

// The whole huge pages inside [data, data + bytes): `begin` rounded up and
// the end rounded down to kHugePageBytes. Empty (begin == end) when no whole
// huge page fits; the partial pages at either end keep 4 KiB pages.
struct HugePageInterior {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  int64_t bytes() const { return static_cast<int64_t>(end - begin); }
};
HugePageInterior InteriorHugePages(const void* data, int64_t bytes);

// What AdviseHugePagesInPlace did.
enum class HugePageAdvice {
  // Nothing: no whole huge page inside the buffer, huge pages off, or the
  // kernel refused MADV_HUGEPAGE (then HugePagesEnabled() turns false).
  kNone,
  // The interior is advised MADV_HUGEPAGE, but not (wholly) collapsed: the
  // kernel has no MADV_COLLAPSE (Linux < 6.1), or had no free huge page at
  // hand. The buffer keeps its 4 KiB pages for now; khugepaged may collapse
  // them later.
  kAdvised,
  // Advised, and every huge page of the interior collapsed now.
  kCollapsed,
};

// Advises the interior of a live, private anonymous buffer MADV_HUGEPAGE and
// collapses it into huge pages in place (MADV_COLLAPSE), piece by piece.
// Never copies the buffer nor changes a byte of it; other threads may read it
// meanwhile. Stops collapsing at the first piece the kernel has no memory for.
// Does not check HugePagesEnabled() (callers do) nor the bookkeeping below.
HugePageAdvice AdviseHugePagesInPlace(void* data, int64_t bytes);

// Whether this process has found MADV_COLLAPSE missing (EINVAL); then
// AdviseHugePagesInPlace only advises, and no longer asks for it.
bool CollapseUnavailable();

// Bookkeeping of advised buffers by address, so that a table is advised once
// and a new buffer at the same address (after the old one is freed) is not
// taken for an advised one: the owner of an advised buffer records it after
// advising and forgets it before the memory is freed. Records are counted
// (two records, two forgets). Thread-safe.
void RecordAdvisedBuffer(const void* data);
void ForgetAdvisedBuffer(const void* data);
bool IsAdvisedBuffer(const void* data);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_HUGE_PAGES_H_
