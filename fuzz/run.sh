#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time over a scratch copy of its corpus (the checked-in
# seeds stay as they are). Exit status: the fuzzer's (nonzero on any finding, whose input is kept
# in ./fuzz-artifacts).
# Usage: fuzz/run.sh path/to/fuzz_target corpus-dir seconds
set -euo pipefail
target=$1 seeds=$2 seconds=$3
artifacts=$PWD/fuzz-artifacts # where a finding's input is kept (ctest runs in the build folder)
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$seeds"/. "$work/" 2>/dev/null || true
cd "$work"
# -timeout: one input taking longer is a finding (a hang); -rss_limit_mb: so is runaway memory.
exec "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$(basename "$target")-" "$work"
