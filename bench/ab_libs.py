"""A/B of builds of the library in one process: the forward grid, masks, packed sequences,
decode (d 128 and MLA's 576 / 512, contiguous and paged), MLA's prefill, head dims beyond 256
(`wide`: 512 / 512 and 576 / 512 with v its own tensor, beside d 256), chunks of prefill
against pages and the backward (`bwd`: the grid's shapes, from one forward's out and lse;
--deterministic for that mode), each case timed for every library in turn, forwards then
backwards (A, B, ..., B, A), with the steady-state timing of bench/common.py, so that drift and
noise show; cuDNN once per grid point as the reference of the same run. Before timing, the
libraries' outputs are compared with the first's (a sanity check; the tests check numerics).
One library alone gives its figures beside cuDNN's.

Usage: python3 bench/ab_libs.py --libs old/libflashjit.so,build/libflashjit.so
       [--names main,new]
       [--cases grid,masks,varlen,decode,mla_prefill,wide,paged_prefill,bwd] [--d 64,128,256]
       [--s 512,...,16384]
       [--rounds 1] [--pages shuffled,ordered] [--envs ';FLASHJIT_BWD_CONFIG=stages=3']
       [--out DIR]
Prints one line per case: TFLOP/s of each timing, each library's mean over the first's, and
the spread of the first's own timings; writes ab_libs.json into --out. TFLOP/s count 4 * d per
query/key pair of the whole square, halved where the mask is causal-like (k <= q): a fixed
count per case, so that the ratio is of times. Decode cases report TB/s of the cache (K and V,
or MLA's one latent cache) in the same column."""
import argparse
import os
import random
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashjit  # noqa: E402
from common import grid_shape, heat, save_results, sustained_ms, tflops, to_pages  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--libs", required=True, help="comma-separated; the first is the reference")
ap.add_argument("--names", default=None)
ap.add_argument("--rounds", type=int, default=1, help="forward-and-back passes over the libraries")
ap.add_argument("--cases", default="grid,masks,varlen")
ap.add_argument("--only", default=None, help="run only the cases whose label contains one of these (comma-separated)")
ap.add_argument("--d", default="64,128,256")
ap.add_argument("--s", default="512,1024,2048,4096,8192,16384")
ap.add_argument("--causal", default="0,1")
ap.add_argument("--warm", type=float, default=0.6, help="seconds of warm-up per timing")
ap.add_argument("--windows", type=int, default=5, help="timed windows of ~0.1 s per timing")
ap.add_argument("--deterministic", type=int, default=0, help="bwd: the deterministic plans")
ap.add_argument("--pages", default="shuffled",
                help="decode's paged copies: shuffled, ordered (page i of sequence b is page "
                     "b * pages_per_seq + i), or both (comma-separated)")
ap.add_argument("--envs", default=None,
                help="';'-separated, one per library: VAR=VALUE settings (space-separated, "
                     "empty: none) made while its context is made, e.g. "
                     "';FLASHJIT_BWD_CONFIG=stages=3', or ';FLASHJIT_TEMPLATE_DIR=dir' to time "
                     "a template copy against the built-in templates (a library may repeat)")
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()
libs = args.libs.split(",")
names = args.names.split(",") if args.names else [chr(ord("A") + i) for i in range(len(libs))]
envs = args.envs.split(";") if args.envs is not None else [""] * len(libs)
if len(envs) != len(libs):
    sys.exit("--envs: one entry per library (%d), got %d" % (len(libs), len(envs)))


def make_context(lib, env):
    """A context of lib, made with env ("VAR=VALUE ...", space-separated, or empty) in the
    environment, which the library reads when a context is made."""
    settings = [x.split("=", 1) for x in env.split()]
    saved = {var: os.environ.get(var) for var, _ in settings}
    os.environ.update(dict(settings))
    try:
        return flashjit.Context(backend="cuda", lib=lib)
    finally:
        for var, value in saved.items():
            if value is None:
                del os.environ[var]
            else:
                os.environ[var] = value


contexts = [make_context(lib, env) for lib, env in zip(libs, envs)]
results = []


def fmt(x):
    """A figure in six columns: TFLOP/s to a tenth, TB/s (below 10) to a thousandth."""
    return f"{x:6.1f}" if x >= 10 else f"{x:6.3f}"


