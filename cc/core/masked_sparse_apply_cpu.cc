// CPU implementation of the TF-free MaskedSparseApply core: the plan, and
// the CPU skeleton that applies any rule of the table (row_rules.h).
//
// Compiled with -ffp-contract=off (see CMakeLists.txt): a fused multiply-add
// would round once where TensorFlow's separate elementwise ops round twice,
// and the point of this kernel is to give exactly their result.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cc/core/masked_sparse_apply.h"

namespace partial_embedding {
namespace {

// Smallest power of two >= value (value >= 1).
int64_t CeilPowerOfTwo(int64_t value) {
  int64_t result = 1;
  while (result < value) result <<= 1;
  return result;
}

// A hash map from non-negative keys (row numbers) to group numbers, for at
// most `max_keys` keys. Open addressing with twice as many slots as keys
// keeps probes short. It stores only group numbers: the caller keeps each
// group's key.
class GroupOfKey {
 public:
  explicit GroupOfKey(int64_t max_keys)
      : slot_group_(static_cast<size_t>(
                        CeilPowerOfTwo(std::max<int64_t>(2 * max_keys, 2))),
                    -1),
        slot_mask_(static_cast<uint64_t>(slot_group_.size() - 1)) {}

  // The group whose key (key_of_group[group]) is `key`; or, when there is
  // none, -1, after recording `new_group` for `key`.
  int64_t FindOrAdd(int64_t key, int64_t new_group,
                    const std::vector<int64_t>& key_of_group) {
    // Fibonacci hashing: multiply, keep the high bits' mix in the low bits.
    uint64_t slot = (static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> 17;
    while (true) {
      slot &= slot_mask_;
      const int64_t group = slot_group_[slot];
      if (group < 0) {
        slot_group_[slot] = new_group;
        return -1;
      }
      if (key_of_group[group] == key) return group;
      ++slot;
    }
  }

 private:
  std::vector<int64_t> slot_group_;  // -1 where empty.
  uint64_t slot_mask_;
};

// How many indices ahead the planning loops ask for the row mask's (and the
// slot map's) entries: scattered single loads, each a likely cache miss.
constexpr int64_t kPlanPrefetchDistance = 16;

}  // namespace

template <typename Index>
void GroupPermittedRows(const Index* indices, int64_t num_indices,
                        const bool* row_mask, RowGroups* groups) {
  groups->rows.clear();
  groups->starts.clear();
  groups->positions.clear();
  groups->slot_rows.clear();
  GroupOfKey group_of_row(num_indices);
  std::vector<int64_t> group_of(static_cast<size_t>(num_indices), -1);
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < num_indices; ++i) {
    // The mask's entries are scattered over V bytes: ask for them ahead
    // (indices are known to be below V here).
    if (i + kPlanPrefetchDistance < num_indices &&
        indices[i + kPlanPrefetchDistance] >= 0) {
      __builtin_prefetch(row_mask + indices[i + kPlanPrefetchDistance], 0);
    }
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row < 0 || !row_mask[row]) continue;
    const int64_t new_group = groups->num_groups();
    const int64_t group = group_of_row.FindOrAdd(row, new_group, groups->rows);
    if (group < 0) {
      group_of[i] = new_group;
      groups->rows.push_back(row);
      counts.push_back(1);
    } else {
      group_of[i] = group;
      ++counts[group];
    }
  }
  const int64_t num_groups = groups->num_groups();
  groups->starts.resize(static_cast<size_t>(num_groups + 1));
  groups->starts[0] = 0;
  for (int64_t g = 0; g < num_groups; ++g) {
    groups->starts[g + 1] = groups->starts[g] + counts[g];
  }
  groups->positions.resize(static_cast<size_t>(groups->starts[num_groups]));
  // Reuse counts as each group's fill cursor; positions stay increasing.
  for (int64_t g = 0; g < num_groups; ++g) counts[g] = groups->starts[g];
  for (int64_t i = 0; i < num_indices; ++i) {
    const int64_t group = group_of[i];
    if (group >= 0) groups->positions[counts[group]++] = i;
  }
}

