// Standalone tests of the TF-free CPU core, meant to run under AddressSanitizer
// and UndefinedBehaviorSanitizer (build_tools/sanitize.sh). No test framework:
// each check prints what failed and the run exits non-zero.
//
// The seed is fixed (0) unless PE_TEST_SEED says otherwise (an integer, or
// "random"), as for the Python tests; it is printed at the start.
//
// MaskedScatterSubCpu, on every dtype x index type:
//  - against a double-precision reference, with heavy duplicates; frozen and
//    untouched rows compared bit for bit;
//  - the same bits for 1..4 plain threads and for parallel-fors that run the
//    shards in one call or in reverse order, on updates large enough to be
//    split into several shards;
//  - out-of-range and negative indices reported at their first position with
//    nothing written;
//  - empty inputs, one row, rows of width one and zero.
// MaskedSparseApplyRuleCpu with the Adam rules (Adam, AdamW, AMSGrad), on
// every dtype x index type: bit for bit against a plain per-element reference
// that rounds the same way, with duplicates and frozen rows, for every
// parallel-for above; a bad index reported with no table written. The same with
// compact slots (a slot map): var and every mapped slot row bit for bit equal
// to full-size slots, other slot rows untouched; each refused slot map (out of
// range, one row with two slot rows, two rows sharing one) reported at its
// positions with nothing written. GroupPermittedRows: every permitted position
// in exactly one group, groups in order of first occurrence, with enough
// distinct rows to collide in the hash table. Huge pages (huge_pages.cc): the
// environment switch, the 2 MiB-aligned interior, the bookkeeping, and advising
// a buffer in place: contents kept, and where the kernel collapsed it, smaps
// shows huge pages. Float16 / BFloat16 conversions on every 16-bit pattern.
// EmbeddingBagCpu and the bag gradient (EmbeddingBagGradValuesCpu), on every
// dtype x index type: sum / mean / sqrtn with and without weights, sorted and
// unsorted bags, empty bags, pruned (negative) ids, duplicates within and
// across bags, frozen rows, against a double-precision reference within the
// rounding bound of the sums; the same bits for every parallel-for; rows in
// order of first occurrence; an id >= V reported with its bag and place, with
// nothing written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cc/core/embedding_bag.h"
#include "cc/core/embedding_bag_contract.h"
#include "cc/core/huge_pages.h"
#include "cc/core/masked_scatter_sub.h"
#include "cc/core/masked_sparse_apply.h"
#include "cc/core/parallel_for.h"
#include "cc/core/row_rules.h"
#include "cc/core/row_update_common.h"
#include "cc/core/row_update_contract.h"

namespace pe = partial_embedding;

namespace {

int failures = 0;

void Fail(const std::string& what, uint64_t seed, int trial) {
  std::fprintf(stderr, "FAIL: %s (seed %llu, trial %d)\n", what.c_str(),
               static_cast<unsigned long long>(seed), trial);
  ++failures;
}

uint64_t SeedFromEnvironment() {
  const char* setting = std::getenv("PE_TEST_SEED");
  if (setting == nullptr || *setting == '\0') return 0;
  if (std::string(setting) == "random") return std::random_device{}();
  return std::strtoull(setting, nullptr, 10);
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
bool BitsEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <typename T>
bool BitsEqual(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
double Epsilon() {
  if (std::is_same<T, pe::Float16>::value) return std::ldexp(1.0, -11);
  if (std::is_same<T, pe::BFloat16>::value) return std::ldexp(1.0, -8);
  if (std::is_same<T, float>::value) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, -53);
}

// The ways a driver may be run: plain threads 1..4, and two parallel-fors
// that group the shards differently (all in one call; one by one in reverse).
// Each records the most shards it was asked for.
struct Runner {
  const char* name;
  pe::CpuParallelism parallelism;
};

int64_t most_shards_seen = 1;

std::vector<Runner> Runners() {
  std::vector<Runner> runners;
  for (int threads = 1; threads <= 4; ++threads) {
    pe::CpuParallelism plain = pe::PlainThreads(threads);
    pe::ParallelFor inner = plain.parallel_for;
    plain.parallel_for = [inner](int64_t n, const pe::ShardRange& run) {
      most_shards_seen = std::max(most_shards_seen, n);
      inner(n, run);
    };
    runners.push_back({"plain threads", plain});
  }
  pe::CpuParallelism one_call;
  one_call.max_threads = 4;
  one_call.parallel_for = [](int64_t n, const pe::ShardRange& run) {
    run(0, n);
  };
  runners.push_back({"one call", one_call});
  pe::CpuParallelism reversed;
  reversed.max_threads = 3;
  reversed.parallel_for = [](int64_t n, const pe::ShardRange& run) {
    for (int64_t shard = n - 1; shard >= 0; --shard) run(shard, shard + 1);
  };
  runners.push_back({"reversed", reversed});
  return runners;
}

struct Sizes {
  int64_t num_rows;
  int64_t row_size;
  int64_t num_indices;
};

// Small random sizes (row_size 0 allowed), or, when `large`, an update big
// enough for RecommendedShards to split it four ways.
Sizes RandomSizes(std::mt19937_64& rng, bool large) {
  if (large) return {2000 + static_cast<int64_t>(rng() % 64), 16, 20000};
  return {1 + static_cast<int64_t>(rng() % 64), static_cast<int64_t>(rng() % 9),
          static_cast<int64_t>(rng() % 3000)};
}

// Indices over [0, num_rows), three in four of them on a few hot rows.
template <typename Index>
std::vector<Index> RandomIndices(std::mt19937_64& rng, const Sizes& sizes) {
  const int64_t hot = std::min<int64_t>(sizes.num_rows, 1 + rng() % 4);
  std::vector<Index> indices(sizes.num_indices);
  for (auto& index : indices) {
    index = static_cast<Index>((rng() % 4 != 0) ? rng() % hot
                                                : rng() % sizes.num_rows);
  }
  return indices;
}

std::unique_ptr<bool[]> RandomMask(std::mt19937_64& rng, int64_t num_rows) {
  std::unique_ptr<bool[]> mask(new bool[num_rows]);
  for (int64_t r = 0; r < num_rows; ++r) mask[r] = rng() % 2;
  return mask;
}

template <typename T>
std::vector<T> RandomValues(std::mt19937_64& rng, int64_t count, double low,
                            double high) {
  std::uniform_real_distribution<double> value(low, high);
  std::vector<T> values(count);
  for (auto& x : values) x = FromDouble<T>(value(rng));
  return values;
}

// ---------------------------------------------------------------------------
// MaskedScatterSubCpu

template <typename T, typename Index>
void ScatterRandomCases(std::mt19937_64& rng, uint64_t seed, int trials,
                        bool large) {
  for (int trial = 0; trial < trials; ++trial) {
    const Sizes sizes = RandomSizes(rng, large);
    const int64_t num_rows = sizes.num_rows, row_size = sizes.row_size;
    const int64_t num_indices = sizes.num_indices;
    const std::vector<Index> indices = RandomIndices<Index>(rng, sizes);
    const std::unique_ptr<bool[]> mask = RandomMask(rng, num_rows);
    const std::vector<T> var = RandomValues<T>(rng, num_rows * row_size, -2, 2);
    const std::vector<T> updates =
        RandomValues<T>(rng, num_indices * row_size, -0.5, 0.5);

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
    for (const Runner& runner : Runners()) {
      std::vector<T> out = var;
      const int64_t bad = pe::MaskedScatterSubCpu(
          out.data(), num_rows, row_size, indices.data(), num_indices,
          updates.data(), mask.get(), runner.parallelism);
      const std::string where = std::string(" (") + runner.name + ")";
      if (bad != -1) {
        Fail("scatter: valid indices reported bad" + where, seed, trial);
      }
      if (first.empty()) {
        first = out;
      } else if (!BitsEqual(first, out)) {
        Fail("scatter: result depends on the threads" + where, seed, trial);
      }
    }
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t j = 0; j < row_size; ++j) {
        const size_t at = r * row_size + j;
        if (hits[r] == 0) {
          if (!BitsEqual(first[at], var[at])) {
            Fail("scatter: frozen or untouched row changed", seed, trial);
          }
          continue;
        }
        const double bound = 4 * Epsilon<T>() * (hits[r] + 1) *
                             (std::fabs(ToDouble(var[at])) + hits[r]);
        if (std::fabs(ToDouble(first[at]) - expected[at]) > bound) {
          Fail("scatter: value differs from the reference", seed, trial);
        }
      }
    }
  }
}

