/*
 * engine._codec: the compiled twin of engine/codec_py.py.
 *
 * Every function here gives the same answer as its Python reference in
 * engine/codec_py.py, byte for byte (tests/unit/test_codec.py compares them);
 * it exists only for speed: these are the per-message loops of the engine.
 *
 * The CommitLog record (drawn in engine/layout.py, all big-endian):
 *
 *   0  TOTALSIZE i32     4  MAGICCODE u32     8  BODYCRC i32       12 QUEUEID i32
 *   16 FLAG i32          20 QUEUEOFFSET i64   28 PHYSICALOFFSET i64
 *   36 SYSFLAG i32       40 BORNTIMESTAMP i64 48 BORNHOST ip4      52 BORNHOST port i32
 *   56 STORETIMESTAMP i64                     64 STOREHOST ip4     68 STOREHOST port i32
 *   72 RECONSUMETIMES i32                     76 PREPARED_TX_OFFSET i64
 *   84 BODYLEN i32, BODY, TOPICLEN (u8 with MAGIC_V1, u16 with MAGIC_V2), TOPIC,
 *      PROPLEN u16, PROPERTIES "name\x01value\x02..."
 *
 * With the whole-record CRC, PROPERTIES end with "__CRC32#\x01" + ten digits
 * (least significant first) + "\x02"; that CRC covers the record minus these
 * 20 bytes. Failures are never explained here: scan_dispatch stops with
 * SCAN_DAMAGE and read_view returns None, and the caller asks engine.layout.
 *
 * The functions take arbitrary buffers: every read is bounded by
 * 0 <= pos and limit <= len(buf), which the entry points check.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

/* ------------------------------------------------------------------------ */
/* Record layout (engine/layout.py: RECORD_HEADER and friends)              */
/* ------------------------------------------------------------------------ */

enum {
    AT_TOTAL_SIZE = 0,
    AT_MAGIC = 4,
    AT_BODY_CRC = 8,
    AT_QUEUE_ID = 12,
    AT_FLAG = 16,
    AT_QUEUE_OFFSET = 20,
    AT_PHYSICAL_OFFSET = 28,
    AT_SYS_FLAG = 36,
    AT_BORN_TS = 40,
    AT_BORN_IP = 48,
    AT_BORN_PORT = 52,
    AT_STORE_TS = 56,
    AT_STORE_IP = 64,
    AT_STORE_PORT = 68,
    AT_RECONSUME_TIMES = 72,
    AT_PREPARED_TX = 76,
    HEADER_BYTES = 84,            /* RECORD_HEADER.size */
    AT_BODY = HEADER_BYTES + 4,   /* after BODYLEN */
    MIN_RECORD_BYTES = 91,        /* header + BODYLEN + TOPICLEN (v1) + PROPLEN */
    TOPIC_V1_MAX_BYTES = 127,
    CRC_TAIL_BYTES = 20,          /* CRC32_RESERVED_BYTES */
    CRC_PREFIX_BYTES = 9,         /* "__CRC32#\x01" */
    CRC_DIGITS = 10,
};

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define MAGIC_BLANK 0xCBD43194u
#define SYSFLAG_HOSTS_V6 (0x10 | 0x20)
#define NAME_VALUE_SEPARATOR 0x01
#define PROPERTY_SEPARATOR 0x02
#define KEY_SEPARATOR 0x20

static const char CRC_PREFIX[] = "__CRC32#\x01";

enum { SCAN_MORE = 0, SCAN_BLANK = 1, SCAN_DAMAGE = 2 };

/* ------------------------------------------------------------------------ */
/* Big-endian loads and stores (the compiler turns these into bswaps)       */
/* ------------------------------------------------------------------------ */

static inline uint16_t load_u16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static inline uint32_t
load_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline int32_t load_i32(const uint8_t *p) { return (int32_t)load_u32(p); }

static inline int64_t
load_i64(const uint8_t *p)
{
    return (int64_t)(((uint64_t)load_u32(p) << 32) | load_u32(p + 4));
}

static inline void
store_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void
store_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static inline void
store_u64(uint8_t *p, uint64_t v)
{
    store_u32(p, (uint32_t)(v >> 32));
    store_u32(p + 4, (uint32_t)v);
}

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

/* zlib.crc32 continued over any length (zlib's own length is a 32-bit uInt). */
static uint32_t
crc_update(uint32_t crc, const uint8_t *p, Py_ssize_t n)
{
    while (n > 0) {
        uInt chunk = n > (1 << 30) ? (uInt)(1 << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
}

/* layout.crc32_masked: RocketMQ's CRC, a non-negative Java int. */
static inline uint32_t crc_masked(const uint8_t *p, Py_ssize_t n) { return crc_update(0, p, n) & 0x7FFFFFFFu; }

/* An int argument as a long long in [lo, hi]; ValueError when out of range. */
static int
int_arg(PyObject *obj, long long lo, long long hi, const char *what, long long *out)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s is out of range", what);
        return -1;
    }
    *out = v;
    return 0;
}

/* A buffer position argument: an int that fits a Py_ssize_t. */
static int
ssize_arg(PyObject *obj, const char *what, Py_ssize_t *out)
{
    long long v;
    if (int_arg(obj, PY_SSIZE_T_MIN, PY_SSIZE_T_MAX, what, &v) < 0)
        return -1;
    *out = (Py_ssize_t)v;
    return 0;
}

/* An int argument clamped to the long long range (only compared against). */
static int
clamped_arg(PyObject *obj, long long *out)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = overflow > 0 ? LLONG_MAX : overflow < 0 ? LLONG_MIN : v;
    return 0;
}

/* base_offset for reading: *exact is 0 when it (or base_offset + pos) is outside
 * the i64 range, so that no PHYSICALOFFSET can equal it. */
static int
base_offset_arg(PyObject *obj, long long *out, int *exact)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    *exact = overflow == 0;
    return 0;
}

/* The commit log offset of buf[pos]: 0 when it is not an i64. */
static inline int
offset_here(long long base, int base_exact, Py_ssize_t pos, int64_t *here)
{
    long long sum;
    if (!base_exact || __builtin_add_overflow(base, (long long)pos, &sum))
        return 0;
    *here = sum;
    return 1;
}

/* Read-only byte view of buf and the checks that keep every read inside it. */
static int
read_buffer(PyObject *buf, Py_ssize_t pos, Py_ssize_t limit, Py_buffer *view)
{
    if (PyObject_GetBuffer(buf, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (pos < 0 || limit > view->len) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "pos %zd and limit %zd must lie in a buffer of %zd bytes",
                     pos, limit, view->len);
        return -1;
    }
    return 0;
}

/* "/<queue_id>" in decimal, as f"{topic}/{queue_id}" writes it; returns the length. */
static int
format_slash_int(char *out, long long value)
{
    char digits[24];
    int n = 0, len = 0;
    unsigned long long u = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    out[len++] = '/';
    if (value < 0)
        out[len++] = '-';
    while (n)
        out[len++] = digits[--n];
    return len;
}

/* zlib.crc32(f"{topic}/{queue_id}".encode()) over the topic's UTF-8 bytes. */
static uint32_t
owner_crc(const uint8_t *topic, Py_ssize_t topic_len, long long queue_id)
{
    char suffix[32];
    int n = format_slash_int(suffix, queue_id);
    return crc_update(crc_update(0, topic, topic_len), (const uint8_t *)suffix, n);
}

