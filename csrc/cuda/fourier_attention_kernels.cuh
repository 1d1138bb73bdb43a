// CUDA kernels of Fourier integral attention (device code only, no ATen).
//
// Flash-attention style: scores are recomputed tile by tile and no N x M tensor is ever
// stored. Two paths, by accumulation type:
//
// float32 path (float32, float16, bfloat16 inputs, converted to float32 when staged):
//   tables.cuh          per call, 8 threads per query / key row: q c, tan(|R| q) and k c,
//                       cos(|R| k), cos(|R| k) tan(|R| k) as float pairs, the row and key
//                       constants (float64 sin / cos, once per row and feature).
//   forward_tiled.cuh   64 queries x 64 keys per step, 4 x 4 register tiles per thread (for
//                       Dv > 64 two halves of the block split the features): an FMA-only element
//                       step (no sin, cos or branch; the renormalisation in the exponent bits),
//                       the rare exact path for |x| < 2^-14, online softmax
//                       in log2 units (ex2.approx) and P V with 4 (8) threads per row.
//   forward_decode.cuh  calls of at most kDecodeMaxRows query rows (decoding): a block per chunk
//                       of kDecKeys keys and every row of a (batch, head) slice, one key per
//                       thread, the tiled
//                       forward's element step and scores; the chunks' (max, sum, P V) partials
//                       merged by a second kernel with the log-sum-exp rule.
//   backward_tiled.cuh  a pre-pass (Delta and c from its own P), then a key-stationary main pass
//                       on the same score tiles that computes g(x) once per element from the
//                       tables and feeds dk, dv and dq, and a small kernel that writes dq;
//                       dradius from dq and dk. Their instructions per element in the sm_90
//                       SASS: scripts/benchmarks/cuda_sass_report.py (history: docs/records/speed.md).
//   Head dims above 128 take the simple backward below.
//
// Simple path (float64, and the float32 backward for D > 128): every warp owns one row (a
// query in the forward and dq kernels, a key in the dk/dv kernel), lanes over 32 rows of the
// other side staged in shared memory, the element math per element:
//   forward_simple.cuh  (warp per query)  lanes over 32 keys: S_ij, online softmax; lanes over
//                       Dv: sum_j p_ij v_j (p by shuffle).
//   backward.cuh        dq (warp per query: P_ij, dP_ij, Delta_i from its own P; lanes over d:
//                       dq_id and dradius) and dk/dv (warp per key).
//
// Every path runs each phi of the ops the CUDA backend declares (limits::kCudaPhis): the float32
// path's kernels by instance (template argument Phi, common.cuh; phi = sigmoid's sum of log
// sigmoid(sinc x) per element: forward_tiled.cuh), the simple kernels by Params::phi.
//
// The element math (Taylor branches, clamps, dropout hash) is the one of
// ../fourier_element_math.h. float32 needs two things of its own (common.cuh), so that the
// results do not depend on how sinf / logf are compiled (--use_fast_math, which a build may add,
// turns them into the approximate hardware intrinsics, useless for sin of large arguments, where
// sinc has its zeros):
//   * ff_sincosf: Cody-Waite reduction by pi/2 with three fma steps plus the Cephes minimax
//     polynomials (about 1 ulp for |x| <= 65536; larger |x| goes through double sincos), used by
//     the rare path and the simple float32 backward;
//   * log of the product over d of |sin x| / |x| kept as mantissa and exponent (as the CPU
//     kernel does): one accurate log per (i, j) instead of one per (i, j, d).
//
// FF_HOST_EMULATION compiles the same kernels as ordinary C++ for the host emulator in
// emulation/ (one OS thread per CUDA thread), which is how they were checked without a GPU.
#pragma once

#include "common.cuh"
#include "forward_simple.cuh"
#include "forward_tiled.cuh"
#include "forward_decode.cuh"
#include "tables.cuh"
#include "backward.cuh"
#include "backward_tiled.cuh"
