/* The optional compiled hot path: `hierarchical_timer.__init__/__enter__/__exit__` and the
 * tallied `__enter__`, statement for statement the pure-Python ones in `recorder.py`.
 *
 * It keeps no state of its own but the slot offsets of the recorder's classes: every module
 * global the pure code reads (`_local`, `_ids`, `tally`, `perf_counter_ns`, `buffer_cap`,
 * `pack_at`, `on_full`, `full_skip`, `_error_extra`, `_gpu_opt_in`, `TimerNode`,
 * `thread_stack`) is read from the recorder's namespace, those read at every block through a
 * cache dropped whenever that namespace changes (`hot_global`), so `arm`/`disarm`,
 * `use_tally`, `reseed_ids` after a fork and `otel_rl.testing`'s swapped clock and ids act on
 * both paths alike. Objects of the recorder's own classes are read and written through their
 * slots; anything else through ordinary attribute access (the same as the pure code, only
 * slower). What the fast path does not cover (keyword arguments, say) is handed to the pure
 * function.
 *
 * Built by setup.py as an optional extension: without a compiler otel_rl runs pure Python.
 * `tests/test_accel.py` drives both paths with the same workloads and compares everything.
 */
#include "_accel.h"
#include <time.h>

/* One slot of one class: objects of exactly `type` (or a subclass, for the timer) use the
 * offset; others go through getattr/setattr by `name`. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t offset;
    PyObject *name;
    int subclasses;
} Field;

enum {
    T_FRAMES, T_NAME, T_NODE, T_SID, T_ST, T_STACK, T_START, T_TR, T_UP,
    S_STACK, S_TRACE, S_TOP, S_TID, S_DROPPED, S_SLOT,
    N_CHILDREN, N_TOTAL, N_COUNT,
    R_TRACE_ID, R_SINK,
    N_FIELDS
};

static const char *field_names[N_FIELDS] = {
    "_frames", "_name", "_node", "_sid", "_st", "_stack", "_start", "_tr", "_up",
    "stack", "trace", "top", "tid", "dropped", "slot",
    "children", "total", "count",
    "trace_id", "sink",
};

static Field fields[N_FIELDS];
static PyObject *ns;           /* the recorder module's globals */
static PyObject *real_clock;   /* time.perf_counter_ns: read natively while it is the clock */
static PyObject *pure_init, *pure_exit;  /* what calls the fast path does not cover go to */
static PyObject *one, *nano;   /* 1 and 1e-9 */
static PyObject *deque_type, *deque_append;  /* collections.deque and its unbound append */
static PyObject *s_local, *s_thread_stack, *s_TimerNode, *s_ids, *s_tally, *s_clock,
    *s_buffer_cap, *s_pack_at, *s_on_full, *s_full_skip, *s_error_extra, *s_gpu_opt_in,
    *s_stack, *s_append, *s_get, *s_pop;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static inline int
fast(PyObject *obj, const Field *f)
{
    return Py_TYPE(obj) == f->type || (f->subclasses && PyObject_TypeCheck(obj, f->type));
}

/* obj.<field>, a new reference (NULL and an exception if unset). */
static PyObject *
get(PyObject *obj, int which)
{
    const Field *f = &fields[which];
    if (fast(obj, f)) {
        PyObject *value = SLOT(obj, f->offset);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
    }
    return PyObject_GetAttr(obj, f->name);
}

/* obj.<field> = value (value borrowed). */
static int
set(PyObject *obj, int which, PyObject *value)
{
    const Field *f = &fields[which];
    if (fast(obj, f)) {
        PyObject *old = SLOT(obj, f->offset);
        Py_INCREF(value);
        SLOT(obj, f->offset) = value;
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(obj, f->name, value);
}

/* A recorder global, a new reference (NameError like the pure code if it is gone). */
static PyObject *
global(PyObject *key)
{
    PyObject *value = namespace_get(ns, key);
    Py_XINCREF(value);
    return value;
}

/* The globals read at every block, cached while the recorder's namespace is unchanged: any
 * change to it (a global rebound by `arm`, `use_tally`, `reseed_ids`, a swapped clock...)
 * drops the whole cache. Python 3.12+ says so through a dict watcher; before, the dict's
 * version tag (PEP 509) changes with every change. */
enum {
    G_LOCAL, G_CLOCK, G_IDS, G_TALLY, G_BUFFER_CAP, G_PACK_AT, G_ON_FULL, G_FULL_SKIP, N_CACHED
};
static PyObject **cached_keys[N_CACHED] = {&s_local, &s_clock, &s_ids, &s_tally, &s_buffer_cap,
                                           &s_pack_at, &s_on_full, &s_full_skip};
static PyObject *cached[N_CACHED];  /* borrowed from the namespace while the cache is valid */
#if PY_VERSION_HEX < 0x030C0000
static uint64_t cache_version;
#endif

static PyObject *
hot_global(int which)
{
#if PY_VERSION_HEX < 0x030C0000
    if (((PyDictObject *)ns)->ma_version_tag != cache_version)
        cache_valid = 0;
#endif
    if (!cache_valid) {
        for (int i = 0; i < N_CACHED; i++) {
            cached[i] = PyDict_GetItemWithError(ns, *cached_keys[i]);
            if (cached[i] == NULL && PyErr_Occurred())
                return NULL;
        }
#if PY_VERSION_HEX < 0x030C0000
        cache_version = ((PyDictObject *)ns)->ma_version_tag;
#endif
        cache_valid = 1;
    }
    PyObject *value = cached[which];
    if (value == NULL) {
        PyErr_Format(PyExc_NameError, "name '%U' is not defined", *cached_keys[which]);
        return NULL;
    }
    Py_INCREF(value);
    return value;
}

/* `local.<name>` of a plain `threading.local` (`_thread._local`), a new reference; NULL with
 * AttributeError if this thread has not set it (NULL with another exception on failure).
 * Read from this thread's instance dict of `local` (what `local.__dict__` gives: for the
 * exact type nothing else in its lookup can answer first), which a few cache entries keep
 * per (local, thread): a block reads the recorder's `_local.stack`, RLlib's glue its
 * `_open.blocks`, and `_thread._local`'s own attribute lookup is most of their cost. A
 * thread's dict stays the same object while the thread lives (`__dict__` cannot be
 * rebound), and thread state ids are never reused, so an entry is never wrong: it only
 * outlives its thread. Any other object goes through getattr. */
typedef struct {
    PyObject *local;   /* strong */
    uint64_t thread;   /* PyThreadState_GetID */
    PyObject *dict;    /* strong */
} LocalDict;
#define N_LOCAL_DICTS 4
static LocalDict local_dicts[N_LOCAL_DICTS];
static unsigned int local_dicts_next;
static PyTypeObject *local_type;  /* _thread._local */
static PyObject *s___dict__;

static PyObject *
thread_attr(PyObject *local, PyObject *name)
{
    if (Py_TYPE(local) != local_type)
        return PyObject_GetAttr(local, name);
    uint64_t thread = PyThreadState_GetID(PyThreadState_Get());
    PyObject *dict = NULL;
    for (int i = 0; i < N_LOCAL_DICTS; i++)
        if (local_dicts[i].local == local && local_dicts[i].thread == thread) {
            dict = local_dicts[i].dict;
            break;
        }
    if (dict == NULL) {
        PyObject *d = PyObject_GetAttr(local, s___dict__);
        if (d == NULL)
            return NULL;
        if (!PyDict_CheckExact(d)) {
            Py_DECREF(d);
            return PyObject_GetAttr(local, name);
        }
        LocalDict *e = &local_dicts[local_dicts_next++ % N_LOCAL_DICTS];
        Py_INCREF(local);
        Py_XSETREF(e->local, local);
        e->thread = thread;
        Py_XSETREF(e->dict, d);
        dict = d;
    }
    PyObject *value = PyDict_GetItemWithError(dict, name);
    if (value == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_AttributeError, "'_thread._local' object has no attribute '%U'",
                         name);
        return NULL;
    }
    return Py_NewRef(value);
}

