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
using xla_ffi::CopyIfNotAliased;
using xla_ffi::GeometryOf;
using xla_ffi::IndexPosition;
using xla_ffi::PoolParallelism;
using xla_ffi::TableGeometry;

template <typename T, typename Index>
int64_t RunCore(ffi::AnyBuffer table, ffi::AnyBuffer indices,
                ffi::AnyBuffer updates, ffi::AnyBuffer row_mask,
                ffi::Result<ffi::AnyBuffer> out,
                const CpuParallelism& parallelism, int64_t* bad_value) {
  const TableGeometry geometry = GeometryOf(table);
  CopyIfNotAliased(table, out);
  const auto* index_data = static_cast<const Index*>(indices.untyped_data());
  const int64_t bad_position = MaskedScatterSubCpu(
      static_cast<T*>(out->untyped_data()), geometry.num_rows,
      geometry.row_size, index_data,
      static_cast<int64_t>(indices.element_count()),
      static_cast<const T*>(updates.untyped_data()),
      static_cast<const bool*>(row_mask.untyped_data()), parallelism);
  *bad_value =
      bad_position >= 0 ? static_cast<int64_t>(index_data[bad_position]) : 0;
  return bad_position;
}

template <typename T>
int64_t RunForIndexType(ffi::AnyBuffer table, ffi::AnyBuffer indices,
                        ffi::AnyBuffer updates, ffi::AnyBuffer row_mask,
                        ffi::Result<ffi::AnyBuffer> out,
                        const CpuParallelism& parallelism, int64_t* bad_value) {
  if (indices.element_type() == ffi::DataType::S64) {
    return RunCore<T, int64_t>(table, indices, updates, row_mask, out,
                               parallelism, bad_value);
  }
  return RunCore<T, int32_t>(table, indices, updates, row_mask, out,
                             parallelism, bad_value);
}

ffi::Error MaskedScatterSubHost(ffi::ThreadPool pool, ffi::AnyBuffer table,
                                ffi::AnyBuffer indices, ffi::AnyBuffer updates,
                                ffi::AnyBuffer row_mask,
                                ffi::Result<ffi::AnyBuffer> out) {
  // The XLA kernel has checked shapes and dtypes while compiling; these
  // checks guard the raw-pointer casts below against a mismatched caller.
  const ffi::DataType index_type = indices.element_type();
  if (index_type != ffi::DataType::S32 && index_type != ffi::DataType::S64) {
    return ffi::Error::InvalidArgument("indices: must be int32 or int64");
  }
  if (row_mask.element_type() != ffi::DataType::PRED ||
      updates.element_type() != table.element_type()) {
    return ffi::Error::InvalidArgument(
        "row_mask must be bool and updates of the table's dtype");
  }
  const CpuParallelism parallelism = PoolParallelism(pool);
  int64_t bad_value = 0;
  int64_t bad_position = -1;
  switch (table.element_type()) {
    case ffi::DataType::F32:
      bad_position = RunForIndexType<float>(table, indices, updates, row_mask,
                                            out, parallelism, &bad_value);
      break;
    case ffi::DataType::F64:
      bad_position = RunForIndexType<double>(table, indices, updates, row_mask,
                                             out, parallelism, &bad_value);
      break;
    case ffi::DataType::F16:
      bad_position = RunForIndexType<Float16>(table, indices, updates, row_mask,
                                              out, parallelism, &bad_value);
      break;
    case ffi::DataType::BF16:
      bad_position = RunForIndexType<BFloat16>(
          table, indices, updates, row_mask, out, parallelism, &bad_value);
      break;
    default:
      return ffi::Error::InvalidArgument(
          "table: dtype must be float16, bfloat16, float32 or float64");
  }
  if (bad_position >= 0) {
    return ffi::Error::InvalidArgument(
        "indices" + IndexPosition(indices, bad_position) + " = " +
        std::to_string(bad_value) + " is not in [0, " +
        std::to_string(GeometryOf(table).num_rows) + "); nothing was written");
  }
  return ffi::Error::Success();
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
