/* ares_events._native: the fast paths of the chain format in C: the verifier's loop
 * (verify_run), canonical JSON's acceptance walk (scan), and the append path's passes
 * (prepare: a batch validated, encoded and digested; insert_rows: sealed straight into
 * the rows a SQL backend inserts; uuid7: a default event id), each held to its Python
 * reference by property tests (tests/integrity/test_native*.py).
 *
 * verify_run() has exactly the semantics of the pure-Python reference
 * ares_events.integrity.verifier.verify_run (which stays the reference: the property
 * tests in tests/integrity/test_native.py check that both agree on every input they
 * generate, valid and tampered): it vouches for each event that is the next version of
 * the stream, links to the last hash, has an inline payload and whose canonical header
 * (format v1, ares_events/chain.py) hashes to its stored hash, and returns at the first
 * event it cannot vouch for, so the slow path names the problem. Where it is unsure (a
 * value of an unusual type) it stops too: it never vouches for what the reference
 * refuses.
 *
 * BLAKE3 is the implementation in blake3_portable.h (written from the specification;
 * one compression at a time with its rows as vectors; several inputs at once lanes-wide
 * in mh_hash below). The package works without this module: the verifier falls
 * back to the Python path when it is missing or ARES_EVENTS_NO_NATIVE=1. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "blake3_portable.h"

#ifndef Py_T_OBJECT_EX
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

/* RecordedEvent's items (ares_events/core/events.py). */
enum {
    F_STREAM = 0,
    F_VERSION = 1,
    F_EVENT_ID = 3,
    F_TYPE = 4,
    F_MODULE = 5,
    F_PAYLOAD = 6,
    F_META = 7,
    F_AT = 8,
    F_PREV = 9,
    F_HASH = 10,
    F_REF = 11,
    F_MIN_ITEMS = 12,
};

static const char HEX[] = "0123456789abcdef";

/* A hash to compute: in[0:len] into out (mh_hash below, lanes-wide; an input longer than a
 * chunk is cut into its chunks, hashed lanes-wide beside the others, then joined). */
typedef struct {
    const uint8_t *in;
    size_t len;
    uint8_t *out;
} mh_job;
static int mh_width(int want);
static void mh_hash(mh_job *jobs, size_t njobs, const uint8_t *key32, int width);

/* A growable output buffer (reused across the events of one call). */
typedef struct {
    char *p;
    size_t cap;
} buf_t;

static int buf_reserve(buf_t *b, size_t need) {
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < need) {
        if (cap > ((size_t)-1) / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p = (char *)PyMem_Realloc(b->p, cap);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

/* json.dumps' string escaper with ensure_ascii=False (json.encoder.c_encode_basestring),
 * applied to UTF-8 bytes: quotes, backslash and the C0 controls are escaped, nothing
 * else (bytes of multi-byte sequences are >= 0x80 and pass unchanged). Writes the
 * quoted string at out; returns the end. out needs 2 + 6 * len bytes. */
static char *json_str(char *out, const char *s, Py_ssize_t len) {
    *out++ = '"';
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *out++ = (char)c;
            continue;
        }
        *out++ = '\\';
        switch (c) {
            case '"':
                *out++ = '"';
                break;
            case '\\':
                *out++ = '\\';
                break;
            case '\b':
                *out++ = 'b';
                break;
            case '\f':
                *out++ = 'f';
                break;
            case '\n':
                *out++ = 'n';
                break;
            case '\r':
                *out++ = 'r';
                break;
            case '\t':
                *out++ = 't';
                break;
            default:
                *out++ = 'u';
                *out++ = '0';
                *out++ = '0';
                *out++ = HEX[c >> 4];
                *out++ = HEX[c & 15];
        }
    }
    *out++ = '"';
    return out;
}

static char *put(char *out, const char *s, size_t len) {
    memcpy(out, s, len);
    return out + len;
}

#define PUT_LIT(out, lit) put((out), (lit), sizeof(lit) - 1)

/* The decimal text of v (what "%lld" prints; snprintf cost ~50 ns a number). */
static char *put_int(char *out, long long v) {
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *out++ = '-';
    while (n) *out++ = tmp[--n];
    return out;
}

/* The UTF-8 of a str (a subclass too: the escaper encodes its value), or NULL with no
 * exception set when it is not a str or cannot be UTF-8 (a lone surrogate): in both
 * cases the reference stops at the event. */
static const char *utf8_of(PyObject *o, Py_ssize_t *len) {
    if (!PyUnicode_Check(o)) return NULL;
    const char *s = PyUnicode_AsUTF8AndSize(o, len);
    if (!s) PyErr_Clear();
    return s;
}

/* Python-level `a != b`; -1 on an exception. */
static int ne(PyObject *a, PyObject *b) { return PyObject_RichCompareBool(a, b, Py_NE); }

/* A chain key argument: None (unkeyed) or 32 bytes; -1 with ValueError otherwise. */
static int key_of(PyObject *key_obj, const uint8_t **key) {
    *key = NULL;
    if (key_obj == Py_None) return 0;
    if (!PyBytes_Check(key_obj) || PyBytes_GET_SIZE(key_obj) != AB3_KEY_LEN) {
        PyErr_SetString(PyExc_ValueError, "key must be 32 bytes or None");
        return -1;
    }
    *key = (const uint8_t *)PyBytes_AS_STRING(key_obj);
    return 0;
}

static PyObject *verify_run(PyObject *self, PyObject *args) {
    PyObject *events, *stream_id, *stream_json, *last_version, *last_hash_in, *key_obj;
    Py_ssize_t start;
    (void)self;
    if (!PyArg_ParseTuple(args, "OnUSOSO:verify_run", &events, &start, &stream_id,
                          &stream_json, &last_version, &last_hash_in, &key_obj))
        return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "start must be >= 0");
        return NULL;
    }
    if (!PyLong_CheckExact(last_version)) {
        PyErr_SetString(PyExc_TypeError, "last_version must be an int");
        return NULL;
    }
    const uint8_t *key;
    if (key_of(key_obj, &key) < 0) return NULL;
    Py_ssize_t n = PySequence_Size(events);
    if (n < 0) return NULL;
    int fast_seq = PyList_CheckExact(events) || PyTuple_CheckExact(events);

    /* The running state. The last hash is kept as bytes (prev_buf, prev_len); its Python
     * object only when one exists already (the argument, or after a generic compare). */
    uint8_t prev_buf[AB3_OUT_LEN];
    const char *stream_js = PyBytes_AS_STRING(stream_json);
    Py_ssize_t stream_js_len = PyBytes_GET_SIZE(stream_json);
    PyObject *last_hash = last_hash_in; /* borrowed or owned, see owns_hash */
    int owns_hash = 0;
    const char *prev = PyBytes_AS_STRING(last_hash_in);
    Py_ssize_t prev_len = PyBytes_GET_SIZE(last_hash_in);
    PyObject *last_v = last_version; /* borrowed or owned */
    int owns_v = 0;
    int overflow = 0;
    long long last_ll = PyLong_AsLongLongAndOverflow(last_version, &overflow);
    if (last_ll == -1 && PyErr_Occurred()) return NULL;
    /* big: the versions are past int64 (or the next one would be); compared as objects. */
    int big = overflow != 0 || last_ll == LLONG_MAX;

    buf_t buf = {NULL, 0};
    PyObject *result = NULL;
    PyObject *one = NULL;
    Py_ssize_t i = start;

    for (; i < n; i++) {
        PyObject *e;
        if (fast_seq) {
            Py_ssize_t size = PySequence_Fast_GET_SIZE(events);
            if (i >= size) {
                PyErr_SetString(PyExc_IndexError, "events changed size during verify_run");
                goto done;
            }
            e = PySequence_Fast_GET_ITEM(events, i);
            Py_INCREF(e);
        } else {
            e = PySequence_GetItem(events, i);
            if (!e) goto done;
        }
        /* Anything but a tuple of a RecordedEvent's shape: the slow path decides. */
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < F_MIN_ITEMS) {
            Py_DECREF(e);
            break;
        }
        PyObject *version = PyTuple_GET_ITEM(e, F_VERSION);
        PyObject *raw = PyTuple_GET_ITEM(e, F_PAYLOAD);
        PyObject *prev_o = PyTuple_GET_ITEM(e, F_PREV);
        long long v_ll = 0;
        int stop = 0;
        /* The order of the reference's tests (each can only run Python code on an
         * unusual type, but then it runs in the same order). */
        if (!PyLong_CheckExact(version)) {
            stop = 1;
        } else if (!big) {
            int ov = 0;
            v_ll = PyLong_AsLongLongAndOverflow(version, &ov);
            stop = ov != 0 || v_ll != last_ll + 1;
        } else {
            if (!one) one = PyLong_FromLong(1);
            PyObject *want = one ? PyNumber_Add(last_v, one) : NULL;
            if (!want) {
                Py_DECREF(e);
                goto done;
            }
            int r = ne(version, want);
            Py_DECREF(want);
            if (r < 0) {
                Py_DECREF(e);
                goto done;
            }
            stop = r;
        }
        if (!stop) {
            if (PyBytes_CheckExact(prev_o)) {
                stop = PyBytes_GET_SIZE(prev_o) != prev_len ||
                       memcmp(PyBytes_AS_STRING(prev_o), prev, (size_t)prev_len) != 0;
            } else {
                if (!last_hash) {
                    last_hash = PyBytes_FromStringAndSize(prev, prev_len);
                    if (!last_hash) {
                        Py_DECREF(e);
                        goto done;
                    }
                    owns_hash = 1;
                }
                int r = ne(prev_o, last_hash);
                if (r < 0) {
                    Py_DECREF(e);
                    goto done;
                }
                stop = r;
            }
        }
        if (!stop) stop = PyTuple_GET_ITEM(e, F_REF) != Py_None || !PyBytes_CheckExact(raw);
        if (!stop) {
            int r = ne(PyTuple_GET_ITEM(e, F_STREAM), stream_id);
            if (r < 0) {
                Py_DECREF(e);
                goto done;
            }
            stop = r;
        }
        if (stop) {
            Py_DECREF(e);
            break;
        }

        /* The header's parts; any that the reference's try block would refuse stops. */
        Py_ssize_t ty_len, mo_len, at_len, id_len;
        const char *ty = utf8_of(PyTuple_GET_ITEM(e, F_TYPE), &ty_len);
        const char *mo = ty ? utf8_of(PyTuple_GET_ITEM(e, F_MODULE), &mo_len) : NULL;
        const char *at = mo ? utf8_of(PyTuple_GET_ITEM(e, F_AT), &at_len) : NULL;
        const char *eid = at ? utf8_of(PyTuple_GET_ITEM(e, F_EVENT_ID), &id_len) : NULL;
        if (!eid) {
            Py_DECREF(e);
            break;
        }
        PyObject *meta_o = PyTuple_GET_ITEM(e, F_META);
        Py_buffer meta;
        if (!PyObject_CheckBuffer(meta_o) || PyObject_GetBuffer(meta_o, &meta, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            Py_DECREF(e);
            break;
        }
        char vtext[32];
        Py_ssize_t vtext_len;
        PyObject *vstr = NULL;
        const char *vchars = vtext;
        if (!big) {
            vtext_len = put_int(vtext, v_ll) - vtext;
        } else {
            vstr = PyObject_Str(version);
            vchars = vstr ? PyUnicode_AsUTF8AndSize(vstr, &vtext_len) : NULL;
            if (!vchars) {
                Py_XDECREF(vstr);
                PyBuffer_Release(&meta);
                Py_DECREF(e);
                goto done;
            }
        }
        const char *payload = PyBytes_AS_STRING(raw);
        Py_ssize_t payload_len = PyBytes_GET_SIZE(raw);
        size_t need = (size_t)prev_len + 160 + 6 * ((size_t)ty_len + mo_len + at_len + id_len) +
                      (size_t)meta.len + (size_t)stream_js_len + (size_t)vtext_len;
        if (buf_reserve(&buf, need) < 0) {
            Py_XDECREF(vstr);
            PyBuffer_Release(&meta);
            Py_DECREF(e);
            goto done;
        }
        uint8_t digest[AB3_OUT_LEN];
        ab3_hash(NULL, (const uint8_t *)payload, (size_t)payload_len, digest);
        char size_text[32];
        int size_len = (int)(put_int(size_text, payload_len) - size_text);

        char *o = buf.p;
        o = put(o, prev, (size_t)prev_len);
        o = PUT_LIT(o, "{\"at\":");
        o = json_str(o, at, at_len);
        o = PUT_LIT(o, ",\"id\":");
        o = json_str(o, eid, id_len);
        o = PUT_LIT(o, ",\"meta\":");
        o = put(o, (const char *)meta.buf, (size_t)meta.len);
        o = PUT_LIT(o, ",\"module\":");
        o = json_str(o, mo, mo_len);
        o = PUT_LIT(o, ",\"payload\":\"");
        for (int k = 0; k < AB3_OUT_LEN; k++) {
            *o++ = HEX[digest[k] >> 4];
            *o++ = HEX[digest[k] & 15];
        }
        o = PUT_LIT(o, "\",\"size\":");
        o = put(o, size_text, (size_t)size_len);
        o = PUT_LIT(o, ",\"stream\":");
        o = put(o, stream_js, (size_t)stream_js_len);
        o = PUT_LIT(o, ",\"type\":");
        o = json_str(o, ty, ty_len);
        o = PUT_LIT(o, ",\"v\":1,\"version\":");
        o = put(o, vchars, (size_t)vtext_len);
        *o++ = '}';
        PyBuffer_Release(&meta);
        Py_XDECREF(vstr);

        uint8_t h[AB3_OUT_LEN];
        ab3_hash(key, (const uint8_t *)buf.p, (size_t)(o - buf.p), h);

        PyObject *stored = PyTuple_GET_ITEM(e, F_HASH);
        int mismatch;
        if (PyBytes_CheckExact(stored)) {
            mismatch = PyBytes_GET_SIZE(stored) != AB3_OUT_LEN ||
                       memcmp(PyBytes_AS_STRING(stored), h, AB3_OUT_LEN) != 0;
        } else {
            PyObject *hb = PyBytes_FromStringAndSize((const char *)h, AB3_OUT_LEN);
            mismatch = hb ? ne(hb, stored) : -1;
            Py_XDECREF(hb);
            if (mismatch < 0) {
                Py_DECREF(e);
                goto done;
            }
        }
        if (mismatch) {
            Py_DECREF(e);
            break;
        }
        /* Vouched for: it is the new tail. */
        memcpy(prev_buf, h, AB3_OUT_LEN);
        prev = (const char *)prev_buf;
        prev_len = AB3_OUT_LEN;
        if (owns_hash) Py_DECREF(last_hash);
        last_hash = NULL;
        owns_hash = 0;
        if (owns_v) Py_DECREF(last_v);
        Py_INCREF(version);
        last_v = version;
        owns_v = 1;
        last_ll = v_ll;
        if (!big && last_ll == LLONG_MAX) big = 1;
        Py_DECREF(e);
    }
    {
        PyObject *hash_out = last_hash;
        if (hash_out) {
            Py_INCREF(hash_out);
        } else {
            hash_out = PyBytes_FromStringAndSize(prev, prev_len);
            if (!hash_out) goto done;
        }
        result = Py_BuildValue("(nON)", i, last_v, hash_out);
    }
