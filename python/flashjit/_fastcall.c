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
** A slot may also be filled by the call: given None where the slot remembers a tensor made
** like another slot's (an output), run() makes it with alloc(that slot's tensor) (PyTorch's
** empty_like) and returns it.
**
** Reading a tensor's dtype, shape, strides, device and data pointer through its Python
** attributes costs five Python calls a tensor, most of a repeated call's own time. Where
** PyTorch's stable C functions are given (the shim: torch/csrc/inductor/aoti_torch/c/shim.h,
** what AOTInductor's compiled models call), run() reads them through those instead, from the
** tensor's at::Tensor (one pointer to its TensorImpl, which the tensor's _cdata gives). A Call
** checks at construction that the shim reads its prepared tensors as their Python attributes
** do, and uses its attributes where it does not.
**
** Only Python's C API: the library function and the shim come as addresses (from ctypes), so
** this module links neither libflashjit nor torch. It is optional; without it the binding
** calls through ctypes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { MAX_ARGS = 11, MAX_TARGETS = 2, MAX_DIMS = 8, MAX_SLOTS = 32 };
enum { SHIM_CUDA = 1 }; /* c10::DeviceType::CUDA, the shim's device type of CUDA tensors */

/* The shim's functions (each returns 0 on success); an at::Tensor * is their tensor handle. */
typedef struct shim {
    int32_t (*data_ptr)(void *tensor, void **out);
    int32_t (*dim)(void *tensor, int64_t *out);
    int32_t (*sizes)(void *tensor, int64_t **out);
    int32_t (*strides)(void *tensor, int64_t **out);
    int32_t (*dtype)(void *tensor, int32_t *out);
    int32_t (*device_type)(void *tensor, int32_t *out);
    int32_t (*device_index)(void *tensor, int32_t *out);
    int32_t (*current_stream)(int32_t device, void **out);
} shim;

/* What a tensor is: its dtype (the Python object, and the shim's code), shape and strides. */
typedef struct layout {
    PyObject *dtype, *shape, *stride;
    int32_t dtype_code;
    int64_t ndim, sizes[MAX_DIMS], strides[MAX_DIMS];
} layout;

/* One array argument: None expected (dtype NULL), or a tensor of this layout whose data
** pointer goes to each target (an fj_tensor's data field; the descriptor's mod_args too for
** mod_args); like >= 0: None given is made as alloc(arrays[like]). */
typedef struct slot {
    layout want;
    void **target[MAX_TARGETS];
    int ntargets;
    Py_ssize_t like;
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
    PyObject *alloc;       /* alloc(tensor) -> a new tensor like it, for slots with like >= 0 */
    PyObject *keep;        /* what owns the structures the pointers above point into */
    shim shim;             /* all NULL where not given or not trusted */
} call;

static PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_get_device, *s_cdata;

/* x.name(): through the vectorcall protocol, no bound method made (Python 3.9+). */
static PyObject *call_method(PyObject *x, PyObject *name)
{
#if PY_VERSION_HEX >= 0x03090000
    return PyObject_CallMethodNoArgs(x, name);
#else
    return PyObject_CallMethodObjArgs(x, name, NULL);
#endif
}

/* fn(arg), through the vectorcall protocol where there is one. */
static PyObject *call_one(PyObject *fn, PyObject *arg)
{
#if PY_VERSION_HEX >= 0x03090000
    return PyObject_CallOneArg(fn, arg);
#else
    return PyObject_CallFunctionObjArgs(fn, arg, NULL);
#endif
}

static void layout_clear(layout *l)
{
    Py_CLEAR(l->dtype);
    Py_CLEAR(l->shape);
    Py_CLEAR(l->stride);
}