def time_ms(fn):
    return sustained_ms(fn, warm_s=args.warm, windows=args.windows)


def snapshot(result):
    """A copy of a call's result (a tensor, or a tuple of them: the backward's) as one f32
    vector: the calls of all libraries write the same output tensors."""
    parts = result if isinstance(result, tuple) else (result,)
    return torch.cat([t.float().flatten() for t in parts])


def ab(label, flop, make_call, peer=None):
    """Times make_call(ctx)() for every context, forwards then backwards; flop counts one call."""
    if args.only and not any(x in label for x in args.only.split(",")):
        return
    calls = [make_call(ctx) for ctx in contexts]
    outs = [snapshot(c()) for c in calls]
    torch.cuda.synchronize()
    diff = max([(o - outs[0]).abs().max().item() for o in outs[1:]], default=0.0)
    n = len(calls)
    t = {i: [] for i in range(n)}
    for i in (list(range(n)) + list(range(n - 1, -1, -1))) * args.rounds:
        t[i].append(flop / time_ms(calls[i]) / 1e9)
    ref = flop / time_ms(peer) / 1e9 if peer else None
    mean = [sum(t[i]) / len(t[i]) for i in range(n)]
    spread = (max(t[0]) - min(t[0])) / mean[0]
    line = f"{label:<34}"
    for i in range(n):
        line += f" {names[i]} " + " ".join(fmt(x) for x in t[i])
    line += "  " + " ".join(f"{names[i]}/{names[0]} {mean[i] / mean[0]:.3f}" for i in range(1, n))
    line += f"  spread {spread:.3f}"
    if ref:
        line += f"  cuDNN {fmt(ref)} ({mean[-1] / ref:.2f})"
    print(line + f"  maxdiff {diff:.1e}", flush=True)
    results.append(dict(case=label, times=[t[i] for i in range(n)],
                        ratios=[mean[i] / mean[0] for i in range(n)], spread=spread, cudnn=ref,
                        maxdiff=diff))


torch.manual_seed(0)
heat()
cases = args.cases.split(",")
if "grid" in cases:
    for d in [int(x) for x in args.d.split(",")]:
        for causal in [bool(int(x)) for x in args.causal.split(",")]:
            for s in [int(x) for x in args.s.split(",")]:
                b, h = grid_shape(s, d)
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                out = torch.empty_like(q)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def cudnn():
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

                ab(f"grid d {d} causal {int(causal)} s {s}", tflops(b, h, s, d, causal, 1) * 1e9,
                   lambda ctx: (lambda: ctx.forward(q, k, v, out=out, causal=causal)), cudnn)
                del q, k, v, out

if "masks" in cases:
    s, d, h, b = 8192, 128, 16, 2
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    qi = torch.arange(s, device="cuda")
    docs = torch.tensor([0, 1500, 4000, 5200, s], device="cuda", dtype=torch.int32)
    exprs = {"causal as mask_mod": ("k <= q", None),
             "window 1024": ("k <= q && q - k < 1024", None),
             "4 documents (iarg)": ("(iarg[1] <= q) + (iarg[2] <= q) + (iarg[3] <= q) == "
                                    "(iarg[1] <= k) + (iarg[2] <= k) + (iarg[3] <= k)", docs),
             "prefix-LM 1k": ("k < 1024 || k <= q", None)}
    for label, (expr, mod_args) in exprs.items():
        ab(f"masks {label}", 4 * d * h * b * s * s / (2 if "k <= q" in expr else 1),
           lambda ctx, e=expr, m=mod_args: (lambda: ctx.forward(q, k, v, out=out, mask_mod=e,
                                                                mod_args=m)))
    bias = torch.randn(1, h, s, s, device="cuda", dtype=torch.bfloat16)
    ab("masks dense bias [1, h, s, s]", 4 * d * h * b * s * s,
       lambda ctx: (lambda: ctx.forward(q, k, v, out=out, bias=bias)))
    del bias
    # Causal as FlashMask ranges: key j is hidden from rows [0, j).
    ranges = torch.stack([torch.zeros_like(qi), qi], dim=-1).to(torch.int32).view(1, 1, s, 2)
    ab("masks ranges (causal as FlashMask)", 4 * d * h * b * s * s / 2,
       lambda ctx: (lambda: ctx.forward(q, k, v, out=out, mask_ranges=ranges)))
    del q, k, v, out

