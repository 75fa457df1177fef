#!/usr/bin/env bash
# `flashjit cache build` on a machine without a GPU: NVRTC alone compiles the tensor-core
# kernels for sm_80 and sm_90a (and the merges) into a cache that verifies, with no register
# spills in the default configurations and no serialised wgmma on Hopper. Skips (exit 77) where NVRTC is not
# installed.
set -uo pipefail
cli=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
checked=0
expected=0
# kind_opts KIND: `opt`, the cache build options of a kind "OPTION|VALUE" ("": none; "OPTION|":
# no value).
kind_opts() {
    opt=()
    [ -n "$1" ] && opt=("${1%%|*}")
    [ -n "${1#*|}" ] && opt+=("${1#*|}")
}
# mma_backward_built WHAT MIN: the last build's output ($out) shown, and a failure (WHAT names
# the build) unless it succeeded ($status) with at least MIN mma.sync backward kernels and no
# backward kernel spilled.
mma_backward_built() {
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build --backward $1"; exit 1; }
    [ "$(echo "$out" | awk '$2 == "cuda.bwd.mma"' | wc -l)" -ge "$2" ] ||
        { echo "FAIL: too few mma.sync backward kernels $1"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda.bwd/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills backward kernels spill $1"; exit 1; }
    checked=$((checked + 1))
}
# Bad option values: exit 2 with a message naming the option, nothing built.
for bad in "--varlen 3|--varlen takes 1 or 2" "--ranges 3|--ranges takes 2 or 4" \
           "--bias f16|--bias takes f32 or dtype" "--dtype f32|--dtype takes bf16, f16, e4m3 and e5m2"; do
    args=${bad%%|*} message=${bad#*|}
    out=$("$cli" cache build --arch sm_90a --cache "$dir/bad.db" $args 2>&1)
    status=$?
    [ $status -eq 2 ] && echo "$out" | grep -q -- "$message" ||
        { echo "FAIL: cache build $args: status $status, '$out'"; exit 1; }
    [ ! -s "$dir/bad.db" ] || { echo "FAIL: cache build $args wrote a cache"; exit 1; }
done
checked=$((checked + 1))
for arch in sm_80 sm_90a; do
    out=$("$cli" cache build --arch $arch --cache "$dir/offline.db" --dtype bf16,f16 \
        --head-dim 64,96,128,256 --causal 0,1 --softcap 0,1 2>&1)
    status=$?
    if echo "$out" | grep -q "NVRTC is not available"; then
        echo "SKIP: NVRTC is not installed"
        exit 77
    fi
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build for $arch"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda.fwd.(mma|wgmma)$/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills kernels spill registers on $arch"; exit 1; }
    serial=$(echo "$out" | grep -c "wgmma serialised")
    [ "$serial" -eq 0 ] || { echo "FAIL: $serial kernels run their wgmma serialised"; exit 1; }
    expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
    checked=$((checked + 1))
done
# Masks, score terms and packed sequences on the Hopper kernel, one kind at a time, with the block classifier where
# it is needed: no spills, no serialised wgmma.
for kind in "--mask-mod q/64==k/64" "--mask" "--ranges 4" "--block-mask" "--bias f32" \
            "--bias dtype" "--score-mod s*0.5" "--alibi" "--varlen 2"; do
    out=$("$cli" cache build --arch sm_90a --cache "$dir/offline.db" --head-dim 64,128,256 \
        --causal 0,1 --seqlen 8192 $kind 2>&1)
    status=$?
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build $kind"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda.fwd.wgmma$/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills kernels spill registers with $kind"; exit 1; }
    [ "$(echo "$out" | grep -c "wgmma serialised")" -eq 0 ] || { echo "FAIL: serialised wgmma with $kind"; exit 1; }
    case $kind in --mask-mod*|--mask|--ranges*)
        echo "$out" | grep -q "cuda.classify" || { echo "FAIL: no block classifier built for $kind"; exit 1; } ;;
    esac
    expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
    checked=$((checked + 1))
