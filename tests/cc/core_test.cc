// Standalone tests of the TF-free CPU core, meant to run under AddressSanitizer
// and UndefinedBehaviorSanitizer (build_tools/sanitize.sh). No test framework:
// each check prints what failed and the run exits non-zero.
//
// Checks, on fresh random inputs (the seed is printed):
//  - every dtype x index type against a double-precision reference, with heavy
//    duplicates, frozen rows compared bit for bit, 1..4 threads giving the same
//    bits;
//  - out-of-range and negative indices reported at their first position with
//    nothing written;
//  - empty inputs, one row, rows of width one and zero;
//  - float16 / bfloat16 conversions on every 16-bit pattern.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "cc/core/masked_scatter_sub.h"

namespace pe = partial_embedding;

namespace {

int failures = 0;

void Fail(const char* what, uint64_t seed, int trial) {
  std::fprintf(stderr, "FAIL: %s (seed %llu, trial %d)\n", what,
               static_cast<unsigned long long>(seed), trial);
  ++failures;
}

template <typename T>
double ToDouble(T x) {
  return static_cast<double>(pe::Arith<T>::Load(x));
}

template <typename T>
T FromDouble(double x) {
  return pe::Arith<T>::Store(static_cast<typename pe::Arith<T>::Compute>(x));
}

template <typename T>
double Epsilon() {
  if (std::is_same<T, pe::Float16>::value) return std::ldexp(1.0, -11);
  if (std::is_same<T, pe::BFloat16>::value) return std::ldexp(1.0, -8);
  if (std::is_same<T, float>::value) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, -53);
}

template <typename T, typename Index>
void RandomCases(std::mt19937_64& rng, uint64_t seed, int trials) {
  std::uniform_real_distribution<double> value(-2.0, 2.0);
  for (int trial = 0; trial < trials; ++trial) {
    const int64_t num_rows = 1 + static_cast<int64_t>(rng() % 64);
    const int64_t row_size = static_cast<int64_t>(rng() % 9);  // 0 allowed
    const int64_t num_indices = static_cast<int64_t>(rng() % 3000);
    const int64_t hot = std::min<int64_t>(num_rows, 1 + rng() % 4);
    std::vector<Index> indices(num_indices);
    for (auto& index : indices) {
      index =
          static_cast<Index>((rng() % 4 != 0) ? rng() % hot : rng() % num_rows);
    }
    std::unique_ptr<bool[]> mask(new bool[num_rows]);
    for (int64_t r = 0; r < num_rows; ++r) mask[r] = rng() % 2;
    std::vector<T> var(num_rows * row_size), updates(num_indices * row_size);
    for (auto& x : var) x = FromDouble<T>(value(rng));
    for (auto& x : updates) x = FromDouble<T>(value(rng) / 4);

    std::vector<double> expected(var.size());
    std::vector<int64_t> hits(num_rows, 0);
    for (size_t i = 0; i < var.size(); ++i) expected[i] = ToDouble(var[i]);
    for (int64_t i = 0; i < num_indices; ++i) {
      const int64_t row = indices[i];
      if (!mask[row]) continue;
      ++hits[row];
      for (int64_t j = 0; j < row_size; ++j) {
        expected[row * row_size + j] -= ToDouble(updates[i * row_size + j]);
      }
    }

    std::vector<T> first;
    for (int threads = 1; threads <= 4; ++threads) {
      std::vector<T> out = var;
      const int64_t bad = pe::MaskedScatterSubCpu(
          out.data(), num_rows, row_size, indices.data(), num_indices,
          updates.data(), mask.get(), pe::PlainThreads(threads));
      if (bad != -1) Fail("valid indices reported bad", seed, trial);
      if (threads == 1) {
        first = out;
      } else if (!out.empty() && std::memcmp(first.data(), out.data(),
                                             out.size() * sizeof(T)) != 0) {
        Fail("result depends on the thread count", seed, trial);
      }
    }
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t j = 0; j < row_size; ++j) {
        const size_t at = r * row_size + j;
        if (hits[r] == 0) {
          if (std::memcmp(&first[at], &var[at], sizeof(T)) != 0) {
            Fail("untouched row changed", seed, trial);
          }
          continue;
        }
        const double bound = 4 * Epsilon<T>() * (hits[r] + 1) *
                             (std::fabs(ToDouble(var[at])) + hits[r]);
        if (std::fabs(ToDouble(first[at]) - expected[at]) > bound) {
          Fail("value differs from the reference", seed, trial);
        }
      }
    }
  }
}