done:
    if (owns_hash) Py_XDECREF(last_hash);
    if (owns_v) Py_DECREF(last_v);
    Py_XDECREF(one);
    PyMem_Free(buf.p);
    return result;
}


/* ---- sealing a batch (ares_events.chain.link_hashes, the reference) -------------------- */

static PyObject *S_AT, *S_EVENT_ID, *S_META_JSON, *S_MODULE, *S_DIGEST, *S_SIZE, *S_TYPE;

/* The UTF-8 of an attribute that must be a str; NULL with an exception otherwise. */
static const char *str_attr(PyObject *o, Py_ssize_t *len) {
    if (!PyUnicode_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "expected a str");
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(o, len);
}

/* The canonical header of one event after prev (format v1), hashed into prev. */
static int seal_one(buf_t *buf, const uint8_t *key, uint8_t prev[AB3_OUT_LEN], PyObject *at,
                    PyObject *eid, PyObject *meta, PyObject *mo, PyObject *digest,
                    PyObject *size_o, const char *stream_js, size_t stream_js_len,
                    PyObject *ty, long long version) {
    Py_ssize_t at_len, id_len, mo_len, ty_len;
    const char *a = str_attr(at, &at_len);
    const char *e = a ? str_attr(eid, &id_len) : NULL;
    const char *m = e ? str_attr(mo, &mo_len) : NULL;
    const char *t = m ? str_attr(ty, &ty_len) : NULL;
    if (!t) return -1;
    if (!PyBytes_Check(meta) || !PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != 32) {
        PyErr_SetString(PyExc_TypeError, "meta_json and digest must be bytes");
        return -1;
    }
    Py_ssize_t size = PyLong_AsSsize_t(size_o);
    if (size == -1 && PyErr_Occurred()) return -1;
    size_t need = AB3_OUT_LEN + 200 + 6 * ((size_t)at_len + id_len + mo_len + ty_len) +
                  (size_t)PyBytes_GET_SIZE(meta) + stream_js_len;
    if (buf_reserve(buf, need) < 0) return -1;
    char *o = buf->p;
    o = put(o, (const char *)prev, AB3_OUT_LEN);
    o = PUT_LIT(o, "{\"at\":");
    o = json_str(o, a, at_len);
    o = PUT_LIT(o, ",\"id\":");
    o = json_str(o, e, id_len);
    o = PUT_LIT(o, ",\"meta\":");
    o = put(o, PyBytes_AS_STRING(meta), (size_t)PyBytes_GET_SIZE(meta));
    o = PUT_LIT(o, ",\"module\":");
    o = json_str(o, m, mo_len);
    o = PUT_LIT(o, ",\"payload\":\"");
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(digest);
    for (int k = 0; k < 32; k++) {
        *o++ = HEX[d[k] >> 4];
        *o++ = HEX[d[k] & 15];
    }
    o = PUT_LIT(o, "\",\"size\":");
    o = put_int(o, size);
    o = PUT_LIT(o, ",\"stream\":");
    o = put(o, stream_js, stream_js_len);
    o = PUT_LIT(o, ",\"type\":");
    o = json_str(o, t, ty_len);
    o = PUT_LIT(o, ",\"v\":1,\"version\":");
    o = put_int(o, version);
    *o++ = '}';
    ab3_hash(key, (const uint8_t *)buf->p, (size_t)(o - buf->p), prev);
    return 0;
}

static PyObject *link_hashes(PyObject *self, PyObject *args) {
    PyObject *stream_json, *prev_in, *events, *key_obj;
    long long version;
    (void)self;
    if (!PyArg_ParseTuple(args, "SLSOO:link_hashes", &stream_json, &version, &prev_in, &events,
                          &key_obj))
        return NULL;
    const uint8_t *key;
    if (key_of(key_obj, &key) < 0) return NULL;
    if (PyBytes_GET_SIZE(prev_in) != AB3_OUT_LEN) {
        PyErr_SetString(PyExc_ValueError, "prev must be 32 bytes");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(events, "events must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    if (!out) {
        Py_DECREF(seq);
        return NULL;
    }
    uint8_t prev[AB3_OUT_LEN];
    memcpy(prev, PyBytes_AS_STRING(prev_in), AB3_OUT_LEN);
    const char *stream_js = PyBytes_AS_STRING(stream_json);
    size_t stream_js_len = (size_t)PyBytes_GET_SIZE(stream_json);
    buf_t buf = {NULL, 0};
    PyObject *attrs[7] = {NULL};
    PyObject *names[7] = {S_AT, S_EVENT_ID, S_META_JSON, S_MODULE, S_DIGEST, S_SIZE, S_TYPE};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
        for (int k = 0; k < 7; k++) {
            attrs[k] = PyObject_GetAttr(e, names[k]);
            if (!attrs[k]) goto fail;
        }
        if (version == LLONG_MAX) {
            PyErr_SetString(PyExc_OverflowError, "version past the 64-bit range");
            goto fail;
        }
        version++;
        if (seal_one(&buf, key, prev, attrs[0], attrs[1], attrs[2], attrs[3], attrs[4],
                     attrs[5], stream_js, stream_js_len, attrs[6], version) < 0)
            goto fail;
        PyObject *h = PyBytes_FromStringAndSize((const char *)prev, AB3_OUT_LEN);
        if (!h) goto fail;
        PyList_SET_ITEM(out, i, h);
        for (int k = 0; k < 7; k++) Py_CLEAR(attrs[k]);
    }
    PyMem_Free(buf.p);
    Py_DECREF(seq);
    return out;
fail:
    for (int k = 0; k < 7; k++) Py_XDECREF(attrs[k]);
    PyMem_Free(buf.p);
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}


/* ---- UUIDv7 objects (ares_events.core.events.uuid7's object, the reference) ------------ */

static PyObject *S_INT, *S_IS_SAFE, *S_TEXT;

/* An instance of cls (a uuid.UUID subclass with a _text slot) for the 128-bit value
 * hi:lo, with its canonical text; the fields are set as object.__setattr__ sets them. */
static PyObject *build_uuid7(PyTypeObject *cls, uint64_t hi, uint64_t lo, PyObject *is_safe) {
    char text[36];
    unsigned char raw[16];
    for (int i = 0; i < 8; i++) {
        raw[i] = (unsigned char)(hi >> (56 - 8 * i));
        raw[8 + i] = (unsigned char)(lo >> (56 - 8 * i));
    }
    /* 8-4-4-4-12 lowercase hex digits */
    char *o = text;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *o++ = '-';
        *o++ = HEX[raw[i] >> 4];
        *o++ = HEX[raw[i] & 15];
    }
    PyObject *value = _PyLong_FromByteArray(raw, 16, 0, 0);
    if (!value) return NULL;
    PyObject *t = PyUnicode_FromStringAndSize(text, 36);
    PyObject *u = t ? cls->tp_alloc(cls, 0) : NULL;
    if (!u || PyObject_GenericSetAttr(u, S_INT, value) < 0 ||
        PyObject_GenericSetAttr(u, S_IS_SAFE, is_safe) < 0 ||
        PyObject_GenericSetAttr(u, S_TEXT, t) < 0) {
        Py_XDECREF(u);
        u = NULL;
    }
    Py_DECREF(value);
    Py_XDECREF(t);
    return u;
}

/* make_uuid7(cls, ms, seq, rand_b, is_safe): an instance of cls for the UUIDv7 of 48-bit
 * ms, 12-bit seq and 62-bit rand_b (ares_events.core.events.uuid7_reference's object). */
static PyObject *make_uuid7(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "make_uuid7(cls, ms, seq, rand_b, is_safe)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    unsigned long long ms = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long seq = ms == (unsigned long long)-1 && PyErr_Occurred()
                                 ? 0
                                 : PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long rb = PyErr_Occurred() ? 0 : PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (ms >> 48 || seq >> 12 || rb >> 62) {
        PyErr_SetString(PyExc_ValueError, "ms, seq or rand_b out of range");
        return NULL;
    }
    return build_uuid7(cls, ms << 16 | 0x7000ULL | seq, 0x8000000000000000ULL | rb, args[4]);
}

/* The generator of ares_events.core.events.uuid7 in C: the same steps (the millisecond
 * clock, the 12-bit counter within a millisecond that starts at 10 random bits, 62
 * random bits from the same random.getrandbits, in the same order) without a Python
 * frame, so NewEvent's default id factory is one C call. uuid7_setup() gives it the
 * class, is_safe, getrandbits and time.time_ns once. */
static PyObject *U7_CLS, *U7_SAFE, *U7_RAND, *U7_TIME;
static unsigned long long u7_last_ms, u7_seq;

static PyObject *uuid7_setup(PyObject *self, PyObject *args) {
    PyObject *cls, *safe, *rand, *clock;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!OOO:uuid7_setup", &PyType_Type, &cls, &safe, &rand, &clock))
        return NULL;
    Py_XSETREF(U7_CLS, Py_NewRef(cls));
    Py_XSETREF(U7_SAFE, Py_NewRef(safe));
    Py_XSETREF(U7_RAND, Py_NewRef(rand));
    Py_XSETREF(U7_TIME, Py_NewRef(clock));
    u7_last_ms = u7_seq = 0; /* as the Python generator starts */
    Py_RETURN_NONE;
}

/* getrandbits(bits) as an unsigned 64-bit int; -1 with an exception set on error. */
static int u7_bits(int bits, unsigned long long *out) {
    PyObject *n = PyLong_FromLong(bits);
    PyObject *r = n ? PyObject_CallOneArg(U7_RAND, n) : NULL;
    Py_XDECREF(n);
    if (!r) return -1;
    *out = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) return -1;
    if (*out >> bits) {
        PyErr_SetString(PyExc_ValueError, "getrandbits returned too many bits");
        return -1;
    }
    return 0;
}

static PyObject *uuid7_new(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (!U7_CLS) {
        PyErr_SetString(PyExc_RuntimeError, "uuid7_setup() was not called");
        return NULL;
    }
    PyObject *ns = PyObject_CallNoArgs(U7_TIME);
    if (!ns) return NULL;
    unsigned long long t = PyLong_AsUnsignedLongLong(ns);
    Py_DECREF(ns);
    if (t == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    unsigned long long ms = t / 1000000ULL;
    if (ms == u7_last_ms) {
        u7_seq = (u7_seq + 1) & 0xFFF;
    } else {
        unsigned long long s;
        if (u7_bits(10, &s) < 0) return NULL;
        u7_last_ms = ms;
        u7_seq = s;
    }
    unsigned long long rb;
    if (u7_bits(62, &rb) < 0) return NULL;
    if (ms >> 48) {
        PyErr_SetString(PyExc_ValueError, "the clock is past the UUIDv7 range");
        return NULL;
    }
    return build_uuid7((PyTypeObject *)U7_CLS, ms << 16 | 0x7000ULL | u7_seq,
                       0x8000000000000000ULL | rb, U7_SAFE);
}

/* ---- one pass over a batch (ares_events.core.events.prepare_reference and
 * ares_events.core.backend.insert_rows_reference are the references) ------------------- */

/* The offset of the object slot `name` of cls (a member descriptor from __slots__), or
 * -1 with an exception set. Slots are read and written by offset: no attribute lookup
 * and no __setattr__ per field (for a dataclass that is object.__setattr__ anyway). */
static Py_ssize_t slot_offset(PyObject *cls, const char *name) {
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (!d) return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == Py_T_OBJECT_EX) off = m->offset;
    }
    Py_DECREF(d);
    if (off < 0) PyErr_Format(PyExc_TypeError, "%s is not an object slot", name);
    return off;
}

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

enum { P_ID, P_TYPE, P_MODULE, P_PAYLOAD, P_META, P_AT, P_DIGEST, P_SIZE, P_REF, P_UID, P_N };
enum { N_TYPE, N_MODULE, N_PAYLOAD, N_META, N_ID, N_N };

/* The slot offsets of NewEvent, PreparedEvent and _UUID7 (found once, on the first call
 * with these classes). */
static PyObject *K_NEW, *K_PREP, *K_U7;
static Py_ssize_t OFF_NEW[N_N], OFF_PREP[P_N], OFF_TEXT;

static int bind_prepared(PyObject *prep_cls) {
    static const char *const pn[P_N] = {"event_id", "type",   "module", "payload_bytes",
                                        "meta_json", "at",     "digest", "size",
                                        "payload_ref", "uid"};
    if (prep_cls == K_PREP) return 0;
    if (!PyType_Check(prep_cls)) {
        PyErr_SetString(PyExc_TypeError, "expected a class");
        return -1;
    }
    Py_ssize_t op[P_N];
    for (int k = 0; k < P_N; k++)
        if ((op[k] = slot_offset(prep_cls, pn[k])) < 0) return -1;
    memcpy(OFF_PREP, op, sizeof op);
    Py_XSETREF(K_PREP, Py_NewRef(prep_cls));
    return 0;
}

