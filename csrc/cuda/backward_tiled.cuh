// Backward of the float32 path (float32, float16, bfloat16 inputs), on the tables of
// tables.cuh and the score tiles of forward_tiled.cuh. Two kernels, as the simple path:
//
//   dq   (block of kFwdRows queries, sweeping key tiles): per tile the scores (tile_scores),
//        P_ij = exp(S_ij - lse_i), dP_ij = dO_i . v_j in the 4 x 4 register tiles, the
//        coefficients a_ij = p P f dP and b_ij = p P into shared memory; then a second pass
//        over the features with 4 threads per query row, each owning the features
//        d = part + 4 t, computes g(x_ijd) per element from the tables and accumulates
//        sum_j a g, sum_j b g (dq) and the same times u (dradius). Delta_i = sum_j P f dP and
//        c_i = sum_j P are summed from this kernel's own P (see the comment above
//        backward_dq_kernel in backward.cuh: the radius gradient needs that), and
//        dq = |R| (sum a g - Delta sum b g) / c; the dk/dv kernel gets Delta / c and lse + log c.
//   dk/dv (block of kFwdKeys keys, sweeping query tiles): the scores again, P with the dq
//        kernel's lse, dS' = p P (f dP - Delta); dv_j += sum_i P f dO_i (4 threads per key) and
//        dk_jd = -|R_d| sum_i dS'_ij g(x_ijd) (4 threads per key, features part + 4 t).
//
// g from the tables: with s' = t X - Y (as in the forward) and c' = X + t Y = rho cos(x) / cos(a),
// cot x = c' / s' and g(x) = cot x - 1/x = (c' x - s') / (s' x), or g's Taylor series where
// |x| < kSincTaylorBound (there c' x - s' cancels); s' is floored at kSinFloor in magnitude (at a
// zero of sinc, where P is 0 anyway). Per element: u, s' (4), x, c', the fraction (fma, mul, a
// reciprocal and a mul), the series (5), the select (2) and the accumulation (4 in dq, 1 in dk).
// The sm_90 SASS of the dq kernel's loop (one key, 4 features): 113 instructions, 28 per element
// (44 FFMA, 24 FMUL, 8 FADD, 4 MUFU.RCP, 6 LDS, 5 FSETP, ...). The scores cost what they cost in
// the forward (~9.4 per element), in each of the two kernels.
//
// Head dims: features up to 4 kF per thread (kF <= 32, so D <= 128) and Dv <= 128; larger ones
// take the simple path (backward.cuh).
#pragma once

#include "forward_tiled.cuh"

