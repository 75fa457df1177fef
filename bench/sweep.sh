#!/usr/bin/env bash
# Times the forward kernel under several tile configurations (FLASHJIT_CONFIG), one process
# each, flashjit only; then the peers once. Usage: bench/sweep.sh BUILD_DIR D S CAUSAL CONFIG...
# e.g. bench/sweep.sh build-device 128 4096 0,1 "" tile_n=32 "tile_n=32,kk_unroll=2"
set -uo pipefail
build=$1 d=$2 s=$3 causal=$4
shift 4
for config in "$@"; do
    FLASHJIT_CONFIG=$config python3 bench/bench_fwd.py --lib "$build/libflashjit.so" --d "$d" \
        --s "$s" --causal "$causal" --peers 0 --tag "${config:-default}" 2>&1 | grep -vE "^device|^ +d causal"
done
python3 bench/bench_fwd.py --lib "$build/libflashjit.so" --d "$d" --s "$s" --causal "$causal" \
    --tag peers 2>&1 | grep -vE "^device"