template <typename Index>
RuleInputError PlanMaskedSparseApply(const Index* indices, int64_t num_indices,
                                     int64_t num_rows,
                                     const SlotMap<Index>& slot_map,
                                     const bool* row_mask, RowGroups* groups) {
  using Kind = RuleInputError::Kind;
  RuleInputError error;
  error.position = FindFirstBadIndex(indices, num_indices, num_rows);
  if (error.position >= 0) {
    error.kind = Kind::kIndexOutOfRange;
    return error;
  }
  const Index* slot_indices = slot_map.slot_indices;
  if (slot_indices != nullptr) {
    error.position =
        FindFirstBadIndex(slot_indices, num_indices, slot_map.num_slot_rows);
    if (error.position >= 0) {
      error.kind = Kind::kSlotIndexOutOfRange;
      return error;
    }
  }
  GroupPermittedRows(indices, num_indices, row_mask, groups);
  if (slot_indices == nullptr) return error;

  const int64_t num_groups = groups->num_groups();
  const std::vector<int64_t>& starts = groups->starts;
  const std::vector<int64_t>& positions = groups->positions;
  groups->slot_rows.resize(static_cast<size_t>(num_groups));
  // Each group's occurrences against its first one; the lowest disagreeing
  // position is reported.
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t first = positions[starts[g]];
    const Index slot_row = slot_indices[first];
    groups->slot_rows[g] = static_cast<int64_t>(slot_row);
    for (int64_t p = starts[g] + 1; p < starts[g + 1]; ++p) {
      const int64_t position = positions[p];
      if (slot_indices[position] == slot_row) continue;
      if (error.position < 0 || position < error.position) {
        error.kind = Kind::kRowInTwoSlotRows;
        error.position = position;
        error.earlier = first;
      }
      break;  // Later positions of this group are higher.
    }
  }
  if (!error.ok()) return error;
  // Groups are in order of first occurrence: the first group that finds its
  // slot row taken has the lowest first position of any such group.
  GroupOfKey group_of_slot_row(num_groups);
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t owner =
        group_of_slot_row.FindOrAdd(groups->slot_rows[g], g, groups->slot_rows);
    if (owner >= 0) {
      error.kind = Kind::kSlotRowOfTwoRows;
      error.position = positions[starts[g]];
      error.earlier = positions[starts[owner]];
      return error;
    }
  }
  return error;
}

SlotMapPlan PlanSlotRowsFromMap(const float* slot_of_row, int64_t rows_used,
                                int64_t num_slot_rows, int64_t max_slot_rows,
                                RowGroups* groups) {
  using Kind = SlotMapPlan::Kind;
  SlotMapPlan plan;
  if (rows_used < 0 || rows_used > max_slot_rows) {
    plan.kind = Kind::kTooManySlotRows;
    plan.needed = rows_used;
    return plan;
  }
  const int64_t num_groups = groups->num_groups();
  groups->slot_rows.resize(static_cast<size_t>(num_groups));
  int64_t next = rows_used;
  for (int64_t g = 0; g < num_groups; ++g) {
    if (g + kPlanPrefetchDistance < num_groups) {
      __builtin_prefetch(slot_of_row + groups->rows[g + kPlanPrefetchDistance],
                         0);
    }
    const int64_t row = groups->rows[g];
    const float value = slot_of_row[row];
    if (value < 0.0f) {
      plan.new_groups.push_back(g);
      groups->slot_rows[g] = next++;
      continue;
    }
    // NaN fails the first test; a whole number below 2^24 converts exactly.
    if (!(value < static_cast<float>(num_slot_rows)) ||
        value != std::floor(value)) {
      plan.kind = Kind::kNotASlotRow;
      plan.row = row;
      plan.map_value = static_cast<double>(value);
      return plan;
    }
    groups->slot_rows[g] = static_cast<int64_t>(value);
  }
  if (next > max_slot_rows) {
    plan.kind = Kind::kTooManySlotRows;
    plan.needed = next;
    return plan;
  }
  GroupOfKey group_of_slot_row(num_groups);
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t owner =
        group_of_slot_row.FindOrAdd(groups->slot_rows[g], g, groups->slot_rows);
    if (owner >= 0) {
      plan.kind = Kind::kSlotRowOfTwoRows;
      plan.row = groups->rows[g];
      plan.other_row = groups->rows[owner];
      plan.slot_row = groups->slot_rows[g];
      plan.new_groups.clear();
      return plan;
    }
  }
  plan.rows_used_after = next;
  return plan;
}

