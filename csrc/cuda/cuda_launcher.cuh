// The real launches of the CUDA backend, and their instances one translation unit per dtype.
//
// fourier_attention_launch.h is written against a Launcher; CudaLauncher launches on the
// current stream. Each dtype's launches (and with them every kernel of that dtype) are
// instantiated in a file of their own (launch_<dtype>.cu), so a build compiles the kernels
// of the four dtypes in parallel; fourier_attention_cuda.cu, which registers the ops, only
// declares them (FF_CUDA_LAUNCH_INSTANCES(extern template, ...)).
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <cstdlib>

#include "fourier_attention_launch.h"

namespace fourierformer {
namespace cuda {

// The current device's memory free now: the driver's, and what torch's caching allocator holds
// reserved but unallocated (which it hands out before it asks the driver for more).
inline int64_t free_device_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  int64_t cached = 0;
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    // (index 0: StatType::AGGREGATE, every pool)
    cached = stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
  } catch (const c10::Error&) {  // an allocator backend that keeps no such statistics: the driver's alone
  }
  return (int64_t)free_bytes + std::max<int64_t>(cached, 0);
}

// Launches on the current stream of q's device; raises the dynamic shared memory limit
// of a kernel when it needs more than the default 48 KiB (head dims above ~96), and then asks
// for the largest shared memory carveout, so that the blocks the launch bounds allow fit on an
// SM at once (the D 128 main pass: two blocks of 99 KiB, about 200 KiB of the 228 KiB an sm_90 SM
// can give; the driver's default split may leave room for one).
struct CudaLauncher {
  cudaStream_t stream;
  size_t smem_optin;
  int sm_count = 1;                               // for the grid of the backward's main pass
  size_t smem_per_sm = 0;
  int max_grid_splits = kMaxMainSplits;           // the backward's splits of a small grid, at most

  // the backward's score cache budget (score_cache.h), from the memory free at the call
  int64_t score_cache_budget() const { return score_cache_budget_now(free_device_memory); }

  template <typename scalar_t, typename acc_t>
  void operator()(void (*kernel)(Params<scalar_t, acc_t>), int64_t blocks, int threads, size_t smem_bytes,
                  const Params<scalar_t, acc_t>& p) const {
    if (blocks <= 0) return;
    TORCH_CHECK(smem_bytes <= smem_optin, "fourier_attention (cuda): head dims D = ", p.D, ", Dv = ", p.Dv,
                " need ", smem_bytes, " bytes of shared memory per block, this GPU allows ", smem_optin);
    if (smem_bytes > 48 * 1024) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
      C10_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                          cudaFuncAttributePreferredSharedMemoryCarveout,
                                          (int)cudaSharedmemCarveoutMaxShared));
    }
    kernel<<<(unsigned)blocks, (unsigned)threads, smem_bytes, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

// The backward's splits where its grid is small (delta_pass_split, main_pass_splits), at most:
// kMaxMainSplits, or FOURIERFORMER_GRID_SPLITS within 1 (none) .. kMaxMainSplits.
inline int grid_splits_budget() {
  const char* env = std::getenv("FOURIERFORMER_GRID_SPLITS");
  const long splits = env && *env ? std::strtol(env, nullptr, 10) : kMaxMainSplits;
  return splits < 1 ? 1 : splits > kMaxMainSplits ? kMaxMainSplits : (int)splits;
}

inline CudaLauncher current_launcher() {
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  return CudaLauncher{at::cuda::getCurrentCUDAStream().stream(), (size_t)prop->sharedMemPerBlockOptin,
                      prop->multiProcessorCount, (size_t)prop->sharedMemPerMultiprocessor, grid_splits_budget()};
}

}  // namespace cuda
}  // namespace fourierformer

// The forward and backward launches of one (input, accumulation) dtype pair with CudaLauncher:
// `template` instantiates them (in launch_<dtype>.cu), `extern template` declares them.
#define FF_CUDA_LAUNCH_INSTANCES(KIND, SCALAR, ACC)                                                              \
  namespace fourierformer {                                                                                      \
  namespace cuda {                                                                                               \
  KIND void launch_forward<SCALAR, ACC, CudaLauncher>(const AttentionShape&, Params<SCALAR, ACC>&,               \
                                                      const at::TensorOptions&, const CudaLauncher&,             \
                                                      const at::Tensor&);                                        \
  KIND void launch_backward<SCALAR, ACC, CudaLauncher>(const AttentionShape&, Params<SCALAR, ACC>&,              \
                                                       const at::TensorOptions&, const CudaLauncher&,            \
                                                       const at::Tensor&);                                       \
  }                                                                                                              \
  }
