"""The ctypes structures of python/flashjit/_lib.py match the C library's: each *_init function
writes struct_size, which must equal the binding's size (a shorter binding structure would be
overrun by the library). Usage: python3 tests/python_layout.py build/libflashjit.so"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashjit import _lib  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])
failed = 0
checks = [("fj_attention_desc_init", _lib.AttentionDesc),
          ("fj_context_options_init", _lib.ContextOptions)]
for init, cls in checks:
    buf = ctypes.create_string_buffer(4096)
    getattr(lib, init)(buf)
    c_size = int.from_bytes(buf.raw[:8], "little")
    ok = c_size == ctypes.sizeof(cls)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {cls.__name__}: C {c_size} bytes, binding {ctypes.sizeof(cls)}")
# fj_call_info and fj_device_info are filled by calls that check struct_size: a context on any
# backend answers FJ_ERR_INVALID_ARGUMENT (1) for a wrong size and FJ_OK (0) for the right one.
opts = _lib.ContextOptions()
lib.fj_context_options_init(ctypes.byref(opts))
opts.cache_path = b":memory:"
ctx = ctypes.c_void_p()
if lib.fj_context_create(ctypes.byref(opts), ctypes.byref(ctx)) == 0:
    info = _lib.CallInfo()
    info.struct_size = ctypes.sizeof(info)
    ok = lib.fj_context_last_call(ctx, ctypes.byref(info)) == 0
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} CallInfo: binding {ctypes.sizeof(info)} bytes")
    dev = _lib.DeviceInfo()
    dev.struct_size = ctypes.sizeof(dev)
    ok = lib.fj_context_get_device_info(ctx, ctypes.byref(dev)) == 0 and dev.arch
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} DeviceInfo: binding {ctypes.sizeof(dev)} bytes, "
          f"arch {dev.arch.decode()!r}")
    lib.fj_context_destroy(ctx)
    total = 4
else:
    print("SKIP CallInfo, DeviceInfo: no device for a context")
    total = 2
print(f"{total - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
