"""A/B of tile configurations in one process: for each shape, cuDNN, then flashjit under each
FLASHJIT_CONFIG value (one context each; "" is the default plan), the whole list timed --rounds
times in turn so that drift shows. Faster than bench/sweep.sh (one process, kernels compiled
once) and each line compares like with like.

Usage: python3 bench/ab.py [--lib build/libflashjit.so] --d 64 --s 512,1024 --causal 0,1
       "" "tile_n=96" "overlap=1,pingpong=1" ...
Prints per shape and round: cuDNN's TFLOP/s, then each configuration's TFLOP/s (x cuDNN) and the
largest difference from cuDNN's output (a sanity check; tests check numerics)."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashjit  # noqa: E402
from common import add_timing_args, grid_shape, heat, tflops, time_ms  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--d", default="64")
ap.add_argument("--s", default="1024")
ap.add_argument("--causal", default="0")
ap.add_argument("--rounds", type=int, default=2)
add_timing_args(ap)
ap.add_argument("configs", nargs="+")
args = ap.parse_args()

contexts = {}


def context(config):
    """A context made under FLASHJIT_CONFIG=config (read when a context is made)."""
    if config not in contexts:
        os.environ["FLASHJIT_CONFIG"] = config
        contexts[config] = flashjit.Context(backend="cuda", lib=args.lib)
    return contexts[config]


torch.manual_seed(0)
heat()
for d in [int(x) for x in args.d.split(",")]:
    for causal in [bool(int(x)) for x in args.causal.split(",")]:
        for s in [int(x) for x in args.s.split(",")]:
            b, h = grid_shape(s, d)
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)  # noqa: E731
                ref = sdpa().transpose(1, 2)
            print(f"d {d} causal {int(causal)} s {s}:", flush=True)
            for r in range(args.rounds):
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    cudnn = tflops(b, h, s, d, causal, time_ms(sdpa, args.timing, args.reps))
                print(f"  round {r} {'cuDNN':<40} {cudnn:6.0f}", flush=True)
                for config in args.configs:
                    ctx = context(config)
                    out = torch.full_like(q, float("nan"))
                    fj = lambda: ctx.forward(q, k, v, out=out, causal=causal)  # noqa: E731
                    fj()
                    torch.cuda.synchronize()
                    diff = (out.float() - ref.float()).abs().max().item()
                    t = tflops(b, h, s, d, causal, time_ms(fj, args.timing, args.reps))
                    print(f"  round {r} {config or 'default':<40} {t:6.0f} ({t / cudnn:.3f})"
                          f"  maxdiff {diff:.1e}", flush=True)
