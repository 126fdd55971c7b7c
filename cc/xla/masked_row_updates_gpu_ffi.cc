// The XLA custom-call handlers of our row updates on a GPU: the three targets
// of custom_call_targets.h, decoded as the Host handlers decode them, running
// the TF-free CUDA core (cc/core/*_gpu.h) on XLA's stream, with XLA's scratch
// memory as the workspace, in place (every result aliases its operand).
//
// One bad-id rule for every XLA path: a position whose index is outside
// [0, V), or whose slot index is negative, is skipped (BadIndices::kSkip), as
// the Host handlers and XLA's own scatters skip it. So a call never waits for
// the device: nothing comes back to report.
//
// Built two ways from this one file:
// * PE_XLA_CUDA_HANDLERS: a CUDA build of the XLA library registers them for
//   platform CUDA (the tf2xla kernels then register for XLA_GPU_JIT too);
// * PE_SIMT: built against the SIMT emulator (cc/simt), they are registered
//   for platform Host in place of the CPU handlers, so that XLA on the CPU
//   runs this code end to end (FFI decoding, aliasing, the workspace, the
//   stream) with the CUDA core emulated: build_tools/simt_xla_check.sh. There
//   the stream is the emulator's default stream, the workspace comes from
//   cudaMalloc, and each call waits for its stream before it returns (an
//   emulated stream runs only when the host waits; XLA's CPU runtime reads
//   the results as soon as the handler returns).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cc/core/gpu_common.h"
#include "cc/core/masked_scatter_sub_gpu.h"
#include "cc/core/masked_sparse_apply_gpu.h"
#include "cc/core/row_rules.h"
#include "cc/core/row_update_common.h"
#include "cc/xla/custom_call_targets.h"
#include "cc/xla/ffi_common.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

#if defined(PE_SIMT)
#include <cuda_runtime.h>  // The emulator's stand-in (cc/simt/include).

#include <mutex>
#include <vector>
#endif

namespace partial_embedding {
namespace {

namespace ffi = ::xla::ffi;
using xla_ffi::CheckScatterOperands;
using xla_ffi::DecodeRuleCall;
using xla_ffi::DispatchTypes;
using xla_ffi::GeometryOf;
using xla_ffi::RuleCall;
using xla_ffi::TableGeometry;

// The workspace's alignment: what the cores lay their buffers out for.
constexpr size_t kWorkspaceAlignment = 256;

#if defined(PE_SIMT)
// Device memory for one call, freed when the call has waited for its stream.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    for (void* block : blocks_) cudaFree(block);
  }
  std::optional<void*> Allocate(size_t bytes, size_t /*alignment*/) {
    void* block = nullptr;
    if (cudaMalloc(&block, bytes) != cudaSuccess) return std::nullopt;
    blocks_.push_back(block);
    return block;
  }

 private:
  std::vector<void*> blocks_;
};
#else
using Scratch = ffi::ScratchAllocator;
#endif

ffi::Error CudaError(int error, const char* what) {
  return ffi::Error::Internal(std::string(what) + ": " + GpuErrorString(error));
}

// The workspace a core asks for, from `scratch`; null for zero bytes.
ffi::Error TakeWorkspace(Scratch& scratch, size_t bytes, void** workspace) {
  *workspace = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  const std::optional<void*> block =
      scratch.Allocate(bytes, kWorkspaceAlignment);
  if (!block.has_value()) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      "no device memory for the workspace (" +
                          std::to_string(bytes) + " bytes)");
  }
  *workspace = *block;
  return ffi::Error::Success();
}

// A result aliased to its operand arrives in the operand's buffer; copy on
// the stream only if XLA ever gives it a buffer of its own.
ffi::Error BindOnDevice(const ffi::AnyBuffer& operand,
                        ffi::Result<ffi::AnyBuffer>& result, GpuStream stream) {
  if (result->untyped_data() == operand.untyped_data()) {
    return ffi::Error::Success();
  }
  const int error =
      GpuCopyDeviceToDevice(result->untyped_data(), operand.untyped_data(),
                            static_cast<int64_t>(operand.size_bytes()), stream);
  return error == 0 ? ffi::Error::Success()
                    : CudaError(error, "copying a table to its result");
}

// --- MaskedScatterSub ------------------------------------------------------

