// The interface between the SIMT emulator's device side (simt.h, compiled
// into every emulated .cu file) and its runtime (cc/simt/*.cc).
#ifndef PE_SIMT_DEVICE_API_H_
#define PE_SIMT_DEVICE_API_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "include/cuda_runtime.h"

namespace pe_simt {
namespace detail {

// What a lane sees of its coordinates; the runtime points current_lane at
// the running lane's.
struct LaneContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
extern thread_local const LaneContext* current_lane;
[[noreturn]] void OutsideKernel(const char* what);

enum class Collective {
  kSyncThreads,
  kSyncWarp,
  kShfl,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
  kActiveMask,
};

// Waits at a collective until the runtime resolves it; returns this lane's
// result (shuffles: the bits of the value read; votes: the vote).
uint64_t Arrive(const char* file, int line, Collective kind, unsigned mask,
                uint64_t value, int arg, int width);
// Where an atomic may let another lane run first.
void AtomicPoint();
void* DynamicSharedMemory();

// The launch that PE_LAUNCH builds: converts the arguments as a call of the
// kernel would, stores them by value and queues the grid on the stream.
struct KernelLaunch {
  const char* name;
  const char* file;
  int line;
  dim3 grid;
  dim3 block;
  size_t shared_bytes;
  std::function<void()> body;  // Runs one lane.
};
cudaError_t EnqueueKernel(cudaStream_t stream, KernelLaunch launch);

}  // namespace detail
}  // namespace pe_simt

#endif  // PE_SIMT_DEVICE_API_H_
