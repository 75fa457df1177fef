"""The PEP 517 build backend of the flashjit Python package (pyproject.toml names it), so that
`pip install .` needs nothing beyond CMake and a C compiler: no build requirements to download.

build_wheel configures the C library with CMake (tests off, Release; extra arguments from
$CMAKE_ARGS, e.g. -DFLASHJIT_DEPS_ROOT=...), builds the shared library, and packs it with the
package python/flashjit/ into a platform wheel. The version is the CMake project's."""
import base64
import hashlib
import io
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKAGE = os.path.join(ROOT, "python", "flashjit")
SUMMARY = "Exact attention (FlashAttention) with kernels written at run time"


def _version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(flashjit VERSION ([0-9.]+)", f.read()).group(1)


def _metadata():
    extras = {"torch": ["torch>=2.4"], "numpy": ["numpy"]}
    lines = ["Metadata-Version: 2.1", "Name: flashjit", f"Version: {_version()}",
             f"Summary: {SUMMARY}", "Requires-Python: >=3.8", "License: see the source tree"]
    for extra, reqs in extras.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {r}; extra == \"{extra}\"" for r in reqs]
    readme = os.path.join(ROOT, "README.md")
    body = open(readme).read() if os.path.exists(readme) else ""
    return "\n".join(lines) + "\nDescription-Content-Type: text/markdown\n\n" + body


def _tag(extension):
    """The wheel's tag: any Python 3, or this interpreter's ABI where the wheel carries the
    compiled fast path (extension: its file, or None)."""
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    if extension is None:
        return f"py3-none-{platform}"
    abi = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"{abi}-{abi}-{platform}"


def _build_library(build_dir):
    """Builds the library and, where this interpreter's headers are found, the binding's fast
    path (_fastcall); returns (library, extension or None)."""
    configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                 "-DFLASHJIT_TESTS=OFF", f"-DPython3_EXECUTABLE={sys.executable}"] + \
        shlex.split(os.environ.get("CMAKE_ARGS", ""))
    jobs = str(os.cpu_count() or 1)
    build = ["cmake", "--build", build_dir, "--target", "flashjit", "-j", jobs]
    for cmd in (configure, build):
        print("flashjit build:", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    library = os.path.realpath(os.path.join(build_dir, "libflashjit.so"))
    extension = os.path.join(build_dir, "_fastcall" + sysconfig.get_config_var("EXT_SUFFIX"))
    fast = subprocess.run(build[:4] + ["flashjit_fastcall"] + build[5:], stdout=sys.stderr,
                          stderr=sys.stderr)
    if fast.returncode != 0 or not os.path.exists(extension):
        print("flashjit build: no fast path (_fastcall); the package calls through ctypes",
              file=sys.stderr, flush=True)
        return library, None
    return library, extension


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


# ---- PEP 517 hooks -------------------------------------------------------------------------
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = f"flashjit-{_version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w") as f:
        f.write(_metadata())
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    build_dir = os.environ.get("FLASHJIT_WHEEL_BUILD_DIR", os.path.join(ROOT, "build-wheel"))
    library, extension = _build_library(build_dir)
    name = f"flashjit-{version}-{_tag(extension)}.whl"
    dist_info = f"flashjit-{version}.dist-info"
    files = []
    for entry in sorted(os.listdir(PACKAGE)):
        if entry.endswith(".py"):
            with open(os.path.join(PACKAGE, entry), "rb") as f:
                files.append((f"flashjit/{entry}", f.read()))
    with open(library, "rb") as f:
        files.append(("flashjit/libflashjit.so", f.read()))
    if extension is not None:
        with open(extension, "rb") as f:
            files.append((f"flashjit/{os.path.basename(extension)}", f.read()))
    files.append((f"{dist_info}/METADATA", _metadata().encode()))
    files.append((f"{dist_info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: flashjit_build\n"
                                         f"Root-Is-Purelib: false\nTag: {_tag(extension)}\n").encode()))
    record = [_record_line(n, d) for n, d in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    return name


def build_sdist(sdist_directory, config_settings=None):
    """The tracked files of the checkout (git ls-files) as flashjit-VERSION.tar.gz."""
    version = _version()
    name = f"flashjit-{version}.tar.gz"
    tracked = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode().split("\0")
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for rel in filter(None, tracked):
            tar.add(os.path.join(ROOT, rel), arcname=f"flashjit-{version}/{rel}",
                    recursive=False)
        pkg_info = f"flashjit-{version}/PKG-INFO"
        data = _metadata().encode()
        info = tarfile.TarInfo(pkg_info)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return name
