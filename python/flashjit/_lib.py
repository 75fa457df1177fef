"""libflashjit through ctypes: the C structures the binding shares with flashjit.h, and where
the library is found. tests/python_layout.py checks the structures against the library."""
import ctypes
import ctypes.util
import importlib.machinery
import importlib.util
import os

# flashjit.h's enums.
DTYPES = {"f16": 0, "bf16": 1, "f32": 2, "f8_e4m3": 3, "f8_e5m2": 4, "bool": 5, "i32": 6}
DTYPE_SIZES = {0: 2, 1: 2, 2: 4, 3: 1, 4: 1, 5: 1, 6: 4}
BACKENDS = {"auto": 0, "cuda": 1, "opencl": 2}
SOURCES = ["none", "memory", "user cache", "shipped cache", "compiled"]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


# fj_allocator's functions: alloc(user, bytes, stream) -> pointer, free(user, ptr, bytes, stream).
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_void_p)


class Allocator(ctypes.Structure):
    _fields_ = [("alloc", ALLOC_FN), ("free", FREE_FN), ("user", ctypes.c_void_p)]


class ContextOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_int),
                ("device", ctypes.c_int32), ("cache_path", ctypes.c_char_p),
                ("shipped_caches", ctypes.POINTER(ctypes.c_char_p)),
                ("cache_readonly", ctypes.c_int32), ("tune", ctypes.c_int32),
                ("trusted_keys", ctypes.POINTER(ctypes.c_char_p)), ("allocator", Allocator)]


class AttentionDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("softmax_scale", ctypes.c_float),
                ("causal", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float),
                ("mask_mod", ctypes.c_char_p), ("score_mod", ctypes.c_char_p),
                ("mod_args", ctypes.c_void_p), ("mod_args_count", ctypes.c_int64),
                ("alibi_slopes", ctypes.POINTER(Tensor)), ("bias", ctypes.POINTER(Tensor)),
                ("mask", ctypes.POINTER(Tensor)), ("cu_seqlens_q", ctypes.POINTER(Tensor)),
                ("cu_seqlens_k", ctypes.POINTER(Tensor)), ("seqused_k", ctypes.POINTER(Tensor)),
                ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_k", ctypes.c_int64),
                ("mask_ranges", ctypes.POINTER(Tensor)), ("block_mask", ctypes.POINTER(Tensor)),
                ("num_splits", ctypes.c_int32), ("page_table", ctypes.POINTER(Tensor)),
                ("deterministic", ctypes.c_int32), ("dbias", ctypes.POINTER(Tensor)),
                ("q_descale", ctypes.POINTER(Tensor)), ("k_descale", ctypes.POINTER(Tensor)),
                ("v_descale", ctypes.POINTER(Tensor))]


class CallInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("source", ctypes.c_int),
                ("lookup_ms", ctypes.c_double), ("render_ms", ctypes.c_double),
                ("compile_ms", ctypes.c_double), ("load_ms", ctypes.c_double),
                ("total_ms", ctypes.c_double), ("compiles", ctypes.c_uint64),
                ("variant", ctypes.c_char_p), ("kernel_path", ctypes.c_char_p),
                ("registers", ctypes.c_int32), ("spill_bytes", ctypes.c_int32),
                ("tuned", ctypes.c_int32), ("workspace_bytes", ctypes.c_uint64),
                ("launched", ctypes.c_char_p)]


class TuneResult(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("from_record", ctypes.c_int32),
                ("candidates", ctypes.c_int32), ("dropped", ctypes.c_int32),
                ("heuristic_us", ctypes.c_double), ("best_us", ctypes.c_double),
                ("best_config", ctypes.c_char * 128), ("bucket", ctypes.c_char * 256)]


class DeviceInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_int),
                ("index", ctypes.c_int32), ("compute_units", ctypes.c_int32),
                ("global_memory", ctypes.c_uint64), ("local_memory", ctypes.c_uint64),
                ("name", ctypes.c_char * 128), ("arch", ctypes.c_char * 64),
                ("driver", ctypes.c_char * 64), ("platform", ctypes.c_char * 128)]


def _candidates():
    """Where the library may be, first match wins: $FLASHJIT_LIB, beside this package (a wheel),
    the source tree's build folder (running from a checkout), then the system's loader path."""
    env = os.environ.get("FLASHJIT_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libflashjit.so")
    yield os.path.join(here, "..", "..", "build", "libflashjit.so")
    found = ctypes.util.find_library("flashjit")
    if found:
        yield found