namespace {

// The arithmetic of the rules (row_rules.h): plain IEEE operations, one
// rounding each (this file is compiled without contraction).
struct IeeeOperators {
  template <typename C>
  static inline C Add(C a, C b) {
    return a + b;
  }
  template <typename C>
  static inline C Sub(C a, C b) {
    return a - b;
  }
  template <typename C>
  static inline C Mul(C a, C b) {
    return a * b;
  }
  template <typename C>
  static inline C Div(C a, C b) {
    return a / b;
  }
  template <typename C>
  static inline C Sqrt(C a) {
    return std::sqrt(a);
  }
  template <typename C>
  static inline C Pow(C a, C b) {
    return std::pow(a, b);
  }
};

// Asks for `bytes` of memory from `begin` on ahead of their use (for
// writing).
inline __attribute__((always_inline)) void PrefetchBytes(const void* begin,
                                                         int64_t bytes) {
  const char* first = static_cast<const char*>(begin);
  for (int64_t byte = 0; byte < bytes; byte += 64) {
    __builtin_prefetch(first + byte, 1);
  }
}

// Where a group's gradient comes from: the raw rows of a sparse gradient
// ([num_indices, row_size]), a segment sum in position order from zero,
// rounded to T after each addition.
template <typename T>
struct RawRows {
  const T* gradient;

  inline __attribute__((always_inline)) void operator()(
      const RowGroups& groups, int64_t group, int64_t row_size,
      typename Arith<T>::Compute* __restrict__ g) const {
    using A = Arith<T>;
    std::fill(g, g + row_size, typename A::Compute(0));
    for (int64_t p = groups.starts[group]; p < groups.starts[group + 1]; ++p) {
      const T* __restrict__ src = gradient + groups.positions[p] * row_size;
      for (int64_t j = 0; j < row_size; ++j) {
        g[j] = Rounded<T>(g[j] + A::Load(src[j]));
      }
    }
  }
};

// Or the bags' gradient ([num_bags, row_size]): factor * grad[bag] over the
// group's positions, in position order, in the compute type, rounded to T
// once: MaskedEmbeddingBagGrad's value for the row (embedding_bag.h).
template <typename T>
struct BagRows {
  const T* grad;
  const int64_t* bags;
  const typename Arith<T>::Compute* factors;

