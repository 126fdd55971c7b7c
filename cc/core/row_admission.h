// TF-free core of the RowAdmissionObserve kernel: row admission's counting,
// admission and eviction for one training batch, in place, on the CPU.
//
// The rules (docs/row_admission.md; the TensorFlow-op path of
// python/partial_embedding/layers/_admission.py takes the same decisions,
// under XLA and on a GPU):
//   step += 1
//   for every distinct candidate row r of the batch:
//     counts[r] += 1; last_seen[r] = step
//     r wants in when !admitted[r] and counts[r] >= min_count
//   without a capacity: every row that wants in is admitted.
//   with one, when more want in than there is room for: admitted rows absent
//   from the batch (last_seen != step) are evicted, as few as needed, in the
//   order (counts, last_seen, row) for LFU or (last_seen, row) for LRU; an
//   evicted row is no longer admitted, its count is 0, and it is recorded for
//   the optimizer (evicted_rows, evicted_count). Then the rows that want in
//   are admitted in the order (-counts, row) while there is room; the others
//   wait. The admitted list keeps the admitted rows first (the kept ones in
//   their order, then the new ones by row), -1 after.
#ifndef PARTIAL_EMBEDDING_CC_CORE_ROW_ADMISSION_H_
#define PARTIAL_EMBEDDING_CC_CORE_ROW_ADMISSION_H_

#include <cstdint>
#include <vector>

namespace partial_embedding {

// The state, as raw pointers into the variables' buffers.
struct RowAdmissionState {
  const bool* candidates = nullptr;  // [num_rows]
  bool* admitted = nullptr;          // [num_rows]
  int64_t* counts = nullptr;         // [num_rows]
  int64_t* last_seen = nullptr;      // [num_rows]
  int64_t num_rows = 0;
  int64_t* step = nullptr;            // scalar
  int64_t* admitted_count = nullptr;  // scalar
  // With a capacity: [capacity] ids then -1; the evicted rows' record,
  // [evicted_room], and how many were recorded (may exceed the room).
  int64_t* admitted_list = nullptr;
  int64_t* evicted_rows = nullptr;
  int64_t evicted_room = 0;
  int64_t* evicted_count = nullptr;
};

struct RowAdmissionPolicy {
  int64_t min_count = 1;
  int64_t capacity = -1;  // < 0: none
  bool lru = false;       // false: LFU
};

// The first position of `ids` holding an id outside [0, num_rows) (negative
// ids are allowed with `ignore_negative`: they are no row), or -1.
template <typename Index>
int64_t FindBadRowId(const Index* ids, int64_t num_ids, int64_t num_rows,
                     bool ignore_negative);

// Counts one batch and admits or evicts rows (the ids must have passed
// FindBadRowId). Appends the rows it evicted to `evicted`.
template <typename Index>
void ObserveRowAdmissionBatch(const RowAdmissionPolicy& policy,
                              const RowAdmissionState& state, const Index* ids,
                              int64_t num_ids, std::vector<int64_t>* evicted);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_ROW_ADMISSION_H_
