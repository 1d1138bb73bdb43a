// The fused CPU backend's entry points: checks a call, prepares its tensors and masks, and
// runs its (batch, head) slices in parallel (thread_pool.h). float32 runs the vectorised
// kernels of fourier_cpu_kernel.inc for the best instruction set of this CPU (isa_dispatch.cpp);
// float64 runs the scalar loops of scalar_f64.h (same math, with sin and log per element).
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "../fourier_attention.h"
#include "fourier_cpu_kernel.h"
#include "scalar_f64.h"
#include "thread_pool.h"

namespace fourierformer {

namespace {

// phi(x) = x^p with odd p: signed weights (SliceArgs::odd_power).
bool odd_power(c10::string_view phi, double power) { return phi == "power" && std::fmod(power, 2.0) == 1.0; }

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
  bool relu;  // phi = ReLU (see SliceArgs::relu)
  bool sigmoid;  // phi = sigmoid (see SliceArgs::sigmoid)
  bool odd_power;  // phi(x) = x^p with odd p (see SliceArgs::odd_power)
  bool causal;
  double dropout_p;
  int64_t seed;
  double log_eps;  // log of the normaliser's eps (null_key_log_eps), -inf for 0
  at::Tensor key_table;  // (B, H, D, Mt) float32 (see limits::kCpuKeyTableKeys), undefined if none
  at::Tensor weights;  // (B, H, N, Mt) float32, the kept weights (SliceArgs::weights), undefined if none
};

template <typename Slice, typename T>
Slice slice_args(const CallArgs& c, int64_t bh) {
  const AttentionShape& sh = c.sh;
  const int64_t b = bh / sh.H, h = bh % sh.H;
  Slice s;
  s.q = c.q.data_ptr<T>() + bh * sh.N * sh.D;
  s.k = c.k.is_contiguous() ? c.k.data_ptr<T>() + bh * sh.M * sh.D : nullptr;  // (see SliceArgs::k)
  s.v = c.v.data_ptr<T>() + bh * sh.M * sh.Dv;
  s.radius = c.radius.data_ptr<T>() + h * sh.D;
  s.N = sh.N;
  s.M = sh.M;
  s.D = sh.D;
  s.Dv = sh.Dv;
  s.power = (T)c.power;
  s.relu = c.relu;
  s.sigmoid = c.sigmoid;
  s.odd_power = c.odd_power;
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
  s.log_eps = c.log_eps;
  if constexpr (std::is_same_v<Slice, cpu::SliceArgs>) {
    s.key_table = c.key_table.defined() ? c.key_table.data_ptr<float>() + bh * sh.D * c.key_table.size(3) : nullptr;
    s.key_table_stride = c.key_table.defined() ? c.key_table.size(3) : 0;
    s.weights = c.weights.defined() ? c.weights.data_ptr<float>() + bh * sh.N * c.weights.size(3) : nullptr;
    s.weights_stride = c.weights.defined() ? c.weights.size(3) : 0;
  }
  return s;
}

// The names of the kernels' record scopes (torch.profiler events; scripts/benchmarks/benchmark_attention.py
// --profile counts their time as the kernels')
constexpr const char* kCpuForwardKernelScope = "fourierformer::cpu_forward_kernel";
constexpr const char* kCpuBackwardKernelScope = "fourierformer::cpu_backward_kernel";

using cpu::for_each_slice_balanced;
using cpu::kKeptWorkspaceFloats;

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

// The key table a forward call was given (see limits::kCpuKeyTableKeys), checked; undefined if
// none (also for the empty tables of float64 calls, whose scalar kernels read none).
at::Tensor checked_key_table(const std::optional<at::Tensor>& tables, const at::Tensor& q, const at::Tensor& k) {
  if (!tables.has_value() || (tables->numel() == 0 && tables->dim() == 1 && tables->scalar_type() == at::kFloat))
    return at::Tensor();
  const at::Tensor& t = *tables;
  const AttentionShape sh{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), 0};
  TORCH_CHECK(q.scalar_type() == at::kFloat && t.scalar_type() == at::kFloat && t.dim() == 4 && t.size(0) == sh.B &&
                  t.size(1) == sh.H && t.size(2) == sh.D && t.size(3) >= sh.M &&
                  t.size(3) % limits::kCpuKeyTableKeys == 0 && t.is_contiguous() && t.device() == q.device(),
              "fourier_attention (cpu): tables must be a key table of fourier_attention_tables(q, k, radius) for "
              "these keys (float32 (B, H, D, Mt) = (", sh.B, ", ", sh.H, ", ", sh.D, ", at least ", sh.M,
              ", a multiple of ", limits::kCpuKeyTableKeys, "), contiguous, for float32 inputs), got ",
              t.scalar_type(), " ", t.sizes(), " for ", q.scalar_type(), " inputs");
  return t;
}

