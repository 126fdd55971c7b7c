// What every TF-free row-update core shares, on the CPU and in CUDA: the
// 16-bit storage types, the arithmetic the kernels compute in, and the index
// check that runs before the first write.
//
// Nothing here includes TensorFlow or pybind11. Compiled by nvcc, the
// conversions and Arith also run on the device (through CUDA's intrinsics,
// which round the same way).
#ifndef PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_COMMON_H_
#define PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_COMMON_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define PE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PE_HOST_DEVICE inline
#endif

namespace partial_embedding {

// What a core does with a position whose index is outside [0, num_rows):
// refuse the whole call before the first write (TensorFlow's kernels, which
// report it), or skip the position as if its row were frozen (XLA's custom
// calls: XLA has no run-time errors, and its own scatters skip such indices).
enum class BadIndices { kRefuse, kSkip };

// 16-bit float storage types. Their bit layout is IEEE binary16 and bfloat16,
// the same as Eigen::half / Eigen::bfloat16 / __half / __nv_bfloat16, so the
// front ends reinterpret their buffers as these.
struct Float16 {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline uint32_t FloatToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Conversions round to nearest, ties to even; NaN stays a quiet NaN.

PE_HOST_DEVICE float ToFloat(BFloat16 x) {
#if defined(__CUDA_ARCH__)
  return __bfloat162float(__ushort_as_bfloat16(x.bits));
#else
  return BitsToFloat(static_cast<uint32_t>(x.bits) << 16);
#endif
}

PE_HOST_DEVICE BFloat16 ToBFloat16(float value) {
#if defined(__CUDA_ARCH__)
  return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(value))};
#else
  uint32_t bits = FloatToBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep it quiet and keep the sign.
    return BFloat16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((bits + rounding_bias) >> 16)};
#endif
}

PE_HOST_DEVICE float ToFloat(Float16 x) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(x.bits));
#else
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  const uint32_t exponent = (x.bits >> 10) & 0x1fu;
  const uint32_t mantissa = x.bits & 0x3ffu;
  if (exponent == 0x1fu) {  // Inf or NaN.
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {  // Normal.
    return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
#endif
}

PE_HOST_DEVICE Float16 ToFloat16(float value) {
#if defined(__CUDA_ARCH__)
  return Float16{__half_as_ushort(__float2half_rn(value))};
#else
  const uint32_t bits = FloatToBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) {  // NaN stays a quiet NaN.
    return Float16{static_cast<uint16_t>(sign | 0x7e00u)};
  }
  if (abs_bits >= 0x477ff000u) {  // Rounds to or beyond 65520: infinity.
    return Float16{static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (abs_bits < 0x38800000u) {
    // Result is subnormal or zero: scale so the float adder rounds for us
    // (round to nearest even at 2^-24 granularity).
    const float scaled = BitsToFloat(abs_bits) + 0.5f;
    return Float16{static_cast<uint16_t>(
        sign | static_cast<uint16_t>(FloatToBits(scaled) - 0x3f000000u))};
  }
  // Normal: rebias the exponent and round the 13 dropped bits to even.
  const uint32_t odd = (abs_bits >> 13) & 1u;
  const uint32_t rounded = abs_bits + 0xc8000fffu + odd;  // -(112 << 23) + bias
  return Float16{static_cast<uint16_t>(sign | (rounded >> 13))};
#endif
}

// The type the kernels compute in for a storage type T, and the conversions:
// 16-bit types compute in float, rounding once per Store.
template <typename T>
struct Arith {
  using Compute = T;
  static PE_HOST_DEVICE Compute Load(T x) { return x; }
  static PE_HOST_DEVICE T Store(Compute x) { return x; }
};
template <>
struct Arith<Float16> {
  using Compute = float;
  static PE_HOST_DEVICE float Load(Float16 x) { return ToFloat(x); }
  static PE_HOST_DEVICE Float16 Store(float x) { return ToFloat16(x); }
};
template <>
struct Arith<BFloat16> {
  using Compute = float;
  static PE_HOST_DEVICE float Load(BFloat16 x) { return ToFloat(x); }
  static PE_HOST_DEVICE BFloat16 Store(float x) { return ToBFloat16(x); }
};

// The element and index types the cores are instantiated for: each macro
// calls M once per index type, storage type, or (storage type, index type).
#define PE_FOR_EACH_INDEX_TYPE(M) M(int32_t) M(int64_t)
#define PE_FOR_EACH_CORE_TYPE(M) M(Float16) M(BFloat16) M(float) M(double)
// clang-format off: one (type, index type) pair a line.
#define PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(M) \
  M(Float16, int32_t)                           \
  M(Float16, int64_t)                           \
  M(BFloat16, int32_t)                          \
  M(BFloat16, int64_t)                          \
  M(float, int32_t)                             \
  M(float, int64_t)                             \
  M(double, int32_t)                            \
  M(double, int64_t)
// clang-format on

// Returns the first position i with indices[i] outside [0, num_rows), or -1
// when every index is valid. Reads each index once.
template <typename Index>
int64_t FindFirstBadIndex(const Index* indices, int64_t num_indices,
                          int64_t num_rows) {
  for (int64_t i = 0; i < num_indices; ++i) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row < 0 || row >= num_rows) return i;
  }
  return -1;
}

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_ROW_UPDATE_COMMON_H_
