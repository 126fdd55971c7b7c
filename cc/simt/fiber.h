// The SIMT emulator's fibers (private to cc/simt): one per lane, on stacks
// reused across blocks and launches, switched on one OS thread. On x86-64 a
// hand-written switch saves the callee-saved registers (swapcontext's signal
// mask system call would cost more than most lanes' work); elsewhere
// ucontext. Under ASan every switch is announced with the sanitizer's fiber
// calls, so it knows which stack is live.
#ifndef PE_SIMT_FIBER_H_
#define PE_SIMT_FIBER_H_

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace pe_simt {
namespace detail {

class Fiber {
 public:
  Fiber();
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Makes the next Resume run `entry` from the top of the stack. `entry`
  // must end in Suspend(true), never return.
  void Start(void (*entry)());
  // From the scheduler: runs the fiber until it suspends.
  void Resume();
  // From the fiber: back to the scheduler. `finished`: never resumed again
  // before the next Start.
  void Suspend(bool finished);

 private:
  char* stack_ = nullptr;  // Usable stack, above a guard page.
  size_t stack_bytes_ = 0;
  bool live_ = false;  // Started, not finished: its stack holds frames.
  [[maybe_unused]] void* asan_fake_stack_ = nullptr;  // ASan builds only.
#if defined(__x86_64__)
  void* stack_pointer_ = nullptr;
#else
  ucontext_t context_;
#endif
};

}  // namespace detail
}  // namespace pe_simt

#endif  // PE_SIMT_FIBER_H_