// Bad index values for Index, first valid-looking then extreme.
// Four in-range indices with one or two out of range; `first_bad` is where the
// first bad one stands, which the drivers must report (trial picks the values).
template <typename Index>
struct BadIndexTrial {
  std::vector<Index> indices;
  int first_bad;
};

template <typename Index>
BadIndexTrial<Index> MakeBadIndexTrial(std::mt19937_64& rng, int64_t num_rows,
                                       int trial) {
  const Index bad_values[4] = {
      static_cast<Index>(num_rows), static_cast<Index>(-1),
      std::numeric_limits<Index>::max(), std::numeric_limits<Index>::min()};
  BadIndexTrial<Index> result{{0, 1, 2, 3}, static_cast<int>(rng() % 4)};
  result.indices[result.first_bad] = bad_values[trial % 4];
  if (trial % 2) result.indices[3] = bad_values[(trial + 1) % 4];  // two bad
  return result;
}

template <typename Index>
void ScatterBadIndices(std::mt19937_64& rng, uint64_t seed) {
  const int64_t num_rows = 5, row_size = 3;
  std::vector<float> var(num_rows * row_size, 1.0f);
  std::vector<float> updates(4 * row_size, 1.0f);
  bool mask[num_rows] = {false, false, false, false, false};
  for (int trial = 0; trial < 8; ++trial) {
    const auto [indices, position] =
        MakeBadIndexTrial<Index>(rng, num_rows, trial);
    std::vector<float> out = var;
    mask[trial % num_rows] = true;
    const int64_t bad =
        pe::MaskedScatterSubCpu(out.data(), num_rows, row_size, indices.data(),
                                4, updates.data(), mask, pe::PlainThreads(2));
    if (bad != position) Fail("scatter: wrong bad position", seed, trial);
    if (out != var) Fail("scatter: written despite a bad index", seed, trial);
  }
}

// ---------------------------------------------------------------------------
// MaskedSparseApplyRuleCpu with the Adam rules

pe::Rule AdamRule(bool amsgrad) {
  return amsgrad ? pe::Rule::kAmsgrad : pe::Rule::kAdam;
}

// Adam's hyperparameters in the table's order (row_rules.h).
enum AdamHyperparameter {
  kLearningRate,
  kWeightDecay,
  kOneMinusBeta1,
  kOneMinusBeta2,
  kEpsilon,
  kAlpha,
};

template <typename T>
struct AdamState {
  std::vector<T> var, m, v, v_hat;
  pe::RuleTables<T> Tables(int64_t num_rows, int64_t row_size, bool amsgrad) {
    pe::RuleTables<T> tables;
    tables.var = var.data();
    tables.slots[0] = m.data();
    tables.slots[1] = v.data();
    tables.slots[2] = amsgrad ? v_hat.data() : nullptr;
    tables.num_rows = num_rows;
    tables.row_size = row_size;
    return tables;
  }
  bool operator==(const AdamState& other) const {
    return BitsEqual(var, other.var) && BitsEqual(m, other.m) &&
           BitsEqual(v, other.v) && BitsEqual(v_hat, other.v_hat);
  }
};

// The step written the plain way: rows grouped with a std::map, one element
// at a time, every operation rounded to T in the order the header documents.
template <typename T, typename Index>
void ReferenceAdam(AdamState<T>* state, int64_t row_size, bool amsgrad,
                   const std::vector<Index>& indices,
                   const std::vector<T>& grad, const bool* mask,
                   const pe::RuleHyperparameters<T>& hyper) {
  using A = pe::Arith<T>;
  using C = typename A::Compute;
  auto round = [](C x) { return A::Load(A::Store(x)); };
  std::map<int64_t, std::vector<size_t>> positions_of_row;
  for (size_t i = 0; i < indices.size(); ++i) {
    if (mask[indices[i]]) positions_of_row[indices[i]].push_back(i);
  }
  const C lr = A::Load(hyper.values[kLearningRate]);
  const C b1 = A::Load(hyper.values[kOneMinusBeta1]);
  const C b2 = A::Load(hyper.values[kOneMinusBeta2]);
  const C eps = A::Load(hyper.values[kEpsilon]);
  const C alpha = A::Load(hyper.values[kAlpha]);
  const C decay = A::Load(hyper.values[kWeightDecay]);
  for (const auto& [row, positions] : positions_of_row) {
    for (int64_t j = 0; j < row_size; ++j) {
      const size_t at = row * row_size + j;
      C g = 0;
      for (size_t p : positions) g = round(g + A::Load(grad[p * row_size + j]));
      C x = A::Load(state->var[at]);
      if (decay != C(0)) x = round(x - round(round(x * decay) * lr));
      const C m = A::Load(state->m[at]);
      const C v = A::Load(state->v[at]);
      const C m_new = round(m + round(round(g - m) * b1));
      const C v_new = round(v + round(round(round(g * g) - v) * b2));
      C v_used = v_new;
      if (amsgrad) {
        const C v_hat = A::Load(state->v_hat[at]);
        v_used = std::isnan(v_hat)   ? v_hat
                 : std::isnan(v_new) ? v_new
                                     : std::max(v_hat, v_new);
        state->v_hat[at] = A::Store(v_used);
      }
      const C step =
          round(round(m_new * alpha) / round(round(std::sqrt(v_used)) + eps));
      state->m[at] = A::Store(m_new);
      state->v[at] = A::Store(v_new);
      state->var[at] = A::Store(x - step);
    }
  }
}

template <typename T>
pe::RuleHyperparameters<T> Hyperparameters(bool weight_decay) {
  pe::RuleHyperparameters<T> hyper{};
  hyper.values[kLearningRate] = FromDouble<T>(0.01);
  hyper.values[kWeightDecay] = FromDouble<T>(weight_decay ? 0.004 : 0.0);
  hyper.values[kOneMinusBeta1] = FromDouble<T>(0.1);
  hyper.values[kOneMinusBeta2] = FromDouble<T>(0.001);
  hyper.values[kEpsilon] = FromDouble<T>(1e-3);
  hyper.values[kAlpha] = FromDouble<T>(0.05);
  return hyper;
}

