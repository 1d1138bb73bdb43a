"""Autograd and shape (fake) registrations of the fused ``fourierformer::`` ops.

The C++ library defines four ops (csrc/fourier_attention_ops.cpp):

    fourier_attention_forward(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed,
                              normaliser_eps=0, tables=None, phi="power") -> (out, lse)
    fourier_attention_forward_with_weights(<the forward's arguments>) -> (out, lse, weights)
    fourier_attention_backward(grad_out, q, k, v, radius, out, lse, power, attn_mask, key_bias,
                               causal, dropout_p, seed, normaliser_eps=0, tables=None, phi="power",
                               weights=None) -> (dq, dk, dv, dradius)
    fourier_attention_tables(q, k, radius) -> tables

``attn_mask`` (B|1, H|1, N, M) and ``key_bias`` (B, M) are additive float masks or bool masks
(True = masked; the C++ side turns them into 0 / -inf once and knows from the dtype that they
only select). ``radius`` is the (H, D) table, float32 (float64 for float64 inputs); ``lse`` the per-row
log-normaliser (+inf for rows with no visible key), float64 for every input dtype: it is
of order p * D (a sum of D logs), and the backward needs it to float32 accuracy relative
to 1, which a float32 lse (error ulp(|lse|) / 2) would not give. With ``normaliser_eps`` > 0
(the published code's ``sum_j w_ij + eps``) ``lse`` stays the log-sum over the real keys and
``out`` is scaled by their share sigmoid(lse - log eps); the backward recomputes that share.
``phi`` is the op's phi where the backend runs it ("power", and "abs", "relu" and "sigmoid" with
power 1: ops.fused.op_power; csrc/backend_limits.h lists them per backend). ``tables`` (float32, 1-D) are the per-(row, feature) tables that the CUDA kernels of float32,
float16 and bfloat16 build from q, k and radius before they run (csrc/cuda/tables.cuh): the
autograd below builds them once per step and hands them to both ops, which otherwise build their
own (FOURIERFORMER_KEEP_TABLES=0: so they do; the tables then need no memory between the forward
and the backward: 28 bytes per (row, feature) of q and k). On the CPU (float32) they are the key
table (B, H, D, Mt): the keys alone, transposed, which the short-query forward reads (its room
may exceed M: incremental decoding keeps one between steps, see ``ops.key_table``). Empty for
float64.

``weights`` (CPU, float32, no dropout) are the forward's normalised weights before dropout, (B, H,
N, Mt) with M rounded up to a multiple of the key table's block (zero past each row's visible keys):
the backward's first sweep over the keys reads them instead of recomputing every product of sincs.
The autograd keeps them where they take no more memory than q (Mt <= D; _keeps_weights), unless
FOURIERFORMER_KEEP_WEIGHTS is 0; the CUDA kernels keep none (they keep tables instead).

Importing this module registers their shape (fake) and autograd implementations when the
extension has loaded (extension.py, imported first, loads it), so that ``import
fourierformer_fairseq.ops`` does both, as extension-cpp's package does.
"""
from __future__ import annotations

import collections
import os

import torch

