#!/usr/bin/env bash
# `flashjit cache build` on a machine without a GPU: NVRTC alone compiles the tensor-core
# kernels for sm_80 and sm_90a into a cache that verifies, with no register spills in the
# default configurations and no serialised wgmma on Hopper. Skips (exit 77) where NVRTC is not
# installed.
set -uo pipefail
cli=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
checked=0
expected=0
for arch in sm_80 sm_90a; do
    out=$("$cli" cache build --arch $arch --cache "$dir/offline.db" --dtype bf16,f16 \
        --head-dim 64,96,128,256 --causal 0,1 --softcap 0,1 2>&1)
    status=$?
    if echo "$out" | grep -q "NVRTC is not available"; then
        echo "SKIP: NVRTC is not installed"
        exit 77
    fi
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build for $arch"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda.fwd.(mma|wgmma)$/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills kernels spill registers on $arch"; exit 1; }
    serial=$(echo "$out" | grep -c "wgmma serialised")
    [ "$serial" -eq 0 ] || { echo "FAIL: $serial kernels run their wgmma serialised"; exit 1; }
    expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
    checked=$((checked + 1))
done
"$cli" cache verify "$dir/offline.db" || exit 1
kernels=$("$cli" cache ls --cache "$dir/offline.db" | grep -c "^[0-9a-f]\{12\} cuda")
[ "$kernels" -eq "$expected" ] || { echo "FAIL: expected $expected kernels in the cache, found $kernels"; exit 1; }
echo "$((checked + 1)) passed, 0 failed"