if "varlen" in cases:
    h, d, tokens = 16, 128, 32768
    rng = random.Random(0)
    for label, lens in (("16 x 2048", [2048] * 16),
                        ("random 128-8k", None)):
        if lens is None:
            lens, left = [], tokens
            while left > 128:
                n = min(left, rng.randint(128, 8192))
                lens.append(n)
                left -= n
        total = sum(lens)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
        q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        for causal in (False, True):
            flop = sum(4 * d * h * n * n / (2 if causal else 1) for n in lens)
            ab(f"varlen {label} causal {int(causal)}", flop,
               lambda ctx, c=causal: (lambda: ctx.forward(
                   q, k, v, out=out, causal=c, cu_seqlens_q=cu, cu_seqlens_k=cu,
                   max_seqlen_q=max(lens), max_seqlen_k=max(lens))))
        del q, k, v, out

if "decode" in cases:
    # One query row; GQA 32 / 8 at d 128, and MLA (576 / 512, v a view of k) at 16 and 128
    # heads; the paged copies in shuffled pages of 64 (seqused_k: every key).
    for label, b, sk, hq, hkv, d, dv in (("d 128 b 1 x 8k", 1, 8192, 32, 8, 128, 128),
                                         ("d 128 b 1 x 32k", 1, 32768, 32, 8, 128, 128),
                                         ("d 128 b 1 x 128k", 1, 131072, 32, 8, 128, 128),
                                         ("d 128 b 8 x 32k", 8, 32768, 32, 8, 128, 128),
                                         ("d 128 b 32 x 32k", 32, 32768, 32, 8, 128, 128),
                                         ("d 128 b 128 x 8k", 128, 8192, 32, 8, 128, 128),
                                         ("d 128 b 128 x 32k", 128, 32768, 32, 8, 128, 128),
                                         ("MLA hq 16 b 1 x 8k", 1, 8192, 16, 1, 576, 512),
                                         ("MLA hq 16 b 64 x 32k", 64, 32768, 16, 1, 576, 512),
                                         ("MLA hq 128 b 1 x 8k", 1, 8192, 128, 1, 576, 512),
                                         ("MLA hq 128 b 64 x 8k", 64, 8192, 128, 1, 576, 512),
                                         ("MLA hq 128 b 64 x 32k", 64, 32768, 128, 1, 576, 512)):
        q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = k[..., :dv] if dv < d else torch.randn_like(k)
        out = torch.empty(b, 1, hq, dv, device="cuda", dtype=torch.bfloat16)
        cache_bytes = k.numel() * 2 + (0 if dv < d else v.numel() * 2)
        cudnn = None
        if dv == d:  # SDPA takes no 576 / 512 heads
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        ab(f"decode {label} dense (TB/s)", cache_bytes,
           lambda ctx: (lambda: ctx.forward(q, k, v, out=out)), cudnn)
        page = 64
        used = torch.full((b,), sk, device="cuda", dtype=torch.int32)
        for order in args.pages.split(","):
            perm = (torch.randperm(b * (sk // page), device="cuda", dtype=torch.int32)
                    if order == "shuffled" else
                    torch.arange(b * (sk // page), device="cuda", dtype=torch.int32))
            kp = to_pages(k, page, perm)
            vp = kp[..., :dv] if dv < d else to_pages(v, page, perm)
            table = perm.view(b, -1)
            ab(f"decode {label} page 64{'' if order == 'shuffled' else ' ' + order} (TB/s)",
               cache_bytes,
               lambda ctx: (lambda: ctx.forward(q, kp, vp, out=out, page_table=table,
                                                seqused_k=used, max_seqlen_k=sk)))
            del kp, vp
        del q, k, v, out
        qt = kt = vt = cudnn = None

if "mla_prefill" in cases:
    # MLA's prefill (576 / 512, v a view of k, one kv head) at 8k, b 2: on sm_90a the seesaw
    # decode kernel; TFLOP/s count both products, 2 * (d + dv) per pair, halved when causal.
    b, s, d, dv = 2, 8192, 576, 512
    for hq in (16, 128):
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, 1, d, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(b, s, hq, dv, device="cuda", dtype=torch.bfloat16)
        for causal in [bool(int(x)) for x in args.causal.split(",")]:
            ab(f"mla prefill hq {hq} causal {int(causal)} 8k",
               2 * b * hq * s * s * (d + dv) / (2 if causal else 1),
               lambda ctx, c=causal: (lambda: ctx.forward(q, k, k[..., :dv], out=out, causal=c)))
        del q, k, out

if "wide" in cases:
    # Head dims beyond 256, v its own tensor (bench/bench_wide.py's shapes: b * s = 16k,
    # h = 2048 / d), and d 256 for flashjit's own reference; TFLOP/s count both products,
    # 2 * (d + dv) per pair, halved when causal.
    for d, dv in ((256, 256), (512, 512), (576, 512)):
        for s in (4096, 16384):
            b, h = grid_shape(s, d)
            q, k = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            v = torch.randn(b, s, h, dv, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(b, s, h, dv, device="cuda", dtype=torch.bfloat16)
            for causal in [bool(int(x)) for x in args.causal.split(",")]:
                ab(f"wide {d} / {dv} causal {int(causal)} s {s}",
                   2 * b * h * s * s * (d + dv) / (2 if causal else 1),
                   lambda ctx, c=causal: (lambda: ctx.forward(q, k, v, out=out, causal=c)))
            del q, k, v, out

if "paged_prefill" in cases:
    # Chunks of prefill against a paged cache (causal, bottom-right: the chunk's rows are the
    # cache's last), GQA 32 / 8 at d 128, b 4 x 8k keys in shuffled pages of 8 to 128, and the
    # same keys contiguous; on sm_90a Hopper's forward kernel. TFLOP/s count 4 * d per kept pair.
    b, sk, hq, hkv, d = 4, 8192, 32, 8, 128
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    used = torch.full((b,), sk, device="cuda", dtype=torch.int32)
    qs = {sq: torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16) for sq in (512, 2048)}
    for page in (0, 8, 16, 32, 64, 128):
        if page:
            perm = torch.randperm(b * (sk // page), device="cuda", dtype=torch.int32)
            kp, vp, table = to_pages(k, page, perm), to_pages(v, page, perm), perm.view(b, -1)
            paging = dict(page_table=table, seqused_k=used, max_seqlen_k=sk)
        else:
            kp, vp, paging = k, v, {}
        for sq, q in qs.items():
            out = torch.empty_like(q)
            pairs = sq * (sk - sq) + sq * (sq + 1) // 2
            ab(f"paged prefill {sq} x 8k page {page or 'none'}", 4 * d * b * hq * pairs,
               lambda ctx, q=q, out=out, kp=kp, vp=vp, paging=paging: (lambda: ctx.forward(
                   q, kp, vp, out=out, causal=True, **paging)))
        del kp, vp
    del k, v, qs

if "bwd" in cases:
    for d in [int(x) for x in args.d.split(",")]:
        for causal in [bool(int(x)) for x in args.causal.split(",")]:
            for s in [int(x) for x in args.s.split(",")]:
                b, h = grid_shape(s, d)
                q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                                 for _ in range(4))
                out = torch.empty_like(q)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                contexts[0].forward(q, k, v, out=out, lse=lse, causal=causal)
                dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
                qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

                def cudnn(o=o):
                    return torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2),
                                               retain_graph=True)

                det = bool(args.deterministic)
                ab(f"bwd d {d} causal {int(causal)} s {s}{' det' if det else ''}",
                   2.5 * tflops(b, h, s, d, causal, 1) * 1e9,
                   lambda ctx: (lambda: ctx.backward(q, k, v, out, dout, lse, dq=dq, dk=dk, dv=dv,
                                                     causal=causal, deterministic=det)), cudnn)
                del q, k, v, dout, out, lse, dq, dk, dv, qt, kt, vt, o

for i in range(1, len(libs)):
    ratios = [r["ratios"][i] for r in results]
    print(f"{len(results)} cases: {names[i]}/{names[0]} from {min(ratios):.3f} to "
          f"{max(ratios):.3f}, median {sorted(ratios)[len(ratios) // 2]:.3f}")
print(f"{names[0]}'s own spread up to {max(r['spread'] for r in results):.3f}")
save_results(args.out, "ab_libs", dict(names=names, libs=libs, results=results))
