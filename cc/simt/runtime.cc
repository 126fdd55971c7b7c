// The SIMT emulator's CUDA runtime: errors, the seed, device memory, streams
// and events. A stream's work is queued and runs only when the host waits for
// it (a synchronize, a synchronous copy or memset, cudaFree, destroying the
// stream), so a missing synchronisation reads stale results here too.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "include/simt_runtime.h"
#include "runtime_internal.h"

#if defined(PE_SIMT_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

struct CUstream_st {
  bool blocking = true;  // Ordered with the legacy default stream.
  const char* name = "a created stream";
  struct Op {
    uint64_t sequence;
    std::string name;  // Kernel or call, and its site.
    std::function<void()> work;
  };
  std::deque<Op> queue;
};

struct CUevent_st {
  CUstream_st* stream = nullptr;
  uint64_t sequence = 0;  // Of its record operation.
  bool recorded = false;
  bool done = false;
  std::chrono::steady_clock::time_point when;
};

namespace pe_simt {
namespace detail {
namespace {

constexpr unsigned char kGarbage = 0xa5;

enum class MemoryKind { kDevice, kPinned };
struct Allocation {
  size_t bytes;
  MemoryKind kind;
};

struct Runtime {
  std::recursive_mutex mutex;
  uint64_t seed = 1;
  uint64_t random_state = 0;
  bool abort_on_fault = false;
  bool fault_raised = false;  // By the work that runs now.
  cudaError_t sticky = cudaSuccess;
  cudaError_t last = cudaSuccess;
  int64_t faults = 0;
  uint64_t next_sequence = 1;
  std::map<std::string, int64_t> launches;
  std::map<uintptr_t, Allocation> allocations;
  CUstream_st legacy, per_thread;
  std::set<CUstream_st*> streams;  // Created ones.
  std::set<CUevent_st*> events;
};

void ReportPendingWorkAtExit();

Runtime& State() {
  static Runtime* runtime = [] {
    auto* state = new Runtime;  // Never destroyed: used at exit.
    if (const char* seed = std::getenv("PE_SIMT_SEED")) {
      state->seed = std::strtoull(seed, nullptr, 10);
    }
    state->random_state = state->seed;
    const char* abort_env = std::getenv("PE_SIMT_ABORT");
    state->abort_on_fault =
        abort_env != nullptr && std::strcmp(abort_env, "1") == 0;
    state->legacy.name = "the legacy default stream";
    state->per_thread.name = "the per-thread default stream";
    std::atexit(&ReportPendingWorkAtExit);
#if defined(PE_SIMT_ASAN)
    __sanitizer_set_death_callback([] {
      const std::string lane = RunningLaneDescription();
      if (!lane.empty()) ReportFailure("sanitizer report in " + lane);
    });
#endif
    return state;
  }();
  return *runtime;
}

using Lock = std::lock_guard<std::recursive_mutex>;

// Every call that fails records its error for cudaGetLastError.
cudaError_t Result(cudaError_t error) {
  if (error != cudaSuccess) State().last = error;
  return error;
}

CUstream_st* FindStream(cudaStream_t stream) {
  Runtime& state = State();
  if (stream == nullptr || stream == cudaStreamLegacy) return &state.legacy;
  if (stream == cudaStreamPerThread) return &state.per_thread;
  return state.streams.count(stream) != 0 ? stream : nullptr;
}

void DropAllWork() {
  Runtime& state = State();
  state.legacy.queue.clear();
  state.per_thread.queue.clear();
  for (CUstream_st* stream : state.streams) stream->queue.clear();
}

// Runs `stream`'s work up to `sequence`, with the legacy stream's ordering:
// its work waits for earlier work of every blocking stream, and theirs for
// its.
void RunStream(CUstream_st* stream, uint64_t sequence) {
  Runtime& state = State();
  while (state.sticky == cudaSuccess && !stream->queue.empty() &&
         stream->queue.front().sequence <= sequence) {
    CUstream_st::Op op = std::move(stream->queue.front());
    stream->queue.pop_front();
    if (stream == &state.legacy) {
      RunStream(&state.per_thread, op.sequence);
      for (CUstream_st* other : state.streams) {
        if (other->blocking) RunStream(other, op.sequence);
      }
    } else if (stream->blocking) {
      RunStream(&state.legacy, op.sequence);
    }
    if (state.sticky != cudaSuccess) break;
    state.fault_raised = false;
    op.work();
    if (state.fault_raised) {
      state.sticky = cudaErrorLaunchFailure;  // As CUDA's: for good.
      DropAllWork();
    }
  }
}

cudaError_t SynchronizeAll() {
  Runtime& state = State();
  RunStream(&state.legacy, UINT64_MAX);
  RunStream(&state.per_thread, UINT64_MAX);
  for (CUstream_st* stream : state.streams) RunStream(stream, UINT64_MAX);
  return Result(state.sticky);
}

cudaError_t Push(cudaStream_t handle, std::string name,
                 std::function<void()> work, uint64_t* sequence = nullptr) {
  Runtime& state = State();
  if (state.sticky != cudaSuccess) return Result(state.sticky);
  CUstream_st* stream = FindStream(handle);
  if (stream == nullptr) return Result(cudaErrorInvalidResourceHandle);
  const uint64_t number = state.next_sequence++;
  if (sequence != nullptr) *sequence = number;
  stream->queue.push_back(
      CUstream_st::Op{number, std::move(name), std::move(work)});
  return cudaSuccess;
}

const Allocation* FindAllocation(const void* pointer, uintptr_t* start) {
  Runtime& state = State();
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  auto found = state.allocations.upper_bound(address);
  if (found == state.allocations.begin()) return nullptr;
  --found;
  if (address >= found->first + std::max<size_t>(found->second.bytes, 1)) {
    return nullptr;
  }
  *start = found->first;
  return &found->second;
}

bool InDevice(const void* pointer, size_t bytes) {
  uintptr_t start = 0;
  const Allocation* allocation = FindAllocation(pointer, &start);
  return allocation != nullptr && allocation->kind == MemoryKind::kDevice &&
         reinterpret_cast<uintptr_t>(pointer) + bytes <=
             start + allocation->bytes;
}

bool IsPinned(const void* pointer) {
  uintptr_t start = 0;
  const Allocation* allocation = FindAllocation(pointer, &start);
  return allocation != nullptr && allocation->kind == MemoryKind::kPinned;
}

// A host call given memory that is not the device memory it needs: an error
// return, and a line that says why.
cudaError_t NotDeviceMemory(const char* call, const void* pointer,
                            size_t bytes) {
  char text[160];
  std::snprintf(text, sizeof(text),
                "%s: [%p, +%zu) is not in one device allocation", call, pointer,
                bytes);
  ReportFailure(text);
  return Result(cudaErrorInvalidValue);
}

std::string Site(const char* what, const char* file, int line) {
  return std::string(what) + " (at " + file + ":" + std::to_string(line) + ")";
}

void ReportPendingWorkAtExit() {
  Runtime& state = State();
  std::vector<CUstream_st*> streams = {&state.legacy, &state.per_thread};
  streams.insert(streams.end(), state.streams.begin(), state.streams.end());
  for (const CUstream_st* stream : streams) {
    if (stream->queue.empty()) continue;
    ReportFailure(std::string(stream->name) + " has work that never ran (no " +
                  "synchronization after it): first " +
                  stream->queue.front().name);
  }
}

cudaError_t Allocate(void** pointer, size_t bytes, MemoryKind kind) {
  Runtime& state = State();
  if (pointer == nullptr) return Result(cudaErrorInvalidValue);
  if (state.sticky != cudaSuccess) return Result(state.sticky);
  *pointer = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (posix_memalign(pointer, 256, bytes) != 0) {
    *pointer = nullptr;
    return Result(cudaErrorMemoryAllocation);
  }
  Scribble(*pointer, bytes);
  state.allocations[reinterpret_cast<uintptr_t>(*pointer)] =
      Allocation{bytes, kind};
  return cudaSuccess;
}

cudaError_t Release(void* pointer, MemoryKind kind) {
  Runtime& state = State();
  if (pointer == nullptr) return cudaSuccess;
  auto found = state.allocations.find(reinterpret_cast<uintptr_t>(pointer));
  if (found == state.allocations.end() || found->second.kind != kind) {
    return Result(cudaErrorInvalidValue);
  }
  state.allocations.erase(found);
  std::free(pointer);
  return cudaSuccess;
}

cudaError_t Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                 cudaStream_t stream, const char* call, uint64_t* sequence) {
  if (bytes == 0) return Push(stream, call, [] {}, sequence);
  if (kind == cudaMemcpyDefault) {
    const bool from_device = InDevice(src, 1), to_device = InDevice(dst, 1);
    kind = from_device
               ? (to_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
               : (to_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  }
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return Result(cudaErrorInvalidMemcpyDirection);
  }
  const bool from_device =
      kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool to_device =
      kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (from_device && !InDevice(src, bytes))
    return NotDeviceMemory(call, src, bytes);
  if (to_device && !InDevice(dst, bytes))
    return NotDeviceMemory(call, dst, bytes);
  if (!from_device && !IsPinned(src)) {
    // Pageable host memory is staged at the call, as CUDA stages it.
    auto staged = std::make_shared<std::vector<char>>(
        static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    return Push(
        stream, call,
        [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); },
        sequence);
  }
  return Push(
      stream, call, [dst, src, bytes] { std::memcpy(dst, src, bytes); },
      sequence);
}

cudaError_t Set(void* pointer, int value, size_t bytes, cudaStream_t stream,
                const char* call, uint64_t* sequence) {
  if (bytes != 0 && !InDevice(pointer, bytes)) {
    return NotDeviceMemory(call, pointer, bytes);
  }
  return Push(
      stream, call,
      [pointer, value, bytes] { std::memset(pointer, value, bytes); },
      sequence);
}

// A synchronous call: its legacy-stream operation, then waits for it.
cudaError_t WaitFor(cudaError_t queued, uint64_t sequence) {
  if (queued != cudaSuccess) return queued;
  RunStream(&State().legacy, sequence);
  return Result(State().sticky);
}

}  // namespace

std::recursive_mutex& RuntimeMutex() { return State().mutex; }

void RaiseFault(const std::string& message) {
  Runtime& state = State();
  ++state.faults;
  state.fault_raised = true;
  ReportFailure(message);
  if (state.abort_on_fault) std::abort();
}

void CountLaunch(const char* kernel_name) {
  std::string name(kernel_name);
  name = name.substr(0, name.find('<'));
  while (!name.empty() && name.back() == ' ') name.pop_back();
  ++State().launches[name];
}

cudaError_t EnqueueKernel(cudaStream_t stream, KernelLaunch launch) {
  Lock lock(RuntimeMutex());
  const dim3 g = launch.grid, b = launch.block;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 ||
      g.z > 65535 || threads == 0 || threads > 1024 || b.x > 1024 ||
      b.y > 1024 || b.z > 64) {
    return Result(cudaErrorInvalidConfiguration);
  }
  if (launch.shared_bytes > 48 * 1024) return Result(cudaErrorInvalidValue);
  const std::string name = Site(launch.name, launch.file, launch.line);
  auto shared = std::make_shared<KernelLaunch>(std::move(launch));
  return Push(stream, name, [shared] { RunKernel(*shared); });
}

cudaError_t Enqueue(cudaStream_t stream, const char* name, const char* file,
                    int line, std::function<void()> work) {
  Lock lock(RuntimeMutex());
  return Push(stream, Site(name, file, line), std::move(work));
}

bool CheckDeviceRange(const void* pointer, size_t bytes, const char* what) {
  Lock lock(RuntimeMutex());
  if (bytes == 0 || InDevice(pointer, bytes)) return true;
  char text[160];
  std::snprintf(text, sizeof(text),
                "%s: [%p, +%zu) is not in one device allocation", what, pointer,
                bytes);
  RaiseFault(text);
  return false;
}

void Scribble(void* pointer, size_t bytes) {
  // Not one repeated byte: garbage that a wrong read cannot take for a
  // sorted or uniform array.
  uint64_t word = NextRandom() | 0x8080808080808080ull;
  auto* bytes_out = static_cast<unsigned char*>(pointer);
  for (size_t i = 0; i < bytes; i += sizeof(word)) {
    word = word * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t garbage = word ^ (word >> 29) ^ kGarbage;
    std::memcpy(bytes_out + i, &garbage, std::min(sizeof(garbage), bytes - i));
  }
}

uint64_t RandomBits() {
  Lock lock(RuntimeMutex());
  return NextRandom();
}

uint64_t NextRandom() {  // splitmix64
  uint64_t z = (State().random_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace detail

using detail::Lock;
using detail::Result;
using detail::RuntimeMutex;
using detail::State;

uint64_t Seed() { return State().seed; }

void SetSeed(uint64_t seed) {
  Lock lock(RuntimeMutex());
  State().seed = seed;
  State().random_state = seed;
}

std::vector<std::pair<std::string, int64_t>> LaunchCounts() {
  Lock lock(RuntimeMutex());
  return {State().launches.begin(), State().launches.end()};
}

void ResetLaunchCounts() {
  Lock lock(RuntimeMutex());
  State().launches.clear();
}

int64_t FaultCount() { return State().faults; }

void ReportFailure(const std::string& what) {
  std::fprintf(stderr, "simt: %s (PE_SIMT_SEED=%llu)\n", what.c_str(),
               static_cast<unsigned long long>(State().seed));
  std::fflush(stderr);
}

void ResetDevice() {
  Lock lock(RuntimeMutex());
  detail::DropAllWork();
  State().sticky = cudaSuccess;
  State().last = cudaSuccess;
}

}  // namespace pe_simt

using pe_simt::detail::Lock;
using pe_simt::detail::Result;
using pe_simt::detail::RuntimeMutex;
using pe_simt::detail::State;
namespace simt = pe_simt::detail;

cudaError_t cudaGetLastError() {
  Lock lock(RuntimeMutex());
  const cudaError_t last = State().last;
  State().last = cudaSuccess;
  return last != cudaSuccess ? last : State().sticky;
}

cudaError_t cudaPeekAtLastError() {
  Lock lock(RuntimeMutex());
  return State().last != cudaSuccess ? State().last : State().sticky;
}

cudaError_t cudaDeviceSynchronize() {
  Lock lock(RuntimeMutex());
  return simt::SynchronizeAll();
}

cudaError_t cudaDeviceReset() {
  pe_simt::ResetDevice();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  Lock lock(RuntimeMutex());
  return simt::Allocate(pointer, bytes, simt::MemoryKind::kDevice);
}

cudaError_t cudaFree(void* pointer) {
  Lock lock(RuntimeMutex());
  const cudaError_t error = simt::SynchronizeAll();  // As CUDA's cudaFree.
  if (error != cudaSuccess) return error;
  return simt::Release(pointer, simt::MemoryKind::kDevice);
}

cudaError_t cudaMallocHost(void** pointer, size_t bytes) {
  Lock lock(RuntimeMutex());
  return simt::Allocate(pointer, bytes, simt::MemoryKind::kPinned);
}

cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int) {
  return cudaMallocHost(pointer, bytes);
}

cudaError_t cudaFreeHost(void* pointer) {
  Lock lock(RuntimeMutex());
  const cudaError_t error = simt::SynchronizeAll();
  if (error != cudaSuccess) return error;
  return simt::Release(pointer, simt::MemoryKind::kPinned);
}

cudaError_t cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t stream) {
  Lock lock(RuntimeMutex());
  if (simt::FindStream(stream) == nullptr) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  return simt::Allocate(pointer, bytes, simt::MemoryKind::kDevice);
}

cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream) {
  Lock lock(RuntimeMutex());
  if (pointer == nullptr) return cudaSuccess;
  if (State().allocations.count(reinterpret_cast<uintptr_t>(pointer)) == 0) {
    return Result(cudaErrorInvalidValue);
  }
  return simt::Push(stream, "cudaFreeAsync", [pointer] {
    simt::Release(pointer, simt::MemoryKind::kDevice);
  });
}

cudaError_t cudaMemset(void* pointer, int value, size_t bytes) {
  Lock lock(RuntimeMutex());
  uint64_t sequence = 0;
  const cudaError_t queued =
      simt::Set(pointer, value, bytes, nullptr, "cudaMemset", &sequence);
  return simt::WaitFor(queued, sequence);
}

cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes,
                            cudaStream_t stream) {
  Lock lock(RuntimeMutex());
  return simt::Set(pointer, value, bytes, stream, "cudaMemsetAsync", nullptr);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes,
                       cudaMemcpyKind kind) {
  Lock lock(RuntimeMutex());
  uint64_t sequence = 0;
  const cudaError_t queued =
      simt::Copy(dst, src, bytes, kind, nullptr, "cudaMemcpy", &sequence);
  return simt::WaitFor(queued, sequence);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  Lock lock(RuntimeMutex());
  return simt::Copy(dst, src, bytes, kind, stream, "cudaMemcpyAsync", nullptr);
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes,
                                     const void* pointer) {
  Lock lock(RuntimeMutex());
  if (attributes == nullptr) return Result(cudaErrorInvalidValue);
  uintptr_t start = 0;
  const simt::Allocation* allocation = simt::FindAllocation(pointer, &start);
  void* address = const_cast<void*>(pointer);
  *attributes =
      cudaPointerAttributes{cudaMemoryTypeUnregistered, 0, nullptr, nullptr};
  if (allocation != nullptr && allocation->kind == simt::MemoryKind::kDevice) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = address;
  } else if (allocation != nullptr) {
    attributes->type = cudaMemoryTypeHost;
    attributes->devicePointer = address;
    attributes->hostPointer = address;
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream,
                                      unsigned int flags) {
  Lock lock(RuntimeMutex());
  if (stream == nullptr) return Result(cudaErrorInvalidValue);
  *stream = new CUstream_st;
  (*stream)->blocking = (flags & cudaStreamNonBlocking) == 0;
  State().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(RuntimeMutex());
  if (State().streams.count(stream) == 0) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  simt::RunStream(stream, UINT64_MAX);
  stream->queue.clear();
  State().streams.erase(stream);
  for (CUevent_st* event : State().events) {
    if (event->stream == stream) event->stream = nullptr;
  }
  delete stream;
  return Result(State().sticky);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(RuntimeMutex());
  CUstream_st* found = simt::FindStream(stream);
  if (found == nullptr) return Result(cudaErrorInvalidResourceHandle);
  simt::RunStream(found, UINT64_MAX);
  return Result(State().sticky);
}