/* perf_counter_ns() as the recorder sees it: natively while it is time.perf_counter_ns (the
 * same clock CPython reads), else by calling it (otel_rl.testing's deterministic clock). */
static PyObject *
now(void)
{
    PyObject *clock = hot_global(G_CLOCK);
    if (clock == NULL)
        return NULL;
    if (clock == real_clock) {
        Py_DECREF(clock);
#if PY_VERSION_HEX >= 0x030D0000
        PyTime_t t;
        if (PyTime_PerfCounterRaw(&t) < 0)
            return NULL;
        return PyLong_FromLongLong((long long)t);
#elif defined(__linux__)
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
#else
        clock = real_clock;
        Py_INCREF(clock);
#endif
    }
    PyObject *result = PyObject_CallNoArgs(clock);
    Py_DECREF(clock);
    return result;
}

/* --- __init__(self, name, timer_stack=None, gpu=None) ------------------------------------ */

static PyObject *
timer_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames != NULL || nargs < 1 || nargs > 3)
        return call_pure(pure_init, self, args, nargs, kwnames);
    PyObject *name = args[0];
    if (set(self, T_NAME, name) < 0 || set(self, T_STACK, nargs > 1 ? args[1] : Py_None) < 0)
        return NULL;
    if (nargs > 2 && args[2] != Py_None) {  /* the one check GPU timing adds */
        PyObject *opt_in = global(s_gpu_opt_in);
        if (opt_in == NULL)
            return NULL;
        PyObject *r = PyObject_CallFunctionObjArgs(opt_in, self, name, args[2], NULL);
        Py_DECREF(opt_in);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

/* --- __enter__ ---------------------------------------------------------------------------- */

static PyObject *
enter(PyObject *self, int tallied)
{
    PyObject *st = NULL, *name = NULL, *frames = NULL, *last = NULL, *children = NULL;
    PyObject *node = NULL, *tr = NULL, *result = NULL;

    st = get(self, T_STACK);
    if (st == NULL)
        return NULL;
    if (st == Py_None) {
        Py_DECREF(st);
        PyObject *local = hot_global(G_LOCAL);
        if (local == NULL)
            return NULL;
        st = thread_attr(local, s_stack);
        Py_DECREF(local);
        if (st == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return NULL;
            PyErr_Clear();
            PyObject *lookup = global(s_thread_stack);
            if (lookup == NULL)
                return NULL;
            st = PyObject_CallNoArgs(lookup);
            Py_DECREF(lookup);
            if (st == NULL)
                return NULL;
        }
    }
    if ((name = get(self, T_NAME)) == NULL)
        goto done;
    /* The frames list is kept, not looked up again at exit (see recorder.py). */
    if ((frames = get(st, S_STACK)) == NULL || set(self, T_FRAMES, frames) < 0)
        goto done;
    if (PyList_CheckExact(frames) && PyList_GET_SIZE(frames) > 0) {
        last = PyList_GET_ITEM(frames, PyList_GET_SIZE(frames) - 1);
        Py_INCREF(last);
    }
    else if ((last = PySequence_GetItem(frames, -1)) == NULL)
        goto done;
    if ((children = get(last, N_CHILDREN)) == NULL)
        goto done;
    if (PyDict_CheckExact(children)) {
        node = PyDict_GetItemWithError(children, name);
        if (node == NULL && PyErr_Occurred())
            goto done;
        node = node == NULL ? Py_NewRef(Py_None) : Py_NewRef(node);
    }
    else if ((node = PyObject_CallMethodOneArg(children, s_get, name)) == NULL)
        goto done;
    if (node == Py_None) {
        Py_DECREF(node);
        PyObject *cls = global(s_TimerNode);
        if (cls == NULL) {
            node = NULL;
            goto done;
        }
        node = PyObject_CallOneArg(cls, name);
        Py_DECREF(cls);
        if (node == NULL || PyObject_SetItem(children, name, node) < 0)
            goto done;
    }
    if (PyList_CheckExact(frames)) {
        if (PyList_Append(frames, node) < 0)
            goto done;
    }
    else {
        PyObject *r = PyObject_CallMethodOneArg(frames, s_append, node);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    if (set(self, T_NODE, node) < 0 || (tr = get(st, S_TRACE)) == NULL)
        goto done;
    if (tr != Py_None) {
        if (set(self, T_ST, st) < 0)
            goto done;
        PyObject *top = get(st, S_TOP);
        if (top == NULL)
            goto done;
        int failed = set(self, T_UP, top) < 0;
        Py_DECREF(top);
        if (failed || set(st, S_TOP, self) < 0)
            goto done;
        PyObject *ids = hot_global(G_IDS);
        if (ids == NULL)
            goto done;
        PyObject *sid = PyIter_Next(ids);
        Py_DECREF(ids);
        if (sid == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetNone(PyExc_StopIteration);
            goto done;
        }
        if (tallied) {  /* tally[st.slot] = self._sid = next(_ids) */
            PyObject *tally = hot_global(G_TALLY), *slot = NULL;
            failed = tally == NULL || (slot = get(st, S_SLOT)) == NULL ||
                PyObject_SetItem(tally, slot, sid) < 0;
            Py_XDECREF(tally);
            Py_XDECREF(slot);
            if (failed) {
                Py_DECREF(sid);
                goto done;
            }
        }
        failed = set(self, T_SID, sid) < 0;
        Py_DECREF(sid);
        if (failed)
            goto done;
    }
    if (set(self, T_TR, tr) < 0)
        goto done;
    PyObject *start = now();
    if (start == NULL)
        goto done;
    int failed = set(self, T_START, start) < 0;
    Py_DECREF(start);
    if (!failed)
        result = Py_NewRef(node);
done:
    Py_XDECREF(st);
    Py_XDECREF(name);
    Py_XDECREF(frames);
    Py_XDECREF(last);
    Py_XDECREF(children);
    Py_XDECREF(node);
    Py_XDECREF(tr);
    return result;
}

static PyObject *
timer_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return enter(self, 0);
}

static PyObject *
timer_tallied_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return enter(self, 1);
}

/* --- __exit__ ----------------------------------------------------------------------------- */

/* node.total += (end - start) * 1e-9; node.count += 1 */
static int
add_time(PyObject *node, PyObject *start, PyObject *end)
{
    PyObject *elapsed = NULL, *total = NULL, *sum = NULL, *count = NULL;
    int ok = 0, native = 0;
    double seconds = 0.0;
    if (PyLong_CheckExact(start) && PyLong_CheckExact(end)) {
        /* PyLong_AsLong: on 64-bit Linux as wide, and faster on 3.10/3.11 */
        long long s = PyLong_AsLong(start), e = PyLong_AsLong(end);
        if ((s == -1 || e == -1) && PyErr_Occurred())  /* past 64 bits: as Python does */
            PyErr_Clear();
        else {
            seconds = (double)(e - s) * 1e-9;  /* float(end - start) * 1e-9, as Python */
            native = 1;
        }
    }
    if ((total = get(node, N_TOTAL)) == NULL)
        goto done;
    if (native && PyFloat_CheckExact(total))  /* the common case: no float for the elapsed */
        sum = PyFloat_FromDouble(PyFloat_AS_DOUBLE(total) + seconds);
    else {
        if (native)
            elapsed = PyFloat_FromDouble(seconds);
        else {
            PyObject *diff = PyNumber_Subtract(end, start);
            if (diff == NULL)
                goto done;
            elapsed = PyNumber_Multiply(diff, nano);
            Py_DECREF(diff);
        }
        if (elapsed == NULL)
            goto done;
        sum = PyNumber_InPlaceAdd(total, elapsed);
    }
    if (sum == NULL || set(node, N_TOTAL, sum) < 0)
        goto done;
    Py_CLEAR(sum);
    if ((count = get(node, N_COUNT)) == NULL || (sum = PyNumber_InPlaceAdd(count, one)) == NULL ||
        set(node, N_COUNT, sum) < 0)
        goto done;
    ok = 1;
done:
    Py_XDECREF(elapsed);
    Py_XDECREF(total);
    Py_XDECREF(sum);
    Py_XDECREF(count);
    return ok ? 0 : -1;
}

