"""Masks and biases: flashjit's mask_mod expressions and bias tensors against FlexAttention
(same BlockMask semantics) and PyTorch's SDPA with an attn_mask, on the same tensors in one
process. The cases of the masks issue: causal, sliding window, four equal documents, documents
of uneven lengths given as ids (mod_args), prefix-LM and random block sparsity as mask_mod;
mask_mod "k <= q" against causal=1; a dense additive bias.

flashjit runs each mask twice: classifying its blocks itself ("per call": once per shape for a
mask_mod without mod_args, every call otherwise) and given block classes built once by
Context.block_mask ("built once", as Flex is given its create_block_mask). TFLOP/s count the
kept work only: 4 * d * (kept query/key pairs) per head; with --backward also the backward of
each mask case against FlexAttention's (autograd of one Flex forward, retained graph), 2.5
times that count. A row "[flex drop-in]" times flashjit.torch.flex_attention given Flex's own
BlockMask and mask function (traced every call, classes built once per BlockMask).

Usage: python3 bench/bench_masks.py [--lib build/libflashjit.so] [--s 8192] [--d 128]
       [--backward] [--out DIR]
Prints one line per case and writes bench_masks.json into --out (default $OUT or .)."""
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
ap.add_argument("--s", type=int, default=8192)
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--hidden", type=int, default=2048)
add_timing_args(ap)
ap.add_argument("--cases", default="all",
                help="comma-separated: causal,window,documents,prefix_lm,block_sparse,builtin,bias")
ap.add_argument("--backward", action="store_true",
                help="also time each mask case's backward against FlexAttention's")
ap.add_argument("--config", action="append", default=[],
                help="a FLASHJIT_CONFIG value (repeatable): the forward of each case also timed "
                     "in a context made under it, beside the default's and against the same Flex "
                     "time, e.g. --config class_vote=1")
ap.add_argument("--out", default=os.environ.get("OUT", "."))
args = ap.parse_args()

from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

