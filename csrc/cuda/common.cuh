// Shared pieces of the CUDA kernels: Params, shared-memory sizes, float32 element math
// (ff_sincosf, the accurate log, the per-pair log-sinc sum of the simple path), warp
// reductions and staging helpers. See fourier_attention_kernels.cuh for the overview.
#pragma once

#include <cstdint>

#include "../backend_limits.h"
#include "../fourier_element_math.h"

#if defined(FF_HOST_EMULATION)
#include "emulation/host_emulation.h"
#define FF_DEV inline
#define FF_GLOBAL
#define FF_LAUNCH_BOUNDS(n)
#define FF_LAUNCH_BOUNDS_MIN(n, m)
#define FF_DYNAMIC_SHARED(name) unsigned char* name = ::ff_emu::dynamic_smem()
#else
#define FF_DEV __device__ __forceinline__
#define FF_GLOBAL __global__
#define FF_LAUNCH_BOUNDS(n) __launch_bounds__(n)
#define FF_LAUNCH_BOUNDS_MIN(n, m) __launch_bounds__(n, m)
#define FF_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace fourierformer {
namespace cuda {

constexpr int kWarps = 4;                 // rows per block
constexpr int kThreads = kWarps * 32;     // threads per block
constexpr int kTile = 32;                 // rows of the other side staged per step (one per lane)
constexpr int kTileStride = kTile + 1;    // transposed tile: element (row r, dim d) at d * kTileStride + r
constexpr int kMaxHeadDim = limits::kCudaMaxHeadDim;  // D and Dv
constexpr int kPerLane = kMaxHeadDim / 32;  // register accumulators per lane
constexpr unsigned kFullMask = 0xffffffffu;

// The phi of a call's kernel instances (Params::phi at run time; the float32 path's kernels take it
// as a template argument, and the launcher picks the instance with with_phi, fourier_attention_launch.h):
// kPower, p log|sinc| (phi = "power" with its even p, and "abs" with p = 1); kRelu, the same with
// p = 1 and -inf (a zero weight) where a factor's sinc is negative; kSigmoid, sum_d log sigmoid(sinc x)
// (p = 1), a sum over the features of values, not a product; kOdd, phi = "power" with an odd p (x,
// x^3): p log|sinc| with, beside it, the sign of the product of the sincs (the parity of the negative
// factors), signed weights normalised by their signed sum plus eps in the kernels (docs/kernels.md). A
// phi added here takes a case in with_phi, its score in tile_scores_impl, forward_decode_kernel and
// phi_log_score, and its derivative in the main pass's g pass and phi_dlog.
enum class Phi : uint8_t { kPower = 0, kRelu, kSigmoid, kOdd };

// Everything the kernels read and write. Tensors are contiguous; q/k/v/out/dout and the
// gradients of q/k/v have the input dtype, the rest the accumulation type.
template <typename scalar_t, typename acc_t>
struct Params {
  const scalar_t* q;     // (B, H, N, D)
  const scalar_t* k;     // (B, H, M, D)
  const scalar_t* v;     // (B, H, M, Dv)
  const acc_t* radius;   // (H, D)
  const acc_t* attn_mask;  // element (b, h, i, j) at b*mask_sb + h*mask_sh + i*mask_row + j; or null
  int64_t mask_sb, mask_sh, mask_row;
  const acc_t* key_bias;  // (B, M) or null
  // forward outputs
  scalar_t* out;  // (B, H, N, Dv)
  double* lse;   // (B, H, N), float64 (see split_lse)
  // backward inputs / outputs
  const scalar_t* dout;  // (B, H, N, Dv)
  const double* lse_in;  // (B, H, N), the forward's
  acc_t* delta;          // (B, H, N), written by the dq kernel for the dk/dv kernel
  double* lse_bwd;       // (B, H, N), the same: the lse of the backward's own scores
  double log_eps;        // log of the normaliser's eps, -inf for 0 (null_key_share)
  scalar_t* dq;          // (B, H, N, D)
  scalar_t* dk;          // (B, H, M, D)
  scalar_t* dv;          // (B, H, M, Dv)
  acc_t* dradius;        // (H, D), zeroed, accumulated with atomicAdd
  // tables of the float32 path (tables.cuh), built per call by table_kernel; null for float64
  float* trows;         // (B*H, kRowFields, Dp, N): q c, tan(|R| q) as two floats
  float* tkeys;         // (B*H, kKeyFields, Dp, M): k c, X = cos(|R| k), Y = X tan(|R| k) as two floats
  float* row_log_high;  // (B*H, N): sum_d log(c_d |cos(|R_d| q_d)| / |R_d|) as two floats
  float* row_log_low;
  float* key_log;       // (B*H, M): -sum_d log(X / cos(|R_d| k_d))
  float* x_per_u;       // (H, Dp): |R_d| / c_d, 0 for a flat feature: x = u times this
  float* dq_acc;        // (B*H, N, Dp): the tiled backward's dq sums (float32, zeroed, atomicAdd)
  float* dv_acc;        // (B*H, M, Dv): the tiled backward's dv sums (float32, one key block each)
  float* score_cache;   // (B*H, N, score_cache_stride(M)) or null: the tiled backward pre-pass's
                        // scores (log2 units) for its main pass (backward_tiled.cuh, score_cache.h)
  int Dp;               // D rounded up to a multiple of kRenormEvery (padding features are flat)
  int B, H, N, M, D, Dv;
  acc_t power;
  bool relu;  // phi == Phi::kRelu, as the rare path (rare_pair_score) takes it
  Phi phi;    // the call's phi (see Phi; in the byte after relu: the layout of the fields is as without it)
  // power log2(e) as a high and a low part (the float32 path's scores in log2 units:
  // S log2(e) = fma(sum, high, sum * low)), set with power
  float power_log2_high, power_log2_low;
  bool causal;
  float dropout_p;  // compared with ff_dropout_uniform (a float), as on the CPU
  acc_t keep_scale;  // 1 / (1 - dropout_p)
  uint32_t seed;
  // the tiled backward's main pass: each key tile's features split over main_splits blocks of
  // split_features features (the last may have fewer; main_pass_splits in backward_tiled.cuh)
  int main_splits, split_features;
  // the decoding forward (forward_decode.cuh): the partials of its key chunks, decode_splits per
  // (batch, head) slice, (B*H, decode_splits, N) maxima and sums, then (B*H, decode_splits, N, Dv)
  // unnormalised outputs
  float* decode_partials;
  int decode_splits;
  // Phi::kOdd's backward: (B, H, N), the sign (+1 or -1) of each row's normaliser as the pre-pass (the
  // dq kernel of the simple path) finds it, for the main pass (the dk/dv kernel): their P is the
  // signed weight over that normaliser, whose magnitude lse_bwd holds. Null for the other phis.
  acc_t* row_sign;
};

// Shared memory of each kernel, in elements of acc_t.
FF_HD int64_t forward_smem_elems(int D, int Dv) {
  return (int64_t)D * kTileStride + (int64_t)kTile * Dv + (int64_t)kWarps * D + D;
}
FF_HD int odd_stride(int n) { return n | 1; }  // an odd row stride: lanes reading row `lane` hit distinct banks
FF_HD int64_t dq_smem_elems(int D, int Dv) {
  return (int64_t)D * kTileStride + (int64_t)kTile * odd_stride(Dv) + (int64_t)kWarps * (D + Dv) + D;
}
FF_HD int64_t dkv_smem_elems(int D, int Dv) {
  return (int64_t)D * kTileStride + (int64_t)kTile * odd_stride(Dv) + 3 * kTile + (int64_t)kWarps * (D + Dv) + D;
}

// The row's lse (float64: of order p D, wanted to acc_t accuracy relative to 1) as high + low
// acc_t parts: P = exp((S - high) - low), where S - high is exact for every key that matters
// (S within a factor 2 of lse).
template <typename acc_t>
FF_HD void split_lse(double lse, acc_t& high, acc_t& low) {
  high = (acc_t)lse;
  low = (acc_t)(lse - (double)high);  // (inf - inf: NaN, but rows at +inf are never read)
}

// ---------------------------------------------------------------------------------------
// Element math
// ---------------------------------------------------------------------------------------

FF_DEV int ff_float_bits(float x) {
#if defined(FF_HOST_EMULATION)
  int i;
  __builtin_memcpy(&i, &x, sizeof i);
  return i;
#else
  return __float_as_int(x);
#endif
}
FF_DEV float ff_bits_float(int i) {
#if defined(FF_HOST_EMULATION)
  float x;
  __builtin_memcpy(&x, &i, sizeof x);
  return x;
#else
  return __int_as_float(i);
#endif
}

// Splits a positive normal x into its mantissa in [1, 2), returned through x, and exponent.
FF_DEV int take_exponent(float& x) {
  const int bits = ff_float_bits(x);
  x = ff_bits_float((bits & 0x007FFFFF) | 0x3F800000);
  return (bits >> 23) - 127;
}

// The same for a positive normal float64 x (exponent in [-1022, 1023]).
FF_DEV int take_exponent(double& x) {
#if defined(FF_HOST_EMULATION)
  long long bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
#else
  long long bits = __double_as_longlong(x);
#endif
  const int e = (int)((bits >> 52) & 0x7FF) - 1023;
  bits = (bits & 0x000FFFFFFFFFFFFFLL) | 0x3FF0000000000000LL;
#if defined(FF_HOST_EMULATION)
  __builtin_memcpy(&x, &bits, sizeof x);
#else
  x = __longlong_as_double(bits);
#endif
  return e;
}

// log(y) for y in (0.25, 4): reduce to [sqrt(1/2), sqrt(2)), then Cephes' logf polynomial
// (log_poly_near_one in ../fourier_element_math.h, as vlog_near_one in ../cpu/vec.inc).
FF_DEV float log_near_one(float y) {
  float e = 0.0f;
  if (y > 1.41421356f) {
    y *= 0.5f;
    e = 1.0f;
  } else if (y < 0.70710678f) {
    y *= 2.0f;
    e = -1.0f;
  }
  return log_poly_near_one(y - 1.0f) + e * 0.693147180559945f;
}

// log(a / b) for a, b in [1, 2) (so a / b in (1/2, 2)): 2 atanh(s), s = (a - b) / (a + b) in
// (-1/3, 1/3) (a - b exact), as s P(s^2) with P a degree-4 fit of 2 atanh(s) / s on s^2 <= 1/9
// (relative error 4e-9; in float about 6e-8 absolute, as log_near_one), the quotient to about
// 2 ulp (div.approx, as the a / b that log_near_one would take): no branch.
FF_DEV float log_ratio(float a, float b) {
#if defined(FF_HOST_EMULATION)
  const float s = (a - b) / (a + b);
#else
  float s;
  asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(s) : "f"(a - b), "f"(a + b));
#endif
  const float z = s * s;
  float q = fmaf(z, 0.2817833423614502f, 0.27960604429244995f);
  q = fmaf(q, z, 0.40024909377098083f);
  q = fmaf(q, z, 0.6666631698608398f);
  q = fmaf(q, z, 2.0f);
  return s * q;
}

