/* Per-record XXH3-64 of a whole batch in one call (rows), and a batch's rows gathered from a
 * mapped file, each record checked as it is copied (gather): packdata/checksum.py's native path.
 *
 * Hashing a batch record by record from Python pays a numpy row view and a call per record,
 * and records whose fields are stored apart were first copied side by side into one table (a
 * pass over every byte). Here one loop, run without the GIL, hashes each record where it lies.
 * A record whose bytes come from several columns (an image and its label) is hashed from its
 * pieces where they lie by XXH3's streaming state (reset, update per piece, digest) when it is
 * large, and copied into one scratch buffer, then hashed in one call, when it is small: the
 * state's set-up and finish cost more than copying a small record (bench/bench_rowhash.py
 * measures both; `stream_above` is where the routine switches).
 *
 * The hash itself is not compiled here: bind() takes the addresses of xxhash's own XXH3-64
 * functions, resolved once in Python from the `xxhash` package's extension module, so the
 * digests are those of xxhash.xxh3_64_intdigest by construction (checksum.py also checks some at
 * import).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* xxhash's XXH3-64, one-shot and streaming (XXH3_state_t is opaque here: the library
 * allocates it). The error codes the streaming calls return are an enum, returned as an int. */
typedef uint64_t (*hash_fn)(const void *, size_t);
typedef void *(*create_fn)(void);
typedef int (*state_fn)(void *);
typedef int (*update_fn)(void *, const void *, size_t);
typedef uint64_t (*digest_fn)(const void *);

static hash_fn xxh3 = NULL;
static create_fn create_state = NULL;
static state_fn free_state = NULL, reset = NULL;
static update_fn update = NULL;
static digest_fn digest = NULL;

/* records of more bytes than this that come from several columns are streamed, not copied */
#define STREAM_ABOVE 1024
/* a checked gather copies about this many bytes of records, then hashes them (see gather) */
#define BLOCK_BYTES 65536
/* a gather asks for the rows of the record about this many bytes ahead of the one it copies */
#define PREFETCH_BYTES 12288
/* of each such row, its first bytes up to this many: past them the hardware follows a row */
#define PREFETCH_ROW_BYTES 4096
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(address) __builtin_prefetch((address), 0, 1) /* to read, kept in outer caches */
#else
#define PREFETCH(address) ((void)(address))
#endif
#define STRING(x) #x
#define STRING_OF(x) STRING(x)

/* One column: an array of n rows, row i `width` contiguous bytes at base + i * stride; or a
 * list of n buffers, record i's bytes those of pieces[i] (a variable-length field). */
typedef struct {
    Py_buffer view;
    Py_buffer *pieces;
    Py_ssize_t held; /* pieces acquired so far */
    const char *base;
    Py_ssize_t stride;
    Py_ssize_t width;
} column;

static PyObject *
bind(PyObject *self, PyObject *args)
{
    void *p[6];
    PyObject *a[6];
    if (!PyArg_ParseTuple(args, "OOOOOO:bind", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5]))
        return NULL;
    for (int k = 0; k < 6; k++) {
        p[k] = PyLong_AsVoidPtr(a[k]);
        if (p[k] == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "bind: function address %d is 0", k);
            return NULL;
        }
    }
    xxh3 = (hash_fn)(uintptr_t)p[0];
    create_state = (create_fn)(uintptr_t)p[1];
    free_state = (state_fn)(uintptr_t)p[2];
    reset = (state_fn)(uintptr_t)p[3];
    update = (update_fn)(uintptr_t)p[4];
    digest = (digest_fn)(uintptr_t)p[5];
    Py_RETURN_NONE;
}

static int
bound(void)
{
    if (xxh3 == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "packdata._rowhash: bind() the hash functions first");
        return 0;
    }
    return 1;
}

/* Rows of `obj` (its first axis), each row's bytes contiguous (the rows themselves may be
 * strided: an entry of each record, a slice of a table). */
