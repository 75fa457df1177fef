"""Forward attention: flashjit against PyTorch's SDPA backends (FA2 "flash", cuDNN) on the same
tensors, in the same process, over the FlashAttention benchmark grid (b*s = 16384 tokens,
hidden 2048, bf16). TFLOP/s as FlashAttention counts them: 4*b*h*s^2*d, halved when causal.

Usage: python3 bench/bench_fwd.py [--lib build/libflashjit.so] [--quick] [--d 64,128]
       [--s 1024,4096] [--causal 0,1] [--out DIR]
Prints one line per grid point and writes bench_fwd.json into --out (default $OUT or .)."""
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
ap.add_argument("--quick", action="store_true")
ap.add_argument("--d", default="64,128,256")
ap.add_argument("--s", default="512,1024,2048,4096,8192,16384")
ap.add_argument("--causal", default="0,1")
add_timing_args(ap)
ap.add_argument("--peers", type=int, default=1, help="0: time flashjit only")
ap.add_argument("--cache", default=":memory:", help="kernel cache (a tuned one: its records apply)")
ap.add_argument("--tag", default="", help="a label printed on every line (e.g. the config)")
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()
if args.quick:
    args.d, args.s = "128", "1024,8192"

dev = "cuda"
ctx = start(args.lib, args.cache)
peers = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


rows = []
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"flashjit {ctx.lib.fj_version().decode()}", flush=True)
print(f"{'d':>4} {'causal':>6} {'s':>6} {'b':>3} {'h':>3} | {'flashjit':>8} {'fa2':>6} {'cudnn':>6}"
      f" | {'x fa2':>6} {'x cudnn':>7} | {'maxdiff':>8} path", flush=True)
for d in [int(x) for x in args.d.split(",")]:
    for causal in [bool(int(x)) for x in args.causal.split(",")]:
        for s in [int(x) for x in args.s.split(",")]:
            b, h = grid_shape(s, d)
            q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
            out = torch.empty_like(q)
            fj = lambda: ctx.forward(q, k, v, out=out, causal=causal)  # noqa: E731
            fj()
            info = ctx.last_call()
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
            torch.cuda.synchronize()
            diff = (out.float() - ref.float()).abs().max().item()
            row = dict(d=d, causal=causal, s=s, b=b, h=h, maxdiff=diff, tuned=info["tuned"],
                       path=info["kernel_path"], registers=info["registers"],
                       spill_bytes=info["spill_bytes"], compile_ms=info["compile_ms"])
            ms = time_ms(fj, args.timing, args.reps)
            row["flashjit"] = tflops(b, h, s, d, causal, ms)
            for name, backend in peers.items():
                if not args.peers:
                    row[name] = float("nan")
                    continue
                try:
                    with sdpa_kernel([backend]):
                        fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)  # noqa: E731
                        fn()
                        row[name] = tflops(b, h, s, d, causal,
                                           time_ms(fn, args.timing, args.reps))
                except RuntimeError:
                    row[name] = float("nan")
            rows.append(row)
            print(f"{d:4d} {int(causal):6d} {s:6d} {b:3d} {h:3d} | {row['flashjit']:8.1f} "
                  f"{row['fa2']:6.1f} {row['cudnn']:6.1f} | {row['flashjit'] / row['fa2']:6.2f} "
                  f"{row['flashjit'] / row['cudnn']:7.2f} | {diff:8.4f} {info['kernel_path']} "
                  f"r{info['registers']} s{info['spill_bytes']}{' tuned' if info['tuned'] else ''} "
                  f"{args.tag}", flush=True)
            del q, k, v, out, ref

save_results(args.out, f"bench_fwd{'_' + args.tag if args.tag else ''}",
             dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows))
