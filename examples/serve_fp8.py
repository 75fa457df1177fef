"""A serving loop on an FP8 paged KV cache with flashjit.torch: a batch of sequences is prefilled
(their prompts' keys and values quantised into e4m3 pages by one packed append, the prompts
attending causally to their pages), then decoded token by token (each step one quantising
append of a token per sequence, then one paged attention call). At the end every sequence's
last output is compared with PyTorch's SDPA over the dequantised cache (exit status 1 if it
differs beyond bfloat16's rounding).

The keys and values here are random stand-ins for a model's projections; the descale factors
are per kv head (what a calibration pass would give), the ones the attention reads the cache
with. Runs on CUDA, or on the OpenCL backend with CPU tensors.

Usage: python3 examples/serve_fp8.py [--steps 8]"""
import argparse

import torch
import torch.nn.functional as F

import flashjit.torch as fjt

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=8)
args = ap.parse_args()
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
hq, hkv, d, page, max_pages = 8, 2, 64, 16, 8
prompts = [37, 5, 20]  # tokens per sequence
b = len(prompts)

# The cache: pages of every sequence dealt from one pool, in a shuffled order.
k_cache, v_cache = (torch.zeros(b * max_pages, page, hkv, d, device=dev).to(torch.float8_e4m3fn)
                    for _ in range(2))
table = torch.randperm(b * max_pages, device=dev, dtype=torch.int32).view(b, max_pages)
lengths = torch.zeros(b, device=dev, dtype=torch.int32)
k_scale, v_scale = (torch.full((hkv,), s, device=dev) for s in (0.02, 0.01))


def step(new_tokens):
    """Appends each sequence's new tokens (a packed batch of new_tokens[i] each) and attends
    their queries to the whole cache, causally: returns the packed outputs."""
    global lengths
    total = sum(new_tokens)
    cu = torch.tensor([0] + new_tokens, device=dev).cumsum(0).to(torch.int32)
    q = torch.randn(total, hq, d, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    fjt.kv_cache_append_quantized(k, v, cu, k_scale, v_scale, k_cache, v_cache, table, lengths)
    lengths = lengths + cu.diff()
    out = fjt.context(q.device).forward(
        q, k_cache, v_cache, cu_seqlens_q=cu, max_seqlen_q=max(new_tokens), page_table=table,
        seqused_k=lengths, max_seqlen_k=max_pages * page, causal=True, k_descale=k_scale,
        v_descale=v_scale)
    return q, out, cu


step(prompts)  # prefill
for _ in range(args.steps):  # decode: one token per sequence
    q, out, cu = step([1] * b)

# The last step against SDPA over each sequence's dequantised keys and values (bfloat16's
# rounding of the output apart, the same numbers).
worst, largest = 0.0, 0.0
for i in range(b):
    n = int(lengths[i])
    rows = torch.arange(n, device=dev)
    pages = table[i, rows // page].long()
    keys = k_cache[pages, rows % page].float() * k_scale[:, None]
    values = v_cache[pages, rows % page].float() * v_scale[:, None]
    ref = F.scaled_dot_product_attention(
        q[i:i + 1].float().transpose(0, 1)[None], keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None], enable_gqa=True)[0].transpose(0, 1)
    worst = max(worst, (out[i:i + 1].float() - ref).abs().max().item())
    largest = max(largest, ref.abs().max().item())
print(f"{b} sequences, prompts {prompts}, {args.steps} decode steps on {dev}: lengths "
      f"{lengths.tolist()}, last step's largest difference from SDPA {worst:.2g} "
      f"(of outputs up to {largest:.2g})")
raise SystemExit(0 if worst <= largest / 64 else 1)
