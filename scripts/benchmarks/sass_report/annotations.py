"""The model beside the code: the `// SASS:` annotations of the kernel headers, the loops and regions
the report knows, and the headers' lines they stand on."""
import math
import os
import re
from dataclasses import dataclass, field

from . import build

# Each loop that the model counts and each source region that it weighs carries, in the kernel
# headers, a line comment of its own that starts with `// SASS:` (a comment: the compiled code
# does not change). Nothing else of the headers' comments is read, so rewording a comment changes
# nothing here. An annotation is one line of whitespace-separated fields, `key=value` or a flag:
#
#   // SASS: loop=<id> step=<expr> trips=<expr> [unroll=<n>] [elements=<expr> unit=<unit>]
#       directly above a `for` statement (only `#pragma` lines between): the SASS loop whose latch
#       branch the line information names that line. step: the source increment of the induction
#       variable (for the unroll factor); unroll: the factor itself, for the tile loops, which are
#       never unrolled and whose exit test the compiler may rescale; trips: source iterations per
#       entry of the enclosing code; elements / unit (inner loops only): the elements of one
#       source iteration of one thread, in units of UNITS.
#   // SASS: cold=<id> [test] [when=<case>]
#       directly above a line of code that the plain case does not run (weight 0);
#   // SASS: cold=<id> begin [test] [when=<case>]   ...   // SASS: cold=<id> end
#       the same for the lines between the two. test: the region's first line of code is the
#       test that skips it, which the plain case runs: its instructions up to each of its
#       conditional branches count (the compare, and what the compiler hoisted above the
#       branch), those after its last branch are the region's (test_line_runs). when: the region
#       is cold only in that case (CASES), e.g. the score cache's store without the score cache.
#   // SASS: branch=<id> weight=<expr> begin   ...   // SASS: branch=<id> end
#       lines that a thread runs with that weight (in the table kernel: a thread takes the query
#       or the key branch, N / (N + M) of them the first).
#
# The expressions name N, M, D, Dv, the SIZES, the CONSTANTS, the template parameters and the
# model's own names of report.build_report: chunk_dc (features of a chunk, on average), fwd_cols and
# fwd_passes (value columns per thread of the forward, and its column passes), dv_column_groups
# / dv_phases / dv_groups (the main pass's DvTile<kO>), split (the halves per block: the
# forward's forward_threads(Dv) / kFwdThreads, 2 in the two-half pre-pass, 1 in the other
# kernels), main_splits (the main pass's blocks per key tile, main_pass_splits: 1 but in the
# small-grid instance; each split runs its share of the chunks, of the dk store and of the
# dradius sums, split 0 alone the dv loops (averaged over the splits here), every split the pair
# work). An expression holds no whitespace.
#
# The ids the report knows: LOOPS (with the name it prints) and REGIONS. An annotation of another
# id, of a missing or unknown field, or one that is not where its kind must be, is refused with
# its file and line; a known id without an annotation is named in the report's warnings (and the
# tests fail).

