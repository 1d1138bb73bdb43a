// Forward of the float32 path for calls with few query rows (incremental decoding: one query per
// beam in the self-attention, the beams of a sentence in the folded encoder-decoder attention),
// split over the keys in the manner of flash-decoding.
//
// The tiled forward (forward_tiled.cuh) gives a block 64 query rows and sweeps every key: with one
// query it computes 64 rows to keep one, and a (batch, head) slice is one block, however many keys.
// Here a block takes every query row of a slice (N <= kDecodeMaxRows, in registers: kRows of them,
// the launcher's DecodeRows::of(N), tile_switch.h) and one chunk of kDecKeys keys, one key per thread, so that a
// slice is decode_splits(M) blocks:
//   1. forward_decode_kernel: the rows' table fields (q c, t_hi, t_lo of tables.cuh) staged in
//      shared memory (rows past N: row N - 1's, never visible); per feature the thread reads its
//      key's four fields once and does the element step of the tiled forward for each row
//      (first_factor_step, sinc_factor_step, renormalise every kRenormEvery features, FieldWatch),
//      then the same score (log_ratio, the row and key constants, power log2(e) as a float pair),
//      the same rare path (rare_pair_score) and masks: the scores of the tiled backward's
//      tile_scores_log2 bit for bit. The chunk's maximum and sum of 2^(S - max) per row (warp
//      shuffles, then the block's warps through shared memory), dropout after the sum as in the
//      tiled forward, and P V with threads over (row, value column); the partial (max, sum,
//      unnormalised output) of each row goes to p.decode_partials.
//   2. forward_combine_kernel: a block per slice merges the chunks' partials with the log-sum-exp
//      rule (out = sum_s 2^(m_s - m) acc_s / sum_s 2^(m_s - m) l_s, m the largest m_s) and writes
//      out and lse (float64, m ln 2 + log l as the tiled forward writes it; +inf and a zero row
//      where no key is visible).
// The tables are those of table_kernel: built by the launcher or passed in
// (fourier_attention_tables), as for the tiled forward.
#pragma once

#include "forward_tiled.cuh"
#include "tables.cuh"

