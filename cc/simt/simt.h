// The SIMT emulator's device side (cc/simt/README.md), forced into every
// emulated .cu file (-include cc/simt/simt.h -DPE_SIMT=1): CUDA's qualifiers,
// builtins, atomics and warp collectives as host C++, and the launch that
// replaces <<<...>>>. Each lane of a block is a fiber; the runtime
// (cc/simt/*.cc) switches lanes only at collectives and atomics, in an order
// drawn from PE_SIMT_SEED, and checks every collective's rules.
//
// __CUDA_ARCH__ and __CUDACC__ stay undefined: the sources take their host
// arithmetic paths.
#ifndef PE_SIMT_SIMT_H_
#define PE_SIMT_SIMT_H_

#if defined(__CUDA_ARCH__) || defined(__CUDACC__)
#error \
    "cc/simt/simt.h compiles CUDA sources as host C++: not for nvcc or clang -x cuda"
#endif

// Standard headers first: libstdc++ spells attributes __noinline__, which is
// a macro below.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "device_api.h"
#include "include/cuda_runtime.h"
#include "include/simt_runtime.h"

#define __global__
#define __device__
#define __host__
#define __constant__ static
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// Blocks run one at a time, so a static is the block's shared memory. For
// dynamic shared memory see pe_simt::DynamicShared.
#define __shared__ static

namespace pe_simt {
namespace detail {

inline int WarpSize() { return 32; }

inline const LaneContext& Lane(const char* what) {
  if (current_lane == nullptr) OutsideKernel(what);
  return *current_lane;
}

// A collective's call site; the builtins below are macros that name it.
struct CallSite {
  const char* file;
  int line;

  void SyncThreads() const {
    Arrive(file, line, Collective::kSyncThreads, 0, 0, 0, 32);
  }
  void SyncWarp(unsigned mask = 0xffffffffu) const {
    Arrive(file, line, Collective::kSyncWarp, mask, 0, 0, 32);
  }
  template <typename T>
  T Shfl(unsigned mask, T var, int src_lane, int width = 32) const {
    return Shuffle(Collective::kShfl, mask, var, src_lane, width);
  }
  template <typename T>
  T ShflUp(unsigned mask, T var, unsigned delta, int width = 32) const {
    return Shuffle(Collective::kShflUp, mask, var, static_cast<int>(delta),
                   width);
  }
  template <typename T>
  T ShflDown(unsigned mask, T var, unsigned delta, int width = 32) const {
    return Shuffle(Collective::kShflDown, mask, var, static_cast<int>(delta),
                   width);
  }
  template <typename T>
  T ShflXor(unsigned mask, T var, int lane_mask, int width = 32) const {
    return Shuffle(Collective::kShflXor, mask, var, lane_mask, width);
  }
  unsigned Ballot(unsigned mask, int predicate) const {
    return static_cast<unsigned>(
        Arrive(file, line, Collective::kBallot, mask, predicate != 0, 0, 32));
  }
  int Any(unsigned mask, int predicate) const {
    return static_cast<int>(
        Arrive(file, line, Collective::kAny, mask, predicate != 0, 0, 32));
  }
  int All(unsigned mask, int predicate) const {
    return static_cast<int>(
        Arrive(file, line, Collective::kAll, mask, predicate != 0, 0, 32));
  }
  unsigned ActiveMask() const {
    return static_cast<unsigned>(
        Arrive(file, line, Collective::kActiveMask, 0, 0, 0, 32));
  }

