// Host side of the CUDA backend: argument checks, tensor preparation, launch geometry.
//
// Written against a `Launcher` (launch(kernel, blocks, threads, shared_bytes, params)) so that the
// same code drives the real launches (cuda_launcher.cuh, launch_<dtype>.cu) and the host emulator
// (emulation/), which runs it on CPU tensors.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <algorithm>
#include <tuple>
#include <type_traits>

#include "../fourier_attention.h"
#include "fourier_attention_kernels.cuh"

namespace fourierformer {
namespace cuda {

inline at::ScalarType accumulation_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline void check_cuda_call(const AttentionShape& sh, at::ScalarType dtype, const char* what) {
  TORCH_CHECK(dtype_in(limits::kCudaDtypes, dtype), "fourier_attention (cuda) ", what, ": ",
              dtype_list(limits::kCudaDtypes), " are supported, got ", dtype);
  TORCH_CHECK(sh.D <= limits::kCudaMaxHeadDim && sh.Dv <= limits::kCudaMaxHeadDim, "fourier_attention (cuda) ",
              what, ": head dims up to ", limits::kCudaMaxHeadDim, " are supported, got D = ", sh.D, ", Dv = ", sh.Dv);
  TORCH_CHECK(sh.N < limits::kCudaSeqLenBound && sh.M < limits::kCudaSeqLenBound, "fourier_attention (cuda) ", what,
              ": sequence lengths must be below ", limits::kCudaSeqLenBound, ", got N = ", sh.N, ", M = ", sh.M);
}

// Blocks of rows_per_block rows for `rows` rows per (b, h) slice; checked against the grid limit.
inline int64_t grid_blocks(const AttentionShape& sh, int64_t rows, int64_t rows_per_block = kWarps) {
  const int64_t blocks = sh.B * sh.H * ((rows + rows_per_block - 1) / rows_per_block);
  TORCH_CHECK(blocks <= INT_MAX, "fourier_attention (cuda): too many (batch, head, row) blocks: ", blocks);
  return blocks;
}

template <typename scalar_t, typename acc_t>
Params<scalar_t, acc_t> make_params(const AttentionShape& sh, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const at::Tensor& radius, const at::Tensor& mask,
                                    const at::Tensor& key_bias, double power, Phi phi, bool causal,
                                    double dropout_p, int64_t seed) {
  Params<scalar_t, acc_t> p{};
  p.q = q.data_ptr<scalar_t>();
  p.k = k.data_ptr<scalar_t>();
  p.v = v.data_ptr<scalar_t>();
  p.radius = radius.data_ptr<acc_t>();
  p.attn_mask = nullptr;
  p.mask_sb = p.mask_sh = p.mask_row = 0;
  if (mask.defined()) {
    p.attn_mask = mask.data_ptr<acc_t>();
    p.mask_sb = mask_slice_offset(mask, 1, 0);  // 0 where the mask broadcasts over B
    p.mask_sh = mask_slice_offset(mask, 0, 1);  // 0 where it broadcasts over H
    p.mask_row = mask.stride(2);
  }
  p.key_bias = key_bias.defined() ? key_bias.data_ptr<acc_t>() : nullptr;
  p.B = (int)sh.B;
  p.H = (int)sh.H;
  p.N = (int)sh.N;
  p.M = (int)sh.M;
  p.D = (int)sh.D;
  p.Dv = (int)sh.Dv;
  p.power = (acc_t)power;
  p.phi = phi;
  p.relu = phi == Phi::kRelu;
  {
    const double pw = (double)(float)power * 1.44269504088896340736;
    p.power_log2_high = (float)pw;
    p.power_log2_low = (float)(pw - (double)p.power_log2_high);
  }
  p.causal = causal;
  p.log_eps = -INFINITY;  // no null key unless the backward sets it
  p.dropout_p = (float)dropout_p;
  p.keep_scale = acc_t(1) / (acc_t(1) - (acc_t)dropout_p);
  p.seed = (uint32_t)seed;
  return p;
}

struct PreparedInputs {
  AttentionShape sh;
  at::ScalarType dtype, acc;
  at::Tensor q, k, v, radius, mask, key_bias;
};

inline PreparedInputs prepare_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& radius, double power,
                                     const std::optional<at::Tensor>& attn_mask,
                                     const std::optional<at::Tensor>& key_bias, bool causal, double dropout_p,
                                     c10::string_view phi, const char* what) {
  PreparedInputs in;
  in.sh = check_forward_inputs(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, phi);
  in.dtype = q.scalar_type();
  check_cuda_call(in.sh, in.dtype, what);
  in.acc = accumulation_dtype(in.dtype);
  in.q = q.contiguous();
  in.k = k.contiguous();
  in.v = v.contiguous();
  in.radius = radius.to(in.acc).contiguous();
  if (attn_mask.has_value()) in.mask = prepare_mask(*attn_mask, in.acc);
  if (key_bias.has_value()) in.key_bias = additive_mask(*key_bias, in.acc).contiguous();
  return in;
}

// NaN and infinity (docs/kernels.md, "NaN and infinity"): the kernels' max-shifted sums drop a NaN
// score, so a call whose q, k, radius or masks hold a NaN or an infinity (checked once, on the
// device, one flag read back) runs them on inputs with those entries made 0, then gives NaN to what
// the formula makes NaN: a row with a visible key whose score is NaN (its query, the key, the
// radius, a NaN or +inf mask entry there), and in the backward that row's dq, dk and dv of the keys
// it sees and its head's radius gradient. A masked key's score is never formed. A NaN value
// reaches the rows that see it through the kernels' sums.
inline at::Tensor nonfinite_mask_entries(const at::Tensor& mask) { return at::isnan(mask) | (mask == INFINITY); }

inline bool scores_all_finite(const PreparedInputs& in) {
  at::Tensor ok = at::isfinite(in.q).all() & at::isfinite(in.k).all() & at::isfinite(in.radius).all();
  if (in.mask.defined()) ok = ok & ~nonfinite_mask_entries(in.mask).any();
  if (in.key_bias.defined()) ok = ok & ~nonfinite_mask_entries(in.key_bias).any();
  return ok.item<bool>();
}

// (B, H, N) bool: the rows with a visible key whose score is NaN; makes in's q, k, radius and
// masks finite (NaN and infinities 0).
inline at::Tensor nan_score_rows(PreparedInputs& in, bool causal) {
  const AttentionShape& sh = in.sh;
  const at::Tensor bad_q = ~at::isfinite(in.q).all(-1).unsqueeze(-1);                          // (B, H, N, 1)
  const at::Tensor bad_k = ~at::isfinite(in.k).all(-1).unsqueeze(2);                           // (B, H, 1, M)
  const at::Tensor bad_r = ~at::isfinite(in.radius).all(-1).reshape({1, sh.H, 1, 1});         // (1, H, 1, 1)
  at::Tensor visible = at::ones({sh.B, sh.H, sh.N, sh.M}, in.q.options().dtype(at::kBool));
  at::Tensor bad = (bad_q | bad_k | bad_r).expand({sh.B, sh.H, sh.N, sh.M});
  if (in.mask.defined()) {
    visible = visible & (in.mask != -INFINITY);
    bad = bad | nonfinite_mask_entries(in.mask);
    in.mask = at::where(nonfinite_mask_entries(in.mask), at::zeros_like(in.mask), in.mask).contiguous();
  }
  if (in.key_bias.defined()) {
    const at::Tensor kb = in.key_bias.reshape({sh.B, 1, 1, sh.M});
    visible = visible & (kb != -INFINITY);
    bad = bad | nonfinite_mask_entries(kb);
    in.key_bias = at::where(nonfinite_mask_entries(in.key_bias), at::zeros_like(in.key_bias), in.key_bias).contiguous();
  }
  if (causal) {
    const at::Tensor i = at::arange(sh.N, in.q.options().dtype(at::kLong)).unsqueeze(1);
    const at::Tensor j = at::arange(sh.M, in.q.options().dtype(at::kLong)).unsqueeze(0);
    visible = visible & (j <= i + (sh.M - sh.N));
  }
  in.q = at::nan_to_num(in.q, 0.0, 0.0, 0.0).contiguous();
  in.k = at::nan_to_num(in.k, 0.0, 0.0, 0.0).contiguous();
  in.radius = at::nan_to_num(in.radius, 0.0, 0.0, 0.0).contiguous();
  return (bad & visible).any(-1);
}

// (B, H, N, M) bool: the keys that each row sees.
inline at::Tensor visible_keys(const PreparedInputs& in, bool causal) {
  const AttentionShape& sh = in.sh;
  at::Tensor visible = at::ones({sh.B, sh.H, sh.N, sh.M}, in.q.options().dtype(at::kBool));
  if (in.mask.defined()) visible = visible & (in.mask != -INFINITY);
  if (in.key_bias.defined()) visible = visible & (in.key_bias.reshape({sh.B, 1, 1, sh.M}) != -INFINITY);
  if (causal) {
    const at::Tensor i = at::arange(sh.N, in.q.options().dtype(at::kLong)).unsqueeze(1);
    const at::Tensor j = at::arange(sh.M, in.q.options().dtype(at::kLong)).unsqueeze(0);
    visible = visible & (j <= i + (sh.M - sh.N));
  }
  return visible;
}

// The tables of the float32 path (tables.cuh) for the call, carved into p: `given` (what
// fourier_attention_tables returned, checked by checked_tables) or built here; the returned
// tensor owns them (keep it alive until the kernels that read them are queued: the caching
// allocator orders reuse on the stream).
template <typename scalar_t, typename Launcher>
at::Tensor build_tables(const AttentionShape& sh, Params<scalar_t, float>& p, const at::TensorOptions& options,
                        const Launcher& launch, const at::Tensor& given = at::Tensor()) {
  p.Dp = padded_features(p.D);
  if (given.defined()) {
    carve_tables(p, given.data_ptr<float>());
    return given;
  }
  const int64_t floats = table_floats(sh.B * sh.H, sh.H, sh.N, sh.M, p.Dp);
  at::Tensor tables = at::empty({floats}, options.dtype(at::kFloat));
  carve_tables(p, tables.data_ptr<float>());
  const int64_t blocks = table_blocks(sh.B * sh.H, sh.H, sh.N, sh.M, p.Dp);
  TORCH_CHECK(blocks <= INT_MAX && sh.H * p.Dp <= INT_MAX, "fourier_attention (cuda): too many rows for the table kernel: ",
              sh.B * sh.H * (sh.N + sh.M), " rows, ", sh.H, " heads");
  launch(table_kernel<scalar_t>, blocks, kTableThreads, table_smem_bytes(), p);
  return tables;
}

// fourier_attention_tables: the tables of build_tables for q, k and radius as a float32 vector
// (cuda_table_floats elements: empty for float64), for the forward and the backward to share.
template <typename Launcher>
at::Tensor tables_impl(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& radius_in,
                       const Launcher& launch) {
  const AttentionShape sh = check_table_inputs(q_in, k_in, radius_in);
  const at::ScalarType dtype = q_in.scalar_type();
  check_cuda_call(sh, dtype, "tables");
  if (dtype == at::kDouble) return at::empty({0}, q_in.options().dtype(at::kFloat));
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous();
  const at::Tensor radius = radius_in.to(at::kFloat).contiguous();
  at::Tensor tables;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "fourier_attention_tables_cuda", [&] {
    if constexpr (!std::is_same_v<scalar_t, double>) {
      Params<scalar_t, float> p{};
      p.q = q.data_ptr<scalar_t>();
      p.k = k.data_ptr<scalar_t>();
      p.radius = radius.data_ptr<float>();
      p.B = (int)sh.B;
      p.H = (int)sh.H;
      p.N = (int)sh.N;
      p.M = (int)sh.M;
      p.D = (int)sh.D;
      tables = build_tables(sh, p, q.options(), launch);
    }
  });
  return tables;
}

