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
// The sign of a factor (phi = ReLU, whose weight is 0 where some factor's sinc is negative): s'
// has the sign of sin(x) / cos(a) and u that of x, so sinc(x) < 0 exactly where the sign bits of
// s', u and cos a differ in an odd number; the row keeps the sign of cos a in the sign bit of t_lo
// (split_tan_signed; a flat or padding feature, whose s' / u is -1, stores t_lo = -0). Where u is
// 0 (q = k in a feature) the sign of s' is a rounding: such pairs take the rare path, which
// decides from the per-element math (forward_tiled.cuh).
//
// The backward gets cos(x) from the same tables: cos(x) / cos(a) = (X + t Y) / rho, so
// cot x = (X + t Y) / s' (no table of cos a at all).
//
// phi = sigmoid sums log sigmoid(sinc x) over the features, which needs sinc x itself, not a ratio
// whose row and key constants drop out of a product: sin x = s' cos(a) / rho and x = u x_per_u, with
// cos a from the row's t (its sign in t_lo's sign bit, cos_from_tan) and rho taken as 1 (within
// 2^-24). The tables stay the same for every phi (fourier_attention_tables takes none): the kernels of
// phi = sigmoid stage cos a in place of t_lo as they read the rows (forward_tiled.cuh).
//
// table_kernel: kTableSlots (8) threads per row, each a slot of the features (d = slot + 8 n),
// a float64 sincos per (row, feature); the divisions by cos as a reciprocal (float estimate and
// two Newton steps); a query row's constant from the products of the |cos| and of the m = |R| / c
// (mantissas and exponents of the slots' products combined by slot 0 in slot order, one log per
// row, where there was one per (row, feature)); |R| split into c and m from the float's bits;
// 32-bit index divisions below 2^31 rows (its counts in the SASS: docs/records/speed.md). Built once per
// training step (fourier_attention_tables, which the autograd passes to the forward and the
// backward), or by each op that is given none.
#pragma once

#include "common.cuh"
#include "table_layout.h"

