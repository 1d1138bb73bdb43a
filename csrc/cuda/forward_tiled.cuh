// Forward of the float32 path (float32, float16, bfloat16 inputs; float32 arithmetic): register
// tiles over the tables of tables.cuh, like a matmul micro-kernel.
//
// A block owns kFwdRows query rows of one (batch, head) slice and sweeps the visible keys in
// tiles of kFwdKeys (causal: tiles past the block's last visible key are skipped). Blocks of
// kFwdThreads threads for Dv <= 64; for Dv > 64, 2 kFwdThreads threads whose two halves take half
// of the features each (forward_split: a single-half block needs so many registers at head dim
// 128 that an SM holds half the warps, and at the IWSLT shape, N = 64 and one block per (batch,
// head), too few blocks fill the GPU), then swap quotients so that each half finishes half of
// the pairs.
// Per key tile (tile_scores_impl):
//   1. scores: each thread owns kMicro rows x kMicro keys; the features are staged kChunk at a
//      time (two-half blocks: kChunk / 2 for each half; row fields q c, t_hi, t_lo; key fields k c, X, y_hi, y_lo, see tables.cuh;
//      one float4 per field and thread where N and M are multiples of 4), and per (row, key,
//      feature) the element step is
//          u = q c - k c;  s' = fma(t_hi, X, -y_hi) + fma(t_lo, X, -y_lo);  num *= s';  den *= u
//      (FADD, 2 FFMA, FADD, 2 FMUL: no sin, no cos, no branch), plus per kRenormEvery = 8
//      features one renormalisation of num and den kept in the exponent bits (integer
//      operations on the float's bits, no division) with the exponent fields watched
//      (FieldWatch: den's and num's smallest, the largest of both); den's smallest field is the
//      q = k check, once per feature group (0 when some u was exactly 0), the others catch a
//      product of 8 factors that underflowed or overflowed (the rare path then recomputes the
//      thread's pairs). Per feature, float4 loads from shared memory feed all 16 pairs of the
//      thread; the shared-memory offsets are compile-time constants and a chunk's groups are
//      unrolled, so that the loop is the element step and little else. What that costs in the
//      sm_90 SASS, kernel version by kernel version: docs/records/speed.md (the report,
//      scripts/benchmarks/cuda_sass_report.py). Per pair at the end: log |num / den|
//      with num and den in [1, 2) (log_ratio: 2 atanh of (num - den) / (num + den), one
//      division and a degree-4 polynomial, no branch) plus the row and key constants (the key
//      constants loaded once per key, not per pair), times power log2(e) as a float pair; the
//      pair's visibility selected, not branched on.
//   2. the rare path: a thread whose den had a zero or subnormal exponent field (a u exactly 0,
//      q = k in that feature, or, the group's smallest |u| being at most the geometric mean of
//      its 8, some |u| at or below 2^-15.75) rewrites, after the tile's scores are in shared
//      memory (rare_scores_log2), the pairs that have |u| <= kUFloor (|x| < 2^-14) in some
//      feature with the exact per-element math of the simple path (ff_sincosf, Taylor branch,
//      floors), reading the tables from global memory. A pair with 0 < |u| <= kUFloor in a group
//      whose den stayed normal keeps the fast score: there s' is the table difference t X - Y,
//      accurate to 2^-47 |tan a| |X| absolutely, and |x| >= 2^-24 |a| for q != k, so s' / u keeps
//      about float accuracy (a few ulps) relative to the factor. A thread whose num underflowed
//      or whose num or den overflowed in some group (kRareAll) rewrites every visible pair.
//   3. masks; the scores (in log2 units: S log2(e), with the same roundings as S but the last)
//      go to shared memory; 4 threads per row (8 in the two-half blocks) do the online softmax
//      with ex2.approx (about 2 ulp, as the expf that CUDA builds on it) and out += P V with V
//      staged as float32, the unnormalised output and the running max and sums kept in shared
//      memory between key tiles, so that no instance needs to spill (shared memory per block:
//      tiled_forward_smem_floats; where the GPU allows less per block than Dv above 128 needs,
//      as sm_86 and sm_89, the launcher runs the simple forward there). The block's bh and i0
//      are read back from shared memory in each key tile, and dropout is applied in a
//      block-uniform branch after the exponentials.
//
// Threads with no visible pair (micro_tile_live) skip the chunk loop's products; the report's
// counts are for full tiles.
//
// phi = sigmoid (kPhi, Phi::kSigmoid) sums log sigmoid(sinc x) over the features in place of the
// products (sigmoid_sinc_term below): the same staging with two places read otherwise, the same
// chunks and groups, then the pair's sum as its score; no rare path, masks as above.
//
// The row constant row_log_i (tables.cuh) is large (of order D) and cancels against the
// exponents of num / den: it is added as fma(e, ln2_high, row_log_high) first, exact in e
// (ln2_high has 9 bits), so that S_ij keeps float accuracy relative to |S_ij|.
#pragma once

#include <type_traits>

#include "tables.cuh"
#include "tile_switch.h"