// The kernels' Phi of the op's phi and power ("power" with an even p and "abs" take the same
// instances, with p.power; "power" with an odd p, signed weights, kOdd's).
inline Phi kernel_phi(c10::string_view phi, double power) {
  if (phi == "relu") return Phi::kRelu;
  if (phi == "sigmoid") return Phi::kSigmoid;
  if (phi == "power" && std::fmod(power, 2.0) == 1.0) return Phi::kOdd;
  return Phi::kPower;
}

// f(std::integral_constant<Phi, phi>): the float32 path's kernel instances by phi (a Phi added takes
// its case here).
template <typename F>
void with_phi(Phi phi, F&& f) {
  switch (phi) {
    case Phi::kRelu:
      f(std::integral_constant<Phi, Phi::kRelu>{});
      break;
    case Phi::kSigmoid:
      f(std::integral_constant<Phi, Phi::kSigmoid>{});
      break;
    case Phi::kOdd:
      f(std::integral_constant<Phi, Phi::kOdd>{});
      break;
    default:
      f(std::integral_constant<Phi, Phi::kPower>{});
  }
}

// The decoding forward (forward_decode.cuh): the key chunks' partials, then their merge. p's tables
// are carved.
template <typename scalar_t, typename Launcher>
void launch_decode(const AttentionShape& sh, Params<scalar_t, float>& p, const at::TensorOptions& options,
                   const Launcher& launch) {
  const int64_t splits = decode_splits(sh.M);
  const int64_t blocks = sh.B * sh.H * splits;
  TORCH_CHECK(blocks <= INT_MAX, "fourier_attention (cuda): too many (batch, head, key chunk) blocks: ", blocks);
  // (kept alive until both kernels are queued: the caching allocator orders reuse on the stream)
  const at::Tensor partials =
      at::empty({decode_partial_floats(sh.B * sh.H, sh.N, sh.M, sh.Dv)}, options.dtype(at::kFloat));
  p.decode_partials = partials.data_ptr<float>();
  p.decode_splits = (int)splits;
  const size_t smem = sizeof(float) * decode_smem_floats(p.Dp, DecodeRows::of(sh.N));
  DecodeRows::dispatch(sh.N, [&](auto kRows) {  // (tile_switch.h)
    with_phi(p.phi, [&](auto kPhi) {
      launch(forward_decode_kernel<scalar_t, decltype(kRows)::value, decltype(kPhi)::value>, blocks, kDecThreads,
             smem, p);
    });
  });
  if (p.phi == Phi::kOdd)  // (signed sums, normalised with eps there)
    launch(forward_combine_kernel<scalar_t, true>, sh.B * sh.H, kCombineThreads, 0, p);
  else
    launch(forward_combine_kernel<scalar_t>, sh.B * sh.H, kCombineThreads, 0, p);
}

