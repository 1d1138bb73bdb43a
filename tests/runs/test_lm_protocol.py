"""The WikiText-103 recipe's published protocol against the published code (docs/published-model.md,
its status table): each row marked reproduced is checked here on the command the recipe builds and
the model fairseq makes from it; the approximated learning-rate schedule is measured against the
published one.

The published schedule (train.py of minhtannguyen/FourierFormer_NeurIPS, wikitext103/lmtool-fwms):
the optimiser starts at lr; after optimiser step t (t = 1, 2, ...) it sets lr * t / warmup while
t < warmup, else CosineAnnealingLR's closed form at t: lr (1 + cos(pi t / max_step)) / 2. So
update u runs at lr (u = 1), lr (u - 1) / warmup (2 <= u <= warmup), lr (1 + cos(pi (u - 1) /
max_step)) / 2 (u > warmup). Written here from that text, not from fairseq's scheduler.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import lr_scheduler

import fourierformer_fairseq
from fourierformer_fairseq import training_recipes as tr
from fourierformer_fairseq.models.lm_options import PUBLISHED_INIT_STD, softmax_attentions
from repo import load

from repo import REPO  # noqa: E402

pc = load("scripts/analysis/tables/lm_parameter_count.py")


def published_lr(u: int, lr: float, warmup: int, max_step: int) -> float:
    if u == 1:
        return lr
    if u <= warmup:
        return lr * (u - 1) / warmup
    return lr * (1 + math.cos(math.pi * (u - 1) / max_step)) / 2


def parsed(argv):
    parser = options.get_training_parser()
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, argv))


def recipe_cfg(protocol="published", size="small", extra=()):
    arch = tr.lm_recipe(protocol, size)["arch"]
    return parsed(["unused-data", "--user-dir", fourierformer_fairseq.USER_DIR, "--arch", arch, "--cpu",
                   *tr.recipe_args("wikitext103", protocol=protocol, size=size), *extra])


def fairseq_lrs(cfg, updates):
    """The lr fairseq's trainer runs each of `updates` (1-based) at: the scheduler's value after
    step_update(u - 1) (the trainer calls step_update(0) when it builds the optimiser)."""
    params = [nn.Parameter(torch.zeros(1))]
    optimizer = optim.build_optimizer(cfg.optimizer, params)
    scheduler = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, optimizer)
    return {u: scheduler.step_update(u - 1) for u in updates}


@pytest.mark.parametrize("size", ["small", "medium"])
def test_learning_rate_schedule_against_the_published_one(size):
    cfg = recipe_cfg(size=size)
    lr, warmup, last = 2.5e-4, 2000, {"small": 500000, "medium": 400000}[size]
    assert cfg.optimization.lr == [lr] and cfg.lr_scheduler.warmup_updates == warmup
    assert cfg.optimization.max_update == last
    updates = [1, 2, 1000, 2000, 2001, 250000, last - 1000, last]
    got = fairseq_lrs(cfg, updates)
    want = {u: published_lr(u, lr, warmup, last) for u in updates}
    # the warm-up is the published one's from update 2 on (fairseq's linear warm-up from 0 is
    # lr (u - 1) / warmup), bit for bit up to float rounding
    for u in (2, 1000, 2000):
        assert got[u] == pytest.approx(want[u], rel=1e-12, abs=0), u
    # update 1: fairseq runs at its warm-up's start (0), the published code at the full lr
    assert got[1] == 0.0 and want[1] == lr
    # after the warm-up fairseq's cosine decays over max_update - warmup updates, the published one
    # over max_step from step 0: within 0.7 % of the peak lr, and (near the end, where both go to 0)
    # within about (1 - w)^-2 - 1 of the published lr itself, w = warmup / max_step (docs/published-model.md)
    w = warmup / last
    for u in (2001, 250000, last - 1000, last):
        assert abs(got[u] - want[u]) <= 0.007 * lr, u
        assert want[u] <= got[u] <= want[u] / (1 - w) ** 2 * (1 + 1e-4), u
    assert abs(got[250000] - want[250000]) > 1e-3 * lr  # the difference is real, not zero (an approximation)


def test_fairseq_protocol_keeps_fairseqs_recipe():
    cfg = recipe_cfg("fairseq")
    assert cfg.lr_scheduler._name == "inverse_sqrt" and cfg.optimization.max_update == 120000
    assert cfg.model.adaptive_input is False and cfg.model.adaptive_softmax_cutoff is None
    assert cfg.criterion._name == "cross_entropy"


@pytest.mark.parametrize("protocol,size,sequences", [("published", "small", 96), ("published", "medium", 56),
                                                      ("fairseq", "small", 96), ("fairseq", "medium", 96)])
def test_sequences_per_update(protocol, size, sequences):
    cfg = recipe_cfg(protocol, size)
    assert cfg.dataset.batch_size * cfg.optimization.update_freq[0] == sequences
    assert cfg.task.tokens_per_sample == {"small": 256, "medium": 384}[size]


def test_optimiser_and_regularisation_are_the_published_ones():
    cfg = recipe_cfg()
    assert cfg.optimizer._name == "adam" and eval(cfg.optimizer.adam_betas) == (0.9, 0.999)
    assert cfg.optimizer.weight_decay == 0.0 and cfg.optimization.clip_norm == 0.25
    assert cfg.model.dropout == 0.1 and cfg.model.activation_dropout == 0.1
    assert cfg.model.adaptive_softmax_dropout == 0.1 and cfg.model.attention_dropout == 0.0
    assert cfg.lr_scheduler._name == "cosine" and cfg.lr_scheduler.min_lr == 0.0


# --------------------------------------------------------------------------- the model fairseq builds
VOCAB = 1000  # a small dictionary: the cutoffs scaled to it as train.sh scales them


@pytest.fixture(scope="module")
def published_models():
    """The small architectures under the published protocol (2 layers to keep it quick; every other
    size as the recipe has it), softmax twin and --fourier-published."""
    extra = ("--decoder-layers", "2")
    return {kind: pc.our_model(arch, VOCAB, extra=extra + more)
            for kind, arch, more in (("softmax", "softmax_lm_wiki103_small", ()),
                                     ("published", "fourierformer_lm_wiki103_small", ("--fourier-published",)),
                                     ("defaults", "fourierformer_lm_wiki103_small", ()))}


def test_adaptive_input_and_softmax_cutoffs_factors_and_tying(published_models):
    cut = [int(c) for c in tr.scaled_cutoffs(tr.PUBLISHED_CUTOFFS, VOCAB).split(",")]
    assert len(cut) == 3
    for kind, (model, cfg) in published_models.items():
        emb, asm = model.decoder.embed_tokens, model.decoder.adaptive_softmax
        assert emb.cutoff == cut + [VOCAB] and asm.cutoff == cut + [VOCAB], kind
        d = cfg.model.decoder_embed_dim
        # factor 1: every band at the full width, as div_val 1
        assert all(band[0].weight.shape[1] == d for band in emb.embeddings), kind
        # tied: the head's words are band 0's embedding, each tail's output its band's embedding and
        # its projection its band's projection (--tie-adaptive-proj)
        assert asm.head.word_proj.weight is emb.embeddings[0][0].weight
        for i, tail in enumerate(asm.tail, 1):
            assert tail[-1].weight is emb.embeddings[i][0].weight, (kind, i)
            assert tail[0].weight is emb.embeddings[i][1].weight, (kind, i)


def test_layernorm_placement_post_ln_without_a_final_layernorm(published_models):
    for kind, (model, _) in published_models.items():
        assert model.decoder.layer_norm is None, kind
        assert all(not layer.normalize_before for layer in model.decoder.layers), kind
    model, _ = pc.our_model("softmax_lm_wiki103_small", VOCAB, protocol="fairseq", extra=("--decoder-layers", "2"))
    assert model.decoder.layer_norm is not None and all(layer.normalize_before for layer in model.decoder.layers)


def _pooled(tensors):
    return torch.cat([t.detach().flatten().double() for t in tensors])


def test_published_init_standard_deviations(published_models):
    """N(0, 0.02) Linear and embedding weights, N(1, 0.02) LayerNorm weights, zero biases, identity band
    projections. Bounds: the sample std of n draws of N(0, s) is within 4 s / sqrt(2n) of s."""
    s = PUBLISHED_INIT_STD
    for kind, (model, _) in published_models.items():
        emb = model.decoder.embed_tokens
        proj = {id(band[1]) for band in emb.embeddings}
        linears = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in proj]
        weights = _pooled(m.weight for m in linears)
        assert abs(weights.mean()) < 4 * s / math.sqrt(weights.numel()), kind
        assert abs(weights.std() - s) < 4 * s / math.sqrt(2 * weights.numel()), kind
        for m in linears:  # each layer at the std, not only their pool
            assert abs(m.weight.std().item() - s) < 4 * s / math.sqrt(2 * m.weight.numel()) + 1e-9, (kind, m)
        embeddings = _pooled(band[0].weight for band in emb.embeddings)
        assert abs(embeddings.std() - s) < 4 * s / math.sqrt(2 * embeddings.numel()), kind
        for band in emb.embeddings:
            assert torch.equal(band[1].weight, torch.eye(band[1].weight.shape[0])), kind
        norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
        assert norms, kind
        w = _pooled(m.weight for m in norms)
        assert abs(w.mean() - 1) < 4 * s / math.sqrt(w.numel()) and abs(w.std() - s) < 4 * s / math.sqrt(2 * w.numel())
        biases = [m.bias for m in list(linears) + norms if m.bias is not None]
        assert biases and all(torch.count_nonzero(b) == 0 for b in biases), kind
        # fairseq scales the embeddings by sqrt(d) in the forward, as the published code does
        assert model.decoder.embed_scale == pytest.approx(math.sqrt(model.decoder.embed_dim))


def test_attention_without_biases_in_every_published_model(published_models):
    model, _ = published_models["softmax"]
    attentions = softmax_attentions(model)
    assert len(attentions) == 2
    named = dict(model.named_parameters())
    for m in attentions:
        for proj in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
            assert not isinstance(proj.bias, nn.Parameter) and torch.count_nonzero(proj.bias) == 0
    assert not any(n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias", "out_proj.bias")) for n in named)
    # the biases stay in the state dict (as zeros), so the keys are the stock model's
    assert any(k.endswith("self_attn.q_proj.bias") for k in model.state_dict())
    fourier, _ = published_models["published"]
    assert not any(n.endswith("_proj.bias") and "self_attn" in n for n, _ in fourier.named_parameters())


def test_softmax_twin_without_biases_trains_a_step(published_models):
    """The bias buffers go through fairseq's fast attention path and get no gradient."""
    model, _ = published_models["softmax"]
    model.train()
    tokens = torch.randint(4, VOCAB, (2, 16))
    out, _ = model(tokens)
    out.float().sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "self_attn" in n)


