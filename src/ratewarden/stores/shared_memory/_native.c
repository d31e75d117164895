/* ratewarden.stores.shared_memory._native: the shared table's hot operations in C.
 *
 * Optional (setup.py builds it next to the mypyc modules on Linux; without it the store takes
 * the robust mutexes through ctypes and reads entries with struct). A Table holds one process's
 * view of a table file (a buffer export of its mmap) and the offsets of its regions:
 *
 *   lock(r, timeout) / unlock(r) / consistent(r)
 *                                          region r's robust mutex (the GIL is released only if
 *                                          the mutex is contended); lock waits `timeout` seconds
 *                                          at most (then ETIMEDOUT), and returns EINVAL without
 *                                          calling pthread for a mutex whose kind words are not
 *                                          a fresh mutex's (bytes overwritten: garbage can make
 *                                          pthread wait forever or abort the process)
 *   begin(r, digest, now, timeout)        lock region r and find the entry of `digest`: its state
 *                                          (None once expired) with the lock held, or an int:
 *                                          -1 = lock held, take the general path (an insert or
 *                                          delete left half-done, key absent, entry dirty, or a
 *                                          field out of range); > 0 = lock()'s error (the lock
 *                                          is held only for EOWNERDEAD)
 *   commit(r, expires, state)             write that entry's state (dirty while written, unless
 *                                          state is None), never moving its expiry earlier, keep
 *                                          the region's next_expiry a bound, and unlock region r
 *
 * The offsets below are layout.py's (LAYOUT_VERSION); the store uses this module only when its
 * LAYOUT_VERSION matches. Every offset read from the file is bounds-checked against the mapping.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the table file is little-endian; on this platform the store uses its struct path"
#endif

#define LAYOUT_VERSION 2
#define TIMED 1  /* lock() and begin() take a timeout (segment.py checks it) */
#define SIGNATURE_WORDS 16
#define R_OP 8
#define R_NEXT_EXPIRY 24
#define MUTEX 64
#define E_DIGEST 16
#define E_BODY 32
#define E_FLOATS 48
#define CLEAN 0
#define WRITING 1

/* The compiler must neither drop nor reorder the dirty-byte stores around the state's: a process
 * killed at any instruction leaves the entry marked dirty until its state is whole. */
#define FENCE() __atomic_signal_fence(__ATOMIC_SEQ_CST)

typedef struct {
    char *head;                /* the region header */
    pthread_mutex_t *mutex;
    char *index;               /* uint32 slots: entry position + 1, 0 = empty */
    char *entries;
    uint64_t mask;
    Py_ssize_t room;           /* bytes from `entries` to the end of the mapping */
    char *held;                /* the entry begin() found, while this thread holds the lock */
} Region;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int open;
    Py_ssize_t esize;
    Py_ssize_t floats;
    Py_ssize_t count;
    Region *regions;
    Py_ssize_t busy;           /* locks held or awaited through this object (close() refuses) */
    int crash_at;              /* tests: SIGKILL this process at a step of commit() */
    int words;                 /* the words a fresh mutex has non-zero (its kind): offsets, values */
    Py_ssize_t word_at[SIGNATURE_WORDS];
    uint32_t word[SIGNATURE_WORDS];
} Table;

static Region *
region_of(Table *self, PyObject *arg)
{
    if (!self->open) {
        PyErr_SetString(PyExc_ValueError, "the shared-memory table is closed");
        return NULL;
    }
    Py_ssize_t r = PyLong_AsSsize_t(arg);
    if (r == -1 && PyErr_Occurred())
        return NULL;
    if (r < 0 || r >= self->count) {
        PyErr_Format(PyExc_IndexError, "no region %zd (the table has %zd)", r, self->count);
        return NULL;
    }
    return &self->regions[r];
}

#if defined(__x86_64__) || defined(__i386__)
#define RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RELAX() __asm__ __volatile__("yield")
#else
#define RELAX() ((void)0)
#endif
/* A holder keeps a region for a fraction of a microsecond: retry that long before sleeping in
 * the kernel (a futex wait and wake cost more than the whole check). */
#define SPINS 100