// float64: the simple path; float32, float16, bfloat16: the tables, then the decoding forward for
// few query rows (decode_forward, forward_decode.cuh), else the tiled forward.
template <typename scalar_t, typename acc_t, typename Launcher>
void launch_forward(const AttentionShape& sh, Params<scalar_t, acc_t>& p, const at::TensorOptions& options,
                    const Launcher& launch, const at::Tensor& given_tables) {
  if constexpr (std::is_same_v<acc_t, double>) {
    launch(forward_kernel<scalar_t, acc_t>, grid_blocks(sh, sh.N), kThreads,
           sizeof(acc_t) * forward_smem_elems(p.D, p.Dv), p);
  } else {
    if (decode_forward(sh.N)) {
      const at::Tensor tables = build_tables(sh, p, options, launch, given_tables);
      launch_decode(sh, p, options, launch);
      return;
    }
    const size_t smem = sizeof(float) * tiled_forward_smem_floats(p.Dv, p.phi == Phi::kOdd);
    if (smem > launch.smem_optin) {  // (Dv > 128 on GPUs with 99 KiB per block: the simple kernel)
      launch(forward_kernel<scalar_t, acc_t>, grid_blocks(sh, sh.N), kThreads,
             sizeof(acc_t) * forward_smem_elems(p.D, p.Dv), p);
      return;
    }
    const at::Tensor tables = build_tables(sh, p, options, launch, given_tables);
    const int64_t blocks = grid_blocks(sh, sh.N, kFwdRows);
    const int threads = forward_threads(p.Dv);
    ForwardColumns::dispatch(p.Dv, [&](auto kO) {  // (tile_switch.h)
      with_phi(p.phi, [&](auto kPhi) {
        launch(forward_tiled_kernel<scalar_t, decltype(kO)::value, decltype(kPhi)::value>, blocks, threads, smem, p);
      });
    });
  }
}

