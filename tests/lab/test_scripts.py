"""The tools of scripts/benchmarks/, scripts/tools/ and scripts/analysis/: make_tables, average_checkpoints, adam_steps, fourier_estimators, attention_entropy, head_redundancy,
benchmark_model, benchmark_attention.

Fast unit tests on synthetic inputs; the runs that build or train fairseq models are slow.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from repo import REPO, load, script, tracked_texts  # noqa: E402


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# --------------------------------------------------------------------------- make_tables
def fake_run(root, name, meta, results=None, files=None):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    json.dump(meta, open(os.path.join(d, "meta.json"), "w"))
    for fname, content in (results or {}).items():
        json.dump(content, open(os.path.join(d, fname), "w"))
    for fname, text in (files or {}).items():
        open(os.path.join(d, fname), "w").write(text)
    return d


def test_make_tables_all_tables(tmp_path):
    mt = load("make_tables")
    root = str(tmp_path / "runs")
    for seed, (bs, bf) in enumerate([(34.0, 34.5), (34.2, 34.9), (34.4, 34.7)], 1):
        fake_run(root, f"iwslt/softmax_seed{seed}", {"task": "iwslt14", "model": "softmax", "seed": seed},
                 {"results-test.json": {"bleu_tok": bs, "sacrebleu": bs - 1, "sacrebleu_signature": "nrefs:1|case:lc|x"}})
        fake_run(root, f"iwslt/fourier_seed{seed}", {"task": "iwslt14", "model": "fourier", "seed": seed},
                 {"results-test.json": {"bleu_tok": bf, "sacrebleu": bf - 1, "sacrebleu_signature": "nrefs:1|case:lc|x"}})
    # LM: results json for one, raw eval logs only for the other (fallback parsing)
    fake_run(root, "lm/softmax_small_seed1", {"task": "wikitext103", "model": "softmax", "size": "small", "seed": 1},
             {"results-lm.json": {"valid_ppl": 33.0, "test_ppl": 34.0, "stride": 1}})
    fake_run(root, "lm/fourier_small_seed1", {"task": "wikitext103", "model": "fourier", "size": "small", "seed": 1},
             files={"eval-valid.log": "x | Loss (base 2): 5.0000, Perplexity: 32.00\n",
                    "eval-test.log": "x | Loss (base 2): 5.1000, Perplexity: 34.30\n"})
    # the paper's rows of tables 1, 7 and 8 under the published protocol (training_recipes.PAPER_TABLES)
    pub = {"task": "wikitext103", "model": "fourier", "size": "small", "seed": 1, "protocol": "published"}
    fake_run(root, "lm/published_small_seed1", {**pub, "fourier": {"published": 1}},
             {"results-lm.json": {"valid_ppl": 31.0, "test_ppl": 32.0}})
    fake_run(root, "lm/softmax_small_pub_seed1", {**pub, "model": "softmax"},
             {"results-lm.json": {"valid_ppl": 33.5, "test_ppl": 34.5}})
    fake_run(root, "lm/published_small_phiabs_seed1", {**pub, "fourier": {"published": 1, "phi": "abs"}},
             {"results-lm.json": {"valid_ppl": 40.0, "test_ppl": 41.0}})
    fake_run(root, "lm/published_small_power3_seed1", {**pub, "fourier": {"published": 1, "power": "3"}},
             {"results-lm.json": {"valid_ppl": 900.0, "test_ppl": 901.0}})
    fake_run(root, "lm/published_small_radius1_seed1", {**pub, "fourier": {"published": 1, "radius_init": "1.0"}},
             {"results-lm.json": {"valid_ppl": 35.0, "test_ppl": 36.0}})
    fake_run(root, "lm/fourier_small_head_seed1", {**pub, "fourier": {"radius_shape": "head"}},
             {"results-lm.json": {"valid_ppl": 37.0, "test_ppl": 38.0}})
    # the paper's formulation: a setting of its own, never merged with the default rows
    # (a meta.json from before "fourier" was recorded: its options are read from extra_args)
    fake_run(root, "lm/fourier_small_paper_exact_seed1", {"task": "wikitext103", "model": "fourier", "size": "small",
                                                          "seed": 1, "extra_args": ["--fourier-paper-exact", "--lr", "1"]},
             {"results-lm.json": {"valid_ppl": 50.0, "test_ppl": 51.0}})
    fake_run(root, "lm/unevaluated_seed1", {"task": "wikitext103", "model": "fourier", "size": "medium", "seed": 1})
    hr = tmp_path / "hr.json"
    json.dump({"label": "fourier small", "mean": 1.5, "var": 0.25, "layers": 16, "batches": 50}, open(hr, "w"))
    bench = tmp_path / "bench.json"
    json.dump({"device": "cpu", "batch_size": 8, "context": 256, "models": [
        {"name": "softmax small", "train_ms_per_sample": 10.0, "infer_ms_per_sample": 3.0, "train_peak_mem_mb": 100, "infer_peak_mem_mb": 50},
        {"name": "fourier small", "train_ms_per_sample": 12.0, "infer_ms_per_sample": 4.0, "train_peak_mem_mb": 110, "infer_peak_mem_mb": 55}]},
              open(bench, "w"))
    out = tmp_path / "tables.md"
    assert mt.main(["--runs", root, "--head-redundancy", str(hr), "--benchmark", str(bench), "--out", str(out)]) == 0
    text = out.read_text()
    assert "Table 1" in text and "Table 5" in text and "Table 6" in text and "Table 9" in text
    assert "Table 7: ablation over phi, WikiText-103 small" in text
    assert "Table 8: ablation over the radius, WikiText-103 small" in text
    assert "phi=abs" not in text.split("Table 7")[1]
    # mean +- sample std over the three seeds, paper number beside
    b = [34.5, 34.9, 34.7]
    m = sum(b) / 3
    s = math.sqrt(sum((x - m) ** 2 for x in b) / 2)
    assert f"| fourier | — | {m:.2f} ± {s:.2f} |" in text
    assert "| 34.68 |" in text and "| 34.42 |" in text
    # parsed from the raw eval logs; a run without a protocol trained fairseq's recipe: no paper number
    assert "| FourierFormer small (defaults) | — | fairseq | 32.00 | 34.30 | 1 | — | — |" in text
    assert "| softmax small | — | fairseq | 33.00 | 34.00 | 1 | — | — | 1 |" in text
    table1 = text.split("### Table 5")[0]
    # the paper's Fourier column beside the published attention under the published protocol
    assert "| FourierFormer small (published attention) | — | published | 31.00 | 32.00 | 1 | 31.86 | 32.85 |" in table1
    assert "| softmax small | — | published | 33.50 | 34.50 | 1 | 33.15 | 34.29 |" in table1
    # runs off the table's rows keep rows of their own, named by what they changed, with no paper number
    assert "| fourier small (published, phi=abs) | — | published | 40.00 | 41.00 | 1 | — | — |" in table1
    assert "| fourier small (paper_exact) | — | fairseq | 50.00 | 51.00 | 1 | — | — |" in table1
    table7 = text.split("Table 7: ablation over phi")[1].split("###")[0]
    assert "(—, published protocol)" in table7
    assert "| phi x^4 | paper | 31.00 | 32.00 | 1 | 31.86 | 32.85 |" in table7
    assert "| phi |x| | paper | 40.00 | 41.00 | 1 | 33.12 | 34.18 |" in table7
    assert "| phi x^3 | paper | 900.00 | 901.00 | 1 | not converge | not converge |" in table7
    assert "50.00" not in table7 and "37.00" not in table7
    table8 = text.split("Table 8: ablation over the radius")[1].split("###")[0]
    assert "| R_init 1.0 | paper | 35.00 | 36.00 | 1 | 31.89 | 32.87 |" in table8
    assert "| R_init 2.0 | paper | 31.00 | 32.00 | 1 | 31.86 | 32.85 |" in table8
    assert "| defaults, a radius per head | ours | 37.00 | 38.00 | 1 | — | — |" in table8
    assert "paper_exact" not in table8 and "50.00" not in table8
    table6 = text.split("### Table 6")[1].split("###")[0]
    assert "| 7.45 ± 2.50 | 7.37 ± 2.44 |" in table6
    table9 = text.split("### Table 9")[1]
    assert "| 6.00 | 1.70 | 1.43 | 0.94 |" in table9
    assert "unevaluated_seed1" in text
    assert "nrefs:1|case:lc|x" in text


def test_make_tables_parses_fairseq_generate(tmp_path):
    mt = load("make_tables")
    p = tmp_path / "generate-test.txt"
    p.write_text("S-0\tx\nH-0\t-0.1\ty\n2026-01-01 | INFO | fairseq_cli.generate | Generate test with beam=5: BLEU4 = 34.42, 68.0/42.1/28.2/19.3 (BP=0.9)\n")
    assert mt.read_bleu_from_generate(str(p)) == 34.42


def test_make_tables_empty(tmp_path):
    r = run([sys.executable, script("make_tables"), "--runs", str(tmp_path)])
    assert r.returncode == 0 and "No runs" in r.stdout


# --------------------------------------------------------------------------- facts with one home


def _tracked_files():
    """The repository's tracked text files (relative paths), the dated records aside."""
    files = [(path, text) for path, text in tracked_texts() if not path.startswith("docs/records/")]
    assert files, "not a git checkout"
    return files


