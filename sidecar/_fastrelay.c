/* The measured path's per-token step, in C: one upstream read that is exactly one chunk holding
 * one ordinary SSE content event is timed and written to the client without running Python.
 *
 * Why: a streamed token costs the interpreter a few frames (the upstream protocol's
 * data_received, the relay's sink, the timer), and measured live on a 2-core host those frames
 * cost 15-20 us a token, where a bare relay spends about 45 us a token in all: the sidecar paid
 * 1.5-1.9x the relay's CPU per token, nearly all of it interpretation. This type is the base of
 * `sidecar.upstream.Connection`; its `data_received` takes the fast path only while the Python
 * side has armed it (`_fast`), and hands every other read to `_py_data_received`, the Python
 * protocol, unchanged. The decisions are exactly those of the Python code (`StreamTimer.relay`'s
 * fast path and `_fast_token`); tests run both ways and compare.
 *
 * `_fast` is a tuple (write, timer, itl, bufsize, high_water, pressure, is_closing) set by
 * `relay_sse` once the response head is out and the timer has its first token, or None.
 * Optional: without a compiler the package installs without it, and the Python path runs.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    double last_activity;   /* time.monotonic() of the last read */
    PyObject *fast;         /* the armed tuple, or NULL/None */
    char fast_clear;        /* the chunk decoder holds nothing partial (set by the Python side) */
    PyObject *dict;         /* the Python subclass's attributes */
    PyObject *weakrefs;
} FastBase;

static PyObject *str_py_data_received, *str_last, *str_chunks;

static double monotonic_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *find(const char *p, Py_ssize_t n, const char *needle, Py_ssize_t m)
{
    return (const char *)memmem(p, (size_t)n, needle, (size_t)m);
}

#define FIND(p, n, lit) find((p), (n), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* StreamTimer._fast_token on an event's bytes: certainly one ordinary content chunk. */
static int plain_token(const char *p, Py_ssize_t n)
{
    const char *end = p + n;
    const char *i = FIND(p, n, "\"finish_reason\":");
    if (i == NULL)
        return 0;
    i += (i + 16 < end && i[16] == ' ') ? 17 : 16;
    if (end - i < 4 || memcmp(i, "null", 4) != 0)
        return 0;
    if (FIND(i, end - i, "\"finish_reason\"") != NULL)
        return 0;
    if (FIND(p, n, "\"error\"") != NULL)
        return 0;
    i = FIND(p, n, "\"usage\":");
    if (i != NULL) {
        i += (i + 8 < end && i[8] == ' ') ? 9 : 8;
        if (end - i < 4 || memcmp(i, "null", 4) != 0)
            return 0;
    }
    i = FIND(p, n, "\"content\":");
    if (i != NULL) {
        i += (i + 10 < end && i[10] == ' ') ? 11 : 10;
    } else {
        i = FIND(p, n, "\"text\":");
        if (i == NULL)
            return 0;
        i += (i + 7 < end && i[7] == ' ') ? 8 : 7;
    }
    /* an opening quote followed by anything but the closing one: non-empty text */
    return end - i >= 2 && i[0] == '"' && i[1] != '"';
}

/* The payload of a read that is exactly one whole chunk ("<hex>\r\n<payload>\r\n"), as
 * Connection.data_received's own fast path takes it; returns its length, 0 if not one. */
static Py_ssize_t one_chunk(const char *d, Py_ssize_t n, const char **payload)
{
    Py_ssize_t eol = -1, size = 0;
    for (Py_ssize_t k = 0; k + 1 < n && k + 1 < 10; k++) {   /* data.find(b"\r\n", 0, 10) */
        if (d[k] == '\r' && d[k + 1] == '\n') {
            eol = k;
            break;
        }
    }
    if (eol <= 0 || n < 2 || d[n - 2] != '\r' || d[n - 1] != '\n')
        return 0;
    for (Py_ssize_t k = 0; k < eol; k++) {   /* plain hex digits only (no extensions, signs, 0x) */
        char c = d[k];
        int v = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (v < 0)
            return 0;
        size = size * 16 + v;
    }
    if (size <= 0 || eol + 4 + size != n)
        return 0;
    *payload = d + eol + 2;
    return size;
}

/* StreamTimer.relay's fast path: one `data:` line and its blank line. */
static int one_event(const char *p, Py_ssize_t n)
{
    if (n < 7 || memcmp(p, "data:", 5) != 0 || p[n - 2] != '\n' || p[n - 1] != '\n')
        return 0;
    return memchr(p, '\n', (size_t)n) == p + n - 2;
}

/* obj.name = value, the reference to value taken over (NULL: its creation failed). */
static int set_taken(PyObject *obj, PyObject *name, PyObject *value)
{
    if (value == NULL)
        return -1;
    int rc = PyObject_SetAttr(obj, name, value);
    Py_DECREF(value);
    return rc;
}

/* A float or int attribute as a double (-1 with an error set on failure). */
static double number_attr(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1.0;
    double x = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return x;
}

/* Account one token on the timer: _itl.append(now - _last); _last = now; _chunks += 1. */
static int count_token(PyObject *timer, PyObject *itl, double now)
{
    double before = number_attr(timer, str_last);
    if (before == -1.0 && PyErr_Occurred())
        return -1;
    double chunks = number_attr(timer, str_chunks);
    if (chunks == -1.0 && PyErr_Occurred())
        return -1;
    PyObject *gap = PyFloat_FromDouble(now - before);
    if (gap == NULL)
        return -1;
    int rc = PyList_Append(itl, gap);
    Py_DECREF(gap);
    if (rc < 0)
        return -1;
    if (set_taken(timer, str_last, PyFloat_FromDouble(now)) < 0)
        return -1;
    return set_taken(timer, str_chunks, PyLong_FromDouble(chunks + 1.0));
}

