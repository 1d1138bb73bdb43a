// CUDA kernels of Fourier integral attention (device code only, no ATen).
//
// Flash-attention style: scores are recomputed tile by tile and no N x M tensor is ever
// stored. A block is kWarps warps of one (batch, head) slice; every warp owns one row (a
// query in the forward and dq kernels, a key in the dk/dv kernel) and the block stages the
// 32 rows of the other side it sweeps over in shared memory, transposed and padded so that
// lanes reading "their" row and lanes sweeping over d are both free of bank conflicts.
//
//   forward   (warp per query)  lanes over 32 keys: S_ij, online softmax (running max,
//                               rescaled sums); lanes over Dv: sum_j p_ij v_j (p by shuffle).
//   dq        (warp per query)  lanes over keys: P_ij, dP_ij, Delta_i = sum_j P_ij dP_ij;
//                               lanes over d: dq_id and the row's share of dradius, reduced
//                               per block, atomicAdd. The forward output is not read.
//   dk/dv     (warp per key)    lanes over 32 queries: P_ij, dS_ij; lanes over d / Dv: dk, dv.
//
// The element math (Taylor branches, clamps, dropout hash) is the one of
// ../fourier_element_math.h. float32 needs two things of its own here, so that the results do
// not depend on how sinf / logf are compiled (--use_fast_math, which a build may add, turns them
// into the approximate hardware intrinsics, useless for sin of large arguments, where sinc has
// its zeros):
//   * ff_sincosf: Cody-Waite reduction by pi/2 with three fma steps plus the Cephes minimax
//     polynomials (about 1 ulp for |x| <= 65536; larger |x| goes through double sincos);
//   * log of the product over d of |sin x| / |x| kept as mantissa and exponent (as the CPU
//     kernel does): one accurate log per (i, j) instead of one per (i, j, d).
// float64 uses the plain per-element formulas of the CPU float64 path.
//
// FF_HOST_EMULATION compiles the same kernels as ordinary C++ for the host emulator in
// emulation/ (one OS thread per CUDA thread), which is how they were checked without a GPU.
#pragma once

#include <cstdint>

#include "../backend_limits.h"
#include "../fourier_element_math.h"

#if defined(FF_HOST_EMULATION)
#include "emulation/host_emulation.h"
#define FF_DEV inline
#define FF_GLOBAL
#define FF_LAUNCH_BOUNDS(n)
#define FF_DYNAMIC_SHARED(name) unsigned char* name = ::ff_emu::dynamic_smem()
#else
#define FF_DEV __device__ __forceinline__
#define FF_GLOBAL __global__
#define FF_LAUNCH_BOUNDS(n) __launch_bounds__(n)
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
  scalar_t* dq;          // (B, H, N, D)
  scalar_t* dk;          // (B, H, M, D)
  scalar_t* dv;          // (B, H, M, Dv)
  acc_t* dradius;        // (H, D), zeroed, accumulated with atomicAdd
  int B, H, N, M, D, Dv;
  acc_t power;
  bool causal;
  float dropout_p;  // compared with ff_dropout_uniform (a float), as on the CPU
  acc_t keep_scale;  // 1 / (1 - dropout_p)
  uint32_t seed;
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