done
# The opt-in class walk by votes (class_vote=1) with a mask_mod and with the caller's classes:
# no spills, and the kernels built are the vote's.
for kind in "--mask-mod|q / 64 == k / 64" "--block-mask|"; do
    kind_opts "$kind"
    out=$(FLASHJIT_CONFIG=class_vote=1 "$cli" cache build --arch sm_90a --cache "$dir/vote.db" \
        --head-dim 64,128,256 --causal 0,1 --seqlen 8192 "${opt[@]}" 2>&1)
    status=$?
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build class_vote=1 ${opt[*]}"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda.fwd.wgmma$/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills kernels spill with class_vote=1 ${opt[*]}"; exit 1; }
    checked=$((checked + 1))
done
votes=$("$cli" cache ls --cache "$dir/vote.db" | grep "kernel=attn_fwd_wgmma" | grep -c "class_vote=1")
[ "$votes" -eq 12 ] || { echo "FAIL: $votes of 12 forward kernels built with class_vote=1"; exit 1; }
# Head dims beyond 256 on the Hopper kernel: value slices recomputing S (d and dv to 576; d 128
# with dv 512; with a band and a mask; with v a view of k the slices' kernel is the same), and
# the opt-in split of S between a cluster pair (FLASHJIT_CONFIG=d_split=1; MLA's 576 / 512 with v
# a view of k, which loads no value tiles, asked of the forward with path=wgmma); MLA's prefill
# as planned, on the seesaw decode kernel, and the seesaw kernel with v its own tensor
# (path=decode,warps=8): no spills, no serialised wgmma.
for build in "|--head-dim 320,512,576 --head-dim-v 512" "|--head-dim 576,128 --head-dim-v 576,512" \
             "|--head-dim 448 --head-dim-v 192 --mask-mod q/32==k/32" \
             "d_split=1|--head-dim 320,512,576 --head-dim-v 512" \
             "path=wgmma,d_split=1|--head-dim 576 --head-dim-v 512 --v-in-k" \
             "|--head-dim 576 --head-dim-v 512 --v-in-k" \
             "path=decode,warps=8|--head-dim 512,576 --head-dim-v 512"; do
    config=${build%%|*} dims=${build#*|}
    out=$(FLASHJIT_CONFIG=$config "$cli" cache build --arch sm_90a --cache "$dir/offline.db" \
        $dims --causal 0,1 --seqlen 4096 2>&1)
    status=$?
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build $dims ($config)"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda\.(fwd\.wgmma|decode\.seesaw)$/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills kernels spill registers with $dims ($config)"; exit 1; }
    [ "$(echo "$out" | grep -c "wgmma serialised")" -eq 0 ] || { echo "FAIL: serialised wgmma with $dims ($config)"; exit 1; }
    case "$config|$dims" in
    "|"*--v-in-k|path=decode*) echo "$out" | grep -q "cuda.decode.seesaw" ||
        { echo "FAIL: $dims ($config) did not plan the seesaw kernel"; exit 1; } ;;
    esac
    expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
    checked=$((checked + 1))
