#!/usr/bin/env bash
# Builds and tests flashjit on a machine without apt (the GPU machine), against the packages
# that scripts/device-deps.sh extracted into .deps/root; then benchmarks. Logs go to $OUT (or
# ./out). Usage: scripts/device-test.sh [smoke|test|bench|decode|python|bwd|masks|masks-bench|all]
# [extra bench arguments...]
# smoke: a few `flashjit run` checks, each under a time limit (a kernel that hangs is killed).
# decode: the decode, graph-capture, paged, MLA, append, merge and backward suites,
# compute-sanitizer on paged (packed, appended, masked) and MLA decode, the append, a paged
# forward and a backward, chunks of prefill against pages timed on both kernels (16 to 2048
# rows; bench/bench_paged_prefill.py against the dense forward, SDPA and a mixed batch), the host
# time of a memoised decode call, bench/bench_decode.py on the default path
# (the decode kernel) and on the Hopper forward kernel, and bench/bench_append.py (not part of
# all).
# python: the Python package on the GPU (tests/torch_api.py: the drop-in, gradients, torch.compile,
# a CUDA graph of a paged decode step, the Python call's host time; tests/python_api.py on CUDA;
# tests/torch_trace.py: FlexAttention's Python mask_mod and score_mod;
# examples/serve_fp8.py; examples/train_block.py against SDPA).
# bwd: the backward on the GPU (test_backward_cuda; compute-sanitizer memcheck, racecheck and
# synccheck on tensor-core backward runs: ragged causal, masks, packed, d 256, deterministic, a mask
# tensor, block classes), bench/bench_bwd.py
# over d 64/128/256 x causal x 1k/4k/16k, bench/bench_masks.py --backward against FlexAttention,
# and examples/train_block.py against SDPA (not part of all).
# masks: the forward's block classes passed over many at a time (class_vote=1, opt-in): the mask
# tests under it, memcheck and racecheck on a window and on caller's classes; masks-bench:
# bench/bench_masks.py's forward with the default walk and with it (also with a persistent grid
# and two Q buffers, so one work tile's Q loads under the last one's end), against
# FlexAttention, and flashjit.torch's drop-in given Flex's BlockMask (a call each: together they
# pass the device's 10 minutes; not part of all).
# CTEST_LABEL=gpu runs only the tests with that label.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
out=${OUT:-$PWD/out}
mkdir -p "$out"
build=build-device
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
    cmake -S . -B $build -DFLASHJIT_DEPS_ROOT=.deps/root -DFLASHJIT_WERROR=ON \
        -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build $build -j "$(nproc)" 2>&1 | grep -E "error|warning" ;
    $build/flashjit info
} 2>&1 | tee "$out/build.log"
[ -x $build/flashjit ] || { echo "build failed"; exit 1; }
status=0
# `flashjit run` (one rep, CUDA) with the arguments under compute-sanitizer's tool $1: prints
# clean, or FAILED and the report's end.
sanitize() {
    local tool=$1
    shift
    if timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 3 $build/flashjit run \
        --backend cuda --reps 1 "$@" > "$out/sanitizer.tmp" 2>&1; then
        echo "compute-sanitizer $tool clean: $*"
    else
        echo "compute-sanitizer $tool FAILED: $*"; tail -20 "$out/sanitizer.tmp"
    fi
}
if [ "$what" = smoke ] || [ "$what" = all ]; then
    for args in "--seqlen 200 --head-dim 64" "--seqlen 1000 --head-dim 128 --causal" \
                "--seqlen-q 300 --seqlen-k 517 --head-dim 72 --head-dim-v 40 --causal" \
                "--seqlen 777 --head-dim 256 --dtype f16" "--seqlen 129 --head-dim 128 --layout bhsd" \
                "--seqlen 300 --head-dim 128 --dtype e4m3 --causal"; do
        echo "== run $args"
        timeout 60 $build/flashjit run --backend cuda --batch 2 --heads 4 $args 2>&1 |
            grep -E "^kernel|^time|^error|PASS|FAIL|rror" || { echo "run FAILED or timed out"; status=1; }
    done | tee "$out/smoke.log"
    grep -qE "FAIL|timed out" "$out/smoke.log" && status=1