namespace fourierformer {
namespace cuda {

constexpr int kFwdRows = 64;     // query rows per block
constexpr int kFwdKeys = 64;     // keys per tile
constexpr int kFwdThreads = 256;
constexpr int kFwdRowsLog2 = 6, kFwdKeysLog2 = 6;
static_assert(kFwdRows == 1 << kFwdRowsLog2 && kFwdKeys == 1 << kFwdKeysLog2, "tiles of powers of two");
constexpr int kStageStep = kFwdThreads / kFwdRows;  // features staged per pass over the threads
static_assert(kFwdRows == kFwdKeys && kFwdThreads % kFwdRows == 0, "staging: one row and one key per thread");
constexpr int kMicro = 4;        // rows and keys of a thread's register tile (16 x 16 threads)
constexpr int kChunk = 16;       // features staged at a time (a multiple of kRenormEvery)
constexpr int kScoreStride = kFwdKeys + 4;  // row stride of the score tile (float4 aligned, no bank conflicts)
static_assert(kChunk % kRenormEvery == 0, "chunks hold whole renormalisation groups");

// Value columns padded to a multiple of 16 (4 threads per row, a float4 each per 16 columns).
FF_HD int padded_value_columns(int Dv) { return (Dv + 15) / 16 * 16; }

// Shared memory of the tiled forward in floats: the staged chunk (reused for the V tile), the
// score tile and the unnormalised output tile (row stride output_stride: the 8 rows of a quarter
// warp's float4 accesses fall in distinct banks).
// The forward with Dv > 64 (forward_tiled_kernel<scalar_t, 64>) splits the features of each
// chunk between two halves of a block of 2 kFwdThreads threads (twice the warps per SM at the
// same tile: at head dim 128 and N = 64, as in IWSLT, one block per (batch, head) and SM would
// otherwise leave half of the SM's warp slots empty); the second half hands its num / den and
// exponents over through the chunk region.
template <int kO>
FF_HD constexpr int forward_split() { return kO > 16 ? 2 : 1; }
template <int kO>
struct ForwardSplit {
  static FF_HD constexpr int at(int64_t) { return forward_split<kO>(); }
};
// threads per block of the instance the launcher runs at Dv (ForwardColumns, tile_switch.h)
FF_HD int forward_threads(int Dv) { return kFwdThreads * ForwardColumns::apply<ForwardSplit>(Dv); }
constexpr int kSplitExchangeFloats = (2 * kMicro * kMicro + 2) * kFwdThreads;  // see tile_scores_impl

// Row stride of the forward's V tile: up to kO = 32, 4 kO, the most value columns of the kernel
// instance that the launcher runs at Dv (forward_tiled_kernel<scalar_t, kO>, kO by ForwardColumns
// in tile_switch.h): a compile-time stride in the P V loop (a runtime one costs address
// arithmetic per key and column group there); above, Dv padded to 16 (kO = 64: a fixed 256
// would cost shared memory that GPUs with 99 KiB per block do not have).
template <int kO>
struct ForwardValueStride {
  static FF_HD int at(int64_t Dv) { return kO <= 32 ? 4 * kO : padded_value_columns((int)Dv); }
};
FF_HD int forward_value_stride(int Dv) { return ForwardColumns::apply<ForwardValueStride>(Dv); }

FF_HD int64_t tiled_forward_region_floats(int Dv) {
  const int64_t chunk = (int64_t)kChunk * (kRowFields * kFwdRows + kKeyFields * kFwdKeys);
  const int64_t vtile = (int64_t)kFwdKeys * forward_value_stride(Dv);
  const int64_t exchange = Dv > 64 ? kSplitExchangeFloats : 0;
  const int64_t m = chunk > vtile ? chunk : vtile;
  return m > exchange ? m : exchange;
}
FF_HD int output_stride(int Dv) {
  const int Dvs = padded_value_columns(Dv);
  return Dv > 64 || (Dvs / 16) % 2 == 1 ? Dvs : Dvs + 16;  // (Dv > 64: 8 threads per row, one per bank group)
}
// odd: Phi::kOdd's instance, which keeps the signs of the score tile beside it (a byte per pair, at
// the end).
FF_HD int64_t tiled_forward_smem_floats(int Dv, bool odd = false) {
  return tiled_forward_region_floats(Dv) + (int64_t)kFwdRows * kScoreStride + (int64_t)kFwdRows * output_stride(Dv) +
         2 * (int64_t)forward_threads(Dv) + 4 +  // (+ ids, at the start)
         (odd ? (int64_t)kFwdRows * kFwdKeys / 4 : 0);
}

// phi = ReLU: |num| times |s'|, with num's sign bit set where the factor's sinc is negative (the sign
// bits of s', u and t_low, which holds the sign of cos a, differ in an odd number: tables.cuh), so
// that it stays set through the products and the renormalisations (their exponent arithmetic keeps
// the sign bit): num < 0 at the end says some factor was negative. Two logic operations per element.
FF_DEV float relu_mark(float product, float s, float u, float t_low) {
  const int negative = (ff_float_bits(s) ^ ff_float_bits(u) ^ ff_float_bits(t_low)) & (int)0x80000000;
  return ff_bits_float(ff_float_bits(product) | negative);
}

// Phi::kOdd: s' with t_low's sign bit (the sign of cos a) xor'ed into it, so that the signs of num
// and den differ exactly where the product of the sincs is negative (s' u has the sign of -sinc(x)
// cos a: tables.cuh), their parity kept through the products and the renormalisations as ReLU's
// mark is. One logic operation per element.
FF_DEV float odd_factor(float s, float t_low) {
  return ff_bits_float(ff_float_bits(s) ^ (ff_float_bits(t_low) & (int)0x80000000));
}

// One element step (see above). Signs drop out at the end (log |num / den|); kRelu (phi = ReLU):
// num's sign bit says whether a factor was negative (relu_mark); kOdd (odd p): num / den has the
// sign of the product of the sincs (odd_factor).
template <bool kRelu = false, bool kOdd = false>
FF_DEV void sinc_factor_step(float q, float t, float t_low, float k, float X, float Y, float Y_low, float& num,
                             float& den) {
  const float u = q - k;
  const float s = fmaf(t, X, -Y) + fmaf(t_low, X, -Y_low);
  if (kRelu)
    num = relu_mark(num * fabsf(s), s, u, t_low);
  else if (kOdd)
    num *= odd_factor(s, t_low);
  else
    num *= s;
  den *= u;
}

// The exponent fields that renormalise() watches, for the rare path (see ScoreFlags).
struct FieldWatch {
  int den_min = 0x7F800000;  // smallest exponent field of den
  int num_min = 0x7F800000;  // smallest exponent field of num
  int max = 0;               // largest exponent field of num and den
};

// What the rare path must do for a thread's pairs: kRareSelect, den left the normal range
// downwards (a u exactly 0, q = k in that feature: 0 / 0, or, the smallest of the group's 8
// factors being at most their geometric mean, some |u| of the group at or below 2^-15.75, under
// kUFloor): recompute the pairs that have |u| <= kUFloor in some feature; kRareAll, num
// underflowed (8 factors near sinc's zeros or q = k: 0) or num or den overflowed (a product of
// 8 factors past 2^127): recompute every pair of the thread.
enum ScoreFlags : int { kRareSelect = 1, kRareAll = 2 };
FF_DEV int score_flags(const FieldWatch& w) {
  return (w.den_min == 0 ? kRareSelect : 0) | (w.num_min == 0 || w.max == 0x7F800000 ? kRareAll : 0);
}

// The first element step of a product: num and den set, not multiplied.
template <bool kRelu = false, bool kOdd = false>
FF_DEV void first_factor_step(float q, float t, float t_low, float k, float X, float Y, float Y_low, float& num,
                              float& den) {
  const float s = fmaf(t, X, -Y) + fmaf(t_low, X, -Y_low);
  den = q - k;
  num = kRelu ? relu_mark(fabsf(s), s, den, t_low) : (kOdd ? odd_factor(s, t_low) : s);
}

// Phi::kOdd: whether num / den (of sinc_factor_step<false, true>) is negative.
FF_DEV bool odd_negative(float num, float den) { return (ff_float_bits(num) ^ ff_float_bits(den)) < 0; }

// phi = ReLU: whether num (of sinc_factor_step<true>) says some factor was negative.
FF_DEV bool relu_dead(float num) { return ff_float_bits(num) < 0; }

// num and den to their mantissas in [1, 2) (sign kept), expo += exponent(num) - exponent(den),
// all in the exponent bits (integer operations, no division and no branch), every kRenormEvery
// = 8 features; the fields seen go to the watch (integer min / max per pair: spread over the 8
// features of a group, less than the element step itself).
FF_DEV void renormalise(float& num, float& den, int& expo, FieldWatch& w) {
  const int nb = ff_float_bits(num), db = ff_float_bits(den);
  const int ne = nb & 0x7F800000, de = db & 0x7F800000;
  num = ff_bits_float(nb - ne + 0x3F800000);
  den = ff_bits_float(db - de + 0x3F800000);
  expo += (ne - de) >> 23;  // ne - de fits an int; arithmetic shift
  w.den_min = de < w.den_min ? de : w.den_min;
  w.num_min = ne < w.num_min ? ne : w.num_min;
  const int m = ne > de ? ne : de;
  w.max = m > w.max ? m : w.max;
}

// a / b to about 2 ulp: reciprocal and multiply (div.approx.ftz: no range fix-up, so b must be
// a normal float below 2^126 in magnitude, as in every use here).
FF_DEV float ff_divide_approx(float a, float b) {
#if defined(FF_HOST_EMULATION)
  return a / b;
#else
  float r;
  asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#endif
}

FF_DEV float pad_key_field(int f) { return f == kKeySin ? -1.0f : (f == kKeySinLow ? 0.0f : 1.0f); }

FF_DEV float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// The rare path for pair (i, j): if |u| <= kUFloor in some feature, or with `all`, its score
// from the per-element math of the simple path (Taylor branch, floors), else `fast` unchanged.
// Out of line: the tile loop should not carry its registers.
#if defined(FF_HOST_EMULATION)
inline
#else
static __device__ __noinline__  // (static: one copy per translation unit, see launch_<dtype>.cu)
#endif
float rare_pair_score(const float* trows, const float* tkeys, const float* x_per_u, int N, int M, int Dp, int i, int j,
                      float power, float fast, bool all, bool relu) {
  const float* qc = trows + (int64_t)kRowQ * Dp * N + i;
  const float* kc = tkeys + (int64_t)kKeyK * Dp * M + j;
  float closest = ff_inf<float>();
  for (int d = 0; d < Dp; ++d) closest = fminf(closest, fabsf(qc[(int64_t)d * N] - kc[(int64_t)d * M]));
  if (!all && !(closest <= kUFloor)) return fast;
  return power * (relu ? LogSincSum<float>::run<true>(qc, N, kc, M, x_per_u, Dp)
                       : LogSincSum<float>::run<false>(qc, N, kc, M, x_per_u, Dp));
}

// rare_pair_score for Phi::kOdd: the score (NaN: not a rare pair) and, through `negative`, the sign
// of the product of the sincs from the same per-element math (LogSincSum::run_signed: the signs of
// sin x and x outside the Taylor branch, positive within it).
#if defined(FF_HOST_EMULATION)
inline
#else
static __device__ __noinline__
#endif
float rare_pair_score_odd(const float* trows, const float* tkeys, const float* x_per_u, int N, int M, int Dp, int i,
                          int j, float power, bool all, bool& negative) {
  const float* qc = trows + (int64_t)kRowQ * Dp * N + i;
  const float* kc = tkeys + (int64_t)kKeyK * Dp * M + j;
  float closest = ff_inf<float>();
  for (int d = 0; d < Dp; ++d) closest = fminf(closest, fabsf(qc[(int64_t)d * N] - kc[(int64_t)d * M]));
  if (!all && !(closest <= kUFloor)) return NAN;
  return power * LogSincSum<float>::run_signed(qc, N, kc, M, x_per_u, Dp, negative);
}

// log2(e) = kLog2eHigh + kLog2eLow to about 2^-48: fma(S, kLog2eHigh, S * kLog2eLow) is S log2(e)
// with one rounding.
constexpr float kLog2eHigh = 1.44269502162933349609375f;
constexpr float kLog2eLow = 1.925963033500011079e-8f;

// 2^x (ex2.approx.ftz: about 2 ulp, as the expf that CUDA builds on it; 0 for x = -inf).
FF_DEV float ff_exp2_approx(float x) {
#if defined(FF_HOST_EMULATION)
  return exp2f(x);
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#endif
}

// s + add log2(e), add (a mask, natural log) split as fma(add, kLog2eHigh, add kLog2eLow).
FF_DEV float add_log2(float s, float add) { return fmaf(add, kLog2eHigh, fmaf(add, kLog2eLow, s)); }

// ---- phi = sigmoid: a sum over the features of log sigmoid(sinc x), not a product ----
// Its element reads the tables as the others' do, two places staged otherwise (sigmoid_row_field):
// the row's t_low place holds cos a (cos_from_tan, tables.cuh) and the key's y_low place the
// feature's x_per_u. With x = x_per_u u (u = q c - k c), sinc x = s' cos a / x, s' = fma(t_hi, X,
// -y_hi) from the high parts alone: t_low and y_low move s' cos a (= sin x) by under 2^-23
// absolutely, however large t, and sigmoid wants sinc to that absolute accuracy (not relative, as
// log|sinc| does near sinc's zeros). Below |x| = kSincTaylorBound sinc's series in x (1 at q = k:
// no quotient, no floor, so no rare path); log sigmoid by its polynomial on sinc's range
// (log_sigmoid_poly). Per element: u, x, x^2, s', s' cos a, the quotient (div.approx), the series
// (2), the select and the polynomial (8); the terms summed per group of kRenormEvery features,
// the groups into the pair's sum (den, num in tile_scores_impl).
FF_DEV float sigmoid_sinc_term(float q, float t, float cos_a, float k, float X, float Y, float x_per_u) {
  const float x = x_per_u * (q - k);
  const float x2 = x * x;
  const float quotient = ff_divide_approx(fmaf(t, X, -Y) * cos_a, x);  // (used where |x| >= kSincTaylorBound)
  return log_sigmoid_poly(x2 < kSincTaylorBound * kSincTaylorBound ? sinc_taylor(x2) : quotient);
}

FF_DEV float4 splat4(float x) { return make_float4(x, x, x, x); }

// Row field f of a feature as phi = sigmoid stages it (its t_low place: cos a), one float or four
// consecutive rows (src: field 0's, fields `field` floats apart).
FF_DEV float sigmoid_row_field(const float* src, int64_t field, int f) {
  return f == kRowTanLow ? cos_from_tan(src[kRowTan * field], src[kRowTanLow * field]) : src[f * field];
}
FF_DEV float4 sigmoid_row_field4(const float* src, int64_t field, int f) {
  const float4 v = load4(src + f * field);
  if (f != kRowTanLow) return v;
  const float4 t = load4(src + kRowTan * field);
  return make_float4(cos_from_tan(t.x, v.x), cos_from_tan(t.y, v.y), cos_from_tan(t.z, v.z), cos_from_tan(t.w, v.w));
}

// What the Dp - D padding features add to a phi = sigmoid score, which subtracts it: each is
// flat with x_per_u 0 (x = 0, sinc 1), its term log_sigmoid_poly(1).
template <typename P>
FF_DEV float sigmoid_padding_terms(const P& p) {
  return (float)(p.Dp - p.D) * log_sigmoid_poly(1.0f);
}

// Whether a thread's kMicro x kMicro pairs (queries i0 + ty kMicro + (0 .. kMicro - 1), keys
// j0 + tx kMicro + (0 .. kMicro - 1)) can hold a visible one: a row before N, a key before the
// visible end of its last row (M; the causal diagonal). A thread that is not live computes no
// products in tile_scores_impl and no dP or g in the backward (it stages, writes its zeros and
// meets the barriers): short sequences (N, M <= 32, as in translation) leave most of a 64 x 64
// tile so, and a warp of such threads issues nothing there.
template <typename P>
FF_DEV bool micro_tile_live(const P& p, int i0, int j0, int tx, int ty) {
  const int first_row = i0 + ty * kMicro;
  return first_row < p.N && j0 + tx * kMicro < visible_end(p, ff_min(first_row + kMicro - 1, p.N - 1));
}

// Scores of a tile, masks included: S[ii][jj] of query i0 + ty * kMicro + ii and key
// j0 + tx * kMicro + jj (-inf where the key is not visible or masked; rows past N see nothing),
// times log2(e) (the softmax's units in the forward and the backward: P = 2^(S - m)), with the
// roundings of S but the last.
// All threads of the block call it (it stages the features chunk by chunk into `region`,
// with barriers; the caller must not touch region before the next barrier either).
// kSplit 2: a block of 2 kFwdThreads threads, thread tid and tid + kFwdThreads (same tx, ty) each
// take half of every chunk's features, then swap products: S[ii][jj] (ii < kMicro / 2) is then
// that of row ty * kMicro + half * kMicro / 2 + ii, half = threadIdx.x / kFwdThreads.
// kPhi: the call's phi (Phi). kPhi sigmoid sums terms (sigmoid_sinc_term) where the others multiply
// factors: num holds a pair's sum, den its group's (no renormalisation, no rare path, see above).
// kPhi kOdd: `negative` gets the signs of the pairs' products of sincs, bit kMicro ii + jj for
// S[ii][jj] (odd_factor; the rare path's from its per-element math); the other phis leave it alone.
template <int kSplit, bool kRareHere, Phi kPhi, typename scalar_t>
FF_DEV void tile_scores_impl(const Params<scalar_t, float>& p, int64_t bh, int i0, int j0, int tx, int ty,
                             float* region, float (&S)[kMicro][kMicro], int& rare, unsigned& negative) {
  static_assert(kSplit == 1 || kSplit == 2, "one or two halves");
  constexpr bool kRelu = kPhi == Phi::kRelu, kSigmoid = kPhi == Phi::kSigmoid, kOdd = kPhi == Phi::kOdd;
  const int N = p.N, M = p.M, Dp = p.Dp;
  const int tid = threadIdx.x & (kFwdThreads - 1);
  const int half = kSplit == 1 ? 0 : (int)threadIdx.x / kFwdThreads;
  constexpr int kC = kChunk;                        // features staged at a time (kSplit 2: half each)
  float* Rf = region;                               // (kRowFields, kC, kFwdRows)
  float* Kf = region + kRowFields * kC * kFwdRows;  // (kKeyFields, kC, kFwdKeys)
  const float NEG_INF = -ff_inf<float>();
  // (a thread that is not live: scores -inf, as they would be, no products)
  const bool live = micro_tile_live(p, i0, j0, tx, ty);
  // ---- 1. products over the features ----
  float num[kMicro][kMicro], den[kMicro][kMicro];
  int expo[kMicro][kMicro];
#pragma unroll
  for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
    for (int jj = 0; jj < kMicro; ++jj) {
      if (kSigmoid) {  // (den: set by each group's first feature)
        num[ii][jj] = 0.0f;
      } else if (kSplit == 2) {  // (kSplit 1: set by the first feature, first_factor_step)
        num[ii][jj] = 1.0f;
        den[ii][jj] = 1.0f;
      }
      expo[ii][jj] = 0;
    }
  FieldWatch watch;  // see renormalise
  // Staging. Where N and M are multiples of 4 (the table rows then start 16-byte aligned),
  // thread tid stages feature tid / 16 of the chunk, rows and keys 4 (tid % 16) + (0..3), as one
  // float4 per field (kSplit 2: the rows by the first half, the keys by the second); otherwise
  // (the first half) rows / keys tid % 64 of features tid / 64 + 4 n one float at a time. Rows and keys past the end stage the
  // last ones' fields (finite and never visible: no predication; a spurious q = k there can only
  // send the thread down the rare path).
  static_assert(kFwdThreads == 16 * kChunk && kFwdRows == 64 && kFwdKeys == 64, "staging: 16 float4 per field");
  const bool wide = ((N | M) & 3) == 0;  // block-uniform
  const int sr = wide ? 4 * (tid & 15) : tid & (kFwdRows - 1);
  const int sd0 = wide ? tid >> 4 : tid >> kFwdRowsLog2;
  const int64_t rfield = (int64_t)Dp * N, kfield = (int64_t)Dp * M;
  // (kSigmoid: the head's x_per_u, staged in the keys' y_low place)
  const float* head_x_per_u = kSigmoid ? p.x_per_u + (int64_t)((int)bh % p.H) * Dp : nullptr;
  const float* rsrc = p.trows + bh * kRowFields * Dp * N + (int64_t)sd0 * N + ff_min(i0 + sr, wide ? N - 4 : N - 1);
  const float* ksrc = p.tkeys + bh * kKeyFields * Dp * M + (int64_t)sd0 * M + ff_min(j0 + sr, wide ? M - 4 : M - 1);
  constexpr int kGroups = kChunk / kRenormEvery / kSplit;  // renormalisation groups per half and chunk
  const float* rf0 = Rf + (half * kGroups * kRenormEvery) * kFwdRows + ty * kMicro;
  const float* kf0 = Kf + (half * kGroups * kRenormEvery) * kFwdKeys + tx * kMicro;
  // One chunk of kC features from d0 (rsrc and ksrc at its first feature). The first chunk
  // (kFirst) runs outside the loop: with one half (kSplit 1) its first group always runs (Dp >= 8,
  // padded_features), and its first feature sets num and den instead of multiplying them
  // (no initialisation to 1, no multiply by 1, which FTZ does not let the compiler fold).
  auto chunk = [&](int d0, auto first) {
    constexpr bool kFirst = decltype(first)::value && kSplit == 1;
    const int dc = ff_min(kC, Dp - d0);  // a multiple of kRenormEvery
    __syncthreads();  // the previous chunk, or whatever the caller kept in region, is consumed
    if (wide) {  // (kSplit 2: the first half stages the rows, the second the keys)
      if (sd0 < dc) {
        float* rdst = Rf + sd0 * kFwdRows + sr;
        float* kdst = Kf + sd0 * kFwdKeys + sr;
        if (half == 0) {
#pragma unroll
          for (int f = 0; f < kRowFields; ++f)
            *reinterpret_cast<float4*>(rdst + f * kC * kFwdRows) =
                kSigmoid ? sigmoid_row_field4(rsrc, rfield, f) : *reinterpret_cast<const float4*>(rsrc + f * rfield);
        }
        if (kSplit == 1 || half == 1) {
#pragma unroll
          for (int f = 0; f < kKeyFields; ++f)
            *reinterpret_cast<float4*>(kdst + f * kC * kFwdKeys) =
                kSigmoid && f == kKeySinLow ? splat4(head_x_per_u[d0 + sd0])
                                            : *reinterpret_cast<const float4*>(ksrc + f * kfield);
        }
      }
    // SASS: cold=scalar_staging begin test
    } else if (half == 0) {  // scalar staging
#pragma unroll
      for (int n = 0; n < kC / kStageStep; ++n) {
        const int dd = sd0 + n * kStageStep;
        if (dd < dc) {
          const float* r = rsrc + n * kStageStep * (int64_t)N;
          const float* k = ksrc + n * kStageStep * (int64_t)M;
#pragma unroll
          for (int f = 0; f < kRowFields; ++f)
            Rf[(f * kC + dd) * kFwdRows + sr] = kSigmoid ? sigmoid_row_field(r, rfield, f) : r[f * rfield];
#pragma unroll
          for (int f = 0; f < kKeyFields; ++f)
            Kf[(f * kC + dd) * kFwdKeys + sr] =
                kSigmoid && f == kKeySinLow ? head_x_per_u[d0 + dd] : k[f * kfield];
        }
      }
      // SASS: cold=scalar_staging end
    }
    __syncthreads();
    rsrc += kC * (int64_t)N;  // (the next chunk's)
    ksrc += kC * (int64_t)M;
    if (!live) return;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      if ((kFirst && g == 0) || (half * kGroups + g) * kRenormEvery < dc) {  // uniform in each half
#pragma unroll
        for (int e = 0; e < kRenormEvery; ++e) {
          const int dd = g * kRenormEvery + e;  // compile-time offsets below
          const float* rf = rf0 + dd * kFwdRows;
          const float* kf = kf0 + dd * kFwdKeys;
          const float4 q4 = load4(rf), t4 = load4(rf + kC * kFwdRows), tl4 = load4(rf + 2 * kC * kFwdRows);
          const float4 k4 = load4(kf), X4 = load4(kf + kC * kFwdKeys), Y4 = load4(kf + 2 * kC * kFwdKeys),
                       Yl4 = load4(kf + 3 * kC * kFwdKeys);
          const float qv[4] = {q4.x, q4.y, q4.z, q4.w}, tv[4] = {t4.x, t4.y, t4.z, t4.w},
                      tlv[4] = {tl4.x, tl4.y, tl4.z, tl4.w};
          const float kv[4] = {k4.x, k4.y, k4.z, k4.w}, Xv[4] = {X4.x, X4.y, X4.z, X4.w},
                      Yv[4] = {Y4.x, Y4.y, Y4.z, Y4.w}, Ylv[4] = {Yl4.x, Yl4.y, Yl4.z, Yl4.w};
#pragma unroll
          for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
            for (int jj = 0; jj < kMicro; ++jj) {
              if constexpr (kSigmoid) {  // (staged: cos a at t_low's place, x_per_u at y_low's)
                const float term = sigmoid_sinc_term(qv[ii], tv[ii], tlv[ii], kv[jj], Xv[jj], Yv[jj], Ylv[jj]);
                den[ii][jj] = e == 0 ? term : den[ii][jj] + term;
              } else if (kFirst && g == 0 && e == 0) {
                first_factor_step<kRelu, kOdd>(qv[ii], tv[ii], tlv[ii], kv[jj], Xv[jj], Yv[jj], Ylv[jj],
                                               num[ii][jj], den[ii][jj]);
              } else {
                sinc_factor_step<kRelu, kOdd>(qv[ii], tv[ii], tlv[ii], kv[jj], Xv[jj], Yv[jj], Ylv[jj], num[ii][jj],
                                              den[ii][jj]);
              }
            }
        }
#pragma unroll
        for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
          for (int jj = 0; jj < kMicro; ++jj) {
            if constexpr (kSigmoid)
              num[ii][jj] += den[ii][jj];  // the group's sum into the pair's
            else
              renormalise(num[ii][jj], den[ii][jj], expo[ii][jj], watch);
          }
      }
    }
  };
  chunk(0, std::true_type{});
  // SASS: loop=scores_chunks step=kChunk trips=ceil(Dp/kChunk)-1 elements=kMicro*kMicro*chunk_dc/split unit=qkd
  for (int d0 = kC; d0 < Dp; d0 += kC) chunk(d0, std::false_type{});
  // SASS: cold=empty_tile begin
  auto no_scores = [&]() {  // (a thread that is not live)
#pragma unroll
    for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) S[ii][jj] = NEG_INF;
    rare = 0;
    if (kOdd) negative = 0;
    // SASS: cold=empty_tile end
  };
  // SASS: cold=empty_tile test
  if (kSplit == 1 && !live) return no_scores();