template <typename Launcher>
std::tuple<at::Tensor, at::Tensor> forward_impl(const at::Tensor& q_in, const at::Tensor& k_in,
                                                const at::Tensor& v_in, const at::Tensor& radius_in, double power,
                                                const std::optional<at::Tensor>& attn_mask,
                                                const std::optional<at::Tensor>& key_bias, bool causal,
                                                double dropout_p, int64_t seed, double normaliser_eps,
                                                const std::optional<at::Tensor>& tables_in, const Launcher& launch,
                                                c10::string_view phi = "power") {
  PreparedInputs in =
      prepare_inputs(q_in, k_in, v_in, radius_in, power, attn_mask, key_bias, causal, dropout_p, phi, "forward");
  const Phi kphi = kernel_phi(phi, power);
  const AttentionShape& sh = in.sh;
  at::Tensor tables = checked_tables(tables_in, q_in, cuda_table_floats(sh, in.dtype));
  at::Tensor nan_rows;  // (see scores_all_finite)
  if (sh.B * sh.H * sh.N * sh.M > 0 && !scores_all_finite(in)) {
    nan_rows = nan_score_rows(in, causal);
    tables = at::Tensor();  // (built from the finite inputs)
  }
  const double log_eps = null_key_log_eps(normaliser_eps);
  at::Tensor out = at::empty({sh.B, sh.H, sh.N, sh.Dv}, in.q.options());
  // lse is float64 for every dtype: it can be of order 1e3, and the backward needs it to the
  // accumulation type's accuracy relative to 1 (it reads it as two acc_t, see Params::lse_in)
  at::Tensor lse = at::empty({sh.B, sh.H, sh.N}, in.q.options().dtype(at::kDouble));
  if (sh.B * sh.H * sh.N == 0) return {out, lse};
  // instantiated for float32, float64, float16 and bfloat16: limits::kCudaDtypes
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in.dtype, "fourier_attention_forward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    Params<scalar_t, acc_t> p = make_params<scalar_t, acc_t>(sh, in.q, in.k, in.v, in.radius, in.mask,
                                                             in.key_bias, power, kphi, causal, dropout_p, seed);
    p.out = out.data_ptr<scalar_t>();
    p.lse = lse.data_ptr<double>();
    if (kphi == Phi::kOdd) p.log_eps = log_eps;  // (odd p: the kernels apply the null key, signed_row_scale)
    launch_forward(sh, p, in.q.options(), launch, tables);
  });
  if (nan_rows.defined()) {
    out.masked_fill_(nan_rows.unsqueeze(-1), NAN);
    lse.masked_fill_(nan_rows, NAN);
  }
  if (kphi != Phi::kOdd) scale_by_null_key(out, lse, log_eps);  // (odd p: the kernels applied it)
  return {out, lse};
}

