"""Appends to a paged KV cache: flashjit's fj_kv_cache_append (copy), _packed (a serving step's
mixed token counts) and _quantized (bf16 tokens into an e4m3 cache with [b, hkv] descale
factors), against the same writes in plain PyTorch (index_copy_ into the pages' rows; for the
FP8 cache the division, clamp and cast first) on the same tensors, in the same process. An
append is bound by memory traffic: the figure is bytes of new keys and values read and cache
rows written per second (GB/s), the ratio to PyTorch, and the host microseconds of a call (the
launch is what a decode step pays for it).

Each row's result is checked first: the cache rows flashjit wrote equal PyTorch's bit for bit.

Shapes: hkv 8, d 128, pages of --page keys in shuffled order; --b sequences each appending --t
tokens (decode: 1), and a packed step of --b sequences with 1 token each but one with a
--chunk-token prefill chunk.

Usage: python3 bench/bench_append.py [--lib build/libflashjit.so] [--b 1,32,128] [--t 1,16]
       [--chunk 2048] [--page 16] [--out DIR]"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from common import add_timing_args, save_results, start, time_ms  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--b", default="1,32,128")
ap.add_argument("--t", default="1,16")
ap.add_argument("--chunk", type=int, default=2048, help="the packed step's prefill chunk")
ap.add_argument("--page", type=int, default=16)
ap.add_argument("--hkv", type=int, default=8)
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--used", type=int, default=4000, help="each sequence's keys before the append")
add_timing_args(ap)
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()

dev = "cuda"
ctx = start(args.lib)
hkv, d, page = args.hkv, args.d, args.page
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"flashjit {ctx.lib.fj_version().decode()}", flush=True)
print(f"{'kind':>9} {'b':>4} {'tokens':>6} | {'flashjit':>8} {'torch':>7} GB/s | {'x torch':>7} | "
      f"{'host us':>7} {'same':>4}", flush=True)


def host_us(fn, n=2000):
    """Host microseconds per call of fn (the queue never drains: its kernels are short)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def case(kind, lengths):
    """Times one append of lengths[i] new tokens to sequence i (all equal: the dense call)."""
    b, total = len(lengths), sum(lengths)
    per_seq = -(-(args.used + max(lengths)) // page)
    table = torch.randperm(b * per_seq, device=dev, dtype=torch.int32).view(b, per_seq)
    used = torch.full((b,), args.used, device=dev, dtype=torch.int32)
    fp8 = kind == "quantized"
    cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    kc, vc = (torch.zeros(b * per_seq, page, hkv, d, device=dev).to(cache_dtype)
              for _ in range(2))
    kn, vn = (torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    kf, vf = (torch.rand(b, hkv, device=dev) + 0.5 for _ in range(2))
    cu = torch.tensor([0] + lengths, device=dev, dtype=torch.int32).cumsum(0).to(torch.int32)
    seq = torch.repeat_interleave(torch.arange(b, device=dev), torch.tensor(lengths, device=dev))
    pos = used[seq] + torch.arange(total, device=dev) - cu[seq].long()
    rows = (table[seq, pos // page].long() * page + pos % page)  # flat cache rows
    dense = len(set(lengths)) == 1 and kind == "copy"
    if dense:
        t = lengths[0]
        kd, vd = (x.view(b, t, hkv, d) for x in (kn, vn))
        fj = lambda: ctx.kv_cache_append(kd, vd, kc, vc, table, used)  # noqa: E731
    elif fp8:
        fj = lambda: ctx.kv_cache_append(kn, vn, kc, vc, table, used,  # noqa: E731
                                         cu_seqlens_new=cu, k_descale=kf, v_descale=vf)
    else:
        fj = lambda: ctx.kv_cache_append(kn, vn, kc, vc, table, used,  # noqa: E731
                                         cu_seqlens_new=cu)
    flat_k, flat_v = kc.view(-1, hkv, d), vc.view(-1, hkv, d)
    tk, tv = torch.empty_like(flat_k), torch.empty_like(flat_v)
    largest = torch.finfo(cache_dtype).max

    def torch_append(dst_k, dst_v):
        if fp8:  # (FP8 index_copy_ is not implemented: the bytes are copied)
            qk = (kn.float() / kf[seq][:, :, None]).clamp(-largest, largest).to(cache_dtype)
            qv = (vn.float() / vf[seq][:, :, None]).clamp(-largest, largest).to(cache_dtype)
            dst_k.view(torch.uint8).index_copy_(0, rows, qk.view(torch.uint8))
            dst_v.view(torch.uint8).index_copy_(0, rows, qv.view(torch.uint8))
        else:
            dst_k.index_copy_(0, rows, kn)
            dst_v.index_copy_(0, rows, vn)

    fj()
    tk.copy_(flat_k)
    tv.copy_(flat_v)
    torch_append(tk, tv)
    torch.cuda.synchronize()
    same = torch.equal(flat_k.view(torch.uint8), tk.view(torch.uint8)) and \
        torch.equal(flat_v.view(torch.uint8), tv.view(torch.uint8))
    moved = 2 * total * hkv * d * (2 + kc.element_size())  # read new, write the cache's rows
    fj_ms = time_ms(fj, args.timing, args.reps)
    th_ms = time_ms(lambda: torch_append(flat_k, flat_v), args.timing, args.reps)
    row = dict(kind=kind, b=b, tokens=total, hkv=hkv, d=d, page=page, bytes=moved,
               flashjit_ms=fj_ms, torch_ms=th_ms, host_us=host_us(fj), same=same)
    row["flashjit_gbs"], row["torch_gbs"] = moved / fj_ms / 1e6, moved / th_ms / 1e6
    print(f"{kind:>9} {b:4d} {total:6d} | {row['flashjit_gbs']:8.0f} "
          f"{row['torch_gbs']:7.0f}      | {row['flashjit_gbs'] / row['torch_gbs']:7.2f} | "
          f"{row['host_us']:7.1f} {'yes' if same else 'NO':>4}", flush=True)
    return row


results = []
for b in [int(x) for x in args.b.split(",")]:
    for t in [int(x) for x in args.t.split(",")]:
        results.append(case("copy", [t] * b))
        results.append(case("quantized", [t] * b))
    step = [1] * b
    step[0] = args.chunk
    results.append(case("packed", step))
    results.append(case("quantized", step))
save_results(args.out, "bench_append", dict(rows=results))
sys.exit(0 if all(r["same"] for r in results) else 1)
