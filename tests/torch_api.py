"""flashjit.torch on a CUDA device against PyTorch: the SDPA drop-in's outputs and autograd
gradients against float64 SDPA (bf16: within twice the error of bf16 SDPA plus rounding), GQA,
masks, top-left causal for sq != sk; torch.compile(fullgraph=True) of a block using it against
eager; a paged decode step (kv_cache_append + attention) captured in a CUDA graph and replayed
against eager; the host time of a Python call (printed, not asserted). Exits 77 without torch
or a CUDA device. Usage: python tests/torch_api.py  (flashjit importable: installed, or
PYTHONPATH=python with FLASHJIT_LIB)"""
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: no torch")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: no CUDA device")
    sys.exit(77)
import flashjit.torch as fjt  # noqa: E402

torch.manual_seed(0)
dev = "cuda"
failures = 0


def check(name, ok, detail=""):
    global failures
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)


def sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, **kw)


def within(name, got, ref64, plain):
    err = (got.double() - ref64).abs().max().item()
    plain_err = (plain.double() - ref64).abs().max().item()
    atol = 2 * torch.finfo(got.dtype).eps * ref64.abs().max().item()
    check(name, err <= 2 * plain_err + atol, f"err {err:.3g}, plain {plain_err:.3g}")


# Drop-in forward and gradients.
for (b, hq, hkv, sq, sk, d), kw in [((2, 8, 8, 300, 300, 64), dict(is_causal=True)),
                                    ((2, 8, 2, 200, 333, 128), dict(enable_gqa=True)),
                                    ((1, 4, 4, 100, 260, 64), dict(is_causal=True)),
                                    ((2, 4, 4, 128, 128, 64), dict(attn_mask="bool")),
                                    ((2, 4, 4, 96, 160, 64), dict(attn_mask="float"))]:
    q = torch.randn(b, hq, sq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, sk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, sk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    kw = dict(kw)
    if kw.get("attn_mask") == "bool":
        kw["attn_mask"] = torch.rand(b, 1, sq, sk, device=dev) > 0.3
        kw["attn_mask"][..., 0] = True
    elif kw.get("attn_mask") == "float":
        kw["attn_mask"] = torch.randn(1, hq, sq, sk, device=dev, dtype=torch.bfloat16)
    name = f"sdpa b{b} hq{hq} hkv{hkv} sq{sq} sk{sk} d{d} " + \
        ",".join(f"{n}" for n in kw)
    g = torch.randn(b, hq, sq, d, device=dev, dtype=torch.bfloat16)
    out = fjt.scaled_dot_product_attention(q, k, v, **kw)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    plain = sdpa(q, k, v, **kw)
    pq, pk, pv = torch.autograd.grad(plain, (q, k, v), g)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    kw64 = {n: (x.double() if torch.is_tensor(x) and x.is_floating_point() else x)
            for n, x in kw.items()}
    ref = sdpa(q64, k64, v64, **kw64)
    rq, rk, rv = torch.autograd.grad(ref, (q64, k64, v64), g.double())
    within(name + " out", out, ref, plain)
    for n, got, r, p in (("dq", dq, rq, pq), ("dk", dk, rk, pk), ("dv", dv, rv, pv)):
        within(f"{name} {n}", got, r, p)

# torch.compile(fullgraph=True) of a block against eager.
class Block(torch.nn.Module):
    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, dtype=torch.bfloat16, device=dev)
        self.proj = torch.nn.Linear(dim, dim, dtype=torch.bfloat16, device=dev)

    def forward(self, x):
        b, s, dim = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, dim // self.heads).unbind(2)
        o = fjt.attention(q, k, v, causal=True)
        return self.proj(o.reshape(b, s, dim))


block = Block()
x = torch.randn(2, 200, 256, device=dev, dtype=torch.bfloat16)
eager = block(x)
try:
    compiled = torch.compile(block, fullgraph=True)(x)
    diff = (compiled.float() - eager.float()).abs().max().item()
    check("torch.compile(fullgraph=True) block", diff <= 0.05, f"max diff {diff:.3g}")
except Exception as e:  # noqa: BLE001 - reported as the failure
    check("torch.compile(fullgraph=True) block", False, f"{type(e).__name__}: {e}")

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


kc0, vc0 = kc.clone(), vc.clone()
want = step()
torch.cuda.synchronize()
kc.copy_(kc0)
vc.copy_(vc0)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    step()  # warm-up on the capture stream
torch.cuda.current_stream().wait_stream(s)
kc.copy_(kc0)
vc.copy_(vc0)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    got = step()
kc.copy_(kc0)
vc.copy_(vc0)
graph.replay()
torch.cuda.synchronize()
check("CUDA graph of a paged decode step", torch.equal(got, want),
      f"max diff {(got.float() - want.float()).abs().max().item():.3g}")

# Host time of a Python call (decode shape), median of 2000 calls.
for label, fn in (("attention", lambda: fjt.attention(q1, kc, vc, page_table=table,
                                                      seqused_k=used, max_seqlen_k=128)),
                  ("Context.forward", lambda: fjt.context(q1.device).forward(
                      q1, kc, vc, page_table=table, seqused_k=used, max_seqlen_k=128))):
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
sys.exit(1 if failures else 0)
