// Transparent huge pages for large embedding tables (Linux; elsewhere the
// allocation below just fails and callers keep their ordinary buffers).
//
// A training step touches a few thousand rows scattered over tables of many
// gigabytes: with 4 KiB pages nearly every row access also misses the TLB and
// walks the page table. Backing a table with 2 MiB pages removes most of those
// walks. Huge pages only change how the kernel maps the memory, never its
// contents.
#ifndef PARTIAL_EMBEDDING_CC_CORE_HUGE_PAGES_H_
#define PARTIAL_EMBEDDING_CC_CORE_HUGE_PAGES_H_

#include <cstdint>

namespace partial_embedding {

// Size of a transparent huge page on x86-64 and most aarch64 kernels.
constexpr int64_t kHugePageBytes = int64_t{2} << 20;

// Tables at least this large are moved to huge pages by the in-place
// kernels the first time they write them.
constexpr int64_t kHugePagesMinBytes = int64_t{32} << 20;

// False when the environment variable PARTIAL_EMBEDDING_HUGE_PAGES is "0",
// on a platform without transparent huge pages, and for the rest of the
// process once the kernel has refused the advice.
bool HugePagesEnabled();

// A buffer of at least `bytes`, aligned to and sized in whole huge pages,
// advised MADV_HUGEPAGE before its first touch, so the writes that fill it
// fault in huge pages (where the system has them to give). Null when the
// allocation or the advice fails (a refused advice turns HugePagesEnabled
// off). Free with FreeHugePageBuffer only.
void* AllocateHugePageBuffer(int64_t bytes);
void FreeHugePageBuffer(void* data);

// Hands the physical pages under the page-aligned interior of [data, data +
// bytes) back to the system (MADV_DONTNEED); the range stays mapped and reads
// as zeros afterwards. For a buffer about to be freed to an allocator that
// pools memory (TensorFlow's oneDNN CPU allocator does): without it, a table
// moved to huge pages would leave its old copy resident in the pool. Call
// only while holding the last reference to the buffer.
void ReleasePhysicalPages(void* data, int64_t bytes);

// Whether `data` is a live buffer from AllocateHugePageBuffer. Thread-safe.
bool IsHugePageBuffer(const void* data);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_HUGE_PAGES_H_
