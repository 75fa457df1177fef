"""MLA decode (DeepSeek's latent attention, FlashMLA's shape): q [b, sq, hq, 576] against one
latent kv head of 576 whose first 512 dims are also v (v a view of k), bf16, paged by --page
(shuffled pages) and contiguous. No PyTorch backend takes these head dims, so the figures are
absolute: bytes of the cache, Q and O moved per second against the read bandwidth of a large sum
(the memory-bound bar), and TFLOP/s (2 * b * hq * sq * sk * (576 + 512), the compute-bound bar).
Every shape is checked against a float32 reference first.

Usage: python3 bench/bench_mla.py [--lib build/libflashjit.so] [--b 1,32,64] [--sk 8192,32768]
       [--hq 16,128] [--sq 1,2] [--page 64] [--splits 0] [--out DIR]"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from common import (  # noqa: E402
    add_timing_args, read_bandwidth, save_results, start, time_ms, to_pages,
)

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--b", default="1,32,64")
ap.add_argument("--sk", default="8192,32768")
ap.add_argument("--hq", default="16,128")
ap.add_argument("--sq", default="1,2")
ap.add_argument("--page", type=int, default=64, help="page size (0: contiguous only)")
ap.add_argument("--splits", type=int, default=0, help="desc.num_splits (0: the plan's)")
add_timing_args(ap)
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()

dev = "cuda"
D, DV = 576, 512
ctx = start(args.lib)


def reference(q, k, causal):
    """float32 attention of q [b, sq, hq, D] over k [b, sk, 1, D], v = k's first DV dims, scale
    1 / sqrt(D); the heads folded into rows (one kv head), so nothing is broadcast."""
    b, sq, hq, _ = q.shape
    sk = k.shape[1]
    qf = q.float().permute(0, 2, 1, 3).reshape(b, hq * sq, D)
    kf = k.float()[:, :, 0]
    s = torch.bmm(qf, kf.transpose(1, 2)) / D**0.5
    if causal:  # bottom-right: query row i sees keys up to sk - sq + i
        i = torch.arange(hq * sq, device=dev) % sq
        s.masked_fill_(torch.arange(sk, device=dev)[None, :] > (i + sk - sq)[:, None], float("-inf"))
    o = torch.bmm(torch.softmax(s, dim=-1), kf[..., :DV])
    return o.view(b, hq, sq, DV).transpose(1, 2)


ceiling = read_bandwidth(args.timing, args.reps)
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"flashjit {ctx.lib.fj_version().decode()}; read ceiling {ceiling:.0f} GB/s", flush=True)
print(f"{'b':>4} {'sk':>6} {'hq':>4} {'sq':>2} {'page':>4} | {'GB/s':>6} {'% ceil':>6} "
      f"{'TFLOP/s':>7} | {'us':>8} {'maxdiff':>8} path", flush=True)
rows = []
for hq in [int(x) for x in args.hq.split(",")]:
    for sq in [int(x) for x in args.sq.split(",")]:
        for b in [int(x) for x in args.b.split(",")]:
            for sk in [int(x) for x in args.sk.split(",")]:
                q = torch.randn(b, sq, hq, D, device=dev, dtype=torch.bfloat16)
                k = torch.randn(b, sk, 1, D, device=dev, dtype=torch.bfloat16)
                causal = sq > 1
                ref = reference(q, k, causal)
                moved = b * sk * D * 2 + q.numel() * 2 + b * sq * hq * DV * 2
                flops = 2 * b * hq * sq * sk * (D + DV)
                layouts = [(0, k, {})]
                if args.page:
                    pages = -(-sk // args.page)
                    perm = torch.randperm(b * pages, device=dev, dtype=torch.int32)
                    kp = to_pages(k, args.page, perm)
                    used = torch.full((b,), sk, device=dev, dtype=torch.int32)
                    layouts.append((args.page, kp, dict(page_table=perm.view(b, pages),
                                                        seqused_k=used, max_seqlen_k=sk)))
                for page, kk, extra in layouts:
                    out = torch.empty(b, sq, hq, DV, device=dev, dtype=torch.bfloat16)
                    fn = lambda: ctx.forward(q, kk, kk[..., :DV], out=out,  # noqa: E731
                                             causal=causal, num_splits=args.splits, **extra)
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    path = ctx.last_call()["kernel_path"]
                    diff = (out.float() - ref).abs().max().item()
                    ms = time_ms(fn, args.timing, args.reps)
                    r = dict(b=b, sk=sk, hq=hq, sq=sq, page=page, path=path, maxdiff=diff,
                             ms=ms, gbs=moved / ms / 1e6, tflops=flops / ms / 1e9)
                    print(f"{b:4d} {sk:6d} {hq:4d} {sq:2d} {page:4d} | {r['gbs']:6.0f} "
                          f"{100 * r['gbs'] / ceiling:6.1f} {r['tflops']:7.1f} | "
                          f"{1000 * ms:8.1f} {diff:8.2g} {path}", flush=True)
                    rows.append(r)
                del q, k, ref, layouts
                torch.cuda.empty_cache()
save_results(args.out, "bench_mla", dict(ceiling_gbs=ceiling, rows=rows))
