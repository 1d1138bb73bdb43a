"""The training defaults of the Fourier attention: q/k normalisation, the radius's init, the
Gaussian-kernel ablation, the paper-exact switch and the training metrics.

Expected values come from the formula evaluated in float64 here or from tests/oracle.py, never
from ``ops/reference.py``. Tolerances: the module runs in float32; its error against float64 is
held to a few times the plain float32 evaluation's (``oracle.plain_attention``), plus 1e-6.
"""
import math

import pytest
import torch

from fairseq_helpers import parse_arch
from helpers import check_against_plain, future_mask, max_abs_error, split_heads
from oracle import oracle_attention, plain_attention
from repo import load

from fourierformer_fairseq.modules.fourier_multihead_attention import (
    FourierMultiheadAttention,
    auto_radius,
    rms_normalise,
)
from fourierformer_fairseq.ops.gaussian import gaussian_attention

E, H = 32, 4
D = E // H


def projections(m, x):
    """(T, B, E) -> q, k, v as (B, H, T, D) float64, computed from the module's weights directly."""
    W = {n: (getattr(m, n).weight.double(), getattr(m, n).bias.double()) for n in ("q_proj", "k_proj", "v_proj")}
    xs = x.double()
    return [split_heads(xs @ w.T + b, H) for (w, b) in (W["q_proj"], W["k_proj"], W["v_proj"])]


def rms64(t):
    return t / torch.sqrt((t * t).mean(-1, keepdim=True) + 1e-6)


def expected_module_output(m, x, causal=False, key_padding_mask=None, normalise=True, plain=False):
    q, k, v = projections(m, x)
    if normalise:
        q, k = rms64(q), rms64(k)
    fn = plain_attention if plain else oracle_attention
    dtype = torch.float32 if plain else torch.float64
    out = fn(q.to(dtype), k.to(dtype), v.to(dtype), m.radius.detach().to(dtype), power=m.power,
             key_padding_mask=key_padding_mask, causal=causal)
    T, B = x.shape[:2]
    out = out.permute(2, 0, 1, 3).reshape(T, B, E)
    return out.double() @ m.out_proj.weight.double().T + m.out_proj.bias.double()


def test_auto_radius_matches_softmax_temperature():
    # (p R^2 / 3) q.k must equal q.k / sqrt(D): R = sqrt(3 / (p sqrt(D)))
    for p, d in ((2, 128), (2, 64), (4, 16), (4, 64)):
        r = auto_radius(p, d)
        assert math.isclose(p * r * r / 3, 1 / math.sqrt(d), rel_tol=1e-12)
    assert FourierMultiheadAttention(E, H, self_attention=True, power=4).radius_init == pytest.approx(auto_radius(4, D))
    assert FourierMultiheadAttention(E, H, self_attention=True, power=4, radius_init=0.9).radius_init == 0.9


def test_rms_normalise_gives_unit_rms_and_keeps_direction():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=g) * torch.tensor([0.01, 1.0, 100.0]).reshape(3, 1, 1)
    y = rms_normalise(x)
    assert torch.allclose(y.double(), rms64(x.double()), rtol=1e-5, atol=0)  # x / sqrt(mean x^2 + 1e-6)
    assert torch.allclose(y[1:].pow(2).mean(-1), torch.ones(2, 5), atol=1e-4)  # unit RMS where eps is negligible
    cos = torch.nn.functional.cosine_similarity(x, y, dim=-1)
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-6)
    assert rms_normalise(torch.zeros(2, 8)).abs().max() == 0  # eps keeps a zero vector finite


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qk_norm", ["rms", "none"])
def test_module_output_matches_the_oracle_with_and_without_qk_norm(causal, qk_norm):
    torch.manual_seed(0)
    m = FourierMultiheadAttention(E, H, self_attention=True, power=4, qk_norm=qk_norm, radius_init=0.6).eval()
    g = torch.Generator().manual_seed(1)
    T, B = 9, 3
    x = torch.randn(T, B, E, generator=g) * 3.0  # large inputs: normalisation matters
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, -3:] = True
    attn_mask = None
    if causal:
        attn_mask = future_mask(T)
    out, _ = m(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=False)
    exact = expected_module_output(m, x, causal=causal, key_padding_mask=kpm, normalise=qk_norm == "rms")
    plain = expected_module_output(m, x, causal=causal, key_padding_mask=kpm, normalise=qk_norm == "rms", plain=True)
    check_against_plain(out, plain, exact, "module output", atol=1e-5, factor=4)
    err = max_abs_error(out, exact)
    if qk_norm == "rms":
        # the normalisation is not a no-op on these inputs
        unnormalised = expected_module_output(m, x, causal=causal, key_padding_mask=kpm, normalise=False)
        assert (unnormalised - exact).abs().max().item() > 100 * (err + 1e-6)


