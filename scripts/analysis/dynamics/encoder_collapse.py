"""Whether a translation model's encoder has collapsed, per saved checkpoint, on validation sentences.

For each checkpoint of a folder (``checkpoint<epoch>.pt``, fairseq's epoch checkpoints, or one
``.pt`` file), and with ``--init`` for a fresh model of the same config and seed first, runs the
model in eval mode with teacher forcing on the validation set and prints, per attention layer
(``enc0``, ``dec1``, ``cross0``, ...):

- ``ratio/<layer>``: the RMS of the attention's output (after ``out_proj``) over the RMS of its
  query input, the residual stream the output is added to (mean over sentences);
- ``hnorm/<layer>``: a row's entropy over its real keys divided by log(keys) (1: uniform);
- ``null/<layer>``: the weight a row leaves to the null key (``--fourier-normaliser-eps``);
- ``qrms/<layer>``: the RMS of the raw query projection;
- ``gqk/<layer>``, ``gvo/<layer>``, ``gtotal``: gradient norms of the q+k and v+out projections
  and of all parameters, from the nll of the whole validation set as one batch;

and for the model: ``enc_cos``, the mean cosine between the encoder's output vectors at two
different positions of a sentence (1: every position carries the same vector), ``nll`` (nats per
target token) and ``nll_swapped``, the same targets with the next sentence's source (equal to
``nll``: the model does not use its source). docs/published-model.md, "At small width".

    python scripts/analysis/dynamics/encoder_collapse.py --data data-bin/wbw --checkpoints runs/published/ck --init
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re

import torch


def layer_name(name: str) -> str:
    from fourierformer_fairseq.models.attention_options import site_tag

    index = next((p for p in reversed(name.split(".")) if p.isdigit()), "")
    return f"{site_tag(name)}{index}"


def validation_batches(task):
    """(one sample per sentence, all sentences as one batch, the same with each target paired
    with the next sentence's source)."""
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    items = [dataset[i] for i in range(len(dataset))]
    swapped = [dict(item, source=items[(i + 1) % len(items)]["source"]) for i, item in enumerate(items)]
    return [dataset.collater([item]) for item in items], dataset.collater(items), dataset.collater(swapped)


def nll(model, batch, pad: int) -> torch.Tensor:
    lprobs = torch.log_softmax(model(**batch["net_input"])[0].float(), -1)
    target = batch["target"]
    total = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1), ignore_index=pad,
                                         reduction="sum")
    return total / target.ne(pad).sum()


def attention_stats(model, samples) -> dict:
    from fairseq.modules.multihead_attention import MultiheadAttention

    sums = {}
    forwards = {}

    def add(key, value):
        s = sums.setdefault(key, [0.0, 0])
        s[0] += value
        s[1] += 1

    for name, module in model.named_modules():
        if not isinstance(module, MultiheadAttention):
            continue

        def capturing(*args, _forward=module.forward, _layer=layer_name(name), _module=module, **kwargs):
            kwargs["need_weights"] = True
            kwargs["need_head_weights"] = True
            query = args[0] if args else kwargs["query"]
            out, weights = _forward(*args, **kwargs)
            add("ratio/" + _layer, (out.double().pow(2).mean().sqrt() / query.double().pow(2).mean().sqrt()).item())
            P = weights.double()  # (heads, batch, tgt, src)
            total = P.sum(-1)
            add("null/" + _layer, (1 - total).mean().item())
            keys = P.shape[-1]
            if keys > 1:
                Pn = P / total.clamp_min(1e-300).unsqueeze(-1)
                H = -(Pn * torch.where(Pn > 0, Pn.log(), torch.zeros_like(Pn))).sum(-1)
                add("hnorm/" + _layer, (H / math.log(keys)).mean().item())
            add("qrms/" + _layer, _module.q_proj(query).double().pow(2).mean().sqrt().item())
            return out, weights

        forwards[name] = capturing
    _attention_entropy().run_with_forwards(model, samples, forwards)
    return {key: total / n for key, (total, n) in sums.items()}


def _attention_entropy():
    """scripts/analysis/dynamics/attention_entropy.py, beside this script, as a module."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_entropy.py")
    spec = importlib.util.spec_from_file_location("attention_entropy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def position_cosine(model, samples) -> float:
    """Mean cosine between the encoder's outputs at two different positions of a sentence."""
    values = []
    with torch.no_grad():
        for sample in samples:
            net_input = sample["net_input"]
            enc = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])["encoder_out"][0]
            e = torch.nn.functional.normalize(enc[:, 0].double(), dim=-1)
            n = e.shape[0]
            if n > 1:
                values.append(((e @ e.T).sum().item() - n) / (n * n - n))
    return sum(values) / len(values)


def measure(model, samples, batch, swapped, pad: int) -> dict:
    model.eval()
    result = attention_stats(model, samples)
    model.zero_grad()
    loss = nll(model, batch, pad)
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        squared = p.grad.double().pow(2).sum().item()
        m = re.match(r"(.*)\.(q_proj|k_proj|v_proj|out_proj)\.", name)
        if m:
            key = ("gqk/" if m.group(2) in ("q_proj", "k_proj") else "gvo/") + layer_name(m.group(1))
            grads[key] = grads.get(key, 0.0) + squared
        grads["gtotal"] = grads.get("gtotal", 0.0) + squared
    model.zero_grad()
    result.update({k: math.sqrt(v) for k, v in grads.items()})
    result["nll"] = loss.item()
    with torch.no_grad():
        result["nll_swapped"] = nll(model, swapped, pad).item()
    result["enc_cos"] = position_cosine(model, samples)
    return result


def checkpoint_paths(where: str):
    if os.path.isfile(where):
        return [where]
    paths = glob.glob(os.path.join(where, "checkpoint[0-9]*.pt"))
    return sorted(paths, key=lambda p: int(re.findall(r"(\d+)\.pt$", p)[0]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--checkpoints", required=True, help="folder of checkpoint<epoch>.pt files, or one .pt file")
    ap.add_argument("--init", action="store_true", help="also a fresh model of the same config and seed, first")
    ap.add_argument("--out", help="write the points as JSON")
    ap.add_argument("--user-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "..", "fourierformer_fairseq"))
    args = ap.parse_args(argv)

    from fairseq import checkpoint_utils, utils

    utils.import_user_module(argparse.Namespace(user_dir=os.path.abspath(args.user_dir)))
    paths = checkpoint_paths(args.checkpoints)
    if not paths:
        raise SystemExit(f"no checkpoint<epoch>.pt files in {args.checkpoints}")
    points = []
    batches = None
    for path in paths:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": args.data})
        pad = task.target_dictionary.pad()
        if batches is None:
            batches = validation_batches(task)
            if args.init:
                utils.set_torch_seed(cfg.common.seed)
                points.append(("init", measure(task.build_model(cfg.model), *batches, pad)))
        points.append((os.path.basename(path), measure(models[0], *batches, pad)))
        print(f"measured {path}", flush=True)
    keys = sorted(points[0][1])
    print("".ljust(16) + " ".join(f"{label[-9:]:>9}" for label, _ in points))
    for key in keys:
        print(key[:16].ljust(16) + " ".join(f"{point.get(key, float('nan')):9.4g}" for _, point in points))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(points, fh, indent=1)


if __name__ == "__main__":
    main()
