"""A thin ctypes binding of libflashjit for PyTorch tensors.

    import torch, flashjit
    ctx = flashjit.Context(backend="cuda")            # uses PyTorch's CUDA context
    out = ctx.forward(q, k, v, causal=True)           # q [b, sq, hq, d], k/v [b, sk, hkv, d|dv]

Tensors may have any strides with a contiguous last dimension; the call runs on PyTorch's current
stream. Errors raise FlashjitError with the library's message (which names the bad field).
"""
import ctypes
import os

_DTYPES = {"torch.float16": 0, "torch.bfloat16": 1, "torch.float32": 2, "torch.bool": 5,
           "torch.int32": 6}
_BACKENDS = {"auto": 0, "cuda": 1, "opencl": 2}
_SOURCES = ["none", "memory", "user cache", "shipped cache", "compiled"]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


class _ContextOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_int),
                ("device", ctypes.c_int32), ("cache_path", ctypes.c_char_p),
                ("shipped_caches", ctypes.POINTER(ctypes.c_char_p)),
                ("cache_readonly", ctypes.c_int32), ("tune", ctypes.c_int32),
                ("trusted_keys", ctypes.POINTER(ctypes.c_char_p))]


class _AttentionDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("softmax_scale", ctypes.c_float),
                ("causal", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float),
                ("mask_mod", ctypes.c_char_p), ("score_mod", ctypes.c_char_p),
                ("mod_args", ctypes.c_void_p), ("mod_args_count", ctypes.c_int64),
                ("alibi_slopes", ctypes.POINTER(_Tensor)), ("bias", ctypes.POINTER(_Tensor)),
                ("mask", ctypes.POINTER(_Tensor)), ("cu_seqlens_q", ctypes.POINTER(_Tensor)),
                ("cu_seqlens_k", ctypes.POINTER(_Tensor)), ("seqused_k", ctypes.POINTER(_Tensor)),
                ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_k", ctypes.c_int64),
                ("mask_ranges", ctypes.POINTER(_Tensor)), ("block_mask", ctypes.POINTER(_Tensor)),
                ("num_splits", ctypes.c_int32), ("page_table", ctypes.POINTER(_Tensor)),
                ("deterministic", ctypes.c_int32)]


class _CallInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("source", ctypes.c_int),
                ("lookup_ms", ctypes.c_double), ("render_ms", ctypes.c_double),
                ("compile_ms", ctypes.c_double), ("load_ms", ctypes.c_double),
                ("total_ms", ctypes.c_double), ("compiles", ctypes.c_uint64),
                ("variant", ctypes.c_char_p), ("kernel_path", ctypes.c_char_p),
                ("registers", ctypes.c_int32), ("spill_bytes", ctypes.c_int32),
                ("tuned", ctypes.c_int32)]


class FlashjitError(RuntimeError):
    pass


def _load(path=None):
    if path is None:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.environ.get("FLASHJIT_LIB", os.path.join(here, "..", "build", "libflashjit.so"))
    lib = ctypes.CDLL(path)
    lib.fj_status_string.restype = ctypes.c_char_p
    lib.fj_context_last_error.restype = ctypes.c_char_p
    lib.fj_last_create_error.restype = ctypes.c_char_p
    lib.fj_version.restype = ctypes.c_char_p
    lib.fj_context_options_init.argtypes = [ctypes.POINTER(_ContextOptions)]
    lib.fj_context_create.argtypes = [ctypes.POINTER(_ContextOptions), ctypes.POINTER(ctypes.c_void_p)]
    lib.fj_context_destroy.argtypes = [ctypes.c_void_p]
    lib.fj_context_last_error.argtypes = [ctypes.c_void_p]
    lib.fj_attention_desc_init.argtypes = [ctypes.POINTER(_AttentionDesc)]
    lib.fj_attention_forward.argtypes = [ctypes.c_void_p, ctypes.POINTER(_AttentionDesc)] + \
        [ctypes.POINTER(_Tensor)] * 5 + [ctypes.c_void_p]
    lib.fj_attention_merge.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Tensor),
                                       ctypes.POINTER(_Tensor), ctypes.c_int32,
                                       ctypes.POINTER(_Tensor), ctypes.POINTER(_Tensor),
                                       ctypes.c_void_p]
    lib.fj_kv_cache_append.argtypes = [ctypes.c_void_p] + [ctypes.POINTER(_Tensor)] * 6 + \
        [ctypes.c_void_p]
    lib.fj_attention_backward.argtypes = [ctypes.c_void_p, ctypes.POINTER(_AttentionDesc)] + \
        [ctypes.POINTER(_Tensor)] * 9 + [ctypes.c_void_p]
    lib.fj_context_last_call.argtypes = [ctypes.c_void_p, ctypes.POINTER(_CallInfo)]
    return lib


def _tensor(t):
    if t.dtype.__str__() not in _DTYPES:
        raise FlashjitError(f"unsupported dtype {t.dtype}")
    s = _Tensor()
    s.data = t.data_ptr()
    s.dtype = _DTYPES[str(t.dtype)]
    s.ndim = t.dim()
    for i in range(t.dim()):
        s.shape[i] = t.shape[i]
        s.stride[i] = t.stride(i)
    return s


