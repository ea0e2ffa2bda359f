/* The optional compiled common path of `otel_rl.timing` (Sample Factory's `Timing`):
 * `AttrDict.__getattribute__`, `Timing.timeit/add_time/time_avg` (with `_init_context`) and
 * `TimingContext.__init__/__enter__/__exit__` (with `_record_measurement`), statement for
 * statement the pure-Python ones in `timing.py`.
 *
 * Like `_hotpath.c` it keeps no state but the slot offsets of `TimingContext`: every module
 * global the pure code reads (`_block_factory`, `time`, `EPS`, `AvgTime`, `TimingTreeNode`,
 * `_enter_component`, `_bridge_error`, `set_active_stack`, `_NO_SWAP`) is read from the timing
 * module's namespace at each use, so patching one (tests swap `time.time` and
 * `_block_factory`) acts on both paths alike. The mirror block (`_block_factory(key)`, the
 * compiled or pure `hierarchical_timer`) is made, entered and left through the ordinary call
 * protocol. `time.time()` is read natively while it is the real one (the same clock and the
 * same float CPython's gives). What the fast path does not cover (a subclass of `Timing`,
 * `AttrDict` or `TimingContext`, keyword arguments, a context re-entered while open, a key
 * that is not a str, a context whose state is not what `__init__` leaves) is handed to the
 * pure function before anything is changed.
 *
 * Built by setup.py as an optional extension: without a compiler otel_rl runs pure Python.
 * `tests/test_timing_accel.py` drives both paths with the same workloads and compares all.
 */
#include "_accel.h"
#include <time.h>

/* TimingContext's slots */
enum {
    C_ADDITIVE, C_AVERAGE, C_BLOCK, C_GPU, C_KEY, C_OUTER, C_SWAP, C_TIME, C_TIME_ENTER,
    C_TIMING, C_NODE, N_SLOTS
};

static const char *slot_names[N_SLOTS] = {
    "_additive", "_average", "_block", "_gpu", "_key", "_outer_blocks", "_swap", "_time",
    "_time_enter", "_timing", "timing_tree_node",
};

static Py_ssize_t offsets[N_SLOTS];
static PyTypeObject *context_type, *timing_type, *attrdict_type;
static PyObject *ns;  /* timing.py's globals */
static PyObject *pure_getattribute, *pure_timeit, *pure_add_time, *pure_time_avg, *pure_init,
    *pure_enter, *pure_exit;
static PyObject *time_module, *real_time, *zero, *gpu_kwnames;
static PyObject *s_block_factory, *s_time, *s_EPS, *s_AvgTime, *s_TimingTreeNode,
    *s_enter_component, *s_components, *s_switch_to, *s_name, *empty, *s_bridge_error, *s_set_active_stack, *s_NO_SWAP, *s_stack_key,
    *s_node_name, *s_timing, *s_self_time, *s_values, *s_append, *s_pop, *s_enter, *s_exit;

#define SLOT(obj, i) (*(PyObject **)((char *)(obj) + offsets[i]))

/* Replace a slot's value (value borrowed). */
static inline void
put(PyObject *obj, int i, PyObject *value)
{
    PyObject *old = SLOT(obj, i);
    Py_INCREF(value);
    SLOT(obj, i) = value;
    Py_XDECREF(old);
}

/* A timing.py global, borrowed (NameError like the pure code if it is gone). */
static PyObject *
global(PyObject *key)
{
    return namespace_get(ns, key);
}

/* The globals read at every block, cached while timing.py's namespace and the time module's
 * are unchanged (borrowed from them): any change to either (a patched `time.time`, a swapped
 * `_block_factory`) drops the whole cache. Python 3.12+ says so through a dict watcher;
 * before, the dicts' version tags (PEP 509) change with every change. */
enum { G_FACTORY, G_TIME, G_EPS, G_NO_SWAP, N_CACHED };
static PyObject **cached_keys[N_CACHED] = {&s_block_factory, &s_time, &s_EPS, &s_NO_SWAP};
static PyObject *cached[N_CACHED];
static PyObject *cached_time_fn;  /* the time module's `time` while the global is that module */
static PyObject *time_dict;       /* the time module's namespace */
#if PY_VERSION_HEX < 0x030C0000
static uint64_t ns_version, time_version;
#endif

