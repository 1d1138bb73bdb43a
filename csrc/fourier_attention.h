// Host-side declarations shared by the op registration, the CPU and the CUDA backends.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace fourierformer {

// Shapes of one call, after validation.
struct AttentionShape {
  int64_t B, H, N, M, D, Dv;
};

// Checks q (B,H,N,D), k (B,H,M,D), v (B,H,M,Dv), radius (H,D), attn_mask (B|1,H|1,N,M),
// key_bias (B,M) and the scalars; raises a c10::Error that names the offending argument.
AttentionShape check_forward_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& radius, double power,
                                    const std::optional<at::Tensor>& attn_mask,
                                    const std::optional<at::Tensor>& key_bias, bool causal, double dropout_p);

// The mask as the kernels read it: last dim contiguous, in the accumulation dtype.
at::Tensor prepare_mask(const at::Tensor& mask, at::ScalarType dtype);

// Element offset of slice (b, h) in a (B|1, H|1, N, M) mask (broadcast dims have offset 0).
inline int64_t mask_slice_offset(const at::Tensor& mask, int64_t b, int64_t h) {
  return (mask.size(0) == 1 ? 0 : b * mask.stride(0)) + (mask.size(1) == 1 ? 0 : h * mask.stride(1));
}

std::tuple<at::Tensor, at::Tensor> fourier_attention_forward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fourier_attention_backward_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius,
    const at::Tensor& out, const at::Tensor& lse, double power, const std::optional<at::Tensor>& attn_mask,
    const std::optional<at::Tensor>& key_bias, bool causal, double dropout_p, int64_t seed);

// Which CPU instruction set the float32 kernels run with on this machine.
const char* cpu_kernel_isa();

}  // namespace fourierformer