static int bind_classes(PyObject *new_cls, PyObject *prep_cls, PyObject *u7_cls) {
    static const char *const nn[N_N] = {"type", "module", "payload", "metadata", "event_id"};
    if (bind_prepared(prep_cls) < 0) return -1;
    if (new_cls == K_NEW && u7_cls == K_U7) return 0;
    if (!PyType_Check(new_cls) || !PyType_Check(u7_cls)) {
        PyErr_SetString(PyExc_TypeError, "expected classes");
        return -1;
    }
    Py_ssize_t on[N_N], ot;
    for (int k = 0; k < N_N; k++)
        if ((on[k] = slot_offset(new_cls, nn[k])) < 0) return -1;
    if ((ot = slot_offset(u7_cls, "_text")) < 0) return -1;
    memcpy(OFF_NEW, on, sizeof on);
    OFF_TEXT = ot;
    Py_XSETREF(K_NEW, Py_NewRef(new_cls));
    Py_XSETREF(K_U7, Py_NewRef(u7_cls));
    return 0;
}

static PyObject *S_OPTION_KW;
static int scan_value(PyObject *x, int depth);

/* dumps(x, option=opts); NULL with the exception cleared when it refuses (the
 * reference then raises the InvalidEvent). */
static PyObject *call_dumps(PyObject *dumps, PyObject *opts, PyObject *x) {
    PyObject *argv[2] = {x, opts};
    PyObject *r = PyObject_Vectorcall(dumps, argv, 1, S_OPTION_KW);
    if (!r) PyErr_Clear();
    return r;
}

/* prepare(events, at, NewEvent, PreparedEvent, _UUID7, good_names, dumps, opts,
 * max_meta): the list of PreparedEvent that prepare_reference returns, or None when
 * an event is not the plain case (not exactly a NewEvent, a name not yet validated, an
 * id that is not a default UUIDv7, a float anywhere, a duplicate id, metadata that is
 * not a dict or too big, anything the encoder refuses): then the reference runs on the
 * whole batch and raises what it raises. */
static PyObject *prepare(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "prepare() takes 9 arguments");
        return NULL;
    }
    PyObject *events = args[0], *at = args[1], *good = args[5], *dumps = args[6],
             *opts = args[7];
    if (bind_classes(args[2], args[3], args[4]) < 0) return NULL;
    Py_ssize_t max_meta = PyLong_AsSsize_t(args[8]);
    if (max_meta == -1 && PyErr_Occurred()) return NULL;
    if (!PyAnySet_Check(good)) {
        PyErr_SetString(PyExc_TypeError, "good_names must be a set");
        return NULL;
    }
    PyTypeObject *new_t = (PyTypeObject *)K_NEW, *prep_t = (PyTypeObject *)K_PREP,
                 *u7_t = (PyTypeObject *)K_U7;
    PyObject *seq = PySequence_Fast(events, "events must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n), *seen = PySet_New(NULL), *empty_meta = NULL;
    /* The payload digests are independent: hashed lanes-wide once the batch is encoded. */
    mh_job *jobs = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(mh_job));
    if (!jobs) PyErr_NoMemory();
    if (!out || !seen || !jobs) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(out, i, NULL);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *ev = PySequence_Fast_GET_ITEM(seq, i);
        if (!Py_IS_TYPE(ev, new_t)) goto bail;
        PyObject *ty = SLOT(ev, OFF_NEW[N_TYPE]), *mo = SLOT(ev, OFF_NEW[N_MODULE]),
                 *pl = SLOT(ev, OFF_NEW[N_PAYLOAD]), *me = SLOT(ev, OFF_NEW[N_META]),
                 *eid = SLOT(ev, OFF_NEW[N_ID]);
        if (!ty || !mo || !pl || !me || !eid) goto bail;
        if (!PyUnicode_CheckExact(ty) || !PyUnicode_CheckExact(mo)) goto bail;
        int r = PySet_Contains(good, ty);
        if (r == 1) r = PySet_Contains(good, mo);
        if (r < 0) goto fail;
        if (r == 0) goto bail;
        if (!Py_IS_TYPE(eid, u7_t)) goto bail;
        PyObject *text = SLOT(eid, OFF_TEXT);
        if (!text || !PyUnicode_CheckExact(text)) goto bail;
        r = PySet_Contains(seen, text);
        if (r < 0) goto fail;
        if (r == 1 || PySet_Add(seen, text) < 0) {
            if (r == 1) goto bail;
            goto fail;
        }
        PyObject *meta_json;
        if (!PyDict_CheckExact(me)) goto bail;
        if (PyDict_GET_SIZE(me) == 0) {
            if (!empty_meta && !(empty_meta = PyBytes_FromStringAndSize("{}", 2))) goto fail;
            meta_json = Py_NewRef(empty_meta);
        } else {
            int f = scan_value(me, 0);
            if (f == -2) goto fail;
            if (f != 0) goto bail; /* refused, or a float: the reference encodes those */
            meta_json = call_dumps(dumps, opts, me);
            if (!meta_json) goto bail;
            if (!PyBytes_CheckExact(meta_json) || PyBytes_GET_SIZE(meta_json) > max_meta) {
                Py_DECREF(meta_json);
                goto bail;
            }
        }
        int f = scan_value(pl, 0);
        if (f != 0) {
            Py_DECREF(meta_json);
            if (f == -2) goto fail;
            goto bail;
        }
        PyObject *payload = call_dumps(dumps, opts, pl);
        if (!payload || !PyBytes_CheckExact(payload)) {
            Py_XDECREF(payload);
            Py_DECREF(meta_json);
            goto bail;
        }
        PyObject *digest = PyBytes_FromStringAndSize(NULL, AB3_OUT_LEN);
        if (digest)
            jobs[i] = (mh_job){(const uint8_t *)PyBytes_AS_STRING(payload),
                               (size_t)PyBytes_GET_SIZE(payload),
                               (uint8_t *)PyBytes_AS_STRING(digest)};
        PyObject *size = digest ? PyLong_FromSsize_t(PyBytes_GET_SIZE(payload)) : NULL;
        PyObject *p = size ? prep_t->tp_alloc(prep_t, 0) : NULL;
        if (!p) {
            Py_XDECREF(digest);
            Py_XDECREF(size);
            Py_DECREF(payload);
            Py_DECREF(meta_json);
            goto fail;
        }
        SLOT(p, OFF_PREP[P_ID]) = Py_NewRef(text);
        SLOT(p, OFF_PREP[P_TYPE]) = Py_NewRef(ty);
        SLOT(p, OFF_PREP[P_MODULE]) = Py_NewRef(mo);
        SLOT(p, OFF_PREP[P_PAYLOAD]) = payload;
        SLOT(p, OFF_PREP[P_META]) = meta_json;
        SLOT(p, OFF_PREP[P_AT]) = Py_NewRef(at);
        SLOT(p, OFF_PREP[P_DIGEST]) = digest;
        SLOT(p, OFF_PREP[P_SIZE]) = size;
        SLOT(p, OFF_PREP[P_REF]) = Py_NewRef(Py_None);
        SLOT(p, OFF_PREP[P_UID]) = Py_NewRef(eid);
        PyList_SET_ITEM(out, i, p);
    }
    /* One event of one chunk gains nothing from lanes; its digest is hashed alone. */
    mh_hash(jobs, (size_t)n, NULL,
            n > 1 || (n == 1 && jobs[0].len > AB3_CHUNK_LEN) ? mh_width(0) : 1);
    PyMem_Free(jobs);
    Py_XDECREF(empty_meta);
    Py_DECREF(seen);
    Py_DECREF(seq);
    return out;
bail:
    PyMem_Free(jobs);
    Py_XDECREF(empty_meta);
    Py_DECREF(seen);
    Py_DECREF(out);
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    PyMem_Free(jobs);
    Py_XDECREF(empty_meta);
    Py_XDECREF(seen);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}


/* insert_rows(stream_id, stream_json, version, prev, position, prepared, key,
 * PreparedEvent, flat=0): the rows (position, stream_id, version, event_id, type, module,
 * payload, payload_ref, metadata, recorded_at, prev_hash, hash) of the PreparedEvents
 * sealed after version (whose hash is prev) at the positions after position, as
 * insert_rows_reference builds them; None when an event is not exactly a PreparedEvent
 * or has a payload_ref (the reference serializes those). flat: (values, last hash, width)
 * instead, one list without stream_id and the batch's one recorded_at: ten values a row,
 * or four (event_id, payload, prev_hash, hash) when the events share type, module and
 * metadata (params_of_rows is the reference). */