namespace fourierformer {
namespace cuda {

// The launcher's rule (launch_forward): the float32 path runs this forward for a call of at most
// kDecodeMaxRows query rows per (batch, head) slice, with whatever it asks for (masks, causal, key
// padding, dropout, normaliser_eps: the null key scales the combined out by lse afterwards, as for
// the tiled forward); more rows take the tiled forward. The backward is the same for both.
constexpr int kDecodeMaxRows = DecodeRows::kLargest;  // (tile_switch.h)
FF_HD bool decode_forward(int64_t N) { return N <= kDecodeMaxRows; }

constexpr int kDecKeys = 64;              // keys per block, one per thread
constexpr int kDecThreads = kDecKeys;
constexpr int kDecWarps = kDecThreads / 32;
constexpr int kCombineThreads = 128;
static_assert(kDecThreads % 32 == 0, "whole warps");

// Key chunks (blocks) per (batch, head) slice.
FF_HD int64_t decode_splits(int64_t M) { return (M + kDecKeys - 1) / kDecKeys; }

// Floats of p.decode_partials: per (slice, chunk, row) a maximum, a sum and Dv outputs.
FF_HD int64_t decode_partial_floats(int64_t BH, int64_t N, int64_t M, int64_t Dv) {
  return BH * decode_splits(M) * N * (2 + Dv);
}

// Shared memory of forward_decode_kernel in floats: the rows' fields (kRowFields, Dp, kRows), the
// warps' maxima and sums (2, kDecWarps, kRows) and P (kRows, kDecKeys).
FF_HD int64_t decode_smem_floats(int Dp, int rows) {
  return (int64_t)kRowFields * Dp * rows + 2 * (int64_t)kDecWarps * rows + (int64_t)rows * kDecKeys;
}

// kPhi: the call's phi (Phi), as the tiled forward's element step and scores (kSigmoid: the sum of
// sigmoid_sinc_term over the features, the rows' t_low place staged as cos a, x_per_u per feature;
// kOdd: each P with the sign of its product of sincs, the partial sums signed: odd_factor).
template <typename scalar_t, int kRows, Phi kPhi = Phi::kPower>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kDecThreads) forward_decode_kernel(const Params<scalar_t, float> p) {
  constexpr bool kRelu = kPhi == Phi::kRelu, kSigmoid = kPhi == Phi::kSigmoid, kOdd = kPhi == Phi::kOdd;
  FF_DYNAMIC_SHARED(smem_raw);
  const int N = p.N, M = p.M, Dp = p.Dp, Dv = p.Dv, splits = p.decode_splits;
  float* Rf = reinterpret_cast<float*>(smem_raw);   // (kRowFields, Dp, kRows)
  float* Red = Rf + (int64_t)kRowFields * Dp * kRows;  // (2, kDecWarps, kRows)
  float* Ps = Red + 2 * kDecWarps * kRows;           // (kRows, kDecKeys)
  const float NEG_INF = -ff_inf<float>();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t bh = (int)blockIdx.x / splits;
  const int j0 = ((int)blockIdx.x - (int)bh * splits) * kDecKeys;
  const int j = j0 + tid;  // the thread's key

  const float* trows = p.trows + bh * kRowFields * Dp * N;
  const float* tkeys = p.tkeys + bh * kKeyFields * Dp * M;
  // the rows' fields, feature-major: element (f, d, ii) at (f Dp + d) kRows + ii
  // SASS: loop=decode_row_staging step=kDecThreads trips=ceil(kRowFields*Dp*kRows/kDecThreads)
  for (int e = tid; e < kRowFields * Dp * kRows; e += kDecThreads) {
    const int ii = e % kRows, fd = e / kRows;
    if constexpr (kSigmoid)  // (fd = f Dp + d: the feature's field 0 at row d of trows)
      Rf[e] = sigmoid_row_field(trows + (int64_t)(fd % Dp) * N + ff_min(ii, N - 1), (int64_t)Dp * N, fd / Dp);
    else
      Rf[e] = trows[(int64_t)fd * N + ff_min(ii, N - 1)];
  }
  __syncthreads();

  // ---- 1. products over the features (a key past M: the last key's fields, never visible) ----
  const int64_t kfield = (int64_t)Dp * M;
  const float* kf = tkeys + ff_min(j, M - 1);
  const int rfield = Dp * kRows;
  float num[kRows], den[kRows];
  int expo[kRows];
#pragma unroll
  for (int ii = 0; ii < kRows; ++ii) expo[ii] = 0;
  FieldWatch watch;
  // kRenormEvery features from d0; the first group's first feature sets num and den
  // (kSigmoid: num the row's sum, den its group's, as tile_scores_impl; x_per_u of the head)
  const float* head_x_per_u = kSigmoid ? p.x_per_u + (int64_t)((int)bh % p.H) * Dp : nullptr;
  auto group = [&](int d0, auto first) {
#pragma unroll
    for (int e = 0; e < kRenormEvery; ++e) {
      const int64_t d = d0 + e;
      const float k = kf[d * M], X = kf[kfield + d * M], Y = kf[2 * kfield + d * M];
      const float Yl = kSigmoid ? head_x_per_u[d] : kf[3 * kfield + d * M];
      const float* rf = Rf + d * kRows;
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii) {
        if constexpr (kSigmoid) {
          const float term = sigmoid_sinc_term(rf[ii], rf[rfield + ii], rf[2 * rfield + ii], k, X, Y, Yl);
          den[ii] = e == 0 ? term : den[ii] + term;
          if (decltype(first)::value && e == 0) num[ii] = 0.0f;
        } else if (decltype(first)::value && e == 0) {
          first_factor_step<kRelu, kOdd>(rf[ii], rf[rfield + ii], rf[2 * rfield + ii], k, X, Y, Yl, num[ii], den[ii]);
        } else {
          sinc_factor_step<kRelu, kOdd>(rf[ii], rf[rfield + ii], rf[2 * rfield + ii], k, X, Y, Yl, num[ii], den[ii]);
        }
      }
    }
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      if constexpr (kSigmoid)
        num[ii] += den[ii];
      else
        renormalise(num[ii], den[ii], expo[ii], watch);
    }
  };
  group(0, std::true_type{});  // (Dp >= kRenormEvery: padded_features)
  // SASS: loop=decode_features step=kRenormEvery trips=Dp/kRenormEvery-1 elements=kRows*kRenormEvery unit=qkd
  for (int d0 = kRenormEvery; d0 < Dp; d0 += kRenormEvery) group(d0, std::false_type{});

  // ---- scores in log2 units, as tile_scores_impl's ----
  const int flags = kSigmoid ? 0 : score_flags(watch);  // (kSigmoid: no rare path, see tile_scores_impl)
  float S[kRows];
  bool visible[kRows];
  bool negative[kRows];  // (kOdd: the sign of the pair's product of sincs)
  if constexpr (kSigmoid) {
    const float padding = sigmoid_padding_terms(p);
    const float power_high = p.power_log2_high, power_low = p.power_log2_low;  // (power 1: log2(e))
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      const float sum = num[ii] - padding;
      visible[ii] = ii < N && j < visible_end(p, ii);
      S[ii] = visible[ii] ? fmaf(sum, power_high, sum * power_low) : NEG_INF;
    }
  } else {
    const float klog = p.key_log[bh * M + ff_min(j, M - 1)];
    const float power_high = p.power_log2_high, power_low = p.power_log2_low;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      const int i = ff_min(ii, N - 1);
      const float e = (float)expo[ii];
      const float sum = fmaf(e, kLn2High, p.row_log_high[bh * N + i]) +
                        (fmaf(e, kLn2Low, p.row_log_low[bh * N + i]) +
                         (log_ratio(fabsf(num[ii]), fabsf(den[ii])) + klog));
      const float s = kRelu && relu_dead(num[ii]) ? NEG_INF : fmaf(sum, power_high, sum * power_low);
      negative[ii] = kOdd && odd_negative(num[ii], den[ii]);
      visible[ii] = ii < N && j < visible_end(p, ii);
      S[ii] = visible[ii] ? s : NEG_INF;  // (selected, not branched on)
    }
  }
  // SASS: cold=rare_path begin test
  if (flags != 0) {  // the rare path (see forward_tiled.cuh)
    const float* x_per_u = p.x_per_u + (bh % p.H) * Dp;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      if (visible[ii]) {
        if constexpr (kOdd) {
          bool neg = false;
          const float s = rare_pair_score_odd(trows, tkeys, x_per_u, N, M, Dp, ii, j, p.power, flags & kRareAll, neg);
          if (s == s) {  // (NaN: not a rare pair)
            S[ii] = fmaf(s, kLog2eHigh, s * kLog2eLow);
            negative[ii] = neg;
          }
        } else {
          const float s = rare_pair_score(trows, tkeys, x_per_u, N, M, Dp, ii, j, p.power, NAN, flags & kRareAll, p.relu);
          if (s == s) S[ii] = fmaf(s, kLog2eHigh, s * kLog2eLow);  // (NaN: not a rare pair)
        }
      }
    }
    // SASS: cold=rare_path end
  }
  // SASS: cold=masks begin test
  if (p.attn_mask || p.key_bias) {
    const int64_t b = bh / p.H, h = bh % p.H;
    const float bias = p.key_bias && j < M ? p.key_bias[b * M + j] : 0.0f;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      if (visible[ii]) {
        const float add = p.attn_mask ? p.attn_mask[b * p.mask_sb + h * p.mask_sh + (int64_t)ii * p.mask_row + j] : 0.0f;
        S[ii] = add_log2(S[ii], add + bias);
      }
    }
    // SASS: cold=masks end
  }

  // ---- 2. the chunk's maximum and sum per row; P ----
  float* wmax = Red;                     // (kDecWarps, kRows)
  float* wsum = Red + kDecWarps * kRows;  // (kDecWarps, kRows)
