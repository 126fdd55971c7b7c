// What the SIMT emulator's runtime files share (private to cc/simt).
#ifndef PE_SIMT_RUNTIME_INTERNAL_H_
#define PE_SIMT_RUNTIME_INTERNAL_H_

#include <cstdint>
#include <mutex>
#include <string>

#include "device_api.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PE_SIMT_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(PE_SIMT_ASAN)
#define PE_SIMT_ASAN 1
#endif

namespace pe_simt {
namespace detail {

// Held by every runtime call: the emulated device is one.
std::recursive_mutex& RuntimeMutex();
// Prints "simt: <message> (PE_SIMT_SEED=<seed>)", counts the fault, marks
// the running work failed (the device error becomes sticky) or aborts under
// PE_SIMT_ABORT=1.
void RaiseFault(const std::string& message);
// The seeded generator's next draw (the mutex is held).
uint64_t NextRandom();
// Counts a launch that runs, by the kernel's base name.
void CountLaunch(const char* kernel_name);
// Runs every block of a launch (scheduler.cc); false after a fault.
bool RunKernel(const KernelLaunch& launch);
// What is running, for a sanitizer's report: "" on the host.
std::string RunningLaneDescription();
// Before a launch's blocks run, on the thread that runs them (fault_signal.cc):
// installs, once, the SIGSEGV and SIGBUS handlers that report an invalid
// memory access in a lane as one simt: line (`running_block`, then the thread,
// the address and the seed) before deferring to the handler that was there,
// and gives this thread an alternate signal stack (a fiber's may be the one
// that faulted). Not under ASan: its report and its death callback's line
// name the lane.
void ArmFaultSignals(const char* running_block);

}  // namespace detail
}  // namespace pe_simt

#endif  // PE_SIMT_RUNTIME_INTERNAL_H_
