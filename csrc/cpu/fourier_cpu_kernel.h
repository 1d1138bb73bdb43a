// Per-(batch, head) float32 kernels of the fused CPU backend.
//
// fourier_cpu_kernel.inc holds one implementation written with GCC vector extensions (in
// parts: vec.inc, sinc_tables.inc, masks_dropout.inc, forward.inc, backward.inc); it is
// compiled once per instruction set (kernel_avx512.cpp, kernel_avx2.cpp, kernel_generic.cpp)
// and isa_dispatch.cpp picks one at run time (best_kernels).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../backend_limits.h"

namespace fourierformer {
namespace cpu {

constexpr int64_t kKeyTableKeys = limits::kCpuKeyTableKeys;
// The least room of a key table for M keys: M rounded up to a whole number of kKeyTableKeys.
constexpr int64_t key_table_width(int64_t M) { return (M + kKeyTableKeys - 1) / kKeyTableKeys * kKeyTableKeys; }

// One (b, h) slice. Rows are contiguous: q (N, D), k (M, D), v (M, Dv). The kernels build
// their own tables (sin and cos of R q and R k, transposed keys and values) in the workspace.
struct SliceArgs {
  const float* q;
  // nullptr where a key table is given and the slice has fewer than KernelTable::short_query_rows
  // rows: the short-query forward reads the keys from the table alone, so the op leaves k
  // uncopied (incremental decoding passes a strided view of its kept table as k).
  const float* k;
  const float* v;
  const float* radius;  // (D,)
  int64_t N, M, D, Dv;
  float power;
  bool relu;  // phi = ReLU (power 1): a key with a factor whose sinc is negative has weight 0
  bool sigmoid;  // phi = sigmoid (power 1): S = sum_d log sigmoid(sinc x), in the log domain
  // phi(x) = x^p with odd p: each weight carries its product's sign, and a row is normalised by
  // the signed sum of its weights plus eps (the kernel applies the null key itself; lse is
  // log|sum_j w_ij|, -inf where that sum is 0). See FactorSign in sinc_tables.inc.
  bool odd_power;
  // Additive mask element (i, j) at attn_mask[i * mask_row_stride + j]; nullptr if none.
  const float* attn_mask;
  int64_t mask_row_stride;
  const float* key_bias;  // (M,) additive, nullptr if none
  // Whether attn_mask and key_bias (those given) are 0 / -inf only (they came as bool masks), so
  // that weights are kept or zeroed and need no exp; known from the masks' dtype, not their values.
  bool masks_select;
  bool causal;  // key j visible to query i iff j <= i + (M - N)
  float dropout_p;        // 0 disables dropout
  uint32_t seed;
  uint32_t bh;  // b * H + h, the dropout counter
  double log_eps;  // log of the normaliser's eps, -inf for 0 (null_key_share in fourier_element_math.h)
  // The caller's key table of this slice (limits::kCpuKeyTableKeys): key j's feature d at
  // key_table[d * key_table_stride + j]; nullptr if none (the short forward then transposes k).
  const float* key_table;
  int64_t key_table_stride;
  // Kept weights: row i's normalised weights P_ij = w_ij / |sum_j w_ij| at weights[i * weights_stride + j]
  // (weights_stride: a multiple of kKeyTableKeys, at least M), 0 past the row's visible keys and in
  // rows with none; nullptr if none. The forward writes them where given, taking the row groups
  // whatever its rows (the short-query forward keeps none), never with dropout (they are the
  // weights before it); the backward then reads them in place of recomputing its products.
  float* weights;
  int64_t weights_stride;
};

struct KernelTable {
  const char* isa;
  // Forward calls of fewer query rows take the short-query path (forward_short.inc), which reads
  // the keys from a key table alone when one is given.
  int64_t short_query_rows;
  // Floats of scratch memory one slice needs: its tables, O((N + M) D), and a few rows of M
  // (no N x M term).
  size_t (*forward_workspace)(int64_t N, int64_t M, int64_t D, int64_t Dv);
  size_t (*backward_workspace)(int64_t N, int64_t M, int64_t D, int64_t Dv);
  // out (N, Dv), lse (N,): log of the softmax normaliser (of its magnitude for odd p), +inf for
  // fully masked rows. lse is
  // float64: it can be of order 1e3 (p times a sum of D logs) while the backward needs it to
  // float32 accuracy relative to 1, and a float32 lse would carry an error of ulp(1e3) / 2.
  void (*forward)(const SliceArgs&, float* out, double* lse, float* workspace);
  // dq (N, D), dk (M, D), dv (M, Dv) are written; dradius (D,) is written (this slice's share).
  // out is not read: the kernels sum Delta_i = dO_i . O_i from the weights they recompute.
  void (*backward)(const SliceArgs&, const float* out, const double* lse, const float* dout, float* dq, float* dk,
                   float* dv, float* dradius, float* workspace);
};

namespace avx512 {
extern const KernelTable kKernels;
}
namespace avx2 {
extern const KernelTable kKernels;
}
namespace generic {
extern const KernelTable kKernels;
}

// The kernels for the best instruction set of this CPU, or for the one named by the
// environment variable FOURIERFORMER_CPU_ISA (isa_dispatch.cpp).
const KernelTable& best_kernels();

}  // namespace cpu
}  // namespace fourierformer
