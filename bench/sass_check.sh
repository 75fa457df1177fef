#!/usr/bin/env bash
# Builds the default Hopper kernels of the benchmark grid (bf16, d 64/128/256, causal or not,
# 512 to 16k keys) into a cache with NVRTC, and checks the SASS of each binary: wgmma (HGMMA)
# and bulk tensor loads (UTMALDG) present, no local-memory traffic (LDL/STL). Prints one line
# per kernel; exits 1 when any check fails. Needs cuobjdump (CUDA toolkit) and python3.
# Usage: bench/sass_check.sh [BUILD_DIR]
set -uo pipefail
build=${1:-build}
command -v cuobjdump >/dev/null || { echo "cuobjdump not found"; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/flashjit" cache build --arch sm_90a --cache "$dir/grid.db" --dtype bf16 \
    --head-dim 64,128,256 --causal 0,1 --seqlen 512,1024,2048,4096,8192,16384 > "$dir/build.log" 2>&1 ||
    { cat "$dir/build.log"; exit 1; }
# Each forward kernel's binary, and a line naming its tile fields.
python3 - "$dir" <<'PY'
import os, sqlite3, sys
d = sys.argv[1]
fields = ("head_dim_pad", "local_mask", "tile_m", "tile_n", "stages", "overlap", "pingpong",
          "persistent", "exp_poly", "lazy_rescale")
rows = sqlite3.connect(os.path.join(d, "grid.db")).execute(
    "SELECT key, variant_text, binary FROM kernels WHERE variant_text LIKE '%attn_fwd_wgmma%'")
for key, text, binary in rows:
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    with open(os.path.join(d, key[:12] + ".cubin"), "wb") as f:
        f.write(binary)
    with open(os.path.join(d, key[:12] + ".txt"), "w") as f:
        f.write(" ".join(f"{k}={kv.get(k, '?')}" for k in fields))
PY
status=0
n=0
for cubin in "$dir"/*.cubin; do
    [ -e "$cubin" ] || break
    sass=$(cuobjdump -sass "$cubin")
    hgmma=$(grep -c "HGMMA" <<< "$sass")
    tma=$(grep -c "UTMALDG" <<< "$sass")
    local_mem=$(grep -cE "\b(LDL|STL)(\.|\b)" <<< "$sass")
    verdict=ok
    [ "$hgmma" -gt 0 ] && [ "$tma" -gt 0 ] && [ "$local_mem" -eq 0 ] || { verdict=FAIL; status=1; }
    echo "$(cat "${cubin%.cubin}.txt"): HGMMA $hgmma, UTMALDG $tma, LDL/STL $local_mem $verdict"
    n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "FAIL: no Hopper kernel was built"; exit 1; }
echo "$n kernels checked"
exit $status
