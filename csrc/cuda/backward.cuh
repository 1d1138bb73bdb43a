// Backward kernels (dq + dradius + Delta, then dk/dv). See fourier_attention_kernels.cuh.
#pragma once

#include "common.cuh"

namespace fourierformer {
namespace cuda {

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
// was several times the float32 reference's error at D 128 on a GPU (the case: docs/kernels.md,
// "The CUDA kernels"). One sweep suffices: dS is linear in Delta, so
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

  // Per d = lane + 32 t, with a_j = p P_ij f_ij dP_ij, b_j = p P_ij, g_j = g(R_d (q_id - k_jd)) (phi_dlog:
  // the derivative of the call's phi):
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
      bool negative;  // (Phi::kOdd: P's sign)
      acc_t s = phi_signed_score(p, qrow, 1, Ks + lane, kTileStride, Rs, D, negative);
      if (mask_row) s += mask_row[j];
      if (kbias) s += kbias[j];
      acc_t P = s == -ff_inf<acc_t>() ? acc_t(0) : ff_exp((s - L_high) - L_low);
      if (negative) P = -P;
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
          const acc_t gj = phi_dlog(p, Rs[d] * diff);
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
  // m_i / c_i: P renormalised, times the real keys' share with the null key (null_key_share);
  // Phi::kOdd: P / (c_i + eps e^-lse_i) (signed P and c_i; signed_row_scale), its sign for the
  // dk/dv kernel in p.row_sign
  const bool odd = p.phi == Phi::kOdd;
  const double log_share = live && !odd ? null_key_log_share(L, p.log_eps) : 0.0;
  const double odd_scale = live && odd ? signed_row_scale((double)psum, L, p.log_eps) : 0.0;
  const acc_t inv_c = odd ? (acc_t)odd_scale : psum > acc_t(0) ? acc_t(exp(log_share)) / psum : acc_t(0);
  const acc_t delta = warp_sum(delta_lane) * inv_c;  // sum_j (P_ij / c_i) f_ij dP_ij
  if (active && lane == 0) {  // for the dk/dv kernel
    p.delta[bh * N + i] = delta;
    if (odd) {
      p.lse_bwd[bh * N + i] = live ? L - log(fabs(odd_scale)) : (double)INFINITY;
      p.row_sign[bh * N + i] = odd_scale < 0.0 ? acc_t(-1) : acc_t(1);
    } else {
      p.lse_bwd[bh * N + i] = psum > acc_t(0) ? L + log((double)psum) - log_share : (double)INFINITY;
    }
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
      bool negative;  // (Phi::kOdd: the sign of the pair's product, times the row's p.row_sign)
      acc_t s = phi_signed_score(p, Qs + lane, kTileStride, krow, 1, Rs, D, negative);
      if (mask_bh) s += mask_bh[(int64_t)i * p.mask_row + j];
      s += kbias_j;
      acc_t P = s == -INF ? acc_t(0) : ff_exp((s - L) - Ls_low[lane]);
      if (p.phi == Phi::kOdd) P *= negative ? -p.row_sign[bh * N + i] : p.row_sign[bh * N + i];
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
          if (d < D) dk_acc[t] += ci * phi_dlog(p, Rs[d] * (Qs[d * kTileStride + ii] - krow[d]));
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
