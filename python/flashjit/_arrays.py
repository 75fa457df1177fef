"""Arrays in, fj_tensor out. A torch tensor is read through its device pointer and strides; any
other array through DLPack (`__dlpack__`: NumPy, CuPy, JAX, ...). Arrays in device memory of the
context's backend pass straight through; arrays in host memory are staged through device
buffers of the context: copied in before the call, and outputs copied back after it."""
import ctypes
import os
import sys

from . import _lib
from .errors import InvalidArgument

_TORCH_DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32",
                 "torch.bool": "bool", "torch.int32": "i32", "torch.float8_e4m3fn": "f8_e4m3",
                 "torch.float8_e5m2": "f8_e5m2"}
# DLPack (code, bits): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6.
_DLPACK_DTYPES = {(2, 16): "f16", (4, 16): "bf16", (2, 32): "f32", (0, 32): "i32",
                  (6, 8): "bool", (1, 8): "bool"}
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def is_torch(x):
    torch = sys.modules.get("torch")  # never imported here: a torch tensor means torch is loaded
    return torch is not None and isinstance(x, torch.Tensor)


def torch_cuda_signature(arrays):
    """(signature, pointers) of arrays where every one is a torch CUDA tensor or None, else
    None (those calls go through Call every time). The signature, what a prepared call is
    keyed by: each array's dtype, shape and strides, flat (None for None); the pointers: the
    data pointers of the arrays that are not None, in order. On every call's path, so written
    for speed."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    sig, ptrs = [], []
    for x in arrays:
        if x is None:
            sig.append(None)
        elif isinstance(x, tensor) and x.is_cuda:
            sig += (x.dtype, x.shape, x.stride())
            ptrs.append(x.data_ptr())
        else:
            return None
    return tuple(sig), ptrs


_raw_stream = None


def stream_function():
    """PyTorch's function from a CUDA device index to its current stream (a CUstream as an
    int): the fast internal form where the installed torch has it."""
    global _raw_stream
    if _raw_stream is None:
        import torch
        _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
            (lambda i: torch.cuda.current_stream(i).cuda_stream)
    return _raw_stream


_SHIM_FUNCTIONS = ("aoti_torch_get_data_ptr", "aoti_torch_get_dim", "aoti_torch_get_sizes",
                   "aoti_torch_get_strides", "aoti_torch_get_dtype",
                   "aoti_torch_get_device_type", "aoti_torch_get_device_index",
                   "aoti_torch_get_current_cuda_stream")
_shim = False


def torch_shim():
    """The addresses of PyTorch's stable C functions that the C fast path reads tensors with
    (see _fastcall.c; in _SHIM_FUNCTIONS' order, the stream's None where torch has no CUDA),
    or None where the installed torch lacks one of them or FLASHJIT_TORCH_SHIM=0. Found through
    torch._C, whose libraries hold them."""
    global _shim
    if _shim is False:
        _shim = None
        torch = sys.modules.get("torch")
        if torch is not None and os.environ.get("FLASHJIT_TORCH_SHIM", "1") != "0":
            try:
                lib = ctypes.CDLL(torch._C.__file__)
                found = tuple(ctypes.cast(getattr(lib, name, None), ctypes.c_void_p).value
                              for name in _SHIM_FUNCTIONS)
            except OSError:
                found = (None,)
            # The stream's function is CUDA's (absent from a CPU-only torch); the rest must be.
            _shim = None if None in found[:-1] else found
    return _shim


def current_stream(x):
    """PyTorch's current stream on torch CUDA tensor x's device (a CUstream as an int)."""
    return (_raw_stream or stream_function())(x.get_device())


def describe(x, name):
    """(pointer, dtype name, shape, strides in elements, where) of array x, where is "host" or
    "cuda"; keeps nothing alive (the caller holds x, and the capsule while it uses the pointer:
    returned last)."""
    if is_torch(x):
        dtype = _TORCH_DTYPES.get(str(x.dtype))
        if dtype is None:
            raise InvalidArgument(f"{name}: dtype {x.dtype} is not one flashjit takes")
        where = "cuda" if x.is_cuda else "host" if x.device.type == "cpu" else x.device.type
        return x.data_ptr(), dtype, tuple(x.shape), tuple(x.stride()), where, None
    if not hasattr(x, "__dlpack__"):
        raise InvalidArgument(f"{name}: {type(x).__name__} is neither a torch tensor nor a "
                              "DLPack array (__dlpack__)")
    capsule = x.__dlpack__()
    dl = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    key = (dl.dtype.code, dl.dtype.bits)
    if key not in _DLPACK_DTYPES or dl.dtype.lanes != 1:
        kind = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 6: "bool"}.get(key[0], "code ")
        raise InvalidArgument(f"{name}: dtype {kind}{key[1]} (x{dl.dtype.lanes}) is not one "
                              "flashjit takes (float16, bfloat16, float32; bool and int32 for "
                              "masks and offsets)")
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    if dl.strides:
        strides = tuple(dl.strides[i] for i in range(dl.ndim))
    else:  # compact row-major
        strides, step = [], 1
        for extent in reversed(shape):
            strides.insert(0, step)
            step *= max(extent, 1)
        strides = tuple(strides)
    kind = dl.device.device_type
    where = ("host" if kind in (_DL_CPU, _DL_CUDA_HOST) else
             "cuda" if kind in (_DL_CUDA, _DL_CUDA_MANAGED) else f"DLPack device {kind}")
    return (dl.data or 0) + dl.byte_offset, _DLPACK_DTYPES[key], shape, strides, where, capsule


class Call:
    """The arrays of one library call: tensor() gives each its fj_tensor; finish() copies the
    staged outputs back and frees the staging buffers (also on failure: use as a context
    manager)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.keep = []      # capsules and ctypes structures alive through the call
        self.staged = []    # (device buffer, host pointer, bytes, is output)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish(copy_back=exc[0] is None)
        return False

    def tensor(self, x, name, output=False):
        ptr, dtype, shape, strides, where, capsule = describe(x, name)
        self.keep.append(capsule)
        if len(shape) > 4:
            raise InvalidArgument(f"{name}: {len(shape)} dimensions, at most 4")
        if where == "host":
            ptr = self._stage(ptr, dtype, shape, strides, name, output)
        elif where != self.ctx.memory:
            raise InvalidArgument(f"{name} is in {where} memory, but the context's backend "
                                  f"({self.ctx.backend}) reads {self.ctx.memory} memory")
        t = _lib.Tensor()
        t.data, t.dtype, t.ndim = ptr, _lib.DTYPES[dtype], len(shape)
        for i, (extent, stride) in enumerate(zip(shape, strides)):
            t.shape[i], t.stride[i] = extent, stride
        self.keep.append(t)
        return t

    def _stage(self, ptr, dtype, shape, strides, name, output):
        if any(s < 0 for s in strides):
            raise InvalidArgument(f"{name}: negative strides are not supported")
        span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        nbytes = span * _lib.DTYPE_SIZES[_lib.DTYPES[dtype]]
        if nbytes == 0:
            return ptr
        buf = ctypes.c_void_p()
        lib, handle = self.ctx.lib, self.ctx.handle
        self.ctx.check(lib.fj_malloc(handle, nbytes, ctypes.byref(buf)))
        self.staged.append((buf.value, ptr, nbytes, output))
        self.ctx.check(lib.fj_memcpy_h2d(handle, buf, ptr, nbytes))
        return buf.value

    def finish(self, copy_back=True):
        lib, handle = self.ctx.lib, self.ctx.handle
        try:
            if copy_back and any(out for *_, out in self.staged):
                self.ctx.check(lib.fj_synchronize(handle, None))
                for dev, host, nbytes, out in self.staged:
                    if out:
                        self.ctx.check(lib.fj_memcpy_d2h(handle, host, dev, nbytes))
        finally:
            for dev, *_ in self.staged:
                lib.fj_free(handle, dev)
            self.staged, self.keep = [], []