done
# Head dims beyond 256 on mma.sync's forward in value slices (the plan's before Hopper), on
# sm_80 (163 KiB a block) and sm_86 (99 KiB: narrower tiles): every kernel is mma.sync's, no
# spills. A cache of their own: the same kernels are not counted with the others.
for arch in sm_80 sm_86; do
    for dims in "--head-dim 264,320,512,576 --head-dim-v 264,320,512,576" \
                "--head-dim 576,448 --head-dim-v 512,192"; do
        out=$("$cli" cache build --arch $arch --cache "$dir/slices.db" \
            $dims --causal 0,1 --seqlen 4096 2>&1)
        status=$?
        echo "$out"
        [ $status -eq 0 ] || { echo "FAIL: cache build $dims for $arch"; exit 1; }
        spills=$(echo "$out" | awk '$2 ~ /^cuda\.fwd/ && $9 != 0' | wc -l)
        [ "$spills" -eq 0 ] ||
            { echo "FAIL: $spills value-slice kernels spill on $arch ($dims)"; exit 1; }
        built=$(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')
        [ "$(echo "$out" | grep -c "cuda.fwd.mma")" -eq "$built" ] && [ "$built" -gt 0 ] ||
            { echo "FAIL: $dims on $arch not all on mma.sync's kernel"; exit 1; }
        checked=$((checked + 1))
    done
done
# Nested integer min/max, 16 levels (and abs, 24): NVVM's optimiser is exponential in that depth
# unless the dialect hides them from it (~50 s at 12 levels before); a bounded compile.
nested="q"
for i in $(seq 0 15); do
    if [ $((i % 2)) -eq 1 ]; then nested="min($nested, k + $i)"; else nested="max($nested, k - $i)"; fi
done
abs24="q - k"
for i in $(seq 1 24); do abs24="abs($abs24)"; done
for expr in "$nested % 5 != 0" "$abs24 % 7 != 3"; do
    start=$(date +%s)
    out=$(timeout 120 "$cli" cache build --arch sm_90a --cache "$dir/offline.db" --head-dim 64 \
        --causal 0 --seqlen 1024 --mask-mod "$expr" 2>&1)
    status=$?
    took=$(($(date +%s) - start))
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build of a nested expression (status $status)"; exit 1; }
    [ $took -le 30 ] || { echo "FAIL: a nested expression took $took s to compile"; exit 1; }
    expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
    checked=$((checked + 1))
done
# Decode: the decode kernels (on CUDA the tensor-core kernel at these shapes, and the vector
# kernel that FLASHJIT_CONFIG=path=vec asks for) whole and split and the merge of their splits,
# both archs, no spills. The vector kernels go to a cache of their own (the merges are the same
# kernels), which the count at the end leaves out.
for arch in sm_80 sm_90a; do
    for kernel in mma vec; do
        db=$([ $kernel = vec ] && echo vec.db || echo offline.db)
        out=$(FLASHJIT_CONFIG=$([ $kernel = vec ] && echo path=vec) "$cli" cache build \
            --arch $arch --cache "$dir/$db" --decode 1,4 --group 1,8 --head-dim 64,128 \
            --causal 0,1 --seqlen 8192 2>&1)
        status=$?
        echo "$out"
        [ $status -eq 0 ] || { echo "FAIL: cache build --decode ($kernel) for $arch"; exit 1; }
        spills=$(echo "$out" | awk '$2 ~ /^cuda\.(decode|decode\.vec|decode\.mma|merge)$/ && $9 != 0' | wc -l)
        [ "$spills" -eq 0 ] || { echo "FAIL: $spills decode kernels spill on $arch"; exit 1; }
        echo "$out" | grep -q "cuda.decode.$kernel" && echo "$out" | grep -q "cuda.merge" ||
            { echo "FAIL: no $kernel decode or merge kernel built for $arch"; exit 1; }
        [ $kernel = vec ] ||
            expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
        checked=$((checked + 1))
    done
done
# Decode of packed sequences (dense, and packed queries against pages of 16) whole and split, with
# the merge that writes each sequence's packed rows, and chunks of 64 rows against pages (causal:
# each row tile's own band; on sm_90a Hopper's forward): both archs, no spills. A cache of their own
# (the merge differs from the ones above only by its packed rows).
for arch in sm_80 sm_90a; do
    out=$("$cli" cache build --arch $arch --cache "$dir/varlen_decode.db" --decode 1,4 \
        --group 1,8 --head-dim 64,128 --causal 0,1 --seqlen 8192 --varlen 2 --paged 0,16 2>&1 &&
        "$cli" cache build --arch $arch --cache "$dir/varlen_decode.db" --decode 64 --group 4 \
            --head-dim 128 --causal 0,1 --seqlen 8192 --paged 16 2>&1)
    status=$?
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build --decode --varlen for $arch"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda\.(decode|merge)/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills packed decode kernels spill on $arch"; exit 1; }
    echo "$out" | grep -q "cuda.decode.mma" && echo "$out" | grep -q "cuda.merge" ||
        { echo "FAIL: no packed decode or merge kernel built for $arch"; exit 1; }
    checked=$((checked + 1))
