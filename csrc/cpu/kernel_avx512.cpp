// The CPU kernels compiled for avx512; see fourier_cpu_kernel.inc.
// Headers come before the target pragma so that nothing they define carries its flags.
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "../fourier_element_math.h"
#include "fourier_cpu_kernel.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,bmi2")

namespace fourierformer {
namespace cpu {
namespace avx512 {

#define FF_KERNEL_AVX512 1
#define FF_LANES 16
#include "fourier_cpu_kernel.inc"
#undef FF_LANES
#undef FF_KERNEL_AVX512

extern const KernelTable kKernels = {"avx512", kShortQueryRows, forward_workspace, backward_workspace, forward_slice, backward_slice};

}  // namespace avx512
}  // namespace cpu
}  // namespace fourierformer

#pragma GCC pop_options
#endif