// Accurate log of a positive normal float (logf would be __logf under --use_fast_math).
FF_DEV float ff_log_acc(float y) {
  const int e = take_exponent(y);
  return log_near_one(y) + (float)e * 0.693147180559945f;
}
FF_DEV double ff_log_acc(double y) { return log(y); }

FF_DEV float ff_exp(float x) { return expf(x); }
FF_DEV double ff_exp(double x) { return exp(x); }

template <typename T>
FF_DEV T ff_inf() {
  return (T)INFINITY;
}

// sin and cos of x in float32, accurate to about 1 ulp of the reduced argument (so sinc
// keeps its relative accuracy next to its zeros, which __sinf does not).
FF_DEV void ff_sincosf(float x, float& s, float& c) {
  if (!(fabsf(x) <= 65536.0f)) {  // also NaN: double sincos does a full reduction
    double sd, cd;
    sincos((double)x, &sd, &cd);
    s = (float)sd;
    c = (float)cd;
    return;
  }
  // pi/2 = C1 + C2 + C3 (+ 1e-23); every fma below is exact up to one rounding of r.
  const float j = rintf(x * 0.636619772367581343f);
  float r = fmaf(j, -1.57079637050628662109375f, x);
  r = fmaf(j, 4.37113882867379300296306610107421875e-8f, r);
  r = fmaf(j, 1.7151245100058819e-15f, r);
  const float z = r * r;
  const float sp = fmaf(fmaf(fmaf(-1.9515295891E-4f, z, 8.3321608736E-3f), z, -1.6666654611E-1f), z * r, r);
  const float cp =
      fmaf(fmaf(fmaf(2.443315711809948E-5f, z, -1.388731625493765E-3f), z, 4.166664568298827E-2f), z * z,
           fmaf(-0.5f, z, 1.0f));
  const int quadrant = ((int)j) & 3;  // two's complement: also right for negative j
  switch (quadrant) {
    case 0:
      s = sp;
      c = cp;
      break;
    case 1:
      s = cp;
      c = -sp;
      break;
    case 2:
      s = -sp;
      c = -cp;
      break;
    default:
      s = -cp;
      c = sp;
      break;
  }
}

