"""flashjit for PyTorch: operators registered with torch.library, so they run under autograd,
trace under torch.compile (fake implementations give the output shapes, no graph breaks) and
capture into CUDA graphs; and the entry points built on them:

    import flashjit.torch as fjt
    out = fjt.scaled_dot_product_attention(q, k, v, is_causal=True)    # SDPA's drop-in, [b, h, s, d]
    out = fjt.attention(q, k, v, causal=True, mask_mod="k % 64 != 0")  # every feature, [b, s, h, d]
    out = fjt.flex_attention(q, k, v, score_mod="s + 0.1 * (k - q)")   # FlexAttention-like
    out = fjt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + 0.1 * (ki - qi))

Operators: flashjit::attention_forward (returns out and the float32 log-sum-exp),
flashjit::attention_backward, flashjit::attention_merge, flashjit::kv_cache_append,
flashjit::kv_cache_append_packed and flashjit::kv_cache_append_quantized (in place).
Calls run on PyTorch's current stream of the tensors' device, through one flashjit context per
device (created on first use, inside PyTorch's CUDA context). CPU tensors run on the default
backend (CUDA if usable, else OpenCL), copied to its device and back. Gradients flow to q, k,
v (through score_mod by its generated derivative) and a float bias (summed over what it
broadcasts); masks, mod_args and the other terms get none. mask_mod and score_mod are flashjit
expression strings, or FlexAttention's Python functions, traced into expressions (the tensors
they read become mod_args; see flashjit._trace).
"""
import sys
import weakref
from typing import List, Optional, Tuple

import torch

from . import _trace
from ._core import Context
from .errors import InvalidArgument, Unsupported

Tensor = torch.Tensor
_contexts = {}


