#!/usr/bin/env bash
# A cache built offline (NVRTC only, `flashjit cache build --arch ...`) is loaded by a GPU process
# as cache hits: no compile on the GPU machine. Skips (exit 77) without a CUDA device.
set -euo pipefail
cli=$1
arch=$("$cli" info | sed -n 's/.*arch \(sm_[0-9a]*\),.*/\1/p' | head -n 1)
if [ -z "$arch" ]; then
    echo "SKIP: no CUDA device"
    exit 77
fi
db=$(mktemp -d)/offline.db
trap 'rm -rf "$(dirname "$db")"' EXIT
"$cli" cache build --arch "$arch" --cache "$db" --dtype bf16 --head-dim 64,128 --causal 0,1
"$cli" cache verify "$db"
checked=0
for d in 64 128; do
    for causal in "" --causal; do
        out=$("$cli" run --backend cuda --cache "$db" --head-dim $d $causal --seqlen 256 --reps 1)
        echo "$out" | grep -E "^kernel|^PASS|^FAIL"
        echo "$out" | grep -q "^kernel .*user cache" || { echo "FAIL: d=$d $causal compiled instead of hitting the offline cache"; exit 1; }
        echo "$out" | grep -q "^PASS" || exit 1
        checked=$((checked + 1))
    done
done
echo "$checked passed, 0 failed"