template <typename T, typename Index>
void AdamRandomCases(std::mt19937_64& rng, uint64_t seed, int trials,
                     bool large) {
  for (int trial = 0; trial < trials; ++trial) {
    const bool amsgrad = trial % 2 == 1;
    const bool weight_decay = trial % 4 >= 2;
    Sizes sizes = RandomSizes(rng, large);
    if (!large) sizes.num_indices %= 300;
    const int64_t num_rows = sizes.num_rows, row_size = sizes.row_size;
    const int64_t size = num_rows * row_size;
    const std::vector<Index> indices = RandomIndices<Index>(rng, sizes);
    const std::unique_ptr<bool[]> mask = RandomMask(rng, num_rows);
    const std::vector<T> grad =
        RandomValues<T>(rng, sizes.num_indices * row_size, -1, 1);
    AdamState<T> before;
    before.var = RandomValues<T>(rng, size, -2, 2);
    before.m = RandomValues<T>(rng, size, -0.5, 0.5);
    before.v = RandomValues<T>(rng, size, 0, 1);
    before.v_hat = RandomValues<T>(rng, size, 0, 1);
    const pe::RuleHyperparameters<T> hyper = Hyperparameters<T>(weight_decay);

    AdamState<T> expected = before;
    ReferenceAdam(&expected, row_size, amsgrad, indices, grad, mask.get(),
                  hyper);
    std::vector<bool> written(num_rows, false);
    for (Index index : indices) written[index] = written[index] || mask[index];
    for (const Runner& runner : Runners()) {
      AdamState<T> out = before;
      const pe::RuleInputError error = pe::MaskedSparseApplyRuleCpu(
          AdamRule(amsgrad), out.Tables(num_rows, row_size, amsgrad),
          indices.data(), sizes.num_indices, pe::SlotMap<Index>{}, grad.data(),
          mask.get(), hyper, runner.parallelism);
      const std::string where = std::string(" (") + runner.name + ")";
      if (!error.ok())
        Fail("adam: valid indices reported bad" + where, seed, trial);
      if (!(out == expected)) {
        Fail("adam: differs from the reference" + where, seed, trial);
      }
      if (!amsgrad && !BitsEqual(out.v_hat, before.v_hat)) {
        Fail("adam: v_hat written without amsgrad" + where, seed, trial);
      }
      for (int64_t at = 0; at < size; ++at) {
        if (written[at / std::max<int64_t>(row_size, 1)]) continue;
        if (!BitsEqual(out.var[at], before.var[at]) ||
            !BitsEqual(out.m[at], before.m[at]) ||
            !BitsEqual(out.v[at], before.v[at]) ||
            !BitsEqual(out.v_hat[at], before.v_hat[at])) {
          Fail("adam: frozen or absent row changed" + where, seed, trial);
          break;
        }
      }
    }
  }
}

template <typename Index>
void AdamBadIndices(std::mt19937_64& rng, uint64_t seed) {
  const int64_t num_rows = 5, row_size = 3;
  std::unique_ptr<bool[]> mask(new bool[num_rows]);
  for (int64_t r = 0; r < num_rows; ++r) mask[r] = true;
  const std::vector<float> grad(4 * row_size, 0.5f);
  for (int trial = 0; trial < 8; ++trial) {
    const auto [indices, position] =
        MakeBadIndexTrial<Index>(rng, num_rows, trial);
    AdamState<float> before;
    before.var = RandomValues<float>(rng, num_rows * row_size, -1, 1);
    before.m = before.var;
    before.v = RandomValues<float>(rng, num_rows * row_size, 0, 1);
    before.v_hat = before.v;
    AdamState<float> out = before;
    const pe::RuleInputError error = pe::MaskedSparseApplyRuleCpu(
        pe::Rule::kAmsgrad, out.Tables(num_rows, row_size, /*amsgrad=*/true),
        indices.data(), 4, pe::SlotMap<Index>{}, grad.data(), mask.get(),
        Hyperparameters<float>(true), pe::PlainThreads(2));
    if (error.kind != pe::RuleInputError::Kind::kIndexOutOfRange ||
        error.position != position) {
      Fail("adam: wrong bad position", seed, trial);
    }
    if (!(out == before))
      Fail("adam: written despite a bad index", seed, trial);
  }
}

// Compact slots: the same step with m, v, v_hat of S rows and a slot map
// gives var the same bits as full-size slots, and each slot row the bits of
// the full-size row it stands for. The map is a random injection of the
// permitted rows in the batch into [0, S), S larger than needed; frozen
// occurrences name random slot rows (a scratch row, or one a permitted row
// uses: only their range is checked). Slot rows no permitted row names keep
// their bits.
template <typename T, typename Index>
void AdamSlotMapCases(std::mt19937_64& rng, uint64_t seed, int trials,
                      bool large) {
  for (int trial = 0; trial < trials; ++trial) {
    const bool amsgrad = trial % 2 == 1;
    const bool weight_decay = trial % 4 >= 2;
    Sizes sizes = RandomSizes(rng, large);
    if (!large) sizes.num_indices %= 300;
    const int64_t num_rows = sizes.num_rows, row_size = sizes.row_size;
    const int64_t size = num_rows * row_size;
    const std::vector<Index> indices = RandomIndices<Index>(rng, sizes);
    const std::unique_ptr<bool[]> mask = RandomMask(rng, num_rows);
    const std::vector<T> grad =
        RandomValues<T>(rng, sizes.num_indices * row_size, -1, 1);
    AdamState<T> full;
    full.var = RandomValues<T>(rng, size, -2, 2);
    full.m = RandomValues<T>(rng, size, -0.5, 0.5);
    full.v = RandomValues<T>(rng, size, 0, 1);
    full.v_hat = RandomValues<T>(rng, size, 0, 1);
    const pe::RuleHyperparameters<T> hyper = Hyperparameters<T>(weight_decay);

    // Slot rows: one per permitted row of the batch, in a random order,
    // among 1 + rng() % 5 extra rows; the last row is the scratch row.
    std::vector<int64_t> permitted_rows;
    std::vector<int64_t> slot_of_row(num_rows, -1);
    for (Index index : indices) {
      if (mask[index] && slot_of_row[index] < 0) {
        slot_of_row[index] = 0;
        permitted_rows.push_back(index);
      }
    }
    const int64_t num_slot_rows =
        static_cast<int64_t>(permitted_rows.size()) + 1 + rng() % 5;
    std::vector<int64_t> free_slot_rows(num_slot_rows - 1);
    for (int64_t s = 0; s < num_slot_rows - 1; ++s) free_slot_rows[s] = s;
    std::shuffle(free_slot_rows.begin(), free_slot_rows.end(), rng);
    for (size_t k = 0; k < permitted_rows.size(); ++k) {
      slot_of_row[permitted_rows[k]] = free_slot_rows[k];
    }
    std::vector<Index> slot_indices(indices.size());
    for (size_t k = 0; k < indices.size(); ++k) {
      slot_indices[k] = static_cast<Index>(
          mask[indices[k]] ? slot_of_row[indices[k]]
          : rng() % 2      ? num_slot_rows - 1
                           : static_cast<int64_t>(rng() % num_slot_rows));
    }
    const int64_t slot_size = num_slot_rows * row_size;
    AdamState<T> compact;
    compact.var = full.var;
    compact.m = RandomValues<T>(rng, slot_size, -0.5, 0.5);
    compact.v = RandomValues<T>(rng, slot_size, 0, 1);
    compact.v_hat = RandomValues<T>(rng, slot_size, 0, 1);
    for (int64_t row : permitted_rows) {
      for (int64_t j = 0; j < row_size; ++j) {
        const int64_t from = row * row_size + j;
        const int64_t to = slot_of_row[row] * row_size + j;
        compact.m[to] = full.m[from];
        compact.v[to] = full.v[from];
        compact.v_hat[to] = full.v_hat[from];
      }
    }

    AdamState<T> expected = full;
    pe::MaskedSparseApplyRuleCpu(
        AdamRule(amsgrad), expected.Tables(num_rows, row_size, amsgrad),
        indices.data(), sizes.num_indices, pe::SlotMap<Index>{}, grad.data(),
        mask.get(), hyper, pe::PlainThreads(1));
    const pe::SlotMap<Index> slot_map{slot_indices.data(), num_slot_rows};
    for (const Runner& runner : Runners()) {
      AdamState<T> out = compact;
      const pe::RuleInputError error = pe::MaskedSparseApplyRuleCpu(
          AdamRule(amsgrad), out.Tables(num_rows, row_size, amsgrad),
          indices.data(), sizes.num_indices, slot_map, grad.data(), mask.get(),
          hyper, runner.parallelism);
      const std::string where = std::string(" (") + runner.name + ")";
      if (!error.ok()) {
        Fail("adam slots: a valid slot map refused" + where, seed, trial);
        continue;
      }
      if (!BitsEqual(out.var, expected.var)) {
        Fail("adam slots: var differs from full-size slots" + where, seed,
             trial);
      }
      AdamState<T> want = compact;  // untouched slot rows keep their bits
      for (int64_t row : permitted_rows) {
        for (int64_t j = 0; j < row_size; ++j) {
          const int64_t from = row * row_size + j;
          const int64_t to = slot_of_row[row] * row_size + j;
          want.m[to] = expected.m[from];
          want.v[to] = expected.v[from];
          if (amsgrad) want.v_hat[to] = expected.v_hat[from];
        }
      }
      if (!BitsEqual(out.m, want.m) || !BitsEqual(out.v, want.v) ||
          !BitsEqual(out.v_hat, want.v_hat)) {
        Fail("adam slots: slot rows differ from full-size slots" + where, seed,
             trial);
      }
    }
  }
}

