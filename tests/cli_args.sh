#!/usr/bin/env bash
# `flashjit run` with bad sizes and numbers: each exits 2 with a message naming the option,
# before any kernel runs (no device is needed for that); a problem too large for the machine is
# refused with its size. Then the cache commands that sign and verify, `tune` against a cache
# it cannot write, and the backward's report. Usage: cli_args.sh path/to/flashjit
set -uo pipefail
cli=$1
failed=0
check() { # expected-message args...
    local want=$1
    shift
    out=$("$cli" run "$@" 2>&1)
    status=$?
    if [ $status -ne 2 ] || ! grep -q -- "$want" <<<"$out"; then
        echo "FAIL: flashjit run $*: status $status, output: $out"
        failed=1
    else
        echo "ok   flashjit run $*: $(head -1 <<<"$out")"
    fi
}
check "--seqlen takes an integer from 1" --seqlen -5
check "--seqlen takes an integer from 1" --seqlen 0
check "--seqlen takes an integer from 1" --seqlen abc
check "--seqlen takes an integer from 1" --seqlen 99999999999
check "--batch takes an integer from 1" --batch 2x
check "--heads takes an integer from 1" --heads ""
check "--kv-heads takes an integer from 1" --kv-heads -1
check "--head-dim takes an integer from 1" --head-dim 1e3
check "--seqlen-k takes an integer from 1" --seqlen-k 0
check "--window-left takes an integer from -1" --window-left -7
check "--reps takes an integer from 0" --reps many
check "--softcap takes a finite number" --softcap inf
check "--scale takes a finite number" --scale 1.5q
check "--mod-args takes up to 256 numbers" --mod-args 1,x
check "--seed takes an unsigned integer" --seed 12ab
check "--kv-dtype takes e4m3 or e5m2, not 'bf16'" --kv-dtype bf16
check "--backward (or --dbias, --deterministic) is not taken with --paged" --backward --paged 16
check "--append is taken with --paged, not with a contiguous cache" --append 2
check "--append is taken with --paged, not with --mla" --append 2 --paged 16 --mla
check "--append takes an integer from 1" --append 0 --paged 16
check "is not taken with --mla" --deterministic --mla
check "is not taken with --no-lse" --no-lse --backward
# The backward's tile overrides are checked when a context is made, naming the variable.
if "$cli" info 2>/dev/null | grep -qE "^backend opencl: [1-9]"; then
    out=$(FLASHJIT_BWD_CONFIG=warps=99 "$cli" run --backend opencl --seqlen 8 2>&1)
    status=$?
    if [ $status -ne 2 ] || ! grep -q "FLASHJIT_BWD_CONFIG: warps = 99" <<<"$out"; then
        echo "FAIL: a bad FLASHJIT_BWD_CONFIG: status $status, output: $out"
        failed=1
    else
        echo "ok   a bad FLASHJIT_BWD_CONFIG: $(grep FLASHJIT_BWD_CONFIG <<<"$out" | head -1)"
    fi
fi
# Valid numbers, but more memory than any machine here has: refused with the size (when a
# backend exists to plan for; without one the context error also exits 2).
out=$("$cli" run --seqlen 2000000 --batch 4096 --heads 64 2>&1)
status=$?
if [ $status -ne 2 ] || ! grep -qE "GiB of (host|device) memory|cannot create" <<<"$out"; then
    echo "FAIL: a huge problem: status $status, output: $out"
    failed=1
else
    echo "ok   a huge problem: $(head -1 <<<"$out")"
