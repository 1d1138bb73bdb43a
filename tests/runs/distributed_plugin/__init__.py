"""A test-only fairseq plugin: ``fourierformer_fairseq``, plus a record of what each rank trained.

Stock ``fairseq-train`` saves checkpoints on rank 0 only, so a run's other ranks leave nothing to
compare. Loaded with ``--user-dir tests/runs/distributed_plugin`` (in place of ``--user-dir
fourierformer_fairseq``: it imports the package, which registers every architecture) and the
environment variable ``FF_DIST_RECORD=FOLDER``, every training process writes, after each of its
updates, ``FOLDER/rank<R>.pt`` (R: its data-parallel rank) holding

- ``rank``, ``world_size``;
- ``updates``: one dict per update, in order: ``num_updates`` (after the update), ``dummy`` (per
  pass of the update, whether the rank ran fairseq's dummy batch: it had no batch left), ``ids``
  (per pass, the dataset indices of its batch's sentences, sorted; none for a dummy batch),
  ``meters`` ({name: (sum, count)} of every averaged scalar logged during the update, on this
  rank: the criterion's loss, the attention diagnostics, ...) and ``features`` ({module name:
  (draw index, projection)} of every Performer attention after the update);
- ``state``: the model's ``state_dict`` (parameters and buffers) after the last update.

Nothing of the product changes: the plugin wraps ``fairseq.trainer.Trainer.train_step`` to
record, and without ``FF_DIST_RECORD`` it does nothing. With it, one more thing, which changes
nothing in a run of several ranks: the trainer's gradient normalisation
``optimizer.multiply_grads(c)`` gets ``c`` as a float64 0-dim tensor also in a single process. With
more than one rank fairseq's ``c`` (world size / sample size) is such a tensor, from the all-reduced
sample size, and a 0-dim gradient (a scalar radius) times a 0-dim float64 tensor is computed in
float64; in one process ``c`` is a Python float, and that product is computed in float32. The two
differ in the last bit now and then (every other gradient is multiplied in float32 either way), so
a single process compared with two ranks normalises as the ranks do.
"""
from __future__ import annotations

import os

import torch
from fairseq.logging import meters, metrics
from fairseq.optim.fairseq_optimizer import FairseqOptimizer
from fairseq.trainer import Trainer

import fourierformer_fairseq  # noqa: F401  (registers the architectures)

RECORD_ENV = "FF_DIST_RECORD"

_original_train_step = Trainer.train_step
_records: dict = {}


def _cpu_copy(tensor):
    return tensor.detach().to("cpu", copy=True)


def _features(model) -> dict:
    return {name: (int(module.feature_draw), _cpu_copy(module.projection))
            for name, module in model.named_modules()
            if hasattr(module, "feature_draw") and hasattr(module, "projection")}


def _train_step(self, samples, raise_oom=False):
    folder = os.environ.get(RECORD_ENV)
    if not folder:
        return _original_train_step(self, samples, raise_oom)
    with metrics.aggregate() as step_meters:  # this update's scalars (also logged where fairseq logs them)
        out = _original_train_step(self, samples, raise_oom)
    rank = self.data_parallel_rank
    record = _records.setdefault(rank, {"rank": rank, "world_size": self.data_parallel_world_size, "updates": []})
    record["updates"].append({
        "num_updates": self.get_num_updates(),
        "dummy": [sample is None or len(sample) == 0 for sample in samples],
        "ids": [sorted(sample["id"].tolist()) if sample and "id" in sample else [] for sample in samples],
        "meters": {name: (float(meter.sum), float(meter.count)) for name, meter in step_meters.items()
                   if isinstance(meter, meters.AverageMeter)},
        "features": _features(self.get_model()),
    })
    record["state"] = {name: _cpu_copy(value) for name, value in self.get_model().state_dict().items()}
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank{rank}.pt")
    torch.save(record, path + ".part")
    os.replace(path + ".part", path)
    return out


def _multiply_grads(self, c):
    if os.environ.get(RECORD_ENV) and not torch.is_tensor(c):
        c = torch.tensor(float(c), dtype=torch.float64)  # as with more than one rank (see the docstring)
    return _original_multiply_grads(self, c)


_original_multiply_grads = FairseqOptimizer.multiply_grads
Trainer.train_step = _train_step
FairseqOptimizer.multiply_grads = _multiply_grads