template <typename T, typename Index>
ffi::Error ScatterSubOnStream(GpuStream stream, Scratch& scratch, T* var,
                              const TableGeometry& geometry,
                              const ffi::AnyBuffer& indices,
                              const ffi::AnyBuffer& updates,
                              const bool* row_mask) {
  const auto num_indices = static_cast<int64_t>(indices.element_count());
  if (num_indices == 0 || geometry.row_size == 0) return ffi::Error::Success();
  // Deterministic: no float atomics, so a compiled step gives the same bits
  // on every run, as the CPU custom call does.
  constexpr bool kDeterministic = true;
  size_t bytes = 0;
  int error = MaskedScatterSubGpuWorkspaceBytes<T>(
      geometry.num_rows, geometry.row_size, num_indices, kDeterministic, stream,
      &bytes);
  if (error != 0) return CudaError(error, "sizing the workspace");
  void* workspace = nullptr;
  ffi::Error taken = TakeWorkspace(scratch, bytes, &workspace);
  if (taken.failure()) return taken;
  error = MaskedScatterSubGpuAsync<T, Index>(
      var, geometry.num_rows, geometry.row_size,
      static_cast<const Index*>(indices.untyped_data()), num_indices,
      static_cast<const T*>(updates.untyped_data()), row_mask, kDeterministic,
      workspace, bytes, stream, BadIndices::kSkip);
  return error == 0 ? ffi::Error::Success()
                    : CudaError(error, "MaskedScatterSub's CUDA kernels");
}

ffi::Error MaskedScatterSubOnStream(GpuStream stream, Scratch& scratch,
                                    ffi::AnyBuffer table,
                                    ffi::AnyBuffer indices,
                                    ffi::AnyBuffer updates,
                                    ffi::AnyBuffer row_mask,
                                    ffi::Result<ffi::AnyBuffer> out) {
  ffi::Error checked = CheckScatterOperands(table, updates, row_mask);
  if (checked.failure()) return checked;
  ffi::Error bound = BindOnDevice(table, out, stream);
  if (bound.failure()) return bound;
  const TableGeometry geometry = GeometryOf(table);
  const auto* mask = static_cast<const bool*>(row_mask.untyped_data());
  void* var = out->untyped_data();
  return DispatchTypes(table.element_type(), indices.element_type(), "table",
                       [&](auto value, auto index) {
                         using T = decltype(value);
                         return ScatterSubOnStream<T, decltype(index)>(
                             stream, scratch, static_cast<T*>(var), geometry,
                             indices, updates, mask);
                       });
}

// --- MaskedSparseApplyRule (full-size and compact slots) -------------------

template <typename T, typename Index>
ffi::Error RuleOnStream(GpuStream stream, Scratch& scratch,
                        const RuleCall& call) {
  if (call.num_indices == 0 || call.geometry.row_size == 0) {
    return ffi::Error::Success();
  }
  RuleTables<T> tables;
  tables.var = static_cast<T*>(call.var);
  for (int i = 0; i < kMaxSlots; ++i) {
    tables.slots[i] = static_cast<T*>(call.slots[i]);
  }
  tables.num_rows = call.geometry.num_rows;
  tables.row_size = call.geometry.row_size;
  const bool compact = call.slot_indices != nullptr;
  SlotMap<Index> slot_map;
  if (compact) {
    slot_map.slot_indices = static_cast<const Index*>(call.slot_indices);
    slot_map.num_slot_rows = call.num_slot_rows;
  }
  size_t bytes = 0;
  int error = MaskedSparseApplyRuleGpuWorkspaceBytes<T>(
      tables.num_rows, tables.row_size, call.num_indices,
      compact ? call.num_slot_rows : 0, stream, &bytes);
  if (error != 0) return CudaError(error, "sizing the workspace");
  void* workspace = nullptr;
  ffi::Error taken = TakeWorkspace(scratch, bytes, &workspace);
  if (taken.failure()) return taken;
  // The hyperparameters are an operand: already on the device.
  error = MaskedSparseApplyRuleGpuAsync<T, Index>(
      call.rule, tables, static_cast<const Index*>(call.indices),
      call.num_indices, slot_map, static_cast<const T*>(call.grad),
      call.row_mask, static_cast<const T*>(call.hyperparameters), workspace,
      bytes, stream, BadIndices::kSkip);
  return error == 0 ? ffi::Error::Success()
                    : CudaError(error, "the rule's CUDA kernels");
}

ffi::Error RuleCallOnStream(GpuStream stream, Scratch& scratch,
                            std::string_view rule_name, ffi::RemainingArgs args,
                            ffi::RemainingRets rets, bool with_slot_indices) {
  RuleCall call;
  ffi::DataType dtype = ffi::DataType::INVALID;
  std::optional<ffi::AnyBuffer> indices;
  ffi::Error decoded = DecodeRuleCall(
      rule_name, args, rets, with_slot_indices,
      [stream](const ffi::AnyBuffer& operand,
               ffi::Result<ffi::AnyBuffer>& result) {
        return BindOnDevice(operand, result, stream);
      },
      &call, &dtype, &indices);
  if (decoded.failure()) return decoded;
  return DispatchTypes(dtype, indices->element_type(), "var",
                       [&](auto value, auto index) {
                         return RuleOnStream<decltype(value), decltype(index)>(
                             stream, scratch, call);
                       });
}

// --- The handlers, per platform ----------------------------------------------

#if defined(PE_SIMT)

