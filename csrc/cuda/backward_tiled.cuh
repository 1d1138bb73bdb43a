// Backward of the float32 path (float32, float16, bfloat16 inputs), on the tables of
// tables.cuh and the score tiles of forward_tiled.cuh. Three kernels:
//
//   pre-pass (block of kFwdRows queries, sweeping key tiles): the scores in log2 units
//        (tile_scores_log2, the forward's code and roundings), P_ij = 2^(S_ij log2(e) - lse_i
//        log2(e)) (softmax_weight: ex2.approx, no branch) and dP_ij = dO_i . v_j in 4 x 4 register
//        tiles; Delta_i = sum_j P f dP and c_i = sum_j P from this pass's own P (see the comment
//        above backward_dq_kernel in backward.cuh: the radius gradient needs that). It writes
//        Delta_i / c_i and lse_i + log c_i (with the null key's share). Where its grid is small
//        (delta_pass_split), in two halves of a 512-thread block.
//   main pass (block of kFwdKeys keys, sweeping query tiles): the scores again (or, within the
//        score cache's budget, score_cache.h, the pre-pass's, from p.score_cache: kCache), P with
//        the pre-pass's lse, dS' = P (f dP - Delta / c) kept in the thread's 4 x 4 register tile (the
//        power p multiplies dq, dk and dradius once, at the end); dv_j += sum_i P f dO_i in 4 keys
//        x 4 columns register tiles (DvTile: per query a float4 of P f, a float4 of dO, 16 FMAs);
//        then the g pass over the features: per feature each thread computes g(x_ijd) once for its
//        16 (query, key) pairs and sums dS' g over its 4 keys (for dq) and its 4 queries (for dk).
//        Those partial sums go, per group of kGroup features, through shared memory (float4
//        stores that 8 lanes of distinct key columns / query rows put in distinct banks; reads by
//        consecutive rows), are summed over the block's 16 thread columns / rows, and land in the
//        block's dk sums (shared memory, for the whole sweep) and, one float atomicAdd per (query,
//        feature) and key block, in p.dq_acc (float32). The features are staged kChunk at a time
//        in the layout of tile_scores (one float4 per field and thread where N and M are multiples
//        of 4; lanes read float4s of 4 rows or 4 keys: no bank conflicts). The block then writes
//        dk = -p |R| sum_i dS' g and the keys' share of dradius. The block's slice, first key and
//        head sit in shared memory and the thread's indices are re-derived from
//        fresh_thread_index() in each query tile: nothing but the query tile's start is held in
//        a register across the score code (so that it fits 128 registers). Where its grid is small
//        (main_pass_splits), each key tile's features are split over up to kMaxMainSplits blocks.
//   dq kernel (block of kFwdRows queries): dq = p |R| p.dq_acc and the queries' share of dradius.
// dradius from dq and dk, without per-element sums: S depends on R_d only through
// |R_d| (q_id - k_jd), so sum_i q_id dq_id + sum_j k_jd dk_jd = R_d dS/dR_d (see
// backward_dq_finish_kernel; q and k centred per feature so that a common offset cancels).
//
// g from the tables: with s' = t X - Y (as in the forward) and c' = X + t Y = rho cos(x) / cos(a),
// cot x = c' / s' and g(x) = cot x - 1/x = (c' x - s') / (s' x), or g's series (a minimax
// x (c0 + c1 x^2 + c2 x^4), dlog_sinc_taylor) where |x| < kSincTaylorBound (there c' x - s'
// cancels); s' is floored at kSinFloor in magnitude (at a zero of sinc, where P is 0 anyway). Per
// element: u, s' (3), x, c', the floor (2), the fraction (fma, mul, a reciprocal and a mul), x^2
// and the series (3), the select and the two sums (2).
// Instructions per element, registers and spills of each kernel: scripts/benchmarks/cuda_sass_report.py,
// its counts for each version of the kernels in docs/records/speed.md. Threads whose
// pairs hold no visible one (micro_tile_live) skip dP and g. The launch bounds (256, 2) cap every
// kernel at 128 registers, two blocks per SM, and the code keeps what lives across the score code
// small enough not to spill at that cap. dq's sums over key blocks are float atomics, so its last
// bits depend on their order (as dradius's already did).
//
// Head dims: D <= kBwdMaxFeatures and Dv <= kBwdMaxValueColumns; larger ones take the simple
// path (backward.cuh).
#pragma once

#include "forward_tiled.cuh"
#include "score_cache.h"