// The backward's score cache budget at this call (score_cache.h): FOURIERFORMER_SCORE_CACHE_MB
// where set, else the share of `free_memory()`, the launcher's device memory free now (asked only
// then); raises on a setting that is not a whole number of MiB.
template <typename FreeMemory>
int64_t score_cache_budget_now(const FreeMemory& free_memory) {
  const char* setting = std::getenv("FOURIERFORMER_SCORE_CACHE_MB");
  const bool set = setting != nullptr && *setting != '\0';
  const int64_t budget = score_cache_budget(set ? 0 : free_memory(), setting);
  TORCH_CHECK(budget >= 0, "FOURIERFORMER_SCORE_CACHE_MB must be a whole number of MiB (0: no score cache), got \"",
              setting, "\"");
  return budget;
}

// Blocks of kFwdThreads threads (launch bounds: at most 2 per SM) and `smem` bytes of shared
// memory that the launcher's GPU runs at once.
template <typename Launcher>
int64_t resident_blocks(const Launcher& launch, size_t smem) {
  const int64_t per_sm = (int64_t)(launch.smem_per_sm / (smem + 1024));  // (1 KiB per block: the CUDA runtime's)
  return (int64_t)launch.sm_count * (per_sm < 1 ? 1 : per_sm > 2 ? 2 : per_sm);
}

