"""The tools of scripts/analysis/tables/: make_tables (the paper's tables from runs) and
fourier_estimators (Appendix E.4). Fast unit tests on synthetic inputs; the estimators' small run is slow.
(head_redundancy runs on the recipes' trained models: tests/runs/test_recipes.py.)
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from repo import load, script


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
    mt = load("scripts/analysis/tables/make_tables.py")
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
    # the paper's rows of tables 1, 7 and 8 under the published protocol (examples/paper_runs.py: PAPER_TABLES)
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
    mt = load("scripts/analysis/tables/make_tables.py")
    p = tmp_path / "generate-test.txt"
    p.write_text("S-0\tx\nH-0\t-0.1\ty\n2026-01-01 | INFO | fairseq_cli.generate | Generate test with beam=5: BLEU4 = 34.42, 68.0/42.1/28.2/19.3 (BP=0.9)\n")
    assert mt.read_bleu_from_generate(str(p)) == 34.42


def test_make_tables_empty(tmp_path):
    r = run([sys.executable, script("scripts/analysis/tables/make_tables.py"), "--runs", str(tmp_path)])
    assert r.returncode == 0 and "No runs" in r.stdout


# --------------------------------------------------------------------------- fourier_estimators
def test_fourier_density_integrates_to_one():
    fe = load("scripts/analysis/tables/fourier_estimators.py")
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
    fe = load("scripts/analysis/tables/fourier_estimators.py")
    import numpy as np

    rng = np.random.default_rng(1)
    xs = rng.normal(size=(300, 2))
    ys = fe.truth_m(xs)
    test = rng.normal(size=(20, 2))
    a = fe.nw_attention(test, xs, ys, 2.0, 2)
    b = fe.nw_numpy(test, xs, ys, 2.0, 2)
    assert np.max(np.abs(a - b)) < 1e-8


def test_fourier_estimators_small(tmp_path):
    # a fixed radius: no grid search, seconds
    r = run([sys.executable, script("scripts/analysis/tables/fourier_estimators.py"), "--small", "--radius", "4", "--out", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(tmp_path / "results.json"))
    for name in ("density_1d", "density_2d", "regression"):
        e = res["experiments"][name]
        assert e["mse"] > 0 and e["paper_mse"] > 0
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert res["experiments"]["density_1d"]["mse"] < 1e-3
    assert "1.290e-05" in r.stdout and "MSE (paper)" in r.stdout