def test_incremental_decoding_with_qk_norm_equals_full_causal():
    torch.manual_seed(0)
    m = FourierMultiheadAttention(E, H, self_attention=True, power=4).eval()
    g = torch.Generator().manual_seed(2)
    T, B = 7, 2
    x = torch.randn(T, B, E, generator=g)
    mask = future_mask(T)
    full, _ = m(x, x, x, attn_mask=mask, need_weights=False)
    state = {}
    steps = [m(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state, need_weights=False)[0] for t in range(T)]
    assert torch.allclose(torch.cat(steps), full, atol=1e-5, rtol=1e-5)


def gaussian64(q, k, v, radius, power, key_padding_mask=None, causal=False):
    """exp(-(p/6) sum_d R^2 (q_d - k_d)^2), normalised over keys, written out directly in float64."""
    q, k, v = q.double(), k.double(), v.double()
    S = -(power / 6.0) * (radius.double() ** 2) * (q.unsqueeze(3) - k.unsqueeze(2)).pow(2).sum(-1)
    N, M = S.shape[-2:]
    if key_padding_mask is not None:
        S = S.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        i = torch.arange(N).unsqueeze(1) + (M - N)
        S = S.masked_fill(torch.arange(M).unsqueeze(0) > i, float("-inf"))
    return torch.softmax(S, -1) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_gaussian_ablation_matches_its_formula(causal):
    g = torch.Generator().manual_seed(3)
    B, N, M = 2, 5, 11
    if causal:
        N = M
    q, k = torch.randn(B, H, N, D, generator=g), torch.randn(B, H, M, D, generator=g)
    v = torch.randn(B, H, M, 6, generator=g)
    kpm = torch.zeros(B, M, dtype=torch.bool)
    kpm[0, -2:] = True  # right padding: every row keeps a key under the causal mask
    r = torch.tensor(0.8)
    out = gaussian_attention(q, k, v, r, power=4, key_padding_mask=kpm, causal=causal)
    exact = gaussian64(q, k, v, r, 4, key_padding_mask=kpm, causal=causal)
    assert (out.double() - exact).abs().max().item() < 1e-5


def test_sinc_and_gaussian_kernels_agree_for_small_radius_and_part_for_large():
    """p log sinc x = -p x^2/6 + O(x^4): the two attentions differ by O(R^4) and not at large R."""
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, H, 8, D, generator=g), torch.randn(1, H, 16, D, generator=g)
    v = torch.randn(1, H, 16, D, generator=g)
    gaps = []
    for R in (0.05, 0.1, 1.5):
        r = torch.tensor(R, dtype=torch.float64)
        sinc = oracle_attention(q.double(), k.double(), v.double(), r, power=2)
        gauss = gaussian64(q, k, v, r, 2)
        gaps.append((sinc - gauss).abs().max().item())
    assert gaps[1] / gaps[0] == pytest.approx(16, rel=0.2)  # fourth order in R
    assert gaps[2] > 0.1