/* A timing.py global read at every block, borrowed (NameError like the pure code if gone). */
static PyObject *
hot(int which)
{
#if PY_VERSION_HEX < 0x030C0000
    if (((PyDictObject *)ns)->ma_version_tag != ns_version ||
        ((PyDictObject *)time_dict)->ma_version_tag != time_version)
        cache_valid = 0;
#endif
    if (!cache_valid) {
        for (int i = 0; i < N_CACHED; i++) {
            cached[i] = PyDict_GetItemWithError(ns, *cached_keys[i]);
            if (cached[i] == NULL && PyErr_Occurred())
                return NULL;
        }
        cached_time_fn = NULL;
        if (cached[G_TIME] == time_module) {
            cached_time_fn = PyDict_GetItemWithError(time_dict, s_time);
            if (cached_time_fn == NULL && PyErr_Occurred())
                return NULL;
        }
#if PY_VERSION_HEX < 0x030C0000
        ns_version = ((PyDictObject *)ns)->ma_version_tag;
        time_version = ((PyDictObject *)time_dict)->ma_version_tag;
#endif
        cache_valid = 1;
    }
    PyObject *value = cached[which];
    if (value == NULL)
        PyErr_Format(PyExc_NameError, "name '%U' is not defined", *cached_keys[which]);
    return value;
}

/* time.time() as timing.py sees it (the global `time`'s attribute): natively while it is
 * the real one, with the float CPython's time.time() makes of the same reading. */
static PyObject *
wall(void)
{
    PyObject *module = hot(G_TIME), *fn;
    if (module == NULL)
        return NULL;
    if (module == time_module && cached_time_fn != NULL)
        fn = Py_NewRef(cached_time_fn);
    else if ((fn = PyObject_GetAttr(module, s_time)) == NULL)
        return NULL;
    if (fn == real_time) {
        Py_DECREF(fn);
#if PY_VERSION_HEX >= 0x030D0000
        PyTime_t t;
        if (PyTime_TimeRaw(&t) < 0)
            return NULL;
        return PyFloat_FromDouble(PyTime_AsSecondsDouble(t));
#elif defined(__linux__)
        struct timespec ts;
        if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
        long long t = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        /* as _PyTime_AsSecondsDouble */
        double d = t % 1000000000LL == 0 ? (double)(t / 1000000000LL) : (double)t / 1e9;
        return PyFloat_FromDouble(d);
#else
        fn = Py_NewRef(real_time);
#endif
    }
    PyObject *result = PyObject_CallNoArgs(fn);
    Py_DECREF(fn);
    return result;
}

/* `except Exception as exc: _bridge_error(exc)`: 0 when the error was one and was reported,
 * -1 with the error still set otherwise. */
static int
bridge_error(void)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *report = global(s_bridge_error), *r = NULL;
    if (report != NULL)
        r = PyObject_CallOneArg(report, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* --- AttrDict.__getattribute__(self, item) ------------------------------------------------ */

static PyObject *
attr_getattribute(PyObject *self, PyObject *item)
{
    PyTypeObject *type = Py_TYPE(self);
    if ((type != timing_type && type != attrdict_type) || !PyUnicode_CheckExact(item)) {
        PyObject *args[1] = {item};
        return call_pure(pure_getattribute, self, args, 1, NULL);
    }
    PyObject *value = PyDict_GetItemWithError(self, item);  /* `item in self`: self[item] */
    if (value != NULL)
        return Py_NewRef(value);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_GenericGetAttr(self, item);
}

/* --- TimingContext.__init__ and Timing._init_context --------------------------------------- */

static void
fill_context(PyObject *ctx, PyObject *timing, PyObject *key, PyObject *additive,
             PyObject *average, PyObject *gpu, PyObject *no_swap)
{
    put(ctx, C_NODE, Py_None);
    put(ctx, C_TIMING, timing);
    put(ctx, C_KEY, key);
    put(ctx, C_ADDITIVE, additive);
    put(ctx, C_AVERAGE, average);
    put(ctx, C_TIME_ENTER, Py_None);
    put(ctx, C_TIME, zero);
    put(ctx, C_BLOCK, Py_None);
    put(ctx, C_OUTER, Py_None);
    put(ctx, C_GPU, gpu);
    put(ctx, C_SWAP, no_swap);
}

/* __init__(self, timing, key, additive=False, average=None, gpu=None) */
static PyObject *
context_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (Py_TYPE(self) != context_type || kwnames != NULL || nargs < 2 || nargs > 5)
        return call_pure(pure_init, self, args, nargs, kwnames);
    PyObject *no_swap = hot(G_NO_SWAP);
    if (no_swap == NULL)
        return NULL;
    fill_context(self, args[0], args[1], nargs > 2 ? args[2] : Py_False,
                 nargs > 3 ? args[3] : Py_None, nargs > 4 ? args[4] : Py_None, no_swap);
    Py_RETURN_NONE;
}

