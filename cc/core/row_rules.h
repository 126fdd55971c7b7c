// The rule table: every optimizer rule the fused kernels apply, declared
// once. The CPU skeleton (masked_sparse_apply_cpu.cc) and the CUDA skeleton
// (masked_sparse_apply_gpu.cu) both include this header and apply any rule
// from it; MaskedOptimizer reads the same table (kernels_module.cc exports
// it) to pick the kernel and order its inputs.
//
// A rule is
//   - its slots, by name, each per element (a row of the table's row shape)
//     or per row (one value a row);
//   - its hyperparameters, in the variable's storage type, computed by the
//     caller as Keras' own update_step rounds them. Every rule starts with
//     learning_rate and weight_decay (0: none; decoupled, as Keras applies
//     it before the rule);
//   - its update: RowStatistic (row-wise rules only), then ElementStep on
//     each element of the row.
//
// `Ops` supplies the arithmetic in the compute type, each operation rounded
// once to nearest: plain operators on the CPU (compiled with
// -ffp-contract=off, so nothing is fused into a multiply-add), IEEE
// round-to-nearest intrinsics on the GPU; Pow (FTRL only, where its exponent
// is not 0.5, 0 or 1: FtrlPower) is the math library's pow, not rounded once
// (glibc within 1 ulp, CUDA's powf within 4), so FTRL may differ from
// TensorFlow's Pow in the last bits. Every result is
// then rounded to the storage type T, as TensorFlow's separate elementwise ops
// round it, so the element-wise rules equal Keras' update_step as separate
// TensorFlow ops bit for bit. The row-wise rules sum their mean over a row in a
// fixed order of their own (RowMeanSquare) and fold the row's denominator and
// learning rate into one factor a row, so they agree with the stock ops (and
// with FBGEMM) to within rounding, not bit for bit.
#ifndef PARTIAL_EMBEDDING_CC_CORE_ROW_RULES_H_
#define PARTIAL_EMBEDDING_CC_CORE_ROW_RULES_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cc/core/row_update_common.h"

#if defined(__CUDACC__)
#define PE_ALWAYS_INLINE __host__ __device__ __forceinline__
#else
#define PE_ALWAYS_INLINE inline __attribute__((always_inline))
#endif

