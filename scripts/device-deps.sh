#!/usr/bin/env bash
# Fetches the Debian packages that a machine without apt (the GPU machine) needs to build and test
# flashjit, and extracts them into .deps/root. Run here, on a Debian machine with apt; then build
# there with scripts/device-test.sh, which points CMake at .deps/root.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(liblua5.4-dev liblua5.4-0 libcmocka-dev libcmocka0 libsqlite3-dev libsqlite3-0
          libsodium-dev libsodium23 opencl-c-headers)
mkdir -p .deps/debs .deps/root
(cd .deps/debs && apt-get download "${packages[@]}")
for deb in .deps/debs/*.deb; do dpkg -x "$deb" .deps/root; done
echo "extracted ${#packages[@]} packages into .deps/root"