def test_the_fairseq_pin_has_one_home():
    """FAIRSEQ_REQUIREMENT in fourierformer_fairseq/__init__.py is the only place the fairseq pin is
    spelled: setup.py's extra, scripts/tools/install.sh and the offline bundle read it there, and no other
    file (the dated records aside) names the pinned requirement, nor its version in code or the READMEs."""
    import re

    from fourierformer_fairseq import FAIRSEQ_REQUIREMENT

    name, version = FAIRSEQ_REQUIREMENT.split("==")
    spec = re.compile(rf"{re.escape(name)}\s*==")
    code = (".py", ".sh", ".txt", ".toml", ".cfg", ".yml", ".yaml", ".in")
    copies = []
    for path, text in _tracked_files():
        if path == "fourierformer_fairseq/__init__.py" or path.startswith("tests/"):
            continue
        if spec.search(text) or ((path.endswith(code) or path.endswith("README.md")) and version in text):
            copies.append(path)
    assert not copies, f"the fairseq pin is copied outside FAIRSEQ_REQUIREMENT: {copies}"

    # its readers: setup.py's extra, install.sh's line, the offline bundle's roots
    setup_text = open(os.path.join(REPO, "setup.py")).read()
    assert 'package_constant("FAIRSEQ_REQUIREMENT")' in setup_text
    namespace = {"__file__": os.path.join(REPO, "setup.py")}
    exec(compile(setup_text.split("\next_modules, cmdclass =")[0], "setup.py", "exec"), namespace)
    assert namespace["package_constant"]("FAIRSEQ_REQUIREMENT") == FAIRSEQ_REQUIREMENT
    (line,) = [l for l in open(script("install.sh")).read().splitlines() if l.startswith("FAIRSEQ_SPEC=")]
    r = run(["bash", "-c", f"{line}; printf %s \"$FAIRSEQ_SPEC\""], cwd=REPO)
    assert r.stdout == FAIRSEQ_REQUIREMENT, r.stderr
    assert FAIRSEQ_REQUIREMENT in load("offline_bundle").OFFLINE_ROOTS


