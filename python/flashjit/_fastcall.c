/* flashjit._fastcall: the repeated library call of flashjit's Python binding, in C.
**
** The binding prepares a call's C arguments once per signature (flashjit/_core.py, _Prepared:
** an fj_tensor per array, the descriptor pointing at them). A repeated call then only has to
** check that the new arrays have that signature and write their data pointers, which through
** ctypes and Python attribute reads costs several microseconds a call. A Call object does that
** here: run(arrays, options, stream) checks every array against its slot (a torch tensor of
** exactly the remembered dtype, shape, strides and CUDA device, or None where None was given)
** and options against the remembered options, writes the data pointers into the fj_tensor
** structures, and calls the library function. Anything that does not match returns None, and
** the caller takes its general path.
**
** Only Python's C API: the library function comes as an address (from ctypes), so this module
** links neither libflashjit nor torch. It is optional; without it the binding calls through
** ctypes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

enum { MAX_ARGS = 11, MAX_TARGETS = 2 };

/* One array argument: None expected (dtype NULL), or a tensor of this dtype, shape and strides
** whose data pointer goes to each target (an fj_tensor's data field; the descriptor's mod_args
** too for mod_args). */
typedef struct slot {
    PyObject *dtype, *shape, *stride;
    void **target[MAX_TARGETS];
    int ntargets;
} slot;

typedef struct call {
    PyObject ob_base;     /* what PyObject_HEAD declares */
    void *fn;             /* int fn(arg0, ..., arg[nargs - 1], stream): every argument a pointer */
    void *args[MAX_ARGS]; /* the context handle, the descriptor, the fj_tensor structures */
    int nargs;
    slot *slots;
    Py_ssize_t nslots;
    long device;           /* the CUDA device index every tensor must be on */
    PyObject *device_obj;  /* the same, as the stream function's argument */
    PyObject *tensor_type; /* torch.Tensor: the exact type taken (subclasses go the long way) */
    PyObject *options;     /* compared by equality */
    PyObject *stream_fn;   /* stream_fn(device) -> the current CUstream as an int */
    PyObject *keep;        /* what owns the structures the pointers above point into */
} call;

static PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_get_device;

/* x.name(): through the vectorcall protocol, no bound method made (Python 3.9+). */
static PyObject *call_method(PyObject *x, PyObject *name)
{
#if PY_VERSION_HEX >= 0x03090000
    return PyObject_CallMethodNoArgs(x, name);
#else
    return PyObject_CallMethodObjArgs(x, name, NULL);
#endif
}

