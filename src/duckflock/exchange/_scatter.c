/* Scatter the rows of Arrow buffers into per-target regions in one pass (exchange/scatter.py).
 *
 * numpy and Arrow can only gather (``take``): one pass per target, or a sort, then one gather per
 * target and column. Here each column is read once, in row order, and every row is written to the
 * next free slot of its target's region: a histogram of targets gives each region's size and start.
 * Buffers come through the buffer protocol (no numpy or Arrow headers); the loops run without the
 * GIL, so ranks that are threads of one process split at the same time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
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
    Py_END_ALLOW_THREADS
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

/* Region t of an output is [starts[t], starts[t + 1]) bytes: ``starts`` holds size + 1 ascending
 * offsets inside the output. Returns size, or -1 with an error set. */
static Py_ssize_t regions(const Buf *starts, Py_ssize_t out_len) {
    const int64_t *st = starts->view.buf;
    Py_ssize_t size = starts->view.len / 8 - 1;
    if (size < 0 || st[0] < 0 || st[size] > out_len) goto bad;
    for (Py_ssize_t t = 0; t < size; t++)
        if (st[t] > st[t + 1]) goto bad;
    return size;
bad:
    PyErr_SetString(PyExc_ValueError, "output regions outside the output");
    return -1;
}

/* The cursors ``at`` (one per target, in units of 1/scale byte: 8 for bits) each inside their
 * target's region and a multiple of ``unit``; 0, or -1 with an error set. A scatter of several
 * chunks of one column carries them from one call to the next. */
static int inside(const Buf *at, const Buf *starts, Py_ssize_t size, int64_t scale, int64_t unit) {
    const int64_t *a = at->view.buf, *st = starts->view.buf;
    if (at->view.len < size * 8) goto bad;
    for (Py_ssize_t t = 0; t < size; t++)
        if (a[t] < st[t] * scale || a[t] > st[t + 1] * scale || a[t] % unit || (st[t] * scale) % unit) goto bad;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "cursors outside their regions");
    return -1;
}

/* A row whose target is outside the regions, or whose region is full, stops the pass: ``bad``. */
#define SCATTER(T)                                                  \
    do {                                                            \
        const T *s = (const T *)src;                                \
        T *d = (T *)dst;                                            \
        for (Py_ssize_t i = 0; i < n; i++) {                        \
            uint16_t tg = tv[i];                                    \
            if (tg >= size || cur[tg] >= end[tg]) { bad = 1; break; } \
            d[cur[tg]++] = s[i];                                    \
        }                                                           \
    } while (0)

typedef struct { uint64_t a, b; } u128;
typedef struct { uint64_t a, b, c, d; } u256;

/* scatter_fixed(src, src_offset_bytes, width, targets, starts: int64[size + 1], at: int64[size],
 * dst) -> None: row i's ``width`` bytes go to its target's cursor ``at`` (bytes into dst), which
 * moves on. */
static PyObject *scatter_fixed(PyObject *self, PyObject *args) {
    PyObject *s_obj, *t_obj, *st_obj, *a_obj, *d_obj;
    Py_ssize_t offset, width, size;
    Buf s = {0}, t = {0}, st = {0}, a = {0}, d = {0};
    int bad = 0;
    if (!PyArg_ParseTuple(args, "OnnOOOO", &s_obj, &offset, &width, &t_obj, &st_obj, &a_obj, &d_obj)) return NULL;
    if (width <= 0 || offset < 0) return PyErr_Format(PyExc_ValueError, "width %zd, offset %zd", width, offset);
    if (get(t_obj, &t, 0, 0, "targets") < 0) goto fail;
    Py_ssize_t n = t.view.len / 2;
    if (get(s_obj, &s, 0, offset + n * width, "values") < 0 || get(st_obj, &st, 0, 8, "starts") < 0 ||
        get(a_obj, &a, 1, 0, "cursors") < 0 || get(d_obj, &d, 1, 0, "output") < 0 ||
        (size = regions(&st, d.view.len)) < 0 || inside(&a, &st, size, 1, width) < 0)
        goto fail;
    int64_t *cur = PyMem_RawMalloc((2 * size + 1) * sizeof(int64_t)), *end = cur + size;
    if (!cur) { PyErr_NoMemory(); goto fail; }
    int64_t *at = a.view.buf;
    const int64_t *bounds = st.view.buf;
    for (Py_ssize_t k = 0; k < size; k++) {
        cur[k] = at[k] / width;
        end[k] = bounds[k + 1] / width;
    }
    const uint16_t *tv = t.view.buf;
    const char *src = (const char *)s.view.buf + offset;
    char *dst = d.view.buf;
    Py_BEGIN_ALLOW_THREADS
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
            memcpy(dst + (cur[tg]++) * width, src + i * width, width);
        }
    }
    for (Py_ssize_t k = 0; k < size; k++) at[k] = cur[k] * width;
    Py_END_ALLOW_THREADS
    PyMem_RawFree(cur);
    release(&s); release(&t); release(&st); release(&a); release(&d);
    if (bad) return PyErr_Format(PyExc_ValueError, "a target outside 0..%zd or past its region", size - 1);
    Py_RETURN_NONE;
