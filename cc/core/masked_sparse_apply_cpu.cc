// CPU implementation of the TF-free MaskedSparseApplyAdam core.
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

// Rounds a computed value to what storing it in T and loading it back gives:
// the identity where T is its own compute type, one rounding for 16-bit types.
template <typename T>
inline typename Arith<T>::Compute Rounded(typename Arith<T>::Compute x) {
  return Arith<T>::Load(Arith<T>::Store(x));
}

// max(a, b) as TensorFlow's Maximum computes it: NaN if either is NaN.
template <typename C>
inline C MaximumPropagatingNaN(C a, C b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return a < b ? b : a;
}

// Smallest power of two >= value (value >= 1).
int64_t CeilPowerOfTwo(int64_t value) {
  int64_t result = 1;
  while (result < value) result <<= 1;
  return result;
}

}  // namespace

template <typename Index>
void GroupPermittedRows(const Index* indices, int64_t num_indices,
                        const bool* row_mask, RowGroups* groups) {
  groups->rows.clear();
  groups->starts.clear();
  groups->positions.clear();
  // Open addressing on the row number; twice as many slots as positions keeps
  // probes short. Slot value: group number, -1 when empty.
  const int64_t capacity =
      CeilPowerOfTwo(std::max<int64_t>(2 * num_indices, 2));
  const uint64_t slot_mask = static_cast<uint64_t>(capacity - 1);
  std::vector<int64_t> slot_group(static_cast<size_t>(capacity), -1);
  std::vector<int64_t> group_of(static_cast<size_t>(num_indices), -1);
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < num_indices; ++i) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (!row_mask[row]) continue;
    // Fibonacci hashing: multiply, keep the high bits' mix in the low bits.
    uint64_t slot = (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull) >> 17;
    while (true) {
      slot &= slot_mask;
      const int64_t group = slot_group[slot];
      if (group < 0) {
        slot_group[slot] = static_cast<int64_t>(groups->rows.size());
        group_of[i] = slot_group[slot];
        groups->rows.push_back(row);
        counts.push_back(1);
        break;
      }
      if (groups->rows[group] == row) {
        group_of[i] = group;
        ++counts[group];
        break;
      }
      ++slot;
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

namespace {

// The row loop, inlined into one copy per instruction set below: the math is
// IEEE single operations either way (no contraction), so every copy gives the
// same bits; wider vectors only divide and take square roots faster. With
// kAmsgrad the denominator uses v_hat = max(v_hat, v), which is also written.
template <typename T, bool kAmsgrad>
inline __attribute__((always_inline)) void ApplyGroups(
    const AdamTables<T>& tables, const T* gradient, const RowGroups& groups,
    const AdamHyperparameters<T>& hyper, int64_t group_begin,
    int64_t group_end) {
  using A = Arith<T>;
  using C = typename A::Compute;
  const int64_t row_size = tables.row_size;
  const C learning_rate = A::Load(hyper.learning_rate);
  const C one_minus_beta_1 = A::Load(hyper.one_minus_beta_1);
  const C one_minus_beta_2 = A::Load(hyper.one_minus_beta_2);
  const C epsilon = A::Load(hyper.epsilon);
  const C alpha = A::Load(hyper.alpha);
  const C weight_decay = A::Load(hyper.weight_decay);
  const bool decays = weight_decay != C(0);
  std::vector<C> summed(static_cast<size_t>(row_size));
  C* __restrict__ g = summed.data();

  // Rows are scattered over tables much larger than the caches: ask for the
  // rows a few groups ahead so their misses overlap with this row's math.
  constexpr int64_t kPrefetchDistance = 4;
  const int64_t row_bytes = row_size * static_cast<int64_t>(sizeof(T));
  auto prefetch_row = [&](const T* table, int64_t row) {
    const char* begin = reinterpret_cast<const char*>(table + row * row_size);
    for (int64_t byte = 0; byte < row_bytes; byte += 64) {
      __builtin_prefetch(begin + byte, 1);
    }
  };
  for (int64_t group = group_begin; group < group_end; ++group) {
    if (group + kPrefetchDistance < group_end) {
      const int64_t ahead = groups.rows[group + kPrefetchDistance];
      prefetch_row(tables.var, ahead);
      prefetch_row(tables.m, ahead);
      prefetch_row(tables.v, ahead);
      if constexpr (kAmsgrad) prefetch_row(tables.v_hat, ahead);
    }
    // The row's gradient: a segment sum, in position order from zero.
    std::fill(summed.begin(), summed.end(), C(0));
    for (int64_t p = groups.starts[group]; p < groups.starts[group + 1]; ++p) {
      const T* __restrict__ src = gradient + groups.positions[p] * row_size;
      for (int64_t j = 0; j < row_size; ++j) {
        g[j] = Rounded<T>(g[j] + A::Load(src[j]));
      }
    }
    const int64_t offset = groups.rows[group] * row_size;
    T* __restrict__ var = tables.var + offset;
    T* __restrict__ m = tables.m + offset;
    T* __restrict__ v = tables.v + offset;
    T* __restrict__ v_hat = kAmsgrad ? tables.v_hat + offset : nullptr;
    for (int64_t j = 0; j < row_size; ++j) {
      C x = A::Load(var[j]);
      if (decays) {
        x = Rounded<T>(
            x - Rounded<T>(Rounded<T>(x * weight_decay) * learning_rate));
      }
      const C grad = g[j];
      const C m_old = A::Load(m[j]);
      const C m_new = Rounded<T>(
          m_old + Rounded<T>(Rounded<T>(grad - m_old) * one_minus_beta_1));
      const C v_old = A::Load(v[j]);
      const C v_new = Rounded<T>(
          v_old + Rounded<T>(Rounded<T>(Rounded<T>(grad * grad) - v_old) *
                             one_minus_beta_2));
      C v_used = v_new;
      if constexpr (kAmsgrad) {
        v_used = MaximumPropagatingNaN(A::Load(v_hat[j]), v_new);
        v_hat[j] = A::Store(v_used);
      }
      const C denominator = Rounded<T>(Rounded<T>(std::sqrt(v_used)) + epsilon);
      const C step = Rounded<T>(Rounded<T>(m_new * alpha) / denominator);
      m[j] = A::Store(m_new);
      v[j] = A::Store(v_new);
      var[j] = A::Store(x - step);
    }
  }
}

template <typename T, bool kAmsgrad>
void ApplyGroupsBaseline(const AdamTables<T>& tables, const T* gradient,
                         const RowGroups& groups,
                         const AdamHyperparameters<T>& hyper,
                         int64_t group_begin, int64_t group_end) {
  ApplyGroups<T, kAmsgrad>(tables, gradient, groups, hyper, group_begin,
                           group_end);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PE_HAVE_AVX2_COPY 1
template <typename T, bool kAmsgrad>
__attribute__((target("avx2"))) void ApplyGroupsAvx2(
    const AdamTables<T>& tables, const T* gradient, const RowGroups& groups,
    const AdamHyperparameters<T>& hyper, int64_t group_begin,
    int64_t group_end) {
  ApplyGroups<T, kAmsgrad>(tables, gradient, groups, hyper, group_begin,
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

// Applies the step to groups [group_begin, group_end) with the widest copy of
// the row loop this CPU runs.
template <typename T, bool kAmsgrad>
void ApplyGroupsOnThisCpu(const AdamTables<T>& tables, const T* gradient,
                          const RowGroups& groups,
                          const AdamHyperparameters<T>& hyper,
                          int64_t group_begin, int64_t group_end) {
#ifdef PE_HAVE_AVX2_COPY
  if (CpuHasAvx2()) {
    ApplyGroupsAvx2<T, kAmsgrad>(tables, gradient, groups, hyper, group_begin,
                                 group_end);
    return;
  }
#endif
  ApplyGroupsBaseline<T, kAmsgrad>(tables, gradient, groups, hyper, group_begin,
                                   group_end);
}

}  // namespace

template <typename T, typename Index>
int64_t MaskedSparseApplyAdamCpu(const AdamTables<T>& tables,
                                 const Index* indices, int64_t num_indices,
                                 const T* gradient, const bool* row_mask,
                                 const AdamHyperparameters<T>& hyper,
                                 const CpuParallelism& parallelism) {
  const int64_t bad = FindFirstBadIndex(indices, num_indices, tables.num_rows);
  if (bad >= 0) return bad;
  RowGroups groups;
  GroupPermittedRows(indices, num_indices, row_mask, &groups);
  const int64_t num_groups = groups.num_groups();
  if (num_groups == 0 || tables.row_size == 0) return -1;
  const int64_t num_shards = std::min<int64_t>(
      RecommendedShards(num_indices, tables.row_size, parallelism.max_threads),
      num_groups);
  auto run = [&](int64_t begin, int64_t end) {
    const bool amsgrad = tables.v_hat != nullptr;
    for (int64_t shard = begin; shard < end; ++shard) {
      const int64_t group_begin = num_groups * shard / num_shards;
      const int64_t group_end = num_groups * (shard + 1) / num_shards;
      if (amsgrad) {
        ApplyGroupsOnThisCpu<T, true>(tables, gradient, groups, hyper,
                                      group_begin, group_end);
      } else {
        ApplyGroupsOnThisCpu<T, false>(tables, gradient, groups, hyper,
                                       group_begin, group_end);
      }
    }
  };
  if (num_shards == 1) {
    run(0, 1);
  } else {
    parallelism.parallel_for(num_shards, run);
  }
  return -1;
}

#define PE_INSTANTIATE_INDEX(Index)                                           \
  template void GroupPermittedRows<Index>(const Index*, int64_t, const bool*, \
                                          RowGroups*);
PE_INSTANTIATE_INDEX(int32_t)
PE_INSTANTIATE_INDEX(int64_t)
#undef PE_INSTANTIATE_INDEX

#define PE_INSTANTIATE(T)                                                   \
  template int64_t MaskedSparseApplyAdamCpu<T, int32_t>(                    \
      const AdamTables<T>&, const int32_t*, int64_t, const T*, const bool*, \
      const AdamHyperparameters<T>&, const CpuParallelism&);                \
  template int64_t MaskedSparseApplyAdamCpu<T, int64_t>(                    \
      const AdamTables<T>&, const int64_t*, int64_t, const T*, const bool*, \
      const AdamHyperparameters<T>&, const CpuParallelism&);
PE_INSTANTIATE(Float16)
PE_INSTANTIATE(BFloat16)
PE_INSTANTIATE(float)
PE_INSTANTIATE(double)
#undef PE_INSTANTIATE

}  // namespace partial_embedding