from .backends import DECLARATIONS
from .extension import extension_status
from .inputs import AttentionInputs


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """radius and masks are passed in this dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _forward_fake(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed, normaliser_eps=0.0,
                  tables=None, phi="power"):
    B, H, N, _ = q.shape
    out = q.new_empty((B, H, N, v.shape[-1]))
    lse = q.new_empty((B, H, N), dtype=torch.float64)
    return out, lse


def key_table_width(M: int) -> int:
    """The least room of a CPU key table for M keys, which the kept weights' rows share: M rounded up
    to a whole number of key-table blocks (csrc/backend_limits.h, kCpuKeyTableKeys)."""
    block = DECLARATIONS["cpu"].key_table_keys
    return -(-M // block) * block


def _forward_with_weights_fake(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed,
                               normaliser_eps=0.0, tables=None, phi="power"):
    out, lse = _forward_fake(q, k, v, radius, power, attn_mask, key_bias, causal, dropout_p, seed)
    B, H, N, _ = q.shape
    return out, lse, q.new_empty((B, H, N, key_table_width(k.shape[2])), dtype=torch.float32)


def _backward_fake(grad_out, q, k, v, radius, out, lse, power, attn_mask, key_bias, causal, dropout_p, seed,
                   normaliser_eps=0.0, tables=None, phi="power", weights=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(radius)


def _builds_tables(q: torch.Tensor) -> bool:
    """Whether the backend of q's device and dtype builds tables (as cuda_table_floats: the CUDA
    kernels of float32, float16 and bfloat16)."""
    return q.device.type == "cuda" and q.dtype != torch.float64


def _tables_fake(q, k, radius):
    floats = 0
    if _builds_tables(q):
        B, H, N, D = q.shape
        # (int(): symbolic sizes specialise, as the kernels' tables depend on them)
        floats = extension_status().module.cuda_table_floats(*(int(n) for n in (B, H, N, k.shape[2], D)))
    elif q.device.type == "cpu" and q.dtype == torch.float32:  # the key table (see ops.key_table)
        B, H, M, D = k.shape
        return q.new_empty((B, H, D, key_table_width(M)), dtype=torch.float32)
    return q.new_empty((floats,), dtype=torch.float32)


def _keeps_tables(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the autograd builds the tables once for the forward and the backward: on a backend
    whose backward reads them (CUDA: float32, float16, bfloat16, D and Dv up to its tiled
    backward's limit), unless FOURIERFORMER_KEEP_TABLES is 0."""
    if not _builds_tables(q):
        return False
    limit = DECLARATIONS["cuda"].tiled_backward_max_head_dim
    if limit is None or max(q.shape[-1], v.shape[-1]) > limit:
        return False
    return os.environ.get("FOURIERFORMER_KEEP_TABLES", "1") != "0"


def _keeps_weights(q: torch.Tensor, k: torch.Tensor, dropout_p: float) -> bool:
    """Whether the autograd keeps the forward's weights for the backward (see the module docstring):
    CPU float32 calls without dropout whose weights take no more memory than q, unless
    FOURIERFORMER_KEEP_WEIGHTS is 0."""
    if q.device.type != "cpu" or q.dtype != torch.float32 or dropout_p != 0.0:
        return False
    if key_table_width(k.shape[2]) > q.shape[-1]:
        return False
    return os.environ.get("FOURIERFORMER_KEEP_WEIGHTS", "1") != "0"


def forward_arguments_class(schema):
    """A named tuple of an op's arguments, by the names of its schema, the optional ones taking the
    schema's defaults when a call leaves them out (as the dispatcher does for an argument at its
    default): ``args = ForwardArguments(*inputs)``, then ``args.tables``, ``args.normaliser_eps``."""
    names = [a.name for a in schema.arguments]
    optional = [a for a in schema.arguments if a.has_default_value()]
    if schema.arguments[len(names) - len(optional):] != optional:
        raise ValueError(f"{schema.name}: the arguments with defaults must come last")
    return collections.namedtuple("ForwardArguments", names, defaults=[a.default_value for a in optional])


def _setup_context(ctx, inputs, output, weights=None):
    a = inputs if isinstance(inputs, ForwardArguments) else ForwardArguments(*inputs)
    out, lse = output
    ctx.save_for_backward(a.q, a.k, a.v, a.radius, out, lse, a.attn_mask, a.key_bias, a.tables, weights)
    ctx.args = (a.power, a.causal, a.dropout_p, a.seed, a.normaliser_eps, a.phi)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # lse's gradient stays None (no zeros to allocate and fill)


