#!/usr/bin/env bash
# Each launch's time on the GPU (Nsight Compute's gpu__time_duration, kernels one after another,
# clocks as they run) for one `flashjit run` problem under several configurations: what a call's
# kernels cost apart, e.g. a split decode's kernel and its merge against merge_last's one kernel
# (bench/RESULTS.md). A configuration is a FLASHJIT_CONFIG value, optionally prefixed with a
# template folder as DIR: (FLASHJIT_TEMPLATE_DIR, to time a template copy); "-" is the plan's own.
# Usage: bench/kernel_times.sh BUILD_DIR "CONFIG[;CONFIG...]" [flashjit run options...]
# e.g.   bench/kernel_times.sh build "merge_last=0;merge_last=1" --seqlen-q 1 --seqlen-k 32768 \
#            --batch 1 --heads 32 --kv-heads 8 --head-dim 128
set -uo pipefail
build=${1:-build}
configs=${2:--}
shift 2 || true
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
IFS=';' read -r -a list <<< "$configs"
for config in "${list[@]}"; do
    dir=
    if [[ $config == *:* ]]; then
        dir=${config%%:*}
        config=${config#*:}
    fi
    [ "$config" = - ] && config=
    launches=$(FLASHJIT_CONFIG=$config FLASHJIT_TEMPLATE_DIR=$dir "$ncu" --clock-control none \
        -k regex:fj_ --metrics gpu__time_duration.sum "$build/flashjit" run --backend cuda \
        --no-check --reps 3 --cache :memory: "$@" 2>&1 |
        awk '/^  fj_/ {name = $1} /gpu__time_duration/ {printf "%s %s us, ", name, $NF}')
    echo "${dir:+$dir: }${config:-plan}: ${launches%, }"
done