static inline int32_t java_int(uint32_t h) { return (int32_t)h; }

/* Java String.hashCode over bytes that are whole code units (ASCII or Latin-1). */
static uint32_t
java_hash_units8(const uint8_t *p, Py_ssize_t n)
{
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        h = 31u * h + p[i];
    return h;
}

/*
 * layout.java_string_hash: Java String.hashCode over the UTF-16 code units of
 * a str, continuing from the hash h of a prefix (0 for none), read straight from its 1-, 2- or 4-byte representation (a non-BMP
 * code point is its two surrogate units). A lone surrogate cannot be encoded
 * to UTF-16 and fails as text.encode("utf-16-be") does in Python.
 */
static int
java_hash_more(PyObject *text, uint32_t h, uint32_t *out)
{
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0)
        return -1;
#endif
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    switch (PyUnicode_KIND(text)) {
    case PyUnicode_1BYTE_KIND: {
        const uint8_t *u = (const uint8_t *)data;
        for (Py_ssize_t i = 0; i < n; i++)
            h = 31u * h + u[i];
        break;
    }
    case PyUnicode_2BYTE_KIND: {
        const Py_UCS2 *u = (const Py_UCS2 *)data;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (Py_UNICODE_IS_SURROGATE(u[i]))
                goto lone_surrogate;
            h = 31u * h + u[i];
        }
        break;
    }
    default: {
        const Py_UCS4 *u = (const Py_UCS4 *)data;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = u[i];
            if (c >= 0x10000) {
                h = 31u * h + Py_UNICODE_HIGH_SURROGATE(c);
                h = 31u * h + Py_UNICODE_LOW_SURROGATE(c);
            } else {
                if (Py_UNICODE_IS_SURROGATE(c))
                    goto lone_surrogate;
                h = 31u * h + c;
            }
        }
        break;
    }
    }
    *out = h;
    return 0;

lone_surrogate: {
        /* Raise exactly the UnicodeEncodeError the Python reference raises. */
        PyObject *encoded = PyUnicode_AsEncodedString(text, "utf-16-be", "strict");
        if (encoded != NULL) {
            Py_DECREF(encoded);
            PyErr_SetString(PyExc_ValueError, "text holds a lone surrogate");
        }
        return -1;
    }
}

/* java_hash_more from an empty string, as a Java int. */
static int
java_hash_str(PyObject *text, int32_t *out)
{
    uint32_t h;
    if (java_hash_more(text, 0, &h) < 0)
        return -1;
    *out = java_int(h);
    return 0;
}

/* layout.tags_code of a TAGS value given as UTF-8 bytes (decoded with errors="replace"). */
static int
tags_code_bytes(const uint8_t *p, Py_ssize_t n, int32_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] >= 0x80) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)p, n, "replace");
            if (text == NULL)
                return -1;
            int rc = java_hash_str(text, out);
            Py_DECREF(text);
            return rc;
        }
    }
    *out = java_int(java_hash_units8(p, n));
    return 0;
}

static inline PyObject *
decode_replace(const uint8_t *p, Py_ssize_t n)
{
    return PyUnicode_DecodeUTF8((const char *)p, n, "replace");
}

/* ------------------------------------------------------------------------ */
/* Record checks (layout._layout, layout._check_record_crc, _verify_crcs)    */
/* ------------------------------------------------------------------------ */

/* Where the parts of a structurally valid record lie, relative to its first byte. */
typedef struct {
    const uint8_t *rec;
    Py_ssize_t size;
    Py_ssize_t body_at, body_len;
    Py_ssize_t topic_at, topic_len;
    Py_ssize_t props_at, props_len;
} Layout;

/*
 * layout._layout: every length and fixed field of the record at buf[pos:],
 * reading nothing at or past limit. 0 when valid, -1 when decode_record would
 * raise RecordError (truncated header, bad magic, bad total size, physical
 * offset mismatch, IPv6 hosts, bad body / topic length, lengths that disagree
 * with TOTALSIZE). have_here is 0 when the expected offset is not an i64.
 */
static int
check_layout(const uint8_t *buf, Py_ssize_t pos, Py_ssize_t limit, int have_here, int64_t here, Layout *out)
{
    if (limit - pos < AT_BODY)
        return -1;                                   /* truncated header */
    const uint8_t *rec = buf + pos;
    uint32_t magic = load_u32(rec + AT_MAGIC);
    if (magic != MAGIC_V1 && magic != MAGIC_V2)
        return -1;                                   /* bad magic */
    int64_t size = load_i32(rec + AT_TOTAL_SIZE);
    if (size < MIN_RECORD_BYTES || size > limit - pos)
        return -1;                                   /* bad total size */
    if (!have_here || load_i64(rec + AT_PHYSICAL_OFFSET) != here)
        return -1;                                   /* physical offset mismatch */
    if (load_i32(rec + AT_SYS_FLAG) & SYSFLAG_HOSTS_V6)
        return -1;                                   /* IPv6 hosts */
    int64_t body_len = load_i32(rec + HEADER_BYTES);
    int64_t topic_len_bytes = magic == MAGIC_V2 ? 2 : 1;
    int64_t at = AT_BODY + body_len;
    if (body_len < 0 || at + topic_len_bytes > size)
        return -1;                                   /* bad body length */
    int64_t topic_len = magic == MAGIC_V2 ? load_u16(rec + at) : rec[at];
    int64_t topic_at = at + topic_len_bytes;
    at = topic_at + topic_len;
    if (at + 2 > size)
        return -1;                                   /* bad topic length */
    int64_t props_len = load_u16(rec + at);
    int64_t props_at = at + 2;
    if (props_at + props_len != size)
        return -1;                                   /* lengths disagree with total size */
    out->rec = rec;
    out->size = (Py_ssize_t)size;
    out->body_at = AT_BODY;
    out->body_len = (Py_ssize_t)body_len;
    out->topic_at = (Py_ssize_t)topic_at;
    out->topic_len = (Py_ssize_t)topic_len;
    out->props_at = (Py_ssize_t)props_at;
    out->props_len = (Py_ssize_t)props_len;
    return 0;
}

static int
all_digits(const uint8_t *p, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return 1;
}

/*
 * layout._check_record_crc: 1 when the record ends with a valid __CRC32#
 * property, 0 when it has none, -1 when decode_record would raise (damaged
 * name with the property's shape intact, malformed digits, CRC mismatch).
 */
static int
check_record_crc(const Layout *rec)
{
    if (rec->props_len < CRC_TAIL_BYTES)
        return 0;
    const uint8_t *tail = rec->rec + rec->size - CRC_TAIL_BYTES;
    const uint8_t *digits = tail + CRC_PREFIX_BYTES;
    int shaped = tail[CRC_TAIL_BYTES - 1] == PROPERTY_SEPARATOR && all_digits(digits, CRC_DIGITS);
    if (memcmp(tail, CRC_PREFIX, CRC_PREFIX_BYTES) != 0) {
        int name_damage = 0;
        for (int i = 0; i < CRC_PREFIX_BYTES - 1; i++)
            name_damage += tail[i] != (uint8_t)CRC_PREFIX[i];
        return shaped && name_damage <= 2 ? -1 : 0;
    }
    if (!shaped)
        return -1;                                   /* malformed */
    uint64_t expected = 0;
    for (int i = CRC_DIGITS - 1; i >= 0; i--)        /* least significant digit first */
        expected = expected * 10 + (uint64_t)(digits[i] - '0');
    if (crc_masked(rec->rec, rec->size - CRC_TAIL_BYTES) != expected)
        return -1;                                   /* mismatch */
    return 1;
}

