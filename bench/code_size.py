"""The machine code size of each kernel in a kernel cache, from the cubins' ELF sections: no GPU
and no disassembler needed. A kernel's tail that runs once, in a few blocks (a merge in the last
block of a split, an epilogue), is fetched before any of its instructions are cached, so its
length is time: 31 KB of such a tail cost 7-12 us on the H100 (bench/RESULTS.md, merge_last).

    python3 bench/code_size.py CACHE.db [--fields merge_last,paged,tile_m] [--match TEXT]

Prints, a kernel a line: its .text bytes (each kernel's function), registers and spilled bytes
from the compile log, and the named fields of its variant (kernel= always). --match keeps the
kernels whose variant text contains TEXT (repeatable: all must match).
"""
import argparse
import re
import sqlite3
import struct


def text_sections(blob):
    """{section name: size} of the .text sections of an ELF cubin (64-bit, little-endian), or
    None for anything else (an OpenCL binary, PTX)."""
    b = bytes(blob)
    if b[:4] != b"\x7fELF" or b[4] != 2:
        return None
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    sections = []
    for i in range(shnum):
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", b, shoff + i * shentsize)
        sections.append((name, offset, size))
    strings = sections[shstrndx][1]
    out = {}
    for name, _offset, size in sections:
        label = b[strings + name: b.index(b"\0", strings + name)].decode()
        if label.startswith(".text"):
            out[label] = size
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cache")
    ap.add_argument("--fields", default="", help="variant fields to print (comma-separated)")
    ap.add_argument("--match", action="append", default=[])
    args = ap.parse_args()
    fields = [f for f in args.fields.split(",") if f]
    rows = []
    query = "select variant_text, binary, log from kernels"
    for text, blob, log in sqlite3.connect(args.cache).execute(query):
        if not all(m in text for m in args.match):
            continue
        sections = text_sections(blob)
        if not sections:
            continue
        variant = dict(w.split("=", 1) for w in text.split() if "=" in w)
        regs = re.search(r"Used (\d+) registers", log or "")
        spills = re.search(r"(\d+) bytes spill stores", log or "")
        shown = " ".join(f"{f}={variant.get(f, '?')}" for f in ["kernel"] + fields)
        rows.append((sum(sections.values()), regs.group(1) if regs else "?",
                     spills.group(1) if spills else "?", shown))
    for size, regs, spills, shown in sorted(rows, key=lambda r: r[3]):
        print(f"{size:8d} B  {regs:>3} regs  {spills:>4} B spilled  {shown}")


if __name__ == "__main__":
    main()
