#!/usr/bin/env bash
# Installs the Debian packages flashjit builds and runs with, when any is missing. As root it
# runs apt-get; otherwise it prints the command to run. FLASHJIT_SKIP_DEPS=1 skips the check
# (for machines without apt, which build against FLASHJIT_DEPS_ROOT instead). With the argument
# `fuzz` it also installs what `make fuzz` needs.
set -euo pipefail
[ "${FLASHJIT_SKIP_DEPS:-0}" = 1 ] && exit 0
packages=(cmake make gcc libc6-dev pkgconf liblua5.4-dev libsqlite3-dev libsodium-dev libcmocka-dev
          pocl-opencl-icd ocl-icd-opencl-dev opencl-headers)
if [ "${1:-}" = fuzz ]; then # clang and its libFuzzer runtime
    packages+=(clang libclang-rt-dev)
fi
missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" != 0 ]; then
    echo "flashjit needs these packages: ${missing[*]}" >&2
    echo "run as root: apt-get update && $cmd" >&2
    exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
$cmd