LOOPS = {
    # tile_scores_impl (forward_tiled.cuh), in the forward and in the backward's kernels: the chunk
    # loop is the element loop (its renormalisation groups and the staging are unrolled in it; with
    # two halves each thread takes half of the groups of a chunk)
    "scores_chunks": "scores (chunk)",
    # forward_tiled_kernel
    "forward_key_tiles": "key tiles",
    "pv_column_passes": "P V column passes",
    "pv": "P V",
    "output_zeroing": "output tile",
    "output_store": "output tile",
    "rare_pairs": "rare pairs (not run)",  # rare_scores_log2 (a cold region)
    # the backward (backward_tiled.cuh): pre-pass, main pass and dq finish
    "v_staging": "V staging",
    "dout_staging": "dO staging",
    "row_sums_zeroing": "row sums zeroing",
    "delta_key_tiles": "key tiles",
    "delta_dp": "dP = dO V^T",
    "dk_sums_zeroing": "dk sums zeroing",
    "dv_zeroing": "dv zeroing / store",
    "query_tiles": "query tiles",
    "dout_staging_columns": "dO staging columns",
    "main_dp": "dP = dO V^T",
    "dv": "dv = P^T dO",
    "dv_phase_sums": "dv phase sums",
    "g_chunks": "g-pass chunks",
    "g_staging_scalar": "g-pass staging (scalar, not run)",
    "g_pass": "g pass (dq, dk)",
    "dk_store": "dk store",
    "main_dradius_sums": "dradius sums",
    "dradius_key_sum": "dradius key sum",
    "dv_store": "dv zeroing / store",
    "dradius_zeroing": "dradius zeroing",
    "dq_store": "dq store",
    "finish_dradius_sums": "dradius sums",
    # table_kernel
    "query_features": "features",
    "key_features": "features",
    # forward_decode_kernel and forward_combine_kernel (forward_decode.cuh)
    "decode_row_staging": "row fields staging",
    "decode_features": "scores (features)",
    "decode_pv_columns": "P V columns",
    "decode_pv": "P V",
    "combine_columns": "output columns",
    "combine_lse": "lse rows",
    "combine_max": "chunks' maximum",
    "combine_sum": "chunks' sums",
}
# Loops of headers outside csrc/, which carry no annotation: by file.
# atomicAdd's compare-and-swap retry loop (shared memory float): once without contention.
EXTERNAL_LOOPS = [dict(file="sm_20_atomic_functions.hpp", name="atomicAdd CAS loop", step="1", trips="1")]
REGIONS = {
    "rare_path": dict(kind="cold", why="rare path (|x| < 2^-14)"),
    "rare_scores": dict(kind="cold", why="rare path of the forward (|x| < 2^-14)"),
    "rare_scores_call": dict(kind="cold", why="rare path of the forward"),
    "masks": dict(kind="cold", why="attention mask and key bias"),
    "partial_tile": dict(kind="cold", why="a partial tile (the causal diagonal, the last keys)"),
    "scalar_staging": dict(kind="cold", why="scalar staging (N or M not a multiple of 4)"),
    # threads with no visible pair (short sequences, the causal diagonal: micro_tile_live)
    "empty_tile": dict(kind="cold", why="a tile with no visible pair"),
    "dropout": dict(kind="cold", why="dropout"),
    "dropout_hash": dict(kind="cold", why="dropout (hash)"),
    "rows_over_2_31": dict(kind="cold", why="over 2^31 table rows"),
    "flat_feature": dict(kind="cold", why="flat features"),
    # the pre-pass's store of the backward's score cache (kScoreCacheBytes, score_cache.h): the
    # main pass is a kernel instance of its own with the cache and without
    # (backward_main_tiled_kernel<..., kCache>); the store weighs 0 without it
    "score_cache_store": dict(kind="cold", why="the score cache (written)"),
    # the table kernel: a thread's query or key branch, the per-feature x / u (H Dp threads of the
    # grid, Dp per (batch, head) slice with one batch; more batches: fewer, an upper bound), and
    # after the slots' parts slot 0 of each row only, then the query or the key row's constant
    "query_row": dict(kind="branch", why="a query row of the tables"),
    "key_row": dict(kind="branch", why="a key row of the tables"),
    "x_per_u": dict(kind="branch", why="the per-feature x / u"),
    "slot_zero": dict(kind="branch", why="slot 0 of a row"),
    "query_constant": dict(kind="branch", why="a query row's constant"),
    "key_constant": dict(kind="branch", why="a key row's constant"),
}
UNITS = {"qkd": "per (query, key, feature)", "qkc": "per (query, key, value column)", "rd": "per (row, feature)"}
CASES = {"score-cache", "no-score-cache"}  # when=: the backward with (the default) or without the score cache

