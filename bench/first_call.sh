#!/usr/bin/env bash
# First-call cost in fresh processes: cold (empty cache: render + compile + load) and warm
# (the kernel is in the user cache: load only), then the memoised per-call host time.
# Usage: bench/first_call.sh [opencl|cuda] [BUILD_DIR]
set -euo pipefail
backend=${1:-opencl}
build=${2:-build}
db=$(mktemp -d)/kernels.db
export POCL_KERNEL_CACHE=0 # PoCL's own cache would hide the compile
echo "backend $backend"
echo -n "cold: "; "$build/bench_host" first --backend "$backend" --cache "$db"
echo -n "warm: "; "$build/bench_host" first --backend "$backend" --cache "$db"
echo -n "warm: "; "$build/bench_host" first --backend "$backend" --cache "$db"
"$build/bench_host" overhead --backend "$backend"
rm -rf "$(dirname "$db")"