class Context:
    def __init__(self, backend="cuda", device=0, cache_path=None, shipped_caches=(),
                 trusted_keys=(), lib=None):
        """shipped_caches: read-only cache files consulted after the user cache; trusted_keys:
        Ed25519 public keys (hex) one of which must have signed each shipped cache."""
        self.lib = _load(lib)
        opts = _ContextOptions()
        self.lib.fj_context_options_init(ctypes.byref(opts))
        opts.backend = _BACKENDS[backend]
        opts.device = device
        if cache_path is not None:
            opts.cache_path = cache_path.encode()
        # NULL-terminated string arrays; the library copies what it needs during the call.
        shipped = (ctypes.c_char_p * (len(shipped_caches) + 1))(
            *[p.encode() for p in shipped_caches], None)
        keys = (ctypes.c_char_p * (len(trusted_keys) + 1))(*[k.encode() for k in trusted_keys],
                                                           None)
        if shipped_caches:
            opts.shipped_caches = shipped
        if trusted_keys:
            opts.trusted_keys = keys
        handle = ctypes.c_void_p()
        st = self.lib.fj_context_create(ctypes.byref(opts), ctypes.byref(handle))
        if st != 0:
            raise FlashjitError(self.lib.fj_status_string(st).decode() + ": " +
                                self.lib.fj_last_create_error().decode())
        self.handle = handle

    def __del__(self):
        if getattr(self, "handle", None):
            self.lib.fj_context_destroy(self.handle)
            self.handle = None

    def forward(self, q, k, v, out=None, lse=None, causal=False, window=(-1, -1), softcap=0.0,
                scale=0.0, mask_mod=None, score_mod=None, mod_args=None, alibi_slopes=None,
                bias=None, mask=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                max_seqlen_q=0, max_seqlen_k=0, mask_ranges=None, block_mask=None, num_splits=0,
                page_table=None, stream=None):
        """mask_mod / score_mod: expression strings (see flashjit.h); mod_args: a float32 or
        int32 tensor on the device, read by arg[i] / iarg[i]. alibi_slopes: float32 [hq] or
        [b, hq]; bias (float32 or q's dtype) and mask (bool): [b | 1, hq | 1, sq | 1, sk],
        expanded (stride-0) tensors welcome. Variable lengths: q, k, v packed [total, heads, dim]
        with int32 cu_seqlens_q / cu_seqlens_k [batch + 1], optional seqused_k [batch], and the
        maxima max_seqlen_q / max_seqlen_k. mask_ranges: int32 [b | 1, hq | 1, sk, 2 or 4],
        FlashMask's masked row ranges per key. block_mask: int32 [b | 1, hq | 1, ceil(sq / 128),
        ceil(sk / 128)], 0 skip / 1 apply the masks / 2 keep the whole 128 x 128 block.
        num_splits: decode (at most 16 query rows per sequence) splits the keys this many ways
        (1 to 64; 0: the plan's choice). page_table: int32 [b, max_pages] for a paged KV cache,
        k and v then [num_pages, page_size, hkv, d] and seqused_k [b] required."""
        import torch
        if out is None:
            out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
        desc = _AttentionDesc()
        self.lib.fj_attention_desc_init(ctypes.byref(desc))
        desc.causal = int(causal)
        desc.window_left, desc.window_right = window
        desc.softcap = softcap
        desc.softmax_scale = scale
        desc.num_splits = num_splits
        if mask_mod is not None:
            desc.mask_mod = mask_mod.encode()
        if score_mod is not None:
            desc.score_mod = score_mod.encode()
        if mod_args is not None:
            desc.mod_args = mod_args.data_ptr()
            desc.mod_args_count = mod_args.numel()
        terms = {}  # keeps the ctypes structures alive through the call
        desc.max_seqlen_q, desc.max_seqlen_k = max_seqlen_q, max_seqlen_k
        for name, t in (("alibi_slopes", alibi_slopes), ("bias", bias), ("mask", mask),
                        ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                        ("seqused_k", seqused_k), ("mask_ranges", mask_ranges),
                        ("block_mask", block_mask), ("page_table", page_table)):
            if t is not None:
                terms[name] = _tensor(t)
                setattr(desc, name, ctypes.pointer(terms[name]))
        if stream is None and q.is_cuda:
            stream = torch.cuda.current_stream(q.device).cuda_stream
        tq, tk, tv, to = _tensor(q), _tensor(k), _tensor(v), _tensor(out)
        tl = _tensor(lse) if lse is not None else None
        st = self.lib.fj_attention_forward(self.handle, ctypes.byref(desc), ctypes.byref(tq),
                                           ctypes.byref(tk), ctypes.byref(tv), ctypes.byref(to),
                                           ctypes.byref(tl) if tl is not None else None, stream)
        if st != 0:
            raise FlashjitError(self.lib.fj_status_string(st).decode() + ": " +
                                self.lib.fj_context_last_error(self.handle).decode())
        return out

    def backward(self, q, k, v, out, dout, lse, dq=None, dk=None, dv=None, causal=False,
                 window=(-1, -1), softcap=0.0, scale=0.0, mask_mod=None, mod_args=None,
                 alibi_slopes=None, bias=None, mask=None, mask_ranges=None, block_mask=None,
                 deterministic=False, stream=None):
        """The gradients of forward() (see fj_attention_backward): q, k, v, out and lse as the
        forward had and wrote them (same options), dout the gradient of out; returns (dq, dk,
        dv), allocating what is not given."""
        import torch
        dq = torch.empty_like(q) if dq is None else dq
        dk = torch.empty_like(k) if dk is None else dk
        dv = torch.empty_like(v) if dv is None else dv
        desc = _AttentionDesc()
        self.lib.fj_attention_desc_init(ctypes.byref(desc))
        desc.causal = int(causal)
        desc.window_left, desc.window_right = window
        desc.softcap = softcap
        desc.softmax_scale = scale
        desc.deterministic = int(deterministic)
        if mask_mod is not None:
            desc.mask_mod = mask_mod.encode()
        if mod_args is not None:
            desc.mod_args = mod_args.data_ptr()
            desc.mod_args_count = mod_args.numel()
        terms = {}
        for name, t in (("alibi_slopes", alibi_slopes), ("bias", bias), ("mask", mask),
                        ("mask_ranges", mask_ranges), ("block_mask", block_mask)):
            if t is not None:
                terms[name] = _tensor(t)
                setattr(desc, name, ctypes.pointer(terms[name]))
        if stream is None and q.is_cuda:
            stream = torch.cuda.current_stream(q.device).cuda_stream
        ts = [_tensor(t) for t in (q, k, v, out, dout, lse, dq, dk, dv)]
        st = self.lib.fj_attention_backward(self.handle, ctypes.byref(desc),
                                            *[ctypes.byref(t) for t in ts], stream)
        if st != 0:
            raise FlashjitError(self.lib.fj_status_string(st).decode() + ": " +
                                self.lib.fj_context_last_error(self.handle).decode())
        return dq, dk, dv

    def kv_cache_append(self, k_new, v_new, k_cache, v_cache, page_table, seqused_k,
                        stream=None):
        """Writes k_new / v_new [b, tokens, hkv, d] into the paged caches [num_pages, page_size,
        hkv, d] at each sequence's length seqused_k[b] (int32 [b]), in the pages its row of
        page_table (int32 [b, max_pages]) lists (see fj_kv_cache_append). seqused_k is not
        changed: add the tokens to it before attending to them."""
        import torch
        ts = [_tensor(t) for t in (k_new, v_new, k_cache, v_cache, page_table, seqused_k)]
        if stream is None and k_cache.is_cuda:
            stream = torch.cuda.current_stream(k_cache.device).cuda_stream
        st = self.lib.fj_kv_cache_append(self.handle, *[ctypes.byref(t) for t in ts], stream)
        if st != 0:
            raise FlashjitError(self.lib.fj_status_string(st).decode() + ": " +
                                self.lib.fj_context_last_error(self.handle).decode())

    def merge(self, outs, lses, out=None, lse=None, stream=None):
        """Merges attention states over disjoint key sets (see fj_attention_merge): outs and
        lses are sequences of the partial outputs [b, s, h, dv] (or packed [total, h, dv]) and
        their float32 log-sum-exps [b, h, s] (or [h, total]); returns (out, lse), allocating
        what is not given (out in the states' dtype). out / lse may be one of the inputs."""
        import torch
        if len(outs) != len(lses) or not outs:
            raise FlashjitError("merge: outs and lses must be non-empty and of equal length")
        if out is None:
            out = torch.empty_like(outs[0])
        if lse is None:
            lse = torch.empty_like(lses[0])
        states = (_Tensor * len(outs))(*[_tensor(t) for t in outs])
        state_lses = (_Tensor * len(lses))(*[_tensor(t) for t in lses])
        to, tl = _tensor(out), _tensor(lse)
        if stream is None and out.is_cuda:
            stream = torch.cuda.current_stream(out.device).cuda_stream
        st = self.lib.fj_attention_merge(self.handle, states, state_lses, len(outs),
                                         ctypes.byref(to), ctypes.byref(tl), stream)
        if st != 0:
            raise FlashjitError(self.lib.fj_status_string(st).decode() + ": " +
                                self.lib.fj_context_last_error(self.handle).decode())
        return out, lse

    def last_call(self):
        info = _CallInfo()
        info.struct_size = ctypes.sizeof(_CallInfo)
        self.lib.fj_context_last_call(self.handle, ctypes.byref(info))
        return dict(source=_SOURCES[info.source], lookup_ms=info.lookup_ms,
                    render_ms=info.render_ms, compile_ms=info.compile_ms, load_ms=info.load_ms,
                    total_ms=info.total_ms, compiles=info.compiles,
                    variant=(info.variant or b"").decode(),
                    kernel_path=(info.kernel_path or b"").decode(),
                    registers=info.registers, spill_bytes=info.spill_bytes, tuned=info.tuned)
