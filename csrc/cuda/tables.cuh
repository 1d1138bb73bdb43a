// Tables of the float32 path (float32, float16 and bfloat16 inputs): what lets the forward's
// element step do without sin and cos (the formulation of the CPU kernel, ../cpu/sinc_tables.inc).
//
// With a = |R_d| q_id, b = |R_d| k_jd (both exact in float64: 24-bit times 24-bit mantissas),
// x = a - b = |R_d| (q_id - k_jd) and t = tan a, X = fl(cos b), Y = X tan b:
//   s' = t X - Y = rho sin(x) / cos(a),  rho = X / cos(b) = 1 within 2^-24.
// t and Y are each kept as a float and the float of what rounding left, and
//   s' = fma(t_hi, X, -y_hi) + fma(t_lo, X, -y_lo)
// is accurate to a few ulps relative to sin(x) / cos(a), also near x = 0 (the cancellation
// happens inside the exact products of the fmas) and near sinc's other zeros. With q and k
// stored times c_d, the power of two with c_d <= |R_d| < 2 c_d (exact), u = q c - k c is
// x / (|R_d| / c_d), |u| within a factor 2 of |x|, and
//   sinc(x) = (s' / u) * (c_d |cos a| / |R_d|) / rho:
// the middle factor depends only on the row, the last only on the key, so that
//   sum_d log|sinc x_d| = log|prod_d s'_d / prod_d u_d| + row_log_i + key_log_j,
//   row_log_i = sum_d log(c_d |cos a_d| / |R_d|),   key_log_j = -sum_d log rho_jd.
// A flat feature (|R_d| < 1e-9, R = 0 included: sinc = 1 to float precision) stores c = 1,
// q c = q, t = -q and k c = k, X = 1, Y = -k: its factor s' / u = (k - q) / (q - k) is -1
// exactly (the two differences round alike), it adds nothing to row_log or key_log, and its
// x / u is its true |R|, so that g(x) = -x / 3 + ... still gives dq, dk and dR their (tiny)
// values, and R = 0 exactly 0. A padding feature d >= D stores q c = 0, t = 0 and k c = 1,
// X = 1, Y = -1 (s' / u = 1 / -1) and x / u = 0.
//
// The backward gets cos(x) from the same tables: cos(x) / cos(a) = (X + t Y) / rho, so
// cot x = (X + t Y) / s' (no table of cos a at all).
//
// table_kernel: kTableSlots (8) threads per row, each a slot of the features (d = slot + 8 n),
// the float64 sincos and logs per (row, feature) as before, the row's constant summed from the
// slots' partial sums in slot order (was: one thread per row looping over all Dp features: 128
// float64 iterations per thread at head dim 128). sm_90: 52 registers, no spills, 32 warps per
// SM (was 48 and 40). Built per call: the forward and the backward each build their own.
#pragma once

#include "common.cuh"