// The main pass of the tiled backward, by its value columns (up to 4 kO, DvTile: MainPassColumns in
// tile_switch.h) and by whether it reads the pre-pass's scores (kCache: p.score_cache) or computes them; with the
// cache, split over the features where the grid is small (main_pass_splits).
template <typename scalar_t, bool kCache, typename Launcher>
void launch_main_tiled(const AttentionShape& sh, Params<scalar_t, float> p, const Launcher& launch) {
  const size_t smem = sizeof(float) * tiled_main_smem_floats(p.Dp, p.Dv);
  const int64_t tiles = grid_blocks(sh, sh.M, kFwdKeys);
  const int splits = kCache ? main_pass_splits(tiles, p.Dp, resident_blocks(launch, smem), launch.max_grid_splits) : 1;
  p.split_features = main_split_features(p.Dp, splits);
  p.main_splits = (p.Dp + p.split_features - 1) / p.split_features;
  const int64_t blocks = tiles * p.main_splits;
  MainPassColumns::dispatch(p.Dv, [&](auto kO) {
    // (with the cache the scores are the pre-pass's: main_pass_phi)
    with_phi(main_pass_phi(p.phi, kCache), [&](auto kPhi) {
      launch(backward_main_tiled_kernel<scalar_t, decltype(kO)::value, kCache,
                                        main_pass_phi(decltype(kPhi)::value, kCache)>,
             blocks, kFwdThreads, smem, p);
    });
  });
}