namespace partial_embedding {

// The rules, in the table's order.
// clang-format off
enum class Rule : int32_t {
  kSgd, kMomentum, kNesterov, kAdagrad, kRmsprop, kRmspropMomentum,
  kRmspropCentered, kRmspropCenteredMomentum, kAdam, kAmsgrad,
  kRowwiseAdagrad, kRowwiseAdam, kFtrl
};
// clang-format on

inline constexpr int kNumRules = 13;
inline constexpr int kMaxSlots = 3;
inline constexpr int kMaxHyperparameters = 7;

// Hyperparameter positions every rule shares.
inline constexpr int kLearningRate = 0;
inline constexpr int kWeightDecay = 1;

// One row of the table.
struct RuleInfo {
  const char* name;
  int num_slots;
  const char* slot_names[kMaxSlots];
  bool per_row[kMaxSlots];
  int num_hyperparameters;
  const char* hyperparameters[kMaxHyperparameters];
};

// clang-format off
inline constexpr RuleInfo kRuleTable[kNumRules] = {
    {"sgd", 0, {}, {}, 2, {"learning_rate", "weight_decay"}},
    {"momentum", 1, {"momentum"}, {false}, 3,
     {"learning_rate", "weight_decay", "momentum"}},
    {"nesterov", 1, {"momentum"}, {false}, 3,
     {"learning_rate", "weight_decay", "momentum"}},
    {"adagrad", 1, {"accumulator"}, {false}, 3,
     {"learning_rate", "weight_decay", "epsilon"}},
    {"rmsprop", 1, {"velocity"}, {false}, 5,
     {"learning_rate", "weight_decay", "rho", "one_minus_rho", "epsilon"}},
    {"rmsprop_momentum", 2, {"velocity", "momentum"}, {false, false}, 6,
     {"learning_rate", "weight_decay", "rho", "one_minus_rho", "epsilon",
      "momentum"}},
    {"rmsprop_centered", 2, {"velocity", "average_gradient"}, {false, false}, 5,
     {"learning_rate", "weight_decay", "rho", "one_minus_rho", "epsilon"}},
    {"rmsprop_centered_momentum", 3,
     {"velocity", "momentum", "average_gradient"}, {false, false, false}, 6,
     {"learning_rate", "weight_decay", "rho", "one_minus_rho", "epsilon",
      "momentum"}},
    {"adam", 2, {"momentum", "velocity"}, {false, false}, 6,
     {"learning_rate", "weight_decay", "one_minus_beta_1", "one_minus_beta_2",
      "epsilon", "alpha"}},
    {"amsgrad", 3, {"momentum", "velocity", "velocity_hat"},
     {false, false, false}, 6,
     {"learning_rate", "weight_decay", "one_minus_beta_1", "one_minus_beta_2",
      "epsilon", "alpha"}},
    {"rowwise_adagrad", 1, {"accumulator"}, {true}, 3,
     {"learning_rate", "weight_decay", "epsilon"}},
    {"rowwise_adam", 2, {"momentum", "velocity"}, {false, true}, 7,
     {"learning_rate", "weight_decay", "one_minus_beta_1", "one_minus_beta_2",
      "epsilon", "one_minus_beta_1_power", "one_minus_beta_2_power"}},
    {"ftrl", 2, {"accumulator", "linear"}, {false, false}, 6,
     {"learning_rate", "weight_decay", "l1", "two_l2_shrinkage", "two_l2",
      "power"}},
};
// clang-format on

inline const RuleInfo& InfoOf(Rule rule) {
  return kRuleTable[static_cast<int>(rule)];
}

// The rule called `name`; false where there is none.
inline bool RuleFromName(const char* name, Rule* rule) {
  for (int i = 0; i < kNumRules; ++i) {
    if (std::strcmp(kRuleTable[i].name, name) == 0) {
      *rule = static_cast<Rule>(i);
      return true;
    }
  }
  return false;
}

// Whether `rule` reads a statistic of the whole row (the row-wise rules).
PE_ALWAYS_INLINE constexpr bool IsRowwise(Rule rule) {
  return rule == Rule::kRowwiseAdagrad || rule == Rule::kRowwiseAdam;
}

// What storing a computed value in T and loading it back gives: the identity
// where T is its own compute type, one rounding for 16-bit types.
template <typename T>
PE_ALWAYS_INLINE typename Arith<T>::Compute Rounded(
    typename Arith<T>::Compute x) {
  return Arith<T>::Load(Arith<T>::Store(x));
}

// max(a, b) as TensorFlow's Maximum computes it: NaN if either is NaN.
template <typename C>
PE_ALWAYS_INLINE C MaximumPropagatingNaN(C a, C b) {
  if (a != a) return a;
  if (b != b) return b;
  return a < b ? b : a;
}

// FTRL's exponent p = -learning_rate_power (its hyperparameter kFtrlPower),
// in the forms that need no pow: a^0.5 (Keras' default learning_rate_power =
// -0.5) is sqrt(a) + 0, rounded once (pow's +0 at a = -0 included; only at
// a = -inf, which an accumulator never holds, does pow give +inf where it
// gives NaN), a^0 is 1 and a^1 is a, as pow gives them exactly. kRuntime:
// the form is read from RuleConstants::power_form at each element (the GPU
// skeleton); the CPU skeleton picks the form once per row so that each form's
// loop is free of calls and vectorizes.
enum class PowerForm : int32_t { kRuntime, kGeneral, kHalf, kZero, kOne };
inline constexpr int kFtrlPower = 5;

template <typename C>
PE_ALWAYS_INLINE PowerForm PowerFormOf(C power) {
  if (power == C(0.5)) return PowerForm::kHalf;
  if (power == C(0)) return PowerForm::kZero;
  if (power == C(1)) return PowerForm::kOne;
  return PowerForm::kGeneral;
}

// A step's hyperparameters in the storage type, in the rule's table order
// (unused places are zero).
template <typename T>
struct RuleHyperparameters {
  T values[kMaxHyperparameters];
};

// The same in the compute type.
template <typename T>
struct RuleConstants {
  using C = typename Arith<T>::Compute;
  PE_ALWAYS_INLINE explicit RuleConstants(const T* values) {
    for (int i = 0; i < kMaxHyperparameters; ++i) {
      h[i] = Arith<T>::Load(values[i]);
    }
    decays = h[kWeightDecay] != C(0);
    power_form = PowerFormOf(h[kFtrlPower]);
  }
  C h[kMaxHyperparameters];
  bool decays;  // Whether weight_decay is not zero.
  // The form of h[kFtrlPower] (FTRL's exponent; other rules ignore it).
  PowerForm power_form;
};

// a^p for FTRL's exponent p = h[kFtrlPower], rounded to T: `kForm`, or
// k.power_form where kForm is kRuntime (PowerForm).
template <PowerForm kForm, typename T, typename Ops>
PE_ALWAYS_INLINE typename Arith<T>::Compute FtrlPower(
    const RuleConstants<T>& k, typename Arith<T>::Compute a) {
  using C = typename Arith<T>::Compute;
  const PowerForm form = kForm == PowerForm::kRuntime ? k.power_form : kForm;
  if (form == PowerForm::kHalf) return Rounded<T>(Ops::Add(Ops::Sqrt(a), C(0)));
  if (form == PowerForm::kZero) return C(1);
  if (form == PowerForm::kOne) return a;
  return Rounded<T>(Ops::Pow(a, k.h[kFtrlPower]));
}

// The tables of a step as raw row-major pointers: var is
// [num_rows, row_size]; slot i is [slot rows, row_size] per element or
// [slot rows] per row (the rule's per_row), null past the rule's count.
template <typename T>
struct RuleTables {
  T* var = nullptr;
  T* slots[kMaxSlots] = {};
  int64_t num_rows = 0;
  int64_t row_size = 0;
};

// A row's share of a step: the row-wise rules' per-row slot update (written
// here) and the one factor every element of the row is then multiplied by,
// computed once a row so an element's step is a single multiply. Only the
// row-wise rules have one; `mean_square` is the mean over the row of g * g,
// rounded to T (RowMeanSquare).
template <Rule kRule, typename T, typename Ops>
PE_ALWAYS_INLINE typename Arith<T>::Compute RowStatistic(
    const RuleConstants<T>& k, typename Arith<T>::Compute mean_square,
    T* row_slot) {
  using A = Arith<T>;
  using C = typename A::Compute;
  const C* h = k.h;
  if constexpr (kRule == Rule::kRowwiseAdagrad) {
    // G += mean(g^2); the factor lr / (sqrt(G) + epsilon).
    const C sum = Rounded<T>(Ops::Add(A::Load(*row_slot), mean_square));
    *row_slot = A::Store(sum);
    const C denominator =
        Rounded<T>(Ops::Add(Rounded<T>(Ops::Sqrt(sum)), h[2]));
    return Rounded<T>(Ops::Div(h[kLearningRate], denominator));
  } else if constexpr (kRule == Rule::kRowwiseAdam) {
    // v += (mean(g^2) - v) * (1 - beta_2); the factor
    // lr / ((1 - beta_1^t) * (sqrt(v / (1 - beta_2^t)) + epsilon)).
    const C v_old = A::Load(*row_slot);
    const C v_new = Rounded<T>(Ops::Add(
        v_old,
        Rounded<T>(Ops::Mul(Rounded<T>(Ops::Sub(mean_square, v_old)), h[3]))));
    *row_slot = A::Store(v_new);
    const C denominator = Rounded<T>(Ops::Add(
        Rounded<T>(Ops::Sqrt(Rounded<T>(Ops::Div(v_new, h[6])))), h[4]));
    return Rounded<T>(
        Ops::Div(h[kLearningRate], Rounded<T>(Ops::Mul(h[5], denominator))));
  } else {
    (void)h;
    (void)mean_square;
    (void)row_slot;
    return C(0);
  }
}

// The mean of g * g over a row of `row_size` values, each square rounded to
// T, summed in the compute type in a fixed order that vectorizes: eight
// running sums (column j goes to sum j % 8), then added pairwise (0 + 4,
// 1 + 5, ..., then 0 + 2, 1 + 3, then 0 + 1); rounded to T. The CPU skeleton
// sums so; a GPU may group the sum differently (within rounding).
template <typename T, typename Ops>
PE_ALWAYS_INLINE typename Arith<T>::Compute RowMeanSquare(
    const typename Arith<T>::Compute* g, int64_t row_size) {
  using C = typename Arith<T>::Compute;
  constexpr int kLanes = 8;
  C sums[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= row_size; j += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      sums[lane] =
          Ops::Add(sums[lane], Rounded<T>(Ops::Mul(g[j + lane], g[j + lane])));
    }
  }
  for (int lane = 0; j < row_size; ++j, ++lane) {
    sums[lane] = Ops::Add(sums[lane], Rounded<T>(Ops::Mul(g[j], g[j])));
  }
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int lane = 0; lane < width; ++lane) {
      sums[lane] = Ops::Add(sums[lane], sums[lane + width]);
    }
  }
  return Rounded<T>(Ops::Div(sums[0], static_cast<C>(row_size)));
}

