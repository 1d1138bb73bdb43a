"""The SASS of `nvdisasm -g -gi -c`: its functions and instructions with their source lines, its loops
(from the backward branches) and their unroll factors."""
import os
import re
from dataclasses import dataclass, field


@dataclass
class Inst:
    addr: int
    text: str
    opcode: str
    guard: str
    chain: list  # [(file, line), ...] innermost first (inlined-at chain)


@dataclass
class Function:
    name: str
    insts: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # label -> address


INST_RE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
LOC_RE = re.compile(r'^\s*//## File "([^"]+)", line (\d+)(.*)$')


def parse_nvdisasm(text):
    """Functions of `nvdisasm -g -gi -c` output: the kernel's own code (up to its first
    subroutine label), every instruction with its source chain."""
    funcs = {}
    cur = None
    chain = []
    in_comment = False
    pending = []
    in_sub = False
    for line in text.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            cur = Function(m.group(1))
            funcs[cur.name] = cur
            chain, pending, in_sub = [], [], False
            continue
        if cur is None:
            continue
        m = LOC_RE.match(line)
        if m:
            c = [(os.path.basename(m.group(1)), int(m.group(2)))]
            c += [(os.path.basename(a), int(b)) for a, b in re.findall(r'inlined at "([^"]+)", line (\d+)', m.group(3))]
            if not (in_comment and len(chain) >= len(c)):  # keep the longest chain of a comment block
                chain = c
            in_comment = True
            continue
        m = re.match(r"^(\.L_x_\d+|\$\S+):", line)
        if m:
            if m.group(1).startswith("$"):
                in_sub = True
            pending.append(m.group(1))
            continue
        m = INST_RE.match(line)
        if not m:
            continue
        in_comment = False
        addr, body = int(m.group(1), 16), m.group(2)
        for lab in pending:
            cur.labels[lab] = addr
        pending = []
        if in_sub:
            continue
        gm = re.match(r"^(@!?U?P\w+)\s+(.*)$", body)
        guard, body2 = (gm.group(1), gm.group(2)) if gm else ("", body)
        opcode = body2.split()[0] if body2.split() else ""
        if opcode == "NOP":
            continue
        cur.insts.append(Inst(addr, body, opcode, guard, list(chain)))
    return funcs


@dataclass
class Loop:
    head: int
    latch: int
    insts: list
    chain: list        # source chain of the latch branch
    depth: int = 0
    parent: "Loop" = None
    children: list = field(default_factory=list)
    unroll: int = 1
    unroll_how: str = ""


def find_loops(fn):
    loops = []
    for k, ins in enumerate(fn.insts):
        if not ins.opcode.startswith("BRA"):
            continue
        m = re.search(r"`\((\.L_x_\d+)\)", ins.text)
        if not m or m.group(1) not in fn.labels:
            continue
        target = fn.labels[m.group(1)]
        if target >= ins.addr:
            continue  # forward branch, or the trailing self-loop
        same = [lp for lp in loops if lp.head == target]
        if same:  # a second branch back to the same head (a `continue`): one loop, to the last latch
            if ins.addr > same[0].latch:
                same[0].latch, same[0].chain = ins.addr, ins.chain
                same[0].insts = [x for x in fn.insts if target <= x.addr <= ins.addr]
            continue
        body = [x for x in fn.insts if target <= x.addr <= ins.addr]
        loops.append(Loop(target, ins.addr, body, ins.chain))
    # nesting: the smallest loop that contains another one is its parent
    for lp in loops:
        outer = [o for o in loops if o is not lp and o.head <= lp.head and lp.latch <= o.latch]
        if outer:
            lp.parent = min(outer, key=lambda o: o.latch - o.head)
            lp.parent.children.append(lp)
    for lp in loops:
        d, p = 0, lp.parent
        while p:
            d, p = d + 1, p.parent
        lp.depth = d
    return sorted(loops, key=lambda lp: lp.head)


# (uniform registers too: a trip counter the compiler keeps in UR, stepped by UIADD3)
REG_INC = re.compile(r"^(?:U?IADD3|VIADD|IMAD\.IADD|IADD)\s+(U?R\d+),\s*(U?R\d+),\s*(-?0x[0-9a-f]+|-?\d+)")


def unroll_factor(lp, source_step):
    """Source iterations per SASS iteration, from the exit test of the latch: the register it
    compares and that register's increment in the body. An up-counter steps unroll x the
    source step; a counter compared with zero (a down-counter of the trips) steps -unroll."""
    latch = lp.insts[-1]
    pm = re.match(r"@!?(P\d)", latch.guard)
    if not pm:
        return 1, "unconditional latch"
    pred = pm.group(1)
    setp = None
    for ins in reversed(lp.insts[:-1]):
        if re.match(r"^ISETP\S*\s+" + pred + r"\b", ins.text.split(None, 1)[-1] if ins.guard else ins.text) or \
                re.search(r"ISETP\S*\s+" + pred + r",", ins.text):
            setp = ins
            break
    if setp is None:
        return 1, "no exit test found"
    ops = re.findall(r"\b(U?R\d+)\b", setp.text)
    versus_zero = ", RZ," in setp.text or setp.text.rstrip().endswith("RZ, PT")
    # a down-counter of the trips left compared with a constant: the main copy of a loop unrolled
    # by 16 over a runtime count runs while more than 12 are left (ISETP.GT P1, PT, R13, 0xc)
    constant = re.search(r",\s*(-?0x[0-9a-f]+|-?\d+),\s*PT\s*$", setp.text.rstrip())
    for reg in ops:
        for ins in lp.insts:
            m = REG_INC.match(ins.text)
            if m and m.group(1) == reg and m.group(2) == reg:
                inc = int(m.group(3), 16) if "0x" in m.group(3) else int(m.group(3))
                if inc >= 1 << 31:  # SASS prints 32-bit immediates unsigned
                    inc -= 1 << 32
                if versus_zero and abs(inc) <= 16:
                    return abs(inc), f"{reg} {inc:+d} against 0"
                if constant and -16 <= inc < 0:
                    return -inc, f"{reg} {inc:+d} against {constant.group(1)}"
                if source_step and inc % source_step == 0 and inc > 0:
                    return inc // source_step, f"{reg} += {inc:#x} (source step {source_step})"
    return 1, "increment not found (assumed 1)"