def test_training_metrics_are_logged_at_the_interval_and_match_the_weights():
    from fairseq.logging import metrics

    torch.manual_seed(0)
    m = FourierMultiheadAttention(E, H, self_attention=True, power=2, log_interval=3, radius_init=0.5).train()
    m.log_name = "enc2"
    m.dropout_module.p = 0.0
    g = torch.Generator().manual_seed(5)
    T, B = 6, 2
    x = torch.randn(T, B, E, generator=g)
    logged = []
    for update in range(1, 7):
        m.set_num_updates(update)
        with metrics.aggregate(new_root=True) as agg:
            m(x, x, x, need_weights=False)
            logged.append(dict(agg.get_smoothed_values()))
    assert [bool(d) for d in logged] == [False, False, True, False, False, True]
    d = logged[2]
    assert d["radius_enc2"] == pytest.approx(0.5, abs=1e-4)
    # entropy of the first sequence's rows, from the float64 oracle's weights
    q, k, _ = projections(m, x)
    from oracle import oracle_weights
    P = oracle_weights(rms64(q[:1]), rms64(k[:1]), m.radius.detach().double(), power=2)
    Hx = -(P * P.clamp_min(1e-300).log()).sum(-1).mean().item()
    assert d["entropy_enc"] == pytest.approx(Hx, abs=2e-3)
    m.eval()
    m.set_num_updates(9)
    with metrics.aggregate(new_root=True) as agg:
        m(x, x, x, need_weights=False)
        assert not dict(agg.get_smoothed_values())  # never in evaluation


def test_the_lines_between_the_metrics_intervals_leave_them_out():
    """fairseq's loop, with --log-interval 1 below --fourier-log-interval 3: the update's passes inside one
    named aggregator, its smoothed values printed and the aggregator reset after each update. The
    lines of the updates that log the metrics have them; the others leave them out (not None)."""
    from fairseq.logging import metrics

    torch.manual_seed(0)
    m = FourierMultiheadAttention(E, H, self_attention=True, power=2, log_interval=3, radius_init=0.5).train()
    m.log_name = "enc2"
    x = torch.randn(6, 2, E, generator=torch.Generator().manual_seed(5))
    lines = []
    for update in range(1, 8):
        with metrics.aggregate("test_interval_lines", new_root=True):
            m.set_num_updates(update)
            m(x, x, x, need_weights=False)
            metrics.log_scalar("loss", 1.0)
        lines.append(dict(metrics.get_smoothed_values("test_interval_lines")))
        metrics.reset_meters("test_interval_lines")
    for update, line in enumerate(lines, 1):
        assert line["loss"] == 1.0
        diagnostics = {k: v for k, v in line.items() if k != "loss"}
        if update % 3 == 0:
            assert set(diagnostics) == {"radius_enc2", "entropy_enc"} and None not in diagnostics.values(), line
        else:
            assert diagnostics == {}, (update, line)


@pytest.mark.parametrize("power", [1, 3])
def test_training_metrics_of_an_odd_power_log_the_radius_alone(power):
    """Odd powers (Table 7's x and x^3) have signed weights: no entropy, and logging must not stop the training."""
    from fairseq.logging import metrics

    torch.manual_seed(0)
    m = FourierMultiheadAttention(E, H, self_attention=True, power=power, log_interval=1, radius_init=2.0,
                                  qk_norm="none").train()
    m.log_name = "dec0"
    x = torch.randn(5, 2, E, generator=torch.Generator().manual_seed(3))
    m.set_num_updates(1)
    with metrics.aggregate(new_root=True) as agg:
        out, _ = m(x, x, x, need_weights=False)
        logged = dict(agg.get_smoothed_values())
    out.sum().backward()
    assert logged == {"radius_dec0": pytest.approx(2.0)} and m.radius.grad is not None


@pytest.mark.parametrize("arch,power,paper_r", [("fourierformer_iwslt_de_en", 2, 1.0),
                                                ("fourierformer_lm_wiki103_small", 4, 2.0),
                                                ("fourierformer_lm_wiki103_medium", 4, 2.0)])