namespace fourierformer {
namespace cuda {

// |u| at or below this (|x| below 2^-14) is the rare path: sinc is 1 within 1e-9 there, and
// s' / u, exact 0 / 0 at q = k, loses its relative accuracy (see forward_tiled.cuh).
constexpr float kUFloor = 1.0f / 32768.0f;
// |R| below this: a flat feature (sinc(R u) = 1 to float precision for every u that matters).
constexpr double kFlatRadius = 1e-9;

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

// |R_d| of feature d of a head (radius: the head's row of R) and, through c and m, its split
// |R_d| = c m (exact, from the float's bits): c the power of two with c <= |R_d| < 2c,
// m = |R_d| / c in [1, 2). A flat feature
// returns its |R| (0 for NaN) with c = 1 and m = that |R| (its x / u); a padding feature -1.
FF_DEV float feature_radius(const float* radius, int D, int d, float& c, float& m) {
  c = m = 1.0f;
  if (d >= D) return -1.0f;
  const float r = fabsf(radius[d]);
  if (!((double)r >= kFlatRadius)) return m = (r == r ? r : 0.0f);
  const int bits = ff_float_bits(r);
  c = ff_bits_float(bits & 0x7F800000);
  m = ff_bits_float((bits & 0x007FFFFF) | 0x3F800000);
  return r;
}

// 1 / x in float64 to about 1 ulp, for |x| in [1e-30, 1e30]: the float reciprocal (about 2^-23)
// and two Newton steps (2^-46, then float64 rounding): a few instructions inline, where a float64
// division takes a subroutine call.
FF_DEV double ff_reciprocal(double x) {
#if defined(FF_HOST_EMULATION)
  const float r0 = 1.0f / (float)x;
#else
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"((float)x));
#endif
  double r = (double)r0;
  r = fma(r, fma(-x, r, 1.0), r);
  return fma(r, fma(-x, r, 1.0), r);
}

// t = tan a as t_hi + t_lo (t_hi a float next to t, t_lo the float of t - t_hi) with the sign bit
// of t_lo that of cos a (`negative_cos`): t_hi is t rounded to nearest, or its neighbour on t's
// other side where t_lo's sign would differ (|t_lo| then below an ulp of t_hi, not half an ulp);
// t_lo = 0 takes the sign as -0 or +0. phi = ReLU reads the sign of cos a there (see
// sinc_factor_step, forward_tiled.cuh).
FF_DEV void split_tan_signed(double t, bool negative_cos, float& t_hi, float& t_lo) {
  t_hi = (float)t;
  double rest = t - (double)t_hi;
  if (rest != 0.0 && (rest < 0.0) != negative_cos) {
    t_hi = nextafterf(t_hi, rest < 0.0 ? -ff_inf<float>() : ff_inf<float>());
    rest = t - (double)t_hi;
  }
  t_lo = (float)rest;
  if (t_lo == 0.0f) t_lo = negative_cos ? -0.0f : 0.0f;
}

// 1 / sqrt(x) (rsqrtf: the hardware's reciprocal square root, within 2 ulp).
FF_DEV float ff_rsqrt(float x) {
#if defined(FF_HOST_EMULATION)
  return 1.0f / sqrtf(x);
#else
  return rsqrtf(x);
#endif
}

// cos a of a row's feature from its tables (phi = sigmoid, which needs sin x itself, see above): the
// sign of cos a (t_lo's sign bit, split_tan_signed) over sqrt(1 + t_hi^2), to a few ulps (t_hi is
// tan a to half an ulp or one; |t_hi| < 1e17, so that 1 + t_hi^2 stays finite). A flat or padding
// feature's t_hi is no tangent: its value is meaningless and unused (phi = sigmoid takes the series
// there, x being tiny or 0).
FF_DEV float cos_from_tan(float t_hi, float t_lo) { return copysignf(ff_rsqrt(fmaf(t_hi, t_hi, 1.0f)), t_lo); }

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

// The slots' parts of the row constants (kTableSlots, kTableRows each): a query row's num's
// mantissa and den (its sum is log(prod num / prod den) + (sum of the exponents) log 2, one log
// per row), a key row's sum in `num`.
struct TableSlotParts {
  double num[kTableThreads], den[kTableThreads];
  int exponent[kTableThreads];
};
FF_HD int64_t table_smem_bytes() { return (int64_t)sizeof(TableSlotParts); }

template <typename scalar_t>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kTableThreads) table_kernel(const Params<scalar_t, float> p) {
  FF_DYNAMIC_SHARED(smem_raw);
  TableSlotParts& parts = *reinterpret_cast<TableSlotParts*>(smem_raw);
  const int64_t N = p.N, M = p.M, Dp = p.Dp;
  const int tid = threadIdx.x, lane = tid & (kTableRows - 1), slot = tid / kTableRows;
  const int64_t id = (int64_t)blockIdx.x * kTableThreads + tid;
  // SASS: branch=x_per_u weight=min(1,Dp/((N+M)*kTableSlots)) begin
  if (id < (int64_t)p.H * Dp) {  // the per-feature x / u: m (0 for a padding feature); H Dp < 2^31
    const int h = (int)((unsigned)id / (unsigned)Dp), d = (int)id - h * (int)Dp;
    float c, m;
    p.x_per_u[id] = feature_radius(p.radius + (int64_t)h * p.D, p.D, d, c, m) > 0.0f ? m : 0.0f;
  }
  // SASS: branch=x_per_u end
  const int64_t per_slice = N + M, rows = (int64_t)p.B * p.H * per_slice;
  const int64_t rid = (int64_t)blockIdx.x * kTableRows + lane;
  const bool on = rid < rows;
  int64_t bh = 0;  // (a 32-bit division where it will do: a 64-bit one is a subroutine)
  if (rows <= INT_MAX)
    bh = on ? (unsigned)rid / (unsigned)per_slice : 0u;
  // SASS: cold=rows_over_2_31
  else  // (over 2^31 rows)
    bh = on ? rid / per_slice : 0;
  const int64_t row = rid - bh * per_slice;
  const float* radius = p.radius + (int64_t)((unsigned)bh % (unsigned)p.H) * p.D;  // the head's
  // a query row's product of the |cos| (num, moved up by 2^900 where it falls below 2^-900, which
  // `scale` counts: a factor is above 1e-17) and of the m = |R| / c (den, factors in [1, 2), at
  // most 32 per slot); a key row's sum of log rho
  double num = 1.0, den = 1.0, key_sum = 0.0;
  int scale = 0;
  // SASS: branch=query_row weight=N/(N+M) begin
  if (on && row < N) {  // query row: row_log = sum_d log(c_d |cos a_d| / |R_d|) = sum_d log(|cos a_d| / m_d)
    const scalar_t* q = p.q + (bh * N + row) * p.D;
    float* out = p.trows + bh * kRowFields * Dp * N + row + slot * N;
    const int64_t field = Dp * N, step = kTableSlots * N;
    // SASS: loop=query_features step=kTableSlots trips=Dp/kTableSlots elements=1 unit=rd
    for (int d = slot; d < Dp; d += kTableSlots, out += step) {
      float c, m;
      const float r = feature_radius(radius, p.D, d, c, m);
      float qc = 0.0f, t_hi = 0.0f, t_lo = -0.0f;  // (a padding or flat feature's factor is -1: t_lo -0)
      // SASS: cold=flat_feature begin test
      if (r >= 0.0f && (double)r < kFlatRadius) {  // flat
        qc = load_as<float>(q, d);
        t_hi = -qc;
        // SASS: cold=flat_feature end
      } else if (r > 0.0f) {
        const float qf = load_as<float>(q, d);
        const double a = (double)r * (double)qf;
        double sa, ca;
        sincos(a, &sa, &ca);
        const double t = sa * ff_reciprocal(ca);
        split_tan_signed(t, ca < 0.0, t_hi, t_lo);
        qc = (float)((double)qf * (double)c);
        num *= fabs(ca);
        den *= (double)m;
        if (num < 0x1p-900) {
          num *= 0x1p900;
          scale += 900;
        }
      }
      out[kRowQ * field] = qc;
      out[kRowTan * field] = t_hi;
      out[kRowTanLow * field] = t_lo;
    }
  // SASS: branch=key_row weight=M/(N+M) begin
  } else if (on) {  // key row: key_log = -sum_d log rho_d
    // SASS: branch=query_row end
    const int64_t j = row - N;
    const scalar_t* k = p.k + (bh * M + j) * p.D;
    float* out = p.tkeys + bh * kKeyFields * Dp * M + j + slot * M;
    const int64_t field = Dp * M, step = kTableSlots * M;
    // SASS: loop=key_features step=kTableSlots trips=Dp/kTableSlots elements=1 unit=rd
    for (int d = slot; d < Dp; d += kTableSlots, out += step) {
      float c, m;
      const float r = feature_radius(radius, p.D, d, c, m);
      float kc = 1.0f, X = 1.0f, y_hi = -1.0f, y_lo = 0.0f;
      // SASS: cold=flat_feature begin test
      if (r >= 0.0f && (double)r < kFlatRadius) {  // flat
        kc = load_as<float>(k, d);
        y_hi = -kc;
        // SASS: cold=flat_feature end
      } else if (r > 0.0f) {
        const float kf = load_as<float>(k, d);
        const double b = (double)r * (double)kf;
        double sb, cb;
        sincos(b, &sb, &cb);
        X = (float)cb;  // never 0: |cos| of a float64 is above 1e-17
        const double inv = ff_reciprocal(cb);
        const double Y = (double)X * (sb * inv);
        y_hi = (float)Y;
        y_lo = (float)(Y - (double)y_hi);
        kc = (float)((double)kf * (double)c);
        // log rho, rho = X / cb = 1 + delta, |delta| <= 2^-24 (X - cb is exact): delta - delta^2 / 2
        // (the next term, delta^3 / 3, is below 2^-73)
        const double delta = ((double)X - cb) * inv;
        key_sum -= delta * (1.0 - 0.5 * delta);
      }
      out[kKeyK * field] = kc;
      out[kKeyCos * field] = X;
      out[kKeySin * field] = y_hi;
      out[kKeySinLow * field] = y_lo;
    }
  }
  // SASS: branch=key_row end
  if (row < N) scale -= take_exponent(num);
  parts.num[tid] = row < N ? num : key_sum;
  parts.den[tid] = den;
  parts.exponent[tid] = scale;
  __syncthreads();
  // SASS: branch=slot_zero weight=1/kTableSlots begin
  if (!on || slot != 0) return;
  // SASS: branch=query_constant weight=N/(N+M) begin
  if (row < N) {  // the query row's constant
    double n = 1.0, d = 1.0;
    int e = 0;
#pragma unroll
    for (int s = 0; s < kTableSlots; ++s) {
      n *= parts.num[s * kTableRows + lane];  // (mantissas: at most 2^kTableSlots)
      d *= parts.den[s * kTableRows + lane];
      e -= parts.exponent[s * kTableRows + lane];
    }
    const double total = log(n / d) + (double)e * 0.69314718055994530942;
    const float high = (float)total;
    p.row_log_high[bh * N + row] = high;
    p.row_log_low[bh * N + row] = (float)(total - (double)high);
  // SASS: branch=key_constant weight=M/(N+M) begin
  } else {  // the key row's
    // SASS: branch=query_constant end
    double total = 0.0;
#pragma unroll
    for (int s = 0; s < kTableSlots; ++s) total += parts.num[s * kTableRows + lane];
    p.key_log[bh * M + (row - N)] = (float)total;
  }
  // SASS: branch=key_constant end
}
// SASS: branch=slot_zero end

}  // namespace cuda
}  // namespace fourierformer
