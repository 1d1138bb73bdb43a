"""The count of one kernel instance: each SASS loop matched with its annotation, its trips, the weight of
every instruction (cold regions 0, weighted branches, the loops around it), and the whole kernel's
instructions per (query, key, feature) element."""
import math

from .annotations import EXTERNAL_LOOPS, active_cold_regions, cold_and_test_lines, evaluate
from .disassembly import find_loops, unroll_factor


def match_spec(lp, sources):
    """The model of a SASS loop: the annotation of the `for` that its latch branch is named by
    (or an EXTERNAL_LOOPS entry of that file), and that line's text."""
    f, line = lp.chain[0] if lp.chain else ("?", 0)
    lines = sources.lines(f)
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    spec = sources.annotations.loops.get((f, line))
    if spec is not None:
        return dict(spec), text
    for spec in EXTERNAL_LOOPS:
        if spec["file"] == f:
            return dict(spec), text
    return None, text


def test_line_runs(fn, tests, is_cold):
    """Addresses of the instructions of test lines (cold_and_test_lines) that the plain case runs:
    each conditional branch of a test line, and the line's instructions before it in its basic
    block (the compare, and what the compiler hoisted above the branch). What the line has after
    its branch (a call's arguments, the region's first instructions) is the region's."""
    runs, pending = set(), {}
    starts = set(fn.labels.values())
    for ins in fn.insts:
        if ins.addr in starts:  # a branch target: a new basic block
            pending.clear()
        on = [(f, line) for f, line in ins.chain if line in tests.get(f, ())]
        if on and not is_cold(ins.chain):
            pending.setdefault(on[0], []).append(ins.addr)
            if ins.guard and ins.opcode.startswith("BRA") and ins.chain[0] == on[0]:
                runs.update(pending.pop(on[0]))
        if ins.opcode.startswith(("BRA", "EXIT", "RET", "CALL", "JMP", "BRX")):  # the end of a basic block
            pending.clear()
    return runs


def analyse(inst, fn, names, sources, score_cache=True):
    """Everything the report prints about one kernel instance (score_cache: the case of the backward's
    cold regions, active_cold_regions)."""
    loops = find_loops(fn)
    # specs, unroll factors
    for lp in loops:
        spec, text = match_spec(lp, sources)
        lp.source = f"{lp.chain[0][0]}:{lp.chain[0][1]}" if lp.chain else "?"
        lp.text = text
        lp.spec = spec
        step = evaluate(spec["step"], names) if spec else None
        if spec and "unroll" in spec:  # a loop the compiler does not unroll (its body is the kernel)
            lp.unroll, lp.unroll_how = int(spec["unroll"]), "fixed by the model"
        else:
            lp.unroll, lp.unroll_how = unroll_factor(lp, step)
    # copies of one source loop under the same parent: main (largest unroll) + remainder loops; or
    # copies of equal unroll, one per iteration of an unrolled enclosing loop (each runs its trips);
    # or one copy per feature chunk, of which the first `chunks` run
    groups = {}
    for lp in loops:
        groups.setdefault((lp.source, id(lp.parent)), []).append(lp)
    for (src, _), grp in groups.items():
        spec = grp[0].spec
        if spec is None:
            for lp in grp:
                lp.trips = 1.0
            continue
        trips = evaluate(spec["trips"], names)
        if spec.get("chunks"):
            active = evaluate(spec["chunks"], names)
            for k, lp in enumerate(grp):
                lp.trips = trips / lp.unroll if k < active else 0.0
            continue
        if len({lp.unroll for lp in grp}) == 1:  # copies made by an unrolled enclosing loop: each runs
            for lp in grp:
                lp.trips = trips / lp.unroll
            continue
        left = trips
        ordered = sorted(grp, key=lambda lp: -lp.unroll)
        for k, lp in enumerate(ordered):
            if k == len(ordered) - 1:  # the last copy takes the rest (fractional without a remainder loop)
                lp.trips = left / lp.unroll
            else:
                lp.trips = float(left // lp.unroll)
                left -= lp.trips * lp.unroll
    # instruction weights
    cold, tests = cold_and_test_lines(active_cold_regions(sources.annotations, score_cache))
    branch_w = [({reg.file: reg.lines}, evaluate(reg.weight, names))
                for reg in sources.annotations.regions if reg.kind == "branch"]

    def is_cold(chain):
        return any(line in cold.get(f, ()) for f, line in chain)

    def on_test_line(chain):
        return any(line in tests.get(f, ()) for f, line in chain)

    runs = test_line_runs(fn, tests, is_cold)

    def weight(ins):
        if is_cold(ins.chain) or (on_test_line(ins.chain) and ins.addr not in runs):
            return 0.0
        w = 1.0
        for lines, bw in branch_w:
            if any(line in lines.get(f, ()) for f, line in ins.chain):
                w *= bw
        for lp in loops:
            if lp.head <= ins.addr <= lp.latch:
                if is_cold(lp.chain):  # a loop of a cold region: all of it, whatever line its
                    return 0.0         # address arithmetic is attributed to
                w *= lp.trips
        return w

    per_thread = 0.0
    by_line = {}
    by_loop = {id(lp): 0.0 for lp in loops}
    outside = 0.0
    for ins in fn.insts:
        w = weight(ins)
        per_thread += w
        around = [lp for lp in loops if lp.head <= ins.addr <= lp.latch]
        if around:
            by_loop[id(min(around, key=lambda lp: lp.latch - lp.head))] += w
        else:
            outside += w
        own = [(f, line) for f, line in ins.chain if sources.lines(f)]
        f, line = own[0] if own else (ins.chain[0] if ins.chain else ("?", 0))
        by_line[f"{f}:{line}"] = by_line.get(f"{f}:{line}", 0.0) + w
    # loops in the report
    loop_rows = []
    for lp in loops:
        row = dict(source=lp.source, statement=lp.text, name=lp.spec["name"] if lp.spec else "(no model: counted once)",
                   depth=lp.depth, static=len(lp.insts), unroll=lp.unroll, unroll_how=lp.unroll_how,
                   trips_per_entry=round(lp.trips, 3), inner=not lp.children, own_per_thread=by_loop[id(lp)])
        if lp.spec and lp.spec.get("elems"):
            el = evaluate(lp.spec["elems"], names) * lp.unroll
            row.update(elements_per_iteration=el, unit=lp.spec["unit"],
                       per_element=round(len(lp.insts) / el, 2) if el else None)
        loop_rows.append(row)
    top = sorted(by_line.items(), key=lambda kv: -kv[1])[:12]
    return per_thread, loop_rows, top, outside


def whole_per_element(inst, per_thread, names, c):
    """Instructions of the kernel over one (batch, head) slice per (query, key, feature) element."""
    N, M, D = names["N"], names["M"], names["D"]
    if inst.kind in ("decode", "combine"):  # N = kRows queries per slice: ceil(M / kDecKeys) chunks, one merge
        blocks = math.ceil(M / c["kDecKeys"]) if inst.kind == "decode" else 1
        return per_thread * blocks * names[inst.threads] / (N * M * D)
    if inst.kind == "tables":
        threads_total = (N + M) * c["kTableSlots"]  # kTableSlots threads per row
    else:
        rows = N if inst.kind in ("forward", "dq", "delta", "delta2", "finish") else M
        blocks = math.ceil(rows / c[inst.grid_rows]) * names.get("main_splits", 1)
        threads_total = blocks * names[inst.threads]
    return per_thread * threads_total / (N * M * D)