 private:
  template <typename T>
  T Shuffle(Collective kind, unsigned mask, T var, int arg, int width) const {
    static_assert(
        std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
        "shuffles move trivially copyable values of 4 or 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &var, sizeof(T));
    bits = Arrive(file, line, kind, mask, bits, arg, width);
    T result;
    std::memcpy(&result, &bits, sizeof(T));
    return result;
  }
};

template <typename T>
T AtomicUpdate(T* address, T (*update)(T old, T value), T value) {
  AtomicPoint();
  const T old = *address;
  *address = update(old, value);
  return old;
}

inline dim3 ToDim3(dim3 size) { return size; }
template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
dim3 ToDim3(Int size) {
  // Out of range: a grid of 0, which the launch reports as an invalid
  // configuration.
  if (size < 1 || static_cast<unsigned long long>(size) > 0xffffffffull) {
    return dim3(0);
  }
  return dim3(static_cast<unsigned>(size));
}

template <typename... Params>
class Launcher {
 public:
  Launcher(const char* name, const char* file, int line,
           void (*kernel)(Params...), dim3 grid, dim3 block,
           size_t shared_bytes, cudaStream_t stream)
      : launch_{name, file, line, grid, block, shared_bytes, nullptr},
        kernel_(kernel),
        stream_(stream) {}

  template <typename... Args>
  void operator()(Args&&... args) {
    static_assert(sizeof...(Args) == sizeof...(Params),
                  "kernel launch: wrong number of arguments");
    auto params = std::make_shared<std::tuple<Params...>>(
        Pack(std::forward<Args>(args)...));
    void (*kernel)(Params...) = kernel_;
    launch_.body = [kernel, params] { std::apply(kernel, *params); };
    EnqueueKernel(stream_, std::move(launch_));
  }

 private:
  // A call's conversions, as the launch's: each lane then copies the values.
  static std::tuple<Params...> Pack(Params... params) {
    return std::tuple<Params...>(params...);
  }