static inline uint32_t
u32_at(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static double
monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait for a contended mutex until `timeout` seconds from now: 0, ETIMEDOUT or the lock's error.
 * glibc 2.30+ waits on the monotonic clock; elsewhere trylock and short sleeps. */
static int
wait_for(pthread_mutex_t *mutex, double timeout)
{
    double deadline = monotonic() + timeout;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
    struct timespec at;
    at.tv_sec = (time_t)deadline;
    at.tv_nsec = (long)((deadline - (double)at.tv_sec) * 1e9);
    if (at.tv_nsec >= 1000000000L)
        at.tv_nsec = 999999999L;
    return pthread_mutex_clocklock(mutex, CLOCK_MONOTONIC, &at);
#else
    long pause = 50000;  /* ns */
    int rc = EBUSY;
    while (rc == EBUSY) {
        if (monotonic() >= deadline)
            return ETIMEDOUT;
        struct timespec nap = {0, pause};
        nanosleep(&nap, NULL);
        pause = pause < 2500000 ? pause * 2 : 5000000;
        rc = pthread_mutex_trylock(mutex);
    }
    return rc;
#endif
}

/* 0 or pthread_mutex_lock's error (ETIMEDOUT after `timeout` seconds, EINVAL for a mutex whose kind
 * words were overwritten); the lock is held on 0 and EOWNERDEAD. */
static int
take(Table *self, Region *region, double timeout)
{
    const char *raw = (const char *)region->mutex;
    for (int w = 0; w < self->words; w++)
        if (u32_at(raw + self->word_at[w]) != self->word[w])
            return EINVAL;
    int rc = pthread_mutex_trylock(region->mutex);
    for (int spin = 0; rc == EBUSY && spin < SPINS; spin++) {
        RELAX();
        rc = pthread_mutex_trylock(region->mutex);
    }
    if (rc == EBUSY) {
        self->busy++;  /* a waiter: close() must not unmap under it */
        Py_BEGIN_ALLOW_THREADS
        rc = wait_for(region->mutex, timeout);
        Py_END_ALLOW_THREADS
        self->busy--;
    }
    if (rc == 0 || rc == EOWNERDEAD)
        self->busy++;
    return rc;
}

static void
release(Table *self, Region *region)
{
    region->held = NULL;
    pthread_mutex_unlock(region->mutex);
    self->busy--;
}

static PyObject *
Table_lock(Table *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "lock(region, timeout) takes 2 arguments");
        return NULL;
    }
    Region *region = region_of(self, args[0]);
    if (region == NULL)
        return NULL;
    double timeout = PyFloat_AsDouble(args[1]);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(take(self, region, timeout));
}

static PyObject *
Table_unlock(Table *self, PyObject *arg)
{
    Region *region = region_of(self, arg);
    if (region == NULL)
        return NULL;
    release(self, region);
    Py_RETURN_NONE;
}

static PyObject *
Table_consistent(Table *self, PyObject *arg)
{
    Region *region = region_of(self, arg);
    if (region == NULL)
        return NULL;
    return PyLong_FromLong(pthread_mutex_consistent(region->mutex));
}

static PyObject *
Table_begin(Table *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "begin(region, digest, now, timeout) takes 4 arguments");
        return NULL;
    }
    Region *region = region_of(self, args[0]);
    if (region == NULL)
        return NULL;
    if (!PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) != 16) {
        PyErr_SetString(PyExc_TypeError, "begin: the digest must be 16 bytes");
        return NULL;
    }
    const char *digest = PyBytes_AS_STRING(args[1]);
    double now = PyFloat_AsDouble(args[2]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    double timeout = PyFloat_AsDouble(args[3]);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    int rc = take(self, region, timeout);
    if (rc)
        return PyLong_FromLong(rc);
    if (u32_at(region->head + R_OP))
        return PyLong_FromLong(-1);  /* a dead holder's insert or delete: recovered by the caller */
    uint64_t home;
    memcpy(&home, digest + 8, 8);  /* the digest's second little-endian 64-bit half */
    uint64_t mask = region->mask;
    uint64_t i = home & mask;
    char *entry = NULL;
    for (uint64_t probes = 0; probes <= mask; probes++, i = (i + 1) & mask) {
        uint32_t v = u32_at(region->index + 4 * i);
        if (v == 0)
            break;
        Py_ssize_t off = (Py_ssize_t)(v - 1) * self->esize;
        if (off + self->esize > region->room)
            break;  /* out of the mapping: the general path deals with it */
        if (memcmp(region->entries + off + E_DIGEST, digest, 16) == 0) {
            entry = region->entries + off;
            break;
        }
    }
    if (entry == NULL || entry[0] != CLEAN)
        return PyLong_FromLong(-1);
    double expires;
    uint32_t n;
    memcpy(&expires, entry + E_BODY, 8);
    memcpy(&n, entry + E_BODY + 8, 4);
    if ((Py_ssize_t)n > self->floats)
        return PyLong_FromLong(-1);
    region->held = entry;
    if (!(expires > now))
        Py_RETURN_NONE;
    PyObject *state = PyTuple_New(n);
    if (state == NULL)
        goto fail;
    for (uint32_t k = 0; k < n; k++) {
        double x;
        memcpy(&x, entry + E_FLOATS + 8 * (size_t)k, 8);
        PyObject *f = PyFloat_FromDouble(x);
        if (f == NULL) {
            Py_DECREF(state);
            goto fail;
        }
        PyTuple_SET_ITEM(state, k, f);
    }
    return state;
fail:
    release(self, region);
    return NULL;
}