fail:
    release(&s); release(&t); release(&st); release(&a); release(&d);
    return NULL;
}

/* scatter_bits(src or None, src_bit_offset, targets, starts: int64[size + 1] (bytes), at: int64[size]
 * (bits into dst), dst, ones: int64[size]) -> None: bit i (1 where ``src`` is None) goes to its
 * target's cursor, which moves on; ``dst`` comes zeroed; ``ones`` adds up the set bits per target
 * (a validity bitmap's valid rows). */
static PyObject *scatter_bits(PyObject *self, PyObject *args) {
    PyObject *s_obj, *t_obj, *st_obj, *a_obj, *d_obj, *o_obj;
    Py_ssize_t offset, size;
    Buf s = {0}, t = {0}, st = {0}, a = {0}, d = {0}, o = {0};
    int bad = 0;
    if (!PyArg_ParseTuple(args, "OnOOOOO", &s_obj, &offset, &t_obj, &st_obj, &a_obj, &d_obj, &o_obj)) return NULL;
    if (offset < 0) return PyErr_Format(PyExc_ValueError, "offset %zd", offset);
    if (get(t_obj, &t, 0, 0, "targets") < 0) goto fail;
    Py_ssize_t n = t.view.len / 2;
    int all_set = s_obj == Py_None;
    if ((!all_set && get(s_obj, &s, 0, (offset + n + 7) / 8, "bitmap") < 0) || get(st_obj, &st, 0, 8, "starts") < 0 ||
        get(a_obj, &a, 1, 0, "cursors") < 0 || get(d_obj, &d, 1, 0, "output") < 0 ||
        (size = regions(&st, d.view.len)) < 0 || inside(&a, &st, size, 8, 1) < 0 ||
        get(o_obj, &o, 1, size * 8, "ones") < 0)
        goto fail;
    int64_t *end = PyMem_RawMalloc((size + 1) * sizeof(int64_t));
    if (!end) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t k = 0; k < size; k++) end[k] = ((const int64_t *)st.view.buf)[k + 1] * 8;
    const uint16_t *tv = t.view.buf;
    const uint8_t *src = all_set ? NULL : s.view.buf;
    uint8_t *dst = d.view.buf;
    int64_t *ones = o.view.buf, *cur = a.view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = offset + i;
        uint16_t tg = tv[i];
        if (tg >= size || cur[tg] >= end[tg]) { bad = 1; break; }
        int64_t at = cur[tg]++;
        if (!src || ((src[k >> 3] >> (k & 7)) & 1)) {
            dst[at >> 3] |= (uint8_t)(1u << (at & 7));
            ones[tg]++;
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(end);
    release(&s); release(&t); release(&st); release(&a); release(&d); release(&o);
    if (bad) return PyErr_Format(PyExc_ValueError, "a target outside 0..%zd or past its region", size - 1);
    Py_RETURN_NONE;
fail:
    release(&s); release(&t); release(&st); release(&a); release(&d); release(&o);
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
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (tv[i] >= size) { bad = 1; break; }
        sz[tv[i]] += off_at(offs, wide, row + i + 1) - off_at(offs, wide, row + i);
    }
    Py_END_ALLOW_THREADS
    release(&f); release(&t); release(&z);
    if (bad) return PyErr_Format(PyExc_ValueError, "a target outside 0..%zd", size - 1);
    Py_RETURN_NONE;