  KernelLaunch launch_;
  void (*kernel_)(Params...);
  cudaStream_t stream_;
};

}  // namespace detail

template <typename... Params, typename Grid, typename Block>
detail::Launcher<Params...> Launch(const char* kernel_name, const char* file,
                                   int line, void (*kernel)(Params...),
                                   Grid grid, Block block, size_t shared_bytes,
                                   cudaStream_t stream) {
  return detail::Launcher<Params...>(
      kernel_name, file, line, kernel, detail::ToDim3(grid),
      detail::ToDim3(block), shared_bytes, stream);
}

// A kernel held in a function pointer variable: PE_LAUNCH takes its address.
template <typename... Params, typename Grid, typename Block>
detail::Launcher<Params...> Launch(const char* kernel_name, const char* file,
                                   int line, void (*const* kernel)(Params...),
                                   Grid grid, Block block, size_t shared_bytes,
                                   cudaStream_t stream) {
  return Launch(kernel_name, file, line, *kernel, grid, block, shared_bytes,
                stream);
}

// cc/core/gpu_device_common.cuh's streaming load: a plain 16-byte load
// through the uint4 pointer. Member by member: clang's UBSan checks the
// alignment of a member access, not of a whole-struct copy.
inline uint4 LoadStreaming(const uint4* address) {
  return uint4{address->x, address->y, address->z, address->w};
}

// The block's dynamic shared memory (the launch's shared_bytes, refilled with
// garbage before each block), for `extern __shared__ T name[];`:
//   T* name = pe_simt::DynamicShared<T>();
template <typename T>
T* DynamicShared() {
  return static_cast<T*>(detail::DynamicSharedMemory());
}

}  // namespace pe_simt

#ifndef PE_LAUNCH
#define PE_LAUNCH(grid, block, shared_bytes, stream, ...)                   \
  ::pe_simt::Launch(#__VA_ARGS__, __FILE__, __LINE__, &__VA_ARGS__, (grid), \
                    (block), (shared_bytes), (stream))
#endif

// Coordinates, per lane.
#define threadIdx (::pe_simt::detail::Lane("threadIdx").thread_idx)
#define blockIdx (::pe_simt::detail::Lane("blockIdx").block_idx)
#define blockDim (::pe_simt::detail::Lane("blockDim").block_dim)
#define gridDim (::pe_simt::detail::Lane("gridDim").grid_dim)
#define warpSize (::pe_simt::detail::WarpSize())

// Collectives, checked rendezvous that name their call site.
#define PE_SIMT_SITE \
  ::pe_simt::detail::CallSite { __FILE__, __LINE__ }
#define __syncthreads PE_SIMT_SITE.SyncThreads
#define __syncwarp PE_SIMT_SITE.SyncWarp
#define __shfl_sync PE_SIMT_SITE.Shfl
#define __shfl_up_sync PE_SIMT_SITE.ShflUp
#define __shfl_down_sync PE_SIMT_SITE.ShflDown
#define __shfl_xor_sync PE_SIMT_SITE.ShflXor
#define __ballot_sync PE_SIMT_SITE.Ballot
#define __any_sync PE_SIMT_SITE.Any
#define __all_sync PE_SIMT_SITE.All
#define __activemask PE_SIMT_SITE.ActiveMask

// Atomics: plain read-modify-writes (one OS thread runs every lane) that may
// first let another lane run. CUDA's overloads only.
#define PE_SIMT_ATOMIC(name, T, expression)                                   \
  inline T name(T* address, T value) {                                        \
    return ::pe_simt::detail::AtomicUpdate<T>(                                \
        address, [](T old, T operand) -> T { return (void)old, expression; }, \
        value);                                                               \
  }
#define PE_SIMT_WRAPPING_ADD(T, U) \
  static_cast<T>(static_cast<U>(old) + static_cast<U>(operand))
#define PE_SIMT_WRAPPING_SUB(T, U) \
  static_cast<T>(static_cast<U>(old) - static_cast<U>(operand))
PE_SIMT_ATOMIC(atomicAdd, int, PE_SIMT_WRAPPING_ADD(int, unsigned))
PE_SIMT_ATOMIC(atomicAdd, unsigned, old + operand)
PE_SIMT_ATOMIC(atomicAdd, unsigned long long, old + operand)
PE_SIMT_ATOMIC(atomicAdd, float, old + operand)
PE_SIMT_ATOMIC(atomicAdd, double, old + operand)
PE_SIMT_ATOMIC(atomicSub, int, PE_SIMT_WRAPPING_SUB(int, unsigned))
PE_SIMT_ATOMIC(atomicSub, unsigned, old - operand)
PE_SIMT_ATOMIC(atomicExch, int, operand)
PE_SIMT_ATOMIC(atomicExch, unsigned, operand)
PE_SIMT_ATOMIC(atomicExch, unsigned long long, operand)
PE_SIMT_ATOMIC(atomicExch, float, operand)
PE_SIMT_ATOMIC(atomicInc, unsigned, old >= operand ? 0u : old + 1u)
#define PE_SIMT_ATOMIC_INTEGER(T)                             \
  PE_SIMT_ATOMIC(atomicMin, T, operand < old ? operand : old) \
  PE_SIMT_ATOMIC(atomicMax, T, operand > old ? operand : old) \
  PE_SIMT_ATOMIC(atomicAnd, T, old& operand)                  \
  PE_SIMT_ATOMIC(atomicOr, T, old | operand)                  \
  PE_SIMT_ATOMIC(atomicXor, T, old ^ operand)                 \
  inline T atomicCAS(T* address, T compare, T value) {        \
    ::pe_simt::detail::AtomicPoint();                         \
    const T old = *address;                                   \
    if (old == compare) *address = value;                     \
    return old;                                               \
  }
PE_SIMT_ATOMIC_INTEGER(int)
PE_SIMT_ATOMIC_INTEGER(unsigned)
PE_SIMT_ATOMIC_INTEGER(long long)
PE_SIMT_ATOMIC_INTEGER(unsigned long long)
#undef PE_SIMT_ATOMIC_INTEGER
#undef PE_SIMT_WRAPPING_ADD
#undef PE_SIMT_WRAPPING_SUB
#undef PE_SIMT_ATOMIC

inline void __threadfence() {}
inline void __threadfence_block() {}

// min and max as CUDA's device code has them, unqualified in the global
// namespace (std::min and std::max are untouched).
#define PE_SIMT_MIN_MAX(T)                         \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
PE_SIMT_MIN_MAX(int)
PE_SIMT_MIN_MAX(unsigned)
PE_SIMT_MIN_MAX(long)
PE_SIMT_MIN_MAX(unsigned long)
PE_SIMT_MIN_MAX(long long)
PE_SIMT_MIN_MAX(unsigned long long)
#undef PE_SIMT_MIN_MAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// Loads and stores with cache hints: plain accesses.
#define PE_SIMT_PLAIN_LOAD(name) \
  template <typename T>          \
  T name(const T* address) {     \
    return *address;             \
  }
#define PE_SIMT_PLAIN_STORE(name)  \
  template <typename T>            \
  void name(T* address, T value) { \
    *address = value;              \
  }
PE_SIMT_PLAIN_LOAD(__ldg)
PE_SIMT_PLAIN_LOAD(__ldca)
PE_SIMT_PLAIN_LOAD(__ldcg)
PE_SIMT_PLAIN_LOAD(__ldcs)
PE_SIMT_PLAIN_LOAD(__ldlu)
PE_SIMT_PLAIN_LOAD(__ldcv)
PE_SIMT_PLAIN_STORE(__stwb)
PE_SIMT_PLAIN_STORE(__stcg)
PE_SIMT_PLAIN_STORE(__stcs)
PE_SIMT_PLAIN_STORE(__stwt)
#undef PE_SIMT_PLAIN_LOAD
#undef PE_SIMT_PLAIN_STORE

// Integer intrinsics.
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x));
}
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline unsigned __brev(unsigned x) {
  unsigned reversed = 0;
  for (int bit = 0; bit < 32; ++bit)
    reversed |= ((x >> bit) & 1u) << (31 - bit);
  return reversed;
}