// sum_d log|sinc(R_d (a_d - b_d))| with a (query) at stride as and b (key) at stride bs. kRelu
// (phi = ReLU): -inf where some factor's sinc is negative (a NaN sum kept), read from the signs of
// sin x and x outside the Taylor branch (|x| < its bound: sinc > 0 there, also at q = k, where the
// sign of sin x would be a rounding).
template <typename acc_t>
struct LogSincSum;

template <>
struct LogSincSum<float> {
  // As the CPU float32 kernel: |sin x| >= kSinFloor, |x| <= kXCeil, Taylor for small |x|;
  // the products of four factors stay normal, then move their exponents into e.
  template <bool kRelu = false>
  static FF_DEV float run(const float* a, int as, const float* b, int bs, const float* R, int D) {
    bool unused;
    return impl<kRelu, false>(a, as, b, bs, R, D, unused);
  }
  // The same with `negative` set to the sign of the product of the sincs (the parity of the
  // negative factors: phi = x^p with odd p).
  static FF_DEV float run_signed(const float* a, int as, const float* b, int bs, const float* R, int D,
                                 bool& negative) {
    return impl<false, true>(a, as, b, bs, R, D, negative);
  }
  template <bool kRelu, bool kOdd>
  static FF_DEV float impl(const float* a, int as, const float* b, int bs, const float* R, int D, bool& negative) {
    float num = 1.0f, den = 1.0f;
    int e = 0;
    bool dead = false;  // (kRelu: a negative factor; kOdd: an odd number of them)
    for (int d = 0; d < D; ++d) {
      const float x = R[d] * (a[d * as] - b[d * bs]);
      const float ax = fabsf(x);
      if (ax < kSincTaylorBound) {
        num *= sinc_taylor(x * x);
      } else {
        float s, c;
        ff_sincosf(x, s, c);
        if (kRelu) dead |= x < 0.0f ? s > 0.0f : s < 0.0f;
        if (kOdd) dead ^= x < 0.0f ? s > 0.0f : s < 0.0f;
        num *= fmaxf(fabsf(s), kSinFloor);
        den *= fminf(ax, kXCeil);
      }
      if ((d & 3) == 3) e += take_exponent(num) - take_exponent(den);
    }
    e += take_exponent(num) - take_exponent(den);
    const float sum = log_near_one(num / den) + (float)e * 0.693147180559945f;
    if (kOdd) negative = dead;
    return kRelu && dead && sum == sum ? -ff_inf<float>() : sum;
  }
};