ANNOTATION_RE = re.compile(r"^\s*// SASS:(.*)$")
LOOP_FIELDS = dict(required={"step", "trips"}, optional={"unroll", "elements", "unit"}, flags=set())
REGION_FIELDS = {"cold": dict(required=set(), optional={"when"}, flags={"begin", "end", "test"}),
                 "branch": dict(required={"weight"}, optional=set(), flags={"begin", "end"})}


class AnnotationError(ValueError):
    """An annotation that the report cannot read: names the file and the line."""


@dataclass
class Region:
    id: str
    kind: str        # cold or branch
    file: str        # basename of the header
    lines: set       # its lines (1-based)
    first: int       # its first line of code
    where: int       # line of its (first) annotation
    test: bool = False
    when: str = None
    weight: str = None


@dataclass
class Annotations:
    loops: dict = field(default_factory=dict)    # (file, line of the `for`) -> spec
    regions: list = field(default_factory=list)  # Region

    def loop_ids(self):
        return {spec["id"] for spec in self.loops.values()}

    def region_ids(self):
        return {r.id for r in self.regions}


def _code_line_after(lines, i):
    """Index of the line of code that the annotation at index i stands above: the next line,
    `#pragma` lines skipped; None when that is blank, a comment or the end of the file."""
    j = i + 1
    while j < len(lines) and lines[j].strip().startswith("#pragma"):
        j += 1
    if j >= len(lines):
        return None
    text = lines[j].strip()
    return None if not text or text.startswith("//") else j


def parse_annotations(text, file, known_loops=None, known_regions=None):
    """The annotations of one header's text (file: its basename, for the messages)."""
    known_loops = LOOPS if known_loops is None else known_loops
    known_regions = REGIONS if known_regions is None else known_regions
    lines = text.splitlines()
    out = Annotations()
    open_regions = {}  # id -> (begin index, fields, flags)

    def fail(i, why):
        raise AnnotationError(f"{file}:{i + 1}: SASS annotation: {why}: {lines[i].strip()}")

    for i, line in enumerate(lines):
        m = ANNOTATION_RE.match(line)
        if not m:
            continue
        tokens = m.group(1).split()
        if not tokens or "=" not in tokens[0]:
            fail(i, "expected loop=<id>, cold=<id> or branch=<id> first")
        kind, ident = tokens[0].split("=", 1)
        fields, flags = {}, set()
        for tok in tokens[1:]:
            if "=" in tok:
                k, v = tok.split("=", 1)
                if not v:
                    fail(i, f"field {k} has no value")
                if k in fields:
                    fail(i, f"field {k} given twice")
                fields[k] = v
            else:
                flags.add(tok)
        if kind == "loop":
            allowed = LOOP_FIELDS
            if ident not in known_loops:
                fail(i, f"unknown loop {ident!r} (the report's LOOPS)")
        elif kind in REGION_FIELDS:
            allowed = REGION_FIELDS[kind]
            if ident not in known_regions or known_regions[ident]["kind"] != kind:
                fail(i, f"unknown {kind} region {ident!r} (the report's REGIONS)")
        else:
            fail(i, f"unknown kind {kind!r} (loop, cold or branch)")
        unknown = (set(fields) - allowed["required"] - allowed["optional"]) | (flags - allowed["flags"])
        if unknown:
            fail(i, f"unknown field(s) {', '.join(sorted(unknown))}")
        if "end" in flags:
            if ident not in open_regions:
                fail(i, f"end of region {ident!r} without its begin")
            if fields or flags != {"end"}:
                fail(i, "an end takes no other field")
            b, bfields, bflags = open_regions.pop(ident)
            first = _code_line_after(lines, b)
            out.regions.append(Region(ident, kind, file, set(range(b + 2, i + 1)), first + 1, b + 1,
                                      test="test" in bflags, when=bfields.get("when"), weight=bfields.get("weight")))
            continue
        missing = allowed["required"] - set(fields)
        if missing:
            fail(i, f"missing field(s) {', '.join(sorted(missing))}")
        if "when" in fields and fields["when"] not in CASES:
            fail(i, f"when={fields['when']}: not one of {', '.join(sorted(CASES))}")
        if kind == "loop":
            if ("elements" in fields) != ("unit" in fields):
                fail(i, "elements and unit go together")
            if "unit" in fields and fields["unit"] not in UNITS:
                fail(i, f"unit={fields['unit']}: not one of {', '.join(UNITS)}")
        j = _code_line_after(lines, i)
        if j is None:
            fail(i, "must stand directly above a line of code")
        if kind == "loop":
            if not lines[j].strip().startswith("for ("):
                fail(i, "a loop annotation must stand directly above its `for`")
            if (file, j + 1) in out.loops:
                fail(i, "a second annotation for this `for`")
            spec = dict(id=ident, name=known_loops[ident], step=fields["step"], trips=fields["trips"], where=i + 1)
            if "unroll" in fields:
                spec["unroll"] = fields["unroll"]
            if "elements" in fields:
                spec.update(elems=fields["elements"], unit=fields["unit"])
            out.loops[(file, j + 1)] = spec
        elif "begin" in flags:
            if ident in open_regions:
                fail(i, f"region {ident!r} begins again before its end")
            open_regions[ident] = (i, fields, flags)
        else:
            out.regions.append(Region(ident, kind, file, {j + 1}, j + 1, i + 1, test="test" in flags,
                                      when=fields.get("when"), weight=fields.get("weight")))
    for ident, (b, _, _) in open_regions.items():
        fail(b, f"region {ident!r} has no end")
    return out


