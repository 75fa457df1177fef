"""Random attention problems through `flashjit run`, each checked against its float64 reference:
the forward with and without its backward, decode, paged decode (its queries packed too, its
last keys appended by the library), MLA (decode and a quarter prefill), masks, block classes and
score terms, FP8 inputs and FP8 caches, in shapes, head dims, dtypes and layouts drawn off any
benchmark grid. A problem fails when `run` prints FAIL or dies; one whose combination the
library reports as unsupported is counted apart. Prints each failure's command line, so it can
be run again alone.

Usage: python3 tests/soak.py FLASHJIT_CLI [--count 40] [--seed N] [--backend cuda]
       [--cache PATH] [--timeout 120] [--kinds forward,backward,decode,mla,fp8]
--kinds draws only those kinds (default: forward, backward, decode twice, mla); fp8 is a forward
of FP8 q, k and v (e4m3 or e5m2) at head dims to 256 (and a few to 512), which the default
draws a tenth of the forwards as (to 256).
Exit status: 0 every problem passed or was unsupported, 1 one failed, 77 no device (skipped)."""
import argparse
import random
import re
import shlex
import subprocess
import sys

HEAD_DIMS = [8, 16, 24, 32, 40, 48, 64, 72, 80, 96, 112, 128, 160, 192, 256]
# FP8 rows of 16-byte multiples beyond 128 (two panels of q and k on Hopper) weigh more there.
FP8_HEAD_DIMS = HEAD_DIMS + [144, 176, 208, 224, 240, 256]
FP8_WIDE_HEAD_DIMS = [264, 320, 512]
MASK_MODS = ["q / 64 == k / 64", "k <= q && q - k < 100", "k < 32 || k <= q", "(q + k) % 3 != 0"]
SCORE_MODS = ["s - arg[h] * abs(q - k)", "30 * tanh(s / 30)", "q >= k ? s : s - 1"]


def heads(r):
    """(heads, kv heads): MHA, GQA at several ratios, MQA."""
    hkv = r.choice([1, 2, 3, 4])
    return hkv * r.choice([1, 2, 4, 5, 8]), hkv


def forward_args(r, backward, fp8=False):
    hq, hkv = heads(r)
    d = r.choice(FP8_HEAD_DIMS if fp8 else HEAD_DIMS)
    if fp8 and r.random() < 0.15:  # beyond Hopper's FP8 kernel: the 16-bit copies on CUDA
        d = r.choice(FP8_WIDE_HEAD_DIMS)
    a = ["--batch", r.randint(1, 3), "--heads", hq, "--kv-heads", hkv,
         "--seqlen-q", r.randint(1, 700), "--seqlen-k", r.randint(1, 900), "--head-dim", d]
    if fp8:
        a += ["--dtype", r.choice(["e4m3", "e5m2"])]
    else:
        a += ["--dtype", "e4m3" if not backward and r.random() < 0.1
              else r.choice(["bf16", "f16", "f32"])]
    a += ["--layout", r.choice(["bshd", "bhsd", "padded"])]
    if r.random() < 0.3:
        a += ["--head-dim-v", r.choice([dv for dv in (FP8_HEAD_DIMS if fp8 else HEAD_DIMS)
                                        if dv <= 256])]
    if r.random() < 0.5:
        a += ["--causal"]
    if r.random() < 0.2:
        a += ["--window-left", r.randint(0, 300)]
    if r.random() < 0.15:
        a += ["--softcap", r.choice([5, 30])]
    if r.random() < 0.1:
        a += ["--scale", r.choice([-0.2, 0.05, 1.0])]
    if r.random() < 0.2:
        a += ["--varlen"]
    if r.random() < 0.15:
        a += ["--mask-mod", r.choice(MASK_MODS)]
    if r.random() < 0.15:
        a += ["--score-mod", r.choice(SCORE_MODS), "--mod-args", ",".join(["0.1"] * hq)]
    if r.random() < 0.1:
        a += ["--bias", r.choice(["full", "heads", "keys"])]
    if r.random() < 0.08:
        a += ["--block-mask", r.choice(["full", "shared"])]
    if backward:
        a += ["--backward"] + (["--deterministic"] if r.random() < 0.3 else [])
        if "--bias" in a and r.random() < 0.5:
            a += ["--dbias"]
    return a