static int
pop_frame(PyObject *self)
{
    PyObject *frames = get(self, T_FRAMES);
    if (frames == NULL)
        return -1;
    int result;
    if (PyList_CheckExact(frames)) {
        Py_ssize_t n = PyList_GET_SIZE(frames);
        if (n == 0) {
            PyErr_SetString(PyExc_IndexError, "pop from empty list");
            result = -1;
        }
        else {
            /* list.pop() without shrinking the list's storage: a stack of blocks
             * grows and shrinks by one at every block. */
            PyObject *item = PyList_GET_ITEM(frames, n - 1);
            Py_SET_SIZE(frames, n - 1);
            Py_DECREF(item);
            result = 0;
        }
    }
    else {
        PyObject *r = PyObject_CallMethodNoArgs(frames, s_pop);
        result = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(frames);
    return result;
}

/* n < limit, for the recorder's global `which` (Python's comparison where it is not an int) */
static int
below(Py_ssize_t n, int which)
{
    PyObject *limit = hot_global(which);
    if (limit == NULL)
        return -1;
    int result;
    if (PyLong_CheckExact(limit)) {
        int overflow;
        long long c = PyLong_AsLongLongAndOverflow(limit, &overflow);
        result = overflow ? overflow > 0 : (c == -1 && PyErr_Occurred()) ? -1 : n < c;
    }
    else {
        PyObject *len = PyLong_FromSsize_t(n);
        result = len == NULL ? -1 : PyObject_RichCompareBool(len, limit, Py_LT);
        Py_XDECREF(len);
    }
    Py_DECREF(limit);
    return result;
}

/* After an append to a sink that held `held` records:
 * `if 0 < pack_at <= held and threading.get_ident() != full_skip: on_full(sink)` */
static int
after_append(PyObject *sink, Py_ssize_t held)
{
    int due = below(0, G_PACK_AT);  /* 0 (never) where nothing packs: one read a block */
    if (due <= 0)
        return due;
    if ((due = below(held, G_PACK_AT)) != 0)
        return due < 0 ? -1 : 0;
    PyObject *skip = hot_global(G_FULL_SKIP);
    if (skip == NULL)
        return -1;
    /* An int `arm` set; anything else (or out of range) is never this thread's ident. */
    unsigned long other = PyLong_AsUnsignedLong(skip);
    Py_DECREF(skip);
    if (other == (unsigned long)-1 && PyErr_Occurred())
        PyErr_Clear();
    else if (other == PyThread_get_thread_ident())  /* what threading.get_ident() says */
        return 0;
    PyObject *hook = hot_global(G_ON_FULL);
    if (hook == NULL)
        return -1;
    PyObject *r = PyObject_CallOneArg(hook, sink);
    Py_DECREF(hook);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Whether a record holds only ints, strs and None (no extra): such a tuple cannot be in a
 * reference cycle, and the collector would untrack it at its first pass; untracked now, it
 * costs no collector time while it waits in the buffer. */
static int
atomic(PyObject *record)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(record); i++) {
        PyObject *item = PyTuple_GET_ITEM(record, i);
        if (item != Py_None && !PyLong_CheckExact(item) && !PyUnicode_CheckExact(item))
            return 0;
    }
    return 1;
}

static PyObject *
timer_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames != NULL || nargs != 3)
        return call_pure(pure_exit, self, args, nargs, kwnames);
    PyObject *end = NULL, *start = NULL, *node = NULL, *tr = NULL, *st = NULL, *up = NULL;
    PyObject *record = NULL, *sink = NULL, *result = NULL;
    PyObject *item[8] = {NULL};

    if ((end = now()) == NULL || (start = get(self, T_START)) == NULL ||
        (node = get(self, T_NODE)) == NULL || add_time(node, start, end) < 0 ||
        pop_frame(self) < 0 || (tr = get(self, T_TR)) == NULL)
        goto done;
    if (tr == Py_None) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if ((st = get(self, T_ST)) == NULL || (up = get(self, T_UP)) == NULL ||
        set(st, S_TOP, up) < 0)
        goto done;
    /* (span_id, parent_span_id, name, start_ns, end_ns, thread_id, trace_id, extra) */
    if ((item[0] = get(self, T_SID)) == NULL)
        goto done;
    if (PyObject_TypeCheck(up, fields[T_SID].type))
        item[1] = get(up, T_SID);
    else
        item[1] = PyObject_GetAttr(up, fields[T_SID].name);
    if (item[1] == NULL || (item[2] = get(self, T_NAME)) == NULL)
        goto done;
    item[3] = Py_NewRef(start);
    item[4] = Py_NewRef(end);
    if ((item[5] = get(st, S_TID)) == NULL || (item[6] = get(tr, R_TRACE_ID)) == NULL)
        goto done;
    if (args[0] == Py_None)
        item[7] = Py_NewRef(Py_None);
    else {
        PyObject *extra = global(s_error_extra);
        if (extra == NULL)
            goto done;
        item[7] = PyObject_Vectorcall(extra, args, 3, NULL);
        Py_DECREF(extra);
        if (item[7] == NULL)
            goto done;
    }
    if ((record = PyTuple_New(8)) == NULL)
        goto done;
    for (int i = 0; i < 8; i++) {
        PyTuple_SET_ITEM(record, i, item[i]);
        item[i] = NULL;
    }
    if ((sink = get(tr, R_SINK)) == NULL)
        goto done;
    Py_ssize_t held = PyObject_Size(sink);
    int room = held < 0 ? -1 : below(held, G_BUFFER_CAP);
    if (room < 0)
        goto done;
    if (room) {
        if (atomic(record))
            PyObject_GC_UnTrack(record);
        if (PyList_CheckExact(sink)) {
            if (PyList_Append(sink, record) < 0)
                goto done;
        }
        else if ((PyObject *)Py_TYPE(sink) == deque_type) {  /* the export buffer */
            PyObject *args2[2] = {sink, record};
            PyObject *r = PyObject_Vectorcall(deque_append, args2, 2, NULL);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
        }
        else {
            PyObject *r = PyObject_CallMethodOneArg(sink, s_append, record);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
        }
        if (after_append(sink, held) < 0)
            goto done;
    }
    else {  /* st.dropped += 1 */
        PyObject *dropped = get(st, S_DROPPED), *more = NULL;
        int failed = dropped == NULL || (more = PyNumber_InPlaceAdd(dropped, one)) == NULL ||
            set(st, S_DROPPED, more) < 0;
        Py_XDECREF(dropped);
        Py_XDECREF(more);
        if (failed)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 8; i++)
        Py_XDECREF(item[i]);
    Py_XDECREF(end);
    Py_XDECREF(start);
    Py_XDECREF(node);
    Py_XDECREF(tr);
    Py_XDECREF(st);
    Py_XDECREF(up);
    Py_XDECREF(record);
    Py_XDECREF(sink);
    return result;
}

/* --- RLlib's timer glue (`rllib.py`) ------------------------------------------------------
 * `StatsBase.__enter__` / `__exit__` with an otel_rl block around RLlib's own, statement for
 * statement `rllib._patched_enter` / `_patched_exit`: the two Python frames they cost at every
 * RLlib timer block (thousands per iteration in each env runner) are what this saves. The
 * timer is made and entered through its class as it stands (the hot path compiled or not, a
 * tallied `__enter__`), the uncommon exits go to `rllib._end`, and failures to `rllib._fail`.
 */

