"""The ops' registration with torch: opcheck of the forward (also the one keeping its weights),
backward and tables ops (schemas,
fake tensors, autograd), the forward's autograd reading its optional arguments by name from the
schema, torch.compile of the fused op, and the key-table argument's checks."""
import pytest
import torch

from helpers import random_qkv

from fourierformer_fairseq.ops import DECLARATIONS, backend_unavailable_reason, fourier_attention, key_table

CPU_FUSED = not backend_unavailable_reason("cpu")
needs_cpu_kernel = pytest.mark.skipif(not CPU_FUSED, reason=f"fused CPU kernel: {backend_unavailable_reason('cpu')}")


@needs_cpu_kernel
def test_opcheck_forward_op():
    B, H, N, M, D, Dv = 2, 2, 5, 6, 4, 3
    for dtype in (torch.float32, torch.float64):
        q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=dtype, requires_grad=True)
        r = torch.full((H, D), 1.3, dtype=dtype, requires_grad=True)
        mask = torch.zeros(1, H, N, M, dtype=dtype)
        mask[..., 1] = float("-inf")
        bias = torch.zeros(B, M, dtype=dtype)
        args = (q, k, v, r, 4.0, mask, bias, True, 0.0, 0)
        torch.library.opcheck(torch.ops.fourierformer.fourier_attention_forward.default, args)
        torch.library.opcheck(
            torch.ops.fourierformer.fourier_attention_forward.default, (q, k, v, r, 2.0, None, None, False, 0.0, 0)
        )


@needs_cpu_kernel
def test_opcheck_forward_with_weights_and_the_backward_reading_them():
    """The forward that keeps its weights (float32, no dropout) and the backward given them: schemas
    and fake tensors (the weights (B, H, N, M rounded up to the key-table block)); the autograd calls
    them below itself, so the inputs need no gradient here."""
    B, H, N, M, D, Dv = 2, 2, 5, 6, 32, 3
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32)
    r = torch.full((H, D), 0.6)
    mask = torch.zeros(1, H, N, M, dtype=torch.bool)
    mask[..., 1] = True
    for args in ((q, k, v, r, 4.0, mask, None, True, 0.0, 0), (q, k, v, r, 2.0, None, None, False, 0.0, 0, 1e-2)):
        torch.library.opcheck(torch.ops.fourierformer.fourier_attention_forward_with_weights.default, args)
        out, lse, weights = torch.ops.fourierformer.fourier_attention_forward_with_weights(*args)
        assert weights.shape == (B, H, N, DECLARATIONS["cpu"].key_table_keys)
        eps = args[10] if len(args) > 10 else 0.0
        backward_args = (torch.randn_like(out), q, k, v, r, out, lse, *args[4:10], eps, None, "power", weights)
        torch.library.opcheck(torch.ops.fourierformer.fourier_attention_backward.default, backward_args)


@needs_cpu_kernel
def test_op_autograd_reads_its_optional_arguments_by_name():
    """The forward op's autograd names its arguments from the op's schema (ops/fused.py,
    ForwardArguments): each optional one, given or left out (the dispatcher leaves out one at its
    default), reaches the backward op as the value the call meant."""
    from fourierformer_fairseq.ops import fused

    forward, backward = (torch.ops.fourierformer.fourier_attention_forward,
                         torch.ops.fourierformer.fourier_attention_backward)
    schema = forward.default._schema
    assert fused.ForwardArguments._fields == tuple(a.name for a in schema.arguments)
    assert fused.ForwardArguments._field_defaults == {a.name: a.default_value for a in schema.arguments
                                                      if a.has_default_value()}
    q, k, v = random_qkv(1, 2, 4, 5, 3, 3, dtype=torch.float64, seed=7, requires_grad=True)
    r = torch.full((2, 3), 0.9, dtype=torch.float64, requires_grad=True)
    cases = [(4.0, optional) for optional in ((), (0.0,), (0.0, None), (1e-2,), (1e-2, None), (1e-2, None, "power"))]
    cases += [(1.0, (1e-2, None, phi)) for phi in DECLARATIONS["cpu"].phis if phi != "power"]
    for power, optional in cases:
        out, lse = forward(q, k, v, r, power, None, None, False, 0.0, 0, *optional)
        grads = torch.autograd.grad(out.sum(), (q, k, v, r))
        eps = optional[0] if optional else 0.0
        phi = optional[2] if len(optional) > 2 else "power"
        expected = backward(torch.ones_like(out), *(t.detach() for t in (q, k, v, r)), out.detach(), lse, power,
                            None, None, False, 0.0, 0, eps, None, phi)
        for name, got, want in zip("qkvr", grads, expected):
            assert torch.equal(got, want), (optional, name)


@needs_cpu_kernel
def test_torch_compile_runs_the_fused_op():
    q, k, v = random_qkv(2, 2, 9, 9, 16, 16, dtype=torch.float32, requires_grad=True)
    r = torch.tensor(2.0, requires_grad=True)
    r_eager = r.detach().clone().requires_grad_()
    # the compiled call first, as a process's first call (the backends' declarations read their
    # limits on first use: functools.cached_property's lock there, Python < 3.12, failed to trace)
    for declaration in DECLARATIONS.values():  # (their kept reads forgotten: read again under compile)
        for name in [n for n in vars(declaration) if n.startswith("_kept_")]:
            del vars(declaration)[name]
    compiled = torch.compile(lambda *t: fourier_attention(*t, causal=True, backend="cpu"), backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v, r)
    out.sum().backward()
    expected = fourier_attention(q, k, v, r_eager, causal=True, backend="cpu")
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(r.grad, r_eager.grad)  # the compiled graph runs the same backward