// float64 and head dims above kBwdMaxFeatures / kBwdMaxValueColumns: the simple path
// (backward.cuh); the rest: the tables, then the tiled pre-pass, main pass and dq kernels
// (backward_tiled.cuh).
template <typename scalar_t, typename acc_t, typename Launcher>
void launch_backward(const AttentionShape& sh, Params<scalar_t, acc_t>& p, const at::TensorOptions& options,
                     const Launcher& launch, const at::Tensor& given_tables) {
  if constexpr (!std::is_same_v<acc_t, double>) {
    const int Dp = padded_features(p.D);  // (p.Dp is set with the tables)
    const int64_t row_blocks = grid_blocks(sh, sh.N, kFwdRows);
    // the pre-pass's scores kept for the main pass, where they fit the launcher's budget at this
    // call (score_cache.h)
    // (Phi::kOdd: the scores' signs after them, score_sign_bytes)
    const int64_t cache_bytes = score_cache_bytes(sh.B * sh.H, sh.N, sh.M) +
                                (p.phi == Phi::kOdd ? score_sign_bytes(sh.B * sh.H, sh.N, sh.M) : 0);
    const bool cache = sh.N > 0 && sh.M > 0 && cache_bytes <= launch.score_cache_budget();
    // the pre-pass in one or two halves (delta_pass_split: where the grid is small), two only with
    // the cache (the halves' scores round otherwise than the main pass's, whose P must be the
    // pre-pass's bit for bit)
    const size_t delta_smem = sizeof(float) * tiled_delta_smem_floats(p.Dv);
    const size_t delta_split_smem = sizeof(float) * tiled_delta_smem_floats(p.Dv, 2);
    const int delta_split =
        cache && delta_split_smem <= launch.smem_optin
            ? delta_pass_split(row_blocks, Dp, resident_blocks(launch, delta_smem), launch.max_grid_splits)
            : 1;
    const size_t tiled_smem = std::max(delta_split == 2 ? delta_split_smem : delta_smem,
                                       sizeof(float) * (size_t)tiled_main_smem_floats(Dp, p.Dv));
    if (tiled_backward_takes(Dp, p.Dv) && tiled_smem <= launch.smem_optin) {
      const at::Tensor tables = build_tables(sh, p, options, launch, given_tables);
      const at::Tensor dq_acc = at::zeros({sh.B * sh.H * sh.N * p.Dp}, options.dtype(at::kFloat));
      p.dq_acc = dq_acc.data_ptr<float>();
      const at::Tensor dv_acc = at::empty({sh.B * sh.H * sh.M * sh.Dv}, options.dtype(at::kFloat));
      p.dv_acc = dv_acc.data_ptr<float>();
      at::Tensor score_cache;
      if (cache) {
        score_cache = at::empty({(cache_bytes + 3) / (int64_t)sizeof(float)}, options.dtype(at::kFloat));
        p.score_cache = score_cache.data_ptr<float>();
      }
      with_phi(p.phi, [&](auto kPhi) {
        constexpr Phi phi = decltype(kPhi)::value;
        if (sh.N > 0 && delta_split == 2)
          launch(backward_delta_tiled_kernel<scalar_t, 2, phi>, row_blocks, 2 * kFwdThreads, delta_split_smem, p);
        else if (sh.N > 0)
          launch(backward_delta_tiled_kernel<scalar_t, 1, phi>, row_blocks, kFwdThreads, delta_smem, p);
      });
      if (sh.M > 0) {  // with N = 0 this writes zero dk and dv
        if (p.score_cache)
          launch_main_tiled<scalar_t, true>(sh, p, launch);
        else
          launch_main_tiled<scalar_t, false>(sh, p, launch);
      }
      if (sh.N > 0)
        launch(backward_dq_finish_kernel<scalar_t>, row_blocks, kFwdThreads, sizeof(float) * kBwdMaxFeatures, p);
      return;
    }
  }
  if (sh.N > 0)
    launch(backward_dq_kernel<scalar_t, acc_t>, grid_blocks(sh, sh.N), kThreads,
           sizeof(acc_t) * dq_smem_elems(p.D, p.Dv), p);
  if (sh.M > 0)  // with N = 0 this writes zero dk and dv
    launch(backward_dkv_kernel<scalar_t, acc_t>, grid_blocks(sh, sh.M), kThreads,
           sizeof(acc_t) * dkv_smem_elems(p.D, p.Dv), p);
}