def _backward(ctx, grad_out, grad_lse):
    q, k, v, radius, out, lse, attn_mask, key_bias, tables, weights = ctx.saved_tensors
    if grad_out is None:  # (set_materialize_grads(False); gradcheck's undefined-gradient check)
        grad_out = torch.zeros_like(out)
    power, causal, dropout_p, seed, normaliser_eps, phi = ctx.args
    dq, dk, dv, dradius = torch.ops.fourierformer.fourier_attention_backward(
        grad_out.contiguous(), q, k, v, radius, out, lse, power, attn_mask, key_bias, causal, dropout_p, seed,
        normaliser_eps, tables, phi, weights,
    )
    # q, k, v and the radius get gradients; the op's other arguments (power, ..., tables) none
    return (dq, dk, dv, dradius) + (None,) * (len(ForwardArguments._fields) - 4)


class _FusedFourierAttention(torch.autograd.Function):
    """The forward op's autograd: what torch.library.register_autograd(op, _backward,
    setup_context=_setup_context) registers, less its per-call rebuilding of the op's arguments
    from the schema (torch._library.utils.fill_defaults, about as costly per call as the rest of
    the Python around the kernels together)."""

    @staticmethod
    def forward(ctx, keyset, *inputs):
        below = keyset & torch._C._after_autograd_keyset
        args = ForwardArguments(*inputs)
        with torch._C._AutoDispatchBelowAutograd():
            if args.tables is None and _keeps_tables(args.q, args.v):
                # built once, for this forward and its backward (see the module docstring)
                tables = torch.ops.fourierformer.fourier_attention_tables.default.redispatch(
                    below, args.q, args.k, args.radius
                )
                args = args._replace(tables=tables)
            weights = None
            if _keeps_weights(args.q, args.k, args.dropout_p):
                # kept for this forward's backward (see the module docstring)
                *output, weights = torch.ops.fourierformer.fourier_attention_forward_with_weights.default.redispatch(
                    below, *args
                )
                output = tuple(output)
            else:
                output = torch.ops.fourierformer.fourier_attention_forward.default.redispatch(below, *args)
        _setup_context(ctx, args, output, weights)
        return output

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return (None,) + _backward(ctx, grad_out, grad_lse)


def _forward_autograd(keyset, *args):
    """The forward op's Autograd kernel (args as the dispatcher passes them: normaliser_eps is
    left out when it has its default)."""
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
        return _FusedFourierAttention.apply(keyset, *args)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.fourierformer.fourier_attention_forward.default.redispatch(
            keyset & torch._C._after_autograd_keyset, *args
        )


# The ops exist only when the extension has loaded; without it their names stay free (the CUDA
# host emulation defines them from a library of its own).
ForwardArguments = None  # the forward op's arguments by name (forward_arguments_class), once the op exists
if extension_status().loaded:
    ForwardArguments = forward_arguments_class(torch.ops.fourierformer.fourier_attention_forward.default._schema)
    torch.library.register_fake("fourierformer::fourier_attention_forward")(_forward_fake)
    torch.library.register_fake("fourierformer::fourier_attention_forward_with_weights")(_forward_with_weights_fake)
    torch.library.register_fake("fourierformer::fourier_attention_backward")(_backward_fake)
    torch.library.register_fake("fourierformer::fourier_attention_tables")(_tables_fake)
    _LIBRARY = torch.library.Library("fourierformer", "IMPL")  # (its registrations last as long as it)
    _LIBRARY.impl("fourier_attention_forward", _forward_autograd, "Autograd", with_keyset=True)


def op_power(inp: AttentionInputs) -> float:
    """The ops' power of a call: p of phi(x) = x^p, or 1 for the other phis the ops take ("abs",
    "relu" and "sigmoid": the log domain with p = 1; csrc/backend_limits.h, kUnitPower)."""
    return float(inp.power) if inp.phi == "power" else 1.0


