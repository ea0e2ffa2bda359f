/* The metrics' optional compiled column reader: `fill`, one pass over a batch of span records
 * (tuples, `record.py`'s field order) filling the typed columns the metrics count with numpy;
 * `histogram`, the durations bucketed per path in one pass; `settle`, records placed by their
 * parents' path codes in one pass per nesting level.
 *
 * They stand for the pure reader in `metrics_columns.py` (one `np.fromiter(map(itemgetter(i),
 * records))` pass per column, 14-46 ns each; `searchsorted` and `bincount`; numpy passes per
 * level): the same values, the same name lookups in the same order (a mapping's `__missing__`
 * is called as `names[name]` calls it), the same positions of the records with an extra, the
 * same float sums (added in record order), the same `make` calls in the same order.
 * `tests/test_metrics_columns.py` compares the two on random batches, and whole `Metrics` fed
 * by each.
 *
 * Built beside the compiled hot path (setup.py, scripts/build_accel.py), optional: without it
 * the metrics read columns in pure Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Record fields (record.py). */
enum { F_SPAN_ID = 0, F_PARENT_ID = 1, F_NAME = 2, F_START = 3, F_END = 4, F_THREAD_ID = 5,
       F_EXTRA = 7, F_COUNT = 8 };

/* A writable buffer of `n` 8-byte items, or none (None). */
typedef struct {
    Py_buffer view;
    int held;
} Out;

static int
out_open(PyObject *obj, Py_ssize_t n, Out *out, const char *what)
{
    out->held = 0;
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, &out->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    out->held = 1;
    if (out->view.len != n * 8) {
        PyErr_Format(PyExc_ValueError, "%s: a buffer of %zd 8-byte items is needed", what, n);
        return -1;
    }
    return 0;
}

static void
out_close(Out *out)
{
    if (out->held)
        PyBuffer_Release(&out->view);
    out->held = 0;
}

/* Where `long` has 64 bits, PyLong_AsLong: PyLong_AsLongLong goes through a byte array for an
 * int of more than one 30-bit digit (every perf_counter_ns time), 5x slower. */
#if SIZEOF_LONG == 8
#define AS_I64 PyLong_AsLong
#define AS_U64 PyLong_AsUnsignedLong
typedef long i64_t;
typedef unsigned long u64_t;
#else
#define AS_I64 PyLong_AsLongLong
#define AS_U64 PyLong_AsUnsignedLongLong
typedef long long i64_t;
typedef unsigned long long u64_t;
#endif

static int
as_i64(PyObject *obj, int64_t *into)
{
    i64_t v = AS_I64(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *into = (int64_t)v;
    return 0;
}

static int
as_u64(PyObject *obj, uint64_t *into)
{
    if (!PyLong_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "an id is not an int");
        return -1;
    }
    u64_t v = AS_U64(obj);
    if (v == (u64_t)-1 && PyErr_Occurred())
        return -1;
    *into = (uint64_t)v;
    return 0;
}

/* The codes of the names seen in one `fill` call, by the name object (a batch has few names,
 * and every record of a block holds the same string object): a slot per pointer hash. */
#define CACHE_SLOTS 64
typedef struct {
    PyObject *name[CACHE_SLOTS];  /* borrowed: the records keep them alive during the call */
    int64_t code[CACHE_SLOTS];
} Cache;

/* names[name] as an int64: the dict's own lookup first, then `__getitem__` (a subclass's
 * `__missing__`), as `map(names.__getitem__, ...)` does. Only values the dict held are cached,
 * and a `__missing__` call (which may change the dict) empties the cache. */
static int
lookup(PyObject *names, PyObject *name, int64_t *into, Cache *cache)
{
    size_t slot = ((size_t)name >> 4) % CACHE_SLOTS;
    if (cache->name[slot] == name) {
        *into = cache->code[slot];
        return 0;
    }
    PyObject *value = PyDict_GetItemWithError(names, name);  /* borrowed */
    if (value != NULL) {
        if (as_i64(value, into) < 0)
            return -1;
        cache->name[slot] = name;
        cache->code[slot] = *into;
        return 0;
    }
    if (PyErr_Occurred())
        return -1;
    memset(cache->name, 0, sizeof(cache->name));
    value = PyObject_GetItem(names, name);
    if (value == NULL)
        return -1;
    int failed = as_i64(value, into);
    Py_DECREF(value);
    return failed;
}

PyDoc_STRVAR(fill_doc,
"fill(records, names, codes, durations, sids, psids, tids, /) -> list[int]\n\n"
"Fill the columns given (writable buffers of len(records) int64/uint64 items, or None) from\n"
"`records`: codes = names[name], durations = end - start, span, parent and thread ids.\n"
"Returns the positions of the records whose extra is truthy.");