torch.manual_seed(0)
heat()
dev = "cuda"
s, d = args.s, args.d
b, h = max(1, 16384 // s), args.hidden // d
ctx = flashjit.Context(backend="cuda", lib=args.lib)
if args.lib:  # flashjit.torch's contexts load the library from FLASHJIT_LIB
    os.environ["FLASHJIT_LIB"] = os.path.abspath(args.lib)
import flashjit.torch as fjt  # noqa: E402
# The contexts of --config (the library reads FLASHJIT_CONFIG when a context is made).
configured, caller_config = [], os.environ.get("FLASHJIT_CONFIG")
for config in args.config:
    os.environ["FLASHJIT_CONFIG"] = config
    configured.append((config, flashjit.Context(backend="cuda", lib=args.lib)))
os.environ.pop("FLASHJIT_CONFIG", None)
if caller_config is not None:
    os.environ["FLASHJIT_CONFIG"] = caller_config
# Every mask (and, with --backward, inputs with and without requires_grad) is a graph of its
# own: past torch.compile's default of 8 the last cases ran unfused (Flex's block-sparse
# backward at 14.7 TFLOP/s, 2026-12-02).
torch._dynamo.config.recompile_limit = 64
flex = torch.compile(flex_attention, dynamic=False)
q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [b, h, s, d] views for the peers
out = torch.empty_like(q)
lse = torch.empty(b, h, s, device=dev, dtype=torch.float32)
dout = torch.randn_like(q)
grads = [torch.empty_like(x) for x in (q, k, v)]

docs, window, prefix, block = 4, 1024, 1024, 128
nblocks = (s + block - 1) // block
keep_blocks = (torch.rand(nblocks, nblocks, device=dev) < 0.5).to(torch.int32)
# Documents of uneven lengths (from a quarter to twice the mean of s / 6): each key's id.
lengths, left = [], s
while left > 0:
    lengths.append(min(left, int(torch.randint(s // 24, s // 3, ()).item())))
    left -= lengths[-1]
doc_ids = torch.repeat_interleave(torch.arange(len(lengths), device=dev, dtype=torch.int32),
                                  torch.tensor(lengths, device=dev))

# Each case: flashjit's expression (with its mod_args) and FlexAttention's mask_mod, equal.
cases = {
    "causal": ("k <= q", None, lambda b_, h_, qi, ki: ki <= qi),
    "window": (f"k <= q && q - k < {window}", None,
               lambda b_, h_, qi, ki: (ki <= qi) & (qi - ki < window)),
    "documents": (f"q / {s // docs} == k / {s // docs} && k <= q", None,
                  lambda b_, h_, qi, ki: (qi // (s // docs) == ki // (s // docs)) & (ki <= qi)),
    "documents_ids": ("iarg[q] == iarg[k] && k <= q", doc_ids,
                      lambda b_, h_, qi, ki: (doc_ids[qi] == doc_ids[ki]) & (ki <= qi)),
    "prefix_lm": (f"k < {prefix} || k <= q", None,
                  lambda b_, h_, qi, ki: (ki < prefix) | (ki <= qi)),
    "block_sparse": (f"iarg[(q / {block}) * {nblocks} + k / {block}] != 0", keep_blocks.view(-1),
                     lambda b_, h_, qi, ki: keep_blocks[qi // block, ki // block] != 0),
}


def tflops(pairs, ms):
    return 4 * b * h * d * pairs / ms / 1e9


def kept_pairs(mask_mod):
    qi = torch.arange(s, device=dev)[:, None]
    ki = torch.arange(s, device=dev)[None, :]
    return int(mask_mod(0, 0, qi, ki).sum().item())


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return time_ms(fn, args.timing, args.reps)


rows = []
print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, b {b} h {h} s {s} d {d}",
      flush=True)
print(f"{'case':>14} | {'per call':>8} {'built':>8} {'flex':>8} | {'x flex':>6} {'built':>6} | "
      f"{'maxdiff':>8} path", flush=True)


def report(name, pairs, times, scale, path, diff):
    """One row: flashjit per call and with classes built once, Flex (times in ms)."""
    per_call, built, fx = (scale * tflops(pairs, t) for t in times)
    row = dict(case=name, pairs=pairs, flashjit=per_call, flashjit_built=built, flex=fx,
               maxdiff=diff, path=path)
    rows.append(row)
    print(f"{name:>14} | {per_call:8.1f} {built:8.1f} {fx:8.1f} | {per_call / fx:6.2f} "
          f"{built / fx:6.2f} | {diff:8.4f} {path}", flush=True)


wanted = set(cases) | {"builtin", "bias"} if args.cases == "all" else set(args.cases.split(","))
for name, (expr, mod_args, mask_mod) in cases.items():
    if name not in wanted:
        continue
    pairs = kept_pairs(mask_mod)
    bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=s, KV_LEN=s, device=dev)
    classes = ctx.block_mask(q, k, mask_mod=expr, mod_args=mod_args)
    masks = dict(mask_mod=expr, mod_args=mod_args)
    fj = lambda: ctx.forward(q, k, v, out=out, **masks)  # noqa: E731
    fj_built = lambda: ctx.forward(q, k, v, out=out, block_mask=classes, **masks)  # noqa: E731
    fx = lambda: flex(qt, kt, vt, block_mask=bm)  # noqa: E731
    times = bench(fj), bench(fj_built), bench(fx)
    path = ctx.last_call()["kernel_path"]
    fj_built()
    # The check: a call given classes built once launches no classification pre-pass.
    path += "" if len(ctx.last_call()["launched"]) == 1 else \
        " (built once, launched: " + ",".join(ctx.last_call()["launched"]) + ")"
    flex_ref = fx().transpose(1, 2).float()
    diff = (out.float() - flex_ref).abs().max().item()
    report(name, pairs, times, 1, path, diff)
    # Flex's own call, to flashjit.torch's drop-in: its mask function traced, its BlockMask.
    dropin = bench(lambda: fjt.flex_attention(qt, kt, vt, block_mask=bm))
    report(f"{name} [flex drop-in]", pairs, (dropin, dropin, times[2]), 1,
           fjt.context(dev).last_call()["kernel_path"],
           (fjt.flex_attention(qt, kt, vt, block_mask=bm).transpose(1, 2).float() -
            flex_ref).abs().max().item())
    for config, c in configured:
        c_classes = c.block_mask(q, k, mask_mod=expr, mod_args=mod_args)
        c_times = (bench(lambda: c.forward(q, k, v, out=out, **masks)),
                   bench(lambda: c.forward(q, k, v, out=out, block_mask=c_classes, **masks)),
                   times[2])
        # (the path names the tile fields that ran: a config that does not fit the request
        # falls back to the default's)
        ran = dict(line.split("=", 1) for line in c.last_call()["variant"].splitlines()
                   if "=" in line)
        fields = ("class_vote", "persistent", "stages", "q_stages", "tile_n")
        c_path = c.last_call()["kernel_path"] + " " + ",".join(f"{f}={ran.get(f, '?')}"
                                                                for f in fields)
        report(f"{name} [{config}]", pairs, c_times, 1, c_path,
               (out.float() - flex_ref).abs().max().item())
    if args.backward:  # dq, dk, dv from the forward's out and lse, against Flex's autograd
        ctx.forward(q, k, v, out=out, lse=lse, **masks)
        fjb = lambda: ctx.backward(q, k, v, out, dout, lse, *grads, **masks)  # noqa: E731
        fjb_built = lambda: ctx.backward(q, k, v, out, dout, lse, *grads,  # noqa: E731
                                         block_mask=classes, **masks)
        leaves = [x.detach().requires_grad_() for x in (qt, kt, vt)]
        flex_out = flex(*leaves, block_mask=bm)
        fxb = lambda: torch.autograd.grad(flex_out, leaves, dout.transpose(1, 2),  # noqa: E731
                                          retain_graph=True)
        times = bench(fjb), bench(fjb_built), bench(fxb)
        bwd_path = ctx.last_call()["kernel_path"]
        want = fxb()
        bdiff = max((g.float() - w.transpose(1, 2).float()).abs().max().item()
                    for g, w in zip(grads, want))
        report(name + " bwd", pairs, times, 2.5, bwd_path, bdiff)
        del flex_out, leaves

# mask_mod "k <= q" against the built-in causal mask.
if "builtin" in wanted:
    t_builtin = bench(lambda: ctx.forward(q, k, v, out=out, causal=True))
    causal_pairs = s * (s + 1) // 2
    rows.append(dict(case="causal_builtin", pairs=causal_pairs,
                     flashjit=tflops(causal_pairs, t_builtin), path=ctx.last_call()["kernel_path"]))
    print(f"{'causal=1':>14} | {rows[-1]['flashjit']:8.1f} (mask_mod 'k <= q' at "
          f"{rows[0]['flashjit'] / rows[-1]['flashjit']:.2f} of it)", flush=True)

# A dense additive bias [1, h, s, s] against SDPA with the same attn_mask.
if "bias" in wanted:
    bias = torch.randn(1, h, s, s, device=dev, dtype=torch.bfloat16)
    t_fj = bench(lambda: ctx.forward(q, k, v, out=out, bias=bias))
    t_sdpa = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias))
    ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias).transpose(1, 2)
    diff = (out.float() - ref.float()).abs().max().item()
    rows.append(dict(case="bias", pairs=s * s, flashjit=tflops(s * s, t_fj),
                     sdpa=tflops(s * s, t_sdpa), maxdiff=diff, path=ctx.last_call()["kernel_path"]))
    print(f"{'bias':>14} | {rows[-1]['flashjit']:8.1f} {rows[-1]['sdpa']:8.1f} (SDPA attn_mask) | "
          f"{rows[-1]['flashjit'] / rows[-1]['sdpa']:6.2f} | {diff:8.4f} {rows[-1]['path']}",
          flush=True)

save_results(args.out, "bench_masks", dict(device=torch.cuda.get_device_name(),
                                           torch=torch.__version__, b=b, h=h, s=s, d=d, rows=rows))
