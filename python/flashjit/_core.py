"""The flashjit context: attention calls on torch tensors or DLPack arrays.

    import flashjit
    ctx = flashjit.Context()                          # backend "auto": CUDA if usable, else OpenCL
    out = ctx.forward(q, k, v, causal=True)           # q [b, sq, hq, d], k/v [b, sk, hkv, d|dv]

Tensors may have any strides with a contiguous last dimension. CUDA tensors are used in place
on PyTorch's current stream (or `stream=`: a CUstream as an int, or a torch.cuda.Stream); host
arrays (NumPy, CPU torch) are copied to the device and back. Failures raise FlashjitError
subclasses (flashjit.errors) with the library's message, which names the bad field.
"""
import ctypes
import threading
import warnings

from . import _lib
from ._arrays import (Call, current_stream, empty_like, forward_out, is_torch, stream_function,
                      torch_cuda_signature, torch_shim)
from .errors import FlashjitError, InvalidArgument, error_for  # noqa: F401

_BACKEND_NAMES = {1: "cuda", 2: "opencl"}
# The fj_tensor arguments of the functions called through _run: (name, is output).
_FORWARD = (("q", False), ("k", False), ("v", False), ("out", True), ("lse", True))
_BACKWARD = (("q", False), ("k", False), ("v", False), ("out", False), ("dout", False),
             ("lse", False), ("dq", True), ("dk", True), ("dv", True))
_APPEND = (("k_new", False), ("v_new", False), ("k_cache", True), ("v_cache", True),
           ("page_table", False), ("seqused_k", False))
_APPEND_PACKED = _APPEND[:2] + (("cu_seqlens_new", False),) + _APPEND[2:]
_APPEND_QUANTIZED = _APPEND[:2] + (("cu_seqlens_new", False), ("k_descale", False),
                                   ("v_descale", False)) + _APPEND[2:]
_BLOCK_MASK = (("q", False), ("k", False), ("classes", True))
# fj_attention_desc as _run takes it: the options in this order, and the array fields (all
# fj_tensor pointers but mod_args, a pointer and a count; dbias written; a caller may stop
# before the descales, which only the forward takes).
_DESC_OPTIONS = ("causal", "window", "softcap", "scale", "mask_mod", "score_mod", "num_splits",
                 "deterministic", "max_seqlen_q", "max_seqlen_k")
_DESC_ARRAYS = ("alibi_slopes", "bias", "mask", "cu_seqlens_q", "cu_seqlens_k", "seqused_k",
                "mask_ranges", "block_mask", "page_table", "dbias", "mod_args", "q_descale",
                "k_descale", "v_descale")
# forward()'s out where the caller gives none: made beside q (see _run's make).
_MAKE_OUT = (3, 0, lambda arrays: forward_out(arrays[0], arrays[2]))
_BHSD = (0, 1, 2, 3)  # forward()'s q, k, v, out: the slots layout "bhsd" swaps
_PREPARED_LIMIT = 256  # prepared signatures kept per thread; the oldest go all at once
_RECENT_LIMIT = 8  # signatures per function that the C fast path tries before Python's