// Refused slot maps report the kind and the positions, and write nothing;
// frozen rows' slot indices are only range-checked.
template <typename Index>
void AdamSlotMapErrors(std::mt19937_64& rng, uint64_t seed) {
  using Kind = pe::RuleInputError::Kind;
  const int64_t num_rows = 6, row_size = 2, num_slot_rows = 4;
  const bool mask[num_rows] = {true, true, true, true, false, false};
  struct Case {
    const char* name;
    std::vector<Index> indices, slot_indices;
    Kind kind;
    int64_t position, earlier;
  };
  const std::vector<Case> cases = {
      {"slot index == S",
       {0, 1, 2},
       {0, 1, 4},
       Kind::kSlotIndexOutOfRange,
       2,
       -1},
      {"negative slot index",
       {0, 1, 2},
       {-1, 1, 2},
       Kind::kSlotIndexOutOfRange,
       0,
       -1},
      {"frozen row's slot index out of range",
       {4, 1},
       {7, 1},
       Kind::kSlotIndexOutOfRange,
       0,
       -1},
      {"row index checked first",
       {0, 9, 2},
       {5, 1, 2},
       Kind::kIndexOutOfRange,
       1,
       -1},
      {"one row, two slot rows",
       {0, 1, 2, 1, 0, 1},
       {0, 1, 2, 1, 0, 3},
       Kind::kRowInTwoSlotRows,
       5,
       1},
      {"lowest such position",
       {0, 1, 1, 0},
       {0, 1, 2, 3},
       Kind::kRowInTwoSlotRows,
       2,
       1},
      {"two rows, one slot row",
       {3, 0, 2, 0, 1},
       {1, 2, 3, 2, 3},
       Kind::kSlotRowOfTwoRows,
       4,
       2},
      {"valid: frozen rows share slot rows",
       {4, 0, 5, 1, 4},
       {1, 1, 1, 2, 3},
       Kind::kNone,
       -1,
       -1},
  };
  for (size_t trial = 0; trial < cases.size(); ++trial) {
    const Case& c = cases[trial];
    const int64_t num_indices = static_cast<int64_t>(c.indices.size());
    const std::vector<float> grad(num_indices * row_size, 0.5f);
    AdamState<float> before;
    before.var = RandomValues<float>(rng, num_rows * row_size, -1, 1);
    before.m = RandomValues<float>(rng, num_slot_rows * row_size, -1, 1);
    before.v = RandomValues<float>(rng, num_slot_rows * row_size, 0, 1);
    before.v_hat = RandomValues<float>(rng, num_slot_rows * row_size, 0, 1);
    AdamState<float> out = before;
    const pe::RuleInputError error = pe::MaskedSparseApplyRuleCpu(
        pe::Rule::kAmsgrad, out.Tables(num_rows, row_size, /*amsgrad=*/true),
        c.indices.data(), num_indices,
        pe::SlotMap<Index>{c.slot_indices.data(), num_slot_rows}, grad.data(),
        mask, Hyperparameters<float>(true), pe::PlainThreads(2));
    const std::string name = std::string("adam slot map: ") + c.name;
    if (error.kind != c.kind || error.position != c.position ||
        error.earlier != c.earlier) {
      Fail(name + ": wrong error", seed, static_cast<int>(trial));
    }
    if (c.kind != Kind::kNone && !(out == before)) {
      Fail(name + ": written despite the error", seed, static_cast<int>(trial));
    }
    if (c.kind == Kind::kNone && BitsEqual(out.var, before.var)) {
      Fail(name + ": nothing written", seed, static_cast<int>(trial));
    }
  }
}