def _op_radius(inp: AttentionInputs) -> torch.Tensor:
    compute = _compute_dtype(inp.q.dtype)
    radius = inp.radius_hd if inp.radius_hd.dtype == compute else inp.radius_hd.to(compute)
    return radius.contiguous()


def fused_forward(inp: AttentionInputs, seed: int, values: torch.Tensor | None = None,
                  tables: torch.Tensor | None = None) -> torch.Tensor:
    """Runs the fused op on normalised inputs; returns out (B, H, N, Dv). ``values`` replaces
    inp.v, ``tables`` are fourier_attention_tables' for inp (see fused_weights)."""
    assert extension_status().loaded
    compute = _compute_dtype(inp.q.dtype)
    radius = _op_radius(inp)
    # bool masks go as they are: the kernels learn from the dtype that they only select
    attn_mask = inp.attn_mask
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(compute)
    key_bias = inp.key_padding_mask
    out, _ = torch.ops.fourierformer.fourier_attention_forward(
        inp.q, inp.k, inp.v if values is None else values, radius, op_power(inp), attn_mask, key_bias,
        inp.causal, inp.dropout_p, seed, inp.normaliser_eps, tables, inp.phi,
    )
    return out


# At most this many key columns per call of fused_weights, on top of the backend's value-width
# limit; None (the default): that limit alone. Tests set it small so that the CPU kernel, which
# has no limit, runs the weights in several chunks too.
WEIGHTS_COLUMNS: int | None = None


def fused_weights(inp: AttentionInputs, seed: int, max_head_dim: int | None) -> torch.Tensor:
    """The normalised weights (B, H, N, M), after dropout (same seed, same mask), computed by
    the fused kernel itself: its forward with the identity as the values gives out = P I = P.
    Columns of at most ``max_head_dim`` keys per call (the kernel's value-width limit; at most
    WEIGHTS_COLUMNS when set); each call recomputes the scores (on CUDA from one set of tables).
    Differentiable w.r.t. q, k and the radius through the op's backward. Rows with no visible key give zeros, as the output does."""
    B, H, N, _ = inp.q.shape
    M = inp.k.shape[2]
    width = min([w for w in (M, max_head_dim, WEIGHTS_COLUMNS) if w] or [1])
    eye = torch.eye(M, dtype=inp.q.dtype, device=inp.q.device)
    tables = None
    if M > width and _builds_tables(inp.q):  # (one set for every chunk)
        tables = torch.ops.fourierformer.fourier_attention_tables(inp.q, inp.k, _op_radius(inp))
    parts = [
        fused_forward(inp, seed, eye[:, c0:c0 + width].expand(B, H, M, min(width, M - c0)), tables)
        for c0 in range(0, M, width)
    ]
    return torch.cat(parts, -1) if parts else inp.q.new_zeros(B, H, N, 0)


def fused_forward_and_weights(inp: AttentionInputs, seed: int, max_head_dim: int | None,
                              tables: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """out (B, H, N, Dv) and the normalised weights (B, H, N, M) (see fused_weights). Where the
    values and the identity fit the kernel's value width together (and WEIGHTS_COLUMNS, when set,
    holds all M columns), one call takes them side by side, [v | I], and computes the scores
    once for both (the same weights, dropout mask included: out = P [v | I] = [P v | P]);
    otherwise the output's call and fused_weights' calls. ``tables`` as fused_forward's."""
    B, H, N, _ = inp.q.shape
    M, Dv = inp.k.shape[2], inp.v.shape[-1]
    if (max_head_dim is None or Dv + M <= max_head_dim) and (WEIGHTS_COLUMNS is None or M <= WEIGHTS_COLUMNS):
        eye = torch.eye(M, dtype=inp.v.dtype, device=inp.v.device).expand(B, H, M, M)
        both = fused_forward(inp, seed, torch.cat([inp.v, eye], -1), tables)
        return both[..., :Dv], both[..., Dv:]
    return fused_forward(inp, seed, tables=tables), fused_weights(inp, seed, max_head_dim)