/* What the glue of one stats class works with: a tuple the class holds as `_otel_rl_glue`
 * (found through the type, so each patched class, and its subclasses, has its own). */
enum {
    G_ENTER, G_EXIT,   /* RLlib's own */
    G_PURE_EXIT,       /* what calls the fast path does not cover go to */
    G_TIMER,           /* hierarchical_timer */
    G_OPEN,            /* rllib._open: .blocks, this thread's open (stats, timer) */
    G_ENDED,           /* rllib._ENDED */
    G_END, G_FAIL,     /* rllib._end, rllib._fail */
    N_GLUE
};
static PyObject *s_otel_rl_block, *s_blocks, *s___enter__, *s___exit__, *s_timer_start,
    *s_timer_end, *s_otel_rl_glue;
static PyObject *s___init__;
static PyMethodDef init_def, enter_def, tallied_enter_def, exit_def;

/* Whether `descr` (borrowed, may be NULL) is a method descriptor of `def`. */
static inline int
is_compiled(PyObject *descr, PyMethodDef *def)
{
    return descr != NULL && Py_IS_TYPE(descr, &PyMethodDescr_Type) &&
        ((PyMethodDescrObject *)descr)->d_method == def;
}

/* `timer_class(name)` then `timer.__enter__()`, the timer returned (a new reference) or NULL.
 * The class is called as any caller calls it (for `hierarchical_timer`, its `tp_vectorcall`
 * below); its `__enter__` is called directly where it is this module's (compiled, tallied or
 * not) and the object has no instance dict that could hold another. */
static PyObject *
timer_open(PyObject *timer_class, PyObject *name)
{
    PyObject *timer = PyObject_CallOneArg(timer_class, name);
    if (timer == NULL)
        return NULL;
    PyTypeObject *tt = Py_TYPE(timer);
    PyObject *r;
    PyObject *descr = tt->tp_dictoffset == 0 ? _PyType_Lookup(tt, s___enter__) : NULL;
    if (is_compiled(descr, &tallied_enter_def))
        r = enter(timer, 1);
    else if (is_compiled(descr, &enter_def))
        r = enter(timer, 0);
    else
        r = PyObject_CallMethodNoArgs(timer, s___enter__);
    if (r == NULL) {
        Py_DECREF(timer);
        return NULL;
    }
    Py_DECREF(r);
    return timer;
}

/* `timer.__exit__(*args)` (3 arguments), directly where it is this module's. */
static PyObject *
timer_close(PyObject *timer, PyObject *const *args)
{
    PyTypeObject *tt = Py_TYPE(timer);
    if (tt->tp_dictoffset == 0 && is_compiled(_PyType_Lookup(tt, s___exit__), &exit_def))
        return timer_exit(timer, args, 3, NULL);
    PyObject *call[4] = {timer, args[0], args[1], args[2]};
    return PyObject_VectorcallMethod(s___exit__, call, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}


/* The glue tuple of `self`'s class, borrowed; NULL with an exception if it has none. */
static PyObject *
glue_of(PyObject *self)
{
    PyObject *g = _PyType_Lookup(Py_TYPE(self), s_otel_rl_glue);
    if (g == NULL || !PyTuple_CheckExact(g) || PyTuple_GET_SIZE(g) != N_GLUE) {
        PyErr_Format(PyExc_TypeError, "%R has no otel_rl RLlib glue", (PyObject *)Py_TYPE(self));
        return NULL;
    }
    return g;
}
#define GLUE(g, which) PyTuple_GET_ITEM(g, which)

/* `except AttributeError: <quiet>` / `except Exception as exc: _fail(where, exc)`; other
 * exceptions stay raised (-1). */
static int
glue_failed(PyObject *g, PyObject *where, int quiet_attribute_error)
{
    if (quiet_attribute_error && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = PyObject_CallFunctionObjArgs(GLUE(g, G_FAIL), where, value ? value : Py_None,
                                               NULL);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* The block of `self` opened and pushed on this thread's list; 0, or -1 with an exception. */
static int
glue_open(PyObject *g, PyObject *self, PyObject *name)
{
    PyObject *timer = timer_open(GLUE(g, G_TIMER), name);
    if (timer == NULL)
        return -1;
    PyObject *pair = PyTuple_Pack(2, self, timer);
    Py_DECREF(timer);
    if (pair == NULL)
        return -1;
    int failed;
    PyObject *blocks = thread_attr(GLUE(g, G_OPEN), s_blocks);
    if (blocks == NULL) {  /* `except AttributeError: local.blocks = [(self, timer)]` */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            Py_DECREF(pair);
            return -1;
        }
        PyErr_Clear();
        blocks = PyList_New(1);
        if (blocks == NULL) {
            Py_DECREF(pair);
            return -1;
        }
        PyList_SET_ITEM(blocks, 0, pair);
        failed = PyObject_SetAttr(GLUE(g, G_OPEN), s_blocks, blocks) < 0;
        Py_DECREF(blocks);
        return failed ? -1 : 0;
    }
    if (PyList_CheckExact(blocks))
        failed = PyList_Append(blocks, pair) < 0;
    else {
        PyObject *r2 = PyObject_CallMethodOneArg(blocks, s_append, pair);
        failed = r2 == NULL;
        Py_XDECREF(r2);
    }
    Py_DECREF(blocks);
    Py_DECREF(pair);
    return failed ? -1 : 0;
}

static PyObject *
glue_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *g = glue_of(self);
    if (g == NULL)
        return NULL;
    Py_INCREF(g);  /* the class's attribute could be replaced meanwhile */
    PyObject *result = NULL;
    PyObject *name = PyObject_GetAttr(self, s_otel_rl_block);  /* the class's None unless named */
    if (name == NULL)
        goto done;
    if (name != Py_None && glue_open(g, self, name) < 0 &&
        glue_failed(g, s_timer_start, 0) < 0) {
        Py_DECREF(name);
        goto done;
    }
    Py_DECREF(name);
    result = PyObject_CallOneArg(GLUE(g, G_ENTER), self);
done:
    Py_DECREF(g);
    return result;
}

/* Element `i` of the list `blocks` is a pair whose first item is `owner`. */
static inline int
pair_owned_by(PyObject *blocks, Py_ssize_t i, PyObject *owner)
{
    PyObject *pair = PyList_GET_ITEM(blocks, i);
    return PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 &&
        PyTuple_GET_ITEM(pair, 0) == owner;
}

/* The `finally:` of `_patched_exit`: this thread's innermost block ends if it is `self`'s,
 * else `_end` sorts it out. 0, or -1 with an exception. */
static int
glue_close(PyObject *g, PyObject *self, PyObject *const *args)
{
    PyObject *blocks = thread_attr(GLUE(g, G_OPEN), s_blocks);
    if (blocks == NULL)
        return -1;
    int result = 0;
    Py_ssize_t n = PyList_CheckExact(blocks) ? PyList_GET_SIZE(blocks) : -1;
    if (n == 0)
        goto done;
    if (n > 0 && pair_owned_by(blocks, n - 1, self) &&
        (n == 1 || !pair_owned_by(blocks, n - 2, GLUE(g, G_ENDED)))) {
        /* blocks.pop(); last[1].__exit__(exc_type, exc_value, tb) */
        PyObject *pair = PyList_GET_ITEM(blocks, n - 1);
        Py_INCREF(pair);
        if (PyList_SetSlice(blocks, n - 1, n, NULL) < 0) {
            Py_DECREF(pair);
            result = -1;
            goto done;
        }
        PyObject *r = timer_close(PyTuple_GET_ITEM(pair, 1), args);
        Py_DECREF(pair);
        if (r == NULL)
            result = -1;
        Py_XDECREF(r);
        goto done;
    }
    if (n < 0) {  /* not a list (never made so here): `if blocks:` as Python would */
        int truth = PyObject_IsTrue(blocks);
        if (truth <= 0) {
            result = truth;
            goto done;
        }
    }
    PyObject *exc_info = PyTuple_Pack(3, args[0], args[1], args[2]);
    if (exc_info == NULL) {
        result = -1;
        goto done;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(GLUE(g, G_END), self, blocks, exc_info, NULL);
    Py_DECREF(exc_info);
    if (r == NULL)
        result = -1;
    Py_XDECREF(r);
done:
    Py_DECREF(blocks);
    return result;
}

static PyObject *
glue_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *g = glue_of(self);
    if (g == NULL)
        return NULL;
    Py_INCREF(g);
    PyObject *result;
    if (kwnames != NULL || nargs != 3) {
        result = call_pure(GLUE(g, G_PURE_EXIT), self, args, nargs, kwnames);
        Py_DECREF(g);
        return result;
    }
    PyObject *call[4] = {self, args[0], args[1], args[2]};
    result = PyObject_Vectorcall(GLUE(g, G_EXIT), call, 4, NULL);
    /* finally: what RLlib's __exit__ raised stays raised, unless the glue raises past its
     * own `except` clauses (as in Python, where that exception would replace it) */
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (result == NULL)
        PyErr_Fetch(&type, &value, &tb);
    if (glue_close(g, self, args) < 0 && glue_failed(g, s_timer_end, 1) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_XDECREF(result);
        result = NULL;
    }
    else if (result == NULL)
        PyErr_Restore(type, value, tb);
    Py_DECREF(g);
    return result;
}

static PyMethodDef glue_enter_def = {
    "__enter__", (PyCFunction)glue_enter, METH_NOARGS,
    "__enter__($self, /)\n--\n\nRLlib's `StatsBase.__enter__` in an otel_rl block (compiled)."};
static PyMethodDef glue_exit_def = {
    "__exit__", (PyCFunction)(void (*)(void))glue_exit, METH_FASTCALL | METH_KEYWORDS,
    "__exit__($self, exc_type, exc_value, tb)\n--\n\n"
    "RLlib's `StatsBase.__exit__`, then the end of its otel_rl block (compiled)."};

/* `(a, b)` from two new references (either may be NULL: the error stands), both released. */
static PyObject *
new_pair(PyObject *a, PyObject *b)
{
    PyObject *pair = a && b ? PyTuple_Pack(2, a, b) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return pair;
}

static PyObject *
install_rllib(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *cls, *enter, *exit_fn, *pure_exit, *timer, *local, *ended, *end, *fail;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOO:install_rllib", &PyType_Type, &cls, &enter,
                          &exit_fn, &pure_exit, &timer, &local, &ended, &end, &fail))
        return NULL;
    PyObject *g = PyTuple_Pack(N_GLUE, enter, exit_fn, pure_exit, timer, local, ended, end, fail);
    if (g == NULL)
        return NULL;
    int failed = PyObject_SetAttr(cls, s_otel_rl_glue, g) < 0;
    Py_DECREF(g);
    if (failed)
        return NULL;
    PyObject *c_enter = PyDescr_NewMethod((PyTypeObject *)cls, &glue_enter_def);
    PyObject *c_exit = PyDescr_NewMethod((PyTypeObject *)cls, &glue_exit_def);
    return new_pair(c_enter, c_exit);
}

