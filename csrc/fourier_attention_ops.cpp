// The `fourierformer` operator library: schemas, shared input checks, and the Python
// module `fourierformer_fairseq._C` that loading registers them through.
#include <Python.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "cuda/score_cache.h"
#include "cuda/table_layout.h"
#include "fourier_attention.h"

#ifndef FF_TORCH_VERSION
#define FF_TORCH_VERSION "unknown"
#endif
#ifndef FF_CUDA_VERSION
#define FF_CUDA_VERSION ""
#endif

namespace fourierformer {
namespace {

// A rule of backend_limits.h on p, in words ("even p >= 2", "integer p >= 1").
std::string fused_power_rule(double min_power, double multiple) {
  std::ostringstream rule;
  if (multiple == 1.0) {
    rule << "integer p";
  } else if (multiple == 2.0) {
    rule << "even p";
  } else {
    rule << "p a multiple of " << multiple;
  }
  rule << " >= " << min_power;
  return rule.str();
}

}  // namespace

void check_no_kept_weights(const std::optional<at::Tensor>& weights) {
  TORCH_CHECK(!weights.has_value(), "fourier_attention backward (cuda): the CUDA kernels keep no weights (the CPU's "
              "fourier_attention_forward_with_weights does), got weights of shape ", weights->sizes());
}

void check_phi(c10::string_view phi, double power, bool on_cpu) {
  bool listed = false;
  std::string others;  // the phis besides "power", for the message
  auto scan = [&](const auto& phis) {
    for (const char* name : phis) {
      listed |= phi == name;
      if (std::string(name) != "power") others += std::string(", or phi = ") + name;
    }
  };
  if (on_cpu)
    scan(limits::kCpuPhis);
  else
    scan(limits::kCudaPhis);
  const double min_power = on_cpu ? limits::kCpuMinPower : limits::kCudaMinPower;
  const double multiple = on_cpu ? limits::kCpuPowerMultiple : limits::kCudaPowerMultiple;
  const bool powered = phi == "power" && power >= min_power && std::fmod(power, multiple) == 0.0;
  const bool unit = phi != "power" && power == limits::kUnitPower;
  TORCH_CHECK(listed && (powered || unit), "fourier_attention: the ", on_cpu ? "cpu" : "cuda",
              " kernels take phi(x) = x^p with ", fused_power_rule(min_power, multiple), others,
              " (with p = 1), got phi = ", std::string(phi), ", p = ", power, "; other phis run on the reference backend");
}

AttentionShape check_forward_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& radius, double power,
                                    const std::optional<at::Tensor>& attn_mask,
                                    const std::optional<at::Tensor>& key_bias, bool causal, double dropout_p,
                                    c10::string_view phi, bool on_cpu) {
  TORCH_CHECK(q.dim() == 4, "fourier_attention: q must be (B, H, N, D), got ", q.sizes());
  TORCH_CHECK(k.dim() == 4, "fourier_attention: k must be (B, H, M, D), got ", k.sizes());
  TORCH_CHECK(v.dim() == 4, "fourier_attention: v must be (B, H, M, Dv), got ", v.sizes());
  AttentionShape s{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  TORCH_CHECK(k.size(0) == s.B && k.size(1) == s.H && k.size(3) == s.D, "fourier_attention: k has shape ",
              k.sizes(), ", q has shape ", q.sizes());
  TORCH_CHECK(v.size(0) == s.B && v.size(1) == s.H && v.size(2) == s.M, "fourier_attention: v has shape ",
              v.sizes(), ", k has shape ", k.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "fourier_attention: q, k, v must share a dtype");
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device() && q.device() == radius.device(),
              "fourier_attention: q, k, v, radius must be on one device");
  TORCH_CHECK(radius.dim() == 2 && radius.size(0) == s.H && radius.size(1) == s.D,
              "fourier_attention: the kernel takes radius expanded to (H, D) = (", s.H, ", ", s.D, "), got ",
              radius.sizes());
  check_phi(phi, power, on_cpu);
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "fourier_attention: dropout_p must be in [0, 1), got ",
              dropout_p);
  TORCH_CHECK(!causal || s.N <= s.M, "fourier_attention: causal attention needs N <= M");
  if (attn_mask.has_value()) {
    const at::Tensor& m = *attn_mask;
    TORCH_CHECK(m.dim() == 4 && (m.size(0) == 1 || m.size(0) == s.B) && (m.size(1) == 1 || m.size(1) == s.H) &&
                    m.size(2) == s.N && m.size(3) == s.M,
                "fourier_attention: attn_mask must be (B|1, H|1, N, M), got ", m.sizes());
    TORCH_CHECK(m.is_floating_point() || m.scalar_type() == at::kBool,
                "fourier_attention: attn_mask must be an additive float mask or a bool mask, got ", m.scalar_type());
    TORCH_CHECK(m.device() == q.device(), "fourier_attention: attn_mask is on another device than q");
  }
  if (key_bias.has_value()) {
    const at::Tensor& m = *key_bias;
    TORCH_CHECK(m.dim() == 2 && m.size(0) == s.B && m.size(1) == s.M,
                "fourier_attention: key_bias must be (B, M), got ", m.sizes());
    TORCH_CHECK(m.is_floating_point() || m.scalar_type() == at::kBool,
                "fourier_attention: key_bias must be an additive float mask or a bool mask, got ", m.scalar_type());
    TORCH_CHECK(m.device() == q.device(), "fourier_attention: key_bias is on another device than q");
  }
  return s;
}