def test_the_papers_numbers_have_one_home():
    """scripts/analysis/tables/paper_numbers.json holds the paper's numbers; the READMEs, the recipes, the
    package, the tools and the kernels restate none of its perplexities or BLEU scores (every value of
    10 or more, as the paper writes it, to two decimals), they link it. (docs/ is left out: its tables
    of measurements would match by chance; its records may cite the paper beside a measured number.)"""
    import re

    numbers = []

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 10:
            numbers.append(f"{x:.2f}")

    walk(json.load(open(os.path.join(REPO, "scripts", "analysis", "tables", "paper_numbers.json"))))
    assert "34.42" in numbers and "32.85" in numbers
    pattern = re.compile(r"(?<![\d.])(" + "|".join(re.escape(n) for n in sorted(set(numbers))) + r")(?![\d])")
    product = ("README.md", "setup.py", "examples/", "fourierformer_fairseq/", "scripts/tools/", "scripts/benchmarks/", "scripts/analysis/", "csrc/")
    copies = {path: sorted(set(pattern.findall(text))) for path, text in _tracked_files()
              if path.startswith(product) and path != "scripts/analysis/tables/paper_numbers.json" and pattern.search(text)}
    assert not copies, f"the paper's numbers restated outside scripts/analysis/tables/paper_numbers.json: {copies}"