def context(device=None):
    """The flashjit context serving tensors on `device` (a torch.device or string)."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = device  # keyed as a tensor's .device reads, so a call finds it in one lookup
    if key not in _contexts:
        if device.type == "cuda":
            with torch.cuda.device(device):  # the library adopts PyTorch's context
                torch.cuda.init()
                _contexts[key] = Context(backend="cuda", device=device.index,
                                         allocator=_caching_allocator(device.index))
        elif device.type == "cpu":
            _contexts[key] = Context(backend="auto")
        else:
            raise InvalidArgument(f"tensors on {device}: flashjit serves cuda and cpu tensors")
    return _contexts[key]


def _caching_allocator(index):
    """The context's workspaces from PyTorch's caching allocator, on the stream of the call."""
    def alloc(nbytes, stream):
        return torch.cuda.caching_allocator_alloc(nbytes, device=index, stream=stream)

    def free(ptr, nbytes, stream):
        if not sys.is_finalizing():  # at exit the process's memory goes with it
            torch.cuda.caching_allocator_delete(ptr)

    return alloc, free


def _last_dim_contiguous(x):
    return x if x is None or x.stride(-1) == 1 else x.contiguous()


def _lse_shape(q, packed):
    return (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])


# ---- operators ------------------------------------------------------------------------------
@torch.library.custom_op("flashjit::attention_forward", mutates_args=())
def attention_forward(
        q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor], bias: Optional[Tensor],
        mask: Optional[Tensor], mask_ranges: Optional[Tensor], block_mask: Optional[Tensor],
        mod_args: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], seqused_k: Optional[Tensor],
        page_table: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, causal: bool,
        window_left: int, window_right: int, softcap: float, scale: float, mask_mod: str,
        score_mod: str, num_splits: int) -> Tuple[Tensor, Tensor]:
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    out = context(q.device).forward(
        q, k, v, lse=lse, causal=causal, window=(window_left, window_right), softcap=softcap,
        scale=scale, mask_mod=mask_mod or None, score_mod=score_mod or None, mod_args=mod_args,
        alibi_slopes=alibi_slopes, bias=bias, mask=mask, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, mask_ranges=mask_ranges, block_mask=block_mask,
        num_splits=num_splits, page_table=page_table)
    return out, lse


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, alibi_slopes, bias, mask, mask_ranges, block_mask,
                            mod_args, cu_seqlens_q, cu_seqlens_k, seqused_k, page_table,
                            max_seqlen_q, max_seqlen_k, causal, window_left, window_right,
                            softcap, scale, mask_mod, score_mod, num_splits):
    out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
    return out, q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)


@torch.library.custom_op("flashjit::attention_backward", mutates_args=())
def attention_backward(
        dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        alibi_slopes: Optional[Tensor], bias: Optional[Tensor], mask: Optional[Tensor],
        mask_ranges: Optional[Tensor], block_mask: Optional[Tensor], mod_args: Optional[Tensor],
        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, causal: bool,
        window_left: int, window_right: int, softcap: float, scale: float, mask_mod: str,
        score_mod: str, deterministic: bool,
        want_dbias: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = _dbias_like(q, k, bias, want_dbias)
    context(q.device).backward(
        q, k, v, out, _last_dim_contiguous(dout), lse, dq=dq, dk=dk, dv=dv, causal=causal,
        window=(window_left, window_right), softcap=softcap, scale=scale,
        mask_mod=mask_mod or None, score_mod=score_mod or None, mod_args=mod_args,
        alibi_slopes=alibi_slopes, bias=bias,
        mask=mask, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, mask_ranges=mask_ranges,
        block_mask=block_mask, deterministic=deterministic,
        dbias=dbias if want_dbias else None)
    return dq, dk, dv, dbias


def _dbias_like(q, k, bias, want):
    """The bias's gradient buffer (float32, broadcast dimensions of extent 1), or an empty
    tensor when it is not wanted."""
    if not want or bias is None:
        return q.new_empty((0,), dtype=torch.float32)
    bias4 = bias
    while bias4.dim() < 4:
        bias4 = bias4.unsqueeze(0)
    # The bias's own extents where it does not broadcast (a packed request's bias is a padded
    # batch, whose extents q's and k's shapes do not give).
    shape = Context.bias_grad_shape(tuple(bias4.shape), bias4.stride(), *bias4.shape)
    return q.new_empty(shape, dtype=torch.float32)


@attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, alibi_slopes, bias, *rest):
    want_dbias = rest[-1]
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            _dbias_like(q, k, bias, want_dbias))


# The forward's arguments by position (setup_context and the backward read them by name).
_FORWARD_ARGS = ("q", "k", "v", "alibi_slopes", "bias", "mask", "mask_ranges", "block_mask",
                 "mod_args", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table",
                 "max_seqlen_q", "max_seqlen_k", "causal", "window_left", "window_right",
                 "softcap", "scale", "mask_mod", "score_mod", "num_splits")
_TENSOR_ARGS = _FORWARD_ARGS[:13]
deterministic_backward = False  # flashjit.torch.deterministic_backward = True: bit-identical


def _setup_context(ctx, inputs, output):
    args = dict(zip(_FORWARD_ARGS, inputs))
    ctx.save_for_backward(*[args[n] for n in _TENSOR_ARGS], *output)
    ctx.options = {n: args[n] for n in _FORWARD_ARGS[13:]}


def _backward(ctx, dout, dlse):
    saved = dict(zip(_TENSOR_ARGS + ("out", "lse"), ctx.saved_tensors))
    o = ctx.options
    if saved["page_table"] is not None:
        raise Unsupported("no gradient through a paged KV cache")
    want_dbias = saved["bias"] is not None and ctx.needs_input_grad[_FORWARD_ARGS.index("bias")]
    dq, dk, dv, dbias = attention_backward(
        dout, saved["q"], saved["k"], saved["v"], saved["out"], saved["lse"],
        saved["alibi_slopes"], saved["bias"], saved["mask"], saved["mask_ranges"],
        saved["block_mask"], saved["mod_args"], saved["cu_seqlens_q"], saved["cu_seqlens_k"],
        saved["seqused_k"], o["max_seqlen_q"], o["max_seqlen_k"], o["causal"],
        o["window_left"], o["window_right"], o["softcap"], o["scale"], o["mask_mod"],
        o["score_mod"], deterministic_backward, want_dbias)
    grads = [dq, dk, dv] + [None] * (len(_FORWARD_ARGS) - 3)
    if want_dbias:  # summed over the broadcast dimensions; autograd wants the bias's shape
        bias = saved["bias"]
        grads[_FORWARD_ARGS.index("bias")] = \
            dbias.view(dbias.shape[4 - bias.dim():] if bias.dim() < 4 else dbias.shape) \
            .expand(bias.shape).to(bias.dtype)
    return tuple(grads)


attention_forward.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("flashjit::attention_merge", mutates_args=())
def attention_merge(outs: List[Tensor], lses: List[Tensor]) -> Tuple[Tensor, Tensor]:
    out, lse = torch.empty_like(outs[0]), torch.empty_like(lses[0])
    return context(outs[0].device).merge(list(outs), list(lses), out=out, lse=lse)


@attention_merge.register_fake
def _attention_merge_fake(outs, lses):
    return torch.empty_like(outs[0]), torch.empty_like(lses[0])


@torch.library.custom_op("flashjit::kv_cache_append", mutates_args=("k_cache", "v_cache"))
def kv_cache_append(k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor,
                    page_table: Tensor, seqused_k: Tensor) -> None:
    context(k_cache.device).kv_cache_append(k_new, v_new, k_cache, v_cache, page_table,
                                            seqused_k)


@kv_cache_append.register_fake
def _kv_cache_append_fake(k_new, v_new, k_cache, v_cache, page_table, seqused_k):
    return None


@torch.library.custom_op("flashjit::kv_cache_append_packed",
                         mutates_args=("k_cache", "v_cache"))
def kv_cache_append_packed(k_new: Tensor, v_new: Tensor, cu_seqlens_new: Tensor,
                           k_cache: Tensor, v_cache: Tensor, page_table: Tensor,
                           seqused_k: Tensor) -> None:
    context(k_cache.device).kv_cache_append(k_new, v_new, k_cache, v_cache, page_table,
                                            seqused_k, cu_seqlens_new=cu_seqlens_new)


@kv_cache_append_packed.register_fake
def _kv_cache_append_packed_fake(k_new, v_new, cu_seqlens_new, k_cache, v_cache, page_table,
                                 seqused_k):
    return None


@torch.library.custom_op("flashjit::kv_cache_append_quantized",
                         mutates_args=("k_cache", "v_cache"))
def kv_cache_append_quantized(k_new: Tensor, v_new: Tensor, cu_seqlens_new: Optional[Tensor],
                              k_descale: Optional[Tensor], v_descale: Optional[Tensor],
                              k_cache: Tensor, v_cache: Tensor, page_table: Tensor,
                              seqused_k: Tensor) -> None:
    context(k_cache.device).kv_cache_append(k_new, v_new, k_cache, v_cache, page_table,
                                            seqused_k, cu_seqlens_new=cu_seqlens_new,
                                            k_descale=k_descale, v_descale=v_descale)


@kv_cache_append_quantized.register_fake
def _kv_cache_append_quantized_fake(k_new, v_new, cu_seqlens_new, k_descale, v_descale, k_cache,
                                    v_cache, page_table, seqused_k):
    return None


# ---- entry points ---------------------------------------------------------------------------
def _direct(q, k, v, bias):
    """Whether attention() may call the context without the operator's dispatch (tens of
    microseconds a call): in eager mode (torch.compile traces the operator), on plain tensors
    (not fake tensors or other subclasses), with autograd not recording (no input wants a
    gradient)."""
    if type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor:
        return False
    if torch.compiler.is_compiling():
        return False
    return not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                             v.requires_grad or
                                             (bias is not None and bias.requires_grad)))


def attention(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, scale=None,
              mask_mod=None, score_mod=None, mod_args=None, alibi_slopes=None, bias=None,
              mask=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0,
              max_seqlen_k=0, mask_ranges=None, block_mask=None, page_table=None, num_splits=0,
              return_lse=False):
    """Attention with every flashjit feature, q [b, sq, hq, d], k/v [b, sk, hkv, d|dv] (or
    packed [total, heads, dim] with cu_seqlens_q/k; or paged k/v [num_pages, page_size, hkv,
    d] with page_table and seqused_k); see flashjit.Context.forward for each argument. Returns
    out [b, sq, hq, dv] (and the float32 log-sum-exp [b, hq, sq] with return_lse).
    mask_mod and score_mod may be FlexAttention's functions, mask_mod(b, h, q_idx, kv_idx) and
    score_mod(score, b, h, q_idx, kv_idx), traced into expressions."""
    if callable(mask_mod) or callable(score_mod):
        mask_mod, score_mod, mod_args = _trace.expressions(mask_mod, score_mod, mod_args,
                                                           q.device)
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):  # the quick test
        q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    if _direct(q, k, v, bias):  # the context straight away, options as given
        lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None),
                          dtype=torch.float32) if return_lse else None
        d = q.device
        # By position, in Context.forward's order: matching 21 keywords costs more than a
        # microsecond a call, a tenth of this path.
        out = (_contexts.get(d) or context(d)).forward(
            q, k, v, None, lse, causal, window, softcap, scale or 0.0, mask_mod, score_mod,
            mod_args, alibi_slopes, bias, mask, cu_seqlens_q, cu_seqlens_k, seqused_k,
            max_seqlen_q, max_seqlen_k, mask_ranges, block_mask, num_splits, page_table)
    else:
        out, lse = attention_forward(
            q, k, v, alibi_slopes, bias, mask, mask_ranges, block_mask, mod_args, cu_seqlens_q,
            cu_seqlens_k, seqused_k, page_table, int(max_seqlen_q), int(max_seqlen_k),
            bool(causal), int(window[0]), int(window[1]), float(softcap), float(scale or 0.0),
            mask_mod or "", score_mod or "", int(num_splits))
    return (out, lse) if return_lse else out


def create_block_mask(q, k, *, mask_mod=None, mod_args=None, mask=None, mask_ranges=None,
                      cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):
    """The 128 x 128 block classes of the masks for attention() of q and k ([b, s, h, d], or
    packed [total, h, d] with cu_seqlens_q / cu_seqlens_k and the maxima): an int32 tensor to
    pass as block_mask= of the calls with the same masks, which then skip their own
    classification (FlexAttention's create_block_mask; see Context.block_mask). mask_mod: an
    expression string, or FlexAttention's mask_mod(b, h, q_idx, kv_idx), traced."""
    if callable(mask_mod):
        mask_mod, _, mod_args = _trace.expressions(mask_mod, None, mod_args, q.device)
    d = q.device
    return (_contexts.get(d) or context(d)).block_mask(
        q, k, mask_mod=mask_mod, mod_args=mod_args, mask=mask, mask_ranges=mask_ranges,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k)


def _to_bshd(x):
    """[b, h, s, d] (or [h, s, d]) as the [b, s, h, d] view flashjit reads."""
    return _as_bhsd(x).transpose(1, 2)


def _as_bhsd(x):
    """x as [b, h, s, d]: [h, s, d] gains a batch of one."""
    n = x.dim()
    if n == 4:
        return x
    if n == 3:
        return x.unsqueeze(0)
    raise InvalidArgument(f"expected [batch, heads, seq, dim] tensors, got {n} dims")


def _as_4d(t, name):
    if t.dim() > 4:
        raise InvalidArgument(f"{name}: {t.dim()} dims, at most 4")
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's signature and [b, h, s, d] layout.
    attn_mask: bool (True takes part) or a float bias, broadcastable to [b, h, sq, sk];
    is_causal aligns top-left as SDPA does (for sq != sk: query i sees keys j <= i).
    dropout_p other than 0 is not supported."""
    if dropout_p != 0.0:
        raise Unsupported(f"dropout_p = {dropout_p}: flashjit computes attention without "
                          "dropout; pass 0.0")
    if is_causal and attn_mask is not None:
        raise InvalidArgument("attn_mask and is_causal both given (SDPA allows one)")
    unbatched = query.dim() == 3
    q, k, v = _as_bhsd(query), _as_bhsd(key), _as_bhsd(value)
    if not enable_gqa and q.shape[1] != k.shape[1]:
        raise InvalidArgument(f"query has {q.shape[1]} heads and key {k.shape[1]}: pass "
                              "enable_gqa=True for grouped-query attention")
    causal, mask_mod = False, None
    if is_causal:
        causal = q.shape[2] == k.shape[2]
        mask_mod = None if causal else "k <= q"  # SDPA's top-left alignment
    mask = bias = None
    if attn_mask is not None:
        attn_mask = _as_4d(attn_mask, "attn_mask")
        if attn_mask.dtype == torch.bool:
            mask = attn_mask
        else:
            bias = attn_mask if attn_mask.dtype in (torch.float32, q.dtype) else \
                attn_mask.to(torch.float32)
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    if _direct(q, k, v, bias):  # the context straight away, in SDPA's layout
        d = q.device
        out = (_contexts.get(d) or context(d)).forward(
            q, k, v, None, None, causal, (-1, -1), 0.0, scale or 0.0, mask_mod, bias=bias,
            mask=mask, layout="bhsd")
    else:
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                        mask_mod=mask_mod, scale=scale, mask=mask, bias=bias).transpose(1, 2)
    return out[0] if unbatched else out


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, mask_mod=None,
                   mod_args=None):
    """FlexAttention's call on [b, h, s, d] tensors. score_mod: FlexAttention's
    score_mod(score, b, h, q_idx, kv_idx), traced into a flashjit expression, or the expression
    itself ("s + 0.5 * (k - q)"; see flashjit.h). block_mask: FlexAttention's BlockMask, whose
    mask_mod is traced and classified into flashjit's block classes once per BlockMask and shape
    (as FlexAttention's blocks are built once; outside torch.compile, which classifies every
    call), or flashjit's int32 block classes (create_block_mask) with mask_mod= the same mask as
    a function or an expression. kernel_options is accepted and ignored."""
    q, k, v = _to_bshd(query), _to_bshd(key), _to_bshd(value)
    if block_mask is not None and not isinstance(block_mask, Tensor):
        flex_mask = getattr(block_mask, "mask_mod", None)
        if not callable(flex_mask):
            raise InvalidArgument(f"block_mask: a {type(block_mask).__name__}; FlexAttention's "
                                  "BlockMask or flashjit's block classes (create_block_mask)")
        if mask_mod is not None:
            raise InvalidArgument("mask_mod: given beside a BlockMask, which carries its own")
        if _is_noop_mask(flex_mask):
            block_mask = None
        else:
            mask_mod, _, mod_args = _trace.expressions(flex_mask, None, mod_args, q.device)
            block_mask = _flex_classes(block_mask, q, k, mask_mod, mod_args)
    if q.shape[2] != k.shape[2] and not enable_gqa:
        raise InvalidArgument(f"query has {q.shape[2]} heads and key {k.shape[2]}: pass "
                              "enable_gqa=True for grouped-query attention")
    out, lse = attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, mod_args=mod_args,
                         block_mask=block_mask, scale=scale, return_lse=True)
    out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


# flashjit's block classes of each FlexAttention BlockMask, by the shapes and mask they served.
_flex_memo = weakref.WeakKeyDictionary()


def _flex_classes(flex_block_mask, q, k, mask_mod, mod_args):
    """The block classes of mask_mod (traced from flex_block_mask's) for q and k ([b, s, h, d]),
    built on the first call with this BlockMask and shapes and kept with it; None under
    torch.compile (the call classifies its masks itself)."""
    if mask_mod is None or torch.compiler.is_compiling():
        return None
    memo = _flex_memo.setdefault(flex_block_mask, {})
    key = (tuple(q.shape[:3]), tuple(k.shape[:3]), q.device, mask_mod)
    if key not in memo:
        memo[key] = create_block_mask(q, k, mask_mod=mask_mod, mod_args=mod_args)
    return memo[key]


def _is_noop_mask(fn):
    """Whether fn is FlexAttention's noop_mask (every pair kept)."""
    try:
        from torch.nn.attention.flex_attention import noop_mask
    except ImportError:
        return False
    return fn is noop_mask


__all__ = ["attention", "scaled_dot_product_attention", "flex_attention", "create_block_mask",
           "context",
           "attention_forward", "attention_backward", "attention_merge", "kv_cache_append",
           "kv_cache_append_packed", "kv_cache_append_quantized"]
