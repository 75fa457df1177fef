"""The backward pass: flashjit against PyTorch's SDPA backends (cuDNN, FA2 "flash") on the same
tensors, in the same process. Each side is timed on the backward alone: flashjit's
fj_attention_backward from the forward's out and lse, the peers' autograd backward of one SDPA
forward (retained graph). TFLOP/s as FlashAttention counts a backward: 2.5 times the forward's
4 * b * h * s^2 * d, halved when causal. The gradients are compared with the first peer's
(max |difference| of dq, dk, dv). flashjit runs as called by default (dq by atomics on tensor
cores) and with deterministic=True ("det": its time over the default's).

Shapes: bf16, b * s = 16k tokens, hidden 2048 (h = 2048 / d), over --s, --d and --causal.

Usage: python3 bench/bench_bwd.py [--lib build/libflashjit.so] [--s 1024,4096] [--d 64,128]
       [--causal 0,1] [--out DIR]"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from common import add_timing_args, grid_shape, save_results, start, tflops, time_ms  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--s", default="1024,4096")
ap.add_argument("--d", default="64,128")
ap.add_argument("--causal", default="0,1")
add_timing_args(ap)
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()

dev = "cuda"
ctx = start(args.lib)
peers = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"flashjit {ctx.lib.fj_version().decode()}", flush=True)
print(f"{'s':>6} {'d':>4} {'c':>1} | {'flashjit':>8} {'cudnn':>7} {'fa2':>7} TFLOP/s | "
      f"{'x cudnn':>7} {'x fa2':>6} | {'ms':>8} {'det':>5} {'maxdiff':>8} path", flush=True)
rows = []
for d in [int(x) for x in args.d.split(",")]:
    for s in [int(x) for x in args.s.split(",")]:
        for causal in [bool(int(x)) for x in args.causal.split(",")]:
            b, h = grid_shape(s, d)
            q, k, v, dout = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16)
                             for _ in range(4))
            out = torch.empty_like(q)
            lse = torch.empty(b, h, s, device=dev, dtype=torch.float32)
            ctx.forward(q, k, v, out=out, lse=lse, causal=causal)
            dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
            fj, fj_det = (lambda det=det: ctx.backward(  # noqa: E731
                q, k, v, out, dout, lse, dq=dq, dk=dk, dv=dv, causal=causal, deterministic=det)
                for det in (False, True))
            fj()
            path = ctx.last_call()["kernel_path"]
            row = dict(s=s, d=d, b=b, h=h, causal=causal, path=path,
                       flashjit_det_ms=time_ms(fj_det, args.timing, args.reps),
                       flashjit_ms=time_ms(fj, args.timing, args.reps))
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            for name, backend in peers.items():
                try:
                    with sdpa_kernel([backend]):
                        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    grad = lambda: torch.autograd.grad(  # noqa: E731
                        o, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True)
                    got = grad()
                    if "maxdiff" not in row:
                        row["maxdiff"] = max((a.float() - b_.transpose(1, 2).float()).abs()
                                             .max().item() for a, b_ in zip((dq, dk, dv), got))
                    row[name + "_ms"] = time_ms(grad, args.timing, args.reps)
                    del o, got
                except RuntimeError as e:  # the backend refuses the shape
                    row[name + "_err"] = str(e).splitlines()[0][:80]
            tf = {n: 2.5 * tflops(b, h, s, d, causal, row[n + "_ms"])
                  for n in ("flashjit", *peers) if n + "_ms" in row}
            row.update({n + "_tflops": t for n, t in tf.items()})
            ratio = {n: tf["flashjit"] / tf[n] if n in tf else float("nan") for n in peers}
            print(f"{s:6d} {d:4d} {int(causal):1d} | {tf['flashjit']:8.1f} "
                  f"{tf.get('cudnn', float('nan')):7.1f} {tf.get('fa2', float('nan')):7.1f}"
                  f"         | {ratio['cudnn']:7.3f} {ratio['fa2']:6.3f} | "
                  f"{row['flashjit_ms']:8.2f} {row['flashjit_det_ms'] / row['flashjit_ms']:5.2f} "
                  f"{row.get('maxdiff', float('nan')):8.2g} {path}",
                  flush=True)
            rows.append(row)
            del q, k, v, dout, out, lse, dq, dk, dv, qt, kt, vt
            torch.cuda.empty_cache()
save_results(args.out, "bench_bwd", dict(rows=rows))
