// The lookup of a quantized partial table, TF-free: each id's row is its
// float store row when it has one, else its int8 row divided by its scale
// (Keras' dequantization: float(int8) / scale, one IEEE division per value).
#ifndef PARTIAL_EMBEDDING_CC_CORE_QUANTIZED_LOOKUP_H_
#define PARTIAL_EMBEDDING_CC_CORE_QUANTIZED_LOOKUP_H_

#include <cstdint>

#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"

namespace partial_embedding {

// The inputs of one lookup, as raw pointers.
//   codes:       int8 [num_rows, width], the quantized table.
//   scales:      float [num_rows], one per row.
//   store:       float [store_rows, width], the float rows; the last one is
//                the sentinel no id has.
//   sorted_ids:  int32 [store_rows], the table rows that have a store row,
//                ascending, padded with num_rows.
//   store_index: int32 [store_rows], the store row of each sorted id.
template <typename Index>
struct QuantizedLookupInputs {
  const int8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t num_rows = 0;
  int64_t width = 0;
  const float* store = nullptr;
  int64_t store_rows = 0;
  const int32_t* sorted_ids = nullptr;
  const int32_t* store_index = nullptr;
  const Index* ids = nullptr;
  int64_t num_ids = 0;
};

// The store row of `id`, found among the sorted ids by a branchless lower
// bound (the sorted ids are a few thousand int32 values, so the search is
// compare-bound, and a branch per level mispredicts about half the time); the
// sentinel (store_rows - 1) for an id without one. The CPU and CUDA cores
// both use it.
template <typename Index>
PE_HOST_DEVICE int32_t StoreRowOf(const QuantizedLookupInputs<Index>& in,
                                  int64_t id) {
  const int32_t* base = in.sorted_ids;
  int64_t length = in.store_rows;
  while (length > 1) {
    const int64_t half = length / 2;
    base = (base[half - 1] < id) ? base + half : base;
    length -= half;
  }
  if (*base != id) {
    return static_cast<int32_t>(in.store_rows - 1);
  }
  return in.store_index[base - in.sorted_ids];
}

// Writes out[i, :] (float [num_ids, width]) and row_of[i], the store row
// id i read (store_rows - 1, the sentinel, for an id without one). Every id
// is checked first: returns -1 when all are in [0, num_rows), else the
// position of the first that is not, having written nothing. A store index
// outside [0, store_rows) is reported as position num_ids (a corrupt store).
template <typename Index>
int64_t QuantizedLookupCpu(const QuantizedLookupInputs<Index>& in, float* out,
                           int32_t* row_of, const CpuParallelism& parallelism);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_QUANTIZED_LOOKUP_H_