def decode_args(r):
    hq, hkv = heads(r)
    a = ["--batch", r.randint(1, 9), "--heads", hq, "--kv-heads", hkv,
         "--seqlen-q", r.choice([1, 1, 1, 2, 3, 5, 16]), "--seqlen-k", r.randint(1, 5000),
         "--head-dim", r.choice(HEAD_DIMS), "--dtype", r.choice(["bf16", "bf16", "f16"])]
    if r.random() < 0.5:
        a += ["--causal"]
    if r.random() < 0.5:
        a += ["--paged", r.choice([1, 5, 8, 16, 32, 64, 128, 256])]
        if r.random() < 0.3:  # the queries packed: a batch of mixed lengths
            a += ["--varlen", "--seqlen-q", r.choice([4, 16, 60])]
        elif r.random() < 0.25:  # a chunk of prefill (beyond decode's 16 rows)
            a += ["--seqlen-q", r.choice([17, 64, 200, 777])]
        if r.random() < 0.4:  # the last keys written by the library's append
            a += ["--append", r.choice([1, 2, 5, 100])]
    elif r.random() < 0.3:
        a += ["--varlen"] + (["--seqused-k"] if r.random() < 0.5 else [])
    if r.random() < 0.4:
        a += ["--splits", r.choice([1, 2, 3, 7, 64])]
    if r.random() < 0.1:
        a += ["--kv-dtype", r.choice(["e4m3", "e5m2"])]
    if r.random() < 0.15:
        a += ["--alibi", r.choice(["heads", "batch"])]
    if r.random() < 0.1:
        a += ["--mask-mod", r.choice(MASK_MODS)]
    if r.random() < 0.1:
        a += ["--score-mod", r.choice(SCORE_MODS), "--mod-args", ",".join(["0.1"] * hq)]
    if r.random() < 0.1:
        a += r.choice([["--bias", "full"], ["--bias", "keys"], ["--mask", "random"],
                       ["--mask", "keys"], ["--ranges", "2"]])
    return a


def mla_args(r):
    if r.random() < 0.25:  # a prefill (on Hopper the seesaw kernel), small enough to check
        a = ["--mla", "--batch", r.randint(1, 2), "--heads", r.choice([16, 24]),
             "--seqlen-q", r.randint(17, 300), "--seqlen-k", r.randint(1, 1500)]
    else:
        a = ["--mla", "--batch", r.randint(1, 5), "--heads", r.choice([16, 24, 64, 128]),
             "--seqlen-q", r.choice([1, 1, 2, 4]), "--seqlen-k", r.randint(1, 3000)]
    if r.random() < 0.5:
        a += ["--paged", r.choice([16, 64])]
        if r.random() < 0.3:
            a += ["--varlen"]
    if r.random() < 0.5:
        a += ["--causal"]
    return a


KINDS = ["forward", "backward", "decode", "decode", "mla"]


def problem(r, kinds):
    kind = r.choice(kinds)
    if kind == "decode":
        a = decode_args(r)
    elif kind == "mla":
        a = mla_args(r)
    else:
        a = forward_args(r, kind == "backward", fp8=kind == "fp8")
    return kind, [str(x) for x in a]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--cache", default=":memory:")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--kinds", default=None)
    args = ap.parse_args()
    kinds = KINDS if args.kinds is None else args.kinds.split(",")
    if not set(kinds) <= set(KINDS) | {"fp8"}:
        ap.error(f"--kinds: of {', '.join(sorted(set(KINDS) | {'fp8'}))}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    info = subprocess.run([args.cli, "info"], capture_output=True, text=True).stdout
    devices = re.search(r"backend %s: (\d+) device" % re.escape(args.backend), info)
    if not devices or int(devices.group(1)) == 0:
        print(f"SKIP: no {args.backend} device ({args.cli} info)")
        return 77
    print(f"soak: {args.count} problems, seed {seed}")
    r = random.Random(seed)
    counts = {"pass": 0, "fail": 0, "unsupported": 0}
    for i in range(args.count):
        kind, a = problem(r, kinds)
        cmd = [args.cli, "run", "--backend", args.backend, "--cache", args.cache, "--reps", "1"] + a
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired:
            out, rc = "timed out", -1
        last = out.strip().splitlines()[-1] if out.strip() else ""
        if rc == 0 and last.startswith("PASS"):
            verdict = "pass"
        elif "unsupported request" in out or rc == 2:
            verdict = "unsupported"
        else:
            verdict = "fail"
        counts[verdict] += 1
        print(f"{i:3d} {kind:8s} {verdict:11s} {shlex.join(a)}", flush=True)
        if verdict != "pass":
            print("      " + "\n      ".join(out.strip().splitlines()[-6:]))
    print(f"soak: {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['unsupported']} unsupported (seed {seed})")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
