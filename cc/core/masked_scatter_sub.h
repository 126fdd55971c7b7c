// TF-free core of the MaskedScatterSub kernel.
//
// Nothing here includes TensorFlow or pybind11: the TensorFlow OpKernel and the
// pybind11 kernel module both call these functions over raw pointers, which is
// what lets the GPU path be tested where TensorFlow is absent.
//
// Semantics, for every position i in [0, num_indices):
//   if row_mask[indices[i]]:  var[indices[i], :] -= updates[i, :]
// Rows whose mask is false are never written. Duplicate indices accumulate.
#ifndef PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_H_
#define PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_H_

#include <cstdint>
#include <cstring>

namespace partial_embedding {

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

inline float ToFloat(BFloat16 x) {
  return BitsToFloat(static_cast<uint32_t>(x.bits) << 16);
}

inline BFloat16 ToBFloat16(float value) {
  uint32_t bits = FloatToBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep it quiet and keep the sign.
    return BFloat16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  // Round to nearest, ties to even.
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((bits + rounding_bias) >> 16)};
}

inline float ToFloat(Float16 x) {
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
}

inline Float16 ToFloat16(float value) {
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
}

// Arithmetic used by the kernels: 16-bit types compute in float.
template <typename T>
struct Arith {
  using Compute = T;
  static Compute Load(T x) { return x; }
  static T Store(Compute x) { return x; }
};
template <>
struct Arith<Float16> {
  using Compute = float;
  static float Load(Float16 x) { return ToFloat(x); }
  static Float16 Store(float x) { return ToFloat16(x); }
};
template <>
struct Arith<BFloat16> {
  using Compute = float;
  static float Load(BFloat16 x) { return ToFloat(x); }
  static BFloat16 Store(float x) { return ToBFloat16(x); }
};

// Returns the first position i with indices[i] outside [0, num_rows), or -1
// when every index is valid. Reads each index once.
template <typename Index>
int64_t FindFirstBadIndex(const Index* indices, int64_t num_indices,
                          int64_t num_rows);

// Applies the update to the rows r with r % num_shards == shard, in the order
// of `indices`. Shards touch disjoint rows, so they may run concurrently, and
// the result does not depend on how many run at once: each row's updates are
// always applied in index order. Indices must already be validated.
template <typename T, typename Index>
void MaskedScatterSubShard(T* var, int64_t row_size, const Index* indices,
                           int64_t num_indices, const T* updates,
                           const bool* row_mask, int shard, int num_shards);

// How many shards are worth running for an update of this size: one below a
// size where starting threads costs more than it saves.
int RecommendedShards(int64_t num_indices, int64_t row_size, int max_threads);

// Validates, then updates `var` ([num_rows, row_size], row-major) in place on
// the CPU with up to `max_threads` threads. Returns -1 on success, or the first
// bad position in `indices` (nothing is written then).
template <typename T, typename Index>
int64_t MaskedScatterSubCpu(T* var, int64_t num_rows, int64_t row_size,
                            const Index* indices, int64_t num_indices,
                            const T* updates, const bool* row_mask,
                            int max_threads);

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_MASKED_SCATTER_SUB_H_
