"""Host time of the Python call path (no GPU time: a decode-shaped call whose kernel is tiny), and
where it goes: the whole of flashjit.torch.attention and Context.forward, then each part of a
prepared call alone (the signature, the current stream, the output's allocation, the repeated
call through the C fast path (flashjit._fastcall: checks, pointers, the library call), the
library call through the unchecked ctypes entry, the checked one, and one that keeps the GIL),
medians of 5000 calls; and PyTorch's SDPA on the same shape for scale. FLASHJIT_FASTCALL=0
measures the binding without its fast path.

Shapes: bf16, b 4, hq 16 / hkv 4, d 128, seqlen_q 1, a paged cache of 128 keys per sequence.

Launches are asynchronous: where the GPU runs the tiny kernels slower than the host issues them,
the launch queue fills and a launch waits for the GPU, so host time would read the GPU's pace.
--drain N synchronises every N calls, outside the timed region, so the queue never fills;
"GPU time per call" (events around 2000 calls) says which of the two paces a run without drain
measures. --rounds R repeats the rows R times (the host's speed drifts between runs) and gives
each row's median over the rounds; "Python call, 24 arguments" is the host's own pace.

Usage: python3 bench/bench_pyhost.py [--lib build/libflashjit.so] [--ab ROUNDS] [--drain N]
       [--rounds R]"""
import argparse
import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashjit.torch as fjt  # noqa: E402
from flashjit import _arrays, _core  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default=None)
ap.add_argument("--ab", type=int, default=0, metavar="ROUNDS",
                help="then ROUNDS rounds of flashjit.torch.attention alternating between the C "
                     "fast path and ctypes in this process (paired: the host's drift cancels)")
ap.add_argument("--drain", type=int, default=0, metavar="N",
                help="synchronise every N calls, untimed (0: never)")
ap.add_argument("--rounds", type=int, default=1, metavar="R")
args = ap.parse_args()
if args.lib:
    os.environ["FLASHJIT_LIB"] = args.lib

dev = "cuda"
b, hq, hkv, d, page, pages = 4, 16, 4, 128, 16, 8
q = torch.randn(b, 1, hq, d, device=dev, dtype=torch.bfloat16)
kc = torch.randn(b * pages, page, hkv, d, device=dev, dtype=torch.bfloat16)
vc = torch.randn_like(kc)
table = torch.randperm(b * pages, device=dev, dtype=torch.int32).view(b, -1)
used = torch.full((b,), 100, device=dev, dtype=torch.int32)
out = torch.empty_like(q)
ctx = fjt.context(q.device)
kw = dict(page_table=table, seqused_k=used, max_seqlen_k=pages * page)


def median_us(fn, n=5000):
    fn()
    torch.cuda.synchronize()
    times = []
    for i in range(n):
        if args.drain and i % args.drain == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    times.sort()
    return 1e6 * times[n // 2]


def gpu_us(fn, n=2000):
    """The GPU's time per call over n calls issued back to back (events around them)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / n


def python_call(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, q, r, s, t, u, v, w, x, y):
    return a


ctx.forward(q, kc, vc, out=out, **kw)
(_, options, _), prepared = next(iter(ctx._local.prepared.items()))
# forward's arrays, then the descriptor's
every = (q, kc, vc, out, None) + tuple({"seqused_k": used, "page_table": table}.get(n)
                                       for n in _core._DESC_ARRAYS)
fast = prepared._fast.get(())  # None without the extension (or with FLASHJIT_FASTCALL=0)
without_out = every[:3] + (None,) + every[4:]
stream = _arrays.current_stream(q)
checked = getattr(ctx.lib, "fj_attention_forward")
kept = ctypes.PyDLL(ctx.lib.path)["fj_attention_forward"]  # no GIL release around the call
kept.restype = ctypes.c_int
checked_args = [ctypes.byref(prepared.desc)] + [
    None if t is None else ctypes.byref(t) for t in prepared.structs[:5]]
# PyTorch's own SDPA on the same shape (a contiguous cache of the same length) for scale: its
# host time on this machine at this moment.
qs = q.transpose(1, 2)
ks, vs = (torch.randn(b, hkv, pages * page, d, device=dev, dtype=torch.bfloat16) for _ in "kv")
rows = [
    ("Python call, 24 arguments", lambda: python_call(*range(24))),
    ("torch SDPA (contiguous cache)", lambda: torch.nn.functional.scaled_dot_product_attention(
        qs, ks, vs, enable_gqa=True)),
    ("flashjit.torch.attention", lambda: fjt.attention(q, kc, vc, **kw)),
    ("flashjit.torch SDPA drop-in (contiguous)", lambda: fjt.scaled_dot_product_attention(
        qs, ks, vs, enable_gqa=True)),
    ("Context.forward", lambda: ctx.forward(q, kc, vc, **kw)),
    ("Context.forward, out given", lambda: ctx.forward(q, kc, vc, out=out, **kw)),
    ("  signature", lambda: _arrays.torch_cuda_signature(every)),
    ("  current stream", lambda: _arrays.current_stream(q)),
    ("  output allocation", lambda: torch.empty_like(q)),
] + ([("  C fast path (checks, pointers, call)", lambda: fast.run(every, options, None)),
      ("  C fast path, out made by it", lambda: fast.run(without_out, options, None))]
     if fast is not None else []) + [
    ("  library call, unchecked entry", lambda: prepared.invoke(stream)),
    ("  library call, checked entry", lambda: checked(ctx.handle, *checked_args, stream)),
    ("  library call, GIL kept", lambda: kept(ctx.handle, *prepared.args,
                                              ctypes.c_void_p(stream))),
]
print(f"torch {torch.__version__}, {ctx}, C fast path: {fast is not None}, through "
      f"torch's C shim: {getattr(fast, 'uses_shim', False)}, drain "
      f"{args.drain or 'never'}, {args.rounds} round(s)")
results = {name: [] for name, _ in rows}
for r in range(args.rounds):
    for name, fn in rows:
        results[name].append(median_us(fn))
    print(f"round {r + 1}: " + ", ".join(f"{results[name][-1]:.1f}" for name, _ in rows[:6]),
          flush=True)
for name, _ in rows:
    m = sorted(results[name])
    print(f"{name:40s} {m[len(m) // 2]:7.1f} us (rounds {m[0]:.1f}-{m[-1]:.1f})", flush=True)
for name, fn in rows[1:4]:
    print(f"GPU time per call, {name}: {gpu_us(fn):.1f} us", flush=True)

if args.ab and fast is not None:
    # The thread's recent fast calls set aside make the binding take its ctypes path.
    recent, pairs = ctx._local.recent, []
    call = (lambda: fjt.attention(q, kc, vc, **kw))
    for _ in range(args.ab):
        ctx._local.recent = recent
        with_fast = median_us(call, 2000)
        ctx._local.recent = None
        pairs.append((with_fast, median_us(call, 2000)))
    ctx._local.recent = recent
    fast_us = sorted(p[0] for p in pairs)
    ctypes_us = sorted(p[1] for p in pairs)
    ratios = sorted(c / f for f, c in pairs)
    print(f"attention, {args.ab} alternating rounds (medians of 2000): fast path "
          f"{fast_us[len(pairs) // 2]:.1f} us (range {fast_us[0]:.1f}-{fast_us[-1]:.1f}), ctypes "
          f"{ctypes_us[len(pairs) // 2]:.1f} us ({ctypes_us[0]:.1f}-{ctypes_us[-1]:.1f}), "
          f"ctypes / fast {ratios[len(pairs) // 2]:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})")