namespace fourierformer {
namespace cuda {

constexpr int kBwdMaxFeatures = 128;  // largest padded D of the tiled backward
// largest Dv of the tiled backward: its shared memory (about 100 KiB at Dv = 128) then fits
// every GPU the build targets (sm_80 allows 163 KiB per block)
constexpr int kBwdMaxValueColumns = 128;
constexpr int kCoefStride = kFwdKeys + 1;  // coefficient tiles: odd stride, lanes over rows hit distinct banks

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

// Shared memory of the tiled backward kernels, in floats.
FF_HD int64_t tiled_dq_region_floats(int Dv) {
  const int64_t chunk = (int64_t)kChunk * (kRowFields * kFwdRows + kKeyFields * kFwdKeys);
  const int64_t vt = (int64_t)Dv * kFwdKeys;
  return chunk > vt ? chunk : vt;  // (the g pass's key chunk, kFwdKeys * kChunk * 4, is smaller than chunk)
}
FF_HD int64_t tiled_dq_smem_floats(int Dv) {
  return tiled_dq_region_floats(Dv) + (int64_t)Dv * kFwdRows + 2 * (int64_t)kFwdRows * kCoefStride +
         4 * kFwdRows + kBwdMaxFeatures;
}
FF_HD int dkv_out_stride(int Dv) { return padded_value_columns(Dv) + 4; }
FF_HD int64_t tiled_dkv_region_floats(int Dv) {
  const int64_t chunk = (int64_t)kChunk * (kRowFields * kFwdRows + kKeyFields * kFwdKeys);
  const int64_t ot = (int64_t)kFwdRows * dkv_out_stride(Dv);
  return chunk > ot ? chunk : ot;
}
FF_HD int64_t tiled_dkv_smem_floats(int Dv) {
  return tiled_dkv_region_floats(Dv) + (int64_t)Dv * kFwdKeys + 2 * (int64_t)kFwdKeys * kCoefStride + 3 * kFwdRows;
}

// lse as two floats, +inf as (+inf, 0) (P = exp((S - high) - low) is then 0).
FF_DEV void split_lse_or_inf(double L, float& high, float& low) {
  if (L < (double)INFINITY) {
    split_lse(L, high, low);
  } else {
    high = ff_inf<float>();
    low = 0.0f;
  }
}

// ---------------------------------------------------------------------------------------
// dq, dradius, Delta / c and lse + log c. Grid: B * H * ceil(N / kFwdRows) blocks of kFwdThreads.
// ---------------------------------------------------------------------------------------
template <typename scalar_t, int kF>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kFwdThreads) backward_dq_tiled_kernel(const Params<scalar_t, float> p) {
  static_assert(kF % 4 == 0 && 4 * kF <= kBwdMaxFeatures, "features per thread");
  FF_DYNAMIC_SHARED(smem_raw);
  const int N = p.N, M = p.M, Dp = p.Dp, Dv = p.Dv, D = p.D;
  float* region = reinterpret_cast<float*>(smem_raw);  // score chunks, then V^T, then the g pass's key chunks
  float* Vt = region;                                  // (Dv, kFwdKeys)
  float* Kg = region;                                  // (kFwdKeys, kChunk, 4)
  float* dOt = region + tiled_dq_region_floats(Dv);     // (Dv, kFwdRows): the block's dO, transposed
  float* A = dOt + (int64_t)Dv * kFwdRows;             // (kFwdRows, kCoefStride): p P f dP
  float* Bc = A + kFwdRows * kCoefStride;              // (kFwdRows, kCoefStride): p P
  float* row_sums = Bc + kFwdRows * kCoefStride;       // (2, kFwdRows, 2): Delta and c partials per warp column
  float* dr_sum = row_sums + 4 * kFwdRows;             // (kBwdMaxFeatures,): dradius of the block

  const int tid = threadIdx.x;
  const int row_blocks = (N + kFwdRows - 1) / kFwdRows;
  const int64_t bh = blockIdx.x / row_blocks;
  const int i0 = (int)(blockIdx.x - bh * row_blocks) * kFwdRows;
  const int h = (int)(bh % p.H);
  const int warp = tid >> 5, lane = tid & 31;
  const int tx = (warp & 1) * 8 + (lane & 7);
  const int ty = (warp >> 1) * 4 + (lane >> 3);
  const int gr = tid >> 2, part = tid & 3;  // g pass: row gr, features part + 4 t
  const int gi = i0 + gr;

  const float* trows = p.trows + bh * kRowFields * Dp * N;
  const float* tkeys = p.tkeys + bh * kKeyFields * Dp * M;
  const float* x_per_u = p.x_per_u + (int64_t)h * Dp;
  const scalar_t* v = p.v + bh * M * Dv;

  for (int d = tid; d < kBwdMaxFeatures; d += kFwdThreads) dr_sum[d] = 0.0f;
  for (int idx = tid; idx < Dv * kFwdRows; idx += kFwdThreads) {
    const int c = idx / kFwdRows, r = idx - c * kFwdRows;
    const int i = i0 + r;
    dOt[idx] = i < N ? load_as<float>(p.dout, (bh * N + i) * Dv + c) : 0.0f;
  }
  float L_high[kMicro], L_low[kMicro];
#pragma unroll
  for (int ii = 0; ii < kMicro; ++ii) {
    const int i = i0 + ty * kMicro + ii;
    split_lse_or_inf(i < N ? p.lse_in[bh * N + i] : (double)INFINITY, L_high[ii], L_low[ii]);
  }
  float delta_part[kMicro], psum_part[kMicro];
#pragma unroll
  for (int ii = 0; ii < kMicro; ++ii) delta_part[ii] = psum_part[ii] = 0.0f;
  float dq_a[kF], dq_b[kF], dr_a[kF], dr_b[kF];
#pragma unroll
  for (int t = 0; t < kF; ++t) dq_a[t] = dq_b[t] = dr_a[t] = dr_b[t] = 0.0f;

  const int last_row = ff_min(N - 1, i0 + kFwdRows - 1);
  const int block_end = visible_end(p, last_row);
  const int g_end = gi < N ? visible_end(p, gi) : 0;

  for (int j0 = 0; j0 < block_end; j0 += kFwdKeys) {
    float S[kMicro][kMicro];
    tile_scores(p, bh, i0, j0, tx, ty, region, S);
    __syncthreads();  // the score chunks are consumed
    for (int idx = tid; idx < Dv * kFwdKeys; idx += kFwdThreads) {
      const int c = idx / kFwdKeys, r = idx - c * kFwdKeys;
      const int j = j0 + r;
      Vt[idx] = j < M ? load_as<float>(v, (int64_t)j * Dv + c) : 0.0f;
    }
    __syncthreads();
    float dP[kMicro][kMicro];
#pragma unroll
    for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) dP[ii][jj] = 0.0f;
    for (int c = 0; c < Dv; ++c) {
      const float4 o4 = load4(dOt + c * kFwdRows + ty * kMicro), v4 = load4(Vt + c * kFwdKeys + tx * kMicro);
      const float ov[4] = {o4.x, o4.y, o4.z, o4.w}, vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
      for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
        for (int jj = 0; jj < kMicro; ++jj) dP[ii][jj] = fmaf(ov[ii], vv[jj], dP[ii][jj]);
    }
#pragma unroll
    for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) {
        const int i = i0 + ty * kMicro + ii, j = j0 + tx * kMicro + jj;
        const float s = S[ii][jj];
        const float P = s == -ff_inf<float>() ? 0.0f : ff_exp((s - L_high[ii]) - L_low[ii]);
        float a = 0.0f, bcoef = 0.0f;
        if (P != 0.0f) {
          const float f = p.dropout_p > 0.0f ? dropout_factor(p, (uint32_t)bh, i, j) : 1.0f;
          const float pfdp = P * f * dP[ii][jj];
          delta_part[ii] += pfdp;
          psum_part[ii] += P;
          a = p.power * pfdp;
          bcoef = p.power * P;
        }
        A[(ty * kMicro + ii) * kCoefStride + tx * kMicro + jj] = a;
        Bc[(ty * kMicro + ii) * kCoefStride + tx * kMicro + jj] = bcoef;
      }
    // g pass: row gr, keys j0 .. j0 + nk, features part + 4 t, kChunk features staged at a time.
    const int nk = ff_min(kFwdKeys, g_end - j0);
    const float* arow = A + gr * kCoefStride;
    const float* brow = Bc + gr * kCoefStride;
#pragma unroll
    for (int c4 = 0; c4 < kF / 4; ++c4) {
      const int d0 = c4 * kChunk;
      if (d0 >= Dp) break;  // (block-uniform)
      const int dc = ff_min(kChunk, Dp - d0);
      __syncthreads();  // V^T or the previous key chunk is consumed; the coefficients are written
      for (int idx = tid; idx < dc * kFwdKeys; idx += kFwdThreads) {
        const int c = idx & (kFwdKeys - 1), dd = idx >> kFwdKeysLog2;
        const int j = j0 + c;
        const float* src = tkeys + (int64_t)(d0 + dd) * M + j;
#pragma unroll
        for (int f = 0; f < kKeyFields; ++f)
          Kg[(c * kChunk + dd) * 4 + f] = j < M ? src[(int64_t)f * Dp * M] : pad_key_field(f);
      }
      __syncthreads();
      float qf[4], tf[4], tlf[4], xu[4];
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        const int d = d0 + part + 4 * tt;
        const bool on = gi < N && d < Dp;
        qf[tt] = on ? trows[((int64_t)kRowQ * Dp + d) * N + gi] : 0.0f;
        tf[tt] = on ? trows[((int64_t)kRowTan * Dp + d) * N + gi] : 0.0f;
        tlf[tt] = on ? trows[((int64_t)kRowTanLow * Dp + d) * N + gi] : 0.0f;
        xu[tt] = d < Dp ? x_per_u[d] : 0.0f;
      }
      for (int jj = 0; jj < nk; ++jj) {
        const float bj = brow[jj];
        if (bj == 0.0f) continue;  // P_ij = 0
        const float aj = arow[jj];
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          const float4 k4 = load4(Kg + (jj * kChunk + part + 4 * tt) * 4);
          float u;
          const float g = dlog_sinc_tables(qf[tt], tf[tt], tlf[tt], k4.x, k4.y, k4.z, k4.w, xu[tt], u);
          const float gu = g * u;
          const int t = 4 * c4 + tt;
          dq_a[t] = fmaf(aj, g, dq_a[t]);
          dq_b[t] = fmaf(bj, g, dq_b[t]);
          dr_a[t] = fmaf(aj, gu, dr_a[t]);
          dr_b[t] = fmaf(bj, gu, dr_b[t]);
        }
      }
    }
  }

  // Delta_i and c_i: over the 8 lanes of a warp row (lane & 7), then over the 2 warp columns.