static void call_dealloc(call *c)
{
    for (Py_ssize_t i = 0; i < c->nslots; i++)
        layout_clear(&c->slots[i].want);
    PyMem_Free(c->slots);
    Py_XDECREF(c->device_obj);
    Py_XDECREF(c->tensor_type);
    Py_XDECREF(c->options);
    Py_XDECREF(c->stream_fn);
    Py_XDECREF(c->alloc);
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

/* What the tensor is and where its data is, through the shim; 0 where the shim fails or the
** tensor has more than MAX_DIMS dimensions, -1 on a Python error. */
static int shim_read(const shim *f, PyObject *x, layout *l, int32_t *device_type,
                     int32_t *device_index, void **ptr)
{
    PyObject *o = PyObject_GetAttr(x, s_cdata);
    if (!o)
        return -1;
    void *impl = PyLong_AsVoidPtr(o); /* the TensorImpl *; &impl is an at::Tensor * */
    Py_DECREF(o);
    if (PyErr_Occurred())
        return -1;
    void *t = &impl;
    int64_t *sizes, *strides;
    if (f->dim(t, &l->ndim) || l->ndim < 0 || l->ndim > MAX_DIMS || f->sizes(t, &sizes) ||
        f->strides(t, &strides) || f->dtype(t, &l->dtype_code) ||
        f->device_type(t, device_type) || f->device_index(t, device_index) ||
        f->data_ptr(t, ptr))
        return 0;
    memcpy(l->sizes, sizes, (size_t)l->ndim * sizeof *sizes);
    memcpy(l->strides, strides, (size_t)l->ndim * sizeof *strides);
    return 1;
}

/* The tensor's layout, device and data pointer through its Python attributes (references
** into l, which layout_clear releases); -1 on a Python error. */
static int attrs_read(PyObject *x, layout *l, long *device, void **ptr)
{
    PyObject *o;
    if (!(l->dtype = PyObject_GetAttr(x, s_dtype)) ||
        !(l->shape = PyObject_GetAttr(x, s_shape)) || !(l->stride = call_method(x, s_stride)) ||
        !(o = call_method(x, s_get_device)))
        return -1;
    *device = PyLong_AsLong(o);
    Py_DECREF(o);
    if (!(o = call_method(x, s_data_ptr)))
        return -1;
    *ptr = PyLong_AsVoidPtr(o);
    Py_DECREF(o);
    return PyErr_Occurred() ? -1 : 0;
}

/* Whether tuple t holds exactly the n ints v; -1 on error. */
static int tuple_is(PyObject *t, const int64_t *v, int64_t n)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n)
        return 0;
    for (int64_t i = 0; i < n; i++) {
        long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (x != v[i])
            return 0;
    }
    return 1;
}

/* Remembers prepared tensor x as slot t's layout; clears c->shim where the shim reads x
** otherwise than its attributes do. */
static int slot_learn(call *c, slot *t, PyObject *x)
{
    long device;
    void *ptr;
    if (attrs_read(x, &t->want, &device, &ptr) < 0)
        return -1;
    if (!c->shim.data_ptr)
        return 0;
    layout seen = {0};
    int32_t type, index;
    void *shim_ptr;
    int r = shim_read(&c->shim, x, &seen, &type, &index, &shim_ptr);
    if (r < 0)
        return -1;
    int same = r;
    if (same && (same = tuple_is(t->want.shape, seen.sizes, seen.ndim)) == 1)
        same = tuple_is(t->want.stride, seen.strides, seen.ndim);
    if (same < 0)
        return -1;
    if (same && type == SHIM_CUDA && index == device && shim_ptr == ptr) {
        memcpy(t->want.sizes, seen.sizes, sizeof seen.sizes);
        memcpy(t->want.strides, seen.strides, sizeof seen.strides);
        t->want.ndim = seen.ndim;
        t->want.dtype_code = seen.dtype_code;
    } else {
        memset(&c->shim, 0, sizeof c->shim);
    }
    return 0;
}