namespace fourierformer {
namespace cuda {

constexpr int kBwdMaxFeatures = limits::kCudaTiledBackwardMaxHeadDim;  // largest padded D of the tiled backward
// largest Dv of the tiled backward: its shared memory (about 100 KiB at Dv = 128) then fits
// every GPU the build targets (sm_80 allows 163 KiB per block)
constexpr int kBwdMaxValueColumns = limits::kCudaTiledBackwardMaxHeadDim;
static_assert(MainPassColumns::kLargest == kBwdMaxValueColumns, "the main pass's instances cover its value columns");
// Whether the tiled backward takes padded features Dp and value columns Dv (the launcher also asks
// that its shared memory fit the GPU's).
FF_HD constexpr bool tiled_backward_takes(int Dp, int Dv) { return Dp <= kBwdMaxFeatures && Dv <= kBwdMaxValueColumns; }
// The main pass's feature splits. Its grid has one block per key tile; where that would leave
// the GPU's resident block slots (`resident` blocks at once) half empty or worse (the IWSLT
// shape, B 32 H 4 N 64, launches 128 blocks on 132 SMs), each key tile's features are split over
// `splits` blocks, so that up to `resident` blocks run, each with whole chunks of kChunk
// features: splits = floor(resident / blocks), at most kMaxMainSplits and Dp / kChunk. Only with
// the score cache: without it every split would compute the scores over all the features
// again, the costliest part of the pre-pass. Each split computes dP (work of order Dv per
// (query, key) pair) for its dS'; the first alone computes dv. max_splits: the launcher's cap
// (kMaxMainSplits; FOURIERFORMER_GRID_SPLITS on a GPU, 1: none).
constexpr int kMaxMainSplits = 4;
FF_HD int main_pass_splits(int64_t blocks, int Dp, int64_t resident, int max_splits) {
  if (blocks <= 0 || 2 * blocks > resident) return 1;
  int64_t splits = resident / blocks;
  if (splits > max_splits) splits = max_splits;
  if (splits > Dp / kChunk) splits = Dp / kChunk;
  return splits > 1 ? (int)splits : 1;
}
// The pre-pass's halves (backward_delta_tiled_kernel<..., kSplit>): 2 where its grid of
// `blocks` single-half blocks would leave half of the `resident` block slots empty or more (one
// block per SM at most: 8 warps), the head dim is 64 or more (below, the halves' exchange and
// the work per (query, key) pair outweigh the features that the halves share, as the report's
// counts of both instances show: docs/records/speed.md) and the launcher's cap allows splits.
constexpr int kDeltaSplitMinFeatures = 64;
FF_HD int delta_pass_split(int64_t blocks, int Dp, int64_t resident, int max_splits) {
  return max_splits >= 2 && Dp >= kDeltaSplitMinFeatures && blocks > 0 && 2 * blocks <= resident ? 2 : 1;
}
// The phi of the main pass's instance for a call's phi: with the score cache (`cache`) the scores are
// the pre-pass's and only the g pass's derivative tells the phis apart, which is log|sinc|'s for
// ReLU as for the power (where P is not 0): ReLU runs the power's instance there.
FF_HD constexpr Phi main_pass_phi(Phi phi, bool cache) { return cache && phi == Phi::kRelu ? Phi::kPower : phi; }
// Features per split: Dp / splits rounded up to whole chunks (the last split takes the rest).
FF_HD int main_split_features(int Dp, int splits) {
  const int per = (Dp + splits - 1) / splits;
  return (per + kChunk - 1) / kChunk * kChunk;
}

// g(x) = d/dx log|sinc x| of one element from the table fields; u = q c - k c through u_out.
FF_DEV float dlog_sinc_tables(float q, float t, float t_low, float k, float X, float Y, float Y_low, float x_per_u,
                              float& u_out) {
  const float u = q - k;
  const float s = fmaf(t, X, -Y) + fmaf(t_low, X, -Y_low);
  const float x = x_per_u * u;
  const float x2 = x * x;
  const float c = fmaf(t, Y, X);
  const float s_safe = copysignf(fmaxf(fabsf(s), kSinFloor), s);  // |s x| >= kSinFloor / 4 in the branch used
  const float big = ff_divide_approx(fmaf(c, x, -s_safe), s_safe * x);
  u_out = u;
  return x2 < kSincTaylorBound * kSincTaylorBound ? dlog_sinc_taylor(x, x2) : big;
}

// g(x) = d/dx log|sinc x| of one element from the table fields, as dlog_sinc_tables.
FF_DEV float dlog_sinc_g(float q, float t, float t_low, float k, float X, float Y, float Y_low, float x_per_u) {
  float u;
  return dlog_sinc_tables(q, t, t_low, k, X, Y, Y_low, x_per_u, u);
}

// phi = sigmoid: d/dx log sigmoid(sinc x) = sigmoid(-sinc x) sinc'(x) of one element from the table
// fields as sigmoid_sinc_term reads them (cos a staged at t_low's place, forward_tiled.cuh): with
// r = 1 / x (div.approx), sinc x = s' cos a r and cos x = c' cos a (c' = X + t Y, as g's; the high
// parts alone, to about 2^-23 absolutely), sinc'(x) = (cos x - sinc x) r; below |x| =
// kSincTaylorBound sinc's series and sinc' = sinc g with g's (there the difference cancels);
// sigmoid(-sinc x) by its polynomial (sigmoid_minus_poly). Per element: u, x, x^2, the reciprocal,
// s' and c' (2), their products (4), the difference, the series (2 + 4), the selects (2), the
// polynomial (8) and the product.
FF_DEV float dlog_sigmoid_sinc_tables(float q, float t, float cos_a, float k, float X, float Y, float x_per_u) {
  const float x = x_per_u * (q - k);
  const float x2 = x * x;
  const float r = ff_divide_approx(1.0f, x);  // (used where |x| >= kSincTaylorBound)
  const float sinc_big = fmaf(t, X, -Y) * cos_a * r;
  const float derivative_big = (fmaf(t, Y, X) * cos_a - sinc_big) * r;
  const bool small = x2 < kSincTaylorBound * kSincTaylorBound;
  const float y = small ? sinc_taylor(x2) : sinc_big;
  const float derivative = small ? y * dlog_sinc_taylor(x, x2) : derivative_big;
  return sigmoid_minus_poly(y) * derivative;
}

// The main pass's dv = P^T dO for value columns up to 4 kO (kO by Dv: MainPassColumns in
// tile_switch.h): thread tid takes keys 4 kg + (0..3) (kg = tid % 16) and, in register
// tiles of 4 keys x 4 columns (per query: a float4 of P f, a float4 of dO, 16 FMAs), the column
// groups cg0 + 16 n (n < kGroups) of every kPhases-th query of the tile, from query qs, where
// tid / 16 = cg0 + kColumnGroups qs. With kPhases > 1 (Dv <= 32) the phases' partial sums are
// added through shared memory.
template <int kO>
struct DvTile {
  static constexpr int kColumnGroups = kO < 16 ? kO : 16;  // column groups per group of threads
  static constexpr int kPhases = 16 / kColumnGroups;       // query phases
  static constexpr int kGroups = kO / kColumnGroups;       // column groups per thread
  static_assert(kColumnGroups * kPhases == 16 && kGroups * kColumnGroups == kO, "16 slots of 16 threads");
};

// V of keys j0 .. j0 + kFwdKeys - 1, transposed into Vt (Dv rounded up to 4, kFwdKeys) as
// float32 (keys past M and columns past Dv: 0): thread tid takes key tid % 64 and the column
// quads tid / 64 + 4 n, four loads and four stores per quad from one index computation, no branch.
template <typename scalar_t>
FF_DEV void stage_v_transposed(const scalar_t* v, int j0, int M, int Dv, float* Vt, int tid) {
  const int r = tid & (kFwdKeys - 1);
  const bool on = j0 + r < M;
  const scalar_t* src = v + (int64_t)(j0 + r) * Dv;
  const int quads = (Dv + 3) >> 2;
  // SASS: loop=v_staging step=kFwdThreads/kFwdKeys trips=ceil(Dv/4)*kFwdKeys/kFwdThreads
#pragma unroll 2
  for (int c4 = tid >> kFwdKeysLog2; c4 < quads; c4 += kFwdThreads / kFwdKeys) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 4 * c4 + e;
      Vt[c * kFwdKeys + r] = (on && c < Dv) ? load_as<float>(src, c) : 0.0f;
    }
  }
}

