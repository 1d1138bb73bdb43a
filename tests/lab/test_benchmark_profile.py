"""scripts/benchmarks/benchmark_attention.py --profile: the fused op's ATen ops, launches and time outside its
kernels per forward+backward call (torch.profiler).

On CPU (fast, at a small shape): its ATen op count against the profiler's own aggregation of a
direct profile of the same calls, an ATen op and a delay planted in the wrapper, and the CLI.
The CUDA classification (fused kernels by their namespace, every other device event a launch
outside them) on a synthetic profile, since no GPU runs here.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
import torch
from torch.autograd import DeviceType

import fourierformer_fairseq.ops as ops
from fourierformer_fairseq.ops import backend_unavailable_reason
from repo import script

from repo import REPO  # noqa: E402

SCRIPT = script("scripts/benchmarks/benchmark_attention.py")
SHAPE = dict(name="small", B=1, H=2, N=16, D=8, causal=False)
CALLS = 3

needs_fused_cpu = pytest.mark.skipif(bool(backend_unavailable_reason("cpu")),
                                     reason=f"fused CPU backend: {backend_unavailable_reason('cpu')}")


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_attention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ba():
    return load_benchmark()


@needs_fused_cpu
def test_profile_counts_match_a_direct_profile(ba):
    """The ATen ops it counts per call are those of a direct profile of the same forward+backward
    calls, aggregated by the profiler itself (key_averages), forward, backward and the fused ops'
    C++ calls included."""
    rec = ba.profile_fused(SHAPE, "cpu", torch.float32, 4, CALLS)
    step, tensors = ba.profile_step(SHAPE, "cpu", torch.float32, 4)
    step()
    for t in tensors:
        t.grad = None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(CALLS):
            step()
            for t in tensors:
                t.grad = None
    averages = prof.key_averages()
    direct = sum(a.count for a in averages if a.key.startswith("aten::")) / CALLS
    assert rec["aten_ops"] == direct
    assert 0 < rec["aten_top"] <= rec["aten_ops"]
    # both kernels ran once per call, inside their scopes, and are not counted as overhead
    scopes = {a.key: a.count for a in averages if a.key in ba.CPU_KERNEL_SCOPES}
    assert scopes == {name: CALLS for name in ba.CPU_KERNEL_SCOPES}
    assert not any(name in rec["ops"] for name in ba.CPU_KERNEL_SCOPES)
    for name in ba.FUSED_OPS:
        assert rec["ops"][name][0] == 1  # the fused ops' own time (checks, Python autograd) is overhead
    assert rec["fused_us"] > 0 and rec["host_us"] > 0 and rec["wall_us"] > 0
    assert 0.0 <= rec["non_kernel_share"] <= 1.0
    assert rec["other_launches"] is None and rec["other_device_us"] is None  # no device on CPU


@needs_fused_cpu
def test_profile_counts_a_planted_op_and_delay(ba, monkeypatch):
    """An ATen op and a 20 ms sleep planted in the wrapper, before the fused forward: one more ATen op
    per call, at the top level, listed by name, and the delay counted as host time outside the
    kernels."""
    before = ba.profile_fused(SHAPE, "cpu", torch.float32, 4, CALLS)
    real = ops.fused_forward

    def planted(inp, seed, values=None, tables=None):
        torch.neg(inp.q)
        time.sleep(0.02)
        return real(inp, seed, values, tables)

    monkeypatch.setattr(ops, "fused_forward", planted)
    after = ba.profile_fused(SHAPE, "cpu", torch.float32, 4, CALLS)
    assert after["aten_ops"] == before["aten_ops"] + 1
    assert after["aten_top"] == before["aten_top"] + 1
    assert after["ops"]["aten::neg"][0] == 1 and "aten::neg" not in before["ops"]
    assert after["host_us"] >= 20000.0


@dataclass
class Interval:
    start: float
    end: float

    def elapsed_us(self):
        return self.end - self.start


@dataclass
class Event:
    """The fields of torch.profiler's FunctionEvent that the summary reads."""
    name: str
    start: float
    end: float
    device_type: DeviceType = DeviceType.CPU
    cpu_parent: "Event | None" = None
    children_us: float = 0.0
    time_range: Interval = field(init=False)

    def __post_init__(self):
        self.time_range = Interval(self.start, self.end)

    @property
    def self_cpu_time_total(self):
        return self.end - self.start - self.children_us