/* Call(fn, args, slots, device, tensor_type, options, stream_fn, keep, alloc=None, shim=None):
**   fn: the function's address; args: its leading arguments' addresses (None for NULL);
**   slots: per array, None or (prepared tensor, (target address, ...), like: None or the index
**   of the slot whose alloc() fills this one when None is given); shim: None or the addresses
**   of aoti_torch_get_data_ptr, _dim, _sizes, _strides, _dtype, _device_type, _device_index
**   and aoti_torch_get_current_cuda_stream. */
static int call_init(call *c, PyObject *a, PyObject *kw)
{
    static char *names[] = {"fn", "args", "slots", "device", "tensor_type", "options",
                            "stream_fn", "keep", "alloc", "shim", NULL};
    PyObject *fn, *args, *slots, *tensor_type, *options, *stream_fn, *keep;
    PyObject *alloc = Py_None, *shim_addrs = Py_None;
    long device;
    if (!PyArg_ParseTupleAndKeywords(a, kw, "OO!O!lOOOO|OO", names, &fn, &PyTuple_Type, &args,
                                     &PyTuple_Type, &slots, &device, &tensor_type, &options,
                                     &stream_fn, &keep, &alloc, &shim_addrs))
        return -1;
    if (c->slots) {
        PyErr_SetString(PyExc_TypeError, "a Call is initialised once");
        return -1;
    }
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (nargs != 5 && nargs != 7 && nargs != 8 && nargs != 10 && nargs != 11) {
        PyErr_Format(PyExc_ValueError, "%zd leading arguments: 5, 7, 8, 10 or 11 are called",
                     nargs);
        return -1;
    }
    if (PyTuple_GET_SIZE(slots) > MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "at most %d arrays", MAX_SLOTS);
        return -1;
    }
    if (as_pointer(fn, &c->fn) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < nargs; i++)
        if (as_pointer(PyTuple_GET_ITEM(args, i), &c->args[i]) < 0)
            return -1;
    c->nargs = (int)nargs;
    if (shim_addrs != Py_None) {
        void **f = (void **)&c->shim;
        const Py_ssize_t n = sizeof c->shim / sizeof *f;
        if (!PyTuple_Check(shim_addrs) || PyTuple_GET_SIZE(shim_addrs) != n) {
            PyErr_Format(PyExc_ValueError, "shim: a tuple of %zd addresses", n);
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if (as_pointer(PyTuple_GET_ITEM(shim_addrs, i), &f[i]) < 0)
                return -1;
        for (Py_ssize_t i = 0; i + 1 < n; i++) /* the stream's function may be missing */
            if (!f[i])
                memset(&c->shim, 0, sizeof c->shim);
    }
    c->nslots = PyTuple_GET_SIZE(slots);
    c->slots = PyMem_Calloc((size_t)c->nslots ? (size_t)c->nslots : 1, sizeof *c->slots);
    if (!c->slots) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < c->nslots; i++) {
        PyObject *s = PyTuple_GET_ITEM(slots, i), *x, *targets, *like;
        slot *t = &c->slots[i];
        t->like = -1;
        if (s == Py_None)
            continue;
        if (!PyArg_ParseTuple(s, "OO!O", &x, &PyTuple_Type, &targets, &like))
            return -1;
        t->ntargets = (int)PyTuple_GET_SIZE(targets);
        if (t->ntargets < 1 || t->ntargets > MAX_TARGETS) {
            PyErr_SetString(PyExc_ValueError, "a slot takes one or two targets");
            return -1;
        }
        for (int j = 0; j < t->ntargets; j++)
            if (as_pointer(PyTuple_GET_ITEM(targets, j), (void **)&t->target[j]) < 0)
                return -1;
        if (like != Py_None) {
            t->like = PyLong_AsSsize_t(like);
            if (t->like == -1 && PyErr_Occurred())
                return -1;
            if (t->like < 0 || t->like >= c->nslots || t->like == i || alloc == Py_None) {
                PyErr_SetString(PyExc_ValueError, "like: another slot's index, with alloc");
                return -1;
            }
        }
        if (slot_learn(c, t, x) < 0)
            return -1;
    }
    for (Py_ssize_t i = 0; i < c->nslots; i++)
        if (c->slots[i].like >= 0 && !c->slots[c->slots[i].like].want.dtype) {
            PyErr_SetString(PyExc_ValueError, "like: a slot that holds a tensor");
            return -1;
        }
    c->device = device;
    if (!(c->device_obj = PyLong_FromLong(device)))
        return -1;
    if (c->shim.current_stream) { /* trusted where it names the stream stream_fn does */
        void *mine = NULL, *theirs;
        PyObject *s = call_one(stream_fn, c->device_obj);
        if (!s)
            return -1;
        theirs = PyLong_AsVoidPtr(s);
        Py_DECREF(s);
        if (PyErr_Occurred())
            return -1;
        if (c->shim.current_stream((int32_t)device, &mine) || mine != theirs)
            c->shim.current_stream = NULL;
    }
    c->tensor_type = new_ref(tensor_type);
    c->options = new_ref(options);
    c->stream_fn = new_ref(stream_fn);
    c->alloc = new_ref(alloc);
    c->keep = new_ref(keep);
    return 0;
}