static void
die(Table *self, int step)
{
    if (self->crash_at == step)
        kill(getpid(), SIGKILL);
}

/* table.py's write(): the region's next_expiry stays a lower bound of its entries' expiries
 * (never lowered by a commit while it holds: expires >= the entry's own >= it). */
static inline void
keep_bound(Region *region, double expires)
{
    double next;
    memcpy(&next, region->head + R_NEXT_EXPIRY, 8);
    if (expires < next)
        memcpy(region->head + R_NEXT_EXPIRY, &expires, 8);
}

static PyObject *
Table_commit(Table *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "commit(region, expires, state) takes 3 arguments");
        return NULL;
    }
    Region *region = region_of(self, args[0]);
    if (region == NULL)
        return NULL;
    char *entry = region->held;
    if (entry == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "commit() without a begin() that found the entry");
        return NULL;
    }
    PyObject *state = args[2];
    if (state == Py_None) {
        release(self, region);
        Py_RETURN_NONE;
    }
    double expires = PyFloat_AsDouble(args[1]);
    if (expires == -1.0 && PyErr_Occurred())
        goto fail;
    PyObject *seq = PySequence_Fast(state, "a state must be a sequence of floats");
    if (seq == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > self->floats) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "a state of %zd numbers does not fit an entry (%zd)", n, self->floats);
        goto fail;
    }
    /* Convert first: an error leaves the entry untouched. */
    double small[16];
    double *values = n <= 16 ? small : PyMem_Malloc(sizeof(double) * (size_t)n);
    if (values == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        goto fail;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        values[k] = PyFloat_AsDouble(items[k]);
        if (values[k] == -1.0 && PyErr_Occurred()) {
            if (values != small)
                PyMem_Free(values);
            Py_DECREF(seq);
            goto fail;
        }
    }
    Py_DECREF(seq);
    /* A check never moves an expiry earlier: a caller whose clock reads slightly late must not
     * shorten a newer window's life (and the region's next_expiry stays a bound). */
    double current;
    memcpy(&current, entry + E_BODY, 8);
    if (current > expires)
        expires = current;
    uint32_t length = (uint32_t)n;
    static const char pad[4] = {0, 0, 0, 0};
    *(volatile char *)entry = WRITING;
    FENCE();
    die(self, 1);
    memcpy(entry + E_BODY, &expires, 8);
    memcpy(entry + E_BODY + 8, &length, 4);
    memcpy(entry + E_BODY + 12, pad, 4);
    memcpy(entry + E_FLOATS, values, 8 * (size_t)n);
    FENCE();
    die(self, 2);
    *(volatile char *)entry = CLEAN;
    FENCE();
    keep_bound(region, expires);
    if (values != small)
        PyMem_Free(values);
    release(self, region);
    Py_RETURN_NONE;
fail:
    release(self, region);
    return NULL;
}

static PyObject *
Table_close(Table *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->open)
        Py_RETURN_NONE;
    if (self->busy > 0) {
        PyErr_SetString(PyExc_BufferError, "the shared-memory table is in use by another thread");
        return NULL;
    }
    self->open = 0;
    PyMem_Free(self->regions);
    self->regions = NULL;
    self->count = 0;
    PyBuffer_Release(&self->view);
    Py_RETURN_NONE;
}

