"""FP8 forward attention: flashjit's FP8 (q, k, v in float8_e4m3fn or float8_e5m2, descale
factors [1], out bfloat16) against flashjit's own bf16 forward on the same shapes, in the same
process, over the FlashAttention benchmark grid (b*s = 16384 tokens, hidden 2048). TFLOP/s as
FlashAttention counts them: 4*b*h*s^2*d, halved when causal. cuDNN's SDPA is tried on the FP8
tensors too and reported as nan where PyTorch does not take them.

The error columns: the largest difference of each output from a float32 attention of the values
the FP8 inputs stand for (dequantised), over the largest magnitude of that reference.

Usage: python3 bench/bench_fp8.py [--lib build/libflashjit.so] [--d 64,128,256]
       [--s 2048,4096,8192,16384] [--causal 0,1] [--fp8 e4m3|e5m2] [--out DIR]"""
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
ap.add_argument("--d", default="64,128,256")
ap.add_argument("--s", default="2048,4096,8192,16384")
ap.add_argument("--causal", default="0,1")
ap.add_argument("--fp8", default="e4m3", choices=["e4m3", "e5m2"])
add_timing_args(ap)
ap.add_argument("--cache", default=":memory:")
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()

ctx = start(args.lib, args.cache)
f8 = torch.float8_e4m3fn if args.fp8 == "e4m3" else torch.float8_e5m2
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"flashjit {ctx.lib.fj_version().decode()}, {args.fp8}", flush=True)
print(f"{'d':>4} {'causal':>6} {'s':>6} {'b':>3} {'h':>3} | {'fp8':>7} {'bf16':>7} {'cudnn8':>7}"
      f" | {'x bf16':>6} | {'err fp8':>8} {'err bf16':>8} | path", flush=True)
rows = []
for d in [int(x) for x in args.d.split(",")]:
    for causal in [bool(int(x)) for x in args.causal.split(",")]:
        for s in [int(x) for x in args.s.split(",")]:
            b, h = grid_shape(s, d)
            # FP8 inputs with a scale each: real = code * descale.
            real = [torch.randn(b, s, h, d, device="cuda") for _ in range(3)]
            scales = [x.abs().amax() / (448.0 if f8 == torch.float8_e4m3fn else 57344.0) * 4
                      for x in real]
            codes = [(x / sc).to(f8) for x, sc in zip(real, scales)]
            descale = [sc.reshape(1).float() for sc in scales]
            deq = [c.float() * sc for c, sc in zip(codes, scales)]
            q16, k16, v16 = (x.to(torch.bfloat16) for x in deq)
            out8 = torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16)
            out16 = torch.empty_like(out8)

            def fp8(): return ctx.forward(*codes, out=out8, causal=causal, q_descale=descale[0],
                                          k_descale=descale[1], v_descale=descale[2])

            def bf16(): return ctx.forward(q16, k16, v16, out=out16, causal=causal)
            fp8()
            info = ctx.last_call()
            bf16()
            # Float32 reference of the dequantised inputs (cuDNN / FA2 take no float32: the math
            # backend, one head group at a time to bound its memory).
            ref = torch.empty(b, s, h, d, device="cuda")
            for i in range(b):
                for j in range(0, h, 4):
                    qt, kt, vt = (x[i:i + 1, :, j:j + 4].transpose(1, 2) for x in deq)
                    with sdpa_kernel([SDPBackend.MATH]):
                        ref[i:i + 1, :, j:j + 4] = F.scaled_dot_product_attention(
                            qt, kt, vt, is_causal=causal).transpose(1, 2)
            top = ref.abs().max().item()
            err8 = (out8.float() - ref).abs().max().item() / top
            err16 = (out16.float() - ref).abs().max().item() / top
            del ref
            row = dict(d=d, causal=causal, s=s, b=b, h=h, err_fp8=err8, err_bf16=err16,
                       path=info["kernel_path"], registers=info["registers"],
                       spill_bytes=info["spill_bytes"])
            row["fp8"] = tflops(b, h, s, d, causal, time_ms(fp8, args.timing, args.reps))
            row["bf16"] = tflops(b, h, s, d, causal, time_ms(bf16, args.timing, args.reps))
            try:
                qt, kt, vt = (x.transpose(1, 2) for x in codes)
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    def cudnn(): return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    cudnn()
                    ms = time_ms(cudnn, args.timing, args.reps)
                    row["cudnn8"] = tflops(b, h, s, d, causal, ms)
            except (RuntimeError, TypeError, NotImplementedError):
                row["cudnn8"] = float("nan")
            rows.append(row)
            print(f"{d:4d} {int(causal):6d} {s:6d} {b:3d} {h:3d} | {row['fp8']:7.1f} "
                  f"{row['bf16']:7.1f} {row['cudnn8']:7.1f} | {row['fp8'] / row['bf16']:6.2f} | "
                  f"{err8:8.4f} {err16:8.4f} | {info['kernel_path']} r{info['registers']} "
                  f"s{info['spill_bytes']}", flush=True)
            del real, codes, deq, q16, k16, v16, out8, out16

save_results(args.out, f"bench_fp8_{args.fp8}",
             dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows))