static PyObject *insert_rows(PyObject *self, PyObject *args) {
    PyObject *stream_id, *stream_json, *prev_in, *events, *key_obj, *prep_cls;
    long long version, pos;
    (void)self;
    int flat = 0;
    if (!PyArg_ParseTuple(args, "USLSLOOO|p:insert_rows", &stream_id, &stream_json, &version,
                          &prev_in, &pos, &events, &key_obj, &prep_cls, &flat))
        return NULL;
    int shared = flat; /* until two events differ in type, module or metadata */
    if (bind_prepared(prep_cls) < 0) return NULL;
    const uint8_t *key;
    if (key_of(key_obj, &key) < 0) return NULL;
    if (PyBytes_GET_SIZE(prev_in) != AB3_OUT_LEN) {
        PyErr_SetString(PyExc_ValueError, "prev must be 32 bytes");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(events, "events must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyTypeObject *prep_t = (PyTypeObject *)K_PREP;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
        if (!Py_IS_TYPE(e, prep_t) || SLOT(e, OFF_PREP[P_REF]) != Py_None ||
            !SLOT(e, OFF_PREP[P_PAYLOAD]) || !PyBytes_Check(SLOT(e, OFF_PREP[P_PAYLOAD]))) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        for (int k = 0; k < P_N; k++) {
            if (!SLOT(e, OFF_PREP[k])) {
                Py_DECREF(seq);
                Py_RETURN_NONE;
            }
        }
        if (flat && i > 0) { /* one recorded_at for the batch, bound once */
            PyObject *a0 = SLOT(PySequence_Fast_GET_ITEM(seq, 0), OFF_PREP[P_AT]);
            PyObject *ai = SLOT(e, OFF_PREP[P_AT]);
            int same = a0 == ai ? 1 : PyObject_RichCompareBool(a0, ai, Py_EQ);
            if (same != 1 || !PyUnicode_CheckExact(ai)) {
                Py_DECREF(seq);
                if (same < 0) return NULL;
                Py_RETURN_NONE;
            }
            static const int same_slots[3] = {P_TYPE, P_MODULE, P_META};
            for (int k = 0; k < 3 && shared; k++) {
                PyObject *a = SLOT(PySequence_Fast_GET_ITEM(seq, 0), OFF_PREP[same_slots[k]]);
                PyObject *b = SLOT(e, OFF_PREP[same_slots[k]]);
                int eq = a == b                  ? 1
                         : Py_TYPE(a) != Py_TYPE(b) ? 0
                                                    : PyObject_RichCompareBool(a, b, Py_EQ);
                if (eq < 0) {
                    Py_DECREF(seq);
                    return NULL;
                }
                shared = eq;
            }
        }
    }
    if (flat && n == 0) {
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    if (n > 0 && (version > LLONG_MAX - n || pos > LLONG_MAX - n)) {
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    int width = shared ? 4 : 10;
    PyObject *rows = PyList_New(flat ? width * n : n);
    if (!rows) {
        Py_DECREF(seq);
        return NULL;
    }
    uint8_t prev[AB3_OUT_LEN];
    memcpy(prev, PyBytes_AS_STRING(prev_in), AB3_OUT_LEN);
    const char *stream_js = PyBytes_AS_STRING(stream_json);
    size_t stream_js_len = (size_t)PyBytes_GET_SIZE(stream_json);
    buf_t buf = {NULL, 0};
    PyObject *prev_obj = Py_NewRef(prev_in);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
        version++;
        pos++;
        if (seal_one(&buf, key, prev, SLOT(e, OFF_PREP[P_AT]), SLOT(e, OFF_PREP[P_ID]),
                     SLOT(e, OFF_PREP[P_META]), SLOT(e, OFF_PREP[P_MODULE]),
                     SLOT(e, OFF_PREP[P_DIGEST]), SLOT(e, OFF_PREP[P_SIZE]), stream_js,
                     stream_js_len, SLOT(e, OFF_PREP[P_TYPE]), version) < 0)
            goto fail;
        PyObject *h = PyBytes_FromStringAndSize((const char *)prev, AB3_OUT_LEN);
        if (shared && h) { /* event_id, payload, prev_hash, hash */
            PyObject **out = &PyList_GET_ITEM(rows, 4 * i);
            out[0] = Py_NewRef(SLOT(e, OFF_PREP[P_ID]));
            out[1] = Py_NewRef(SLOT(e, OFF_PREP[P_PAYLOAD]));
            out[2] = prev_obj;
            out[3] = h;
            prev_obj = Py_NewRef(h);
            continue;
        }
        if (flat) {
            /* position, version, event_id, type, module, payload, payload_ref, metadata,
             * prev_hash, hash: the row without stream_id and recorded_at */
            PyObject *po = h ? PyLong_FromLongLong(pos) : NULL;
            PyObject *vo = po ? PyLong_FromLongLong(version) : NULL;
            if (!vo) {
                Py_XDECREF(h);
                Py_XDECREF(po);
                goto fail;
            }
            PyObject **out = &PyList_GET_ITEM(rows, 10 * i);
            out[0] = po;
            out[1] = vo;
            out[2] = Py_NewRef(SLOT(e, OFF_PREP[P_ID]));
            out[3] = Py_NewRef(SLOT(e, OFF_PREP[P_TYPE]));
            out[4] = Py_NewRef(SLOT(e, OFF_PREP[P_MODULE]));
            out[5] = Py_NewRef(SLOT(e, OFF_PREP[P_PAYLOAD]));
            out[6] = Py_NewRef(Py_None);
            out[7] = Py_NewRef(SLOT(e, OFF_PREP[P_META]));
            out[8] = prev_obj;
            out[9] = h;
            prev_obj = Py_NewRef(h);
            continue;
        }
        PyObject *row = h ? PyTuple_New(12) : NULL;
        PyObject *po = row ? PyLong_FromLongLong(pos) : NULL;
        PyObject *vo = po ? PyLong_FromLongLong(version) : NULL;
        if (!vo) {
            Py_XDECREF(h);
            Py_XDECREF(row);
            Py_XDECREF(po);
            goto fail;
        }
        PyTuple_SET_ITEM(row, 0, po);
        PyTuple_SET_ITEM(row, 1, Py_NewRef(stream_id));
        PyTuple_SET_ITEM(row, 2, vo);
        PyTuple_SET_ITEM(row, 3, Py_NewRef(SLOT(e, OFF_PREP[P_ID])));
        PyTuple_SET_ITEM(row, 4, Py_NewRef(SLOT(e, OFF_PREP[P_TYPE])));
        PyTuple_SET_ITEM(row, 5, Py_NewRef(SLOT(e, OFF_PREP[P_MODULE])));
        PyTuple_SET_ITEM(row, 6, Py_NewRef(SLOT(e, OFF_PREP[P_PAYLOAD])));
        PyTuple_SET_ITEM(row, 7, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(row, 8, Py_NewRef(SLOT(e, OFF_PREP[P_META])));
        PyTuple_SET_ITEM(row, 9, Py_NewRef(SLOT(e, OFF_PREP[P_AT])));
        PyTuple_SET_ITEM(row, 10, prev_obj); /* the reference moves into the row */
        PyTuple_SET_ITEM(row, 11, h);
        prev_obj = Py_NewRef(h);
        PyList_SET_ITEM(rows, i, row);
    }
    PyMem_Free(buf.p);
    Py_DECREF(seq);
    if (flat) return Py_BuildValue("(NNi)", rows, prev_obj, width);
    return Py_BuildValue("(NN)", rows, prev_obj);
fail:
    PyMem_Free(buf.p);
    Py_DECREF(prev_obj);
    Py_DECREF(seq);
    Py_DECREF(rows);
    return NULL;
}

/* ---- NewEvent's __init__ (the dataclass-generated one stays the reference) ------------- */

/* A frozen, slotted, keyword-only dataclass's __init__ as the class's tp_init: the same
 * fields, defaults and default factories (read from the dataclass by install_init), the
 * same TypeErrors, the slots written as object.__setattr__ writes them, and no Python
 * frame. tests/integrity/test_native_batch.py holds it to the generated __init__. */
#define INIT_MAX 8
static PyTypeObject *INIT_CLS;
static int INIT_N;
static PyObject *INIT_NAMES[INIT_MAX], *INIT_DEFAULT[INIT_MAX], *INIT_FACTORY[INIT_MAX];
static Py_ssize_t INIT_OFF[INIT_MAX];

static PyObject *INIT_REFERENCE; /* the generated __init__ */

/* Anything but a plain call (positional arguments, an unknown keyword, a missing field)
 * goes to the generated __init__, so the TypeError is the interpreter's own, word for
 * word (3.13 adds "Did you mean ...?"). */
static int kw_init_reference(PyObject *self, PyObject *args, PyObject *kwds) {
    PyObject *bound = PyMethod_New(INIT_REFERENCE, self);
    PyObject *r = bound ? PyObject_Call(bound, args, kwds) : NULL;
    Py_XDECREF(bound);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

static int kw_init(PyObject *self, PyObject *args, PyObject *kwds) {
    PyObject *vals[INIT_MAX] = {NULL};
    Py_ssize_t found = 0;
    if (PyTuple_GET_SIZE(args) != 0 || Py_TYPE(self) != INIT_CLS)
        return kw_init_reference(self, args, kwds);
    if (kwds && PyDict_GET_SIZE(kwds)) {
        for (int k = 0; k < INIT_N; k++) {
            vals[k] = PyDict_GetItemWithError(kwds, INIT_NAMES[k]); /* borrowed */
            if (vals[k]) found++;
            else if (PyErr_Occurred()) return -1;
        }
        if (found != PyDict_GET_SIZE(kwds)) return kw_init_reference(self, args, kwds);
    }
    for (int k = 0; k < INIT_N; k++)
        if (!vals[k] && !INIT_FACTORY[k] && !INIT_DEFAULT[k])
            return kw_init_reference(self, args, kwds);
    PyObject *set[INIT_MAX] = {NULL};
    for (int k = 0; k < INIT_N; k++) {
        PyObject *v = vals[k];
        if (v) {
            set[k] = Py_NewRef(v);
        } else if (INIT_FACTORY[k] == (PyObject *)&PyDict_Type) {
            set[k] = PyDict_New();
        } else if (INIT_FACTORY[k]) {
            set[k] = PyObject_CallNoArgs(INIT_FACTORY[k]);
        } else if (INIT_DEFAULT[k]) {
            set[k] = Py_NewRef(INIT_DEFAULT[k]);
        }
        if (!set[k]) {
            for (int j = 0; j < k; j++) Py_DECREF(set[j]);
            return -1;
        }
    }
    for (int k = 0; k < INIT_N; k++) Py_XSETREF(SLOT(self, INIT_OFF[k]), set[k]);
    return 0;
}

/* install_init(cls, names, defaults, factories, missing): make kw_init cls's tp_init;
 * defaults[i] / factories[i] is `missing` where the field has none. */
static PyObject *install_init(PyObject *self, PyObject *args) {
    PyObject *cls, *names, *defaults, *factories, *missing;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O:install_init", &PyType_Type, &cls, &PyTuple_Type,
                          &names, &PyTuple_Type, &defaults, &PyTuple_Type, &factories, &missing))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n > INIT_MAX || PyTuple_GET_SIZE(defaults) != n || PyTuple_GET_SIZE(factories) != n ||
        !(((PyTypeObject *)cls)->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        PyErr_SetString(PyExc_ValueError, "install_init: unsupported class or fields");
        return NULL;
    }
    PyObject *reference = PyDict_GetItemString(((PyTypeObject *)cls)->tp_dict, "__init__");
    if (!reference || !PyFunction_Check(reference)) {
        PyErr_SetString(PyExc_ValueError, "install_init: the class has no generated __init__");
        return NULL;
    }
    Py_ssize_t offs[INIT_MAX];
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *name = PyTuple_GET_ITEM(names, k);
        if (!PyUnicode_Check(name) || (offs[k] = slot_offset(cls, PyUnicode_AsUTF8(name))) < 0)
            return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *d = PyTuple_GET_ITEM(defaults, k), *f = PyTuple_GET_ITEM(factories, k);
        Py_XSETREF(INIT_NAMES[k], Py_NewRef(PyTuple_GET_ITEM(names, k)));
        Py_XSETREF(INIT_DEFAULT[k], d == missing ? NULL : Py_NewRef(d));
        Py_XSETREF(INIT_FACTORY[k], f == missing ? NULL : Py_NewRef(f));
        INIT_OFF[k] = offs[k];
    }
    if (INIT_CLS && INIT_CLS != (PyTypeObject *)cls) {
        /* Another class (the module reloaded): give the old one back its generated
         * __init__ (setting the attribute makes the interpreter re-point tp_init). */
        if (PyObject_SetAttrString((PyObject *)INIT_CLS, "__init__", INIT_REFERENCE) < 0)
            return NULL;
    }
    INIT_N = (int)n;
    Py_XSETREF(INIT_REFERENCE, Py_NewRef(reference));
    Py_XSETREF(INIT_CLS, (PyTypeObject *)Py_NewRef(cls));
    INIT_CLS->tp_init = kw_init;
    Py_RETURN_NONE;
}

static PyObject *blake3_hash(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "key", NULL};
    Py_buffer data;
    PyObject *key_obj = Py_None;
    uint8_t out[AB3_OUT_LEN];
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|O:blake3_hash", kwlist, &data, &key_obj))
        return NULL;
    const uint8_t *key;
    if (key_of(key_obj, &key) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ab3_hash(key, (const uint8_t *)data.buf, (size_t)data.len, out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, AB3_OUT_LEN);
}


/* ---- canonical JSON acceptance (ares_events.chain._scan, the reference) ---------------- */

#define MAX_DEPTH 200

/* 1: the value holds a float; 0: it does not; -1: the reference refuses it (no exception
 * set: the Python path then names the problem); -2: an exception is set. */
static int scan_value(PyObject *x, int depth);

static int scan_item(PyObject *v, int depth) {
    if (PyUnicode_CheckExact(v) || PyBool_Check(v) || v == Py_None) return 0;
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long ll = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (ll == -1 && PyErr_Occurred()) return -2;
        return overflow ? -1 : 0;
    }
    if (PyFloat_CheckExact(v)) return isfinite(PyFloat_AS_DOUBLE(v)) ? 1 : -1;
    if (PyDict_CheckExact(v) || PyList_CheckExact(v)) return scan_value(v, depth + 1);
    if (PyUnicode_Check(v)) return 0; /* a str subclass encodes as its value */
    return -1;
}

static int scan_value(PyObject *x, int depth) {
    if (depth > MAX_DEPTH) return -1;
    int has_float = 0;
    if (PyDict_CheckExact(x)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(x, &pos, &k, &v)) {
            if (!PyUnicode_CheckExact(k)) return -1;
            int r = scan_item(v, depth);
            if (r < 0) return r;
            has_float |= r;
        }
        return has_float;
    }
    if (PyList_CheckExact(x)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(x); i++) {
            int r = scan_item(PyList_GET_ITEM(x, i), depth);
            if (r < 0) return r;
            has_float |= r;
        }
        return has_float;
    }
    return scan_item(x, depth - 1);
}

static PyObject *scan(PyObject *self, PyObject *x) {
    (void)self;
    int r = scan_value(x, 0);
    if (r == -2) return NULL;
    if (r == -1) Py_RETURN_NONE;
    return PyBool_FromLong(r);
}

