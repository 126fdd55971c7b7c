// The fused Adam step on one element, shared by the CPU core
// (masked_sparse_apply_cpu.cc) and the CUDA core (masked_sparse_apply_gpu.cu)
// so both compute the same operations in the same order (the step is spelled
// out in masked_sparse_apply.h).
//
// `Ops` supplies the arithmetic in the compute type, each operation rounded
// once to nearest: plain operators on the CPU (compiled with
// -ffp-contract=off, so nothing is fused into a multiply-add), IEEE
// round-to-nearest intrinsics on the GPU (which are never contracted). Every
// result is then rounded to the storage type T, as TensorFlow's separate
// elementwise ops round it.
#ifndef PARTIAL_EMBEDDING_CC_CORE_ADAM_RULE_H_
#define PARTIAL_EMBEDDING_CC_CORE_ADAM_RULE_H_

#include "cc/core/row_update_common.h"

#if defined(__CUDACC__)
#define PE_ALWAYS_INLINE __host__ __device__ __forceinline__
#else
#define PE_ALWAYS_INLINE inline __attribute__((always_inline))
#endif

namespace partial_embedding {

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

// The hyperparameters of a step in the compute type.
template <typename T>
struct AdamConstants {
  using C = typename Arith<T>::Compute;
  PE_ALWAYS_INLINE AdamConstants(T learning_rate_in, T one_minus_beta_1_in,
                                 T one_minus_beta_2_in, T epsilon_in,
                                 T alpha_in, T weight_decay_in)
      : learning_rate(Arith<T>::Load(learning_rate_in)),
        one_minus_beta_1(Arith<T>::Load(one_minus_beta_1_in)),
        one_minus_beta_2(Arith<T>::Load(one_minus_beta_2_in)),
        epsilon(Arith<T>::Load(epsilon_in)),
        alpha(Arith<T>::Load(alpha_in)),
        weight_decay(Arith<T>::Load(weight_decay_in)),
        decays(weight_decay != C(0)) {}
  C learning_rate;
  C one_minus_beta_1;
  C one_minus_beta_2;
  C epsilon;
  C alpha;
  C weight_decay;
  bool decays;  // Whether weight_decay is not zero.
};

// The step on one element of var and of its slots, given the element's
// summed gradient. With kAmsgrad the denominator uses v_hat = max(v_hat, v),
// which is also written (v_hat is ignored otherwise).
template <typename T, typename Ops, bool kAmsgrad>
PE_ALWAYS_INLINE void AdamElementStep(typename Arith<T>::Compute grad,
                                      const AdamConstants<T>& k, T& var, T& m,
                                      T& v, T* v_hat) {
  using A = Arith<T>;
  using C = typename A::Compute;
  C x = A::Load(var);
  if (k.decays) {
    x = Rounded<T>(
        Ops::Sub(x, Rounded<T>(Ops::Mul(Rounded<T>(Ops::Mul(x, k.weight_decay)),
                                        k.learning_rate))));
  }
  const C m_old = A::Load(m);
  const C m_new = Rounded<T>(
      Ops::Add(m_old, Rounded<T>(Ops::Mul(Rounded<T>(Ops::Sub(grad, m_old)),
                                          k.one_minus_beta_1))));
  const C v_old = A::Load(v);
  const C v_new = Rounded<T>(Ops::Add(
      v_old, Rounded<T>(Ops::Mul(
                 Rounded<T>(Ops::Sub(Rounded<T>(Ops::Mul(grad, grad)), v_old)),
                 k.one_minus_beta_2))));
  C v_used = v_new;
  if constexpr (kAmsgrad) {
    v_used = MaximumPropagatingNaN(A::Load(*v_hat), v_new);
    *v_hat = A::Store(v_used);
  }
  const C denominator =
      Rounded<T>(Ops::Add(Rounded<T>(Ops::Sqrt(v_used)), k.epsilon));
  const C step =
      Rounded<T>(Ops::Div(Rounded<T>(Ops::Mul(m_new, k.alpha)), denominator));
  m = A::Store(m_new);
  v = A::Store(v_new);
  var = A::Store(Ops::Sub(x, step));
}

}  // namespace partial_embedding

#endif  // PARTIAL_EMBEDDING_CC_CORE_ADAM_RULE_H_