/* --- RLlib's own timer methods, compiled (`rllib.py`, `_patch_ema`) ------------------------
 * RLlib 2.60's `StatsBase.__enter__` / `__exit__` and, for a float pushed into an `EmaStats`
 * (every `log_time` timer: its default reduce is "ema"), `EmaStats.push` with its two
 * `safe_isnan`s, statement for statement. RLlib's Python block costs ~1.9 us, 1.5 us of it the
 * push (two numpy `isnan`s on a Python float, `torch.is_tensor`, three frames); this is what
 * the glue above calls as "RLlib's own" where `rllib.py` found those four functions' sources to
 * be the ones written here. Whatever it does not cover is handed, before anything changes, to
 * RLlib's own function: keyword arguments, a start that is None (the `assert`, whatever `-O`
 * makes of it), a `push` that is not `EmaStats.push`, a value or `_value` or `_ema_coeff` that
 * is not exactly a float, an ema.py `tf` or `safe_isnan` other than the ones seen at install. `threading.get_ident` and
 * `time.perf_counter` are looked up in base.py's namespace at every call, as RLlib's code does.
 */
enum {
    F_GLOBALS,      /* base.py's module dict */
    F_EMA_GLOBALS,  /* ema.py's module dict */
    F_EMA_PUSH,     /* EmaStats.push */
    F_ENTER, F_EXIT,  /* StatsBase.__enter__, __exit__ (Python) */
    F_TF,           /* ema.py's `tf` when it was false (RLlib's stub where TF is absent) */
    F_SAFE_ISNAN,   /* ema.py's `safe_isnan` at install */
    N_FUSED
};
static PyObject *s_threading, *s_get_ident, *s_time, *s_perf_counter, *s_start_times, *s_push,
    *s_value, *s_ema_coeff, *s_tf, *s_safe_isnan;

/* `module.attr()` for the global `module` of `globals`; NULL with an exception, or with none
 * where `module` is not a global there (the caller hands the call to RLlib's function). */
static PyObject *
call_global(PyObject *globals, PyObject *module, PyObject *attr)
{
    PyObject *m = PyDict_GetItemWithError(globals, module);
    if (m == NULL)
        return NULL;
    Py_INCREF(m);
    PyObject *f = PyObject_GetAttr(m, attr);
    Py_DECREF(m);
    if (f == NULL)
        return NULL;
    PyObject *r = PyObject_CallNoArgs(f);
    Py_DECREF(f);
    return r;
}

static PyObject *
stats_enter(PyObject *fused, PyObject *self)
{
    PyObject *globals = PyTuple_GET_ITEM(fused, F_GLOBALS);
    PyObject *tid = call_global(globals, s_threading, s_get_ident);
    if (tid == NULL)
        return PyErr_Occurred() ? NULL
            : PyObject_Vectorcall(PyTuple_GET_ITEM(fused, F_ENTER), &self, 1, NULL);
    /* self._start_times[thread_id] = time.perf_counter()  (the value first, as Python) */
    PyObject *now = call_global(globals, s_time, s_perf_counter);
    if (now == NULL) {
        Py_DECREF(tid);
        return PyErr_Occurred() ? NULL
            : PyObject_Vectorcall(PyTuple_GET_ITEM(fused, F_ENTER), &self, 1, NULL);
    }
    PyObject *starts = PyObject_GetAttr(self, s_start_times);
    int failed = starts == NULL || PyObject_SetItem(starts, tid, now) < 0;
    Py_XDECREF(starts);
    Py_DECREF(now);
    Py_DECREF(tid);
    return failed ? NULL : Py_NewRef(self);
}

/* `EmaStats.push(self, value)` for `value` a float; 1 done, 0 not covered (nothing changed),
 * -1 with an exception. */