/* 1, with *ptr x's data pointer, where x matches slot t; 0 where it does not; -1 on a Python
** error. */
static int slot_pointer(const call *c, const slot *t, PyObject *x, void **ptr)
{
    if ((PyObject *)Py_TYPE(x) != c->tensor_type)
        return 0;
    const layout *w = &t->want;
    if (c->shim.data_ptr) {
        layout l;
        int32_t type, index;
        int r = shim_read(&c->shim, x, &l, &type, &index, ptr);
        if (r != 1)
            return r;
        return l.dtype_code == w->dtype_code && l.ndim == w->ndim &&
               !memcmp(l.sizes, w->sizes, (size_t)l.ndim * sizeof *l.sizes) &&
               !memcmp(l.strides, w->strides, (size_t)l.ndim * sizeof *l.strides) &&
               type == SHIM_CUDA && index == c->device;
    }
    layout l = {0};
    long device;
    int same = attrs_read(x, &l, &device, ptr) < 0 ? -1
                                                   : l.dtype == w->dtype && device == c->device;
    if (same == 1 && (same = same_ints(l.shape, w->shape)) == 1)
        same = same_ints(l.stride, w->stride);
    layout_clear(&l);
    return same;
}

/* PyTorch's current stream on the call's device (a CUstream), or NULL with a Python error
** set (*ok 0). */
static void *current_stream(const call *c, int *ok)
{
    void *stream = NULL;
    *ok = 1;
    if (c->shim.current_stream && !c->shim.current_stream((int32_t)c->device, &stream))
        return stream;
    PyObject *s = call_one(c->stream_fn, c->device_obj);
    if (!s) {
        *ok = 0;
        return NULL;
    }
    stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    *ok = !PyErr_Occurred();
    return stream;
}

typedef int (*fn5)(void *, void *, void *, void *, void *, void *);
typedef int (*fn7)(void *, void *, void *, void *, void *, void *, void *, void *);
typedef int (*fn8)(void *, void *, void *, void *, void *, void *, void *, void *, void *);
typedef int (*fn10)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *,
                    void *);
typedef int (*fn11)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *,
                    void *, void *);