  constexpr int kRows = kMicro / kSplit;
  const int row0 = ty * kMicro + half * kRows;  // the thread's rows: row0 + (0 .. kRows - 1)
  int flags;  // ScoreFlags (kSplit 2: both halves')
  int row_end[kRows];
  if constexpr (kSigmoid) {
    // ---- phi = sigmoid: the pair's sum (kSplit 2: the halves swap sums), less the padding's ----
    float sum[kRows][kMicro];
    if (kSplit == 1) {
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj) sum[ii][jj] = num[ii][jj];
    } else {
      __syncthreads();  // the last chunk is consumed
      // slot of pair q written by half w, read by the other (as the quotients below)
      auto slot = [&](int w, int q) { return region + (w * kRows * kMicro + q) * kFwdThreads + tid; };
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj)  // half 0 hands rows kRows.., half 1 rows 0..
          *slot(half, ii * kMicro + jj) = half == 0 ? num[kRows + ii][jj] : num[ii][jj];
      __syncthreads();
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj)
          sum[ii][jj] = (half == 0 ? num[ii][jj] : num[kRows + ii][jj]) + *slot(1 - half, ii * kMicro + jj);
      // SASS: cold=empty_tile test
      if (!live) return no_scores();  // (after the exchange's barriers; the partner is not live either)
    }
    flags = 0;  // (no products: nothing to leave the float range, and the series at q = k)
    const float padding = sigmoid_padding_terms(p);
    const float power_high = p.power_log2_high, power_low = p.power_log2_low;  // (power 1: log2(e))
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      const int i = i0 + row0 + ii;
      row_end[ii] = i < N ? visible_end(p, i) : 0;
    }
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) {
        const float s = sum[ii][jj] - padding;
        S[ii][jj] = fmaf(s, power_high, s * power_low);
      }
  } else {
    flags = score_flags(watch);
    // ---- kSplit 2: the halves swap quotients, each keeps kRows of the kMicro rows ----
    // rn / rd = |num / den| in (1/2, 2), rn and rd in [1, 2) (kSplit 2: the product of the halves'
    // quotients brought back to [1, 2) with its exponent moved to ex, over 1): log_ratio's range
    float rn[kRows][kMicro], rd[kRows][kMicro];
    int ex[kRows][kMicro];
    bool dead[kRows][kMicro];  // (kRelu: a factor's sinc is negative; kSplit 2: in either half)
    bool odd[kRows][kMicro];   // (kOdd: the product is negative; kSplit 2: the halves' parities)
    if (kSplit == 1) {
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj) {
          dead[ii][jj] = kRelu && relu_dead(num[ii][jj]);
          odd[ii][jj] = kOdd && odd_negative(num[ii][jj], den[ii][jj]);
          rn[ii][jj] = fabsf(num[ii][jj]);
          rd[ii][jj] = fabsf(den[ii][jj]);
          ex[ii][jj] = expo[ii][jj];
        }
    } else {
      constexpr int kHanded = kRows * kMicro;  // pairs handed over
      __syncthreads();  // the last chunk is consumed
      // slot (field: quotient, exponent; writer half; pair) of thread tid
      auto slot = [&](int f, int w, int q) { return region + ((f * 2 + w) * kHanded + q) * kFwdThreads + tid; };
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj) {  // half 0 hands rows kRows.., half 1 rows 0..
          const int q = ii * kMicro + jj;
          const float hn = half == 0 ? num[kRows + ii][jj] : num[ii][jj];
          const float hd = half == 0 ? den[kRows + ii][jj] : den[ii][jj];
          const int he = half == 0 ? expo[kRows + ii][jj] : expo[ii][jj];
          // (kRelu: with hn's sign, relu_dead; kOdd: with the sign of hn / hd, odd_negative)
          const float quotient = fabsf(ff_divide_approx(hn, hd));
          *slot(0, half, q) = kRelu ? copysignf(quotient, hn) : (kOdd ? ff_divide_approx(hn, hd) : quotient);
          *slot(1, half, q) = ff_bits_float(he);
        }
      region[4 * kHanded * kFwdThreads + half * kFwdThreads + tid] = ff_bits_float(score_flags(watch));
      __syncthreads();
      const int other = 1 - half;
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj) {
          const int q = ii * kMicro + jj;
          const float kn = half == 0 ? num[ii][jj] : num[kRows + ii][jj];
          const float kd = half == 0 ? den[ii][jj] : den[kRows + ii][jj];
          const int ke = half == 0 ? expo[ii][jj] : expo[kRows + ii][jj];
          const float handed = *slot(0, other, q);
          dead[ii][jj] = kRelu && (relu_dead(kn) || relu_dead(handed));
          odd[ii][jj] = kOdd && odd_negative(kn, kd) != (ff_float_bits(handed) < 0);
          float r = fabsf(ff_divide_approx(kn, kd)) * fabsf(handed);  // in (1/4, 4)
          const int e = take_exponent(r);                             // r to [1, 2)
          rn[ii][jj] = r;
          rd[ii][jj] = 1.0f;
          ex[ii][jj] = ke + ff_float_bits(*slot(1, other, q)) + e;
        }
      flags = score_flags(watch) | ff_float_bits(region[4 * kHanded * kFwdThreads + other * kFwdThreads + tid]);
      // SASS: cold=empty_tile test
      if (!live) return no_scores();  // (after the exchange's barriers; the partner is not live either)
    }

    // ---- scores (what follows is loaded or computed only now: fewer registers live in the loop) ----
    float log_high[kRows], log_low[kRows], klog[kMicro];
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      const int i = i0 + row0 + ii;
      const bool on = i < N;
      log_high[ii] = on ? p.row_log_high[bh * N + i] : 0.0f;
      log_low[ii] = on ? p.row_log_low[bh * N + i] : 0.0f;
      row_end[ii] = on ? visible_end(p, i) : 0;
    }
