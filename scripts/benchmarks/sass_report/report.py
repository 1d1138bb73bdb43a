"""The report: compiles the instances of each head dim (build), reads their SASS (disassembly,
occupancy), counts them (count) and prints the tables or JSON; the command line."""
import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time

from . import build
from .annotations import LOOPS, REGIONS, UNITS, AnnotationError, Sources, missing_annotations
from .build import (ARCH, PHIS, ROOT, Builder, ToolMissing, find_tool, launcher_instances, progress, run,
                    setup_nvcc_flags, tool_version)
from .count import analyse, whole_per_element
from .disassembly import parse_nvdisasm
from .occupancy import SM90, launch_bounds, occupancy, parse_ptxas, parse_res_usage


def main(argv=None):
    ap = argparse.ArgumentParser(prog="cuda_sass_report.py", description=sys.modules[__package__].__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dims", default="16,128", help="comma-separated D = Dv values (default 16,128)")
    ap.add_argument("--shapes", default="256,1024", help="N = M values of the whole-kernel counts (default 256,1024)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--no-score-cache", action="store_true",
                    help="count the backward's main pass without the pre-pass's score cache (it computes the "
                         "scores again, as where B H N M floats exceed kScoreCacheBytes)")
    ap.add_argument("--phi", choices=tuple(PHIS), default="power",
                    help="the kernels' instances for this phi: power (also abs: the same instances, p = 1), relu "
                         "(its Phi::kRelu instances: the forward, the pre-pass, the main pass without the score "
                         "cache and the decoding forward), sigmoid (its Phi::kSigmoid instances, the main pass "
                         "with the score cache too: its g pass takes sigmoid's derivative) or odd (phi(x) = x^p with "
                         "odd p: its Phi::kOdd instances, the main pass with the score cache too, which reads the "
                         "scores' signs, and the decoding forward's signed merge)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (.cu, ptxas logs, SASS) and print it")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "fourierformer-sass-cache"),
                    help="cubin cache (default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        head_dims = sorted({int(x) for x in args.head_dims.split(",") if x.strip()})
        shapes = [int(x) for x in args.shapes.split(",") if x.strip()]
    except ValueError:
        ap.error("--head-dims and --shapes take comma-separated integers")
    if not head_dims or any(d < 1 or d > 128 for d in head_dims):
        ap.error("--head-dims: values in 1..128 (the tiled float32 kernels)")
    if not shapes or any(n < 1 for n in shapes):
        ap.error("--shapes: positive integers")
    try:
        nvcc = find_tool("nvcc")
        nvdisasm = find_tool("nvdisasm")
    except ToolMissing as e:
        print(f"cuda_sass_report: {e}", file=sys.stderr)
        return 2
    cuobjdump = find_tool("cuobjdump", required=False)
    flags = setup_nvcc_flags()
    work = tempfile.mkdtemp(prefix="fourierformer-sass-")
    try:
        report = build_report(head_dims, shapes, nvcc, nvdisasm, cuobjdump, flags, args.cache_dir, work, args.keep,
                              score_cache=not args.no_score_cache, phi=args.phi)
    except AnnotationError as e:
        print(f"cuda_sass_report: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # a failed compile: the headers no longer have what the report instantiates
        print(f"cuda_sass_report: {e}\n(if a kernel, a constant or a size function was renamed, update "
              f"launcher_instances, CONSTANTS, CHOICES or SIZES in {os.path.relpath(build.__file__, ROOT)})",
              file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.keep:
        report["work_dir"] = work
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print_report(report)
    progress(f"done in {time.monotonic() - build.T0:.1f} s")
    return 0


def build_report(head_dims, shapes, nvcc, nvdisasm, cuobjdump, flags, cache_dir, work, keep, score_cache=True,
                 phi="power"):
    b = Builder(cache_dir, work, nvcc, flags)
    nvdisasm_version = tool_version(nvdisasm)
    progress(f"nvcc {b.nvcc_version} ({nvcc}), nvdisasm {nvdisasm_version}, flags {' '.join(flags)}, "
             f"headers {b.hash[:12]}, cache {cache_dir}")
    info, cached = b.host_info(head_dims)
    progress("header constants and sizes " + ("(cached)" if cached else "compiled"))
    c = info["constants"]
    warnings = []
    sources = Sources()
    no_loops, no_regions = missing_annotations(sources.annotations)
    for ident in no_loops:
        warnings.append(f"no annotation in the headers for the loop {ident} ({LOOPS[ident]}): its SASS loop "
                        f"is counted once")
    for ident in no_regions:
        warnings.append(f"no annotation in the headers for the region {ident} ({REGIONS[ident]['why']}): "
                        f"counted as run")
    report = dict(date=time.strftime("%Y-%m-%d"), arch=ARCH, nvcc=b.nvcc_version, nvdisasm=nvdisasm_version,
                  nvcc_flags=flags, phi=phi,
                  headers_sha256=b.hash, constants=c, head_dims={}, warnings=warnings)
    done = {}
    for hd in head_dims:
        sizes = info["sizes"][str(hd)]
        insts = launcher_instances(c, sizes, score_cache, phi)
        rows = []
        for inst in insts:
            if inst.template not in done:
                progress(f"D = Dv = {hd}: {inst.template}: compiling for {ARCH}")
                cub, log, was_cached = b.cubin(inst.template)
                progress(f"  {'cached' if was_cached else 'compiled'}; disassembling")
                sass_path = cub[:-len(".cubin")] + f".nvdisasm-{nvdisasm_version}.sass.txt"
                if os.path.exists(sass_path):
                    sass = open(sass_path).read()
                else:
                    sass = run([nvdisasm, "-g", "-gi", "-c", cub])
                    with open(sass_path + f".tmp{os.getpid()}", "w") as fh:
                        fh.write(sass)
                    os.replace(sass_path + f".tmp{os.getpid()}", sass_path)
                if keep:
                    safe = re.sub(r"[^\w]+", "_", inst.template).strip("_")
                    open(os.path.join(work, safe + ".sass"), "w").write(sass)
                    open(os.path.join(work, safe + ".ptxas.txt"), "w").write(log)
                funcs = parse_nvdisasm(sass)
                entry = [f for f in funcs if f in parse_ptxas(log) and parse_ptxas(log)[f].get("entry")]
                if len(entry) != 1:
                    raise RuntimeError(f"{inst.template}: expected one kernel in the cubin, found {list(funcs)}")
                res = parse_res_usage(run([cuobjdump, "-res-usage", cub])) if cuobjdump else {}
                done[inst.template] = (funcs[entry[0]], parse_ptxas(log), res)
            fn, ptx, res = done[inst.template]
            props = ptx[fn.name]
            if res and res.get(fn.name) != props.get("regs"):
                warnings.append(f"{inst.template}: cuobjdump says {res.get(fn.name)} registers, ptxas {props.get('regs')}")
            callee = {k: dict(spill_stores=v.get("spill_stores", 0), spill_loads=v.get("spill_loads", 0))
                      for k, v in ptx.items() if not v.get("entry") and (v.get("spill_stores") or v.get("spill_loads"))}
            threads = {**c, **sizes}[inst.threads]
            split = threads // c["kFwdThreads"] if inst.kind in ("forward", "delta2") else 1
            lb = launch_bounds(inst.template, {**c, **inst.params})
            if lb and lb[0] != threads:
                warnings.append(f"{inst.template}: launched with {threads} threads, __launch_bounds__({lb[0]})")
            dyn = 4 * sizes[inst.smem] if inst.smem else 0
            warps, blocks, limiter = occupancy(props["regs"], threads, props.get("smem", 0) + dyn)
            label = inst.template + (f" x{inst.params['splits']}" if inst.params.get("splits", 1) > 1 else "")
            label += f" (N = {inst.params['N']})" if inst.kind == "combine" else ""
            row = dict(kernel=label, kind=inst.kind, rows=inst.params.get("N"), function=fn.name, threads=threads,
                       launch_bounds=lb,
                       registers=props["regs"], registers_cuobjdump=res.get(fn.name),
                       spill_stores=props.get("spill_stores", 0), spill_loads=props.get("spill_loads", 0),
                       stack_frame=props.get("stack", 0), callee_spills=callee,
                       smem_static=props.get("smem", 0), smem_dynamic=dyn, warps_per_sm=warps, blocks_per_sm=blocks,
                       occupancy_limit=limiter, static_instructions=len(fn.insts), shapes={})
            for n in shapes:
                names = dict(c)
                names.update(sizes)
                names.update(inst.params)
                Dp = sizes["Dp"]
                # the forward's P V: kO / split columns per thread in passes of at most 16; Dvs / (4 split)
                # of them (on average over the row's threads) are real columns
                kO = inst.params.get("kO", 0)
                fwd_passes = max(1, inst.params.get("kO", 0) // split // 16)
                fwd_passes = min(fwd_passes, math.ceil(sizes["Dvs"] / (64 * split)))
                # (the decoding forward: N its register rows)
                names.update(N=inst.params.get("N", n), M=n, D=hd, Dv=hd, split=split, fwd_passes=fwd_passes,
                             main_splits=inst.params.get("splits", 1),
                             chunk_dc=Dp / math.ceil(Dp / c["kChunk"]),
                             fwd_cols=min(inst.params.get("kO", 0) // split, sizes["Dvs"] / (4 * split)) / fwd_passes,
                             # the main pass's dv tiles (DvTile in backward_tiled.cuh)
                             dv_column_groups=min(kO, 16), dv_phases=16 // min(kO, 16) if kO else 1,
                             dv_groups=kO // min(kO, 16) if kO else 1)
                per_thread, loop_rows, top, outside = analyse(inst, fn, names, sources, score_cache)
                scale = whole_per_element(inst, 1.0, names, c)
                row["shapes"][str(n)] = dict(per_thread=round(per_thread), per_element=round(per_thread * scale, 2),
                                             outside_loops_per_element=round(outside * scale, 3),
                                             top_lines=[(k, round(v * scale, 3)) for k, v in top])
                for lr in loop_rows:
                    lr["share_per_element"] = round(lr.pop("own_per_thread") * scale, 3)
                row["loops"] = loop_rows  # (the same for every shape but the trip counts)
                row.setdefault("loops_by_shape", {})[str(n)] = [lr["trips_per_entry"] for lr in loop_rows]
                row.setdefault("loop_shares_by_shape", {})[str(n)] = [lr["share_per_element"] for lr in loop_rows]
                for lr in loop_rows:
                    if lr["name"].startswith("(no model"):
                        msg = f"{inst.template}: loop at {lr['source']} ({lr['statement'][:60]}) has no model: counted once"
                        if msg not in warnings:
                            warnings.append(msg)
            rows.append(row)
        totals = {}
        for n in shapes:
            by = {r["kind"]: r["shapes"][str(n)]["per_element"] for r in rows if r["rows"] is None}
            # the decoding forward at N = its register rows: the chunks' kernel and the merge
            decoding = {}
            for r in rows:
                if r["rows"] is not None:
                    decoding[str(r["rows"])] = round(decoding.get(str(r["rows"]), 0.0) + r["shapes"][str(n)]["per_element"], 2)
            bwd = by["delta"] + by["main"] + by["finish"] if "delta" in by else None
            small = by["delta2"] + by["main2"] + by["finish"] if "delta2" in by else None
            totals[str(n)] = dict(forward=by["forward"], forward_with_tables=round(by["tables"] + by["forward"], 2),
                                  backward=None if bwd is None else round(bwd, 2),
                                  backward_small_grid=None if small is None else round(small, 2),
                                  backward_with_tables=None if bwd is None else round(by["tables"] + bwd, 2),
                                  step=None if bwd is None else round(by["tables"] + by["forward"] + bwd, 2),
                                  step_small_grid=None if small is None else round(by["tables"] + by["forward"] + small, 2),
                                  decoding=decoding)
        report["head_dims"][str(hd)] = dict(sizes=sizes, kernels=rows, totals=totals)
    return report


def short_name(mangled):
    m = re.search(r"rare_pair_score|__internal_\w*slowpath\w*", mangled)
    return m.group(0) if m else mangled


def print_report(r):
    out = []
    out.append(f"SASS report, {r['date']}: float32 CUDA kernels for {r['arch']}, nvcc {r['nvcc']} "
               f"{' '.join(r['nvcc_flags'])}, headers sha256 {r['headers_sha256'][:12]}")
    out.append("Counts are SASS instructions per thread (static), per element as described by "
               "`python scripts/benchmarks/cuda_sass_report.py --help`.")
    shapes = None
    for hd, h in r["head_dims"].items():
        out.append("")
        out.append(f"== D = Dv = {hd} (padded features Dp = {h['sizes']['Dp']}) ==")
        for k in h["kernels"]:
            shapes = list(k["shapes"])
            out.append("")
            lb = k.get("launch_bounds")
            lbs = ("" if not lb else f", __launch_bounds__({lb[0]}" + (f", {lb[1]})" if lb[1] else ")")
                   + (f": at most {min(SM90['max_regs_per_thread'], SM90['regs_per_sm'] // (lb[0] * lb[1]) // 8 * 8)} "
                      "registers" if lb[1] else ""))
            out.append(f"{k['kernel']}  [{k['kind']}]  {k['threads']} threads/block{lbs}")
            cs = "".join(f"; callee {short_name(n)}: {v['spill_stores']}/{v['spill_loads']} B spill st/ld"
                         for n, v in k["callee_spills"].items())
            out.append(f"  registers {k['registers']}, spill stores {k['spill_stores']} B, spill loads "
                       f"{k['spill_loads']} B, stack {k['stack_frame']} B{cs}")
            out.append(f"  shared memory {k['smem_static'] + k['smem_dynamic']} B/block "
                       f"(dynamic {k['smem_dynamic']}), {k['blocks_per_sm']} block(s) = {k['warps_per_sm']} warps/SM "
                       f"(limited by {k['occupancy_limit']}); {k['static_instructions']} instructions in the kernel body")
            out.append(f"  {'loop (source)':<30} {'name':<22} {'depth':>5} {'static':>6} {'unroll':>6} "
                       f"{'trips/entry @N=' + '/'.join(shapes):>18} {'share of whole':>16} {'instr/element':>14}")
            rows = []
            for i, lp in enumerate(k["loops"]):
                trips = "/".join(f"{k['loops_by_shape'][s][i]:g}" for s in shapes)
                pe = f"{lp['per_element']:.2f}" if lp.get("per_element") is not None else ""
                unit = f"  {UNITS[lp['unit']]}" if lp.get("unit") else ""
                share = [k["loop_shares_by_shape"][s][i] for s in shapes]
                text = (f"  {'  ' * lp['depth'] + lp['source']:<30} {lp['name'][:22]:<22} {lp['depth']:>5} "
                        f"{lp['static']:>6} {lp['unroll']:>6} {trips:>18} ")
                rest = f" {pe:>14}{unit}"
                if rows and (text, rest) == rows[-1][0]:
                    rows[-1][1] += 1  # identical copies (chunks, atomicAdd retry loops): one row, shares summed
                    rows[-1][2] = [a + b for a, b in zip(rows[-1][2], share)]
                else:
                    rows.append([(text, rest), 1, share])
            for (text, rest), n, share in rows:
                sh = "/".join(f"{v:.2f}" for v in share)
                out.append(f"{text}{sh:>16}{rest}" + (f"  (x{n}, shares summed)" if n > 1 else ""))
            sh = "/".join(f"{k['shapes'][s]['outside_loops_per_element']:.2f}" for s in shapes)
            out.append(f"  {'(outside every loop)':<30} {'':<22} {'':>5} {'':>6} {'':>6} {'':>18} {sh:>16}")
            whole = ", ".join(f"N = M = {s}: {v['per_element']:.2f} ({v['per_thread']} per thread)"
                              for s, v in k["shapes"].items())
            out.append(f"  whole kernel per (query, key, feature) element: {whole}")
        out.append("")
        for s, t in h["totals"].items():
            b = "n/a" if t["backward"] is None else (f"{t['backward']:.2f} (with the tables {t['backward_with_tables']:.2f}); "
                                                     f"a training step (the tables once) {t['step']:.2f}")
            out.append(f"  D = {hd}, N = M = {s}: forward {t['forward']:.2f} (with the tables "
                       f"{t['forward_with_tables']:.2f}), backward (pre-pass + main + dq finish) {b}")
            dec = ", ".join(f"N = {rows}: {v:.2f}" for rows, v in t.get("decoding", {}).items())
            if dec:
                out.append(f"  D = {hd}, M = {s}: the decoding forward (chunks + merge) {dec}")
    out.append("")
    out.append("Summary (instructions per (query, key, feature) element; inner = the element loop of the kernel)")
    out.append(f"  {'D':>4} {'kernel':<48} {'regs':>4} {'spill st/ld B':>13} {'warps/SM':>8} {'inner loops':>18} "
               + " ".join(f"{'whole@' + s:>10}" for s in shapes or []))
    for hd, h in r["head_dims"].items():
        for k in h["kernels"]:
            inner = {}
            for lp in k["loops"]:
                if lp.get("unit") == "qkd" and lp["inner"]:
                    inner.setdefault(lp["name"], []).append(lp["per_element"])
            ie = " + ".join(f"{min(v):.1f}" if max(v) - min(v) < 0.05 else f"{min(v):.1f}-{max(v):.1f}"
                            for v in inner.values())
            out.append(f"  {hd:>4} {k['kernel']:<48} {k['registers']:>4} "
                       f"{str(k['spill_stores']) + '/' + str(k['spill_loads']):>13} {k['warps_per_sm']:>8} {ie:>18} "
                       + " ".join(f"{k['shapes'][s]['per_element']:>10.2f}" for s in shapes))
        for name, label in (("backward", "backward (pre-pass + main + finish)"),
                            ("backward_small_grid", "backward, small grid (two-half pre-pass)"),
                            ("forward_with_tables", "forward + tables"),
                            ("backward_with_tables", "backward + tables"), ("step", "step (tables once, fwd, bwd)"),
                            ("step_small_grid", "step, small grid")):
            vals = [h["totals"][s][name] for s in shapes]
            if all(v is not None for v in vals):
                out.append(f"  {hd:>4} {label:<48} {'':>4} {'':>13} {'':>8} {'':>18} "
                           + " ".join(f"{v:>10.2f}" for v in vals))
        for rows in (h["totals"][shapes[0]].get("decoding") or {}) if shapes else ():
            vals = [h["totals"][s]["decoding"][rows] for s in shapes]
            out.append(f"  {hd:>4} {'decoding forward at N = ' + rows + ' (M = the shape)':<48} {'':>4} {'':>13} "
                       f"{'':>8} {'':>18} " + " ".join(f"{v:>10.2f}" for v in vals))
    if r["warnings"]:
        out.append("")
        out.append("Warnings:")
        out += [f"  - {w}" for w in r["warnings"]]
    if r.get("work_dir"):
        out.append("")
        out.append(f"Work folder kept: {r['work_dir']}")
    print("\n".join(out))