// Structure of the groups, on many distinct rows (the hash table probes) and
// many duplicates, with about half the rows frozen.
template <typename Index>
void GroupingCases(std::mt19937_64& rng, uint64_t seed) {
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t num_rows = int64_t{1} << (4 + 3 * trial);  // 16 .. 512K
    const int64_t num_indices = 1 + static_cast<int64_t>(rng() % 5000);
    std::vector<Index> indices(num_indices);
    for (auto& index : indices) {
      // Some rows a multiple of a large power of two, to share hash bits.
      const int64_t row = rng() % 3 == 0
                              ? (rng() % 8) * (num_rows / 8)
                              : static_cast<int64_t>(rng() % num_rows);
      index = static_cast<Index>(row);
    }
    const std::unique_ptr<bool[]> mask = RandomMask(rng, num_rows);
    pe::RowGroups groups;
    pe::GroupPermittedRows(indices.data(), num_indices, mask.get(), &groups);

    std::vector<int64_t> first_seen;  // permitted rows by first occurrence
    std::map<int64_t, std::vector<int64_t>> positions_of_row;
    for (int64_t i = 0; i < num_indices; ++i) {
      const int64_t row = indices[i];
      if (!mask[row]) continue;
      if (positions_of_row[row].empty()) first_seen.push_back(row);
      positions_of_row[row].push_back(i);
    }
    if (groups.rows != first_seen) {
      Fail("grouping: rows not in order of first occurrence", seed, trial);
      continue;
    }
    if (groups.starts.size() != groups.rows.size() + 1 ||
        groups.starts.front() != 0 ||
        groups.starts.back() != static_cast<int64_t>(groups.positions.size())) {
      Fail("grouping: starts do not delimit the positions", seed, trial);
      continue;
    }
    for (int64_t g = 0; g < groups.num_groups(); ++g) {
      const std::vector<int64_t> positions(
          groups.positions.begin() + groups.starts[g],
          groups.positions.begin() + groups.starts[g + 1]);
      if (positions != positions_of_row[groups.rows[g]]) {
        Fail("grouping: a group's positions are wrong", seed, trial);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Huge pages

// AnonHugePages (KiB) of the mappings in /proc/self/smaps that lie inside
// [begin, end); -1 where smaps cannot be read.
int64_t AnonHugeKibInside(uintptr_t begin, uintptr_t end) {
  std::FILE* smaps = std::fopen("/proc/self/smaps", "r");
  if (smaps == nullptr) return -1;
  int64_t total = 0;
  bool inside = false;
  char line[512];
  while (std::fgets(line, sizeof(line), smaps) != nullptr) {
    unsigned long long low = 0, high = 0;
    long long kib = 0;
    if (std::sscanf(line, "%llx-%llx ", &low, &high) == 2) {
      inside = low >= begin && high <= end;
    } else if (inside && std::sscanf(line, "AnonHugePages: %lld", &kib) == 1) {
      total += kib;
    }
  }
  std::fclose(smaps);
  return total;
}

void HugePages() {
  // The environment switch is read at every call.
  setenv("PARTIAL_EMBEDDING_HUGE_PAGES", "0", 1);
  if (pe::HugePagesEnabled()) Fail("huge pages: not off with =0", 0, 0);
  unsetenv("PARTIAL_EMBEDDING_HUGE_PAGES");

  // The interior: whole huge pages only, inside the buffer.
  constexpr uintptr_t kHuge = static_cast<uintptr_t>(pe::kHugePageBytes);
  struct InteriorCase {
    uintptr_t start;
    int64_t bytes;
    uintptr_t begin, end;  // expected; begin == end: empty
  };
  const InteriorCase interior_cases[] = {
      {kHuge * 8, 3 * pe::kHugePageBytes, kHuge * 8, kHuge * 11},
      {kHuge * 8 + 64, 3 * pe::kHugePageBytes, kHuge * 9, kHuge * 11},
      {kHuge * 8 + 64, 3 * pe::kHugePageBytes - 64, kHuge * 9, kHuge * 11},
      {kHuge * 8 + 64, 3 * pe::kHugePageBytes - 65, kHuge * 9, kHuge * 10},
      {kHuge * 8 + 64, 2 * pe::kHugePageBytes - 64, kHuge * 9, kHuge * 10},
      {kHuge * 8 + 64, 2 * pe::kHugePageBytes - 65, 0, 0},
      {kHuge * 8, pe::kHugePageBytes - 1, 0, 0},
      {kHuge * 8, 0, 0, 0},
      {kHuge * 8, -5, 0, 0},
      {0, 4 * pe::kHugePageBytes, 0, 0},
      {~uintptr_t{0} - kHuge, 4 * pe::kHugePageBytes, 0, 0},
  };
  for (const InteriorCase& c : interior_cases) {
    const pe::HugePageInterior interior =
        pe::InteriorHugePages(reinterpret_cast<const void*>(c.start), c.bytes);
    if (interior.begin != c.begin || interior.end != c.end) {
      Fail("huge pages: interior of [" + std::to_string(c.start) + ", +" +
               std::to_string(c.bytes) + ")",
           0, 0);
    }
  }

  // Bookkeeping: counted records, by address.
  int first = 0, second = 0;
  if (pe::IsAdvisedBuffer(&first)) Fail("huge pages: stray record", 0, 0);
  pe::RecordAdvisedBuffer(&first);
  pe::RecordAdvisedBuffer(&first);
  pe::RecordAdvisedBuffer(&second);
  if (!pe::IsAdvisedBuffer(&first) || !pe::IsAdvisedBuffer(&second)) {
    Fail("huge pages: not recorded", 0, 0);
  }
  pe::ForgetAdvisedBuffer(&first);
  if (!pe::IsAdvisedBuffer(&first)) Fail("huge pages: one of two forgot", 0, 0);
  pe::ForgetAdvisedBuffer(&first);
  pe::ForgetAdvisedBuffer(&second);
  pe::ForgetAdvisedBuffer(&second);  // Forgetting too often does no harm.
  if (pe::IsAdvisedBuffer(&first) || pe::IsAdvisedBuffer(&second)) {
    Fail("huge pages: still recorded", 0, 0);
  }

  // Nothing to advise: no whole huge page.
  std::vector<unsigned char> small(pe::kHugePageBytes, 0x5a);
  if (pe::AdviseHugePagesInPlace(small.data() + 1, pe::kHugePageBytes - 1) !=
          pe::HugePageAdvice::kNone ||
      pe::AdviseHugePagesInPlace(nullptr, 8 * pe::kHugePageBytes) !=
          pe::HugePageAdvice::kNone) {
    Fail("huge pages: advised a buffer without a whole huge page", 0, 0);
  }

  // In place: the contents stay, head and tail included, and where the
  // kernel collapsed the interior, smaps shows it on huge pages. A buffer
  // that starts off the huge-page grid, as an allocator's would.
  const bool enabled = pe::HugePagesEnabled();
  const int64_t bytes = 6 * pe::kHugePageBytes + 12345;
  std::vector<unsigned char> table(bytes + 2 * pe::kHugePageBytes);
  unsigned char* start = table.data() + pe::kHugePageBytes / 2 + 96;
  std::mt19937_64 fill(7);
  for (int64_t i = 0; i < bytes; ++i) start[i] = static_cast<uint8_t>(fill());
  const std::vector<unsigned char> expected(start, start + bytes);
  const pe::HugePageAdvice advice = pe::AdviseHugePagesInPlace(start, bytes);
  if (!std::equal(expected.begin(), expected.end(), start)) {
    Fail("huge pages: advising changed the contents", 0, 0);
  }
#if defined(__linux__)
  if (advice == pe::HugePageAdvice::kNone && enabled &&
      pe::HugePagesEnabled()) {
    Fail("huge pages: nothing advised yet still enabled", 0, 0);
  }
  if (advice == pe::HugePageAdvice::kCollapsed) {
    const pe::HugePageInterior interior = pe::InteriorHugePages(start, bytes);
    const int64_t huge_kib = AnonHugeKibInside(interior.begin, interior.end);
    if (huge_kib >= 0 && huge_kib < interior.bytes() / 1024) {
      Fail("huge pages: collapsed, yet smaps shows " +
               std::to_string(huge_kib) + " KiB of huge pages in " +
               std::to_string(interior.bytes() / 1024) + " KiB",
           0, 0);
    }
  }
  if (advice == pe::HugePageAdvice::kCollapsed && pe::CollapseUnavailable()) {
    Fail("huge pages: collapsed without MADV_COLLAPSE", 0, 0);
  }
#else
  if (advice != pe::HugePageAdvice::kNone) Fail("huge pages: off Linux", 0, 0);
#endif
  std::printf("huge pages: in-place advice %s\n",
              advice == pe::HugePageAdvice::kCollapsed ? "collapsed"
              : advice == pe::HugePageAdvice::kAdvised
                  ? "advised, not collapsed"
                  : "not given");
  // Writes after the collapse land where they did before.
  start[0] ^= 0xff;
  start[bytes - 1] ^= 0xff;
  start[bytes / 2] ^= 0xff;
  if (start[0] != (expected[0] ^ 0xff) ||
      start[bytes - 1] != (expected[bytes - 1] ^ 0xff) ||
      start[bytes / 2] != (expected[bytes / 2] ^ 0xff)) {
    Fail("huge pages: a write after the advice went astray", 0, 0);
  }
}

// ---------------------------------------------------------------------------
// 16-bit conversions

// The row-update shape contract: each violation named with the shapes in
// either notation, and a valid problem passes.
void RowUpdateContract() {
  using pe::ShapeNotation;
  const auto check = [](const pe::RowUpdateShapes& shapes,
                        ShapeNotation notation, const std::string& expected) {
    const std::string got = pe::CheckRowUpdateShapes(shapes, notation);
    if (got != expected) Fail("row-update contract: got '" + got + "'", 0, 0);
  };
  check({{5, 3}, {5}, {2, 4}, {2, 4, 3}, "var", "updates"},
        ShapeNotation::kTensorFlow, "");
  check({{5}, {5}, {}, {}, "var", "updates"}, ShapeNotation::kNumPy, "");
  check({{}, {}, {}, {}, "resource", "updates"}, ShapeNotation::kTensorFlow,
        "resource: the variable must have rank >= 1, got shape []");
  check({{5, 3}, {4}, {2}, {2, 3}, "var", "grad"}, ShapeNotation::kTensorFlow,
        "row_mask: shape [4] must be [5] (one entry per row of the variable "
        "of shape [5,3])");
  check({{5, 3}, {5, 1}, {2}, {2, 3}, "var", "gradient"}, ShapeNotation::kNumPy,
        "row_mask: shape (5, 1) must be (5,) (one entry per row of the "
        "variable of shape (5, 3))");
  check({{5, 3}, {5}, {2}, {2, 4}, "variable", "updates"},
        ShapeNotation::kTensorFlow,
        "updates: shape [2,4] must be [2,3] (indices.shape + "
        "variable.shape[1:]) for indices of shape [2] and a variable of shape "
        "[5,3]");
  check({{5, 3}, {5}, {}, {1, 3}, "var", "updates"}, ShapeNotation::kNumPy,
        "updates: shape (1, 3) must be (3,) (indices.shape + var.shape[1:]) "
        "for indices of shape () and a variable of shape (5, 3)");
}

// The slot contract: full-size slots have var's shape; compact ones
// [S] + var.shape[1:], one S >= 1 for all; unknown dimensions match any; and
// slot_indices has indices' shape.
void SlotContract() {
  using pe::ShapeNotation;
  const int64_t unknown = pe::kUnknownDim;
  const auto check = [](const std::string& got, const std::string& expected) {
    if (got != expected) Fail("slot contract: got '" + got + "'", 0, 0);
  };
  const auto slots = [](const pe::Dims& m, const pe::Dims& v) {
    return std::vector<pe::SlotShape>{{"m", m}, {"v", v}};
  };
  const auto tf = ShapeNotation::kTensorFlow;
  check(pe::CheckSlotShapes({5, 3}, slots({5, 3}, {5, 3}), false, tf), "");
  check(pe::CheckSlotShapes({5, 3}, slots({5, 3}, {4, 3}), false,
                            ShapeNotation::kNumPy),
        "v: shape (4, 3) does not match var's shape (5, 3)");
  check(pe::CheckSlotShapes({5, 3}, slots({2, 3}, {2, 3}), true, tf), "");
  check(pe::CheckSlotShapes({unknown, 3}, slots({unknown, 3}, {2, unknown}),
                            true, tf),
        "");
  const std::string rule =
      " must be [S] + var.shape[1:] with one S >= 1 for all slots (var: ";
  check(pe::CheckSlotShapes({5, 3}, slots({2, 3}, {4, 3}), true, tf),
        "v: shape [4,3]" + rule + "[5,3], m: [2,3])");
  check(pe::CheckSlotShapes({5, 3}, slots({2, 4}, {2, 4}), true, tf),
        "m: shape [2,4]" + rule + "[5,3], m: [2,4])");
  check(pe::CheckSlotShapes({5, 3}, slots({0, 3}, {0, 3}), true, tf),
        "m: shape [0,3]" + rule + "[5,3], m: [0,3])");
  check(pe::CheckSlotShapes({5, 3}, slots({}, {2, 3}), true, tf),
        "m: shape []" + rule + "[5,3], m: [])");
  check(pe::CheckSlotShapes({5, 3}, slots({unknown, 3}, {2, 3, 1}), true, tf),
        "v: shape [2,3,1]" + rule + "[5,3], m: [?,3])");
  check(pe::CheckSlotIndicesShape({3}, {3}, tf), "");
  check(pe::CheckSlotIndicesShape({3}, {unknown}, tf), "");
  check(pe::CheckSlotIndicesShape({3}, {2}, ShapeNotation::kNumPy),
        "slot_indices: shape (2,) does not match indices' shape (3,)");
}

// The bag contract: each violation named once with the shapes, in either
// notation; unknown dimensions (a shape function's) match any size.
void BagContract() {
  using pe::ShapeNotation;
  const auto tf = ShapeNotation::kTensorFlow;
  const auto numpy = ShapeNotation::kNumPy;
  const int64_t unknown = pe::kUnknownDim;
  const auto check = [](const std::string& got, const std::string& expected) {
    if (got != expected) Fail("bag contract: got '" + got + "'", 0, 0);
  };
  const pe::BagPositionShapes three{{3}, {3}, pe::Dims{3}, "factors"};
  // The lookup: weights absent ([0] in the op) or [N]; num_bags >= 0.
  check(pe::CheckBagLookupShapes(
            {{5, 2}, {{3}, {3}, pe::OpWeights({0})}, {}, 4}, tf),
        "");
  check(pe::CheckBagLookupShapes(
            {{5, 2}, {{3}, {3}, pe::OpWeights({2})}, {}, 4}, tf),
        "ids, bags and weights: must be vectors with one entry per position, "
        "got shapes [3], [3] and [2]");
  check(pe::CheckBagLookupShapes(
            {{5, 2}, {{3}, {3, 1}, std::nullopt}, {}, std::nullopt}, numpy),
        "ids and bags: must be vectors with one entry per position, got "
        "shapes (3,) and (3, 1)");
  check(pe::CheckBagLookupShapes({{}, {{3}, {3}, std::nullopt}, {}, 4}, tf),
        "params: shape [] must be [V, ...] (rank >= 1)");
  check(pe::CheckBagLookupShapes({{5}, {{3}, {3}, std::nullopt}, {2}, 4}, tf),
        "num_bags: shape [2] must be a scalar");
  check(pe::CheckBagLookupShapes({{5}, {{3}, {3}, std::nullopt}, {}, -1}, tf),
        "num_bags: -1 must be >= 0");
  check(pe::CheckBagLookupShapes(
            {{unknown}, {{unknown}, {3}, pe::Dims{unknown}}, {}, std::nullopt},
            tf),
        "");
  // The gradient.
  check(pe::CheckBagGradShapes({{4, 2}, three, {5}}, tf), "");
  check(pe::CheckBagGradShapes({{}, three, {5}}, numpy),
        "grad: shape () must be [B, ...] (rank >= 1)");
  check(pe::CheckBagGradShapes({{4, 2}, three, {5, 1}}, tf),
        "row_mask: shape [5,1] must be [V] (rank 1)");
  // The fused step, full-size and compact slots.
  pe::BagAdamShapes adam{
      {5, 2}, {{"m", {5, 2}}, {"v", {5, 2}}}, {}, {}, {4, 2}, three, {5}};
  check(pe::CheckBagAdamShapes(adam, tf), "");
  adam.slots[1].dims = {3, 2};
  check(pe::CheckBagAdamShapes(adam, tf),
        "v: shape [3,2] does not match var's shape [5,2]");
  adam.slots[0].dims = {3, 2};
  adam.slot_of_row = pe::Dims{5};
  adam.slot_rows_used = pe::Dims{};
  check(pe::CheckBagAdamShapes(adam, tf), "");
  adam.slot_of_row = pe::Dims{4};
  check(pe::CheckBagAdamShapes(adam, numpy),
        "slot_of_row: shape (4,) must be (5,) (one entry per row of var)");
  adam.slot_of_row = pe::Dims{5};
  adam.slot_rows_used = pe::Dims{1};
  check(pe::CheckBagAdamShapes(adam, tf),
        "slot_rows_used: shape [1] must be a scalar");
  adam.slot_rows_used = pe::Dims{};
  adam.grad = {4, 3};
  check(pe::CheckBagAdamShapes(adam, tf),
        "grad: shape [4,3] must be [B] + [2] (var.shape[1:])");
  adam.grad = {unknown, unknown};
  adam.row_mask = {4};
  check(pe::CheckBagAdamShapes(adam, tf),
        "row_mask: shape [4] must be [5] (one entry per row of var)");
  adam.var = {unknown, 2};
  check(pe::CheckBagAdamShapes(adam, tf), "");
  adam.positions.bags = {2};
  check(pe::CheckBagAdamShapes(adam, tf),
        "ids, bags and factors: must be vectors with one entry per position, "
        "got shapes [3], [2] and [3]");
  adam.var = {};
  check(pe::CheckBagAdamShapes(adam, tf),
        "var: shape [] must be [V, ...] (rank >= 1)");
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
  if (pe::ToFloat16(std::ldexp(1.0f, -25)).bits != 0) {
    Fail("float16 tiny", 0, 0);
  }
}

// ---------------------------------------------------------------------------
// EmbeddingBagCpu and its gradient

// A random batch of bags: positive weights (the bound below needs no
// cancellation in the weight sums), about one id in eight pruned.
template <typename Index>
struct BagBatch {
  std::vector<Index> ids;
  std::vector<int64_t> bags;
  std::vector<double> weights;
  int64_t num_bags = 0;
};

template <typename Index>
BagBatch<Index> RandomBagBatch(std::mt19937_64& rng, int64_t num_rows,
                               bool sorted) {
  BagBatch<Index> batch;
  batch.num_bags = 1 + static_cast<int64_t>(rng() % 12);
  for (int64_t bag = 0; bag < batch.num_bags; ++bag) {
    const int64_t length = static_cast<int64_t>(rng() % 7);  // Empty bags too.
    for (int64_t k = 0; k < length; ++k) {
      const int64_t id = rng() % 8 == 0
                             ? -1 - static_cast<int64_t>(rng() % 3)
                             : static_cast<int64_t>(rng() % num_rows);
      batch.ids.push_back(static_cast<Index>(id));
      batch.bags.push_back(bag);
      batch.weights.push_back(0.25 + (rng() % 1000) / 400.0);
    }
  }
  if (!sorted) {
    for (size_t i = batch.bags.size(); i > 1; --i) {
      const size_t j = rng() % i;
      std::swap(batch.ids[i - 1], batch.ids[j]);
      std::swap(batch.bags[i - 1], batch.bags[j]);
      std::swap(batch.weights[i - 1], batch.weights[j]);
    }
  }
  return batch;
}

// The exact factor of each position (0 for pruned ones) in double.
template <typename Index>
std::vector<double> ReferenceFactors(const BagBatch<Index>& batch,
                                     bool weighted, pe::BagCombiner combiner) {
  const size_t n = batch.ids.size();
  std::vector<double> sums(batch.num_bags, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (batch.ids[i] < 0) continue;
    const double w = weighted ? batch.weights[i] : 1.0;
    sums[batch.bags[i]] += combiner == pe::BagCombiner::kSqrtN ? w * w : w;
  }
  std::vector<double> factors(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (batch.ids[i] < 0) continue;
    const double w = weighted ? batch.weights[i] : 1.0;
    const double sum = sums[batch.bags[i]];
    factors[i] = combiner == pe::BagCombiner::kSum    ? w
                 : combiner == pe::BagCombiner::kMean ? w / sum
                                                      : w / std::sqrt(sum);
  }
  return factors;
}

// Whether `got` is within the rounding bound of a sum of k terms whose
// magnitudes add up to `magnitude`: the factors (a sum of k weights, a
// division or square root, a product) and the k products and additions each
// round once in the compute type, the result once more in T.
template <typename T>
bool WithinBagBound(double got, double exact, double magnitude, int64_t k) {
  const double compute = std::is_same<T, double>::value ? std::ldexp(1.0, -53)
                                                        : std::ldexp(1.0, -24);
  const double bound = (2.0 * k + 4.0) * compute * magnitude +
                       Epsilon<T>() * std::fabs(exact) + 1e-300;
  return std::fabs(got - exact) <= bound;
}

template <typename T, typename Index>
void BagRandomCases(std::mt19937_64& rng, uint64_t seed, int trials) {
  using C = typename pe::Arith<T>::Compute;
  const pe::BagCombiner combiners[] = {
      pe::BagCombiner::kSum, pe::BagCombiner::kMean, pe::BagCombiner::kSqrtN};
  for (int trial = 0; trial < trials; ++trial) {
    const int64_t num_rows = 1 + static_cast<int64_t>(rng() % 20);
    const int64_t row_size = static_cast<int64_t>(rng() % 6);
    const bool sorted = trial % 3 != 0;
    const bool weighted = trial % 2 == 0;
    const pe::BagCombiner combiner = combiners[trial % 3];
    const BagBatch<Index> batch = RandomBagBatch<Index>(rng, num_rows, sorted);
    const int64_t n = static_cast<int64_t>(batch.ids.size());
    const std::vector<T> params =
        RandomValues<T>(rng, num_rows * row_size, -2.0, 2.0);
    std::vector<C> weights(n);
    for (int64_t i = 0; i < n; ++i)
      weights[i] = static_cast<C>(batch.weights[i]);
    pe::BagPositions<Index> positions;
    positions.ids = batch.ids.data();
    positions.bags = batch.bags.data();
    positions.num_positions = n;
    positions.num_bags = batch.num_bags;
    positions.num_rows = num_rows;
    const std::vector<double> factors_exact =
        ReferenceFactors(batch, weighted, combiner);

    // Forward: every runner gives the same bits, within the bound.
    std::vector<T> first_out;
    std::vector<C> factors;
    for (const Runner& runner : Runners()) {
      std::vector<T> out(batch.num_bags * row_size, FromDouble<T>(7.0));
      std::vector<C> run_factors(n, C(-1));
      const pe::BagInputError error = pe::EmbeddingBagCpu<T, Index>(
          params.data(), row_size, positions,
          weighted ? weights.data() : nullptr, combiner, out.data(),
          run_factors.data(), runner.parallelism);
      if (!error.ok()) {
        Fail("bag forward: refused a valid batch", seed, trial);
        return;
      }
      if (first_out.empty() && factors.empty()) {
        first_out = out;
        factors = run_factors;
      } else if (!BitsEqual(out, first_out) ||
                 !BitsEqual(run_factors, factors)) {
        Fail(std::string("bag forward: bits differ with ") + runner.name, seed,
             trial);
      }
    }
    for (int64_t b = 0; b < batch.num_bags; ++b) {
      for (int64_t j = 0; j < row_size; ++j) {
        double exact = 0.0, magnitude = 0.0;
        int64_t k = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (batch.bags[i] != b || batch.ids[i] < 0) continue;
          const double term =
              factors_exact[i] * ToDouble(params[batch.ids[i] * row_size + j]);
          exact += term;
          magnitude += std::fabs(term);
          ++k;
        }
        if (!WithinBagBound<T>(ToDouble(first_out[b * row_size + j]), exact,
                               magnitude, k)) {
          Fail("bag forward: a value is outside the rounding bound", seed,
               trial);
        }
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!WithinBagBound<T>(static_cast<double>(factors[i]), factors_exact[i],
                             std::fabs(factors_exact[i]), n)) {
        Fail("bag forward: a factor is wrong", seed, trial);
        break;
      }
    }

    // Gradient: rows by first occurrence, values within the bound, the same
    // bits for every runner.
    const std::unique_ptr<bool[]> mask = RandomMask(rng, num_rows);
    const std::vector<T> grad =
        RandomValues<T>(rng, batch.num_bags * row_size, -1.0, 1.0);
    pe::RowGroups groups;
    if (!pe::PlanEmbeddingBagGrad(positions, mask.get(), &groups).ok()) {
      Fail("bag gradient: refused a valid batch", seed, trial);
      return;
    }
    std::vector<int64_t> expected_rows;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = batch.ids[i];
      if (id >= 0 && mask[id] &&
          std::find(expected_rows.begin(), expected_rows.end(), id) ==
              expected_rows.end()) {
        expected_rows.push_back(id);
      }
    }
    if (groups.rows != expected_rows) {
      Fail("bag gradient: rows are not the permitted ids by first occurrence",
           seed, trial);
      continue;
    }
    std::vector<T> first_values;
    for (const Runner& runner : Runners()) {
      std::vector<T> values(groups.num_groups() * row_size);
      pe::EmbeddingBagGradValuesCpu<T>(grad.data(), row_size, batch.bags.data(),
                                       factors.data(), groups, values.data(),
                                       runner.parallelism);
      if (first_values.empty()) {
        first_values = values;
      } else if (!BitsEqual(values, first_values)) {
        Fail(std::string("bag gradient: bits differ with ") + runner.name, seed,
             trial);
      }
    }
    for (int64_t g = 0; g < groups.num_groups(); ++g) {
      for (int64_t j = 0; j < row_size; ++j) {
        double exact = 0.0, magnitude = 0.0;
        int64_t k = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (batch.ids[i] != groups.rows[g]) continue;
          const double term =
              factors_exact[i] * ToDouble(grad[batch.bags[i] * row_size + j]);
          exact += term;
          magnitude += std::fabs(term);
          ++k;
        }
        if (!WithinBagBound<T>(ToDouble(first_values[g * row_size + j]), exact,
                               magnitude, k + n)) {
          Fail("bag gradient: a value is outside the rounding bound", seed,
               trial);
        }
      }
    }
  }
}