fi
if [ "$what" = test ] || [ "$what" = all ]; then
    (cd $build && ctest --output-on-failure --timeout 300 -V ${CTEST_LABEL:+-L "$CTEST_LABEL"}) > "$out/ctest.log" 2>&1 || status=1
    grep -E "^\s*[0-9]+/[0-9]+ Test|tests passed|FAIL|SKIP" "$out/ctest.log" | tail -20
    $build/flashjit run --backend cuda --batch 2 --heads 6 --kv-heads 2 --seqlen-q 300 \
        --seqlen-k 517 --head-dim 72 --head-dim-v 40 --dtype bf16 --causal | tee "$out/run.log"
    bench/first_call.sh cuda $build 2>&1 | tee "$out/first_call.log"
    if command -v compute-sanitizer >/dev/null; then
        # Both kernel paths, ragged sizes, masks (the classifier step with a mask_mod reading
        # mod_args, FlashMask ranges, a bias); a report fails the run.
        for args in "--seqlen-q 300 --seqlen-k 517 --head-dim 72 --head-dim-v 40 --causal" \
                    "--seqlen 129 --head-dim 128 --window-left 16 --window-right 8 --heads 2" \
                    "--seqlen 200 --head-dim 256 --causal --heads 2 --dtype f16" \
                    "--seqlen 77 --head-dim 40 --dtype f32 --heads 2" \
                    "--seqlen 300 --head-dim 128 --heads 2 --mask-mod iarg[0]<=k||k<=q --mod-args 1e-43" \
                    "--seqlen 260 --head-dim 64 --heads 2 --ranges 4 --causal" \
                    "--seqlen 200 --head-dim 128 --heads 2 --bias full"; do
            for tool in memcheck racecheck synccheck; do
                if compute-sanitizer --tool $tool --error-exitcode 3 $build/flashjit run \
                    --backend cuda --reps 1 --batch 1 $args > "$out/sanitizer.tmp" 2>&1; then
                    echo "compute-sanitizer $tool clean: $args"
                else
                    echo "compute-sanitizer $tool FAILED: $args"; tail -20 "$out/sanitizer.tmp"
                fi
            done
        done | tee "$out/sanitizer.log"
        # The merge kernel, every case of its suite (in place, packed, chained through the workspace).
        if compute-sanitizer --tool memcheck --error-exitcode 3 $build/test_merge_cuda \
            > "$out/sanitizer.tmp" 2>&1; then
            echo "compute-sanitizer memcheck clean: test_merge_cuda"
        else
            echo "compute-sanitizer memcheck FAILED: test_merge_cuda"; tail -20 "$out/sanitizer.tmp"
        fi | tee -a "$out/sanitizer.log"
        grep -q FAILED "$out/sanitizer.log" && status=1
    fi
    # The default Hopper kernels of the benchmark grid: wgmma and TMA in their SASS, no spills.
    if command -v cuobjdump >/dev/null; then
        bench/sass_check.sh $build > "$out/sass.log" 2>&1 || status=1
        tail -1 "$out/sass.log"
    fi
