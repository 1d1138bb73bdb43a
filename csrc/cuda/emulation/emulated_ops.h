// Translation unit of the host emulation build (included from the source that
// run_emulated_check.py compiles with the CPU torch; never part of the real extension).
//
// It compiles the op library (schemas, input checks) with the CPU kernels replaced by the
// CUDA host code + kernels of ../fourier_attention_launch.h run under the host emulator:
// in that process torch.ops.fourierformer.* on CPU tensors execute the CUDA kernels.
#pragma once

#ifndef FF_HOST_EMULATION
#define FF_HOST_EMULATION 1
#endif

#include <torch/extension.h>

#include <cstdlib>

#include "../../fourier_attention_ops.cpp"
#include "../fourier_attention_launch.h"

namespace fourierformer {
namespace {
// smem_optin: the per-block shared memory the emulated GPU allows (FF_EMU_SMEM_OPTIN bytes,
// e.g. 101376 for the 99 KiB of sm_86 / sm_89; unset: no limit), as CudaLauncher's.
// score_cache_budget(): the backward's score cache budget, FF_EMU_SCORE_CACHE_BYTES bytes where
// set (so that both main passes can be checked), else as on a GPU (score_cache.h:
// FOURIERFORMER_SCORE_CACHE_MB, else a share of the memory free) with FF_EMU_FREE_MEMORY_BYTES
// free (unset: 139 GiB, an idle H200's).
// sm_count, smem_per_sm: the emulated GPU's SMs (FF_EMU_SM_COUNT; unset: 132, an H100's or
// H200's, whose main pass then splits the features of every small test case with the score
// cache and D >= 32; 1: never) and their shared memory (228 KiB, sm_90's).
struct EmuLauncher {
  size_t smem_optin = emulated_smem_optin();
  int sm_count = emulated_sm_count();
  size_t smem_per_sm = 228 * 1024;
  int max_grid_splits = cuda::kMaxMainSplits;

  static int emulated_sm_count() {
    const char* env = std::getenv("FF_EMU_SM_COUNT");
    return env && *env ? (int)std::strtol(env, nullptr, 10) : 132;
  }

  int64_t score_cache_budget() const {
    const char* env = std::getenv("FF_EMU_SCORE_CACHE_BYTES");
    if (env && *env) return (int64_t)std::strtoll(env, nullptr, 10);
    return cuda::score_cache_budget_now([] {
      const char* free_env = std::getenv("FF_EMU_FREE_MEMORY_BYTES");
      return free_env && *free_env ? (int64_t)std::strtoll(free_env, nullptr, 10) : int64_t(139) << 30;
    });
  }

  static size_t emulated_smem_optin() {
    const char* env = std::getenv("FF_EMU_SMEM_OPTIN");
    return env && *env ? (size_t)std::strtoull(env, nullptr, 10) : (size_t)-1;
  }

  template <typename scalar_t, typename acc_t>
  void operator()(void (*kernel)(cuda::Params<scalar_t, acc_t>), int64_t blocks, int threads, size_t smem_bytes,
                  const cuda::Params<scalar_t, acc_t>& p) const {
    if (blocks <= 0) return;
    TORCH_CHECK(smem_bytes <= smem_optin, "fourier_attention (emulated cuda): head dims D = ", p.D, ", Dv = ", p.Dv,
                " need ", smem_bytes, " bytes of shared memory per block, the emulated GPU allows ", smem_optin);
    ff_emu::launch(kernel, blocks, threads, smem_bytes, p);
  }
};
}  // namespace

at::Tensor fourier_attention_tables_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& radius) {
  return cuda::tables_impl(q, k, radius, EmuLauncher{});
}

std::tuple<at::Tensor, at::Tensor> fourier_attention_forward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi) {
  check_phi(phi, power, false);  // (the CUDA kernels' phis)
  return cuda::forward_impl(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed, normaliser_eps,
                            tables, EmuLauncher{}, phi);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fourier_attention_forward_with_weights_cpu(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool, double, int64_t, double,
    const std::optional<at::Tensor>&, c10::string_view) {
  TORCH_CHECK(false, "fourier_attention_forward_with_weights: the CUDA kernels keep no weights");
  return {};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fourier_attention_backward_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius,
    const at::Tensor& out, const at::Tensor& lse, double power, const std::optional<at::Tensor>& attn_mask,
    const std::optional<at::Tensor>& key_bias, bool causal, double dropout_p, int64_t seed,
    double normaliser_eps, const std::optional<at::Tensor>& tables, c10::string_view phi,
    const std::optional<at::Tensor>& weights) {
  check_phi(phi, power, false);
  check_no_kept_weights(weights);
  return cuda::backward_impl(dout, q, k, v, radius, out, lse, power, attn_mask, key_bias, causal, dropout_p, seed,
                             normaliser_eps, tables, EmuLauncher{}, phi);
}

const char* cpu_kernel_isa() { return "cuda-host-emulation"; }
}  // namespace fourierformer

// sin, cos of float32 x through the kernels' ff_sincosf, and g(x) and sum_d log|sinc| helpers.
inline std::vector<at::Tensor> emulated_sincosf(const at::Tensor& x_in) {
  at::Tensor x = x_in.to(at::kFloat).contiguous();
  at::Tensor s = at::empty_like(x), c = at::empty_like(x), g = at::empty_like(x), l = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* sp = s.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  float* gp = g.data_ptr<float>();
  float* lp = l.data_ptr<float>();
  const float zero = 0.0f, one = 1.0f;
  for (int64_t n = 0; n < x.numel(); ++n) {
    fourierformer::cuda::ff_sincosf(xp[n], sp[n], cp[n]);
    gp[n] = fourierformer::cuda::dlog_sinc(xp[n]);
    lp[n] = fourierformer::cuda::LogSincSum<float>::run(xp + n, 1, &zero, 0, &one, 1);
  }
  return {s, c, g, l};
}

// Planted bugs for the sanitizer runs (run_emulated_check.py --sanitize, which must see each one
// reported, so that a clean run of the kernels means something): a block of 64 threads stages x
// in shared memory and reads its neighbour's word. what: 0, correct; 1, "race": no barrier between
// the writes and the reads; 2, "shared_overflow": thread 0 also reads the first float past the
// block's shared memory (which the emulator allocates to the byte); 3, "global_overflow":
// thread 0 also reads x one element past its end.
namespace ff_probe {
inline void probe_kernel(const float* x, int64_t n, float* out, int what, int64_t smem_floats) {
  float* s = reinterpret_cast<float*>(ff_emu::dynamic_smem());
  const int t = (int)threadIdx.x;
  s[t] = x[t % n];
  if (what != 1) __syncthreads();
  float v = s[(t + 1) % 64];
  if (what == 2 && t == 0) v += s[smem_floats];
  if (what == 3 && t == 0) v += x[n];
  out[t] = v;
}
}  // namespace ff_probe

inline at::Tensor emulated_sanitizer_probe(const at::Tensor& x_in, int64_t what) {
  TORCH_CHECK(what >= 0 && what <= 3, "emulated_sanitizer_probe: what is 0 to 3");
  at::Tensor x = x_in.to(at::kFloat).contiguous();
  TORCH_CHECK(x.numel() > 0, "emulated_sanitizer_probe: x is empty");
  at::Tensor out = at::empty({64}, x.options());
  const int64_t smem_floats = 64;
  ff_emu::launch(ff_probe::probe_kernel, 1, 64, sizeof(float) * smem_floats, (const float*)x.data_ptr<float>(),
                 x.numel(), out.data_ptr<float>(), (int)what, smem_floats);
  return out;
}