# --------------------------------------------------------------------------- average_checkpoints
def test_average_checkpoints(tmp_path):
    ac = load("average_checkpoints")
    ck = tmp_path / "ck"
    ck.mkdir()
    for e in range(1, 5):
        torch.save({"model": {"w": torch.full((2, 2), float(e)), "n": torch.tensor([e])}, "cfg": {"epoch": e}},
                   ck / f"checkpoint{e}.pt")
    torch.save({"model": {"w": torch.zeros(2, 2), "n": torch.tensor([0])}}, ck / "checkpoint_best.pt")
    out = tmp_path / "avg.pt"
    assert ac.main(["--inputs", str(ck), "--num-epoch-checkpoints", "3", "--output", str(out)]) == 0
    st = torch.load(out, weights_only=False)
    assert torch.allclose(st["model"]["w"], torch.full((2, 2), 3.0))  # mean of epochs 2, 3, 4
    assert st["model"]["n"].item() == 4 and st["cfg"]["epoch"] == 4
    assert st["model"]["w"].dtype == torch.float32


@pytest.mark.parametrize("flag,asked", [("--num-epoch-checkpoints", "5"), ("--num-update-checkpoints", "1")])
def test_average_checkpoints_refuses_fewer_checkpoints_than_asked(tmp_path, flag, asked):
    """Four epoch checkpoints and none by update: asking for more than there are exits non-zero, naming
    what it found, and writes nothing."""
    ck = tmp_path / "ck"
    ck.mkdir()
    for e in range(1, 5):
        torch.save({"model": {"w": torch.full((2,), float(e))}}, ck / f"checkpoint{e}.pt")
    out = tmp_path / "avg.pt"
    r = run([sys.executable, script("average_checkpoints"), "--inputs", str(ck), flag, asked, "--output", str(out)])
    assert r.returncode == 1 and not out.exists(), r.stderr
    found = "4 (checkpoint1.pt, checkpoint2.pt, checkpoint3.pt, checkpoint4.pt)" if "epoch" in flag else "0 (none)"
    assert f"asked for the last {asked} " in r.stderr and f"found {found}" in r.stderr, r.stderr


# --------------------------------------------------------------------------- fourier_estimators
def test_fourier_density_integrates_to_one():
    fe = load("fourier_estimators")
    import numpy as np

    rng = np.random.default_rng(0)
    samples = rng.normal(size=(2000, 1))
    grid = np.linspace(-12, 12, 4801)[:, None]
    for p, R in ((1, 3.0), (2, 5.0), (4, 8.0)):
        dens = fe.density(grid, samples, R, p)
        assert abs(np.trapezoid(dens, grid[:, 0]) - 1) < 0.03, p
    # the constants A_p = int (sin z / z)^p dz (closed forms for p <= 4, numerical beyond) against a
    # quadrature on [-L, L]: the two tails beyond L add at most 4 / L (p = 1, by parts) and
    # 2 / ((p - 1) L^(p - 1)) for p >= 2; 1e-6 for the quadrature itself
    L = 1000.0
    z = np.linspace(-L, L, 4_000_001)
    s = np.sinc(z / np.pi)
    for p in (1, 2, 3, 4):
        quad = float(np.trapezoid(s ** p, z))
        tail = 4 / L if p == 1 else 2 / ((p - 1) * L ** (p - 1))
        assert abs(fe.kernel_constant(p) - quad) < tail + 1e-6, p
    assert abs(fe.kernel_constant(6) - 11 * math.pi / 20) < 1e-6  # the known closed form for p = 6


def test_nw_regression_is_fourier_attention():
    fe = load("fourier_estimators")
    import numpy as np

    rng = np.random.default_rng(1)
    xs = rng.normal(size=(300, 2))
    ys = fe.truth_m(xs)
    test = rng.normal(size=(20, 2))
    a = fe.nw_attention(test, xs, ys, 2.0, 2)
    b = fe.nw_numpy(test, xs, ys, 2.0, 2)
    assert np.max(np.abs(a - b)) < 1e-8