namespace fourierformer {
namespace cuda {

enum TableRowField : int { kRowQ = 0, kRowTan, kRowTanLow, kRowFields };
enum TableKeyField : int { kKeyK = 0, kKeyCos, kKeySin, kKeySinLow, kKeyFields };
// The products over the features are renormalised every kRenormEvery features (see
// forward_tiled.cuh); the tables pad D to a multiple of it with flat features.
constexpr int kRenormEvery = 8;
// |u| at or below this (|x| below 2^-14) is the rare path: sinc is 1 within 1e-9 there, and
// s' / u, exact 0 / 0 at q = k, loses its relative accuracy (see forward_tiled.cuh).
constexpr float kUFloor = 1.0f / 32768.0f;
// |R| below this: a flat feature (sinc(R u) = 1 to float precision for every u that matters).
constexpr double kFlatRadius = 1e-9;

// (at least one group: the score loop's first group always runs)
FF_HD int padded_features(int D) { return D < 1 ? kRenormEvery : (D + kRenormEvery - 1) / kRenormEvery * kRenormEvery; }

// Floats of the tables for a call (see Params).
FF_HD int64_t table_floats(int64_t BH, int64_t H, int64_t N, int64_t M, int64_t Dp) {
  return BH * (kRowFields * Dp * N + kKeyFields * Dp * M + 2 * N + M) + H * Dp;
}

template <typename scalar_t, typename acc_t>
FF_HD void carve_tables(Params<scalar_t, acc_t>& p, float* ws) {
  const int64_t BH = (int64_t)p.B * p.H, N = p.N, M = p.M, Dp = p.Dp;
  p.trows = ws;
  p.tkeys = p.trows + BH * kRowFields * Dp * N;
  p.row_log_high = p.tkeys + BH * kKeyFields * Dp * M;
  p.row_log_low = p.row_log_high + BH * N;
  p.key_log = p.row_log_low + BH * N;
  p.x_per_u = p.key_log + BH * M;
}

// |R| of feature d and c, the power of two with c <= |R| < 2c; for a flat feature its |R| (0 for
// NaN) and c = 1; -1 for a padding feature.
FF_DEV double feature_radius(const float* radius, int h, int D, int d, double& c) {
  c = 1.0;
  if (d >= D) return -1.0;
  const double r = fabs((double)radius[(int64_t)h * D + d]);
  if (!(r >= kFlatRadius)) return r == r ? r : 0.0;
  int e = 0;
  (void)frexp(r, &e);  // r = m 2^e, m in [1/2, 1)
  c = ldexp(1.0, e - 1);
  return r;
}

// One thread per (row, feature slot): a block takes kTableRows consecutive rows of the
// (batch, head) slices (rows first, then keys, per slice; lane = row, so that the table writes
// are coalesced) and kTableSlots threads per row, slot s computing features s + kTableSlots n;
// the slots' float64 partial sums of the row constant are added in slot order. The first
// H * Dp threads of the grid (by block-major thread index) also write x_per_u.
constexpr int kTableThreads = 256;
constexpr int kTableRows = 32;
constexpr int kTableSlots = kTableThreads / kTableRows;

FF_HD int64_t table_blocks(int64_t BH, int64_t H, int64_t N, int64_t M, int64_t Dp) {
  const int64_t row_blocks = (BH * (N + M) + kTableRows - 1) / kTableRows;
  const int64_t feature_blocks = (H * Dp + kTableThreads - 1) / kTableThreads;
  return row_blocks > feature_blocks ? row_blocks : feature_blocks;
}
FF_HD int64_t table_smem_bytes() { return (int64_t)sizeof(double) * kTableThreads; }

template <typename scalar_t>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kTableThreads) table_kernel(const Params<scalar_t, float> p) {
  FF_DYNAMIC_SHARED(smem_raw);
  double* partial = reinterpret_cast<double*>(smem_raw);  // (kTableSlots, kTableRows)
  const int64_t N = p.N, M = p.M, Dp = p.Dp;
  const int tid = threadIdx.x, lane = tid & (kTableRows - 1), slot = tid / kTableRows;
  const int64_t id = (int64_t)blockIdx.x * kTableThreads + tid;
  if (id < (int64_t)p.H * Dp) {  // the per-feature x / u
    const int h = (int)(id / Dp), d = (int)(id % Dp);
    double c;
    const double r = feature_radius(p.radius, h, p.D, d, c);
    p.x_per_u[id] = r > 0.0 ? (float)(r / c) : 0.0f;
  }
  const int64_t per_slice = N + M;
  const int64_t rid = (int64_t)blockIdx.x * kTableRows + lane;
  const bool on = rid < (int64_t)p.B * p.H * per_slice;
  const int64_t bh = on ? rid / per_slice : 0, row = rid - bh * per_slice;
  const int h = (int)(bh % p.H);
  double log_sum = 0.0;
  if (on && row < N) {  // query row
    const scalar_t* q = p.q + (bh * N + row) * p.D;
    float* out = p.trows + bh * kRowFields * Dp * N + row;
    for (int d = slot; d < Dp; d += kTableSlots) {
      double c;
      const double r = feature_radius(p.radius, h, p.D, d, c);
      float qc = 0.0f, t_hi = 0.0f, t_lo = 0.0f;
      if (r >= 0.0 && r < kFlatRadius) {  // flat
        qc = load_as<float>(q, d);
        t_hi = -qc;
      } else if (r > 0.0) {
        const float qf = load_as<float>(q, d);
        const double a = r * (double)qf;
        double sa, ca;
        sincos(a, &sa, &ca);
        const double t = sa / ca;
        t_hi = (float)t;
        t_lo = (float)(t - (double)t_hi);
        qc = (float)((double)qf * c);
        log_sum += log(c * fabs(ca) / r);
      }
      out[((int64_t)kRowQ * Dp + d) * N] = qc;
      out[((int64_t)kRowTan * Dp + d) * N] = t_hi;
      out[((int64_t)kRowTanLow * Dp + d) * N] = t_lo;
    }
  } else if (on) {  // key row
    const int64_t j = row - N;
    const scalar_t* k = p.k + (bh * M + j) * p.D;
    float* out = p.tkeys + bh * kKeyFields * Dp * M + j;
    for (int d = slot; d < Dp; d += kTableSlots) {
      double c;
      const double r = feature_radius(p.radius, h, p.D, d, c);
      float kc = 1.0f, X = 1.0f, y_hi = -1.0f, y_lo = 0.0f;
      if (r >= 0.0 && r < kFlatRadius) {  // flat
        kc = load_as<float>(k, d);
        y_hi = -kc;
      } else if (r > 0.0) {
        const float kf = load_as<float>(k, d);
        const double b = r * (double)kf;
        double sb, cb;
        sincos(b, &sb, &cb);
        X = (float)cb;  // never 0: |cos| of a float64 is above 1e-17
        const double Y = (double)X * (sb / cb);
        y_hi = (float)Y;
        y_lo = (float)(Y - (double)y_hi);
        kc = (float)((double)kf * c);
        // log rho, rho = X / cb = 1 + delta, |delta| <= 2^-24 (X - cb is exact): delta - delta^2 / 2
        // (the next term, delta^3 / 3, is below 2^-73)
        const double delta = ((double)X - cb) / cb;
        log_sum -= delta * (1.0 - 0.5 * delta);
      }
      out[((int64_t)kKeyK * Dp + d) * M] = kc;
      out[((int64_t)kKeyCos * Dp + d) * M] = X;
      out[((int64_t)kKeySin * Dp + d) * M] = y_hi;
      out[((int64_t)kKeySinLow * Dp + d) * M] = y_lo;
    }
  }
  partial[slot * kTableRows + lane] = log_sum;
  __syncthreads();
  if (!on || slot != 0) return;
  double total = 0.0;
#pragma unroll
  for (int s = 0; s < kTableSlots; ++s) total += partial[s * kTableRows + lane];
  if (row < N) {
    const float high = (float)total;
    p.row_log_high[bh * N + row] = high;
    p.row_log_low[bh * N + row] = (float)(total - (double)high);
  } else {
    p.key_log[bh * M + (row - N)] = (float)total;
  }
}

}  // namespace cuda
}  // namespace fourierformer