static int
ema_push(PyObject *fused, PyObject *self, PyObject *value)
{
    /* if tf and tf.is_tensor(value): ...  (false while `tf` is the object found false at
     * install; anything else there, or another `safe_isnan`, stays RLlib's to judge) */
    PyObject *ema_globals = PyTuple_GET_ITEM(fused, F_EMA_GLOBALS);
    PyObject *tf = PyDict_GetItemWithError(ema_globals, s_tf);
    if (tf == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (tf != PyTuple_GET_ITEM(fused, F_TF))
        return 0;
    PyObject *isnan_fn = PyDict_GetItemWithError(ema_globals, s_safe_isnan);
    if (isnan_fn == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (isnan_fn != PyTuple_GET_ITEM(fused, F_SAFE_ISNAN))
        return 0;
    /* if safe_isnan(value): return  (torch.is_tensor(float) is False; numpy's isnan) */
    double v = PyFloat_AS_DOUBLE(value);
    if (isnan(v))
        return 1;
    /* torch and isinstance(value, torch.Tensor): never for a float */
    PyObject *old = PyObject_GetAttr(self, s_value);
    if (old == NULL)
        return -1;
    if (!PyFloat_CheckExact(old)) {
        Py_DECREF(old);
        return 0;
    }
    double x = PyFloat_AS_DOUBLE(old);
    Py_DECREF(old);
    if (isnan(x))  /* self._value = value */
        return PyObject_SetAttr(self, s_value, value) < 0 ? -1 : 1;
    /* self._value = self._ema_coeff * value + (1.0 - self._ema_coeff) * self._value, each
     * operation rounded as Python rounds it (volatile: no fused multiply-add) */
    PyObject *coeff = PyObject_GetAttr(self, s_ema_coeff);
    if (coeff == NULL)
        return -1;
    if (!PyFloat_CheckExact(coeff)) {
        Py_DECREF(coeff);
        return 0;
    }
    double c = PyFloat_AS_DOUBLE(coeff);
    Py_DECREF(coeff);
    volatile double a = c * v;
    volatile double b = 1.0 - c;
    volatile double d = b * x;
    PyObject *ema = PyFloat_FromDouble(a + d);
    if (ema == NULL)
        return -1;
    int failed = PyObject_SetAttr(self, s_value, ema) < 0;
    Py_DECREF(ema);
    return failed ? -1 : 1;
}

static PyObject *
stats_exit(PyObject *fused, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *own = PyTuple_GET_ITEM(fused, F_EXIT);
    if (kwnames != NULL || nargs != 4)
        return PyObject_Vectorcall(own, args, nargs, kwnames);
    PyObject *self = args[0], *globals = PyTuple_GET_ITEM(fused, F_GLOBALS);
    PyObject *result = NULL, *starts = NULL, *start = NULL, *now = NULL, *delta = NULL,
        *push = NULL;
    PyObject *tid = call_global(globals, s_threading, s_get_ident);
    if (tid == NULL)
        return PyErr_Occurred() ? NULL : PyObject_Vectorcall(own, args, nargs, NULL);
    /* assert self._start_times[thread_id] is not None */
    if ((starts = PyObject_GetAttr(self, s_start_times)) == NULL ||
        (start = PyObject_GetItem(starts, tid)) == NULL)
        goto done;
    if (start == Py_None) {
        result = PyObject_Vectorcall(own, args, nargs, NULL);
        goto done;
    }
    /* time_delta_s = time.perf_counter() - self._start_times[thread_id] */
    if ((now = call_global(globals, s_time, s_perf_counter)) == NULL) {
        if (!PyErr_Occurred())
            result = PyObject_Vectorcall(own, args, nargs, NULL);
        goto done;
    }
    if ((delta = PyNumber_Subtract(now, start)) == NULL)
        goto done;
    /* self.push(time_delta_s) */
    if ((push = PyObject_GetAttr(self, s_push)) == NULL)
        goto done;
    int pushed = 0;
    if (PyFloat_CheckExact(delta) && PyMethod_Check(push) &&
        PyMethod_GET_FUNCTION(push) == PyTuple_GET_ITEM(fused, F_EMA_PUSH) &&
        PyMethod_GET_SELF(push) == self)
        pushed = ema_push(fused, self, delta);
    if (pushed == 0) {
        PyObject *r = PyObject_CallOneArg(push, delta);
        pushed = r == NULL ? -1 : 1;
        Py_XDECREF(r);
    }
    if (pushed < 0)
        goto done;
    /* del self._start_times[thread_id] */
    Py_SETREF(starts, PyObject_GetAttr(self, s_start_times));
    if (starts != NULL && PyObject_DelItem(starts, tid) == 0)
        result = Py_NewRef(Py_None);
done:
    Py_XDECREF(push);
    Py_XDECREF(delta);
    Py_XDECREF(now);
    Py_XDECREF(start);
    Py_XDECREF(starts);
    Py_DECREF(tid);
    return result;
}

static PyMethodDef stats_enter_def = {
    "__enter__", (PyCFunction)stats_enter, METH_O,
    "__enter__($self, /)\n--\n\nRLlib 2.60's `StatsBase.__enter__` (compiled)."};
static PyMethodDef stats_exit_def = {
    "__exit__", (PyCFunction)(void (*)(void))stats_exit, METH_FASTCALL | METH_KEYWORDS,
    "__exit__($self, exc_type, exc_value, tb)\n--\n\n"
    "RLlib 2.60's `StatsBase.__exit__`, an `EmaStats`' push included (compiled)."};

static PyObject *
rllib_stats(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *globals, *ema_globals, *push, *enter, *exit_fn, *tf, *safe_isnan;
    if (!PyArg_ParseTuple(args, "O!O!OOOOO:rllib_stats", &PyDict_Type, &globals, &PyDict_Type,
                          &ema_globals, &push, &enter, &exit_fn, &tf, &safe_isnan))
        return NULL;
    PyObject *fused = PyTuple_Pack(N_FUSED, globals, ema_globals, push, enter, exit_fn, tf,
                                   safe_isnan);
    if (fused == NULL)
        return NULL;
    PyObject *c_enter = PyCFunction_New(&stats_enter_def, fused);
    PyObject *c_exit = PyCFunction_New(&stats_exit_def, fused);
    Py_DECREF(fused);
    return new_pair(c_enter, c_exit);
}

/* --- RLlib's `MetricsLogger.log_time`, compiled (`rllib.py`, `_patch_logger`) --------------
 * RLlib 2.60's `log_time(self, key)` for a key the logger already holds: there
 * `_maybe_create_stats_object` (under `self._threading_lock`, RLlib's no-op `_DummyRLock`) finds
 * it with `_key_in_stats` and creates nothing, and `_get_key` returns it, each flattening the key
 * with `force_tuple(tree.flatten(key))` and walking `self.stats` (~2 us, seven Python frames;
 * every RLlib timer block starts with one). Here a key that is a str or a non-empty tuple of
 * strs (what `tree.flatten` and `force_tuple` leave as they are) is walked once through
 * `self.stats` and returned. Everything else goes to RLlib's own `log_time`, before anything
 * changes: keyword arguments, a key not held yet (RLlib creates its stats object), another kind
 * of key, a level that is not exactly a dict, a lock that is not a `_DummyRLock` whose
 * `__enter__`/`__exit__` are the ones seen at install, and a logger whose
 * `_maybe_create_stats_object`, `_key_in_stats` or `_get_key`, or a metrics_logger.py whose
 * `tree`, `tree.flatten` or `force_tuple`, are not the ones seen at install (looked up at every
 * call, as RLlib's code does). */
enum {
    LT_OWN,         /* MetricsLogger.log_time (Python) */
    LT_GLOBALS,     /* metrics_logger.py's module dict */
    LT_TREE, LT_FLATTEN, LT_FORCE_TUPLE,  /* `tree`, `tree.flatten`, `force_tuple` there */
    LT_MAYBE, LT_KEY_IN, LT_GET_KEY,      /* the three MetricsLogger methods log_time calls */
    LT_LOCK, LT_LOCK_ENTER, LT_LOCK_EXIT,  /* _DummyRLock, its __enter__ and __exit__ */
    N_LOG_TIME
};
static PyObject *s_otel_rl_log_time, *s_tree, *s_flatten, *s_force_tuple,
    *s_maybe_create_stats_object, *s_key_in_stats, *s_get_key, *s_threading_lock, *s_stats;

/* Whether `self.name` is the function `f` bound to `self`: found on its type, not shadowed by
 * an instance attribute; 0 also where looking it up raised (the caller hands the call on). */
static int
bound_to(PyObject *self, PyObject *name, PyObject *f)
{
    PyObject *m = NULL;
#if PY_VERSION_HEX < 0x030D0000
    int unbound = _PyObject_GetMethod(self, name, &m);
#else
    int unbound = 0;
    m = PyObject_GetAttr(self, name);
#endif
    if (m == NULL) {
        PyErr_Clear();
        return 0;
    }
    int same = unbound ? m == f
        : PyMethod_Check(m) && PyMethod_GET_FUNCTION(m) == f && PyMethod_GET_SELF(m) == self;
    Py_DECREF(m);
    return same;
}

/* Whether metrics_logger.py's global `name` is `expected` (0 also where it is gone). */
static inline int
global_is(PyObject *globals, PyObject *name, PyObject *expected)
{
    PyObject *v = PyDict_GetItemWithError(globals, name);
    if (v == NULL)
        PyErr_Clear();
    return v == expected;
}

/* The stats object `self` holds under `key` (a new reference), or NULL with no exception where
 * the fast path does not cover the call. */
static PyObject *
held_stats(PyObject *lt, PyObject *self, PyObject *key)
{
#define LT(which) PyTuple_GET_ITEM(lt, which)
    PyObject *const *parts;
    Py_ssize_t n;
    if (PyUnicode_CheckExact(key)) {
        parts = &key;
        n = 1;
    }
    else if (PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) > 0) {
        parts = &PyTuple_GET_ITEM(key, 0);
        n = PyTuple_GET_SIZE(key);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!PyUnicode_CheckExact(parts[i]))
                return NULL;
    }
    else
        return NULL;
    PyObject *globals = LT(LT_GLOBALS);
    if (!global_is(globals, s_tree, LT(LT_TREE)) ||
        !global_is(globals, s_force_tuple, LT(LT_FORCE_TUPLE)))
        return NULL;
    PyObject *flatten = PyObject_GetAttr(LT(LT_TREE), s_flatten);
    if (flatten == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_DECREF(flatten);  /* only its identity is read: the module still holds it */
    if (flatten != LT(LT_FLATTEN) ||
        !bound_to(self, s_maybe_create_stats_object, LT(LT_MAYBE)) ||
        !bound_to(self, s_key_in_stats, LT(LT_KEY_IN)) ||
        !bound_to(self, s_get_key, LT(LT_GET_KEY)))
        return NULL;
    /* with self._threading_lock: (a _DummyRLock: its __enter__ and __exit__ do nothing) */
    PyObject *lock = PyObject_GetAttr(self, s_threading_lock);
    if (lock == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyTypeObject *lt_type = Py_TYPE(lock);
    Py_DECREF(lock);
    if ((PyObject *)lt_type != LT(LT_LOCK) ||
        _PyType_Lookup(lt_type, s___enter__) != LT(LT_LOCK_ENTER) ||
        _PyType_Lookup(lt_type, s___exit__) != LT(LT_LOCK_EXIT))
        return NULL;
    /* _key_in_stats(key) and _get_key(key): `_dict = _dict[part]` for each part */
    PyObject *level = PyObject_GetAttr(self, s_stats);
    if (level == NULL) {
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *next = PyDict_CheckExact(level) ? PyDict_GetItemWithError(level, parts[i])
            : NULL;
        Py_XINCREF(next);
        Py_DECREF(level);
        if (next == NULL) {  /* not held (RLlib creates it), or not a dict there */
            PyErr_Clear();
            return NULL;
        }
        level = next;
    }
    return level;
#undef LT
}

static PyObject *
log_time(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *lt = _PyType_Lookup(Py_TYPE(self), s_otel_rl_log_time);
    if (lt == NULL || !PyTuple_CheckExact(lt) || PyTuple_GET_SIZE(lt) != N_LOG_TIME) {
        PyErr_Format(PyExc_TypeError, "%R has no otel_rl log_time", (PyObject *)Py_TYPE(self));
        return NULL;
    }
    Py_INCREF(lt);  /* the class's attribute could be replaced meanwhile */
    PyObject *result = kwnames == NULL && nargs == 1 ? held_stats(lt, self, args[0]) : NULL;
    if (result == NULL)
        result = call_pure(PyTuple_GET_ITEM(lt, LT_OWN), self, args, nargs, kwnames);
    Py_DECREF(lt);
    return result;
}

static PyMethodDef log_time_def = {
    "log_time", (PyCFunction)(void (*)(void))log_time, METH_FASTCALL | METH_KEYWORDS,
    "log_time($self, key, **kwargs)\n--\n\n"
    "RLlib 2.60's `MetricsLogger.log_time` for a key it holds (compiled)."};

static PyObject *
rllib_log_time(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *cls, *own, *globals, *tree, *flatten, *force_tuple, *maybe, *key_in, *get_key,
        *lock, *lock_enter, *lock_exit;
    if (!PyArg_ParseTuple(args, "O!OO!OOOOOOO!OO:rllib_log_time", &PyType_Type, &cls, &own,
                          &PyDict_Type, &globals, &tree, &flatten, &force_tuple, &maybe,
                          &key_in, &get_key, &PyType_Type, &lock, &lock_enter, &lock_exit))
        return NULL;
    PyObject *lt = PyTuple_Pack(N_LOG_TIME, own, globals, tree, flatten, force_tuple, maybe,
                                key_in, get_key, lock, lock_enter, lock_exit);
    if (lt == NULL)
        return NULL;
    int failed = PyObject_SetAttr(cls, s_otel_rl_log_time, lt) < 0;
    Py_DECREF(lt);
    return failed ? NULL : PyDescr_NewMethod((PyTypeObject *)cls, &log_time_def);
}

/* --- install ------------------------------------------------------------------------------ */

static PyMethodDef init_def = {
    "__init__", (PyCFunction)(void (*)(void))timer_init, METH_FASTCALL | METH_KEYWORDS,
    "__init__($self, name, timer_stack=None, gpu=None)\n--\n\n"
    "The compiled `hierarchical_timer.__init__`."};
static PyMethodDef enter_def = {
    "__enter__", (PyCFunction)timer_enter, METH_NOARGS,
    "__enter__($self, /)\n--\n\nThe compiled `hierarchical_timer.__enter__`."};
static PyMethodDef tallied_enter_def = {
    "__enter__", (PyCFunction)timer_tallied_enter, METH_NOARGS,
    "__enter__($self, /)\n--\n\nThe compiled `_tallied_enter`."};
static PyMethodDef exit_def = {
    "__exit__", (PyCFunction)(void (*)(void))timer_exit, METH_FASTCALL | METH_KEYWORDS,
    "__exit__($self, exc_type, exc, tb)\n--\n\nThe compiled `hierarchical_timer.__exit__`."};

static int
find_field(int which, PyObject *cls, int subclasses)
{
    PyObject *name = PyUnicode_InternFromString(field_names[which]);
    if (name == NULL)
        return -1;
    PyObject *descr = PyObject_GetAttr(cls, name);
    if (descr == NULL) {
        Py_DECREF(name);
        return -1;
    }
    int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type);
    if (ok) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        ok = member->type == Py_T_OBJECT_EX && !(member->flags & Py_READONLY);
        fields[which].offset = member->offset;
    }
    Py_DECREF(descr);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%R.%U is not a writable slot", cls, name);
        Py_DECREF(name);
        return -1;
    }
    Py_XSETREF(fields[which].name, name);
    Py_INCREF(cls);
    Py_XSETREF(fields[which].type, (PyTypeObject *)cls);
    fields[which].subclasses = subclasses;
    return 0;
}