static PyObject *FastBase_data_received(FastBase *self, PyObject *data)
{
    PyObject *fast = self->fast;
    if (fast != NULL && fast != Py_None && self->fast_clear && PyBytes_CheckExact(data)
            && PyTuple_CheckExact(fast) && PyTuple_GET_SIZE(fast) == 7) {
        const char *payload;
        Py_ssize_t n = one_chunk(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &payload);
        if (n > 0 && one_event(payload, n) && plain_token(payload, n)) {
            Py_INCREF(fast);   /* the calls below may disarm (and free) it */
            PyObject *is_closing = PyObject_CallNoArgs(PyTuple_GET_ITEM(fast, 6));
            if (is_closing == NULL)
                goto fail;
            int closing = PyObject_IsTrue(is_closing);
            Py_DECREF(is_closing);
            if (closing < 0)
                goto fail;
            if (!closing) {
                double mono = monotonic_now();
                self->last_activity = mono;
                /* perf_counter is CLOCK_MONOTONIC on Linux, as the module checks at import */
                if (count_token(PyTuple_GET_ITEM(fast, 1), PyTuple_GET_ITEM(fast, 2), mono) < 0)
                    goto fail;
                PyObject *r = PyObject_CallOneArg(PyTuple_GET_ITEM(fast, 0), data);
                if (r == NULL)
                    goto fail;
                Py_DECREF(r);
                PyObject *size = PyObject_CallNoArgs(PyTuple_GET_ITEM(fast, 3));
                if (size == NULL)
                    goto fail;
                int over = PyObject_RichCompareBool(size, PyTuple_GET_ITEM(fast, 4), Py_GT);
                Py_DECREF(size);
                if (over < 0)
                    goto fail;
                if (over) {
                    r = PyObject_CallNoArgs(PyTuple_GET_ITEM(fast, 5));   /* disarms, pauses */
                    if (r == NULL)
                        goto fail;
                    Py_DECREF(r);
                }
                Py_DECREF(fast);
                Py_RETURN_NONE;
            }
            Py_DECREF(fast);
        }
    }
    return PyObject_CallMethodOneArg((PyObject *)self, str_py_data_received, data);
fail:
    Py_DECREF(fast);
    return NULL;
}

static PyObject *FastBase_event_fast(PyObject *module, PyObject *data)
{
    /* For tests: would the C path take this event (its bytes without chunk framing)? */
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "bytes expected");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    return PyBool_FromLong(one_event(p, n) && plain_token(p, n));
}

static PyObject *module_monotonic(PyObject *module, PyObject *unused)
{
    return PyFloat_FromDouble(monotonic_now());
}

static int FastBase_traverse(FastBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fast);
    Py_VISIT(self->dict);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int FastBase_clear(FastBase *self)
{
    Py_CLEAR(self->fast);
    Py_CLEAR(self->dict);
    return 0;
}

static void FastBase_dealloc(FastBase *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    FastBase_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMethodDef FastBase_methods[] = {
    {"data_received", (PyCFunction)FastBase_data_received, METH_O,
     "One read from the upstream: the C fast path when armed, else _py_data_received(data)."},
    {NULL}
};

static PyMemberDef FastBase_members[] = {
    {"last_activity", T_DOUBLE, offsetof(FastBase, last_activity), 0, "time.monotonic() of the last activity"},
    {"_fast", T_OBJECT, offsetof(FastBase, fast), 0, "the armed fast path (a tuple) or None"},
    {"_fast_clear", T_BOOL, offsetof(FastBase, fast_clear), 0, "no partial chunk held"},
    {"__dictoffset__", T_PYSSIZET, offsetof(FastBase, dict), READONLY},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(FastBase, weakrefs), READONLY},
    {NULL}
};

static PyType_Slot FastBase_slots[] = {
    {Py_tp_doc, "The C fast path under sidecar.upstream.Connection."},
    {Py_tp_dealloc, FastBase_dealloc},
    {Py_tp_traverse, FastBase_traverse},
    {Py_tp_clear, FastBase_clear},
    {Py_tp_methods, FastBase_methods},
    {Py_tp_members, FastBase_members},
    {Py_tp_new, PyType_GenericNew},
    {0, NULL}
};

static PyType_Spec FastBase_spec = {
    .name = "sidecar._fastrelay.FastBase",
    .basicsize = sizeof(FastBase),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = FastBase_slots,
};

static PyMethodDef module_methods[] = {
    {"event_fast", FastBase_event_fast, METH_O, "Whether the C path takes this SSE event as a plain token."},
    {"monotonic", module_monotonic, METH_NOARGS, "CLOCK_MONOTONIC, the clock the C path times tokens with."},
    {NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sidecar._fastrelay", "The measured path's per-token step, in C.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastrelay(void)
{
    str_py_data_received = PyUnicode_InternFromString("_py_data_received");
    str_last = PyUnicode_InternFromString("_last");
    str_chunks = PyUnicode_InternFromString("_chunks");
    if (str_py_data_received == NULL || str_last == NULL || str_chunks == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    PyObject *tp = PyType_FromSpec(&FastBase_spec);
    if (tp == NULL || PyModule_AddObject(m, "FastBase", tp) < 0) {
        Py_XDECREF(tp);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
