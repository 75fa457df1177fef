"""flashjit.torch against PyTorch: the SDPA drop-in's outputs and autograd gradients against
float64 SDPA (within twice the error of SDPA in the same dtype, plus rounding), GQA, bool and
float masks, top-left causal for sq != sk; flex_attention with a score_mod expression and its
gradients against the same function in torch; kv_cache_append into shuffled pages with paged
attention over them (and a mixed step: packed new tokens, packed queries), and attention_merge
of two key halves; repeated calls of one signature
(on CUDA: outs made by the C fast path, tensors read through torch's C shim);
block classes built once (create_block_mask) and used; FP8 inputs with descale factors, and an
FP8 KV cache read by bfloat16 queries;
torch.library.opcheck of the forward operator (schema, fake tensor, autograd registration, AOT
dispatch); torch.compile(fullgraph=True) of a block using it against eager. On a CUDA device,
in bf16, also a paged decode step (kv_cache_append + attention), eager and torch.compile'd,
captured in a CUDA graph and replayed against eager, and the host time of a Python call
(printed, not asserted). Without a CUDA device the checks run on CPU tensors in float32 (the
context's device is then OpenCL's: PoCL). Exits 77 without torch.
Usage: python tests/torch_api.py  (flashjit importable: installed, or PYTHONPATH=python with
FLASHJIT_LIB)"""
import sys
import time

from torch_checks import check, dev, dtype, exit_status, within  # (exits 77 without torch)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import flashjit.torch as fjt  # noqa: E402

torch.manual_seed(0)
print(f"device {dev}, {dtype}, torch {torch.__version__}, {fjt.context(dev)}")


def sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, **kw)


# Drop-in forward and gradients.
shapes = [((2, 8, 8, 300, 300, 64), dict(is_causal=True)),
          ((2, 8, 2, 200, 333, 128), dict(enable_gqa=True)),
          ((1, 4, 4, 100, 260, 64), dict(is_causal=True)),
          ((1, 4, 4, 260, 100, 64), dict(is_causal=True)),
          ((2, 4, 4, 128, 128, 64), dict(attn_mask="bool")),
          ((2, 4, 4, 96, 160, 64), dict(attn_mask="float"))]