static PyObject *sqlite_setup(PyObject *self, PyObject *args); /* below, with the writer */
static PyObject *sqlite_handle_check(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(value, /)\n--\n\n"
     "True when value holds a float, False when not, None when canonical JSON refuses\n"
     "it; the same acceptance as ares_events.chain._scan."},
    {"verify_run", verify_run, METH_VARARGS,
     "verify_run(events, start, stream_id, stream_json, last_version, last_hash, key)\n"
     "--\n\n"
     "The chain verifier's fast path over events[start:]; the same as the pure-Python\n"
     "ares_events.integrity.verifier.verify_run. Returns (index of the first event it\n"
     "cannot vouch for or len(events), last version, last hash)."},
    {"link_hashes", link_hashes, METH_VARARGS,
     "link_hashes(stream_json, version, prev, events, key)\n--\n\n"
     "The link hashes of events sealed after version whose hash is prev; the same as\n"
     "ares_events.chain.link_hashes (stream_json: the stream id as a JSON string)."},
    {"make_uuid7", (PyCFunction)(void (*)(void))make_uuid7, METH_FASTCALL,
     "make_uuid7(cls, ms, seq, rand_b, is_safe, /)\n--\n\n"
     "A cls instance (uuid.UUID with a _text slot) for the UUIDv7 of ms, seq and rand_b;\n"
     "the same object as ares_events.core.events.uuid7 builds in Python."},
    {"uuid7_setup", uuid7_setup, METH_VARARGS,
     "uuid7_setup(cls, is_safe, getrandbits, time_ns)\n--\n\n"
     "Give uuid7() its class, is_safe value, random bits and clock, and start its\n"
     "millisecond counter afresh."},
    {"uuid7", uuid7_new, METH_NOARGS,
     "uuid7()\n--\n\n"
     "A new UUIDv7 object: ares_events.core.events.uuid7's steps, in C."},
    {"prepare", (PyCFunction)(void (*)(void))prepare, METH_FASTCALL,
     "prepare(events, at, NewEvent, PreparedEvent, _UUID7, good_names, dumps, opts,\n"
     "        max_meta, /)\n--\n\n"
     "ares_events.core.events.prepare_reference's PreparedEvents for the plain case, in\n"
     "one pass; None when the reference has to run."},
    {"insert_rows", insert_rows, METH_VARARGS,
     "insert_rows(stream_id, stream_json, version, prev, position, prepared, key,\n"
     "            PreparedEvent, flat=False, /)\n--\n\n"
     "(rows, last hash): ares_events.core.backend.insert_rows_reference in one pass;\n"
     "flat: one list of the rows' values without stream_id and recorded_at (one\n"
     "recorded_at for the batch). None when the reference has to run."},
    {"install_init", install_init, METH_VARARGS,
     "install_init(cls, names, defaults, factories, missing, /)\n--\n\n"
     "Give a frozen, slotted, keyword-only dataclass (NewEvent) a C __init__ with the\n"
     "same fields, defaults and errors as its generated one."},
    {"sqlite_setup", sqlite_setup, METH_VARARGS,
     "sqlite_setup(path, version_number, /)\n--\n\n"
     "Find the SQLite functions in the library the module at path (_sqlite3) runs on;\n"
     "True when SQLiteWriter can be used."},
    {"sqlite_handle_check", sqlite_handle_check, METH_VARARGS,
     "sqlite_handle_check(connect, connection_type, /)\n--\n\n"
     "True when a connection_type made by connect(':memory:') starts with the sqlite3\n"
     "handle SQLite opened for it (checked, never assumed); SQLiteWriter needs it."},
    {"blake3_hash", (PyCFunction)(void (*)(void))blake3_hash, METH_VARARGS | METH_KEYWORDS,
     "blake3_hash(data, key=None)\n--\n\n"
     "The 32-byte BLAKE3 hash of data (keyed_hash mode with a 32-byte key)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ares_events._native",
    "The chain format's fast paths in C (optional; see chain.py and verifier.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

static int add_page_methods(PyObject *mod);
static int add_writer(PyObject *mod);

PyMODINIT_FUNC PyInit__native(void) {
    if (!S_AT) {
        S_AT = PyUnicode_InternFromString("at");
        S_EVENT_ID = PyUnicode_InternFromString("event_id");
        S_META_JSON = PyUnicode_InternFromString("meta_json");
        S_MODULE = PyUnicode_InternFromString("module");
        S_DIGEST = PyUnicode_InternFromString("digest");
        S_SIZE = PyUnicode_InternFromString("size");
        S_TYPE = PyUnicode_InternFromString("type");
        S_INT = PyUnicode_InternFromString("int");
        S_IS_SAFE = PyUnicode_InternFromString("is_safe");
        S_TEXT = PyUnicode_InternFromString("_text");
        /* interned: orjson matches keyword names by identity */
        PyObject *opt = PyUnicode_InternFromString("option");
        S_OPTION_KW = opt ? PyTuple_Pack(1, opt) : NULL;
        Py_XDECREF(opt);
        if (!S_OPTION_KW) return NULL;
        if (!S_INT || !S_IS_SAFE || !S_TEXT) return NULL;
        if (!S_AT || !S_EVENT_ID || !S_META_JSON || !S_MODULE || !S_DIGEST || !S_SIZE || !S_TYPE)
            return NULL;
    }
    PyObject *mod = PyModule_Create(&module);
    if (mod && (add_page_methods(mod) < 0 || add_writer(mod) < 0)) Py_CLEAR(mod);
    return mod;
}

/* ==== Issue 33's read path: a page of events verified in one call ======================
 *
 * verify_page() vouches for a prefix of what verify_run() would vouch for, hashing several
 * events at once: the payload digests of a page are independent, and so are its link
 * hashes once each event's stored prev_hash is known to equal the stored hash before it,
 * so both are computed lanes-wide (16 lanes with AVX-512, 8 with AVX2, 4 with SSE2 or
 * the compiler's generic vectors, one at a time without them). It declines (stops) at anything unusual
 * (a subclass, a non-bytes value, a version past int64, a string that is not UTF-8):
 * the caller goes on with verify_run() from there, which decides those. So it never
 * vouches for an event verify_run refuses, and verify_run settles the rest. */

/* One chunk to compress lanes-wide: a whole input of one chunk at most (root = AB3_ROOT,
 * counter 0, out its hash), or one chunk of a longer input (root = 0, counter the chunk's
 * index, out its chaining value, joined by mh_join). */
typedef struct {
    const uint8_t *in;
    size_t len;
    uint8_t *out;
    uint64_t counter;
    uint8_t root;
} mh_part;

/* The hashes of jobs[0:njobs] (each one chunk at most), lanes-wide: each lane takes the
 * next job when its own is done, so inputs of different lengths share the steps. The
 * message words and the per-lane values are built as vectors from scalars (not stored
 * lane by lane and read back whole, which stalls on store forwarding); the chaining
 * values stay vectors from step to step. */
#define MH_L4(f) {f(0), f(1), f(2), f(3)}
#define MH_L8(f) {f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7)}
#define MH_L16(f)                                                                     \
    {f(0), f(1), f(2),  f(3),  f(4),  f(5),  f(6),  f(7),                              \
     f(8), f(9), f(10), f(11), f(12), f(13), f(14), f(15)}
#define MH_DEFINE(NAME, W, LANES, ATTR)                                                       \
    ATTR static void NAME(const mh_part *jobs, size_t njobs, const uint32_t key[8],           \
                          uint8_t base) {                                                     \
        typedef uint32_t vec __attribute__((vector_size(4 * (W))));                           \
        size_t job[W], off[W];                                                                \
        int active[W];                                                                        \
        const uint8_t *src[W];                                                                \
        uint8_t pad[W][AB3_BLOCK_LEN];                                                        \
        uint32_t bl[W], fl[W], fresh[W], clo[W], chi[W];                                      \
        vec cv[8];                                                                            \
        size_t next = 0;                                                                      \
        for (int k = 0; k < 8; k++) cv[k] = (vec){0} + key[k];                                \
        for (int l = 0; l < (W); l++) active[l] = 0;                                          \
        for (;;) {                                                                            \
            int any = 0;                                                                      \
            for (int l = 0; l < (W); l++) {                                                   \
                fresh[l] = 0;                                                                 \
                if (!active[l] && next < njobs) {                                             \
                    job[l] = next++;                                                          \
                    off[l] = 0;                                                               \
                    active[l] = 1;                                                            \
                    fresh[l] = 0xFFFFFFFFu;                                                   \
                }                                                                             \
                if (!active[l]) {                                                             \
                    bl[l] = 0;                                                                \
                    fl[l] = 0;                                                                \
                    clo[l] = chi[l] = 0;                                                      \
                    src[l] = pad[l];                                                          \
                    continue;                                                                 \
                }                                                                             \
                any = 1;                                                                      \
                const mh_part *jb = &jobs[job[l]];                                            \
                size_t rem = jb->len - off[l];                                                \
                uint32_t flags = base | (off[l] == 0 ? AB3_CHUNK_START : 0);                  \
                size_t take = AB3_BLOCK_LEN;                                                  \
                if (rem <= AB3_BLOCK_LEN) {                                                   \
                    take = rem;                                                               \
                    flags |= AB3_CHUNK_END | jb->root;                                        \
                }                                                                             \
                clo[l] = (uint32_t)jb->counter;                                               \
                chi[l] = (uint32_t)(jb->counter >> 32);                                       \
                src[l] = jb->in + off[l];                                                     \
                if (take < AB3_BLOCK_LEN) {                                                   \
                    memset(pad[l], 0, AB3_BLOCK_LEN);                                         \
                    if (take) memcpy(pad[l], src[l], take);                                   \
                    src[l] = pad[l];                                                          \
                }                                                                             \
                bl[l] = (uint32_t)take;                                                       \
                fl[l] = flags;                                                                \
            }                                                                                 \
            if (!any) break;                                                                  \
            {                                                                                 \
                vec fm = LANES(MH_FRESH);                                                     \
                for (int k = 0; k < 8; k++) cv[k] = (cv[k] & ~fm) | (((vec){0} + key[k]) & fm); \
            }                                                                                 \
            vec s[16], m[16];                                                                 \
            for (int w = 0; w < 16; w++) m[w] = (vec)LANES(MH_WORD);                          \
            for (int k = 0; k < 8; k++) s[k] = cv[k];                                         \
            for (int k = 0; k < 4; k++) s[8 + k] = (vec){0} + AB3_IV[k];                      \
            s[12] = (vec)LANES(MH_CLO);                                                       \
            s[13] = (vec)LANES(MH_CHI);                                                       \
            s[14] = (vec)LANES(MH_BL);                                                        \
            s[15] = (vec)LANES(MH_FL);                                                        \
            for (int r = 0; r < 7; r++) {                                                     \
                const uint8_t *p = AB3_SCHEDULE[r];                                           \
                MH_G(0, 4, 8, 12, m[p[0]], m[p[1]]);                                          \
                MH_G(1, 5, 9, 13, m[p[2]], m[p[3]]);                                          \
                MH_G(2, 6, 10, 14, m[p[4]], m[p[5]]);                                         \
                MH_G(3, 7, 11, 15, m[p[6]], m[p[7]]);                                         \
                MH_G(0, 5, 10, 15, m[p[8]], m[p[9]]);                                         \
                MH_G(1, 6, 11, 12, m[p[10]], m[p[11]]);                                       \
                MH_G(2, 7, 8, 13, m[p[12]], m[p[13]]);                                        \
                MH_G(3, 4, 9, 14, m[p[14]], m[p[15]]);                                        \
            }                                                                                 \
            for (int k = 0; k < 8; k++) cv[k] = s[k] ^ s[k + 8];                              \
            for (int l = 0; l < (W); l++) {                                                   \
                if (!active[l]) continue;                                                     \
                if (fl[l] & AB3_CHUNK_END) {                                                  \
                    uint8_t *o = jobs[job[l]].out;                                            \
                    for (int k = 0; k < 8; k++) ab3_store32(o + 4 * k, cv[k][l]);             \
                    active[l] = 0;                                                            \
                } else {                                                                      \
                    off[l] += AB3_BLOCK_LEN;                                                  \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }
#define MH_FRESH(l) fresh[l]
#define MH_WORD(l) ab3_load32(src[l] + 4 * w)
#define MH_BL(l) bl[l]
#define MH_FL(l) fl[l]
#define MH_CLO(l) clo[l]
#define MH_CHI(l) chi[l]

#define MH_ROT(x, c) (((x) >> (c)) | ((x) << (32 - (c))))
#define MH_G(a, b, c, d, x, y)               \
    do {                                     \
        s[a] = s[a] + s[b] + (x);            \
        s[d] = MH_ROT(s[d] ^ s[a], 16);      \
        s[c] = s[c] + s[d];                  \
        s[b] = MH_ROT(s[b] ^ s[c], 12);      \
        s[a] = s[a] + s[b] + (y);            \
        s[d] = MH_ROT(s[d] ^ s[a], 8);       \
        s[c] = s[c] + s[d];                  \
        s[b] = MH_ROT(s[b] ^ s[c], 7);       \
    } while (0)

#if defined(__GNUC__) || defined(__clang__)
#define MH_VECTORS 1
MH_DEFINE(mh_run4, 4, MH_L4, )
#if defined(__x86_64__) || defined(__i386__)
#define MH_X86 1
MH_DEFINE(mh_run8, 8, MH_L8, __attribute__((target("avx2"))))
MH_DEFINE(mh_run16, 16, MH_L16, __attribute__((target("avx512f"))))
#endif
#endif

/* Which lanes-wide path runs: 0 = the best the CPU has, else 1 (one at a time), 4, 8 or
 * 16 (set by blake3_many for the tests; a width the CPU lacks falls back to a lower one). */
static int mh_width(int want) {
#ifdef MH_X86
    static int avx2 = -1, avx512 = -1;
    if (avx2 < 0) {
        __builtin_cpu_init();
        avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
        avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    if (want == 0) want = avx512 ? 16 : avx2 ? 8 : 4;
    if (want == 16 && !avx512) want = 8;
    if (want == 8 && !avx2) want = 4;
    if (want != 1 && want != 4 && want != 8 && want != 16) want = 4;
#elif defined(MH_VECTORS)
    if (want != 1) want = 4;
#else
    want = 1;
#endif
    return want;
}

/* The hash of an input of n > 1 chunks from its chunks' chaining values (cvs, 32 bytes
 * each, in order): ab3_hash's stack of completed subtrees, the final parent as root. */
static void mh_join(const uint32_t key[8], uint8_t base, const uint8_t *cvs, size_t n,
                    uint8_t out[AB3_OUT_LEN]) {
    uint32_t stack[54][8], cv[8];
    size_t depth = 0;
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 8; k++) cv[k] = ab3_load32(cvs + AB3_OUT_LEN * i + 4 * k);
        if (i == n - 1) break;
        for (uint64_t total = i + 1; (total & 1) == 0; total >>= 1) {
            depth--;
            ab3_parent(key, stack[depth], cv, base, 0, cv);
        }
        memcpy(stack[depth++], cv, sizeof cv);
    }
    while (depth > 0) {
        depth--;
        ab3_parent(key, stack[depth], cv, base, depth == 0, cv);
    }
    for (int k = 0; k < 8; k++) ab3_store32(out + 4 * k, cv[k]);
}

static size_t mh_chunks(size_t len) {
    return len <= AB3_CHUNK_LEN ? 1 : (len + AB3_CHUNK_LEN - 1) / AB3_CHUNK_LEN;
}

static void mh_hash(mh_job *jobs, size_t njobs, const uint8_t *key32, int width) {
    uint32_t key[8];
    uint8_t base = 0;
    if (key32) {
        for (int i = 0; i < 8; i++) key[i] = ab3_load32(key32 + 4 * i);
        base = AB3_KEYED_HASH;
    } else {
        memcpy(key, AB3_IV, sizeof key);
    }
    if (njobs == 0) return;
#ifdef MH_VECTORS
    /* Every chunk of every input is a part; a longer input's chaining values go to cvs. */
    size_t nparts = 0, ncvs = 0;
    for (size_t i = 0; i < njobs; i++) {
        size_t c = mh_chunks(jobs[i].len);
        nparts += c;
        if (c > 1) ncvs += c;
    }
    mh_part *parts = width == 1 ? NULL : (mh_part *)PyMem_RawMalloc(sizeof(mh_part) * nparts);
    uint8_t *cvs = ncvs ? (uint8_t *)PyMem_RawMalloc((size_t)AB3_OUT_LEN * ncvs) : NULL;
    if (parts && (cvs || !ncvs)) {
        size_t k = 0, c = 0;
        for (size_t i = 0; i < njobs; i++) {
            size_t n = mh_chunks(jobs[i].len);
            for (size_t j = 0; j < n; j++, k++) {
                size_t off = j * AB3_CHUNK_LEN, rem = jobs[i].len - off;
                parts[k].in = jobs[i].in + off;
                parts[k].len = rem < AB3_CHUNK_LEN ? rem : AB3_CHUNK_LEN;
                parts[k].out = n == 1 ? jobs[i].out : cvs + (size_t)AB3_OUT_LEN * (c + j);
                parts[k].counter = j;
                parts[k].root = n == 1 ? AB3_ROOT : 0;
            }
            if (n > 1) c += n;
        }
#ifdef MH_X86
        if (width == 16)
            mh_run16(parts, nparts, key, base);
        else if (width == 8)
            mh_run8(parts, nparts, key, base);
        else
#endif
            mh_run4(parts, nparts, key, base);
        c = 0;
        for (size_t i = 0; i < njobs; i++) {
            size_t n = mh_chunks(jobs[i].len);
            if (n == 1) continue;
            mh_join(key, base, cvs + (size_t)AB3_OUT_LEN * c, n, jobs[i].out);
            c += n;
        }
        PyMem_RawFree(parts);
        PyMem_RawFree(cvs);
        return;
    }
    /* No memory for the parts (or one at a time asked for): each input alone. */
    PyMem_RawFree(parts);
    PyMem_RawFree(cvs);
#endif
    for (size_t i = 0; i < njobs; i++) ab3_hash(key32, jobs[i].in, jobs[i].len, jobs[i].out);
}

static int vp_str(PyObject *o, const char **s, Py_ssize_t *len) {
    if (!PyUnicode_CheckExact(o)) return 0;
    *s = PyUnicode_AsUTF8AndSize(o, len);
    if (!*s) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

typedef struct {
    const char *ty, *mo, *at, *eid, *meta, *payload;
    Py_ssize_t ty_len, mo_len, at_len, id_len, meta_len, payload_len;
    long long version;
    size_t hoff, hlen; /* the link hash input (prev + header) in the page buffer */
    uint8_t digest[AB3_OUT_LEN];
    uint8_t h[AB3_OUT_LEN];
} vp_ev;

static PyObject *verify_page(PyObject *self, PyObject *args) {
    PyObject *events, *stream_id, *stream_json, *last_version, *last_hash_in, *key_obj;
    Py_ssize_t start;
    int width = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!nUSO!SO|i:verify_page", &PyList_Type, &events, &start,
                          &stream_id, &stream_json, &PyLong_Type, &last_version,
                          &last_hash_in, &key_obj, &width))
        return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "start must be >= 0");
        return NULL;
    }
    const uint8_t *key;
    if (key_of(key_obj, &key) < 0) return NULL;
    width = mh_width(width);
    int overflow = 0;
    long long last_ll = PyLong_AsLongLongAndOverflow(last_version, &overflow);
    if (last_ll == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(events);
    if (overflow || !PyLong_CheckExact(last_version) || start >= n ||
        !PyBytes_CheckExact(last_hash_in))
        return Py_BuildValue("(nOO)", start, last_version, last_hash_in);

    Py_ssize_t cap = n - start;
    vp_ev *ev = (vp_ev *)PyMem_Malloc(sizeof(vp_ev) * (size_t)cap);
    mh_job *jobs = (mh_job *)PyMem_Malloc(sizeof(mh_job) * (size_t)cap);
    char *buf = NULL;
    PyObject *result = NULL;
    if (!ev || !jobs) {
        PyErr_NoMemory();
        goto done;
    }
    const char *stream_js = PyBytes_AS_STRING(stream_json);
    size_t stream_js_len = (size_t)PyBytes_GET_SIZE(stream_json);

    /* 1. The checks that need no hash, in order, up to the first decline. */
    const char *prev = PyBytes_AS_STRING(last_hash_in);
    Py_ssize_t prev_len = PyBytes_GET_SIZE(last_hash_in);
    long long lv = last_ll;
    Py_ssize_t m = 0;
    size_t total = 0;
    for (Py_ssize_t i = start; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(events, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < F_MIN_ITEMS) break;
        PyObject *version = PyTuple_GET_ITEM(e, F_VERSION);
        PyObject *raw = PyTuple_GET_ITEM(e, F_PAYLOAD);
        PyObject *prev_o = PyTuple_GET_ITEM(e, F_PREV);
        PyObject *sid = PyTuple_GET_ITEM(e, F_STREAM);
        PyObject *meta = PyTuple_GET_ITEM(e, F_META);
        PyObject *stored = PyTuple_GET_ITEM(e, F_HASH);
        if (!PyLong_CheckExact(version) || lv == LLONG_MAX) break;
        int ov = 0;
        long long v = PyLong_AsLongLongAndOverflow(version, &ov);
        if (ov || v != lv + 1) break;
        if (!PyBytes_CheckExact(prev_o) || PyBytes_GET_SIZE(prev_o) != prev_len ||
            memcmp(PyBytes_AS_STRING(prev_o), prev, (size_t)prev_len) != 0)
            break;
        if (PyTuple_GET_ITEM(e, F_REF) != Py_None || !PyBytes_CheckExact(raw)) break;
        if (sid != stream_id) {
            if (!PyUnicode_CheckExact(sid)) break;
            int c = PyUnicode_Compare(sid, stream_id);
            if (c == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                break;
            }
            if (c != 0) break;
        }
        if (!PyBytes_CheckExact(meta) || !PyBytes_CheckExact(stored) ||
            PyBytes_GET_SIZE(stored) != AB3_OUT_LEN)
            break;
        vp_ev *x = &ev[m];
        if (!vp_str(PyTuple_GET_ITEM(e, F_TYPE), &x->ty, &x->ty_len) ||
            !vp_str(PyTuple_GET_ITEM(e, F_MODULE), &x->mo, &x->mo_len) ||
            !vp_str(PyTuple_GET_ITEM(e, F_AT), &x->at, &x->at_len) ||
            !vp_str(PyTuple_GET_ITEM(e, F_EVENT_ID), &x->eid, &x->id_len))
            break;
        x->meta = PyBytes_AS_STRING(meta);
        x->meta_len = PyBytes_GET_SIZE(meta);
        x->payload = PyBytes_AS_STRING(raw);
        x->payload_len = PyBytes_GET_SIZE(raw);
        x->version = v;
        x->hlen = (size_t)prev_len + 256 +
                  6 * ((size_t)x->ty_len + x->mo_len + x->at_len + x->id_len) +
                  (size_t)x->meta_len + stream_js_len;
        total += x->hlen;
        /* The next event links to this one's stored hash: if it is not also the
         * computed one, step 5 stops here and the next event is never vouched for. */
        prev = PyBytes_AS_STRING(stored);
        prev_len = AB3_OUT_LEN;
        lv = v;
        m++;
    }
    if (m == 0) {
        result = Py_BuildValue("(nOO)", start, last_version, last_hash_in);
        goto done;
    }

    /* 2. Every payload digest. */
    for (Py_ssize_t k = 0; k < m; k++) {
        jobs[k].in = (const uint8_t *)ev[k].payload;
        jobs[k].len = (size_t)ev[k].payload_len;
        jobs[k].out = ev[k].digest;
    }
    mh_hash(jobs, (size_t)m, NULL, width);

    /* 3. Every link hash input: the stored prev_hash (checked equal above) + header. */
    buf = (char *)PyMem_Malloc(total ? total : 1);
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    char *o = buf;
    for (Py_ssize_t k = 0; k < m; k++) {
        vp_ev *x = &ev[k];
        PyObject *e = PyList_GET_ITEM(events, start + k);
        PyObject *prev_o = PyTuple_GET_ITEM(e, F_PREV);
        x->hoff = (size_t)(o - buf);
        o = put(o, PyBytes_AS_STRING(prev_o), (size_t)PyBytes_GET_SIZE(prev_o));
        o = PUT_LIT(o, "{\"at\":");
        o = json_str(o, x->at, x->at_len);
        o = PUT_LIT(o, ",\"id\":");
        o = json_str(o, x->eid, x->id_len);
        o = PUT_LIT(o, ",\"meta\":");
        o = put(o, x->meta, (size_t)x->meta_len);
        o = PUT_LIT(o, ",\"module\":");
        o = json_str(o, x->mo, x->mo_len);
        o = PUT_LIT(o, ",\"payload\":\"");
        for (int b = 0; b < AB3_OUT_LEN; b++) {
            *o++ = HEX[x->digest[b] >> 4];
            *o++ = HEX[x->digest[b] & 15];
        }
        o = PUT_LIT(o, "\",\"size\":");
        o = put_int(o, x->payload_len);
        o = PUT_LIT(o, ",\"stream\":");
        o = put(o, stream_js, stream_js_len);
        o = PUT_LIT(o, ",\"type\":");
        o = json_str(o, x->ty, x->ty_len);
        o = PUT_LIT(o, ",\"v\":1,\"version\":");
        o = put_int(o, x->version);
        *o++ = '}';
        x->hlen = (size_t)(o - buf) - x->hoff;
    }

    /* 4. Every link hash. */
    for (Py_ssize_t k = 0; k < m; k++) {
        jobs[k].in = (const uint8_t *)buf + ev[k].hoff;
        jobs[k].len = ev[k].hlen;
        jobs[k].out = ev[k].h;
    }
    mh_hash(jobs, (size_t)m, key, width);

    /* 5. In order: vouch while the computed hash is the stored one. */
    Py_ssize_t ok = 0;
    while (ok < m) {
        PyObject *stored = PyTuple_GET_ITEM(PyList_GET_ITEM(events, start + ok), F_HASH);
        if (memcmp(PyBytes_AS_STRING(stored), ev[ok].h, AB3_OUT_LEN) != 0) break;
        ok++;
    }
    if (ok == 0) {
        result = Py_BuildValue("(nOO)", start, last_version, last_hash_in);
    } else {
        PyObject *e = PyList_GET_ITEM(events, start + ok - 1);
        result = Py_BuildValue("(nOO)", start + ok, PyTuple_GET_ITEM(e, F_VERSION),
                               PyTuple_GET_ITEM(e, F_HASH));
    }
done:
    PyMem_Free(ev);
    PyMem_Free(jobs);
    PyMem_Free(buf);
    return result;
}

/* blake3_many(items, key=None, width=0): the hashes of a list of bytes, lanes-wide (for
 * the tests: width 1, 4, 8 or 16 forces a path; 0 is the one verify_page uses). */
static PyObject *blake3_many(PyObject *self, PyObject *args) {
    PyObject *items, *key_obj = Py_None;
    int width = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!|Oi:blake3_many", &PyList_Type, &items, &key_obj, &width))
        return NULL;
    const uint8_t *key;
    if (key_of(key_obj, &key) < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(PyList_GET_ITEM(items, i))) {
            PyErr_SetString(PyExc_TypeError, "items must be bytes");
            return NULL;
        }
    }
    mh_job *jobs = (mh_job *)PyMem_Malloc(sizeof(mh_job) * (size_t)(n ? n : 1));
    uint8_t *outs = (uint8_t *)PyMem_Malloc((size_t)AB3_OUT_LEN * (size_t)(n ? n : 1));
    PyObject *res = NULL;
    if (!jobs || !outs) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyList_GET_ITEM(items, i);
        jobs[i].in = (const uint8_t *)PyBytes_AS_STRING(b);
        jobs[i].len = (size_t)PyBytes_GET_SIZE(b);
        jobs[i].out = outs + (size_t)AB3_OUT_LEN * (size_t)i;
    }
    mh_hash(jobs, (size_t)n, key, mh_width(width));
    res = PyList_New(n);
    if (!res) goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PyBytes_FromStringAndSize((const char *)outs + AB3_OUT_LEN * i,
                                                AB3_OUT_LEN);
        if (!h) {
            Py_CLEAR(res);
            goto out;
        }
        PyList_SET_ITEM(res, i, h);
    }