#pragma unroll
  for (int ii = 0; ii < kRows; ++ii) {
    const float m = warp_max(S[ii]);
    if (lane == 0) wmax[warp * kRows + ii] = m;
  }
  __syncthreads();
  float P[kRows];
#pragma unroll
  for (int ii = 0; ii < kRows; ++ii) {
    float m = wmax[ii];
#pragma unroll
    for (int w = 1; w < kDecWarps; ++w) m = fmaxf(m, wmax[w * kRows + ii]);
    P[ii] = ff_exp2_approx(S[ii] - (m > NEG_INF ? m : 0.0f));  // 0 for a key not visible
    if (kOdd && negative[ii]) P[ii] = -P[ii];
    const float l = warp_sum(P[ii]);  // the normaliser counts every key (kOdd: a signed sum)
    if (lane == 0) wsum[warp * kRows + ii] = l;
  }
  // SASS: cold=dropout begin test
  if (p.dropout_p > 0.0f) {  // (block-uniform) dropout: P times the keep factor
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii)
      if (P[ii] != 0.0f) P[ii] *= dropout_factor(p, (uint32_t)bh, ii, j);
    // SASS: cold=dropout end
  }
#pragma unroll
  for (int ii = 0; ii < kRows; ++ii) Ps[ii * kDecKeys + tid] = P[ii];
  __syncthreads();

  // ---- the partials: maximum and sum by the first N threads, P V by (row, column) ----
  const int64_t slot = bh * splits + ((int)blockIdx.x - (int)bh * splits);  // (slice, chunk)
  const int64_t all_rows = (int64_t)p.B * p.H * splits * N;
  if (tid < N) {
    float m = wmax[tid], l = wsum[tid];
#pragma unroll
    for (int w = 1; w < kDecWarps; ++w) {
      m = fmaxf(m, wmax[w * kRows + tid]);
      l += wsum[w * kRows + tid];
    }
    p.decode_partials[slot * N + tid] = m;
    p.decode_partials[all_rows + slot * N + tid] = l;
  }
  const int nk = ff_min(kDecKeys, M - j0);
  const scalar_t* v = p.v + (bh * M + j0) * Dv;
  float* acc_out = p.decode_partials + 2 * all_rows + slot * N * Dv;
  // SASS: loop=decode_pv_columns step=kDecThreads trips=ceil(kRows*Dv/kDecThreads)
  for (int e = tid; e < N * Dv; e += kDecThreads) {
    const int r = e / Dv, c = e - r * Dv;
    const float* prow = Ps + r * kDecKeys;
    float acc = 0.0f;
    // SASS: loop=decode_pv step=1 trips=kDecKeys elements=1 unit=qkc
#pragma unroll 4
    for (int jj = 0; jj < nk; ++jj) acc = fmaf(prow[jj], load_as<float>(v, (int64_t)jj * Dv + c), acc);
    acc_out[e] = acc;
  }
}

