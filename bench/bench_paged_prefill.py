"""Chunks of prefill against a paged KV cache: flashjit's plan (on sm_90a Hopper's forward beyond
16 rows) and the decode kernels (a context made with FLASHJIT_CONFIG=path=decode) on the same
pages, flashjit's forward on the same keys contiguous, and PyTorch's SDPA (cuDNN, FA2 "flash";
they take no pages) on the contiguous keys, in one process. TFLOP/s count the visible pairs
(causal: bottom-right, each chunk the last rows of its sequence, as a serving engine's prefill
continues a cached prompt; SDPA's is_causal is top-left, so its causal figures use FA2 with
torch's causal_lower_right bias and cuDNN is timed non-causal only).

--mixed also times a serving engine's mixed batch: one chunk of --sq rows and b - 1 sequences
of one decode row each, queries packed (cu_seqlens_q), all against pages of sk keys: the plan
(which, by the chunk's rows, sends the whole batch to the forward) against the decode kernels.

Shapes: bf16, hq 32 / hkv 8, d 128 by default; batch x chunk rows x cached keys over --b, --sq
and --sk; pages in shuffled order.

Usage: python3 bench/bench_paged_prefill.py [--lib build/libflashjit.so] [--b 4]
       [--sq 64,256,2048] [--sk 8192,32768] [--paged 16,64] [--causal 0,1] [--mixed] [--out DIR]"""
import argparse
import itertools
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashjit  # noqa: E402
from common import add_timing_args, save_results, start, time_ms, to_pages  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--b", default="4")
ap.add_argument("--sq", default="64,256,2048")
ap.add_argument("--sk", default="8192,32768")
ap.add_argument("--paged", default="16,64")
ap.add_argument("--causal", default="0,1")
ap.add_argument("--hq", type=int, default=32)
ap.add_argument("--hkv", type=int, default=8)
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--mixed", action="store_true", help="also a chunk with b - 1 decode rows")
add_timing_args(ap)
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()


def ints(text):
    return [int(x) for x in text.split(",") if x]


dev = "cuda"
ctx = start(args.lib)
os.environ["FLASHJIT_CONFIG"] = "path=decode"  # read when a context is made
decode_ctx = flashjit.Context(backend="cuda", lib=args.lib, cache_path=":memory:")
del os.environ["FLASHJIT_CONFIG"]
hq, hkv, d = args.hq, args.hkv, args.d


def visible_pairs(sq, sk, causal):
    """Pairs a chunk of sq rows sees of sk keys (causal: bottom-right)."""
    if not causal:
        return sq * sk
    return sum(min(sk, sk - sq + i + 1) for i in range(sq) if sk - sq + i + 1 > 0)


def tflops(pairs, ms):
    return 4 * hq * d * pairs / ms / 1e9


