#!/usr/bin/env bash
# The three ways to consume flashjit, each built and run: the installed CMake package
# (flashjit::flashjit and flashjit::flashjit_static), the installed pkg-config file (shared, and
# static with Libs.private), and add_subdirectory of the source tree; and the C++ example
# (examples/cpp, find_package), which runs an attention on the device. Usage:
# tests/install_consumers.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
prefix=$dir/prefix
cmake --install "$build" --prefix "$prefix" > "$dir/install.log" 2>&1 ||
    { cat "$dir/install.log"; fail "cmake --install"; }
for f in include/flashjit.h bin/flashjit lib/cmake/flashjit/flashjitConfig.cmake \
         lib/pkgconfig/flashjit.pc lib/libflashjit.a; do
    [ -e "$prefix/$f" ] || fail "$f not installed"
done
soname=$(objdump -p "$prefix"/lib/libflashjit.so | awk '$1 == "SONAME" {print $2}')
[ "$soname" = libflashjit.so.0 ] || fail "SONAME is '$soname'"
"$prefix/bin/flashjit" --help > /dev/null 2>&1; [ $? -le 2 ] || fail "installed CLI"
"$prefix/bin/flashjit" info > /dev/null 2>&1 || fail "installed CLI: flashjit info"

# 1. find_package(flashjit)
cmake -S "$src/tests/consumer" -B "$dir/pkg" -DCMAKE_PREFIX_PATH="$prefix" > "$dir/pkg.log" 2>&1 &&
    cmake --build "$dir/pkg" >> "$dir/pkg.log" 2>&1 || { cat "$dir/pkg.log"; fail "find_package consumer"; }
"$dir/pkg/app_shared" || fail "find_package: the shared-library program"
"$dir/pkg/app_static" || fail "find_package: the static program"
ldd "$dir/pkg/app_static" | grep -q libflashjit && fail "app_static links libflashjit.so"

# 2. pkg-config
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# The new user's way: no rpath or LD_LIBRARY_PATH of their own (the .pc file carries the rpath).
cc -o "$dir/pc_shared" "$src/tests/consumer/main.c" $(pkg-config --cflags --libs flashjit) ||
    fail "pkg-config: shared link"
env -u LD_LIBRARY_PATH "$dir/pc_shared" || fail "pkg-config: the shared-library program"
cc -o "$dir/pc_static" "$src/tests/consumer/main.c" $(pkg-config --cflags flashjit) \
    "$prefix/lib/libflashjit.a" $(pkg-config --static --libs-only-l flashjit | sed 's/-lflashjit//') ||
    fail "pkg-config: static link with Libs.private"
"$dir/pc_static" || fail "pkg-config: the static program"

# 3. add_subdirectory (as FetchContent does): only the library and the program are built
cmake -S "$src/tests/consumer" -B "$dir/sub" -DFLASHJIT_SOURCE="$src" > "$dir/sub.log" 2>&1 &&
    cmake --build "$dir/sub" --target app_shared -j "$(nproc)" >> "$dir/sub.log" 2>&1 ||
    { tail -30 "$dir/sub.log"; fail "add_subdirectory consumer"; }
"$dir/sub/app_shared" || fail "add_subdirectory: the program"
[ ! -e "$dir/sub/flashjit/tests" ] || fail "add_subdirectory built flashjit's tests"
# 4. The C++ example of examples/cpp, with find_package; it runs an attention on the device.
cmake -S "$src/examples/cpp" -B "$dir/cpp" -DCMAKE_PREFIX_PATH="$prefix" > "$dir/cpp.log" 2>&1 &&
    cmake --build "$dir/cpp" >> "$dir/cpp.log" 2>&1 || { cat "$dir/cpp.log"; fail "C++ example"; }
"$dir/cpp/attention_cpp" || fail "C++ example: the program (no device, or a wrong result)"
echo "ok: find_package (shared, static), pkg-config (shared, static), add_subdirectory, C++"