if dev == "cpu":  # PoCL is slow: smaller problems
    shapes = [((b, h, hk, max(sq // 4, 1), max(sk // 4, 1), min(d, 32)), kw)
              for (b, h, hk, sq, sk, d), kw in shapes]
for (b, hq, hkv, sq, sk, d), kw in shapes:
    q = torch.randn(b, hq, sq, d, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hkv, sk, d, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hkv, sk, d, device=dev, dtype=dtype, requires_grad=True)
    kw = dict(kw)
    if kw.get("attn_mask") == "bool":
        kw["attn_mask"] = torch.rand(b, 1, sq, sk, device=dev) > 0.3
        kw["attn_mask"][..., 0] = True
    elif kw.get("attn_mask") == "float":  # a bias that learns: its gradient is checked too
        kw["attn_mask"] = torch.randn(1, hq, sq, sk, device=dev, dtype=dtype,
                                      requires_grad=True)
    name = f"sdpa b{b} hq{hq} hkv{hkv} sq{sq} sk{sk} d{d} " + \
        ",".join(f"{n}" for n in kw)
    g = torch.randn(b, hq, sq, d, device=dev, dtype=dtype)
    inputs = (q, k, v) + ((kw["attn_mask"],) if isinstance(kw.get("attn_mask"), torch.Tensor)
                          and kw["attn_mask"].requires_grad else ())
    out = fjt.scaled_dot_product_attention(q, k, v, **kw)
    grads = torch.autograd.grad(out, inputs, g)
    plain = sdpa(q, k, v, **kw)
    plain_grads = torch.autograd.grad(plain, inputs, g)
    inputs64 = tuple(x.detach().double().requires_grad_() for x in inputs)
    kw64 = dict(kw)
    if len(inputs) == 4:
        kw64["attn_mask"] = inputs64[3]
    ref = sdpa(*inputs64[:3], **kw64)
    ref_grads = torch.autograd.grad(ref, inputs64, g.double())
    within(name + " out", out, ref, plain)
    # Without autograd the drop-in calls the context in SDPA's layout: twice (the second call on
    # CUDA the C fast path's), then with q's memory in [b, s, h, d] order.
    with torch.no_grad():
        direct = [fjt.scaled_dot_product_attention(q, k, v, **kw) for _ in range(2)]
        strided = q.detach().transpose(1, 2).contiguous().transpose(1, 2)
        direct.append(fjt.scaled_dot_product_attention(strided, k, v, **kw))
    for how, got in zip(("first", "repeated", "strided q"), direct):
        within(f"{name} out without autograd, {how}", got, ref.detach(), plain)
    for n, got, r, p in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads, plain_grads):
        within(f"{name} {n}", got, r, p)

# Bad input: the drop-in names what it does not take.
q, k, v = (torch.randn(1, h, 16, 32, device=dev, dtype=dtype) for h in (4, 2, 2))
for name, call, cls in (
        ("dropout", lambda: fjt.scaled_dot_product_attention(q, q, q, dropout_p=0.1),
         fjt.Unsupported),
        ("grouped heads without enable_gqa", lambda: fjt.scaled_dot_product_attention(q, k, v),
         fjt.InvalidArgument),
        ("attn_mask with is_causal",
         lambda: fjt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(
             16, 16, dtype=torch.bool, device=dev), is_causal=True), fjt.InvalidArgument),
        ("5-D query", lambda: fjt.scaled_dot_product_attention(q[None], q[None], q[None]),
         fjt.InvalidArgument),
        ("layout", lambda: fjt.context(dev).forward(q, q, q, layout="bsdh"),
         fjt.InvalidArgument),
        ("layout bhsd with packed sequences", lambda: fjt.context(dev).forward(
            q, q, q, layout="bhsd", cu_seqlens_q=torch.zeros(2, dtype=torch.int32, device=dev)),
         fjt.InvalidArgument)):
    try:
        call()
        check(f"bad input: {name}", False, "no error")
    except cls as e:
        check(f"bad input: {name}", True, f"{type(e).__name__}: {e}")

# Unbatched [h, s, d] inputs, as SDPA takes them; Context.forward in layout "bhsd" with out
# given.
q, k, v = (torch.randn(4, 37, 32, device=dev, dtype=dtype) for _ in range(3))
within("sdpa unbatched [h, s, d]", fjt.scaled_dot_product_attention(q, k, v, is_causal=True),
       sdpa(q.double(), k.double(), v.double(), is_causal=True), sdpa(q, k, v, is_causal=True))
out = torch.full((1, 4, 37, 32), float("nan"), device=dev, dtype=dtype)
got = fjt.context(dev).forward(q[None], k[None], v[None], out=out, causal=True, layout="bhsd")
within("Context.forward, layout bhsd, out given", out, sdpa(q.double(), k.double(), v.double(),
       is_causal=True)[None], sdpa(q, k, v, is_causal=True)[None])
check("Context.forward, layout bhsd, returns the out given", got is out)

# flex_attention with a score_mod expression: output and gradients against the same function
# written in torch, in float64.
b, h, sq, sk, d = (2, 4, 70, 90, 32) if dev == "cpu" else (2, 8, 300, 400, 64)
q, k, v = (torch.randn(b, h, n, d, device=dev, dtype=dtype, requires_grad=True)
           for n in (sq, sk, sk))
g = torch.randn(b, h, sq, d, device=dev, dtype=dtype)
out = fjt.flex_attention(q, k, v, score_mod="s * 0.5 + tanh(s) - 0.01 * abs(q - k)")
grads = torch.autograd.grad(out, (q, k, v), g)


def flex_reference(q, k, v):
    s = q @ k.transpose(-1, -2) / d ** 0.5
    rel = (torch.arange(sq, device=dev)[:, None] - torch.arange(sk, device=dev)[None]).abs()
    s = s * 0.5 + torch.tanh(s) - 0.01 * rel.to(s.dtype)
    return torch.softmax(s, -1) @ v


q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
ref = flex_reference(q64, k64, v64)
ref_grads = torch.autograd.grad(ref, (q64, k64, v64), g.double())
plain = flex_reference(q, k, v)
plain_grads = torch.autograd.grad(plain, (q, k, v), g)
within("flex_attention score_mod out", out, ref, plain)
for n, got, r, p in zip(("dq", "dk", "dv"), grads, ref_grads, plain_grads):
    within(f"flex_attention score_mod {n}", got, r, p)

# Packed sequences with a float bias seen as a padded batch [b, h, max_q, max_k]: the gradients
# of q, k, v and the bias against SDPA per sequence (float64 autograd, the bias's slice of
# each), within twice the same computation's error in the inputs' dtype.
lens_q, lens_k = [5, 9, 3], [7, 12, 4]
cu_q, cu_k = (torch.tensor([0] + lens, device=dev).cumsum(0).to(torch.int32)
              for lens in (lens_q, lens_k))
q = torch.randn(sum(lens_q), 2, 16, device=dev, dtype=dtype, requires_grad=True)
k, v = (torch.randn(sum(lens_k), 2, 16, device=dev, dtype=dtype, requires_grad=True)
        for _ in range(2))
bias = torch.randn(3, 2, 9, 12, device=dev, requires_grad=True)
out = fjt.attention(q, k, v, bias=bias, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=9,
                    max_seqlen_k=12)
g = torch.randn_like(out)
grads = torch.autograd.grad(out, (q, k, v, bias), g)


def packed_reference(q, k, v, bias):
    outs = []
    for i in range(3):
        qi, ki, vi = (x[int(c[i]):int(c[i + 1])].transpose(0, 1)[None]
                      for x, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        mask = bias[i:i + 1, :, :lens_q[i], :lens_k[i]].to(qi.dtype)
        outs.append(sdpa(qi, ki, vi, attn_mask=mask)[0].transpose(0, 1))
    return torch.cat(outs)


leaves64 = [x.detach().double().requires_grad_() for x in (q, k, v, bias)]
ref_grads = torch.autograd.grad(packed_reference(*leaves64), leaves64, g.double())
leaves = [x.detach().requires_grad_() for x in (q, k, v, bias)]
plain_grads = torch.autograd.grad(packed_reference(*leaves), leaves, g)
within("packed sequences with a bias: out", out,
       packed_reference(*[x.double() for x in leaves64]), packed_reference(*leaves))
for n, got, r, p in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads, plain_grads):
    within(f"packed sequences with a bias: {n}", got, r, p)

# The forward operator through torch.library.opcheck: schema, fake tensor, autograd, AOT.
q, k, v = (torch.randn(1, 33, h, 32, device=dev, dtype=dtype, requires_grad=True)
           for h in (4, 2, 2))
report = torch.library.opcheck(torch.ops.flashjit.attention_forward.default,
                               (q, k, v) + (None,) * 10 + (0, 0, True, -1, -1, 0.0, 0.0, "", "",
                                                           0))
check("opcheck flashjit::attention_forward", all(r == "SUCCESS" for r in report.values()),
      str(report))


# torch.compile(fullgraph=True) of a block against eager.
class Block(torch.nn.Module):
    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=dtype, device=dev)
        self.proj = torch.nn.Linear(dim, dim, dtype=dtype, device=dev)

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, dim // self.heads).unbind(2)
        o = fjt.attention(q, k, v, causal=True)
        return self.proj(o.reshape(b, s, dim))


