// The device functor behind the QuantizedLookup OpKernel: specialized for the
// CPU in quantized_lookup_kernels.cc and for the GPU in
// quantized_lookup_kernels.cu.cc.
#ifndef PARTIAL_EMBEDDING_CC_KERNELS_QUANTIZED_LOOKUP_KERNELS_H_
#define PARTIAL_EMBEDDING_CC_KERNELS_QUANTIZED_LOOKUP_KERNELS_H_

#include <cstdint>

#include "cc/core/quantized_lookup.h"
#include "cc/kernels/in_place_update.h"

namespace partial_embedding {

template <typename Device, typename Index>
struct QuantizedLookupFunctor {
  // Writes rows and store_rows unless an input is bad: then sets
  // *bad_position as QuantizedLookupCpu returns it (the first bad id's
  // position, or in.num_ids for a corrupt store index; -1 when all is well)
  // and *bad_value to that id, having written nothing. A non-OK status is a
  // device failure.
  absl::Status operator()(OpKernelContext* ctx,
                          const QuantizedLookupInputs<Index>& in, float* rows,
                          int32_t* store_rows, int64_t* bad_position,
                          int64_t* bad_value) const;
};

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_KERNELS_QUANTIZED_LOOKUP_KERNELS_H_
