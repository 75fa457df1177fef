"""Head dims beyond 256: flashjit's d 512 and MLA's 576 / 512 against its own d 256 at the same
length (b * s = 16384 tokens, hidden 2048 for the grid's heads), bf16, and MLA prefill (one
kv head of 576 whose first 512 dims are v, hq query heads). TFLOP/s count both products:
2 * b * hq * sq * sk * (d + dv), halved when causal. PyTorch's memory-efficient SDPA, the
one peer that takes these dims, is timed beside it where it runs.

MLA prefill runs on the plan's kernel (on sm_90a the seesaw decode kernel) and on the forward
kernel (a context made with FLASHJIT_CONFIG=path=wgmma), with the keys contiguous and in pages.

Usage: python3 bench/bench_wide.py [--lib build/libflashjit.so] [--dims 256,512,576/512]
       [--s 2048,4096,8192,16384] [--causal 0,1] [--mla-heads 16,64,128] [--mla-pages 0,64]
       [--out DIR]
Prints one line per point and writes bench_wide.json into --out (default $OUT or .)."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashjit  # noqa: E402
from common import (add_timing_args, grid_shape, save_results, start, time_ms,  # noqa: E402
                    to_pages)

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--dims", default="256,512,576/512", help="d or d/dv, commas")
ap.add_argument("--s", default="2048,4096,8192,16384")
ap.add_argument("--causal", default="0,1")
ap.add_argument("--mla-heads", default="16,64,128", help="MLA prefill at 8k, b 2 (empty: none)")
ap.add_argument("--mla-pages", default="0,64",
                help="MLA prefill's key layouts: 0 contiguous, N pages of N keys (shuffled)")
add_timing_args(ap)
ap.add_argument("--peers", type=int, default=1, help="0: time flashjit only")
ap.add_argument("--tag", default="", help="a label printed on every line (e.g. the config)")
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()

dev = "cuda"
ctx = start(args.lib)
# The forward kernel, for MLA prefill: the plan runs it on the seesaw decode kernel (sm_90a).
os.environ["FLASHJIT_CONFIG"] = "path=wgmma"  # read when a context is made
forward_ctx = flashjit.Context(backend="cuda", lib=args.lib, cache_path=":memory:")
del os.environ["FLASHJIT_CONFIG"]


def tflops(b, h, sq, sk, d, dv, causal, ms):
    return 2 * b * h * sq * sk * (d + dv) / (2 if causal else 1) / ms / 1e9


def measure(name, b, s, hq, hkv, d, dv, causal, mla=False, page=0, c=ctx):
    """One point: flashjit's TFLOP/s (on context c; MLA's cache in pages of `page` keys), its
    largest difference from SDPA's math in float32 on a slice of the heads, and the
    memory-efficient SDPA's TFLOP/s where it runs."""
    q = torch.randn(b, s, hq, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(b, s, hkv, d, device=dev, dtype=torch.bfloat16)
    v = k[..., :dv] if mla else torch.randn(b, s, hkv, dv, device=dev, dtype=torch.bfloat16)
    out = torch.empty(b, s, hq, dv, device=dev, dtype=torch.bfloat16)
    kk, extra = k, {}
    if page:
        pages = -(-s // page)
        perm = torch.randperm(b * pages, device=dev, dtype=torch.int32)
        kk = to_pages(k, page, perm)
        extra = dict(page_table=perm.view(b, pages), max_seqlen_k=s,
                     seqused_k=torch.full((b,), s, device=dev, dtype=torch.int32))
    vv = kk[..., :dv] if mla else v
    fj = lambda: c.forward(q, kk, vv, out=out, causal=causal, **extra)  # noqa: E731
    fj()
    info = c.last_call()
    # A check on the first query head (and the kv head it reads), rows of the first batch.
    rows = min(s, 2048)
    qt = q[:1, -rows:, :1].transpose(1, 2).float()
    kt, vt = (x[:1, :, :1].transpose(1, 2).float() for x in (k, v))
    scores = qt @ kt.transpose(-1, -2) * d ** -0.5
    if causal:
        keep = torch.ones(rows, s, device=dev, dtype=torch.bool).tril(s - rows)
        scores = scores.masked_fill(~keep, float("-inf"))
    ref = (scores.softmax(-1) @ vt).transpose(1, 2)
    torch.cuda.synchronize()
    diff = (out[:1, -rows:, :1].float() - ref).abs().max().item()
    ms = time_ms(fj, args.timing, args.reps)
    row = dict(case=name, b=b, s=s, hq=hq, hkv=hkv, d=d, dv=dv, causal=causal, page=page,
               maxdiff=diff,
               path=info["kernel_path"], registers=info["registers"],
               spill_bytes=info["spill_bytes"], flashjit=tflops(b, hq, s, s, d, dv, causal, ms))
    row["efficient"] = float("nan")
    if args.peers and c is ctx and not page:
        try:
            qs, ks, vs = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                fn = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal,  # noqa: E731
                                                            enable_gqa=hq != hkv)
                fn()
                row["efficient"] = tflops(b, hq, s, s, d, dv, causal, time_ms(fn, args.timing, args.reps))
        except RuntimeError:
            pass
    del q, k, v, out
    return row


print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"flashjit {ctx.lib.fj_version().decode()}", flush=True)
print(f"{'case':>10} {'causal':>6} {'s':>6} {'b':>3} {'hq':>3} {'hkv':>3} | {'flashjit':>8} "
      f"{'x d256':>6} {'effic.':>6} | {'maxdiff':>8} path", flush=True)
rows, own256 = [], {}


def report(row, base=None):
    """Prints and keeps row; its ratio is to base, else to d 256 at its length and mask."""
    rows.append(row)
    base = base or own256.get((row["causal"], row["s"]))
    ratio = row["flashjit"] / base if base else float("nan")
    row["x_d256"] = ratio
    print(f"{row['case']:>10} {int(row['causal']):6d} {row['s']:6d} {row['b']:3d} {row['hq']:3d} "
          f"{row['hkv']:3d} | {row['flashjit']:8.1f} {ratio:6.2f} {row['efficient']:6.1f} | "
          f"{row['maxdiff']:8.4f} {row['path']} r{row['registers']} s{row['spill_bytes']} "
          f"{args.tag}", flush=True)


for spec in [x for x in args.dims.split(",") if x]:
    d, dv = (int(x) for x in spec.split("/")) if "/" in spec else (int(spec), int(spec))
    for causal in [bool(int(x)) for x in args.causal.split(",")]:
        for s in [int(x) for x in args.s.split(",")]:
            b, h = grid_shape(s, d)
            row = measure(spec, b, s, h, h, d, dv, causal)
            if d == dv == 256:
                own256[(causal, s)] = row["flashjit"]
            report(row)
# MLA prefill on the forward kernel and on the plan's, contiguous and paged; the plan's "x d256"
# is its ratio to the forward kernel's on the same layout.
for hq in [int(x) for x in args.mla_heads.split(",") if x]:
    for causal in [bool(int(x)) for x in args.causal.split(",")]:
        for page in [int(x) for x in args.mla_pages.split(",") if x]:
            name = f"mla h{hq}" + (f" p{page}" if page else "")
            fwd = measure(name + " fwd", 2, 8192, hq, 1, 576, 512, causal, True, page, forward_ctx)
            report(fwd)
            report(measure(name, 2, 8192, hq, 1, 576, 512, causal, True, page), fwd["flashjit"])

save_results(args.out, f"bench_wide{'_' + args.tag if args.tag else ''}",
             dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows))