/* ctx.initial_value(): a new reference */
static PyObject *
initial_value(PyObject *average)
{
    if (average == Py_None)
        return PyFloat_FromDouble(0.0);
    PyObject *cls = global(s_AvgTime);
    if (cls == NULL)
        return NULL;
    return PyObject_CallOneArg(cls, average);
}

static PyObject *
init_context(PyObject *self, PyObject *key, PyObject *additive, PyObject *average,
             PyObject *gpu)
{
    PyObject *no_swap = hot(G_NO_SWAP);
    if (no_swap == NULL)
        return NULL;
    Py_INCREF(no_swap);  /* the allocation may collect garbage, and so run any code */
    PyObject *ctx = context_type->tp_alloc(context_type, 0);
    if (ctx == NULL) {
        Py_DECREF(no_swap);
        return NULL;
    }
    PyObject *node = NULL, *tree = NULL, *value = NULL;
    fill_context(ctx, self, key, additive, average, gpu, no_swap);
    Py_DECREF(no_swap);
    int has = PyDict_Contains(self, key);
    if (has < 0)
        goto fail;
    if (!has) {
        if ((value = initial_value(average)) == NULL || PyDict_SetItem(self, key, value) < 0)
            goto fail;
        Py_CLEAR(value);
    }
    PyObject *stack = PyDict_GetItemWithError(self, s_stack_key), *parent;
    if (stack == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, s_stack_key);
        goto fail;
    }
    if (PyList_CheckExact(stack) && PyList_GET_SIZE(stack) > 0)
        parent = Py_NewRef(PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1));
    else if ((parent = PySequence_GetItem(stack, -1)) == NULL)
        goto fail;
    if (Py_TYPE(parent) == context_type && SLOT(parent, C_NODE) != NULL)
        node = Py_NewRef(SLOT(parent, C_NODE));
    else
        node = PyObject_GetAttr(parent, s_node_name);
    Py_DECREF(parent);
    if (node == NULL || (tree = PyObject_GetAttr(node, s_timing)) == NULL)
        goto fail;
    if ((has = PySequence_Contains(tree, key)) < 0)
        goto fail;
    if (!has) {
        PyObject *cls = global(s_TimingTreeNode), *child;
        if (cls == NULL || (value = initial_value(average)) == NULL)
            goto fail;
        child = PyObject_CallOneArg(cls, value);
        if (child == NULL)
            goto fail;
        int failed = PyObject_SetItem(tree, key, child);
        Py_DECREF(child);
        if (failed < 0)
            goto fail;
        Py_CLEAR(value);
    }
    if ((value = PyObject_GetItem(tree, key)) == NULL)
        goto fail;
    put(ctx, C_NODE, value);
    Py_DECREF(value);
    Py_DECREF(node);
    Py_DECREF(tree);
    return ctx;
fail:
    Py_XDECREF(value);
    Py_XDECREF(node);
    Py_XDECREF(tree);
    Py_DECREF(ctx);
    return NULL;
}

/* timeit(self, key, gpu=None) */
static PyObject *
timing_timeit(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (Py_TYPE(self) != timing_type || kwnames != NULL || nargs < 1 || nargs > 2 ||
        !PyUnicode_CheckExact(args[0]))
        return call_pure(pure_timeit, self, args, nargs, kwnames);
    return init_context(self, args[0], Py_False, Py_None, nargs > 1 ? args[1] : Py_None);
}