// An id >= V: refused with its bag and place, nothing written; negative ids
// are pruned, not refused.
template <typename Index>
void BagBadIds(uint64_t seed) {
  const std::vector<Index> ids = {3, -1, 0, 2, 9, 1};
  const std::vector<int64_t> bags = {0, 1, 1, 1, 1, 2};
  pe::BagPositions<Index> positions;
  positions.ids = ids.data();
  positions.bags = bags.data();
  positions.num_positions = 6;
  positions.num_bags = 3;
  positions.num_rows = 4;
  const std::vector<float> params(8, 1.0f);
  std::vector<float> out(6, 5.0f);
  std::vector<float> factors(6, 5.0f);
  const pe::BagInputError error = pe::EmbeddingBagCpu<float, Index>(
      params.data(), 2, positions, nullptr, pe::BagCombiner::kMean, out.data(),
      factors.data(), pe::PlainThreads(2));
  if (error.kind != pe::BagInputError::Kind::kIdOutOfRange ||
      error.position != 4 || error.bag != 1 || error.place != 3 ||
      error.value != 9 ||
      pe::BagInputErrorMessage(error, 4, 3) !=
          "sp_ids: bag 1, position 3 = 9 is not in [0, 4)") {
    Fail("bag forward: a bad id is not reported with its bag and place", seed,
         0);
  }
  if (out != std::vector<float>(6, 5.0f) ||
      factors != std::vector<float>(6, 5.0f)) {
    Fail("bag forward: wrote although an id was refused", seed, 0);
  }
  const std::unique_ptr<bool[]> mask(new bool[4]{true, true, true, true});
  pe::RowGroups groups;
  if (pe::PlanEmbeddingBagGrad(positions, mask.get(), &groups).position != 4) {
    Fail("bag gradient: a bad id is not reported", seed, 0);
  }
  const std::vector<int64_t> bad_bags = {0, 1, 1, 3, 1, 2};
  positions.bags = bad_bags.data();
  const pe::BagInputError bag_error = pe::CheckBagPositions(positions, nullptr);
  if (bag_error.kind != pe::BagInputError::Kind::kBagOutOfRange ||
      bag_error.position != 3 || bag_error.value != 3) {
    Fail("bag positions: a bag out of range is not reported", seed, 0);
  }
}