fi
if [ "$what" = decode ]; then
    # Quick suites first, then the benchmark, the sanitizer and the (slow) backward suite, each
    # under a time limit, so a hang costs one step rather than the whole run.
    # (test_decode_cuda compiles a variant for most of its cases: minutes on a fresh cache)
    (cd $build &&
        ctest --output-on-failure --timeout 420 -R "test_(decode|graph|append|merge)_cuda") \
        > "$out/ctest_decode.log" 2>&1 || status=1
    grep -E "Test +#|tests passed" "$out/ctest_decode.log"
    for seqlen_q in 1 4; do
        echo -n "host time, memoised decode call, seqlen_q $seqlen_q: "
        $build/bench_host overhead --backend cuda --seqlen-q $seqlen_q
    done 2>&1 | tee "$out/host_decode.log"
    # The default (the decode kernel) and the Hopper forward kernel at decode shapes
    # (DECODE_CONFIGS: FLASHJIT_CONFIG values, "default" for none).
    for config in ${DECODE_CONFIGS:-default path=wgmma}; do
        [ "$config" = default ] && config=
        echo "== FLASHJIT_CONFIG=$config"
        FLASHJIT_CONFIG=$config PYTHONUNBUFFERED=1 timeout 200 python3 bench/bench_decode.py \
            --lib $build/libflashjit.so --out "$out" "$@" 2>&1 | tee -a "$out/bench_decode.log"
    done
    PYTHONUNBUFFERED=1 timeout 150 python3 bench/bench_append.py --lib $build/libflashjit.so \
        --out "$out" 2>&1 | tee "$out/bench_append.log" || status=1
    for args in "--seqlen-q 2 --seqlen-k 300 --paged 16 --causal --splits 3" \
                "--seqlen-q 1 --seqlen-k 700 --head-dim 128 --splits 5" \
                "--seqlen-q 1 --seqlen-k 700 --mla --heads 16 --paged 64 --splits 5" \
                "--seqlen-q 16 --seqlen-k 700 --paged 16 --varlen --causal --append 5 --splits 3" \
                "--seqlen-q 4 --seqlen-k 500 --paged 5 --varlen --kv-dtype e4m3 --append 2 \
                 --mask random" \
                "--seqlen-q 70 --seqlen-k 90 --head-dim 64 --causal --backward"; do
        if timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 \
            $build/flashjit run --backend cuda --reps 1 --batch 5 --heads 8 --kv-heads 2 $args \
            > "$out/sanitizer.tmp" 2>&1; then
            echo "compute-sanitizer memcheck clean: $args"
        else
            echo "compute-sanitizer memcheck FAILED: $args"; tail -20 "$out/sanitizer.tmp"; status=1
        fi
    done | tee "$out/sanitizer_decode.log"
    grep -q FAILED "$out/sanitizer_decode.log" && status=1
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $build/test_append_cuda \
        > "$out/sanitizer.tmp" 2>&1 && echo "compute-sanitizer memcheck clean: test_append_cuda" ||
        { echo "compute-sanitizer memcheck FAILED: test_append_cuda"; status=1; }
    # Chunks of prefill against pages: Hopper's forward (the default beyond 16 rows; path=wgmma
    # from 1) under memcheck on pages of 16 with packed queries, and timed against the decode
    # kernels (path=decode) from 16 to 2048 rows (b 8 x 8192 keys, hq 32 / hkv 8, d 128, pages
    # of 16 and 64; the same seed, so the same key counts, for every kernel).
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 \
        $build/flashjit run --backend cuda --reps 1 --batch 3 --heads 8 --kv-heads 2 \
        --seqlen-q 200 --seqlen-k 500 --head-dim 128 --paged 16 --varlen --causal \
        > "$out/sanitizer.tmp" 2>&1 && echo "compute-sanitizer memcheck clean: paged forward" ||
        { echo "compute-sanitizer memcheck FAILED: paged forward"; tail -20 "$out/sanitizer.tmp"
          status=1; }
    for rows in 16 64 256 2048; do
        for config in path=decode path=wgmma; do
            for paged in 16 64; do
                for causal in "" --causal; do
                    echo "rows $rows, FLASHJIT_CONFIG=$config, pages of $paged $causal: $(
                        FLASHJIT_CONFIG=$config timeout 60 $build/flashjit run --backend cuda \
                        --no-check --seed 1 --reps 20 --batch 8 --heads 32 --kv-heads 8 \
                        --seqlen-q $rows --seqlen-k 8192 --head-dim 128 --paged $paged $causal \
                        2>&1 | grep -E '^kernel|^time' | cut -c1-60 | tr '\n' ' ')"
                done
            done
        done
    done 2>&1 | tee "$out/paged_prefill.log"
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/bench_paged_prefill.py \
        --lib $build/libflashjit.so --paged 16 --mixed --out "$out" 2>&1 |
        tee "$out/bench_paged_prefill.log"
    (cd $build && ctest --output-on-failure --timeout 420 -R "test_backward_cuda") \
        > "$out/ctest_backward.log" 2>&1 || status=1
    grep -E "Test +#|tests passed" "$out/ctest_backward.log"
