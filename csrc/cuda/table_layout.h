// The layout of the float32 path's tables (built by table_kernel, tables.cuh), host-safe so that
// the op library (../fourier_attention_ops.cpp: fourier_attention_tables, the size checks and
// Python's `_C.cuda_table_floats`) and the kernels share one definition.
#pragma once

#include <cstdint>

#include "../fourier_element_math.h"

namespace fourierformer {
namespace cuda {

enum TableRowField : int { kRowQ = 0, kRowTan, kRowTanLow, kRowFields };
enum TableKeyField : int { kKeyK = 0, kKeyCos, kKeySin, kKeySinLow, kKeyFields };
// The products over the features are renormalised every kRenormEvery features (see
// forward_tiled.cuh); the tables pad D to a multiple of it with flat features.
constexpr int kRenormEvery = 8;

// The kernels read the tables as float4 (the staging of forward_tiled.cuh and backward_tiled.cuh
// where N and M are multiples of 4): they must start on this boundary, in bytes (checked_tables
// copies a view that does not; the offsets inside are multiples of 4 floats there).
constexpr int64_t kTableAlignBytes = 16;

// (at least one group: the score loop's first group always runs)
FF_HD int padded_features(int D) { return D < 1 ? kRenormEvery : (D + kRenormEvery - 1) / kRenormEvery * kRenormEvery; }

// Floats of the tables for a call (see Params): per (batch, head) slice the query rows' fields
// (kRowFields, Dp, N), the keys' (kKeyFields, Dp, M), row_log as two floats (2, N), key_log (M);
// then x_per_u (H, Dp).
FF_HD int64_t table_floats(int64_t BH, int64_t H, int64_t N, int64_t M, int64_t Dp) {
  return BH * (kRowFields * Dp * N + kKeyFields * Dp * M + 2 * N + M) + H * Dp;
}

}  // namespace cuda
}  // namespace fourierformer