done
# A decode is built for a small cache and a large one, whose plans on sm_90a copy the tiles
# otherwise: on pages of 16 keys row copies, and from 512 MiB tensor maps a page at a time. So
# one request's shipped kernels are both, whole and split (4), its merge and its append.
out=$("$cli" cache build --arch sm_90a --cache "$dir/large_decode.db" --decode 1 --group 4 \
    --head-dim 128 --causal 0 --seqlen 8192 --paged 16 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] && [ "$(echo "$out" | grep -c "cuda.decode.mma")" -eq 4 ] ||
    { echo "FAIL: cache build --paged 16: expected 4 decode kernels (small and large caches)"; exit 1; }
checked=$((checked + 1))
# Chunks of prefill against pages on sm_90a: Hopper's forward copying the keys by pages (a tile a
# copy on pages of 64 and 256, several pages a copy each on pages of 8 and 16), no spills (the
# copying thread keeps its tile's page numbers), and the decode kernels on pages of 5.
out=$("$cli" cache build --arch sm_90a --cache "$dir/paged_prefill.db" \
    --decode 64 --group 4 --head-dim 64,96,128,256 --causal 0,1 --seqlen 4096 \
    --paged 5,8,16,64,256 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] || { echo "FAIL: cache build of paged chunks (status $status)"; exit 1; }
spills=$(echo "$out" | awk '$2 ~ /^cuda\.(fwd|decode)/ && $9 != 0' | wc -l)
[ "$spills" -eq 0 ] || { echo "FAIL: $spills paged chunk kernels spill"; exit 1; }
[ "$(echo "$out" | grep -c "cuda.fwd.wgmma")" -eq 22 ] && echo "$out" | grep -q "cuda.decode.mma" ||
    { echo "FAIL: paged chunks: expected 22 forward kernels (d 96 shares d 128's) and decode's"
      exit 1; }
checked=$((checked + 1))
# Decode with value dims beyond 256 (MLA's 576 / 512 with v a view of k; 320 soft-capped): on
# sm_90a from 16 packed rows a kv head the wgmma kernels (MLA's 128 heads dense and on pages of
# 64 the seesaw kernel, by bulk tensor copies; 16 heads, pages of 16 and 320's the other, by its
# threads' copies or bulk ones), below it (8 heads) and on sm_80 the mma kernel's split_dv; both
# archs, no spills.
# A cache of their own (their merges are the kernels above's).
for arch in sm_80 sm_90a; do
    out=$("$cli" cache build --arch $arch --cache "$dir/wide_decode.db" --decode 1,2 \
        --group 8,16,128 --head-dim 576 --head-dim-v 512 --v-in-k --causal 0,1 --seqlen 8192 \
        --paged 0,16,64 2>&1 &&
        "$cli" cache build --arch $arch --cache "$dir/wide_decode.db" --decode 1 --group 64 \
            --head-dim 320 --softcap 1 --causal 1 --seqlen 8192 --paged 0,64 2>&1)
    status=$?
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build --decode of wide heads for $arch"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda\.decode/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills wide decode kernels spill on $arch"; exit 1; }
    [ $arch = sm_80 ] || { echo "$out" | grep -q "cuda.decode.wgmma" &&
        echo "$out" | grep -q "cuda.decode.seesaw"; } ||
        { echo "FAIL: no wgmma or seesaw decode kernel built for $arch"; exit 1; }
    echo "$out" | grep -q "cuda.decode.mma" ||
        { echo "FAIL: no mma decode kernel built for $arch"; exit 1; }
    checked=$((checked + 1))
done
# Training: --backward adds the backward's kernels through a score_mod's derivative, with a
# bias and its gradient: D, dk/dv on wgmma (adding dq; the same kernel deterministic, in runs),
# the cast of dq, and the dbias stage on mma.sync after them; all build, none spills.
out=$("$cli" cache build --arch sm_90a --cache "$dir/offline.db" --head-dim 64 --causal 1 \
    --seqlen 1024 --backward --bias f32 --score-mod "s * 0.5 + tanh(s)" 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] || { echo "FAIL: cache build --backward (status $status)"; exit 1; }
