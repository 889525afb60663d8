/* ares_events._native: the fast paths of the chain format in C: the verifier's loop
 * (verify_run) and canonical JSON's acceptance walk (scan).
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
 * BLAKE3 is the portable implementation in blake3_portable.h (written from the
 * specification; no SIMD). The package works without this module: the verifier falls
 * back to the Python path when it is missing or ARES_EVENTS_NO_NATIVE=1. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "blake3_portable.h"

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
    const uint8_t *key = NULL;
    if (key_obj != Py_None) {
        if (!PyBytes_Check(key_obj) || PyBytes_GET_SIZE(key_obj) != AB3_KEY_LEN) {
            PyErr_SetString(PyExc_ValueError, "key must be 32 bytes or None");
            return NULL;
        }
        key = (const uint8_t *)PyBytes_AS_STRING(key_obj);
    }
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
            vtext_len = snprintf(vtext, sizeof vtext, "%lld", v_ll);
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
        int size_len = snprintf(size_text, sizeof size_text, "%zd", payload_len);

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

static PyObject *link_hashes(PyObject *self, PyObject *args) {
    PyObject *stream_json, *prev_in, *events, *key_obj;
    long long version;
    (void)self;
    if (!PyArg_ParseTuple(args, "SLSOO:link_hashes", &stream_json, &version, &prev_in, &events,
                          &key_obj))
        return NULL;
    const uint8_t *key = NULL;
    if (key_obj != Py_None) {
        if (!PyBytes_Check(key_obj) || PyBytes_GET_SIZE(key_obj) != AB3_KEY_LEN) {
            PyErr_SetString(PyExc_ValueError, "key must be 32 bytes or None");
            return NULL;
        }
        key = (const uint8_t *)PyBytes_AS_STRING(key_obj);
    }
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
        Py_ssize_t at_len, id_len, mo_len, ty_len;
        const char *at = str_attr(attrs[0], &at_len);
        const char *eid = at ? str_attr(attrs[1], &id_len) : NULL;
        const char *mo = eid ? str_attr(attrs[3], &mo_len) : NULL;
        const char *ty = mo ? str_attr(attrs[6], &ty_len) : NULL;
        if (!ty) goto fail;
        PyObject *meta = attrs[2], *digest = attrs[4];
        if (!PyBytes_Check(meta) || !PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != 32) {
            PyErr_SetString(PyExc_TypeError, "meta_json and digest must be bytes");
            goto fail;
        }
        Py_ssize_t size = PyLong_AsSsize_t(attrs[5]);
        if (size == -1 && PyErr_Occurred()) goto fail;
        if (version == LLONG_MAX) {
            PyErr_SetString(PyExc_OverflowError, "version past the 64-bit range");
            goto fail;
        }
        version++;
        size_t need = AB3_OUT_LEN + 200 + 6 * ((size_t)at_len + id_len + mo_len + ty_len) +
                      (size_t)PyBytes_GET_SIZE(meta) + stream_js_len;
        if (buf_reserve(&buf, need) < 0) goto fail;
        char num[32];
        char *o = buf.p;
        o = put(o, (const char *)prev, AB3_OUT_LEN);
        o = PUT_LIT(o, "{\"at\":");
        o = json_str(o, at, at_len);
        o = PUT_LIT(o, ",\"id\":");
        o = json_str(o, eid, id_len);
        o = PUT_LIT(o, ",\"meta\":");
        o = put(o, PyBytes_AS_STRING(meta), (size_t)PyBytes_GET_SIZE(meta));
        o = PUT_LIT(o, ",\"module\":");
        o = json_str(o, mo, mo_len);
        o = PUT_LIT(o, ",\"payload\":\"");
        const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(digest);
        for (int k = 0; k < 32; k++) {
            *o++ = HEX[d[k] >> 4];
            *o++ = HEX[d[k] & 15];
        }
        o = PUT_LIT(o, "\",\"size\":");
        o = put(o, num, (size_t)snprintf(num, sizeof num, "%zd", size));
        o = PUT_LIT(o, ",\"stream\":");
        o = put(o, stream_js, stream_js_len);
        o = PUT_LIT(o, ",\"type\":");
        o = json_str(o, ty, ty_len);
        o = PUT_LIT(o, ",\"v\":1,\"version\":");
        o = put(o, num, (size_t)snprintf(num, sizeof num, "%lld", version));
        *o++ = '}';
        ab3_hash(key, (const uint8_t *)buf.p, (size_t)(o - buf.p), prev);
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

/* make_uuid7(cls, ms, seq, rand_b, is_safe): an instance of cls (a uuid.UUID subclass
 * with a _text slot) for the UUIDv7 of 48-bit ms, 12-bit seq and 62-bit rand_b, with its
 * canonical text; the fields are set as object.__setattr__ sets them. */
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
    unsigned long long hi = ms << 16 | 0x7000ULL | seq;
    unsigned long long lo = 0x8000000000000000ULL | rb;
    char text[40];
    snprintf(text, sizeof text, "%08llx-%04llx-%04llx-%04llx-%012llx", hi >> 32,
             (hi >> 16) & 0xFFFF, hi & 0xFFFF, lo >> 48, lo & 0xFFFFFFFFFFFFULL);
    PyObject *h = PyLong_FromUnsignedLongLong(hi);
    PyObject *sh = h ? PyLong_FromLong(64) : NULL;
    PyObject *hs = sh ? PyNumber_Lshift(h, sh) : NULL;
    PyObject *l = hs ? PyLong_FromUnsignedLongLong(lo) : NULL;
    PyObject *value = l ? PyNumber_Or(hs, l) : NULL;
    Py_XDECREF(h);
    Py_XDECREF(sh);
    Py_XDECREF(hs);
    Py_XDECREF(l);
    if (!value) return NULL;
    PyObject *t = PyUnicode_FromStringAndSize(text, 36);
    PyObject *u = t ? cls->tp_alloc(cls, 0) : NULL;
    if (!u || PyObject_GenericSetAttr(u, S_INT, value) < 0 ||
        PyObject_GenericSetAttr(u, S_IS_SAFE, args[4]) < 0 ||
        PyObject_GenericSetAttr(u, S_TEXT, t) < 0) {
        Py_XDECREF(u);
        u = NULL;
    }
    Py_DECREF(value);
    Py_XDECREF(t);
    return u;
}

static PyObject *blake3_hash(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "key", NULL};
    Py_buffer data;
    PyObject *key_obj = Py_None;
    uint8_t out[AB3_OUT_LEN];
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|O:blake3_hash", kwlist, &data, &key_obj))
        return NULL;
    const uint8_t *key = NULL;
    if (key_obj != Py_None) {
        if (!PyBytes_Check(key_obj) || PyBytes_GET_SIZE(key_obj) != AB3_KEY_LEN) {
            PyBuffer_Release(&data);
            PyErr_SetString(PyExc_ValueError, "key must be 32 bytes or None");
            return NULL;
        }
        key = (const uint8_t *)PyBytes_AS_STRING(key_obj);
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
        if (!S_INT || !S_IS_SAFE || !S_TEXT) return NULL;
        if (!S_AT || !S_EVENT_ID || !S_META_JSON || !S_MODULE || !S_DIGEST || !S_SIZE || !S_TYPE)
            return NULL;
    }
    return PyModule_Create(&module);
}