static void call_dealloc(call *c)
{
    for (Py_ssize_t i = 0; i < c->nslots; i++) {
        Py_XDECREF(c->slots[i].dtype);
        Py_XDECREF(c->slots[i].shape);
        Py_XDECREF(c->slots[i].stride);
    }
    PyMem_Free(c->slots);
    Py_XDECREF(c->device_obj);
    Py_XDECREF(c->tensor_type);
    Py_XDECREF(c->options);
    Py_XDECREF(c->stream_fn);
    Py_XDECREF(c->keep);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* o, with a reference taken (Py_NewRef, which Python 3.10 added). */
static PyObject *new_ref(PyObject *o)
{
    Py_INCREF(o);
    return o;
}

static int as_pointer(PyObject *o, void **out)
{
    *out = o == Py_None ? NULL : PyLong_AsVoidPtr(o);
    return PyErr_Occurred() ? -1 : 0;
}

/* Call(fn, args, slots, device, tensor_type, options, stream_fn, keep):
**   fn: the function's address; args: its leading arguments' addresses (None for NULL);
**   slots: per array, None or (dtype, shape, stride, (target address, ...)). */
static int call_init(call *c, PyObject *a, PyObject *kw)
{
    PyObject *fn, *args, *slots, *tensor_type, *options, *stream_fn, *keep;
    long device;
    if (!PyArg_ParseTuple(a, "OO!O!lOOOO", &fn, &PyTuple_Type, &args, &PyTuple_Type, &slots,
                          &device, &tensor_type, &options, &stream_fn, &keep))
        return -1;
    if (c->slots) {
        PyErr_SetString(PyExc_TypeError, "a Call is initialised once");
        return -1;
    }
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (nargs != 5 && nargs != 7 && nargs != 11) {
        PyErr_Format(PyExc_ValueError, "%zd leading arguments: 5, 7 or 11 are called", nargs);
        return -1;
    }
    if (as_pointer(fn, &c->fn) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (as_pointer(PyTuple_GET_ITEM(args, i), &c->args[i]) < 0)
            return -1;
    c->nargs = (int)nargs;
    c->nslots = PyTuple_GET_SIZE(slots);
    c->slots = PyMem_Calloc((size_t)c->nslots ? (size_t)c->nslots : 1, sizeof *c->slots);
    if (!c->slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < c->nslots; i++) {
        PyObject *s = PyTuple_GET_ITEM(slots, i), *dtype, *shape, *stride, *targets;
        if (s == Py_None)
            continue;
        if (!PyArg_ParseTuple(s, "OO!O!O!", &dtype, &PyTuple_Type, &shape, &PyTuple_Type, &stride,
                              &PyTuple_Type, &targets))
            return -1;
        slot *t = &c->slots[i];
        t->ntargets = (int)PyTuple_GET_SIZE(targets);
        if (t->ntargets < 1 || t->ntargets > MAX_TARGETS) {
            PyErr_SetString(PyExc_ValueError, "a slot takes one or two targets");
            return -1;
        }
        for (int j = 0; j < t->ntargets; j++)
            if (as_pointer(PyTuple_GET_ITEM(targets, j), (void **)&t->target[j]) < 0)
                return -1;
        t->dtype = new_ref(dtype);
        t->shape = new_ref(shape);
        t->stride = new_ref(stride);
    }
    c->device = device;
    if (!(c->device_obj = PyLong_FromLong(device)))
        return -1;
    c->tensor_type = new_ref(tensor_type);
    c->options = new_ref(options);
    c->stream_fn = new_ref(stream_fn);
    c->keep = new_ref(keep);
    return 0;
}

/* Whether a and b (tuples of ints, or torch.Size, a tuple) are equal; -1 on error. */
static int same_ints(PyObject *a, PyObject *b)
{
    if (!PyTuple_Check(a) || !PyTuple_Check(b))
        return PyObject_RichCompareBool(a, b, Py_EQ);
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (n != PyTuple_GET_SIZE(b))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(a, i), *y = PyTuple_GET_ITEM(b, i);
        if (x == y)
            continue;
        int r = PyObject_RichCompareBool(x, y, Py_EQ);
        if (r != 1)
            return r;
    }
    return 1;
}

/* same_ints of o, a new reference that this releases (NULL: a Python error, -1), and want. */
static int owned_same_ints(PyObject *o, PyObject *want)
{
    if (!o)
        return -1;
    const int same = same_ints(o, want);
    Py_DECREF(o);
    return same;
}

/* 1, with *ptr x's data pointer, where x matches slot t; 0 where it does not; -1 on a Python
** error. */
static int slot_pointer(const call *c, const slot *t, PyObject *x, void **ptr)
{
    if ((PyObject *)Py_TYPE(x) != c->tensor_type)
        return 0;
    PyObject *o = PyObject_GetAttr(x, s_dtype);
    if (!o)
        return -1;
    int same = o == t->dtype;
    Py_DECREF(o);
    if (!same)
        return 0;
    if ((same = owned_same_ints(PyObject_GetAttr(x, s_shape), t->shape)) != 1 ||
        (same = owned_same_ints(call_method(x, s_stride), t->stride)) != 1)
        return same;
    if (!(o = call_method(x, s_get_device)))
        return -1;
    long device = PyLong_AsLong(o);
    Py_DECREF(o);
    if (device != c->device)
        return PyErr_Occurred() ? -1 : 0;
    if (!(o = call_method(x, s_data_ptr)))
        return -1;
    *ptr = PyLong_AsVoidPtr(o);
    Py_DECREF(o);
    return PyErr_Occurred() ? -1 : 1;
}

typedef int (*fn5)(void *, void *, void *, void *, void *, void *);
typedef int (*fn7)(void *, void *, void *, void *, void *, void *, void *, void *);
typedef int (*fn11)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *,
                    void *, void *);

