"""scripts/tools/gpu_check.py's parsing, verdicts, commands, offline bundle check and GPU-hour arithmetic, on
inputs written here (the GPU steps themselves run only on a GPU: `bash scripts/tools/gpu_check.sh`)."""
from __future__ import annotations

import argparse
import json
import os
import time
import zipfile

import pytest

from fourierformer_fairseq import training_recipes
from fourierformer_fairseq.fairseq_runs import TIMED_OUT, run_logged
from repo import load


@pytest.fixture(scope="module")
def gc():
    return load("scripts/tools/gpu_check.py")


@pytest.fixture(scope="module")
def bundle():
    return load("scripts/tools/offline_bundle.py")


def fairseq_log(losses, ups, valid, overflows=0, amp_overflows=0):
    """Lines as fairseq-train --log-format json writes them."""
    lines = ["2026-01-01 00:00:00 | INFO | fairseq_cli.train | begin training"]
    for i in range(overflows):
        lines.append("2026-01-01 00:00:01 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring "
                     f"gradient, setting loss scale to: {64 / 2 ** i}")
    for i in range(amp_overflows):
        lines.append("2026-01-01 00:00:01 | INFO | fairseq.trainer | AMP: overflow detected, setting scale to "
                     f"{64 / 2 ** i}")
    for n, (loss, u) in enumerate(zip(losses, ups), start=1):
        rec = {"epoch": 1, "update": n / 100, "loss": f"{loss:.3f}", "ups": f"{u:.2f}", "num_updates": str(10 * n)}
        lines.append(f"2026-01-01 00:00:02 | INFO | train_inner | {json.dumps(rec)}")
    for v in valid:
        rec = {"epoch": 1, "valid_loss": f"{v:.3f}", "valid_num_updates": "100"}
        lines.append(f"2026-01-01 00:00:03 | INFO | valid | {json.dumps(rec)}")
    return lines


def test_parse_training_reads_losses_validations_overflows_and_the_median_rate(gc):
    r = gc.parse_training(fairseq_log([9.0, 8.0, 7.0, 6.0, 5.0, 4.0], [1.0, 10.0, 20.0, 25.0, 50.0, 40.0], [7.5, 7.0], 2))
    assert r["train"] == [(10, 9.0), (20, 8.0), (30, 7.0), (40, 6.0), (50, 5.0), (60, 4.0)]
    assert r["valid"] == [7.5, 7.0] and r["overflows"] == 2
    # the first third (ups 1 and 10) is left out; the median of 1000 / (20, 25, 50, 40) ms
    assert r["ms_per_update"] == pytest.approx(1000 / 25)


def test_parse_training_counts_the_amp_overflows_too(gc):
    r = gc.parse_training(fairseq_log([9.0, 8.0], [5.0, 5.0], [7.0], overflows=1, amp_overflows=3))
    assert r["overflows"] == 4


def run(losses, valid, overflows=0):
    return {"train": [(10 * i, l) for i, l in enumerate(losses)], "valid": valid, "overflows": overflows,
            "ms_per_update": 50.0}


def test_judge_pair_passes_a_fourier_run_that_trains_like_its_twin(gc):
    status, what = gc.judge_pair(run([10, 6], [6.1, 7.0]), run([10, 6.1], [6.0, 6.5]))
    assert status == "PASS", what
    assert "1.00x" in what  # ms/update of both reported


@pytest.mark.parametrize("fourier, twin, why", [
    (run([10, 9.5], [6.0]), run([10, 6], [6.0], 1), "dropped"),  # the Fourier loss barely falls
    (run([10, 6], [6.6]), run([10, 6], [6.0], 1), "valid"),  # its best validation loss is 10 % above the twin's
    (run([10, 6], [6.0], overflows=3), run([10, 6], [6.0], 1), "overflow"),  # two more overflow-skipped updates
    # neither trains: the Fourier loss falls as much as the twin's, which is nothing
    (run([10, 9.9], [6.0]), run([10, 9.9], [6.0]), "neither model's training is shown"),
])
def test_judge_pair_fails_what_the_check_promises_to_catch(gc, fourier, twin, why):
    status, what = gc.judge_pair(fourier, twin)
    assert status == "FAIL" and why in what, what