/* layout._verify_crcs: 0 when the record's CRCs hold, -1 when decode_record would raise. */
static int
verify_crcs(const Layout *rec, int require_record_crc)
{
    int found = check_record_crc(rec);
    if (found < 0)
        return -1;
    if (found == 0) {
        if (require_record_crc)
            return -1;
        int64_t body_crc = load_i32(rec->rec + AT_BODY_CRC);
        if ((int64_t)crc_masked(rec->rec + rec->body_at, rec->body_len) != body_crc)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Properties (layout.decode_properties, bytewise)                          */
/* ------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *at;   /* NULL: absent */
    Py_ssize_t len;
} Span;

/* The properties the hot paths read: the last valid entry of each name. */
typedef struct {
    Span tags, keys, uniq;
} Wanted;

static inline int
name_is(const uint8_t *name, Py_ssize_t len, const char *literal)
{
    return (size_t)len == strlen(literal) && memcmp(name, literal, (size_t)len) == 0;
}

/*
 * decode_properties splits the decoded text on \x02 and keeps an entry when it
 * has a non-empty name before its first \x01 and a non-empty value after it; a
 * later duplicate overwrites an earlier one. Splitting the bytes before
 * decoding is the same: an invalid UTF-8 sequence never swallows an ASCII byte,
 * and names compare bytewise exactly as their decoded forms do for ASCII names.
 *
 * Fills *wanted; when user is a dict, also sets in it every entry but KEYS,
 * TAGS and __CRC32# (Record.user_properties), decoded with errors="replace",
 * in the Python dict's order (first occurrence, last value).
 */
static int
scan_properties(const uint8_t *p, Py_ssize_t n, Wanted *wanted, PyObject *user)
{
    memset(wanted, 0, sizeof *wanted);
    Py_ssize_t start = 0;
    while (start < n) {
        const uint8_t *entry = p + start;
        const uint8_t *stop = memchr(entry, PROPERTY_SEPARATOR, (size_t)(n - start));
        Py_ssize_t entry_len = stop ? stop - entry : n - start;
        const uint8_t *sep = memchr(entry, NAME_VALUE_SEPARATOR, (size_t)entry_len);
        start += entry_len + 1;
        if (sep == NULL || sep == entry || sep + 1 == entry + entry_len)
            continue;
        Py_ssize_t name_len = sep - entry;
        Span value = {sep + 1, entry_len - name_len - 1};
        if (name_is(entry, name_len, "TAGS")) {
            wanted->tags = value;
            continue;
        }
        if (name_is(entry, name_len, "KEYS")) {
            wanted->keys = value;
            continue;
        }
        if (name_is(entry, name_len, "__CRC32#"))
            continue;
        if (name_is(entry, name_len, "UNIQ_KEY"))
            wanted->uniq = value;
        if (user != NULL) {
            PyObject *k = decode_replace(entry, name_len);
            PyObject *v = k ? decode_replace(value.at, value.len) : NULL;
            int rc = v ? PyDict_SetItem(user, k, v) : -1;
            Py_XDECREF(k);
            Py_XDECREF(v);
            if (rc < 0)
                return -1;
        }
    }
    return 0;
}

/*
 * Record.keys: the KEYS value split on ' ' without the empty parts; with
 * first (the UNIQ_KEY) in front when it is not NULL. A new list.
 */
static PyObject *
split_keys(Span keys, PyObject *first)
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    if (first != NULL && PyList_Append(list, first) < 0)
        goto error;
    Py_ssize_t start = 0;
    while (keys.at != NULL && start < keys.len) {
        const uint8_t *part = keys.at + start;
        const uint8_t *stop = memchr(part, KEY_SEPARATOR, (size_t)(keys.len - start));
        Py_ssize_t part_len = stop ? stop - part : keys.len - start;
        start += part_len + 1;
        if (part_len == 0)
            continue;
        PyObject *key = decode_replace(part, part_len);
        if (key == NULL)
            goto error;
        int rc = PyList_Append(list, key);
        Py_DECREF(key);
        if (rc < 0)
            goto error;
    }
    return list;
error:
    Py_DECREF(list);
    return NULL;
}

/* The record's topic, strictly UTF-8 (layout._topic). NULL with *damaged set when it
 * is not UTF-8; NULL without it on another error. */
static PyObject *
decode_topic(const Layout *rec, int *damaged)
{
    PyObject *topic = PyUnicode_DecodeUTF8((const char *)rec->rec + rec->topic_at, rec->topic_len, "strict");
    if (topic == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        *damaged = 1;
    }
    return topic;
}

/* ------------------------------------------------------------------------ */
/* java_hash(text) and owner_index(topic, queue_id, owner_count)             */
/* ------------------------------------------------------------------------ */

/* java_hash(text: str) -> int: Java String.hashCode as a signed 32-bit int. */
static PyObject *
codec_java_hash(PyObject *Py_UNUSED(module), PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "java_hash() takes a str, not %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    int32_t h;
    if (java_hash_str(text, &h) < 0)
        return NULL;
    return PyLong_FromLong(h);
}

/* f"{topic}/{queue_id}".encode() for any objects, as the Python reference builds it. */
static PyObject *
owner_key_bytes(PyObject *topic, PyObject *queue_id)
{
    PyObject *empty = PyUnicode_New(0, 0);
    if (empty == NULL)
        return NULL;
    PyObject *t = PyObject_Format(topic, empty);
    PyObject *q = t ? PyObject_Format(queue_id, empty) : NULL;
    PyObject *joined = q ? PyUnicode_FromFormat("%U/%U", t, q) : NULL;
    PyObject *encoded = joined ? PyUnicode_AsUTF8String(joined) : NULL;
    Py_DECREF(empty);
    Py_XDECREF(t);
    Py_XDECREF(q);
    Py_XDECREF(joined);
    return encoded;
}

/*
 * owner_index(topic: str, queue_id: int, owner_count: int) -> int:
 * zlib.crc32(f"{topic}/{queue_id}".encode()) % owner_count. The plain case
 * (a str, an int that fits 64 bits, a positive count) is computed here; any
 * other goes through the same Python operations as the reference.
 */
static PyObject *
codec_owner_index(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "owner_index() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *topic = args[0], *queue_id = args[1], *owner_count = args[2];
    uint32_t crc;
    int overflow = 1;
    long long qid = 0;
    if (PyUnicode_CheckExact(topic) && PyLong_CheckExact(queue_id))
        qid = PyLong_AsLongLongAndOverflow(queue_id, &overflow);
    if (!overflow) {
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(topic, &len);
        if (utf8 == NULL)
            return NULL;
        crc = owner_crc((const uint8_t *)utf8, len, qid);
    } else {
        PyObject *encoded = owner_key_bytes(topic, queue_id);
        if (encoded == NULL)
            return NULL;
        crc = crc_update(0, (const uint8_t *)PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded));
        Py_DECREF(encoded);
    }
    if (PyLong_CheckExact(owner_count)) {
        long count = PyLong_AsLongAndOverflow(owner_count, &overflow);
        if (!overflow && count > 0)
            return PyLong_FromUnsignedLong(crc % (unsigned long)count);
    }
    PyObject *value = PyLong_FromUnsignedLong(crc);
    if (value == NULL)
        return NULL;
    PyObject *result = PyNumber_Remainder(value, owner_count);
    Py_DECREF(value);
    return result;
}