#pragma unroll
    for (int jj = 0; jj < kMicro; ++jj) {
      const int j = j0 + tx * kMicro + jj;
      klog[jj] = j < M ? p.key_log[bh * M + j] : 0.0f;
    }
    // power log2(e) (from the launcher) as a high and a low float: S = fma(sum, high, sum * low)
    const float power_high = p.power_log2_high, power_low = p.power_log2_low;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) {
        // (computed for every pair; a key past the end holds the last key's fields, finite)
        const float e = (float)ex[ii][jj];
        const float sum = fmaf(e, kLn2High, log_high[ii]) +
                          (fmaf(e, kLn2Low, log_low[ii]) + (log_ratio(rn[ii][jj], rd[ii][jj]) + klog[jj]));
        S[ii][jj] = kRelu && dead[ii][jj] ? NEG_INF : fmaf(sum, power_high, sum * power_low);
      }
    if constexpr (kOdd) {
      negative = 0;
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj) negative |= odd[ii][jj] ? 1u << (ii * kMicro + jj) : 0u;
    }
  }
  {  // keys a row does not see: -inf (a thread-uniform test: the thread's keys all visible to all
     // its rows, as in every tile but the causal diagonal's and the last, needs no select)
    int first_end = row_end[0];
#pragma unroll
    for (int ii = 1; ii < kRows; ++ii) first_end = ff_min(first_end, row_end[ii]);
    // SASS: cold=partial_tile begin test
    if (j0 + tx * kMicro + kMicro > first_end) {  // partial tile
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj)
          if (j0 + tx * kMicro + jj >= row_end[ii]) S[ii][jj] = NEG_INF;
      // SASS: cold=partial_tile end
    }
  }
  // ---- 2. the rare path ----
  // (kRareHere false: left to the caller, rare_scores_log2)
  // SASS: cold=rare_path begin
  rare = kRareHere ? 0 : flags;
  if (kRareHere && flags != 0) {
    const float* trows = p.trows + bh * kRowFields * Dp * N;
    const float* tkeys = p.tkeys + bh * kKeyFields * Dp * M;
    const float* x_per_u = p.x_per_u + (bh % p.H) * Dp;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) {
        const int i = i0 + row0 + ii, j = j0 + tx * kMicro + jj;
        if (j < row_end[ii]) {
          if constexpr (kOdd) {
            bool neg = false;
            const float s = rare_pair_score_odd(trows, tkeys, x_per_u, N, M, Dp, i, j, p.power, flags & kRareAll, neg);
            if (s == s) {  // (NaN: not a rare pair)
              S[ii][jj] = fmaf(s, kLog2eHigh, s * kLog2eLow);
              const unsigned bit = 1u << (ii * kMicro + jj);
              negative = neg ? negative | bit : negative & ~bit;
            }
          } else {
            const float s = rare_pair_score(trows, tkeys, x_per_u, N, M, Dp, i, j, p.power, NAN, flags & kRareAll, p.relu);
            if (s == s) S[ii][jj] = fmaf(s, kLog2eHigh, s * kLog2eLow);  // (NaN: not a rare pair)
          }
        }
      }
    }
  }
  // SASS: cold=rare_path end
  // ---- 3. masks ----
  if (!p.attn_mask && !p.key_bias) return;
  // SASS: cold=masks begin test
  const int64_t b = bh / p.H, h = bh % p.H;
  const float* kbias = p.key_bias ? p.key_bias + b * M : nullptr;