static PyObject *
fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "fill() takes 7 arguments");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "records must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *names = args[1];
    if (names != Py_None && !PyDict_Check(names)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_TypeError, "names must be a dict");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Out codes, durations, sids, psids, tids;
    codes.held = durations.held = sids.held = psids.held = tids.held = 0;
    PyObject *extras = NULL, *r = NULL;
    if (out_open(args[2], n, &codes, "codes") < 0
        || out_open(args[3], n, &durations, "durations") < 0
        || out_open(args[4], n, &sids, "sids") < 0 || out_open(args[5], n, &psids, "psids") < 0
        || out_open(args[6], n, &tids, "tids") < 0)
        goto fail;
    if (codes.held && names == Py_None) {
        PyErr_SetString(PyExc_TypeError, "codes need names");
        goto fail;
    }
    extras = PyList_New(0);
    if (extras == NULL)
        goto fail;
    Cache cache;
    memset(cache.name, 0, sizeof(cache.name));
    int64_t *c = codes.held ? (int64_t *)codes.view.buf : NULL;
    int64_t *d = durations.held ? (int64_t *)durations.view.buf : NULL;
    uint64_t *s = sids.held ? (uint64_t *)sids.view.buf : NULL;
    uint64_t *p = psids.held ? (uint64_t *)psids.view.buf : NULL;
    uint64_t *t = tids.held ? (uint64_t *)tids.view.buf : NULL;
    /* A `__missing__` or `__index__` runs Python code, which could change a list of records:
     * each record is held while it is read, and the list's items read again for the next. */
    for (Py_ssize_t i = 0; i < n && i < PySequence_Fast_GET_SIZE(seq); i++) {
        r = PySequence_Fast_ITEMS(seq)[i];
        Py_INCREF(r);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < F_COUNT) {
            PyErr_Format(PyExc_TypeError, "record %zd is not a span record", i);
            goto fail;
        }
        if (c != NULL && lookup(names, PyTuple_GET_ITEM(r, F_NAME), &c[i], &cache) < 0)
            goto fail;
        if (d != NULL) {
            int64_t start, end;
            if (as_i64(PyTuple_GET_ITEM(r, F_START), &start) < 0
                || as_i64(PyTuple_GET_ITEM(r, F_END), &end) < 0)
                goto fail;
            d[i] = (int64_t)((uint64_t)end - (uint64_t)start);  /* wraps, as numpy's does */
        }
        if (s != NULL && as_u64(PyTuple_GET_ITEM(r, F_SPAN_ID), &s[i]) < 0)
            goto fail;
        if (p != NULL && as_u64(PyTuple_GET_ITEM(r, F_PARENT_ID), &p[i]) < 0)
            goto fail;
        if (t != NULL && as_u64(PyTuple_GET_ITEM(r, F_THREAD_ID), &t[i]) < 0)
            goto fail;
        PyObject *extra = PyTuple_GET_ITEM(r, F_EXTRA);
        if (extra != Py_None) {
            int truth = PyObject_IsTrue(extra);
            if (truth < 0)
                goto fail;
            if (truth) {
                PyObject *at = PyLong_FromSsize_t(i);
                if (at == NULL || PyList_Append(extras, at) < 0) {
                    Py_XDECREF(at);
                    goto fail;
                }
                Py_DECREF(at);
            }
        }
        Py_CLEAR(r);
    }
    out_close(&codes); out_close(&durations); out_close(&sids); out_close(&psids);
    out_close(&tids);
    Py_DECREF(seq);
    return extras;
fail:
    Py_XDECREF(r);
    out_close(&codes); out_close(&durations); out_close(&sids); out_close(&psids);
    out_close(&tids);
    Py_XDECREF(extras);
    Py_DECREF(seq);
    return NULL;
}

/* A buffer of `n` items of `size` bytes (n < 0: any count, returned in `*count`). */
static int
view_open(PyObject *obj, Py_buffer *view, Py_ssize_t size, Py_ssize_t n, int writable,
          Py_ssize_t *count, const char *what)
{
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len % size || (n >= 0 && view->len != n * size)) {
        PyBuffer_Release(view);
        if (n < 0)
            PyErr_Format(PyExc_ValueError, "%s: a buffer of %zd-byte items is needed", what,
                         size);
        else
            PyErr_Format(PyExc_ValueError, "%s: a buffer of %zd %zd-byte items is needed",
                         what, n, size);
        return -1;
    }
    if (count != NULL)
        *count = view->len / size;
    return 0;
}

