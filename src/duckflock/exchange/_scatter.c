/* Scatter the rows of Arrow buffers into per-target regions in one pass (exchange/scatter.py).
 *
 * numpy and Arrow can only gather (``take``): one pass per target, or a sort, then one gather per
 * target and column. Here each column is read once, in row order, and every row is written to the
 * next free slot of its target's region: a histogram of targets gives each region's size and start.
 * Buffers come through the buffer protocol (no numpy or Arrow headers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Calls over at least this many rows let the rank's other threads run meanwhile (a stage's
 * DuckDB, other stages); shorter ones keep the GIL: a thread that lets go of it for a few
 * microseconds at a time waits to get it back behind the others at every call. */
#define RELEASE_ROWS 16384
#define LET_GO(n) PyThreadState *ts_ = (n) >= RELEASE_ROWS ? PyEval_SaveThread() : NULL
#define TAKE_BACK() if (ts_) PyEval_RestoreThread(ts_)

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static int get(PyObject *obj, Buf *b, int writable, Py_ssize_t at_least, const char *what) {
    if (PyObject_GetBuffer(obj, &b->view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    b->held = 1;
    if (b->view.len < at_least) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, needs %zd", what, b->view.len, at_least);
        return -1;
    }
    return 0;
}

static void release(Buf *b) {
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
}

/* histogram(targets: uint16[n], size, counts: int64[size]) -> None; a target >= size is an error. */
static PyObject *histogram(PyObject *self, PyObject *args) {
    PyObject *t_obj, *c_obj;
    Py_ssize_t size;
    Buf t = {0}, c = {0};
    if (!PyArg_ParseTuple(args, "OnO", &t_obj, &size, &c_obj)) return NULL;
    if (get(t_obj, &t, 0, 0, "targets") < 0 || get(c_obj, &c, 1, size * 8, "counts") < 0) goto fail;
    const uint16_t *tv = t.view.buf;
    int64_t *cv = c.view.buf;
    Py_ssize_t n = t.view.len / 2, bad = 0;
    /* Four interleaved histograms: consecutive rows of one target do not wait on each other's store. */
    int64_t *part = PyMem_RawCalloc(4 * (size_t)size + 1, sizeof(int64_t));
    if (!part) { PyErr_NoMemory(); goto fail; }
    Py_ssize_t i = 0;
    LET_GO(n);
    for (; i + 4 <= n; i += 4) {
        uint16_t a = tv[i], b = tv[i + 1], c2 = tv[i + 2], d = tv[i + 3];
        if (a >= size || b >= size || c2 >= size || d >= size) { bad = 1; break; }
        part[a]++;
        part[size + b]++;
        part[2 * size + c2]++;
        part[3 * size + d]++;
    }
    for (; i < n && !bad; i++) {
        if (tv[i] >= size) bad = 1;
        else part[tv[i]]++;
    }
    for (Py_ssize_t k = 0; k < size; k++) cv[k] = part[k] + part[size + k] + part[2 * size + k] + part[3 * size + k];
    TAKE_BACK();
    PyMem_RawFree(part);
    release(&t);
    release(&c);
    if (bad) return PyErr_Format(PyExc_ValueError, "a target rank outside 0..%zd", size - 1);
    Py_RETURN_NONE;
fail:
    release(&t);
    release(&c);
    return NULL;
}

/* Each target's own output: ``outs`` is a list of ``size`` writable buffers (None for a target
 * without rows). Fills bufs/base/len; 0, or -1 with an error set (buffers got so far are in bufs). */
static int outputs(PyObject *outs, Py_ssize_t size, Buf *bufs, char **base, int64_t *len) {
    if (!PyList_Check(outs) || PyList_GET_SIZE(outs) != size) {
        PyErr_Format(PyExc_ValueError, "outputs: a list of %zd buffers", size);
        return -1;
    }
    for (Py_ssize_t t = 0; t < size; t++) {
        PyObject *o = PyList_GET_ITEM(outs, t);
        base[t] = NULL;
        len[t] = 0;
        if (o == Py_None) continue;
        if (get(o, &bufs[t], 1, 0, "output") < 0) return -1;
        base[t] = bufs[t].view.buf;
        len[t] = bufs[t].view.len;
    }
    return 0;
}

/* The per-target state of one call: outputs, their lengths, cursors. */
typedef struct {
    Py_ssize_t size;
    Buf *bufs;
    char **base;
    int64_t *len;
} Outs;

static int open_outs(Outs *o, PyObject *list, Py_ssize_t size) {
    o->size = size;
    o->bufs = PyMem_RawCalloc(size ? size : 1, sizeof(Buf));
    o->base = PyMem_RawCalloc(size ? size : 1, sizeof(char *));
    o->len = PyMem_RawCalloc(size ? size : 1, sizeof(int64_t));
    if (!o->bufs || !o->base || !o->len) {
        PyErr_NoMemory();
        return -1;
    }
    return outputs(list, size, o->bufs, o->base, o->len);
}

static void close_outs(Outs *o) {
    if (o->bufs)
        for (Py_ssize_t t = 0; t < o->size; t++) release(&o->bufs[t]);
    PyMem_RawFree(o->bufs);
    PyMem_RawFree(o->base);
    PyMem_RawFree(o->len);
    o->bufs = NULL;
    o->base = NULL;
    o->len = NULL;
}

/* The cursors ``at`` (one per target, in units of 1/scale byte: 8 for bits) each inside their
 * target's output and a multiple of ``unit``; 0, or -1 with an error set. A scatter of several
 * chunks of one column carries them from one call to the next. */
static int inside(const Buf *at, const int64_t *len, Py_ssize_t size, int64_t scale, int64_t unit) {
    const int64_t *a = at->view.buf;
    if (at->view.len != size * 8) goto bad;
    for (Py_ssize_t t = 0; t < size; t++)
        if (a[t] < 0 || a[t] > len[t] * scale || a[t] % unit) goto bad;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "cursors outside their outputs");
    return -1;
}

