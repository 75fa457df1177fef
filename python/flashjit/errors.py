"""The library's status codes as Python exceptions. Every failure raises a FlashjitError subclass
carrying the status and the library's message (which names the bad field and value)."""


class FlashjitError(RuntimeError):
    """A flashjit call failed: .status is the fj_status code, .message the library's detail."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status
        self.message = message


class InvalidArgument(FlashjitError, ValueError):
    """FJ_ERR_INVALID_ARGUMENT: a shape, stride, dtype, pointer or option is wrong."""


class Unsupported(FlashjitError, NotImplementedError):
    """FJ_ERR_UNSUPPORTED: a valid request no kernel serves yet."""


class TemplateError(FlashjitError):
    """FJ_ERR_TEMPLATE: a kernel template failed to render (an expression, a template bug)."""


class CompileError(FlashjitError):
    """FJ_ERR_COMPILE: the backend compiler rejected a kernel."""


class BackendError(FlashjitError):
    """FJ_ERR_BACKEND: the driver (CUDA or OpenCL) reported an error."""


class CacheError(FlashjitError):
    """FJ_ERR_CACHE: the kernel cache failed."""


class OutOfMemory(FlashjitError, MemoryError):
    """FJ_ERR_OUT_OF_MEMORY: a device allocation failed."""


class NoDevice(FlashjitError):
    """FJ_ERR_NO_DEVICE: no usable device for the requested backend."""


# flashjit.h's FJ_STATUS_MAP order.
_BY_STATUS = {1: InvalidArgument, 2: Unsupported, 3: TemplateError, 4: CompileError,
              5: BackendError, 6: CacheError, 7: OutOfMemory, 8: NoDevice}


def error_for(status, message):
    """The exception for a failed call's status and message."""
    return _BY_STATUS.get(status, FlashjitError)(message, status)