#pragma unroll
  for (int ii = 0; ii < kMicro; ++ii) {
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      delta_part[ii] += __shfl_xor_sync(kFullMask, delta_part[ii], o);
      psum_part[ii] += __shfl_xor_sync(kFullMask, psum_part[ii], o);
    }
  }
  if ((lane & 7) == 0) {
#pragma unroll
    for (int ii = 0; ii < kMicro; ++ii) {
      float* slot = row_sums + ((warp & 1) * kFwdRows + ty * kMicro + ii) * 2;
      slot[0] = delta_part[ii];
      slot[1] = psum_part[ii];
    }
  }
  __syncthreads();
  const float psum = row_sums[gr * 2 + 1] + row_sums[(kFwdRows + gr) * 2 + 1];  // c_i; 0 without a gradient
  // m_i / c_i: P renormalised, times the real keys' share with the null key (null_key_share)
  const double L_row = gi < N ? p.lse_in[bh * N + gi] : (double)INFINITY;
  const double log_share = psum > 0.0f ? null_key_log_share(L_row, p.log_eps) : 0.0;
  const float inv_c = psum > 0.0f ? (float)exp(log_share) / psum : 0.0f;
  const float delta = (row_sums[gr * 2] + row_sums[(kFwdRows + gr) * 2]) * inv_c;
  if (gi < N) {
    if (part == 0) {
      p.delta[bh * N + gi] = delta;
      p.lse_bwd[bh * N + gi] = psum > 0.0f ? L_row + log((double)psum) - log_share : (double)INFINITY;
    }
    scalar_t* dq_i = p.dq + (bh * N + gi) * D;
#pragma unroll
    for (int t = 0; t < kF; ++t) {
      const int d = part + 4 * t;
      if (d < D) dq_i[d] = static_cast<scalar_t>(fabsf(p.radius[(int64_t)h * D + d]) * ((dq_a[t] - delta * dq_b[t]) * inv_c));
    }
  }
