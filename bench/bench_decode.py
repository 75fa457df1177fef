"""Decode attention: flashjit against PyTorch's SDPA backends (cuDNN, FA2 "flash") on the same
tensors, in the same process. Decode is bound by reading K and V, so the figure is bytes of Q, K,
V and O moved per second (GB/s), and the ratio to each peer; the read bandwidth of a large sum
is printed as the ceiling.

Shapes: bf16, hq 32 / hkv 8, d 128, seqlen_q 1 (--sq), batch x kv length over --b and --sk,
contiguous [b, s, h, d] caches, and with --paged page sizes also flashjit on a paged cache of the
same keys (pages in shuffled order; the peers, which take no pages, on the contiguous one). SDPA
takes grouped heads with enable_gqa. With --kv-dtype e4m3|e5m2 flashjit reads an FP8 cache (the
same keys quantised, per-kv-head descale factors) and its bytes are counted as FP8; the peers,
which take no FP8 cache, read the bf16 one, so the ratio compares bytes per second.

Usage: python3 bench/bench_decode.py [--lib build/libflashjit.so] [--b 1,8,32,128]
       [--sk 1024,8192,131072] [--paged 16,64] [--splits 0] [--kv-dtype e4m3] [--out DIR]"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from common import (  # noqa: E402
    add_timing_args, read_bandwidth, save_results, start, time_ms, to_pages,
)

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--b", default="1,8,32,128")
ap.add_argument("--sk", default="1024,8192,32768,131072")
ap.add_argument("--sq", type=int, default=1)
ap.add_argument("--hq", type=int, default=32)
ap.add_argument("--hkv", type=int, default=8)
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--splits", type=int, default=0, help="desc.num_splits (0: the plan's)")
ap.add_argument("--paged", default="", help="page sizes to time flashjit on too (e.g. 16,64)")
ap.add_argument("--kv-dtype", default="", choices=["", "e4m3", "e5m2"],
                help="flashjit on an FP8 cache of the same keys (bytes counted as FP8)")
ap.add_argument("--max-gib", type=float, default=24.0, help="skip shapes whose K + V exceed this")
add_timing_args(ap)
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()

dev = "cuda"
ctx = start(args.lib)
peers = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}


def quantise_kv(k, v, name):
    """k and v in FP8 with a descale factor per (batch, kv head): amax / the format's largest."""
    dt = torch.float8_e4m3fn if name == "e4m3" else torch.float8_e5m2
    top = torch.finfo(dt).max
    out, scales = [], {}
    for x, key in ((k, "k_descale"), (v, "v_descale")):
        s = (x.float().abs().amax(dim=(1, 3)) / top).clamp_min(1e-12)  # [b, hkv]
        out.append((x.float() / s[:, None, :, None]).to(dt))
        scales[key] = s.contiguous()
    return out[0], out[1], scales


ceiling = read_bandwidth(args.timing, args.reps)
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"flashjit {ctx.lib.fj_version().decode()}; read ceiling {ceiling:.0f} GB/s", flush=True)
print(f"{'b':>4} {'sk':>7} {'page':>4} {'MiB':>7} | {'flashjit':>8} {'cudnn':>7} {'fa2':>7} GB/s | "
      f"{'x cudnn':>7} {'x fa2':>6} {'% ceil':>6} | {'us':>7} {'maxdiff':>8} path", flush=True)
rows = []
hq, hkv, d, sq = args.hq, args.hkv, args.d, args.sq
for b in [int(x) for x in args.b.split(",")]:
    for sk in [int(x) for x in args.sk.split(",")]:
        kv_bytes = 2 * b * sk * hkv * d * 2
        if kv_bytes > args.max_gib * 1024**3:
            continue
        q = torch.randn(b, sq, hq, d, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
        out = torch.empty_like(q)
        moved = kv_bytes + 2 * q.numel() * 2  # K, V read; Q read, O written
        causal = sq > 1
        kq, vq, scales = k, v, {}
        if args.kv_dtype:
            kq, vq, scales = quantise_kv(k, v, args.kv_dtype)
        fj_moved = moved - kv_bytes + kq.numel() * kq.element_size() * 2
        fj = lambda: ctx.forward(q, kq, vq, out=out, causal=causal,  # noqa: E731
                                 num_splits=args.splits, **scales)
        fj()
        path = ctx.last_call()["kernel_path"]
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                 enable_gqa=True).transpose(1, 2)
        torch.cuda.synchronize()
        diff = (out.float() - ref.float()).abs().max().item()
        paged_rows = []
        row = dict(b=b, sk=sk, sq=sq, hq=hq, hkv=hkv, d=d, path=path, maxdiff=diff,
                   bytes=moved, kv_dtype=args.kv_dtype or "bf16", flashjit_bytes=fj_moved,
                   flashjit_ms=time_ms(fj, args.timing, args.reps))
        for name, be in peers.items():
            try:
                with sdpa_kernel([be]):
                    fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
                        qt, kt, vt, is_causal=causal, enable_gqa=True)
                    fn()
                    row[name + "_ms"] = time_ms(fn, args.timing, args.reps)
            except RuntimeError as e:  # the backend refuses the shape
                row[name + "_err"] = str(e).splitlines()[0][:80]
        for page in [int(x) for x in args.paged.split(",") if x]:
            paged_row = dict(row, page=page)
            pages_per_seq = -(-sk // page)
            perm = torch.randperm(b * pages_per_seq, device=dev, dtype=torch.int32)
            table = perm.view(b, pages_per_seq)
            kp, vp = (to_pages(x, page, perm) for x in (kq, vq))
            used = torch.full((b,), sk, device=dev, dtype=torch.int32)
            outp = torch.empty_like(q)
            fjp = lambda: ctx.forward(q, kp, vp, out=outp, causal=causal,  # noqa: E731
                                      num_splits=args.splits, page_table=table,
                                      seqused_k=used, max_seqlen_k=sk, **scales)
            fjp()
            torch.cuda.synchronize()
            paged_row["path"] = ctx.last_call()["kernel_path"]
            paged_row["maxdiff"] = (outp.float() - ref.float()).abs().max().item()
            paged_row["flashjit_ms"] = time_ms(fjp, args.timing, args.reps)
            paged_rows.append(paged_row)
            del kp, vp, outp
        gbs = {n: moved / row[n + "_ms"] / 1e6 for n in ("flashjit", *peers) if n + "_ms" in row}
        row.update({n + "_gbs": g for n, g in gbs.items()})
        for r in [dict(row, page=0)] + paged_rows:
            r.update({n + "_gbs": g for n, g in gbs.items()})
            r["flashjit_gbs"] = fj_moved / r["flashjit_ms"] / 1e6
            ratio = {n: r["flashjit_gbs"] / gbs[n] if n in gbs else float("nan") for n in peers}
            print(f"{b:4d} {sk:7d} {r['page']:4d} {kv_bytes / 2**20:7.0f} | "
                  f"{r['flashjit_gbs']:8.0f} {gbs.get('cudnn', float('nan')):7.0f} "
                  f"{gbs.get('fa2', float('nan')):7.0f}      | {ratio['cudnn']:7.2f} "
                  f"{ratio['fa2']:6.2f} {100 * r['flashjit_gbs'] / ceiling:6.1f} | "
                  f"{1000 * r['flashjit_ms']:7.1f} {r['maxdiff']:8.2g} {r['path']}", flush=True)
            rows.append(r)
        del q, k, v, kq, vq, out, qt, kt, vt, ref
        torch.cuda.empty_cache()
save_results(args.out, "bench_decode", dict(ceiling_gbs=ceiling, rows=rows))