/* `hierarchical_timer(name, ...)` (the class called): where the class, as it stands, runs
 * this module's `__init__` and makes its objects with `object.__new__`, the object is
 * allocated and `__init__`ed here (what `type.__call__` does, without its argument tuple and
 * `slot_tp_init`'s lookup and call); anything else (keyword arguments, another `__init__` or
 * `__new__`, the pure path) goes to `type.__call__` itself. Set as the class's
 * `tp_vectorcall` at `install`: CPython calls it for every `hierarchical_timer(...)` (a
 * subclass does not inherit it). */
static PyObject *
timer_class_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *
timer_class_call_general(PyObject *callable, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    PyObject *tuple = PyTuple_New(nargs);
    if (tuple == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    PyObject *kwargs = NULL;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        if ((kwargs = PyDict_New()) == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                Py_DECREF(tuple);
                Py_DECREF(kwargs);
                return NULL;
            }
    }
    PyObject *result = PyType_Type.tp_call(callable, tuple, kwargs);
    Py_DECREF(tuple);
    Py_XDECREF(kwargs);
    return result;
}

static PyObject *
timer_class_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyTypeObject *tt = (PyTypeObject *)callable;
    if (kwnames == NULL && nargs >= 1 && nargs <= 3 && tt->tp_new == PyBaseObject_Type.tp_new &&
        !(tt->tp_flags & Py_TPFLAGS_IS_ABSTRACT) &&
        is_compiled(_PyType_Lookup(tt, s___init__), &init_def)) {
        PyObject *timer = tt->tp_alloc(tt, 0);
        if (timer == NULL)
            return NULL;
        PyObject *r = timer_init(timer, args, nargs, NULL);
        if (r == NULL) {
            Py_DECREF(timer);
            return NULL;
        }
        Py_DECREF(r);  /* None: the fast path's only result */
        return timer;
    }
    return timer_class_call_general(callable, args, nargs, kwnames);
}