// Float intrinsics: one IEEE operation each, rounded to nearest (compile
// with -ffp-contract=off so nothing fuses them).
#define PE_SIMT_ROUNDED_TO_NEAREST(T, Add, Sub, Mul, Div, Sqrt, Rcp, Fma) \
  inline T Add(T a, T b) { return a + b; }                                \
  inline T Sub(T a, T b) { return a - b; }                                \
  inline T Mul(T a, T b) { return a * b; }                                \
  inline T Div(T a, T b) { return a / b; }                                \
  inline T Sqrt(T a) { return std::sqrt(a); }                             \
  inline T Rcp(T a) { return T(1) / a; }                                  \
  inline T Fma(T a, T b, T c) { return std::fma(a, b, c); }
PE_SIMT_ROUNDED_TO_NEAREST(float, __fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn,
                           __fsqrt_rn, __frcp_rn, __fmaf_rn)
PE_SIMT_ROUNDED_TO_NEAREST(double, __dadd_rn, __dsub_rn, __dmul_rn, __ddiv_rn,
                           __dsqrt_rn, __drcp_rn, __fma_rn)
#undef PE_SIMT_ROUNDED_TO_NEAREST
#define PE_SIMT_BIT_CAST(name, From, To) \
  inline To name(From x) {               \
    To y;                                \
    std::memcpy(&y, &x, sizeof(y));      \
    return y;                            \
  }
PE_SIMT_BIT_CAST(__float_as_int, float, int)
PE_SIMT_BIT_CAST(__float_as_uint, float, unsigned)
PE_SIMT_BIT_CAST(__int_as_float, int, float)
PE_SIMT_BIT_CAST(__uint_as_float, unsigned, float)
PE_SIMT_BIT_CAST(__double_as_longlong, double, long long)
PE_SIMT_BIT_CAST(__longlong_as_double, long long, double)
#undef PE_SIMT_BIT_CAST

#endif  // PE_SIMT_SIMT_H_
