"""Backend declarations (ops/backends.py): every reason, the C++ limits they read, the fallback warning."""
import warnings

import pytest
import torch

import fourierformer_fairseq.ops as ops
from fourierformer_fairseq.ops import DECLARATIONS, fourier_attention, select_backend
from fourierformer_fairseq.ops.extension import extension_status
from fourierformer_fairseq.ops.inputs import prepare_inputs
from helpers import random_qkv

LOADED = extension_status().loaded
needs_extension = pytest.mark.skipif(not LOADED, reason=f"extension: {extension_status().reason}")
CPU, CUDA = DECLARATIONS["cpu"], DECLARATIONS["cuda"]


def inputs(B=1, H=2, N=3, M=4, D=5, Dv=6, dtype=torch.float32, seed=0, **kw):
    """q, k, v (drawn in float32, then cast to dtype), the radius 0.9 and the op's keywords kw."""
    q, k, v = random_qkv(B, H, N, M, D, Dv, seed=seed, to=dtype)
    return q, k, v, torch.tensor(0.9, dtype=dtype), kw


def reasons(backend, q, k, v, r, kw):
    return backend.not_supported_reasons(prepare_inputs(q, k, v, r, **kw))


@needs_extension
def test_fused_limits_are_the_extensions():
    limits = extension_status().module.backend_limits
    for name, backend in (("cpu", CPU), ("cuda", CUDA)):
        assert backend.supported_dtypes == tuple(getattr(torch, n) for n in limits[name]["dtypes"])
        assert backend.max_head_dim == limits[name]["max_head_dim"]
        assert backend.min_power == limits[name]["min_power"]
        assert backend.power_multiple == limits[name]["power_multiple"]
        assert backend.power_rule == limits[name]["power_rule"] and backend.power_rule in backend.describe()
        assert backend.phis == limits[name]["phis"] and "power" in backend.phis
    assert CPU.max_head_dim is None and CUDA.max_head_dim is not None


@needs_extension
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cpu_declaration_agrees_with_the_cpu_op(dtype):
    """The raw C++ op runs exactly the dtypes and powers the declaration lists, and says the same."""
    q, k, v, r, _ = inputs(dtype=dtype)
    radius = r.to(torch.float64 if dtype == torch.float64 else torch.float32).expand(2, 5).contiguous()
    for power in (1.0, 2.0, 3.0, 4.0):
        powered = power >= CPU.min_power and power % CPU.power_multiple == 0
        declared = dtype in CPU.supported_dtypes and powered
        run = lambda: torch.ops.fourierformer.fourier_attention_forward(q, k, v, radius, power, None, None, False, 0.0, 0)  # noqa: E731
        if declared:
            out, _ = run()
            assert out.shape == (1, 2, 3, 6) and torch.isfinite(out).all()
        else:
            with pytest.raises(RuntimeError) as e:
                run()
            if dtype not in CPU.supported_dtypes and powered:
                for t in CPU.supported_dtypes:
                    assert str(t).replace("torch.", "") in str(e.value)
            if not powered:  # the C++ check and the declaration say the same rule
                assert CPU.power_rule in str(e.value)


@needs_extension
def test_cpu_op_takes_exactly_the_declared_phis():
    """The raw C++ op runs the phis the declaration lists (the others with power 1, "power" with a p
    under its power rule: every integer p >= 1 on the CPU) and refuses the rest, naming the phis it runs."""
    q, k, v, r, _ = inputs()
    radius = r.expand(2, 5).contiguous()
    for phi in ("power", "abs", "relu", "sigmoid"):
        for power in (1.0, 2.0, 3.0, 4.0):
            run = lambda: torch.ops.fourierformer.fourier_attention_forward(  # noqa: E731
                q, k, v, radius, power, None, None, False, 0.0, 0, 0.0, None, phi)
            powered = power >= CPU.min_power and power % CPU.power_multiple == 0
            takes = phi in CPU.phis and (powered if phi == "power" else power == 1.0)
            if takes:
                out, _ = run()
                assert torch.isfinite(out).all(), (phi, power)
            else:
                with pytest.raises(RuntimeError) as e:
                    run()
                assert CPU.power_rule in str(e.value), str(e.value)
                assert all(f"phi = {p}" in str(e.value) for p in CPU.phis if p != "power"), str(e.value)


@needs_extension
def test_each_reason_alone():
    """Each limit adds exactly its own reason to those of plain float32 inputs."""
    q, k, v, r, kw = inputs()
    assert reasons(CPU, q, k, v, r, kw) == []
    cuda_base = reasons(CUDA, q, k, v, r, kw)
    assert "inputs are on cpu" in cuda_base  # plus, on a machine without CUDA, why it cannot run at all
    assert cuda_base == list(CUDA.not_supported_reasons()) + ["inputs are on cpu"]
    # odd p (signed weights) adds no reason on either backend: their power rules take every integer p >= 1
    assert reasons(CPU, q, k, v, r, dict(power=3)) == [] and reasons(CUDA, q, k, v, r, dict(power=3)) == cuda_base
    cases = [
        (CPU, dict(dtype=torch.float16), "the cpu kernel takes torch.float32, torch.float64, got torch.float16"),
        (CPU, dict(attn_mask=torch.zeros(3, 4, requires_grad=True)), "attn_mask requires grad"),
        (CUDA, dict(D=CUDA.max_head_dim + 1), f"head dims up to {CUDA.max_head_dim}, got D = {CUDA.max_head_dim + 1}"),
        (CUDA, dict(Dv=CUDA.max_head_dim + 1), f"Dv = {CUDA.max_head_dim + 1}"),
    ]
    for backend, override, expected in cases:
        dtype = override.pop("dtype", torch.float32)
        shape = {n: override.pop(n) for n in ("D", "Dv") if n in override}
        q, k, v, r, _ = inputs(dtype=dtype, **shape)
        base = [] if backend is CPU else cuda_base
        got = reasons(backend, q, k, v, r, override)
        added = [g for g in got if g not in base]
        assert got[: len(base)] == base and len(added) == 1 and expected in added[0], (override, got)
    # no head-dim limit on the CPU; float16 is a dtype of the CUDA kernels
    q, k, v, r, kw = inputs(D=CUDA.max_head_dim + 1, dtype=torch.float16)
    assert not any("head dims" in g for g in reasons(CPU, q, k, v, r, kw))
    assert not any("kernel takes torch" in g for g in reasons(CUDA, q, k, v, r, kw))


