// The SIMT emulator's report of an invalid memory access in a lane (see
// ArmFaultSignals in runtime_internal.h). A GPU reports one as
// cudaErrorIllegalAddress; here the process still dies of the signal, but
// first a simt: line names the kernel, the block and the thread. The handler
// runs on an alternate stack, as the faulting stack may be a fiber's, and
// neither allocates nor formats with stdio: it writes one preformatted line.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "include/simt_runtime.h"
#include "runtime_internal.h"

namespace pe_simt {
namespace detail {
namespace {

#if !defined(PE_SIMT_ASAN)

constexpr int kSignals[] = {SIGSEGV, SIGBUS};
constexpr size_t kAlternateStackBytes = 64 * 1024;

// The handlers that were there before ours, by kSignals' order.
struct sigaction previous_actions[2];
// The block that runs (BlockRun::description); read only on the thread that
// runs it, while a lane runs.
const char* running_block = "";

// One line in a fixed buffer, formatted without stdio or allocation.
class SignalLine {
 public:
  void Text(const char* text) {
    while (*text != '\0') Char(*text++);
  }
  void Number(uint64_t value, unsigned base) {
    char digits[24];
    int count = 0;
    do {
      digits[count++] = "0123456789abcdef"[value % base];
      value /= base;
    } while (value != 0);
    while (count > 0) Char(digits[--count]);
  }
  void Write() {
    text_[size_++] = '\n';  // Char leaves room for it.
    for (size_t written = 0; written < size_;) {
      const ssize_t n = write(STDERR_FILENO, text_ + written, size_ - written);
      if (n <= 0) return;
      written += static_cast<size_t>(n);
    }
  }

 private:
  void Char(char c) {
    if (size_ + 1 < sizeof(text_)) text_[size_++] = c;
  }
  char text_[2048];
  size_t size_ = 0;
};

void OnFaultSignal(int signal, siginfo_t* info, void*) {
  const int index = signal == SIGSEGV ? 0 : 1;
  if (const LaneContext* lane = current_lane) {
    const uint3& t = lane->thread_idx;
    const dim3& size = lane->block_dim;
    SignalLine line;
    line.Text("simt: ");
    line.Text(running_block);
    line.Text(" thread ");
    line.Number(t.x + uint64_t{size.x} * (t.y + uint64_t{size.y} * t.z), 10);
    line.Text(": invalid memory access at 0x");
    line.Number(reinterpret_cast<uintptr_t>(info->si_addr), 16);
    line.Text(signal == SIGSEGV ? " (SIGSEGV)" : " (SIGBUS)");
    line.Text(", as a GPU's illegal address (PE_SIMT_SEED=");
    line.Number(Seed(), 10);
    line.Text(")");
    line.Write();
  }
  // The previous handler back, with its own flags and mask; it sees the same
  // fault: a faulting instruction faults again when this handler returns, and
  // a signal that was sent (kill, raise) is sent again, delivered then.
  sigaction(signal, &previous_actions[index], nullptr);
  if (info->si_code <= 0) raise(signal);
}

// This thread's alternate signal stack, unless it has one (Python's
// faulthandler gives one to the thread that enables it).
class AlternateStack {
 public:
  AlternateStack() {
    stack_t current;
    if (sigaltstack(nullptr, &current) == 0 &&
        (current.ss_flags & SS_DISABLE) == 0) {
      return;
    }
    void* memory = mmap(nullptr, kAlternateStackBytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return;
    stack_t stack{};
    stack.ss_sp = memory;
    stack.ss_size = kAlternateStackBytes;
    if (sigaltstack(&stack, nullptr) == 0) {
      memory_ = memory;
    } else {
      munmap(memory, kAlternateStackBytes);
    }
  }
  ~AlternateStack() {
    if (memory_ == nullptr) return;
    stack_t current;
    if (sigaltstack(nullptr, &current) == 0 && current.ss_sp == memory_) {
      stack_t off{};
      off.ss_flags = SS_DISABLE;
      sigaltstack(&off, nullptr);
    }
    munmap(memory_, kAlternateStackBytes);
  }
  AlternateStack(const AlternateStack&) = delete;
  AlternateStack& operator=(const AlternateStack&) = delete;

 private:
  void* memory_ = nullptr;
};

#endif  // !defined(PE_SIMT_ASAN)

}  // namespace

void ArmFaultSignals([[maybe_unused]] const char* block) {
#if !defined(PE_SIMT_ASAN)
  static const bool installed = [] {
    for (int i = 0; i < 2; ++i) {
      struct sigaction action{};
      action.sa_sigaction = &OnFaultSignal;
      action.sa_flags = SA_SIGINFO | SA_ONSTACK;
      sigemptyset(&action.sa_mask);
      if (sigaction(kSignals[i], &action, &previous_actions[i]) != 0) {
        std::perror("simt: cannot install the fault signal handlers");
        std::abort();
      }
    }
    return true;
  }();
  (void)installed;
  thread_local AlternateStack alternate_stack;
  running_block = block;
#endif
}

}  // namespace detail
}  // namespace pe_simt