/* add_time(self, key, gpu=None) */
static PyObject *
timing_add_time(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (Py_TYPE(self) != timing_type || kwnames != NULL || nargs < 1 || nargs > 2 ||
        !PyUnicode_CheckExact(args[0]))
        return call_pure(pure_add_time, self, args, nargs, kwnames);
    return init_context(self, args[0], Py_True, Py_None, nargs > 1 ? args[1] : Py_None);
}

/* time_avg(self, key, average=10, gpu=None) */
static PyObject *ten;

static PyObject *
timing_time_avg(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (Py_TYPE(self) != timing_type || kwnames != NULL || nargs < 1 || nargs > 3 ||
        !PyUnicode_CheckExact(args[0]))
        return call_pure(pure_time_avg, self, args, nargs, kwnames);
    return init_context(self, args[0], Py_False, nargs > 1 ? args[1] : ten,
                        nargs > 2 ? args[2] : Py_None);
}

/* --- TimingContext.__enter__ --------------------------------------------------------------- */

/* Whether every slot the fast paths read is set (as `__init__` and `__setstate__` leave it). */
static int
complete(PyObject *self)
{
    for (int i = 0; i < N_SLOTS; i++)
        if (SLOT(self, i) == NULL)
            return 0;
    return 1;
}

/* _enter_component(timing): once otel_rl has loaded `components` (`_components` is set),
 * what it returns, ``components.switch_to(str(dict.get(timing, "_name", "")), _NO_SWAP)``,
 * without its Python frame (0.1 µs of a top-level block); else the function itself. */
static PyObject *
enter_component(PyObject *timing)
{
    PyObject *components = PyDict_GetItemWithError(ns, s_components), *name;
    if (components == NULL && PyErr_Occurred())
        return NULL;
    if (components == NULL || components == Py_None || !PyDict_Check(timing) ||
        ((name = PyDict_GetItemWithError(timing, s_name)) != NULL && !PyUnicode_CheckExact(name))) {
        if (PyErr_Occurred())
            return NULL;
        PyObject *pure = global(s_enter_component);
        return pure == NULL ? NULL : PyObject_CallOneArg(pure, timing);
    }
    PyObject *no_swap = hot(G_NO_SWAP);
    if (no_swap == NULL)
        return NULL;
    if (name == NULL)
        name = empty;
    PyObject *args[3] = {components, name, no_swap};
    Py_INCREF(components);
    Py_INCREF(name);
    Py_INCREF(no_swap);
    PyObject *result = PyObject_VectorcallMethod(s_switch_to, args, 3, NULL);
    Py_DECREF(components);
    Py_DECREF(name);
    Py_DECREF(no_swap);
    return result;
}

static PyObject *
context_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    if (Py_TYPE(self) != context_type || !complete(self) || SLOT(self, C_BLOCK) != Py_None ||
        !PyDict_Check(SLOT(self, C_TIMING)))
        return PyObject_CallOneArg(pure_enter, self);
    PyObject *timing = SLOT(self, C_TIMING);
    PyObject *factory = hot(G_FACTORY);
    if (factory == NULL)
        return NULL;
    Py_INCREF(timing);
    if (factory != Py_None) {
        Py_INCREF(factory);
        PyObject *block = NULL, *stack = PyDict_GetItemWithError(timing, s_stack_key);
        int ok = 0;
        if (stack == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, s_stack_key);
            goto bridged;
        }
        Py_ssize_t depth = PyObject_Size(stack);
        if (depth < 0)
            goto bridged;
        if (depth == 1) {
            PyObject *swap = enter_component(timing);
            if (swap == NULL)
                goto bridged;
            put(self, C_SWAP, swap);
            Py_DECREF(swap);
        }
        /* held: the factory may run any code, rebinding the slots included */
        PyObject *key = Py_NewRef(SLOT(self, C_KEY)), *gpu = Py_NewRef(SLOT(self, C_GPU));
        if (gpu == Py_None) {
            PyObject *fargs[2] = {NULL, key};
            block = PyObject_Vectorcall(factory, fargs + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                        NULL);
        }
        else {
            PyObject *fargs[2] = {key, gpu};
            block = PyObject_Vectorcall(factory, fargs, 1, gpu_kwnames);
        }
        Py_DECREF(key);
        Py_DECREF(gpu);
        if (block == NULL)
            goto bridged;
        PyObject *r = PyObject_VectorcallMethod(s_enter, &block, 1, NULL);
        if (r == NULL)
            goto bridged;
        Py_DECREF(r);
        put(self, C_BLOCK, block);
        ok = 1;
