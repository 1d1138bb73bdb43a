// What each fused backend accepts, declared once.
//
// The C++ checks (check_forward_inputs, the CPU and CUDA entry points) read these, the
// kernels size their buffers with them, and the extension exports them to Python as
// `fourierformer_fairseq._C.backend_limits` (fourier_attention_ops.cpp), from which
// fourierformer_fairseq/ops/backends.py builds each backend's declaration. No ATen here:
// the CUDA kernels (device code) include this header too.
#pragma once

#include <climits>
#include <cstdint>

namespace fourierformer {
namespace limits {

// p of phi(x) = x^p, per backend: p must be a multiple of k*PowerMultiple and at least
// k*MinPower (fused_power_rule(), fourier_attention_ops.cpp, says it in words). The kernels work in
// the log domain, p log|sinc|: an even p's weights are never negative. The CPU kernels take odd p
// too: each weight's sign (the sign of its product of sincs) goes beside its log-magnitude and the
// signed weights are normalised directly, w_ij / (sum_j w_ij + eps), as the reference defines them
// (docs/kernels.md); so do the CUDA kernels (their Phi::kOdd instances).
constexpr double kCpuMinPower = 1.0;
constexpr double kCpuPowerMultiple = 1.0;
constexpr double kCudaMinPower = 1.0;
constexpr double kCudaPowerMultiple = 1.0;

// The phis of the op (fourier_attention's phi, the ops' argument phi) each fused backend runs:
// "power" with the rule on p above; "abs", phi(x) = |x|, the log domain with p = 1
// (log |sinc|), "relu", the same with a zero weight wherever a factor's sinc is negative, and
// "sigmoid", sum_d log sigmoid(sinc), all taken with power kUnitPower. The other phis run on the
// reference backend.
constexpr const char* kCpuPhis[] = {"power", "abs", "relu", "sigmoid"};
constexpr const char* kCudaPhis[] = {"power", "abs", "relu", "sigmoid"};
constexpr double kUnitPower = 1.0;

// Input dtypes, named as torch names them. The CPU kernels are float32 (vectorised) and
// float64 (scalar loops); the CUDA kernels are instantiated by AT_DISPATCH_FLOATING_TYPES_AND2
// (kHalf, kBFloat16) in cuda/fourier_attention_launch.h, i.e. for these four.
constexpr const char* kCpuDtypes[] = {"float32", "float64"};
constexpr const char* kCudaDtypes[] = {"float32", "float16", "bfloat16", "float64"};

// Largest head dim (D and Dv) of the CUDA kernels: a lane keeps kCudaMaxHeadDim / 32
// accumulators in registers. The CPU kernels have no such limit.
constexpr int kCudaMaxHeadDim = 256;

// Largest D and Dv of the CUDA tiled backward (float32, float16, bfloat16: the one that reads the
// tables of fourier_attention_tables); larger head dims take the simple kernels.
constexpr int kCudaTiledBackwardMaxHeadDim = 128;

// The CPU backend's key table (what fourier_attention_tables returns for float32 on the CPU,
// and what incremental decoding keeps between steps): the keys alone, transposed,
// (B, H, D, Mt) float32 with key j's feature d at [b, h, d, j]; Mt, the table's room for keys,
// is a multiple of this (a whole number of every instruction set's vectors) and at least M.
constexpr int64_t kCpuKeyTableKeys = 16;

// The CUDA kernels index rows with int: sequence lengths N and M must be below this.
constexpr int64_t kCudaSeqLenBound = INT_MAX / 2;

}  // namespace limits
}  // namespace fourierformer