def test_judge_pair_allows_one_overflow_more_than_the_twin(gc):
    assert gc.OVERFLOW_SLACK == 1
    status, what = gc.judge_pair(run([10, 6], [6.0], overflows=2), run([10, 6], [6.0], overflows=1))
    assert status == "PASS", what


def test_the_twin_must_fall_by_the_stated_minimum(gc):
    drop = gc.MIN_TWIN_LOSS_DROP[True]
    just = run([10, 10 - drop], [6.0])
    short = run([10, 10 - 0.9 * drop], [6.0])
    assert gc.judge_pair(just, just)[0] == "PASS"
    assert gc.judge_pair(short, short)[0] == "FAIL"
    # a dry run's tiny models for a few updates are held to the smaller minimum
    assert gc.judge_pair(short, short, gpu=False)[0] == "PASS"


@pytest.mark.parametrize("precision, flag", [("fp16", "--fp16"), ("amp", "--amp")])
def test_train_command_is_the_recipe_with_the_precision_flag(gc, precision, flag, tmp_path):
    args = argparse.Namespace(gpu=True, data_bin=str(tmp_path), updates=200)
    (tmp_path / gc.TASKS["lm"][1]).mkdir()  # WikiText-2's dictionary: 33,276 words and fairseq's 4 symbols
    (tmp_path / gc.TASKS["lm"][1] / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(33276)))
    for task, (name, _) in gc.TASKS.items():
        fourier = training_recipes.recipe(name)["arch"]
        cmd = gc.train_command(args, task, fourier, precision, "/save")
        assert os.path.basename(cmd[0]).startswith("fairseq-train") or "fairseq_cli.train" in " ".join(cmd[:3])
        assert flag in cmd and "--bf16" not in cmd and "--cpu" not in cmd
        assert cmd[cmd.index("--arch") + 1] == fourier and cmd[cmd.index("--max-update") + 1] == "200"
        assert cmd.count("--max-update") == 1 and "--max-epoch" not in cmd and "--update-freq" not in cmd
        assert cmd[cmd.index("--warmup-updates") + 1] == str(200 // 3)
        # the recipe's hyper-parameters, from its table, but what the check changes
        for option in ("--adam-betas", "--dropout", "--weight-decay", "--clip-norm"):
            assert cmd[cmd.index(option) + 1] == training_recipes.recipe_value(name, option), (task, option)
        changed_lr = gc.CHECK_CHANGES[task][0].get("--lr", training_recipes.recipe_value(name, "--lr"))
        assert cmd[cmd.index("--lr") + 1] == changed_lr
        # only the evaluated (--fp16) runs keep a checkpoint
        assert ("--no-save" in cmd) == (precision != "fp16")
        if name == "wikitext103":  # the protocol's adaptive cutoffs, scaled to the data's vocabulary
            assert cmd[cmd.index("--adaptive-input-cutoff") + 1] == cmd[cmd.index("--adaptive-softmax-cutoff") + 1] \
                == training_recipes.scaled_cutoffs(training_recipes.PUBLISHED_CUTOFFS, 33280)


# The verdict's two thresholds, each just inside and just outside (the twin: loss 10 -> 6, best
# valid 6.0): the Fourier run's loss must drop at least LOSS_DROP_FRACTION of the twin's drop
# (0.8 x 4 = 3.2), and its best validation loss stay within VALID_SLACK of the twin's (1.05 x 6.0).
@pytest.mark.parametrize("side", [-1, 1], ids=["inside", "outside"])
def test_judge_pair_loss_drop_threshold_is_exact(gc, side):
    drop = gc.LOSS_DROP_FRACTION * 4.0 * (1 - side * 1e-3)
    status, what = gc.judge_pair(run([10, 10 - drop], [6.0]), run([10, 6], [6.0]))
    assert status == ("PASS" if side < 0 else "FAIL"), what
    assert (side > 0) == ("dropped" in what)
    assert gc.LOSS_DROP_FRACTION == pytest.approx(0.8)


@pytest.mark.parametrize("side", [-1, 1], ids=["inside", "outside"])
def test_judge_pair_valid_slack_threshold_is_exact(gc, side):
    valid = gc.VALID_SLACK * 6.0 * (1 + side * 1e-3)
    status, what = gc.judge_pair(run([10, 6], [valid, valid + 1]), run([10, 6], [6.5, 6.0]))
    assert status == ("PASS" if side < 0 else "FAIL"), what
    assert (side > 0) == ("valid" in what.split(": ", 1)[-1] if status == "FAIL" else False)
    assert gc.VALID_SLACK == pytest.approx(1.05)


def test_compiler_preset_replaces_a_wrapper_and_keeps_the_system_compiler(gc, monkeypatch):
    if not os.path.exists("/usr/bin/g++"):
        pytest.skip("no /usr/bin/g++ here")
    monkeypatch.setenv("CXX", "/opt/gcc/bin/g++")
    assert gc.compiler_preset() == {"CXX": "/usr/bin/g++", "CC": "/usr/bin/gcc"}
    monkeypatch.setenv("CXX", "/usr/bin/g++")
    assert gc.compiler_preset() == {}


def fake_wheel(folder, name, version, requires=()):
    path = os.path.join(folder, f"{name.replace('-', '_')}-{version}-py3-none-any.whl")
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta + "\nlong description\nRequires-Dist: not-a-header\n")
    return path