bridged:
        Py_XDECREF(block);
        Py_DECREF(factory);
        if (!ok && bridge_error() < 0) {
            Py_DECREF(timing);
            return NULL;
        }
    }
    /* Measured after the mirror block opened, so its cost stays out of Timing's numbers. */
    PyObject *start = wall(), *stack;
    if (start == NULL) {
        Py_DECREF(timing);
        return NULL;
    }
    put(self, C_TIME_ENTER, start);
    Py_DECREF(start);
    stack = PyDict_GetItemWithError(timing, s_stack_key);
    int failed;
    if (stack == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, s_stack_key);
        failed = 1;
    }
    else if (PyList_CheckExact(stack))
        failed = PyList_Append(stack, self) < 0;
    else {
        PyObject *r = PyObject_CallMethodOneArg(stack, s_append, self);
        failed = r == NULL;
        Py_XDECREF(r);
    }
    Py_DECREF(timing);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* --- TimingContext.__exit__ ---------------------------------------------------------------- */

/* target += value, a new reference */
static PyObject *
plus(PyObject *target, PyObject *value)
{
    if (PyFloat_CheckExact(target) && PyFloat_CheckExact(value))
        return PyFloat_FromDouble(PyFloat_AS_DOUBLE(target) + PyFloat_AS_DOUBLE(value));
    return PyNumber_InPlaceAdd(target, value);
}