template <typename Index>
void BadIndices(std::mt19937_64& rng, uint64_t seed) {
  const int64_t num_rows = 5, row_size = 3;
  std::vector<float> var(num_rows * row_size, 1.0f);
  std::vector<float> updates(4 * row_size, 1.0f);
  bool mask[num_rows] = {false, false, false, false, false};
  const Index bad_values[] = {
      static_cast<Index>(num_rows), static_cast<Index>(-1),
      std::numeric_limits<Index>::max(), std::numeric_limits<Index>::min()};
  for (int trial = 0; trial < 8; ++trial) {
    const int position = static_cast<int>(rng() % 4);
    std::vector<Index> indices = {0, 1, 2, 3};
    indices[position] = bad_values[trial % 4];
    if (trial % 2) indices[3] = bad_values[(trial + 1) % 4];  // two bad
    const int expected_position = trial % 2 ? std::min(position, 3) : position;
    std::vector<float> out = var;
    mask[trial % num_rows] = true;
    const int64_t bad =
        pe::MaskedScatterSubCpu(out.data(), num_rows, row_size, indices.data(),
                                4, updates.data(), mask, pe::PlainThreads(2));
    if (bad != expected_position) Fail("wrong bad position", seed, trial);
    if (out != var) Fail("written despite a bad index", seed, trial);
  }
}

void SixteenBitConversions() {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const pe::Float16 half{static_cast<uint16_t>(bits)};
    const float wide = pe::ToFloat(half);
    if (!std::isnan(wide) && pe::ToFloat16(wide).bits != half.bits) {
      Fail("float16 round trip", bits, 0);
    }
    const pe::BFloat16 brain{static_cast<uint16_t>(bits)};
    const float brain_wide = pe::ToFloat(brain);
    if (!std::isnan(brain_wide) &&
        pe::ToBFloat16(brain_wide).bits != brain.bits) {
      Fail("bfloat16 round trip", bits, 0);
    }
    if (std::isnan(wide) != std::isnan(pe::ToFloat(pe::ToFloat16(wide)))) {
      Fail("float16 NaN lost", bits, 0);
    }
  }
  // Ties round to even; overflow goes to infinity.
  if (pe::ToFloat16(65520.0f).bits != 0x7c00u) Fail("float16 overflow", 0, 0);
  if (pe::ToFloat16(65504.0f).bits != 0x7bffu) Fail("float16 max", 0, 0);
  if (pe::ToFloat16(1.0f + std::ldexp(1.0f, -11)).bits != 0x3c00u) {
    Fail("float16 tie to even", 0, 0);
  }
  if (pe::ToFloat16(std::ldexp(1.0f, -25)).bits != 0)
    Fail("float16 tiny", 0, 0);
}

}  // namespace

int main() {
  const uint64_t seed = std::random_device{}();
  std::printf("core_test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const int trials = 40;
  RandomCases<pe::Float16, int32_t>(rng, seed, trials);
  RandomCases<pe::Float16, int64_t>(rng, seed, trials);
  RandomCases<pe::BFloat16, int32_t>(rng, seed, trials);
  RandomCases<pe::BFloat16, int64_t>(rng, seed, trials);
  RandomCases<float, int32_t>(rng, seed, trials);
  RandomCases<float, int64_t>(rng, seed, trials);
  RandomCases<double, int32_t>(rng, seed, trials);
  RandomCases<double, int64_t>(rng, seed, trials);
  BadIndices<int32_t>(rng, seed);
  BadIndices<int64_t>(rng, seed);
  SixteenBitConversions();
  if (failures) {
    std::printf("core_test: %d failures\n", failures);
    return 1;
  }
  std::printf("core_test: all checks passed\n");
  return 0;
}
