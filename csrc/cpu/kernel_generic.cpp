// The CPU kernels compiled for generic; see fourier_cpu_kernel.inc.
// Headers come before the target pragma so that nothing they define carries its flags.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../fourier_element_math.h"
#include "fourier_cpu_kernel.h"


#pragma GCC push_options
// Baseline x86-64 (or any other architecture): no target pragma.

namespace fourierformer {
namespace cpu {
namespace generic {

#define FF_LANES 4
#include "fourier_cpu_kernel.inc"
#undef FF_LANES

extern const KernelTable kKernels = {"generic", kShortQueryRows, forward_workspace, backward_workspace, forward_slice, backward_slice};

}  // namespace generic
}  // namespace cpu
}  // namespace fourierformer

#pragma GCC pop_options

