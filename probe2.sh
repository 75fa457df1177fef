#!/usr/bin/env bash
export OUT
b=build-device
cmake -S . -B $b -DFLASHJIT_DEPS_ROOT=.deps/root -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build $b -j 16 2>&1 | grep -E "error|warning"
(cd $b && timeout 300 ctest --output-on-failure --timeout 250 -L gpu > $OUT/ctest.log 2>&1; echo "ctest rc $?"; grep -E "Test +#|tests passed" $OUT/ctest.log; grep -E "FAIL|SKIP" $OUT/ctest.log | head -20)
for tool in memcheck racecheck; do
 for a in "--seqlen 700 --head-dim 128 --mask-mod q/300==k/300&&k<=q" "--seqlen 500 --head-dim 64 --mask random --causal --alibi heads --bias full"; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 $b/flashjit run --backend cuda --reps 1 --batch 1 --heads 2 $a > $OUT/san.txt 2>&1; echo "$tool rc=$? $a"; grep -E "kernel |PASS|FAIL|ERROR SUMMARY|RACECHECK SUMMARY" $OUT/san.txt | head -4
 done
done
timeout 240 python3 bench/bench_masks.py --lib $b/libflashjit.so --reps 30 2>&1 | tail -12
timeout 150 python3 bench/bench_fwd.py --lib $b/libflashjit.so --d 64,128,256 --s 8192,16384 --causal 1 --reps 50 2>&1 | tail -7
