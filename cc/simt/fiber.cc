// The SIMT emulator's fibers: see fiber.h.
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "runtime_internal.h"

#if defined(PE_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__x86_64__)
// void pe_simt_switch_stack(void** save_sp, void* next_sp): pushes the
// callee-saved registers and the SSE/x87 control words, saves the stack
// pointer, loads the other fiber's and pops its.
asm(R"(
  .text
  .globl pe_simt_switch_stack
  .hidden pe_simt_switch_stack
  .type pe_simt_switch_stack, @function
  .p2align 4
pe_simt_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size pe_simt_switch_stack, .-pe_simt_switch_stack
)");
extern "C" void pe_simt_switch_stack(void** save_sp, void* next_sp);
#endif

namespace pe_simt {
namespace detail {
namespace {

#if defined(PE_SIMT_ASAN)
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif

thread_local void (*current_entry)() = nullptr;
thread_local Fiber::Context scheduler_context;
// The scheduler's stack as ASan knows it, learnt when a switch from it ends.
thread_local bool from_scheduler = false;
thread_local const void* scheduler_stack_bottom = nullptr;
thread_local size_t scheduler_stack_bytes = 0;

// Leaves the running side (its resume point into `save`) for `next`, whose
// stack ASan is told of; returns when switched back. `fake_stack`: where ASan
// keeps the running side's fake frames meanwhile (null: it never resumes).
inline void Leave(Fiber::Context* save, Fiber::Context* next,
                  [[maybe_unused]] const void* next_bottom,
                  [[maybe_unused]] size_t next_bytes,
                  [[maybe_unused]] void** fake_stack) {
#if defined(PE_SIMT_ASAN)
  __sanitizer_start_switch_fiber(fake_stack, next_bottom, next_bytes);
#endif
#if defined(__x86_64__)
  pe_simt_switch_stack(save, *next);
#else
  swapcontext(save, next);
#endif
}

// On a fiber that was just switched to: ends ASan's switch (`fake_stack`:
// the fiber's own, saved when it left) and learns the scheduler's stack if
// the switch came from there.
inline void Arrived([[maybe_unused]] void* fake_stack) {
#if defined(PE_SIMT_ASAN)
  const void* bottom = nullptr;
  size_t bytes = 0;
  __sanitizer_finish_switch_fiber(fake_stack, &bottom, &bytes);
  if (from_scheduler) {
    scheduler_stack_bottom = bottom;
    scheduler_stack_bytes = bytes;
  }
#endif
  from_scheduler = false;
}

void FiberMain() {
  Arrived(nullptr);
  current_entry();
  std::fprintf(stderr, "simt: internal error: a fiber's entry returned\n");
  std::abort();
}

}  // namespace

Fiber::Fiber() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* memory =
      mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (memory == MAP_FAILED) {
    std::fprintf(stderr, "simt: cannot map a %zu-byte fiber stack\n",
                 kStackBytes);
    std::abort();
  }
  mprotect(memory, page, PROT_NONE);  // Overflow faults, not corrupts.
  stack_ = static_cast<char*>(memory) + page;
  stack_bytes_ = kStackBytes;
}

Fiber::~Fiber() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  munmap(stack_ - page, stack_bytes_ + page);
}

void Fiber::Start(void (*entry)()) {
#if defined(PE_SIMT_ASAN)
  // A lane's frames that never return leave their redzones poisoned: all of
  // an abandoned lane's (a faulted launch), a finished lane's last ones, at
  // the top, where the first frame goes.
  constexpr size_t kTopBytes = 4096;
  if (live_) {
    __asan_unpoison_memory_region(stack_, stack_bytes_);
  } else {
    __asan_unpoison_memory_region(stack_ + stack_bytes_ - kTopBytes, kTopBytes);
  }
#endif
  live_ = true;
  current_entry = entry;
#if defined(__x86_64__)
  auto top =
      reinterpret_cast<uintptr_t>(stack_ + stack_bytes_) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  *--slot = 0;  // FiberMain's return address: none (keeps the ABI alignment).
  *--slot = reinterpret_cast<uint64_t>(&FiberMain);
  for (int i = 0; i < 6; ++i) *--slot = 0;       // rbp rbx r12 r13 r14 r15.
  *--slot = 0x1f80u | (uint64_t{0x037f} << 32);  // Default MXCSR, x87 CW.
  context_ = slot;
#else
  getcontext(&context_);
  context_.uc_stack.ss_sp = stack_;
  context_.uc_stack.ss_size = stack_bytes_;
  context_.uc_link = nullptr;
  makecontext(&context_, &FiberMain, 0);
#endif
}

void Fiber::Resume() {
  from_scheduler = true;
  void* fake_stack = nullptr;
  Leave(&scheduler_context, &context_, stack_, stack_bytes_, &fake_stack);
#if defined(PE_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

void Fiber::SwitchTo(Fiber* next, bool finished) {
  if (finished) live_ = false;
  void** fake_stack = finished ? nullptr : &asan_fake_stack_;
  if (next != nullptr) {
    Leave(&context_, &next->context_, next->stack_, next->stack_bytes_,
          fake_stack);
  } else {
    Leave(&context_, &scheduler_context, scheduler_stack_bottom,
          scheduler_stack_bytes, fake_stack);
  }
  Arrived(asan_fake_stack_);
}

}  // namespace detail
}  // namespace pe_simt
