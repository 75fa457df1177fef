"""The binding's C fast path (flashjit._fastcall, python/flashjit/_fastcall.c) without torch or a
GPU: a Call over stand-in tensors (a class with torch's dtype, shape, stride(), get_device(),
data_ptr() and _cdata) and a ctypes callback standing in for the library function. A matching
call writes every data pointer into its targets and returns the function's status; each kind of
mismatch returns None and writes nothing; a slot given None is made like its twin. Then the same
through a stand-in of PyTorch's C shim (ctypes callbacks reading the stand-ins), and a shim that
reads otherwise than the attributes, which the Call must not trust.

Usage: python3 tests/python_fastcall.py LIBRARY (the extension is looked for beside it; exit 77,
a skip, where it was not built).
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashjit import _lib  # noqa: E402

fastcall = _lib._fastcall_beside(os.path.abspath(sys.argv[1]))
if fastcall is None:
    print("SKIP: flashjit._fastcall was not built beside", sys.argv[1])
    sys.exit(77)


registry = {}  # _cdata -> the stand-in, for the stand-in shim


class Fake:
    """What the fast path reads of a torch tensor."""

    def __init__(self, ptr, dtype="bf16", shape=(2, 3, 4, 8), stride=(96, 32, 8, 1), device=0):
        self.ptr, self.dtype, self.shape, self._stride, self.device = \
            ptr, dtype, shape, stride, device
        self._cdata = 0x100 + len(registry)
        registry[self._cdata] = self

    def stride(self):
        return self._stride

    def get_device(self):
        return self.device

    def data_ptr(self):
        return self.ptr


class FakeSubclass(Fake):
    pass


seen = []
FN7 = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 8)


@FN7
def library_function(*args):
    seen.append(args)
    return 5 if args[1] == 0xBAD else 0


# Three array slots: a tensor, None, a tensor written to two places (as mod_args is).
tensors = [_lib.Tensor() for _ in range(2)]
extra = ctypes.c_void_p(0)
targets = [(ctypes.addressof(tensors[0]) + _lib.Tensor.data.offset,),
           (ctypes.addressof(tensors[1]) + _lib.Tensor.data.offset, ctypes.addressof(extra))]
slots = ((Fake(0x1, device=1), targets[0], None), None,
         (Fake(0x2, "f32", (5,), (1,), device=1), targets[1], None))
leading = (0x1000, 0x2000, ctypes.addressof(tensors[0]), None, ctypes.addressof(tensors[1]),
           None, None)
options = (True, (-1, -1), 0.0, "k <= q")
streams = []


def stream_of(device):
    streams.append(device)
    return 0x5000 + device


call = fastcall.Call(ctypes.cast(library_function, ctypes.c_void_p).value, leading, slots, 1,
                     Fake, options, stream_of, tensors)


def good():
    return (Fake(0xA000, device=1), None, Fake(0xB000, "f32", (5,), (1,), device=1))


def pointers():
    return tensors[0].data, tensors[1].data, extra.value


# A match: pointers written, the function called with the leading arguments and the stream.
assert call.run(good(), (True, (-1, -1), 0.0, "k <= q"), None) == (0, None)
assert not call.uses_shim and call.shim_read(good()[0]) is None
assert pointers() == (0xA000, 0xB000, 0xB000), pointers()
assert seen[-1] == (0x1000, 0x2000, ctypes.addressof(tensors[0]), None,
                    ctypes.addressof(tensors[1]), None, None, 0x5001), seen[-1]
assert streams == [1]
assert call.run(good(), options, 0x7000) == (0, None) and seen[-1][-1] == 0x7000 and \
    streams == [1]

# Each mismatch: None, nothing written, nothing called.
calls_before = len(seen)
tensors[0].data = tensors[1].data = extra.value = 1
a, n, b = good()
mismatches = {
    "dtype": (Fake(0xA000, "f16", device=1), n, b),
    "shape": (Fake(0xA000, shape=(2, 3, 4, 9), device=1), n, b),
    "stride": (Fake(0xA000, stride=(96, 32, 8, 2), device=1), n, b),
    "device": (a, n, Fake(0xB000, "f32", (5,), (1,), device=0)),
    "subclass": (FakeSubclass(0xA000, device=1), n, b),
    "None where a tensor was": (None, n, b),
    "a tensor where None was": (a, Fake(0xC000, device=1), b),
    "fewer arrays": (a, n),
}
for what, arrays in mismatches.items():
    assert call.run(arrays, options, None) is None, what
assert call.run(good(), (False, (-1, -1), 0.0, "k <= q"), None) is None, "options"
assert len(seen) == calls_before and pointers() == (1, 1, 1), "a mismatch wrote or called"

# The function's failure comes back as its status.
failing = fastcall.Call(ctypes.cast(library_function, ctypes.c_void_p).value,
                        (0x1000, 0xBAD) + leading[2:], slots, 1, Fake, options, stream_of, None)
assert failing.run(good(), options, 0) == (5, None)

# Malformed construction is an error, not a crash.
for bad in [(0, (1, 2, 3), slots, 1, Fake, options, stream_of, None),
            (0, leading, ((Fake(1), (), None),), 1, Fake, options, stream_of, None),
            (0, leading, ((Fake(1), (8,), 0),), 1, Fake, options, stream_of, None, Fake),
            (0, leading, ((Fake(1), (8,), 1),), 1, Fake, options, stream_of, None),
            (0, leading, slots, 1, Fake, options, stream_of, None, None, (1, 2))]:
    try:
        fastcall.Call(*bad)
    except (ValueError, TypeError):
        continue
    raise AssertionError(f"Call{bad!r} was accepted")
try:  # the structures' addresses are fixed for the object's life
    call.__init__(0, leading, slots, 1, Fake, options, stream_of, None)
    raise AssertionError("a Call was initialised twice")
except TypeError:
    pass

# A slot given None is made like its twin (alloc(twin)), checked as a given tensor is, and
# returned; a made tensor that does not match is dropped and the call refused.
made = []


def alloc(like, shape=None):
    made.append(Fake(0xD000 + len(made), like.dtype, shape or like.shape, like.stride(),
                     like.device))
    return made[-1]


twin_slots = ((Fake(0x1, device=1), targets[0], None), None,
              (Fake(0x2, device=1), targets[1], 0))
twins = fastcall.Call(ctypes.cast(library_function, ctypes.c_void_p).value, leading, twin_slots,
                      1, Fake, options, stream_of, tensors, alloc)
a = Fake(0xA000, device=1)
status, out = twins.run((a, None, None), options, 0)
assert status == 0 and out is made[-1] and pointers() == (0xA000, out.ptr, out.ptr), pointers()
given = Fake(0xE000, device=1)
assert twins.run((a, None, given), options, 0) == (0, None) and pointers()[1] == 0xE000
odd = fastcall.Call(ctypes.cast(library_function, ctypes.c_void_p).value, leading, twin_slots,
                    1, Fake, options, stream_of, tensors, lambda like: alloc(like, (1,)))
calls_before = len(seen)
assert odd.run((a, None, None), options, 0) is None and len(seen) == calls_before

# The same through a stand-in of PyTorch's C shim: each function reads the stand-in whose
# _cdata the at::Tensor (a pointer to that value) holds.
keep_alive = []


def shim_function(argtypes, read):
    fn = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(read)
    keep_alive.append(fn)
    return ctypes.cast(fn, ctypes.c_void_p).value


def tensor_at(handle):
    return registry[ctypes.c_void_p.from_address(handle).value]


def ints(values):
    array = (ctypes.c_int64 * max(1, len(values)))(*values)
    keep_alive.append(array)
    return ctypes.addressof(array)


DTYPE_CODES = {"bf16": 15, "f32": 6, "f16": 5}
P = ctypes.c_void_p


def writer(ctype, value_of):
    def read(handle, out):
        ctype.from_address(out).value = value_of(tensor_at(handle))
        return 0
    return read


def shim_of(stride_of=lambda x: x.stride()):
    return (shim_function((P, P), writer(ctypes.c_void_p, lambda x: x.ptr)),
            shim_function((P, P), writer(ctypes.c_int64, lambda x: len(x.shape))),
            shim_function((P, P), writer(ctypes.c_void_p, lambda x: ints(x.shape))),
            shim_function((P, P), writer(ctypes.c_void_p, lambda x: ints(stride_of(x)))),
            shim_function((P, P), writer(ctypes.c_int32, lambda x: DTYPE_CODES[x.dtype])),
            shim_function((P, P), writer(ctypes.c_int32, lambda x: 1)),
            shim_function((P, P), writer(ctypes.c_int32, lambda x: x.device)),
            shim_function((ctypes.c_int32, P), lambda device, out: (
                ctypes.c_void_p.from_address(out).__setattr__("value", 0x5000 + device), 0)[1]))


shimmed = fastcall.Call(ctypes.cast(library_function, ctypes.c_void_p).value, leading, slots,
                        1, Fake, options, stream_of, tensors, None, shim_of())
assert shimmed.uses_shim
assert shimmed.shim_read(Fake(0xF000, "f32", (5, 2), (2, 1), 3)) == (6, (5, 2), (2, 1), 1, 3,
                                                                        0xF000)
streams.clear()
assert shimmed.run(good(), options, None) == (0, None) and streams == [], streams
assert pointers() == (0xA000, 0xB000, 0xB000) and seen[-1][-1] == 0x5001, seen[-1]
calls_before = len(seen)
tensors[0].data = tensors[1].data = extra.value = 1
for what, arrays in mismatches.items():
    assert shimmed.run(arrays, options, None) is None, what
assert len(seen) == calls_before and pointers() == (1, 1, 1), "a mismatch wrote or called"
# A shim that reads the strides otherwise than stride() does is not used.
wrong = fastcall.Call(ctypes.cast(library_function, ctypes.c_void_p).value, leading, slots, 1,
                      Fake, options, stream_of, tensors, None,
                      shim_of(lambda x: tuple(2 * s for s in x.stride())))
assert not wrong.uses_shim and wrong.run(good(), options, None) == (0, None)
print("python_fastcall: OK")