template <>
struct LogSincSum<double> {
  // As the CPU float64 path: one log per element (-inf only where sin x == 0, x != 0).
  template <bool kRelu = false>
  static FF_DEV double run(const double* a, int as, const double* b, int bs, const double* R, int D) {
    double sum = 0.0;
    bool dead = false;  // (kRelu: a negative factor; sin x x >= 0 in the Taylor branch)
    for (int d = 0; d < D; ++d) {
      const double x = R[d] * (a[d * as] - b[d * bs]);
      const double s = sin(x);
      if (kRelu) dead |= s * x < 0.0;
      sum += log_abs_sinc_from_sin(x, s);
    }
    return kRelu && dead && sum == sum ? -ff_inf<double>() : sum;
  }
  // The same with `negative` set to the sign of the product (an odd number of factors with sin x x < 0).
  static FF_DEV double run_signed(const double* a, int as, const double* b, int bs, const double* R, int D,
                                  bool& negative) {
    double sum = 0.0;
    bool odd = false;
    for (int d = 0; d < D; ++d) {
      const double x = R[d] * (a[d * as] - b[d * bs]);
      const double s = sin(x);
      odd ^= s * x < 0.0;
      sum += log_abs_sinc_from_sin(x, s);
    }
    negative = odd;
    return sum;
  }
};

// sum_d log sigmoid(sinc(R_d (a_d - b_d))) (phi = sigmoid), strides as LogSincSum's.
template <typename acc_t>
struct LogSigmoidSincSum;