// Shared memory of the tiled backward kernels, in floats.
// (kSplit 2: the two halves' exchange of tile_scores_impl too)
FF_HD int64_t tiled_delta_region_floats(int Dv, int split = 1) {
  const int64_t chunk = (int64_t)kChunk * (kRowFields * kFwdRows + kKeyFields * kFwdKeys);
  const int64_t vt = (int64_t)(Dv + 3) / 4 * 4 * kFwdKeys;  // (stage_v_transposed: whole quads)
  const int64_t m = chunk > vt ? chunk : vt;
  return split == 2 && kSplitExchangeFloats > m ? kSplitExchangeFloats : m;
}
FF_HD int64_t tiled_delta_smem_floats(int Dv, int split = 1) {
  return 4 + tiled_delta_region_floats(Dv, split) + (int64_t)Dv * kFwdRows + 6 * kFwdRows;  // (4: ids)
}
FF_HD int dkv_out_stride(int Dv) { return padded_value_columns(Dv) + 4; }
// The main pass's g-pass partial sums per group of kGroup features: dq's (feature, key column tx,
// query row) at stride kPqStride per (feature, tx), dk's (feature, query row ty, key) at kFwdKeys.
constexpr int kGroup = 4;
constexpr int kPqStride = kFwdRows + 4;  // (e * 16 + tx) * 68 + r: float4 stores by 8 lanes of distinct tx hit distinct banks
FF_HD int64_t main_partials_floats() {
  return (int64_t)kGroup * 16 * kPqStride + (int64_t)kGroup * 16 * kFwdKeys;
}
FF_HD int64_t tiled_main_region_floats(int Dv) {  // score chunks, then dO, then the g pass's chunks
  const int64_t chunk = (int64_t)kChunk * (kRowFields * kFwdRows + kKeyFields * kFwdKeys);
  const int64_t ot = (int64_t)kFwdRows * dkv_out_stride(Dv);
  return chunk > ot ? chunk : ot;
}
FF_HD int64_t tiled_main_union_floats(int Dv) {  // V^T, then P f, then the partial sums
  int64_t u = (int64_t)(Dv + 3) / 4 * 4 * kFwdKeys;  // (stage_v_transposed: whole quads)
  const int64_t w = (int64_t)kFwdRows * kFwdKeys;
  if (w > u) u = w;
  return main_partials_floats() > u ? main_partials_floats() : u;
}
FF_HD int64_t tiled_main_smem_floats(int Dp, int Dv) {
  return tiled_main_region_floats(Dv) + tiled_main_union_floats(Dv) + (int64_t)kFwdKeys * Dp + 3 * kFwdRows + kChunk +
         4;  // (ids, at the start)
}

// lse log2(e) as two floats, +inf as (+inf, 0): P = 2^((S log2(e) - high) - low) is then 0.
FF_DEV void split_lse_log2_or_inf(double L, float& high, float& low) {
  if (L < (double)INFINITY) {
    split_lse(L * 1.44269504088896340736, high, low);
  } else {
    high = ff_inf<float>();
    low = 0.0f;
  }
}

// P = 2^((S2 - high) - low) for a score S2 in log2 units (tile_scores_log2) and the row's lse in
// log2 units (split_lse_log2_or_inf): 0 for a masked key (S2 = -inf) and for a row past N or
// without visible keys (high = +inf), without a branch.
FF_DEV float softmax_weight(float S2, float high, float low) { return ff_exp2_approx((S2 - high) - low); }