#pragma unroll
  for (int t = 0; t < kF; ++t) {
    const int d = part + 4 * t;
    const float dr = (dr_a[t] - delta * dr_b[t]) * inv_c;
    if (d < D && dr != 0.0f) atomicAdd(dr_sum + d, dr);
  }
  __syncthreads();
  for (int d = tid; d < D; d += kFwdThreads) {
    // sum over the block of p dS g u, u = c (q - k): dradius = sign(R) sum p dS g(|R| (q - k)) (q - k)
    const float R = p.radius[(int64_t)h * D + d];
    const float sum = x_per_u[d] == 0.0f ? 0.0f : dr_sum[d] * (x_per_u[d] / R);
    if (sum != 0.0f) atomicAdd(p.dradius + (int64_t)h * D + d, sum);
  }
}

// ---------------------------------------------------------------------------------------
// dk and dv. Grid: B * H * ceil(M / kFwdKeys) blocks of kFwdThreads (after the dq kernel).
// ---------------------------------------------------------------------------------------
template <typename scalar_t, int kF, int kO>
FF_GLOBAL void FF_LAUNCH_BOUNDS(kFwdThreads) backward_dkv_tiled_kernel(const Params<scalar_t, float> p) {
  static_assert(kF % 4 == 0 && 4 * kF <= kBwdMaxFeatures && kO % 4 == 0, "features and columns per thread");
  FF_DYNAMIC_SHARED(smem_raw);
  const int N = p.N, M = p.M, Dp = p.Dp, Dv = p.Dv, D = p.D;
  const int ostride = dkv_out_stride(Dv);
  float* region = reinterpret_cast<float*>(smem_raw);  // score chunks, then dO, then the g pass's query chunks
  float* Ot = region;                                  // (kFwdRows, ostride): dO of the query tile
  float* Qg = region;                                  // (kFwdRows, kChunk, 4)
  float* Vt = region + tiled_dkv_region_floats(Dv);     // (Dv, kFwdKeys): the block's v, transposed
  float* W = Vt + (int64_t)Dv * kFwdKeys;              // (kFwdKeys, kCoefStride): P f, [key][query]
  float* C = W + kFwdKeys * kCoefStride;               // (kFwdKeys, kCoefStride): p dS
  float* Lh = C + kFwdKeys * kCoefStride;              // (kFwdRows,) lse_bwd high part
  float* Ll = Lh + kFwdRows;                           // (kFwdRows,) low part
  float* Dl = Ll + kFwdRows;                           // (kFwdRows,) Delta / c

  const int tid = threadIdx.x;
  const int key_blocks = (M + kFwdKeys - 1) / kFwdKeys;
  const int64_t bh = blockIdx.x / key_blocks;
  const int j0 = (int)(blockIdx.x - bh * key_blocks) * kFwdKeys;
  const int h = (int)(bh % p.H);
  const int warp = tid >> 5, lane = tid & 31;
  const int tx = (warp & 1) * 8 + (lane & 7);
  const int ty = (warp >> 1) * 4 + (lane >> 3);
  const int gk = tid >> 2, part = tid & 3;  // dv and g pass: key gk
  const int gj = j0 + gk;

  const float* trows = p.trows + bh * kRowFields * Dp * N;
  const float* tkeys = p.tkeys + bh * kKeyFields * Dp * M;
  const float* x_per_u = p.x_per_u + (int64_t)h * Dp;
  const scalar_t* v = p.v + bh * M * Dv;
  const scalar_t* dout = p.dout + bh * N * Dv;

  for (int idx = tid; idx < Dv * kFwdKeys; idx += kFwdThreads) {
    const int c = idx / kFwdKeys, r = idx - c * kFwdKeys;
    const int j = j0 + r;
    Vt[idx] = j < M ? load_as<float>(v, (int64_t)j * Dv + c) : 0.0f;
  }
  float dk_acc[kF], dv_acc[kO];
#pragma unroll
  for (int t = 0; t < kF; ++t) dk_acc[t] = 0.0f;
#pragma unroll
  for (int t = 0; t < kO; ++t) dv_acc[t] = 0.0f;
  // Query i sees key j iff j <= i + (M - N): the block's first key bounds the first query.
  const int i_begin = p.causal ? ff_max(0, j0 - (M - N)) : 0;

  for (int i0 = i_begin; i0 < N; i0 += kFwdRows) {
    float S[kMicro][kMicro];
    tile_scores(p, bh, i0, j0, tx, ty, region, S);
    __syncthreads();  // the score chunks are consumed
    for (int idx = tid; idx < kFwdRows * Dv; idx += kFwdThreads) {
      const int r = idx / Dv, c = idx - r * Dv;
      const int i = i0 + r;
      Ot[r * ostride + c] = i < N ? load_as<float>(dout, (int64_t)i * Dv + c) : 0.0f;
    }
    for (int idx = tid; idx < kFwdRows * (ostride - Dv); idx += kFwdThreads) {  // padding columns: 0
      const int r = idx / (ostride - Dv), c = Dv + idx - r * (ostride - Dv);
      Ot[r * ostride + c] = 0.0f;
    }
    if (tid < kFwdRows) {
      const int i = i0 + tid;
      split_lse_or_inf(i < N ? p.lse_bwd[bh * N + i] : (double)INFINITY, Lh[tid], Ll[tid]);
      Dl[tid] = i < N ? p.delta[bh * N + i] : 0.0f;
    }
    __syncthreads();
    float dP[kMicro][kMicro];
#pragma unroll
    for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) dP[ii][jj] = 0.0f;
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
#pragma unroll
    for (int ii = 0; ii < kMicro; ++ii)
#pragma unroll
      for (int jj = 0; jj < kMicro; ++jj) {
        const int r = ty * kMicro + ii, i = i0 + r, j = j0 + tx * kMicro + jj;
        const float s = S[ii][jj];
        const float P = s == -ff_inf<float>() ? 0.0f : ff_exp((s - Lh[r]) - Ll[r]);
        float w = 0.0f, coef = 0.0f;
        if (P != 0.0f) {
          const float f = p.dropout_p > 0.0f ? dropout_factor(p, (uint32_t)bh, i, j) : 1.0f;
          w = P * f;
          coef = p.power * P * (dP[ii][jj] * f - Dl[r]);
        }
        W[(tx * kMicro + jj) * kCoefStride + r] = w;
        C[(tx * kMicro + jj) * kCoefStride + r] = coef;
      }
    __syncthreads();
    // dv: key gk, columns 16 t + 4 part + (0..3)
    const int nq = ff_min(kFwdRows, N - i0);
    const float* wrow = W + gk * kCoefStride;
    const float* crow = C + gk * kCoefStride;
    for (int ii = 0; ii < nq; ++ii) {
      const float w = wrow[ii];
      if (w == 0.0f) continue;
      const float* orow = Ot + ii * ostride + part * 4;
#pragma unroll
      for (int t = 0; t < kO / 4; ++t) {
        if (16 * t < Dv) {
          const float4 o4 = load4(orow + 16 * t);
          dv_acc[4 * t + 0] = fmaf(w, o4.x, dv_acc[4 * t + 0]);
          dv_acc[4 * t + 1] = fmaf(w, o4.y, dv_acc[4 * t + 1]);
          dv_acc[4 * t + 2] = fmaf(w, o4.z, dv_acc[4 * t + 2]);
          dv_acc[4 * t + 3] = fmaf(w, o4.w, dv_acc[4 * t + 3]);
        }
      }
    }
    // g pass: key gk, queries i0 .. i0 + nq, features part + 4 t
#pragma unroll
    for (int c4 = 0; c4 < kF / 4; ++c4) {
      const int d0 = c4 * kChunk;
      if (d0 >= Dp) break;  // (block-uniform)
      const int dc = ff_min(kChunk, Dp - d0);
      __syncthreads();  // dO or the previous query chunk is consumed
      for (int idx = tid; idx < dc * kFwdRows; idx += kFwdThreads) {
        const int r = idx & (kFwdRows - 1), dd = idx >> kFwdRowsLog2;
        const int i = i0 + r;
        const float* src = trows + (int64_t)(d0 + dd) * N + i;
#pragma unroll
        for (int f = 0; f < kRowFields; ++f) Qg[(r * kChunk + dd) * 4 + f] = i < N ? src[(int64_t)f * Dp * N] : 0.0f;
      }
      __syncthreads();
      float kf[4], Xf[4], Yf[4], Ylf[4], xu[4];
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
        const int d = d0 + part + 4 * tt;
        const bool on = gj < M && d < Dp;
        kf[tt] = on ? tkeys[((int64_t)kKeyK * Dp + d) * M + gj] : 1.0f;
        Xf[tt] = on ? tkeys[((int64_t)kKeyCos * Dp + d) * M + gj] : 1.0f;
        Yf[tt] = on ? tkeys[((int64_t)kKeySin * Dp + d) * M + gj] : -1.0f;
        Ylf[tt] = on ? tkeys[((int64_t)kKeySinLow * Dp + d) * M + gj] : 0.0f;
        xu[tt] = d < Dp ? x_per_u[d] : 0.0f;
      }
      for (int ii = 0; ii < nq; ++ii) {
        const float ci = crow[ii];
        if (ci == 0.0f) continue;
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          const float4 q4 = load4(Qg + (ii * kChunk + part + 4 * tt) * 4);
          float u;
          const float g = dlog_sinc_tables(q4.x, q4.y, q4.z, kf[tt], Xf[tt], Yf[tt], Ylf[tt], xu[tt], u);
          dk_acc[4 * c4 + tt] = fmaf(ci, g, dk_acc[4 * c4 + tt]);
        }
      }
    }
  }

  if (gj >= M) return;  // after the last __syncthreads
  scalar_t* dk_j = p.dk + (bh * M + gj) * D;
  scalar_t* dv_j = p.dv + (bh * M + gj) * Dv;
#pragma unroll
  for (int t = 0; t < kF; ++t) {
    const int d = part + 4 * t;
    if (d < D) dk_j[d] = static_cast<scalar_t>(-fabsf(p.radius[(int64_t)h * D + d]) * dk_acc[t]);
  }
#pragma unroll
  for (int t = 0; t < kO / 4; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = 16 * t + 4 * part + e;
      if (c < Dv) dv_j[c] = static_cast<scalar_t>(dv_acc[4 * t + e]);
    }
}

}  // namespace cuda
}  // namespace fourierformer