/* x.values.append(value) */
static int
append_value(PyObject *avg, PyObject *value)
{
    PyObject *values = PyObject_GetAttr(avg, s_values);
    if (values == NULL)
        return -1;
    PyObject *r = PyObject_CallMethodOneArg(values, s_append, value);
    Py_DECREF(values);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* self._record_measurement(key, value) */
static int
record_measurement(PyObject *self, PyObject *key, PyObject *value)
{
    PyObject *node = SLOT(self, C_NODE), *timing = SLOT(self, C_TIMING);
    PyObject *old = NULL, *sum = NULL;
    int ok = 0;
    int additive = PyObject_IsTrue(SLOT(self, C_ADDITIVE));
    if (additive < 0)
        return -1;
    Py_INCREF(node);
    Py_INCREF(timing);
    if (additive) {
        if ((old = PyObject_GetItem(timing, key)) == NULL || (sum = plus(old, value)) == NULL ||
            PyObject_SetItem(timing, key, sum) < 0)
            goto done;
        Py_CLEAR(old);
        Py_CLEAR(sum);
        if ((old = PyObject_GetAttr(node, s_self_time)) == NULL ||
            (sum = plus(old, value)) == NULL || PyObject_SetAttr(node, s_self_time, sum) < 0)
            goto done;
    }
    else if (SLOT(self, C_AVERAGE) != Py_None) {
        if ((old = PyObject_GetItem(timing, key)) == NULL || append_value(old, value) < 0)
            goto done;
        Py_CLEAR(old);
        if ((old = PyObject_GetAttr(node, s_self_time)) == NULL || append_value(old, value) < 0)
            goto done;
    }
    else if (PyObject_SetItem(timing, key, value) < 0 ||
             PyObject_SetAttr(node, s_self_time, value) < 0)
        goto done;
    ok = 1;
done:
    Py_XDECREF(old);
    Py_XDECREF(sum);
    Py_DECREF(node);
    Py_DECREF(timing);
    return ok ? 0 : -1;
}

static int
pop_context(PyObject *timing)
{
    PyObject *stack = PyDict_GetItemWithError(timing, s_stack_key);
    if (stack == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, s_stack_key);
        return -1;
    }
    if (PyList_CheckExact(stack)) {
        Py_ssize_t n = PyList_GET_SIZE(stack);
        if (n == 0) {
            PyErr_SetString(PyExc_IndexError, "pop from empty list");
            return -1;
        }
        /* list.pop() without shrinking the list's storage: the stack of open blocks grows
         * and shrinks by one at every block. */
        PyObject *item = PyList_GET_ITEM(stack, n - 1);
        Py_SET_SIZE(stack, n - 1);
        Py_DECREF(item);
        return 0;
    }
    PyObject *r = PyObject_CallMethodNoArgs(stack, s_pop);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The try part of __exit__: record the time and pop. */
static int
exit_body(PyObject *self)
{
    PyObject *end = wall();
    if (end == NULL)
        return -1;
    PyObject *eps = hot(G_EPS), *passed = NULL, *start = SLOT(self, C_TIME_ENTER);
    if (eps == NULL) {
        Py_DECREF(end);
        return -1;
    }
    Py_INCREF(eps);
    Py_INCREF(start);
    if (PyFloat_CheckExact(end) && PyFloat_CheckExact(eps) && PyFloat_CheckExact(start)) {
        double d = PyFloat_AS_DOUBLE(end) - PyFloat_AS_DOUBLE(start);
        /* max(d, EPS): the first unless EPS is larger */
        passed = PyFloat_AS_DOUBLE(eps) > d ? Py_NewRef(eps) : PyFloat_FromDouble(d);
    }
    else {
        PyObject *d = PyNumber_Subtract(end, start);
        if (d != NULL) {
            int larger = PyObject_RichCompareBool(eps, d, Py_GT);
            passed = larger < 0 ? NULL : Py_NewRef(larger ? eps : d);
            Py_DECREF(d);
        }
    }
    Py_DECREF(end);
    Py_DECREF(eps);
    Py_DECREF(start);
    if (passed == NULL)
        return -1;
    PyObject *key = Py_NewRef(SLOT(self, C_KEY)), *timing = Py_NewRef(SLOT(self, C_TIMING));
    int failed = record_measurement(self, key, passed) < 0 || pop_context(timing) < 0;
    Py_DECREF(key);
    Py_DECREF(timing);
    Py_DECREF(passed);
    return failed ? -1 : 0;
}

/* Chain an error raised in the finally part onto the one it interrupted, as Python does. */
static void
chain(PyObject *type, PyObject *value, PyObject *tb)
{
    if (type == NULL)
        return;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *t2, *v2, *tb2;
    PyErr_Fetch(&t2, &v2, &tb2);
    PyErr_NormalizeException(&t2, &v2, &tb2);
    if (v2 != value) {
        Py_INCREF(value);
        PyException_SetContext(v2, value);
    }
    PyErr_Restore(t2, v2, tb2);
    Py_DECREF(type);
    Py_DECREF(value);
    Py_XDECREF(tb);
}

static PyObject *
context_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (Py_TYPE(self) != context_type || kwnames != NULL || nargs != 3 || !complete(self) ||
        !PyFloat_CheckExact(SLOT(self, C_TIME_ENTER)) || !PyDict_Check(SLOT(self, C_TIMING)) ||
        (SLOT(self, C_OUTER) != Py_None && !PyList_CheckExact(SLOT(self, C_OUTER))))
        return call_pure(pure_exit, self, args, nargs, kwnames);
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (exit_body(self) < 0)
        PyErr_Fetch(&type, &value, &tb);
    /* finally: */
    PyObject *block = SLOT(self, C_BLOCK);
    if (block != Py_None) {
        Py_INCREF(block);
        PyObject *outer = SLOT(self, C_OUTER), *next;
        if (PyList_CheckExact(outer) && PyList_GET_SIZE(outer) > 0) {
            /* outer.pop() */
            Py_ssize_t n = PyList_GET_SIZE(outer);
            next = Py_NewRef(PyList_GET_ITEM(outer, n - 1));
            if (PyList_SetSlice(outer, n - 1, n, NULL) < 0) {
                Py_DECREF(next);
                Py_DECREF(block);
                goto failed;
            }
        }
        else
            next = Py_NewRef(Py_None);
        put(self, C_BLOCK, next);
        Py_DECREF(next);
        PyObject *xargs[4] = {block, args[0], args[1], args[2]};
        PyObject *r = PyObject_VectorcallMethod(s_exit, xargs, 4, NULL);
        Py_DECREF(block);
        if (r == NULL) {
            if (bridge_error() < 0)
                goto failed;
        }
        else
            Py_DECREF(r);
    }
    PyObject *no_swap = hot(G_NO_SWAP);
    if (no_swap == NULL)
        goto failed;
    PyObject *swap = SLOT(self, C_SWAP);
    if (swap != no_swap) {
        Py_INCREF(swap);
        put(self, C_SWAP, no_swap);
        PyObject *set_stack = global(s_set_active_stack), *r = NULL;
        if (set_stack != NULL)
            r = PyObject_CallOneArg(set_stack, swap);
        Py_DECREF(swap);
        if (r == NULL)
            goto failed;
        Py_DECREF(r);
    }
    if (type != NULL) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    Py_RETURN_NONE;
failed:
    chain(type, value, tb);
    return NULL;
}

