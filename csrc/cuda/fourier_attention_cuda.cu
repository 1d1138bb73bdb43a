// The CUDA backend of the `fourierformer` ops: registers the kernels of
// fourier_attention_kernels.cuh for the CUDA dispatch key. Semantics are those of the CPU
// backend (../cpu/fourier_attention_cpu.cpp); see fourier_attention_launch.h for the host
// side and fourier_attention_kernels.cuh for how the kernels are organised.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "fourier_attention_launch.h"

namespace fourierformer {
namespace cuda {
namespace {

// Launches on the current stream of q's device; raises the dynamic shared memory limit
// of a kernel when it needs more than the default 48 KiB (head dims above ~96).
struct CudaLauncher {
  cudaStream_t stream;
  size_t smem_optin;

  template <typename scalar_t, typename acc_t>
  void operator()(void (*kernel)(Params<scalar_t, acc_t>), int64_t blocks, int threads, size_t smem_bytes,
                  const Params<scalar_t, acc_t>& p) const {
    if (blocks <= 0) return;
    TORCH_CHECK(smem_bytes <= smem_optin, "fourier_attention (cuda): head dims D = ", p.D, ", Dv = ", p.Dv,
                " need ", smem_bytes, " bytes of shared memory per block, this GPU allows ", smem_optin);
    if (smem_bytes > 48 * 1024) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    }
    kernel<<<(unsigned)blocks, (unsigned)threads, smem_bytes, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

CudaLauncher current_launcher() {
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  return CudaLauncher{at::cuda::getCurrentCUDAStream().stream(), (size_t)prop->sharedMemPerBlockOptin};
}

void check_on_cuda(const at::Tensor& q) {
  TORCH_CHECK(q.is_cuda(), "fourier_attention (cuda): q must be a CUDA tensor, got ", q.device());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fourier_attention_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps) {
  check_on_cuda(q);
  const c10::cuda::CUDAGuard guard(q.device());
  return forward_impl(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed, normaliser_eps,
                      current_launcher());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fourier_attention_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& radius, const at::Tensor& out, const at::Tensor& lse, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps) {
  check_on_cuda(q);
  const c10::cuda::CUDAGuard guard(q.device());
  return backward_impl(grad_out, q, k, v, radius, out, lse, power, attn_mask, key_bias, causal, dropout_p, seed,
                       normaliser_eps, current_launcher());
}

TORCH_LIBRARY_IMPL(fourierformer, CUDA, m) {
  m.impl("fourier_attention_forward", &fourier_attention_forward_cuda);
  m.impl("fourier_attention_backward", &fourier_attention_backward_cuda);
}

}  // namespace cuda
}  // namespace fourierformer