#pragma unroll
  for (int ii = 0; ii < kRows; ++ii) {
    const int i = i0 + row0 + ii;
    const float* mrow =
        (p.attn_mask && i < N) ? p.attn_mask + b * p.mask_sb + h * p.mask_sh + (int64_t)i * p.mask_row : nullptr;
#pragma unroll
    for (int jj = 0; jj < kMicro; ++jj) {
      const int j = j0 + tx * kMicro + jj;
      if (j < row_end[ii]) S[ii][jj] = add_log2(S[ii][jj], (mrow ? mrow[j] : 0.0f) + (kbias ? kbias[j] : 0.0f));
    }
  }
  // SASS: cold=masks end
}

// Scores of a tile times log2(e) (see tile_scores_impl), rare path and masks included: the
// backward's (P = 2^(S log2(e) - lse log2(e)), the forward's roundings); kOdd: their signs in
// `negative` (tile_scores_impl).
template <Phi kPhi, typename scalar_t>
FF_DEV void tile_scores_log2(const Params<scalar_t, float>& p, int64_t bh, int i0, int j0, int tx, int ty,
                             float* region, float (&S)[kMicro][kMicro], unsigned& negative) {
  int rare;  // (0: the rare path is done here)
  tile_scores_impl<1, true, kPhi>(p, bh, i0, j0, tx, ty, region, S, rare, negative);
}

