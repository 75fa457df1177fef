"""FlexAttention's Python mask_mod and score_mod through flashjit.torch (traced into expressions,
flashjit._trace): outputs and gradients against a float64 reference that applies the same
Python functions to broadcast index tensors (as FlexAttention's definition does), on fresh random
data. Covers floor division and remainder of negative values (Python's, not C's), captured
tensors indexed by the indices (document ids, a relative-position table by head), torch.where,
tanh soft-capping, FlexAttention's BlockMask object, flashjit's create_block_mask with a
function, torch.compile of a caller, and the errors for what cannot be traced. Errors are
bounded by twice the plain implementation's (the inputs' dtype, P rounded to it). On CUDA in
bfloat16, else CPU tensors in float32 (the context's device is then OpenCL's). Exits 77
without torch.
Usage: python tests/torch_trace.py  (flashjit importable: installed, or PYTHONPATH=python with
FLASHJIT_LIB)"""
import sys

from torch_checks import check, dev, dtype, exit_status, within  # (exits 77 without torch)
import torch  # noqa: E402
import flashjit.torch as fjt  # noqa: E402
from flashjit.errors import FlashjitError, Unsupported  # noqa: E402

torch.manual_seed(1)


def reference(q, k, v, score_mod=None, mask_mod=None, scale=None, work=torch.float64):
    """Attention of [b, h, s, d] tensors with the functions applied to broadcast index tensors,
    computed in `work` (float64; or the inputs' dtype, P rounded to it: the plain
    implementation); rows that keep no key give zeros."""
    q, k, v = (x.to(work) for x in (q, k, v))
    b, h, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    k, v = (x.repeat_interleave(h // x.shape[1], dim=1) for x in (k, v))
    bi = torch.arange(b, device=q.device).view(b, 1, 1, 1)
    hi = torch.arange(h, device=q.device).view(1, h, 1, 1)
    qi = torch.arange(sq, device=q.device).view(1, 1, sq, 1)
    ki = torch.arange(sk, device=q.device).view(1, 1, 1, sk)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if score_mod is not None:
        s = score_mod(s, bi, hi, qi, ki).to(work)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(bi, hi, qi, ki).expand(s.shape), float("-inf"))
    p = torch.softmax(s.double(), dim=-1).nan_to_num(0.0).to(work)
    return p @ v


def close(name, got, *inputs, **mods):
    """got against the float64 reference of inputs and mods, by the plain implementation's
    error."""
    within(name, got, reference(*inputs, **mods), reference(*inputs, work=dtype, **mods))
b, hq, hkv, sq, sk, d = 2, 4, 2, 173, 301, 64
q = torch.randn(b, hq, sq, d, device=dev, dtype=dtype)
k = torch.randn(b, hkv, sk, d, device=dev, dtype=dtype)
v = torch.randn(b, hkv, sk, d, device=dev, dtype=dtype)

# Masks of the indices alone, with Python's floor division and remainder of negative values.
masks = {
    "causal window": lambda b_, h_, qi, ki: (qi >= ki) & (qi - ki < 50),
    "floor of negatives": lambda b_, h_, qi, ki: (qi - ki) // 37 != -2,
    "remainder of negatives": lambda b_, h_, qi, ki: (ki - qi) % 5 != 3,
    "prefix or head-dependent": lambda b_, h_, qi, ki: (ki < 16) | ((qi + h_ * 7) % 3 == 0),
    "xor and not": lambda b_, h_, qi, ki: ~((qi > ki) ^ (b_ == 1)),
}
for name, mask_mod in masks.items():
    out = fjt.flex_attention(q, k, v, mask_mod=mask_mod, enable_gqa=True)
    close(f"mask_mod {name}", out, q, k, v, mask_mod=mask_mod)

# Documents given as ids: a captured int tensor indexed by both indices.
lengths = [60, 13, 100, 128]
doc_q = torch.repeat_interleave(torch.arange(4, device=dev), torch.tensor(lengths, device=dev))
doc_k = torch.repeat_interleave(torch.arange(4, device=dev),
                                torch.tensor([90, 11, 100, 100], device=dev)).to(torch.int32)


def documents(b_, h_, qi, ki):
    return (doc_q[qi] == doc_k[ki]) & (ki <= qi + 30)


out = fjt.flex_attention(q, k, v, mask_mod=documents, enable_gqa=True)
close("mask_mod documents by captured ids", out, q, k, v, mask_mod=documents)

# Score terms: a relative-position table by head (captured float tensor), where, soft-capping.
rel = torch.randn(hq, sq + sk, device=dev) * 0.5
slopes = torch.rand(hq, device=dev)
scores = {
    "relative table": lambda s, b_, h_, qi, ki: s + rel[h_, qi - ki + sk],
    "alibi-like": lambda s, b_, h_, qi, ki: s - slopes[h_] * (qi - ki).abs(),
    "soft-cap": lambda s, b_, h_, qi, ki: 5.0 * torch.tanh(s / 5.0),
    "where": lambda s, b_, h_, qi, ki: torch.where(qi >= ki, s, s * 0.5 - 1.0),
    "true division of integers": lambda s, b_, h_, qi, ki: s + (qi - ki) / 64,
    "masked by -inf (methods, full_like)": lambda s, b_, h_, qi, ki: torch.where(
        qi.ge(ki), s.abs().sqrt(), torch.full_like(s, float("-inf"))),
}
for name, score_mod in scores.items():
    out = fjt.flex_attention(q, k, v, score_mod=score_mod, enable_gqa=True)
    close(f"score_mod {name}", out, q, k, v, score_mod=score_mod)

# Both at once, with the caller's own mod_args read by a string-free mask: the captured tensors
# go after them.
out = fjt.flex_attention(q, k, v, score_mod=scores["relative table"], mask_mod=documents,
                         enable_gqa=True)
close("score_mod and mask_mod together", out, q, k, v, score_mod=scores["relative table"],
      mask_mod=documents)

# Gradients through a traced score_mod (soft-capping) under a traced mask.
leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
ref_leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
dout = torch.randn(b, hq, sq, d, device=dev, dtype=dtype)
fjt.flex_attention(*leaves, score_mod=scores["soft-cap"], mask_mod=masks["causal window"],
                   enable_gqa=True).backward(dout)
plain_leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
for inputs, work in ((ref_leaves, torch.float64), (plain_leaves, dtype)):
    reference(*inputs, score_mod=scores["soft-cap"], mask_mod=masks["causal window"],
              work=work).backward(dout.to(work))
for name, got, want, plain in zip("qkv", leaves, ref_leaves, plain_leaves):
    within(f"d{name} through a traced score_mod and mask_mod", got.grad, want.grad, plain.grad)

# FlexAttention's BlockMask: its mask_mod is traced.
try:
    from torch.nn.attention.flex_attention import create_block_mask as flex_block_mask
    bm = flex_block_mask(masks["causal window"], None, None, sq, sk, device=dev)
except Exception as e:  # noqa: BLE001 (a torch without FlexAttention on this device)
    print(f"skip FlexAttention's BlockMask: {type(e).__name__}: {e}")
else:
    for call in ("first", "second"):  # the second reuses the classes built by the first
        out = fjt.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
        close(f"FlexAttention BlockMask, {call} call", out, q, k, v,
              mask_mod=masks["causal window"])
    launched = fjt.context(dev).last_call()["launched"]
    check("a reused BlockMask launches no classification", not any(
        "classify" in x for x in launched), ",".join(launched))

# flashjit's block classes from a function, reused.
classes = fjt.create_block_mask(q.transpose(1, 2), k.transpose(1, 2), mask_mod=documents)
out = fjt.flex_attention(q, k, v, mask_mod=documents, block_mask=classes, enable_gqa=True)
close("create_block_mask of a function, reused", out, q, k, v, mask_mod=documents)

# Under torch.compile the functions are traced while dynamo traces the caller: without a graph
# break where captured tensors are indexed by one value; a tensor indexed by several (the
# relative table) breaks the graph there (dynamo cannot pass a tuple of symbols to
# Tensor.__getitem__), and still runs.
for name, score_mod, fullgraph in (("alibi-like", scores["alibi-like"], True),
                                   ("relative table", scores["relative table"], False)):
    def block(q, k, v):
        return fjt.flex_attention(q, k, v, score_mod=score_mod, mask_mod=documents,
                                  enable_gqa=True) * 2.0
    what = f"torch.compile(fullgraph={fullgraph}) of traced functions ({name})"
    try:
        torch._dynamo.reset()
        compiled = torch.compile(block, backend="aot_eager", fullgraph=fullgraph)(q, k, v)
        diff = (compiled.double() - block(q, k, v).double()).abs().max().item()
        check(what, diff == 0.0, f"diff {diff:.3g}")
    except Exception as e:  # noqa: BLE001
        check(what, False, f"{type(e).__name__}: {e}")


def raises(name, fn, kind, words):
    try:
        fn()
    except kind as e:
        check(name, words in str(e), f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001
        check(name, False, f"{type(e).__name__}: {e}")
    else:
        check(name, False, "no error")


raises("'and' on traced values", lambda: fjt.flex_attention(
    q, k, v, mask_mod=lambda b_, h_, qi, ki: qi >= ki and ki > 3, enable_gqa=True),
    Unsupported, "torch.where")
raises("an untraced torch function", lambda: fjt.flex_attention(
    q, k, v, score_mod=lambda s, b_, h_, qi, ki: torch.sin(s), enable_gqa=True),
    Unsupported, "torch.sin")
raises("a captured tensor that requires grad", lambda: fjt.flex_attention(
    q, k, v, score_mod=lambda s, b_, h_, qi, ki: s + rel.requires_grad_()[h_, qi], enable_gqa=True),
    Unsupported, "requires grad")
rel.requires_grad_(False)
raises("a block_mask of neither kind", lambda: fjt.flex_attention(
    q, k, v, block_mask=[1, 2], enable_gqa=True), FlashjitError, "block_mask")
if "bm" in globals():  # (FlexAttention's BlockMask where this torch has one)
    raises("mask_mod beside a BlockMask", lambda: fjt.flex_attention(
        q, k, v, block_mask=bm, mask_mod=documents, enable_gqa=True), FlashjitError, "mask_mod")
raises("a float mask", lambda: fjt.flex_attention(
    q, k, v, mask_mod=lambda b_, h_, qi, ki: qi * 0.5, enable_gqa=True),
    FlashjitError, "boolean")

sys.exit(exit_status())