def empty_like(ref, shape=None, dtype=None, name="array"):
    """A new array of shape (None: ref's) and dtype name (None: ref's, an error naming `name`
    where flashjit does not take it) where ref lives: torch beside a torch tensor, NumPy for
    other host arrays (bf16 as uint16 bits unless ml_dtypes is installed), CuPy for other CUDA
    arrays."""
    if is_torch(ref):
        torch = sys.modules["torch"]
        tdtype = None if dtype is None else getattr(torch, {"f16": "float16", "bf16": "bfloat16",
                                                            "f32": "float32",
                                                            "i32": "int32"}[dtype])
        if shape is None:  # torch's cheapest allocation, a microsecond under new_empty's
            return torch.empty_like(ref) if tdtype is None else \
                torch.empty_like(ref, dtype=tdtype)
        return ref.new_empty(shape) if tdtype is None else ref.new_empty(shape, dtype=tdtype)
    if shape is None:
        shape = describe(ref, name)[2]
    if dtype is None:
        dtype = dtype_of(ref, name)
    where = describe(ref, "array")[4]
    if where == "host":
        import numpy
        if dtype == "bf16":
            try:
                import ml_dtypes
                return numpy.empty(shape, dtype=ml_dtypes.bfloat16)
            except ImportError:
                return numpy.empty(shape, dtype=numpy.uint16)
        return numpy.empty(shape, dtype={"f16": numpy.float16, "f32": numpy.float32,
                                         "i32": numpy.int32}[dtype])
    if where == "cuda":
        import cupy
        return cupy.empty(shape, dtype={"f16": cupy.float16, "f32": cupy.float32,
                                        "i32": cupy.int32}[dtype])
    raise InvalidArgument(f"cannot allocate an output beside a {type(ref).__name__}: pass out=")


_out_dtypes = {}  # torch dtype -> out_dtype_for's answer, filled as dtypes are seen


def forward_out(q, v):
    """forward()'s out where the caller gives none: q's shape with v's last extent, in q's dtype
    (bfloat16 for an FP8 q), beside q. On every call without out, so a torch q whose out is
    q's own shape and dtype goes straight to torch.empty_like."""
    torch = sys.modules.get("torch")
    if torch is not None and type(q) is torch.Tensor and q.shape[-1] == v.shape[-1] and \
            _out_dtypes.get(q.dtype, "") is None:
        return torch.empty_like(q)
    dv = v.shape[-1]
    shape = None if dv == q.shape[-1] else tuple(q.shape[:-1]) + (dv,)
    return empty_like(q, shape, out_dtype_for(q), name="q")


def out_dtype_for(q):
    """The dtype name forward() gives out when q is FP8 (torch float8 tensors: bfloat16), else
    None (q's own): a dict lookup, no DLPack export, on the call's path."""
    if not is_torch(q):
        return None
    try:
        return _out_dtypes[q.dtype]
    except KeyError:
        name = _TORCH_DTYPES.get(str(q.dtype))
        found = _out_dtypes[q.dtype] = "bf16" if name in ("f8_e4m3", "f8_e5m2") else None
        return found


def dtype_of(x, name):
    """The dtype name of array x (an error naming it where flashjit does not take it)."""
    return describe(x, name)[1]