static int
open_array(PyObject *obj, Py_ssize_t index, column *c)
{
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_STRIDES) < 0) {
        PyErr_Format(PyExc_ValueError, "column %zd: expected an array with one row per record "
                     "(a %.100s whose buffer has no strides)", index, Py_TYPE(obj)->tp_name);
        return 0;
    }
    Py_buffer *v = &c->view;
    if (v->ndim < 1) {
        PyErr_Format(PyExc_ValueError, "column %zd is 0-dimensional: it needs one row per record",
                     index);
        PyBuffer_Release(v);
        return 0;
    }
    Py_ssize_t width = v->itemsize;
    for (int d = v->ndim - 1; d >= 1; d--) {
        if (v->shape[d] > 1 && v->strides[d] != width) {
            PyErr_Format(PyExc_ValueError,
                         "column %zd: each row's bytes must lie together (C-contiguous within "
                         "a row); axis %d has stride %zd, not %zd", index, d, v->strides[d],
                         width);
            PyBuffer_Release(v);
            return 0;
        }
        width *= v->shape[d];
    }
    c->base = v->buf;
    c->stride = v->strides[0];
    c->width = width;
    return 1;
}

/* Record i's bytes: a contiguous buffer per item of the list or tuple `obj`. */
static int
open_pieces(PyObject *obj, Py_ssize_t index, column *c)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    c->pieces = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    if (c->pieces == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    for (; c->held < n; c->held++) {
        PyObject *item = PySequence_Fast_GET_ITEM(obj, c->held);
        if (PyObject_GetBuffer(item, &c->pieces[c->held], PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Format(PyExc_ValueError, "column %zd, record %zd: expected a C-contiguous "
                         "array or buffer, got a %.100s that is not", index, c->held,
                         Py_TYPE(item)->tp_name);
            return 0;
        }
    }
    return 1;
}

/* The column `obj`: an array (anything exporting a buffer), or a list or tuple of one buffer
 * per record. Its record count is `*rows`. */
static int
open_column(PyObject *obj, Py_ssize_t index, column *c, Py_ssize_t *rows)
{
    if (PyObject_CheckBuffer(obj)) {
        if (!open_array(obj, index, c))
            return 0;
        *rows = c->view.shape[0];
        return 1;
    }
    if (PyList_Check(obj) || PyTuple_Check(obj)) {
        *rows = PySequence_Fast_GET_SIZE(obj);
        return open_pieces(obj, index, c);
    }
    PyErr_Format(PyExc_TypeError, "column %zd: expected an array, or a list of one array per "
                 "record, got %.100s", index, Py_TYPE(obj)->tp_name);
    return 0;
}

static void
close_column(column *c)
{
    if (c->pieces == NULL) {
        PyBuffer_Release(&c->view);
        return;
    }
    for (Py_ssize_t i = 0; i < c->held; i++)
        PyBuffer_Release(&c->pieces[i]);
    PyMem_Free(c->pieces);
}

/* Record i's bytes in column c. */
static inline const char *
piece(const column *c, Py_ssize_t i, Py_ssize_t *len)
{
    if (c->pieces != NULL) {
        *len = c->pieces[i].len;
        return c->pieces[i].buf;
    }
    *len = c->width;
    return c->base + i * c->stride;
}

/* XXH3-64 of record i: its bytes in each of the m columns in order, streamed from its pieces
 * when there are several and it is larger than `stream_above`, else copied into `scratch`
 * (room for the largest such record) and hashed in one call. */
static inline uint64_t
hash_record(const column *cols, Py_ssize_t m, Py_ssize_t i, Py_ssize_t stream_above, void *state,
            char *scratch)
{
    Py_ssize_t len, total = 0;
    if (m == 1) {
        const char *bytes = piece(&cols[0], i, &len);
        return xxh3(bytes, (size_t)len);
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        piece(&cols[k], i, &len);
        total += len;
    }
    if (total > stream_above) {
        reset(state);
        for (Py_ssize_t k = 0; k < m; k++) {
            const char *bytes = piece(&cols[k], i, &len);
            update(state, bytes, (size_t)len);
        }
        return digest(state);
    }
    char *at = scratch;
    for (Py_ssize_t k = 0; k < m; k++) {
        const char *bytes = piece(&cols[k], i, &len);
        memcpy(at, bytes, (size_t)len);
        at += len;
    }
    return xxh3(scratch, (size_t)total);
}

/* `obj` as `count` uint64 (any number where count < 0), C-contiguous; writable where asked
 * (the output). `what` names it in errors. */
static int
open_uint64(PyObject *obj, const char *what, Py_ssize_t count, int writable, Py_buffer *v)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a%s contiguous array of uint64", what,
                     writable ? " writable," : "");
        return 0;
    }
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && PY_LITTLE_ENDIAN))
        f++;
    if (v->itemsize != 8 || (strcmp(f, "L") != 0 && strcmp(f, "Q") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s must hold 8-byte integers (uint64), not format '%s'",
                     what, v->format ? v->format : "B");
        PyBuffer_Release(v);
        return 0;
    }
    if (count >= 0 && v->len != 8 * count) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd values, expected %zd", what, v->len / 8,
                     count);
        PyBuffer_Release(v);
        return 0;
    }
    return 1;
}

