#!/usr/bin/env python3
"""Writes seed inputs for fuzz_validate into corpus/validate: valid requests (dense, packed,
with masks and expressions), encoded as fuzz_validate.c and fuzz_input.h read them, so the
fuzzer starts from requests that plan and mutates them field by field. Run it again after
changing that encoding. Usage: python3 fuzz/seeds.py"""
import os
import struct

BF16, F32, I32, BOOL = 1, 2, 6, 5


def num(v):
    """fuzz_int: one tag byte below 0xf0 and one value byte, or 0xff and 8 bytes."""
    if 0 <= v <= 255:
        return bytes([0, v])
    return bytes([0xff]) + struct.pack("<q", v)


def tensor(dtype, shape, offset=0, present=True):
    ndim = len(shape)
    shape = list(shape) + [1] * (4 - ndim)
    strides, step = [0] * 4, 1
    for i in reversed(range(ndim)):
        strides[i], step = step, step * shape[i]
    out = bytes([offset, 1 if present else 0, dtype, ndim])
    for i in range(4):
        out += num(shape[i]) + num(strides[i])
    return out


def request(tensors, present, scale=0.0, softcap=0.0, causal=0, window=(-1, -1), maxq=0, maxk=0,
            nargs=0, mask="", score="", config="", merge=0):
    out = b"".join(tensors)
    out += struct.pack("<H", present) + bytes([0])  # which optional tensors; the desc's own size
    out += struct.pack("<f", scale) + struct.pack("<f", softcap) + bytes([1, 1])
    out += num(causal) + num(window[0] + 2) + num(window[1] + 2) + num(maxq) + num(maxk)
    out += num(nargs + 1) + bytes([1 if nargs else 0, 0])
    out += b"\0".join(s.encode() for s in (mask, score, config)) + b"\0"
    return out + bytes([merge + 1])  # the merge's state count (fuzz_validate.c reads n - 1)


def dense(b, sq, sk, hq, hkv, d, extra=()):
    lse = tensor(F32, (b, hq, sq))
    ts = [tensor(BF16, (b, sq, hq, d)), tensor(BF16, (b, sk, hkv, d)), tensor(BF16, (b, sk, hkv, d)),
          tensor(BF16, (b, sq, hq, d)), lse]
    ts += list(extra) + [tensor(F32, (1,))] * (8 - len(extra))
    return ts


seeds = {
    "dense": request(dense(2, 128, 256, 8, 2, 64), 1 << 8, causal=1),
    "window": request(dense(1, 300, 517, 4, 4, 72), 0, window=(100, 0), softcap=30.0),
    "masks": request(dense(1, 200, 200, 2, 2, 128, [tensor(F32, (2,)), tensor(F32, (1, 2, 200, 200)),
                                                   tensor(BOOL, (1, 1, 1, 200))]),
                     0b111 | 1 << 8, mask="q / 64 == k / 64", score="s - arg[h] * abs(q - k)",
                     nargs=4),
    "packed": request([tensor(BF16, (500, 4, 64)), tensor(BF16, (700, 4, 64)),
                       tensor(BF16, (700, 4, 64)), tensor(BF16, (500, 4, 64)),
                       tensor(F32, (4, 500)), tensor(F32, (1,)), tensor(F32, (1,)),
                       tensor(F32, (1,)), tensor(I32, (4,)), tensor(I32, (4,)), tensor(I32, (3,)),
                       tensor(F32, (1,)), tensor(F32, (1,))],
                      0b111000 | 1 << 8, maxq=300, maxk=400, config="tile_m=64,tile_n=64"),
    # A merge of 3 states (and their lses) into t[12], with lse t[11] (present bit 9).
    "merge": request([tensor(BF16, (2, 16, 4, 64))] * 6 + [tensor(F32, (2, 4, 16))] * 6 +
                     [tensor(BF16, (2, 16, 4, 64))], 1 << 9, merge=3),
}
folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "validate")
os.makedirs(folder, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} seeds to {folder}")