@pytest.mark.slow
def test_fourier_estimators_small(tmp_path):
    # a fixed radius: no grid search, seconds
    r = run([sys.executable, script("fourier_estimators"), "--small", "--radius", "4", "--out", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "results.json"))
    for name in ("density_1d", "density_2d", "regression"):
        e = res["experiments"][name]
        assert e["mse"] > 0 and e["paper_mse"] > 0
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert res["experiments"]["density_1d"]["mse"] < 1e-3
    assert "1.290e-05" in r.stdout and "MSE (paper)" in r.stdout


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
    mod = load("adam_steps")
    path, expected = _adam_checkpoint(tmp_path, spike=1.0)
    got = mod.adam_steps(torch.load(path, weights_only=False))
    assert set(got) == set(expected)
    for name in expected:
        assert got[name] == pytest.approx(expected[name], rel=1e-12), name
    # a spike in the radius's gradient sets its second moment: its step collapses
    spiked = mod.adam_steps(torch.load(_adam_checkpoint(tmp_path, spike=1e6)[0], weights_only=False))
    assert spiked["radius"] < 0.05 * got["radius"]
    assert spiked["fc.weight"] > 0.5 * got["fc.weight"]  # the other weights keep their steps
    out = run([sys.executable, script("adam_steps"), str(path)])
    assert out.returncode == 0, out.stderr
    assert f"radii {expected['radius']:.3f}" in out.stdout


def test_adam_steps_refuses_a_misaligned_state(tmp_path):
    mod = load("adam_steps")
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
    got = load("attention_entropy").entropies(Model(), [{"net_input": {"x": x}}])
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


