"""One decode shape run a few times by flashjit or by cuDNN's SDPA on the same kind of torch
tensors, for a profiler to wrap (bench/decode_l2.sh): bf16, hq 32 / hkv 8, d 128, one query
row, contiguous [b, s, h, d] caches.

Usage: python3 bench/decode_once.py flashjit|cudnn [--b 128] [--sk 8192] [--lib PATH] [--reps 3]"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser()
ap.add_argument("who", choices=["flashjit", "cudnn"])
ap.add_argument("--b", type=int, default=128)
ap.add_argument("--sk", type=int, default=8192)
ap.add_argument("--lib", default=None)
ap.add_argument("--reps", type=int, default=3)
args = ap.parse_args()

q = torch.randn(args.b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(args.b, args.sk, 8, 128, device="cuda", dtype=torch.bfloat16)
        for _ in range(2))
if args.who == "flashjit":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import flashjit  # noqa: E402

    ctx = flashjit.Context(backend="cuda", lib=args.lib)
    out = torch.empty_like(q)
    call = lambda: ctx.forward(q, k, v, out=out)  # noqa: E731
else:
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
for _ in range(args.reps):
    call()
torch.cuda.synchronize()
print(f"{args.who}: {args.reps} calls, b {args.b} x {args.sk} keys")
