"""The tools of scripts/benchmarks/: benchmark_model, benchmark_generation and benchmark_attention
(its --profile: tests/lab/test_benchmark_profile.py). Fast unit tests on synthetic inputs; the
runs that build fairseq models are slow."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from repo import load, script


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


# --------------------------------------------------------------------------- model scripts
def test_benchmark_model_small(tmp_path):
    out = tmp_path / "bench.json"
    r = run([sys.executable, script("scripts/benchmarks/benchmark_model.py"), "--small", "--device", "cpu", "--out", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(out))
    names = [m["name"] for m in res["models"]]
    assert names == ["softmax small", "fourier small"]
    for m in res["models"]:
        assert m["train_ms_per_sample"] > 0 and m["infer_ms_per_sample"] > 0 and m["train_peak_mem_mb"] > 0
    assert "| fourier small |" in r.stdout


def test_benchmark_generation_small(tmp_path):
    """Every part of the generation benchmark runs on its --small models: beam search with fairseq's
    SequenceGenerator, the LM's incremental decoding and the stock fairseq-generate on checkpoints
    of the pair; a row and a ratio per part and thread count, and the hypotheses of both
    translation models of the pinned length (the run stops otherwise)."""
    out = tmp_path / "generation.json"
    r = run([sys.executable, script("scripts/benchmarks/benchmark_generation.py"), "--small", "--shapes", "mt,lm,cli", "--threads", "1",
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
    bg = load("scripts/benchmarks/benchmark_generation.py")
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
    ba = load("scripts/benchmarks/benchmark_attention.py")
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
    ba = load("scripts/benchmarks/benchmark_attention.py")
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
    r = run([sys.executable, script("scripts/benchmarks/benchmark_attention.py"), "--device", "cpu", "--scaling", "--quick",
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
    path = script("scripts/benchmarks/benchmark_attention.py")
    r = run([sys.executable, path, "--device", "cpu", "--quick", "--reps", "2", "--shapes", "sweep N=256",
             "--impls", "fused,sdpa,performer,fourier_rf", "--no-memory"], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| sweep N=256")]
    assert [line.split("|")[2].strip() for line in rows] == ["fused", "sdpa", "performer", "fourier_rf"]
    assert all(float(line.split("|")[3]) > 0 and line.split("|")[4].strip().endswith("x") for line in rows)
    ba = load("scripts/benchmarks/benchmark_attention.py")  # the refusal comes before any timing: in this process
    monkeypatch.setattr(sys, "argv", [path, "--device", "cpu", "--impls", "fused,favor"])
    with pytest.raises(SystemExit, match=r"unknown \['favor'\]"):
        ba.main()
