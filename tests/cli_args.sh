#!/usr/bin/env bash
# `flashjit run` with bad sizes and numbers: each exits 2 with a message naming the option,
# before any kernel runs (no device is needed for that); a problem too large for the machine is
# refused with its size. Usage: cli_args.sh path/to/flashjit
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
exit $failed