// ---------------------------------------------------------------------------------------
// Pre-pass: Delta / c and lse + log c per query row (see the comment above backward_dq_kernel
// in backward.cuh for why from this pass's own P). Grid: B * H * ceil(N / kFwdRows) blocks of
// kSplit kFwdThreads threads. kSplit 2 (where the grid leaves the GPU's block slots half empty,
// delta_pass_split): the forward's two halves, each taking half of every chunk's features, then
// half of the thread's rows (tile_scores_impl<2>): twice the warps per block, for the halves'
// exchange of their products on top of the instructions per element.
// ---------------------------------------------------------------------------------------
// kPhi: the call's phi (Phi; the scores of tile_scores_impl). kOdd: P takes the sign of its product of
// sincs (tile_scores_impl's `negative`, kept in the score cache's sign bytes for the main pass), c_i
// and Delta_i are signed sums, and the row's P / (c_i + eps e^-lse_i) (signed_row_scale) is the signed
// weight: it writes lse_i - log|that scale| and, in p.row_sign, its sign.
template <typename scalar_t, int kSplit, Phi kPhi = Phi::kPower>
FF_GLOBAL void FF_LAUNCH_BOUNDS_MIN(kFwdThreads * kSplit, 2 / kSplit)
    backward_delta_tiled_kernel(const Params<scalar_t, float> p) {
  static_assert(kSplit == 1 || kSplit == 2, "one or two halves");
  constexpr int kThreads = kFwdThreads * kSplit;
  constexpr int kRows = kMicro / kSplit;  // the thread's rows: row0 + (0 .. kRows - 1)
  FF_DYNAMIC_SHARED(smem_raw);
  const int N = p.N, M = p.M, Dv = p.Dv;
  // the block's bh, i0 and visible keys first: read back in each key tile (no register across
  // the score code, no division redone there), at a constant address
  int* ids = reinterpret_cast<int*>(smem_raw);             // (4 ints)
  float* region = reinterpret_cast<float*>(smem_raw) + 4;  // score chunks (and the halves' exchange), then V^T
  float* Vt = region;                                  // (Dv, kFwdKeys)
  float* dOt = region + tiled_delta_region_floats(Dv, kSplit);  // (Dv, kFwdRows): the block's dO, transposed
  float* row_sums = dOt + (int64_t)Dv * kFwdRows;      // (2, kFwdRows, 2): Delta and c partials per warp column
  float* Lh = row_sums + 4 * kFwdRows;                 // (kFwdRows,) lse high part
  float* Ll = Lh + kFwdRows;                           // (kFwdRows,) low part

  const int tid = kSplit == 1 ? (int)threadIdx.x : (int)threadIdx.x & (kFwdThreads - 1);
  const int half = kSplit == 1 ? 0 : (int)threadIdx.x / kFwdThreads;
  const int warp = tid >> 5, lane = tid & 31;
  const int tx = (warp & 1) * 8 + (lane & 7);
  const int ty = (warp >> 1) * 4 + (lane >> 3);
  const int row0 = ty * kMicro + half * kRows;
  {  // (bh and i0 live only here: the key-tile loop reads them from ids)
    int i0;
    const int64_t bh = block_slice(N, kFwdRows, i0);
    if (threadIdx.x == 0) {
      ids[0] = (int)bh;
      ids[1] = i0;
      ids[2] = visible_end(p, ff_min(N - 1, i0 + kFwdRows - 1));
    }
    // SASS: loop=dout_staging step=kFwdThreads*split trips=Dv*kFwdRows/(kFwdThreads*split)
    for (int idx = threadIdx.x; idx < Dv * kFwdRows; idx += kThreads) {
      const int c = idx >> kFwdRowsLog2, r = idx & (kFwdRows - 1);
      const int i = i0 + r;
      dOt[idx] = i < N ? load_as<float>(p.dout, (bh * N + i) * Dv + c) : 0.0f;
    }
    if (threadIdx.x < kFwdRows) {
      const int i = i0 + threadIdx.x;
      split_lse_log2_or_inf(i < N ? p.lse_in[bh * N + i] : (double)INFINITY, Lh[threadIdx.x], Ll[threadIdx.x]);
    }
    // SASS: loop=row_sums_zeroing step=kFwdThreads*split trips=4*kFwdRows/(kFwdThreads*split)
    for (int idx = threadIdx.x; idx < 4 * kFwdRows; idx += kThreads) row_sums[idx] = 0.0f;
  }
  __syncthreads();  // ids

  // SASS: loop=delta_key_tiles step=kFwdKeys unroll=1 trips=ceil(M/kFwdKeys)
  for (int j0 = 0; j0 < ids[2]; j0 += kFwdKeys) {
    float S[kMicro][kMicro];  // (kSplit 2: rows ii < kRows)
    unsigned negative = 0;    // (kOdd: the signs, see tile_scores_impl)
    if constexpr (kSplit == 1) {
      tile_scores_log2<kPhi>(p, (int64_t)ids[0], ids[1], j0, tx, ty, region, S, negative);
    } else {
      int rare;
      tile_scores_impl<2, true, kPhi>(p, (int64_t)ids[0], ids[1], j0, tx, ty, region, S, rare, negative);
    }
    __syncthreads();  // the score chunks are consumed
    const int64_t bh = ids[0];
    const int i0 = ids[1];
    if (half == 0) stage_v_transposed(p.v + bh * M * Dv, j0, M, Dv, Vt, tid);
    __syncthreads();
    // SASS: cold=score_cache_store begin test when=no-score-cache
    if (p.score_cache && j0 + tx * kMicro < M) {  // (the thread's 4 keys, within the row's stride)
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii) {
        const int i = i0 + row0 + ii;
        if (i < N)
          *reinterpret_cast<float4*>(p.score_cache + (bh * N + i) * score_cache_stride(M) + j0 + tx * kMicro) =
              make_float4(S[ii][0], S[ii][1], S[ii][2], S[ii][3]);
        if (kPhi == Phi::kOdd && i < N)  // (the sign bytes after the scores: score_sign_bytes)
          reinterpret_cast<unsigned char*>(p.score_cache + (int64_t)p.B * p.H * N * score_cache_stride(M))
              [(bh * N + i) * (score_cache_stride(M) / 4) + (j0 >> 2) + tx] = (negative >> (ii * kMicro)) & 15u;
      }
      // SASS: cold=score_cache_store end
    }
    float dP[kRows][kMicro], delta_part[kRows], psum_part[kRows];
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      delta_part[ii] = psum_part[ii] = 0.0f;
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) dP[ii][jj] = 0.0f;
    }
    if (micro_tile_live(p, i0, j0, tx, ty)) {  // (a thread that is not live: P = 0, its dP unused)
      // SASS: loop=delta_dp step=1 trips=Dv elements=kMicro*kMicro/split unit=qkc
      for (int c = 0; c < Dv; ++c) {
        const float4 v4 = load4(Vt + c * kFwdKeys + tx * kMicro);
        const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
        float ov[kRows];
        if constexpr (kRows == 4) {
          const float4 o4 = load4(dOt + c * kFwdRows + row0);
          ov[0] = o4.x, ov[1] = o4.y, ov[2] = o4.z, ov[3] = o4.w;
        } else {
          const float2 o2 = *reinterpret_cast<const float2*>(dOt + c * kFwdRows + row0);
          ov[0] = o2.x, ov[1] = o2.y;
        }
#pragma unroll
        for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
          for (int jj = 0; jj < kMicro; ++jj) dP[ii][jj] = fmaf(ov[ii], vv[jj], dP[ii][jj]);
      }
    }
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      const float lh = Lh[row0 + ii], ll = Ll[row0 + ii];
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) {
        S[ii][jj] = softmax_weight(S[ii][jj], lh, ll);  // P
        if (kPhi == Phi::kOdd && ((negative >> (ii * kMicro + jj)) & 1u)) S[ii][jj] = -S[ii][jj];
      }
    }
    // SASS: cold=dropout begin test
    if (p.dropout_p > 0.0f) {  // (block-uniform) dP times the keep factor
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj)
          if (S[ii][jj] != 0.0f)
            dP[ii][jj] *= dropout_factor(p, (uint32_t)bh, i0 + row0 + ii, j0 + tx * kMicro + jj);
      // SASS: cold=dropout end
    }
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) {
        delta_part[ii] = fmaf(S[ii][jj], dP[ii][jj], delta_part[ii]);
        psum_part[ii] += S[ii][jj];
      }
    // the tile's Delta_i and c_i shares: over the 8 lanes of a warp row (lane & 7), then into the
    // warp column's slot (one lane owns it; registers stay free while the scores are computed)
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) {
        delta_part[ii] += __shfl_xor_sync(kFullMask, delta_part[ii], o);
        psum_part[ii] += __shfl_xor_sync(kFullMask, psum_part[ii], o);
      }
    }
    if ((lane & 7) == 0) {
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii) {
        float* slot = row_sums + ((warp & 1) * kFwdRows + row0 + ii) * 2;
        slot[0] += delta_part[ii];
        slot[1] += psum_part[ii];
      }
    }
    // (the next tile_scores starts with a barrier: V^T is consumed before the chunks overwrite it)
  }

  __syncthreads();
  const int64_t bh = ids[0];
  const int i0 = ids[1];
  if (threadIdx.x < kFwdRows && i0 + (int)threadIdx.x < N) {
    const int r = threadIdx.x, i = i0 + r;
    const float psum = row_sums[r * 2 + 1] + row_sums[(kFwdRows + r) * 2 + 1];  // c_i; 0 without a gradient
    const double L_row = p.lse_in[bh * N + i];
    if constexpr (kPhi == Phi::kOdd) {
      // P / (c_i + eps e^-lse_i): P is w / |Z| for the forward's Z = sign e^lse and c_i about Z / |Z|,
      // so that this is w / (Z + eps), conditioned as the formula is where eps keeps Z + eps from 0
      const bool live = L_row < (double)INFINITY;  // (+inf: no visible key, P = 0)
      const double scale = live ? signed_row_scale(psum, L_row, p.log_eps) : 0.0;
      p.delta[bh * N + i] = (row_sums[r * 2] + row_sums[(kFwdRows + r) * 2]) * (float)scale;
      p.lse_bwd[bh * N + i] = live ? L_row - log(fabs(scale)) : (double)INFINITY;
      p.row_sign[bh * N + i] = scale < 0.0 ? -1.0f : 1.0f;
    } else {
      // m_i / c_i: P renormalised, times the real keys' share with the null key (null_key_share)
      const double log_share = psum > 0.0f ? null_key_log_share(L_row, p.log_eps) : 0.0;
      const float inv_c = psum > 0.0f ? (float)exp(log_share) / psum : 0.0f;
      p.delta[bh * N + i] = (row_sums[r * 2] + row_sums[(kFwdRows + r) * 2]) * inv_c;
      p.lse_bwd[bh * N + i] = psum > 0.0f ? L_row + log((double)psum) - log_share : (double)INFINITY;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Main pass: dk, dv, the dq sums (into p.dq_acc) and the keys' share of dradius. Grid:
// B * H * ceil(M / kFwdKeys) blocks of kFwdThreads (after the pre-pass). Value columns up to
// 4 kO (kO = 1, 2, 4, 8, 16, 32: the dv tiles of DvTile<kO>); kCache: the scores from
// p.score_cache (score_cache.h), else computed; kPhi: the call's phi (Phi): the scores computed here
// (tile_scores_log2) and the g pass's derivative (kSigmoid: dlog_sigmoid_sinc_tables). With the cache
// the scores are the pre-pass's, so that the phis of one derivative share an instance
// (main_pass_phi: ReLU takes the power's). kOdd: P with the sign of its product of sincs (from the
// score cache's sign bytes, or tile_scores_log2) times the row's p.row_sign (the pre-pass's).
// ---------------------------------------------------------------------------------------
template <typename scalar_t, int kO, bool kCache, Phi kPhi = Phi::kPower>
FF_GLOBAL void FF_LAUNCH_BOUNDS_MIN(kFwdThreads, 2) backward_main_tiled_kernel(const Params<scalar_t, float> p) {
  static_assert(kO == 1 || kO == 2 || kO % 4 == 0, "value columns per thread");
  static_assert(kPhi == main_pass_phi(kPhi, kCache), "with the cache the scores are the pre-pass's");
  constexpr bool kSigmoid = kPhi == Phi::kSigmoid;
  FF_DYNAMIC_SHARED(smem_raw);
  const int N = p.N, M = p.M, Dp = p.Dp, Dv = p.Dv, D = p.D;
  const int ostride = dkv_out_stride(Dv);
  int* ids = reinterpret_cast<int*>(smem_raw);  // (4 ints: bh, j0, h, split; see below; a constant address)
  float* region = reinterpret_cast<float*>(smem_raw) + 4;  // score chunks, then dO, then the g pass's chunks
  float* Ot = region;                                  // (kFwdRows, ostride): dO of the query tile
  float* Rf = region;                                  // g pass: (kRowFields, kChunk, kFwdRows)
  float* Kf = region + kRowFields * kChunk * kFwdRows;  // g pass: (kKeyFields, kChunk, kFwdKeys)
  float* uni = region + (int)tiled_main_region_floats(Dv);  // (int offsets: 32-bit shared-memory arithmetic)
  float* Vt = uni;                                     // (Dv, kFwdKeys): v of the block, transposed
  float* W = uni;                                      // (kFwdRows, kFwdKeys): P f, [query][key]
  float* Pq = uni;                                     // (kGroup, 16, kPqStride): dq partials
  float* Pk = uni + kGroup * 16 * kPqStride;           // (kGroup, 16, kFwdKeys): dk partials
  float* dks = uni + (int)tiled_main_union_floats(Dv);  // (Dp, kFwdKeys): sum_i dS' g of the block's keys
  float* Lh = dks + kFwdKeys * Dp;                      // (kFwdRows,) lse_bwd high part
  float* Ll = Lh + kFwdRows;                           // (kFwdRows,) low part
  float* Dl = Ll + kFwdRows;                           // (kFwdRows,) Delta / c
  float* xus = Dl + kFwdRows;                          // (kChunk,) x / u of the chunk's features

  // The block's (batch, head) slice and first key, kept in shared memory (ids) and the thread's
  // indices re-derived from fresh_thread_index() in each query tile: no register holds them
  // across the score code.
  int i_begin;
  {
    const int tid = threadIdx.x;
    int j0, split;
    const int bh = block_slice(M, kFwdKeys, p.main_splits, j0, split);
    if (tid == 0) {
      ids[0] = bh;
      ids[1] = j0;
      ids[2] = bh % p.H;
      ids[3] = split;  // features [split * p.split_features, + p.split_features) of the key tile; dv in split 0
    }
    // SASS: loop=dk_sums_zeroing step=kFwdThreads trips=kFwdKeys*Dp/kFwdThreads
    for (int idx = tid; idx < kFwdKeys * Dp; idx += kFwdThreads) dks[idx] = 0.0f;
    // dv of the block's keys: summed per query tile in registers, across tiles in p.dv_acc
    // (float32), which keeps the registers free while the scores are computed
    const int nk = ff_min(kFwdKeys, M - j0);
    float* dv_block = p.dv_acc + ((int64_t)bh * M + j0) * Dv;  // (nk, Dv)
    if (split == 0)
      // SASS: loop=dv_zeroing step=kFwdThreads trips=kFwdKeys*Dv/(kFwdThreads*main_splits)
      for (int idx = tid; idx < nk * Dv; idx += kFwdThreads) dv_block[idx] = 0.0f;
    // Query i sees key j iff j <= i + (M - N): the block's first key bounds the first query.
    i_begin = p.causal ? ff_max(0, j0 - (M - N)) : 0;
  }
  __syncthreads();  // ids

  // SASS: loop=query_tiles step=kFwdRows unroll=1 trips=ceil(N/kFwdRows)
  for (int i0 = i_begin; i0 < N; i0 += kFwdRows) {
    float S[kMicro][kMicro];
    unsigned negative = 0;  // (kOdd: the signs of the pairs, bit kMicro ii + jj)
    if constexpr (kCache) {  // the pre-pass's scores (p.score_cache; -inf where not visible)
      const int tid = fresh_thread_index(), warp = tid >> 5, lane = tid & 31;
      const int64_t bh = ids[0];
      const int j = ids[1] + ((warp & 1) * 8 + (lane & 7)) * kMicro;  // the thread's first key
#pragma unroll
      for (int ii = 0; ii < kMicro; ++ii) {
        const int i = i0 + ((warp >> 1) * 4 + (lane >> 3)) * kMicro + ii;
        const int end = i < N ? visible_end(p, i) : 0;  // (keys past `end` in the row's stride: not read)
        const float4 s4 = j < end ? load4(p.score_cache + (bh * N + i) * score_cache_stride(p.M) + j)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj) S[ii][jj] = j + jj < end ? sv[jj] : -ff_inf<float>();
        if (kPhi == Phi::kOdd && j < end)  // (score_sign_bytes)
          negative |= (unsigned)reinterpret_cast<const unsigned char*>(
                          p.score_cache + (int64_t)p.B * p.H * N * score_cache_stride(p.M))
                          [(bh * N + i) * (score_cache_stride(p.M) / 4) + (j >> 2)]
                      << (ii * kMicro);
      }
    } else {  // no score cache: the scores again
      const int tid = fresh_thread_index(), warp = tid >> 5, lane = tid & 31;
      tile_scores_log2<kPhi>(p, (int64_t)ids[0], i0, ids[1], (warp & 1) * 8 + (lane & 7), (warp >> 1) * 4 + (lane >> 3),
                             region, S, negative);
    }
    __syncthreads();  // the score chunks and the previous tile's partials are consumed
    const int tid = fresh_thread_index();
    const int64_t bh = ids[0];
    const int j0 = ids[1], h = ids[2];
    const int warp = tid >> 5, lane = tid & 31;
    const int tx = (warp & 1) * 8 + (lane & 7);
    const int ty = (warp >> 1) * 4 + (lane >> 3);
    const bool live = micro_tile_live(p, i0, j0, tx, ty);  // (not live: P = 0, C = 0, no dP, no g)
    const int rc = tid & (kFwdKeys - 1), re = tid >> 6;  // reductions: row / key rc, feature re of a group
    const int dv_kg = tid & 15, dv_slot = tid >> 4;     // see DvTile
    const int dv_cg0 = dv_slot % DvTile<kO>::kColumnGroups, dv_qs = dv_slot / DvTile<kO>::kColumnGroups;
    const int nk = ff_min(kFwdKeys, M - j0);
    float* dv_block = p.dv_acc + (bh * M + j0) * Dv;
    const scalar_t* v = p.v + bh * M * Dv;
    const scalar_t* dout = p.dout + bh * N * Dv;
    // dO of the query tile, padding columns 0: column quads tid % 16 + 16 n of rows tid / 16 + 16 m,
    // a float4 store each (no integer division)
#pragma unroll
    for (int n = 0; n < kFwdRows * 16 / kFwdThreads; ++n) {
      const int r = (tid >> 4) + n * (kFwdThreads / 16), i = i0 + r;
      const bool on = i < N;
      const scalar_t* src = dout + (int64_t)i * Dv;
      // SASS: loop=dout_staging_columns step=64 trips=(Dvs+4)/64
#pragma unroll 1
      for (int c = 4 * (tid & 15); c < ostride; c += 64) {
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = (on && c + e < Dv) ? load_as<float>(src, c + e) : 0.0f;
        *reinterpret_cast<float4*>(Ot + r * ostride + c) = make_float4(o[0], o[1], o[2], o[3]);
      }
    }
    stage_v_transposed(v, j0, M, Dv, Vt, tid);
    if (tid < kFwdRows) {
      const int i = i0 + tid;
      split_lse_log2_or_inf(i < N ? p.lse_bwd[bh * N + i] : (double)INFINITY, Lh[tid], Ll[tid]);
      Dl[tid] = i < N ? p.delta[bh * N + i] : 0.0f;
    }
    __syncthreads();
    float dP[kMicro][kMicro];
#pragma unroll
    for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) dP[ii][jj] = 0.0f;
    if (live) {
      // SASS: loop=main_dp step=1 trips=Dv elements=kMicro*kMicro/split unit=qkc
      for (int c = 0; c < Dv; ++c) {
        const float4 v4 = load4(Vt + c * kFwdKeys + tx * kMicro);
        const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
        for (int ii = 0; ii < kMicro; ++ii) {
          const float o = Ot[(ty * kMicro + ii) * ostride + c];
#pragma unroll
          for (int jj = 0; jj < kMicro; ++jj) dP[ii][jj] = fmaf(o, vv[jj], dP[ii][jj]);
        }
      }
    }
    // C = dS' = P (f dP - Delta / c), kept in registers for the g pass (the power multiplies dq,
    // dk and dradius at the end); P f for dv, in S.
    float C[kMicro][kMicro];
#pragma unroll
    for (int ii = 0; ii < kMicro; ++ii) {
      const int r = ty * kMicro + ii;
      const float lh = Lh[r], ll = Ll[r], dl = Dl[r];
      // (kOdd: the row's normaliser's sign, the pre-pass's; 1 for rows past N, whose P is 0)
      const float row_sign = kPhi == Phi::kOdd && i0 + r < N ? p.row_sign[bh * N + i0 + r] : 1.0f;
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) {
        float P = softmax_weight(S[ii][jj], lh, ll);
        if (kPhi == Phi::kOdd) P = ((negative >> (ii * kMicro + jj)) & 1u) ? -row_sign * P : row_sign * P;
        S[ii][jj] = P;
        C[ii][jj] = P * (dP[ii][jj] - dl);
      }
    }
    // SASS: cold=dropout begin test
    if (p.dropout_p > 0.0f) {  // (block-uniform) the keep factor f
#pragma unroll
      for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj) {
          const int r = ty * kMicro + ii;
          if (S[ii][jj] != 0.0f) {
            const float f = dropout_factor(p, (uint32_t)bh, i0 + r, j0 + tx * kMicro + jj);
            C[ii][jj] = S[ii][jj] * (dP[ii][jj] * f - Dl[r]);
            S[ii][jj] *= f;
          }
        }
      // SASS: cold=dropout end
    }
    // dv = P^T dO (see dv_tile), in the first feature split only (block-uniform): keys
    // 4 kg + (0..3) times value columns 4 (cg0 + 16 n) + (0..3), over the queries qs + kPhases m
    // of the tile
    if (ids[3] == 0) {
      __syncthreads();  // V^T is consumed (W takes its place)
#pragma unroll
      for (int ii = 0; ii < kMicro; ++ii)
        *reinterpret_cast<float4*>(W + (ty * kMicro + ii) * kFwdKeys + tx * kMicro) =
            make_float4(S[ii][0], S[ii][1], S[ii][2], S[ii][3]);
      __syncthreads();
      const int nq = ff_min(kFwdRows, N - i0);
      using T = DvTile<kO>;
      float acc[T::kGroups][4][4];
#pragma unroll
      for (int n = 0; n < T::kGroups; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[n][e][c] = 0.0f;
      const float* wcol = W + 4 * dv_kg;
      const float* ocol = Ot + 4 * dv_cg0;
      // SASS: loop=dv step=dv_phases trips=kFwdRows/(dv_phases*main_splits) elements=16*dv_groups unit=qkc
      for (int ii = dv_qs; ii < nq; ii += T::kPhases) {
        const float4 w4 = load4(wcol + ii * kFwdKeys);
        const float w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
        for (int n = 0; n < T::kGroups; ++n) {
          const float4 o4 = load4(ocol + ii * ostride + 64 * n);  // (padding columns: 0)
          const float o[4] = {o4.x, o4.y, o4.z, o4.w};
#pragma unroll
          for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[n][e][c] = fmaf(w[e], o[c], acc[n][e][c]);
        }
      }
      if (T::kPhases == 1) {  // the thread's keys and columns are its own: into p.dv_acc
#pragma unroll
        for (int n = 0; n < T::kGroups; ++n) {
          const int c0 = 4 * (dv_cg0 + 16 * n);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = 4 * dv_kg + e;
            if (key < nk) {
#pragma unroll
              for (int c = 0; c < 4; ++c)
                if (c0 + c < Dv) dv_block[key * Dv + c0 + c] += acc[n][e][c];
            }
          }
        }
      } else {  // the kPhases partial sums through shared memory (Ot and W are consumed)
        constexpr int kW = 4 * T::kColumnGroups;  // columns of the partial tile
        float* red = region;                        // (kPhases, kFwdKeys, kW)
        __syncthreads();
#pragma unroll
        for (int e = 0; e < 4; ++e)
          *reinterpret_cast<float4*>(red + (dv_qs * kFwdKeys + 4 * dv_kg + e) * kW + 4 * dv_cg0) =
              make_float4(acc[0][e][0], acc[0][e][1], acc[0][e][2], acc[0][e][3]);
        __syncthreads();
        // SASS: loop=dv_phase_sums step=kFwdThreads trips=kFwdKeys*4*dv_column_groups/(kFwdThreads*main_splits)
        for (int idx = tid; idx < kFwdKeys * kW; idx += kFwdThreads) {
          const int key = idx / kW, c = idx % kW;  // (compile-time divisor)
          float sum = 0.0f;
#pragma unroll
          for (int ph = 0; ph < T::kPhases; ++ph) sum += red[ph * kFwdKeys * kW + idx];
          if (key < nk && c < Dv) dv_block[key * Dv + c] += sum;
        }
      }
    }
    // g pass: the thread's 4 x 4 (query, key) pairs, coefficients C; per group of kGroup features
    // the partial sums over its 4 keys (dq) and 4 queries (dk) go through shared memory. The
    // block's features: its split's (whole chunks but the last).
    const int d_end = ff_min(Dp, (ids[3] + 1) * p.split_features);
    // SASS: loop=g_chunks step=kChunk trips=ceil(Dp/kChunk)/main_splits
    for (int d0 = ids[3] * p.split_features; d0 < d_end; d0 += kChunk) {
      const int dc = ff_min(kChunk, d_end - d0);
      __syncthreads();  // dO and P f, or the previous chunk and partials, are consumed
      {  // as tile_scores: where N and M are multiples of 4, thread tid stages feature tid / 16 of
         // the chunk, rows and keys 4 (tid % 16) + (0..3), one float4 per field; else rows / keys
         // tid % 64 of features tid / 64 + 4 n one float at a time. Rows past N stage 0, keys
         // past M a padding key (finite g; their C is 0).
        const float* trows = p.trows + bh * kRowFields * Dp * N;  // (recomputed: registers)
        const float* tkeys = p.tkeys + bh * kKeyFields * Dp * M;
        const int64_t rfield = (int64_t)Dp * N, kfield = (int64_t)Dp * M;
        if (((N | M) & 3) == 0) {  // block-uniform
          const int r = 4 * (tid & 15), dd = tid >> 4;
          if (dd < dc) {
            const bool row_on = i0 + r < N, key_on = j0 + r < M;
            const float* rsrc = trows + (int64_t)(d0 + dd) * N + (i0 + r);
            const float* ksrc = tkeys + (int64_t)(d0 + dd) * M + (j0 + r);
#pragma unroll
            for (int f = 0; f < kRowFields; ++f)  // (kSigmoid: cos a at t_low's place, sigmoid_row_field)
              *reinterpret_cast<float4*>(Rf + (f * kChunk + dd) * kFwdRows + r) =
                  row_on ? (kSigmoid ? sigmoid_row_field4(rsrc, rfield, f) : load4(rsrc + f * rfield))
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int f = 0; f < kKeyFields; ++f) {
              const float pad = pad_key_field(f);
              *reinterpret_cast<float4*>(Kf + (f * kChunk + dd) * kFwdKeys + r) =
                  key_on ? load4(ksrc + f * kfield) : make_float4(pad, pad, pad, pad);
            }
          }
        // SASS: cold=scalar_staging begin test
        } else {  // scalar staging
          const int r = tid & (kFwdRows - 1), dd0 = tid >> kFwdRowsLog2;
          const bool row_on = i0 + r < N, key_on = j0 + r < M;
          const float* rsrc = trows + (int64_t)(d0 + dd0) * N + (i0 + r);
          const float* ksrc = tkeys + (int64_t)(d0 + dd0) * M + (j0 + r);
          // SASS: loop=g_staging_scalar step=kStageStep trips=chunk_dc/kStageStep
          for (int dd = dd0; dd < dc; dd += kStageStep, rsrc += kStageStep * (int64_t)N, ksrc += kStageStep * (int64_t)M) {
#pragma unroll
            for (int f = 0; f < kRowFields; ++f)
              Rf[(f * kChunk + dd) * kFwdRows + r] =
                  row_on ? (kSigmoid ? sigmoid_row_field(rsrc, rfield, f) : rsrc[f * rfield]) : 0.0f;
#pragma unroll
            for (int f = 0; f < kKeyFields; ++f)
              Kf[(f * kChunk + dd) * kFwdKeys + r] = key_on ? ksrc[f * kfield] : pad_key_field(f);
          }
          // SASS: cold=scalar_staging end
        }
        if (tid < dc) xus[tid] = p.x_per_u[(int64_t)h * Dp + d0 + tid];
      }
      __syncthreads();
      // SASS: loop=g_pass step=kGroup trips=chunk_dc/kGroup elements=kMicro*kMicro*kGroup unit=qkd
      for (int dd = 0; dd < dc; dd += kGroup) {
        // SASS: cold=empty_tile begin test
        if (!live) {  // C = 0: zero partials
#pragma unroll
          for (int e = 0; e < kGroup; ++e) {
            *reinterpret_cast<float4*>(Pq + (e * 16 + tx) * kPqStride + ty * kMicro) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *reinterpret_cast<float4*>(Pk + (e * 16 + ty) * kFwdKeys + tx * kMicro) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
          // SASS: cold=empty_tile end
        } else {
#pragma unroll
          for (int e = 0; e < kGroup; ++e) {
            const float* rf = Rf + (dd + e) * kFwdRows + ty * kMicro;
            const float* kf = Kf + (dd + e) * kFwdKeys + tx * kMicro;
            const float4 q4 = load4(rf), t4 = load4(rf + kChunk * kFwdRows), tl4 = load4(rf + 2 * kChunk * kFwdRows);
            const float4 k4 = load4(kf), X4 = load4(kf + kChunk * kFwdKeys), Y4 = load4(kf + 2 * kChunk * kFwdKeys),
                         Yl4 = load4(kf + 3 * kChunk * kFwdKeys);
            const float xu = xus[dd + e];
            const float qv[4] = {q4.x, q4.y, q4.z, q4.w}, tv[4] = {t4.x, t4.y, t4.z, t4.w},
                        tlv[4] = {tl4.x, tl4.y, tl4.z, tl4.w};
            const float kv[4] = {k4.x, k4.y, k4.z, k4.w}, Xv[4] = {X4.x, X4.y, X4.z, X4.w},
                        Yv[4] = {Y4.x, Y4.y, Y4.z, Y4.w}, Ylv[4] = {Yl4.x, Yl4.y, Yl4.z, Yl4.w};
            float dqp[kMicro], dkp[kMicro];  // over the thread's 4 keys (dq) and 4 queries (dk)
#pragma unroll
            for (int t = 0; t < kMicro; ++t) dqp[t] = dkp[t] = 0.0f;
#pragma unroll
            for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
              for (int jj = 0; jj < kMicro; ++jj) {
                const float g = kSigmoid ? dlog_sigmoid_sinc_tables(qv[ii], tv[ii], tlv[ii], kv[jj], Xv[jj], Yv[jj], xu)
                                         : dlog_sinc_g(qv[ii], tv[ii], tlv[ii], kv[jj], Xv[jj], Yv[jj], Ylv[jj], xu);
                dqp[ii] = fmaf(C[ii][jj], g, dqp[ii]);
                dkp[jj] = fmaf(C[ii][jj], g, dkp[jj]);
              }
            *reinterpret_cast<float4*>(Pq + (e * 16 + tx) * kPqStride + ty * kMicro) =
                make_float4(dqp[0], dqp[1], dqp[2], dqp[3]);
            *reinterpret_cast<float4*>(Pk + (e * 16 + ty) * kFwdKeys + tx * kMicro) =
                make_float4(dkp[0], dkp[1], dkp[2], dkp[3]);
          }
        }
        __syncthreads();
        {  // thread: query row / key rc, feature d0 + dd + re
          float sq = 0.0f, sk = 0.0f;
#pragma unroll
          for (int t = 0; t < 16; ++t) {
            sq += Pq[(re * 16 + t) * kPqStride + rc];
            sk += Pk[(re * 16 + t) * kFwdKeys + rc];
          }
          const int d = d0 + dd + re;
          dks[d * kFwdKeys + rc] += sk;
          if (sq != 0.0f && i0 + rc < N) atomicAdd(p.dq_acc + (bh * N + i0 + rc) * Dp + d, sq);
        }
        __syncthreads();  // the partials are consumed
      }
    }
  }

  __syncthreads();  // dks complete (also with no query tile)
  const int tid = threadIdx.x;
  const int64_t bh = ids[0];
  const int j0 = ids[1], h = ids[2], split = ids[3];
  const int nk = ff_min(kFwdKeys, M - j0);
  const float* dv_block = p.dv_acc + (bh * M + j0) * Dv;
  // the split's real features [d_lo, d_hi)
  const int d_lo = split * p.split_features, d_hi = ff_min(D, d_lo + p.split_features), nd = d_hi - d_lo;
  // dk = -p |R| sum_i dS' g; the keys' share of dradius, p sign(R) / c sum_j (k c - m) (-sum_i dS' g)
  // with m = q c of the slice's first query (see backward_dq_finish_kernel).
  // SASS: loop=dk_store step=kFwdThreads trips=kFwdKeys*D/(kFwdThreads*main_splits)
  for (int idx = tid; idx < nk * nd; idx += kFwdThreads) {
    const int c = idx / nd, d = d_lo + idx - c * nd;
    p.dk[(bh * M + j0 + c) * D + d] =
        static_cast<scalar_t>(-p.power * fabsf(p.radius[(int64_t)h * D + d]) * dks[d * kFwdKeys + c]);
  }
  if (N > 0) {
    const float* trows = p.trows + bh * kRowFields * Dp * N;
    const float* tkeys = p.tkeys + bh * kKeyFields * Dp * M;
    const float* x_per_u = p.x_per_u + (int64_t)h * Dp;
    // SASS: loop=main_dradius_sums step=kFwdThreads trips=D/(kFwdThreads*main_splits)
    for (int d = d_lo + tid; d < d_hi; d += kFwdThreads) {
      const float m = trows[((int64_t)kRowQ * Dp + d) * N];
      const float* kc = tkeys + ((int64_t)kKeyK * Dp + d) * M + j0;
      float sum = 0.0f;
      // SASS: loop=dradius_key_sum step=1 trips=kFwdKeys
      for (int c = 0; c < nk; ++c) sum = fmaf(kc[c] - m, dks[d * kFwdKeys + c], sum);
      const float R = p.radius[(int64_t)h * D + d];
      const float dr = x_per_u[d] == 0.0f ? 0.0f : -p.power * sum * (x_per_u[d] / R);
      if (dr != 0.0f) atomicAdd(p.dradius + (int64_t)h * D + d, dr);
    }
  }
  if (split == 0)
    // SASS: loop=dv_store step=kFwdThreads trips=kFwdKeys*Dv/(kFwdThreads*main_splits)
    for (int idx = tid; idx < nk * Dv; idx += kFwdThreads)
      p.dv[(bh * M + j0) * Dv + idx] = static_cast<scalar_t>(dv_block[idx]);
}

