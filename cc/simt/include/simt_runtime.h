// The SIMT emulator's own host API (cc/simt/README.md): the scheduling seed,
// launch and fault counts, and the reports of test programs. Plain C++: host
// code that is not a .cu file may include it.
#ifndef PE_SIMT_INCLUDE_SIMT_RUNTIME_H_
#define PE_SIMT_INCLUDE_SIMT_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda_runtime.h"

namespace pe_simt {

// The seed that draws block orders, lane orders, atomic yields and CUB's
// buffer choices: PE_SIMT_SEED (decimal), 1 when unset.
uint64_t Seed();
// Restarts the draws from `seed`, as a fresh process with PE_SIMT_SEED=seed.
void SetSeed(uint64_t seed);
// How many launches of each kernel ran, by base name (up to the first '<').
std::vector<std::pair<std::string, int64_t>> LaunchCounts();
void ResetLaunchCounts();
// How many faults (broken collective rules, deadlocks) were reported.
int64_t FaultCount();
// Prints "simt: <what> (PE_SIMT_SEED=<seed>)" to stderr: for a test program
// whose own check found a wrong result.
void ReportFailure(const std::string& what);
// Clears a sticky fault and drops all queued work (cudaDeviceReset does the
// same): lets a test harness go on after a reported fault.
void ResetDevice();

namespace detail {

// Queues host work on `stream`, to run at its next synchronisation point, as
// a kernel would: the CUB stand-ins' way in. `name`, `file` and `line` name
// the operation in reports.
cudaError_t Enqueue(cudaStream_t stream, const char* name, const char* file,
                    int line, std::function<void()> work);
// Whether [pointer, pointer + bytes) lies in one device allocation; if not,
// reports a fault naming `what` (from inside queued work only).
bool CheckDeviceRange(const void* pointer, size_t bytes, const char* what);
// Fills `bytes` bytes with the garbage pattern.
void Scribble(void* pointer, size_t bytes);
// A draw from the seeded generator.
uint64_t RandomBits();

}  // namespace detail
}  // namespace pe_simt

#endif  // PE_SIMT_INCLUDE_SIMT_RUNTIME_H_
