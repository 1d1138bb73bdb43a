// The fused CPU backend: splits a call into (batch, head) slices run in parallel with
// ATen's thread pool. float32 runs the vectorised kernels of fourier_cpu_kernel.inc for the
// best instruction set of this CPU; float64 runs the scalar loops below (same math, with
// sin and log per element, for tests and gradcheck).
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "../fourier_attention.h"
#include "../fourier_element_math.h"
#include "fourier_cpu_kernel.h"

namespace fourierformer {
namespace cpu {

// The kernels for the best instruction set of this CPU, or for the one named by the
// environment variable FOURIERFORMER_CPU_ISA (avx512, avx2 or generic) when this CPU has it,
// so that every variant can be tested on one machine. Chosen once per process.
static const KernelTable& best_kernels() {
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

// ---- float64: scalar loops over the same math ----
template <typename T>
struct ScalarSlice {
  const T* q;
  const T* k;
  const T* v;
  const T* radius;
  int64_t N, M, D, Dv;
  T power;
  const T* attn_mask;
  int64_t mask_row_stride;
  const T* key_bias;
  bool causal;
  T dropout_p;
  uint32_t seed, bh;

  int64_t visible_end(int64_t i) const { return causal ? std::min(M, i + (M - N) + 1) : M; }

  T score(int64_t i, int64_t j) const {
    T s = 0;
    for (int64_t d = 0; d < D; ++d) {
      T x = radius[d] * (q[i * D + d] - k[j * D + d]);
      s += log_abs_sinc_from_sin(x, std::sin(x));
    }
    s *= power;
    if (attn_mask) s += attn_mask[i * mask_row_stride + j];
    if (key_bias) s += key_bias[j];
    return s;
  }

  T dropout_scale(int64_t i, int64_t j) const {
    if (dropout_p <= 0) return T(1);
    return ff_dropout_uniform(seed, bh, (uint32_t)i, (uint32_t)j) >= (float)dropout_p ? T(1) / (T(1) - dropout_p)
                                                                                       : T(0);
  }

  void forward(T* out, double* lse, std::vector<T>& row) const {
    row.resize(M);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t end = visible_end(i);
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < end; ++j) {
        row[j] = score(i, j);
        m = std::max(m, row[j]);
      }
      T* out_i = out + i * Dv;
      for (int64_t c = 0; c < Dv; ++c) out_i[c] = 0;
      if (!(m > -std::numeric_limits<T>::infinity())) {
        lse[i] = std::numeric_limits<T>::infinity();
        continue;
      }
      T sum = 0;
      for (int64_t j = 0; j < end; ++j) {
        T e = std::exp(row[j] - m);
        sum += e;
        e *= dropout_scale(i, j);
        if (e == 0) continue;
        for (int64_t c = 0; c < Dv; ++c) out_i[c] += e * v[j * Dv + c];
      }
      for (int64_t c = 0; c < Dv; ++c) out_i[c] /= sum;
      lse[i] = m + std::log(sum);
    }
  }

  void backward(const T* out, const double* lse, const T* dout, T* dq, T* dk, T* dv, T* dradius) const {
    for (int64_t n = 0; n < M * D; ++n) dk[n] = 0;
    for (int64_t n = 0; n < M * Dv; ++n) dv[n] = 0;
    for (int64_t n = 0; n < N * D; ++n) dq[n] = 0;
    for (int64_t d = 0; d < D; ++d) dradius[d] = 0;
    for (int64_t i = 0; i < N; ++i) {
      if (!(lse[i] < std::numeric_limits<T>::infinity())) continue;
      const T* dout_i = dout + i * Dv;
      T delta = 0;
      for (int64_t c = 0; c < Dv; ++c) delta += dout_i[c] * out[i * Dv + c];
      const int64_t end = visible_end(i);
      for (int64_t j = 0; j < end; ++j) {
        const T P = std::exp(score(i, j) - lse[i]);
        if (P == 0) continue;
        const T f = dropout_scale(i, j);
        T dP = 0;
        for (int64_t c = 0; c < Dv; ++c) {
          dP += dout_i[c] * v[j * Dv + c];
          dv[j * Dv + c] += P * f * dout_i[c];
        }
        const T coef = power * P * (dP * f - delta);
        for (int64_t d = 0; d < D; ++d) {
          const T diff = q[i * D + d] - k[j * D + d];
          const T x = radius[d] * diff;
          const T dx = coef * dlog_sinc_from_sincos(x, std::sin(x), std::cos(x));
          dq[i * D + d] += radius[d] * dx;
          dk[j * D + d] -= radius[d] * dx;
          dradius[d] += diff * dx;
        }
      }
    }
  }
};

}  // namespace cpu

const char* cpu_kernel_isa() { return cpu::best_kernels().isa; }