fail:
    release(&f); release(&t); release(&z);
    return NULL;
}

/* scatter_var(offsets, offset_width, row_offset, data, targets, offset_starts: int64[size + 1]
 * (bytes in dst_offsets), data_starts: int64[size + 1] (bytes in dst_data), slot: int64[size]
 * (bytes into dst_offsets: the next offset to write), pos: int64[size] (bytes into dst_data),
 * dst_offsets, dst_data) -> None: each row's bytes go to its target's ``pos`` and its end, counted
 * from the start of the target's data region, to its ``slot``; both move on. A region's first
 * offset (0) is the caller's to write. */
static PyObject *scatter_var(PyObject *self, PyObject *args) {
    PyObject *f_obj, *v_obj, *t_obj, *os_obj, *ds_obj, *sl_obj, *p_obj, *df_obj, *dv_obj;
    Py_ssize_t owidth, row, size;
    Buf f = {0}, v = {0}, t = {0}, os = {0}, ds = {0}, sl = {0}, p = {0}, df = {0}, dv = {0};
    if (!PyArg_ParseTuple(args, "OnnOOOOOOOO", &f_obj, &owidth, &row, &v_obj, &t_obj, &os_obj, &ds_obj, &sl_obj,
                          &p_obj, &df_obj, &dv_obj))
        return NULL;
    if ((owidth != 4 && owidth != 8) || row < 0) return PyErr_Format(PyExc_ValueError, "offset width %zd", owidth);
    if (get(t_obj, &t, 0, 0, "targets") < 0) goto fail;
    Py_ssize_t n = t.view.len / 2;
    if (get(f_obj, &f, 0, (row + n + 1) * owidth, "offsets") < 0 || get(v_obj, &v, 0, 0, "data") < 0 ||
        get(os_obj, &os, 0, 8, "offset starts") < 0 || get(df_obj, &df, 1, 0, "output offsets") < 0 ||
        get(dv_obj, &dv, 1, 0, "output data") < 0 || (size = regions(&os, df.view.len)) < 0 ||
        get(ds_obj, &ds, 0, (size + 1) * 8, "data starts") < 0 || regions(&ds, dv.view.len) != size ||
        get(sl_obj, &sl, 1, 0, "slots") < 0 || get(p_obj, &p, 1, 0, "positions") < 0 ||
        inside(&sl, &os, size, 1, owidth) < 0 || inside(&p, &ds, size, 1, 1) < 0)
        goto fail;
    const uint16_t *tv = t.view.buf;
    const void *offs = f.view.buf;
    const char *data = v.view.buf;
    const int64_t *ostart = os.view.buf, *dstart = ds.view.buf;
    int64_t *slot = sl.view.buf, *pos = p.view.buf;
    char *outf = df.view.buf, *outd = dv.view.buf;
    int wide = owidth == 8, bad = 0;
    int64_t vlen = v.view.len;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint16_t tg = tv[i];
        if (tg >= size || slot[tg] + owidth > ostart[tg + 1]) { bad = 1; break; }
        int64_t a = off_at(offs, wide, row + i), len = off_at(offs, wide, row + i + 1) - a;
        if (a < 0 || len < 0 || a + len > vlen || pos[tg] + len > dstart[tg + 1]) { bad = 1; break; }
        memcpy(outd + pos[tg], data + a, len);
        pos[tg] += len;
        int64_t end = pos[tg] - dstart[tg];
        if (wide) *(int64_t *)(outf + slot[tg]) = end;
        else *(int32_t *)(outf + slot[tg]) = (int32_t)end;
        slot[tg] += owidth;
    }
    Py_END_ALLOW_THREADS
    release(&f); release(&v); release(&t); release(&os); release(&ds); release(&sl); release(&p); release(&df);
    release(&dv);
    if (bad) return PyErr_Format(PyExc_ValueError, "variable-width rows outside their regions");
    Py_RETURN_NONE;
fail:
    release(&f); release(&v); release(&t); release(&os); release(&ds); release(&sl); release(&p); release(&df);
    release(&dv);
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
