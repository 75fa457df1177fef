"""Summarises the warp-stall samples per SASS instruction that bench/profile.sh writes
(stalls.csv: Nsight Compute's source page): the instructions with the most samples, each with
its share of all samples and its leading stall reasons, and the totals by reason and by opcode.

Usage: python3 bench/stalls.py STALLS_CSV [--top N]"""
import argparse
import collections
import csv
import io
import sys

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--top", type=int, default=60)
args = ap.parse_args()

text = open(args.csv, errors="replace").read()
# ncu may print lines before the table; the table starts at the header naming "Source".
start = text.find('"Address"')
if start < 0:
    start = text.find('"#"')
rows = list(csv.reader(io.StringIO(text[max(start, 0):])))
if not rows:
    sys.exit("no table in " + args.csv)
head, body = rows[0], rows[1:]


def number(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def col(name):
    for i, h in enumerate(head):
        if h.startswith(name):
            return i
    return None


total_col = col("Warp Stall Sampling (All Samples)")
src_col = col("Source")
addr_col = col("Address")
if total_col is None or src_col is None:
    sys.exit("columns not found; header: " + ", ".join(head))
# Per-reason columns: the sampling columns other than the totals ("stall_*" in newer versions).
reason_cols = [i for i, h in enumerate(head)
               if (h.startswith("stall_") or h.startswith("Warp Stall Sampling ("))
               and i != total_col and "Not-issued" not in h and "All Samples" not in h]
total = sum(number(r[total_col]) for r in body if len(r) > total_col) or 1.0
print(f"{len(body)} instructions, {total:.0f} samples")

by_reason = collections.Counter()
by_op = collections.Counter()
for r in body:
    if len(r) <= total_col:
        continue
    op = r[src_col].split()[0] if r[src_col].split() else "?"
    if op.startswith("@"):
        op = r[src_col].split()[1] if len(r[src_col].split()) > 1 else op
    by_op[op.split(".")[0]] += number(r[total_col])
    for i in reason_cols:
        by_reason[head[i]] += number(r[i])
print("by reason:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(12) if v))
print("by opcode:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_op.most_common(16)))
print()
top = sorted((r for r in body if len(r) > total_col), key=lambda r: -number(r[total_col]))[:args.top]
for r in top:
    reasons = sorted(((number(r[i]), head[i]) for i in reason_cols), reverse=True)[:3]
    why = ", ".join(f"{n.replace('stall_', '')} {100 * v / total:.1f}" for v, n in reasons if v)
    addr = r[addr_col] if addr_col is not None else ""
    print(f"{100 * number(r[total_col]) / total:5.2f}% {addr:>6} {r[src_col][:70]:<70} {why}")