template <typename Launcher>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_impl(
    const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& radius_in, const at::Tensor& out_in, const at::Tensor& lse_in, double power,
    const std::optional<at::Tensor>& attn_mask, const std::optional<at::Tensor>& key_bias, bool causal,
    double dropout_p, int64_t seed, double normaliser_eps, const std::optional<at::Tensor>& tables_in,
    const Launcher& launch, c10::string_view phi = "power") {
  PreparedInputs in =
      prepare_inputs(q_in, k_in, v_in, radius_in, power, attn_mask, key_bias, causal, dropout_p, phi, "backward");
  const Phi kphi = kernel_phi(phi, power);
  at::Tensor tables = checked_tables(tables_in, q_in, cuda_table_floats(in.sh, in.dtype));
  const double log_eps = null_key_log_eps(normaliser_eps);
  const AttentionShape& sh = in.sh;
  TORCH_CHECK(out_in.dim() == 4 && out_in.size(0) == sh.B && out_in.size(1) == sh.H && out_in.size(2) == sh.N &&
                  out_in.size(3) == sh.Dv && dout_in.sizes() == out_in.sizes(),
              "fourier_attention backward: grad_out and out must be (B, H, N, Dv)");
  TORCH_CHECK(lse_in.dim() == 3 && lse_in.size(0) == sh.B && lse_in.size(1) == sh.H && lse_in.size(2) == sh.N,
              "fourier_attention backward: lse must be (B, H, N), got ", lse_in.sizes());
  TORCH_CHECK(out_in.device() == in.q.device() && dout_in.device() == in.q.device() &&
                  lse_in.device() == in.q.device(),
              "fourier_attention backward: grad_out, out and lse must be on q's device");
  // out is checked but not read: the dq kernel sums Delta_i = dO_i . O_i from the P it recomputes
  // (see backward_dq_kernel)
  const at::Tensor dout = dout_in.to(in.dtype).contiguous();
  at::Tensor lse = lse_in.to(at::kDouble).contiguous();
  // (see scores_all_finite) the kernels run on the finite inputs and skip the NaN rows (lse +inf,
  // as a row that sees no key); those rows' gradients are NaN where the formula's are
  at::Tensor nan_rows, visible;
  if (sh.B * sh.H * sh.N * sh.M > 0 && !scores_all_finite(in)) {
    visible = visible_keys(in, causal);
    nan_rows = nan_score_rows(in, causal) | at::isnan(lse);
    lse = lse.masked_fill(nan_rows, INFINITY);
    tables = at::Tensor();
  }
  at::Tensor dq = at::empty(in.q.sizes(), in.q.options());
  at::Tensor dk = at::empty(in.k.sizes(), in.k.options());
  at::Tensor dv = at::empty(in.v.sizes(), in.v.options());
  at::Tensor dradius = at::zeros({sh.H, sh.D}, in.q.options().dtype(in.acc));
  at::Tensor delta = at::empty({sh.B, sh.H, sh.N}, in.q.options().dtype(in.acc));
  at::Tensor lse_bwd = at::empty({sh.B, sh.H, sh.N}, in.q.options().dtype(at::kDouble));
  // (Phi::kOdd: the rows' normaliser signs, Params::row_sign)
  const at::Tensor row_sign =
      kphi == Phi::kOdd ? at::empty({sh.B, sh.H, sh.N}, in.q.options().dtype(in.acc)) : at::Tensor();
  if (sh.B * sh.H > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in.dtype, "fourier_attention_backward_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      Params<scalar_t, acc_t> p = make_params<scalar_t, acc_t>(sh, in.q, in.k, in.v, in.radius, in.mask,
                                                               in.key_bias, power, kphi, causal, dropout_p, seed);
      p.dout = dout.data_ptr<scalar_t>();
      p.lse_in = lse.data_ptr<double>();
      p.delta = delta.data_ptr<acc_t>();
      p.lse_bwd = lse_bwd.data_ptr<double>();
      p.row_sign = row_sign.defined() ? row_sign.data_ptr<acc_t>() : nullptr;
      p.log_eps = log_eps;
      p.dq = dq.data_ptr<scalar_t>();
      p.dk = dk.data_ptr<scalar_t>();
      p.dv = dv.data_ptr<scalar_t>();
      p.dradius = dradius.data_ptr<acc_t>();
      launch_backward(sh, p, in.q.options(), launch, tables);
    });
  }
  if (nan_rows.defined()) {
    const at::Tensor seen = (visible & nan_rows.unsqueeze(-1)).any(2).unsqueeze(-1);  // (B, H, M, 1)
    dq.masked_fill_(nan_rows.unsqueeze(-1), NAN);
    dk.masked_fill_(seen, NAN);
    dv.masked_fill_(seen, NAN);
    dradius.masked_fill_(nan_rows.any(2).any(0).unsqueeze(-1), NAN);
  }
  return {dq, dk, dv, dradius.to(radius_in.scalar_type())};
}

}  // namespace cuda
}  // namespace fourierformer