namespace {

struct SliceMasks {
  at::Tensor attn_mask;  // additive; undefined if none
  at::Tensor key_bias;
  bool selections;  // every mask given was bool (0 / -inf): see SliceArgs::masks_select
};

SliceMasks prepare_masks(const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias,
                         at::ScalarType dtype) {
  SliceMasks m;
  if (attn_mask.has_value()) m.attn_mask = prepare_mask(*attn_mask, dtype);
  if (key_bias.has_value()) m.key_bias = additive_mask(*key_bias, dtype).contiguous();
  m.selections = mask_selects(attn_mask) && mask_selects(key_bias);
  return m;
}

// Everything a call shares across its (batch, head) slices.
struct CallArgs {
  AttentionShape sh;
  at::Tensor q, k, v, radius;
  SliceMasks masks;
  double power;
  bool causal;
  double dropout_p;
  int64_t seed;
};

template <typename Slice, typename T>
Slice slice_args(const CallArgs& c, int64_t bh) {
  const AttentionShape& sh = c.sh;
  const int64_t b = bh / sh.H, h = bh % sh.H;
  Slice s;
  s.q = c.q.data_ptr<T>() + bh * sh.N * sh.D;
  s.k = c.k.data_ptr<T>() + bh * sh.M * sh.D;
  s.v = c.v.data_ptr<T>() + bh * sh.M * sh.Dv;
  s.radius = c.radius.data_ptr<T>() + h * sh.D;
  s.N = sh.N;
  s.M = sh.M;
  s.D = sh.D;
  s.Dv = sh.Dv;
  s.power = (T)c.power;
  s.attn_mask = nullptr;
  s.mask_row_stride = 0;
  if (c.masks.attn_mask.defined()) {
    s.attn_mask = c.masks.attn_mask.data_ptr<T>() + mask_slice_offset(c.masks.attn_mask, b, h);
    s.mask_row_stride = c.masks.attn_mask.stride(2);
  }
  s.key_bias = c.masks.key_bias.defined() ? c.masks.key_bias.data_ptr<T>() + b * sh.M : nullptr;
  s.causal = c.causal;
  s.dropout_p = (T)c.dropout_p;
  s.seed = (uint32_t)c.seed;
  s.bh = (uint32_t)bh;
  return s;
}

// Each thread keeps its workspace between calls while it is at most this many floats (16 MiB),
// so that a call does not pay for fresh pages; a larger one is freed when the call ends.
constexpr size_t kKeptWorkspaceFloats = size_t(1) << 22;

// fn(bh) for bh in [0, n), in parallel: each worker takes the next slice as it finishes one,
// so that a core slowed by other work does fewer slices (with ATen's static split, the
// whole call would wait for its share). setup() runs once per worker.
template <typename Setup, typename Fn>
void for_each_slice_balanced(int64_t n, Setup setup, Fn fn) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    auto state = setup();
    for (int64_t bh = next.fetch_add(1); bh < n; bh = next.fetch_add(1)) fn(bh, state);
  });
}

// fn(slice, bh, workspace) for every slice of a float32 call, in parallel; each worker
// has one workspace of ws_floats floats.
template <typename Fn>
void for_each_float32_slice(const CallArgs& c, size_t ws_floats, Fn fn) {
  for_each_slice_balanced(
      c.sh.B * c.sh.H,
      [&] {
        thread_local std::vector<float> kept;
        std::vector<float> once;  // (moving it keeps its data where ws.data() points)
        std::vector<float>& ws = ws_floats <= kKeptWorkspaceFloats ? kept : once;
        if (ws.size() < ws_floats) ws.resize(ws_floats);  // the kernels write what they read
        float* data = ws.data();
        return std::make_pair(data, std::move(once));
      },
      [&](int64_t bh, auto& ws) {
        cpu::SliceArgs s = slice_args<cpu::SliceArgs, float>(c, bh);
        s.masks_select = c.masks.selections;
        fn(s, bh, ws.first);
      });
}

// fn(slice, bh) for every slice of a float64 call, in parallel.
template <typename Fn>
void for_each_float64_slice(const CallArgs& c, Fn fn) {
  for_each_slice_balanced(
      c.sh.B * c.sh.H, [] { return 0; },
      [&](int64_t bh, int) { fn(slice_args<cpu::ScalarSlice<double>, double>(c, bh), bh); });
}

