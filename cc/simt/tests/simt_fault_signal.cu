// An invalid memory access in a lane (build_tools/simt_selftest.sh builds
// this without sanitizers, and with them): the process dies of the signal,
// after one simt: line that names the kernel, the block and the thread, and
// after any handler that was there before, which sees the same fault.
//
//   simt_fault_signal lane      thread 37 of WildReadKernel reads address 0x40
//   simt_fault_signal chained   the same, under a SA_SIGINFO handler
//                               installed before the first launch
//   simt_fault_signal host      the host reads it after a launch: no simt line
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "simt_runtime.h"

namespace {

__global__ void WildReadKernel(const int* wild, int* out) {
  if (threadIdx.x == 37) out[0] = *wild;
}

__global__ void NothingKernel() {}

void OnPreviousHandler(int signal, siginfo_t* info, void*) {
  char line[96];
  const int length =
      std::snprintf(line, sizeof(line), "previous handler: signal %d at %p\n",
                    signal, info->si_addr);
  if (write(STDERR_FILENO, line, static_cast<size_t>(length)) < 0) _exit(3);
  ::signal(signal, SIG_DFL);  // The access faults again, and kills.
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  // 0x40, from a run-time value, so that no compiler sees a constant address.
  const int* wild = reinterpret_cast<const int*>(uintptr_t(argc) * 32);
  int* out = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&out), sizeof(int));
  if (std::strcmp(mode, "chained") == 0) {
    struct sigaction action{};
    action.sa_sigaction = &OnPreviousHandler;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &action, nullptr);
  }
  if (std::strcmp(mode, "host") == 0) {
    PE_LAUNCH(1, 32, 0, nullptr, NothingKernel)();
    cudaDeviceSynchronize();
    std::printf("%d\n", *static_cast<const volatile int*>(wild));
    return 0;
  }
  PE_LAUNCH(2, 64, 0, nullptr, WildReadKernel)(wild, out);
  cudaDeviceSynchronize();
  std::fprintf(stderr, "no fault\n");
  return 0;
}
