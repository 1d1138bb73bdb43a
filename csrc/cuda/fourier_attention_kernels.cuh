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

#include "common.cuh"
#include "forward_simple.cuh"
#include "forward_tiled.cuh"
#include "tables.cuh"
#include "backward.cuh"
#include "backward_tiled.cuh"