@needs_cpu_kernel
def test_opcheck_backward_op():
    B, H, N, M, D, Dv = 2, 2, 5, 6, 4, 3
    for dtype in (torch.float32, torch.float64):
        q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=dtype, seed=1)
        r = torch.full((H, D), 1.3, dtype=dtype)
        mask = torch.zeros(1, H, N, M, dtype=dtype)
        mask[..., 1] = float("-inf")
        bias = torch.zeros(B, M, dtype=dtype)
        for masks in ((mask, bias, True), (None, None, False)):
            fwd = (q, k, v, r, 4.0, *masks, 0.0, 0)
            out, lse = torch.ops.fourierformer.fourier_attention_forward(*fwd)
            assert lse.dtype == torch.float64
            grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)
            bwd = (grad_out, q, k, v, r, out, lse, 4.0, *masks, 0.0, 0)
            torch.library.opcheck(torch.ops.fourierformer.fourier_attention_backward.default, bwd)


@needs_cpu_kernel
def test_tables_op_and_argument_on_cpu(monkeypatch):
    """fourier_attention_tables on the CPU: float32 keys give the key table (B, H, D, Mt), the keys
    transposed and zero past M (Mt the next multiple of the backend's key_table_keys), float64 an
    empty vector; not differentiable, passing opcheck. The forward takes it (the same results as
    without, bit for bit, also from a table with room for more keys, and through the op's autograd),
    the backward takes and ignores it, and both refuse tables of another shape, dtype or device
    with a message that says what they must be."""
    B, H, N, M, D, Dv = 2, 2, 5, 6, 4, 3
    q, k, v = random_qkv(B, H, N, M, D, Dv, dtype=torch.float32, seed=6, requires_grad=True)
    r = torch.full((H, D), 1.1, requires_grad=True)
    tables_op = torch.ops.fourierformer.fourier_attention_tables
    tables = tables_op(q, k, r)
    block = DECLARATIONS["cpu"].key_table_keys
    assert block == 16 and tables.dtype == torch.float32 and tables.shape == (B, H, D, block)
    assert not tables.requires_grad
    assert torch.equal(tables[..., :M], k.detach().transpose(2, 3)) and not tables[..., M:].any()
    assert tables_op(q.double(), k.double(), r.double()).shape == (0,)
    torch.library.opcheck(tables_op.default, (q.detach(), k.detach(), r.detach()))
    with pytest.raises(RuntimeError, match="radius must be"):
        tables_op(q, k, torch.ones(H, D + 1))
    args = (q, k, v, r, 4.0, None, None, True, 0.0, 0, 0.0)
    out, lse = torch.ops.fourierformer.fourier_attention_forward(*args)
    out_t, lse_t = torch.ops.fourierformer.fourier_attention_forward(*args, tables)
    assert torch.equal(out, out_t) and torch.equal(lse, lse_t)
    roomy = key_table(k.detach(), room=3 * block + 1)
    assert roomy.shape == (B, H, D, 4 * block) and torch.equal(roomy[..., :block], tables)
    out_r, lse_r = torch.ops.fourierformer.fourier_attention_forward(*args, roomy)
    assert torch.equal(out, out_r) and torch.equal(lse, lse_r)
    torch.library.opcheck(torch.ops.fourierformer.fourier_attention_forward.default,
                          tuple(a.detach() if torch.is_tensor(a) else a for a in args) + (tables,))
    grads = torch.autograd.grad(out.sum(), (q, k, v, r))
    grads_t = torch.autograd.grad(out_t.sum(), (q, k, v, r))
    for a, b in zip(grads, grads_t):
        assert torch.equal(a, b)
    grad_out = torch.ones_like(out)
    bwd = (grad_out, q.detach(), k.detach(), v.detach(), r.detach(), out.detach(), lse, 4.0, None, None, True, 0.0, 0,
           0.0, tables)
    torch.library.opcheck(torch.ops.fourierformer.fourier_attention_backward.default, bwd)
    # the autograd's path on CUDA (tables built in its forward, saved, passed to the backward), here
    # with the CPU op's key table: the same gradients, and the tables op called once per step
    from fourierformer_fairseq.ops import fused

    calls, saved = [], []
    monkeypatch.setattr(fused, "_keeps_tables", lambda q_, v_: calls.append(1) or True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out_k, _ = torch.ops.fourierformer.fourier_attention_forward(*args)
    grads_k = torch.autograd.grad(out_k.sum(), (q, k, v, r))
    assert calls == [1]
    assert [t.shape for t in saved if t.dtype == torch.float32 and t.shape == tables.shape] == [tables.shape]
    assert torch.equal(out_k, out)
    for a, b in zip(grads, grads_k):
        assert torch.equal(a, b)
    too_narrow = torch.zeros(B, H, D, 0)
    for bad in (torch.zeros(3), torch.zeros(0, dtype=torch.float64), torch.zeros(1, 0), too_narrow,
                torch.zeros(B, H, D, block + 1), torch.zeros(B, H, D + 1, block), tables.double(),
                torch.zeros(B, H, block, D).transpose(2, 3)):
        with pytest.raises(RuntimeError, match=r"tables must be a key table of fourier_attention_tables"):
            torch.ops.fourierformer.fourier_attention_forward(*args, bad)
        with pytest.raises(RuntimeError, match=r"tables must be a key table of fourier_attention_tables"):
            torch.ops.fourierformer.fourier_attention_backward(*bwd[:-1], bad)