// The step on one element of var and of its per-element slots (s[i] points
// at the element of slot i; per-row slots are RowStatistic's), given the
// element's summed gradient and the row's statistic. kPower: the form of
// FTRL's exponent (PowerForm; the others rules ignore it).
template <Rule kRule, typename T, typename Ops,
          PowerForm kPower = PowerForm::kRuntime>
PE_ALWAYS_INLINE void ElementStep(const RuleConstants<T>& k,
                                  typename Arith<T>::Compute grad,
                                  typename Arith<T>::Compute row_statistic,
                                  T& var, T* const s[kMaxSlots]) {
  using A = Arith<T>;
  using C = typename A::Compute;
  const C* h = k.h;
  const C lr = h[kLearningRate];
  (void)row_statistic;
  // Rounded(a op b), the shorthand of every line below.
  const auto add = [](C a, C b) { return Rounded<T>(Ops::Add(a, b)); };
  const auto sub = [](C a, C b) { return Rounded<T>(Ops::Sub(a, b)); };
  const auto mul = [](C a, C b) { return Rounded<T>(Ops::Mul(a, b)); };
  const auto div = [](C a, C b) { return Rounded<T>(Ops::Div(a, b)); };
  const auto sqrt = [](C a) { return Rounded<T>(Ops::Sqrt(a)); };
  C x = A::Load(var);
  if (k.decays) x = sub(x, mul(mul(x, h[kWeightDecay]), lr));
  if constexpr (kRule == Rule::kSgd) {
    x = sub(x, mul(grad, lr));
  } else if constexpr (kRule == Rule::kMomentum || kRule == Rule::kNesterov) {
    // m = m * momentum - g * lr; var += m (Nesterov: m * momentum - g * lr).
    const C m = sub(mul(A::Load(*s[0]), h[2]), mul(grad, lr));
    *s[0] = A::Store(m);
    x = add(x, kRule == Rule::kNesterov ? sub(mul(m, h[2]), mul(grad, lr)) : m);
  } else if constexpr (kRule == Rule::kAdagrad) {
    // accumulator += g^2; var -= lr * g / sqrt(accumulator + epsilon).
    const C accumulator = add(A::Load(*s[0]), mul(grad, grad));
    *s[0] = A::Store(accumulator);
    x = sub(x, div(mul(lr, grad), sqrt(add(accumulator, h[2]))));
  } else if constexpr (kRule == Rule::kRmsprop ||
                       kRule == Rule::kRmspropMomentum ||
                       kRule == Rule::kRmspropCentered ||
                       kRule == Rule::kRmspropCenteredMomentum) {
    constexpr bool kCentered = kRule == Rule::kRmspropCentered ||
                               kRule == Rule::kRmspropCenteredMomentum;
    constexpr bool kMomentumSlot = kRule == Rule::kRmspropMomentum ||
                                   kRule == Rule::kRmspropCenteredMomentum;
    // velocity = rho * velocity + (1 - rho) * g^2, and with centered the
    // average gradient alike; increment = lr * g / sqrt(denominator).
    const C velocity =
        add(mul(h[2], A::Load(*s[0])), mul(h[3], mul(grad, grad)));
    *s[0] = A::Store(velocity);
    C denominator;
    if constexpr (kCentered) {
      T* average_slot = s[kMomentumSlot ? 2 : 1];
      const C average = add(mul(h[2], A::Load(*average_slot)), mul(h[3], grad));
      *average_slot = A::Store(average);
      denominator = add(sub(velocity, mul(average, average)), h[4]);
    } else {
      denominator = add(velocity, h[4]);
    }
    const C increment = div(mul(lr, grad), sqrt(denominator));
    if constexpr (kMomentumSlot) {
      const C momentum = add(mul(h[5], A::Load(*s[1])), increment);
      *s[1] = A::Store(momentum);
      x = sub(x, momentum);
    } else {
      x = sub(x, increment);
    }
  } else if constexpr (kRule == Rule::kAdam || kRule == Rule::kAmsgrad) {
    // m += (g - m) * (1 - beta_1); v += (g^2 - v) * (1 - beta_2);
    // var -= m * alpha / (sqrt(v or max(v_hat, v)) + epsilon).
    const C m_old = A::Load(*s[0]);
    const C m_new = add(m_old, mul(sub(grad, m_old), h[2]));
    const C v_old = A::Load(*s[1]);
    const C v_new = add(v_old, mul(sub(mul(grad, grad), v_old), h[3]));
    C v_used = v_new;
    if constexpr (kRule == Rule::kAmsgrad) {
      v_used = MaximumPropagatingNaN(A::Load(*s[2]), v_new);
      *s[2] = A::Store(v_used);
    }
    const C step = div(mul(m_new, h[5]), add(sqrt(v_used), h[4]));
    *s[0] = A::Store(m_new);
    *s[1] = A::Store(v_new);
    x = sub(x, step);
  } else if constexpr (kRule == Rule::kRowwiseAdagrad) {
    // var -= g * (lr / (sqrt(G) + epsilon)), the factor the row's.
    x = sub(x, mul(grad, row_statistic));
  } else if constexpr (kRule == Rule::kRowwiseAdam) {
    // m += (g - m) * (1 - beta_1); var -= m * the row's factor.
    const C m_old = A::Load(*s[0]);
    const C m_new = add(m_old, mul(sub(grad, m_old), h[2]));
    *s[0] = A::Store(m_new);
    x = sub(x, mul(m_new, row_statistic));
  } else if constexpr (kRule == Rule::kFtrl) {
    // n = accumulator + g^2, p(a) = a^power (power = -learning_rate_power);
    // linear += g + two_l2_shrinkage * var - (p(n) - p(accumulator)) / lr *
    // var; var = (clip(linear, -l1, l1) - linear) / (p(n) / lr + two_l2),
    // where two_l2 = 2 * (l2 + beta / (2 * lr)).
    const auto pow = [&k](C a) { return FtrlPower<kPower, T, Ops>(k, a); };
    const C accumulator = A::Load(*s[0]);
    const C updated = add(accumulator, mul(grad, grad));
    const C power_new = pow(updated);
    const C sigma = div(sub(power_new, pow(accumulator)), lr);
    const C shrunk = add(grad, mul(h[3], x));
    const C linear = add(A::Load(*s[1]), sub(shrunk, mul(sigma, x)));
    const C l1 = h[2];
    // clip as TensorFlow's clip_by_value: max(min(linear, l1), -l1), a NaN
    // kept.
    C clipped = l1 < linear ? l1 : linear;
    clipped = clipped < -l1 ? -l1 : clipped;
    const C quadratic = add(div(power_new, lr), h[4]);
    *s[0] = A::Store(updated);
    *s[1] = A::Store(linear);
    x = div(sub(clipped, linear), quadratic);
  }
  var = A::Store(x);
}

// Calls f(std::integral_constant<Rule, rule>{}): how a skeleton turns the
// rule of a step into the template argument of its loops. Host code only:
// PE_ALWAYS_INLINE would make it host and device under nvcc, which then warns
// at every host lambda it calls.
template <int kCandidate = 0, typename F>
inline void DispatchRule(Rule rule, F&& f) {
  if constexpr (kCandidate < kNumRules) {
    constexpr Rule kRule = static_cast<Rule>(kCandidate);
    if (rule == kRule) return f(std::integral_constant<Rule, kRule>{});
    DispatchRule<kCandidate + 1>(rule, f);
  }
}

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_ROW_RULES_H_