// The kept weights a backward call was given (fourier_attention_forward_with_weights' for the same
// call), checked; undefined if none.
at::Tensor checked_kept_weights(const std::optional<at::Tensor>& weights, const at::Tensor& q, const at::Tensor& k,
                                double dropout_p) {
  if (!weights.has_value()) return at::Tensor();
  const at::Tensor& w = *weights;
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), M = k.size(2);
  TORCH_CHECK(q.scalar_type() == at::kFloat && dropout_p == 0.0 && w.scalar_type() == at::kFloat && w.dim() == 4 &&
                  w.size(0) == B && w.size(1) == H && w.size(2) == N && w.size(3) == cpu::key_table_width(M) &&
                  w.is_contiguous() && w.device() == q.device(),
              "fourier_attention backward (cpu): weights must be the kept weights of "
              "fourier_attention_forward_with_weights for this call (float32 (B, H, N, Mt) = (", B, ", ", H, ", ", N,
              ", ", cpu::key_table_width(M), "), contiguous, for float32 inputs without dropout), got ",
              w.scalar_type(), " ", w.sizes(), " for ", q.scalar_type(), " inputs with dropout_p ", dropout_p);
  return w;
}

// The gradients of rows whose lse is NaN (a NaN or infinite input or mask in the row, see the
// forward's nan_rows): NaN where the formula's are, i.e. in the row's dq, in dk and dv of every key
// it sees, and in its head's share of the radius gradient (the kernels skip a row whose lse is not
// finite, as they skip rows with no visible key).
void nan_row_gradients(const CallArgs& c, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                       at::Tensor& dradius_slices) {
  const at::Tensor bad = at::isnan(lse);
  if (!bad.any().item<bool>()) return;
  const AttentionShape& sh = c.sh;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const at::Tensor mask = c.masks.attn_mask.defined() ? c.masks.attn_mask.to(at::kDouble) : at::Tensor();
  const at::Tensor key_bias = c.masks.key_bias.defined() ? c.masks.key_bias.to(at::kDouble) : at::Tensor();
  const at::Tensor rows = bad.nonzero();  // (n, 3): b, h, i
  for (int64_t n = 0; n < rows.size(0); ++n) {
    const int64_t b = rows[n][0].item<int64_t>(), h = rows[n][1].item<int64_t>(), i = rows[n][2].item<int64_t>();
    dq[b][h][i].fill_(nan);
    dradius_slices[b][h].fill_(nan);
    const int64_t end = c.causal ? std::min(sh.M, i + (sh.M - sh.N) + 1) : sh.M;
    for (int64_t j = 0; j < end; ++j) {
      double m = 0.0;
      if (mask.defined()) m += mask[mask.size(0) == 1 ? 0 : b][mask.size(1) == 1 ? 0 : h][i][j].item<double>();
      if (key_bias.defined()) m += key_bias[b][j].item<double>();
      if (m == -std::numeric_limits<double>::infinity()) continue;
      dk[b][h][j].fill_(nan);
      dv[b][h][j].fill_(nan);
    }
  }
}

}  // namespace

at::Tensor fourier_attention_tables_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& radius) {
  check_table_inputs(q, k, radius);
  if (q.scalar_type() != at::kFloat) return at::empty({0}, q.options().dtype(at::kFloat));  // (float64: none)
  // the key table: the keys transposed, zero past M (the other tables depend on the rows and the
  // radius, and the kernels build them per tile)
  const int64_t M = k.size(2);
  at::Tensor table = at::zeros({k.size(0), k.size(1), k.size(3), cpu::key_table_width(M)}, k.options());
  table.narrow(3, 0, M).copy_(k.detach().transpose(2, 3));  // (not differentiable)
  return table;
}