out:
    PyMem_Free(jobs);
    PyMem_Free(outs);
    return res;
}

/* row_to_event(cls, missing, slow, row): the RecordedEvent of a SQLite row (12 columns in
 * RecordedEvent's order, payload_ref NULL): tuple.__new__(cls, (*row, [missing, missing,
 * None])) as RecordedEvent._from_row builds it, in one C call. Any other row (a
 * reference to parse, an unexpected shape) goes to slow(row). */
static PyObject *row_to_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "row_to_event(cls, missing, slow, row)");
        return NULL;
    }
    PyObject *cls = args[0], *missing = args[1], *slow = args[2], *row = args[3];
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a tuple subclass");
        return NULL;
    }
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != F_MIN_ITEMS ||
        PyTuple_GET_ITEM(row, F_REF) != Py_None)
        return PyObject_CallOneArg(slow, row);
    PyObject *cell = PyList_New(3);
    if (!cell) return NULL;
    Py_INCREF(missing);
    PyList_SET_ITEM(cell, 0, missing);
    Py_INCREF(missing);
    PyList_SET_ITEM(cell, 1, missing);
    Py_INCREF(Py_None);
    PyList_SET_ITEM(cell, 2, Py_None);
    PyTypeObject *tp = (PyTypeObject *)cls;
    PyObject *e = tp->tp_alloc(tp, F_MIN_ITEMS + 1);
    if (!e) {
        Py_DECREF(cell);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < F_MIN_ITEMS; k++) {
        PyObject *x = PyTuple_GET_ITEM(row, k);
        Py_INCREF(x);
        PyTuple_SET_ITEM(e, k, x);
    }
    PyTuple_SET_ITEM(e, F_MIN_ITEMS, cell);
    return e;
}

/* event_payload(event): RecordedEvent.payload in C (the property's Python getter stays the
 * reference, set by payload_setup with the missing marker and orjson.loads): the value the
 * event's cell holds, or its inline payload decoded and kept there; slow(event) decides any
 * other event (spilled, erased, an unexpected shape). */
static PyObject *PL_MISSING, *PL_LOADS, *PL_SLOW;

static PyObject *payload_setup(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *missing, *loads, *slow;
    if (!PyArg_ParseTuple(args, "OOO:payload_setup", &missing, &loads, &slow)) return NULL;
    Py_XSETREF(PL_MISSING, Py_NewRef(missing));
    Py_XSETREF(PL_LOADS, Py_NewRef(loads));
    Py_XSETREF(PL_SLOW, Py_NewRef(slow));
    Py_RETURN_NONE;
}

static PyObject *event_payload(PyObject *self, PyObject *e) {
    (void)self;
    if (!PL_SLOW) {
        PyErr_SetString(PyExc_RuntimeError, "payload_setup() was not called");
        return NULL;
    }
    if (PyTuple_Check(e) && PyTuple_GET_SIZE(e) == F_MIN_ITEMS + 1) {
        PyObject *cell = PyTuple_GET_ITEM(e, F_MIN_ITEMS);
        if (PyList_CheckExact(cell) && PyList_GET_SIZE(cell) == 3) {
            PyObject *p = PyList_GET_ITEM(cell, 0);
            if (p != PL_MISSING) return Py_NewRef(p);
            PyObject *raw = PyTuple_GET_ITEM(e, F_PAYLOAD);
            if (PyBytes_CheckExact(raw)) {
                p = PyObject_CallOneArg(PL_LOADS, raw);
                if (p) PyList_SetItem(cell, 0, Py_NewRef(p));
                return p;
            }
        }
    }
    return PyObject_CallOneArg(PL_SLOW, e);
}

static PyMethodDef page_methods[] = {
    {"row_to_event", (PyCFunction)(void (*)(void))row_to_event, METH_FASTCALL,
     "row_to_event(cls, missing, slow, row, /)\n--\n\n"
     "RecordedEvent._from_row of a row without a payload reference, in C; slow(row) for\n"
     "any other row."},
    {"payload_setup", payload_setup, METH_VARARGS,
     "payload_setup(missing, loads, slow, /)\n--\n\nWhat event_payload needs."},
    {"event_payload", event_payload, METH_O,
     "event_payload(event, /)\n--\n\n"
     "RecordedEvent.payload in C; slow(event) for any event but the plain cases."},
    {"verify_page", verify_page, METH_VARARGS,
     "verify_page(events, start, stream_id, stream_json, last_version, last_hash, key,\n"
     "            width=0)\n--\n\n"
     "verify_run over a list of events or rows, hashing several events at once; it may\n"
     "stop earlier than verify_run (at anything unusual), never later: go on with\n"
     "verify_run from the index it returns."},
    {"blake3_many", blake3_many, METH_VARARGS,
     "blake3_many(items, key=None, width=0)\n--\n\n"
     "The BLAKE3 hash of each bytes of a list, lanes-wide (width 1, 4, 8 or 16 forces a\n"
     "path)."},
    {NULL, NULL, 0, NULL},
};