AttentionShape check_table_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& radius) {
  TORCH_CHECK(q.dim() == 4, "fourier_attention_tables: q must be (B, H, N, D), got ", q.sizes());
  TORCH_CHECK(k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
              "fourier_attention_tables: k must be (B, H, M, D) with q's B, H and D, got ", k.sizes(), " and q ",
              q.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), "fourier_attention_tables: q and k must share a dtype");
  TORCH_CHECK(radius.dim() == 2 && radius.size(0) == q.size(1) && radius.size(1) == q.size(3),
              "fourier_attention_tables: radius must be (H, D) = (", q.size(1), ", ", q.size(3), "), got ",
              radius.sizes());
  TORCH_CHECK(q.device() == k.device() && q.device() == radius.device(),
              "fourier_attention_tables: q, k, radius must be on one device");
  return AttentionShape{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), 0};
}

int64_t cuda_table_floats(const AttentionShape& sh, at::ScalarType dtype) {
  if (dtype == at::kDouble) return 0;
  return cuda::table_floats(sh.B * sh.H, sh.H, sh.N, sh.M, cuda::padded_features((int)sh.D));
}

at::Tensor checked_tables(const std::optional<at::Tensor>& tables, const at::Tensor& q, int64_t floats) {
  if (!tables.has_value()) return at::Tensor();
  const at::Tensor& t = *tables;
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.numel() == floats && t.is_contiguous() &&
                  t.device() == q.device(),
              "fourier_attention: tables must be what fourier_attention_tables(q, k, radius) returned for these "
              "inputs (", floats, " float32 elements on ", q.device(), "), got ", t.scalar_type(), " ", t.sizes(),
              " on ", t.device());
  // a view that does not start on the kernels' float4 boundary (a slice of a larger buffer, say):
  // read from an aligned copy (the same values, so the same results bit for bit)
  if (t.numel() > 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % cuda::kTableAlignBytes != 0) return t.clone();
  return t;
}

double null_key_log_eps(double normaliser_eps) {
  TORCH_CHECK(std::isfinite(normaliser_eps) && normaliser_eps >= 0.0,
              "fourier_attention: normaliser_eps must be finite and >= 0, got ", normaliser_eps);
  return normaliser_eps > 0.0 ? std::log(normaliser_eps) : -std::numeric_limits<double>::infinity();
}

void scale_by_null_key(at::Tensor& out, const at::Tensor& lse, double log_eps) {
  if (!(log_eps > -std::numeric_limits<double>::infinity()) || out.numel() == 0) return;
  // m_i = sigmoid(lse_i - log eps) in float64 (1 for rows at lse = +inf, whose out is 0);
  // the product in float32 at least, rounded once to out's dtype
  const at::ScalarType compute = out.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor share = at::sigmoid(lse - log_eps).to(compute).unsqueeze(-1);
  out.copy_(out.to(compute) * share);
}

at::Tensor additive_mask(const at::Tensor& mask, at::ScalarType dtype) {
  if (mask.scalar_type() != at::kBool) return mask.to(dtype);
  return at::zeros(mask.sizes(), mask.options().dtype(dtype))
      .masked_fill_(mask, -std::numeric_limits<double>::infinity());
}

at::Tensor prepare_mask(const at::Tensor& mask, at::ScalarType dtype) {
  at::Tensor m = additive_mask(mask, dtype);
  if (m.stride(3) != 1 && m.size(3) > 1) m = m.contiguous();
  return m;
}