// Row r of slice bh merged over the chunks: its maximum m (log2 units, -inf where no key is
// visible), its sum l and, for column c >= 0, its unnormalised output `acc`.
template <typename scalar_t>
FF_DEV void combine_row(const Params<scalar_t, float>& p, int64_t bh, int r, int c, float& m, float& l, float& acc) {
  const int N = p.N, splits = p.decode_splits;
  const int64_t all_rows = (int64_t)p.B * p.H * splits * N;
  const float* pm = p.decode_partials + bh * splits * N + r;
  const float* pl = pm + all_rows;
  const float* pa = p.decode_partials + 2 * all_rows + (bh * splits * N + r) * p.Dv + c;
  m = -ff_inf<float>();
  // SASS: loop=combine_max step=1 trips=ceil(M/kDecKeys)
  for (int s = 0; s < splits; ++s) m = fmaxf(m, pm[(int64_t)s * N]);
  l = 0.0f;
  acc = 0.0f;
  if (!(m > -ff_inf<float>())) return;
  // SASS: loop=combine_sum step=1 trips=ceil(M/kDecKeys)
  for (int s = 0; s < splits; ++s) {
    const float w = ff_exp2_approx(pm[(int64_t)s * N] - m);  // 0 for a chunk that sees no key of the row
    l = fmaf(pl[(int64_t)s * N], w, l);
    if (c >= 0) acc = fmaf(pa[(int64_t)s * N * p.Dv], w, acc);
  }
}

// kOdd (Phi::kOdd): the chunks' sums are signed; the row is normalised by their sum plus eps
// (signed_row_scale) and lse is log|sum| (-inf where it is 0).
template <typename scalar_t, bool kOdd = false>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kCombineThreads) forward_combine_kernel(const Params<scalar_t, float> p) {
  const int N = p.N, Dv = p.Dv;
  const int64_t bh = blockIdx.x;
  // SASS: loop=combine_columns step=kCombineThreads trips=ceil(N*Dv/kCombineThreads)
  for (int e = threadIdx.x; e < N * Dv; e += kCombineThreads) {
    const int r = e / Dv, c = e - r * Dv;
    float m, l, acc;
    combine_row(p, bh, r, c, m, l, acc);
    const bool empty = !(m > -ff_inf<float>());  // no visible, unmasked key
    if constexpr (kOdd)
      p.out[(bh * N + r) * Dv + c] = static_cast<scalar_t>(
          empty ? 0.0f : acc * (float)signed_row_scale(l, (double)m * 0.693147180559945309, p.log_eps));
    else
      p.out[(bh * N + r) * Dv + c] = static_cast<scalar_t>(empty ? 0.0f : acc * (1.0f / l));
  }
  // SASS: loop=combine_lse step=kCombineThreads trips=ceil(N/kCombineThreads)
  for (int r = threadIdx.x; r < N; r += kCombineThreads) {
    float m, l, unused;
    combine_row(p, bh, r, -1, m, l, unused);
    const bool empty = !(m > -ff_inf<float>());
    // m is in log2 units
    p.lse[bh * N + r] =
        empty ? (double)INFINITY : (double)m * 0.693147180559945309 + log(kOdd ? fabs((double)l) : (double)l);
  }
}

}  // namespace cuda
}  // namespace fourierformer
