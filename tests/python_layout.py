"""The ctypes structures of python/flashjit.py match the C library's: each *_init function
writes struct_size, which must equal the binding's size (a shorter binding structure would be
overrun by the library). Usage: python3 tests/python_layout.py build/libflashjit.so"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashjit  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])
failed = 0
checks = [("fj_attention_desc_init", flashjit._AttentionDesc),
          ("fj_context_options_init", flashjit._ContextOptions)]
for init, cls in checks:
    buf = ctypes.create_string_buffer(4096)
    getattr(lib, init)(buf)
    c_size = int.from_bytes(buf.raw[:8], "little")
    ok = c_size == ctypes.sizeof(cls)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {cls.__name__}: C {c_size} bytes, binding {ctypes.sizeof(cls)}")
# fj_call_info is filled by fj_context_last_call, which checks struct_size: a context on any
# backend answers FJ_ERR_INVALID_ARGUMENT (1) for a wrong size and FJ_OK (0) for the right one.
opts = flashjit._ContextOptions()
lib.fj_context_options_init(ctypes.byref(opts))
opts.cache_path = b":memory:"
ctx = ctypes.c_void_p()
if lib.fj_context_create(ctypes.byref(opts), ctypes.byref(ctx)) == 0:
    info = flashjit._CallInfo()
    info.struct_size = ctypes.sizeof(info)
    ok = lib.fj_context_last_call(ctx, ctypes.byref(info)) == 0
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} _CallInfo: binding {ctypes.sizeof(info)} bytes")
    lib.fj_context_destroy(ctx)
    total = 3
else:
    print("SKIP _CallInfo: no device for a context")
    total = 2
print(f"{total - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