PyDoc_STRVAR(rows_doc,
"rows(columns, out, stream_above=" STRING_OF(STREAM_ABOVE) ")\n--\n\n"
"Write into ``out`` (n uint64) the XXH3-64 of each record i: its bytes in each of ``columns`` in\n"
"order. A column is an array of n rows along its first axis, each row's bytes contiguous, or a\n"
"list of n C-contiguous arrays (or other buffers), one per record. With several columns, a\n"
"record of more than ``stream_above`` bytes is hashed from its pieces by XXH3's streaming\n"
"state, a smaller one copied into one buffer first (the digests are the same).");

static PyObject *
rows(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"columns", "out", "stream_above", NULL};
    PyObject *given, *out_obj;
    Py_ssize_t stream_above = STREAM_ABOVE;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|n:rows", keywords, &given, &out_obj,
                                     &stream_above) || !bound())
        return NULL;
    if (stream_above < 0)
        stream_above = 0;
    PyObject *seq = PySequence_Fast(given, "rows: columns must be a list of columns");
    if (seq == NULL)
        return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq), opened = 0, n = 0;
    PyObject *result = NULL;
    Py_buffer out;
    int have_out = 0;
    char *scratch = NULL;
    void *state = NULL;
    column *cols = PyMem_Calloc(m ? m : 1, sizeof(column));
    if (cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (m == 0) {
        PyErr_SetString(PyExc_ValueError, "rows: no columns");
        goto done;
    }
    for (; opened < m; opened++) {
        Py_ssize_t count;
        int ok = open_column(PySequence_Fast_GET_ITEM(seq, opened), opened, &cols[opened], &count);
        if (ok && opened == 0)
            n = count;
        else if (ok && count != n) {
            PyErr_Format(PyExc_ValueError, "column %zd has %zd records, column 0 has %zd", opened,
                         count, n);
            ok = 0;
        }
        if (!ok) {
            opened++; /* what open_column acquired before failing is released below */
            goto done;
        }
    }
    if (!open_uint64(out_obj, "out", n, 1, &out))
        goto done;
    have_out = 1;
    /* the largest record copied (the scratch buffer's size), whether any is streamed */
    Py_ssize_t copied = 0, streamed = 0;
    if (m > 1) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t total = 0, len;
            for (Py_ssize_t k = 0; k < m; k++) {
                piece(&cols[k], i, &len);
                if (len > PY_SSIZE_T_MAX - total) {
                    PyErr_SetString(PyExc_OverflowError, "rows: a record's size overflows");
                    goto done;
                }
                total += len;
            }
            if (total > stream_above)
                streamed = 1;
            else if (total > copied)
                copied = total;
        }
        if ((scratch = PyMem_RawMalloc(copied ? copied : 1)) == NULL ||
            (streamed && (state = create_state()) == NULL)) {
            PyErr_NoMemory();
            goto done;
        }
    }
    uint64_t *digests = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        digests[i] = hash_record(cols, m, i, stream_above, state, scratch);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    if (state != NULL)
        free_state(state);
    PyMem_RawFree(scratch);
    if (have_out)
        PyBuffer_Release(&out);
    for (Py_ssize_t k = 0; k < opened; k++)
        close_column(&cols[k]);
    PyMem_Free(cols);
    Py_DECREF(seq);
    return result;
}