def test_parameter_counts_explained_term_by_term(published_models):
    """ours = the published code's count (its model definition, term by term) + each itemised difference."""
    for kind, fourier in (("softmax", False), ("published", True)):
        model, cfg = published_models[kind]
        d, layers, inner = cfg.model.decoder_embed_dim, cfg.model.decoder_layers, cfg.model.decoder_ffn_embed_dim
        published = sum(pc.published_count(VOCAB, d, inner, layers, 3, fourier).values())
        diff = pc.differences(model, VOCAB, VOCAB, d, 3, softmax_biases=0)
        assert pc.count_trained(model) == published + sum(diff.values()), kind
    # the arithmetic of the published count at the paper's small size, written out
    small = pc.published_count(pc.PUBLISHED_VOCAB, 128, 2048, 16, 3, False)
    assert sum(small.values()) == (267735 * 128 + 16 * (4 * 128 * 128 + 2 * 128 + 2 * 128 * 2048 + 2048 + 128 + 2 * 128)
                                   + 267735 + 3 * 128 + 3)


# --------------------------------------------------------------------------- the recipe's shell side
def test_train_script_prints_the_protocols_command(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(VOCAB - 4)))
    cmd = ["bash", os.path.join(REPO, "examples", "wikitext103", "train.sh"), "--print-command", "--data", str(data),
           "--max-update", "1000", "--model", "softmax"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    cut = tr.scaled_cutoffs(tr.PUBLISHED_CUTOFFS, VOCAB)
    assert f"--adaptive-input-cutoff {cut.replace(',', chr(92) + ',')}" in r.stdout
    assert "--warmup-updates 4 " in r.stdout and "--max-update 1000 " in r.stdout
    assert "scaled in proportion" in r.stderr
    r = subprocess.run(cmd[:-2] + ["--protocol", "fairseq"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "--lr-scheduler inverse_sqrt" in r.stdout and "adaptive" not in r.stdout
    r = subprocess.run(cmd + ["--protocol", "frobnicate"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0 and "--protocol must be" in r.stderr


def test_scaled_cutoffs_and_warmup():
    assert tr.scaled_cutoffs(tr.PUBLISHED_CUTOFFS, tr.WIKITEXT103_VOCAB) == tr.PUBLISHED_CUTOFFS
    assert tr.scaled_cutoffs(tr.PUBLISHED_CUTOFFS, 33280) == "2500,5000,25000"
    with pytest.raises(ValueError, match="too small"):
        tr.scaled_cutoffs(tr.PUBLISHED_CUTOFFS, 3)
    assert tr.scaled_warmup("published", "small", 500000) == 2000 and tr.scaled_warmup("published", "small", 1000) == 4
    assert tr.scaled_warmup("fairseq", "small", 1200) == 40


# --------------------------------------------------------------------------- the dry run
def test_dry_run_gpu_hours_recomputed_from_their_inputs():
    """Each run's GPU-hours are its updates x the step time of what it executes (the protocol's pass x
    --update-freq); a run the record does not hold (here: the Gaussian kernel's attention) is of unknown
    cost, not costed at another's speed; a run shared by tables is counted once in their total; the odd
    powers (x, x^3) run on the fused kernels, costed at their speed."""
    pr = load_paper_runs()
    record = {"step_times": [
        {"task": "wikitext103", "protocol": "published", "size": size, "attention": att, "precision": "fp32",
         "sequences_per_pass": seqs, "tokens_per_sequence": ctx, "ms_per_pass": ms}
        for size, seqs, ctx in (("small", 16, 256), ("medium", 8, 384))
        for att, ms in (("softmax", 100.0), ("fused", 200.0))]}
    lines = pr.dry_run_lines(["table1", "table7"], "published", record=record, seeds=3)
    small, medium = 500000 * 6 * 200.0 / 3.6e6, 400000 * 7 * 200.0 / 3.6e6  # a Fourier seed, GPU-hours
    run = lines[lines.index(next(l for l in lines if l.startswith("wikitext103 small published_small "))) + 1]
    assert f"a seed {small:.1f} GPU-h on 1 GPU" in run and f"{3 * 500000 * 96 * 256 / 1e9:.2f}G tokens" in run
    assert "in table1, table7" in next(l for l in lines if l.startswith("wikitext103 small published_small "))
    x3 = next(l for l in lines if l.startswith("wikitext103 small published_small_power3 "))
    assert "attention: the fused kernels" in x3 and "reference" not in x3
    assert f"a seed {small:.1f} GPU-h on 1 GPU" in lines[lines.index(x3) + 1]
    gaussian = next(l for l in lines if l.startswith("wikitext103 small fourier_small_gaussian "))
    assert "cost unknown" in lines[lines.index(gaussian) + 1]
    import re

    def total(name):
        line = next(l for l in lines if l.startswith(name))
        return float(re.search(r"total: ([0-9.]+) GPU-hours", line).group(1)), line

    t1, _ = total("table1 total")
    assert abs(t1 - 3 * (small / 2 + small * 2 + medium / 2 + medium * 2)) <= 0.51
    t7, line7 = total("table7 total")
    fused7 = [r for r in pr.table_runs("table7")["runs"] if pr.attention_backend(r[3], 16)[0] == "fused"]
    assert abs(t7 - 3 * small * len(fused7)) <= 0.51 and f"{len(fused7)} of 10 runs" in line7
    both, _ = total("all 2 tables")
    assert abs(both - (t1 + t7 - 3 * small * 2)) <= 1.1  # published_small and fourier_small once


def load_paper_runs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper_runs", os.path.join(REPO, "examples", "paper_runs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reproduce_dry_run_prints_every_run_once_with_its_command_and_trains_nothing(tmp_path):
    pr = load_paper_runs()
    r = subprocess.run(["bash", os.path.join(REPO, "examples", "reproduce.sh"), "--dry-run", "--runs", str(tmp_path / "r"),
                        "--seeds", "1", "table5", "table6"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    for table in ("table5", "table6"):
        for run, model, size, extra, *_ in pr.table_runs(table)["runs"]:
            head = next(l for l in r.stdout.splitlines() if f" {run}" in l and l.startswith(pr.table_runs(table)["task"]))
            i = r.stdout.splitlines().index(head)
            cmd = next(l for l in r.stdout.splitlines()[i:] if l.strip().startswith("fairseq-train "))
            assert f"--save-dir {tmp_path / 'r'}" in cmd and "--arch " in cmd and "--seed 1 " in cmd
            assert all(a in cmd.split() for a in extra)
    assert "data-bin/wikitext-103 " in r.stdout and "data-bin/iwslt14.tokenized.de-en " in r.stdout
    assert r.stdout.count("total:") == 3 and "docs/records/step_times.json" in r.stdout
    assert not (tmp_path / "r").exists()


def test_the_dry_runs_step_times_are_the_record_reproduce_passes(tmp_path):
    """reproduce.sh hands paper_runs.py the step-time record (--timings, else the dated one of this
    checkout); paper_runs.py has no default of its own, and the package holds no paper table."""
    record = tmp_path / "times.json"
    record.write_text(json.dumps({"date": "a day", "machine": "a card", "step_times": [
        {"task": "iwslt14", "attention": att, "precision": "fp32", "protocol": None, "size": None,
         "tokens_per_pass": 2048, "ms_per_pass": ms} for att, ms in (("softmax", 360.0), ("fused", 720.0))]}))
    r = subprocess.run(["bash", os.path.join(REPO, "examples", "reproduce.sh"), "--dry-run", "--seeds", "1",
                        "--timings", str(record), "table5"], capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f"# step times: {record} (a day, a card" in r.stdout
    hours = 50 * 1100 * (360.0 + 720.0) * 2 / 3.6e6  # both runs: epochs x updates an epoch x ms at 4096 tokens
    assert f"table5 total: {hours:.0f} GPU-hours on 1 GPU" in r.stdout, r.stdout[-2000:]
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples", "paper_runs.py"), "dry-run", "table5"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0 and "--timings" in r.stderr
    assert not hasattr(tr, "PAPER_TABLES") and not hasattr(tr, "table_runs")


# --------------------------------------------------------------------------- every row of the LM tables
def _row_runs():
    pr = load_paper_runs()
    seen = {}
    for table in ("table1", "table6", "table7", "table8"):
        for row in pr.table_runs(table)["runs"]:
            seen.setdefault(row[0], row)
    return sorted(seen.values())


@pytest.mark.parametrize("row", _row_runs(), ids=lambda r: r[0])
def test_every_row_of_the_lm_tables_builds_its_setting_and_trains_a_step(row):
    """Each run of tables 1, 6, 7 and 8 under the published protocol (1 layer): the model has the row's
    phi, power and radius, and a step gives its attention and radius gradients."""
    from fourierformer_fairseq.fairseq_runs import options_given
    from fourierformer_fairseq.modules.fourier_multihead_attention import FourierMultiheadAttention

    name, model_kind, size, extra, label, paper_row = row
    arch = tr.lm_recipe("published", size)["arch"]
    if model_kind == "softmax":
        arch = "softmax_lm_wiki103_" + size
    model, cfg = pc.our_model(arch, VOCAB, size=size, extra=("--decoder-layers", "1", *extra))
    given = options_given(list(extra))
    fourier = [m for m in model.modules() if isinstance(m, FourierMultiheadAttention)]
    assert len(fourier) == (0 if model_kind == "softmax" else 1)
    for m in fourier:
        assert m.power == int(given.get("power", 4)) and m.phi == given.get("phi", "power")
        assert m.kernel == given.get("kernel", "sinc")
        shape = {"scalar": (), "head": (m.num_heads, 1), "feature": (m.num_heads, m.head_dim),
                 "vector": (m.head_dim,)}[given.get("radius_shape", "scalar")]
        assert tuple(m.radius.shape) == shape
        want = float(given["radius_init"]) if "radius_init" in given else (2.0 if "published" in given else None)
        if want is not None:
            assert torch.all(m.radius == want)
        assert (m.normaliser_eps == 1e-6) == ("published" in given)
    model.train()
    torch.manual_seed(0)
    out, _ = model(torch.randint(4, VOCAB, (2, 12)))
    out.float().sum().backward()
    for n, p in model.named_parameters():
        if "self_attn" in n:
            assert p.grad is not None and torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("size,gpus,per_gpu,freq", [("small", 2, 16, 3), ("small", 8, 12, 1), ("medium", 4, 7, 2)])
def test_train_script_shares_the_protocols_sequences_over_gpus(size, gpus, per_gpu, freq):
    """--gpus N keeps the protocol's sequences an update: per-GPU batch x update-freq x N."""
    base = ["bash", os.path.join(REPO, "examples", "wikitext103", "train.sh"), "--print-command", "--size", size]
    r = subprocess.run(base + ["--gpus", str(gpus)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    got = int(words[words.index("--batch-size") + 1]), int(words[words.index("--update-freq") + 1])
    assert got == (per_gpu, freq)
    assert per_gpu * freq * gpus == {"small": 96, "medium": 56}[size]
    assert words[words.index("--distributed-world-size") + 1] == str(gpus)
    r = subprocess.run(base + ["--gpus", "5"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0 and "cannot be shared evenly by 5 GPUs" in r.stderr


# --------------------------------------------------------------------------- the status table's verdicts
def _status_rows() -> dict:
    """docs/published-model.md's status table: row number -> (published, here, status)."""
    text = open(os.path.join(REPO, "docs", "published-model.md"), encoding="utf-8").read()
    table = text[text.index("## Status: the published training, row by row"):]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0].isdigit():
            rows[int(cells[0])] = tuple(cells[1:])
    return rows


def test_status_table_says_no_more_than_it_knows():
    """Rows 1 and 2 hold only for one of the two kernel variants (the published LM's is not published);
    row 7 says what the trained band projection does to the tying; row 16 is the one verdict on the
    evaluation, which evaluate.sh and the READMEs point to, with the shift of the band boundaries by
    fairseq's special symbols (the published vocabulary has one, <eos>: fairseq's have the others)."""
    from fairseq.data import Dictionary

    rows = _status_rows()
    for n in (1, 2):
        assert rows[n][2].startswith("approximated: which kernel variant is unknown"), rows[n]
        assert "**reproduced**" not in rows[n][2] and "R^(pD)" in rows[n][2]
    assert "no longer one tensor" in rows[7][2] and "band 0's projection leaves the identity" in rows[7][2]
    assert rows[16][2].startswith("approximated: the base toolkit's evaluation")
    assert f"up to {Dictionary().nspecial - 1} words" in rows[16][2]
    for path in ("examples/wikitext103/evaluate.sh", "examples/README.md", "README.md"):
        text = open(os.path.join(REPO, path), encoding="utf-8").read()
        assert "row 16" in text, path
        # the evaluation is not called the paper's protocol anywhere (row 16: not known)
        for line in text.splitlines():
            assert not ("paper's protocol" in line and ("sliding" in line or "evaluate.sh" in line
                                                        or "stride" in line.lower())), (path, line)