block = Block()
x = torch.randn(2, 200 if dev == "cuda" else 40, 256, device=dev, dtype=dtype)
eager = block(x)
try:
    compiled = torch.compile(block, fullgraph=True)(x)
    diff = (compiled.float() - eager.float()).abs().max().item()
    check("torch.compile(fullgraph=True) block", diff <= (0.05 if dev == "cuda" else 1e-4),
          f"max diff {diff:.3g}")
except Exception as e:  # noqa: BLE001 - reported as the failure
    check("torch.compile(fullgraph=True) block", False, f"{type(e).__name__}: {e}")

# The decode operators: kv_cache_append into shuffled pages, paged attention of the appended
# cache against dense SDPA on the same keys, and attention_merge of two key halves.
b, hq, hkv, d, page, pages_per_seq = 3, 8, 2, 64, 16, 6
lens = torch.tensor([5, 40, 77], device=dev, dtype=torch.int32)
table = torch.randperm(b * pages_per_seq, device=dev, dtype=torch.int32).view(b, -1)
kc = torch.randn(b * pages_per_seq, page, hkv, d, device=dev, dtype=dtype)
vc = torch.randn_like(kc)
kn, vn = (torch.randn(b, 2, hkv, d, device=dev, dtype=dtype) for _ in range(2))
fjt.kv_cache_append(kn, vn, kc, vc, table, lens)
lens2 = lens + 2
q1 = torch.randn(b, 1, hq, d, device=dev, dtype=dtype)
got = fjt.attention(q1, kc, vc, page_table=table, seqused_k=lens2,
                    max_seqlen_k=pages_per_seq * page)
