#!/usr/bin/env bash
# Profiles one kernel on the GPU machine: Nsight Compute's warp-stall, pipe and memory
# sections, the SASS of the kernel (instruction mix) and warp-stall samples per SASS instruction
# (stalls.csv: address, source, samples by reason; stalls.txt: bench/stalls.py's summary of
# it). Writes into $OUT (or ./out).
# Usage: bench/profile.sh BUILD_DIR [flashjit run options...]
# PROFILE_KERNEL: a regular expression naming the kernel (default fj_attn, the first launched;
# fj_attn_bwd_dkdv with --backward for the backward's dK/dV stage).
set -uo pipefail
build=${1:-build}
shift || true
out=${OUT:-$PWD/out}
mkdir -p "$out"
kernel=${PROFILE_KERNEL:-fj_attn}
dump=$(mktemp -d)
args=(--backend cuda --no-check --reps 3 "$@")
FLASHJIT_DUMP=$dump "$build/flashjit" run "${args[@]}" --cache :memory: | grep -E "^kernel|^time"
for src in "$dump"/*.src; do
    name=$(basename "$src" .src)
    arch=$(sed -n 's/.*--gpu-architecture=\(sm_[0-9a]*\).*/\1/p' "$dump/$name.opts")
    arch=${arch:-sm_90a}
    cp "$src" "$dump/$name.cu"
    nvcc -cubin -arch="$arch" -o "$dump/$name.cubin" "$dump/$name.cu" -Xptxas -v 2>&1 | grep -E "registers|spill"
    cuobjdump -sass "$dump/$name.cubin" > "$out/$name.sass"
    echo "instruction mix of $name:"
    grep -oE "^\s+/\*[0-9a-f]+\*/\s+[A-Z0-9_.]+" "$out/$name.sass" | awk '{print $2}' | sed 's/\..*//' |
        sort | uniq -c | sort -rn | head -25
done
ncu --clock-control none -k regex:$kernel -c 1 --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section Occupancy --section SpeedOfLight --section SchedulerStats \
    "$build/flashjit" run "${args[@]}" --cache :memory: > "$out/ncu.txt" 2>&1
grep -vE "^==PROF==|^\s*$" "$out/ncu.txt" | grep -E "Stall|Issue|Throughput|Occupancy|Warp Cycles|Eligible|Active Warps|Registers|Pipe|SM Busy|Duration|Block Limit" | head -60
m=smsp__warp_issue_stalled
metrics=${m}_barrier_per_warp_active.pct,${m}_long_scoreboard_per_warp_active.pct,${m}_short_scoreboard_per_warp_active.pct,${m}_math_pipe_throttle_per_warp_active.pct,${m}_mio_throttle_per_warp_active.pct,${m}_wait_per_warp_active.pct,${m}_not_selected_per_warp_active.pct,${m}_selected_per_warp_active.pct,${m}_dispatch_stall_per_warp_active.pct,${m}_no_instruction_per_warp_active.pct,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
ncu --clock-control none -k regex:$kernel -c 1 --metrics "$metrics" \
    "$build/flashjit" run "${args[@]}" --cache :memory: > "$out/ncu_metrics.txt" 2>&1
grep -E "smsp__|sm__|l1tex__" "$out/ncu_metrics.txt"
# Warp-stall samples per SASS instruction (columns: address, source, samples by reason).
ncu --clock-control none -k regex:$kernel -c 1 --section WarpStateStats --section SourceCounters \
    -f -o "$out/prof" "$build/flashjit" run "${args[@]}" --cache :memory: > /dev/null 2>&1
ncu -i "$out/prof.ncu-rep" --page source --csv --print-source sass > "$out/stalls.csv" 2>&1
# Their summary (the instructions with the most samples, totals by reason and by opcode).
python3 "$(dirname "$0")/stalls.py" "$out/stalls.csv" --top 60 > "$out/stalls.txt" 2>&1
head -4 "$out/stalls.txt"
rm -rf "$dump"