/* run(arrays, options, stream): the library's status, or None where the arrays or options are
** not this call's (nothing written then). stream: a CUstream as an int, or None for PyTorch's
** current stream on the tensors' device. */
static PyObject *call_run(call *c, PyObject *const *a, Py_ssize_t n)
{
    if (n != 3 || !PyTuple_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "run(arrays: tuple, options, stream)");
        return NULL;
    }
    PyObject *arrays = a[0];
    if (PyTuple_GET_SIZE(arrays) != c->nslots)
        Py_RETURN_NONE;
    int same = a[1] == c->options ? 1 : PyObject_RichCompareBool(a[1], c->options, Py_EQ);
    if (same != 1)
        return same < 0 ? NULL : (Py_INCREF(Py_None), Py_None);
    /* Check everything before writing anything. */
    void *ptrs[32];
    if (c->nslots > (Py_ssize_t)(sizeof ptrs / sizeof ptrs[0]))
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < c->nslots; i++) {
        PyObject *x = PyTuple_GET_ITEM(arrays, i);
        const slot *t = &c->slots[i];
        if (!t->dtype) {
            if (x != Py_None)
                Py_RETURN_NONE;
            continue;
        }
        int r = slot_pointer(c, t, x, &ptrs[i]);
        if (r != 1)
            return r < 0 ? NULL : (Py_INCREF(Py_None), Py_None);
    }
    void *stream;
    if (a[2] == Py_None) {
        PyObject *s = PyObject_CallFunctionObjArgs(c->stream_fn, c->device_obj, NULL);
        if (!s)
            return NULL;
        stream = PyLong_AsVoidPtr(s);
        Py_DECREF(s);
    } else {
        stream = PyLong_AsVoidPtr(a[2]);
    }
    if (PyErr_Occurred())
        return NULL;
    for (Py_ssize_t i = 0; i < c->nslots; i++)
        for (int j = 0; j < c->slots[i].ntargets; j++)
            *c->slots[i].target[j] = ptrs[i];
    void *const *g = c->args;
    int st;
    Py_BEGIN_ALLOW_THREADS switch (c->nargs)
    {
    case 5: st = ((fn5)c->fn)(g[0], g[1], g[2], g[3], g[4], stream); break;
    case 7: st = ((fn7)c->fn)(g[0], g[1], g[2], g[3], g[4], g[5], g[6], stream); break;
    default:
        st = ((fn11)c->fn)(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10],
                           stream);
        break;
    }
    Py_END_ALLOW_THREADS return PyLong_FromLong(st);
}

static PyMethodDef call_methods[] = {
    {"run", (PyCFunction)(void (*)(void))call_run, METH_FASTCALL,
     "run(arrays, options, stream) -> the library's status, or None where the arrays or "
     "options do not match this call"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject call_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "flashjit._fastcall.Call",
    .tp_basicsize = sizeof(call),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A prepared library call of the binding: see the module's documentation.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)call_init,
    .tp_dealloc = (destructor)call_dealloc,
    .tp_methods = call_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "flashjit._fastcall",
    .m_doc = "The repeated library call of flashjit's Python binding (see _core.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__fastcall(void)
{
    if (!(s_dtype = PyUnicode_InternFromString("dtype")) ||
        !(s_shape = PyUnicode_InternFromString("shape")) ||
        !(s_stride = PyUnicode_InternFromString("stride")) ||
        !(s_data_ptr = PyUnicode_InternFromString("data_ptr")) ||
        !(s_get_device = PyUnicode_InternFromString("get_device")))
        return NULL;
    if (PyType_Ready(&call_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&call_type);
    if (PyModule_AddObject(m, "Call", (PyObject *)&call_type) < 0) {
        Py_DECREF(&call_type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