static int add_page_methods(PyObject *mod) {
    return PyModule_AddFunctions(mod, page_methods);
}

/* ==== Issue 33's write path: an SQLite append in one call =================================
 *
 * SQLiteWriter runs SQLiteRecorder._append_rows' statements (BEGIN IMMEDIATE, the head and
 * last position, the multi-row INSERTs, the head's UPSERT, COMMIT) on the sqlite3 handle of
 * one Python sqlite3.Connection, with insert_rows() sealing the rows in between: the same
 * SQL, the same values, the same transaction, without a Python call per statement and with
 * no copy of a bound value (Python's sqlite3 copies each one). The rows are byte for byte
 * the Python path's (tests/stores/test_sqlite_native_writes.py).
 *
 * The SQLite functions are those of the library Python's own _sqlite3 module runs on,
 * looked up in it at run time (sqlite_setup): never a second copy of SQLite in the process
 * (two copies would not share their POSIX lock bookkeeping) and no build dependency on its
 * headers. Anything unusual is handed back: append() returns None before anything is
 * written (a version that does not match, a reused event id, an event insert_rows does not
 * take, a connection that was closed) and the recorder runs its Python path, which decides;
 * False when the database stayed busy for the busy timeout. Other SQLite errors are raised
 * as sqlite3's own exception classes, after a ROLLBACK. */

#if defined(_WIN32)
static PyObject *sqlite_setup(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    Py_RETURN_FALSE; /* no dlsym: the Python path */
}
static PyObject *sqlite_handle_check(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    Py_RETURN_FALSE;
}
#else
#include <dlfcn.h>

typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
#define SQ_OK 0
#define SQ_BUSY 5
#define SQ_LOCKED 6
#define SQ_CONSTRAINT 19
#define SQ_INTEGER 1
#define SQ_FLOAT 2
#define SQ_ROW 100
#define SQ_DONE 101
#define SQ_BLOB 4
#define SQ_NULL 5
#define SQ_PREPARE_PERSISTENT 0x01

static struct {
    int (*prepare_v3)(sqlite3 *, const char *, int, unsigned int, sqlite3_stmt **,
                      const char **);
    int (*step)(sqlite3_stmt *);
    int (*reset)(sqlite3_stmt *);
    int (*finalize)(sqlite3_stmt *);
    int (*bind_int64)(sqlite3_stmt *, int, long long);
    int (*bind_text)(sqlite3_stmt *, int, const char *, int, void (*)(void *));
    int (*bind_blob)(sqlite3_stmt *, int, const void *, int, void (*)(void *));
    int (*bind_null)(sqlite3_stmt *, int);
    int (*column_type)(sqlite3_stmt *, int);
    long long (*column_int64)(sqlite3_stmt *, int);
    const void *(*column_blob)(sqlite3_stmt *, int);
    int (*column_bytes)(sqlite3_stmt *, int);
    const char *(*errmsg)(sqlite3 *);
    int (*extended_errcode)(sqlite3 *);
    int (*get_autocommit)(sqlite3 *);
    int (*libversion_number)(void);
    int (*auto_extension)(void (*)(void));
    int (*cancel_auto_extension)(void (*)(void));
    void *(*db_mutex)(sqlite3 *);
    void (*mutex_enter)(void *);
    void (*mutex_leave)(void *);
    int (*column_count)(sqlite3_stmt *);
    double (*column_double)(sqlite3_stmt *, int);
    int (*bind_parameter_count)(sqlite3_stmt *);
    const unsigned char *(*column_text)(sqlite3_stmt *, int);
} SQ;
static int SQ_READY;

/* sqlite_setup(path of _sqlite3, version number): look the functions up in the library
 * _sqlite3 is linked to; True when every one is found, none is shadowed by another copy
 * in the global scope, and the library is the version Python's sqlite3 reports. */
static PyObject *sqlite_setup(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    int want;
    if (!PyArg_ParseTuple(args, "si:sqlite_setup", &path, &want)) return NULL;
    if (SQ_READY) return PyBool_FromLong(SQ_READY > 0);
    SQ_READY = -1;
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) Py_RETURN_FALSE;
    static const char *names[] = {
        "sqlite3_prepare_v3",   "sqlite3_step",         "sqlite3_reset",
        "sqlite3_finalize",     "sqlite3_bind_int64",   "sqlite3_bind_text",
        "sqlite3_bind_blob",    "sqlite3_bind_null",    "sqlite3_column_type",
        "sqlite3_column_int64", "sqlite3_column_blob",  "sqlite3_column_bytes",
        "sqlite3_errmsg",       "sqlite3_extended_errcode", "sqlite3_get_autocommit",
        "sqlite3_libversion_number", "sqlite3_auto_extension", "sqlite3_cancel_auto_extension",
        "sqlite3_db_mutex",     "sqlite3_mutex_enter",  "sqlite3_mutex_leave",
        "sqlite3_column_count", "sqlite3_column_double", "sqlite3_bind_parameter_count",
        "sqlite3_column_text",
    };
    void **slots = (void **)&SQ;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *f = dlsym(h, names[i]);
        void *global = dlsym(RTLD_DEFAULT, names[i]);
        if (!f || (global && global != f)) {
            dlclose(h);
            Py_RETURN_FALSE;
        }
        slots[i] = f;
    }
    dlclose(h); /* RTLD_NOLOAD: _sqlite3 keeps the library loaded */
    if (SQ.libversion_number() != want) Py_RETURN_FALSE;
    SQ_READY = 1;
    Py_RETURN_TRUE;
}

/* CPython's pysqlite_Connection starts with its sqlite3 handle (NULL once closed): true of
 * every CPython this was written against, and checked on the running one before a writer
 * is made (sqlite_handle_check), since the struct is private to _sqlite3. */
typedef struct {
    PyObject_HEAD
    sqlite3 *db;
} conn_head;

static PyObject *CONN_TYPE; /* the Connection type whose layout was checked, or NULL */

/* Handles SQLite opens while sqlite_handle_check's probe is opened (another thread may open
 * one at the same moment: it lands here too, which does no harm). */
#define AX_MAX 16
static sqlite3 *AX_SEEN[AX_MAX];
static int AX_N;

static int ax_entry(sqlite3 *db, char **err, const void *api) {
    (void)err;
    (void)api;
    int i = __atomic_fetch_add(&AX_N, 1, __ATOMIC_SEQ_CST);
    if (i < AX_MAX) __atomic_store_n(&AX_SEEN[i], db, __ATOMIC_SEQ_CST);
    return SQ_OK;
}

/* sqlite_handle_check(connect, connection_type): open a probe with connect(":memory:") while
 * an auto-extension notes every handle SQLite opens; True when the probe is a
 * connection_type and what sits where conn_head puts the handle is one of those. So the
 * writer never reads a handle from a layout it has not seen hold one. */
static PyObject *sqlite_handle_check(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *connect, *type;
    if (!PyArg_ParseTuple(args, "OO!:sqlite_handle_check", &connect, &PyType_Type, &type))
        return NULL;
    if (SQ_READY <= 0) Py_RETURN_FALSE;
    __atomic_store_n(&AX_N, 0, __ATOMIC_SEQ_CST);
    if (SQ.auto_extension((void (*)(void))ax_entry) != SQ_OK) Py_RETURN_FALSE;
    PyObject *probe = PyObject_CallFunction(connect, "s", ":memory:");
    SQ.cancel_auto_extension((void (*)(void))ax_entry);
    if (!probe) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    int ok = PyObject_TypeCheck(probe, (PyTypeObject *)type) &&
             Py_TYPE(probe)->tp_basicsize >= (Py_ssize_t)sizeof(conn_head);
    if (ok) {
        sqlite3 *db = ((conn_head *)probe)->db;
        int n = __atomic_load_n(&AX_N, __ATOMIC_SEQ_CST);
        ok = 0;
        for (int i = 0; i < n && i < AX_MAX && db; i++)
            if (__atomic_load_n(&AX_SEEN[i], __ATOMIC_SEQ_CST) == db) ok = 1;
    }
    PyObject *r = PyObject_CallMethod(probe, "close", NULL);
    if (r) Py_DECREF(r);
    else PyErr_Clear();
    Py_DECREF(probe);
    if (ok && !CONN_TYPE) CONN_TYPE = Py_NewRef(type);
    return PyBool_FromLong(ok && CONN_TYPE == type);
}

enum { W_BEGIN, W_HEAD, W_UPSERT, W_COMMIT, W_ROLLBACK, W_FIXED };

#define W_READS 16 /* read statements a writer keeps prepared (the recorder has ~10) */
#define W_MAX_ROWS 64 /* rows per INSERT (stores/sqlite/sql.py: 642 values, under 999) */

typedef struct {
    PyObject_HEAD
    PyObject *conn, *insert_sql, *genesis, *op_error, *db_error, *prep_cls;
    sqlite3 *db;
    sqlite3_stmt *st[W_FIXED]; /* prepared once, in this order (SQLiteWriter's arguments) */
    sqlite3_stmt *ins[2][W_MAX_ROWS + 1];
    PyObject *rd_sql[W_READS]; /* rows(): the reads prepared so far, a slot each */
    sqlite3_stmt *rd[W_READS];
    int rd_next, reading;
} Writer;

static void w_finalize_all(Writer *w) {
    for (int i = 0; i < W_FIXED; i++) {
        if (w->st[i]) SQ.finalize(w->st[i]);
        w->st[i] = NULL;
    }
    for (int u = 0; u < 2; u++)
        for (int k = 0; k <= W_MAX_ROWS; k++) {
            if (w->ins[u][k]) SQ.finalize(w->ins[u][k]);
            w->ins[u][k] = NULL;
        }
    for (int i = 0; i < W_READS; i++) {
        if (w->rd[i]) SQ.finalize(w->rd[i]);
        w->rd[i] = NULL;
        Py_CLEAR(w->rd_sql[i]);
    }
}

static void w_dealloc(Writer *w) {
    w_finalize_all(w);
    Py_XDECREF(w->conn);
    Py_XDECREF(w->insert_sql);
    Py_XDECREF(w->genesis);
    Py_XDECREF(w->op_error);
    Py_XDECREF(w->db_error);
    Py_XDECREF(w->prep_cls);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* The error of rc as sqlite3 raises it (OperationalError for the codes it maps there,
 * DatabaseError otherwise), with its sqlite_errorcode. */
static PyObject *w_raise(Writer *w, int rc) {
    int base = rc & 0xff;
    int op = base == 1 || base == 3 || base == 4 || base == SQ_BUSY || base == SQ_LOCKED ||
             base == 8 || base == 9 || base == 10 || base == 13 || base == 14 || base == 15 ||
             base == 16 || base == 17;
    PyObject *msg = PyUnicode_DecodeUTF8(SQ.errmsg(w->db), (Py_ssize_t)strlen(SQ.errmsg(w->db)),
                                         "replace");
    if (!msg) return NULL;
    PyObject *exc = PyObject_CallOneArg(op ? w->op_error : w->db_error, msg);
    Py_DECREF(msg);
    if (!exc) return NULL;
    PyObject *code = PyLong_FromLong(SQ.extended_errcode(w->db));
    if (code) {
        PyObject_SetAttrString(exc, "sqlite_errorcode", code);
        Py_DECREF(code);
    }
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

static int w_step(sqlite3_stmt *st) {
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = SQ.step(st);
    Py_END_ALLOW_THREADS
    return rc;
}

/* Step a statement that returns no row; its reset's code is the error's when it fails. */
static int w_run(sqlite3_stmt *st) {
    int rc = w_step(st);
    int rc2 = SQ.reset(st);
    return rc == SQ_DONE ? SQ_OK : (rc2 != SQ_OK ? rc2 : rc);
}

static int w_prepare(Writer *w, sqlite3_stmt **st, PyObject *sql) {
    if (*st) return SQ_OK;
    const char *text = PyUnicode_AsUTF8(sql);
    if (!text) return -1;
    return SQ.prepare_v3(w->db, text, -1, SQ_PREPARE_PERSISTENT, st, NULL);
}

/* Bind a value as sqlite3 binds it (str as UTF-8 text, bytes as a blob, int, None);
 * without a copy: the caller keeps the value alive until the statement is reset. */
static int w_bind(sqlite3_stmt *st, int i, PyObject *v) {
    if (v == Py_None) return SQ.bind_null(st, i);
    if (PyLong_CheckExact(v)) {
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) return -1;
        return SQ.bind_int64(st, i, x);
    }
    if (PyBytes_CheckExact(v))
        return SQ.bind_blob(st, i, PyBytes_AS_STRING(v), (int)PyBytes_GET_SIZE(v), NULL);
    if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(v, &n);
        if (!u) return -1;
        return SQ.bind_text(st, i, u, (int)n, NULL);
    }
    PyErr_Format(PyExc_TypeError, "cannot bind a %.100s", Py_TYPE(v)->tp_name);
    return -1;
}

static PyObject *w_new(PyTypeObject *type, PyObject *args, PyObject *kwds);

/* append(stream_id, stream_json, expected, events, key): see above. expected is the
 * version the stream must be at, or -1 (any), -2 (no stream), -3 (stream exists). */