def synthetic_cuda_step(ba, t0, host_us, kernel_us):
    """One step's events: the fused forward op (an aten::to in it, an aten::copy_ under the to), an
    autograd node on another thread, two fused kernels and a fill kernel on the device."""
    step = Event(ba.PROFILE_STEP, t0, t0 + host_us)
    fwd = Event(ba.FUSED_OPS[0], t0 + 1, t0 + 20, children_us=5)
    to = Event("aten::to", t0 + 2, t0 + 7, cpu_parent=fwd, children_us=3)
    copy = Event("aten::copy_", t0 + 3, t0 + 6, cpu_parent=to)
    node = Event("autograd::engine::evaluate_function: X", t0 + 30, t0 + 40)
    bwd = Event(ba.FUSED_OPS[1], t0 + 31, t0 + 39, cpu_parent=node)
    dev = [Event("void fourierformer::cuda::forward_tiled_kernel<float, 16>(...)", t0 + 5, t0 + 5 + kernel_us,
                 DeviceType.CUDA),
           Event("void fourierformer::cuda::backward_dq_kernel<float>(...)", t0 + 50, t0 + 50 + 2 * kernel_us,
                 DeviceType.CUDA),
           Event("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>(...)", t0 + 45, t0 + 47,
                 DeviceType.CUDA)]
    return [step, fwd, to, copy, node, bwd] + dev


def test_summary_on_a_synthetic_cuda_profile(ba):
    """On CUDA the fused kernels are the device events of the fourierformer:: namespace; every
    other device event is a launch outside them; host time is the whole call's (median)."""
    events = (synthetic_cuda_step(ba, 0.0, 100.0, 10.0) + synthetic_cuda_step(ba, 1000.0, 300.0, 30.0)
              + synthetic_cuda_step(ba, 2000.0, 200.0, 20.0))
    rec = ba.summarise_profile(events, 3, "cuda")
    assert rec["aten_ops"] == 2 and rec["aten_top"] == 1
    assert rec["fused_launches"] == 2 and rec["other_launches"] == 1
    assert rec["fused_us"] == pytest.approx((30 + 90 + 60) / 3)
    assert rec["other_device_us"] == pytest.approx(2.0)
    assert rec["host_us"] == 200.0
    assert rec["ops"]["aten::to"] == (1, 2.0) and rec["ops"][ba.FUSED_OPS[0]] == (1, 14.0)
    with pytest.raises(RuntimeError, match="holds 3 steps, expected 4"):
        ba.summarise_profile(events, 4, "cuda")
    with pytest.raises(RuntimeError, match="did not run the fused op"):
        ba.summarise_profile([e for e in events if e.name not in ba.FUSED_OPS], 3, "cuda")
    with pytest.raises(RuntimeError, match="no device events"):
        ba.summarise_profile([e for e in events if e.device_type == DeviceType.CPU], 3, "cuda")


@needs_fused_cpu
def test_profile_cli():
    """--profile on CPU: the speed table, then one profile row per shape asked for, and the listing."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--impls", "fused", "--shapes", "sweep N=256",
                        "--quick", "--reps", "2", "--no-memory", "--profile"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert ba_header() in lines
    rows = [line for line in lines if line.startswith("| sweep N=256 (B=1, H=8, N=256, D=16) |")]
    assert len(rows) == 2  # the speed table's row and the profile's
    cells = [c.strip() for c in rows[1].split("|")[1:-1]]
    assert len(cells) == 8 and cells[2] == "-" and cells[5] == "-" and cells[7].endswith("%")
    assert any(line.startswith("- sweep N=256: ") for line in lines)


def ba_header():
    return load_benchmark().PROFILE_HEADER