// The forward's rare path: after the scores of the tile are in St (row stride kScoreStride),
// the thread whose tile_scores_impl said `rare` rewrites those of its visible pairs (rows
// row0 .. row0 + rows - 1, keys tx * kMicro + (0 .. kMicro - 1)) that
// have |u| <= kUFloor in some feature (all of them with `all`, kRareAll) from the per-element
// math (rare_pair_score), masks included. A loop, not unrolled, outside the score code: no registers held across the calls.
// kPhi kOdd: the pairs' signs too, in Sg (a byte per pair, row stride kFwdKeys; rare_pair_score_odd).
// SASS: cold=rare_scores begin
template <typename scalar_t, Phi kPhi = Phi::kPower>
FF_DEV void rare_scores_log2(const Params<scalar_t, float>& p, int64_t bh, int i0, int j0, int tx, int row0,
                             int rows, float* St, bool all, unsigned char* Sg = nullptr) {
  const int N = p.N, M = p.M, Dp = p.Dp;
  const float* trows = p.trows + bh * kRowFields * Dp * N;
  const float* tkeys = p.tkeys + bh * kKeyFields * Dp * M;
  const float* x_per_u = p.x_per_u + (bh % p.H) * Dp;
  const int64_t b = bh / p.H, h = bh % p.H;
  // SASS: loop=rare_pairs step=1 trips=kMicro*kMicro/split
#pragma unroll 1
  for (int pair = 0; pair < rows * kMicro; ++pair) {
    const int r = row0 + pair / kMicro, c = tx * kMicro + pair % kMicro;
    const int i = i0 + r, j = j0 + c;
    if (i >= N || j >= visible_end(p, i)) continue;
    bool neg = false;
    const float s = kPhi == Phi::kOdd ? rare_pair_score_odd(trows, tkeys, x_per_u, N, M, Dp, i, j, p.power, all, neg)
                                      : rare_pair_score(trows, tkeys, x_per_u, N, M, Dp, i, j, p.power, NAN, all, p.relu);
    if (!(s == s)) continue;  // not a rare pair
    if (kPhi == Phi::kOdd) Sg[r * kFwdKeys + c] = neg;
    float s2 = fmaf(s, kLog2eHigh, s * kLog2eLow);
    if (p.attn_mask || p.key_bias) {
      const float add = (p.attn_mask ? p.attn_mask[b * p.mask_sb + h * p.mask_sh + (int64_t)i * p.mask_row + j] : 0.0f) +
                        (p.key_bias ? p.key_bias[b * M + j] : 0.0f);
      s2 = add_log2(s2, add);
    }
    St[r * kScoreStride + c] = s2;
  }
  // SASS: cold=rare_scores end
}

