"""FourierMultiheadAttention on a GPU: half-precision parameters (fairseq's --fp16 / --bf16),
autocast (--amp), incremental decoding and the dropout seed. Needs a GPU with the CUDA kernels.

Tolerance rule for half precision: the module's error against its own float64 copy (the same
weights, the same rounded input, run through the reference backend) is at most 4 times the error
of fairseq's stock softmax MultiheadAttention against its float64 copy at the same dtype and
shapes, plus 4 eps of the dtype: both are dominated by the half-precision projections.
"""
from __future__ import annotations

import copy

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from fourierformer_fairseq.modules import FourierMultiheadAttention
from fourierformer_fairseq.ops import backend_unavailable_reason
from helpers import future_mask, max_relative_error

_reason = backend_unavailable_reason("cuda")
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(bool(_reason), reason=f"CUDA kernels: {_reason}")]

E, H, T, B = 64, 4, 24, 3
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _pair(**kw):
    """A Fourier module and its softmax twin, seeded, in float32 on the GPU."""
    torch.manual_seed(0)
    fourier = FourierMultiheadAttention(E, H, self_attention=True, **kw).cuda().eval()
    torch.manual_seed(0)
    softmax = MultiheadAttention(E, H, self_attention=True).cuda().eval()
    return fourier, softmax


def _run(m, x, causal):
    return m(x, x, x, attn_mask=future_mask(x.shape[0], dtype=x.dtype, device=x.device) if causal else None)[0]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", list(HALF))
def test_half_precision_parameters_match_float64(dtype, causal):
    dt = HALF[dtype]
    fourier, softmax = _pair()
    fourier.causal = causal  # as the decoder layer builds its self-attention
    x = torch.randn(T, B, E, device="cuda").to(dt)
    errs = {}
    grads = {}
    for name, m in (("fourier", fourier), ("softmax", softmax)):
        half = copy.deepcopy(m).to(dt).train(False)
        exact = copy.deepcopy(m).double()
        if name == "fourier":
            exact.backend = "reference"
        for p in half.parameters():
            p.requires_grad_(True)
        out = _run(half, x, causal)
        assert out.dtype == dt and torch.isfinite(out).all(), name
        out.float().square().mean().backward()
        grads[name] = {n: p.grad for n, p in half.named_parameters()}
        errs[name] = max_relative_error(out, _run(exact, x.double(), causal))
    eps = torch.finfo(dt).eps
    assert errs["fourier"] <= 4 * errs["softmax"] + 4 * eps, errs
    g = grads["fourier"]["radius"]
    assert g is not None and g.dtype == dt and torch.isfinite(g).all() and g.abs().sum() > 0
    assert all(torch.isfinite(t).all() for t in grads["fourier"].values())


@pytest.mark.parametrize("dtype", list(HALF))
def test_autocast_runs_the_fused_op_in_half_and_keeps_the_radius_float32(dtype):
    dt = HALF[dtype]
    fourier, softmax = _pair()
    x = torch.randn(T, B, E, device="cuda")
    exact = copy.deepcopy(fourier).double()
    exact.backend = "reference"
    errs = {}
    for name, m in (("fourier", fourier), ("softmax", softmax)):
        with torch.autocast("cuda", dtype=dt):
            out = _run(m, x, causal=True)
        assert torch.isfinite(out).all(), name
        out.float().square().mean().backward()
        ref = exact if name == "fourier" else copy.deepcopy(softmax).double()
        errs[name] = max_relative_error(out, _run(ref, x.double(), causal=True))
    assert errs["fourier"] <= 4 * errs["softmax"] + 4 * torch.finfo(dt).eps, errs
    assert fourier.radius.grad.dtype == torch.float32 and torch.isfinite(fourier.radius.grad).all()
    assert fourier.radius.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_incremental_decoding_on_cuda_equals_full_forward(dtype):
    fourier, _ = _pair()
    fourier = fourier.to(dtype)
    fourier.causal = True
    x = torch.randn(T, B, E, device="cuda").to(dtype)
    with torch.no_grad():
        full = _run(fourier, x, causal=True)
        state = {}
        steps = [fourier(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state)[0] for t in range(T)]
    # float32: the CPU test's tolerance; float16: a step and the full pass round the same float32
    # results to float16 (the kernels accumulate in float32), so they differ by a rounding at most
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(torch.float16).eps * full.abs().max().item()
    torch.testing.assert_close(torch.cat(steps), full, rtol=0, atol=tol)


def test_dropout_on_cuda_is_seeded_and_draws_the_cpu_mask():
    torch.manual_seed(0)
    m = FourierMultiheadAttention(E, H, self_attention=True, dropout=0.3).train()
    x = torch.randn(T, B, E)
    cpu = copy.deepcopy(m)
    gpu = copy.deepcopy(m).cuda()

    def run(module, seed, device):
        torch.manual_seed(seed)
        xi = x.to(device)
        return module(xi, xi, xi, attn_mask=future_mask(T).to(device))[0].detach().cpu()

    a, b, c = run(gpu, 1, "cuda"), run(gpu, 1, "cuda"), run(gpu, 2, "cuda")
    assert torch.equal(a, b), "the same seed gives the same dropout mask"
    assert not torch.allclose(a, c), "another seed gives another mask"
    # the mask is a hash of (seed, b*H + h, i, j): the CPU kernels draw the same one
    torch.testing.assert_close(a, run(cpu, 1, "cpu"), rtol=1e-4, atol=1e-5)