// ---------------------------------------------------------------------------------------
// dq = |R| sum_j dS' g from p.dq_acc, and the queries' share of dradius. Grid:
// B * H * ceil(N / kFwdRows) blocks of kFwdThreads (after the main pass).
//
// dradius from dq and dk: S depends on R_d only through x = |R_d| (q - k), so
// dS/dR_d = sign(R_d) sum_ij dS_ij g(x_ijd) (q_id - k_jd) = (sum_i q_id dq_id + sum_j k_jd dk_jd) / R_d,
// with dq = |R| sum_j dS g and dk = -|R| sum_i dS g. It is exact for any constant m_d subtracted
// from q and k (sum_i dq_id + sum_j dk_jd = 0): m_d = q c of the slice's first query keeps the
// products at the size of q - k (inputs with a large common offset would otherwise cancel).
// In table units (q c, k c, sums without |R|): dradius_d = sign(R) / c (sum_i (q c - m) A_i - sum_j
// (k c - m) B_j) = x_per_u / R (...), 0 where x_per_u is 0 (R = 0, as before).
// ---------------------------------------------------------------------------------------
template <typename scalar_t>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kFwdThreads) backward_dq_finish_kernel(const Params<scalar_t, float> p) {
  FF_DYNAMIC_SHARED(smem_raw);
  float* dr_sum = reinterpret_cast<float*>(smem_raw);  // (kBwdMaxFeatures,)
  const int N = p.N, Dp = p.Dp, D = p.D;
  const int tid = threadIdx.x;
  const int row_blocks = (N + kFwdRows - 1) / kFwdRows;
  const int64_t bh = blockIdx.x / row_blocks;
  const int i0 = (int)(blockIdx.x - bh * row_blocks) * kFwdRows;
  const int h = (int)(bh % p.H);
  const float* qc = p.trows + bh * kRowFields * Dp * N;  // field kRowQ
  const float* acc = p.dq_acc + bh * N * Dp;
  // SASS: loop=dradius_zeroing step=kFwdThreads trips=kBwdMaxFeatures/kFwdThreads
  for (int d = tid; d < kBwdMaxFeatures; d += kFwdThreads) dr_sum[d] = 0.0f;
  __syncthreads();
  const int nr = ff_min(kFwdRows, N - i0);
  // SASS: loop=dq_store step=kFwdThreads trips=kFwdRows*D/kFwdThreads
  for (int idx = tid; idx < nr * D; idx += kFwdThreads) {
    const int r = idx / D, d = idx - r * D;
    const int i = i0 + r;
    const float a = acc[(int64_t)i * Dp + d];
    p.dq[(bh * N + i) * D + d] = static_cast<scalar_t>(p.power * fabsf(p.radius[(int64_t)h * D + d]) * a);
    if (a != 0.0f) atomicAdd(dr_sum + d, (qc[(int64_t)d * N + i] - qc[(int64_t)d * N]) * a);
  }
  __syncthreads();
  // SASS: loop=finish_dradius_sums step=kFwdThreads trips=D/kFwdThreads
  for (int d = tid; d < D; d += kFwdThreads) {
    const float xu = p.x_per_u[(int64_t)h * Dp + d];
    const float R = p.radius[(int64_t)h * D + d];
    const float dr = xu == 0.0f ? 0.0f : p.power * dr_sum[d] * (xu / R);
    if (dr != 0.0f) atomicAdd(p.dradius + (int64_t)h * D + d, dr);
  }
}

}  // namespace cuda
}  // namespace fourierformer