/* A row whose target is outside 0..size-1, or whose output is full, stops the pass: ``bad``. */
#define SCATTER(T)                                                  \
    do {                                                            \
        const T *s = (const T *)src;                                \
        for (Py_ssize_t i = 0; i < n; i++) {                        \
            uint16_t tg = tv[i];                                    \
            if (tg >= size || cur[tg] >= end[tg]) { bad = 1; break; } \
            ((T *)o.base[tg])[cur[tg]++] = s[i];                    \
        }                                                           \
    } while (0)

typedef struct { uint64_t a, b; } u128;
typedef struct { uint64_t a, b, c, d; } u256;

/* scatter_fixed(src, src_offset_bytes, width, targets, at: int64[size], outs) -> None: row i's
 * ``width`` bytes go to its target's output at its cursor ``at`` (bytes), which moves on. */
static PyObject *scatter_fixed(PyObject *self, PyObject *args) {
    PyObject *s_obj, *t_obj, *a_obj, *outs;
    Py_ssize_t offset, width, size;
    Buf s = {0}, t = {0}, a = {0};
    Outs o = {0};
    int64_t *cur = NULL;
    int bad = 0;
    if (!PyArg_ParseTuple(args, "OnnOOO", &s_obj, &offset, &width, &t_obj, &a_obj, &outs)) return NULL;
    if (width <= 0 || offset < 0) return PyErr_Format(PyExc_ValueError, "width %zd, offset %zd", width, offset);
    if (get(t_obj, &t, 0, 0, "targets") < 0) goto fail;
    Py_ssize_t n = t.view.len / 2;
    if (get(s_obj, &s, 0, offset + n * width, "values") < 0 || get(a_obj, &a, 1, 0, "cursors") < 0) goto fail;
    size = a.view.len / 8;
    if (open_outs(&o, outs, size) < 0 || inside(&a, o.len, size, 1, width) < 0) goto fail;
    cur = PyMem_RawMalloc((2 * size + 1) * sizeof(int64_t));
    if (!cur) { PyErr_NoMemory(); goto fail; }
    int64_t *end = cur + size, *at = a.view.buf;
    for (Py_ssize_t k = 0; k < size; k++) {
        cur[k] = at[k] / width;
        end[k] = o.len[k] / width;
    }
    const uint16_t *tv = t.view.buf;
    const char *src = (const char *)s.view.buf + offset;
    LET_GO(n);
    switch (width) {
    case 1: SCATTER(uint8_t); break;
    case 2: SCATTER(uint16_t); break;
    case 4: SCATTER(uint32_t); break;
    case 8: SCATTER(uint64_t); break;
    case 16: SCATTER(u128); break;
    case 32: SCATTER(u256); break;
    default:
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t tg = tv[i];
            if (tg >= size || cur[tg] >= end[tg]) { bad = 1; break; }
            memcpy(o.base[tg] + (cur[tg]++) * width, src + i * width, width);
        }
    }
    TAKE_BACK();
    for (Py_ssize_t k = 0; k < size; k++) at[k] = cur[k] * width;
    PyMem_RawFree(cur);
    release(&s); release(&t); release(&a); close_outs(&o);
    if (bad) return PyErr_Format(PyExc_ValueError, "a target outside 0..%zd or past its output", size - 1);
    Py_RETURN_NONE;