// log(y) for y in (0.25, 4): reduce to [sqrt(1/2), sqrt(2)), then Cephes' logf polynomial
// (the scalar twin of vlog_near_one in ../cpu/vec.inc).
FF_DEV float log_near_one(float y) {
  float e = 0.0f;
  if (y > 1.41421356f) {
    y *= 0.5f;
    e = 1.0f;
  } else if (y < 0.70710678f) {
    y *= 2.0f;
    e = -1.0f;
  }
  const float f = y - 1.0f;
  const float z = f * f;
  float p = 7.0376836292E-2f;
  p = p * f - 1.1514610310E-1f;
  p = p * f + 1.1676998740E-1f;
  p = p * f - 1.2420140846E-1f;
  p = p * f + 1.4249322787E-1f;
  p = p * f - 1.6668057665E-1f;
  p = p * f + 2.0000714765E-1f;
  p = p * f - 2.4999993993E-1f;
  p = p * f + 3.3333331174E-1f;
  const float r = f * z * p - 0.5f * z + f;
  return r + e * 0.693147180559945f;
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

// sum_d log|sinc(R_d (a_d - b_d))| with a (query) at stride as and b (key) at stride bs.
template <typename acc_t>
struct LogSincSum;

template <>
struct LogSincSum<float> {
  // As the CPU float32 kernel: |sin x| >= kSinFloor, |x| <= kXCeil, Taylor for small |x|;
  // the products of four factors stay normal, then move their exponents into e.
  static FF_DEV float run(const float* a, int as, const float* b, int bs, const float* R, int D) {
    float num = 1.0f, den = 1.0f;
    int e = 0;
    for (int d = 0; d < D; ++d) {
      const float x = R[d] * (a[d * as] - b[d * bs]);
      const float ax = fabsf(x);
      if (ax < kSincTaylorBound) {
        num *= sinc_taylor(x * x);
      } else {
        float s, c;
        ff_sincosf(x, s, c);
        num *= fmaxf(fabsf(s), kSinFloor);
        den *= fminf(ax, kXCeil);
      }
      if ((d & 3) == 3) e += take_exponent(num) - take_exponent(den);
    }
    e += take_exponent(num) - take_exponent(den);
    return log_near_one(num / den) + (float)e * 0.693147180559945f;
  }
};

template <>
struct LogSincSum<double> {
  // As the CPU float64 path: one log per element (-inf only where sin x == 0, x != 0).
  static FF_DEV double run(const double* a, int as, const double* b, int bs, const double* R, int D) {
    double sum = 0.0;
    for (int d = 0; d < D; ++d) {
      const double x = R[d] * (a[d * as] - b[d * bs]);
      sum += log_abs_sinc_from_sin(x, sin(x));
    }
    return sum;
  }
};

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

// ---------------------------------------------------------------------------------------
// Forward: warp per query row.
// Grid: B * H * ceil(N / kWarps) blocks of kThreads.
// ---------------------------------------------------------------------------------------
template <typename scalar_t, typename acc_t>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kThreads) forward_kernel(const Params<scalar_t, acc_t> p) {
  FF_DYNAMIC_SHARED(smem_raw);
  const int D = p.D, Dv = p.Dv, N = p.N, M = p.M;
  acc_t* Ks = reinterpret_cast<acc_t*>(smem_raw);  // (D, kTileStride): keys of the tile, transposed
  acc_t* Vs = Ks + (int64_t)D * kTileStride;       // (kTile, Dv)
  acc_t* Qw = Vs + (int64_t)kTile * Dv;             // (kWarps, D): each warp's query row
  acc_t* Rs = Qw + (int64_t)kWarps * D;             // (D,): radius of head h

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_blocks = (N + kWarps - 1) / kWarps;
  const int64_t bh = blockIdx.x / row_blocks;
  const int rb = (int)(blockIdx.x - bh * row_blocks);
  const int b = (int)(bh / p.H), h = (int)(bh % p.H);
  const int i = rb * kWarps + warp;
  const bool active = i < N;

  const scalar_t* q = p.q + bh * N * D;
  const scalar_t* k = p.k + bh * M * D;
  const scalar_t* v = p.v + bh * M * Dv;
  for (int d = tid; d < D; d += kThreads) Rs[d] = p.radius[(int64_t)h * D + d];
  acc_t* qrow = Qw + warp * D;
  if (active)
    for (int d = lane; d < D; d += 32) qrow[d] = load_as<acc_t>(q, (int64_t)i * D + d);
  __syncthreads();  // Rs and qrow are read below even when there is no tile to sweep

  const int end_i = active ? visible_end(p, i) : 0;
  const int last_row = ff_min(N - 1, rb * kWarps + kWarps - 1);
  const int block_end = visible_end(p, last_row);
  const acc_t* mask_row =
      (p.attn_mask && active) ? p.attn_mask + b * p.mask_sb + h * p.mask_sh + (int64_t)i * p.mask_row : nullptr;
  const acc_t* kbias = p.key_bias ? p.key_bias + (int64_t)b * M : nullptr;
  const acc_t NEG_INF = -ff_inf<acc_t>();

  acc_t m_run = NEG_INF;  // running max of the row (warp-uniform)
  acc_t l_lane = 0;       // this lane's share of the running sum of exp(S - m_run)
  acc_t acc[kPerLane];    // out_i[lane + 32 t], unnormalised
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) acc[t] = 0;

  for (int j0 = 0; j0 < block_end; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    stage_transposed(Ks, k, j0, M, D);
    stage_rows(Vs, v, j0, M, Dv, Dv);
    __syncthreads();
    if (!active || j0 >= end_i) continue;  // warp-uniform

    const int j = j0 + lane;
    acc_t s = NEG_INF;
    if (j < end_i) {
      s = p.power * LogSincSum<acc_t>::run(qrow, 1, Ks + lane, kTileStride, Rs, D);
      if (mask_row) s += mask_row[j];
      if (kbias) s += kbias[j];
    }
    const acc_t tile_max = warp_max(s);
    const acc_t m_new = tile_max > m_run ? tile_max : m_run;
    if (!(m_new > NEG_INF)) continue;  // nothing visible yet (warp-uniform)
    const acc_t scale = ff_exp(m_run - m_new);  // 0 while m_run is -inf
    acc_t e = ff_exp(s - m_new);                // 0 for masked keys
    l_lane = l_lane * scale + e;                // the normaliser counts every key
    if (p.dropout_p > 0.0f && e != acc_t(0)) e *= dropout_factor(p, (uint32_t)bh, i, j);
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) acc[t] *= scale;
    const int nj = ff_min(kTile, end_i - j0);
    for (int jj = 0; jj < nj; ++jj) {
      const acc_t w = __shfl_sync(kFullMask, e, jj);
      if (w == acc_t(0)) continue;  // warp-uniform
      const acc_t* vrow = Vs + jj * Dv;
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int c = lane + 32 * t;
        if (c < Dv) acc[t] += w * vrow[c];
      }
    }
    m_run = m_new;
  }

  if (!active) return;  // after the last __syncthreads
  const acc_t l = warp_sum(l_lane);
  scalar_t* out_i = p.out + (bh * N + i) * Dv;
  const bool empty = !(m_run > NEG_INF);  // no visible, unmasked key
  const acc_t inv = empty ? acc_t(0) : acc_t(1) / l;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int c = lane + 32 * t;
    if (c < Dv) out_i[c] = static_cast<scalar_t>(empty ? acc_t(0) : acc[t] * inv);
  }
  if (lane == 0) p.lse[bh * N + i] = empty ? (double)INFINITY : (double)m_run + log((double)l);
}

