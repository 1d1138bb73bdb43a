// The CUDA backend of the `fourierformer` ops: registers the kernels of
// fourier_attention_kernels.cuh for the CUDA dispatch key. Semantics are those of the CPU
// backend (../cpu/fourier_attention_cpu.cpp); see fourier_attention_launch.h for the host
// side, fourier_attention_kernels.cuh for how the kernels are organised and cuda_launcher.cuh
// for the launches (compiled per dtype in launch_<dtype>.cu).
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cuda_launcher.cuh"

// instantiated in launch_<dtype>.cu, one translation unit per dtype
FF_CUDA_LAUNCH_INSTANCES(extern template, float, float)
FF_CUDA_LAUNCH_INSTANCES(extern template, at::Half, float)
FF_CUDA_LAUNCH_INSTANCES(extern template, at::BFloat16, float)
FF_CUDA_LAUNCH_INSTANCES(extern template, double, double)

namespace fourierformer {
namespace cuda {
namespace {

void check_on_cuda(const at::Tensor& q) {
  TORCH_CHECK(q.is_cuda(), "fourier_attention (cuda): q must be a CUDA tensor, got ", q.device());
}

}  // namespace

at::Tensor fourier_attention_tables_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& radius) {
  check_on_cuda(q);
  const c10::cuda::CUDAGuard guard(q.device());
  return tables_impl(q, k, radius, current_launcher());
}

std::tuple<at::Tensor, at::Tensor> fourier_attention_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi) {
  check_on_cuda(q);
  check_phi(phi, power, false);
  const c10::cuda::CUDAGuard guard(q.device());
  return forward_impl(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed, normaliser_eps, tables,
                      current_launcher(), phi);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fourier_attention_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& radius, const at::Tensor& out, const at::Tensor& lse, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi, const std::optional<at::Tensor>& weights) {
  check_on_cuda(q);
  check_phi(phi, power, false);
  check_no_kept_weights(weights);
  const c10::cuda::CUDAGuard guard(q.device());
  return backward_impl(grad_out, q, k, v, radius, out, lse, power, attn_mask, key_bias, causal, dropout_p, seed,
                       normaliser_eps, tables, current_launcher(), phi);
}

TORCH_LIBRARY_IMPL(fourierformer, CUDA, m) {
  m.impl("fourier_attention_tables", &fourier_attention_tables_cuda);
  m.impl("fourier_attention_forward", &fourier_attention_forward_cuda);
  m.impl("fourier_attention_backward", &fourier_attention_backward_cuda);
}

}  // namespace cuda
}  // namespace fourierformer
