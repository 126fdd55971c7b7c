// CUDA implementation of the TF-free quantized lookup (quantized_lookup.h):
// the same rows, the same store rows, the same errors as the CPU core, over
// device pointers. A first kernel checks every id and every store index; the
// second, one warp per id, finds its store row by binary search and copies
// that float row or dequantizes its int8 row (float(int8) / scale, one IEEE
// division per value), unless the first found an error: then nothing is
// written. Only the batch's rows are read: the [V, D] table stays where it is.
#ifndef PARTIAL_EMBEDDING_CC_CORE_QUANTIZED_LOOKUP_GPU_H_
#define PARTIAL_EMBEDDING_CC_CORE_QUANTIZED_LOOKUP_GPU_H_

#include <cstddef>
#include <cstdint>

#include "cc/core/gpu_common.h"
#include "cc/core/quantized_lookup.h"

namespace partial_embedding {

// Bytes of device scratch memory one lookup needs (its error words).
constexpr size_t kQuantizedLookupGpuWorkspaceBytes = 256;

// Enqueues the lookup on `stream` (every pointer of `in`, `out` and `row_of`
// on the device) and returns without waiting; whether an id was bad is left
// in `workspace` (ReadGpuQuantizedLookupError).
template <typename Index>
int QuantizedLookupGpuAsync(const QuantizedLookupInputs<Index>& in, float* out,
                            int32_t* row_of, void* workspace, GpuStream stream);

// Waits for `stream`, then sets *bad_position as QuantizedLookupCpu returns
// it (-1: every id in range; i < num_ids: ids[i] is the first out of range;
// num_ids: a store index outside [0, store_rows)) and *bad_value to ids[i].
template <typename Index>
int ReadGpuQuantizedLookupError(const void* workspace, const Index* ids,
                                int64_t num_ids, GpuStream stream,
                                int64_t* bad_position, int64_t* bad_value);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_QUANTIZED_LOOKUP_GPU_H_
