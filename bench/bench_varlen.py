"""Packed sequences of different lengths (cu_seqlens): flashjit against PyTorch's varlen
attention (torch.nn.attention.varlen, FA2's varlen kernel) when this PyTorch has it, else SDPA
on nested (jagged) tensors; and against flashjit itself on one dense batch of the same total
work. Same tensors, same process; outputs compared sequence by sequence with SDPA.

TFLOP/s count the kept work: 4 * d * (query/key pairs each sequence keeps) per head.

Usage: python3 bench/bench_varlen.py [--lib build/libflashjit.so] [--tokens 32768] [--d 128]
       [--out DIR]
Prints one line per case and writes bench_varlen.json into --out (default $OUT or .)."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashjit  # noqa: E402
from common import add_timing_args, heat, save_results, time_ms  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--tokens", type=int, default=32768, help="total tokens of the packed batch")
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--hidden", type=int, default=2048)
add_timing_args(ap)
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()

torch.manual_seed(0)
heat()
dev = "cuda"
d, h = args.d, args.hidden // args.d
ctx = flashjit.Context(backend="cuda", lib=args.lib)

try:
    from torch.nn.attention.varlen import varlen_attn  # PyTorch >= 2.9
except ImportError:
    varlen_attn = None


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return time_ms(fn, args.timing, args.reps)


def lengths(kind):
    """Sequence lengths summing to about args.tokens."""
    if kind == "equal 2k":
        return [2048] * (args.tokens // 2048)
    lens, total = [], 0
    lo, hi = (128, 8192) if kind == "random 128-8k" else (64, 1024)
    while total < args.tokens:
        n = int(torch.randint(lo, hi + 1, (1,)).item())
        lens.append(n)
        total += n
    return lens


rows = []
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, tokens ~{args.tokens} "
      f"h {h} d {d}, peer: {'varlen_attn' if varlen_attn else 'SDPA on nested tensors'}", flush=True)
print(f"{'lengths':>16} {'causal':>6} | {'flashjit':>8} {'peer':>8} {'dense':>8} | {'x peer':>6} | "
      f"{'maxdiff':>8} path", flush=True)
for kind in ("equal 2k", "random 128-8k", "random 64-1k"):
    lens = lengths(kind)
    cu = torch.tensor([0] + lens, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    total, longest = int(cu[-1].item()), max(lens)
    q, k, v = (torch.randn(total, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    for causal in (False, True):
        pairs = sum(n * (n + 1) // 2 if causal else n * n for n in lens)
        tflops = lambda ms: 4 * h * d * pairs / ms / 1e9  # noqa: E731
        fj = lambda: ctx.forward(q, k, v, out=out, causal=causal, cu_seqlens_q=cu,  # noqa: E731
                                 cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
        t_fj = bench(fj)
        path = ctx.last_call()["kernel_path"]
        peer = None
        if varlen_attn is not None:
            # Causal as is_causal (PyTorch 2.9) or as the window (-1, 0) (from 2.10).
            for kw in (dict(window_size=(-1, 0) if causal else (-1, -1)), dict(is_causal=causal)):
                try:
                    varlen_attn(q, k, v, cu, cu, longest, longest, **kw)
                    peer = lambda kw=kw: varlen_attn(q, k, v, cu, cu, longest, longest, **kw)  # noqa: E731
                    break
                except TypeError:
                    pass
            if peer is None:
                print("varlen_attn: unknown signature; SDPA on nested tensors instead", flush=True)
        if peer is None:
            qn, kn, vn = (torch.nested.nested_tensor_from_jagged(x, cu.long()).transpose(1, 2)
                          for x in (q, k, v))
            peer = lambda: F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal)  # noqa: E731
        t_peer = bench(peer)
        # The same work as one dense batch of equal sequences (the dense kernel's speed).
        s_eq = int((pairs / len(lens)) ** 0.5) if not causal else int((2 * pairs / len(lens)) ** 0.5)
        s_eq = max(64, s_eq // 64 * 64)
        qd = torch.randn(len(lens), s_eq, h, d, device=dev, dtype=torch.bfloat16)
        t_dense = bench(lambda: ctx.forward(qd, qd, qd, causal=causal))
        pairs_dense = len(lens) * (s_eq * (s_eq + 1) // 2 if causal else s_eq * s_eq)
        dense = 4 * h * d * pairs_dense / t_dense / 1e9
        fj()
        diff = 0.0
        for i, n in enumerate(lens[:8]):
            a, b = int(cu[i].item()), int(cu[i + 1].item())
            ref = F.scaled_dot_product_attention(*(x[a:b].transpose(0, 1).unsqueeze(0) for x in (q, k, v)),
                                                 is_causal=causal)[0].transpose(0, 1)
            diff = max(diff, (out[a:b].float() - ref.float()).abs().max().item())
        row = dict(lengths=kind, sequences=len(lens), causal=causal, flashjit=tflops(t_fj),
                   peer=tflops(t_peer), dense=dense, maxdiff=diff, path=path)
        rows.append(row)
        print(f"{kind:>16} {int(causal):>6} | {row['flashjit']:8.1f} {row['peer']:8.1f} "
              f"{row['dense']:8.1f} | {row['flashjit'] / row['peer']:6.2f} | {diff:8.4f} {path}",
              flush=True)

save_results(args.out, "bench_varlen",
             dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  peer="varlen_attn" if varlen_attn else "sdpa_nested", h=h, d=d, rows=rows))