// ---------------------------------------------------------------------------------------
// Backward, step 1: dq, dradius and Delta; warp per query row, tiles of 32 keys.
// Grid: B * H * ceil(N / kWarps) blocks.
//
// Delta_i = sum_j P_ij f_ij dP_ij is summed here from the P this kernel recomputes, not taken
// as dO_i . O_i from the stored output: dS_ij = P_ij (f_ij dP_ij - Delta_i) must sum to zero
// over j with the P it multiplies, because dS/dR sums dS_ij T_ij with T_ij = sum_d (q - k) g,
// which has a large part common to all keys of a row (x g(x) = x cot x - 1 <= 0 for every d).
// An error e_i in Delta_i moves dradius by about p e_i sum_j P_ij T_ij: with O from the
// forward's float32 scores (errors ~ eps |S|, |S| of order p D) or rounded to float32, that
// was 8-15x the float32 reference's error at D 128 on an H200. One sweep suffices: dS is linear in Delta, so
// the row keeps sum_j p P f dP g(.) and sum_j p P g(.) apart and combines them at the end.
// For the same reason P is renormalised here: with P_ij = exp(S_ij - lse_i), sum_j P_ij = c_i
// is 1 only as far as these scores agree with the forward's (both carry errors of order
// eps |S|), and sum_j dS_ij = Delta_i (1 - c_i). The gradient uses P_ij / c_i, and the
// dk/dv kernel gets lse_i + log c_i and Delta_i / c_i.
// ---------------------------------------------------------------------------------------
template <typename scalar_t, typename acc_t>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kThreads) backward_dq_kernel(const Params<scalar_t, acc_t> p) {
  FF_DYNAMIC_SHARED(smem_raw);
  const int D = p.D, Dv = p.Dv, N = p.N, M = p.M;
  const int vstride = odd_stride(Dv);
  acc_t* Ks = reinterpret_cast<acc_t*>(smem_raw);  // (D, kTileStride)
  acc_t* Vs = Ks + (int64_t)D * kTileStride;       // (kTile, vstride)
  acc_t* Qw = Vs + (int64_t)kTile * vstride;        // (kWarps, D)
  acc_t* dOw = Qw + (int64_t)kWarps * D;            // (kWarps, Dv)
  acc_t* Rs = dOw + (int64_t)kWarps * Dv;           // (D,)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_blocks = (N + kWarps - 1) / kWarps;
  const int64_t bh = blockIdx.x / row_blocks;
  const int rb = (int)(blockIdx.x - bh * row_blocks);
  const int b = (int)(bh / p.H), h = (int)(bh % p.H);
  const int i = rb * kWarps + warp;
  const bool active = i < N;

  const scalar_t* q = p.q + bh * N * D;
  const scalar_t* k = p.k + bh * M * D;
  const scalar_t* v = p.v + bh * M * Dv;
  for (int d = tid; d < D; d += kThreads) Rs[d] = p.radius[(int64_t)h * D + d];
  acc_t* qrow = Qw + warp * D;
  acc_t* dorow = dOw + warp * Dv;
  if (active) {
    for (int d = lane; d < D; d += 32) qrow[d] = load_as<acc_t>(q, (int64_t)i * D + d);
    for (int c = lane; c < Dv; c += 32) dorow[c] = load_as<acc_t>(p.dout, (bh * N + i) * Dv + c);
  }
  __syncthreads();  // Rs, qrow, dorow are read below even when there is no tile to sweep
  const double L = active ? p.lse_in[bh * N + i] : (double)INFINITY;
  const bool live = active && L < (double)INFINITY;  // fully masked rows get no gradient
  acc_t L_high = 0, L_low = 0;
  if (live) split_lse(L, L_high, L_low);
  const int end_i = live ? visible_end(p, i) : 0;
  const int last_row = ff_min(N - 1, rb * kWarps + kWarps - 1);
  const int block_end = visible_end(p, last_row);
  const acc_t* mask_row =
      (p.attn_mask && active) ? p.attn_mask + b * p.mask_sb + h * p.mask_sh + (int64_t)i * p.mask_row : nullptr;
  const acc_t* kbias = p.key_bias ? p.key_bias + (int64_t)b * M : nullptr;

  // Per d = lane + 32 t, with a_j = p P_ij f_ij dP_ij, b_j = p P_ij, g_j = g(R_d (q_id - k_jd)):
  // sum_j a_j g_j, sum_j b_j g_j (dq) and the same times (q_id - k_jd) (dradius).
  acc_t dq_a[kPerLane], dq_b[kPerLane], dr_a[kPerLane], dr_b[kPerLane];
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) dq_a[t] = dq_b[t] = dr_a[t] = dr_b[t] = 0;
  acc_t delta_lane = 0;  // this lane's share of sum_j P f dP
  acc_t psum_lane = 0;   // this lane's share of c_i = sum_j P

  for (int j0 = 0; j0 < block_end; j0 += kTile) {
    __syncthreads();
    stage_transposed(Ks, k, j0, M, D);
    stage_rows(Vs, v, j0, M, Dv, vstride);
    __syncthreads();
    if (!live || j0 >= end_i) continue;  // warp-uniform

    // Lanes over keys: a_j and b_j (p dS_ij = a_j - b_j Delta_i, dP_ij = dO_i . v_j).
    const int j = j0 + lane;
    acc_t a = 0, bcoef = 0;
    if (j < end_i) {
      acc_t s = p.power * LogSincSum<acc_t>::run(qrow, 1, Ks + lane, kTileStride, Rs, D);
      if (mask_row) s += mask_row[j];
      if (kbias) s += kbias[j];
      const acc_t P = s == -ff_inf<acc_t>() ? acc_t(0) : ff_exp((s - L_high) - L_low);
      if (P != acc_t(0)) {
        const acc_t f = p.dropout_p > 0.0f ? dropout_factor(p, (uint32_t)bh, i, j) : acc_t(1);
        const acc_t* vrow = Vs + lane * vstride;
        acc_t dP = 0;
        for (int c = 0; c < Dv; ++c) dP += dorow[c] * vrow[c];
        const acc_t pfdp = P * f * dP;
        delta_lane += pfdp;
        psum_lane += P;
        a = p.power * pfdp;
        bcoef = p.power * P;
      }
    }
    // Lanes over d.
    const int nj = ff_min(kTile, end_i - j0);
    for (int jj = 0; jj < nj; ++jj) {
      const acc_t bj = __shfl_sync(kFullMask, bcoef, jj);
      const acc_t aj = __shfl_sync(kFullMask, a, jj);
      if (bj == acc_t(0)) continue;  // warp-uniform (P_ij = 0)
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int d = lane + 32 * t;
        if (d < D) {
          const acc_t diff = qrow[d] - Ks[d * kTileStride + jj];
          const acc_t gj = dlog_sinc(Rs[d] * diff);
          const acc_t gdiff = gj * diff;
          dq_a[t] += aj * gj;
          dq_b[t] += bj * gj;
          dr_a[t] += aj * gdiff;
          dr_b[t] += bj * gdiff;
        }
      }
    }
  }
  const acc_t psum = warp_sum(psum_lane);  // c_i; 0 for rows without a gradient
  const acc_t inv_c = psum > acc_t(0) ? acc_t(1) / psum : acc_t(0);
  const acc_t delta = warp_sum(delta_lane) * inv_c;  // sum_j (P_ij / c_i) f_ij dP_ij
  if (active && lane == 0) {  // for the dk/dv kernel
    p.delta[bh * N + i] = delta;
    p.lse_bwd[bh * N + i] = psum > acc_t(0) ? L + log((double)psum) : (double)INFINITY;
  }
  acc_t dr_acc[kPerLane];  // sum_j p dS_ij g(x_ijd) (q_id - k_jd)
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) dr_acc[t] = (dr_a[t] - delta * dr_b[t]) * inv_c;

  if (active) {
    scalar_t* dq_i = p.dq + (bh * N + i) * D;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int d = lane + 32 * t;
      if (d < D) dq_i[d] = static_cast<scalar_t>(Rs[d] * ((dq_a[t] - delta * dq_b[t]) * inv_c));
    }
  }

  // dradius[h, d] += sum over this block's rows, one atomicAdd per (block, d).
  __syncthreads();  // every warp is done with Ks
  acc_t* red = Ks;  // (kWarps, D) fits in (D, kTileStride)
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < D) red[warp * D + d] = dr_acc[t];
  }
  __syncthreads();
  for (int d = tid; d < D; d += kThreads) {
    acc_t sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += red[w * D + d];
    if (sum != acc_t(0)) atomicAdd(p.dradius + (int64_t)h * D + d, sum);
  }
}