def test_arch_defaults_and_the_paper_exact_switch(arch, power, paper_r):
    from fourierformer_fairseq.models import FourierAttentionOptions
    from fourierformer_fairseq.models.attention_options import LM_SITES
    from fourierformer_fairseq.models.fourierformer import SITES

    sites = LM_SITES if "_lm_" in arch else SITES
    o = FourierAttentionOptions.from_args(parse_arch(arch), sites)
    assert (o.power, o.qk_norm, o.radius_init, o.kernel) == (power, "rms", None, "sinc")
    o = FourierAttentionOptions.from_args(parse_arch(arch, "--fourier-paper-exact"), sites)
    assert (o.power, o.qk_norm, o.radius_init) == (power, "none", paper_r)
    o = FourierAttentionOptions.from_args(parse_arch(arch, "--fourier-paper-exact", "--fourier-radius-init", "0.3"), sites)
    assert (o.qk_norm, o.radius_init) == ("none", 0.3)
    with pytest.raises(SystemExit):  # refused by the parser (its choices)
        parse_arch(arch, "--fourier-qk-norm", "layer")
    with pytest.raises(ValueError, match="--fourier-log-interval"):
        FourierAttentionOptions.from_args(parse_arch(arch, "--fourier-log-interval", "-1"), sites)


def test_attention_scale_script_separates_the_paper_settings_from_the_defaults():
    """The script measures the package's defaults: its auto_radius and rms_normalise (the q/k
    normalisation the module runs)."""
    from fourierformer_fairseq.modules import fourier_multihead_attention as fma

    mod = load("scripts/analysis/dynamics/attention_scale.py")
    assert mod.auto_radius is fma.auto_radius and mod.rms_normalise is fma.rms_normalise
    paper = mod.measure(64, 2, 1.0, 1.0, qk_norm=False, N=32, M=64)
    default = mod.measure(64, 2, fma.auto_radius(2, 64), 1.0, qk_norm=True, N=32, M=64)
    assert paper["spread"] > 5 and paper["grad_ratio"] > 5 and paper["entropy"] < 0.5
    assert 0.8 < default["spread"] < 1.4 and 0.7 < default["grad_ratio"] < 1.5
    assert default["near_zero"] == 0 and abs(default["entropy"] - default["entropy_softmax"]) < 0.05


def test_training_curves_reads_fairseq_json_logs(tmp_path):
    import json

    mod = load("scripts/analysis/dynamics/training_curves.py")
    log = tmp_path / "train.log"
    lines = []
    for u in (10, 20):
        rec = {"epoch": 1, "loss": str(10 - u / 10), "gnorm": "1.5", "num_updates": str(u), "radius_enc0": "0.43",
               "entropy_enc": "2.1"}
        lines.append(f"2026-01-01 00:00:00 | INFO | train_inner | {json.dumps(rec)}")
    lines.append('2026-01-01 00:00:00 | INFO | valid | {"epoch": 1, "valid_nll_loss": "7.25", "valid_num_updates": "20"}')
    log.write_text("\n".join(lines) + "\n")
    parsed = mod.read_log(str(log))
    assert mod.series(parsed["train"], "loss") == ([10.0, 20.0], [9.0, 8.0])
    assert mod.series(parsed["valid"], "valid_nll_loss") == ([20.0], [7.25])
    out = tmp_path / "c.png"
    mod.main(["--run", f"x={log}", "--out", str(out)])
    assert out.stat().st_size > 1000


def test_options_saved_before_qk_norm_existed_rebuild_the_paper_formulation():
    from fourierformer_fairseq.models import FourierAttentionOptions
    from fourierformer_fairseq.models.fourierformer import SITES

    args = parse_arch("fourierformer_iwslt_de_en", "--fourier-radius-init", "1.0")
    args.fourier_qk_norm = None  # what the saved options of an older checkpoint give
    assert FourierAttentionOptions.from_args(args, SITES).qk_norm == "none"
