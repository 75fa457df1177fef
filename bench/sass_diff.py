"""Compares the machine code of the kernels in two kernel caches: a refactor that should not
change what runs can show that it does not, without a GPU.

Build the same set of kernels with two versions of the library (`flashjit cache build ...`
into A.db and B.db, the same options), then:

    python3 bench/sass_diff.py A.db B.db [--cuobjdump PATH] [--show N]

Kernels are paired by their variant key without the lines that name the library's own
version (templates=, args=; an old `dtype=` is read as the three per-role dtypes). For each
pair the SASS of both is disassembled (cuobjdump, from the CUDA toolkit or Triton's wheel),
constant-bank offsets are blanked (parameter blocks move fields around), and the instruction
sequences are compared. Prints one line per pair: same, or the instruction counts, the
registers of each, and the opcodes whose counts differ; exit status 1 when any pair differs.
"""
import argparse
import collections
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile

# Derived from the other lines, or naming the library version.
VOLATILE = ("templates=", "args=", "shared_bytes=", "consumer_regs=", "batch_fastest=", "heavy_first=")


def identity(variant_text):
    """The variant key lines that describe the kernel, not the library version."""
    lines = []
    for line in variant_text.splitlines():
        if line.startswith(VOLATILE):
            continue
        if line.startswith("dtype="):  # keys before per-role dtypes
            value = line.split("=", 1)[1]
            lines += [f"q_dtype={value}", f"kv_dtype={value}", f"out_dtype={value}",
                      "acc_dtype=f32"]
            continue
        lines.append(line)
    return "\n".join(sorted(lines))


def kernels(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = {}
    for text, binary in db.execute("SELECT variant_text, binary FROM kernels"):
        out[identity(text)] = binary
    return out


def sass(cuobjdump, binary):
    """The kernel's instructions (opcode and operands), constant-bank offsets blanked, and its
    register count."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary)
        f.flush()
        text = subprocess.run([cuobjdump, "--dump-sass", f.name], capture_output=True,
                              text=True, check=True).stdout
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    code = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if not m:
            continue
        ins = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][P]", m.group(1))
        ins = re.sub(r"0x[0-9a-f]+", "#", ins) if ins.split()[0].startswith(("BRA", "CALL", "BSSY", "JMP")) else ins
        code.append(ins)
    return code, int(regs.group(1)) if regs else -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--cuobjdump", default=os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump"))
    ap.add_argument("--show", type=int, default=6, help="differing opcodes shown per pair")
    args = ap.parse_args()
    if not args.cuobjdump:
        sys.exit("no cuobjdump: install the CUDA toolkit or pass --cuobjdump")
    a, b = kernels(args.a), kernels(args.b)
    differ = 0
    for key in sorted(set(a) | set(b)):
        name = " ".join(line for line in key.splitlines()
                        if line.split("=")[0] in ("kernel", "q_dtype", "head_dim_pad", "tile_m",
                                                  "tile_n", "local_mask", "persistent", "target")
                        or (line.split("=", 1)[1] not in ("0", "false", "") and line.split("=")[0]
                            in ("alibi", "bias", "mask_mod", "score_mod", "mask_tensor",
                                "mask_ranges", "block_mask", "varlen", "softcap", "ctas_per_sm")))
        if key not in a or key not in b:
            print(f"only in {'A' if key in a else 'B'}: {name}")
            differ += 1
            continue
        ca, ra = sass(args.cuobjdump, a[key])
        cb, rb = sass(args.cuobjdump, b[key])
        if ca == cb and ra == rb:
            print(f"same       {len(ca):6d} ins {ra:3d} regs  {name}")
            continue
        differ += 1
        ha = collections.Counter(i.split()[0] for i in ca)
        hb = collections.Counter(i.split()[0] for i in cb)
        ops = sorted(set(ha) | set(hb), key=lambda o: -abs(ha[o] - hb[o]))
        delta = ", ".join(f"{o} {ha[o]}->{hb[o]}" for o in ops[:args.show] if ha[o] != hb[o])
        print(f"DIFFERS {len(ca):6d}->{len(cb):6d} ins {ra:3d}->{rb:3d} regs  {name}  [{delta}]")
    print(f"{len(set(a) & set(b))} pairs, {differ} differ or unpaired")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
