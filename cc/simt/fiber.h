// The SIMT emulator's fibers (private to cc/simt): one per lane, on stacks
// reused across blocks and launches, switched on one OS thread, from one lane
// straight to the next. On x86-64 a hand-written switch saves the
// callee-saved registers (swapcontext's signal mask system call would cost
// more than most lanes' work); elsewhere ucontext. Under ASan every switch is
// announced with the sanitizer's fiber calls, so it knows which stack is live.
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
  // A suspended side's resume point: its stack pointer on x86-64.
#if defined(__x86_64__)
  using Context = void*;
#else
  using Context = ucontext_t;
#endif

  Fiber();
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Makes the next switch to it run `entry` from the top of the stack.
  // `entry` never returns: it ends in SwitchTo(..., true).
  void Start(void (*entry)());
  // From the scheduler: runs this fiber, and those it switches to, until one
  // switches back.
  void Resume();
  // From this fiber, the running one: straight on to `next` (one switch, not
  // two through the scheduler), or back to the scheduler if null.
  // `finished`: never resumed again before the next Start.
  void SwitchTo(Fiber* next, bool finished);

 private:
  char* stack_ = nullptr;  // Usable stack, above a guard page.
  size_t stack_bytes_ = 0;
  bool live_ = false;  // Started, not finished: its stack holds frames.
  [[maybe_unused]] void* asan_fake_stack_ = nullptr;  // ASan builds only.
  Context context_{};  // Where a switch to it goes on.
};

}  // namespace detail
}  // namespace pe_simt

#endif  // PE_SIMT_FIBER_H_
