/* What the optional compiled modules that stand in for pure-Python code share (`_hotpath.c`,
 * `_timingacc.c`; included by each, so each gets its own copy of these statics): handing a
 * call to the pure function, reading a module global as the pure code would, and knowing when
 * a watched namespace changed (the cache of globals read at every call is then dropped).
 */
#ifndef OTEL_RL_ACCEL_H
#define OTEL_RL_ACCEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif
#ifndef Py_READONLY
#define Py_READONLY READONLY
#endif

/* `pure(self, *args, **kwnames)`: what the fast path does not cover. */
static PyObject *
call_pure(PyObject *pure, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
          PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *stack[16];
    if (nargs + nkw + 1 > 16) {
        PyErr_SetString(PyExc_TypeError, "too many arguments");
        return NULL;
    }
    stack[0] = self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        stack[i + 1] = args[i];
    return PyObject_Vectorcall(pure, stack, (size_t)(nargs + 1), kwnames);
}

/* The global `key` of the namespace `ns`, borrowed (NameError like the pure code if it is
 * gone). */
static PyObject *
namespace_get(PyObject *ns, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(ns, key);
    if (value == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_NameError, "name '%U' is not defined", key);
    return value;
}

/* Whether the module's cache of globals still holds: cleared by any change to a watched
 * namespace. Python 3.12+ says so through a dict watcher (`watch_namespace`); before, each
 * module compares the dicts' version tags (PEP 509) itself. */
static int cache_valid;
#if PY_VERSION_HEX >= 0x030C0000
static int watcher_id = -1;

static int
namespace_changed(PyDict_WatchEvent Py_UNUSED(event), PyObject *Py_UNUSED(dict),
                  PyObject *Py_UNUSED(key), PyObject *Py_UNUSED(new_value))
{
    cache_valid = 0;
    return 0;
}
#endif

/* Drop the cache whenever `dict` changes from now on (3.12+; a no-op before). */
static int
watch_namespace(PyObject *dict)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (watcher_id < 0 && (watcher_id = PyDict_AddWatcher(namespace_changed)) < 0)
        return -1;
    if (PyDict_Watch(watcher_id, dict) < 0)
        return -1;
#else
    (void)dict;
#endif
    return 0;
}

#endif