[ "$(echo "$out" | grep -c "cuda.bwd.simt")" -eq 2 ] &&
    [ "$(echo "$out" | grep -c "cuda.bwd.wgmma")" -eq 1 ] &&
    [ "$(echo "$out" | grep -c "cuda.bwd.mma")" -eq 1 ] ||
    { echo "FAIL: cache build --backward did not build D, dk/dv, the cast and dbias"; exit 1; }
[ "$(echo "$out" | awk '$2 ~ /^cuda.bwd/ && $9 != 0' | wc -l)" -eq 0 ] ||
    { echo "FAIL: a backward kernel with dbias spills"; exit 1; }
expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
checked=$((checked + 1))
# The backward's tensor-core stages (dkdv adding dq, and the cast; on sm_80 dkdv and dq when
# deterministic; dK and dV apart at d 256), both archs, and with the masks, score terms,
# soft-capping, a mask tensor, ranges, block classes and packed sequences they take (sm_90a):
# built, no spills. A cache of their own: the builds share the D stage's kernels, which the
# count at the end would see twice.
for arch in sm_80 sm_90a; do
    kinds=("")
    [ $arch = sm_90a ] && kinds+=("--mask-mod|k % 3 != 0" "--mask-mod|abs(q - k) < 300 || q / 64 == k / 64"
        "--score-mod|s * 0.5 + tanh(s)" "--varlen|2"
        "--softcap|1" "--ranges|4" "--mask|" "--block-mask|")
    for kind in "${kinds[@]}"; do
        kind_opts "$kind"
        out=$("$cli" cache build --arch $arch --cache "$dir/backward.db" --dtype bf16 \
            --head-dim 64,128,256 --causal 0,1 --seqlen 2048 --backward "${opt[@]}" 2>&1)
        status=$?
        echo "$out"
        [ $status -eq 0 ] || { echo "FAIL: cache build --backward ${opt[*]} for $arch"; exit 1; }
        spills=$(echo "$out" | awk '$2 ~ /^cuda.bwd.w?gmma$|^cuda.bwd.mma$/ && $9 != 0' | wc -l)
        [ "$spills" -eq 0 ] || { echo "FAIL: $spills backward kernels spill on $arch ${opt[*]}"; exit 1; }
        echo "$out" | grep -qE "cuda.bwd.w?gmma|cuda.bwd.mma" ||
            { echo "FAIL: no tensor-core backward built for $arch ${opt[*]}"; exit 1; }
        # Hopper's dk/dv kernels (d 64 to 256: the split one beyond 128), on sm_90a only
        hopper=$(echo "$out" | grep -c "cuda.bwd.wgmma")
        if [ $arch = sm_90a ]; then [ "$hopper" -gt 0 ]; else [ "$hopper" -eq 0 ]; fi ||
            { echo "FAIL: $hopper Hopper backward kernels built for $arch ${opt[*]}"; exit 1; }
        checked=$((checked + 1))
    done
