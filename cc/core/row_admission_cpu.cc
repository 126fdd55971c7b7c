// Row admission's batch step on the CPU (see row_admission.h).
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "cc/core/row_admission.h"

namespace partial_embedding {

template <typename Index>
int64_t FindBadRowId(const Index* ids, int64_t num_ids, int64_t num_rows,
                     bool ignore_negative) {
  for (int64_t i = 0; i < num_ids; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 && ignore_negative) continue;
    if (id < 0 || id >= num_rows) return i;
  }
  return -1;
}

namespace {

// Evicts, from the admitted list's first `used` entries, up to `needed` rows
// absent from this batch, in the policy's order. Returns how many are left
// in the list, which keeps its order.
int64_t Evict(const RowAdmissionPolicy& policy, const RowAdmissionState& state,
              int64_t used, int64_t needed, int64_t step,
              std::vector<int64_t>* evicted) {
  std::vector<int64_t> evictable;
  evictable.reserve(static_cast<size_t>(used));
  for (int64_t position = 0; position < used; ++position) {
    const int64_t row = state.admitted_list[position];
    if (state.last_seen[row] != step) evictable.push_back(row);
  }
  const int64_t count =
      std::min<int64_t>(needed, static_cast<int64_t>(evictable.size()));
  if (count <= 0) return used;
  const auto first_out = [&](int64_t a, int64_t b) {
    if (policy.lru) {
      return std::tie(state.last_seen[a], a) < std::tie(state.last_seen[b], b);
    }
    return std::tie(state.counts[a], state.last_seen[a], a) <
           std::tie(state.counts[b], state.last_seen[b], b);
  };
  // O(capacity): the keys are distinct (they end with the row), so the set
  // of the first `count` is the same whatever the selection's order.
  std::nth_element(evictable.begin(), evictable.begin() + (count - 1),
                   evictable.end(), first_out);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = evictable[static_cast<size_t>(i)];
    state.admitted[row] = false;
    state.counts[row] = 0;
    const int64_t slot = *state.evicted_count;
    if (slot < state.evicted_room) state.evicted_rows[slot] = row;
    *state.evicted_count = slot + 1;
    evicted->push_back(row);
  }
  int64_t kept = 0;
  for (int64_t position = 0; position < used; ++position) {
    const int64_t row = state.admitted_list[position];
    if (state.admitted[row]) state.admitted_list[kept++] = row;
  }
  for (int64_t position = kept; position < used; ++position) {
    state.admitted_list[position] = -1;
  }
  return kept;
}

}  // namespace

template <typename Index>
void ObserveRowAdmissionBatch(const RowAdmissionPolicy& policy,
                              const RowAdmissionState& state, const Index* ids,
                              int64_t num_ids, std::vector<int64_t>* evicted) {
  const int64_t step = ++*state.step;
  // last_seen == step marks a row already counted in this batch: the
  // duplicates of a batch cost nothing more.
  std::vector<int64_t> wanting;
  for (int64_t i = 0; i < num_ids; ++i) {
    const int64_t row = static_cast<int64_t>(ids[i]);
    if (row < 0 || !state.candidates[row] || state.last_seen[row] == step) {
      continue;
    }
    state.last_seen[row] = step;
    const int64_t count = ++state.counts[row];
    if (!state.admitted[row] && count >= policy.min_count) {
      wanting.push_back(row);
    }
  }
  if (wanting.empty()) return;
  std::sort(wanting.begin(), wanting.end());
  int64_t used = *state.admitted_count;
  if (policy.capacity >= 0) {
    const int64_t wanted = static_cast<int64_t>(wanting.size());
    if (wanted > policy.capacity - used) {
      used = Evict(policy, state, used, wanted - (policy.capacity - used), step,
                   evicted);
      const int64_t room = policy.capacity - used;
      if (wanted > room) {
        // The most often seen win, ties to the smaller row.
        const auto first_in = [&](int64_t a, int64_t b) {
          return std::make_tuple(-state.counts[a], a) <
                 std::make_tuple(-state.counts[b], b);
        };
        std::nth_element(wanting.begin(), wanting.begin() + room, wanting.end(),
                         first_in);
        wanting.resize(static_cast<size_t>(room));
        std::sort(wanting.begin(), wanting.end());
      }
    }
  }
  for (const int64_t row : wanting) {
    state.admitted[row] = true;
    if (policy.capacity >= 0) state.admitted_list[used] = row;
    ++used;
  }
  *state.admitted_count = used;
}

#define PE_INSTANTIATE_ROW_ADMISSION(Index)                                   \
  template int64_t FindBadRowId<Index>(const Index*, int64_t, int64_t, bool); \
  template void ObserveRowAdmissionBatch<Index>(                              \
      const RowAdmissionPolicy&, const RowAdmissionState&, const Index*,      \
      int64_t, std::vector<int64_t>*);
PE_INSTANTIATE_ROW_ADMISSION(int32_t)
PE_INSTANTIATE_ROW_ADMISSION(int64_t)
#undef PE_INSTANTIATE_ROW_ADMISSION

}  // namespace partial_embedding