  inline __attribute__((always_inline)) void operator()(
      const RowGroups& groups, int64_t group, int64_t row_size,
      typename Arith<T>::Compute* __restrict__ g) const {
    using A = Arith<T>;
    using C = typename A::Compute;
    std::fill(g, g + row_size, C(0));
    for (int64_t p = groups.starts[group]; p < groups.starts[group + 1]; ++p) {
      const int64_t position = groups.positions[p];
      const C factor = factors[position];
      const T* __restrict__ src = grad + bags[position] * row_size;
      for (int64_t j = 0; j < row_size; ++j) g[j] += factor * A::Load(src[j]);
    }
    for (int64_t j = 0; j < row_size; ++j) g[j] = Rounded<T>(g[j]);
  }
};

// Slot i's stride per column: 1 per element, 0 per row (absent slots too).
template <Rule kRule>
constexpr int64_t SlotStride(int i) {
  return i < kRuleTable[static_cast<int>(kRule)].num_slots &&
                 !kRuleTable[static_cast<int>(kRule)].per_row[i]
             ? 1
             : 0;
}

// Where slot i's row `slot_row` begins (null for a slot the rule lacks).
template <Rule kRule, typename T>
inline __attribute__((always_inline)) T* SlotRow(const RuleTables<T>& tables,
                                                 int i, int64_t slot_row) {
  const RuleInfo& info = kRuleTable[static_cast<int>(kRule)];
  if (i >= info.num_slots) return nullptr;
  return tables.slots[i] + slot_row * (info.per_row[i] ? 1 : tables.row_size);
}

// ElementStep on the row_size elements of a row of var and of its slots
// (s0..s2 where the rule has them), with FTRL's exponent of form kPower.
template <typename T, Rule kRule, PowerForm kPower>
inline __attribute__((always_inline)) void UpdateElements(
    const RuleConstants<T>& k, const typename Arith<T>::Compute* __restrict__ g,
    typename Arith<T>::Compute statistic, int64_t row_size, T* __restrict__ var,
    T* __restrict__ s0, T* __restrict__ s1, T* __restrict__ s2) {
  for (int64_t j = 0; j < row_size; ++j) {
    T* const s[kMaxSlots] = {s0 + SlotStride<kRule>(0) * j,
                             s1 + SlotStride<kRule>(1) * j,
                             s2 + SlotStride<kRule>(2) * j};
    ElementStep<kRule, T, IeeeOperators, kPower>(k, g[j], statistic, var[j], s);
  }
}

// The rule on row `row` of var and row `slot_row` of the slots, given the
// row's summed gradient g.
template <typename T, Rule kRule>
inline __attribute__((always_inline)) void UpdateRow(
    const RuleTables<T>& tables, int64_t row, int64_t slot_row,
    const typename Arith<T>::Compute* __restrict__ g,
    const RuleConstants<T>& k) {
  using C = typename Arith<T>::Compute;
  const int64_t row_size = tables.row_size;
  T* __restrict__ var = tables.var + row * row_size;
  T* __restrict__ s0 = SlotRow<kRule>(tables, 0, slot_row);
  T* __restrict__ s1 = SlotRow<kRule>(tables, 1, slot_row);
  T* __restrict__ s2 = SlotRow<kRule>(tables, 2, slot_row);
  C statistic = C(0);
  if constexpr (IsRowwise(kRule)) {
    // The mean of the squared gradient over the row; the rule's per-row slot
    // is its last.
    const C mean_square = RowMeanSquare<T, IeeeOperators>(g, row_size);
    T* row_slot = kRule == Rule::kRowwiseAdagrad ? s0 : s1;
    statistic = RowStatistic<kRule, T, IeeeOperators>(k, mean_square, row_slot);
  }
  if constexpr (kRule == Rule::kFtrl) {
    // FTRL's exponent's form picked once a row: the loops of 0.5, 0 and 1
    // call no pow, so they vectorize.
    switch (k.power_form) {
      case PowerForm::kHalf:
        return UpdateElements<T, kRule, PowerForm::kHalf>(
            k, g, statistic, row_size, var, s0, s1, s2);
      case PowerForm::kZero:
        return UpdateElements<T, kRule, PowerForm::kZero>(
            k, g, statistic, row_size, var, s0, s1, s2);
      case PowerForm::kOne:
        return UpdateElements<T, kRule, PowerForm::kOne>(
            k, g, statistic, row_size, var, s0, s1, s2);
      default:
        return UpdateElements<T, kRule, PowerForm::kGeneral>(
            k, g, statistic, row_size, var, s0, s1, s2);
    }
  } else {
    UpdateElements<T, kRule, PowerForm::kGeneral>(k, g, statistic, row_size,
                                                  var, s0, s1, s2);
  }
}

// The group loop, inlined into one copy per instruction set below: the math
// is IEEE single operations either way (no contraction), so every copy gives
// the same bits; wider vectors only divide and take square roots faster.
template <typename T, Rule kRule, typename Source>
inline __attribute__((always_inline)) void ApplyGroups(
    const RuleTables<T>& tables, const Source& gradient,
    const RowGroups& groups, const RuleHyperparameters<T>& hyper,
    int64_t group_begin, int64_t group_end) {
  const RuleConstants<T> constants(hyper.values);
  const RuleInfo& info = kRuleTable[static_cast<int>(kRule)];
  const int64_t row_size = tables.row_size;
  const int64_t* rows = groups.rows.data();
  const int64_t* slot_rows =
      groups.slot_rows.empty() ? rows : groups.slot_rows.data();
  std::vector<typename Arith<T>::Compute> summed(static_cast<size_t>(row_size));
  // Rows are scattered over tables much larger than the caches: ask for the
  // rows a few groups ahead so their misses overlap with this row's math.
  constexpr int64_t kPrefetchDistance = 4;
  const int64_t row_bytes = row_size * static_cast<int64_t>(sizeof(T));
  for (int64_t group = group_begin; group < group_end; ++group) {
    if (group + kPrefetchDistance < group_end) {
      const int64_t slot_ahead = slot_rows[group + kPrefetchDistance];
      PrefetchBytes(tables.var + rows[group + kPrefetchDistance] * row_size,
                    row_bytes);
      for (int i = 0; i < info.num_slots; ++i) {
        PrefetchBytes(SlotRow<kRule>(tables, i, slot_ahead),
                      info.per_row[i] ? 1 : row_bytes);
      }
    }
    gradient(groups, group, row_size, summed.data());
    UpdateRow<T, kRule>(tables, rows[group], slot_rows[group], summed.data(),
                        constants);
  }
}

template <typename T, Rule kRule, typename Source>
void ApplyGroupsBaseline(const RuleTables<T>& tables, const Source& gradient,
                         const RowGroups& groups,
                         const RuleHyperparameters<T>& hyper,
                         int64_t group_begin, int64_t group_end) {
  ApplyGroups<T, kRule>(tables, gradient, groups, hyper, group_begin,
                        group_end);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PE_HAVE_AVX2_COPY 1
template <typename T, Rule kRule, typename Source>
__attribute__((target("avx2"))) void ApplyGroupsAvx2(
    const RuleTables<T>& tables, const Source& gradient,
    const RowGroups& groups, const RuleHyperparameters<T>& hyper,
    int64_t group_begin, int64_t group_end) {
  ApplyGroups<T, kRule>(tables, gradient, groups, hyper, group_begin,
                        group_end);
}

bool CpuHasAvx2() {
  static const bool has_avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has_avx2;
}
#endif

// Applies the rule to groups [group_begin, group_end) with the widest copy
// of the row loop this CPU runs.
template <typename T, Rule kRule, typename Source>
void ApplyGroupsOnThisCpu(const RuleTables<T>& tables, const Source& gradient,
                          const RowGroups& groups,
                          const RuleHyperparameters<T>& hyper,
                          int64_t group_begin, int64_t group_end) {
#ifdef PE_HAVE_AVX2_COPY
  if (CpuHasAvx2()) {
    ApplyGroupsAvx2<T, kRule>(tables, gradient, groups, hyper, group_begin,
                              group_end);
    return;
  }
#endif
  ApplyGroupsBaseline<T, kRule>(tables, gradient, groups, hyper, group_begin,
                                group_end);
}

// The rule on the groups, each shard a contiguous range of them, with each
// group's gradient from `gradient` (RawRows or BagRows).
template <typename T, typename Source>
void ApplyPlannedGroups(Rule rule, const RuleTables<T>& tables,
                        const RowGroups& groups, int64_t num_indices,
                        const Source& gradient,
                        const RuleHyperparameters<T>& hyper,
                        const CpuParallelism& parallelism) {
  const int64_t num_groups = groups.num_groups();
  if (num_groups == 0 || tables.row_size == 0) return;
  const int64_t num_shards = std::min<int64_t>(
      RecommendedShards(num_indices, tables.row_size, parallelism.max_threads),
      num_groups);
  auto run = [&](int64_t begin, int64_t end) {
    DispatchRule(rule, [&](auto kind) {
      for (int64_t shard = begin; shard < end; ++shard) {
        ApplyGroupsOnThisCpu<T, decltype(kind)::value>(
            tables, gradient, groups, hyper, num_groups * shard / num_shards,
            num_groups * (shard + 1) / num_shards);
      }
    });
  };
  if (num_shards == 1) {
    run(0, 1);
  } else {
    parallelism.parallel_for(num_shards, run);
  }
}

}  // namespace

template <typename T>
void ApplyPlannedRuleCpu(Rule rule, const RuleTables<T>& tables,
                         const RowGroups& groups, int64_t num_indices,
                         const T* gradient, const RuleHyperparameters<T>& hyper,
                         const CpuParallelism& parallelism) {
  ApplyPlannedGroups(rule, tables, groups, num_indices, RawRows<T>{gradient},
                     hyper, parallelism);
}

template <typename T>
void ApplyPlannedBagRuleCpu(Rule rule, const RuleTables<T>& tables,
                            const RowGroups& groups, const T* grad,
                            const int64_t* bags,
                            const typename Arith<T>::Compute* factors,
                            const RuleHyperparameters<T>& hyper,
                            const CpuParallelism& parallelism) {
  ApplyPlannedGroups(rule, tables, groups,
                     static_cast<int64_t>(groups.positions.size()),
                     BagRows<T>{grad, bags, factors}, hyper, parallelism);
}

template <typename T, typename Index>
RuleInputError MaskedSparseApplyRuleCpu(Rule rule, const RuleTables<T>& tables,
                                        const Index* indices,
                                        int64_t num_indices,
                                        const SlotMap<Index>& slot_map,
                                        const T* gradient, const bool* row_mask,
                                        const RuleHyperparameters<T>& hyper,
                                        const CpuParallelism& parallelism) {
  RowGroups groups;
  const RuleInputError error = PlanMaskedSparseApply(
      indices, num_indices, tables.num_rows, slot_map, row_mask, &groups);
  if (error.ok()) {
    ApplyPlannedRuleCpu(rule, tables, groups, num_indices, gradient, hyper,
                        parallelism);
  }
  return error;
}

#define PE_INSTANTIATE_GROUPING(Index)                                        \
  template void GroupPermittedRows<Index>(const Index*, int64_t, const bool*, \
                                          RowGroups*);                        \
  template RuleInputError PlanMaskedSparseApply<Index>(                       \
      const Index*, int64_t, int64_t, const SlotMap<Index>&, const bool*,     \
      RowGroups*);
PE_FOR_EACH_INDEX_TYPE(PE_INSTANTIATE_GROUPING)
#undef PE_INSTANTIATE_GROUPING

#define PE_INSTANTIATE_APPLY(T)                                               \
  template void ApplyPlannedRuleCpu<T>(                                       \
      Rule, const RuleTables<T>&, const RowGroups&, int64_t, const T*,        \
      const RuleHyperparameters<T>&, const CpuParallelism&);                  \
  template void ApplyPlannedBagRuleCpu<T>(                                    \
      Rule, const RuleTables<T>&, const RowGroups&, const T*, const int64_t*, \
      const typename Arith<T>::Compute*, const RuleHyperparameters<T>&,       \
      const CpuParallelism&);
PE_FOR_EACH_CORE_TYPE(PE_INSTANTIATE_APPLY)
#undef PE_INSTANTIATE_APPLY

#define PE_INSTANTIATE(T, Index)                              \
  template RuleInputError MaskedSparseApplyRuleCpu<T, Index>( \
      Rule, const RuleTables<T>&, const Index*, int64_t,      \
      const SlotMap<Index>&, const T*, const bool*,           \
      const RuleHyperparameters<T>&, const CpuParallelism&);
PE_FOR_EACH_CORE_TYPE_AND_INDEX_TYPE(PE_INSTANTIATE)
#undef PE_INSTANTIATE

}  // namespace partial_embedding
