"""Timing-only copies of the tensor-core decode kernel (templates/attn_decode_mma.cu.lua), each
with one part of its work taken out, to find where its time goes. Each copy is written to a
directory of its own, which FLASHJIT_TEMPLATE_DIR points the library at (the other templates
come from the library as built). The copies without arithmetic give wrong results: time them,
never check them.

Variants:
  nomath        the tile loop waits for its tile and refills the ring, then skips the tile
  sonly         only S = Q K^T of each tile (then skips the rest)
  nosm          the products without the softmax (scaling, masking, online max and sum)
  nohint        bulk copies without the evict-first L2 policy (results unchanged)
  nohint_nomath nohint and nomath
  nomath_noepi  nomath, and the block returns after its loop (no combine, no stores)

Usage: python3 bench/decode_variants.py OUT_DIR [VARIANT ...]
then, on the GPU machine, for example:
  python3 bench/ab_libs.py --libs build/libflashjit.so,build/libflashjit.so \\
      --names real,nomath --envs ';FLASHJIT_TEMPLATE_DIR=OUT_DIR/nomath' --cases decode
Each edit is found by a piece of the template's text; where the template has changed so that
a piece is gone, the script stops with the piece it missed."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "templates", "attn_decode_mma.cu.lua")
NAME = os.path.basename(TEMPLATE)

# (after the `% end` of the FP8 branch, so that every kind of cache skips its tile)
SLOT = "        const elem_t *slot = ring + (tile % STAGES) * RING_SLOT;\n% end\n"
SKIP = ("        if (ntiles > 0) /* timing only: the rest of the tile skipped */\n"
        "            continue;\n")
S_DONE = "% if split_dv then\n        /* The warps' parts of S added up"
SOFTMAX_FROM = '% local qk_mul = fp8_kv and "qk_mul" or "score_mul"\n'
SOFTMAX_TO = "        /* O += P V over the warp's keys, P as 16-bit A fragments. */"
LOOP_END = "    }\n\n    /* The state of a slab's warps combined"
BULK_COPY = ("            bulk_load_row(smem_addr(dst), is_k ? k + off : v + off,\n"
             "                          (u32)((is_k ? head_dim : head_dim_v) * (int)sizeof(kv_t)),"
             " bar, policy);")
PLAIN_COPY = """\
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                         " [%0], [%1], %2, [%3];"
                         ::"r"(smem_addr(dst)), "l"(is_k ? k + off : v + off),
                         "r"((u32)((is_k ? head_dim : head_dim_v) * (int)sizeof(kv_t))), "r"(bar)
                         : "memory");
            (void)policy;"""


def replace_once(text, piece, by):
    if text.count(piece) != 1:
        sys.exit("decode_variants: the template has %d copies of %r (want 1)"
                 % (text.count(piece), piece[:60]))
    return text.replace(piece, by)


def nomath(t):
    return replace_once(t, SLOT, SLOT + SKIP)


def sonly(t):
    return replace_once(t, S_DONE, SKIP + S_DONE)


def nosm(t):
    i, j = t.find(SOFTMAX_FROM), t.find(SOFTMAX_TO)
    if i < 0 or j < i:
        sys.exit("decode_variants: the softmax's first or last line is gone from the template")
    return (t[:i] + "        if (ntiles < 0) { /* timing only: the softmax skipped */\n" + t[i:j]
            + "        }\n" + t[j:])


def nohint(t):
    return replace_once(t, BULK_COPY, PLAIN_COPY)


def noepi(t):
    return replace_once(t, LOOP_END, "    }\n    if (ntiles > 0) /* timing only: no epilogue */\n"
                        "        return;\n\n    /* The state of a slab's warps combined")


VARIANTS = {
    "nomath": [nomath],
    "sonly": [sonly],
    "nosm": [nosm],
    "nohint": [nohint],
    "nohint_nomath": [nohint, nomath],
    "nomath_noepi": [nomath, noepi],
}


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    out, names = sys.argv[1], sys.argv[2:] or list(VARIANTS)
    for name in names:
        if name not in VARIANTS:
            sys.exit("decode_variants: no variant %r (%s)" % (name, ", ".join(VARIANTS)))
    with open(TEMPLATE) as f:
        source = f.read()
    for name in names:
        text = source
        for edit in VARIANTS[name]:
            text = edit(text)
        os.makedirs(os.path.join(out, name), exist_ok=True)
        with open(os.path.join(out, name, NAME), "w") as f:
            f.write(text)
        print(os.path.join(out, name))


if __name__ == "__main__":
    main()