/* ------------------------------------------------------------------------ */
/* encode_records                                                           */
/* ------------------------------------------------------------------------ */

/* A HostAddress as struct packs it: ip with "4s" (padded or cut to 4 bytes), port "i". */
typedef struct {
    uint8_t ip[4];
    uint32_t port;
} Host;

static int
host_arg(PyObject *obj, const char *what, Host *out)
{
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 2) {
        PyErr_Format(PyExc_TypeError, "%s must be an (ip, port) pair", what);
        return -1;
    }
    PyObject *ip = PyTuple_GET_ITEM(obj, 0);
    if (!PyBytes_Check(ip) && !PyByteArray_Check(ip)) {
        PyErr_Format(PyExc_TypeError, "%s ip must be bytes", what);
        return -1;
    }
    Py_ssize_t n = PyBytes_Check(ip) ? PyBytes_GET_SIZE(ip) : PyByteArray_GET_SIZE(ip);
    const char *data = PyBytes_Check(ip) ? PyBytes_AS_STRING(ip) : PyByteArray_AS_STRING(ip);
    memset(out->ip, 0, sizeof out->ip);
    memcpy(out->ip, data, (size_t)(n < 4 ? n : 4));
    long long port;
    if (int_arg(PyTuple_GET_ITEM(obj, 1), INT32_MIN, INT32_MAX, "port", &port) < 0)
        return -1;
    out->port = (uint32_t)port;
    return 0;
}

/* One item of the batch: (body, properties, flag, born_timestamp_ms). */
typedef struct {
    Py_buffer body;
    Py_buffer props;
    int have_body, have_props;
    uint32_t flag;
    int64_t born_ms;
} Item;

static void
release_items(Item *items, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i].have_body)
            PyBuffer_Release(&items[i].body);
        if (items[i].have_props)
            PyBuffer_Release(&items[i].props);
    }
    PyMem_Free(items);
}

/* Check one item and take its buffers; the Item holds whatever it took, even on failure. */
static int
item_arg(PyObject *obj, Item *out)
{
    PyObject *seq = PySequence_Tuple(obj);  /* the same tuple, or an immutable copy */
    if (seq == NULL)
        return -1;
    int rc = -1;
    long long v;
    if (PyTuple_GET_SIZE(seq) != 4) {
        PyErr_Format(PyExc_ValueError, "a batch item has 4 fields, not %zd", PyTuple_GET_SIZE(seq));
        goto done;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(seq, 0), &out->body, PyBUF_SIMPLE) < 0)
        goto done;
    out->have_body = 1;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(seq, 1), &out->props, PyBUF_SIMPLE) < 0)
        goto done;
    out->have_props = 1;
    if (int_arg(PyTuple_GET_ITEM(seq, 2), INT32_MIN, INT32_MAX, "flag", &v) < 0)
        goto done;
    out->flag = (uint32_t)v;
    if (int_arg(PyTuple_GET_ITEM(seq, 3), INT64_MIN, INT64_MAX, "born_timestamp_ms", &v) < 0)
        goto done;
    out->born_ms = v;
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

/* Everything the records of one batch share. */
typedef struct {
    const uint8_t *topic;
    Py_ssize_t topic_len;
    uint32_t queue_id;
    int64_t store_ms;
    Host store_host, born_host;
    int with_record_crc;
} Batch;

/* layout.encoded_size of one item. */
static inline int64_t
item_size(const Batch *b, const Item *it)
{
    int64_t props = it->props.len + (b->with_record_crc ? CRC_TAIL_BYTES : 0);
    return MIN_RECORD_BYTES + (b->topic_len > TOPIC_V1_MAX_BYTES ? 1 : 0) + it->body.len + b->topic_len + props;
}

/* zlib's crc32 costs ~70 ns a call plus ~0.2 ns a byte, crc32_combine ~60 ns: below this
 * body size one pass over the whole record is cheaper than combining the body's CRC. */
#define CRC_COMBINE_MIN_BODY 1024

/* layout.encode_record_into: one record at out[0:size]. */
static void
encode_one(uint8_t *out, int64_t size, const Batch *b, const Item *it, int64_t queue_offset,
           int64_t commit_log_offset)
{
    int v2 = b->topic_len > TOPIC_V1_MAX_BYTES;
    Py_ssize_t props_len = it->props.len + (b->with_record_crc ? CRC_TAIL_BYTES : 0);
    const uint8_t *body = it->body.buf;
    uint32_t body_crc = crc_update(0, body, it->body.len);
    store_u32(out + AT_TOTAL_SIZE, (uint32_t)size);
    store_u32(out + AT_MAGIC, v2 ? MAGIC_V2 : MAGIC_V1);
    store_u32(out + AT_BODY_CRC, body_crc & 0x7FFFFFFFu);
    store_u32(out + AT_QUEUE_ID, b->queue_id);
    store_u32(out + AT_FLAG, it->flag);
    store_u64(out + AT_QUEUE_OFFSET, (uint64_t)queue_offset);
    store_u64(out + AT_PHYSICAL_OFFSET, (uint64_t)commit_log_offset);
    store_u32(out + AT_SYS_FLAG, 0);
    store_u64(out + AT_BORN_TS, (uint64_t)it->born_ms);
    memcpy(out + AT_BORN_IP, b->born_host.ip, 4);
    store_u32(out + AT_BORN_PORT, b->born_host.port);
    store_u64(out + AT_STORE_TS, (uint64_t)b->store_ms);
    memcpy(out + AT_STORE_IP, b->store_host.ip, 4);
    store_u32(out + AT_STORE_PORT, b->store_host.port);
    store_u32(out + AT_RECONSUME_TIMES, 0);
    store_u64(out + AT_PREPARED_TX, 0);
    store_u32(out + HEADER_BYTES, (uint32_t)it->body.len);
    uint8_t *at = out + AT_BODY;
    memmove(at, body, (size_t)it->body.len);  /* the body may be a view of this very buffer */
    at += it->body.len;
    if (v2) {
        store_u16(at, (uint16_t)b->topic_len);
        at += 2;
    } else {
        *at++ = (uint8_t)b->topic_len;
    }
    memmove(at, b->topic, (size_t)b->topic_len);
    at += b->topic_len;
    store_u16(at, (uint16_t)props_len);
    at += 2;
    memmove(at, it->props.buf, (size_t)it->props.len);
    at += it->props.len;
    if (b->with_record_crc) {
        /* crc32 of the record minus the tail; past CRC_COMBINE_MIN_BODY, without reading
         * the body twice (header, the body's CRC combined in, the rest) */
        uint32_t crc;
        if (it->body.len < CRC_COMBINE_MIN_BODY) {
            crc = crc_update(0, out, size - CRC_TAIL_BYTES);
        } else {
            crc = crc_update(0, out, AT_BODY);
            crc = (uint32_t)crc32_combine(crc, body_crc, (z_off_t)it->body.len);
            crc = crc_update(crc, out + AT_BODY + it->body.len, size - CRC_TAIL_BYTES - AT_BODY - it->body.len);
        }
        crc &= 0x7FFFFFFFu;
        memcpy(at, CRC_PREFIX, CRC_PREFIX_BYTES);
        for (int i = 0; i < CRC_DIGITS; i++) {  /* layout.crc32_property_digits */
            at[CRC_PREFIX_BYTES + i] = (uint8_t)('0' + crc % 10);
            crc /= 10;
        }
        at[CRC_TAIL_BYTES - 1] = PROPERTY_SEPARATOR;
    }
}