PyDoc_STRVAR(histogram_doc,
"histogram(codes, durations, bounds, counts, totals, runs, /) -> None\n\n"
"Add each duration (int64) to its code's (int64, each in range(len(runs))) row of `counts`\n"
"(int64, len(bounds) + 1 buckets per code: bucket i holds durations in (bounds[i-1],\n"
"bounds[i]]), its value to totals[code] (float64, in record order) and 1 to runs[code].");

static PyObject *
histogram(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "histogram() takes 6 arguments");
        return NULL;
    }
    Py_buffer in[3];
    Py_ssize_t n, nd, nb;
    Out counts, totals, runs;
    counts.held = totals.held = runs.held = 0;
    int opened = 0;
    if (view_open(args[0], &in[0], 8, -1, 0, &n, "codes") < 0)
        return NULL;
    opened = 1;
    if (view_open(args[1], &in[1], 8, -1, 0, &nd, "durations") < 0)
        goto fail;
    opened = 2;
    if (view_open(args[2], &in[2], 8, -1, 0, &nb, "bounds") < 0)
        goto fail;
    opened = 3;
    if (nd != n) {
        PyErr_SetString(PyExc_ValueError, "durations: one per code is needed");
        goto fail;
    }
    if (PyObject_GetBuffer(args[5], &runs.view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        goto fail;
    runs.held = 1;
    Py_ssize_t kinds = runs.view.len / 8, width = nb + 1;
    if (out_open(args[3], kinds * width, &counts, "counts") < 0
        || out_open(args[4], kinds, &totals, "totals") < 0 || runs.view.len != kinds * 8)
        goto fail;
    const int64_t *c = (const int64_t *)in[0].buf, *d = (const int64_t *)in[1].buf;
    const int64_t *b = (const int64_t *)in[2].buf;
    int64_t *into = (int64_t *)counts.view.buf, *r = (int64_t *)runs.view.buf;
    double *t = (double *)totals.view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t code = c[i], v = d[i];
        if (code < 0 || code >= kinds) {
            PyErr_Format(PyExc_ValueError, "code %lld is out of range", (long long)code);
            goto fail;
        }
        Py_ssize_t lo = 0, hi = nb;  /* the first bound >= v: numpy's searchsorted "left" */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (b[mid] < v)
                lo = mid + 1;
            else
                hi = mid;
        }
        into[code * width + lo] += 1;
        t[code] += (double)v;
        r[code] += 1;
    }
    for (int k = 0; k < opened; k++)
        PyBuffer_Release(&in[k]);
    out_close(&counts); out_close(&totals); out_close(&runs);
    Py_RETURN_NONE;
fail:
    for (int k = 0; k < opened; k++)
        PyBuffer_Release(&in[k]);
    out_close(&counts); out_close(&totals); out_close(&runs);
    return NULL;
}

static int
compare_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

PyDoc_STRVAR(settle_doc,
"settle(codes, sub, same, parent, parent_codes, name_codes, width, make, /) -> None\n\n"
"`metrics_columns.Reader.settle` in one pass per nesting level: each record sub[j] without a\n"
"code (codes < 0) whose parent's code is known (same[j]: codes[parent[j]], else\n"
"parent_codes[j]) gets make(parent code * width + name_codes[j]); per level, all parents'\n"
"codes are read first and `make` is called once per distinct key, in ascending order.");