fi
if [ "$what" = bwd ]; then
    # Every tensor-core case runs twice (with and without dq's atomics), and on Hopper once
    # more on the mma.sync kernels, each compiling its variants first: several minutes
    # (FJ_TEST_FILTER=test_tensor* runs that test alone).
    (cd $build && timeout 420 ./test_backward_cuda) > "$out/test_backward.log" 2>&1 || status=1
    grep -E "FAIL|PASSED|FAILED" "$out/test_backward.log"
    echo "on tensor cores: $(grep -c 'cuda.bwd.wgmma$' "$out/test_backward.log") cases on wgmma," \
        "$(grep -c 'cuda.bwd.mma$' "$out/test_backward.log") on mma.sync"
    for args in "--seqlen-q 130 --seqlen-k 200 --head-dim 128 --causal" \
                "--seqlen 150 --head-dim 64 --bias full --alibi heads --mask-mod k%3!=0" \
                "--seqlen 300 --head-dim 128 --varlen --causal" \
                "--seqlen 140 --head-dim 256 --window-left 40 --window-right 8" \
                "--seqlen-q 130 --seqlen-k 200 --head-dim 128 --causal --deterministic" \
                "--seqlen 300 --head-dim 128 --mask random" \
                "--seqlen 300 --head-dim 64 --causal --block-mask full"; do
        for tool in memcheck racecheck synccheck; do
            sanitize $tool --batch 2 --heads 4 --kv-heads 2 --backward $args
        done
    done | tee "$out/sanitizer_bwd.log"
    grep -q FAILED "$out/sanitizer_bwd.log" && status=1
    # The bias's gradient (a SIMT stage after the tensor cores' stages): checked at a size the
    # host's float64 reference takes in seconds, timed at 2k unchecked.
    for args in "--bias heads --dbias" "--bias full --dbias --causal" \
        "--bias keys --dbias --causal" "--bias heads"; do
        echo "== --backward $args: $(timeout 100 $build/flashjit run --backend cuda --batch 1 \
            --heads 4 --seqlen 509 --head-dim 128 --backward $args 2>&1 |
            grep -E '^dbias|PASS|FAIL' | cut -c1-80 | tr '\n' ' ')"
        echo "   timed: $(timeout 100 $build/flashjit run --backend cuda --batch 2 --heads 16 \
            --seqlen 2048 --head-dim 128 --no-check --backward $args 2>&1 |
            grep -E '^backward' | cut -c1-80)"
    done 2>&1 | tee "$out/dbias.log"
    grep -q FAIL "$out/dbias.log" && status=1
    PYTHONUNBUFFERED=1 timeout 400 python3 bench/bench_bwd.py --lib $build/libflashjit.so \
        --d 64,128,256 --s 1024,4096,16384 --out "$out" 2>&1 | tee "$out/bench_bwd.log"
    PYTHONUNBUFFERED=1 timeout 450 python3 bench/bench_masks.py --lib $build/libflashjit.so \
        --backward --cases causal,window,documents,documents_ids,prefix_lm,block_sparse \
        --out "$out" 2>&1 | tee "$out/bench_masks_bwd.log"
    PYTHONPATH=$PWD/python FLASHJIT_LIB=$PWD/$build/libflashjit.so PYTHONUNBUFFERED=1 \
        timeout 300 python3 examples/train_block.py --steps 300 2>&1 | tee "$out/train_block.log" ||
        status=1
fi
if [ "$what" = masks ]; then
    (cd $build && ctest --output-on-failure --timeout 420 -R "test_attention_cuda_class_vote") \
        > "$out/ctest_masks.log" 2>&1 || status=1
    grep -E "Test +#|tests passed|PASSED|FAILED" "$out/ctest_masks.log"
    for args in "--seqlen 1000 --head-dim 128 --mask-mod k<=q&&q-k<300" \
                "--seqlen 700 --head-dim 64 --causal --block-mask full" \
                "--seqlen 900 --head-dim 256 --mask-mod q/200==k/200"; do
        for tool in memcheck racecheck; do
            FLASHJIT_CONFIG=class_vote=1 sanitize $tool --batch 2 --heads 4 --kv-heads 2 $args
        done
    done | tee "$out/sanitizer_masks.log"
    grep -q FAILED "$out/sanitizer_masks.log" && status=1
fi
if [ "$what" = masks-bench ]; then
    PYTHONUNBUFFERED=1 timeout 500 python3 bench/bench_masks.py --lib $build/libflashjit.so \
        --cases causal,window,documents,documents_ids,prefix_lm,block_sparse \
        --config class_vote=1 --config class_vote=1,persistent=1,stages=2,q_stages=2 \
        --config class_vote=1,persistent=3,stages=2,q_stages=2 --out "$out" "$@" 2>&1 |
        tee "$out/bench_masks.log"
fi
if [ "$what" = python ]; then
    export PYTHONPATH=$PWD/python FLASHJIT_LIB=$PWD/$build/libflashjit.so PYTHONUNBUFFERED=1
    timeout 300 python3 tests/torch_api.py 2>&1 | tee "$out/torch_api.log" || status=1
    timeout 120 python3 tests/python_api.py cuda 2>&1 | tee "$out/python_api.log" || status=1
    timeout 300 python3 tests/torch_trace.py 2>&1 | tee "$out/torch_trace.log" || status=1
    timeout 120 python3 examples/serve_fp8.py 2>&1 | tee "$out/serve_fp8.log" || status=1
    timeout 300 python3 examples/train_block.py --steps 300 2>&1 | tee "$out/train_block.log" ||
        status=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    PYTHONUNBUFFERED=1 python3 bench/bench_fwd.py --lib $build/libflashjit.so --out "$out" "$@" \
        2>&1 | tee "$out/bench.log"
fi
exit $status