/*
 * encode_records(buf, pos, base_offset, topic, queue_id, first_queue_offset,
 *                store_timestamp_ms, store_host, born_host, with_record_crc, items)
 *     -> (offsets, end)
 *
 * Every item is checked and the batch's size computed before anything is
 * written: ValueError (and no write) when it does not fit in buf at pos, or when
 * a field does not fit its struct format.
 */
static PyObject *
codec_encode_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "encode_records() takes 11 arguments (%zd given)", nargs);
        return NULL;
    }
    Batch b;
    Py_buffer out, topic;
    Py_ssize_t pos;
    long long base, queue_id, first_queue_offset, store_ms;
    PyObject *seq = NULL, *offsets = NULL, *result = NULL;
    Item *items = NULL;
    Py_ssize_t n = 0;

    if (ssize_arg(args[1], "pos", &pos) < 0 || int_arg(args[2], INT64_MIN, INT64_MAX, "base_offset", &base) < 0
        || int_arg(args[4], INT32_MIN, INT32_MAX, "queue_id", &queue_id) < 0
        || int_arg(args[5], INT64_MIN, INT64_MAX, "first_queue_offset", &first_queue_offset) < 0
        || int_arg(args[6], INT64_MIN, INT64_MAX, "store_timestamp_ms", &store_ms) < 0
        || host_arg(args[7], "store_host", &b.store_host) < 0 || host_arg(args[8], "born_host", &b.born_host) < 0)
        return NULL;
    int with_crc = PyObject_IsTrue(args[9]);
    if (with_crc < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &topic, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {  /* as struct.pack_into answers a read-only buffer */
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "buf must be a writable buffer, not %.100s", Py_TYPE(args[0])->tp_name);
        }
        PyBuffer_Release(&topic);
        return NULL;
    }
    b.topic = topic.buf;
    b.topic_len = topic.len;
    b.queue_id = (uint32_t)queue_id;
    b.store_ms = store_ms;
    b.with_record_crc = with_crc;
    if (topic.len > UINT16_MAX) {
        PyErr_Format(PyExc_ValueError, "a topic of %zd bytes is too long", topic.len);
        goto done;
    }

    seq = PySequence_Tuple(args[10]);  /* immutable while the items are read */
    if (seq == NULL)
        goto done;
    n = PyTuple_GET_SIZE(seq);
    items = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Item));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (item_arg(PyTuple_GET_ITEM(seq, i), &items[i]) < 0) {
            n = i + 1;  /* release what this item holds too */
            goto done;
        }
        int64_t props = items[i].props.len + (with_crc ? CRC_TAIL_BYTES : 0);
        int64_t size = item_size(&b, &items[i]);
        if (props > UINT16_MAX || size > INT32_MAX) {
            n = i + 1;
            PyErr_Format(PyExc_ValueError, "item %zd does not fit a record (properties of %lld bytes, "
                         "record of %lld)", i, (long long)props, (long long)size);
            goto done;
        }
        total += size;
    }
    if (pos < 0 || total > out.len - pos) {
        PyErr_Format(PyExc_ValueError, "a batch of %lld bytes does not fit at %zd in a buffer of %zd",
                     (long long)total, pos, out.len);
        goto done;
    }
    long long last;
    if (__builtin_add_overflow(base, (long long)pos + total, &last)
        || __builtin_add_overflow(first_queue_offset, (long long)n, &last)) {
        PyErr_SetString(PyExc_ValueError, "commit log or queue offsets are out of range");
        goto done;
    }

    offsets = PyList_New(n);
    if (offsets == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t size = item_size(&b, &items[i]);
        int64_t here = base + pos;
        PyObject *offset = PyLong_FromLongLong(here);
        if (offset == NULL)
            goto done;
        PyList_SET_ITEM(offsets, i, offset);
        encode_one((uint8_t *)out.buf + pos, size, &b, &items[i], first_queue_offset + i, here);
        pos += (Py_ssize_t)size;
    }
    result = Py_BuildValue("(On)", offsets, pos);

done:
    Py_XDECREF(offsets);
    Py_XDECREF(seq);
    if (items != NULL)
        release_items(items, n);
    PyBuffer_Release(&out);
    PyBuffer_Release(&topic);
    return result;
}

/* ------------------------------------------------------------------------ */
/* scan_dispatch                                                            */
/* ------------------------------------------------------------------------ */

/* The topic of the previous record: a batch's records usually share one str. */
typedef struct {
    PyObject *topic;          /* owned, or NULL */
    const uint8_t *bytes;     /* where its bytes lie in the buffer */
    Py_ssize_t len;
    long long queue_id;       /* and the owner of (topic, queue_id) */
    Py_ssize_t owner;
    int have_owner;
} TopicCache;

/* A new reference to the record's topic; NULL with *damaged set when it is not UTF-8. */
static PyObject *
cached_topic(TopicCache *cache, const Layout *rec, int *damaged)
{
    const uint8_t *bytes = rec->rec + rec->topic_at;
    if (cache->topic != NULL && cache->len == rec->topic_len
        && memcmp(cache->bytes, bytes, (size_t)rec->topic_len) == 0) {
        cache->bytes = bytes;
        Py_INCREF(cache->topic);
        return cache->topic;
    }
    PyObject *topic = decode_topic(rec, damaged);
    if (topic == NULL)
        return NULL;
    Py_XSETREF(cache->topic, topic);
    cache->bytes = bytes;
    cache->len = rec->topic_len;
    cache->have_owner = 0;
    Py_INCREF(topic);
    return topic;
}

static Py_ssize_t
cached_owner(TopicCache *cache, long long queue_id, long owner_count)
{
    if (!cache->have_owner || cache->queue_id != queue_id) {
        cache->owner = (Py_ssize_t)(owner_crc(cache->bytes, cache->len, queue_id) % (unsigned long)owner_count);
        cache->queue_id = queue_id;
        cache->have_owner = 1;
    }
    return cache->owner;
}

