/* The relay's optional compiled column writer: `columns`, one pass over a batch of span
 * records (tuples, `record.py`'s field order) writing the typed columns a worker sends to the
 * parent (`relay.encode_columns`).
 *
 * It stands for the pure writer in `relay_columns.py` (a `zip(*records)` transpose, an `array`
 * per column, names and traces numbered in order of first appearance): the same bytes, the
 * same name and trace lists, the same positions of the records with an extra.
 * `tests/test_relay_columns.py` compares the two on random batches. A batch it does not take
 * as it is (a record that is not an 8-tuple, a field that is not an int or out of its
 * column's range) gets None back: the pure writer then does what it always did (raises).
 *
 * Built beside the compiled hot path (setup.py, scripts/build_accel.py), optional.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Record fields (record.py). */
enum { F_SPAN_ID = 0, F_PARENT_ID = 1, F_NAME = 2, F_START = 3, F_END = 4, F_THREAD_ID = 5,
       F_TRACE_ID = 6, F_EXTRA = 7, F_COUNT = 8 };

/* Bytes per record over the seven columns: span and parent id (Q), name index (I), start and
 * end (q), thread id (Q), trace index (I). */
#define ROW_BYTES (8 + 8 + 4 + 8 + 8 + 8 + 4)

/* -1 with no error set: not a value this column holds (the pure writer decides). */
static int
as_u64(PyObject *obj, uint64_t *into)
{
    if (!PyLong_Check(obj))
        return -1;
#if SIZEOF_LONG == 8
    unsigned long v = PyLong_AsUnsignedLong(obj);  /* as for `as_i64` below */
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
#else
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
#endif
        PyErr_Clear();
        return -1;
    }
    *into = (uint64_t)v;
    return 0;
}

static int
as_i64(PyObject *obj, int64_t *into)
{
    if (!PyLong_Check(obj))
        return -1;
#if SIZEOF_LONG == 8
    long v = PyLong_AsLong(obj);  /* PyLong_AsLongLong is 5x slower on multi-digit ints */
#else
    long long v = PyLong_AsLongLong(obj);
#endif
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *into = (int64_t)v;
    return 0;
}

/* The index of `key` in `order` (its first appearance), numbered on first sight; the last
 * object seen answers without a dict lookup (a batch's records share their name and trace
 * objects). -1 with an error set on failure, -2 for an index past uint32. */
typedef struct {
    PyObject *index;  /* dict: key -> int */
    PyObject *order;  /* list of keys */
    PyObject *last;   /* borrowed: alive in the records during the call */
    uint32_t last_at;
} Numbering;

static int64_t
number(Numbering *nb, PyObject *key)
{
    if (key == nb->last)
        return nb->last_at;
    PyObject *at = PyDict_GetItemWithError(nb->index, key);  /* borrowed */
    Py_ssize_t i;
    if (at != NULL) {
        i = PyLong_AsSsize_t(at);
    } else {
        if (PyErr_Occurred())
            return -1;
        i = PyList_GET_SIZE(nb->order);
        if (i > (Py_ssize_t)UINT32_MAX)
            return -2;
        PyObject *value = PyLong_FromSsize_t(i);
        if (value == NULL)
            return -1;
        int failed = PyDict_SetItem(nb->index, key, value) < 0
            || PyList_Append(nb->order, key) < 0;
        Py_DECREF(value);
        if (failed)
            return -1;
    }
    nb->last = key;
    nb->last_at = (uint32_t)i;
    return i;
}

PyDoc_STRVAR(columns_doc,
"columns(records, /) -> (bytes, names, traces, extras) | None\n\n"
"The seven typed columns of `records` as one bytes object (span ids, parent ids, name\n"
"indexes, starts, ends, thread ids, trace indexes; native byte order, as array.tobytes), the\n"
"names and trace ids in order of first appearance, and the positions of the records whose\n"
"extra is not None; None for records it does not take as they are.");

static PyObject *
columns(PyObject *module, PyObject *records)
{
    PyObject *seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = NULL, *extras = NULL, *result = NULL;
    Numbering names = {PyDict_New(), PyList_New(0), NULL, 0};
    Numbering traces = {PyDict_New(), PyList_New(0), NULL, 0};
    if (names.index == NULL || names.order == NULL || traces.index == NULL
        || traces.order == NULL)
        goto done;
    if (n > PY_SSIZE_T_MAX / ROW_BYTES) {
        PyErr_NoMemory();
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * ROW_BYTES);
    extras = PyList_New(0);
    if (out == NULL || extras == NULL)
        goto done;
    char *base = PyBytes_AS_STRING(out);
    uint64_t *sids = (uint64_t *)base;
    uint64_t *psids = sids + n;
    uint32_t *codes = (uint32_t *)(psids + n);
    int64_t *starts = (int64_t *)(codes + n);
    int64_t *ends = starts + n;
    uint64_t *tids = (uint64_t *)(ends + n);
    uint32_t *trace_codes = (uint32_t *)(tids + n);
    /* Nothing here runs Python code that could change the list (dict keys are the records'
     * own names and trace ids: str and int hash and compare in C). */
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = items[i];
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != F_COUNT)
            goto decline;
        PyObject *name = PyTuple_GET_ITEM(r, F_NAME);
        PyObject *trace = PyTuple_GET_ITEM(r, F_TRACE_ID);
        if (!PyUnicode_CheckExact(name) || !PyLong_CheckExact(trace))
            goto decline;
        if (as_u64(PyTuple_GET_ITEM(r, F_SPAN_ID), &sids[i]) < 0
            || as_u64(PyTuple_GET_ITEM(r, F_PARENT_ID), &psids[i]) < 0
            || as_i64(PyTuple_GET_ITEM(r, F_START), &starts[i]) < 0
            || as_i64(PyTuple_GET_ITEM(r, F_END), &ends[i]) < 0
            || as_u64(PyTuple_GET_ITEM(r, F_THREAD_ID), &tids[i]) < 0)
            goto decline;
        int64_t code = number(&names, name);
        int64_t trace_code = code < 0 ? code : number(&traces, trace);
        if (trace_code == -2)
            goto decline;
        if (trace_code < 0)
            goto done;
        codes[i] = (uint32_t)code;
        trace_codes[i] = (uint32_t)trace_code;
        if (PyTuple_GET_ITEM(r, F_EXTRA) != Py_None) {
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(extras, at) < 0) {
                Py_XDECREF(at);
                goto done;
            }
            Py_DECREF(at);
        }
    }
    result = PyTuple_Pack(4, out, names.order, traces.order, extras);
    goto done;
decline:
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(out);
    Py_XDECREF(extras);
    Py_XDECREF(names.index);
    Py_XDECREF(names.order);
    Py_XDECREF(traces.index);
    Py_XDECREF(traces.order);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"columns", (PyCFunction)columns, METH_O, columns_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_relaycols",
    "The relay's compiled column writer (see otel_rl._internal.relay_columns).", -1, methods,
};

PyMODINIT_FUNC
PyInit__relaycols(void)
{
    return PyModule_Create(&module_def);
}
