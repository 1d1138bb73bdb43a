// The float32 backward's score cache (backward_tiled.cuh): its size and the budget it must fit,
// host-safe so that the kernels, the launchers (fourier_attention_launch.h, cuda_launcher.cuh, the
// host emulator) and the op library (Python's `_C.score_cache_budget` and `_C.score_cache_bytes`)
// share one definition.
//
// The pre-pass keeps its scores (log2 units, masks and rare path included: the main pass's P must
// be the pre-pass's, bit for bit) for the main pass, which then reads them instead of computing
// them again (its score loop, for 8 bytes of memory traffic per (query, key) pair), where they
// fit the budget; beyond, the main pass computes them again. Either way the
// same P, so the same results (dk and dv bit for bit, dq and dradius to their float atomics'
// order), unless the grid is small: there only the cached backward splits its work
// (delta_pass_split, main_pass_splits), which rounds otherwise.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "../fourier_element_math.h"

namespace fourierformer {
namespace cuda {

// Floats per cached row of scores: M rounded up to a multiple of 4 (float4 rows).
FF_HD int64_t score_cache_stride(int64_t M) { return (M + 3) & ~int64_t(3); }

// Bytes of the cache for a call: B H N rows of score_cache_stride(M) floats.
FF_HD int64_t score_cache_bytes(int64_t BH, int64_t N, int64_t M) {
  return BH * N * score_cache_stride(M) * (int64_t)sizeof(float);
}

// Phi::kOdd (phi(x) = x^p, odd p): the cached scores' signs after the scores, a byte per 4 keys of a
// row (bit jj for key 4 c + jj of byte c), B H N rows of score_cache_stride(M) / 4 bytes.
FF_HD int64_t score_sign_bytes(int64_t BH, int64_t N, int64_t M) { return BH * N * (score_cache_stride(M) / 4); }

// The budget is this fraction of the device memory free at the backward's call (the driver's
// free memory and what torch's caching allocator holds unused): the cache lives only during the
// call, and the rest stays for whatever else runs then.
constexpr int64_t kScoreCacheFreeShareDenominator = 4;  // a quarter

// The budget in bytes for `free_bytes` of free device memory and `setting`, the value of
// FOURIERFORMER_SCORE_CACHE_MB (null or empty: unset), which overrides the free memory: a whole
// number of MiB (0: no cache). -1 for a setting that is not such a number.
inline int64_t score_cache_budget(int64_t free_bytes, const char* setting) {
  if (setting == nullptr || *setting == '\0') return free_bytes > 0 ? free_bytes / kScoreCacheFreeShareDenominator : 0;
  char* end = nullptr;
  const long long mib = std::strtoll(setting, &end, 10);
  if (end == setting || *end != '\0' || mib < 0 || mib > (INT64_MAX >> 20)) return -1;
  return (int64_t)mib << 20;
}

}  // namespace cuda
}  // namespace fourierformer