/* --- install ------------------------------------------------------------------------------ */

static PyMethodDef getattribute_def = {
    "__getattribute__", (PyCFunction)attr_getattribute, METH_O,
    "__getattribute__($self, item, /)\n--\n\nThe compiled `AttrDict.__getattribute__`."};
static PyMethodDef timeit_def = {
    "timeit", (PyCFunction)(void (*)(void))timing_timeit, METH_FASTCALL | METH_KEYWORDS,
    "timeit($self, key, gpu=None)\n--\n\nThe compiled `Timing.timeit`."};
static PyMethodDef add_time_def = {
    "add_time", (PyCFunction)(void (*)(void))timing_add_time, METH_FASTCALL | METH_KEYWORDS,
    "add_time($self, key, gpu=None)\n--\n\nThe compiled `Timing.add_time`."};
static PyMethodDef time_avg_def = {
    "time_avg", (PyCFunction)(void (*)(void))timing_time_avg, METH_FASTCALL | METH_KEYWORDS,
    "time_avg($self, key, average=10, gpu=None)\n--\n\nThe compiled `Timing.time_avg`."};
static PyMethodDef init_def = {
    "__init__", (PyCFunction)(void (*)(void))context_init, METH_FASTCALL | METH_KEYWORDS,
    "__init__($self, timing, key, additive=False, average=None, gpu=None)\n--\n\n"
    "The compiled `TimingContext.__init__`."};
static PyMethodDef enter_def = {
    "__enter__", (PyCFunction)context_enter, METH_NOARGS,
    "__enter__($self, /)\n--\n\nThe compiled `TimingContext.__enter__`."};
static PyMethodDef exit_def = {
    "__exit__", (PyCFunction)(void (*)(void))context_exit, METH_FASTCALL | METH_KEYWORDS,
    "__exit__($self, type_, value, traceback)\n--\n\nThe compiled `TimingContext.__exit__`."};

static int
find_slot(int which, PyObject *cls)
{
    PyObject *descr = PyObject_GetAttrString(cls, slot_names[which]);
    if (descr == NULL)
        return -1;
    int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type);
    if (ok) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        ok = member->type == Py_T_OBJECT_EX && !(member->flags & Py_READONLY);
        offsets[which] = member->offset;
    }
    Py_DECREF(descr);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a writable slot", cls, slot_names[which]);
        return -1;
    }
    return 0;
}

#define KEEP(var, value) do { Py_INCREF(value); Py_XSETREF(var, value); } while (0)