/* run(arrays, options, stream): None where the arrays or options are not this call's (nothing
** written then), else (the library's status, the tensor made for a slot given None, or None).
** stream: a CUstream as an int, or None for PyTorch's current stream on the tensors' device. */
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
        return same < 0 ? NULL : new_ref(Py_None);
    /* Check everything before writing anything; make the missing output last. */
    void *ptrs[MAX_SLOTS];
    Py_ssize_t make = -1;
    for (Py_ssize_t i = 0; i < c->nslots; i++) {
        PyObject *x = PyTuple_GET_ITEM(arrays, i);
        const slot *t = &c->slots[i];
        if (x == Py_None && t->like >= 0 && make < 0) {
            make = i;
            continue;
        }
        if (!t->want.dtype) {
            if (x != Py_None)
                Py_RETURN_NONE;
            continue;
        }
        int r = slot_pointer(c, t, x, &ptrs[i]);
        if (r != 1)
            return r < 0 ? NULL : new_ref(Py_None);
    }
    PyObject *made = NULL;
    if (make >= 0) {
        made = call_one(c->alloc, PyTuple_GET_ITEM(arrays, c->slots[make].like));
        if (!made)
            return NULL;
        int r = slot_pointer(c, &c->slots[make], made, &ptrs[make]);
        if (r != 1) {
            Py_DECREF(made);
            return r < 0 ? NULL : new_ref(Py_None);
        }
    }
    void *stream;
    int ok = 1;
    if (a[2] == Py_None) {
        stream = current_stream(c, &ok);
    } else {
        stream = PyLong_AsVoidPtr(a[2]);
        ok = !PyErr_Occurred();
    }
    if (!ok) {
        Py_XDECREF(made);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < c->nslots; i++)
        for (int j = 0; j < c->slots[i].ntargets; j++)
            *c->slots[i].target[j] = ptrs[i];
    void *const *g = c->args;
    int st;
    Py_BEGIN_ALLOW_THREADS switch (c->nargs)
    {
    case 5: st = ((fn5)c->fn)(g[0], g[1], g[2], g[3], g[4], stream); break;
    case 7: st = ((fn7)c->fn)(g[0], g[1], g[2], g[3], g[4], g[5], g[6], stream); break;
    case 8: st = ((fn8)c->fn)(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], stream); break;
    case 10:
        st = ((fn10)c->fn)(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], stream);
        break;
    default:
        st = ((fn11)c->fn)(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10],
                           stream);
        break;
    }
    Py_END_ALLOW_THREADS return Py_BuildValue("(iN)", st, made ? made : new_ref(Py_None));
}

/* The shim's reading of tensor x: (dtype code, sizes, strides, device type, device index,
** data pointer), or None where it fails; for the binding's and the tests' checks. */
static PyObject *call_shim_read(call *c, PyObject *x)
{
    if (!c->shim.data_ptr)
        Py_RETURN_NONE;
    layout l;
    int32_t type, index;
    void *ptr;
    int r = shim_read(&c->shim, x, &l, &type, &index, &ptr);
    if (r != 1)
        return r < 0 ? NULL : new_ref(Py_None);
    PyObject *sizes = PyTuple_New(l.ndim), *strides = PyTuple_New(l.ndim);
    if (!sizes || !strides) {
        Py_XDECREF(sizes);
        Py_XDECREF(strides);
        return NULL;
    }
    for (int64_t i = 0; i < l.ndim; i++) {
        PyTuple_SET_ITEM(sizes, i, PyLong_FromLongLong(l.sizes[i]));
        PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(l.strides[i]));
    }
    return Py_BuildValue("(iNNiiN)", l.dtype_code, sizes, strides, type, index,
                         PyLong_FromVoidPtr(ptr));
}

static PyObject *call_uses_shim(call *c, void *unused)
{
    (void)unused;
    return PyBool_FromLong(c->shim.data_ptr != NULL);
}

static PyGetSetDef call_getset[] = {
    {"uses_shim", (getter)call_uses_shim, NULL,
     "whether run() reads tensors through PyTorch's C shim (else their attributes)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef call_methods[] = {
    {"run", (PyCFunction)(void (*)(void))call_run, METH_FASTCALL,
     "run(arrays, options, stream) -> the library's status, or None where the arrays or "
     "options do not match this call"},
    {"shim_read", (PyCFunction)call_shim_read, METH_O,
     "shim_read(tensor) -> what the shim reads of it, or None"},
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
    .tp_getset = call_getset,
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
        !(s_get_device = PyUnicode_InternFromString("get_device")) ||
        !(s_cdata = PyUnicode_InternFromString("_cdata")))
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