static PyObject *
settle(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "settle() takes 8 arguments");
        return NULL;
    }
    Py_buffer views[6];
    int opened = 0;
    Py_ssize_t n, m;
    Py_ssize_t *todo = NULL;
    int64_t *known = NULL, *keys = NULL, *values = NULL, *distinct = NULL;
    PyObject *result = NULL;
    long long width = PyLong_AsLongLong(args[6]);
    if (width == -1 && PyErr_Occurred())
        return NULL;
    if (width <= 0) {
        PyErr_SetString(PyExc_ValueError, "width must be positive");
        return NULL;
    }
    PyObject *make = args[7];
    if (view_open(args[0], &views[0], 8, -1, 1, &n, "codes") < 0)
        return NULL;
    opened = 1;
    if (view_open(args[1], &views[1], 8, -1, 0, &m, "sub") < 0)
        goto done;
    opened = 2;
    static const char *names[] = {"same", "parent", "parent_codes", "name_codes"};
    for (int k = 0; k < 4; k++) {
        if (view_open(args[2 + k], &views[2 + k], k == 0 ? 1 : 8, m, 0, NULL, names[k]) < 0)
            goto done;
        opened = 3 + k;
    }
    int64_t *codes = (int64_t *)views[0].buf;
    const int64_t *sub = (const int64_t *)views[1].buf;
    const uint8_t *same = (const uint8_t *)views[2].buf;
    const int64_t *parent = (const int64_t *)views[3].buf;
    const int64_t *parent_codes = (const int64_t *)views[4].buf;
    const int64_t *name_codes = (const int64_t *)views[5].buf;
    for (Py_ssize_t j = 0; j < m; j++) {
        if (sub[j] < 0 || sub[j] >= n || (same[j] && (parent[j] < 0 || parent[j] >= n))) {
            PyErr_SetString(PyExc_IndexError, "a position is out of range");
            goto done;
        }
    }
    /* An open-addressing table of the level's distinct keys (all >= 0; -1 is empty). */
    Py_ssize_t capacity = 16;
    while (capacity < 2 * m)
        capacity *= 2;
    todo = PyMem_Malloc((m ? m : 1) * sizeof(Py_ssize_t));
    known = PyMem_Malloc((m ? m : 1) * sizeof(int64_t));
    distinct = PyMem_Malloc((m ? m : 1) * sizeof(int64_t));
    keys = PyMem_Malloc(capacity * sizeof(int64_t));
    values = PyMem_Malloc(capacity * sizeof(int64_t));
    if (!todo || !known || !distinct || !keys || !values) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t left = 0;
    for (Py_ssize_t j = 0; j < m; j++)
        if (codes[sub[j]] < 0)
            todo[left++] = j;
    while (left) {
        Py_ssize_t ready = 0, count = 0;
        for (Py_ssize_t t = 0; t < left; t++) {  /* every parent read before any is written */
            Py_ssize_t j = todo[t];
            known[t] = same[j] ? codes[parent[j]] : parent_codes[j];
            ready += known[t] >= 0;
        }
        if (!ready)
            break;
        memset(keys, 0xff, capacity * sizeof(int64_t));
        size_t mask = (size_t)capacity - 1;
        for (Py_ssize_t t = 0; t < left; t++) {
            if (known[t] < 0)
                continue;
            int64_t key = known[t] * width + name_codes[todo[t]];
            if (key < 0 || name_codes[todo[t]] < 0) {
                PyErr_SetString(PyExc_ValueError, "a name code is negative");
                goto done;
            }
            known[t] = key;  /* from here: the key (>= 0) */
            size_t at = ((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20 & mask;
            while (keys[at] != -1 && keys[at] != key)
                at = (at + 1) & mask;
            if (keys[at] == -1) {
                keys[at] = key;
                distinct[count++] = key;
            }
        }
        qsort(distinct, (size_t)count, sizeof(int64_t), compare_i64);
        for (Py_ssize_t d = 0; d < count; d++) {  /* ascending, as numpy's pass makes them */
            PyObject *key = PyLong_FromLongLong(distinct[d]);
            if (key == NULL)
                goto done;
            PyObject *made = PyObject_CallOneArg(make, key);
            Py_DECREF(key);
            if (made == NULL)
                goto done;
            int64_t value;
            int failed = as_i64(made, &value);
            Py_DECREF(made);
            if (failed)
                goto done;
            size_t at = ((uint64_t)distinct[d] * 0x9E3779B97F4A7C15ull) >> 20 & mask;
            while (keys[at] != distinct[d])
                at = (at + 1) & mask;
            values[at] = value;
        }
        Py_ssize_t kept = 0;
        for (Py_ssize_t t = 0; t < left; t++) {
            Py_ssize_t j = todo[t];
            if (known[t] < 0) {  /* its parent has no code yet */
                todo[kept++] = j;
                continue;
            }
            size_t at = ((uint64_t)known[t] * 0x9E3779B97F4A7C15ull) >> 20 & mask;
            while (keys[at] != known[t])
                at = (at + 1) & mask;
            codes[sub[j]] = values[at];
        }
        left = kept;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int k = 0; k < opened; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(todo);
    PyMem_Free(known);
    PyMem_Free(distinct);
    PyMem_Free(keys);
    PyMem_Free(values);
    return result;
}

static PyMethodDef methods[] = {
    {"settle", (PyCFunction)(void (*)(void))settle, METH_FASTCALL, settle_doc},
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL, fill_doc},
    {"histogram", (PyCFunction)(void (*)(void))histogram, METH_FASTCALL, histogram_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_metricsacc",
    "The metrics' compiled column reader (see otel_rl._internal.metrics_columns).", -1, methods,
};

PyMODINIT_FUNC
PyInit__metricsacc(void)
{
    return PyModule_Create(&module_def);
}
