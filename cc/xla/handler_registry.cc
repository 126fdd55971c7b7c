// What XLA's FFI registry holds of our custom calls, for Python
// (ops/xla_custom_call.py reads it through ctypes): whether a target has a
// handler for a platform, and which code backs this library's handlers.
//
// FindHandler is XLA's own lookup (libtensorflow_framework.so.2), the one
// XLA's runtimes call when they run a custom call: an answer here is what
// XLA will find, not what this library meant to register.
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "xla/ffi/api/c_api.h"

// xla/ffi/ffi_api.h declares these, but includes MLIR headers the TensorFlow
// wheel does not ship: the two declarations are repeated here, word for word
// (the same type in the same namespace; checked against TF 2.21's header).
namespace xla::ffi {
struct HandlerRegistration {
  XLA_FFI_Metadata metadata;
  XLA_FFI_Handler_Bundle bundle;
};
absl::StatusOr<HandlerRegistration> FindHandler(absl::string_view name,
                                                absl::string_view platform);
}  // namespace xla::ffi

#define PE_XLA_EXPORT extern "C" __attribute__((visibility("default")))

// 1 where `target` has a typed-FFI handler for `platform` ("Host", "CUDA").
PE_XLA_EXPORT int PartialEmbeddingXlaHandlerRegistered(const char* target,
                                                       const char* platform) {
  if (target == nullptr || platform == nullptr) return 0;
  return ::xla::ffi::FindHandler(target, platform).ok() ? 1 : 0;
}

// What runs behind the Host handlers of this build: "cpu" (the CPU cores) or
// "simt" (the CUDA handlers' code on the SIMT emulator); "+cuda" where the
// CUDA handlers are built too.
PE_XLA_EXPORT const char* PartialEmbeddingXlaHandlerBuild() {
#if defined(PE_SIMT)
  return "simt";
#elif defined(PE_XLA_CUDA_HANDLERS)
  return "cpu+cuda";
#else
  return "cpu";
#endif
}