template <typename T, typename Index>
void EveryCoreOn(std::mt19937_64& rng, uint64_t seed) {
  ScatterRandomCases<T, Index>(rng, seed, 40, /*large=*/false);
  ScatterRandomCases<T, Index>(rng, seed, 1, /*large=*/true);
  AdamRandomCases<T, Index>(rng, seed, 24, /*large=*/false);
  AdamRandomCases<T, Index>(rng, seed, 2, /*large=*/true);
  AdamSlotMapCases<T, Index>(rng, seed, 24, /*large=*/false);
  AdamSlotMapCases<T, Index>(rng, seed, 2, /*large=*/true);
  BagRandomCases<T, Index>(rng, seed, 30);
}

}  // namespace

int main() {
  const uint64_t seed = SeedFromEnvironment();
  std::printf("core_test seed %llu (PE_TEST_SEED=<int>|random changes it)\n",
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  EveryCoreOn<pe::Float16, int32_t>(rng, seed);
  EveryCoreOn<pe::Float16, int64_t>(rng, seed);
  EveryCoreOn<pe::BFloat16, int32_t>(rng, seed);
  EveryCoreOn<pe::BFloat16, int64_t>(rng, seed);
  EveryCoreOn<float, int32_t>(rng, seed);
  EveryCoreOn<float, int64_t>(rng, seed);
  EveryCoreOn<double, int32_t>(rng, seed);
  EveryCoreOn<double, int64_t>(rng, seed);
  if (most_shards_seen < 4) Fail("no update was split into 4 shards", seed, 0);
  ScatterBadIndices<int32_t>(rng, seed);
  ScatterBadIndices<int64_t>(rng, seed);
  AdamBadIndices<int32_t>(rng, seed);
  AdamBadIndices<int64_t>(rng, seed);
  AdamSlotMapErrors<int32_t>(rng, seed);
  AdamSlotMapErrors<int64_t>(rng, seed);
  GroupingCases<int32_t>(rng, seed);
  GroupingCases<int64_t>(rng, seed);
  BagBadIds<int32_t>(seed);
  BagBadIds<int64_t>(seed);
  HugePages();
  SixteenBitConversions();
  RowUpdateContract();
  SlotContract();
  BagContract();
  if (failures) {
    std::printf("core_test: %d failures\n", failures);
    return 1;
  }
  std::printf("core_test: all checks passed\n");
  return 0;
}