class _Prepared:
    """The ctypes arguments of one library call: an fj_tensor per array (None for None), the
    descriptor with its fields pointing at theirs, and the function. point() moves them to new
    arrays of the same signature."""

    def __init__(self, call, function, spec, arrays, options, desc_arrays):
        lib = call.ctx.lib
        self.fn = lib.unchecked[function]
        self.keep = call.keep  # what the structures need alive (capsules), as long as they live
        self.structs = [None if x is None else call.tensor(x, name, output)
                        for (name, output), x in zip(spec, arrays)]
        args = [None if t is None else _address(t) for t in self.structs]
        self.mod_args = None
        if options is not None:
            desc = self.desc = _lib.AttentionDesc()
            lib.fj_attention_desc_init(ctypes.byref(desc))
            o = dict(zip(_DESC_OPTIONS, options))
            desc.causal, desc.deterministic = int(o["causal"]), int(o["deterministic"])
            desc.window_left, desc.window_right = (int(w) for w in o["window"])
            desc.softcap, desc.softmax_scale = o["softcap"], o["scale"]
            desc.num_splits = o["num_splits"]
            desc.max_seqlen_q, desc.max_seqlen_k = o["max_seqlen_q"], o["max_seqlen_k"]
            if o["mask_mod"] is not None:
                desc.mask_mod = o["mask_mod"].encode()
            if o["score_mod"] is not None:
                desc.score_mod = o["score_mod"].encode()
            for name, x in zip(_DESC_ARRAYS, desc_arrays):
                t = None if x is None else call.tensor(x, name, output=name == "dbias")
                self.structs.append(t)
                if t is None:
                    continue
                if name != "mod_args":
                    setattr(desc, name, ctypes.pointer(t))
                elif t.ndim != 1:
                    raise InvalidArgument(f"mod_args: {t.ndim} dimensions, expected a 1-D "
                                          "float32 or int32 array")
                else:
                    self.mod_args = t
                    desc.mod_args, desc.mod_args_count = t.data, t.shape[0]
            args.insert(0, _address(desc))
        self.args = args
        self.live = [t for t in self.structs if t is not None]  # point()'s, in order
        self._call = [call.ctx.handle, *args, None]  # invoke's arguments, the stream last
        self._stream = None
        self._fast = {}  # the _fastcall.Call per layout (see fast_call)

    def point(self, ptrs):
        """Moves the structures to new data pointers: one for each array that is not None."""
        for t, ptr in zip(self.live, ptrs):
            t.data = ptr
        if self.mod_args is not None:
            self.desc.mod_args = self.mod_args.data

    def fast_call(self, fastcall, arrays, options, make=None, swapped=()):
        """The _fastcall.Call of this signature (made once per layout) for arrays (torch CUDA
        tensors or None, the forms this was prepared from, or for the slots in swapped those
        tensors' views with dimensions 1 and 2 swapped: a call's arrays in the caller's layout,
        whose data pointers are the prepared views') and options. make: (slot, like), a slot
        whose tensor a call may leave to the Call (given None) where that tensor is
        torch.empty_like of slot like's, as it is when the output was made so."""
        fast = self._fast.get(swapped)
        if fast is None:
            import torch
            slots = []
            for i, (x, t) in enumerate(zip(arrays, self.structs)):
                if x is None:
                    slots.append(None)
                    continue
                targets = [ctypes.addressof(t) + _lib.Tensor.data.offset]
                if t is self.mod_args:  # the descriptor holds mod_args' pointer too
                    targets.append(ctypes.addressof(self.desc) + _lib.AttentionDesc.mod_args.offset)
                like = None
                if make is not None and make[0] == i:
                    y = arrays[make[1]]
                    if (x.dtype, x.shape, x.stride()) == (y.dtype, y.shape, y.stride()):
                        like = make[1]
                slots.append((x, tuple(targets), like))
            leading = tuple(a if a is None else a.value for a in self._call[:-1])
            device = next(x for x in arrays if x is not None).get_device()
            fast = self._fast[swapped] = fastcall.Call(
                ctypes.cast(self.fn, ctypes.c_void_p).value, leading, tuple(slots), device,
                torch.Tensor, options, stream_function(), self, torch.empty_like, torch_shim())
        return fast

    def invoke(self, stream):
        """Calls the function on stream (a CUstream as an int; None: the default stream)."""
        if stream != self._stream:  # a new ctypes argument only when the stream changes
            self._stream = stream
            self._call[-1] = None if stream is None else ctypes.c_void_p(stream)
        return self.fn(*self._call)


def _allocator_of(alloc, free):
    """An fj_allocator calling alloc(nbytes, stream) and free(ptr, nbytes, stream); an exception
    in alloc is a failed allocation (NULL: the call fails with FJ_ERR_OUT_OF_MEMORY), one in
    free a warning. The callbacks live as long as the structure (kept by the context)."""
    def c_alloc(user, nbytes, stream):
        try:
            return alloc(nbytes, stream or 0) or None
        except Exception as e:  # noqa: BLE001 -- reported, then NULL back to the library
            warnings.warn(f"flashjit: the workspace allocator failed: {e!r}", RuntimeWarning)
            return None

    def c_free(user, ptr, nbytes, stream):
        try:
            free(ptr, nbytes, stream or 0)
        except Exception as e:  # noqa: BLE001 -- the library cannot act on it (at exit, say)
            warnings.warn(f"flashjit: giving a workspace back failed: {e!r}", RuntimeWarning)

    return _lib.Allocator(_lib.ALLOC_FN(c_alloc), _lib.FREE_FN(c_free), None)