fail:
    PyMem_RawFree(cur);
    release(&s); release(&t); release(&a); close_outs(&o);
    return NULL;
}

/* scatter_bits(src or None, src_bit_offset, targets, at: int64[size] (bits), outs, ones: int64[size])
 * -> None: bit i (1 where ``src`` is None) goes to its target's output at its cursor, which moves
 * on; ``ones`` adds up the set bits per target (a validity bitmap's valid rows). A byte's first
 * bit sets it whole, so outputs need not come zeroed. */
static PyObject *scatter_bits(PyObject *self, PyObject *args) {
    PyObject *s_obj, *t_obj, *a_obj, *outs, *n_obj;
    Py_ssize_t offset, size;
    Buf s = {0}, t = {0}, a = {0}, ones_b = {0};
    Outs o = {0};
    int bad = 0;
    if (!PyArg_ParseTuple(args, "OnOOOO", &s_obj, &offset, &t_obj, &a_obj, &outs, &n_obj)) return NULL;
    if (offset < 0) return PyErr_Format(PyExc_ValueError, "offset %zd", offset);
    if (get(t_obj, &t, 0, 0, "targets") < 0) goto fail;
    Py_ssize_t n = t.view.len / 2;
    int all_set = s_obj == Py_None;
    if ((!all_set && get(s_obj, &s, 0, (offset + n + 7) / 8, "bitmap") < 0) || get(a_obj, &a, 1, 0, "cursors") < 0)
        goto fail;
    size = a.view.len / 8;
    if (open_outs(&o, outs, size) < 0 || inside(&a, o.len, size, 8, 1) < 0 ||
        get(n_obj, &ones_b, 1, size * 8, "ones") < 0)
        goto fail;
    const uint16_t *tv = t.view.buf;
    const uint8_t *src = all_set ? NULL : s.view.buf;
    int64_t *ones = ones_b.view.buf, *cur = a.view.buf;
    LET_GO(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = offset + i;
        uint16_t tg = tv[i];
        if (tg >= size || cur[tg] >= o.len[tg] * 8) { bad = 1; break; }
        int64_t at = cur[tg]++;
        uint8_t bit = !src || ((src[k >> 3] >> (k & 7)) & 1);
        uint8_t *byte = (uint8_t *)o.base[tg] + (at >> 3);
        if (at & 7) *byte |= (uint8_t)(bit << (at & 7));
        else *byte = bit;
        ones[tg] += bit;
    }
    TAKE_BACK();
    release(&s); release(&t); release(&a); release(&ones_b); close_outs(&o);
    if (bad) return PyErr_Format(PyExc_ValueError, "a target outside 0..%zd or past its output", size - 1);
    Py_RETURN_NONE;
fail:
    release(&s); release(&t); release(&a); release(&ones_b); close_outs(&o);
    return NULL;
}

static inline int64_t off_at(const void *offs, int wide, Py_ssize_t i) {
    return wide ? ((const int64_t *)offs)[i] : (int64_t)((const int32_t *)offs)[i];
}

/* var_sizes(offsets, offset_width (4|8), row_offset, targets, sizes: int64[size]) -> None: adds
 * each row's bytes of variable-width data to its target's size. */
static PyObject *var_sizes(PyObject *self, PyObject *args) {
    PyObject *f_obj, *t_obj, *z_obj;
    Py_ssize_t owidth, row;
    Buf f = {0}, t = {0}, z = {0};
    if (!PyArg_ParseTuple(args, "OnnOO", &f_obj, &owidth, &row, &t_obj, &z_obj)) return NULL;
    if ((owidth != 4 && owidth != 8) || row < 0) return PyErr_Format(PyExc_ValueError, "offset width %zd", owidth);
    if (get(t_obj, &t, 0, 0, "targets") < 0 || get(z_obj, &z, 1, 0, "sizes") < 0) goto fail;
    Py_ssize_t n = t.view.len / 2, size = z.view.len / 8;
    if (get(f_obj, &f, 0, (row + n + 1) * owidth, "offsets") < 0) goto fail;
    const uint16_t *tv = t.view.buf;
    int64_t *sz = z.view.buf;
    const void *offs = f.view.buf;
    int wide = owidth == 8, bad = 0;
    LET_GO(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (tv[i] >= size) { bad = 1; break; }
        sz[tv[i]] += off_at(offs, wide, row + i + 1) - off_at(offs, wide, row + i);
    }
    TAKE_BACK();
    release(&f); release(&t); release(&z);
    if (bad) return PyErr_Format(PyExc_ValueError, "a target outside 0..%zd", size - 1);
    Py_RETURN_NONE;
fail:
    release(&f); release(&t); release(&z);
    return NULL;
}

