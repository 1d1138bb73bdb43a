"""Static reading of the sm_90 SASS of the float32 CUDA kernels, without a GPU and without torch.

    python scripts/benchmarks/cuda_sass_report.py                      # head dims 16 and 128
    python scripts/benchmarks/cuda_sass_report.py --head-dims 16,64,128
    python scripts/benchmarks/cuda_sass_report.py --json > sass.json   # machine-readable
    python scripts/benchmarks/cuda_sass_report.py --keep               # keep the generated .cu, logs and SASS
    python scripts/benchmarks/cuda_sass_report.py --phi relu           # phi = ReLU's kernel instances
    python scripts/benchmarks/cuda_sass_report.py --phi sigmoid        # phi = sigmoid's kernel instances
    python scripts/benchmarks/cuda_sass_report.py --phi odd            # phi(x) = x^p with odd p (x, x^3)

For each head dim (D = Dv) it compiles, from the kernel headers alone (csrc/cuda/*.cuh, no torch
or ATen header), the float32 kernel instances that the launcher (csrc/cuda/fourier_attention_launch.h)
runs at that shape: the table kernel, the tiled forward (forward_threads(Dv) threads per block: two
halves of kFwdThreads when Dv > 64), the tiled backward's pre-pass, main pass and dq finish kernels,
and the decoding forward for few query rows (forward_decode.cuh: its key-chunk kernel for one query
row and for kDecodeMaxRows, and the kernel that merges the chunks). Which instance runs at a size is
the launcher's choice, stated once in csrc/cuda/tile_switch.h (ForwardColumns, MainPassColumns,
DecodeRows): the report reads it from there, through the host program below.
A generated translation unit includes fourier_attention_kernels.cuh and explicitly instantiates one
kernel template; it is compiled with ``nvcc -cubin -arch=sm_90 -Xptxas -v`` and the nvcc flags of
setup.py (-O3 -lineinfo), and disassembled with nvdisasm (line information included). The cubins
and ptxas logs are cached under ``${TMPDIR:-/tmp}/fourierformer-sass-cache`` (--cache-dir), keyed
on a hash of the headers, the instance and the compiler, so a second run only disassembles.
Head-dim dependent sizes (shared memory, padded features), the launcher's choices and the tile
constants come from a small host program compiled from the same headers.

Per kernel instance it prints:
  * registers, spill stores / loads (bytes), stack frame, shared memory (static + dynamic at the
    head dim, as the launcher asks for it);
  * the launch bounds of the kernel (read from its FF_LAUNCH_BOUNDS in the headers; ptxas caps
    the registers by them) and the warps per SM on sm_90 (65536 registers per SM in 4 quarters,
    allocated per warp in units of 256; 228 KiB shared memory per SM with 1 KiB reserved per
    block; 64 warps and 32 blocks at most), and what limits it;
  * every loop of the kernel, found from the backward branches of the SASS (a loop is the address
    range from a branch target up to a branch that jumps back to it), named by the source ``for``
    statement of that branch (the line information of -lineinfo) and the annotation above it (see
    "The model beside the code" below), with its static instruction
    count, the unroll factor the compiler chose (source iterations per SASS iteration, read from
    the increment of the induction variable that the exit test compares) and the trip count used
    for the weighting;
  * instructions per element of each inner loop: the static instructions of the loop body divided
    by the elements one SASS iteration of one thread handles (unroll factor times the elements of
    one source iteration, from the tile constants: e.g. the score loop does kMicro x kMicro pairs
    times kRenormEvery features). Elements are (query, key, feature) triples, or (query, key,
    value column) triples for the P V / dO V^T / P^T dO loops;
  * the whole kernel per (query, key, feature) element at N = M = 256 and 1024: every instruction
    of the kernel weighted by the trip counts of the loops around it (per entry, for the shape),
    summed over the threads of all blocks of one (batch, head) slice, divided by N M D. The count
    is for the plain case: no mask, no key bias, no dropout, not causal, the backward's score cache
    present (its main pass reads the pre-pass's scores; --no-score-cache: computes them again), no pair on the rare path
    (|x| < 2^-14), no flat feature: the source lines of those branches (the cold regions the
    headers annotate) weigh 0, but for the tests that skip them, which the plain case runs (a
    region's first line with the flag test: its instructions up to its conditional branch, the
    compare and what the compiler hoisted above it), and out-of-line subroutines (the rare path's function, slow paths of divisions and of
    float64 sincos) are not counted. In the table kernel the per-feature x / u branch is weighted
    for one batch (H Dp threads of the grid) and the row constant's slot sum for slot 0 only.
    Totals: forward + tables = table kernel + forward kernel, backward + tables = table kernel +
    pre-pass + main pass + dq finish kernel (as when the backward builds its own tables), and a
    training step = table kernel + forward + backward (the autograd builds the tables once and
    passes them to both: fourier_attention_tables); at head dims of 64 and more also the backward
    and the step on a small grid (the two-half pre-pass and the main pass in two splits, as the
    launcher runs the IWSLT'14 benchmark shape on 132 SMs: delta_pass_split, main_pass_splits).
    The decoding forward is counted at its own shape: N = its register rows (1 and kDecodeMaxRows)
    queries against M = the shape's keys, its key-chunk kernel and its merge per (query, key,
    feature) element (totals: decoding).

Each loop row also gives its share of the whole-kernel count (the instructions of that loop not
inside a nested loop, weighted as above, per element), and "outside every loop" the rest, so that
the shares add up to the whole. A loop without an annotation is counted once and named in the
warnings at the end: after a kernel change, annotate it rather than trust those totals.

The model beside the code: each loop the model counts and each source region it weighs carries a
`// SASS:` line comment in the kernel headers, e.g.

    // SASS: loop=g_pass step=kGroup trips=chunk_dc/kGroup elements=kMicro*kMicro*kGroup unit=qkd
    for (int dd = 0; dd < dc; dd += kGroup) {

(its name, the source step, the trips per entry and the elements per trip), or `// SASS:
cold=<id> begin [test]` ... `// SASS: cold=<id> end` around code the plain case does not run, and
`// SASS: branch=<id> weight=<expr> begin` ... `end` around code run with a weight. The report
reads those annotations and the -lineinfo line numbers, nothing else of the comments; the
grammar, and the ids it knows (LOOPS, REGIONS), are in annotations.py. An annotation it cannot read
is refused with its file and line.

This is a static model: it does not know about stalls, bank conflicts or latency; an instruction
issued under a false predicate still counts (it takes an issue slot), and a loop exit or `continue`
that the plain case does not take (P = 0) is assumed not taken.

What it reported for each version of the kernels, dated with the machine, the command, the
compiler and the headers' hash: docs/records/speed.md (its latest entries are the current counts).
The counts are for full tiles: the threads of a short sequence's empty micro-tiles
(micro_tile_live) skip their loops, which this count does not model. The first feature chunk of
the scores runs outside that loop (peeled): at D = 16 the loop does not run and the chunk counts
in the tile loop's share.

Requirements: nvcc (the CUDA toolkit, 12.x or 13.x) and nvdisasm; cuobjdump (optional) cross-checks
the register counts. The two disassemblers come as PyPI wheels (not needed by the project itself):

    python -m pip install nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump

They are found on PATH, next to nvcc, under $CUDA_HOME/bin, or in those wheels (nvidia/cu*/bin).
A cold run compiles every instance, a cached one only disassembles.

The package's modules: build (the tools, the headers, the host program, the instances the launcher
runs, their compilation with the cache), annotations (the `// SASS:` model beside the code),
disassembly (nvdisasm's functions, the loops and their unroll factors), occupancy (ptxas's
registers and spills, the launch bounds, the warps per SM), count (one instance's weighted count)
and report (the command line, the report and its tables).
"""
