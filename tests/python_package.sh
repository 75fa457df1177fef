#!/usr/bin/env bash
# The Python package as a user gets it: `pip install <source>` into a fresh virtual environment
# (the in-tree build backend compiles the library with CMake), NumPy from the package index,
# then tests/python_api.py with the installed package, from outside the source tree, on the
# backend given (default opencl). Exits 77 (skipped) where venv or NumPy cannot be had.
# Usage: tests/python_package.sh SOURCE_DIR [backend]
set -uo pipefail
src=$(cd "$1" && pwd)
backend=${2:-opencl}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv" || { echo "SKIP: python3 -m venv failed"; exit 77; }
py="$work/venv/bin/python"
# The wheel's library is built in a folder of its own, not the source tree's.
FLASHJIT_WHEEL_BUILD_DIR="$work/build" "$py" -m pip install --quiet --disable-pip-version-check \
    "$src" || { echo "FAIL: pip install $src"; exit 1; }
"$py" -m pip install --quiet --disable-pip-version-check numpy ||
    { echo "SKIP: numpy could not be installed from the package index"; exit 77; }
cd "$work" || exit 1
# The installed package, not the checkout: FLASHJIT_LIB unset, the source tree not on the path.
env -u FLASHJIT_LIB -u PYTHONPATH "$py" -c \
    'import flashjit, os; print("installed:", os.path.dirname(flashjit.__file__))' &&
    env -u FLASHJIT_LIB -u PYTHONPATH "$py" -m flashjit ||
    { echo "FAIL: import flashjit (python -m flashjit) from the installed package"; exit 1; }
# Where this Python has its headers, the wheel carries the C fast path of repeated calls.
env -u FLASHJIT_LIB -u PYTHONPATH "$py" -c '
import os, sysconfig, flashjit
has = flashjit.info()["fast_path"]
headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
print("fast path (_fastcall):", has)
raise SystemExit(0 if has or not headers else "the wheel lacks _fastcall though Python.h exists")' ||
    { echo "FAIL: the installed package has no fast path"; exit 1; }
env -u FLASHJIT_LIB -u PYTHONPATH "$py" "$src/tests/python_api.py" "$backend"
