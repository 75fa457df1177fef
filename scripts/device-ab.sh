#!/usr/bin/env bash
# A/B of this tree against another version of flashjit on the GPU machine, in one process
# (bench/ab_libs.py), plus the memoised host time per call of both. BASE is a source tree of the
# other version (e.g. `git worktree add` or `git archive | tar -x` of an older commit); both are
# built against .deps/root (scripts/device-deps.sh). FLASHJIT_CACHE may name a kernel cache built
# beforehand with `flashjit cache build` for both versions, so the run spends no time compiling.
# Usage: scripts/device-ab.sh BASE [ab_libs.py arguments...]; logs go to $OUT (or ./out).
set -uo pipefail
cd "$(dirname "$0")/.."
base=$1
shift
out=${OUT:-$PWD/out}
mkdir -p "$out"
for tree in . "$base"; do
    build=build-device
    [ "$tree" = . ] || build=$PWD/build-base
    cmake -S "$tree" -B "$build" -DFLASHJIT_DEPS_ROOT="$PWD/.deps/root" -DFLASHJIT_TESTS=OFF \
        -DCMAKE_BUILD_TYPE=Release >/dev/null &&
        cmake --build "$build" -j "$(nproc)" 2>&1 | grep -E "error|warning"
    [ -e "$build/libflashjit.so" ] || { echo "build of $tree failed"; exit 1; }
done
for build in build-base build-device; do
    echo -n "$build: "
    "$build/bench_host" overhead --backend cuda
done 2>&1 | tee "$out/host_ab.log"
PYTHONUNBUFFERED=1 python3 bench/ab_libs.py --libs build-base/libflashjit.so,build-device/libflashjit.so \
    --out "$out" "$@" 2>&1 | tee "$out/ab.log"