// One emulated call at a time (the emulator runs one device), on its default
// stream, waited for before returning.
template <typename Run>
ffi::Error OnEmulatedStream(const Run& run) {
  static std::mutex emulator;
  std::lock_guard<std::mutex> lock(emulator);
  GpuStream stream = nullptr;
  ffi::Error error = ffi::Error::Success();
  {
    Scratch scratch;
    error = run(stream, scratch);
    const cudaError_t waited = cudaStreamSynchronize(nullptr);
    if (error.success() && waited != cudaSuccess) {
      error = CudaError(waited, "the emulated stream");
    }
  }
  return error;
}

ffi::Error MaskedScatterSubHandler(ffi::AnyBuffer table, ffi::AnyBuffer indices,
                                   ffi::AnyBuffer updates,
                                   ffi::AnyBuffer row_mask,
                                   ffi::Result<ffi::AnyBuffer> out) {
  return OnEmulatedStream([&](GpuStream stream, Scratch& scratch) {
    return MaskedScatterSubOnStream(stream, scratch, table, indices, updates,
                                    row_mask, out);
  });
}

ffi::Error FullSlotsHandler(std::string_view rule, ffi::RemainingArgs args,
                            ffi::RemainingRets rets) {
  return OnEmulatedStream([&](GpuStream stream, Scratch& scratch) {
    return RuleCallOnStream(stream, scratch, rule, args, rets, false);
  });
}

ffi::Error CompactSlotsHandler(std::string_view rule, ffi::RemainingArgs args,
                               ffi::RemainingRets rets) {
  return OnEmulatedStream([&](GpuStream stream, Scratch& scratch) {
    return RuleCallOnStream(stream, scratch, rule, args, rets, true);
  });
}

#define PE_GPU_HANDLER_CONTEXT ffi::Ffi::Bind()
constexpr const char* kGpuHandlerPlatform = kHostPlatform;

#else  // CUDA

ffi::Error MaskedScatterSubHandler(GpuStream stream, Scratch scratch,
                                   ffi::AnyBuffer table, ffi::AnyBuffer indices,
                                   ffi::AnyBuffer updates,
                                   ffi::AnyBuffer row_mask,
                                   ffi::Result<ffi::AnyBuffer> out) {
  return MaskedScatterSubOnStream(stream, scratch, table, indices, updates,
                                  row_mask, out);
}

ffi::Error FullSlotsHandler(GpuStream stream, Scratch scratch,
                            std::string_view rule, ffi::RemainingArgs args,
                            ffi::RemainingRets rets) {
  return RuleCallOnStream(stream, scratch, rule, args, rets, false);
}

ffi::Error CompactSlotsHandler(GpuStream stream, Scratch scratch,
                               std::string_view rule, ffi::RemainingArgs args,
                               ffi::RemainingRets rets) {
  return RuleCallOnStream(stream, scratch, rule, args, rets, true);
}

// XLA's stream and its scratch allocator.
#define PE_GPU_HANDLER_CONTEXT               \
  ffi::Ffi::Bind()                           \
      .Ctx<ffi::PlatformStream<GpuStream>>() \
      .Ctx<ffi::ScratchAllocator>()
constexpr const char* kGpuHandlerPlatform = kCudaPlatform;

#endif

}  // namespace

XLA_FFI_DEFINE_HANDLER(kMaskedScatterSubGpuHandler, MaskedScatterSubHandler,
                       PE_GPU_HANDLER_CONTEXT
                           .Arg<ffi::AnyBuffer>()    // table
                           .Arg<ffi::AnyBuffer>()    // indices
                           .Arg<ffi::AnyBuffer>()    // updates
                           .Arg<ffi::AnyBuffer>()    // row_mask
                           .Ret<ffi::AnyBuffer>());  // table, aliased
XLA_FFI_DEFINE_HANDLER(kFullSlotsGpuHandler, FullSlotsHandler,
                       PE_GPU_HANDLER_CONTEXT
                           .Attr<std::string_view>(kRuleAttribute)
                           .RemainingArgs()
                           .RemainingRets());
XLA_FFI_DEFINE_HANDLER(kCompactSlotsGpuHandler, CompactSlotsHandler,
                       PE_GPU_HANDLER_CONTEXT
                           .Attr<std::string_view>(kRuleAttribute)
                           .RemainingArgs()
                           .RemainingRets());

XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedScatterSubTarget,
                         kGpuHandlerPlatform, kMaskedScatterSubGpuHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyRuleTarget,
                         kGpuHandlerPlatform, kFullSlotsGpuHandler);
XLA_FFI_REGISTER_HANDLER(XLA_FFI_GetApi(), kMaskedSparseApplyRuleSlotsTarget,
                         kGpuHandlerPlatform, kCompactSlotsGpuHandler);

#undef PE_GPU_HANDLER_CONTEXT

}  // namespace partial_embedding