static PyObject *w_append(Writer *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyUnicode_CheckExact(args[0]) || !PyLong_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "append(stream_id, stream_json, expected, events, key)");
        return NULL;
    }
    PyObject *sid = args[0], *events = args[3];
    long long expected = PyLong_AsLongLong(args[2]);
    if (expected == -1 && PyErr_Occurred()) return NULL;
    if (!SQ_READY || ((conn_head *)w->conn)->db != w->db || !w->db) Py_RETURN_NONE;
    int rc = w_run(w->st[W_BEGIN]);
    if (rc != SQ_OK) {
        if ((rc & 0xff) == SQ_BUSY || (rc & 0xff) == SQ_LOCKED) Py_RETURN_FALSE;
        return w_raise(w, rc);
    }
    /* From here every way out ends the transaction; a failure with no Python error set
     * (a version that does not match, a reused id, a busy database, anything insert_rows
     * does not take) hands the append back: None. */
    PyObject *prev = NULL, *rows = NULL, *ret = NULL;
    if (w_bind(w->st[W_HEAD], 1, sid) || w_bind(w->st[W_HEAD], 2, sid)) goto rollback;
    rc = w_step(w->st[W_HEAD]);
    if (rc != SQ_ROW) {
        SQ.reset(w->st[W_HEAD]);
        goto sqlite_error;
    }
    long long version = SQ.column_int64(w->st[W_HEAD], 0); /* NULL reads as 0: no stream */
    long long pos = SQ.column_int64(w->st[W_HEAD], 2);
    if (version && SQ.column_type(w->st[W_HEAD], 1) == SQ_BLOB &&
        SQ.column_bytes(w->st[W_HEAD], 1) == AB3_OUT_LEN)
        prev = PyBytes_FromStringAndSize(SQ.column_blob(w->st[W_HEAD], 1),
                                         SQ.column_bytes(w->st[W_HEAD], 1));
    else if (!version)
        prev = PyObject_CallOneArg(w->genesis, sid);
    rc = SQ.reset(w->st[W_HEAD]);
    if (rc != SQ_OK) goto sqlite_error;
    if (!prev) goto rollback; /* a head without a 32-byte hash: the Python path decides */
    if (expected == -2 ? version != 0 : expected == -3 ? version == 0
                                                       : expected >= 0 && version != expected)
        goto rollback;
    if (!PyBytes_Check(prev) || PyBytes_GET_SIZE(prev) != AB3_OUT_LEN) goto rollback;
    PyObject *call = Py_BuildValue("(OOLOLOOOi)", sid, args[1], version, prev, pos, events,
                                   args[4], w->prep_cls, 1);
    if (!call) goto rollback;
    rows = insert_rows(NULL, call);
    Py_DECREF(call);
    if (!rows || rows == Py_None) goto rollback;
    PyObject *values = PyTuple_GET_ITEM(rows, 0), *last = PyTuple_GET_ITEM(rows, 1);
    int width = (int)PyLong_AsLong(PyTuple_GET_ITEM(rows, 2));
    int uniform = width == 4;
    Py_ssize_t n = PyList_GET_SIZE(values) / width;
    PyObject *e0 = PySequence_GetItem(events, 0);
    if (!e0) goto rollback;
    /* shared: ?1 stream_id, ?2 recorded_at; uniform also ?3 type, ?4 module, ?5 metadata,
     * ?6 and ?7 the statement's first position and version (SQL in stores/sqlite/sql.py) */
    PyObject *shared[3] = {SLOT(e0, OFF_PREP[P_TYPE]), SLOT(e0, OFF_PREP[P_MODULE]),
                           SLOT(e0, OFF_PREP[P_META])};
    PyObject *at = SLOT(e0, OFF_PREP[P_AT]);
    for (Py_ssize_t start = 0; start < n; start += W_MAX_ROWS) {
        int k = (int)(n - start < W_MAX_ROWS ? n - start : W_MAX_ROWS);
        sqlite3_stmt **st = &w->ins[uniform][k];
        if (!*st) {
            PyObject *sql = PyObject_CallFunction(w->insert_sql, "iO", k,
                                                  uniform ? Py_True : Py_False);
            rc = sql ? w_prepare(w, st, sql) : -1;
            Py_XDECREF(sql);
            if (rc < 0) {
                Py_DECREF(e0);
                goto rollback;
            }
            if (rc != SQ_OK) {
                Py_DECREF(e0);
                goto sqlite_error;
            }
        }
        int b = w_bind(*st, 1, sid) || w_bind(*st, 2, at);
        int first = 3;
        if (uniform && !b) {
            b = w_bind(*st, 3, shared[0]) || w_bind(*st, 4, shared[1]) ||
                w_bind(*st, 5, shared[2]) || SQ.bind_int64(*st, 6, pos + 1 + start) ||
                SQ.bind_int64(*st, 7, version + 1 + start);
            first = 8;
        }
        for (Py_ssize_t j = 0; !b && j < (Py_ssize_t)k * width; j++)
            b = w_bind(*st, first + (int)j, PyList_GET_ITEM(values, start * width + j));
        if (b) {
            Py_DECREF(e0);
            if (PyErr_Occurred()) goto rollback;
            rc = b;
            goto sqlite_error;
        }
        rc = w_run(*st);
        if (rc != SQ_OK) {
            Py_DECREF(e0);
            if ((rc & 0xff) == SQ_CONSTRAINT) goto rollback; /* a reused event id */
            goto sqlite_error;
        }
    }
    Py_DECREF(e0);
    if (w_bind(w->st[W_UPSERT], 1, sid) || SQ.bind_int64(w->st[W_UPSERT], 2, version + n) ||
        w_bind(w->st[W_UPSERT], 3, last))
        goto rollback;
    rc = w_run(w->st[W_UPSERT]);
    if (rc != SQ_OK) goto sqlite_error;
    rc = w_run(w->st[W_COMMIT]);
    if (rc != SQ_OK) goto sqlite_error;
    ret = Py_BuildValue("(LL)", version + n, pos + n);
    Py_DECREF(rows);
    Py_DECREF(prev);
    return ret;
sqlite_error:
    if ((rc & 0xff) != SQ_BUSY && (rc & 0xff) != SQ_LOCKED)
        w_raise(w, rc); /* before the ROLLBACK replaces the message */
rollback:
    if (!SQ.get_autocommit(w->db)) w_run(w->st[W_ROLLBACK]);
    Py_XDECREF(rows);
    Py_XDECREF(prev);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* The prepared statement of a read (kept in one of W_READS slots, the oldest replaced). */
static sqlite3_stmt *w_read_stmt(Writer *w, PyObject *sql, int *rc) {
    for (int i = 0; i < W_READS; i++) {
        if (w->rd_sql[i] == sql) return w->rd[i];
    }
    for (int i = 0; i < W_READS; i++) {
        if (w->rd_sql[i] && PyUnicode_Compare(w->rd_sql[i], sql) == 0) return w->rd[i];
    }
    int k = w->rd_next;
    w->rd_next = (k + 1) % W_READS;
    if (w->rd[k]) SQ.finalize(w->rd[k]);
    w->rd[k] = NULL;
    Py_CLEAR(w->rd_sql[k]);
    *rc = w_prepare(w, &w->rd[k], sql);
    if (*rc != SQ_OK) return NULL;
    w->rd_sql[k] = Py_NewRef(sql);
    return w->rd[k];
}

/* One column of the current row as Python's sqlite3 gives it (no converters, str text). */
static PyObject *w_column(sqlite3_stmt *st, int i) {
    switch (SQ.column_type(st, i)) {
    case SQ_INTEGER:
        return PyLong_FromLongLong(SQ.column_int64(st, i));
    case SQ_FLOAT:
        return PyFloat_FromDouble(SQ.column_double(st, i));
    case SQ_NULL:
        Py_RETURN_NONE;
    case SQ_BLOB: {
        const char *b = SQ.column_blob(st, i);
        return PyBytes_FromStringAndSize(b ? b : "", SQ.column_bytes(st, i));
    }
    default: { /* text, as UTF-8 whatever the file's encoding (then its size) */
        const char *t = (const char *)SQ.column_text(st, i);
        return PyUnicode_DecodeUTF8(t ? t : "", SQ.column_bytes(st, i), NULL);
    }
    }
}

/* rows(sql, args): every row of a read as a list of tuples, what
 * conn.execute(sql, args).fetchall() returns; None: take that Python path instead. The
 * whole read holds the connection's mutex, taken once, so SQLite's own entries to it (a
 * recursive mutex this thread holds) cost no atomic operation: in a process that ever
 * started a thread, Python's sqlite3 pays one for each of its three calls a column. Each
 * step lets the GIL go, as sqlite3's do. Holding the mutex then is safe because nothing
 * else enters it: the connection is this thread's, close() waits for the reads in flight,
 * and sqlite3_interrupt() takes no mutex. */
static PyObject *w_rows_once(Writer *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_CheckExact(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "rows(sql, args)");
        return NULL;
    }
    if (!SQ_READY || !w->db || ((conn_head *)w->conn)->db != w->db) Py_RETURN_NONE;
    int rc = SQ_OK;
    sqlite3_stmt *st = w_read_stmt(w, args[0], &rc);
    if (!st) {
        if (PyErr_Occurred()) return NULL;
        return w_raise(w, rc);
    }
    PyObject *params = args[1];
    Py_ssize_t np = PyTuple_GET_SIZE(params);
    if (np != SQ.bind_parameter_count(st)) Py_RETURN_NONE; /* sqlite3 says what is wrong */
    for (Py_ssize_t i = 0; i < np; i++) {
        if (w_bind(st, (int)i + 1, PyTuple_GET_ITEM(params, i)) != SQ_OK) {
            SQ.reset(st);
            PyErr_Clear(); /* a value it does not bind as sqlite3 would: sqlite3 decides */
            Py_RETURN_NONE;
        }
    }
    PyObject *out = PyList_New(0);
    if (!out) {
        SQ.reset(st);
        return NULL;
    }
    void *m = SQ.db_mutex(w->db);
    if (m) SQ.mutex_enter(m);
    rc = w_step(st);
    int ncol = SQ.column_count(st);
    while (rc == SQ_ROW) {
        PyObject *row = PyTuple_New(ncol);
        if (!row) break;
        for (int i = 0; i < ncol; i++) {
            PyObject *v = w_column(st, i);
            if (!v) {
                Py_CLEAR(row);
                break;
            }
            PyTuple_SET_ITEM(row, i, v);
        }
        if (!row || PyList_Append(out, row) < 0) {
            Py_XDECREF(row);
            break;
        }
        Py_DECREF(row);
        rc = w_step(st);
    }
    int rc2 = SQ.reset(st);
    if (m) SQ.mutex_leave(m);
    if (PyErr_Occurred()) {
        Py_DECREF(out);
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
        PyErr_Clear(); /* text that is not UTF-8: sqlite3 says so its own way */
        Py_RETURN_NONE;
    }
    if (rc != SQ_DONE) {
        Py_DECREF(out);
        return w_raise(w, rc2 != SQ_OK ? rc2 : rc);
    }
    return out;
}

/* A read inside a read on this writer (a finalizer that an allocation ran reads this
 * thread's store) goes to fetchall(): it would rebind or finalize the outer one's
 * statement under it. */
static PyObject *w_rows(Writer *w, PyObject *const *args, Py_ssize_t nargs) {
    if (w->reading) Py_RETURN_NONE;
    w->reading = 1;
    PyObject *r = w_rows_once(w, args, nargs);
    w->reading = 0;
    return r;
}

static PyObject *w_close(Writer *w, PyObject *unused) {
    (void)unused;
    w_finalize_all(w);
    w->db = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef w_methods[] = {
    {"append", (PyCFunction)(void (*)(void))w_append, METH_FASTCALL,
     "append(stream_id, stream_json, expected, events, key, /)\n--\n\n"
     "(last version, last position) of the committed append; None: nothing was written,\n"
     "take the Python path; False: the database stayed busy for the busy timeout."},
    {"rows", (PyCFunction)(void (*)(void))w_rows, METH_FASTCALL,
     "rows(sql, args, /)\n--\n\n"
     "conn.execute(sql, args).fetchall() in one call; None: take that path instead."},
    {"close", (PyCFunction)w_close, METH_NOARGS,
     "close()\n--\n\nFinalize the statements (before the connection closes)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ares_events._native.SQLiteWriter",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SQLiteWriter(conn, begin, head, upsert, commit, rollback, insert_sql,\n"
              "             genesis, PreparedEvent, OperationalError, DatabaseError)\n--\n\n"
              "One connection's appends in one call each (sqlite_setup() first).",
    .tp_new = w_new,
    .tp_dealloc = (destructor)w_dealloc,
    .tp_methods = w_methods,
};

static PyObject *w_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *conn, *sql[W_FIXED], *insert_sql, *genesis, *prep_cls, *op_error, *db_error;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "SQLiteWriter takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OUUUUUOOOOO:SQLiteWriter", &conn, &sql[0], &sql[1], &sql[2],
                          &sql[3], &sql[4], &insert_sql, &genesis, &prep_cls, &op_error,
                          &db_error))
        return NULL;
    if (SQ_READY <= 0 || !CONN_TYPE) {
        PyErr_SetString(PyExc_RuntimeError,
                        "sqlite_setup() and sqlite_handle_check() did not succeed");
        return NULL;
    }
    if (!PyObject_TypeCheck(conn, (PyTypeObject *)CONN_TYPE)) {
        PyErr_Format(PyExc_TypeError, "SQLiteWriter needs a %.100s, not a %.100s",
                     ((PyTypeObject *)CONN_TYPE)->tp_name, Py_TYPE(conn)->tp_name);
        return NULL;
    }
    if (bind_prepared(prep_cls) < 0) return NULL;
    Writer *w = (Writer *)type->tp_alloc(type, 0);
    if (!w) return NULL;
    w->conn = Py_NewRef(conn);
    w->insert_sql = Py_NewRef(insert_sql);
    w->genesis = Py_NewRef(genesis);
    w->prep_cls = Py_NewRef(prep_cls);
    w->op_error = Py_NewRef(op_error);
    w->db_error = Py_NewRef(db_error);
    w->db = ((conn_head *)conn)->db;
    for (int i = 0; i < W_FIXED; i++) {
        int rc = w->db ? w_prepare(w, &w->st[i], sql[i]) : -1;
        if (rc != SQ_OK) {
            if (rc > 0) w_raise(w, rc);
            else if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "the connection is closed");
            Py_DECREF(w);
            return NULL;
        }
    }
    return (PyObject *)w;
}
#endif

static int add_writer(PyObject *mod) {
#if !defined(_WIN32)
    if (PyType_Ready(&WriterType) < 0) return -1;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(mod, "SQLiteWriter", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        return -1;
    }
#endif
    return 0;
}