def load(path=None):
    """The library with its functions' signatures; OSError naming every place tried."""
    tried = []
    lib = None
    for p in ([path] if path else _candidates()):
        try:
            lib = ctypes.CDLL(p)
            break
        except OSError as e:
            tried.append(f"{p}: {e}")
    if lib is None:
        raise OSError("libflashjit not found (set FLASHJIT_LIB to its path); tried:\n  " +
                      "\n  ".join(tried or ["nothing"]))
    P, T = ctypes.POINTER, ctypes.POINTER(Tensor)
    sig = {
        "fj_version": (ctypes.c_char_p, []),
        "fj_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "fj_last_create_error": (ctypes.c_char_p, []),
        "fj_context_last_error": (ctypes.c_char_p, [ctypes.c_void_p]),
        "fj_context_cache_path": (ctypes.c_char_p, [ctypes.c_void_p]),
        "fj_context_options_init": (None, [P(ContextOptions)]),
        "fj_context_create": (ctypes.c_int, [P(ContextOptions), P(ctypes.c_void_p)]),
        "fj_context_destroy": (None, [ctypes.c_void_p]),
        "fj_device_count": (ctypes.c_int, [ctypes.c_int, P(ctypes.c_int32)]),
        "fj_device_get_info": (ctypes.c_int, [ctypes.c_int, ctypes.c_int32, P(DeviceInfo)]),
        "fj_context_get_device_info": (ctypes.c_int, [ctypes.c_void_p, P(DeviceInfo)]),
        "fj_attention_desc_init": (None, [P(AttentionDesc)]),
        "fj_attention_forward": (ctypes.c_int, [ctypes.c_void_p, P(AttentionDesc)] + [T] * 5 +
                                 [ctypes.c_void_p]),
        "fj_attention_backward": (ctypes.c_int, [ctypes.c_void_p, P(AttentionDesc)] + [T] * 9 +
                                  [ctypes.c_void_p]),
        "fj_attention_tune": (ctypes.c_int, [ctypes.c_void_p, P(AttentionDesc)] + [T] * 5 +
                              [ctypes.c_void_p, P(TuneResult)]),
        "fj_attention_merge": (ctypes.c_int, [ctypes.c_void_p, T, T, ctypes.c_int32, T, T,
                                              ctypes.c_void_p]),
        "fj_kv_cache_append": (ctypes.c_int, [ctypes.c_void_p] + [T] * 6 + [ctypes.c_void_p]),
        "fj_kv_cache_append_packed": (ctypes.c_int,
                                      [ctypes.c_void_p] + [T] * 7 + [ctypes.c_void_p]),
        "fj_kv_cache_append_quantized": (ctypes.c_int,
                                         [ctypes.c_void_p] + [T] * 9 + [ctypes.c_void_p]),
        "fj_block_mask_build": (ctypes.c_int, [ctypes.c_void_p, P(AttentionDesc)] + [T] * 3 +
                                [ctypes.c_void_p]),
        "fj_context_last_call": (ctypes.c_int, [ctypes.c_void_p, P(CallInfo)]),
        "fj_malloc": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, P(ctypes.c_void_p)]),
        "fj_free": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
        "fj_memcpy_h2d": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_size_t]),
        "fj_memcpy_d2h": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_size_t]),
        "fj_synchronize": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    # The calls the binding repeats most, also without argtypes (a microsecond less a call):
    # every argument a ctypes pointer-sized object or None, which the caller makes sure of.
    lib.unchecked = {}
    for name in ("fj_attention_forward", "fj_attention_backward", "fj_kv_cache_append",
                 "fj_kv_cache_append_packed", "fj_kv_cache_append_quantized",
                 "fj_block_mask_build", "fj_attention_tune"):
        fn = lib[name]
        fn.restype = ctypes.c_int
        lib.unchecked[name] = fn
    lib.path = p
    lib.fastcall = _fastcall_beside(p)
    return lib


_fastcall_modules = {}  # the extension's path -> module: loaded once per process


def _fastcall_beside(path):
    """The C fast path of repeated calls (the flashjit._fastcall extension, see _fastcall.c),
    built beside the library (a build folder; the wheel's package), or None: calls then go
    through ctypes alone. FLASHJIT_FASTCALL=0 turns it off."""
    if os.environ.get("FLASHJIT_FASTCALL", "1") == "0" or not os.path.dirname(path):
        return None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        where = os.path.join(os.path.dirname(path), "_fastcall" + suffix)
        if where in _fastcall_modules:
            return _fastcall_modules[where]
        if not os.path.exists(where):
            continue
        try:
            spec = importlib.util.spec_from_file_location("flashjit._fastcall", where)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _fastcall_modules[where] = module
            return module
        except ImportError:  # built for another Python: the ctypes path serves
            return None
    return None
