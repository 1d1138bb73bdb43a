// The float64 path of the CPU backend: scalar loops over the math of the float32 kernels
// (sin and log per element), for tests and gradcheck. One (batch, head) slice per ScalarSlice.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../fourier_element_math.h"

namespace fourierformer {
namespace cpu {

template <typename T>
struct ScalarSlice {
  const T* q;
  const T* k;
  const T* v;
  const T* radius;
  int64_t N, M, D, Dv;
  T power;
  bool relu;  // phi = ReLU (power 1): a key with a factor whose sinc is negative has weight 0
  bool sigmoid;  // phi = sigmoid (power 1): S = sum_d log sigmoid(sinc x), in the log domain
  const T* attn_mask;
  int64_t mask_row_stride;
  const T* key_bias;
  bool causal;
  T dropout_p;
  uint32_t seed, bh;
  double log_eps;  // log of the normaliser's eps, -inf for 0 (null_key_share)

  int64_t visible_end(int64_t i) const { return causal ? std::min(M, i + (M - N) + 1) : M; }

  // d log sigmoid(sinc x) / dx = sigmoid(-sinc x) sinc'(x), sinc'(x) = (x cos x - sin x) / x^2, or
  // its series below |x| = 0.1 (where the quotient cancels; the next term is below 1e-19 there).
  static T dlog_sigmoid_sinc(T x) {
    const T x2 = x * x;
    const T y = x == 0 ? T(1) : std::sin(x) / x;
    const T derivative =
        std::abs(x) < T(0.1)
            ? x * (T(-1) / 3 + x2 * (T(1) / 30 + x2 * (T(-1) / 840 + x2 * (T(1) / 45360 + x2 * (T(-1) / 3991680)))))
            : (x * std::cos(x) - std::sin(x)) / x2;
    return derivative / (T(1) + std::exp(y));
  }

  T score(int64_t i, int64_t j) const {
    T mask = 0;
    if (attn_mask) mask += attn_mask[i * mask_row_stride + j];
    if (key_bias) mask += key_bias[j];
    if (mask == -std::numeric_limits<T>::infinity()) return mask;  // a masked key's score is not formed
    T s = 0;
    bool dead = false;  // (relu: a negative factor)
    for (int64_t d = 0; d < D; ++d) {
      T x = radius[d] * (q[i * D + d] - k[j * D + d]);
      const T sin_x = std::sin(x);
      if (sigmoid) {  // log sigmoid(y) = -log(1 + e^-y), y = sinc x
        s -= std::log1p(std::exp(-(x == 0 ? T(1) : sin_x / x)));
        continue;
      }
      s += log_abs_sinc_from_sin(x, sin_x);
      dead |= relu && sin_x * x < 0;
    }
    // (ReLU's zero weight: -inf, NaN with a NaN or +inf mask, as the formula's 0 e^mask)
    return dead ? -std::numeric_limits<T>::infinity() + mask : s * power + mask;
  }

  T dropout_scale(int64_t i, int64_t j) const {
    if (dropout_p <= 0) return T(1);
    return ff_dropout_uniform(seed, bh, (uint32_t)i, (uint32_t)j) >= (float)dropout_p ? T(1) / (T(1) - dropout_p)
                                                                                       : T(0);
  }

  void forward(T* out, double* lse, std::vector<T>& row) const {
    row.resize(M);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t end = visible_end(i);
      T m = -std::numeric_limits<T>::infinity();
      bool nan_row = false;  // a NaN score, or a +inf one (a +inf mask): the formula's row is NaN
      for (int64_t j = 0; j < end; ++j) {
        row[j] = score(i, j);
        nan_row |= !(row[j] < std::numeric_limits<T>::infinity()) && row[j] != -std::numeric_limits<T>::infinity();
        m = std::max(m, row[j]);
      }
      T* out_i = out + i * Dv;
      for (int64_t c = 0; c < Dv; ++c) out_i[c] = nan_row ? std::numeric_limits<T>::quiet_NaN() : 0;
      if (nan_row) {
        lse[i] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      if (!(m > -std::numeric_limits<T>::infinity())) {
        lse[i] = std::numeric_limits<T>::infinity();
        continue;
      }
      T sum = 0;
      for (int64_t j = 0; j < end; ++j) {
        T e = std::exp(row[j] - m);
        sum += e;
        e *= dropout_scale(i, j);
        if (e == 0) continue;
        for (int64_t c = 0; c < Dv; ++c) out_i[c] += e * v[j * Dv + c];
      }
      for (int64_t c = 0; c < Dv; ++c) out_i[c] /= sum;
      lse[i] = m + std::log(sum);
    }
  }

  // out is not read: Delta_i = sum_j P_ij f_ij dP_ij is summed from the weights recomputed here
  // (with the null key's share m_i in P), as in the float32 kernels: Delta from the stored
  // output differs from this by the output's rounding, which rows with their weight on one
  // key amplify in dq, dk and dradius.
  void backward(const T* out, const double* lse, const T* dout, T* dq, T* dk, T* dv, T* dradius) const {
    (void)out;
    for (int64_t n = 0; n < M * D; ++n) dk[n] = 0;
    for (int64_t n = 0; n < M * Dv; ++n) dv[n] = 0;
    for (int64_t n = 0; n < N * D; ++n) dq[n] = 0;
    for (int64_t d = 0; d < D; ++d) dradius[d] = 0;
    std::vector<T> P(M), dP(M);
    for (int64_t i = 0; i < N; ++i) {
      if (!(lse[i] < std::numeric_limits<T>::infinity())) continue;
      const T* dout_i = dout + i * Dv;
      const T share = (T)null_key_share(lse[i], log_eps);
      const int64_t end = visible_end(i);
      T delta = 0;
      for (int64_t j = 0; j < end; ++j) {
        P[j] = share * std::exp(score(i, j) - lse[i]);  // the weight after the null key
        T dot = 0;
        if (P[j] != 0)
          for (int64_t c = 0; c < Dv; ++c) dot += dout_i[c] * v[j * Dv + c];
        dP[j] = dot;
        delta += P[j] * dropout_scale(i, j) * dot;
      }
      for (int64_t j = 0; j < end; ++j) {
        if (P[j] == 0) continue;
        const T f = dropout_scale(i, j);
        for (int64_t c = 0; c < Dv; ++c) dv[j * Dv + c] += P[j] * f * dout_i[c];
        const T coef = power * P[j] * (dP[j] * f - delta);
        for (int64_t d = 0; d < D; ++d) {
          const T diff = q[i * D + d] - k[j * D + d];
          const T x = radius[d] * diff;
          const T dx = coef * (sigmoid ? dlog_sigmoid_sinc(x) : dlog_sinc_from_sincos(x, std::sin(x), std::cos(x)));
          dq[i * D + d] += radius[d] * dx;
          dk[j * D + d] -= radius[d] * dx;
          dradius[d] += diff * dx;
        }
      }
    }
  }
};

}  // namespace cpu
}  // namespace fourierformer
