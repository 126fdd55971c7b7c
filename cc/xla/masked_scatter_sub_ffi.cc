// The XLA CPU custom-call handler behind PartialEmbedding>MaskedScatterSub
// under XLA: decodes the call's buffers through XLA's typed FFI and hands raw
// pointers to the same TF-free core the TensorFlow kernel calls.
//
// Only the header-only FFI API (xla/ffi/api/ffi.h) is used here; the one
// symbol it needs at run time, XLA_FFI_GetApi, is exported by
// libtensorflow_framework.so.2, whose handler registry the XLA CPU runtime
// in libtensorflow_cc.so.2 searches.
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/masked_scatter_sub.h"
#include "cc/core/parallel_for.h"
#include "cc/core/row_update_common.h"
#include "cc/xla/custom_call_targets.h"
#include "cc/xla/ffi_common.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace partial_embedding {
namespace {

namespace ffi = ::xla::ffi;
using xla_ffi::CheckScatterOperands;
using xla_ffi::CopyIfNotAliased;
using xla_ffi::DispatchTypes;
using xla_ffi::GeometryOf;
using xla_ffi::PoolParallelism;
using xla_ffi::TableGeometry;

// The update, with every position whose index is outside [0, V) skipped (as
// XLA's own scatters skip them: XLA has no run-time errors). The core refuses
// such a call before its first write; it is then run again over the valid
// positions alone, copied (only a call with a bad index pays for the copy).
template <typename T, typename Index>
void RunCore(ffi::AnyBuffer table, ffi::AnyBuffer indices,
             ffi::AnyBuffer updates, ffi::AnyBuffer row_mask,
             ffi::Result<ffi::AnyBuffer> out,
             const CpuParallelism& parallelism) {
  const TableGeometry geometry = GeometryOf(table);
  CopyIfNotAliased(table, out);
  auto* var = static_cast<T*>(out->untyped_data());
  const auto* index_data = static_cast<const Index*>(indices.untyped_data());
  const auto* update_data = static_cast<const T*>(updates.untyped_data());
  const auto* mask = static_cast<const bool*>(row_mask.untyped_data());
  const auto num_indices = static_cast<int64_t>(indices.element_count());
  if (MaskedScatterSubCpu(var, geometry.num_rows, geometry.row_size, index_data,
                          num_indices, update_data, mask, parallelism) < 0) {
    return;
  }
  std::vector<Index> kept_indices;
  std::vector<T> kept_updates;
  for (int64_t i = 0; i < num_indices; ++i) {
    const auto row = static_cast<int64_t>(index_data[i]);
    if (row < 0 || row >= geometry.num_rows) continue;
    kept_indices.push_back(index_data[i]);
    kept_updates.insert(kept_updates.end(), update_data + i * geometry.row_size,
                        update_data + (i + 1) * geometry.row_size);
  }
  MaskedScatterSubCpu(var, geometry.num_rows, geometry.row_size,
                      kept_indices.data(),
                      static_cast<int64_t>(kept_indices.size()),
                      kept_updates.data(), mask, parallelism);
}

ffi::Error MaskedScatterSubHost(ffi::ThreadPool pool, ffi::AnyBuffer table,
                                ffi::AnyBuffer indices, ffi::AnyBuffer updates,
                                ffi::AnyBuffer row_mask,
                                ffi::Result<ffi::AnyBuffer> out) {
  ffi::Error checked = CheckScatterOperands(table, updates, row_mask);
  if (checked.failure()) return checked;
  const CpuParallelism parallelism = PoolParallelism(pool);
  return DispatchTypes(table.element_type(), indices.element_type(), "table",
                       [&](auto value, auto index) {
                         RunCore<decltype(value), decltype(index)>(
                             table, indices, updates, row_mask, out,
                             parallelism);
                         return ffi::Error::Success();
                       });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kMaskedScatterSubHostHandler, MaskedScatterSubHost,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()   // XLA's intra-op pool
                           .Arg<ffi::AnyBuffer>()    // table
                           .Arg<ffi::AnyBuffer>()    // indices
                           .Arg<ffi::AnyBuffer>()    // updates
                           .Arg<ffi::AnyBuffer>()    // row_mask
                           .Ret<ffi::AnyBuffer>());  // table, aliased

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedScatterSubTarget,
                         kHostPlatform, kMaskedScatterSubHostHandler);

}  // namespace partial_embedding