def complete_folder(bundle, folder):
    """Every root of the offline bundle that is not on the machine, as a wheel without requirements."""
    from packaging.requirements import Requirement

    for root in bundle.OFFLINE_ROOTS:
        req = Requirement(root)
        if bundle.canonical(req.name) not in bundle.ON_THE_MACHINE:
            version = next((str(s.version) for s in req.specifier), "1.0")
            fake_wheel(folder, req.name, version)


def test_the_bundle_reads_the_dependencies_of_requirements_txt(bundle, tmp_path, monkeypatch):
    """OFFLINE_ROOTS carries requirements.txt's recipe, test and build requirements as that file writes
    them (but what the check does not use, NOT_CARRIED), read from it, not copied: a pin changed there is
    the bundle's pin."""
    from packaging.requirements import Requirement

    text = open(os.path.join(bundle.REPO, "requirements.txt")).read()
    listed = [line.split("#")[0].strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert listed and bundle.NOT_CARRIED
    for r in listed:
        carried = bundle.canonical(Requirement(r).name) not in bundle.NOT_CARRIED
        assert (r in bundle.OFFLINE_ROOTS) == carried, r
    (tmp_path / "requirements.txt").write_text("# extra: recipes\nsacremoses>=9.9  # why\n\n# extra: test\npytest\n")
    monkeypatch.setattr(bundle, "REPO", str(tmp_path))
    assert bundle.requirements("extra: recipes") == ["sacremoses>=9.9"] and bundle.requirements("extra: test") == ["pytest"]
    with pytest.raises(RuntimeError, match="no section"):
        bundle.requirements("build")


def test_verify_wheels_finds_what_is_missing_and_nothing_more(bundle, tmp_path):
    folder = str(tmp_path)
    complete_folder(bundle, folder)
    assert bundle.verify_wheels(folder) == []
    # a requirement met by nothing in the folder; one on the machine (torch), one for another Python
    fake_wheel(folder, "needs-things", "1.0", ["mock", "torch>=1.13", 'importlib-resources; python_version < "3.9"',
                                              'black; extra == "dev"'])
    assert bundle.verify_wheels(folder) == ["mock is missing"]
    fake_wheel(folder, "mock", "5.2.0")
    assert bundle.verify_wheels(folder) == []
    fake_wheel(folder, "wants-new-mock", "1.0", ["mock>=6"])
    assert bundle.verify_wheels(folder) == ["mock>=6 is not satisfied by mock 5.2.0"]


def test_verify_wheels_refuses_torch_in_the_folder(bundle, tmp_path):
    complete_folder(bundle, str(tmp_path))
    fake_wheel(str(tmp_path), "torch", "2.11.0")
    assert any("torch is in" in p for p in bundle.verify_wheels(str(tmp_path)))


def test_step_times_of_the_protocols_own_passes_are_the_record_the_dry_run_reads(gc, tmp_path):
    """The steptimes step's code path on the CPU (tiny layers, the protocol's pass): an entry for each size,
    attention (the twin, the fused published attention, a reference row while one is not fused) and
    precision, at the protocol's sequences a pass and context; the record it makes costs every run of the
    LM tables whose attention it measured, as updates x ms a pass x --update-freq."""
    entries = gc.protocol_step_times("cpu", tiny=True, warmup=0, steps=1)
    attentions = [a for a, _, _ in gc.step_time_models()]
    assert {(e["size"], e["attention"], e["precision"]) for e in entries} == {
        (size, a, p) for size in ("small", "medium") for a in attentions for p in gc.STEP_TIME_PRECISIONS}
    assert all(e.get("ms_per_pass", 0) > 0 for e in entries), [e for e in entries if "error" in e]
    small = next(e for e in entries if e["size"] == "small" and e["attention"] == "fused" and e["precision"] == "fp32")
    assert (small["sequences_per_pass"], small["tokens_per_sequence"]) == (16, 256)
    record = gc.step_time_record(entries, gpu=False)
    path = tmp_path / "step_times.json"
    path.write_text(json.dumps(record))
    pr = gc.paper_runs()
    lines = pr.dry_run_lines(["table1", "table7"], record=pr.step_times(str(path)), record_path=str(path), seeds=1)
    # every run's cost but the Gaussian kernel's (its own op, which the step does not measure)
    unknown = [lines[i - 1] for i, l in enumerate(lines) if "cost unknown" in l and not l.startswith(("table", "all"))]
    assert unknown and all("gaussian" in l for l in unknown), unknown
    run = lines[lines.index(next(l for l in lines if l.startswith("wikitext103 small published_small "))) + 1]
    assert f"a seed {500000 * small['ms_per_pass'] * 6 / 3.6e6:.1f} GPU-h on 1 GPU" in run


def test_rows_are_written_as_they_come_and_a_step_past_its_limit_is_stopped(gc, tmp_path):
    check = gc.Check(str(tmp_path), budget=100)
    check.head(["## GPU check", "card: test"])
    check.record("first", "PASS", 1.0, "one")
    assert "| first | PASS | 1 | one |" in open(check.summary).read()  # before the check ends
    t0 = time.monotonic()
    rc, text = check.run("sleeper", ["bash", "-c", "echo started; sleep 60"], limit=1)
    assert rc == TIMED_OUT and "started" in text and "time limit" in text
    assert time.monotonic() - t0 < 50  # stopped, not waited for
    assert gc.failure(rc, text).startswith("ran past its time limit")


def test_run_logged_stops_the_children_of_a_command_at_its_limit(tmp_path):
    marker = tmp_path / "survived"
    rc = run_logged(["bash", "-c", f"(sleep 3; touch {marker}) & wait"], str(tmp_path / "log"), timeout=0.5)
    assert rc == TIMED_OUT
    time.sleep(4)
    assert not marker.exists()


def test_the_budget_cuts_each_limit(gc, tmp_path):
    check = gc.Check(str(tmp_path), budget=1)
    rc, _ = check.run("sleeper", ["sleep", "30"], limit=500)
    assert rc == TIMED_OUT


def test_packed_wheels_unpack_to_the_same_files(bundle, tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    complete_folder(bundle, str(folder))
    fake_wheel(str(folder), "mock", "5.2.0")
    archive = str(tmp_path / "bundle" / "wheels.tar.xz")
    os.makedirs(os.path.dirname(archive))
    bundle.pack_wheels(str(folder), archive)
    back = bundle.unpack_wheels(archive, str(tmp_path / "back"))
    names = sorted(os.listdir(folder))
    assert sorted(os.listdir(back)) == names and len(names) > 5
    for name in names:
        with zipfile.ZipFile(folder / name) as a, zipfile.ZipFile(os.path.join(back, name)) as b:
            assert [(i.filename, a.read(i)) for i in a.infolist()] == [(i.filename, b.read(i)) for i in b.infolist()]
    assert bundle.verify_wheels(back) == []


def test_unpack_refuses_what_is_not_a_wheel(bundle, tmp_path):
    import tarfile

    archive = str(tmp_path / "wheels.tar.xz")
    (tmp_path / "evil.sh").write_text("echo")
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(str(tmp_path / "evil.sh"), arcname="../evil.sh")
    with pytest.raises(ValueError, match="not a wheel"):
        bundle.unpack_wheels(archive, str(tmp_path / "out"))


def test_packed_data_bin_keeps_the_binaries_and_dictionaries_only(bundle, tmp_path):
    src = tmp_path / "data-bin"
    files = {"wikitext-2/dict.txt": b"the 5\n", "wikitext-2/train.bin": bytes(range(256)) * 4,
             "multi30k.de-en/dict.de.txt": b"und 3\n", "multi30k.de-en/text/train.de": b"text copy\n",
             "wikitext-2/raw/wiki.train.tokens": b"raw copy\n"}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    archive = str(tmp_path / "data-bin.tar.xz")
    bundle.pack_data(str(src), archive)
    back = bundle.unpack_data(archive, str(tmp_path / "out"))
    got = {os.path.relpath(os.path.join(d, f), back) for d, _, fs in os.walk(back) for f in fs}
    assert got == {"wikitext-2/dict.txt", "wikitext-2/train.bin", "multi30k.de-en/dict.de.txt"}
    for rel in got:
        assert open(os.path.join(back, rel), "rb").read() == files[rel]


def test_attention_row_gives_the_ratios_and_the_grid_splits_gain(gc, tmp_path):
    """step_attention on a GPU times fused, fused_unsplit and sdpa in one run and reports, per
    shape, the ratios to SDPA and unsplit / split where both fused rows are there."""
    recorded, commands = [], []

    class FakeCheck:
        out = str(tmp_path)

        def run(self, name, cmd, seconds, env=None):
            commands.append(cmd)
            path = cmd[cmd.index("--json") + 1]
            row = dict(shape="IWSLT'14", causal=False, elements=2 ** 20, sdpa_fwd_ms=1.0, sdpa_fwd_bwd_ms=2.0)
            rows = [dict(row, impl="fused", fwd_ms=3.0, fwd_bwd_ms=8.0),
                    dict(row, impl="fused_unsplit", fwd_ms=3.0, fwd_bwd_ms=10.0),
                    dict(row, impl="sdpa", fwd_ms=1.0, fwd_bwd_ms=2.0)]
            with open(path, "w") as f:
                json.dump({"rows": rows, "profile": []}, f)
            return 0, ""

        def record(self, step, status, seconds, what):
            recorded.append((step, status, what))

    gc.step_attention(FakeCheck(), argparse.Namespace(gpu=True))
    assert commands[0][commands[0].index("--impls") + 1] == "fused,fused_unsplit,sdpa"
    (step, status, what), = recorded
    assert status == "PASS"
    assert "IWSLT'14: fwd 3.0x, fwd+bwd 4.0x sdpa" in what and "unsplit / split 1.25" in what


def test_generation_row_gives_the_beam_search_and_the_op_at_decoding_shapes(gc, tmp_path):
    """step_generation runs scripts/benchmarks/benchmark_generation.py (beam 5, the IWSLT'14 pair; --device cuda
    on a GPU, --small on the dry run) and the op timings at DECODING_OP_SHAPES in a process of their
    own, and reports the ratios of both; a failing part fails the row and says which."""
    for gpu in (True, False):
        recorded, commands = [], []

        class FakeCheck:
            out = str(tmp_path)

            def run(self, name, cmd, seconds, env=None):
                commands.append((name, cmd))
                if name == "generation":
                    with open(cmd[cmd.index("--out") + 1], "w") as f:
                        json.dump({"rows": [dict(shape="mt", threads=1, softmax_s=2.0, fourier_s=2.5, ratio=1.25)]}, f)
                    return 0, ""
                assert "decoding_op_times(" in cmd[2] and ("'cuda'" if gpu else "'cpu'") in cmd[2]
                with open(cmd[-1], "w") as f:
                    json.dump([dict(shape="beam step N1 M30 D128", fused_ms=0.3, sdpa_ms=0.1, ratio=3.0)], f)
                return 0, ""

            def record(self, step, status, seconds, what):
                recorded.append((step, status, what))

        gc.step_generation(FakeCheck(), argparse.Namespace(gpu=gpu))
        (name, cmd), (ops_name, _) = commands
        assert name == "generation" and ops_name == "generation_ops"
        assert cmd[1] == "scripts/benchmarks/benchmark_generation.py" and cmd[cmd.index("--beam") + 1] == "5"
        assert cmd[cmd.index("--shapes") + 1] == "mt"
        assert (cmd[cmd.index("--device") + 1] == "cuda") if gpu else ("--small" in cmd and "--device" not in cmd)
        (step, status, what), = recorded
        assert step == "generation" and status == "PASS"
        assert "beam 5, mt: 1.25x the softmax twin (2.50 s against 2.00 s)" in what
        assert "beam step N1 M30 D128: op 3.0x sdpa (0.300 ms)" in what

    class FailingCheck(FakeCheck):
        def run(self, name, cmd, seconds, env=None):
            return (1, "Traceback\nRuntimeError: boom") if name == "generation_ops" else super().run(name, cmd, seconds)

    recorded.clear()
    commands.clear()
    gc.step_generation(FailingCheck(), argparse.Namespace(gpu=False))
    (step, status, what), = recorded
    assert status == "FAIL" and "the op at decoding shapes: exit 1" in what and "1.25x the softmax twin" in what


def test_decoding_op_times_on_the_cpu(gc):
    """The op timings of the generation row, through the CPU kernels at two small decoding shapes."""
    rows = gc.decoding_op_times("cpu", reps=2, shapes=(("one query", 2, 2, 1, 9, 16), ("eight", 1, 2, 8, 70, 8)))
    assert [r["shape"] for r in rows] == ["one query", "eight"]
    for r in rows:
        assert r["fused_ms"] > 0 and r["sdpa_ms"] > 0 and r["ratio"] == pytest.approx(r["fused_ms"] / r["sdpa_ms"])
    assert "generation" in gc.STEPS and gc.STEPS.index("generation") > gc.STEPS.index("table9")


# ------------------------------------------------------------------------------------- sanitize
# compute-sanitizer's own output lines (the tool prefixes each with "========= ")
MEMCHECK_CLEAN = "========= COMPUTE-SANITIZER\nok  Dv 3\n========= ERROR SUMMARY: 0 errors\n"
RACECHECK_RACE = ("========= COMPUTE-SANITIZER\n"
                  "========= Error: Race reported between Write access at backward_delta_tiled_kernel+0x1a0\n"
                  "=========     and Read access at backward_delta_tiled_kernel+0x2f0 [128 hazards]\n"
                  "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
REFUSED = "========= COMPUTE-SANITIZER\n========= Error: Device not supported. Please refer to the documentation\n"


class FakeSanitizerCheck:
    """Check's run / record / left, with canned outputs per compute-sanitizer tool."""

    def __init__(self, outputs, left=500.0):
        self.outputs, self.seconds_left = outputs, left
        self.commands, self.envs, self.recorded = [], [], []

    def left(self):
        return self.seconds_left

    def run(self, name, cmd, seconds, env=None):
        self.commands.append(cmd)
        self.envs.append(env)
        return self.outputs[cmd[cmd.index("--tool") + 1]]

    def record(self, step, status, seconds, what):
        self.recorded.append((step, status, what))


def test_sanitize_runs_each_tool_over_the_kernel_cases_and_reads_its_verdict(gc, monkeypatch):
    monkeypatch.setattr(gc, "find_compute_sanitizer", lambda: "/opt/cuda/bin/compute-sanitizer")
    check = FakeSanitizerCheck({"memcheck": (0, MEMCHECK_CLEAN),
                                "racecheck": (gc.SANITIZER_ERROR_EXIT, RACECHECK_RACE),
                                "synccheck": (TIMED_OUT, "========= COMPUTE-SANITIZER\nok  Dv 3\n")})
    gc.step_sanitize(check, argparse.Namespace(gpu=True))
    assert [c[c.index("--tool") + 1] for c in check.commands] == list(gc.SANITIZER_TOOLS)
    for cmd, env in zip(check.commands, check.envs):
        assert cmd[0] == "/opt/cuda/bin/compute-sanitizer" and cmd[-1] == "scripts/benchmarks/cuda_kernel_cases.py"
        assert cmd[cmd.index("--error-exitcode") + 1] == str(gc.SANITIZER_ERROR_EXIT)
        assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    (m_step, m_status, m_what), (r_step, r_status, r_what), (s_step, s_status, s_what) = check.recorded
    assert (m_step, m_status) == ("sanitize (memcheck)", "PASS") and "ERROR SUMMARY: 0 errors" in m_what
    assert (r_step, r_status) == ("sanitize (racecheck)", "FAIL")
    assert "1 hazard displayed (1 error" in r_what and "Race reported between Write access" in r_what
    assert (s_step, s_status) == ("sanitize (synccheck)", "SKIP") and "no verdict" in s_what


def test_sanitize_gives_no_verdict_without_a_gpu_a_tool_the_device_or_the_time(gc, monkeypatch):
    check = FakeSanitizerCheck({})
    gc.step_sanitize(check, argparse.Namespace(gpu=False))
    assert [(s, st) for s, st, _ in check.recorded] == [("sanitize", "SKIP")] and not check.commands

    monkeypatch.setattr(gc, "find_compute_sanitizer", lambda: None)
    check = FakeSanitizerCheck({})
    gc.step_sanitize(check, argparse.Namespace(gpu=True))
    assert check.recorded[0][1] == "SKIP" and "not found" in check.recorded[0][2]

    monkeypatch.setattr(gc, "find_compute_sanitizer", lambda: "compute-sanitizer")
    check = FakeSanitizerCheck({tool: (gc.SANITIZER_ERROR_EXIT, REFUSED) for tool in gc.SANITIZER_TOOLS})
    gc.step_sanitize(check, argparse.Namespace(gpu=True))
    assert {st for _, st, _ in check.recorded} == {"SKIP"} and "cannot run here" in check.recorded[0][2]

    check = FakeSanitizerCheck({}, left=gc.SANITIZE_MIN_SECONDS - 1)
    gc.step_sanitize(check, argparse.Namespace(gpu=True))
    assert len(check.recorded) == len(gc.SANITIZER_TOOLS) and not check.commands
    assert all(st == "SKIP" and "of the budget left" in what for _, st, what in check.recorded)


def test_sanitize_fails_a_tool_that_exits_otherwise(gc):
    status, what = gc.judge_sanitizer("memcheck", 1, "Traceback\nRuntimeError: CUDA error\n")
    assert status == "FAIL" and "exit 1" in what


def test_the_kernel_cases_run_through_the_cpu_kernels(capsys):
    """scripts/benchmarks/cuda_kernel_cases.py (what the sanitize step runs on a GPU), here through the CPU
    kernels: every float32 and float64 case runs with finite outputs, the half ones are named."""
    cases = load("scripts/benchmarks/cuda_kernel_cases.py")
    assert cases.main(["--device", "cpu"]) == 0
    out = capsys.readouterr().out
    halves = sum(dtype not in (cases.torch.float32, cases.torch.float64) for _, _, dtype, _ in cases.CASES)
    assert f"{len(cases.CASES) - halves} of {len(cases.CASES)} cases ran with finite outputs on cpu" in out
    assert out.count("ok  ") == len(cases.CASES) - halves


# ------------------------------------------------------------------------------------- distributed

class FakeTestsCheck:
    """Check's run / record with one canned pytest output."""

    def __init__(self, rc, text):
        self.rc, self.text = rc, text
        self.commands, self.limits, self.recorded = [], [], []

    def run(self, name, cmd, seconds, env=None):
        self.commands.append(cmd)
        self.limits.append(seconds)
        return self.rc, self.text

    def record(self, step, status, seconds, what):
        self.recorded.append((step, status, what))


def test_distributed_row_runs_the_two_rank_gpu_tests_within_a_minute_and_reads_pytest(gc):
    check = FakeTestsCheck(0, "...\n3 passed, 18 deselected in 41.20s\n")
    gc.step_distributed(check, argparse.Namespace(gpu=True), 16)
    (cmd,), (limit,) = check.commands, check.limits
    assert cmd[cmd.index("-m", 3) + 1] == "cuda" and "tests/runs/test_distributed.py" in cmd
    assert limit == gc.STEP_SECONDS["distributed"] == 60 and "distributed" in gc.STEPS
    assert check.recorded == [("distributed (two ranks)", "PASS", "3 passed, 18 deselected in 41.20s")]

    check = FakeTestsCheck(1, "F..\n1 failed, 2 passed, 18 deselected in 44.00s\n")
    gc.step_distributed(check, argparse.Namespace(gpu=True), 16)
    assert check.recorded[0][1] == "FAIL" and "1 failed" in check.recorded[0][2]

    check = FakeTestsCheck(0, "sss\n3 skipped, 18 deselected in 5.00s\n")  # a GPU torch does not see: nothing ran
    gc.step_distributed(check, argparse.Namespace(gpu=True), 16)
    assert check.recorded[0][1] == "FAIL" and "nothing ran" in check.recorded[0][2]


def test_distributed_row_skips_without_a_gpu(gc):
    check = FakeTestsCheck(0, "")
    gc.step_distributed(check, argparse.Namespace(gpu=False), 16)
    assert not check.commands and [(s, st) for s, st, _ in check.recorded] == [("distributed (two ranks)", "SKIP")]