template <>
struct LogSigmoidSincSum<float> {
  // sinc x = sin x / x (ff_sincosf), or its series below |x| = kSincTaylorBound (1 at q = k: no
  // floor and no quotient there); log sigmoid by the polynomial on sinc's range (log_sigmoid_poly).
  // The terms summed in groups of 8 and the groups into the total (a float sum of D terms of order
  // 1 then rounds about D / 8 + 8 times, not D times).
  static FF_DEV float run(const float* a, int as, const float* b, int bs, const float* R, int D) {
    float sum = 0.0f, group = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float x = R[d] * (a[d * as] - b[d * bs]);
      float y;
      if (fabsf(x) < kSincTaylorBound) {
        y = sinc_taylor(x * x);
      } else {
        float s, c;
        ff_sincosf(x, s, c);
        y = s / x;
      }
      group += log_sigmoid_poly(y);
      if ((d & 7) == 7) {
        sum += group;
        group = 0.0f;
      }
    }
    return sum + group;
  }
};

template <>
struct LogSigmoidSincSum<double> {
  // As the CPU float64 path (log_sigmoid_sinc_f64 per element).
  static FF_DEV double run(const double* a, int as, const double* b, int bs, const double* R, int D) {
    double sum = 0.0;
    for (int d = 0; d < D; ++d) sum += log_sigmoid_sinc_f64(R[d] * (a[d * as] - b[d * bs]));
    return sum;
  }
};

// p.power times the score of the call's phi (p.phi): LogSincSum (kRelu: its -inf for a negative
// factor), or LogSigmoidSincSum (kSigmoid; p.power is 1 there); kOdd's log-magnitude as the power's
// (its sign: phi_signed_score).
template <typename P, typename acc_t>
FF_DEV acc_t phi_log_score(const P& p, const acc_t* a, int as, const acc_t* b, int bs, const acc_t* R, int D) {
  switch (p.phi) {
    case Phi::kRelu:
      return p.power * LogSincSum<acc_t>::template run<true>(a, as, b, bs, R, D);
    case Phi::kSigmoid:
      return p.power * LogSigmoidSincSum<acc_t>::run(a, as, b, bs, R, D);
    default:
      return p.power * LogSincSum<acc_t>::template run<false>(a, as, b, bs, R, D);
  }
}

// phi_log_score with `negative` set to whether the weight is negative: the sign of the product of
// the sincs for Phi::kOdd (LogSincSum's run_signed), false for the other phis.
template <typename P, typename acc_t>
FF_DEV acc_t phi_signed_score(const P& p, const acc_t* a, int as, const acc_t* b, int bs, const acc_t* R, int D,
                              bool& negative) {
  negative = false;
  if (p.phi == Phi::kOdd) return p.power * LogSincSum<acc_t>::run_signed(a, as, b, bs, R, D, negative);
  return phi_log_score(p, a, as, b, bs, R, D);
}

// 1 / (l + eps e^-m) for a row of Phi::kOdd's signed weights whose sum is l in units of e^m (the
// real keys' normaliser Z = l e^m): out = sum_j w_j v_j / (Z + eps), the null key applied in the
// kernel (the positive sums' share sigmoid(lse - log eps) of scale_by_null_key cannot hold a
// negative Z; as signed_row_scale in ../cpu/masks_dropout.inc). A sum of 0 gives inf (the
// formula's division by 0 where eps is 0).
FF_DEV double signed_row_scale(double l, double m, double log_eps) {
  return 1.0 / (log_eps > -(double)INFINITY ? l + exp(log_eps - m) : l);
}

// g(x) = d/dx log|sinc x| (finite everywhere, 0 at x = 0).
FF_DEV float dlog_sinc(float x) {
  if (fabsf(x) < kSincTaylorBound) return dlog_sinc_taylor(x, x * x);
  float s, c;
  ff_sincosf(x, s, c);
  return dlog_sinc_from_sincos(x, s, c);
}
FF_DEV double dlog_sinc(double x) {
  if (fabs(x) < (double)taylor_bound<double>()) return dlog_sinc_taylor(x, x * x);
  double s, c;
  sincos(x, &s, &c);
  return dlog_sinc_from_sincos(x, s, c);
}

// d/dx log sigmoid(sinc x) = sigmoid(-sinc x) sinc'(x) (phi = sigmoid; finite everywhere, 0 at x = 0):
// sinc'(x) = (cos x - sinc x) / x, or sinc x g(x) with the series of both below |x| =
// kSincTaylorBound (where the quotient cancels); sigmoid(-y) by its polynomial (sigmoid_minus_poly).
FF_DEV float dlog_sigmoid_sinc(float x) {
  const float x2 = x * x;
  float y, derivative;
  if (fabsf(x) < kSincTaylorBound) {
    y = sinc_taylor(x2);
    derivative = y * dlog_sinc_taylor(x, x2);
  } else {
    float s, c;
    ff_sincosf(x, s, c);
    y = s / x;
    derivative = (c - y) / x;
  }
  return sigmoid_minus_poly(y) * derivative;
}
FF_DEV double dlog_sigmoid_sinc(double x) { return dlog_sigmoid_sinc_f64(x); }

