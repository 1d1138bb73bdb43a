"""One training step of every architecture and preset gives every parameter a gradient.

fairseq's default ``--ddp-backend pytorch_ddp`` (c10d) runs torch's DistributedDataParallel without
``--find-unused-parameters``: a parameter that takes no part in a step's backward stops the run on
a GPU ("Expected to have finished reduction in the prior iteration ..."). Here each plugin
architecture (and the softmax twins), shrunk, with each of its kind's presets, takes one step in
training mode on a batch with padding (left-padded sources, right-padded targets and LM lines of
different lengths), the loss fairseq's cross-entropy criterion computes; after ``backward`` every
parameter that requires a gradient must hold one (finite).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fairseq_helpers import LM_DIMS, TRANSLATION_DIMS, arch_task, dummy_dictionary, plugin_archs, random_tokens

FOURIER_PRESETS = [
    [], ["--fourier-published"], ["--fourier-paper-exact"], ["--fourier-kernel", "gaussian"],
    ["--fourier-normaliser-eps", "1e-6"], ["--fourier-radius-shape", "head"], ["--fourier-radius-shape", "feature"],
    ["--fourier-phi", "abs"], ["--fourier-phi", "relu"], ["--fourier-phi", "sigmoid"], ["--fourier-power", "3"],
    ["--fourier-log-interval", "1"],
]
PERFORMER_PRESETS = [
    [], ["--performer-kernel", "relu"], ["--performer-kernel", "fourier_rf"],
    ["--performer-kernel", "fourier_rf", "--fourier-radius-shape", "feature"], ["--performer-feature-type", "iid"],
    ["--performer-redraw-interval", "1"],
]
GFNET_PRESETS = [[]]
# the sites a kind may leave softmax (translation only: an LM has only the decoder's)
SITE_PRESETS = {
    "fourier": [["--fourier-attention", s] for s in ("encoder", "decoder", "cross", "encoder,cross")],
    "performer": [["--performer-attention", s] for s in ("encoder", "decoder", "cross")],
    "gfnet": [["--gfnet-attention", s] for s in ("encoder", "decoder")],
}
TRANSLATION_EXTRA = [[], ["--share-decoder-input-output-embed"], ["--share-all-embeddings"]]


def build(arch: str, options, dims, task: str, d):
    """The model of ``arch`` as fairseq-train builds it (``fairseq.models.build_model``: an arch function,
    or a dataclass model's defaults for the archs named after their model), on the dictionary d."""
    from types import SimpleNamespace

    from fairseq import models, options as fairseq_options

    parser = fairseq_options.get_training_parser()
    args = fairseq_options.parse_args_and_arch(parser, ["unused-data-dir", "--task", task, "--arch", arch, *dims,
                                                        *options])
    return models.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))


def kind(arch: str) -> str:
    for name in ("performer", "gfnet", "fourier"):
        if arch.startswith(name):
            return name
    return "softmax"


def cases():
    import fourierformer_fairseq  # noqa: F401  (registers the archs)
    from fourierformer_fairseq.models import SOFTMAX_TWINS

    out = []
    for arch in plugin_archs() + sorted(set(SOFTMAX_TWINS.values())):
        translation = arch_task(arch)[1] == "translation"
        presets = {"fourier": FOURIER_PRESETS, "performer": PERFORMER_PRESETS, "gfnet": GFNET_PRESETS}.get(kind(arch), [[]])
        presets = presets + (SITE_PRESETS.get(kind(arch), []) if translation else [])
        extras = TRANSLATION_EXTRA if translation else [[], ["--share-decoder-input-output-embed"]]
        for preset in presets:
            for extra in (extras if preset == [] else [[]]):
                out.append(pytest.param(arch, translation, preset + extra, id="-".join([arch, *preset, *extra])))
    return out


@pytest.mark.parametrize("arch, translation, options", cases())
def test_one_step_on_a_padded_batch_gives_every_parameter_a_gradient(arch, translation, options):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    d = dummy_dictionary()
    if translation:
        model = build(arch, options, TRANSLATION_DIMS, "translation", d)
        src = random_tokens(d, [5, 3, 7], pad_left=True, generator=g)
        target = random_tokens(d, [4, 6, 2], pad_left=False, generator=g)
        prev = target.roll(1, dims=1)
        prev[:, 0] = d.eos()
        prev[target.eq(d.pad())] = d.pad()
        inputs = dict(src_tokens=src, src_lengths=src.ne(d.pad()).sum(1), prev_output_tokens=prev)
    else:
        model = build(arch, options, LM_DIMS, "language_modeling", d)
        lines = random_tokens(d, [9, 4, 6], pad_left=False, generator=g)
        target = lines[:, 1:].contiguous()
        inputs = dict(src_tokens=lines[:, :-1].contiguous())
    model.train()
    model.set_num_updates(1)  # as fairseq's task does before each pass (a Performer redraw, the diagnostics)
    net_output = model(**inputs)
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    loss = F.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1), ignore_index=d.pad(), reduction="sum")
    loss.backward()
    params = dict(model.named_parameters())
    assert params
    missing = [n for n, p in params.items() if p.requires_grad and p.grad is None]
    assert not missing, f"{arch} {options}: no gradient for {missing}"
    bad = [n for n, p in params.items() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"{arch} {options}: non-finite gradient for {bad}"