def paged(k, v, page):
    """k and v as pages in shuffled order, the table and each sequence's key count."""
    b, sk = k.shape[0], k.shape[1]
    pages = -(-sk // page)
    perm = torch.randperm(b * pages, device=dev, dtype=torch.int32)
    used = torch.full((b,), sk, device=dev, dtype=torch.int32)
    return to_pages(k, page, perm), to_pages(v, page, perm), perm.view(b, pages), used


def peers(q, k, v, causal):
    """ms of SDPA's cuDNN and FA2 on the contiguous keys (None where a backend refuses)."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    got = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("fa2", SDPBackend.FLASH_ATTENTION)):
        if causal and name == "cudnn":
            got[name] = None
            continue
        mask = causal_lower_right(q.shape[1], k.shape[1]) if causal else None
        try:
            with sdpa_kernel([backend]):
                fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
                    qt, kt, vt, attn_mask=mask, enable_gqa=True)
                fn()
                got[name] = time_ms(fn, args.timing, args.reps)
        except (RuntimeError, TypeError, ValueError) as e:  # the backend refuses the shape
            print(f"  ({name}: {str(e).splitlines()[0][:80]})", flush=True)
            got[name] = None
    return got


def ratio(a, b):
    return a / b if a and b else float("nan")


rows = []
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, hq {hq} hkv {hkv} d {d}",
      flush=True)
print(f"{'b':>3} {'sq':>5} {'sk':>6} {'page':>4} {'c':>1} | {'plan':>6} {'decode':>6} {'dense':>6} "
      f"{'fa2':>6} {'cudnn':>6} TFLOP/s | {'x decode':>8} {'x dense':>7} {'x fa2':>6} "
      f"{'x cudnn':>7} | maxdiff path", flush=True)
for b in ints(args.b):
    for sk in ints(args.sk):
        k, v = (torch.randn(b, sk, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
        for sq in ints(args.sq):
            q = torch.randn(b, sq, hq, d, device=dev, dtype=torch.bfloat16)
            out = torch.empty_like(q)
            for causal in ints(args.causal):
                pairs = b * visible_pairs(sq, sk, causal)
                dense_ms = time_ms(lambda: ctx.forward(q, k, v, out=out, causal=bool(causal)),
                                   args.timing, args.reps)
                ref = out.clone()
                peer = peers(q, k, v, causal)
                for page in ints(args.paged):
                    kp, vp, table, used = paged(k, v, page)
                    outp = torch.empty_like(q)
                    run = {}
                    for name, c in (("decode", decode_ctx), ("plan", ctx)):
                        fn = lambda: c.forward(q, kp, vp, out=outp,  # noqa: E731
                                               causal=bool(causal), page_table=table,
                                               seqused_k=used, max_seqlen_k=sk)
                        fn()
                        run[name] = time_ms(fn, args.timing, args.reps)
                    path = ctx.last_call()["kernel_path"]
                    diff = (outp.float() - ref.float()).abs().max().item()
                    row = dict(b=b, sq=sq, sk=sk, page=page, causal=causal, pairs=pairs,
                               path=path, maxdiff=diff, plan_ms=run["plan"],
                               decode_ms=run["decode"], dense_ms=dense_ms,
                               fa2_ms=peer["fa2"], cudnn_ms=peer["cudnn"])
                    rows.append(row)
                    t = {n: tflops(pairs, row[n + "_ms"]) if row[n + "_ms"] else None
                         for n in ("plan", "decode", "dense", "fa2", "cudnn")}
                    cells = " ".join(f"{t[n]:6.0f}" if t[n] else f"{'-':>6}"
                                     for n in ("plan", "decode", "dense", "fa2", "cudnn"))
                    print(f"{b:3d} {sq:5d} {sk:6d} {page:4d} {causal:1d} | {cells}         | "
                          f"{ratio(t['plan'], t['decode']):8.2f} "
                          f"{ratio(t['plan'], t['dense']):7.2f} "
                          f"{ratio(t['plan'], t['fa2']):6.2f} "
                          f"{ratio(t['plan'], t['cudnn']):7.2f} | {diff:.3g} {path}", flush=True)
                    del kp, vp, outp
            del q, out
        if args.mixed and b > 1:
            # One chunk (sequence 0) and b - 1 decode rows, packed, causal, on pages of the
            # first page size.
            page = ints(args.paged)[0]
            kp, vp, table, used = paged(k, v, page)
            for sq in ints(args.sq):
                lengths = [sq] + [1] * (b - 1)
                cu = torch.tensor([0, *itertools.accumulate(lengths)], device=dev,
                                  dtype=torch.int32)
                q = torch.randn(sum(lengths), hq, d, device=dev, dtype=torch.bfloat16)
                outs = {}
                run = {}
                for name, c in (("decode", decode_ctx), ("plan", ctx)):
                    outs[name] = torch.empty_like(q)
                    fn = lambda: c.forward(q, kp, vp, out=outs[name],  # noqa: E731
                                           causal=True, page_table=table, seqused_k=used,
                                           cu_seqlens_q=cu, max_seqlen_q=sq, max_seqlen_k=sk)
                    fn()
                    run[name] = time_ms(fn, args.timing, args.reps)
                path = ctx.last_call()["kernel_path"]
                diff = (outs["plan"].float() - outs["decode"].float()).abs().max().item()
                row = dict(b=b, sq=sq, sk=sk, page=page, causal=1, mixed=True, path=path,
                           maxdiff=diff, plan_ms=run["plan"], decode_ms=run["decode"])
                rows.append(row)
                print(f"{b:3d} {sq:5d} {sk:6d} {page:4d} 1 | mixed: plan {1000 * run['plan']:.1f} "
                      f"us, decode {1000 * run['decode']:.1f} us: "
                      f"x decode {run['decode'] / run['plan']:.2f} | {diff:.3g} {path}",
                      flush=True)
                del q, outs
            del kp, vp
        del k, v
        torch.cuda.empty_cache()
save_results(args.out, "bench_paged_prefill", dict(hq=hq, hkv=hkv, d=d, rows=rows))