worst = 0.0
for i in range(b):
    n = int(lens2[i])
    rows = torch.cat([kc[table[i, j // page], j % page][None] for j in range(n)])
    vals = torch.cat([vc[table[i, j // page], j % page][None] for j in range(n)])
    ok_tail = torch.equal(rows[-2:], kn[i]) and torch.equal(vals[-2:], vn[i])
    ref = sdpa(q1[i:i + 1].transpose(1, 2).double(), rows[None].transpose(1, 2).double(),
               vals[None].transpose(1, 2).double(), enable_gqa=True).transpose(1, 2)
    worst = max(worst, (got[i:i + 1].double() - ref).abs().max().item()) if ok_tail else 1e9
check("kv_cache_append + paged attention", worst < (1e-4 if dtype == torch.float32 else 0.02),
      f"max err {worst:.3g}")
# A mixed serving step: the sequences add 3, 1 and 2 tokens (a prefill chunk, a decode step,
# speculative rows) packed, and their queries, packed too, attend to their pages causally
# (bottom-right), against SDPA per sequence.
cu = torch.tensor([0, 3, 4, 6], device=dev, dtype=torch.int32)
kn, vn = (torch.randn(6, hkv, d, device=dev, dtype=dtype) for _ in range(2))
fjt.kv_cache_append_packed(kn, vn, cu, kc, vc, table, lens2)
lens3 = lens2 + cu.diff()
qp = torch.randn(6, hq, d, device=dev, dtype=dtype)
got = fjt.attention(qp, kc, vc, cu_seqlens_q=cu, max_seqlen_q=3, page_table=table,
                    seqused_k=lens3, max_seqlen_k=pages_per_seq * page, causal=True)
worst = 0.0
for i in range(b):
    n, lo, hi = int(lens3[i]), int(cu[i]), int(cu[i + 1])
    rows = torch.cat([kc[table[i, j // page], j % page][None] for j in range(n)])
    vals = torch.cat([vc[table[i, j // page], j % page][None] for j in range(n)])
    ok_tail = torch.equal(rows[n - (hi - lo):], kn[lo:hi]) and \
        torch.equal(vals[n - (hi - lo):], vn[lo:hi])
    keep = torch.arange(n, device=dev)[None, :] <= \
        torch.arange(hi - lo, device=dev)[:, None] + n - (hi - lo)
    ref = sdpa(qp[None, lo:hi].transpose(1, 2).double(), rows[None].transpose(1, 2).double(),
               vals[None].transpose(1, 2).double(), attn_mask=keep,
               enable_gqa=True).transpose(1, 2)
    worst = max(worst, (got[None, lo:hi].double() - ref).abs().max().item()) if ok_tail else 1e9
check("packed kv_cache_append + packed queries over the pages",
      worst < (1e-4 if dtype == torch.float32 else 0.02), f"max err {worst:.3g}")
q, k, v = (torch.randn(2, n, 4, 32, device=dev, dtype=dtype) for n in (9, 40, 40))
halves = [fjt.attention(q, k[:, lo:hi], v[:, lo:hi], return_lse=True)
          for lo, hi in ((0, 17), (17, 40))]
merged, merged_lse = fjt.attention_merge([o for o, _ in halves], [l for _, l in halves])
whole, whole_lse = fjt.attention(q, k, v, return_lse=True)
err = max((merged.float() - whole.float()).abs().max().item(),
          (merged_lse - whole_lse).abs().max().item())
check("attention_merge of two key halves", err < (1e-4 if dtype == torch.float32 else 0.02),
      f"max err {err:.3g}")

# Repeated calls of one signature (on CUDA the binding's prepared path: only the data pointers
# change): new tensors and a mod_args of new contents each time, through the direct path and
# the operator (a tensor wanting a gradient), against SDPA with the same mask.
worst = 0.0
for cut, grad in ((5, False), (20, True), (49, False)):
    q, k, v = (torch.randn(1, 50, 4, 32, device=dev, dtype=dtype, requires_grad=grad)
               for _ in range(3))
    got = fjt.attention(q, k, v, mask_mod="k <= iarg[0]",
                        mod_args=torch.tensor([cut], device=dev, dtype=torch.int32))
    keep = (torch.arange(50, device=dev) <= cut).expand(50, 50)
    ref = sdpa(*(x.detach().transpose(1, 2).double() for x in (q, k, v)),
               attn_mask=keep).transpose(1, 2)
    worst = max(worst, (got.double() - ref).abs().max().item())
check("repeated calls of one signature", worst < (1e-4 if dtype == torch.float32 else 0.02),
      f"max err {worst:.3g}")

# On CUDA the C fast path makes out itself (torch.empty_like of q) and reads tensors through
# PyTorch's C shim (see _fastcall.c), where this torch has it: each call's out is a tensor of
# its own, and what the shim reads of tensors of several layouts and dtypes is what their
# attributes say.
if dev == "cuda":
    ctx = fjt.context(dev)
    recent = getattr(ctx._local, "recent", None)
    if recent is None:
        print("SKIP the C fast path's checks: flashjit._fastcall was not built")
    else:
        q, k, v = (torch.randn(1, 50, 4, 32, device=dev, dtype=dtype) for _ in range(3))
        first, second = fjt.attention(q, k, v), fjt.attention(q, k, v)
        check("each call's out a tensor of its own", first.data_ptr() != second.data_ptr() and
              torch.equal(first, second))
        fast = recent["fj_attention_forward"][0]
        base = torch.randn(4, 6, 8, 16, device=dev)
        views = [base, base.transpose(1, 2), base[1:, :, 2:5], base[0, 1],
                 torch.randn(1, 6, 1, 16, device=dev).expand(4, 6, 8, 16),
                 base.to(torch.bfloat16), torch.ones(3, device=dev, dtype=torch.int32),
                 torch.ones(2, 3, device=dev, dtype=torch.bool),
                 base.to(torch.float8_e4m3fn)[:, 2]]
        codes, agree = {}, fast.uses_shim
        for x in views:
            read = fast.shim_read(x)
            agree = agree and read is not None and \
                read[1:] == (tuple(x.shape), x.stride(), 1, x.get_device(), x.data_ptr()) and \
                codes.setdefault(x.dtype, read[0]) == read[0]
        check("torch's C shim read as the tensors' attributes", agree and
              len(set(codes.values())) == len(codes), f"uses_shim {fast.uses_shim}")

# Signatures interleaved (on CUDA the C fast path tries the thread's recent signatures in turn):
# two shapes and a view with other strides, alternating, some on a side stream (PyTorch's
# current stream there), each against SDPA.
worst = 0.0
side = torch.cuda.Stream() if dev == "cuda" else None
for i in range(9):
    b, s, h = ((1, 33, 4), (2, 17, 2))[i % 2]
    q, k, v = (torch.randn(b, s, h, 32, device=dev, dtype=dtype) for _ in range(3))
    if i % 3 == 2:  # a [b, h, s, d] tensor's transposed view: the same shape, other strides
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    if side is not None and i >= 4:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = fjt.attention(q, k, v, causal=True)
        side.synchronize()
    else:
        got = fjt.attention(q, k, v, causal=True)
    ref = sdpa(*(x.transpose(1, 2).double() for x in (q, k, v)), is_causal=True).transpose(1, 2)
    worst = max(worst, (got.double() - ref).abs().max().item())
check("interleaved signatures and streams", worst < (1e-4 if dtype == torch.float32 else 0.02),
      f"max err {worst:.3g}, C fast path: {fjt.context(dev).lib.fastcall is not None}")

# Block classes built once, used by a later call: equal to the call that classifies itself.
q, k, v = (torch.randn(1, 300, h, 32, device=dev, dtype=dtype) for h in (4, 2, 2))
docs = "q / 64 == k / 64 || k < 16"
classes = fjt.create_block_mask(q, k, mask_mod=docs)
diff = (fjt.attention(q, k, v, mask_mod=docs, block_mask=classes).float() -
        fjt.attention(q, k, v, mask_mod=docs).float()).abs().max().item()
check("create_block_mask, then attention with it",
      classes.dtype == torch.int32 and diff <= (1e-6 if dtype == torch.float32 else 0.02),
      f"classes {tuple(classes.shape)}, max diff {diff:.3g}")



def plain_fp8(q, k, v, causal):
    """Attention as a plain FP8 implementation computes it ([b, h, s, d] float64 inputs, the
    dequantised values): P rounded to e4m3 after the row's max is taken out, float32 sums, the
    result rounded to bfloat16 (the FP8 criterion: flashjit's error at most twice this one's)."""
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    p = (s - s.amax(-1, keepdim=True)).exp().float()
    p8 = p.to(torch.float8_e4m3fn).float()
    return ((p8 @ v.float()) / p.sum(-1, keepdim=True)).to(torch.bfloat16)


# FP8 inputs (both formats) with [b, hkv] descale factors, causal GQA: a bfloat16 out against
# float64 SDPA of the dequantised inputs, within twice a plain FP8 implementation's error plus
# bfloat16's rounding (P in FP8 on Hopper's kernel; the SIMT kernel keeps P in float32).
fctx = fjt.context(dev)
for f8 in (torch.float8_e4m3fn, torch.float8_e5m2):
    xs = [torch.randn(2, 50, h, 32, device=dev) for h in (4, 2, 2)]
    factors = [torch.rand(2, 2, device=dev) * 0.05 + 0.02 for _ in range(3)]
    per_head = [f.repeat_interleave(x.shape[2] // 2, 1)[:, None, :, None]
                for x, f in zip(xs, factors)]
    codes = [(x / f).to(f8) for x, f in zip(xs, per_head)]
    q64, k64, v64 = ((c.double() * f.double()).transpose(1, 2) for c, f in zip(codes, per_head))
    ref = sdpa(q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1),
               is_causal=True).transpose(1, 2)
    got = fctx.forward(*codes, causal=True, q_descale=factors[0], k_descale=factors[1],
                       v_descale=factors[2])
    err = (got.double() - ref).abs().max().item()
    plain = plain_fp8(q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1), True)
    plain_err = (plain.double().transpose(1, 2) - ref).abs().max().item()
    check(f"fp8 forward ({f8}, descales [b, hkv])",
          got.dtype == torch.bfloat16 and err <= 2 * plain_err + ref.abs().max().item() / 256,
          f"max error {err:.3g} (plain fp8 {plain_err:.3g}) of {ref.abs().max().item():.3g}")
    # The same keys and values as an FP8 KV cache, read by bfloat16 queries (decode shapes).
    q16 = xs[0][:, -2:].to(torch.bfloat16)
    ref = sdpa(q16.double().transpose(1, 2), k64.repeat_interleave(2, 1),
               v64.repeat_interleave(2, 1)).transpose(1, 2)
    got = fctx.forward(q16, codes[1], codes[2], k_descale=factors[1], v_descale=factors[2])
    err = (got.double() - ref).abs().max().item()
    check(f"fp8 KV cache ({f8}) with bfloat16 queries",
          got.dtype == torch.bfloat16 and err <= ref.abs().max().item() / 128,
          f"max error {err:.3g} of {ref.abs().max().item():.3g}")

    # bfloat16 tokens quantised into that format's paged cache by the append (packed, descale
    # factors [b, hkv] for e4m3 and [hkv] for e5m2, values beyond the format's range
    # saturated), then read by a paged decode with the same factors: the cache's bytes as torch
    # quantises, the attention against float64 SDPA of the dequantised cache.
    b, hkv, d, page, largest = 2, 2, 32, 8, torch.finfo(f8).max
    kc8, vc8 = (torch.zeros(6, page, hkv, d, device=dev).to(f8) for _ in range(2))
    table = torch.tensor([[4, 1, 3], [0, 5, 2]], device=dev, dtype=torch.int32)
    used = torch.tensor([3, 9], device=dev, dtype=torch.int32)
    cu = torch.tensor([0, 5, 7], device=dev, dtype=torch.int32)
    kn, vn = (torch.randn(7, hkv, d, device=dev).mul(100).to(torch.bfloat16) for _ in range(2))
    per_head = f8 == torch.float8_e5m2
    kf, vf = (torch.rand(1 if per_head else b, hkv, device=dev) * 0.5 + 0.1 for _ in range(2))
    kf, vf = kf.expand(b, hkv), vf.expand(b, hkv)  # the factors of each (sequence, kv head)
    given = (kf[0], vf[0]) if per_head else (kf, vf)
    fjt.kv_cache_append_quantized(kn, vn, cu, *given, kc8, vc8, table, used)
    seq = torch.repeat_interleave(torch.arange(b, device=dev), cu.diff())
    ok = True
    for new, f, cache in ((kn, kf, kc8), (vn, vf, vc8)):
        want = (new.float() / f[seq][:, :, None]).clamp(-largest, largest).to(f8)
        pos = used[seq] + torch.arange(7, device=dev) - cu[seq]
        got = cache[table[seq, pos // page], pos % page]
        ok = ok and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    lens = used + cu.diff()
    q1 = torch.randn(b, 1, 4, d, device=dev, dtype=torch.bfloat16)
    got = fctx.forward(q1, kc8, vc8, page_table=table, seqused_k=lens, max_seqlen_k=3 * page,
                       k_descale=given[0], v_descale=given[1])
    err = 0.0
    for i in range(b):
        n = int(lens[i])
        rows = torch.cat([kc8[table[i, j // page], j % page][None] for j in range(n)])
        vals = torch.cat([vc8[table[i, j // page], j % page][None] for j in range(n)])
        k64 = rows.double() * kf[i].double()[:, None]
        v64 = vals.double() * vf[i].double()[:, None]
        ref = sdpa(q1[i:i + 1].double().transpose(1, 2), k64[None].transpose(1, 2),
                   v64[None].transpose(1, 2), enable_gqa=True).transpose(1, 2)
        err = max(err, (got[i:i + 1].double() - ref).abs().max().item() /
                  max(ref.abs().max().item(), 1e-30))
    check(f"bfloat16 tokens quantised into a paged {f8} cache, then read "
          f"(descales {'[hkv]' if per_head else '[b, hkv]'})",
          ok and err <= 1 / 128, f"bytes as torch quantises: {ok}, relative error {err:.3g}")

if dev != "cuda":
    sys.exit(exit_status())

# A paged decode step in a CUDA graph: append one token per sequence, then attend.
b, hq, hkv, d, page, pages_per_seq = 4, 16, 4, 128, 16, 8
kc = torch.randn(b * pages_per_seq, page, hkv, d, device=dev, dtype=torch.bfloat16)
vc = torch.randn_like(kc)
table = torch.randperm(b * pages_per_seq, device=dev, dtype=torch.int32).view(b, -1)
used = torch.tensor([5, 40, 77, 100], device=dev, dtype=torch.int32)
q1 = torch.randn(b, 1, hq, d, device=dev, dtype=torch.bfloat16)
kn, vn = (torch.randn(b, 1, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2))


def step():
    fjt.kv_cache_append(kn, vn, kc, vc, table, used)
    return fjt.attention(q1, kc, vc, page_table=table, seqused_k=used + 1,
                         max_seqlen_k=pages_per_seq * page)


def replayed(fn):
    """fn's result when captured in a CUDA graph (after a warm-up on the capture stream) and
    replayed, from the cache's first contents."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):  # the stream whose workspace the warm-up sized
        got = fn()
    kc.copy_(kc0)
    vc.copy_(vc0)
    graph.replay()
    torch.cuda.synchronize()
    return got


kc0, vc0 = kc.clone(), vc.clone()
want = step()
for label, fn in (("", step), ("torch.compile(fullgraph=True)'d ", torch.compile(
        step, fullgraph=True))):
    kc.copy_(kc0)
    vc.copy_(vc0)
    try:
        got = replayed(fn)
        check(f"CUDA graph of a {label}paged decode step", torch.equal(got, want),
              f"max diff {(got.float() - want.float()).abs().max().item():.3g}")
    except Exception as e:  # noqa: BLE001 - reported as the failure
        check(f"CUDA graph of a {label}paged decode step", False, f"{type(e).__name__}: {e}")

# Host time of a Python call (decode shape), median of 2000 calls.
ctx = fjt.context(q1.device)
out1 = torch.empty_like(q1)
for label, fn in (("attention", lambda: fjt.attention(q1, kc, vc, page_table=table,
                                                      seqused_k=used, max_seqlen_k=128)),
                  ("Context.forward", lambda: ctx.forward(
                      q1, kc, vc, page_table=table, seqused_k=used, max_seqlen_k=128)),
                  ("Context.forward, out given", lambda: ctx.forward(
                      q1, kc, vc, out=out1, page_table=table, seqused_k=used,
                      max_seqlen_k=128))):
    fn()
    times = []
    for _ in range(2000):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    times.sort()
    print(f"host time of flashjit.torch {label}: median {1e6 * times[1000]:.1f} us, "
          f"p10 {1e6 * times[200]:.1f} us")
sys.exit(exit_status())