/* (topic, queue_id, queue_offset, commit_log_offset, size, tags_code, store_timestamp, keys), stealing keys. */
static PyObject *
dispatch_entry(PyObject *topic, const Layout *rec, int32_t tags_code, PyObject *keys)
{
    PyObject *entry = PyTuple_New(8);
    if (entry == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    Py_INCREF(topic);
    PyTuple_SET_ITEM(entry, 0, topic);
    PyTuple_SET_ITEM(entry, 7, keys);
    PyObject *values[6] = {
        PyLong_FromLong(load_i32(rec->rec + AT_QUEUE_ID)),
        PyLong_FromLongLong(load_i64(rec->rec + AT_QUEUE_OFFSET)),
        PyLong_FromLongLong(load_i64(rec->rec + AT_PHYSICAL_OFFSET)),
        PyLong_FromSsize_t(rec->size),
        PyLong_FromLong(tags_code),
        PyLong_FromLongLong(load_i64(rec->rec + AT_STORE_TS)),
    };
    int failed = 0;
    for (int i = 0; i < 6; i++) {
        if (values[i] == NULL) {
            failed = 1;
            Py_INCREF(Py_None);
            values[i] = Py_None;
        }
        PyTuple_SET_ITEM(entry, i + 1, values[i]);
    }
    if (failed) {
        Py_DECREF(entry);
        return NULL;
    }
    return entry;
}

/* The same entry with other keys, sharing its first seven items (entry[:7] + (keys,)). */
static PyObject *
with_keys(PyObject *entry, PyObject *keys)
{
    PyObject *copy = PyTuple_New(8);
    if (copy == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        PyObject *item = PyTuple_GET_ITEM(entry, i);
        Py_INCREF(item);
        PyTuple_SET_ITEM(copy, i, item);
    }
    PyTuple_SET_ITEM(copy, 7, keys);
    return copy;
}

/* Append obj to list and drop the caller's reference. */
static int
append_steal(PyObject *list, PyObject *obj)
{
    if (obj == NULL)
        return -1;
    int rc = PyList_Append(list, obj);
    Py_DECREF(obj);
    return rc;
}

/*
 * Dispatch one parsed record: its entry to its owner, and to the index when it
 * has keys. -1 on error.
 */
static int
dispatch_record(const Layout *rec, PyObject *topic, TopicCache *cache, long owner_count, PyObject *per_owner,
                PyObject *for_index)
{
    Wanted wanted;
    int32_t code = 0;
    (void)scan_properties(rec->rec + rec->props_at, rec->props_len, &wanted, NULL);  /* no dict: cannot fail */
    if (wanted.tags.at != NULL && tags_code_bytes(wanted.tags.at, wanted.tags.len, &code) < 0)
        return -1;
    PyObject *empty = PyList_New(0);
    if (empty == NULL)
        return -1;
    PyObject *entry = dispatch_entry(topic, rec, code, empty);
    if (entry == NULL)
        return -1;
    long long queue_id = load_i32(rec->rec + AT_QUEUE_ID);
    PyObject *owner_list = PyList_GET_ITEM(per_owner, cached_owner(cache, queue_id, owner_count));
    if (PyList_Append(owner_list, entry) < 0) {
        Py_DECREF(entry);
        return -1;
    }
    int rc = 0;
    if (wanted.uniq.at != NULL || wanted.keys.at != NULL) {
        PyObject *uniq = wanted.uniq.at ? decode_replace(wanted.uniq.at, wanted.uniq.len) : NULL;
        PyObject *keys = (uniq != NULL || wanted.uniq.at == NULL) ? split_keys(wanted.keys, uniq) : NULL;
        Py_XDECREF(uniq);
        if (keys == NULL)
            rc = -1;
        else if (PyList_GET_SIZE(keys) == 0)
            Py_DECREF(keys);     /* a KEYS value of spaces only: nothing to index */
        else
            rc = append_steal(for_index, with_keys(entry, keys));
    }
    Py_DECREF(entry);
    return rc;
}

/*
 * scan_dispatch(buf, pos, limit, base_offset, max_records, owner_count)
 *     -> (per_owner, for_index, count, pos, stop)
 *
 * codec_py.scan_dispatch: records parsed from buf[pos:limit] as decode_record
 * does without CRC checks, until limit (SCAN_MORE), max_records (SCAN_MORE),
 * the end-of-segment blank marker (SCAN_BLANK, TOTALSIZE = len(buf) - pos) or a
 * record that fails a check (SCAN_DAMAGE). owner_count must be at least 1.
 */
static PyObject *
codec_scan_dispatch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "scan_dispatch() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t pos, limit;
    long long base, max_records, owner_count;
    int base_exact;
    if (ssize_arg(args[1], "pos", &pos) < 0 || ssize_arg(args[2], "limit", &limit) < 0
        || base_offset_arg(args[3], &base, &base_exact) < 0 || clamped_arg(args[4], &max_records) < 0
        || int_arg(args[5], 1, LONG_MAX, "owner_count", &owner_count) < 0)
        return NULL;
    Py_buffer view;
    if (read_buffer(args[0], pos, limit, &view) < 0)
        return NULL;

    const uint8_t *buf = view.buf;
    PyObject *per_owner = NULL, *for_index = NULL, *result = NULL;
    TopicCache cache = {0};
    long long count = 0;
    int stop = SCAN_MORE;

    per_owner = PyList_New((Py_ssize_t)owner_count);
    if (per_owner == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < owner_count; i++) {
        PyObject *list = PyList_New(0);
        if (list == NULL)
            goto done;
        PyList_SET_ITEM(per_owner, i, list);
    }
    for_index = PyList_New(0);
    if (for_index == NULL)
        goto done;

    while (count < max_records) {
        if (limit - pos < 8)
            break;                                   /* SCAN_MORE */
        int64_t size = load_i32(buf + pos + AT_TOTAL_SIZE);
        if (load_u32(buf + pos + AT_MAGIC) == MAGIC_BLANK && size == (int64_t)(view.len - pos)) {
            stop = SCAN_BLANK;
            break;
        }
        int64_t here = 0;
        int have_here = offset_here(base, base_exact, pos, &here);
        Layout rec;
        if (check_layout(buf, pos, limit, have_here, here, &rec) < 0) {
            stop = SCAN_DAMAGE;
            break;
        }
        int damaged = 0;
        PyObject *topic = cached_topic(&cache, &rec, &damaged);
        if (topic == NULL) {
            if (!damaged)
                goto done;
            stop = SCAN_DAMAGE;
            break;
        }
        int rc = dispatch_record(&rec, topic, &cache, (long)owner_count, per_owner, for_index);
        Py_DECREF(topic);
        if (rc < 0)
            goto done;
        pos += rec.size;
        count++;
    }
    result = Py_BuildValue("(OOLni)", per_owner, for_index, count, pos, stop);

done:
    Py_XDECREF(cache.topic);
    Py_XDECREF(per_owner);
    Py_XDECREF(for_index);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------------ */
/* read_view                                                                */
/* ------------------------------------------------------------------------ */

/* MessageView's fields, in order: the dict is msgpack-encoded as is. */
enum {
    F_TOPIC, F_QUEUE_ID, F_QUEUE_OFFSET, F_COMMIT_LOG_OFFSET, F_STORE_SIZE, F_MSG_ID, F_BODY, F_BODY_CRC,
    F_TAGS, F_KEYS, F_UNIQ_KEY, F_PROPERTIES, F_FLAG, F_SYS_FLAG, F_BORN_TIMESTAMP, F_BORN_HOST,
    F_STORE_TIMESTAMP, F_STORE_HOST, F_RECONSUME_TIMES, F_COUNT
};

static const char *const field_names[F_COUNT] = {
    "topic", "queue_id", "queue_offset", "commit_log_offset", "store_size", "msg_id", "body", "body_crc",
    "tags", "keys", "uniq_key", "properties", "flag", "sys_flag", "born_timestamp", "born_host",
    "store_timestamp", "store_host", "reconsume_times",
};

static PyObject *field_keys[F_COUNT];  /* interned at import */
static PyObject *view_template;        /* field_keys -> None, in order: copied, then filled */
static PyObject *uniq_key_name;        /* "UNIQ_KEY" */

/* Decimal digits of v at out; returns how many. */
static int
format_uint(char *out, uint32_t v)
{
    char digits[10];
    int n = 0, len = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        out[len++] = digits[--n];
    return len;
}

/* str(HostAddress): "a.b.c.d:port" (socket.inet_ntoa and a signed port); ip and port as stored. */
static PyObject *
host_text(const uint8_t *ip_port)
{
    char text[32];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        n += format_uint(text + n, ip_port[i]);
        text[n++] = i < 3 ? '.' : ':';
    }
    int32_t port = load_i32(ip_port + 4);
    if (port < 0)
        text[n++] = '-';
    n += format_uint(text + n, port < 0 ? 0u - (uint32_t)port : (uint32_t)port);
    return PyUnicode_DecodeASCII(text, n, NULL);
}

