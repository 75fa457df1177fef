#!/usr/bin/env bash
# Where a decode's memory traffic goes, flashjit's kernel beside cuDNN's on the same shape
# (bench/decode_once.py): Nsight Compute's DRAM, L2 and L2-fabric counters of one launch each.
# The fabric links the H200's two L2 partitions; half of every read crosses it.
# Usage: bench/decode_l2.sh BUILD_DIR [b] [sk]   (writes nothing; prints the counters)
set -uo pipefail
build=$(cd "${1:-build}" && pwd) || exit 1
b=${2:-128}
sk=${3:-8192}
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,smsp__inst_executed.sum,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed
metrics+=,lts__ltcfabric2ltc_cycles_active.avg.pct_of_peak_sustained_elapsed
metrics+=,lts__t_requests_srcunit_tex.sum,lts__t_sectors_srcunit_tex.sum
metrics+=,lts__t_requests_srcunit_ltcfabric.sum,lts__t_sectors_srcunit_ltcfabric.sum
metrics+=,l1tex__m_xbar2l1tex_read_sectors_mem_lg_op_ld.sum
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
cd "$(dirname "$0")/.."
for who in cudnn flashjit; do
    kernel=$([ $who = cudnn ] && echo cudnn || echo fj_attn_decode)
    echo "=== $who"
    "$ncu" --clock-control none --metrics "$metrics" -k "regex:$kernel" -c 1 \
        python3 bench/decode_once.py $who --b "$b" --sk "$sk" --lib "$build/libflashjit.so" |
        grep -E "^    [a-z]"
done