// dS/dx over p of the call's phi at x: g(x) (kPower, kRelu: their weights' log is p log|sinc|
// where not 0), dlog_sigmoid_sinc (kSigmoid).
template <typename P, typename acc_t>
FF_DEV acc_t phi_dlog(const P& p, acc_t x) {
  return p.phi == Phi::kSigmoid ? dlog_sigmoid_sinc(x) : dlog_sinc(x);
}

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

template <typename acc_t, typename scalar_t>
FF_DEV acc_t load_as(const scalar_t* p, int64_t idx) {
  return static_cast<acc_t>(p[idx]);
}

template <typename T>
FF_DEV T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

template <typename T>
FF_DEV T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const T w = __shfl_xor_sync(kFullMask, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// threadIdx.x read anew (asm volatile: the compiler neither hoists it out of a loop nor keeps it
// in a register across one), so that indices derived from it need no register across the score
// code of a tile (spills otherwise, at 128 registers).
FF_DEV int fresh_thread_index() {
#if defined(FF_HOST_EMULATION)
  return (int)threadIdx.x;
#else
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
#endif
}

// The (batch, head) slice of this block and the first row / key of its tile, for a grid of
// ceil(len / tile) blocks per slice, slice-major (32-bit divisions: the grid is below 2^31 blocks).
FF_DEV int block_slice(int len, int tile, int& first) {
  const int per_slice = (len + tile - 1) / tile;
  const int bh = (int)blockIdx.x / per_slice;
  first = ((int)blockIdx.x - bh * per_slice) * tile;
  return bh;
}

// The same for a grid of `splits` consecutive blocks per tile: `split` is the block's among them.
FF_DEV int block_slice(int len, int tile, int splits, int& first, int& split) {
  const int b = (int)blockIdx.x / splits;
  split = (int)blockIdx.x - b * splits;
  const int per_slice = (len + tile - 1) / tile;
  const int bh = b / per_slice;
  first = (b - bh * per_slice) * tile;
  return bh;
}

FF_DEV int ff_min(int a, int b) { return a < b ? a : b; }
FF_DEV int ff_max(int a, int b) { return a > b ? a : b; }

// Keys visible to query i: [0, visible_end).
template <typename P>
FF_DEV int visible_end(const P& p, int i) {
  if (!p.causal) return p.M;
  const int end = i + (p.M - p.N) + 1;
  return end < p.M ? end : p.M;
}

template <typename scalar_t, typename acc_t>
FF_DEV acc_t dropout_factor(const Params<scalar_t, acc_t>& p, uint32_t bh, int i, int j) {
  return ff_dropout_uniform(p.seed, bh, (uint32_t)i, (uint32_t)j) >= p.dropout_p ? p.keep_scale : acc_t(0);
}

// Stages rows [r0, r0 + kTile) of src (rows of length len, rows >= rows_total read as 0)
// transposed: dst[d * kTileStride + r].
template <typename acc_t, typename scalar_t>
FF_DEV void stage_transposed(acc_t* dst, const scalar_t* src, int r0, int rows_total, int len) {
  const int n = kTile * len;
  for (int idx = threadIdx.x; idx < n; idx += kThreads) {
    const int r = idx / len, d = idx - r * len;
    const int row = r0 + r;
    dst[d * kTileStride + r] = row < rows_total ? load_as<acc_t>(src, (int64_t)row * len + d) : acc_t(0);
  }
}

// Stages rows [r0, r0 + kTile) of src row-major with row stride `stride` (>= len).
template <typename acc_t, typename scalar_t>
FF_DEV void stage_rows(acc_t* dst, const scalar_t* src, int r0, int rows_total, int len, int stride) {
  const int n = kTile * len;
  for (int idx = threadIdx.x; idx < n; idx += kThreads) {
    const int r = idx / len, c = idx - r * len;
    const int row = r0 + r;
    dst[r * stride + c] = row < rows_total ? load_as<acc_t>(src, (int64_t)row * len + c) : acc_t(0);
  }
}


}  // namespace cuda
}  // namespace fourierformer
