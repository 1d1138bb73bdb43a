// Host-side declarations shared by the op registration, the CPU and the CUDA backends.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <optional>
#include <string>
#include <tuple>

#include "backend_limits.h"

namespace fourierformer {

// Whether dtype is one of the torch dtype names of a limits:: list (backend_limits.h).
template <size_t N>
bool dtype_in(const char* const (&names)[N], at::ScalarType dtype) {
  const std::string name(c10::getDtypeNames(dtype).first);
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

// "float32, float16 and bfloat16": a limits:: dtype list for error messages.
template <size_t N>
std::string dtype_list(const char* const (&names)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i) s += std::string(i == 0 ? "" : i + 1 == N ? " and " : ", ") + names[i];
  return s;
}

// Shapes of one call, after validation.
struct AttentionShape {
  int64_t B, H, N, M, D, Dv;
};

// Checks q (B,H,N,D), k (B,H,M,D), v (B,H,M,Dv), radius (H,D), attn_mask (B|1,H|1,N,M),
// key_bias (B,M) and the scalars; raises a c10::Error that names the offending argument.
// attn_mask and key_bias are each either additive float masks or bool masks (true = may not
// be attended, as nn.MultiheadAttention and fairseq mark them). phi and power: see check_phi.
AttentionShape check_forward_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& radius, double power,
                                    const std::optional<at::Tensor>& attn_mask,
                                    const std::optional<at::Tensor>& key_bias, bool causal, double dropout_p,
                                    c10::string_view phi = "power", bool on_cpu = false);

// Whether the CPU (on_cpu) or the CUDA backend runs phi with power (limits::kCpuPhis, kCudaPhis:
// "power" with p under the backend's power rule, the others with p = limits::kUnitPower); raises
// saying which it runs.
void check_phi(c10::string_view phi, double power, bool on_cpu);

// Raises if a backward call of a backend that keeps no weights (CUDA) was given some (the CPU's
// kept weights, fourier_attention_forward_with_weights).
void check_no_kept_weights(const std::optional<at::Tensor>& weights);

// log(normaliser_eps) (-inf for 0) after checking it is finite and >= 0.
double null_key_log_eps(double normaliser_eps);

// out_i *= sigmoid(lse_i - log_eps): the forward's share of the null key (a no-op for log_eps = -inf).
void scale_by_null_key(at::Tensor& out, const at::Tensor& lse, double log_eps);

// A mask as an additive one in dtype: a bool mask becomes 0 / -inf (here, once), a float mask is cast.
at::Tensor additive_mask(const at::Tensor& mask, at::ScalarType dtype);

// attn_mask as the kernels read it: additive_mask with its last dim contiguous.
at::Tensor prepare_mask(const at::Tensor& mask, at::ScalarType dtype);

// Whether a mask only selects (bool: each weight kept or zeroed) rather than adds scores; the
// kernels take a faster path when every mask of a call selects.
inline bool mask_selects(const std::optional<at::Tensor>& mask) {
  return !mask.has_value() || mask->scalar_type() == at::kBool;
}

// Element offset of slice (b, h) in a (B|1, H|1, N, M) mask (broadcast dims have offset 0).
inline int64_t mask_slice_offset(const at::Tensor& mask, int64_t b, int64_t h) {
  return (mask.size(0) == 1 ? 0 : b * mask.stride(0)) + (mask.size(1) == 1 ? 0 : h * mask.stride(1));
}

// Checks q (B,H,N,D), k (B,H,M,D) and radius (H,D) of fourier_attention_tables (Dv = 0).
AttentionShape check_table_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& radius);

// Floats of the tables that the CUDA backend's fourier_attention_tables returns for a call
// (cuda/table_layout.h): 0 for float64, whose kernels read none. (The CPU backend's tables are
// its key table, see limits::kCpuKeyTableKeys.)
int64_t cuda_table_floats(const AttentionShape& sh, at::ScalarType dtype);

// Checks the `tables` argument of the forward and backward ops: absent, or what
// fourier_attention_tables returned for these q, k and radius on this backend (`floats`
// float32 elements, contiguous, on q's device); returns it (a copy where it does not start on
// cuda::kTableAlignBytes, which the kernels' float4 loads need) or an undefined tensor.
at::Tensor checked_tables(const std::optional<at::Tensor>& tables, const at::Tensor& q, int64_t floats);

at::Tensor fourier_attention_tables_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& radius);

std::tuple<at::Tensor, at::Tensor> fourier_attention_forward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi);

// The forward that also returns the weights it kept for its backward: (B, H, N, Mt) float32, Mt
// M rounded up to a multiple of limits::kCpuKeyTableKeys (cpu::SliceArgs::weights); float32 calls
// without dropout.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fourier_attention_forward_with_weights_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fourier_attention_backward_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius,
    const at::Tensor& out, const at::Tensor& lse, double power, const std::optional<at::Tensor>& attn_mask,
    const std::optional<at::Tensor>& key_bias, bool causal, double dropout_p, int64_t seed, double normaliser_eps,
    const std::optional<at::Tensor>& tables, c10::string_view phi, const std::optional<at::Tensor>& weights);

// Which CPU instruction set the float32 kernels run with on this machine.
const char* cpu_kernel_isa();

}  // namespace fourierformer
