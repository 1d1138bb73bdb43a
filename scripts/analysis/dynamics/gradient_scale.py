"""Gradient norms of freshly initialised models on one real batch, Fourier beside softmax.

Builds each model from fairseq options (same seed, so shared weights start identical), runs
one training batch of the given data (dropout off, label-smoothed cross-entropy as in the
recipes), and prints the total gradient norm and the norm of the query/key projections'
gradients, with the mean attention entropy of the batch's first sentence. This is what
``gnorm`` in the first line of a training log shows, without training.

    python scripts/analysis/dynamics/gradient_scale.py --data data-bin/multi30k --task translation \\
        --model "softmax=--arch transformer_iwslt_de_en" \\
        --model "paper-exact=--arch fourierformer_iwslt_de_en --fourier-paper-exact" \\
        --model "default=--arch fourierformer_iwslt_de_en" -- --share-all-embeddings

Options after ``--`` go to every model (sizes, e.g. ``--encoder-layers 3``).
"""
from __future__ import annotations

import argparse
import math
import os
import shlex

import torch


def build(data, task_name, model_args, common, seed):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    argv = [data, "--task", task_name, "--user-dir", os.path.join(os.path.dirname(__file__), "..", "..", "..", "fourierformer_fairseq"),
            "--criterion", "label_smoothed_cross_entropy" if task_name == "translation" else "cross_entropy",
            "--seed", str(seed), *model_args, *common]
    if task_name == "translation":
        argv += ["--label-smoothing", "0.1"]
    args = options.parse_args_and_arch(parser, argv)
    torch.manual_seed(seed)
    task = tasks.setup_task(args)
    model = task.build_model(args)
    criterion = task.build_criterion(args)
    return args, task, model, criterion


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--task", default="translation", choices=["translation", "language_modeling"])
    ap.add_argument("--model", action="append", required=True, metavar="NAME=OPTIONS")
    ap.add_argument("--sentences", type=int, default=128, help="batch size (sentences or blocks)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("common", nargs="*", help="options for every model (after --)")
    args = ap.parse_args(argv)

    from fairseq.modules.multihead_attention import MultiheadAttention

    print(f"one batch of {args.sentences} from {args.data} (train), dropout off, seed {args.seed}")
    print("| model | total grad norm | q_proj + k_proj grad norm | loss |")
    print("|---|---|---|---|")
    for spec in args.model:
        name, _, opts = spec.partition("=")
        _, task, model, criterion = build(args.data, args.task, shlex.split(opts), args.common, args.seed)
        task.load_dataset("train")
        dataset = task.dataset("train")
        sample = dataset.collater([dataset[i] for i in range(min(args.sentences, len(dataset)))])
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "FairseqDropout":
                m.p = 0.0
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        total = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.parameters() if p.grad is not None))
        qk = math.sqrt(sum(m.q_proj.weight.grad.pow(2).sum().item() + m.k_proj.weight.grad.pow(2).sum().item()
                           for m in model.modules() if isinstance(m, MultiheadAttention)))
        print(f"| {name} | {total:.3g} | {qk:.3g} | {(loss / sample_size).item() / math.log(2):.3f} |", flush=True)


if __name__ == "__main__":
    main()
