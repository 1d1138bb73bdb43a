// Element math of Fourier integral attention, shared by the CPU and CUDA kernels.
//
// The series below are plain arithmetic on a template type T, so the same code runs on
// a CUDA thread (T = float / double), in the scalar float64 CPU path, and on a GCC
// vector of 16 floats in the vectorised CPU kernel (scalar constants broadcast there).
// The *_from_* helpers branch, so they are for scalar T only.
//
//   sinc(x) = sin(x) / x,    x = R_d (q_id - k_jd)
//   S_ij    = p * sum_d log|sinc(x_ijd)|
//   dS/dx   = p * g(x),      g(x) = d/dx log|sinc x| = cot(x) - 1/x = (x cos x - sin x) / (x sin x)
//
// Near x = 0 both sinc and g use their Taylor series, which keeps sinc exactly 1 and
// g exactly 0 at q = k and avoids the cancellation of sin(x)/x and cot(x) - 1/x.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FF_HD __host__ __device__ __forceinline__
#else
#define FF_HD inline __attribute__((always_inline))
#endif

namespace fourierformer {

// |x| below this uses the Taylor series (error of the truncated series < 1e-12 there).
constexpr float kSincTaylorBound = 0.25f;
// |sin x| is clamped to at least this before a log or a division: values below it are
// below the rounding error of sin in float32 anyway, and it keeps products of four
// factors inside the normal float range (see the CPU kernel's renormalisation).
constexpr float kSinFloor = 1e-9f;
// |x| is clamped to at most this for the same reason (float32 sin is meaningless there).
constexpr float kXCeil = 1e9f;

// Bound of the Taylor branch by type: float64 computes sin directly, so its bound only has
// to cover the cancellation of cot(x) - 1/x (relative error ~3 eps / x^2).
template <typename T>
FF_HD constexpr float taylor_bound() { return kSincTaylorBound; }
template <>
FF_HD constexpr float taylor_bound<double>() { return 0.05f; }

// sinc(x) = 1 - x^2/6 + x^4/120 for small |x| in float precision: the next term, x^6/5040,
// is below 5e-8 for |x| < kSincTaylorBound. Any float-like T (float, a float vector).
template <typename T>
FF_HD T sinc_taylor(T x2) {
  return 1.0f + x2 * (-1.0f / 6.0f + x2 * (1.0f / 120.0f));
}
// float64 keeps two more terms (its bound is taylor_bound<double>()).
FF_HD double sinc_taylor(double x2) {
  return 1.0 + x2 * (-1.0 / 6.0 + x2 * (1.0 / 120.0 + x2 * (-1.0 / 5040.0 + x2 * (1.0 / 362880.0))));
}

// ln 2 = kLn2High + kLn2Low; e * kLn2High is exact for |e| < 2^15 (355 / 512, Cody and Waite).
constexpr float kLn2High = 0.693359375f;
constexpr float kLn2Low = -2.12194440e-4f;

// log(1 + f) for 1 + f in [sqrt(1/2), sqrt(2)): Cephes' logf polynomial, the one of the CPU
// kernel's vlog_near_one and the CUDA kernels' log_near_one. Any float-like T.
template <typename T>
FF_HD T log_poly_near_one(T f) {
  const T z = f * f;
  T p = f * 7.0376836292E-2f - 1.1514610310E-1f;
  p = p * f + 1.1676998740E-1f;
  p = p * f - 1.2420140846E-1f;
  p = p * f + 1.4249322787E-1f;
  p = p * f - 1.6668057665E-1f;
  p = p * f + 2.0000714765E-1f;
  p = p * f - 2.4999993993E-1f;
  p = p * f + 3.3333331174E-1f;
  return f * z * p - 0.5f * z + f;
}

// g(x) = cot(x) - 1/x = -x/3 - x^3/45 - 2x^5/945 - x^7/4725 - ... for small |x|: in float, for
// |x| < kSincTaylorBound, x (c0 + c1 x^2 + c2 x^4) with the minimax c1, c2 of g(x) / x on
// x^2 <= 1/16 (relative error 4.9e-9, below float's rounding; the series to x^7 was 1.4e-9):
// two FMAs and a multiply.
template <typename T>
FF_HD T dlog_sinc_taylor(T x, T x2) {
  return x * (-1.0f / 3.0f + x2 * (-0.022221753373742104f + x2 * -0.0021363887935876846f));
}
// float64 needs its coefficients in float64 (as floats they are off by up to 3e-8 relative)
// and one more term (-2x^9/93555).
FF_HD double dlog_sinc_taylor(double x, double x2) {
  return x * (-1.0 / 3.0 + x2 * (-1.0 / 45.0 + x2 * (-2.0 / 945.0 + x2 * (-1.0 / 4725.0 + x2 * (-2.0 / 93555.0)))));
}

// ---- phi = sigmoid: log sigmoid(y) and sigmoid(-y) at y = sinc x, on sinc's range [-0.2173, 1] ----
// Polynomials of degree 8 in y, fitted in float64 at Chebyshev points of [-0.2173, 1.0001] (their
// error there below 2^-22 relative when evaluated in float32): the coefficients of the CPU kernel's
// log_sigmoid_of_sinc and sigmoid_of_minus_sinc (cpu/sinc_tables.inc). Any float-like T; the CUDA
// kernels' float32 path and simple float32 kernels evaluate them (float64 takes the formula:
// log_sigmoid_f64, dlog_sigmoid_sinc_f64).
template <typename T>
FF_HD T log_sigmoid_poly(T y) {
  return -0.6931471806375562f +
         y * (0.500000003836925f +
              y * (-0.12499999053000288f +
                   y * (-2.79427248558935e-07f +
                        y * (0.005208766765036044f +
                             y * (3.7314403541035727e-06f +
                                  y * (-0.00036272603101880185f +
                                       y * (2.2980815199169873e-05f + y * 1.3006955692541957e-05f)))))));
}
template <typename T>
FF_HD T sigmoid_minus_poly(T y) {
  return 0.49999999994889627f +
         y * (-0.24999999450740054f +
              y * (-5.256360602355476e-10f +
                   y * (0.02083294585066474f +
                        y * (1.1295121908649523e-06f +
                             y * (-0.002079275563611863f +
                                  y * (-2.5966706658339092e-05f +
                                       y * (0.0002637498748978036f + y * -5.116597418391189e-05f)))))));
}

// float64: log sigmoid(sinc x) = -log(1 + e^-y) with y = sin(x) / x (1 at x = 0; the quotient keeps
// its relative accuracy down to tiny x in float64), as the CPU's float64 path (cpu/scalar_f64.h).
FF_HD double log_sigmoid_sinc_f64(double x) {
  const double y = x == 0.0 ? 1.0 : sin(x) / x;
  return -log1p(exp(-y));
}

// float64: d log sigmoid(sinc x) / dx = sigmoid(-sinc x) sinc'(x), sinc'(x) = (x cos x - sin x) / x^2,
// or its series below |x| = 0.1 (where the quotient cancels; the next term is below 1e-19 there), as
// the CPU's float64 path (cpu/scalar_f64.h, ScalarSlice::dlog_sigmoid_sinc).
FF_HD double dlog_sigmoid_sinc_f64(double x) {
  const double x2 = x * x;
  const double y = x == 0.0 ? 1.0 : sin(x) / x;
  const double derivative =
      (x < 0.0 ? -x : x) < 0.1
          ? x * (-1.0 / 3 + x2 * (1.0 / 30 + x2 * (-1.0 / 840 + x2 * (1.0 / 45360 + x2 * (-1.0 / 3991680)))))
          : (x * cos(x) - sin(x)) / x2;
  return derivative / (1.0 + exp(y));
}

// Scalar log|sinc(x)| from a precomputed sin(x); used by the CUDA kernel and the
// float64 CPU path. Returns -inf exactly where sin(x) == 0 and x != 0.
FF_HD float ff_log(float x) { return logf(x); }
FF_HD double ff_log(double x) { return log(x); }

template <typename T>
FF_HD T log_abs_sinc_from_sin(T x, T sin_x) {
  T ax = x < T(0) ? -x : x;
  if (ax < T(taylor_bound<T>())) return ff_log(sinc_taylor(x * x));
  T as = sin_x < T(0) ? -sin_x : sin_x;
  return ff_log(as) - ff_log(ax);
}

// Scalar g(x) from precomputed sin and cos; finite everywhere (0 at x = 0).
template <typename T>
FF_HD T dlog_sinc_from_sincos(T x, T sin_x, T cos_x) {
  T ax = x < T(0) ? -x : x;
  if (ax < T(taylor_bound<T>())) return dlog_sinc_taylor(x, x * x);
  T s = sin_x;
  if (s > -T(kSinFloor) && s < T(kSinFloor)) s = s < T(0) ? -T(kSinFloor) : T(kSinFloor);
  return (x * cos_x - s) / (x * s);
}

// ---- The published normaliser: out_i = sum_j w_ij v_j / (sum_j w_ij + eps), a null key of
// log-weight log(eps) and value 0. Kernels keep lse_i = log sum_j w_ij over the real keys (the
// forward and the backward's recomputed P are unchanged); the null key only scales a row's
// weights by its real keys' share of the mass,
//     m_i = sum_j w_ij / (sum_j w_ij + eps) = sigmoid(lse_i - log eps),
// so P~_ij = m_i P_ij, out~_i = m_i out_i and dS_ij = P~_ij (dP_ij - Delta~_i) with
// Delta~_i = sum_j P~_ij dP_ij. log_eps = -inf (eps = 0) gives m = 1 exactly; a row whose keys
// all underflow (lse_i << log eps) gives m = 0: out 0 and gradients 0. Computed in float64.
FF_HD double null_key_log_share(double lse, double log_eps) {
  // -softplus(log_eps - lse) = log sigmoid(lse - log_eps), without overflow
  const double x = log_eps - lse;
  if (!(x > -INFINITY)) return 0.0;  // eps = 0, or lse = +inf (a row without keys: P is 0 anyway)
  return x > 0.0 ? -(x + log1p(exp(-x))) : -log1p(exp(x));
}
FF_HD double null_key_share(double lse, double log_eps) { return exp(null_key_log_share(lse, log_eps)); }

// ---- Attention dropout: a counter-based RNG, identical on CPU, CUDA and in the reference
// (fourierformer_fairseq/ops/reference.py: dropout_keep_mask). ----
// SASS: cold=dropout_hash begin
FF_HD uint32_t ff_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
  // SASS: cold=dropout_hash end
}

// Uniform in [0, 1) with 24 random bits for element (bh, i, j) of one call.
// SASS: cold=dropout_hash begin
FF_HD float ff_dropout_uniform(uint32_t seed, uint32_t bh, uint32_t i, uint32_t j) {
  uint32_t x = seed ^ (bh * 0x9E3779B1u);
  x = ff_mix32(x ^ (i * 0x85EBCA77u));
  x = ff_mix32(x ^ (j * 0xC2B2AE3Du));
  return float(x >> 8) * (1.0f / 16777216.0f);
  // SASS: cold=dropout_hash end
}

}  // namespace fourierformer