/* `obj` as n int64 values (C-contiguous), named `what` in errors. */
static int
open_int64(PyObject *obj, const char *what, Py_ssize_t n, Py_buffer *v)
{
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous array of int64", what);
        return 0;
    }
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && PY_LITTLE_ENDIAN))
        f++;
    if (v->itemsize != 8 || (strcmp(f, "l") != 0 && strcmp(f, "q") != 0) ||
        (n >= 0 && v->len != 8 * n)) {
        PyErr_Format(PyExc_ValueError, "%s must hold %zd int64 values (got %zd of format '%s')",
                     what, n, v->len / (v->itemsize ? v->itemsize : 1),
                     v->format ? v->format : "B");
        PyBuffer_Release(v);
        return 0;
    }
    return 1;
}

/* The check a gather makes: expected[j] is row j's checksum, records[j] its bit in verified (set
 * here as rows pass; a record's number, or one bit per entry where entries are checked apart). */
typedef struct {
    Py_buffer records, expected, verified;
    int held; /* buffers acquired so far */
} check;

static void
close_check(check *c)
{
    Py_buffer *b[3] = {&c->records, &c->expected, &c->verified};
    for (int k = 0; k < c->held; k++)
        PyBuffer_Release(b[k]);
}

static int
open_check(PyObject *records, PyObject *expected, PyObject *verified, Py_ssize_t n, check *c)
{
    if (!open_int64(records, "records", n, &c->records))
        return 0;
    c->held = 1;
    if (!open_uint64(expected, "expected", n, 0, &c->expected))
        return 0;
    c->held = 2;
    if (PyObject_GetBuffer(verified, &c->verified, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_SetString(PyExc_ValueError, "verified must be a writable, contiguous bitmap");
        return 0;
    }
    c->held = 3;
    Py_ssize_t bits = 8 * c->verified.len;
    const int64_t *r = c->records.buf;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (r[j] < 0 || r[j] >= bits) {
            PyErr_Format(PyExc_IndexError, "record %lld is outside verified's %zd bits",
                         (long long)r[j], bits);
            return 0;
        }
    }
    return 1;
}

/* Set bit r of `bits`; whether it was clear. Atomic: loader threads check batches at once, and
 * a bit lost to a race would make the count of checked records wrong. */
static inline int
mark(unsigned char *bits, int64_t r)
{
    unsigned char bit = (unsigned char)(1u << (r & 7));
#if defined(__GNUC__) || defined(__clang__)
    return !(__atomic_fetch_or(&bits[r >> 3], bit, __ATOMIC_RELAXED) & bit);
#else
    int was = !(bits[r >> 3] & bit);
    bits[r >> 3] |= bit;
    return was;
#endif
}

static inline int
marked(const unsigned char *bits, int64_t r)
{
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_load_n(&bits[r >> 3], __ATOMIC_RELAXED) & (1u << (r & 7));
#else
    return bits[r >> 3] & (1u << (r & 7));
#endif
}

PyDoc_STRVAR(gather_doc,
"gather(columns, rows, outs, records=None, expected=None, verified=None, stream_above="
STRING_OF(STREAM_ABOVE) ", block_bytes=" STRING_OF(BLOCK_BYTES) ", prefetch_bytes="
STRING_OF(PREFETCH_BYTES) ")\n--\n\n"
"Copy row ``rows[k][j]`` of each column k (an array of rows, each row's bytes contiguous; rows\n"
"may be strided, even overlap, over a mapped file) to row j of ``outs[k]`` (writable,\n"
"C-contiguous, n rows of that width), for j < n. Every row number is checked first\n"
"(IndexError).\n\n"
"Given ``records`` (n int64: the bit of each row's record in ``verified``, a bitmap, bit b of\n"
"byte b >> 3), ``expected`` (n uint64: each row's checksum) and ``verified``, each record j\n"
"whose bit is clear is hashed (XXH3-64 of its rows in column order) as it was copied, compared\n"
"with ``expected[j]`` and its bit set. Returns (first, checked): the position j of the first\n"
"record that does not match (-1 if none; the rows after it are not copied), and how many bits\n"
"this call set. ``stream_above`` is :func:`rows`'; records are copied about ``block_bytes`` at a\n"
"time, then hashed. While a record is copied, the rows of the record about ``prefetch_bytes``\n"
"ahead (their first " STRING_OF(PREFETCH_ROW_BYTES) " bytes each) are requested from memory (0: none).");

