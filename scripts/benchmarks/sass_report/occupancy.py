"""Registers, spills and shared memory (ptxas -v, cuobjdump -res-usage), the kernels' launch bounds (read
from the headers) and the warps per SM on sm_90 that they allow."""
import math
import re

from . import build
from .annotations import evaluate

# sm_90 resources (CUDA C Programming Guide, compute capability 9.0)
SM90 = dict(regs_per_sm=65536, reg_quarters=4, reg_alloc_unit=256, max_regs_per_thread=255,
            smem_per_sm=228 * 1024, smem_reserved_per_block=1024, max_smem_per_block=227 * 1024,
            max_warps=64, max_blocks=32)


def parse_ptxas(log):
    """{function: dict(regs, spill_stores, spill_loads, stack, smem, entry)} of a -Xptxas -v log."""
    out = {}
    cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            out.setdefault(m.group(1), {})["entry"] = True
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), {})
            cur.setdefault("entry", False)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["regs"] = int(m.group(1))
            sm = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(sm.group(1)) if sm else 0
    return out


def parse_res_usage(text):
    """{function: regs} of `cuobjdump -res-usage`."""
    out = {}
    fn = None
    for line in text.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"REG:(\d+)", line)
        if m and fn:
            out[fn] = int(m.group(1))
            fn = None
    return out


def occupancy(regs, threads, smem_bytes, arch=SM90):
    """Resident warps per SM and the limiting resource."""
    warps_per_block = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(regs, 1) * 32 / arch["reg_alloc_unit"]) * arch["reg_alloc_unit"]
    quarter = arch["regs_per_sm"] // arch["reg_quarters"]
    warps_by_regs = arch["reg_quarters"] * (quarter // regs_per_warp)
    limits = {
        "registers": warps_by_regs // warps_per_block,
        "warps": arch["max_warps"] // warps_per_block,
        "blocks": arch["max_blocks"],
    }
    per_block = smem_bytes + arch["smem_reserved_per_block"]
    limits["shared memory"] = 0 if smem_bytes > arch["max_smem_per_block"] else arch["smem_per_sm"] // per_block
    blocks = min(limits.values())
    limiter = min(limits, key=lambda k: limits[k])
    return blocks * warps_per_block, blocks, limiter


def launch_bounds(kernel_template, names):
    """(max threads, min blocks per SM or None) of a kernel's FF_LAUNCH_BOUNDS[_MIN](...) in the
    headers, evaluated with the constants and template parameters; None when not found."""
    base = kernel_template.split("<")[0]
    for f in build.header_files():
        text = re.sub(r"\s+", " ", open(f).read())
        m = re.search(r"FF_LAUNCH_BOUNDS(_MIN)?\(((?:[^()]|\([^()]*\))*)\) " + re.escape(base) + r"\(", text)
        if not m:
            continue
        args = [a.strip() for a in m.group(2).split(",")]

        def c_expr(e):
            t = re.match(r"(.+?)\s*\?\s*(.+?)\s*:\s*(.+)$", e)  # a ? b : c
            return f"({t.group(2)}) if ({t.group(1)}) else ({t.group(3)})" if t else e

        def call(m):  # f<arg>(): a `template <int P> FF_HD constexpr int f() { return ...; }` of the headers
            for g in build.header_files():
                d = re.search(r"template <int (\w+)> FF_HD constexpr int " + re.escape(m.group(1))
                              + r"\(\) \{ return ([^;]*); \}", re.sub(r"\s+", " ", open(g).read()))
                if d:
                    return str(int(evaluate(c_expr(d.group(2)), {**names, d.group(1): evaluate(m.group(2), names)})))
            raise KeyError(m.group(1))
        try:
            vals = [int(evaluate(c_expr(re.sub(r"(\w+)<([^<>()]*)>\(\)", call, a)), names)) for a in args]
        except Exception:  # an expression this reader does not know
            return None
        return vals[0], (vals[1] if len(vals) > 1 else None)
    return None
