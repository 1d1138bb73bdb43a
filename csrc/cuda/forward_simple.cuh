// Forward of the simple path (warp per query row, one key per lane): float64.
// See fourier_attention_kernels.cuh for the overview.
#pragma once

#include "common.cuh"

namespace fourierformer {
namespace cuda {

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
    bool negative = false;  // (Phi::kOdd: the weight's sign, phi_signed_score)
    if (j < end_i) {
      s = phi_signed_score(p, qrow, 1, Ks + lane, kTileStride, Rs, D, negative);
      if (mask_row) s += mask_row[j];
      if (kbias) s += kbias[j];
    }
    const acc_t tile_max = warp_max(s);
    const acc_t m_new = tile_max > m_run ? tile_max : m_run;
    if (!(m_new > NEG_INF)) continue;  // nothing visible yet (warp-uniform)
    const acc_t scale = ff_exp(m_run - m_new);  // 0 while m_run is -inf
    acc_t e = ff_exp(s - m_new);                // 0 for masked keys
    if (negative) e = -e;                       // (kOdd: signed weights, a signed sum)
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
  const bool odd = p.phi == Phi::kOdd;    // (by the signed sum plus eps: signed_row_scale)
  const acc_t inv = empty ? acc_t(0) : (odd ? (acc_t)signed_row_scale((double)l, (double)m_run, p.log_eps) : acc_t(1) / l);
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int c = lane + 32 * t;
    if (c < Dv) out_i[c] = static_cast<scalar_t>(empty ? acc_t(0) : acc[t] * inv);
  }
  if (lane == 0) p.lse[bh * N + i] = empty ? (double)INFINITY : (double)m_run + log(odd ? fabs((double)l) : (double)l);
}


}  // namespace cuda
}  // namespace fourierformer