TORCH_LIBRARY(fourierformer, m) {
  // normaliser_eps: out_i = sum_j w_ij v_j / (sum_j w_ij + eps), the published code's normaliser
  // (see null_key_share in fourier_element_math.h); lse stays the log-sum over the real keys.
  // phi: "power" (|sinc|^p, even p), "abs" (|sinc|, power 1), "relu" (max(sinc, 0), power 1), where
  // the backend runs it (limits::kCpuPhis, kCudaPhis; check_phi).
  m.def(
      // attn_mask (B|1, H|1, N, M) and key_bias (B, M): additive float masks, or bool (true = masked)
      "fourier_attention_forward(Tensor q, Tensor k, Tensor v, Tensor radius, float power, Tensor? attn_mask, "
      "Tensor? key_bias, bool causal, float dropout_p, int seed, float normaliser_eps=0.0, Tensor? tables=None, "
      "str phi=\"power\") -> (Tensor, Tensor)");
  m.def(
      "fourier_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor radius, Tensor out, "
      "Tensor lse, float power, Tensor? attn_mask, Tensor? key_bias, bool causal, float dropout_p, int seed, "
      "float normaliser_eps=0.0, Tensor? tables=None, str phi=\"power\", Tensor? weights=None) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  // The forward that also returns the weights it kept for its backward (the CPU's float32 calls
  // without dropout: fourier_attention_forward_with_weights_cpu), whose weights argument takes them
  // in place of recomputing them: the autograd calls it where they take no more memory than q
  // (ops/fused.py).
  m.def(
      "fourier_attention_forward_with_weights(Tensor q, Tensor k, Tensor v, Tensor radius, float power, "
      "Tensor? attn_mask, Tensor? key_bias, bool causal, float dropout_p, int seed, float normaliser_eps=0.0, "
      "Tensor? tables=None, str phi=\"power\") -> (Tensor, Tensor, Tensor)");
  // tables: what the forward and the backward of the CUDA float32 path (float32, float16, bfloat16)
  // build from q, k and radius before their kernels (cuda/tables.cuh), built once and passed to
  // both (the autograd does, ops/fused.py) instead of twice; a float32 vector, empty where the
  // backend builds none (CPU, float64). The ops build their own when tables is None.
  m.def("fourier_attention_tables(Tensor q, Tensor k, Tensor radius) -> Tensor");
}

// The tables are not differentiable (the forward's and backward's gradients go to q, k and radius).
TORCH_LIBRARY_IMPL(fourierformer, Autograd, m) {
  m.impl("fourier_attention_tables", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(fourierformer, CPU, m) {
  m.impl("fourier_attention_tables", &fourier_attention_tables_cpu);
  m.impl("fourier_attention_forward", &fourier_attention_forward_cpu);
  m.impl("fourier_attention_forward_with_weights", &fourier_attention_forward_with_weights_cpu);
  m.impl("fourier_attention_backward", &fourier_attention_backward_cpu);
}

}  // namespace fourierformer

namespace {

template <size_t N>
PyObject* name_tuple(const char* const (&names)[N]) {
  PyObject* t = PyTuple_New(N);
  for (size_t i = 0; t != nullptr && i < N; ++i) PyTuple_SET_ITEM(t, i, PyUnicode_FromString(names[i]));
  return t;
}

// {"cpu": {...}, "cuda": {...}}: the limits of backend_limits.h for Python (ops/backends.py),
// with the rule on p in words (power_rule) and the op's phis each backend runs (phis). A limit a backend does not have is None.
PyObject* backend_limits_dict() {
  namespace L = fourierformer::limits;
  const std::string cpu_rule = fourierformer::fused_power_rule(L::kCpuMinPower, L::kCpuPowerMultiple);
  const std::string cuda_rule = fourierformer::fused_power_rule(L::kCudaMinPower, L::kCudaPowerMultiple);
  PyObject* cpu = Py_BuildValue("{s:s,s:N,s:N,s:d,s:d,s:s,s:O,s:O,s:O,s:L}", "device", "cpu", "dtypes",
                                name_tuple(L::kCpuDtypes), "phis", name_tuple(L::kCpuPhis), "min_power", L::kCpuMinPower, "power_multiple",
                                L::kCpuPowerMultiple, "power_rule", cpu_rule.c_str(), "max_head_dim", Py_None,
                                "seq_len_bound", Py_None, "tiled_backward_max_head_dim", Py_None,
                                "key_table_keys", (long long)L::kCpuKeyTableKeys);
  PyObject* cuda = Py_BuildValue("{s:s,s:N,s:N,s:d,s:d,s:s,s:i,s:L,s:i}", "device", "cuda", "dtypes",
                                 name_tuple(L::kCudaDtypes), "phis", name_tuple(L::kCudaPhis), "min_power", L::kCudaMinPower, "power_multiple",
                                 L::kCudaPowerMultiple, "power_rule", cuda_rule.c_str(), "max_head_dim",
                                 L::kCudaMaxHeadDim, "seq_len_bound", (long long)L::kCudaSeqLenBound,
                                 "tiled_backward_max_head_dim", L::kCudaTiledBackwardMaxHeadDim);
  if (cpu == nullptr || cuda == nullptr) {
    Py_XDECREF(cpu);
    Py_XDECREF(cuda);
    return nullptr;
  }
  return Py_BuildValue("{s:N,s:N}", "cpu", cpu, "cuda", cuda);
}

// _C.cuda_table_floats(B, H, N, M, D): the size of fourier_attention_tables' output on CUDA for
// float32, float16 and bfloat16 (its shape function, ops/fused.py).
PyObject* py_cuda_table_floats(PyObject*, PyObject* args) {
  long long B, H, N, M, D;
  if (!PyArg_ParseTuple(args, "LLLLL", &B, &H, &N, &M, &D)) return nullptr;
  const fourierformer::AttentionShape sh{B, H, N, M, D, 0};
  return PyLong_FromLongLong(fourierformer::cuda_table_floats(sh, at::kFloat));
}

// _C.score_cache_budget(free_bytes, setting=None) and _C.score_cache_bytes(B, H, N, M): the CUDA
// float32 backward's rule for its score cache (cuda/score_cache.h), for the tests on any machine.
PyObject* py_score_cache_budget(PyObject*, PyObject* args) {
  long long free_bytes;
  const char* setting = nullptr;
  if (!PyArg_ParseTuple(args, "L|z", &free_bytes, &setting)) return nullptr;
  const int64_t budget = fourierformer::cuda::score_cache_budget(free_bytes, setting);
  if (budget < 0) {
    PyErr_Format(PyExc_ValueError, "FOURIERFORMER_SCORE_CACHE_MB must be a whole number of MiB (0: no score cache), "
                 "got \"%s\"", setting);
    return nullptr;
  }
  return PyLong_FromLongLong(budget);
}

PyObject* py_score_cache_bytes(PyObject*, PyObject* args) {
  long long B, H, N, M;
  if (!PyArg_ParseTuple(args, "LLLL", &B, &H, &N, &M)) return nullptr;
  return PyLong_FromLongLong(fourierformer::cuda::score_cache_bytes(B * H, N, M));
}

PyMethodDef module_methods[] = {
    {"cuda_table_floats", py_cuda_table_floats, METH_VARARGS,
     "cuda_table_floats(B, H, N, M, D): float32 elements of fourier_attention_tables' output on CUDA "
     "(float32, float16, bfloat16 inputs)"},
    {"score_cache_budget", py_score_cache_budget, METH_VARARGS,
     "score_cache_budget(free_bytes, setting=None): the bytes the CUDA float32 backward may keep its scores in "
     "with free_bytes of device memory free and FOURIERFORMER_SCORE_CACHE_MB set to setting (None: unset)"},
    {"score_cache_bytes", py_score_cache_bytes, METH_VARARGS,
     "score_cache_bytes(B, H, N, M): the bytes of the CUDA float32 backward's score cache for a call"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// `import fourierformer_fairseq._C` loads this library (which registers the ops above) and
// exposes how it was built, so the loader can tell a stale build from a working one, and
// what each fused backend accepts (backend_limits).
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "fused Fourier attention kernels", -1,
                                          module_methods};
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  PyModule_AddStringConstant(module, "torch_version", FF_TORCH_VERSION);
  PyModule_AddStringConstant(module, "cuda_version", FF_CUDA_VERSION);
  PyModule_AddStringConstant(module, "cpu_isa", fourierformer::cpu_kernel_isa());
  PyObject* limits = backend_limits_dict();
  if (limits == nullptr || PyModule_AddObject(module, "backend_limits", limits) < 0) {
    Py_XDECREF(limits);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
