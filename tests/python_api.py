"""The installed Python package on a real device without torch: NumPy arrays (through DLPack)
against float64 references computed here. Forward (f32, f16; causal, GQA, odd sizes, strided
[b, h, s, d] views, lse), the backward against analytic gradients (also through a score_mod,
with the bias's gradient), the merge of two key halves against the whole, block classes
built once and used (dense and packed), workspaces from the caller's allocator, tuning a paged
decode, and errors raised as the right FlashjitError subclass naming the field.
Usage: python tests/python_api.py [backend]   (default opencl; exits 77 without a device)"""
import sys

import numpy as np

import flashjit

backend = sys.argv[1] if len(sys.argv) > 1 else "opencl"
assert "torch" not in sys.modules, "import flashjit imported torch"
try:
    ctx = flashjit.Context(backend=backend, cache_path=":memory:")
except flashjit.NoDevice as e:
    print(f"SKIP: {e}")
    sys.exit(77)
print(ctx, flashjit.info()["version"])
rng = np.random.default_rng(1234)
failures = 0


def check(name, ok, detail=""):
    global failures
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")


def reference(q, k, v, causal, scale=None):
    """Attention in float64 on [b, s, h, d] arrays; returns (out, lse [b, hq, sq], p)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hkv, axis=2)
    v = np.repeat(v, hq // hkv, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * (scale or 1 / np.sqrt(d))
    if causal:
        keep = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq
        s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = (np.log(p.sum(-1)) + m[..., 0])
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v), lse, p


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# Forward: f32 to 1e-4 relative; f16 within twice a plain f16 computation's error (+ rounding).
for dtype, causal, (b, sq, sk, hq, hkv, d, dv) in [
        (np.float32, False, (2, 37, 53, 4, 2, 32, 32)),
        (np.float32, True, (1, 64, 64, 3, 1, 40, 24)),
        (np.float16, True, (2, 19, 77, 8, 2, 64, 64)),
        (np.float16, False, (1, 5, 300, 4, 4, 128, 128))]:
    q, k, v = rand(b, sq, hq, d, dtype=dtype), rand(b, sk, hkv, d, dtype=dtype), \
        rand(b, sk, hkv, dv, dtype=dtype)
    lse = np.full((b, hq, sq), np.nan, np.float32)
    out = ctx.forward(q, k, v, lse=lse, causal=causal)
    ref, ref_lse, p = reference(q, k, v, causal)
    err = np.abs(out.astype(np.float64) - ref).max()
    if dtype == np.float32:
        ok, bar = err <= 1e-4 * np.abs(ref).max() + 1e-6, "1e-4 relative"
    else:
        pv = np.repeat(v, hq // hkv, axis=2).astype(np.float32)
        plain = np.einsum("bhqk,bkhd->bqhd", p.astype(np.float16).astype(np.float32), pv)
        plain_err = np.abs(plain.astype(np.float16).astype(np.float64) - ref).max()
        ulp = np.spacing(np.float16(np.abs(ref).max())).astype(np.float64)
        ok, bar = err <= 2 * plain_err + 2 * ulp, f"2 x plain {plain_err:.3g} + 2 ulp"
    lse_err = np.abs(lse - ref_lse).max()
    check(f"forward {np.dtype(dtype).name} causal={int(causal)} b{b} sq{sq} sk{sk} hq{hq} "
          f"hkv{hkv} d{d} dv{dv}", ok and lse_err < 1e-3 and out.dtype == dtype,
          f"err {err:.3g} ({bar}), lse {lse_err:.3g}, {ctx.last_call()['kernel_path']}")

# The caller's allocator for workspaces (flashjit.torch passes PyTorch's caching allocator):
# here the library's own fj_malloc on that context, counted. A split decode takes its partial
# states from it, gives them back when the context goes, and equals the plain context's result.
import ctypes  # noqa: E402

held = {}
owner = {}  # the context's library and handle (not the context: del must destroy it)


def ws_alloc(nbytes, stream):
    ptr = ctypes.c_void_p()
    if owner["lib"].fj_malloc(owner["handle"], nbytes, ctypes.byref(ptr)) != 0:
        return 0
    held[ptr.value] = nbytes
    return ptr.value


def ws_free(ptr, nbytes, stream):
    assert held.pop(ptr) == nbytes
    owner["lib"].fj_free(owner["handle"], ctypes.c_void_p(ptr))


actx = flashjit.Context(backend=backend, cache_path=":memory:", allocator=(ws_alloc, ws_free))
owner.update(lib=actx.lib, handle=actx.handle)
q, k = rand(2, 1, 8, 32), rand(2, 700, 2, 32)
out_alloc = actx.forward(q, k, k, num_splits=4)
took = dict(held)
out_plain = ctx.forward(q, k, k, num_splits=4)
del actx  # destroys the context, which gives its workspace back
check("workspaces from the caller's allocator", len(took) == 1 and not held and
      np.array_equal(out_alloc, out_plain), f"{len(took)} taken, {len(held)} not given back")

# Tuning a paged decode's bucket (kernel and key splits) from Python: measured once, then the
# record; the call after it takes the record.
tctx = flashjit.Context(backend=backend, cache_path=":memory:")
kc = rand(40, 16, 2, 32)
table = rng.permutation(40).astype(np.int32).reshape(2, 20)
used = np.array([300, 170], np.int32)
q = rand(2, 1, 8, 32)
paged = dict(page_table=table, seqused_k=used, max_seqlen_k=320)
first = tctx.tune(q, kc, kc, **paged)
again = tctx.tune(q, kc, kc, **paged)
out = tctx.forward(q, kc, kc, **paged)
check("tune a paged decode", not first["from_record"] and first["candidates"] > 1 and
      first["bucket"].startswith("dec.") and again["from_record"] and
      again["best_config"] == first["best_config"] and tctx.last_call()["tuned"] == 1,
      f"{first['bucket']}: {first['candidates']} candidates, best {first['best_config']}")
del tctx

# Strided views: [b, h, s, d] storage passed as [b, s, h, d] (DLPack strides).
qh, kh, vh = rand(2, 4, 33, 16), rand(2, 2, 45, 16), rand(2, 2, 45, 16)
q, k, v = (x.transpose(0, 2, 1, 3) for x in (qh, kh, vh))
out = ctx.forward(q, k, v, causal=True)
err = np.abs(out - reference(q, k, v, True)[0]).max()
check("forward on transposed views", err < 1e-4, f"err {err:.3g}")
# The same arrays in their own [b, h, s, d] layout: out made in that layout, and given.
out = ctx.forward(qh, kh, vh, causal=True, layout="bhsd")
err = np.abs(out.transpose(0, 2, 1, 3) - reference(q, k, v, True)[0]).max()
given = np.full((2, 4, 33, 16), np.nan, np.float32)
again = ctx.forward(qh, kh, vh, out=given, causal=True, layout="bhsd")
check("forward in layout bhsd", out.shape == (2, 4, 33, 16) and err < 1e-4 and
      again is given and np.array_equal(given, out), f"err {err:.3g}")

# Backward: f32 gradients against the analytic ones in float64.
b, sq, sk, hq, hkv, d = 2, 21, 30, 4, 2, 16
q, k, v, dout = rand(b, sq, hq, d), rand(b, sk, hkv, d), rand(b, sk, hkv, d), rand(b, sq, hq, d)
lse = np.empty((b, hq, sq), np.float32)
out = ctx.forward(q, k, v, lse=lse, causal=True)
dq, dk, dv = ctx.backward(q, k, v, out, dout, lse, causal=True)
ref, _, p = reference(q, k, v, True)
g = hq // hkv
do = dout.astype(np.float64)
vv = np.repeat(v.astype(np.float64), g, axis=2)
kk = np.repeat(k.astype(np.float64), g, axis=2)
dp = np.einsum("bqhd,bkhd->bhqk", do, vv)
ds = p * (dp - np.einsum("bqhd,bqhd->bhq", do, ref)[..., None]) / np.sqrt(d)
ref_dq = np.einsum("bhqk,bkhd->bqhd", ds, kk)
ref_dk = np.einsum("bhqk,bqhd->bkhd", ds, q.astype(np.float64)).reshape(b, sk, hkv, g, d).sum(3)
ref_dv = np.einsum("bhqk,bqhd->bkhd", p, do).reshape(b, sk, hkv, g, d).sum(3)
for name, got, want in (("dq", dq, ref_dq), ("dk", dk, ref_dk), ("dv", dv, ref_dv)):
    err = np.abs(got - want).max() / np.abs(want).max()
    check(f"backward {name}", err < 1e-4, f"relative err {err:.3g}")

# Backward through a score_mod with a bias shared by the batch: dq and the bias's gradient
# (summed over the batch) against float64 ones computed here.
b, sq, sk, hq, d = 2, 13, 19, 2, 16
q, k, v, dout = rand(b, sq, hq, d), rand(b, sk, hq, d), rand(b, sk, hq, d), rand(b, sq, hq, d)
bias = rand(1, hq, sq, sk)
mod = "s * 0.5 + tanh(s)"
lse = np.empty((b, hq, sq), np.float32)
out = ctx.forward(q, k, v, lse=lse, score_mod=mod, bias=bias)
dbias = np.full((1, hq, sq, sk), np.nan, np.float32)
dq, dk, dv = ctx.backward(q, k, v, out, dout, lse, score_mod=mod, bias=bias, dbias=dbias)
qd, kd, vd, gd = (x.astype(np.float64) for x in (q, k, v, dout))
s_in = np.einsum("bqhd,bkhd->bhqk", qd, kd) / np.sqrt(d) + bias.astype(np.float64)
s_out = 0.5 * s_in + np.tanh(s_in)
p = np.exp(s_out - s_out.max(-1, keepdims=True))
p /= p.sum(-1, keepdims=True)
o = np.einsum("bhqk,bkhd->bqhd", p, vd)
dp = np.einsum("bqhd,bkhd->bhqk", gd, vd)
ds = p * (dp - np.einsum("bqhd,bqhd->bhq", gd, o)[..., None]) * (1.5 - np.tanh(s_in) ** 2)
ref_dq = np.einsum("bhqk,bkhd->bqhd", ds, kd) / np.sqrt(d)
ref_dbias = ds.sum(0, keepdims=True)
for name, got, want in (("dq", dq, ref_dq), ("dbias", dbias, ref_dbias)):
    err = np.abs(got - want).max() / np.abs(want).max()
    check(f"backward through score_mod, {name}", err < 1e-4, f"relative err {err:.3g}")

# Merge: attention over two key halves, merged, equals attention over all keys.
q, k, v = rand(1, 9, 2, 32), rand(1, 40, 2, 32), rand(1, 40, 2, 32)
parts = []
for lo, hi in ((0, 17), (17, 40)):
    lse = np.empty((1, 2, 9), np.float32)
    parts.append((ctx.forward(q, k[:, lo:hi], v[:, lo:hi], lse=lse), lse))
out, lse = ctx.merge([o for o, _ in parts], [l for _, l in parts])
ref, ref_lse, _ = reference(q, k, v, False)
err = max(np.abs(out - ref).max(), np.abs(lse - ref_lse).max())
check("merge of two key halves", err < 1e-4, f"err {err:.3g}")

# Block classes built once (documents of 32 and a 16-key prefix, 300 x 300): a forward given
# them as block_mask equals one that classifies itself.
q, k, v = rand(1, 300, 2, 32), rand(1, 300, 1, 32), rand(1, 300, 1, 32)
docs = "q / 32 == k / 32 || k < 16"
classes = ctx.block_mask(q, k, mask_mod=docs)
want = np.array([[1 if qb == kb or kb == 0 else 0 for kb in range(3)] for qb in range(3)])
got = ctx.forward(q, k, v, mask_mod=docs, block_mask=classes)
err = np.abs(got - ctx.forward(q, k, v, mask_mod=docs)).max()
check("block_mask built once", classes.shape == (1, 2, 3, 3) and
      (classes[0, 0] == want).all() and err < 1e-6,
      f"classes {classes[0, 0].tolist()}, err {err:.3g}")

# The same documents over two packed sequences (200 and 300 rows): classes of the padded batch
# of the longest, and a forward given them equals one that classifies itself.
cu = np.array([0, 200, 500], np.int32)
pq, pk, pv = rand(500, 2, 32), rand(500, 1, 32), rand(500, 1, 32)
packed = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=300, max_seqlen_k=300)
classes = ctx.block_mask(pq, pk, mask_mod=docs, **packed)
got = ctx.forward(pq, pk, pv, mask_mod=docs, block_mask=classes, **packed)
launched = ctx.last_call()["launched"]  # the forward alone: no classification pre-pass
err = np.abs(got - ctx.forward(pq, pk, pv, mask_mod=docs, **packed)).max()
check("block_mask built once, packed sequences", classes.shape == (2, 2, 3, 3) and
      (classes[0, 0] == want).all() and (classes[1, 1] == want).all() and err < 1e-6 and
      launched == [ctx.last_call()["kernel_path"]],
      f"classes {classes[1, 0].tolist()}, err {err:.3g}, launched {launched}")

# A bias and ALiBi over a paged cache (the table's 64 keys) equal them over the same keys
# contiguous.
q, kc, vc = rand(1, 8, 2, 32), rand(4, 16, 2, 32), rand(4, 16, 2, 16)
bias, slopes = rand(1, 2, 8, 64), np.array([0.5, 0.125], np.float32)
got = ctx.forward(q, kc, vc, page_table=np.array([[2, 0, 3, 1]], np.int32),
                  seqused_k=np.full(1, 64, np.int32), max_seqlen_k=64, bias=bias,
                  alibi_slopes=slopes)
order = [2, 0, 3, 1]
want = ctx.forward(q, kc[order].reshape(1, 64, 2, 32), vc[order].reshape(1, 64, 2, 16),
                   bias=bias, alibi_slopes=slopes)
err = np.abs(got - want).max()
check("bias and ALiBi over a paged cache", err < 1e-4, f"err {err:.3g}")

# Packed queries over a paged cache (a serving batch of a 3-row chunk and a decode row), split
# in two: each sequence's rows and lse are the float64 reference's over its keys, causal
# bottom-right.
q, kc, vc = rand(4, 2, 32), rand(5, 16, 2, 32), rand(5, 16, 2, 16)
table, used, lens = np.array([[2, 0], [4, 1]], np.int32), np.array([20, 9], np.int32), [3, 1]
lse = np.empty((2, 4), np.float32)
got = ctx.forward(q, kc, vc, lse=lse, cu_seqlens_q=np.array([0, 3, 4], np.int32),
                  max_seqlen_q=3, page_table=table, seqused_k=used, causal=True, num_splits=2)
err, row = 0.0, 0
for b in range(2):
    keys = kc[table[b]].reshape(1, 32, 2, 32)[:, :used[b]]
    vals = vc[table[b]].reshape(1, 32, 2, 16)[:, :used[b]]
    want, want_lse, _ = reference(q[None, row:row + lens[b]], keys, vals, True)
    err = max(err, np.abs(got[row:row + lens[b]] - want[0]).max(),
              np.abs(lse[:, row:row + lens[b]] - want_lse[0]).max())
    row += lens[b]
check("packed queries over a paged cache", got.shape == (4, 2, 16) and err < 1e-4,
      f"err {err:.3g}")

# Packed new tokens appended to a paged cache (2, 0 and 3 tokens; row 0 of no sequence; the
# last token beyond its pages): each lands at its sequence's length in its pages, nothing else
# changes.
kc, vc = rand(6, 4, 2, 8), rand(6, 4, 2, 16)
kn, vn = rand(6, 2, 8), rand(6, 2, 16)
table, used = np.array([[3, 0], [5, 1], [2, 4]], np.int32), np.array([1, 4, 6], np.int32)
first = np.array([1, 3, 3, 6], np.int32)
kc0, want_k, want_v = kc.copy(), kc.copy(), vc.copy()
for b in range(3):
    for t in range(first[b + 1] - first[b]):
        pos = used[b] + t
        if pos < 8:
            want_k[table[b, pos // 4], pos % 4] = kn[first[b] + t]
            want_v[table[b, pos // 4], pos % 4] = vn[first[b] + t]
ctx.kv_cache_append(kn, vn, kc, vc, table, used, cu_seqlens_new=first)
check("packed kv_cache_append", np.array_equal(kc, want_k) and np.array_equal(vc, want_v) and
      not np.array_equal(kc0, want_k))

# Errors: the subclass and the field.
q, k, v = rand(1, 8, 2, 32), rand(1, 8, 2, 32), rand(1, 8, 2, 16)
cases = [("bad head dim", lambda: ctx.forward(q, rand(1, 8, 2, 24), v), flashjit.InvalidArgument,
          "k"),
         ("float64", lambda: ctx.forward(q.astype(np.float64), k, v), flashjit.InvalidArgument,
          "q"),
         ("lse shape", lambda: ctx.forward(q, k, v, lse=np.empty((1, 2, 7), np.float32)),
          flashjit.InvalidArgument, "lse"),
         ("bad backend", lambda: flashjit.Context(backend="metal"), flashjit.InvalidArgument,
          "backend"),
         ("tune: bad head dim", lambda: ctx.tune(q, rand(1, 8, 2, 24), v),
          flashjit.InvalidArgument, "k"),
         ("block classes with a paged cache",
          lambda: ctx.forward(q, rand(4, 16, 2, 32), rand(4, 16, 2, 16),
                              page_table=np.zeros((1, 4), np.int32),
                              seqused_k=np.full(1, 8, np.int32), max_seqlen_k=64,
                              mask_mod="k <= q", block_mask=np.ones((1, 2, 1, 1), np.int32)),
          flashjit.Unsupported, "block_mask"),
         ("key offsets with a paged cache",
          lambda: ctx.forward(rand(8, 2, 32), rand(4, 16, 2, 32), rand(4, 16, 2, 16),
                              page_table=np.zeros((1, 4), np.int32),
                              seqused_k=np.full(1, 8, np.int32), max_seqlen_q=8,
                              cu_seqlens_q=np.array([0, 8], np.int32),
                              cu_seqlens_k=np.array([0, 8], np.int32)),
          flashjit.Unsupported, "cu_seqlens_k"),
         ("unknown layout", lambda: ctx.forward(q, k, v, layout="bsdh"),
          flashjit.InvalidArgument, "layout"),
         ("layout bhsd with a paged cache",
          lambda: ctx.forward(q, rand(4, 16, 2, 32), rand(4, 16, 2, 16), layout="bhsd",
                              page_table=np.zeros((1, 4), np.int32),
                              seqused_k=np.full(1, 8, np.int32), max_seqlen_k=64),
          flashjit.InvalidArgument, "bhsd"),
         ("descale factors for a float32 cache",
          lambda: ctx.kv_cache_append(rand(1, 1, 2, 8), rand(1, 1, 2, 8), rand(2, 4, 2, 8),
                                      rand(2, 4, 2, 8), np.zeros((1, 2), np.int32),
                                      np.zeros(1, np.int32), k_descale=np.ones(1, np.float32)),
          flashjit.InvalidArgument, "k_descale"),
         ("block classes of packed sequences without their maxima",
          lambda: ctx.block_mask(pq, pk, mask_mod=docs, cu_seqlens_q=cu, cu_seqlens_k=cu),
          flashjit.InvalidArgument, "max_seqlen_q")]
for name, fn, cls, field in cases:
    try:
        fn()
        check(f"error: {name}", False, "no exception")
    except cls as e:
        check(f"error: {name}", field in str(e), f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - any other type is the failure reported
        check(f"error: {name}", False, f"{type(e).__name__}: {e}")
sys.exit(1 if failures else 0)
