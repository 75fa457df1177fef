"""The kernels of one backward call, flashjit's and PyTorch's SDPA backends' (cuDNN, FA2 "flash"),
on the same tensors, for Nsight Compute: each backward runs a few times untraced, then once
between cudaProfilerStart and cudaProfilerStop, so that `ncu --profile-from-start off` sees
exactly the kernels of one backward call of each (the forwards and the warm-up are outside).

Usage (bf16, b * s = 16k, hidden 2048, as bench/bench_bwd.py):
  ncu --profile-from-start off --clock-control none --metrics METRICS --csv \\
      python3 bench/bwd_kernels.py [--lib build/libflashjit.so] [--s 4096] [--d 128] [--causal 0]
      [--peers cudnn,fa2]
Each profiled call is marked on stdout ("== flashjit", "== cudnn", ...) in launch order."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from common import grid_shape, start  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--s", type=int, default=4096)
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--causal", type=int, default=0)
ap.add_argument("--peers", default="cudnn,fa2")
ap.add_argument("--deterministic", type=int, default=0)
args = ap.parse_args()

backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
ctx = start(args.lib)
b, h = grid_shape(args.s, args.d)
causal = bool(args.causal)
q, k, v, dout = (torch.randn(b, args.s, h, args.d, device="cuda", dtype=torch.bfloat16)
                 for _ in range(4))
out = torch.empty_like(q)
lse = torch.empty(b, h, args.s, device="cuda", dtype=torch.float32)
ctx.forward(q, k, v, out=out, lse=lse, causal=causal)
dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
calls = {"flashjit": lambda: ctx.backward(q, k, v, out, dout, lse, dq=dq, dk=dk, dv=dv,
                                          causal=causal,
                                          deterministic=bool(args.deterministic))}
qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
for name in [p for p in args.peers.split(",") if p]:
    with sdpa_kernel([backends[name]]):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    calls[name] = lambda o=o: torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2),
                                                  retain_graph=True)
print(f"b {b} h {h} s {args.s} d {args.d} causal {int(causal)}", flush=True)
for name, fn in calls.items():
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    print(f"== {name}", flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