// ---------------------------------------------------------------------------------------
// Backward, step 2: dk and dv; warp per key row, tiles of 32 queries (after step 1, whose
// Delta and lse it reads).
// Grid: B * H * ceil(M / kWarps) blocks.
// ---------------------------------------------------------------------------------------
template <typename scalar_t, typename acc_t>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kThreads) backward_dkv_kernel(const Params<scalar_t, acc_t> p) {
  FF_DYNAMIC_SHARED(smem_raw);
  const int D = p.D, Dv = p.Dv, N = p.N, M = p.M;
  const int ostride = odd_stride(Dv);
  acc_t* Qs = reinterpret_cast<acc_t*>(smem_raw);  // (D, kTileStride): queries of the tile, transposed
  acc_t* dOs = Qs + (int64_t)D * kTileStride;      // (kTile, ostride)
  acc_t* Ls = dOs + (int64_t)kTile * ostride;       // (kTile,) lse, high part (+inf: no gradient)
  acc_t* Ls_low = Ls + kTile;                       // (kTile,) lse, low part (see split_lse)
  acc_t* Deltas = Ls_low + kTile;                   // (kTile,) Delta
  acc_t* Kw = Deltas + kTile;                       // (kWarps, D): each warp's key row
  acc_t* Vw = Kw + (int64_t)kWarps * D;             // (kWarps, Dv): each warp's value row
  acc_t* Rs = Vw + (int64_t)kWarps * Dv;            // (D,)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int key_blocks = (M + kWarps - 1) / kWarps;
  const int64_t bh = blockIdx.x / key_blocks;
  const int kb = (int)(blockIdx.x - bh * key_blocks);
  const int b = (int)(bh / p.H), h = (int)(bh % p.H);
  const int j = kb * kWarps + warp;
  const bool active = j < M;

  const scalar_t* q = p.q + bh * N * D;
  const scalar_t* k = p.k + bh * M * D;
  const scalar_t* v = p.v + bh * M * Dv;
  const scalar_t* dout = p.dout + bh * N * Dv;
  for (int d = tid; d < D; d += kThreads) Rs[d] = p.radius[(int64_t)h * D + d];
  acc_t* krow = Kw + warp * D;
  acc_t* vrow = Vw + warp * Dv;
  if (active) {
    for (int d = lane; d < D; d += 32) krow[d] = load_as<acc_t>(k, (int64_t)j * D + d);
    for (int c = lane; c < Dv; c += 32) vrow[c] = load_as<acc_t>(v, (int64_t)j * Dv + c);
  }
  __syncthreads();  // Rs, krow, vrow are read below even when there is no tile to sweep (N = 0)
  const acc_t kbias_j = (p.key_bias && active) ? p.key_bias[(int64_t)b * M + j] : acc_t(0);
  const acc_t* mask_bh = p.attn_mask ? p.attn_mask + b * p.mask_sb + h * p.mask_sh : nullptr;
  const acc_t INF = ff_inf<acc_t>();
  // Query i sees key j iff j <= i + (M - N): the block's first key bounds the first query.
  const int i_begin = p.causal ? ff_max(0, kb * kWarps - (M - N)) : 0;

  acc_t dk_acc[kPerLane], dv_acc[kPerLane];
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) dk_acc[t] = dv_acc[t] = 0;

  for (int i0 = i_begin; i0 < N; i0 += kTile) {
    __syncthreads();
    stage_transposed(Qs, q, i0, N, D);
    stage_rows(dOs, dout, i0, N, Dv, ostride);
    if (tid < kTile) {
      const int i = i0 + tid;
      const double L = i < N ? p.lse_bwd[bh * N + i] : (double)INFINITY;
      acc_t high = INF, low = 0;
      if (L < (double)INFINITY) split_lse(L, high, low);
      Ls[tid] = high;
      Ls_low[tid] = low;
      Deltas[tid] = i < N ? p.delta[bh * N + i] : acc_t(0);
    }
    __syncthreads();
    if (!active) continue;

    // Lanes over queries: w_i = P_ij f_ij (for dv) and coef_i = p * dS_ij (for dk).
    const int i = i0 + lane;
    const int nq = ff_min(kTile, N - i0);
    const acc_t L = Ls[lane];
    acc_t coef = 0, w = 0;
    if (lane < nq && L < INF && (!p.causal || j <= i + (M - N))) {
      acc_t s = p.power * LogSincSum<acc_t>::run(Qs + lane, kTileStride, krow, 1, Rs, D);
      if (mask_bh) s += mask_bh[(int64_t)i * p.mask_row + j];
      s += kbias_j;
      const acc_t P = s == -INF ? acc_t(0) : ff_exp((s - L) - Ls_low[lane]);
      if (P != acc_t(0)) {
        const acc_t f = p.dropout_p > 0.0f ? dropout_factor(p, (uint32_t)bh, i, j) : acc_t(1);
        const acc_t* dorow = dOs + lane * ostride;
        acc_t dP = 0;
        for (int c = 0; c < Dv; ++c) dP += dorow[c] * vrow[c];
        w = P * f;
        coef = p.power * P * (dP * f - Deltas[lane]);
      }
    }
    for (int ii = 0; ii < nq; ++ii) {
      const acc_t wi = __shfl_sync(kFullMask, w, ii);
      const acc_t ci = __shfl_sync(kFullMask, coef, ii);
      if (wi != acc_t(0)) {  // warp-uniform
        const acc_t* dorow = dOs + ii * ostride;
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) {
          const int c = lane + 32 * t;
          if (c < Dv) dv_acc[t] += wi * dorow[c];
        }
      }
      if (ci != acc_t(0)) {  // warp-uniform
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) {
          const int d = lane + 32 * t;
          if (d < D) dk_acc[t] += ci * dlog_sinc(Rs[d] * (Qs[d * kTileStride + ii] - krow[d]));
        }
      }
    }
  }

  if (!active) return;  // after the last __syncthreads
  scalar_t* dk_j = p.dk + (bh * M + j) * D;
  scalar_t* dv_j = p.dv + (bh * M + j) * Dv;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < D) dk_j[d] = static_cast<scalar_t>(-Rs[d] * dk_acc[t]);
    const int c = lane + 32 * t;
    if (c < Dv) dv_j[c] = static_cast<scalar_t>(dv_acc[t]);
  }
}

}  // namespace cuda
}  // namespace fourierformer