fi
# expect STATUS MESSAGE args...: flashjit ARGS exits with STATUS and prints MESSAGE.
expect() {
    local want_status=$1 want=$2
    shift 2
    out=$("$cli" "$@" 2>&1)
    status=$?
    if [ $status -ne "$want_status" ] || ! grep -q -- "$want" <<<"$out"; then
        echo "FAIL: flashjit $*: status $status (expected $want_status), output: $out"
        failed=1
    else
        echo "ok   flashjit $*: $(head -1 <<<"$out")"
    fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect 2 "--trusted-key takes an Ed25519 public key" cache verify --trusted-key zz "$tmp/none.db"
expect 2 "--key FILE is missing" cache sign "$tmp/c.db"
expect 0 "public key" cache keygen --key "$tmp/key"
expect 1 "File exists" cache keygen --key "$tmp/key" # never replaces a key
expect 0 "public key" cache keygen --key "$tmp/other"
expect 1 "not a secret key" cache sign --key "$tmp/key.pub" --cache "$tmp/c.db"
expect 0 "signed $tmp/c.db with public key $(cat "$tmp/key.pub")" cache sign --key "$tmp/key" \
    --cache "$tmp/c.db"
expect 0 "ok, 0 kernels, signed by $(cat "$tmp/key.pub")" cache verify "$tmp/c.db" \
    --trusted-key "$(cat "$tmp/key.pub")"
expect 1 "not signed by a trusted key" cache verify "$tmp/c.db" \
    --trusted-key "$(cat "$tmp/other.pub")"
expect 2 "opts.trusted_keys\[0\] is not an Ed25519 public key" run --trusted-key 1234
# Tuning with nowhere to keep the results stops before it starts (given a device to tune on);
# `run --backward` checks and times the backward and names its kernel; `run --dtype e5m2`
# checks FP8 inputs against the float64 reference and their plain FP8 implementation, and
# `--kv-dtype e4m3` a paged FP8 KV cache on the decode kernel; FP8 has
# no backward (an unsupported request: status 2); FP8 forwards tune.
if "$cli" info 2>/dev/null | grep -qE "^backend opencl: [1-9]"; then
    expect 0 "backward   opencl.bwd.simt, [0-9.]* ms (median of 2)" run --backend opencl \
        --cache :memory: --seqlen 40 --head-dim 16 --heads 2 --backward --reps 2
    expect 1 "cannot be written, so the results would be lost" tune --backend opencl \
        --cache /proc/version/kernels.db --head-dim 64 --seqlen 64
    expect 0 "plain e5m2 implementation" run --backend opencl --cache :memory: --seqlen 40 \
        --head-dim 16 --heads 2 --dtype e5m2 --causal
    expect 0 "kernel     opencl.decode" run --backend opencl --cache :memory: --seqlen-q 1 \
        --seqlen-k 90 --head-dim 16 --heads 4 --kv-heads 2 --kv-dtype e4m3 --paged 16
    expect 2 "the backward of fp8 attention is not supported" run --backend opencl \
        --cache :memory: --seqlen 40 --head-dim 16 --heads 2 --dtype e4m3 --backward
    expect 0 "1 shapes tuned, 0 failed" tune --backend opencl --cache "$tmp/decode.db" \
        --decode 1 --group 2 --paged 16 --head-dim 32 --seqlen 300 --causal 0 --hidden 128 \
        --tokens 600
    expect 0 "1 shapes tuned, 0 failed" tune --backend opencl --cache "$tmp/fp8.db" \
        --dtype e5m2 --head-dim 16 --seqlen 64 --causal 1 --hidden 32 --tokens 64
    # FLASHJIT_LOG=debug names each launch before it is issued (the backward's stages too)
    FLASHJIT_LOG=debug expect 0 "launch fj_attn_bwd_dkdv (opencl.bwd.simt, step 1, run 1 of 1)" \
        run --backend opencl --cache :memory: --seqlen 40 --head-dim 16 --heads 2 --backward \
        --reps 1
fi
expect 2 "--dtype takes bf16, f16, f32, e4m3 or e5m2, not 'e3m4'" tune --dtype e3m4
expect 2 "FP8 inputs have no backward and no paged cache" tune --dtype e4m3 --backward
expect 2 "has no backward and no merge of its own" cache build --arch sm_90a --dtype e4m3 --backward
expect 2 "--kv-dtype goes with 16-bit queries" cache build --arch sm_90a --dtype e4m3 --kv-dtype e5m2
expect 2 "--kv-dtype takes e4m3 or e5m2, not 'bf16'" cache build --arch sm_90a --kv-dtype bf16
expect 2 "--paged goes with --decode" cache build --arch sm_90a --paged 64
expect 2 "--paged goes with --decode and 16-bit queries" cache build --arch sm_90a --decode 1 \
    --dtype e4m3 --paged 16
expect 2 "--paged takes an integer from 0 to 4096, not '5000'" cache build --arch sm_90a \
    --decode 1 --paged 5000
expect 0 "--paged P,..." cache build --help
expect 0 "--backward   also the backward" tune --help
expect 2 "--group and --paged go with --decode" tune --group 4
expect 2 "--decode tunes forwards only" tune --decode 1 --backward
expect 2 "not a multiple of --head-dim 64 times --group 3" tune --decode 1 --group 3 --head-dim 64
exit $failed