EXTRA_SOURCES = {}  # basename -> path of sources outside csrc/ that loops may be named from (tests)


class Sources:
    """The headers' lines by basename, and their annotations (read once)."""

    def __init__(self):
        self._lines = {}
        self._annotations = None

    def _path(self, name):
        hits = [f for f in build.header_files() if os.path.basename(f) == name]
        if not hits and name in EXTRA_SOURCES:
            hits = [EXTRA_SOURCES[name]]
        return hits[0] if hits else None

    def lines(self, name):
        if name not in self._lines:
            path = self._path(name)
            self._lines[name] = open(path).read().splitlines() if path else []
        return self._lines[name]

    @property
    def annotations(self):
        if self._annotations is None:
            self._annotations = read_annotations()
        return self._annotations


def read_annotations(paths=None):
    """The annotations of every header (and of EXTRA_SOURCES), merged."""
    if paths is None:
        paths = build.header_files() + sorted(EXTRA_SOURCES.values())
    out = Annotations()
    for path in paths:
        a = parse_annotations(open(path).read(), os.path.basename(path))
        out.loops.update(a.loops)
        out.regions += a.regions
    return out


def missing_annotations(ann):
    """Known loop and region ids that no annotation names."""
    return sorted(set(LOOPS) - ann.loop_ids()), sorted(set(REGIONS) - ann.region_ids())


def cold_and_test_lines(regions):
    """({file: lines} that weigh 0, {file: lines} of tests that skip them) of the cold regions: a
    test region's first line is a test line unless another region's lines hold it."""
    cold, tests = {}, {}
    for reg in regions:
        starts = {reg.first} if reg.test else set()
        cold.setdefault(reg.file, set()).update(reg.lines - starts)
        tests.setdefault(reg.file, set()).update(reg.lines & starts)
    return cold, {f: ls - cold.get(f, set()) for f, ls in tests.items()}


def active_cold_regions(ann, score_cache=True):
    """The cold regions of the case: the backward with the score cache (the default) or without it."""
    case = "score-cache" if score_cache else "no-score-cache"
    return [r for r in ann.regions if r.kind == "cold" and r.when in (None, case)]


def evaluate(expr, names):
    env = {"ceil": lambda x: math.ceil(x - 1e-9), "min": min, "max": max, "__builtins__": {}}
    env.update(names)
    return eval(expr, env)  # the annotations' and the launch bounds' expressions (the headers')
