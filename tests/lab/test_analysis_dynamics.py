"""The tools of scripts/analysis/dynamics/: adam_steps and attention_entropy, on inputs whose answers
are computed here."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from repo import load, script


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# --------------------------------------------------------------------------- adam_steps
def _adam_checkpoint(tmp_path, spike):
    """A fairseq-layout checkpoint of a small model with a buffer, a tied weight and a radius, after
    60 Adam steps; the radius's gradient is multiplied by ``spike`` on the first step, which Adam's
    first moment has forgotten by the end (0.9^59) and its second has not (0.98^59)."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(7, 4)
            self.radius = torch.nn.Parameter(torch.tensor(0.5))
            self.fc = torch.nn.Linear(4, 4)
            self.out = torch.nn.Linear(4, 7, bias=False)
            self.out.weight = self.embed.weight          # tied, listed twice in the state dict
            self.register_buffer("version", torch.tensor([3.0]))

        def forward(self, x):
            return self.out(torch.tanh(self.fc(self.embed(x)) * self.radius))

    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.98))
    for step in range(60):
        opt.zero_grad()
        net(torch.randint(0, 7, (3, 5))).logsumexp(-1).mean().backward()
        if step == 0:
            net.radius.grad *= spike
        opt.step()
    path = tmp_path / f"checkpoint_{spike}.pt"
    torch.save({"model": net.state_dict(), "last_optimizer_state": opt.state_dict(),
                "optimizer_history": [{"num_updates": 60}]}, path)
    expected = {}
    for name, p in net.named_parameters():                # named_parameters lists a tied weight once
        st = opt.state[p]
        expected[name] = (st["exp_avg"].double().abs() / (st["exp_avg_sq"].double().sqrt() + 1e-8)).mean().item()
    return path, expected


def test_adam_steps_aligns_the_optimizer_state_with_the_parameters(tmp_path):
    mod = load("scripts/analysis/dynamics/adam_steps.py")
    path, expected = _adam_checkpoint(tmp_path, spike=1.0)
    got = mod.adam_steps(torch.load(path, weights_only=False))
    assert set(got) == set(expected)
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=1e-12), name
    # a spike in the radius's gradient sets its second moment: its step collapses
    spiked = mod.adam_steps(torch.load(_adam_checkpoint(tmp_path, spike=1e6)[0], weights_only=False))
    assert spiked["radius"] < 0.05 * got["radius"]
    assert spiked["fc.weight"] > 0.5 * got["fc.weight"]  # the other weights keep their steps
    out = run([sys.executable, script("scripts/analysis/dynamics/adam_steps.py"), str(path)])
    assert out.returncode == 0, out.stderr
    assert f"radii {expected['radius']:.3f}" in out.stdout


def test_adam_steps_refuses_a_misaligned_state(tmp_path):
    mod = load("scripts/analysis/dynamics/adam_steps.py")
    path, _ = _adam_checkpoint(tmp_path, spike=1.0)
    ck = torch.load(path, weights_only=False)
    del ck["last_optimizer_state"]["state"][max(ck["last_optimizer_state"]["state"])]
    with pytest.raises(ValueError, match="parameters in the model state"):
        mod.adam_steps(ck)
    ck = torch.load(path, weights_only=False)
    ck["last_optimizer_state"] = {}
    with pytest.raises(ValueError, match="no optimizer state"):
        mod.adam_steps(ck)


# --------------------------------------------------------------------------- attention_entropy
@pytest.mark.parametrize("radius_shape", ["scalar", "head", "feature"])
def test_attention_entropy_measures_the_modules_own_q_k_and_radius(radius_shape):
    """past_zero: the fraction of (query, key, head) with |R_hd (q_d - k_d)| > pi for some d, on the
    module's normalised q and k and its radius, whatever its shape; the site from the module's name."""
    from fourierformer_fairseq.modules import FourierMultiheadAttention
    from fourierformer_fairseq.modules.fourier_multihead_attention import rms_normalise

    torch.manual_seed(0)
    E, H, T = 12, 3, 6
    D = E // H
    attention = FourierMultiheadAttention(E, H, self_attention=True, radius_shape=radius_shape, radius_init=2.0)
    with torch.no_grad():
        attention.radius.mul_(torch.rand(attention.radius.shape) + 0.5)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Module()
            self.encoder.self_attn = attention

        def forward(self, x):
            return self.encoder.self_attn(x, x, x)

    x = torch.randn(T, 1, E)
    got = load("scripts/analysis/dynamics/attention_entropy.py").entropies(Model(), [{"net_input": {"x": x}}])
    with torch.no_grad():
        q, k = (rms_normalise(proj(x[:, 0]).double().reshape(T, H, D)) for proj in (attention.q_proj, attention.k_proj))
    r = attention.radius.detach().double()
    R = torch.tensor([[float(r) if r.dim() == 0 else float(r[h, min(d, r.shape[1] - 1)]) for d in range(D)]
                      for h in range(H)], dtype=torch.float64)
    past = (R * (q[:, None] - k[None, :])).abs().gt(math.pi).any(-1)  # (T, T, H)
    expected = past.double().mean().item()
    assert 0 < expected < 1
    assert set(got) == {"enc", "q_rms/enc", "past_zero/enc"}
    assert got["past_zero/enc"] == pytest.approx(expected, abs=1e-12)