static PyObject *
gather(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"columns", "rows", "outs", "records", "expected", "verified",
                               "stream_above", "block_bytes", "prefetch_bytes", NULL};
    PyObject *given, *rows_obj, *outs_obj, *records = Py_None, *expected = Py_None,
                                            *verified = Py_None;
    Py_ssize_t stream_above = STREAM_ABOVE, block_bytes = BLOCK_BYTES,
               prefetch_bytes = PREFETCH_BYTES;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOOnnn:gather", keywords, &given,
                                     &rows_obj, &outs_obj, &records, &expected, &verified,
                                     &stream_above, &block_bytes, &prefetch_bytes))
        return NULL;
    int checking = records != Py_None;
    if (checking && (expected == Py_None || verified == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "gather: records needs expected and verified");
        return NULL;
    }
    if (checking && !bound())
        return NULL;
    PyObject *seq = PySequence_Fast(given, "gather: columns must be a list of arrays");
    if (seq == NULL)
        return NULL;
    PyObject *rseq = PySequence_Fast(rows_obj, "gather: rows must be a list of arrays");
    PyObject *oseq = rseq ? PySequence_Fast(outs_obj, "gather: outs must be a list of arrays")
                          : NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq), n = -1, opened = 0, rows_held = 0,
               outs_held = 0;
    PyObject *result = NULL;
    column *cols = PyMem_Calloc(m ? m : 1, sizeof(column));
    Py_buffer *rows_b = PyMem_Calloc(m ? m : 1, sizeof(Py_buffer));
    Py_buffer *outs_b = PyMem_Calloc(m ? m : 1, sizeof(Py_buffer));
    check chk = {.held = 0};
    char *scratch = NULL;
    column *copied = NULL; /* the outs, as columns the hash reads the copied rows from */
    void *state = NULL;
    if (oseq == NULL)
        goto done;
    if (cols == NULL || rows_b == NULL || outs_b == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (m == 0 || PySequence_Fast_GET_SIZE(rseq) != m || PySequence_Fast_GET_SIZE(oseq) != m) {
        PyErr_Format(PyExc_ValueError, "gather: %zd columns, %zd row arrays, %zd outs: expected "
                     "as many of each (at least one)", m, PySequence_Fast_GET_SIZE(rseq),
                     PySequence_Fast_GET_SIZE(oseq));
        goto done;
    }
    Py_ssize_t record_bytes = 0;
    for (; opened < m; opened++) {
        column *c = &cols[opened];
        if (!open_array(PySequence_Fast_GET_ITEM(seq, opened), opened, c)) {
            goto done;
        }
        if (!open_int64(PySequence_Fast_GET_ITEM(rseq, opened), "rows", n, &rows_b[opened])) {
            opened++;
            goto done;
        }
        rows_held++;
        if (n < 0)
            n = rows_b[opened].len / 8;
        Py_buffer *o = &outs_b[opened];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(oseq, opened), o,
                               PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            PyErr_Format(PyExc_ValueError, "out %zd must be a writable, C-contiguous array",
                         opened);
            opened++;
            goto done;
        }
        outs_held++;
        if (o->len != n * c->width) {
            PyErr_Format(PyExc_ValueError, "out %zd holds %zd bytes, expected %zd rows of %zd",
                         opened, o->len, n, c->width);
            opened++;
            goto done;
        }
        const int64_t *r = rows_b[opened].buf;
        Py_ssize_t limit = c->view.shape[0];
        for (Py_ssize_t j = 0; j < n; j++) {
            if (r[j] < 0 || r[j] >= limit) {
                PyErr_Format(PyExc_IndexError, "row %lld is outside column %zd's %zd rows",
                             (long long)r[j], opened, limit);
                opened++;
                goto done;
            }
        }
        record_bytes += c->width;
    }
    if (checking) {
        if (!open_check(records, expected, verified, n, &chk))
            goto done;
        if ((copied = PyMem_Calloc(m, sizeof(column))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t k = 0; k < m; k++) {
            copied[k].base = outs_b[k].buf;
            copied[k].stride = copied[k].width = cols[k].width;
        }
        if (m > 1 && ((scratch = PyMem_RawMalloc(record_bytes ? record_bytes : 1)) == NULL ||
                      (record_bytes > stream_above && (state = create_state()) == NULL))) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_ssize_t first_bad = -1, newly = 0;
    Py_BEGIN_ALLOW_THREADS
    const int64_t *record = checking ? chk.records.buf : NULL;
    const uint64_t *sums = checking ? chk.expected.buf : NULL;
    unsigned char *bits = checking ? chk.verified.buf : NULL;
    /* Rows are copied a block at a time, then the block's records hashed: copies back to back
     * keep many loads from memory in flight, where a hash after each copy would wait for each
     * record's bytes in turn; a block stays in the CPU's cache until it is hashed. */
    Py_ssize_t block = record_bytes ? block_bytes / record_bytes : n;
    if (block < 1)
        block = 1;
    /* Rows lie at random in a file many times the CPU's caches, and the hardware's own
     * prefetcher only follows a row once it has started: asking for the rows a few records
     * ahead keeps loads from memory in flight while this record is copied (bench_rowhash). */
    Py_ssize_t ahead = 0;
    if (prefetch_bytes > 0)
        ahead = record_bytes > 0 && prefetch_bytes / record_bytes > 1 ? prefetch_bytes / record_bytes
                                                                      : 1;
    for (Py_ssize_t start = 0; start < n && first_bad < 0; start += block) {
        Py_ssize_t end = start + block < n ? start + block : n;
        for (Py_ssize_t j = start; j < end; j++) {
            /* written out here: in a helper function, GCC deems the prefetches free of effects
             * and drops the call */
            if (ahead && j + ahead < n) {
                for (Py_ssize_t k = 0; k < m; k++) {
                    const column *c = &cols[k];
                    const char *row = c->base + ((const int64_t *)rows_b[k].buf)[j + ahead] * c->stride;
                    for (Py_ssize_t at = 0; at < c->width && at < PREFETCH_ROW_BYTES; at += 64)
                        PREFETCH(row + at);
                }
            }
            for (Py_ssize_t k = 0; k < m; k++) {
                const column *c = &cols[k];
                memcpy((char *)outs_b[k].buf + j * c->width,
                       c->base + ((const int64_t *)rows_b[k].buf)[j] * c->stride,
                       (size_t)c->width);
            }
        }
        for (Py_ssize_t j = start; checking && j < end; j++) {
            if (marked(bits, record[j]))
                continue;
            /* hashed from the rows copied (in cache): what the read returns is what was checked */
            if (hash_record(copied, m, j, stream_above, state, scratch) != sums[j]) {
                first_bad = j;
                break;
            }
            newly += mark(bits, record[j]);
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nn", first_bad, newly);
done:
    if (state != NULL)
        free_state(state);
    PyMem_RawFree(scratch);
    PyMem_Free(copied);
    close_check(&chk);
    for (Py_ssize_t k = 0; k < outs_held; k++)
        PyBuffer_Release(&outs_b[k]);
    for (Py_ssize_t k = 0; k < rows_held; k++)
        PyBuffer_Release(&rows_b[k]);
    for (Py_ssize_t k = 0; k < opened; k++)
        close_column(&cols[k]);
    PyMem_Free(cols);
    PyMem_Free(rows_b);
    PyMem_Free(outs_b);
    Py_XDECREF(oseq);
    Py_XDECREF(rseq);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(xxh3, create_state, free_state, reset, update, digest)\n--\n\n"
     "Use the functions at these addresses from now on: xxhash's XXH3_64bits, XXH3_createState,\n"
     "XXH3_freeState, XXH3_64bits_reset, XXH3_64bits_update and XXH3_64bits_digest."},
    {"rows", (PyCFunction)(void (*)(void))rows, METH_VARARGS | METH_KEYWORDS, rows_doc},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_VARARGS | METH_KEYWORDS, gather_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "packdata._rowhash",
    "Per-record XXH3-64 of a batch, and a batch's rows gathered and checked, in one call "
    "(packdata.checksum's native path).", -1, methods,
};

PyMODINIT_FUNC
PyInit__rowhash(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "STREAM_ABOVE", STREAM_ABOVE) < 0)
        Py_CLEAR(m);
    return m;
}
