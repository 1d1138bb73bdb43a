// Which float32 kernel variant (instruction set) the CPU backend runs: chosen once per
// process from what this CPU supports (see fourier_cpu_kernel.h for the variants).
#include <cstdlib>
#include <cstring>

#include "../fourier_attention.h"
#include "fourier_cpu_kernel.h"

namespace fourierformer {
namespace cpu {

// The kernels for the best instruction set of this CPU, or for the one named by the
// environment variable FOURIERFORMER_CPU_ISA (avx512, avx2 or generic) when this CPU has it,
// so that every variant can be tested on one machine. Chosen once per process.
const KernelTable& best_kernels() {
  static const KernelTable* table = [] {
    const KernelTable* supported[3];
    int n = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
      supported[n++] = &avx512::kKernels;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) supported[n++] = &avx2::kKernels;
#endif
    supported[n++] = &generic::kKernels;
    const char* wanted = std::getenv("FOURIERFORMER_CPU_ISA");
    if (wanted != nullptr)
      for (int i = 0; i < n; ++i)
        if (std::strcmp(wanted, supported[i]->isa) == 0) return supported[i];
    return supported[0];
  }();
  return *table;
}

}  // namespace cpu

const char* cpu_kernel_isa() { return cpu::best_kernels().isa; }

}  // namespace fourierformer
