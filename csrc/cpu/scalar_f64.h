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
  bool odd_power;  // phi(x) = x^p, odd p: signed weights sign e^S (see SliceArgs::odd_power)
  const T* attn_mask;
  int64_t mask_row_stride;
  const T* key_bias;
  bool causal;
  T dropout_p;
  uint32_t seed, bh;
  double log_eps;  // log of the normaliser's eps, -inf for 0 (null_key_share)

  int64_t visible_end(int64_t i) const { return causal ? std::min(M, i + (M - N) + 1) : M; }

  // S_ij = p sum_d log|sinc x| + mask (phi's score); with odd_power, *negative gets the sign of the
  // weight (of the product of the sincs).
  T score(int64_t i, int64_t j, bool* negative = nullptr) const {
    T mask = 0;
    if (attn_mask) mask += attn_mask[i * mask_row_stride + j];
    if (key_bias) mask += key_bias[j];
    if (mask == -std::numeric_limits<T>::infinity()) return mask;  // a masked key's score is not formed
    T s = 0;
    bool dead = false;  // (relu: a negative factor)
    bool odd = false;  // (odd_power: an odd number of negative factors)
    for (int64_t d = 0; d < D; ++d) {
      T x = radius[d] * (q[i * D + d] - k[j * D + d]);
      const T sin_x = std::sin(x);
      if (sigmoid) {  // log sigmoid(sinc x) (../fourier_element_math.h)
        s += (T)log_sigmoid_sinc_f64((double)x);
        continue;
      }
      s += log_abs_sinc_from_sin(x, sin_x);
      dead |= relu && sin_x * x < 0;
      odd ^= sin_x * x < 0;
    }
    if (negative) *negative = odd_power && odd;
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
    std::vector<char> negative(M);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t end = visible_end(i);
      T m = -std::numeric_limits<T>::infinity();
      bool nan_row = false;  // a NaN score, or a +inf one (a +inf mask): the formula's row is NaN
      for (int64_t j = 0; j < end; ++j) {
        bool neg = false;
        row[j] = score(i, j, &neg);
        negative[j] = neg;
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
        if (negative[j]) e = -e;
        sum += e;
        e *= dropout_scale(i, j);
        if (e == 0) continue;
        for (int64_t c = 0; c < Dv; ++c) out_i[c] += e * v[j * Dv + c];
      }
      // (odd p: the signed sum, and the null key here: w / (sum_j w_j + eps), see signed_row_scale)
      const T denominator = odd_power && log_eps > -std::numeric_limits<double>::infinity()
                                ? sum + (T)std::exp(log_eps - (double)m)
                                : sum;
      for (int64_t c = 0; c < Dv; ++c) out_i[c] /= denominator;
      lse[i] = m + std::log(std::abs(sum));
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
      const int64_t end = visible_end(i);
      // odd p: P = sign e^(S - lse) sums to the normaliser's sign, +-1, and P / (that sum + eps e^-lse)
      // is w / (Z + eps), as in the float32 kernels (signed_row_scale)
      T sign_sum = 0;
      for (int64_t j = 0; j < end; ++j) {
        bool neg = false;
        P[j] = std::exp(score(i, j, &neg) - lse[i]);
        if (neg) P[j] = -P[j];
        sign_sum += P[j];
      }
      const T share = odd_power ? T(1) / (sign_sum + (log_eps > -std::numeric_limits<double>::infinity()
                                                          ? (T)std::exp(log_eps - lse[i])
                                                          : T(0)))
                                : (T)null_key_share(lse[i], log_eps);
      T delta = 0;
      for (int64_t j = 0; j < end; ++j) {
        P[j] *= share;  // the weight after the null key
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
          const T dx = coef * (sigmoid ? (T)dlog_sigmoid_sinc_f64((double)x) : dlog_sinc_from_sincos(x, std::sin(x), std::cos(x)));
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