namespace {

// The forward, and with keep_weights also the kept weights (B, H, N, Mt) (SliceArgs::weights).
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_cpu(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& radius_in,
    double power, const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias,
    bool causal, double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi, bool keep_weights) {
  const AttentionShape sh =
      check_forward_inputs(q_in, k_in, v_in, radius_in, power, attn_mask, key_bias, causal, dropout_p, phi, true);
  const double log_eps = null_key_log_eps(normaliser_eps);
  const auto dtype = q_in.scalar_type();
  TORCH_CHECK(dtype_in(limits::kCpuDtypes, dtype), "fourier_attention (cpu): ", dtype_list(limits::kCpuDtypes),
              " are supported, got ", dtype);
  TORCH_CHECK(!keep_weights || (dtype == at::kFloat && dropout_p == 0.0),
              "fourier_attention_forward_with_weights (cpu): the weights are kept for float32 calls without "
              "dropout (they are the weights before it), got ", dtype, " with dropout_p ", dropout_p);
  at::Tensor key_table = checked_key_table(tables, q_in, k_in);
  // whether the slices take the short-query forward (phi = sigmoid has none, and kept weights come
  // from the row groups: such slices of a few rows take the row groups, and their workspace); with
  // a key table it reads the keys from the table alone: k stays as given
  const bool sigmoid = phi == "sigmoid";
  const int64_t short_rows = cpu::best_kernels().short_query_rows;
  const bool short_query = sh.N < short_rows && !sigmoid && !keep_weights;
  const bool keys_from_table = key_table.defined() && short_query;
  const CallArgs c{sh,
                   q_in.contiguous(),
                   keys_from_table ? k_in : k_in.contiguous(),
                   v_in.contiguous(),
                   radius_in.to(dtype).contiguous(),
                   prepare_masks(attn_mask, key_bias, dtype),
                   power,
                   phi == "relu",
                   sigmoid,
                   odd_power(phi, power),
                   causal,
                   dropout_p,
                   seed,
                   log_eps,
                   key_table,
                   keep_weights ? at::empty({sh.B, sh.H, sh.N, cpu::key_table_width(sh.M)}, c.q.options())
                                : at::Tensor()};
  at::Tensor out = at::empty({sh.B, sh.H, sh.N, sh.Dv}, c.q.options());
  // lse is float64 for every input dtype (see KernelTable::forward)
  at::Tensor lse = at::empty({sh.B, sh.H, sh.N}, c.q.options().dtype(at::kDouble));
  {
    // the kernels' own time under torch.profiler, apart from the op's checks, copies and allocations
    RECORD_FUNCTION(kCpuForwardKernelScope, std::vector<c10::IValue>());
    if (dtype == at::kFloat) {
      const cpu::KernelTable& kernels = cpu::best_kernels();
      const int64_t workspace_rows = short_query ? sh.N : std::max(sh.N, short_rows);
      for_each_float32_slice(c, kernels.forward_workspace(workspace_rows, sh.M, sh.D, sh.Dv),
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
  }
  if (!c.odd_power) scale_by_null_key(out, lse, log_eps);  // (odd p: the kernels apply the null key)
  return {out, lse, c.weights};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fourier_attention_forward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi) {
  auto [out, lse, weights] = forward_cpu(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed,
                                         normaliser_eps, tables, phi, false);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fourier_attention_forward_with_weights_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& radius, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi) {
  return forward_cpu(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed, normaliser_eps, tables,
                     phi, true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fourier_attention_backward_cpu(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& radius_in, const at::Tensor& out_in, const at::Tensor& lse_in, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables,
    c10::string_view phi, const std::optional<at::Tensor>& weights) {
  const AttentionShape sh =
      check_forward_inputs(q_in, k_in, v_in, radius_in, power, attn_mask, key_bias, causal, dropout_p, phi, true);
  checked_key_table(tables, q_in, k_in);  // (the backward builds its own tables)
  const at::Tensor kept = checked_kept_weights(weights, q_in, k_in, dropout_p);
  const double log_eps = null_key_log_eps(normaliser_eps);
  const auto dtype = q_in.scalar_type();
  TORCH_CHECK(dtype_in(limits::kCpuDtypes, dtype), "fourier_attention (cpu): ", dtype_list(limits::kCpuDtypes),
              " are supported, got ", dtype);
  TORCH_CHECK(dout_in.sizes() == out_in.sizes() && out_in.size(0) == sh.B && out_in.size(2) == sh.N &&
                  out_in.size(3) == sh.Dv,
              "fourier_attention backward: grad_out and out must be (B, H, N, Dv)");
  const CallArgs c{sh, q_in.contiguous(), k_in.contiguous(), v_in.contiguous(), radius_in.to(dtype).contiguous(),
                   prepare_masks(attn_mask, key_bias, dtype), power, phi == "relu", phi == "sigmoid", odd_power(phi, power),
                   causal, dropout_p, seed, log_eps, at::Tensor(), kept};
  const at::Tensor out = out_in.to(dtype).contiguous(), dout = dout_in.to(dtype).contiguous();
  const at::Tensor lse = lse_in.to(at::kDouble).contiguous();
  at::Tensor dq = at::empty_like(c.q), dk = at::empty_like(c.k), dv = at::empty_like(c.v);
  at::Tensor dradius_slices = at::empty({sh.B, sh.H, sh.D}, c.q.options());
  {
    RECORD_FUNCTION(kCpuBackwardKernelScope, std::vector<c10::IValue>());
    if (dtype == at::kFloat)
      backward_slices<float>(c, out, lse, dout, dq, dk, dv, dradius_slices);
    else
      backward_slices<double>(c, out, lse, dout, dq, dk, dv, dradius_slices);
  }
  nan_row_gradients(c, lse, dq, dk, dv, dradius_slices);
  return {dq, dk, dv, dradius_slices.sum(0)};
}

}  // namespace fourierformer