// Queued work has not run: "not ready", and it runs now, so that a polling
// loop ends.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Lock lock(RuntimeMutex());
  CUstream_st* found = simt::FindStream(stream);
  if (found == nullptr) return Result(cudaErrorInvalidResourceHandle);
  if (State().sticky != cudaSuccess) return Result(State().sticky);
  if (found->queue.empty()) return cudaSuccess;
  simt::RunStream(found, UINT64_MAX);
  return State().sticky != cudaSuccess ? Result(State().sticky)
                                       : cudaErrorNotReady;
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  Lock lock(RuntimeMutex());
  if (device == nullptr) return Result(cudaErrorInvalidValue);
  if (simt::FindStream(stream) == nullptr) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int) {
  Lock lock(RuntimeMutex());
  if (State().events.count(event) == 0) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  if (!event->recorded || event->done || event->stream == nullptr) {
    return simt::FindStream(stream) != nullptr
               ? cudaSuccess
               : Result(cudaErrorInvalidResourceHandle);
  }
  CUstream_st* waited = event->stream;
  const uint64_t sequence = event->sequence;
  return simt::Push(stream, "cudaStreamWaitEvent", [waited, sequence] {
    if (State().streams.count(waited) != 0 || waited == &State().legacy ||
        waited == &State().per_thread) {
      simt::RunStream(waited, sequence);
    }
  });
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  Lock lock(RuntimeMutex());
  if (event == nullptr) return Result(cudaErrorInvalidValue);
  *event = new CUevent_st;
  State().events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  return cudaEventCreate(event);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(RuntimeMutex());
  if (State().events.count(event) == 0) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  uint64_t sequence = 0;
  const cudaError_t error = simt::Push(
      stream, "cudaEventRecord",
      [event] {
        event->done = true;
        event->when = std::chrono::steady_clock::now();
      },
      &sequence);
  if (error != cudaSuccess) return error;
  event->stream = simt::FindStream(stream);
  event->sequence = sequence;
  event->recorded = true;
  event->done = false;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Lock lock(RuntimeMutex());
  if (State().events.count(event) == 0) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  if (event->recorded && !event->done && event->stream != nullptr) {
    simt::RunStream(event->stream, event->sequence);
  }
  return Result(State().sticky);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(RuntimeMutex());
  if (State().events.count(event) == 0) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  if (!event->recorded || event->done) return Result(State().sticky);
  cudaEventSynchronize(event);  // As cudaStreamQuery: runs for the next query.
  return State().sticky != cudaSuccess ? Result(State().sticky)
                                       : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start,
                                 cudaEvent_t end) {
  Lock lock(RuntimeMutex());
  if (ms == nullptr) return Result(cudaErrorInvalidValue);
  if (State().events.count(start) == 0 || State().events.count(end) == 0) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  if (!start->recorded || !end->recorded)
    return Result(cudaErrorInvalidResourceHandle);
  if (!start->done || !end->done) return Result(cudaErrorNotReady);
  *ms =
      std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(RuntimeMutex());
  if (State().events.erase(event) == 0) {
    return Result(cudaErrorInvalidResourceHandle);
  }
  // A queued record still refers to it: keep it (a few bytes) if so.
  if (!event->recorded || event->done) delete event;
  return cudaSuccess;
}
