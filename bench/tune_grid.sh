#!/usr/bin/env bash
# Tunes the whole forward grid on the GPU machine (timed), then benchmarks against PyTorch with
# the tuned cache. Usage: bench/tune_grid.sh BUILD_DIR [flashjit tune options...]
set -uo pipefail
build=${1:-build}
shift || true
out=${OUT:-$PWD/out}
mkdir -p "$out"
db=$out/tuned.db
rm -f "$db"
start=$(date +%s)
"$build/flashjit" tune --backend cuda --cache "$db" "$@" | tee "$out/tune.log"
echo "whole grid tuned in $(( $(date +%s) - start )) s" | tee -a "$out/tune.log"
"$build/flashjit" cache export "$out/tuned-kernels.db" --cache "$db" >/dev/null
PYTHONUNBUFFERED=1 python3 bench/bench_fwd.py --lib "$build/libflashjit.so" --cache "$db" \
    --out "$out" 2>&1 | tee "$out/bench_tuned.log"