done
# A bias (f32 and in q's dtype) through Hopper's dk/dv kernels at d 64 (64 streamed rows) and
# 256, and its gradient on mma.sync: no spills. (Hopper's dk/dv kernel at d 128 keeps 4-8
# bytes spilled at 255 registers: bench/RESULTS.md.)
for bias in f32 dtype; do
    out=$("$cli" cache build --arch sm_90a --cache "$dir/backward.db" --dtype bf16 \
        --head-dim 64,256 --causal 0,1 --seqlen 2048 --backward --bias $bias 2>&1)
    status=$?
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build --backward --bias $bias"; exit 1; }
    [ "$(echo "$out" | grep -c "cuda.bwd.wgmma")" -eq 4 ] &&
        [ "$(echo "$out" | grep -c "cuda.bwd.mma")" -eq 4 ] ||
        { echo "FAIL: not four Hopper dk/dv and four dbias kernels with --bias $bias"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda.bwd/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills backward kernels spill with --bias $bias"; exit 1; }
    checked=$((checked + 1))
done
# On sm_80 the dk/dv, dq and dbias stages are all mma.sync's, to d 256: no spills.
out=$("$cli" cache build --arch sm_80 --cache "$dir/backward.db" --dtype bf16 \
    --head-dim 64,128,256 --causal 0,1 --seqlen 2048 --backward --bias dtype --softcap 1 2>&1)
status=$?
mma_backward_built "with a bias on sm_80" 6
# mma.sync's dk/dv kernel with its warps in a grid, on Hopper (`path=mma`: up to 128-row tiles
# at d 64 and 64 at d 128, where sm_80's shared memory takes fewer), with the masks and the
# packed sequences that shrink its tiles: built, no spills.
for kind in "" "--mask-mod|k % 3 != 0" "--ranges|4" "--mask|" "--block-mask|" "--varlen|2"; do
    kind_opts "$kind"
    out=$(FLASHJIT_BWD_CONFIG=path=mma "$cli" cache build --arch sm_90a --cache "$dir/backward.db" \
        --dtype bf16 --head-dim 64,128 --causal 0,1 --seqlen 2048 --backward "${opt[@]}" 2>&1)
    status=$?
    mma_backward_built "with path=mma ${opt[*]} on sm_90a" 8
done
# The opt-in two blocks per SM (one consumer warpgroup each, 232 registers): no spills either.
out=$(FLASHJIT_CONFIG=tile_m=64,warps=8,ctas_per_sm=2,pingpong=0 "$cli" cache build --arch sm_90a \
    --cache "$dir/offline.db" --head-dim 64 --causal 0,1 --seqlen 1024 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] || { echo "FAIL: cache build with two blocks per SM"; exit 1; }
spills=$(echo "$out" | awk '$2 ~ /^cuda.fwd.wgmma$/ && $9 != 0' | wc -l)
[ "$spills" -eq 0 ] || { echo "FAIL: $spills kernels spill with two blocks per SM"; exit 1; }
expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
checked=$((checked + 1))
# FP8: inputs in e4m3 and e5m2 (out bf16) on Hopper's kernel (FP8 products, each value tile by
# one bulk copy from v transposed by a plan step, whose kernel builds once a format; beyond 128
# columns of q and k S summed by panels in key parts; no spills, no serialised wgmma), and an FP8
# KV cache read by bf16 queries on the vector decode kernel (whole and split), each with and
# without descale factors: all build, two kernels a shape. A cache of their own: the decode's
# merge is also built above, which the count at the end would see twice.
out=$("$cli" cache build --arch sm_90a --cache "$dir/fp8.db" --dtype e4m3,e5m2 \
    --head-dim 64,128,192,256 --head-dim-v 64,128,128,256 --causal 0,1 --seqlen 1024 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] || { echo "FAIL: cache build --dtype e4m3,e5m2 (status $status)"; exit 1; }
[ "$(echo "$out" | grep -c "cuda.fwd.wgmma f8e")" -eq 32 ] &&
    [ "$(echo "$out" | grep -c "cuda.transpose_v f8e")" -eq 2 ] ||
    { echo "FAIL: cache build --dtype e4m3,e5m2: not 32 FP8 kernels and 2 transposing ones"
      exit 1; }
echo "$out" | awk '($2 == "cuda.fwd.wgmma" || $2 == "cuda.transpose_v") && $9 != 0 { bad = 1 }
                   END { exit bad }' || { echo "FAIL: an FP8 Hopper kernel spills"; exit 1; }
[ "$(echo "$out" | grep -c "wgmma serialised")" -eq 0 ] ||
    { echo "FAIL: an FP8 Hopper kernel runs its wgmma serialised"; exit 1; }
# The same with the kernel's own transposing warps (FLASHJIT_CONFIG=v_transposed=0, as packed
# sequences take): the 32 kernels stage each value tile (their producer keeps 40 or 56
# registers, so the consumers' tiles differ); no spills.
out=$(FLASHJIT_CONFIG=v_transposed=0 "$cli" cache build --arch sm_90a --cache "$dir/fp8.db" \
    --dtype e4m3,e5m2 --head-dim 64,128,192,256 --head-dim-v 64,128,128,256 --causal 0,1 \
    --seqlen 1024 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] || { echo "FAIL: cache build with v_transposed=0 (status $status)"; exit 1; }
[ "$(echo "$out" | grep -c "cuda.fwd.wgmma f8e")" -eq 32 ] ||
    { echo "FAIL: v_transposed=0 did not build 32 FP8 kernels"; exit 1; }
echo "$out" | awk '$2 == "cuda.fwd.wgmma" && $9 != 0 { bad = 1 } END { exit bad }' ||
    { echo "FAIL: a kernel spills with v_transposed=0"; exit 1; }
[ "$(echo "$out" | grep -c "wgmma serialised")" -eq 0 ] ||
    { echo "FAIL: an FP8 Hopper kernel runs its wgmma serialised (v_transposed=0)"; exit 1; }
# An FP8 KV cache read by bf16 queries: the tensor-core decode kernel (cvt on sm_90a, bit
# placement on sm_80), its plan's and the tuner's other copy (four kernels a build), no spills.
for arch in sm_90a sm_80; do
    out=$("$cli" cache build --arch $arch --cache "$dir/fp8.db" --dtype bf16 --kv-dtype e4m3 \
        --decode 1 --group 4 --head-dim 128 --causal 0 --seqlen 8192 2>&1)
    status=$?
    echo "$out"
    [ $status -eq 0 ] ||
        { echo "FAIL: cache build --kv-dtype e4m3 for $arch (status $status)"; exit 1; }
    [ "$(echo "$out" | awk '$2 == "cuda.decode.mma" && $9 == 0' | wc -l)" -eq 4 ] ||
        { echo "FAIL: cache build --kv-dtype e4m3 for $arch: not four decode kernels without spills"
          exit 1; }
done
# The same cache paged, also its appends: FP8 tokens copied, bf16 ones quantised (no spills).
out=$("$cli" cache build --arch sm_90a --cache "$dir/fp8.db" --dtype bf16 --kv-dtype e4m3 \
    --decode 1 --group 4 --head-dim 128 --causal 0 --seqlen 8192 --paged 16 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] || { echo "FAIL: cache build --kv-dtype e4m3 --paged 16 ($status)"; exit 1; }
[ "$(echo "$out" | awk '$2 == "cuda.kv_append" && $9 == 0' | wc -l)" -eq 2 ] ||
    { echo "FAIL: cache build --kv-dtype e4m3 --paged 16: not two append kernels"; exit 1; }
"$cli" cache verify "$dir/fp8.db" || exit 1
checked=$((checked + 1))
# Merges: one launch and a chain, with and without lse, both archs: no spills.
for arch in sm_80 sm_90a; do
    out=$("$cli" cache build --arch $arch --cache "$dir/offline.db" --merge 2,8,20 --lse 0,1 2>&1)
    status=$?
    echo "$out"
    [ $status -eq 0 ] || { echo "FAIL: cache build --merge for $arch"; exit 1; }
    spills=$(echo "$out" | awk '$2 ~ /^cuda.merge$/ && $9 != 0' | wc -l)
    [ "$spills" -eq 0 ] || { echo "FAIL: $spills merge kernels spill on $arch"; exit 1; }
    echo "$out" | grep -q "cuda.merge" || { echo "FAIL: no merge kernel built for $arch"; exit 1; }
    expected=$((expected + $(echo "$out" | sed -n 's/^\([0-9]*\) kernels built.*/\1/p')))
    checked=$((checked + 1))
done
"$cli" cache verify "$dir/offline.db" || exit 1
kernels=$("$cli" cache ls --cache "$dir/offline.db" | grep -c "^[0-9a-f]\{12\} cuda")
[ "$kernels" -eq "$expected" ] || { echo "FAIL: expected $expected kernels in the cache, found $kernels"; exit 1; }
echo "$((checked + 1)) passed, 0 failed"