// kPhi: the call's phi (Phi; tile_scores_impl). kOdd: the scores' signs go beside them in shared
// memory (Sg, a byte per pair), the exponentials take them (signed P, a signed running sum l: the
// running max is over the log-magnitudes as for the other phis), and the row is normalised by its
// signed sum plus eps here (signed_row_scale), lse = log|sum|.
template <typename scalar_t, int kO, Phi kPhi = Phi::kPower>
FF_GLOBAL void FF_LAUNCH_BOUNDS_MIN(kFwdThreads * forward_split<kO>(), kO <= 16 ? 2 : 1)
    forward_tiled_kernel(const Params<scalar_t, float> p) {
  static_assert(kO % 4 == 0, "value columns per thread: whole float4");
  constexpr int kSplit = forward_split<kO>();
  constexpr int kThreads = kFwdThreads * kSplit;
  constexpr int kParts = 4 * kSplit;               // threads per row in the softmax and P V
  constexpr int kPartKeys = kFwdKeys / kParts;     // keys of a tile per thread there
  constexpr int kColStep = 4 * kParts;             // columns 4 part + kColStep t + (0..3)
  static_assert(kPartKeys % 4 == 0, "whole float4 of scores per thread");
  FF_DYNAMIC_SHARED(smem_raw);
  const int N = p.N, M = p.M, Dv = p.Dv;
  const int Dvs = padded_value_columns(Dv);
  // the block's bh and i0 first (see below): a constant address, no register for it
  int* ids = reinterpret_cast<int*>(smem_raw);  // (4 ints: bh, i0, the block's visible keys)
  float* region = reinterpret_cast<float*>(smem_raw) + 4;
  const int kVStride = kO <= 32 ? 4 * kO : Dvs;          // forward_value_stride(Dv) (compile-time up to kO 32)
  float* Vs = region;                                    // (kFwdKeys, kVStride), once the scores are done
  float* St = region + tiled_forward_region_floats(Dv);  // (kFwdRows, kScoreStride)
  float* Os = St + kFwdRows * kScoreStride;              // (kFwdRows, output_stride): out, unnormalised
  float* ML = Os + kFwdRows * output_stride(Dv);         // (2, kThreads): m_run and l_part of each thread
  constexpr bool kOdd = kPhi == Phi::kOdd;
  // (kOdd: (kFwdRows, kFwdKeys) bytes, 1 where the pair's weight is negative)
  unsigned char* Sg = kOdd ? reinterpret_cast<unsigned char*>(ML + 2 * kThreads) : nullptr;
  const float NEG_INF = -ff_inf<float>();


  const int tid = threadIdx.x;
  {
    int i0;
    const int bh = block_slice(N, kFwdRows, i0);
    // (read back from shared memory in each key tile: no register across the score code, and no
    // division that the compiler would otherwise redo in the loop to spare the register)
    if (tid == 0) {
      ids[0] = bh;
      ids[1] = i0;
      ids[2] = visible_end(p, ff_min(N - 1, i0 + kFwdRows - 1));  // keys any row of the block sees
    }
  }

  // Score phase: warps of 4 x 8 threads, each half of the block 16 x 16: rows ty * 4 + ii, keys
  // tx * 4 + jj.
  const int warp = (tid & (kFwdThreads - 1)) >> 5, lane = tid & 31;
  const int tx = (warp & 1) * 8 + (lane & 7);
  const int ty = (warp >> 1) * 4 + (lane >> 3);
  // Softmax and P V: kParts threads per row (in one warp), keys part * kPartKeys + (0 ..
  // kPartKeys - 1) and columns kColStep t + 4 part + (0..3), the columns kept in Os between key
  // tiles (not in registers: the score loop has them all).
  const int pr = tid / kParts, part = tid % kParts;
  float* orow = Os + pr * output_stride(Dv) + 4 * part;
  // SASS: loop=output_zeroing step=1 trips=Dvs/(16*split)
  for (int t = 0; kColStep * t + 4 * part < Dvs; ++t)
    *reinterpret_cast<float4*>(orow + kColStep * t) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);


  // the running max of row pr in log2 units (the same in its kParts threads) and this thread's
  // share of the running sum of 2^(S - m_run), kept in ML between key tiles
  ML[tid] = NEG_INF;
  ML[kThreads + tid] = 0.0f;

  __syncthreads();  // ids
  // SASS: loop=forward_key_tiles step=kFwdKeys unroll=1 trips=ceil(M/kFwdKeys)
  for (int j0 = 0; j0 < ids[2]; j0 += kFwdKeys) {
    float S[kMicro][kMicro];
    int rare;  // ScoreFlags
    unsigned negative = 0;  // (kOdd: the signs, see tile_scores_impl)
    tile_scores_impl<kSplit, false, kPhi>(p, (int64_t)ids[0], ids[1], j0, tx, ty, region, S, rare, negative);  // log2 units
    const int64_t bh = ids[0];
    const int i0 = ids[1];
    const int row0 = ty * kMicro + (tid / kFwdThreads) * (kMicro / kSplit);  // the rows of S
#pragma unroll
    for (int ii = 0; ii < kMicro / kSplit; ++ii)
      *reinterpret_cast<float4*>(St + (row0 + ii) * kScoreStride + tx * kMicro) =
          make_float4(S[ii][0], S[ii][1], S[ii][2], S[ii][3]);
    if constexpr (kOdd) {  // the 4 pairs' signs of each row as one word of 4 bytes
#pragma unroll
      for (int ii = 0; ii < kMicro / kSplit; ++ii) {
        const unsigned n = negative >> (ii * kMicro);
        *reinterpret_cast<unsigned*>(Sg + (row0 + ii) * kFwdKeys + tx * kMicro) =
            (n & 1u) | ((n >> 1) & 1u) << 8 | ((n >> 2) & 1u) << 16 | ((n >> 3) & 1u) << 24;
      }
    }
    // SASS: cold=rare_scores_call test
    if (rare) rare_scores_log2<scalar_t, kPhi>(p, bh, i0, j0, tx, row0, kMicro / kSplit, St, (rare & kRareAll) != 0, Sg);
    __syncthreads();  // scores written; the chunk region is free for V
    const scalar_t* v = p.v + bh * M * Dv;
    if (kO <= 32) {  // element tid + kThreads n of the (kFwdKeys, kVStride) tile: compile-time row
                     // and column (columns past Dv: 0)
#pragma unroll
      for (int n = 0; n < kFwdKeys * 4 * kO / kThreads; ++n) {
        const int e = tid + kThreads * n, r = e / (4 * kO), c = e % (4 * kO);
        const int j = j0 + r;
        Vs[e] = (j < M && c < Dv) ? load_as<float>(v, (int64_t)j * Dv + c) : 0.0f;
      }
    } else {  // columns tid % 16 + 16 n of keys tid / 16 + kThreads / 16 m
      for (int r = tid >> 4; r < kFwdKeys; r += kThreads / 16) {
        const int j = j0 + r;
#pragma unroll 1
        for (int c = tid & 15; c < Dvs; c += 16)
          Vs[r * kVStride + c] = (j < M && c < Dv) ? load_as<float>(v, (int64_t)j * Dv + c) : 0.0f;
      }
    }
    __syncthreads();

    float* srow = St + pr * kScoreStride + part * kPartKeys;  // the thread's kPartKeys scores
    float sv[kPartKeys];
    float tile_max = NEG_INF;
#pragma unroll
    for (int t = 0; t < kPartKeys / 4; ++t) {
      const float4 s4 = load4(srow + 4 * t);
      sv[4 * t] = s4.x;
      sv[4 * t + 1] = s4.y;
      sv[4 * t + 2] = s4.z;
      sv[4 * t + 3] = s4.w;
      tile_max = fmaxf(tile_max, fmaxf(fmaxf(s4.x, s4.y), fmaxf(s4.z, s4.w)));
    }
#pragma unroll
    for (int o = 1; o < kParts; o <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, o));
    float m_run = ML[tid], l_part = ML[kThreads + tid];
    const float m_new = fmaxf(m_run, tile_max);
    float scale = 1.0f;
    if (m_new > NEG_INF) {  // the same in the row's kParts threads
      scale = ff_exp2_approx(m_run - m_new);  // 0 while m_run is -inf
      l_part *= scale;
      const int pi = i0 + pr;
      unsigned signs[kPartKeys / 4];  // (kOdd: the keys' sign bytes, four to a word)
      if constexpr (kOdd) {
#pragma unroll
        for (int t = 0; t < kPartKeys / 4; ++t)
          signs[t] = reinterpret_cast<const unsigned*>(Sg + pr * kFwdKeys + part * kPartKeys)[t];
      }
#pragma unroll
      for (int t = 0; t < kPartKeys; ++t) {
        sv[t] = ff_exp2_approx(sv[t] - m_new);  // 0 for masked keys
        if (kOdd && ((signs[t / 4] >> (8 * (t % 4))) & 1u)) sv[t] = -sv[t];
        l_part += sv[t];                        // the normaliser counts every key
      }
      // SASS: cold=dropout begin test
      if (p.dropout_p > 0.0f) {  // (block-uniform) dropout: P times the keep factor
#pragma unroll
        for (int t = 0; t < kPartKeys; ++t)
          if (sv[t] != 0.0f) sv[t] *= dropout_factor(p, (uint32_t)bh, pi, j0 + part * kPartKeys + t);
        // SASS: cold=dropout end
      }
#pragma unroll
      for (int t = 0; t < kPartKeys / 4; ++t)
        *reinterpret_cast<float4*>(srow + 4 * t) = make_float4(sv[4 * t], sv[4 * t + 1], sv[4 * t + 2], sv[4 * t + 3]);
      m_run = m_new;
      ML[tid] = m_run;
      ML[kThreads + tid] = l_part;
    }
    __syncwarp();  // the row's P (its kParts threads are in one warp)
    if (m_new > NEG_INF) {
      float* orow = Os + pr * output_stride(Dv) + 4 * part;  // (recomputed: a register less in the score loop)
      const int nk = ff_min(kFwdKeys, (i0 + pr < N ? visible_end(p, i0 + pr) : 0) - j0);
      // columns in passes of at most 16 per thread (kO 64: two; registers)
      constexpr int kCols = kO / kSplit, kPassCols = kCols < 16 ? kCols : 16, kGroupsPerPass = kPassCols / 4;
      // SASS: loop=pv_column_passes step=1 trips=fwd_passes
#pragma unroll 1
      for (int pass = 0; pass < kCols / kPassCols; ++pass) {
        const int t0 = pass * kGroupsPerPass;
        if (kColStep * t0 + 4 * part >= Dvs) break;
        float acc[kPassCols];  // out[pi, kColStep (t0 + t) + 4 part + e] at acc[4 t + e]
#pragma unroll
        for (int t = 0; t < kGroupsPerPass; ++t) {
          if (kColStep * (t0 + t) + 4 * part < Dvs) {
            const float4 o4 = load4(orow + kColStep * (t0 + t));
            acc[4 * t + 0] = o4.x * scale;
            acc[4 * t + 1] = o4.y * scale;
            acc[4 * t + 2] = o4.z * scale;
            acc[4 * t + 3] = o4.w * scale;
          }
        }
        bool col_on[kGroupsPerPass];  // (kSplit 1: always; Dvs is a multiple of kColStep = 16)
#pragma unroll
        for (int t = 0; t < kGroupsPerPass; ++t) col_on[t] = kSplit == 1 || kColStep * (t0 + t) + 4 * part < Dvs;
        // the row's P and the V rows of its keys, as pointers stepped by the loop (no address
        // arithmetic per key)
        const float* prow = St + pr * kScoreStride;
        const float* vrow = Vs + part * 4 + kColStep * t0;
        // SASS: loop=pv step=4 trips=kFwdKeys/4 elements=4*fwd_cols unit=qkc
        for (int jj = 0; jj < nk; jj += 4, prow += 4, vrow += 4 * kVStride) {
          const float4 p4 = load4(prow);
          const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float* vr = vrow + e * kVStride;
#pragma unroll
            for (int t = 0; t < kGroupsPerPass; ++t) {
              if (col_on[t]) {
                const float4 v4 = load4(vr + kColStep * t);
                acc[4 * t + 0] = fmaf(pv[e], v4.x, acc[4 * t + 0]);
                acc[4 * t + 1] = fmaf(pv[e], v4.y, acc[4 * t + 1]);
                acc[4 * t + 2] = fmaf(pv[e], v4.z, acc[4 * t + 2]);
                acc[4 * t + 3] = fmaf(pv[e], v4.w, acc[4 * t + 3]);
              }
            }
          }
        }
#pragma unroll
        for (int t = 0; t < kGroupsPerPass; ++t)
          if (kColStep * (t0 + t) + 4 * part < Dvs)
            *reinterpret_cast<float4*>(orow + kColStep * (t0 + t)) =
                make_float4(acc[4 * t + 0], acc[4 * t + 1], acc[4 * t + 2], acc[4 * t + 3]);
      }
    }
  }

  const float m_run = ML[tid];
  float l = ML[kThreads + tid];
  {
    const int64_t bh = ids[0];
    const int i0 = ids[1];
#pragma unroll
  for (int o = 1; o < kParts; o <<= 1) l += __shfl_xor_sync(kFullMask, l, o);
  const int pi = i0 + pr;
  if (pi >= N) return;
  const bool empty = !(m_run > NEG_INF);  // no visible, unmasked key
  // (kOdd: by the signed sum plus eps; m_run in log2 units)
  const float inv = empty ? 0.0f
                          : (kOdd ? (float)signed_row_scale(l, (double)m_run * 0.693147180559945309, p.log_eps)
                                  : 1.0f / l);
  scalar_t* out_i = p.out + (bh * N + pi) * Dv;
  orow = Os + pr * output_stride(Dv) + 4 * part;
  // SASS: loop=output_store step=1 trips=Dvs/(16*split)
  for (int t = 0; kColStep * t + 4 * part < Dvs; ++t) {
    const float4 o4 = load4(orow + kColStep * t);
    const float ov[4] = {o4.x, o4.y, o4.z, o4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = kColStep * t + 4 * part + e;
      if (c < Dv) out_i[c] = static_cast<scalar_t>(empty ? 0.0f : ov[e] * inv);
    }
  }
  // m_run is in log2 units
  // (kOdd: log|l|, -inf where the signed sum is 0)
  if (part == 0)
    p.lse[bh * N + pi] =
        empty ? (double)INFINITY : (double)m_run * 0.693147180559945309 + log(kOdd ? fabs((double)l) : (double)l);
  }
}

}  // namespace cuda
}  // namespace fourierformer
