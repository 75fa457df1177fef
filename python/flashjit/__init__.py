"""flashjit: exact attention (FlashAttention) with kernels written at run time for the shape,
mask, head dims and dtype of each request.

    import flashjit
    ctx = flashjit.Context()                 # CUDA where usable, else OpenCL
    out = ctx.forward(q, k, v, causal=True)  # torch tensors or DLPack arrays (NumPy, CuPy, ...)

flashjit.torch (imported on use) adds PyTorch operators with autograd and torch.compile support,
and scaled_dot_product_attention, a drop-in for PyTorch's. flashjit.info() describes the
library and the devices it sees."""
import ctypes

from . import errors
from ._core import Context
from ._lib import load as _load_library
from .errors import (BackendError, CacheError, CompileError, FlashjitError, InvalidArgument,
                     NoDevice, OutOfMemory, TemplateError, Unsupported)

try:  # the installed package's version (the CMake project's); info() has the library's
    from importlib.metadata import PackageNotFoundError, version as _version
    __version__ = _version("flashjit")
except PackageNotFoundError:  # running from a source checkout
    __version__ = "unknown"


def info(lib=None):
    """The library's version and path, whether repeated calls take the C fast path
    (flashjit._fastcall; FLASHJIT_FASTCALL=0 turns it off), and each backend's devices: a dict
    (printable)."""
    from . import _lib
    library = _load_library(lib)
    backends = {}
    for name in ("cuda", "opencl"):
        count = ctypes.c_int32(0)
        library.fj_device_count(_lib.BACKENDS[name], ctypes.byref(count))
        devices = []
        for i in range(count.value):
            d = _lib.DeviceInfo()
            d.struct_size = ctypes.sizeof(d)
            if library.fj_device_get_info(_lib.BACKENDS[name], i, ctypes.byref(d)) == 0:
                devices.append(dict(name=d.name.decode(), arch=d.arch.decode(),
                                    compute_units=d.compute_units,
                                    memory_gib=round(d.global_memory / 2**30, 1),
                                    driver=d.driver.decode()))
        backends[name] = devices
    return dict(version=library.fj_version().decode(), library=library.path,
                fast_path=library.fastcall is not None, backends=backends)


def __getattr__(name):
    if name == "torch":  # flashjit.torch needs torch; plain flashjit does not
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'flashjit' has no attribute {name!r}")


__all__ = ["Context", "info", "errors", "FlashjitError", "InvalidArgument", "Unsupported",
           "TemplateError", "CompileError", "BackendError", "CacheError", "OutOfMemory",
           "NoDevice"]