/* scatter_var(offsets, offset_width, row_offset, data, targets, slot: int64[size] (bytes into the
 * target's offsets: the next offset to write), pos: int64[size] (bytes into its data), out_offsets,
 * out_data) -> None: each row's bytes go to its target's data at ``pos``, and where they end to
 * its offsets at ``slot``; both move on. Each output's first offset (0) is the caller's to write. */
static PyObject *scatter_var(PyObject *self, PyObject *args) {
    PyObject *f_obj, *v_obj, *t_obj, *sl_obj, *p_obj, *of_list, *od_list;
    Py_ssize_t owidth, row, size;
    Buf f = {0}, v = {0}, t = {0}, sl = {0}, p = {0};
    Outs of = {0}, od = {0};
    if (!PyArg_ParseTuple(args, "OnnOOOOOO", &f_obj, &owidth, &row, &v_obj, &t_obj, &sl_obj, &p_obj, &of_list,
                          &od_list))
        return NULL;
    if ((owidth != 4 && owidth != 8) || row < 0) return PyErr_Format(PyExc_ValueError, "offset width %zd", owidth);
    if (get(t_obj, &t, 0, 0, "targets") < 0) goto fail;
    Py_ssize_t n = t.view.len / 2;
    if (get(f_obj, &f, 0, (row + n + 1) * owidth, "offsets") < 0 || get(v_obj, &v, 0, 0, "data") < 0 ||
        get(sl_obj, &sl, 1, 0, "slots") < 0 || get(p_obj, &p, 1, 0, "positions") < 0)
        goto fail;
    size = sl.view.len / 8;
    if (open_outs(&of, of_list, size) < 0 || open_outs(&od, od_list, size) < 0 ||
        inside(&sl, of.len, size, 1, owidth) < 0 || inside(&p, od.len, size, 1, 1) < 0)
        goto fail;
    const uint16_t *tv = t.view.buf;
    const void *offs = f.view.buf;
    const char *data = v.view.buf;
    int64_t *slot = sl.view.buf, *pos = p.view.buf;
    int wide = owidth == 8, bad = 0;
    int64_t vlen = v.view.len;
    LET_GO(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint16_t tg = tv[i];
        if (tg >= size || slot[tg] + owidth > of.len[tg]) { bad = 1; break; }
        int64_t a = off_at(offs, wide, row + i), len = off_at(offs, wide, row + i + 1) - a;
        if (a < 0 || len < 0 || a + len > vlen || pos[tg] + len > od.len[tg]) { bad = 1; break; }
        memcpy(od.base[tg] + pos[tg], data + a, len);
        pos[tg] += len;
        if (wide) *(int64_t *)(of.base[tg] + slot[tg]) = pos[tg];
        else *(int32_t *)(of.base[tg] + slot[tg]) = (int32_t)pos[tg];
        slot[tg] += owidth;
    }
    TAKE_BACK();
    release(&f); release(&v); release(&t); release(&sl); release(&p); close_outs(&of); close_outs(&od);
    if (bad) return PyErr_Format(PyExc_ValueError, "variable-width rows outside their outputs");
    Py_RETURN_NONE;
fail:
    release(&f); release(&v); release(&t); release(&sl); release(&p); close_outs(&of); close_outs(&od);
    return NULL;
}

static PyMethodDef methods[] = {
    {"histogram", histogram, METH_VARARGS, "Rows per target; a target outside 0..size-1 is an error."},
    {"scatter_fixed", scatter_fixed, METH_VARARGS, "Scatter fixed-width values into per-target regions."},
    {"scatter_bits", scatter_bits, METH_VARARGS, "Scatter a bitmap into per-target regions."},
    {"var_sizes", var_sizes, METH_VARARGS, "Bytes of variable-width data per target."},
    {"scatter_var", scatter_var, METH_VARARGS, "Scatter variable-width offsets and data per target."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_scatter", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__scatter(void) { return PyModule_Create(&module); }