# --------------------------------------------------------------------------- model scripts
@pytest.mark.slow
def test_benchmark_model_small(tmp_path):
    out = tmp_path / "bench.json"
    r = run([sys.executable, script("benchmark_model"), "--small", "--device", "cpu", "--out", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(out))
    names = [m["name"] for m in res["models"]]
    assert names == ["softmax small", "fourier small"]
    for m in res["models"]:
        assert m["train_ms_per_sample"] > 0 and m["infer_ms_per_sample"] > 0 and m["train_peak_mem_mb"] > 0
    assert "| fourier small |" in r.stdout


@pytest.mark.slow
def test_benchmark_generation_small(tmp_path):
    """Every part of the generation benchmark runs on its --small models: beam search with fairseq's
    SequenceGenerator, the LM's incremental decoding and the stock fairseq-generate on checkpoints
    of the pair; a row and a ratio per part and thread count, and the hypotheses of both
    translation models of the pinned length (the run stops otherwise)."""
    out = tmp_path / "generation.json"
    r = run([sys.executable, script("benchmark_generation"), "--small", "--shapes", "mt,lm,cli", "--threads", "1",
             "--rounds", "1", "--device", "cpu", "--out", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.load(open(out))["rows"]
    assert [(row["shape"], row["threads"]) for row in rows] == [("mt", 1), ("lm", 1), ("cli", 1)]
    for row in rows:
        assert row["softmax_s"] >= 0 and row["fourier_s"] >= 0
        assert row["shape"] == "cli" or row["ratio"] == pytest.approx(row["fourier_s"] / row["softmax_s"])
    assert "| mt |" in r.stdout and "| lm |" in r.stdout and "| cli |" in r.stdout


def test_benchmark_generation_decoding_steps_grow_the_keys():
    """The LM round decodes a token at a time through the incremental state: after it, each
    self-attention layer holds one cached key per decoded token (and, for the FourierFormer, the key
    table holding them)."""
    bg = load("benchmark_generation")
    import argparse

    args = argparse.Namespace(lm_batch=2, lm_tokens=5, device="cpu")
    model, tgt = bg.build("fourierformer_lm_wiki103_small", "lm", 50, 8, bg.SMALL_DIMS["lm"])
    state = bg.lm_round(args, model, len(tgt))()
    buffers = [v for k, v in state.items() if k.endswith("attn_state")]
    assert buffers and all(b["prev_key"].shape[2] == 5 for b in buffers)
    assert all(torch.equal(b["prev_key_table"][..., :5], b["prev_key"].transpose(2, 3)) for b in buffers)


# --------------------------------------------------------------------------- benchmark_attention
SWEEP = [256, 512, 1024, 2048, 4096, 8192, 16384]


def test_benchmark_attention_crossover():
    ba = load("benchmark_attention")
    # a linear op 40 N against a quadratic one N^2 / 100: faster from N > 4000 on
    lin = {n: 40.0 * n for n in SWEEP}
    quad = {n: n * n / 100.0 for n in SWEEP}
    assert ba.crossover(SWEEP, lin, quad) == (4096, 16384)
    assert ba.crossover(SWEEP, quad, lin) == (None, 16384)  # the quadratic one is faster only up to 2048
    # faster at 256 and 512, slower at 1024, faster from 2048 on: it stays faster only from 2048
    fast = {n: 1.0 for n in SWEEP}
    slow = {256: 2.0, 512: 2.0, 1024: 0.5, 2048: 2.0, 4096: 2.0, 8192: 2.0, 16384: 2.0}
    assert ba.crossover(SWEEP, fast, slow) == (2048, 16384)
    assert ba.crossover(list(reversed(SWEEP)), fast, slow) == (2048, 16384)  # order of the sizes does not matter
    assert ba.crossover(SWEEP, fast, {n: 2.0 for n in SWEEP}) == (256, 16384)  # faster everywhere
    only_last = {**slow, **{n: 0.5 for n in SWEEP[:-1]}}
    assert ba.crossover(SWEEP, fast, only_last) == (16384, 16384)
    # a tie is not faster
    assert ba.crossover(SWEEP, fast, {**slow, 16384: 1.0}) == (None, 16384)
    # an implementation skipped beyond N = 1024 (None): compared where both ran
    skipped = {256: 0.5, 512: 2.0, 1024: 2.0, 2048: None, 4096: None}
    assert ba.crossover(SWEEP, fast, skipped) == (512, 1024)
    assert ba.crossover(SWEEP, {}, slow) == (None, None)
    assert ba.fmt_crossover(4096, 16384) == "N = 4096"
    assert ba.fmt_crossover(None, 16384) == "none up to 16384"
    assert ba.fmt_crossover(None, None) == "-"


def test_benchmark_attention_scaling_report():
    """The scaling table and the crossover table from a synthetic timing table."""
    ba = load("benchmark_attention")
    impls = ["fused", "sdpa", "performer", "fourier_rf"]
    cost = {  # ms as a function of N, per (causal, backward) group: scaled so that the crossovers differ
        "fused": lambda n, s: s * n * n / 1000.0,
        "sdpa": lambda n, s: s * n * n / 4000.0,
        "performer": lambda n, s: 2.0 * n,
        "fourier_rf": lambda n, s: 20.0 * n,
    }
    rows = []
    for causal, backward in ba.SCALING_GROUPS:
        s = (4.0 if backward else 1.0) / (2.0 if causal else 1.0)
        for n in SWEEP:
            rows.append(dict(N=n, causal=causal, backward=backward, rounds=3,
                             ms={i: cost[i](n, s) for i in impls}, mem={i: 2**20 * n / 256 for i in impls}))
    lines = ba.scaling_report(impls, rows)
    header = lines[0]
    assert header == ("| mask | pass | N | fused ms | sdpa ms | performer ms | fourier_rf ms | performer / fused | "
                      "performer / sdpa | fourier_rf / fused | fourier_rf / sdpa | fused MiB | sdpa MiB | "
                      "performer MiB | fourier_rf MiB | rounds |")
    body = [line for line in lines[2:2 + 4 * len(SWEEP)]]
    assert all(line.count("|") == header.count("|") for line in body)
    # grouped (none fwd, none fwd+bwd, causal fwd, causal fwd+bwd), N ascending in each
    assert [tuple(c.strip() for c in line.split("|")[1:4]) for line in body[:2]] == [("none", "fwd", "256"),
                                                                                     ("none", "fwd", "512")]
    assert body[len(SWEEP)].split("|")[1:3] == [" none ", " fwd+bwd "]
    assert body[-1].split("|")[1:4] == [" causal ", " fwd+bwd ", " 16384 "]
    # none fwd, N = 1024: fused 1048.58, performer 2048 -> 1.95x; memory 4 MiB
    row = next(line for line in body if line.startswith("| none | fwd | 1024 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[3:7] == ["1048.58", "262.14", "2048.00", "20480.00"]
    assert cells[7] == f"{2048 / 1048.576:.2f}x" and cells[11:15] == ["4.0"] * 4 and cells[15] == "3"
    # crossovers: performer (2 N) beats fused (s N^2 / 1000) once N > 2000 / s, sdpa once N > 8000 / s;
    # fourier_rf (20 N) beats fused once N > 20000 / s and sdpa once N > 80000 / s
    cross = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
             for line in lines if line.startswith("| performer |") or line.startswith("| fourier_rf |")}
    assert "| sub-quadratic op | against | fwd | fwd+bwd | causal fwd | causal fwd+bwd |" in lines
    #                        s = 1           s = 4          s = 0.5            s = 2
    assert cross[("performer", "fused")] == ["N = 2048", "N = 512", "N = 4096", "N = 1024"]
    assert cross[("performer", "sdpa")] == ["N = 8192", "N = 2048", "N = 16384", "N = 4096"]
    assert cross[("fourier_rf", "fused")] == ["none up to 16384", "N = 8192", "none up to 16384", "N = 16384"]
    assert cross[("fourier_rf", "sdpa")] == ["none up to 16384", "none up to 16384", "none up to 16384",
                                             "none up to 16384"]


def test_benchmark_attention_scaling_quick():
    """--scaling runs end to end at small N: the table's rows and cells, the ratios, the crossovers."""
    r = run([sys.executable, script("benchmark_attention"), "--device", "cpu", "--scaling", "--quick",
             "--sizes", "32,64", "--scaling-shape", "1,2,16", "--reps", "2", "--no-memory"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "# scaling: B=1, H=2, D=16, N = 32, 64; performer m=44 (44 features), fourier_rf m=16 (528 features)" in out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| none |") or line.startswith("| causal |")]
    assert [r_[:3] for r_ in rows] == [[m, p, n] for m in ("none", "causal") for p in ("fwd", "fwd+bwd")
                                       for n in ("32", "64")]
    impls = ["fused", "sdpa", "performer", "fourier_rf", "gfnet"]
    subquadratic, exact = impls[2:], impls[:2]
    pairs = [(a, b) for a in subquadratic for b in exact]
    ms = {}
    for cells in rows:
        times = dict(zip(impls, (float(c) for c in cells[3:3 + len(impls)])))
        assert all(t > 0 for t in times.values())
        # each ratio is that of the unrounded times: within the printed times' rounding (0.005 ms)
        ratios = cells[3 + len(impls):3 + len(impls) + len(pairs)]
        for got, (a, b) in zip(ratios, pairs):
            a, b = times[a], times[b]
            ratio = float(got.rstrip("x"))
            assert ratio + 0.005 >= (a - 0.005) / (b + 0.005), (got, a, b)
            assert b <= 0.005 or ratio - 0.005 <= (a + 0.005) / (b - 0.005), (got, a, b)
        rest = cells[3 + len(impls) + len(pairs):]
        assert rest == ["-"] * len(impls) + ["2"]
        ms[(cells[0], cells[1], int(cells[2]))] = times
    cross = [line for line in out.splitlines() if any(line.startswith(f"| {op} |") for op in subquadratic)]
    assert len(cross) == len(pairs)
    groups = [("none", "fwd"), ("none", "fwd+bwd"), ("causal", "fwd"), ("causal", "fwd+bwd")]
    for line in cross:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        op, against = cells[:2]
        for cell, (mask, p) in zip(cells[2:], groups):
            t = {n: ms[(mask, p, n)] for n in (32, 64)}
            if any(t[n][op] == t[n][against] for n in (32, 64)):
                continue  # equal once rounded: the printed times cannot tell which was faster
            faster = [t[n][op] < t[n][against] for n in (32, 64)]
            want = "N = 32" if all(faster) else "N = 64" if faster[1] else "none up to 64"
            assert cell == want, (line, t)


def test_benchmark_attention_linear_ops_selectable(monkeypatch):
    """The default table takes the linear-time ops through --impls; unknown names are refused."""
    path = script("benchmark_attention")
    r = run([sys.executable, path, "--device", "cpu", "--quick", "--reps", "2", "--shapes", "sweep N=256",
             "--impls", "fused,sdpa,performer,fourier_rf", "--no-memory"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| sweep N=256")]
    assert [line.split("|")[2].strip() for line in rows] == ["fused", "sdpa", "performer", "fourier_rf"]
    assert all(float(line.split("|")[3]) > 0 and line.split("|")[4].strip().endswith("x") for line in rows)
    ba = load("benchmark_attention")  # the refusal comes before any timing: in this process
    monkeypatch.setattr(sys, "argv", [path, "--device", "cpu", "--impls", "fused,favor"])
    with pytest.raises(SystemExit, match=r"unknown \['favor'\]"):
        ba.main()
