#!/usr/bin/env python3
"""The language models' parameter counts under the published protocol, beside the published code's.

Ours: the model fairseq builds (``--arch ..._wiki103_small|medium`` with the published protocol's
options from fourierformer_fairseq/training_recipes.py), instantiated on the CPU with a dictionary
of WikiText-103's size, its trained parameters counted (tied weights once). The published code's:
derived from its model definition (minhtannguyen/FourierFormer_NeurIPS, wikitext103/lmtool-fwms/src/
mem_transformer.py with train.py's flags: --adaptive --div_val 1, tied weights, attn_type 2 (softmax)
or 203 (Fourier), d_embed = d_model), term by term:

  word embedding      AdaptiveEmbedding, div_val 1: one Embedding(n_token, d), no projection (d_proj = d_embed)
  per layer           attention: q, k, v, o Linear(d, d, bias=False) (softmax: q_net + kv_net), LayerNorm(d);
                      feed-forward: Linear(d, inner) + Linear(inner, d) with biases, LayerNorm(d);
                      Fourier: one radius (paramR, a scalar)
  adaptive softmax    ProjectedAdaptiveLogSoftmax, div_val 1: out_layers[0] = Linear(d, n_token) whose
                      weight is tied to the embedding (its bias is not), cluster_weight (3, d), cluster_bias (3);
                      no projections (d_proj = d_embed)

and every difference between the two is itemised, so that ours = published + the sum of the items:

    python scripts/analysis/tables/lm_parameter_count.py                 # small and medium, softmax and Fourier
    python scripts/analysis/tables/lm_parameter_count.py --vocab 33280   # another vocabulary (cutoffs scaled)
"""
from __future__ import annotations

import argparse
import sys

PUBLISHED_VOCAB = 267735  # n_token of the published code's WikiText-103 corpus (its vocabulary, <eos> and <unk> included)


def published_count(vocab: int, d: int, inner: int, layers: int, n_clusters: int, fourier: bool) -> dict:
    """The published model's parameters, term by term (see the module docstring)."""
    layer = {
        "attention projections": 4 * d * d,
        "attention LayerNorm": 2 * d,
        "feed-forward": d * inner + inner + inner * d + d,
        "feed-forward LayerNorm": 2 * d,
        "radius": 1 if fourier else 0,
    }
    return {
        "word embedding": vocab * d,
        **{f"layers: {k}": layers * v for k, v in layer.items()},
        "adaptive softmax: output bias": vocab,
        "adaptive softmax: cluster weight and bias": n_clusters * d + n_clusters,
    }


def our_model(arch: str, vocab: int, protocol: str = "published", size: str = "small", extra=()):
    """Our model under the protocol, built by fairseq from the recipe's command line (CPU, a dictionary of
    ``vocab`` entries, the protocol's cutoffs scaled to it)."""
    import torch

    from fairseq import options, tasks
    from fairseq.data import Dictionary
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fourierformer_fairseq  # noqa: F401  (registers the plugin)
    from fourierformer_fairseq import USER_DIR
    from fourierformer_fairseq.training_recipes import (PUBLISHED_CUTOFFS, WIKITEXT103_VOCAB, recipe_args,
                                                         scaled_cutoffs)

    changes = {}
    if vocab != WIKITEXT103_VOCAB and protocol == "published":
        cut = scaled_cutoffs(PUBLISHED_CUTOFFS, vocab)
        changes = {"--adaptive-input-cutoff": cut, "--adaptive-softmax-cutoff": cut}
    argv = ["unused-data", "--user-dir", USER_DIR, "--arch", arch, "--cpu",
            *recipe_args("wikitext103", changes, protocol=protocol, size=size), *extra]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    cfg = convert_namespace_to_omegaconf(args)
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    task = tasks.get_task("language_modeling")(cfg.task, dictionary, dictionary)
    torch.manual_seed(1)
    return task.build_model(cfg.model), cfg


def count_trained(model) -> int:
    """Trained parameters, each tensor once (model.parameters() already skips the tied repeats)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def differences(model, vocab: int, published_vocab: int, d: int, n_clusters: int, softmax_biases: int) -> dict:
    """Each way ours differs from the published count (ours - published = the sum of the values)."""
    bands = len(model.decoder.embed_tokens.embeddings) if hasattr(model.decoder.embed_tokens, "embeddings") else 0
    out = {
        f"vocabulary: fairseq's {vocab} entries against {published_vocab} (its special symbols, padded)":
            (vocab - published_vocab) * d,
        f"adaptive input: a d x d projection per band ({bands} bands; the published model has none)": bands * d * d,
        "adaptive softmax: no output bias": -published_vocab,
        "adaptive softmax: no cluster bias (the head's class projection has no bias)": -n_clusters,
    }
    if softmax_biases:
        out["softmax attention: biases (kept)"] = softmax_biases
    return out


def report(vocab: int, out=sys.stdout) -> list:
    from fourierformer_fairseq.models.lm_options import softmax_attentions
    from fourierformer_fairseq.training_recipes import WIKITEXT103_VOCAB

    published_vocab = PUBLISHED_VOCAB if vocab == WIKITEXT103_VOCAB else vocab
    rows = []
    for size, d in (("small", 128), ("medium", 256)):
        for kind, arch, extra in (("softmax", f"softmax_lm_wiki103_{size}", ()),
                                  ("Fourier (--fourier-published)", f"fourierformer_lm_wiki103_{size}",
                                   ("--fourier-published",))):
            model, cfg = our_model(arch, vocab, size=size, extra=extra)
            layers, inner = cfg.model.decoder_layers, cfg.model.decoder_ffn_embed_dim
            n_clusters = len(str(cfg.model.adaptive_softmax_cutoff).split(","))
            fourier = kind != "softmax"
            published = published_count(published_vocab, d, inner, layers, n_clusters, fourier)
            biases = sum(p.numel() for m in softmax_attentions(model) for p in m.parameters() if p.dim() == 1)
            diff = differences(model, vocab, published_vocab, d, n_clusters, biases)
            ours = count_trained(model)
            rows.append({"size": size, "model": kind, "ours": ours, "published": sum(published.values()),
                         "published_terms": published, "differences": diff})
            print(f"## {size}, {kind}: ours {ours:,}, published {sum(published.values()):,}, "
                  f"difference {ours - sum(published.values()):+,}", file=out)
            for k, v in published.items():
                print(f"  published {k}: {v:,}", file=out)
            for k, v in diff.items():
                print(f"  difference, {k}: {v:+,}", file=out)
            explained = sum(diff.values())
            print(f"  explained: {explained:+,} ({'all' if explained == ours - sum(published.values()) else 'NOT all'})",
                  file=out)
    return rows


def main(argv=None) -> int:
    import logging
    import warnings

    from fourierformer_fairseq.training_recipes import WIKITEXT103_VOCAB

    warnings.filterwarnings("ignore")  # hydra's deprecation notices of fairseq's config conversion
    logging.disable(logging.WARNING)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=WIKITEXT103_VOCAB,
                    help="the dictionary's size, fairseq's special symbols included (default: WikiText-103's)")
    args = ap.parse_args(argv)
    rows = report(args.vocab)
    return 0 if all(r["ours"] - r["published"] == sum(r["differences"].values()) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