/* host_text with a one-entry cache per slot: the store host hardly ever changes,
 * and a born host repeats while one producer sends. */
static PyObject *
cached_host_text(int slot, const uint8_t *ip_port)
{
    static PyObject *texts[2];
    static uint8_t keys[2][8];
    if (texts[slot] == NULL || memcmp(keys[slot], ip_port, 8) != 0) {
        PyObject *text = host_text(ip_port);
        if (text == NULL)
            return NULL;
        Py_XSETREF(texts[slot], text);
        memcpy(keys[slot], ip_port, 8);
    }
    return Py_NewRef(texts[slot]);
}

/* layout.encode_msg_id: store ip (4), port (i32), commit log offset (i64), 32 uppercase hex digits. */
static PyObject *
msg_id_text(const uint8_t *rec)
{
    static const char hex[] = "0123456789ABCDEF";
    uint8_t raw[16];
    memcpy(raw, rec + AT_STORE_IP, 8);             /* ip and port, already big-endian */
    memcpy(raw + 8, rec + AT_PHYSICAL_OFFSET, 8);
    PyObject *text = PyUnicode_New(32, 127);
    if (text == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    for (int i = 0; i < 16; i++) {
        out[2 * i] = (Py_UCS1)hex[raw[i] >> 4];
        out[2 * i + 1] = (Py_UCS1)hex[raw[i] & 0xF];
    }
    return text;
}

/* A decoded optional property: the str, or None when absent. */
static PyObject *
optional_text(Span span)
{
    if (span.at == NULL)
        Py_RETURN_NONE;
    return decode_replace(span.at, span.len);
}

/* The reply map of a record that passed every check. */
static PyObject *
view_dict(const Layout *rec, PyObject *topic)
{
    const uint8_t *r = rec->rec;
    PyObject *values[F_COUNT] = {NULL};
    PyObject *dict = NULL;
    Wanted wanted;

    values[F_PROPERTIES] = PyDict_New();
    if (values[F_PROPERTIES] == NULL
        || scan_properties(r + rec->props_at, rec->props_len, &wanted, values[F_PROPERTIES]) < 0)
        goto done;
    Py_INCREF(topic);
    values[F_TOPIC] = topic;
    values[F_QUEUE_ID] = PyLong_FromLong(load_i32(r + AT_QUEUE_ID));
    values[F_QUEUE_OFFSET] = PyLong_FromLongLong(load_i64(r + AT_QUEUE_OFFSET));
    values[F_COMMIT_LOG_OFFSET] = PyLong_FromLongLong(load_i64(r + AT_PHYSICAL_OFFSET));
    values[F_STORE_SIZE] = PyLong_FromSsize_t(rec->size);
    values[F_MSG_ID] = msg_id_text(r);
    values[F_BODY] = PyBytes_FromStringAndSize((const char *)r + rec->body_at, rec->body_len);
    values[F_BODY_CRC] = PyLong_FromLong(load_i32(r + AT_BODY_CRC));
    values[F_TAGS] = optional_text(wanted.tags);
    values[F_KEYS] = split_keys(wanted.keys, NULL);
    /* props.get("UNIQ_KEY"): the user properties hold it, decoded */
    values[F_UNIQ_KEY] = PyDict_GetItemWithError(values[F_PROPERTIES], uniq_key_name);
    if (values[F_UNIQ_KEY] == NULL && !PyErr_Occurred())
        values[F_UNIQ_KEY] = Py_None;
    Py_XINCREF(values[F_UNIQ_KEY]);
    values[F_FLAG] = PyLong_FromLong(load_i32(r + AT_FLAG));
    values[F_SYS_FLAG] = PyLong_FromLong(load_i32(r + AT_SYS_FLAG));
    values[F_BORN_TIMESTAMP] = PyLong_FromLongLong(load_i64(r + AT_BORN_TS));
    values[F_BORN_HOST] = cached_host_text(0, r + AT_BORN_IP);
    values[F_STORE_TIMESTAMP] = PyLong_FromLongLong(load_i64(r + AT_STORE_TS));
    values[F_STORE_HOST] = cached_host_text(1, r + AT_STORE_IP);
    values[F_RECONSUME_TIMES] = PyLong_FromLong(load_i32(r + AT_RECONSUME_TIMES));
    for (int i = 0; i < F_COUNT; i++)
        if (values[i] == NULL)
            goto done;
    dict = PyDict_Copy(view_template);  /* sized and ordered already: filling it never resizes */
    if (dict == NULL)
        goto done;
    for (int i = 0; i < F_COUNT; i++) {
        if (PyDict_SetItem(dict, field_keys[i], values[i]) < 0) {
            Py_CLEAR(dict);
            goto done;
        }
    }
done:
    for (int i = 0; i < F_COUNT; i++)
        Py_XDECREF(values[i]);
    return dict;
}

/*
 * read_view(buf, pos, limit, base_offset, check_crc, require_record_crc) -> dict | None
 *
 * codec_py.read_view: the record at buf[pos:] as MessageView's map, or None
 * whenever decode_record would raise RecordError.
 */
static PyObject *
codec_read_view(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "read_view() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t pos, limit;
    long long base;
    int base_exact;
    if (ssize_arg(args[1], "pos", &pos) < 0 || ssize_arg(args[2], "limit", &limit) < 0
        || base_offset_arg(args[3], &base, &base_exact) < 0)
        return NULL;
    int check_crc = PyObject_IsTrue(args[4]);
    int require_record_crc = check_crc < 0 ? -1 : PyObject_IsTrue(args[5]);
    if (require_record_crc < 0)
        return NULL;
    Py_buffer view;
    if (read_buffer(args[0], pos, limit, &view) < 0)
        return NULL;

    PyObject *result = NULL;
    int64_t here = 0;
    int have_here = offset_here(base, base_exact, pos, &here);
    Layout rec;
    if (check_layout(view.buf, pos, limit, have_here, here, &rec) < 0
        || (check_crc && verify_crcs(&rec, require_record_crc) < 0)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    int damaged = 0;
    PyObject *topic = decode_topic(&rec, &damaged);
    if (topic == NULL) {
        if (damaged)
            result = Py_NewRef(Py_None);
        goto done;
    }
    result = view_dict(&rec, topic);
    Py_DECREF(topic);
done:
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Module                                                                   */
/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* index_put_keys (IndexFile#putKey, engine/index_file.py)                   */
/* ------------------------------------------------------------------------ */

/*
 * The IndexFile (engine/layout.py: INDEX_HEADER, INDEX_SLOT, INDEX_ITEM):
 *
 *   header, 40 bytes: begin ts i64 | end ts i64 | begin phy i64 | end phy i64 | slots used i32 | count i32
 *   then hash_slot_count x i32 (newest item in the bucket), then 20-byte items:
 *   hash i32 | commit log offset i64 | time diff s i32 | previous item i32
 *
 * Each key is indexed as prefix + key ("topic#key"). The header in buf is
 * the state: read first, rewritten after every item, so
 * a kill between an item and its header leaves one uncounted item
 * (IndexFile.repair_after_kill unlinks it).
 */
enum { INDEX_HEADER_BYTES = 40, INDEX_SLOT_BYTES = 4, INDEX_ITEM_BYTES = 20 };

static PyObject *
codec_index_put_keys(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "index_put_keys(buf, hash_slot_count, index_count_max, prefix, keys, "
                                         "commit_log_offset, store_timestamp_ms)");
        return NULL;
    }
    long long slots, count_max, offset, store_ts;
    if (int_arg(args[1], 1, INT32_MAX, "hash_slot_count", &slots) < 0
        || int_arg(args[2], 0, INT32_MAX, "index_count_max", &count_max) < 0
        || int_arg(args[5], LLONG_MIN, LLONG_MAX, "commit_log_offset", &offset) < 0
        || int_arg(args[6], LLONG_MIN, LLONG_MAX, "store_timestamp_ms", &store_ts) < 0)
        return NULL;
    PyObject *prefix = args[3], *keys = args[4];
    if (!PyUnicode_Check(prefix) || !PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "prefix must be a str and keys a list of str");
        return NULL;
    }
    uint32_t prefix_hash;  /* the hash of prefix + key continues from the prefix's */
    if (java_hash_more(prefix, 0, &prefix_hash) < 0)
        return NULL;

    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return NULL;
    uint8_t *buf = (uint8_t *)view.buf;
    long long items_base = INDEX_HEADER_BYTES + slots * INDEX_SLOT_BYTES;
    if (view.len < items_base + count_max * INDEX_ITEM_BYTES) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the buffer is smaller than an index file of these dimensions");
        return NULL;
    }
    int64_t begin_ts = load_i64(buf), end_ts = load_i64(buf + 8);
    int64_t begin_phy = load_i64(buf + 16), end_phy = load_i64(buf + 24);
    int32_t slots_used = load_i32(buf + 32), count = load_i32(buf + 36);
    if (count < 1)
        count = 1;  /* item 0 is never used: 0 in a slot means an empty bucket */
    Py_ssize_t added = 0, n = PyList_GET_SIZE(keys);
    for (; added < n && count < count_max; added++) {
        PyObject *key = PyList_GET_ITEM(keys, added);
        uint32_t h;
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "keys must be str");
            goto fail;
        }
        if (java_hash_more(key, prefix_hash, &h) < 0)
            goto fail;
        /* indexKeyHashMethod: abs(hashCode), Integer.MIN_VALUE mapped to 0 */
        int32_t signed_hash = java_int(h);
        int32_t key_hash = signed_hash == INT32_MIN ? 0 : signed_hash < 0 ? -signed_hash : signed_hash;
        uint8_t *slot = buf + INDEX_HEADER_BYTES + (long long)(key_hash % slots) * INDEX_SLOT_BYTES;
        int32_t previous = load_i32(slot);
        if (previous <= 0 || previous > count)
            previous = 0;
        int64_t time_diff = 0;
        if (begin_ts > 0 && store_ts > begin_ts) {
            time_diff = (store_ts - begin_ts) / 1000;  /* no overflow: both are positive here */
            if (time_diff > INT32_MAX)
                time_diff = INT32_MAX;
        }
        uint8_t *item = buf + items_base + (long long)count * INDEX_ITEM_BYTES;
        store_u32(item, (uint32_t)key_hash);
        store_u64(item + 4, (uint64_t)offset);
        store_u32(item + 12, (uint32_t)time_diff);
        store_u32(item + 16, (uint32_t)previous);
        store_u32(slot, (uint32_t)count);
        if (count <= 1) {
            begin_phy = offset;
            begin_ts = store_ts;
        }
        if (previous == 0)
            slots_used++;
        count++;
        end_phy = offset;
        end_ts = store_ts;
        store_u64(buf, (uint64_t)begin_ts);
        store_u64(buf + 8, (uint64_t)end_ts);
        store_u64(buf + 16, (uint64_t)begin_phy);
        store_u64(buf + 24, (uint64_t)end_phy);
        store_u32(buf + 32, (uint32_t)slots_used);
        store_u32(buf + 36, (uint32_t)count);
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(added);

fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef codec_methods[] = {
    {"java_hash", codec_java_hash, METH_O, "Java String.hashCode as a signed 32-bit int."},
    {"owner_index", (PyCFunction)(void (*)(void))codec_owner_index, METH_FASTCALL,
     "Which ConsumeQueue owner holds (topic, queue_id): CRC-32 of topic/queue_id."},
    {"encode_records", (PyCFunction)(void (*)(void))codec_encode_records, METH_FASTCALL,
     "Encode a batch of records for one queue at buf[pos:] (see engine/codec_py.py)."},
    {"scan_dispatch", (PyCFunction)(void (*)(void))codec_scan_dispatch, METH_FASTCALL,
     "Parse records from buf[pos:limit] for dispatch, without CRC checks (see engine/codec_py.py)."},
    {"index_put_keys", (PyCFunction)(void (*)(void))codec_index_put_keys, METH_FASTCALL,
     "IndexFile#putKey for each topic#key; returns how many were added (see engine/codec_py.py)."},
    {"read_view", (PyCFunction)(void (*)(void))codec_read_view, METH_FASTCALL,
     "The record at buf[pos:] as a reply's message map; None if it fails any check."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "engine._codec",
    .m_doc = "The batch codec of the hot paths, compiled: the same answers as engine.codec_py.",
    .m_size = -1,
    .m_methods = codec_methods,
};

PyMODINIT_FUNC
PyInit__codec(void)
{
    for (int i = 0; i < F_COUNT; i++) {
        if (field_keys[i] == NULL) {
            field_keys[i] = PyUnicode_InternFromString(field_names[i]);
            if (field_keys[i] == NULL)
                return NULL;
        }
    }
    if (view_template == NULL) {
        view_template = PyDict_New();
        if (view_template == NULL)
            return NULL;
        for (int i = 0; i < F_COUNT; i++)
            if (PyDict_SetItem(view_template, field_keys[i], Py_None) < 0)
                return NULL;
    }
    if (uniq_key_name == NULL && (uniq_key_name = PyUnicode_InternFromString("UNIQ_KEY")) == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&codec_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddIntConstant(module, "SCAN_MORE", SCAN_MORE) < 0
        || PyModule_AddIntConstant(module, "SCAN_BLANK", SCAN_BLANK) < 0
        || PyModule_AddIntConstant(module, "SCAN_DAMAGE", SCAN_DAMAGE) < 0
        || PyModule_AddObjectRef(module, "COMPILED", Py_True) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