static int
Table_init(Table *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"mm", "esize", "floats", "regions", NULL};
    PyObject *mm, *spans;
    Py_ssize_t esize, floats;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnnO:Table", kwlist, &mm, &esize, &floats, &spans))
        return -1;
    if (self->open) {
        PyErr_SetString(PyExc_RuntimeError, "Table is already initialised");
        return -1;
    }
    if (esize < E_FLOATS + 8 * floats || floats < 0) {
        PyErr_SetString(PyExc_ValueError, "entry size too small for its floats");
        return -1;
    }
    PyObject *seq = PySequence_Fast(spans, "regions must be a sequence of (base, index, entries, mask)");
    if (seq == NULL)
        return -1;
    if (PyObject_GetBuffer(mm, &self->view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(seq);
        return -1;
    }
    pthread_mutex_t fresh;
    pthread_mutexattr_t attr;
    memset(&fresh, 0, sizeof fresh);
    if (pthread_mutexattr_init(&attr) || pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)
        || pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) || pthread_mutex_init(&fresh, &attr)) {
        PyErr_SetString(PyExc_OSError, "cannot initialise a process-shared robust mutex");
        PyBuffer_Release(&self->view);
        Py_DECREF(seq);
        return -1;
    }
    pthread_mutexattr_destroy(&attr);
    self->words = 0;
    for (Py_ssize_t at = 0; at + 4 <= (Py_ssize_t)sizeof fresh && self->words < SIGNATURE_WORDS; at += 4) {
        uint32_t v = u32_at((const char *)&fresh + at);
        if (v) {
            self->word_at[self->words] = at;
            self->word[self->words++] = v;
        }
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    Region *regions = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Region));
    if (regions == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    char *mem = self->view.buf;
    Py_ssize_t len = self->view.len;
    for (Py_ssize_t r = 0; r < count; r++) {
        Py_ssize_t base, index, entries, mask;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, r), "nnnn", &base, &index, &entries, &mask))
            goto fail;
        if (base < 0 || base + MUTEX + (Py_ssize_t)sizeof(pthread_mutex_t) > len || mask < 0 || (mask & (mask + 1))
            || index < base + MUTEX + (Py_ssize_t)sizeof(pthread_mutex_t) || entries < index + 4 * (mask + 1)
            || entries > len) {
            PyErr_Format(PyExc_ValueError, "region %zd lies outside the mapping", r);
            goto fail;
        }
        regions[r].head = mem + base;
        regions[r].mutex = (pthread_mutex_t *)(mem + base + MUTEX);
        regions[r].index = mem + index;
        regions[r].entries = mem + entries;
        regions[r].mask = (uint64_t)mask;
        regions[r].room = len - entries;
    }
    Py_DECREF(seq);
    self->regions = regions;
    self->count = count;
    self->esize = esize;
    self->floats = floats;
    self->open = 1;
    return 0;
fail:
    PyMem_Free(regions);
    PyBuffer_Release(&self->view);
    Py_DECREF(seq);
    return -1;
}

static void
Table_dealloc(Table *self)
{
    if (self->open) {
        PyMem_Free(self->regions);
        PyBuffer_Release(&self->view);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Table_get_crash_at(Table *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->crash_at);
}

static int
Table_set_crash_at(Table *self, PyObject *value, void *Py_UNUSED(closure))
{
    long v = value == NULL ? 0 : PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    self->crash_at = (int)v;
    return 0;
}

static PyMethodDef Table_methods[] = {
    {"lock", (PyCFunction)(void (*)(void))Table_lock, METH_FASTCALL,
     "Lock region r's mutex within timeout seconds; returns 0 or the error (EOWNERDEAD: held)."},
    {"unlock", (PyCFunction)Table_unlock, METH_O, "Unlock region r's mutex."},
    {"consistent", (PyCFunction)Table_consistent, METH_O, "Mark region r's mutex consistent after EOWNERDEAD."},
    {"begin", (PyCFunction)(void (*)(void))Table_begin, METH_FASTCALL,
     "Lock region r and read the entry of digest: its state, None (expired) or an int (see the module)."},
    {"commit", (PyCFunction)(void (*)(void))Table_commit, METH_FASTCALL,
     "Write the entry begin() found (unless state is None; its expiry never earlier) and unlock region r."},
    {"close", (PyCFunction)Table_close, METH_NOARGS, "Release the mapping (refused while a lock is held)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Table_getset[] = {
    {"crash_at", (getter)Table_get_crash_at, (setter)Table_set_crash_at,
     "Tests: SIGKILL this process in commit() after marking the entry dirty (1) or after writing its state (2).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ratewarden.stores.shared_memory._native.Table",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One process's view of a shared table: its regions' mutexes and the one-key hot path.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_methods = Table_methods,
    .tp_getset = Table_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The shared-memory table's hot operations in C.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&TableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0
        || PyModule_AddIntConstant(m, "LAYOUT_VERSION", LAYOUT_VERSION) < 0
        || PyModule_AddIntConstant(m, "TIMED", TIMED) < 0
        || PyModule_AddIntConstant(m, "R_OP", R_OP) < 0
        || PyModule_AddIntConstant(m, "MUTEX", MUTEX) < 0
        || PyModule_AddIntConstant(m, "E_DIGEST", E_DIGEST) < 0
        || PyModule_AddIntConstant(m, "E_BODY", E_BODY) < 0
        || PyModule_AddIntConstant(m, "E_FLOATS", E_FLOATS) < 0
        || PyModule_AddIntConstant(m, "MUTEX_SIZE", (long)sizeof(pthread_mutex_t)) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