template <typename T>
void backward_slices(const CallArgs& c, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                     at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& dradius_slices) {
  const AttentionShape& sh = c.sh;
  // Runs `kernel` on slice bh's share of every per-slice tensor.
  auto on_slice = [&](int64_t bh, auto&& kernel) {
    kernel(out.data_ptr<T>() + bh * sh.N * sh.Dv, lse.data_ptr<double>() + bh * sh.N,
           dout.data_ptr<T>() + bh * sh.N * sh.Dv, dq.data_ptr<T>() + bh * sh.N * sh.D,
           dk.data_ptr<T>() + bh * sh.M * sh.D, dv.data_ptr<T>() + bh * sh.M * sh.Dv,
           dradius_slices.data_ptr<T>() + bh * sh.D);
  };
  if constexpr (std::is_same_v<T, float>) {
    const cpu::KernelTable& kernels = cpu::best_kernels();
    for_each_float32_slice(c, kernels.backward_workspace(sh.N, sh.M, sh.D, sh.Dv),
                           [&](const cpu::SliceArgs& s, int64_t bh, float* ws) {
                             on_slice(bh, [&](auto... p) { kernels.backward(s, p..., ws); });
                           });
  } else {
    for_each_float64_slice(c, [&](const cpu::ScalarSlice<double>& s, int64_t bh) {
      on_slice(bh, [&](auto... p) { s.backward(p...); });
    });
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fourier_attention_forward_cpu(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& radius_in,
    double power, const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias,
    bool causal, double dropout_p, int64_t seed) {
  const AttentionShape sh =
      check_forward_inputs(q_in, k_in, v_in, radius_in, power, attn_mask, key_bias, causal, dropout_p);
  const auto dtype = q_in.scalar_type();
  TORCH_CHECK(dtype_in(limits::kCpuDtypes, dtype), "fourier_attention (cpu): ", dtype_list(limits::kCpuDtypes),
              " are supported, got ", dtype);
  const CallArgs c{sh, q_in.contiguous(), k_in.contiguous(), v_in.contiguous(), radius_in.to(dtype).contiguous(),
                   prepare_masks(attn_mask, key_bias, dtype), power, causal, dropout_p, seed};
  at::Tensor out = at::empty({sh.B, sh.H, sh.N, sh.Dv}, c.q.options());
  // lse is float64 for every input dtype (see KernelTable::forward)
  at::Tensor lse = at::empty({sh.B, sh.H, sh.N}, c.q.options().dtype(at::kDouble));
  if (dtype == at::kFloat) {
    const cpu::KernelTable& kernels = cpu::best_kernels();
    for_each_float32_slice(c, kernels.forward_workspace(sh.N, sh.M, sh.D, sh.Dv),
                           [&](const cpu::SliceArgs& s, int64_t bh, float* ws) {
                             kernels.forward(s, out.data_ptr<float>() + bh * sh.N * sh.Dv,
                                             lse.data_ptr<double>() + bh * sh.N, ws);
                           });
  } else {
    for_each_float64_slice(c, [&](const cpu::ScalarSlice<double>& s, int64_t bh) {
      std::vector<double> row;
      s.forward(out.data_ptr<double>() + bh * sh.N * sh.Dv, lse.data_ptr<double>() + bh * sh.N, row);
    });
  }
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fourier_attention_backward_cpu(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& radius_in, const at::Tensor& out_in, const at::Tensor& lse_in, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed) {
  const AttentionShape sh =
      check_forward_inputs(q_in, k_in, v_in, radius_in, power, attn_mask, key_bias, causal, dropout_p);
  const auto dtype = q_in.scalar_type();
  TORCH_CHECK(dtype_in(limits::kCpuDtypes, dtype), "fourier_attention (cpu): ", dtype_list(limits::kCpuDtypes),
              " are supported, got ", dtype);
  TORCH_CHECK(dout_in.sizes() == out_in.sizes() && out_in.size(0) == sh.B && out_in.size(2) == sh.N &&
                  out_in.size(3) == sh.Dv,
              "fourier_attention backward: grad_out and out must be (B, H, N, Dv)");
  const CallArgs c{sh, q_in.contiguous(), k_in.contiguous(), v_in.contiguous(), radius_in.to(dtype).contiguous(),
                   prepare_masks(attn_mask, key_bias, dtype), power, causal, dropout_p, seed};
  const at::Tensor out = out_in.to(dtype).contiguous(), dout = dout_in.to(dtype).contiguous();
  const at::Tensor lse = lse_in.to(at::kDouble).contiguous();
  at::Tensor dq = at::empty_like(c.q), dk = at::empty_like(c.k), dv = at::empty_like(c.v);
  at::Tensor dradius_slices = at::empty({sh.B, sh.H, sh.D}, c.q.options());
  if (dtype == at::kFloat)
    backward_slices<float>(c, out, lse, dout, dq, dk, dv, dradius_slices);
  else
    backward_slices<double>(c, out, lse, dout, dq, dk, dv, dradius_slices);
  return {dq, dk, dv, dradius_slices.sum(0)};
}

}  // namespace fourierformer