static PyObject *
install(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *timer, *stack, *node, *trace, *namespace, *init, *enter_fn, *tallied, *exit_fn;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OOOO:install", &PyType_Type, &timer, &PyType_Type,
                          &stack, &PyType_Type, &node, &PyType_Type, &trace, &PyDict_Type,
                          &namespace, &init, &enter_fn, &tallied, &exit_fn))
        return NULL;
    PyObject *classes[N_FIELDS];
    for (int i = 0; i < N_FIELDS; i++)
        classes[i] = i <= T_UP ? timer : i <= S_SLOT ? stack : i <= N_COUNT ? node : trace;
    for (int i = 0; i < N_FIELDS; i++)
        if (find_field(i, classes[i], i <= T_UP) < 0)
            return NULL;
    if (watch_namespace(namespace) < 0)
        return NULL;
    Py_INCREF(namespace);
    Py_XSETREF(ns, namespace);
    cache_valid = 0;
    Py_INCREF(init);
    Py_XSETREF(pure_init, init);
    Py_INCREF(exit_fn);
    Py_XSETREF(pure_exit, exit_fn);
    PyTypeObject *type = (PyTypeObject *)timer;
    type->tp_vectorcall = timer_class_call;
    PyObject *c_init = PyDescr_NewMethod(type, &init_def);
    PyObject *c_enter = PyDescr_NewMethod(type, &enter_def);
    PyObject *c_tallied = PyDescr_NewMethod(type, &tallied_enter_def);
    PyObject *c_exit = PyDescr_NewMethod(type, &exit_def);
    PyObject *result = NULL;
    if (c_init && c_enter && c_tallied && c_exit)
        result = Py_BuildValue("{OOOOOOOO}", init, c_init, enter_fn, c_enter, tallied, c_tallied,
                               exit_fn, c_exit);
    Py_XDECREF(c_init);
    Py_XDECREF(c_enter);
    Py_XDECREF(c_tallied);
    Py_XDECREF(c_exit);
    return result;
}

static PyMethodDef module_methods[] = {
    {"install", install, METH_VARARGS,
     "install(timer, stack, node, trace, namespace, init, enter, tallied_enter, exit, /)\n--\n\n"
     "The compiled versions of the four pure functions, as {pure: compiled}, for the recorder's\n"
     "classes and globals."},
    {"install_rllib", install_rllib, METH_VARARGS,
     "install_rllib(stats, enter, exit, pure_exit, timer, local, ended, end, fail, /)\n--\n\n"
     "The compiled `__enter__` and `__exit__` of RLlib's stats class `stats` (rllib.py's glue\n"
     "around RLlib's own `enter` and `exit`), as a pair of its method descriptors."},
    {"rllib_stats", rllib_stats, METH_VARARGS,
     "rllib_stats(base_globals, ema_globals, ema_push, enter, exit, tf, safe_isnan, /)\n--\n\n"
     "RLlib 2.60's own `StatsBase.__enter__` and `__exit__` (`EmaStats.push` inlined), compiled,\n"
     "as a pair of functions of the stats object; what they do not cover goes to `enter`/`exit`."},
    {"rllib_log_time", rllib_log_time, METH_VARARGS,
     "rllib_log_time(logger, own, globals, tree, flatten, force_tuple, maybe_create,\n"
     "               key_in_stats, get_key, lock, lock_enter, lock_exit, /)\n--\n\n"
     "RLlib 2.60's `MetricsLogger.log_time` for a key the logger holds, compiled, as a method\n"
     "descriptor of the class `logger`; every other call goes to `own`."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hotpath", "otel_rl's optional compiled hot path (see recorder.py).",
    -1, module_methods};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    INTERN(s_local, "_local");
    INTERN(s_thread_stack, "thread_stack");
    INTERN(s_TimerNode, "TimerNode");
    INTERN(s_ids, "_ids");
    INTERN(s_tally, "tally");
    INTERN(s_clock, "perf_counter_ns");
    INTERN(s_buffer_cap, "buffer_cap");
    INTERN(s_pack_at, "pack_at");
    INTERN(s_on_full, "on_full");
    INTERN(s_full_skip, "full_skip");
    INTERN(s_error_extra, "_error_extra");
    INTERN(s_gpu_opt_in, "_gpu_opt_in");
    INTERN(s_stack, "stack");
    INTERN(s_append, "append");
    INTERN(s_get, "get");
    INTERN(s_pop, "pop");
    INTERN(s_otel_rl_block, "_otel_rl_block");
    INTERN(s_blocks, "blocks");
    INTERN(s___enter__, "__enter__");
    INTERN(s___exit__, "__exit__");
    INTERN(s_timer_start, "timer start");
    INTERN(s_timer_end, "timer end");
    INTERN(s_otel_rl_glue, "_otel_rl_glue");
    INTERN(s___dict__, "__dict__");
    INTERN(s___init__, "__init__");
    INTERN(s_threading, "threading");
    INTERN(s_get_ident, "get_ident");
    INTERN(s_time, "time");
    INTERN(s_perf_counter, "perf_counter");
    INTERN(s_start_times, "_start_times");
    INTERN(s_push, "push");
    INTERN(s_value, "_value");
    INTERN(s_ema_coeff, "_ema_coeff");
    INTERN(s_tf, "tf");
    INTERN(s_safe_isnan, "safe_isnan");
    INTERN(s_otel_rl_log_time, "_otel_rl_log_time");
    INTERN(s_tree, "tree");
    INTERN(s_flatten, "flatten");
    INTERN(s_force_tuple, "force_tuple");
    INTERN(s_maybe_create_stats_object, "_maybe_create_stats_object");
    INTERN(s_key_in_stats, "_key_in_stats");
    INTERN(s_get_key, "_get_key");
    INTERN(s_threading_lock, "_threading_lock");
    INTERN(s_stats, "stats");
    if ((one = PyLong_FromLong(1)) == NULL || (nano = PyFloat_FromDouble(1e-9)) == NULL)
        return NULL;
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL)
        return NULL;
    real_clock = PyObject_GetAttrString(time, "perf_counter_ns");
    Py_DECREF(time);
    if (real_clock == NULL)
        return NULL;
    PyObject *thread = PyImport_ImportModule("_thread");
    if (thread == NULL)
        return NULL;
    local_type = (PyTypeObject *)PyObject_GetAttrString(thread, "_local");
    Py_DECREF(thread);
    if (local_type == NULL)
        return NULL;
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL)
        return NULL;
    deque_type = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque_type == NULL || (deque_append = PyObject_GetAttrString(deque_type, "append")) == NULL)
        return NULL;
    return PyModule_Create(&module_def);
}