static PyObject *
install(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *attrdict, *timing, *context, *namespace, *getattribute, *timeit, *add_time,
        *time_avg, *init, *enter_fn, *exit_fn;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOOOOOO:install", &PyType_Type, &attrdict,
                          &PyType_Type, &timing, &PyType_Type, &context, &PyDict_Type,
                          &namespace, &getattribute, &timeit, &add_time, &time_avg, &init,
                          &enter_fn, &exit_fn))
        return NULL;
    for (int i = 0; i < N_SLOTS; i++)
        if (find_slot(i, context) < 0)
            return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)timing, &PyDict_Type) ||
        !PyType_IsSubtype((PyTypeObject *)attrdict, &PyDict_Type)) {
        PyErr_SetString(PyExc_TypeError, "Timing and AttrDict must be dicts");
        return NULL;
    }
    KEEP(attrdict_type, (PyTypeObject *)attrdict);
    KEEP(timing_type, (PyTypeObject *)timing);
    KEEP(context_type, (PyTypeObject *)context);
    if (watch_namespace(namespace) < 0 || watch_namespace(time_dict) < 0)
        return NULL;
    KEEP(ns, namespace);
    cache_valid = 0;
    KEEP(pure_getattribute, getattribute);
    KEEP(pure_timeit, timeit);
    KEEP(pure_add_time, add_time);
    KEEP(pure_time_avg, time_avg);
    KEEP(pure_init, init);
    KEEP(pure_enter, enter_fn);
    KEEP(pure_exit, exit_fn);
    PyObject *c[7] = {
        PyDescr_NewMethod(attrdict_type, &getattribute_def),
        PyDescr_NewMethod(timing_type, &timeit_def),
        PyDescr_NewMethod(timing_type, &add_time_def),
        PyDescr_NewMethod(timing_type, &time_avg_def),
        PyDescr_NewMethod(context_type, &init_def),
        PyDescr_NewMethod(context_type, &enter_def),
        PyDescr_NewMethod(context_type, &exit_def),
    };
    PyObject *result = NULL;
    if (c[0] && c[1] && c[2] && c[3] && c[4] && c[5] && c[6])
        result = Py_BuildValue("{OOOOOOOOOOOOOO}", getattribute, c[0], timeit, c[1], add_time,
                               c[2], time_avg, c[3], init, c[4], enter_fn, c[5], exit_fn, c[6]);
    for (int i = 0; i < 7; i++)
        Py_XDECREF(c[i]);
    return result;
}

static PyMethodDef module_methods[] = {
    {"install", install, METH_VARARGS,
     "install(attrdict, timing, context, namespace, getattribute, timeit, add_time, time_avg,\n"
     "        init, enter, exit, /)\n--\n\n"
     "The compiled versions of the seven pure functions, as {pure: compiled}, for timing.py's\n"
     "classes and globals."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_timingacc",
    "otel_rl's optional compiled Sample Factory Timing (see timing.py).", -1, module_methods};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__timingacc(void)
{
    INTERN(s_block_factory, "_block_factory");
    INTERN(s_time, "time");
    INTERN(s_EPS, "EPS");
    INTERN(s_AvgTime, "AvgTime");
    INTERN(s_TimingTreeNode, "TimingTreeNode");
    INTERN(s_enter_component, "_enter_component");
    INTERN(s_components, "_components");
    INTERN(s_switch_to, "switch_to");
    INTERN(s_name, "_name");
    INTERN(empty, "");
    INTERN(s_bridge_error, "_bridge_error");
    INTERN(s_set_active_stack, "set_active_stack");
    INTERN(s_NO_SWAP, "_NO_SWAP");
    INTERN(s_stack_key, "_open_contexts_stack");
    INTERN(s_node_name, "timing_tree_node");
    INTERN(s_timing, "timing");
    INTERN(s_self_time, "self_time");
    INTERN(s_values, "values");
    INTERN(s_append, "append");
    INTERN(s_pop, "pop");
    INTERN(s_enter, "__enter__");
    INTERN(s_exit, "__exit__");
    if ((zero = PyLong_FromLong(0)) == NULL || (ten = PyLong_FromLong(10)) == NULL ||
        (gpu_kwnames = Py_BuildValue("(s)", "gpu")) == NULL)
        return NULL;
    if ((time_module = PyImport_ImportModule("time")) == NULL ||
        (real_time = PyObject_GetAttrString(time_module, "time")) == NULL)
        return NULL;
    time_dict = PyModule_GetDict(time_module);  /* borrowed: the module is kept */
    return PyModule_Create(&module_def);
}