def _address(struct):
    """A ctypes structure's address as an argument of an unchecked function (see _lib.load)."""
    return ctypes.c_void_p(ctypes.addressof(struct))


class Context:
    def __init__(self, backend="auto", device=0, cache_path=None, shipped_caches=(),
                 trusted_keys=(), lib=None, allocator=None):
        """backend: "auto" (CUDA where usable, else OpenCL), "cuda" or "opencl"; cache_path:
        the kernel cache file (None: the default location, ":memory:": none); shipped_caches:
        read-only cache files consulted after the user cache; trusted_keys: Ed25519 public keys
        (hex) one of which must have signed each shipped cache; allocator: a pair of callables
        (alloc(nbytes, stream) -> device pointer as an int, 0 on failure; free(ptr, nbytes,
        stream)) that the context's workspaces come from (see fj_allocator; flashjit.torch
        passes PyTorch's caching allocator), None: the backend's own allocations."""
        if backend not in _lib.BACKENDS:
            raise InvalidArgument(f"backend = {backend!r}, expected one of "
                                  f"{', '.join(_lib.BACKENDS)}")
        self.lib = _lib.load(lib)
        opts = _lib.ContextOptions()
        self.lib.fj_context_options_init(ctypes.byref(opts))
        opts.backend = _lib.BACKENDS[backend]
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
        if allocator is not None:
            opts.allocator = self._allocator = _allocator_of(*allocator)
        handle = ctypes.c_void_p()
        st = self.lib.fj_context_create(ctypes.byref(opts), ctypes.byref(handle))
        if st != 0:
            raise error_for(st, self.lib.fj_status_string(st).decode() + ": " +
                            self.lib.fj_last_create_error().decode())
        self.handle = handle
        info = _lib.DeviceInfo()
        info.struct_size = ctypes.sizeof(info)
        self.check(self.lib.fj_context_get_device_info(handle, ctypes.byref(info)))
        self.backend = _BACKEND_NAMES.get(info.backend, "?")
        self.device_name = info.name.decode()
        self.arch = info.arch.decode()
        # Where the kernels read: device pointers of CUDA, or buffers the context allocates.
        self.memory = "cuda" if self.backend == "cuda" else "opencl"
        self._local = threading.local()  # each thread's prepared calls (see _run)
        # A cache the context could not open or write is reported once, as a warning.
        note = self.lib.fj_context_last_error(handle).decode()
        if note:
            warnings.warn(f"flashjit: {note}", RuntimeWarning, stacklevel=2)

    def __del__(self):
        if getattr(self, "handle", None):
            self.lib.fj_context_destroy(self.handle)
            self.handle = None

    def __repr__(self):
        return f"<flashjit.Context {self.backend} {self.device_name} ({self.arch})>"

    def check(self, status):
        """Raises the error of a failed library call on this context."""
        if status != 0:
            raise error_for(status, self.lib.fj_status_string(status).decode() + ": " +
                            self.lib.fj_context_last_error(self.handle).decode())

    @property
    def cache_path(self):
        return self.lib.fj_context_cache_path(self.handle).decode()

    # ---- one library call ------------------------------------------------------------------
    def _run(self, function, spec, arrays, options=None, desc_arrays=(), stream=None,
             make=None, swapped=()):
        """Calls library function `function` on arrays, its fj_tensor arguments in order (None:
        NULL) named by spec ((name, is output) pairs); options (in _DESC_OPTIONS' order) and
        desc_arrays (in _DESC_ARRAYS' order) make its fj_attention_desc, options None for a
        function without one. make: (slot, like, maker), an output the caller may leave None:
        made by maker(arrays) (or, on the C fast path, as torch.empty_like of slot like's
        tensor where maker made it so); returns that slot's tensor. swapped: the slots whose
        arrays come with dimensions 1 and 2 swapped from what the function reads ([b, h, s, d]
        for its [b, s, h, d]); the function gets their views, the caller's layout comes back.

        Torch CUDA tensors take the prepared path: the ctypes arguments of a signature (options;
        each tensor's dtype, shape and strides) are built once per thread, and a repeated call
        only writes the data pointers: in C where the _fastcall extension is there (the
        thread's recent signatures tried in turn, the last one used first), else through
        ctypes. Other arrays (host arrays to stage, DLPack capsules to hold) go through a Call
        each time."""
        every = arrays + desc_arrays
        if stream is not None:  # a CUstream as an int or ctypes pointer, or a torch.cuda.Stream
            stream = getattr(stream, "cuda_stream", getattr(stream, "value", stream))
        queue = (function, swapped) if swapped else function  # the recent calls' key
        recent = getattr(self._local, "recent", None)
        if recent is not None:
            made = self._run_recent(recent.get(queue), every, options, stream)
            if made is not False:
                return made if made is not None or make is None else every[make[0]]
        given = every  # in the caller's layout
        if swapped:
            every = tuple(x.swapaxes(1, 2) if i in swapped and x is not None else x
                          for i, x in enumerate(every))
        if make is not None and every[make[0]] is None:
            i = make[0]
            made = make[2](every)
            every = every[:i] + (made,) + every[i + 1:]
            given = given[:i] + (made.swapaxes(1, 2) if i in swapped else made,) + given[i + 1:]
            if recent is not None and \
                    self._run_recent(recent.get(queue), given, options, stream) is not False:
                return given[i]
        result = None if make is None else given[make[0]]
        n = len(arrays)
        found = torch_cuda_signature(every) if self.memory == "cuda" else None
        if stream is None and self.backend == "cuda":
            stream = current_stream(arrays[0]) if found is not None else self._stream(arrays[0])
        if found is None:
            with Call(self) as call:
                prepared = _Prepared(call, function, spec, every[:n], options, every[n:])
                self.check(prepared.invoke(stream))
            return result
        local = self._local
        try:
            cache = local.prepared
        except AttributeError:
            cache = local.prepared = {}
            local.recent = {} if self.lib.fastcall is not None else None
        sig, ptrs = found
        key = (function, options, sig)
        prepared = cache.get(key)
        if prepared is None:
            if len(cache) >= _PREPARED_LIMIT:
                cache.clear()
                if local.recent is not None:
                    local.recent.clear()
            # Nothing is staged, so the structures may outlive the Call: the entry holds them.
            prepared = _Prepared(Call(self), function, spec, every[:n], options, every[n:])
            cache[key] = prepared
        else:
            prepared.point(ptrs)
        if local.recent is not None:  # first in line for the next call
            calls = local.recent.setdefault(queue, [])
            fast = prepared.fast_call(self.lib.fastcall, given, options,
                                      None if make is None else make[:2], swapped)
            if fast in calls:  # it refused these arrays (another device, a tensor subclass)
                calls.remove(fast)
            calls.insert(0, fast)
            del calls[_RECENT_LIMIT:]
        self.check(prepared.invoke(stream))
        return result

    def _run_recent(self, calls, every, options, stream):
        """Runs the first of calls (the C fast path's, most recent first) that takes these
        arrays and options; returns the tensor it made (None where it made none), or False
        where none took them."""
        for i, c in enumerate(calls or ()):
            done = c.run(every, options, stream)
            if done is not None:
                if i:
                    calls.insert(0, calls.pop(i))
                status, made = done
                if status:
                    self.check(status)
                return made
        return False

    def _stream(self, x):
        """PyTorch's current stream for a torch CUDA tensor, else the default stream (None)."""
        return current_stream(x) if is_torch(x) and x.is_cuda else None

    def forward(self, q, k, v, out=None, lse=None, causal=False, window=(-1, -1), softcap=0.0,
                scale=0.0, mask_mod=None, score_mod=None, mod_args=None, alibi_slopes=None,
                bias=None, mask=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                max_seqlen_q=0, max_seqlen_k=0, mask_ranges=None, block_mask=None, num_splits=0,
                page_table=None, q_descale=None, k_descale=None, v_descale=None, stream=None,
                layout="bshd"):
        """Attention (see fj_attention_forward); returns out, allocating it when not given
        (bfloat16 for FP8 inputs: q, k, v all float8_e4m3fn or all float8_e5m2, with optional
        float32 descale factors q_descale, k_descale, v_descale of shape [1], [hkv] or [b, hkv]).
        layout "bhsd": q, k, v and out are [b, h, s, d] (dense, not paged or packed; an out
        made here is too); the default "bshd": [b, s, h, d].
        mask_mod / score_mod: expression strings (see flashjit.h); mod_args: a float32 or int32
        array read by arg[i] / iarg[i]. alibi_slopes: float32 [hq] or [b, hq]; bias (float32 or
        q's dtype) and mask (bool, True keeps): [b | 1, hq | 1, sq | 1, sk], expanded (stride-0)
        tensors welcome. Variable lengths: q, k, v packed [total, heads, dim] with int32
        cu_seqlens_q / cu_seqlens_k [batch + 1], optional seqused_k [batch], and the maxima
        max_seqlen_q / max_seqlen_k. mask_ranges: int32 [b | 1, hq | 1, sk, 2 or 4], FlashMask's
        masked row ranges per key. block_mask: int32 [b | 1, hq | 1, ceil(sq / 128),
        ceil(sk / 128)], 0 skip / 1 apply the masks / 2 keep the whole 128 x 128 block.
        num_splits: decode (at most 16 query rows per sequence) splits the keys this many ways
        (1 to 64; 0: the plan's choice). page_table: int32 [b, max_pages] for a paged KV cache,
        k and v then [num_pages, page_size, hkv, d] and seqused_k [b] required. lse (float32
        [b, hq, sq], or [hq, total] packed) receives the log-sum-exps when given."""
        if layout == "bshd":
            swapped = ()
        elif layout == "bhsd":
            if page_table is not None or cu_seqlens_q is not None or cu_seqlens_k is not None:
                raise InvalidArgument("layout 'bhsd' takes dense [b, h, s, d] q, k, v; paged "
                                      "caches and packed sequences are laid out as 'bshd'")
            swapped = _BHSD
        else:
            raise InvalidArgument(f"layout = {layout!r}, expected 'bshd' or 'bhsd'")
        return self._run("fj_attention_forward", _FORWARD, (q, k, v, out, lse),
                         (causal, tuple(window), softcap, scale, mask_mod, score_mod,
                          num_splits, False, max_seqlen_q, max_seqlen_k),
                         (alibi_slopes, bias, mask, cu_seqlens_q, cu_seqlens_k, seqused_k,
                          mask_ranges, block_mask, page_table, None, mod_args, q_descale,
                          k_descale, v_descale), stream, _MAKE_OUT, swapped)

    def tune(self, q, k, v, out=None, lse=None, causal=False, window=(-1, -1), softcap=0.0,
             scale=0.0, mask_mod=None, score_mod=None, mod_args=None, alibi_slopes=None,
             bias=None, mask=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
             max_seqlen_q=0, max_seqlen_k=0, mask_ranges=None, block_mask=None, num_splits=0,
             page_table=None, stream=None):
        """Tunes the shape bucket of this forward (see fj_attention_tune; a decode's: its kernel
        and key splits), running the candidates on these arrays (out and lse are overwritten),
        and keeps the winner in the context's cache, where later calls of the bucket find it.
        Takes seconds; a bucket tuned before returns its record at once. Returns a dict:
        from_record, candidates, dropped, heuristic_us, best_us, best_config, bucket."""
        if out is None:
            out = forward_out(q, v)
        if stream is None and self.backend == "cuda":
            stream = self._stream(q)
        else:
            stream = getattr(stream, "cuda_stream", getattr(stream, "value", stream))
        result = _lib.TuneResult()
        result.struct_size = ctypes.sizeof(result)
        with Call(self) as call:
            prepared = _Prepared(call, "fj_attention_tune", _FORWARD, (q, k, v, out, lse),
                                 (causal, tuple(window), softcap, scale, mask_mod, score_mod,
                                  num_splits, False, max_seqlen_q, max_seqlen_k),
                                 (alibi_slopes, bias, mask, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                  mask_ranges, block_mask, page_table, None, mod_args))
            self.check(prepared.fn(self.handle, *prepared.args,
                                   None if stream is None else ctypes.c_void_p(stream),
                                   ctypes.byref(result)))
        return dict(from_record=bool(result.from_record), candidates=result.candidates,
                    dropped=result.dropped, heuristic_us=result.heuristic_us,
                    best_us=result.best_us, best_config=result.best_config.decode(),
                    bucket=result.bucket.decode())

    def backward(self, q, k, v, out, dout, lse, dq=None, dk=None, dv=None, causal=False,
                 window=(-1, -1), softcap=0.0, scale=0.0, mask_mod=None, score_mod=None,
                 mod_args=None, alibi_slopes=None, bias=None, mask=None, cu_seqlens_q=None,
                 cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0, max_seqlen_k=0,
                 mask_ranges=None, block_mask=None, deterministic=False, dbias=None,
                 stream=None):
        """The gradients of forward() (see fj_attention_backward): q, k, v, out and lse as the
        forward had and wrote them (same options), dout the gradient of out; returns (dq, dk,
        dv), allocating what is not given. Through a score_mod by its derivative, generated
        from the expression (mod_args get no gradient). dbias: a float32 array shaped as bias
        with each broadcast dimension of extent 1, which receives the bias's gradient (see
        bias_grad_shape)."""
        dq = empty_like(q, name="q") if dq is None else dq
        dk = empty_like(k, name="k") if dk is None else dk
        dv = empty_like(v, name="v") if dv is None else dv
        self._run("fj_attention_backward", _BACKWARD, (q, k, v, out, dout, lse, dq, dk, dv),
                  (causal, tuple(window), softcap, scale, mask_mod, score_mod, 0,
                   deterministic, max_seqlen_q, max_seqlen_k),
                  (alibi_slopes, bias, mask, cu_seqlens_q, cu_seqlens_k, seqused_k, mask_ranges,
                   block_mask, None, dbias, mod_args), stream)
        return dq, dk, dv

    def block_mask(self, q, k, mask_mod=None, mod_args=None, mask=None, mask_ranges=None,
                   classes=None, stream=None, cu_seqlens_q=None, cu_seqlens_k=None,
                   max_seqlen_q=0, max_seqlen_k=0):
        """The 128 x 128 block classes of the masks (see fj_block_mask_build) for a forward of q
        and k: int32 [b, hq, ceil(sq / 128), ceil(sk / 128)] (allocated when not given; extent
        1 where the masks do not differ by batch or head is also accepted), 0 skip, 1 apply the
        masks, 2 keep all. Pass them as block_mask= of calls with the same masks, which then
        skip their own classification. Packed sequences (q, k [total, heads, dim] with
        cu_seqlens_q / cu_seqlens_k and the maxima, as forward takes them): classes of the
        padded batch of the longest, b = len(cu_seqlens_q) - 1, sq = max_seqlen_q,
        sk = max_seqlen_k."""
        if classes is None:
            packed = cu_seqlens_q is not None
            if packed and (max_seqlen_q < 1 or max_seqlen_k < 1):
                raise InvalidArgument(f"max_seqlen_q = {max_seqlen_q}, max_seqlen_k = "
                                      f"{max_seqlen_k}: packed sequences' block classes are "
                                      "sized by the longest (both >= 1)")
            b = cu_seqlens_q.shape[0] - 1 if packed else q.shape[0]
            sq = max_seqlen_q if packed else q.shape[1]
            sk = max_seqlen_k if packed else k.shape[1]
            hq = q.shape[-2]
            classes = empty_like(q, (b, hq, (sq + 127) // 128, (sk + 127) // 128), "i32",
                                 name="q")
        self._run("fj_block_mask_build", _BLOCK_MASK, (q, k, classes),
                  (False, (-1, -1), 0.0, 0.0, mask_mod, None, 0, False, max_seqlen_q,
                   max_seqlen_k),
                  (None, None, mask, cu_seqlens_q, cu_seqlens_k, None, mask_ranges, None, None,
                   None, mod_args),
                  stream)
        return classes

    @staticmethod
    def bias_grad_shape(bias_shape, bias_strides, batch, heads_q, seqlen_q, seqlen_k):
        """The shape of the bias's gradient (desc.dbias): the bias's, with 1 wherever the bias
        broadcasts (extent 1, or stride 0)."""
        full = (batch, heads_q, seqlen_q)
        return tuple(1 if bias_shape[a] == 1 or bias_strides[a] == 0 else full[a]
                     for a in range(3)) + (seqlen_k,)

    def kv_cache_append(self, k_new, v_new, k_cache, v_cache, page_table, seqused_k,
                        stream=None, cu_seqlens_new=None, k_descale=None, v_descale=None):
        """Writes k_new / v_new [b, tokens, hkv, d] into the paged caches [num_pages, page_size,
        hkv, d] at each sequence's length seqused_k[b] (int32 [b]), in the pages its row of
        page_table (int32 [b, max_pages]) lists (see fj_kv_cache_append). With cu_seqlens_new
        (int32 [b + 1]) the new tokens are packed [tokens, hkv, d], sequence b's from row
        cu_seqlens_new[b] (see fj_kv_cache_append_packed). Tokens of another dtype than the
        caches' (float16, bfloat16, float32) are rounded into it; into an FP8 cache divided by
        k_descale / v_descale (float32 [1], [hkv] or [b, hkv], the attention's descale
        factors; None: 1) and saturated (see fj_kv_cache_append_quantized). seqused_k is not
        changed: add the tokens to it before attending to them."""
        if k_descale is not None or v_descale is not None:
            self._run("fj_kv_cache_append_quantized", _APPEND_QUANTIZED,
                      (k_new, v_new, cu_seqlens_new, k_descale, v_descale, k_cache, v_cache,
                       page_table, seqused_k), stream=stream)
        elif cu_seqlens_new is None:
            self._run("fj_kv_cache_append", _APPEND,
                      (k_new, v_new, k_cache, v_cache, page_table, seqused_k), stream=stream)
        else:
            self._run("fj_kv_cache_append_packed", _APPEND_PACKED,
                      (k_new, v_new, cu_seqlens_new, k_cache, v_cache, page_table, seqused_k),
                      stream=stream)

    def merge(self, outs, lses, out=None, lse=None, stream=None):
        """Merges attention states over disjoint key sets (see fj_attention_merge): outs and
        lses are sequences of the partial outputs [b, s, h, dv] (or packed [total, h, dv]) and
        their float32 log-sum-exps [b, h, s] (or [h, total]); returns (out, lse), allocating
        what is not given (out in the states' dtype). out / lse may be one of the inputs."""
        if len(outs) != len(lses) or not outs:
            raise InvalidArgument("merge: outs and lses must be non-empty and of equal length")
        if out is None:
            out = empty_like(outs[0], name="outs[0]")
        if lse is None:
            lse = empty_like(lses[0], dtype="f32", name="lses[0]")
        if stream is None and self.backend == "cuda":
            stream = self._stream(out)
        with Call(self) as call:
            states = (_lib.Tensor * len(outs))(*[call.tensor(t, f"outs[{i}]")
                                                  for i, t in enumerate(outs)])
            state_lses = (_lib.Tensor * len(lses))(*[call.tensor(t, f"lses[{i}]")
                                                      for i, t in enumerate(lses)])
            to = call.tensor(out, "out", output=True)
            tl = call.tensor(lse, "lse", output=True)
            self.check(self.lib.fj_attention_merge(self.handle, states, state_lses, len(outs),
                                                   ctypes.byref(to), ctypes.byref(tl),
                                                   stream))
        return out, lse

    def last_call(self):
        """What the last call ran: kernel path, variant, where the binary came from, times, the
        device workspace it used, and everything it launched in order (`launched`: kernel paths
        and "memset", e.g. ["cuda.classify", "cuda.fwd.wgmma"])."""
        info = _lib.CallInfo()
        info.struct_size = ctypes.sizeof(_lib.CallInfo)
        self.check(self.lib.fj_context_last_call(self.handle, ctypes.byref(info)))
        return dict(source=_lib.SOURCES[info.source], lookup_ms=info.lookup_ms,
                    render_ms=info.render_ms, compile_ms=info.compile_ms, load_ms=info.load_ms,
                    total_ms=info.total_ms, compiles=info.compiles,
                    variant=(info.variant or b"").decode(),
                    kernel_path=(info.kernel_path or b"").decode(),
                    registers=info.registers, spill_bytes=info.spill_bytes, tuned=info.tuned,
                    workspace_bytes=info.workspace_bytes,
                    launched=[x for x in (info.launched or b"").decode().split(",") if x])


__all__ = ["Context", "FlashjitError"]