@needs_extension
def test_cuda_sequence_length_bound():
    bound = CUDA.seq_len_bound
    q = torch.zeros(1, 1, 1, 2).expand(1, 1, bound, 2)  # no memory behind the expanded rows
    got = reasons(CUDA, q, q, q, torch.tensor(1.0), {})
    assert any(f"sequence lengths below {bound}, got N = {bound}" in g for g in got), got
    small = torch.zeros(1, 1, 2, 2)
    assert not any("sequence lengths" in g for g in reasons(CUDA, small, small, small, torch.tensor(1.0), {}))


@needs_extension
def test_all_reasons_are_listed_together():
    q, k, v, r, _ = inputs(dtype=torch.float16)
    mask = torch.zeros(3, 4, dtype=torch.float16, requires_grad=True)
    kw = dict(power=3, attn_mask=mask)
    got = reasons(CPU, q, k, v, r, kw)
    assert len(got) == 2, got  # the dtype and the mask (the CPU kernels take p = 3)
    with pytest.raises(ValueError) as e:
        fourier_attention(q, k, v, r, backend="cpu", **kw)
    for reason in got:
        assert reason in str(e.value)
    got = reasons(CUDA, q, k, v, r, kw)  # the mask and the device (the CUDA kernels take p = 3 too)
    assert sum(("attn_mask requires grad" in g) + ("inputs are on cpu" in g) for g in got) == 2, got
    assert not any("power" in g for g in got), got
    with pytest.raises(ValueError) as e:
        fourier_attention(q, k, v, r, backend="cuda", **kw)
    for reason in got:
        assert reason in str(e.value)


def test_reference_runs_everything():
    q, k, v, r, _ = inputs(dtype=torch.float16)
    kw = dict(phi="relu", power=3, attn_mask=torch.zeros(3, 4, dtype=torch.float16, requires_grad=True))
    assert reasons(DECLARATIONS["reference"], q, k, v, r, kw) == []
    assert select_backend("auto", prepare_inputs(q, k, v, r, **kw)) == "reference"


@needs_extension
def test_auto_falls_back_to_the_reference_with_one_warning(monkeypatch):
    monkeypatch.setattr(ops, "_warned_fallbacks", set())
    q, k, v, r, _ = inputs(dtype=torch.float16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fourier_attention(q, k, v, r)
        fourier_attention(q, k, v, r)
        fourier_attention(q.float(), k.float(), v.float(), r.float())  # the fused cpu kernel: no warning
    fallback = [w for w in caught if "runs the (slow" in str(w.message)]
    assert len(fallback) == 1, [str(w.message) for w in caught]
    assert issubclass(fallback[0].category, RuntimeWarning)
    message = str(fallback[0].message)
    for reason in CPU.not_supported_reasons(prepare_inputs(q, k, v, r)) + CUDA.not_supported_reasons(prepare_inputs(q, k, v, r)):
        assert reason in message
    with warnings.catch_warnings(record=True) as caught:  # another reason: a new warning
        warnings.simplefilter("always")
        mask = torch.zeros(3, 4, requires_grad=True)
        fourier_attention(q.float(), k.float(), v.float(), r.float(), attn_mask=mask)
        fourier_attention(q.float(), k.float(), v.float(), r.float(), attn_mask=mask)
    assert len([w for w in caught if "attn_mask requires grad" in str(w.message)]) == 1


def test_info_reports_the_declarations():
    from fourierformer_fairseq.info import describe

    text = describe(check_errors=False)  # (the check is test_info_reports_backends')
    for name, backend in DECLARATIONS.items():
        line = next(line for line in text.splitlines() if line.strip().startswith(name))
        expected = backend.not_supported_reasons()
        assert ("unavailable: " + "; ".join(expected) if expected else "available") in line
        assert backend.describe() in text


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_python_number_radius_is_a_fixed_radius_on_every_backend(dtype):
    """fourier_attention(q, k, v, 0.9): as a tensor radius 0.9 of the inputs' precision, on each backend
    that runs here; anything else that is not a tensor is refused by name."""
    q, k, v, r, kw = inputs(dtype=dtype)
    backends = ["reference"] + (["cpu"] if LOADED else [])
    for backend in backends:
        torch.testing.assert_close(fourier_attention(q, k, v, 0.9, backend=backend),
                                   fourier_attention(q, k, v, r, backend=backend), rtol=0, atol=0, msg=backend)
        assert prepare_inputs(q, k, v, 0.9).radius_hd.dtype == dtype
    with pytest.raises(TypeError, match="radius must be a tensor or a Python number, got str"):
        fourier_attention(q, k, v, "0.9")
