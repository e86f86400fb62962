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
 * An IPv6 host (SYSFLAG 0x10 for BORNHOST, 0x20 for STOREHOST) is 16 bytes of
 * address and the port, 12 bytes more than the drawing: every field after it
 * moves on by 12. The AT_ offsets past BORNHOST are those of IPv4 hosts; a
 * Layout holds where those fields lie in its record.
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

#include <arpa/inet.h>
#include <limits.h>
#include <stdatomic.h>
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
#define SYSFLAG_BORNHOST_V6 0x10
#define SYSFLAG_STOREHOST_V6 0x20
#define SYSFLAG_HOSTS_V6 (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
enum { IPV4_BYTES = 4, IPV6_BYTES = 16, HOST_V6_EXTRA = IPV6_BYTES - IPV4_BYTES };
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

/*
 * Publication in a shared mapping (the IndexFile, engine/key_lookup.py). The index
 * builder writes while the front, another process, reads. What the writer stores before
 * a release store is visible to a reader that sees that store through an acquire load:
 * a release store is a store with a barrier before it (aarch64: stlr), an acquire load a
 * load with a barrier after it (ldar); on x86-64 both are plain moves and only keep the
 * compiler from moving accesses across them. Values are big-endian; a naturally aligned
 * word (any mmap'd IndexFile field) is stored and loaded whole with C11 atomics, and a
 * misaligned one (a test's bytearray) by bytes between fences. The atomics must be
 * lock-free: a lock would live in one process's memory and order nothing in the other's.
 */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && sizeof(_Atomic uint32_t) == 4,
               "a 32-bit atomic in shared memory must be a lock-free plain word");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && sizeof(_Atomic uint64_t) == 8,
               "a 64-bit atomic in shared memory must be a lock-free plain word");

static inline void
publish_u32(uint8_t *p, uint32_t v)
{
    if (((uintptr_t)p & 3) == 0) {
        uint32_t word;
        store_u32((uint8_t *)&word, v);
        atomic_store_explicit((_Atomic uint32_t *)(void *)p, word, memory_order_release);
    } else {
        atomic_thread_fence(memory_order_release);
        store_u32(p, v);
    }
}

static inline uint32_t
acquire_u32(const uint8_t *p)
{
    if (((uintptr_t)p & 3) == 0) {
        uint32_t word = atomic_load_explicit((_Atomic uint32_t *)(void *)p, memory_order_acquire);
        return load_u32((const uint8_t *)&word);
    }
    uint32_t v = load_u32(p);
    atomic_thread_fence(memory_order_acquire);
    return v;
}

/* A 64-bit header field, stored and loaded whole when aligned (a reader never sees half of it). */
static inline void
store_whole_u64(uint8_t *p, uint64_t v)
{
    if (((uintptr_t)p & 7) == 0) {
        uint64_t word;
        store_u64((uint8_t *)&word, v);
        atomic_store_explicit((_Atomic uint64_t *)(void *)p, word, memory_order_relaxed);
    } else {
        store_u64(p, v);
    }
}

static inline int64_t
load_whole_i64(const uint8_t *p)
{
    if (((uintptr_t)p & 7) == 0) {
        uint64_t word = atomic_load_explicit((_Atomic uint64_t *)(void *)p, memory_order_relaxed);
        return load_i64((const uint8_t *)&word);
    }
    return load_i64(p);
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
    int born_ip_len, store_ip_len;   /* 4, or 16 for an IPv6 host */
    Py_ssize_t store_ts_at, store_host_at, reconsume_at;
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
    if (limit - pos < AT_SYS_FLAG + 4)
        return -1;                                   /* truncated header */
    const uint8_t *rec = buf + pos;
    int32_t sys_flag = load_i32(rec + AT_SYS_FLAG);
    Py_ssize_t born_extra = sys_flag & SYSFLAG_BORNHOST_V6 ? HOST_V6_EXTRA : 0;
    Py_ssize_t store_extra = sys_flag & SYSFLAG_STOREHOST_V6 ? HOST_V6_EXTRA : 0;
    Py_ssize_t header = HEADER_BYTES + born_extra + store_extra;
    if (limit - pos < header + 4)
        return -1;                                   /* truncated header */
    uint32_t magic = load_u32(rec + AT_MAGIC);
    if (magic != MAGIC_V1 && magic != MAGIC_V2)
        return -1;                                   /* bad magic */
    int64_t size = load_i32(rec + AT_TOTAL_SIZE);
    if (size < MIN_RECORD_BYTES + born_extra + store_extra || size > limit - pos)
        return -1;                                   /* bad total size */
    if (!have_here || load_i64(rec + AT_PHYSICAL_OFFSET) != here)
        return -1;                                   /* physical offset mismatch */
    int64_t body_len = load_i32(rec + header);
    int64_t topic_len_bytes = magic == MAGIC_V2 ? 2 : 1;
    int64_t at = header + 4 + body_len;
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
    out->born_ip_len = born_extra ? IPV6_BYTES : IPV4_BYTES;
    out->store_ip_len = store_extra ? IPV6_BYTES : IPV4_BYTES;
    out->store_ts_at = AT_STORE_TS + born_extra;
    out->store_host_at = AT_STORE_IP + born_extra;
    out->reconsume_at = AT_RECONSUME_TIMES + born_extra + store_extra;
    out->body_at = header + 4;
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

/* The next non-empty part of the KEYS value from *start (split on ' '); 0 when none is left. */
static int
next_key(Span keys, Py_ssize_t *start, Span *part)
{
    while (keys.at != NULL && *start < keys.len) {
        const uint8_t *at = keys.at + *start;
        const uint8_t *stop = memchr(at, KEY_SEPARATOR, (size_t)(keys.len - *start));
        Py_ssize_t len = stop ? stop - at : keys.len - *start;
        *start += len + 1;
        if (len > 0) {
            part->at = at;
            part->len = len;
            return 1;
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
    Span part;
    while (next_key(keys, &start, &part)) {
        PyObject *key = decode_replace(part.at, part.len);
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

/* f"{topic}".encode() for any object, as the Python reference builds it. */
static PyObject *
owner_topic_bytes(PyObject *topic)
{
    PyObject *empty = PyUnicode_New(0, 0);
    if (empty == NULL)
        return NULL;
    PyObject *text = PyObject_Format(topic, empty);
    PyObject *encoded = text ? PyUnicode_AsUTF8String(text) : NULL;
    Py_DECREF(empty);
    Py_XDECREF(text);
    return encoded;
}

/*
 * owner_index(topic: str, queue_id: int, owner_count: int) -> int:
 * (zlib.crc32(f"{topic}".encode()) + queue_id) % owner_count: the queues of a topic go
 * round the owners from a place its name picks. The plain case (a str, an int within
 * +-2^62, a positive count) is computed here; any other goes through the same Python
 * operations as the reference.
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
    if (PyUnicode_CheckExact(topic)) {
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(topic, &len);
        if (utf8 == NULL)
            return NULL;
        crc = crc_update(0, (const uint8_t *)utf8, len);
    } else {
        PyObject *encoded = owner_topic_bytes(topic);
        if (encoded == NULL)
            return NULL;
        crc = crc_update(0, (const uint8_t *)PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded));
        Py_DECREF(encoded);
    }
    if (PyLong_CheckExact(queue_id) && PyLong_CheckExact(owner_count)) {
        int overflow_q = 0, overflow_c = 0;
        long long qid = PyLong_AsLongLongAndOverflow(queue_id, &overflow_q);
        long long count = PyLong_AsLongLongAndOverflow(owner_count, &overflow_c);
        const long long bound = 1LL << 62;
        if (!overflow_q && !overflow_c && count > 0 && qid > -bound && qid < bound) {
            long long r = ((long long)crc + qid) % count;
            return PyLong_FromLongLong(r < 0 ? r + count : r);
        }
    }
    PyObject *value = PyLong_FromUnsignedLong(crc);
    if (value == NULL)
        return NULL;
    PyObject *sum = PyNumber_Add(value, queue_id);
    Py_DECREF(value);
    if (sum == NULL)
        return NULL;
    PyObject *result = PyNumber_Remainder(sum, owner_count);
    Py_DECREF(sum);
    return result;
}

/* ------------------------------------------------------------------------ */
/* encode_records                                                           */
/* ------------------------------------------------------------------------ */

/* A HostAddress as layout.encode_record_into packs it: an ip of 16 bytes is IPv6
 * ("16s", SYSFLAG 0x10 / 0x20), any other as "4s" (padded or cut to 4 bytes); port "i". */
typedef struct {
    uint8_t ip[IPV6_BYTES];
    int ip_len;             /* 4 or 16 */
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
    out->ip_len = n == IPV6_BYTES ? IPV6_BYTES : IPV4_BYTES;
    memcpy(out->ip, data, (size_t)(n < out->ip_len ? n : out->ip_len));
    long long port;
    if (int_arg(PyTuple_GET_ITEM(obj, 1), INT32_MIN, INT32_MAX, "port", &port) < 0)
        return -1;
    out->port = (uint32_t)port;
    return 0;
}

/* One item of the batch: (body, properties, flag, born_timestamp_ms[, sys_flag,
 * prepared_transaction_offset]); the two last are 0 when not given. */
typedef struct {
    Py_buffer body;
    Py_buffer props;
    int have_body, have_props;
    uint32_t flag;
    int64_t born_ms;
    uint32_t sys_flag;      /* without the host bits: the hosts set those */
    int64_t prepared_offset;
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
    if (PyTuple_GET_SIZE(seq) != 4 && PyTuple_GET_SIZE(seq) != 6) {
        PyErr_Format(PyExc_ValueError, "a batch item has 4 or 6 fields, not %zd", PyTuple_GET_SIZE(seq));
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
    if (PyTuple_GET_SIZE(seq) == 6) {
        if (int_arg(PyTuple_GET_ITEM(seq, 4), INT32_MIN, INT32_MAX, "sys_flag", &v) < 0)
            goto done;
        out->sys_flag = (uint32_t)v & ~(uint32_t)SYSFLAG_HOSTS_V6;
        if (int_arg(PyTuple_GET_ITEM(seq, 5), INT64_MIN, INT64_MAX, "prepared_transaction_offset", &v) < 0)
            goto done;
        out->prepared_offset = v;
    }
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
    int64_t hosts = (b->born_host.ip_len - IPV4_BYTES) + (b->store_host.ip_len - IPV4_BYTES);
    return MIN_RECORD_BYTES + hosts + (b->topic_len > TOPIC_V1_MAX_BYTES ? 1 : 0) + it->body.len + b->topic_len
        + props;
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
    uint32_t sys_flag = it->sys_flag | (b->born_host.ip_len == IPV6_BYTES ? SYSFLAG_BORNHOST_V6 : 0)
        | (b->store_host.ip_len == IPV6_BYTES ? SYSFLAG_STOREHOST_V6 : 0);
    store_u32(out + AT_SYS_FLAG, sys_flag);
    store_u64(out + AT_BORN_TS, (uint64_t)it->born_ms);
    uint8_t *w = out + AT_BORN_IP;
    memcpy(w, b->born_host.ip, (size_t)b->born_host.ip_len);
    w += b->born_host.ip_len;
    store_u32(w, b->born_host.port);
    store_u64(w + 4, (uint64_t)b->store_ms);
    w += 12;
    memcpy(w, b->store_host.ip, (size_t)b->store_host.ip_len);
    w += b->store_host.ip_len;
    store_u32(w, b->store_host.port);
    store_u32(w + 4, 0);                             /* RECONSUMETIMES */
    store_u64(w + 8, (uint64_t)it->prepared_offset);
    w += 16;
    Py_ssize_t body_at = (w - out) + 4;
    store_u32(w, (uint32_t)it->body.len);
    uint8_t *at = out + body_at;
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
            crc = crc_update(0, out, body_at);
            crc = (uint32_t)crc32_combine(crc, body_crc, (z_off_t)it->body.len);
            crc = crc_update(crc, out + body_at + it->body.len, size - CRC_TAIL_BYTES - body_at - it->body.len);
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
        /* owner_index: (crc32(topic) + queue_id) % owner_count, never negative (a record's queue id is 32 bits) */
        long long r = ((long long)crc_update(0, cache->bytes, cache->len) + queue_id) % (long long)owner_count;
        cache->owner = (Py_ssize_t)(r < 0 ? r + owner_count : r);
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
        PyLong_FromLongLong(load_i64(rec->rec + rec->store_ts_at)),
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
 * A dispatch entry packed (codec_py.PACKED_ENTRY, "<qqqqiiHH"), the way the reput
 * dispatcher sends a receiver its entries: one bytes object, no object per record.
 *
 *   queue_offset i64 | commit_log_offset i64 | store_timestamp i64 | tags_code i64 |
 *   size i32 | queue_id i32 | topic_bytes u16 | key_count u16               44 bytes, little-endian
 *   topic (UTF-8, topic_bytes) | then per key: key_bytes u16 | key (UTF-8, as in the record)
 *
 * Receivers decode a key as decode_replace does: the same str as the tuple form's.
 */
enum { PACKED_HEAD_BYTES = 44 };

static inline void
store_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t
load_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* A growing byte string: the packed entries of one receiver. */
typedef struct {
    uint8_t *data;
    Py_ssize_t len, cap;
} Packer;

static uint8_t *
packer_room(Packer *pk, Py_ssize_t more)
{
    if (pk->len + more > pk->cap) {
        Py_ssize_t cap = pk->cap ? pk->cap : 4096;
        while (cap < pk->len + more)
            cap *= 2;
        uint8_t *data = PyMem_Realloc(pk->data, (size_t)cap);
        if (data == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        pk->data = data;
        pk->cap = cap;
    }
    uint8_t *at = pk->data + pk->len;
    pk->len += more;
    return at;
}

/* The parsed head of a packed entry. */
typedef struct {
    int64_t queue_offset, commit_log_offset, store_timestamp, tags_code;
    int32_t size, queue_id;
    const uint8_t *topic;
    Py_ssize_t topic_len;
    int key_count;
    const uint8_t *keys;      /* the first key's length */
    Py_ssize_t next;          /* where the next entry begins */
} PackedEntry;

/* The entry at buf[pos:n]; -1 with ValueError when it runs past n. */
static int
packed_entry_at(const uint8_t *buf, Py_ssize_t n, Py_ssize_t pos, PackedEntry *e)
{
    if (pos < 0 || n - pos < PACKED_HEAD_BYTES)
        goto torn;
    const uint8_t *p = buf + pos;
    e->queue_offset = (int64_t)load_le(p, 8);
    e->commit_log_offset = (int64_t)load_le(p + 8, 8);
    e->store_timestamp = (int64_t)load_le(p + 16, 8);
    e->tags_code = (int64_t)load_le(p + 24, 8);
    e->size = (int32_t)load_le(p + 32, 4);
    e->queue_id = (int32_t)load_le(p + 36, 4);
    e->topic_len = (Py_ssize_t)load_le(p + 40, 2);
    e->key_count = (int)load_le(p + 42, 2);
    Py_ssize_t at = pos + PACKED_HEAD_BYTES;
    if (n - at < e->topic_len)
        goto torn;
    e->topic = buf + at;
    at += e->topic_len;
    e->keys = buf + at;
    for (int k = 0; k < e->key_count; k++) {
        if (n - at < 2 || n - at - 2 < (Py_ssize_t)load_le(buf + at, 2))
            goto torn;
        at += 2 + (Py_ssize_t)load_le(buf + at, 2);
    }
    e->next = at;
    return 0;
torn:
    PyErr_SetString(PyExc_ValueError, "a packed dispatch entry runs past the end of its bytes");
    return -1;
}

/* Pack one record's entry, its keys [uniq if present] + the non-empty parts of keys (their
 * count fits in u16: a record's properties are at most 32767 bytes); with skip_keyless, an
 * entry left without a key is taken back. */
static int
pack_record(Packer *pk, const Layout *rec, int32_t tags_code, const Span *uniq, Span keys, int skip_keyless)
{
    Py_ssize_t more = PACKED_HEAD_BYTES + rec->topic_len + (uniq ? 2 + uniq->len : 0) + 2 * keys.len + 2;
    uint8_t *p = packer_room(pk, more);
    if (p == NULL)
        return -1;
    store_le(p, (uint64_t)load_i64(rec->rec + AT_QUEUE_OFFSET), 8);
    store_le(p + 8, (uint64_t)load_i64(rec->rec + AT_PHYSICAL_OFFSET), 8);
    store_le(p + 16, (uint64_t)load_i64(rec->rec + rec->store_ts_at), 8);
    store_le(p + 24, (uint64_t)(int64_t)tags_code, 8);
    store_le(p + 32, (uint64_t)(uint32_t)rec->size, 4);
    store_le(p + 36, (uint64_t)(uint32_t)load_i32(rec->rec + AT_QUEUE_ID), 4);
    store_le(p + 40, (uint64_t)rec->topic_len, 2);
    memcpy(p + PACKED_HEAD_BYTES, rec->rec + rec->topic_at, (size_t)rec->topic_len);
    uint8_t *at = p + PACKED_HEAD_BYTES + rec->topic_len;
    int key_count = 0;
    Py_ssize_t start = 0;
    Span part;
    for (int first = uniq != NULL; first || next_key(keys, &start, &part); first = 0, key_count++) {
        if (first)
            part = *uniq;
        store_le(at, (uint64_t)part.len, 2);
        memcpy(at + 2, part.at, (size_t)part.len);
        at += 2 + part.len;
    }
    store_le(p + 42, (uint64_t)key_count, 2);
    pk->len -= skip_keyless && key_count == 0 ? more : more - (at - p);  /* the room not taken back */
    return 0;
}

/* What dispatch reads in a record's properties: its tags' code, and its KEYS and UNIQ_KEY (this
 * one only with index_uniq). -1 on error. */
static int
dispatch_properties(const Layout *rec, int index_uniq, Wanted *wanted, int32_t *code)
{
    *code = 0;
    (void)scan_properties(rec->rec + rec->props_at, rec->props_len, wanted, NULL);  /* no dict: cannot fail */
    if (!index_uniq)
        wanted->uniq.at = NULL;
    return wanted->tags.at != NULL ? tags_code_bytes(wanted->tags.at, wanted->tags.len, code) : 0;
}

/* Dispatch one record packed: to its owner's packer, and to the index's when it has keys. */
static int
pack_dispatch_record(const Layout *rec, TopicCache *cache, long owner_count, Packer *per_owner, Packer *for_index,
                     int index_uniq)
{
    Wanted wanted;
    int32_t code;
    if (dispatch_properties(rec, index_uniq, &wanted, &code) < 0)
        return -1;
    long long queue_id = load_i32(rec->rec + AT_QUEUE_ID);
    Span none = {NULL, 0};
    if (pack_record(&per_owner[cached_owner(cache, queue_id, owner_count)], rec, code, NULL, none, 0) < 0)
        return -1;
    return pack_record(for_index, rec, code, wanted.uniq.at ? &wanted.uniq : NULL, wanted.keys, 1);
}

/*
 * Dispatch one parsed record: its entry to its owner, and to the index when it
 * has keys (its UNIQ_KEY counts only with index_uniq). -1 on error.
 */
static int
dispatch_record(const Layout *rec, PyObject *topic, TopicCache *cache, long owner_count, PyObject *per_owner,
                PyObject *for_index, int index_uniq)
{
    Wanted wanted;
    int32_t code;
    if (dispatch_properties(rec, index_uniq, &wanted, &code) < 0)
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
 * scan_dispatch(buf, pos, limit, base_offset, max_records, owner_count[, index_uniq[, packed]])
 *     -> (per_owner, for_index, count, pos, stop)
 *
 * codec_py.scan_dispatch: records parsed from buf[pos:limit] as decode_record
 * does without CRC checks, until limit (SCAN_MORE), max_records (SCAN_MORE),
 * the end-of-segment blank marker (SCAN_BLANK, TOTALSIZE = len(buf) - pos) or a
 * record that fails a check (SCAN_DAMAGE). owner_count must be at least 1. With
 * packed, each owner's entries and the index's are one bytes object of packed entries.
 */
static PyObject *
codec_scan_dispatch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 6 || nargs > 8) {
        PyErr_Format(PyExc_TypeError, "scan_dispatch() takes 6 to 8 arguments (%zd given)", nargs);
        return NULL;
    }
    int index_uniq = 1, packed = 0;
    if ((nargs >= 7 && (index_uniq = PyObject_IsTrue(args[6])) < 0)
        || (nargs == 8 && (packed = PyObject_IsTrue(args[7])) < 0))
        return NULL;
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
    Packer *packers = NULL;  /* packed: one per owner, then the index's */
    long long count = 0;
    int stop = SCAN_MORE;

    per_owner = PyList_New((Py_ssize_t)owner_count);
    if (per_owner == NULL)
        goto done;
    if (packed && (packers = PyMem_Calloc((size_t)owner_count + 1, sizeof(Packer))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < owner_count && !packed; i++) {
        PyObject *list = PyList_New(0);
        if (list == NULL)
            goto done;
        PyList_SET_ITEM(per_owner, i, list);
    }
    if (!packed && (for_index = PyList_New(0)) == NULL)
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
        int rc = packed
            ? pack_dispatch_record(&rec, &cache, (long)owner_count, packers, &packers[owner_count], index_uniq)
            : dispatch_record(&rec, topic, &cache, (long)owner_count, per_owner, for_index, index_uniq);
        Py_DECREF(topic);
        if (rc < 0)
            goto done;
        pos += rec.size;
        count++;
    }
    for (Py_ssize_t i = 0; i <= owner_count && packed; i++) {
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)packers[i].data, packers[i].len);
        if (bytes == NULL)
            goto done;
        if (i < owner_count)
            PyList_SET_ITEM(per_owner, i, bytes);
        else
            for_index = bytes;
    }
    result = Py_BuildValue("(OOLni)", per_owner, for_index, count, pos, stop);

done:
    for (Py_ssize_t i = 0; packers != NULL && i <= owner_count; i++)
        PyMem_Free(packers[i].data);
    PyMem_Free(packers);
    Py_XDECREF(cache.topic);
    Py_XDECREF(per_owner);
    Py_XDECREF(for_index);
    PyBuffer_Release(&view);
    return result;
}

/* The keys of a packed entry as a list of str (decode_replace). */
static PyObject *
packed_keys(const PackedEntry *e)
{
    PyObject *keys = PyList_New(e->key_count);
    const uint8_t *at = e->keys;
    for (int k = 0; keys != NULL && k < e->key_count; k++) {
        Py_ssize_t len = (Py_ssize_t)load_le(at, 2);
        PyObject *key = decode_replace(at + 2, len);
        if (key == NULL)
            Py_CLEAR(keys);
        else
            PyList_SET_ITEM(keys, k, key);
        at += 2 + len;
    }
    return keys;
}

/*
 * unpack_entry(packed, pos) -> (entry, next_pos)
 *
 * codec_py.unpack_entry: the packed entry at packed[pos:] as a DispatchEntry tuple.
 */
static PyObject *
codec_unpack_entry(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t pos;
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "unpack_entry(packed: bytes, pos)");
        return NULL;
    }
    if (ssize_arg(args[1], "pos", &pos) < 0)
        return NULL;
    PackedEntry e;
    if (packed_entry_at((const uint8_t *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), pos, &e) < 0)
        return NULL;
    PyObject *topic = PyUnicode_DecodeUTF8((const char *)e.topic, e.topic_len, "strict");
    PyObject *keys = topic ? packed_keys(&e) : NULL;
    PyObject *result = keys ? Py_BuildValue("((NiLLiLLN)n)", topic, (int)e.queue_id, (long long)e.queue_offset,
                                            (long long)e.commit_log_offset, (int)e.size, (long long)e.tags_code,
                                            (long long)e.store_timestamp, keys, e.next) : NULL;
    if (result == NULL && keys == NULL)
        Py_XDECREF(topic);
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
static PyObject *field_kwnames;        /* field_keys as a tuple: the keywords of pull_objects' factory calls */
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

/* str(HostAddress): "a.b.c.d:port" (socket.inet_ntoa and a signed port), or with an
 * IPv6 address of ip_len 16 "[v6]:port" (socket.inet_ntop, the same libc function),
 * at text, at most HOST_TEXT_MAX bytes; ip and port as stored. Returns the length. */
enum { HOST_TEXT_MAX = 60 };  /* "[" + INET6_ADDRSTRLEN - 1 (45) + "]:-2147483648" */

static int
format_host(char *text, const uint8_t *ip_port, int ip_len)
{
    int n = 0;
    if (ip_len == IPV6_BYTES) {
        text[n++] = '[';
        if (inet_ntop(AF_INET6, ip_port, text + n, INET6_ADDRSTRLEN) == NULL)
            text[n] = '\0';                          /* cannot happen with AF_INET6 and room */
        n += (int)strlen(text + n);
        text[n++] = ']';
        text[n++] = ':';
    } else {
        for (int i = 0; i < 4; i++) {
            n += format_uint(text + n, ip_port[i]);
            text[n++] = i < 3 ? '.' : ':';
        }
    }
    int32_t port = load_i32(ip_port + ip_len);
    if (port < 0)
        text[n++] = '-';
    n += format_uint(text + n, port < 0 ? 0u - (uint32_t)port : (uint32_t)port);
    return n;
}

static PyObject *
host_text(const uint8_t *ip_port, int ip_len)
{
    char text[HOST_TEXT_MAX + 4];
    return PyUnicode_DecodeASCII(text, format_host(text, ip_port, ip_len), NULL);
}

/* host_text with a one-entry cache per slot: the store host hardly ever changes,
 * and a born host repeats while one producer sends. */
static PyObject *
cached_host_text(int slot, const uint8_t *ip_port, int ip_len)
{
    static PyObject *texts[2];
    static uint8_t keys[2][IPV6_BYTES + 4];
    static int key_lens[2];
    if (texts[slot] == NULL || key_lens[slot] != ip_len + 4 || memcmp(keys[slot], ip_port, (size_t)ip_len + 4) != 0) {
        PyObject *text = host_text(ip_port, ip_len);
        if (text == NULL)
            return NULL;
        Py_XSETREF(texts[slot], text);
        memcpy(keys[slot], ip_port, (size_t)ip_len + 4);
        key_lens[slot] = ip_len + 4;
    }
    return Py_NewRef(texts[slot]);
}

/* layout.encode_msg_id: store ip (4, or 16 for IPv6), port (i32), commit log offset
 * (i64), as msg_id_chars(rec) uppercase hex digits at out. */
enum { MSG_ID_CHARS = 32, MSG_ID_V6_CHARS = 56 };

static inline int
msg_id_chars(const Layout *rec)
{
    return rec->store_ip_len == IPV6_BYTES ? MSG_ID_V6_CHARS : MSG_ID_CHARS;
}

static void
format_msg_id(uint8_t *out, const Layout *rec)
{
    static const char hex[] = "0123456789ABCDEF";
    uint8_t raw[MSG_ID_V6_CHARS / 2];
    int host_len = rec->store_ip_len + 4;
    memcpy(raw, rec->rec + rec->store_host_at, (size_t)host_len);  /* ip and port, already big-endian */
    memcpy(raw + host_len, rec->rec + AT_PHYSICAL_OFFSET, 8);
    for (int i = 0; i < host_len + 8; i++) {
        out[2 * i] = (uint8_t)hex[raw[i] >> 4];
        out[2 * i + 1] = (uint8_t)hex[raw[i] & 0xF];
    }
}

static PyObject *
msg_id_text(const Layout *rec)
{
    PyObject *text = PyUnicode_New(msg_id_chars(rec), 127);
    if (text == NULL)
        return NULL;
    format_msg_id(PyUnicode_1BYTE_DATA(text), rec);
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

/* The fields of a record that passed every check, in field_keys' order, as new references in
 * values (all NULL on entry); -1 with an exception set if one could not be made (the caller
 * releases what was). */
static int
view_values(const Layout *rec, PyObject *topic, PyObject **values)
{
    const uint8_t *r = rec->rec;
    Wanted wanted;

    values[F_PROPERTIES] = PyDict_New();
    if (values[F_PROPERTIES] == NULL
        || scan_properties(r + rec->props_at, rec->props_len, &wanted, values[F_PROPERTIES]) < 0)
        return -1;
    Py_INCREF(topic);
    values[F_TOPIC] = topic;
    values[F_QUEUE_ID] = PyLong_FromLong(load_i32(r + AT_QUEUE_ID));
    values[F_QUEUE_OFFSET] = PyLong_FromLongLong(load_i64(r + AT_QUEUE_OFFSET));
    values[F_COMMIT_LOG_OFFSET] = PyLong_FromLongLong(load_i64(r + AT_PHYSICAL_OFFSET));
    values[F_STORE_SIZE] = PyLong_FromSsize_t(rec->size);
    values[F_MSG_ID] = msg_id_text(rec);
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
    values[F_BORN_HOST] = cached_host_text(0, r + AT_BORN_IP, rec->born_ip_len);
    values[F_STORE_TIMESTAMP] = PyLong_FromLongLong(load_i64(r + rec->store_ts_at));
    values[F_STORE_HOST] = cached_host_text(1, r + rec->store_host_at, rec->store_ip_len);
    values[F_RECONSUME_TIMES] = PyLong_FromLong(load_i32(r + rec->reconsume_at));
    for (int i = 0; i < F_COUNT; i++)
        if (values[i] == NULL)
            return -1;
    return 0;
}

/* The reply map of a record that passed every check. */
static PyObject *
view_dict(const Layout *rec, PyObject *topic)
{
    PyObject *values[F_COUNT] = {NULL};
    PyObject *dict = NULL;
    if (view_values(rec, topic, values) < 0)
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
 *
 * Readers in other processes (engine/key_lookup.py states the protocol): the item's
 * fields are plain stores; its slot is a release store; the header's fields are stored
 * whole, then its count is a release store, the one point where an item is added. A
 * reader loads the count with acquire (index_header), then the slot with acquire
 * (index_select), and answers only items below that count.
 */
enum { INDEX_HEADER_BYTES = 40, INDEX_SLOT_BYTES = 4, INDEX_ITEM_BYTES = 20, INDEX_COUNT_AT = 36 };
/* In a page-aligned mapping every slot and the count are aligned words, and each 64-bit
 * header field an aligned double word: publish_u32 and acquire_u32 take their atomic path. */
_Static_assert(INDEX_HEADER_BYTES % 8 == 0 && INDEX_SLOT_BYTES == 4 && INDEX_COUNT_AT % 4 == 0
               && INDEX_COUNT_AT + 4 == INDEX_HEADER_BYTES, "IndexFile words must be naturally aligned");

/* An IndexFile's header while items are put: read once, published after every item. */
typedef struct {
    uint8_t *buf;
    long long slots, count_max, items_base;
    int64_t begin_ts, end_ts, begin_phy, end_phy;
    int32_t slots_used, count;
} IndexWriting;

/* Map buf as an index file of these dimensions (ValueError if it is smaller), its header read. */
static int
index_writing_open(IndexWriting *ix, Py_buffer *view, long long slots, long long count_max)
{
    ix->buf = (uint8_t *)view->buf;
    ix->slots = slots;
    ix->count_max = count_max;
    ix->items_base = INDEX_HEADER_BYTES + slots * INDEX_SLOT_BYTES;
    if (view->len < ix->items_base + count_max * INDEX_ITEM_BYTES) {
        PyErr_SetString(PyExc_ValueError, "the buffer is smaller than an index file of these dimensions");
        return -1;
    }
    uint8_t *buf = ix->buf;
    ix->begin_ts = load_i64(buf);
    ix->end_ts = load_i64(buf + 8);
    ix->begin_phy = load_i64(buf + 16);
    ix->end_phy = load_i64(buf + 24);
    ix->slots_used = load_i32(buf + 32);
    ix->count = load_i32(buf + 36);
    if (ix->count < 1)
        ix->count = 1;  /* item 0 is never used: 0 in a slot means an empty bucket */
    return 0;
}

/* One item for the key whose Java hash is h (IndexFile#putKey), then the header: the caller
 * checked that count < count_max. */
static void
index_put_one(IndexWriting *ix, uint32_t h, int64_t offset, int64_t store_ts)
{
    uint8_t *buf = ix->buf;
    /* indexKeyHashMethod: abs(hashCode), Integer.MIN_VALUE mapped to 0 */
    int32_t signed_hash = java_int(h);
    int32_t key_hash = signed_hash == INT32_MIN ? 0 : signed_hash < 0 ? -signed_hash : signed_hash;
    uint8_t *slot = buf + INDEX_HEADER_BYTES + (long long)(key_hash % ix->slots) * INDEX_SLOT_BYTES;
    int32_t previous = load_i32(slot);
    if (previous <= 0 || previous > ix->count)
        previous = 0;
    int64_t time_diff = 0;
    if (ix->begin_ts > 0 && store_ts > ix->begin_ts) {
        time_diff = (store_ts - ix->begin_ts) / 1000;  /* no overflow: both are positive here */
        if (time_diff > INT32_MAX)
            time_diff = INT32_MAX;
    }
    uint8_t *item = buf + ix->items_base + (long long)ix->count * INDEX_ITEM_BYTES;
    store_u32(item, (uint32_t)key_hash);
    store_u64(item + 4, (uint64_t)offset);
    store_u32(item + 12, (uint32_t)time_diff);
    store_u32(item + 16, (uint32_t)previous);
    publish_u32(slot, (uint32_t)ix->count);  /* the item above is complete for whoever sees this */
    if (ix->count <= 1) {
        ix->begin_phy = offset;
        ix->begin_ts = store_ts;
    }
    if (previous == 0)
        ix->slots_used++;
    ix->count++;
    ix->end_phy = offset;
    ix->end_ts = store_ts;
    store_whole_u64(buf, (uint64_t)ix->begin_ts);
    store_whole_u64(buf + 8, (uint64_t)ix->end_ts);
    store_whole_u64(buf + 16, (uint64_t)ix->begin_phy);
    store_whole_u64(buf + 24, (uint64_t)ix->end_phy);
    store_u32(buf + 32, (uint32_t)ix->slots_used);
    publish_u32(buf + INDEX_COUNT_AT, (uint32_t)ix->count);  /* the item is added */
}

/* Items for keys[first:] under prefix_hash (the Java hash of "topic#"), while the file has
 * room; how far it got in keys, -1 with an exception set for a key that is not a str. */
static Py_ssize_t
index_put_list(IndexWriting *ix, uint32_t prefix_hash, PyObject *keys, Py_ssize_t first, int64_t offset,
               int64_t store_ts)
{
    Py_ssize_t k = first, n = PyList_GET_SIZE(keys);
    for (; k < n && ix->count < ix->count_max; k++) {
        PyObject *key = PyList_GET_ITEM(keys, k);
        uint32_t h;
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "keys must be str");
            return -1;
        }
        if (java_hash_more(key, prefix_hash, &h) < 0)
            return -1;
        index_put_one(ix, h, offset, store_ts);
    }
    return k;
}

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
    IndexWriting ix;
    Py_ssize_t added = index_writing_open(&ix, &view, slots, count_max) < 0
        ? -1 : index_put_list(&ix, prefix_hash, keys, 0, offset, store_ts);
    PyBuffer_Release(&view);
    return added < 0 ? NULL : PyLong_FromSsize_t(added);
}

static PyObject *entry_names[4];  /* interned at import: topic, commit_log_offset, store_timestamp, keys */
static PyObject *window_start_name, *window_end_name;  /* interned at import */

/* A record to index: a DispatchEntry, or its fields as a tuple (the catch-up's). */
static int
index_entry_fields(PyObject *entry, PyObject **topic, long long *offset, long long *store_ts, PyObject **keys)
{
    PyObject *clo, *ts;
    if (PyTuple_Check(entry)) {
        if (PyTuple_GET_SIZE(entry) != 8) {
            PyErr_SetString(PyExc_TypeError, "an entry tuple has the 8 fields of a DispatchEntry");
            return -1;
        }
        *topic = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
        clo = Py_NewRef(PyTuple_GET_ITEM(entry, 3));
        ts = Py_NewRef(PyTuple_GET_ITEM(entry, 6));
        *keys = Py_NewRef(PyTuple_GET_ITEM(entry, 7));
    } else {
        *topic = PyObject_GetAttr(entry, entry_names[0]);
        clo = PyObject_GetAttr(entry, entry_names[1]);
        ts = PyObject_GetAttr(entry, entry_names[2]);
        *keys = PyObject_GetAttr(entry, entry_names[3]);
    }
    int rc = -1;
    if (*topic == NULL || clo == NULL || ts == NULL || *keys == NULL)
        goto done;
    if (!PyUnicode_Check(*topic) || !PyList_Check(*keys)) {
        PyErr_SetString(PyExc_TypeError, "an entry's topic must be a str and its keys a list of str");
        goto done;
    }
    if (int_arg(clo, LLONG_MIN, LLONG_MAX, "commit_log_offset", offset) < 0
        || int_arg(ts, LLONG_MIN, LLONG_MAX, "store_timestamp", store_ts) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(clo);
    Py_XDECREF(ts);
    if (rc < 0) {
        Py_CLEAR(*topic);
        Py_CLEAR(*keys);
    }
    return rc;
}

/* java_hash_more of UTF-8 bytes decoded with errors="replace" (ASCII hashed as it lies). */
static int
java_hash_utf8(const uint8_t *p, Py_ssize_t n, uint32_t h, uint32_t *out)
{
    Py_ssize_t i = 0;
    while (i < n && p[i] < 0x80)
        h = 31u * h + p[i++];
    if (i == n) {
        *out = h;
        return 0;
    }
    PyObject *rest = decode_replace(p + i, n - i);
    if (rest == NULL)
        return -1;
    int rc = java_hash_more(rest, h, out);
    Py_DECREF(rest);
    return rc;
}

/* index_put_records over packed entries: the cursor is a byte position in packed. */
static PyObject *
index_put_packed(IndexWriting *ix, PyObject *packed, Py_ssize_t pos, Py_ssize_t k, long long min_offset)
{
    const uint8_t *buf = (const uint8_t *)PyBytes_AS_STRING(packed);
    Py_ssize_t n = PyBytes_GET_SIZE(packed);
    const uint8_t *last_topic = NULL;
    Py_ssize_t last_len = -1;
    uint32_t prefix_hash = 0;
    for (; pos < n && ix->count < ix->count_max; k = 0) {
        PackedEntry e;
        if (packed_entry_at(buf, n, pos, &e) < 0)
            return NULL;
        if (e.commit_log_offset >= min_offset) {
            if (last_topic == NULL || last_len != e.topic_len || memcmp(last_topic, e.topic, (size_t)e.topic_len)) {
                if (java_hash_utf8(e.topic, e.topic_len, 0, &prefix_hash) < 0)
                    return NULL;
                prefix_hash = 31u * prefix_hash + '#';  /* "topic#": the hash goes on with each key */
                last_topic = e.topic;
                last_len = e.topic_len;
            }
            const uint8_t *at = e.keys;
            int key = 0;
            for (; key < e.key_count; key++) {
                Py_ssize_t len = (Py_ssize_t)load_le(at, 2);
                if (key >= k) {
                    if (ix->count >= ix->count_max)
                        break;
                    uint32_t h;
                    if (java_hash_utf8(at + 2, len, prefix_hash, &h) < 0)
                        return NULL;
                    index_put_one(ix, h, e.commit_log_offset, e.store_timestamp);
                }
                at += 2 + len;
            }
            if (key < e.key_count)  /* the file filled up inside this record */
                return Py_BuildValue("(ni)", pos, key);
        }
        pos = e.next;
    }
    return Py_BuildValue("(nn)", pos, pos >= n ? (Py_ssize_t)0 : k);
}

/*
 * index_put_records(buf, hash_slot_count, index_count_max, entries, entry, key, min_offset)
 *     -> (entry, key)
 *
 * index_put_keys for every record of entries (DispatchEntry, or its fields as tuples) from
 * entries[entry]'s keys[key:] on, skipping records below min_offset, while the file has room
 * below index_count_max: where it stopped, (len(entries), 0) when every record is in. The
 * records' items are put one by one as index_put_keys puts them. entries may also be
 * bytes of packed entries: entry is then a byte position in them (len(entries) at the end).
 */
static PyObject *
codec_index_put_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "index_put_records(buf, hash_slot_count, index_count_max, entries, entry, "
                                         "key, min_offset)");
        return NULL;
    }
    long long slots, count_max, first_entry, first_key, min_offset;
    if (int_arg(args[1], 1, INT32_MAX, "hash_slot_count", &slots) < 0
        || int_arg(args[2], 0, INT32_MAX, "index_count_max", &count_max) < 0
        || int_arg(args[4], 0, PY_SSIZE_T_MAX, "entry", &first_entry) < 0
        || int_arg(args[5], 0, PY_SSIZE_T_MAX, "key", &first_key) < 0
        || int_arg(args[6], LLONG_MIN, LLONG_MAX, "min_offset", &min_offset) < 0)
        return NULL;
    if (PyBytes_Check(args[3])) {
        Py_buffer pview;
        if (PyObject_GetBuffer(args[0], &pview, PyBUF_WRITABLE) < 0)
            return NULL;
        IndexWriting pix;
        PyObject *reached = index_writing_open(&pix, &pview, slots, count_max) < 0 ? NULL
            : index_put_packed(&pix, args[3], (Py_ssize_t)first_entry, (Py_ssize_t)first_key, min_offset);
        PyBuffer_Release(&pview);
        return reached;
    }
    PyObject *entries = PySequence_Fast(args[3], "entries must be a sequence");
    if (entries == NULL)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(entries);
        return NULL;
    }
    IndexWriting ix;
    PyObject *result = NULL, *last_topic = NULL;
    uint32_t prefix_hash = 0;
    Py_ssize_t e = (Py_ssize_t)first_entry, k = (Py_ssize_t)first_key, n = PySequence_Fast_GET_SIZE(entries);
    if (index_writing_open(&ix, &view, slots, count_max) < 0)
        goto done;
    for (; e < n && ix.count < ix.count_max; e++, k = 0) {
        PyObject *topic, *keys;
        long long offset, store_ts;
        if (index_entry_fields(PySequence_Fast_GET_ITEM(entries, e), &topic, &offset, &store_ts, &keys) < 0)
            goto done;
        Py_ssize_t reached = 0;
        if (offset >= min_offset) {
            if (last_topic == NULL || (topic != last_topic && PyUnicode_Compare(topic, last_topic) != 0)) {
                if (java_hash_more(topic, 0, &prefix_hash) < 0)
                    reached = -1;
                prefix_hash = 31u * prefix_hash + '#';  /* "topic#": the hash goes on with each key */
                Py_XSETREF(last_topic, Py_NewRef(topic));
            }
            if (reached == 0)
                reached = index_put_list(&ix, prefix_hash, keys, k, offset, store_ts);
        } else {
            reached = PyList_GET_SIZE(keys);
        }
        Py_ssize_t key_count = PyList_GET_SIZE(keys);
        Py_DECREF(topic);
        Py_DECREF(keys);
        if (reached < 0)
            goto done;
        if (reached < key_count) {  /* the file filled up inside this record */
            k = reached;
            break;
        }
    }
    if (e >= n)
        k = 0;
    result = Py_BuildValue("(nn)", e, k);
done:
    Py_XDECREF(last_topic);
    PyBuffer_Release(&view);
    Py_DECREF(entries);
    return result;
}

/* ------------------------------------------------------------------------ */
/* cq_put_packed (ConsumeQueue.put, a dispatch batch at a time)            */
/* ------------------------------------------------------------------------ */

/*
 * A ConsumeQueue unit (engine/layout.py CQ_UNIT, ">qiq"):
 *
 *   commit log offset i64 | size i32 | tags code i64     20 bytes, big-endian
 *
 * A queue's "window" is the part of its newest file whose blocks are reserved and which
 * its owner counts as written since the last flush (ConsumeQueue.window, window_start,
 * window_end: byte offsets in the queue). A unit is written here only when it is the
 * queue's next one, is not a replay and lies in the window; everything else (a new queue,
 * a gap, a replay, a new file, more blocks, a deleted topic) is ConsumeQueue.put's, in Python.
 */
enum { CQ_UNIT_BYTES = 20, CQ_CACHE = 16 };

typedef struct {
    PyObject *cq, *topic;           /* strong references */
    const char *topic_utf8;         /* the topic's UTF-8, held by topic */
    Py_ssize_t topic_utf8_len;
    long long queue_id, max_offset, max_physical_end, window_start, window_end;
    Py_buffer window;
    int has_window, wrote;
} CqState;

static PyObject *cq_names[3];  /* interned at import: a ConsumeQueue's attributes cq_state_load reads */
enum { CQN_MAX_OFFSET, CQN_MAX_PHYS, CQN_WINDOW };

static int
cq_long_attr(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL)
        return -1;
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The queue's state into st (its window mapped for writing if it has one); -1 on error. */
static int
cq_state_load(CqState *st, PyObject *cq, PyObject *topic, long long queue_id)
{
    memset(st, 0, sizeof(*st));
    st->cq = Py_NewRef(cq);
    st->topic = Py_NewRef(topic);
    st->queue_id = queue_id;
    if ((st->topic_utf8 = PyUnicode_AsUTF8AndSize(topic, &st->topic_utf8_len)) == NULL
        || cq_long_attr(cq, cq_names[CQN_MAX_OFFSET], &st->max_offset) < 0
        || cq_long_attr(cq, cq_names[CQN_MAX_PHYS], &st->max_physical_end) < 0
        || cq_long_attr(cq, window_start_name, &st->window_start) < 0
        || cq_long_attr(cq, window_end_name, &st->window_end) < 0)
        return -1;
    PyObject *window = PyObject_GetAttr(cq, cq_names[CQN_WINDOW]);
    if (window == NULL)
        return -1;
    if (window != Py_None && st->window_end > st->window_start) {
        if (PyObject_GetBuffer(window, &st->window, PyBUF_WRITABLE) == 0) {
            st->has_window = st->window.len >= st->window_end - st->window_start;
            if (!st->has_window)
                PyBuffer_Release(&st->window);
        } else {
            PyErr_Clear();  /* unmapped since (closed): ConsumeQueue.put maps it again */
        }
    }
    Py_DECREF(window);
    return 0;
}

/* What the writes changed back into the queue and touched; releases st. -1 if that failed. */
static int
cq_state_store(CqState *st, PyObject *touched)
{
    int rc = 0;
    if (st->wrote) {
        PyObject *max_offset = PyLong_FromLongLong(st->max_offset);
        PyObject *max_phys = PyLong_FromLongLong(st->max_physical_end);
        if (max_offset == NULL || max_phys == NULL
            || PyObject_SetAttr(st->cq, cq_names[CQN_MAX_OFFSET], max_offset) < 0
            || PyObject_SetAttr(st->cq, cq_names[CQN_MAX_PHYS], max_phys) < 0
            || PySet_Add(touched, st->cq) < 0)
            rc = -1;
        Py_XDECREF(max_offset);
        Py_XDECREF(max_phys);
    }
    if (st->has_window)
        PyBuffer_Release(&st->window);
    Py_CLEAR(st->cq);
    Py_CLEAR(st->topic);
    return rc;
}

/* The state of (topic, queue_id) in cache, the topic given by its UTF-8 bytes (tb, tn), loaded
 * from queues on first sight (the str decoded then only); NULL when the queue is not in queues
 * or the cache is full (no error), or with *failed set. */
static CqState *
cq_lookup(CqState *cache, int *cached, PyObject *queues, const uint8_t *tb, Py_ssize_t tn, long long queue_id,
          int *failed)
{
    for (int c = 0; c < *cached; c++) {
        if (cache[c].queue_id == queue_id && cache[c].topic_utf8_len == tn
            && memcmp(cache[c].topic_utf8, tb, (size_t)tn) == 0)
            return &cache[c];
    }
    if (*cached >= CQ_CACHE)
        return NULL;
    PyObject *name = PyUnicode_DecodeUTF8((const char *)tb, tn, "strict");
    PyObject *key = name ? Py_BuildValue("(OL)", name, queue_id) : NULL;
    PyObject *cq = key ? PyDict_GetItemWithError(queues, key) : NULL;  /* borrowed */
    Py_XDECREF(key);
    CqState *st = NULL;
    if (cq != NULL) {
        st = &cache[(*cached)++];  /* released by the caller, even when loading it failed */
        if (cq_state_load(st, cq, name, queue_id) < 0) {
            *failed = 1;
            st = NULL;
        }
    } else if (PyErr_Occurred()) {
        *failed = 1;
    }
    Py_XDECREF(name);
    return st;
}

/* Write the unit if it is the queue's next one in its window: 0 when it is left to
 * ConsumeQueue.put (st NULL: not in queues, or the cache is full). */
static int
cq_write_unit(CqState *st, long long queue_offset, long long clo, long long size, long long tags_code)
{
    long long at = queue_offset * CQ_UNIT_BYTES;
    if (st == NULL || !st->has_window || queue_offset != st->max_offset || clo + size <= st->max_physical_end
        || at < st->window_start || at + CQ_UNIT_BYTES > st->window_end || size < 0 || size > INT32_MAX)
        return 0;
    uint8_t *unit = (uint8_t *)st->window.buf + (at - st->window_start);
    store_u64(unit, (uint64_t)clo);
    store_u32(unit + 8, (uint32_t)size);
    store_u64(unit + 12, (uint64_t)tags_code);
    st->max_offset = queue_offset + 1;
    st->max_physical_end = clo + size;
    st->wrote = 1;
    return 1;
}

/* Store every cached state back (the units written stay counted, also after a failure);
 * result, or NULL when something failed. */
static PyObject *
cq_finish(CqState *cache, int cached, PyObject *touched, int failed, PyObject *result)
{
    for (int c = 0; c < cached; c++) {
        if (failed) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            cq_state_store(&cache[c], touched);
            PyErr_Restore(type, value, traceback);
        } else if (cq_state_store(&cache[c], touched) < 0) {
            failed = 1;
        }
    }
    if (failed)
        Py_XDECREF(result);
    return failed ? NULL : result;
}

/*
 * cq_put_packed(packed, pos, min_offset, queues, touched) -> int
 *
 * ConsumeQueue.put for the packed entries of packed[pos:] (topic, queue_id, queue_offset,
 * commit_log_offset, size, tags_code), records below min_offset skipped, while each is the
 * next unit of a queue of queues ({(topic, queue_id): ConsumeQueue}) and lies in its window.
 * Returns the position of the first entry it left to ConsumeQueue.put (len(packed) when
 * none); the queues it wrote to have their max_offset and max_physical_end moved and are
 * added to touched (a set). ValueError for an entry that runs past the end: the units
 * written before it stay counted.
 */
static PyObject *
codec_cq_put_packed(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyDict_Check(args[3]) || !PySet_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "cq_put_packed(packed: bytes, pos, min_offset, queues: dict, touched: set)");
        return NULL;
    }
    long long first, min_offset;
    if (int_arg(args[1], 0, PY_SSIZE_T_MAX, "pos", &first) < 0
        || int_arg(args[2], LLONG_MIN, LLONG_MAX, "min_offset", &min_offset) < 0)
        return NULL;
    const uint8_t *buf = (const uint8_t *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]), pos = (Py_ssize_t)first;
    CqState cache[CQ_CACHE];
    int cached = 0, failed = 0;
    while (pos < n) {
        PackedEntry e;
        if (packed_entry_at(buf, n, pos, &e) < 0) {
            failed = 1;
            break;
        }
        if (e.commit_log_offset >= min_offset) {
            CqState *st = cq_lookup(cache, &cached, args[3], e.topic, e.topic_len, e.queue_id, &failed);
            if (failed || !cq_write_unit(st, e.queue_offset, e.commit_log_offset, e.size, e.tags_code))
                break;  /* ConsumeQueue.put's */
        }
        pos = e.next;
    }
    return cq_finish(cache, cached, args[4], failed, failed ? NULL : PyLong_FromSsize_t(pos));
}

/* index_header(buf): the six header fields, the count loaded with acquire first. */
static PyObject *
codec_index_header(PyObject *Py_UNUSED(module), PyObject *buffer)
{
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len < INDEX_HEADER_BYTES) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the buffer is smaller than an index header");
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)view.buf;
    int32_t count = (int32_t)acquire_u32(buf + INDEX_COUNT_AT);
    PyObject *header = Py_BuildValue("(LLLLii)", (long long)load_whole_i64(buf), (long long)load_whole_i64(buf + 8),
                                     (long long)load_whole_i64(buf + 16), (long long)load_whole_i64(buf + 24),
                                     (int)load_i32(buf + 32), (int)count);
    PyBuffer_Release(&view);
    return header;
}

/*
 * index_select(buf, hash_slot_count, index_count_max, index_count, key_hash, begin_ts, count_max,
 *              begin_ms, end_ms):
 * the commit log offsets of the items in key_hash's chain, newest first (IndexFile#selectPhyOffset).
 *
 * index_count and begin_ts come from a header the caller loaded with index_header (the count
 * with acquire) before this call: only items below index_count are answered, all of them
 * complete. The slot is loaded with acquire after that count, so it leads to every counted
 * item of its bucket; an item at or past index_count (added after that header, or
 * half-added by a killed builder) is not answered, its time does not end the walk, and only
 * its prev is followed (the slot's release made it readable). The walk is bounded by the
 * file's capacity and by prev links that go strictly back.
 */
static PyObject *
codec_index_select(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "index_select(buf, hash_slot_count, index_count_max, index_count, key_hash, "
                                         "begin_ts, count_max, begin_ms, end_ms)");
        return NULL;
    }
    long long slots, count_max, counted, key_hash, begin_ts, found_max, begin_ms, end_ms;
    if (int_arg(args[1], 1, INT32_MAX, "hash_slot_count", &slots) < 0
        || int_arg(args[2], 0, INT32_MAX, "index_count_max", &count_max) < 0
        || int_arg(args[3], LLONG_MIN, LLONG_MAX, "index_count", &counted) < 0
        || int_arg(args[4], 0, INT32_MAX, "key_hash", &key_hash) < 0
        || int_arg(args[5], LLONG_MIN / 2, LLONG_MAX / 2, "begin_ts", &begin_ts) < 0
        || int_arg(args[6], 0, INT32_MAX, "count_max", &found_max) < 0
        || int_arg(args[7], LLONG_MIN, LLONG_MAX, "begin_ms", &begin_ms) < 0
        || int_arg(args[8], LLONG_MIN, LLONG_MAX, "end_ms", &end_ms) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    long long items_base = INDEX_HEADER_BYTES + slots * INDEX_SLOT_BYTES;
    if (view.len < items_base + count_max * INDEX_ITEM_BYTES) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the buffer is smaller than an index file of these dimensions");
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)view.buf;
    PyObject *found = PyList_New(0);
    if (found == NULL)
        goto done;
    int32_t item = (int32_t)acquire_u32(buf + INDEX_HEADER_BYTES + (key_hash % slots) * INDEX_SLOT_BYTES);
    for (long long steps = 0; item > 0 && item < count_max && PyList_GET_SIZE(found) < found_max
                              && steps < count_max; steps++) {
        const uint8_t *at = buf + items_base + (long long)item * INDEX_ITEM_BYTES;
        int32_t prev = load_i32(at + 16);
        if (item < counted) {
            int32_t item_hash = load_i32(at), time_diff = load_i32(at + 12);
            int64_t offset = load_i64(at + 4);
            long long stored_ms = begin_ts + (long long)time_diff * 1000;
            if (item_hash == key_hash && begin_ms <= stored_ms && stored_ms <= end_ms) {
                PyObject *value = PyLong_FromLongLong(offset);
                if (value == NULL || PyList_Append(found, value) < 0) {
                    Py_XDECREF(value);
                    Py_CLEAR(found);
                    goto done;
                }
                Py_DECREF(value);
            }
            if (stored_ms < begin_ms)
                break;
        }
        if (prev <= 0 || prev >= item)
            break;
        item = prev;
    }
done:
    PyBuffer_Release(&view);
    return found;
}

/* ------------------------------------------------------------------------ */
/* pull_run: msgpack message maps straight from the log                     */
/* ------------------------------------------------------------------------ */

/*
 * The maps are written as msgspec.msgpack.Encoder().encode(read_view(...))
 * writes them (tests/unit/test_codec.py checks the forms against msgspec):
 * every int in its smallest form (positive fixint, uint 8/16/32/64 when
 * non-negative; negative fixint, int 8/16/32/64 when negative), str as
 * fixstr/str8/str16/str32, bytes as bin8/bin16/bin32, None as nil, lists as
 * fixarray/array16/array32 and dicts as fixmap/map16/map32.
 */

enum { BLANK_UNIT_SIZE = 0x7FFFFFFF };  /* CQ_UNIT_BYTES: cq_put_packed */

static inline uint8_t *
mp_int(uint8_t *w, int64_t v)
{
    if (v >= 0) {
        if (v < 0x80) {
            *w++ = (uint8_t)v;
        } else if (v <= UINT8_MAX) {
            *w++ = 0xcc;
            *w++ = (uint8_t)v;
        } else if (v <= UINT16_MAX) {
            *w++ = 0xcd;
            store_u16(w, (uint16_t)v);
            w += 2;
        } else if (v <= (int64_t)UINT32_MAX) {
            *w++ = 0xce;
            store_u32(w, (uint32_t)v);
            w += 4;
        } else {
            *w++ = 0xcf;
            store_u64(w, (uint64_t)v);
            w += 8;
        }
    } else if (v >= -32) {
        *w++ = (uint8_t)v;                           /* negative fixint 0xe0..0xff */
    } else if (v >= INT8_MIN) {
        *w++ = 0xd0;
        *w++ = (uint8_t)v;
    } else if (v >= INT16_MIN) {
        *w++ = 0xd1;
        store_u16(w, (uint16_t)v);
        w += 2;
    } else if (v >= INT32_MIN) {
        *w++ = 0xd2;
        store_u32(w, (uint32_t)v);
        w += 4;
    } else {
        *w++ = 0xd3;
        store_u64(w, (uint64_t)v);
        w += 8;
    }
    return w;
}

/* A header of one of msgpack's families: fix (below fix_limit), 8-bit (when code8
 * is not 0), 16-bit or 32-bit length. */
static inline uint8_t *
mp_header(uint8_t *w, size_t n, uint8_t fix, size_t fix_limit, uint8_t code8, uint8_t code16, uint8_t code32)
{
    if (n < fix_limit) {
        *w++ = (uint8_t)(fix | n);
    } else if (code8 != 0 && n <= UINT8_MAX) {
        *w++ = code8;
        *w++ = (uint8_t)n;
    } else if (n <= UINT16_MAX) {
        *w++ = code16;
        store_u16(w, (uint16_t)n);
        w += 2;
    } else {
        *w++ = code32;
        store_u32(w, (uint32_t)n);
        w += 4;
    }
    return w;
}

static inline uint8_t *
mp_str(uint8_t *w, const uint8_t *p, size_t n)
{
    w = mp_header(w, n, 0xa0, 32, 0xd9, 0xda, 0xdb);
    memcpy(w, p, n);
    return w + n;
}

static inline uint8_t *
mp_bin(uint8_t *w, const uint8_t *p, size_t n)
{
    w = mp_header(w, n, 0, 0, 0xc4, 0xc5, 0xc6);
    memcpy(w, p, n);
    return w + n;
}

static inline uint8_t *mp_array(uint8_t *w, size_t n) { return mp_header(w, n, 0x90, 16, 0, 0xdc, 0xdd); }
static inline uint8_t *mp_map(uint8_t *w, size_t n) { return mp_header(w, n, 0x80, 16, 0, 0xde, 0xdf); }

/* A field name (a literal shorter than 32 bytes) as a fixstr. */
#define MP_KEY(w, literal)                                                  \
    do {                                                                    \
        *(w)++ = (uint8_t)(0xa0 | (sizeof(literal) - 1));                   \
        memcpy((w), (literal), sizeof(literal) - 1);                        \
        (w) += sizeof(literal) - 1;                                         \
    } while (0)

/* Strict UTF-8, exactly what bytes.decode("utf-8") accepts: no overlong forms,
 * no surrogates, nothing past U+10FFFF. */
static int
utf8_valid(const uint8_t *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t chunk;
            memcpy(&chunk, p + i, 8);
            if ((chunk & 0x8080808080808080ULL) == 0) {
                i += 8;
                continue;
            }
        }
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t more;
        uint8_t lo = 0x80, hi = 0xBF;                /* bounds of the second byte */
        if (c >= 0xC2 && c <= 0xDF) {
            more = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0)
                lo = 0xA0;                           /* overlong */
            else if (c == 0xED)
                hi = 0x9F;                           /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0)
                lo = 0x90;                           /* overlong */
            else if (c == 0xF4)
                hi = 0x8F;                           /* past U+10FFFF */
        } else {
            return 0;
        }
        if (n - i <= more || p[i + 1] < lo || p[i + 1] > hi)
            return 0;
        for (Py_ssize_t k = 2; k <= more; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
        i += more + 1;
    }
    return 1;
}

/* A kept property entry (layout.decode_properties): a non-empty name before the
 * first \x01, a non-empty value after it. */
typedef struct {
    const uint8_t *name, *value;
    Py_ssize_t name_len, value_len;
} Prop;

enum { PROP_USER = 0, PROP_TAGS, PROP_KEYS, PROP_CRC };

static inline int
prop_kind(const Prop *e)
{
    if (name_is(e->name, e->name_len, "TAGS"))
        return PROP_TAGS;
    if (name_is(e->name, e->name_len, "KEYS"))
        return PROP_KEYS;
    if (name_is(e->name, e->name_len, "__CRC32#"))
        return PROP_CRC;
    return PROP_USER;
}

static int
prop_name_cmp(const void *a, const void *b)
{
    const Prop *x = a, *y = b;
    if (x->name_len != y->name_len)
        return x->name_len < y->name_len ? -1 : 1;
    return memcmp(x->name, y->name, (size_t)x->name_len);
}

/* The entries of a properties block, grown as records need (at most one entry in
 * every 3 bytes, plus one). */
typedef struct {
    Prop stack[32];
    Prop *items;        /* stack or heap */
    Prop *sorted;       /* heap scratch for the duplicate check of many entries, or NULL */
    Py_ssize_t cap, count;
} Props;

static void
props_release(Props *props)
{
    if (props->items != props->stack)
        PyMem_Free(props->items);
    PyMem_Free(props->sorted);
}

/*
 * codec_py._plain_text and the entries read_view maps: 1 when the block is
 * UTF-8 and names no property twice, with its kept entries in props; 0 when
 * the run stops here; -1 on MemoryError.
 */
static int
plain_properties(const uint8_t *p, Py_ssize_t n, Props *props)
{
    if (!utf8_valid(p, n))
        return 0;
    Py_ssize_t most = n / 3 + 1;
    if (most > props->cap) {
        Prop *items = PyMem_Malloc((size_t)most * sizeof(Prop));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (props->items != props->stack)
            PyMem_Free(props->items);
        PyMem_Free(props->sorted);
        props->sorted = NULL;
        props->items = items;
        props->cap = most;
    }
    Py_ssize_t count = 0, start = 0;
    while (start < n) {
        const uint8_t *entry = p + start;
        const uint8_t *stop = memchr(entry, PROPERTY_SEPARATOR, (size_t)(n - start));
        Py_ssize_t entry_len = stop ? stop - entry : n - start;
        const uint8_t *sep = memchr(entry, NAME_VALUE_SEPARATOR, (size_t)entry_len);
        start += entry_len + 1;
        if (sep == NULL || sep == entry || sep + 1 == entry + entry_len)
            continue;
        Prop *e = &props->items[count++];
        e->name = entry;
        e->name_len = sep - entry;
        e->value = sep + 1;
        e->value_len = entry_len - e->name_len - 1;
    }
    props->count = count;
    if (count <= 16) {
        for (Py_ssize_t i = 1; i < count; i++)
            for (Py_ssize_t j = 0; j < i; j++)
                if (prop_name_cmp(&props->items[i], &props->items[j]) == 0)
                    return 0;
        return 1;
    }
    if (props->sorted == NULL && (props->sorted = PyMem_Malloc((size_t)props->cap * sizeof(Prop))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(props->sorted, props->items, (size_t)count * sizeof(Prop));
    qsort(props->sorted, (size_t)count, sizeof(Prop), prop_name_cmp);
    for (Py_ssize_t i = 1; i < count; i++)
        if (prop_name_cmp(&props->sorted[i], &props->sorted[i - 1]) == 0)
            return 0;
    return 1;
}

/* How many parts Record.keys has: the value split on ' ', without empty parts. */
static Py_ssize_t
count_keys(const uint8_t *p, Py_ssize_t n)
{
    Py_ssize_t parts = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        parts += p[i] != KEY_SEPARATOR && (i == 0 || p[i - 1] == KEY_SEPARATOR);
    return parts;
}

/* The most bytes one message map can take: the fixed fields (names, ints, msg_id,
 * hosts) take under 512, the topic and body their length plus a header, and the
 * properties block at most 8 bytes per byte (UNIQ_KEY twice, a header per part). */
static inline Py_ssize_t
map_bound(const Layout *rec)
{
    return 1024 + rec->size + 8 * rec->props_len;
}

/* A host's text, formatted again only when the host changes: the store host never
 * does within a segment, and a born host repeats while one producer sends. */
typedef struct {
    uint8_t ip_port[IPV6_BYTES + 4];
    int ip_len;
    int len;            /* 0: nothing formatted yet */
    char text[HOST_TEXT_MAX + 4];
} HostCache;

static inline uint8_t *
mp_host(uint8_t *w, HostCache *cache, const uint8_t *ip_port, int ip_len)
{
    if (cache->len == 0 || cache->ip_len != ip_len || memcmp(cache->ip_port, ip_port, (size_t)ip_len + 4) != 0) {
        cache->len = format_host(cache->text, ip_port, ip_len);
        memcpy(cache->ip_port, ip_port, (size_t)ip_len + 4);
        cache->ip_len = ip_len;
    }
    return mp_str(w, (const uint8_t *)cache->text, (size_t)cache->len);
}

/* The message map of a record that passed every check (read_view's dict, encoded);
 * hosts[0] caches the born host's text, hosts[1] the store host's. */
static uint8_t *
write_map(uint8_t *w, const Layout *rec, const Props *props, HostCache *hosts)
{
    const uint8_t *r = rec->rec;
    const Prop *tags = NULL, *keys = NULL, *uniq = NULL;
    Py_ssize_t user = 0;
    for (Py_ssize_t i = 0; i < props->count; i++) {
        const Prop *e = &props->items[i];
        switch (prop_kind(e)) {
        case PROP_TAGS:
            tags = e;
            break;
        case PROP_KEYS:
            keys = e;
            break;
        case PROP_CRC:
            break;
        default:
            user++;
            if (name_is(e->name, e->name_len, "UNIQ_KEY"))
                uniq = e;
        }
    }
    *w++ = 0xde;                                     /* map16 of F_COUNT entries */
    store_u16(w, F_COUNT);
    w += 2;
    MP_KEY(w, "topic");
    w = mp_str(w, r + rec->topic_at, (size_t)rec->topic_len);
    MP_KEY(w, "queue_id");
    w = mp_int(w, load_i32(r + AT_QUEUE_ID));
    MP_KEY(w, "queue_offset");
    w = mp_int(w, load_i64(r + AT_QUEUE_OFFSET));
    MP_KEY(w, "commit_log_offset");
    w = mp_int(w, load_i64(r + AT_PHYSICAL_OFFSET));
    MP_KEY(w, "store_size");
    w = mp_int(w, rec->size);
    MP_KEY(w, "msg_id");
    *w++ = 0xd9;                                     /* str8: 32 characters, 56 with IPv6 */
    *w++ = (uint8_t)msg_id_chars(rec);
    format_msg_id(w, rec);
    w += msg_id_chars(rec);
    MP_KEY(w, "body");
    w = mp_bin(w, r + rec->body_at, (size_t)rec->body_len);
    MP_KEY(w, "body_crc");
    w = mp_int(w, load_i32(r + AT_BODY_CRC));
    MP_KEY(w, "tags");
    if (tags != NULL)
        w = mp_str(w, tags->value, (size_t)tags->value_len);
    else
        *w++ = 0xc0;
    MP_KEY(w, "keys");
    if (keys == NULL) {
        *w++ = 0x90;
    } else {
        const uint8_t *p = keys->value;
        Py_ssize_t n = keys->value_len, start = 0;
        w = mp_array(w, (size_t)count_keys(p, n));
        while (start < n) {
            const uint8_t *part = p + start;
            const uint8_t *stop = memchr(part, KEY_SEPARATOR, (size_t)(n - start));
            Py_ssize_t part_len = stop ? stop - part : n - start;
            start += part_len + 1;
            if (part_len > 0)
                w = mp_str(w, part, (size_t)part_len);
        }
    }
    MP_KEY(w, "uniq_key");
    if (uniq != NULL)
        w = mp_str(w, uniq->value, (size_t)uniq->value_len);
    else
        *w++ = 0xc0;
    MP_KEY(w, "properties");
    w = mp_map(w, (size_t)user);
    for (Py_ssize_t i = 0; i < props->count; i++) {
        const Prop *e = &props->items[i];
        if (prop_kind(e) != PROP_USER)
            continue;
        w = mp_str(w, e->name, (size_t)e->name_len);
        w = mp_str(w, e->value, (size_t)e->value_len);
    }
    MP_KEY(w, "flag");
    w = mp_int(w, load_i32(r + AT_FLAG));
    MP_KEY(w, "sys_flag");
    w = mp_int(w, load_i32(r + AT_SYS_FLAG));
    MP_KEY(w, "born_timestamp");
    w = mp_int(w, load_i64(r + AT_BORN_TS));
    MP_KEY(w, "born_host");
    w = mp_host(w, &hosts[0], r + AT_BORN_IP, rec->born_ip_len);
    MP_KEY(w, "store_timestamp");
    w = mp_int(w, load_i64(r + rec->store_ts_at));
    MP_KEY(w, "store_host");
    w = mp_host(w, &hosts[1], r + rec->store_host_at, rec->store_ip_len);
    MP_KEY(w, "reconsume_times");
    w = mp_int(w, load_i32(r + rec->reconsume_at));
    return w;
}

/* The message of a record that passed every check, built by factory(**fields): the
 * fields of read_view's dict, keys a tuple with tuple_keys. */
static PyObject *
build_object(PyObject *factory, const Layout *rec, PyObject *topic, int tuple_keys)
{
    PyObject *values[F_COUNT] = {NULL};
    PyObject *result = NULL;
    if (view_values(rec, topic, values) < 0)
        goto done;
    if (tuple_keys) {
        PyObject *keys = PyList_AsTuple(values[F_KEYS]);
        Py_SETREF(values[F_KEYS], keys);
        if (keys == NULL)
            goto done;
    }
    result = PyObject_Vectorcall(factory, values, 0, field_kwnames);
done:
    for (int i = 0; i < F_COUNT; i++)
        Py_XDECREF(values[i]);
    return result;
}

/* A Python int for comparisons only: exact within the i64 range, else beyond
 * +-2**100, further than any sum of the in-range values it is compared with. */
typedef __int128 wide;

static int
wide_arg(PyObject *obj, const char *what, wide *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = overflow == 0 ? (wide)v : (wide)overflow * ((wide)1 << 100);
    return 0;
}

/*
 * The output's first capacity, from the units alone: about each record's size plus
 * MAP_EXTRA_BYTES for the units that can be taken (plausible, within the byte
 * budget and, all together, within twice the segment), so that the maps are
 * written without regrowing the buffer. A guess, at most FIRST_CAPACITY_MAX:
 * the run grows the buffer when short.
 */
enum { MAP_EXTRA_BYTES = 384, FIRST_CAPACITY_MAX = 16 << 20 };

static Py_ssize_t
first_capacity(const uint8_t *units, long long unit_count, Py_ssize_t segment_len, wide taken, wide over)
{
    wide sum = 0, cap = 4096;
    for (long long i = 0; i < unit_count; i++) {
        const uint8_t *unit = units + i * CQ_UNIT_BYTES;
        int32_t size = load_i32(unit + 8);
        if (size < MIN_RECORD_BYTES || size > segment_len || load_i64(unit) < 0
            || (taken + sum > 0 && over + sum + size > 0))
            break;
        sum += size;
        cap += size + MAP_EXTRA_BYTES;
        if (sum > segment_len || cap >= FIRST_CAPACITY_MAX)
            break;
    }
    return (Py_ssize_t)(cap < FIRST_CAPACITY_MAX ? cap : FIRST_CAPACITY_MAX);
}

/*
 * pull_run(units, units_pos, unit_count, segment, segment_start, visible_end, log_min,
 *          topic, queue_id, queue_offset, max_bytes, taken_bytes, require_record_crc)
 *     -> (maps, count, taken_bytes)
 *
 * codec_py.pull_run: the concatenated msgpack maps of the ConsumeQueue units
 * from units[units_pos:] while each passes, stopping before the first that
 * does not (the reference's docstring lists why). The checks that only decide
 * where the run stops come in the cheapest order: the unit, the record's
 * structure, its identity, its CRCs, its properties. ValueError when the units
 * do not lie in units; TypeError on arguments of the wrong type.
 */
static PyObject *pull_units(PyObject *const *args, PyObject *factory, int tuple_keys);

static PyObject *
codec_pull_run(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "pull_run() takes 13 arguments (%zd given)", nargs);
        return NULL;
    }
    return pull_units(args, NULL, 0);
}

/*
 * pull_objects(factory, tuple_keys, units, units_pos, unit_count, segment, segment_start,
 *              visible_end, log_min, topic, queue_id, queue_offset, max_bytes, taken_bytes,
 *              require_record_crc) -> (messages, count, taken_bytes)
 *
 * codec_py.pull_objects: pull_run's run, each message built straight into
 * factory(**fields) (a list of them) rather than encoded: the reader's own objects
 * without the encode and the decode between.
 */
static PyObject *
codec_pull_objects(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 15) {
        PyErr_Format(PyExc_TypeError, "pull_objects() takes 15 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyCallable_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "factory must be callable, not %.100s", Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    int tuple_keys = PyObject_IsTrue(args[1]);
    if (tuple_keys < 0)
        return NULL;
    return pull_units(args + 2, args[0], tuple_keys);
}

/* pull_run's and pull_objects' walk: maps into bytes without a factory, else objects into a list. */
static PyObject *
pull_units(PyObject *const *args, PyObject *factory, int tuple_keys)
{
    Py_ssize_t units_pos;
    long long unit_count;
    wide segment_start, visible_end, log_min, queue_id, queue_offset, taken, over;
    PyObject *topic = args[7], *taken_obj = args[11];
    if (ssize_arg(args[1], "units_pos", &units_pos) < 0 || clamped_arg(args[2], &unit_count) < 0
        || wide_arg(args[4], "segment_start", &segment_start) < 0
        || wide_arg(args[5], "visible_end", &visible_end) < 0 || wide_arg(args[6], "log_min", &log_min) < 0
        || wide_arg(args[8], "queue_id", &queue_id) < 0 || wide_arg(args[9], "queue_offset", &queue_offset) < 0
        || wide_arg(args[10], "max_bytes", &over) < 0 || wide_arg(taken_obj, "taken_bytes", &taken) < 0)
        return NULL;
    if (!PyUnicode_Check(topic)) {
        PyErr_Format(PyExc_TypeError, "topic must be a str, not %.100s", Py_TYPE(topic)->tp_name);
        return NULL;
    }
    int require_record_crc = PyObject_IsTrue(args[12]);
    if (require_record_crc < 0)
        return NULL;
    /* taken_bytes + size > max_bytes, exactly: (taken_bytes - max_bytes) + size > 0 */
    PyObject *diff = PyNumber_Subtract(taken_obj, args[10]);
    if (diff == NULL)
        return NULL;
    int rc = wide_arg(diff, "taken_bytes - max_bytes", &over);
    Py_DECREF(diff);
    if (rc < 0)
        return NULL;

    Py_buffer units_view, segment_view;
    if (PyObject_GetBuffer(args[0], &units_view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &segment_view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&units_view);
        return NULL;
    }
    PyObject *out = NULL, *result = NULL;
    Props props = {.count = 0};
    props.items = props.stack;
    props.cap = (Py_ssize_t)(sizeof props.stack / sizeof props.stack[0]);
    if (unit_count > 0 && (units_pos < 0 || units_pos > units_view.len
                           || unit_count > (units_view.len - units_pos) / CQ_UNIT_BYTES)) {
        PyErr_Format(PyExc_ValueError, "%lld units at %zd do not lie in a buffer of %zd bytes",
                     unit_count, units_pos, units_view.len);
        goto done;
    }
    Py_ssize_t topic_len = 0;
    const char *topic_utf8 = PyUnicode_AsUTF8AndSize(topic, &topic_len);
    if (topic_utf8 == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            goto done;
        PyErr_Clear();                               /* a lone surrogate: no record's topic equals it */
        unit_count = 0;
    }

    const uint8_t *units = (const uint8_t *)units_view.buf + (unit_count > 0 ? units_pos : 0);
    const uint8_t *segment = segment_view.buf;
    Py_ssize_t segment_len = segment_view.len;
    Py_ssize_t cap = factory ? 0 : first_capacity(units, unit_count, segment_len, taken, over), len = 0;
    out = factory ? PyList_New(0) : PyBytes_FromStringAndSize(NULL, cap);
    if (out == NULL)
        goto done;
    wide sum = 0;                                    /* the sizes taken */
    HostCache hosts[2] = {{.len = 0}, {.len = 0}};
    long long count = 0;
    for (; count < unit_count; count++) {
        const uint8_t *unit = units + count * CQ_UNIT_BYTES;
        int64_t offset = load_i64(unit);
        int32_t size = load_i32(unit + 8);
        if (size <= 0 || size >= BLANK_UNIT_SIZE || offset < 0)
            break;
        wide at = (wide)offset - segment_start;
        if (at < 0 || at + size > segment_len || (wide)offset + size > visible_end || offset < log_min)
            break;
        if (taken + sum > 0 && over + sum + size > 0)
            break;
        Py_ssize_t pos = (Py_ssize_t)at;
        Layout rec;
        /* read_view with limit min(len(segment), visible_end - segment_start) passes only
         * records of the unit's size here, all of which lie inside pos + size */
        if (check_layout(segment, pos, pos + size, 1, offset, &rec) < 0 || rec.size != size
            || load_i32(rec.rec + AT_QUEUE_ID) != queue_id
            || load_i64(rec.rec + AT_QUEUE_OFFSET) != queue_offset + count
            || rec.topic_len != topic_len || memcmp(rec.rec + rec.topic_at, topic_utf8, (size_t)topic_len) != 0
            || verify_crcs(&rec, require_record_crc) < 0)
            break;
        int plain = plain_properties(rec.rec + rec.props_at, rec.props_len, &props);
        if (plain < 0)
            goto done;
        if (plain == 0)
            break;
        if (factory != NULL) {
            PyObject *message = build_object(factory, &rec, topic, tuple_keys);
            int rc = message ? PyList_Append(out, message) : -1;
            Py_XDECREF(message);
            if (rc < 0)
                goto done;
            sum += size;
            continue;
        }
        Py_ssize_t need = map_bound(&rec);
        if (need > cap - len) {
            Py_ssize_t grown = cap > PY_SSIZE_T_MAX / 2 ? PY_SSIZE_T_MAX : 2 * cap;
            cap = grown - len < need ? len + need : grown;
            if (_PyBytes_Resize(&out, cap) < 0)
                goto done;
        }
        uint8_t *start = (uint8_t *)PyBytes_AS_STRING(out) + len;
        len += write_map(start, &rec, &props, hosts) - start;
        sum += size;
    }
    if (factory == NULL && _PyBytes_Resize(&out, len) < 0)
        goto done;
    PyObject *total;
    if (count == 0) {
        total = Py_NewRef(taken_obj);
    } else {
        PyObject *added = PyLong_FromLongLong((long long)sum);  /* at most count * 2**31 */
        total = added ? PyNumber_Add(taken_obj, added) : NULL;
        Py_XDECREF(added);
    }
    if (total != NULL) {
        result = Py_BuildValue("(OLN)", out, count, total);
    }

done:
    Py_XDECREF(out);
    props_release(&props);
    PyBuffer_Release(&segment_view);
    PyBuffer_Release(&units_view);
    return result;
}

/* ------------------------------------------------------------------------ */
/* build_items and send_results: the writer's per-message work              */
/* ------------------------------------------------------------------------ */

static PyObject *s_body, *s_properties, *s_tags, *s_keys, *s_flag, *s_born_timestamp;

static int
intern_writer_names(void)
{
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_body, "body"}, {&s_properties, "properties"}, {&s_tags, "tags"}, {&s_keys, "keys"},
        {&s_flag, "flag"}, {&s_born_timestamp, "born_timestamp"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
            return -1;
    return 0;
}

static inline int
has_separator(const char *p, Py_ssize_t n)
{
    return memchr(p, NAME_VALUE_SEPARATOR, (size_t)n) != NULL || memchr(p, PROPERTY_SEPARATOR, (size_t)n) != NULL;
}

/* The UTF-8 of a str argument; NULL with TypeError for anything else. */
static const char *
utf8_of(PyObject *text, Py_ssize_t *len)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "message texts must be str");
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(text, len);
}

static inline char *
put_text(char *out, const char *p, Py_ssize_t n)
{
    memcpy(out, p, (size_t)n);
    return out + n;
}

/* One message's parts, as pass one found them for pass two. */
typedef struct {
    PyObject *body, *properties, *tags, *keys, *flag, *born;
    const char *tags_at;
    Py_ssize_t tags_len;
    int has_uniq;
} Parts;

static void
release_parts(Parts *m)
{
    Py_XDECREF(m->body);
    Py_XDECREF(m->properties);
    Py_XDECREF(m->tags);
    Py_XDECREF(m->keys);
    Py_XDECREF(m->flag);
    Py_XDECREF(m->born);
}

/*
 * Pass one over one message: fetch its fields and check every rule of
 * codec_py.build_items; the encoded properties' size in *size.
 * 1 when the message passes, 0 when it is refused, -1 on an error.
 */
static int
check_message(PyObject *message, long long body_max, PyObject *uniq, Parts *m, Py_ssize_t *size)
{
    m->body = PyObject_GetAttr(message, s_body);
    m->properties = m->body ? PyObject_GetAttr(message, s_properties) : NULL;
    m->tags = m->properties ? PyObject_GetAttr(message, s_tags) : NULL;
    m->keys = m->tags ? PyObject_GetAttr(message, s_keys) : NULL;
    m->flag = m->keys ? PyObject_GetAttr(message, s_flag) : NULL;
    m->born = m->flag ? PyObject_GetAttr(message, s_born_timestamp) : NULL;
    if (m->born == NULL)
        return -1;
    if (!PyBytes_Check(m->body) || !PyDict_Check(m->properties) || !(PyList_Check(m->keys) || PyTuple_Check(m->keys))) {
        PyErr_SetString(PyExc_TypeError, "a message needs bytes body, dict properties and list (or tuple) keys");
        return -1;
    }
    Py_ssize_t body_len = PyBytes_GET_SIZE(m->body);
    if (body_len == 0 || body_len > body_max)
        return 0;
    Py_ssize_t total = 0, at = 0;
    PyObject *name, *value;
    m->has_uniq = 0;
    while (PyDict_Next(m->properties, &at, &name, &value)) {
        Py_ssize_t name_len, value_len;
        const char *n = utf8_of(name, &name_len);
        const char *v = n ? utf8_of(value, &value_len) : NULL;
        if (v == NULL)
            return -1;
        if (name_len == 0 || value_len == 0 || name_is((const uint8_t *)n, name_len, "KEYS")
            || name_is((const uint8_t *)n, name_len, "TAGS") || name_is((const uint8_t *)n, name_len, "__CRC32#")
            || has_separator(n, name_len) || has_separator(v, value_len))
            return 0;
        m->has_uniq |= name_is((const uint8_t *)n, name_len, "UNIQ_KEY");
        total += name_len + value_len + 2;
    }
    m->tags_at = NULL;
    m->tags_len = 0;
    if (m->tags != Py_None) {
        m->tags_at = utf8_of(m->tags, &m->tags_len);
        if (m->tags_at == NULL)
            return -1;
        if (has_separator(m->tags_at, m->tags_len))
            return 0;
        if (m->tags_len > 0)
            total += 5 + m->tags_len + 1;             /* TAGS \x01 tags \x02 */
    }
    Py_ssize_t key_count = PySequence_Fast_GET_SIZE(m->keys);
    for (Py_ssize_t k = 0; k < key_count; k++) {
        Py_ssize_t key_len;
        const char *key = utf8_of(PySequence_Fast_GET_ITEM(m->keys, k), &key_len);
        if (key == NULL)
            return -1;
        if (key_len == 0 || memchr(key, KEY_SEPARATOR, (size_t)key_len) != NULL || has_separator(key, key_len))
            return 0;
        total += key_len + (k > 0);                   /* the keys joined by spaces */
    }
    if (key_count > 0)
        total += 5 + 1;                               /* KEYS \x01 ... \x02 */
    if (!m->has_uniq) {
        Py_ssize_t uniq_len;
        if (utf8_of(uniq, &uniq_len) == NULL)
            return -1;
        total += 9 + uniq_len + 1;                    /* UNIQ_KEY \x01 id \x02 */
    }
    *size = total;
    return 1;
}

/* Pass two: write the encoded properties of a message that passed, into out (size bytes). */
static void
write_properties(const Parts *m, PyObject *uniq, char *out)
{
    Py_ssize_t at = 0, len;
    PyObject *name, *value;
    while (PyDict_Next(m->properties, &at, &name, &value)) {
        const char *n = PyUnicode_AsUTF8AndSize(name, &len);  /* cached by pass one */
        out = put_text(out, n, len);
        *out++ = NAME_VALUE_SEPARATOR;
        const char *v = PyUnicode_AsUTF8AndSize(value, &len);
        out = put_text(out, v, len);
        *out++ = PROPERTY_SEPARATOR;
    }
    if (m->tags_len > 0) {
        out = put_text(out, "TAGS\x01", 5);
        out = put_text(out, m->tags_at, m->tags_len);
        *out++ = PROPERTY_SEPARATOR;
    }
    Py_ssize_t key_count = PySequence_Fast_GET_SIZE(m->keys);
    if (key_count > 0) {
        out = put_text(out, "KEYS\x01", 5);
        for (Py_ssize_t k = 0; k < key_count; k++) {
            if (k > 0)
                *out++ = KEY_SEPARATOR;
            const char *key = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(m->keys, k), &len);
            out = put_text(out, key, len);
        }
        *out++ = PROPERTY_SEPARATOR;
    }
    if (!m->has_uniq) {
        const char *id = PyUnicode_AsUTF8AndSize(uniq, &len);
        out = put_text(out, "UNIQ_KEY\x01", 9);
        out = put_text(out, id, len);
        *out++ = PROPERTY_SEPARATOR;
    }
}

/* build_items(messages, body_bytes_max, properties_bytes_max, uniq_keys, now_ms)
 * -> (items, payload_bytes) or (None, index of the first refused message). */
static PyObject *
codec_build_items(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "build_items(messages, body_bytes_max, properties_bytes_max, uniq_keys, now_ms)");
        return NULL;
    }
    long long body_max, properties_max;
    PyObject *messages = args[0], *uniq_keys = args[3], *now = args[4];
    if (int_arg(args[1], 0, LLONG_MAX, "body_bytes_max", &body_max) < 0
        || int_arg(args[2], 0, LLONG_MAX, "properties_bytes_max", &properties_max) < 0)
        return NULL;
    if (!PyList_Check(messages) || !PyList_Check(uniq_keys) || !PyLong_Check(now)) {
        PyErr_SetString(PyExc_TypeError, "messages and uniq_keys must be lists and now_ms an int");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(messages);
    if (PyList_GET_SIZE(uniq_keys) < count) {
        PyErr_SetString(PyExc_ValueError, "one uniq key per message is needed");
        return NULL;
    }
    PyObject *items = PyList_New(count);
    if (items == NULL)
        return NULL;
    long long payload = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Parts m = {0};
        Py_ssize_t size = 0;
        PyObject *uniq = PyList_GET_ITEM(uniq_keys, i);
        int ok = check_message(PyList_GET_ITEM(messages, i), body_max, uniq, &m, &size);
        if (ok == 1 && size + CRC_TAIL_BYTES > properties_max)
            ok = 0;
        if (ok != 1) {
            release_parts(&m);
            Py_DECREF(items);
            return ok < 0 ? NULL : Py_BuildValue("(On)", Py_None, i);
        }
        PyObject *encoded = PyBytes_FromStringAndSize(NULL, size);
        PyObject *item = NULL;
        if (encoded != NULL) {
            write_properties(&m, uniq, PyBytes_AS_STRING(encoded));
            item = PyTuple_Pack(4, m.body, encoded, m.flag, m.born == Py_None ? now : m.born);
            Py_DECREF(encoded);
        }
        payload += PyBytes_GET_SIZE(m.body) + size;
        release_parts(&m);
        if (item == NULL) {
            Py_DECREF(items);
            return NULL;
        }
        PyList_SET_ITEM(items, i, item);
    }
    PyObject *result = Py_BuildValue("(NL)", items, payload);
    return result;
}

static const char HEX_DIGITS[] = "0123456789ABCDEF";

/* The message id of counter ``seq`` into id (at least prefix_len + 20 bytes): prefix, the counter's
 * high 32 bits, the clock's low 32 bits, the counter's low 16 bits, in upper-case hex; its length. */
static Py_ssize_t
format_uniq_key(char *id, const char *prefix, Py_ssize_t prefix_len, unsigned long long seq, long long now)
{
    memcpy(id, prefix, (size_t)prefix_len);
    char *tail = id + prefix_len;
    uint32_t high = (uint32_t)(seq >> 16), clock = (uint32_t)now;
    for (int d = 0; d < 8; d++) {
        tail[d] = HEX_DIGITS[(high >> (28 - 4 * d)) & 0xF];
        tail[8 + d] = HEX_DIGITS[(clock >> (28 - 4 * d)) & 0xF];
    }
    for (int d = 0; d < 4; d++)
        tail[16 + d] = HEX_DIGITS[(seq >> (12 - 4 * d)) & 0xF];
    return prefix_len + 20;
}

/* ------------------------------------------------------------------------ */
/* Batches the client encodes: RocketMQ's MessageBatch body                 */
/* ------------------------------------------------------------------------ */

/*
 * MessageDecoder.encodeMessages, each message in turn (big-endian):
 *
 *   0  TOTALSIZE i32    4  MAGICCODE i32 (0)    8  BODYCRC i32 (0)    12 FLAG i32
 *   16 BODYLEN i32, BODY, PROPLEN u16, PROPERTIES "name\x01value\x02..."
 *
 * TOTALSIZE = 22 + BODYLEN + PROPLEN. MAGICCODE and BODYCRC are written 0 and
 * not read: the writer computes the record's CRCs itself, as RocketMQ's broker does.
 */
enum { BATCH_AT_FLAG = 12, BATCH_AT_BODY_LEN = 16, BATCH_AT_BODY = 20, BATCH_FIXED_BYTES = 22 };

static int
name_in(const uint8_t *name, Py_ssize_t len, PyObject *names)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *n = PyTuple_GET_ITEM(names, i);
        if (PyBytes_GET_SIZE(n) == len && memcmp(PyBytes_AS_STRING(n), name, (size_t)len) == 0)
            return 1;
    }
    return 0;
}

/* A KEYS value: keys joined by single spaces, none empty. */
static int
keys_ok(const uint8_t *v, Py_ssize_t n)
{
    if (v[0] == KEY_SEPARATOR || v[n - 1] == KEY_SEPARATOR)
        return 0;
    for (Py_ssize_t i = 1; i < n; i++)
        if (v[i] == KEY_SEPARATOR && v[i - 1] == KEY_SEPARATOR)
            return 0;
    return 1;
}

/*
 * A client's encoded properties: entries name\x01value\x02 to the last byte, each name and
 * value non-empty, no \x01 in a value, no name twice, none of ``refused`` nor __CRC32#,
 * KEYS' keys non-empty, and the whole valid UTF-8. 1 if they pass (*has_uniq: one is
 * UNIQ_KEY), 0 if not, -1 on an error.
 */
static int
client_properties_ok(const uint8_t *p, Py_ssize_t n, PyObject *refused, int *has_uniq)
{
    enum { PAIRWISE_MAX = 32 };
    const uint8_t *names[PAIRWISE_MAX];
    Py_ssize_t name_lens[PAIRWISE_MAX];
    Py_ssize_t count = 0, at = 0;
    PyObject *seen = NULL;  /* the names, once there are more than PAIRWISE_MAX */
    int ok = 0;
    *has_uniq = 0;
    while (at < n) {
        const uint8_t *name = p + at;
        const uint8_t *end = memchr(name, PROPERTY_SEPARATOR, (size_t)(n - at));
        const uint8_t *sep = end ? memchr(name, NAME_VALUE_SEPARATOR, (size_t)(end - name)) : NULL;
        if (sep == NULL)
            goto done;
        Py_ssize_t name_len = sep - name, value_len = end - sep - 1;
        if (name_len == 0 || value_len == 0 || memchr(sep + 1, NAME_VALUE_SEPARATOR, (size_t)value_len) != NULL
            || name_is(name, name_len, "__CRC32#") || name_in(name, name_len, refused)
            || (name_is(name, name_len, "KEYS") && !keys_ok(sep + 1, value_len)))
            goto done;
        *has_uniq |= name_is(name, name_len, "UNIQ_KEY");
        if (count < PAIRWISE_MAX) {
            for (Py_ssize_t i = 0; i < count; i++)
                if (name_lens[i] == name_len && memcmp(names[i], name, (size_t)name_len) == 0)
                    goto done;
            names[count] = name;
            name_lens[count] = name_len;
        } else {
            if (seen == NULL) {
                if ((seen = PySet_New(NULL)) == NULL)
                    return -1;
                for (Py_ssize_t i = 0; i < PAIRWISE_MAX; i++) {
                    PyObject *b = PyBytes_FromStringAndSize((const char *)names[i], name_lens[i]);
                    if (b == NULL || PySet_Add(seen, b) < 0) {
                        Py_XDECREF(b);
                        ok = -1;
                        goto done;
                    }
                    Py_DECREF(b);
                }
            }
            PyObject *b = PyBytes_FromStringAndSize((const char *)name, name_len);
            int dup = b ? PySet_Contains(seen, b) : -1;
            if (dup == 0)
                dup = PySet_Add(seen, b) < 0 ? -1 : 0;
            Py_XDECREF(b);
            if (dup != 0) {
                ok = dup < 0 ? -1 : 0;
                goto done;
            }
        }
        count++;
        at = end - p + 1;
    }
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            ok = -1;
            goto done;
        }
        PyErr_Clear();
        goto done;
    }
    Py_DECREF(text);
    ok = 1;
done:
    Py_XDECREF(seen);
    return ok;
}

/* batch_items(records, body_bytes_max, properties_bytes_max, uniq_prefix, uniq_first_seq, now_ms,
 *             born_timestamp_ms, refused_names) -> (items, payload_bytes) or (None, index) */
static PyObject *
codec_batch_items(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "batch_items(records, body_bytes_max, properties_bytes_max, uniq_prefix, "
                                         "uniq_first_seq, now_ms, born_timestamp_ms, refused_names)");
        return NULL;
    }
    long long body_max, properties_max, first, now;
    Py_ssize_t prefix_len;
    PyObject *born = args[6], *refused = args[7];
    const char *prefix = utf8_of(args[3], &prefix_len);
    if (prefix == NULL || int_arg(args[1], 0, LLONG_MAX, "body_bytes_max", &body_max) < 0
        || int_arg(args[2], 0, LLONG_MAX, "properties_bytes_max", &properties_max) < 0
        || int_arg(args[4], 0, LLONG_MAX / 2, "uniq_first_seq", &first) < 0
        || int_arg(args[5], LLONG_MIN, LLONG_MAX, "now_ms", &now) < 0)
        return NULL;
    if (prefix_len > 44 || !PyLong_Check(born) || !PyTuple_Check(refused)) {
        PyErr_SetString(PyExc_TypeError, "uniq_prefix is at most 44 bytes, born_timestamp_ms an int and "
                                         "refused_names a tuple of bytes");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(refused); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(refused, i))) {
            PyErr_SetString(PyExc_TypeError, "refused_names must be a tuple of bytes");
            return NULL;
        }
    Py_buffer in;
    if (PyObject_GetBuffer(args[0], &in, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *p = in.buf;
    Py_ssize_t pos = 0, index = 0;
    long long payload = 0;
    PyObject *result = NULL, *items = PyList_New(0);
    if (items == NULL)
        goto done;
    for (; pos < in.len || index == 0; index++) {
        Py_ssize_t left = in.len - pos;
        if (left < BATCH_FIXED_BYTES)
            goto refused;
        int64_t total = load_i32(p + pos), body_len = load_i32(p + pos + BATCH_AT_BODY_LEN);
        if (total > left || body_len <= 0 || body_len > body_max || body_len > total - BATCH_FIXED_BYTES)
            goto refused;
        const uint8_t *body = p + pos + BATCH_AT_BODY, *props = body + body_len + 2;
        Py_ssize_t props_len = load_u16(body + body_len);
        if (BATCH_FIXED_BYTES + body_len + props_len != total)
            goto refused;
        int has_uniq, ok = client_properties_ok(props, props_len, refused, &has_uniq);
        if (ok < 0)
            goto done;
        Py_ssize_t size = props_len + (has_uniq ? 0 : 9 + prefix_len + 20 + 1);
        if (ok == 0 || size + CRC_TAIL_BYTES > properties_max)
            goto refused;
        PyObject *encoded = PyBytes_FromStringAndSize(NULL, size);
        if (encoded == NULL)
            goto done;
        char *out = put_text(PyBytes_AS_STRING(encoded), (const char *)props, props_len);
        if (!has_uniq) {
            out = put_text(out, "UNIQ_KEY\x01", 9);
            out += format_uniq_key(out, prefix, prefix_len, (unsigned long long)(first + index), now);
            *out = PROPERTY_SEPARATOR;
        }
        PyObject *item = Py_BuildValue("(y#NiO)", (const char *)body, (Py_ssize_t)body_len, encoded,
                                       (int)load_i32(p + pos + BATCH_AT_FLAG), born);
        if (item == NULL || PyList_Append(items, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
        payload += body_len + size;
        pos += (Py_ssize_t)total;
    }
    result = Py_BuildValue("(OL)", items, payload);
    goto done;
refused:
    result = Py_BuildValue("(On)", Py_None, index);
done:
    Py_XDECREF(items);
    PyBuffer_Release(&in);
    return result;
}

/* batch_records(messages, uniq_prefix, first_counter) -> (records, uniq_keys) or (None, index) */
static PyObject *
codec_batch_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "batch_records(messages, uniq_prefix, first_counter)");
        return NULL;
    }
    long long first;
    Py_ssize_t prefix_len;
    PyObject *messages = args[0];
    const char *prefix = utf8_of(args[1], &prefix_len);
    if (prefix == NULL || int_arg(args[2], 0, LLONG_MAX / 2, "first_counter", &first) < 0)
        return NULL;
    if (!PyList_Check(messages) || prefix_len > 44) {
        PyErr_SetString(PyExc_TypeError, "messages must be a list and uniq_prefix at most 44 bytes");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(messages), done_parts = 0, i;
    Parts *parts = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Parts));
    Py_ssize_t *sizes = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Py_ssize_t));
    PyObject *keys = PyList_New(count), *records = NULL, *result = NULL;
    if (parts == NULL || sizes == NULL || keys == NULL) {
        if (keys != NULL)
            PyErr_NoMemory();
        goto done;
    }
    int64_t total = 0;
    for (i = 0; i < count; i++) {
        char id[64];
        memcpy(id, prefix, (size_t)prefix_len);
        for (int d = 0; d < 16; d++)
            id[prefix_len + d] = HEX_DIGITS[((unsigned long long)(first + i) >> (60 - 4 * d)) & 0xF];
        PyObject *uniq = PyUnicode_FromStringAndSize(id, prefix_len + 16);
        if (uniq == NULL)
            goto done;
        PyList_SET_ITEM(keys, i, uniq);
        done_parts = i + 1;
        int ok = check_message(PyList_GET_ITEM(messages, i), LLONG_MAX, uniq, &parts[i], &sizes[i]);
        if (ok < 0)
            goto done;
        long long flag = 0;
        if (ok == 1 && PyLong_Check(parts[i].flag)) {
            int overflow;
            flag = PyLong_AsLongLongAndOverflow(parts[i].flag, &overflow);
            if (flag == -1 && PyErr_Occurred())
                goto done;
            ok = !overflow && flag >= INT32_MIN && flag <= INT32_MAX;
        } else {
            ok = 0;
        }
        if (ok == 0 || sizes[i] > UINT16_MAX || PyBytes_GET_SIZE(parts[i].body) > INT32_MAX - UINT16_MAX) {
            result = Py_BuildValue("(On)", Py_None, i);
            goto done;
        }
        if (parts[i].has_uniq) {  /* the message's own id is its result's */
            PyObject *own = PyDict_GetItemString(parts[i].properties, "UNIQ_KEY");
            Py_INCREF(own);
            PyList_SET_ITEM(keys, i, own);
            Py_DECREF(uniq);
        }
        total += BATCH_FIXED_BYTES + PyBytes_GET_SIZE(parts[i].body) + sizes[i];
    }
    if (total > PY_SSIZE_T_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "the batch is too large");
        goto done;
    }
    records = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (records == NULL)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(records);
    for (i = 0; i < count; i++) {
        Parts *m = &parts[i];
        Py_ssize_t body_len = PyBytes_GET_SIZE(m->body);
        long long flag = PyLong_AsLongLong(m->flag);  /* in range: pass one checked */
        store_u32(out, (uint32_t)(BATCH_FIXED_BYTES + body_len + sizes[i]));
        memset(out + 4, 0, 8);
        store_u32(out + BATCH_AT_FLAG, (uint32_t)flag);
        store_u32(out + BATCH_AT_BODY_LEN, (uint32_t)body_len);
        memcpy(out + BATCH_AT_BODY, PyBytes_AS_STRING(m->body), (size_t)body_len);
        out += BATCH_AT_BODY + body_len;
        store_u16(out, (uint16_t)sizes[i]);
        write_properties(m, PyList_GET_ITEM(keys, i), (char *)out + 2);
        out += 2 + sizes[i];
    }
    result = Py_BuildValue("(OO)", records, keys);
done:
    for (i = 0; i < done_parts; i++)
        release_parts(&parts[i]);
    PyMem_Free(parts);
    PyMem_Free(sizes);
    Py_XDECREF(keys);
    Py_XDECREF(records);
    return result;
}

/* send_results(offsets, queue_id, first_queue_offset, store_timestamp_ms, msg_id_prefix, status,
 * status_code) -> bytes: the msgpack array of one SendResult map per offset, as msgspec encodes
 * codec_py.send_results' list (field order of engine/ipc/protocol.py: SendResult). */
static PyObject *
codec_send_results(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "send_results(offsets, queue_id, first_queue_offset, store_timestamp_ms, "
                                         "msg_id_prefix, status, status_code)");
        return NULL;
    }
    PyObject *offsets = args[0];
    long long queue_id, first, store_ts, status_code;
    if (int_arg(args[1], LLONG_MIN, LLONG_MAX, "queue_id", &queue_id) < 0
        || int_arg(args[2], 0, LLONG_MAX, "first_queue_offset", &first) < 0
        || int_arg(args[3], LLONG_MIN, LLONG_MAX, "store_timestamp_ms", &store_ts) < 0
        || int_arg(args[6], LLONG_MIN, LLONG_MAX, "status_code", &status_code) < 0)
        return NULL;
    if (!PyList_Check(offsets)) {
        PyErr_SetString(PyExc_TypeError, "offsets must be a list");
        return NULL;
    }
    Py_ssize_t prefix_len, status_len;
    const char *prefix = utf8_of(args[4], &prefix_len);
    const char *status = prefix ? utf8_of(args[5], &status_len) : NULL;
    if (status == NULL)
        return NULL;
    if (prefix_len > 48 || status_len > 64) {  /* an IPv6 store host's prefix is 40 */
        PyErr_SetString(PyExc_ValueError, "msg_id_prefix is at most 48 bytes and status at most 64");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(offsets);
    /* per map at most: its header, the seven keys (82 bytes), the status, status_code (9),
     * msg_id (64 + 2) and four more ints (9 each) */
    Py_ssize_t per_map = 1 + 82 + (2 + status_len) + 9 + (2 + 64) + 4 * 9;
    if (count > (PY_SSIZE_T_MAX - 8) / per_map) {
        PyErr_SetString(PyExc_ValueError, "too many offsets");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 5 + count * per_map);
    if (out == NULL)
        return NULL;
    static const char hex[] = "0123456789ABCDEF";
    uint8_t id[64];
    memcpy(id, prefix, (size_t)prefix_len);
    uint8_t *start = (uint8_t *)PyBytes_AS_STRING(out), *w = mp_array(start, (size_t)count);
    for (Py_ssize_t i = 0; i < count; i++) {
        long long offset;
        if (int_arg(PyList_GET_ITEM(offsets, i), 0, LLONG_MAX, "an offset", &offset) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        for (int d = 0; d < 16; d++)
            id[prefix_len + d] = (uint8_t)hex[((unsigned long long)offset >> (60 - 4 * d)) & 0xF];
        w = mp_map(w, 7);
        MP_KEY(w, "status");
        w = mp_str(w, (const uint8_t *)status, (size_t)status_len);
        MP_KEY(w, "status_code");
        w = mp_int(w, status_code);
        MP_KEY(w, "msg_id");
        w = mp_str(w, id, (size_t)prefix_len + 16);
        MP_KEY(w, "queue_id");
        w = mp_int(w, queue_id);
        MP_KEY(w, "queue_offset");
        w = mp_int(w, first + i);
        MP_KEY(w, "commit_log_offset");
        w = mp_int(w, offset);
        MP_KEY(w, "store_timestamp");
        w = mp_int(w, store_ts);
    }
    if (_PyBytes_Resize(&out, w - start) < 0)
        return NULL;
    return out;
}

/* uniq_keys(prefix, first_seq, count, now_ms) -> list[str]: MessageClientIDSetter-shaped ids,
 * prefix (12 hex digits of ip and pid) + hex8(seq >> 16) + hex8(now) + hex4(seq). */
static PyObject *
codec_uniq_keys(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "uniq_keys(prefix, first_seq, count, now_ms)");
        return NULL;
    }
    long long first, count, now;
    Py_ssize_t prefix_len;
    const char *prefix = utf8_of(args[0], &prefix_len);
    if (prefix == NULL || int_arg(args[1], 0, LLONG_MAX / 2, "first_seq", &first) < 0
        || int_arg(args[2], 0, PY_SSIZE_T_MAX / 8, "count", &count) < 0
        || int_arg(args[3], LLONG_MIN, LLONG_MAX, "now_ms", &now) < 0)
        return NULL;
    if (prefix_len > 44) {  /* 12 for an IPv4 host, 36 for an IPv6 one */
        PyErr_SetString(PyExc_ValueError, "prefix is at most 44 bytes");
        return NULL;
    }
    char id[64];
    PyObject *keys = PyList_New((Py_ssize_t)count);
    if (keys == NULL)
        return NULL;
    for (long long i = 0; i < count; i++) {
        Py_ssize_t len = format_uniq_key(id, prefix, prefix_len, (unsigned long long)(first + i), now);
        PyObject *key = PyUnicode_FromStringAndSize(id, len);
        if (key == NULL) {
            Py_DECREF(keys);
            return NULL;
        }
        PyList_SET_ITEM(keys, (Py_ssize_t)i, key);
    }
    return keys;
}

static PyMethodDef codec_methods[] = {
    {"java_hash", codec_java_hash, METH_O, "Java String.hashCode as a signed 32-bit int."},
    {"owner_index", (PyCFunction)(void (*)(void))codec_owner_index, METH_FASTCALL,
     "Which ConsumeQueue owner holds (topic, queue_id): CRC-32 of topic/queue_id."},
    {"encode_records", (PyCFunction)(void (*)(void))codec_encode_records, METH_FASTCALL,
     "Encode a batch of records for one queue at buf[pos:] (see engine/codec_py.py)."},
    {"scan_dispatch", (PyCFunction)(void (*)(void))codec_scan_dispatch, METH_FASTCALL,
     "Parse records from buf[pos:limit] for dispatch, without CRC checks (see engine/codec_py.py)."},
    {"uniq_keys", (PyCFunction)(void (*)(void))codec_uniq_keys, METH_FASTCALL,
     "MessageClientIDSetter-shaped message ids for a run of counters (see engine/codec_py.py)."},
    {"build_items", (PyCFunction)(void (*)(void))codec_build_items, METH_FASTCALL,
     "Validate a batch of SendMessages and encode their properties (see engine/codec_py.py)."},
    {"batch_items", (PyCFunction)(void (*)(void))codec_batch_items, METH_FASTCALL,
     "Check a client's encoded batch and take its items for encode_records (see engine/codec_py.py)."},
    {"batch_records", (PyCFunction)(void (*)(void))codec_batch_records, METH_FASTCALL,
     "A batch of messages encoded as RocketMQ's MessageBatch body (see engine/codec_py.py)."},
    {"send_results", (PyCFunction)(void (*)(void))codec_send_results, METH_FASTCALL,
     "The msgpack array of one SendResult map per stored record (see engine/codec_py.py)."},
    {"index_put_keys", (PyCFunction)(void (*)(void))codec_index_put_keys, METH_FASTCALL,
     "IndexFile#putKey for each topic#key; returns how many were added (see engine/codec_py.py)."},
    {"cq_put_packed", (PyCFunction)(void (*)(void))codec_cq_put_packed, METH_FASTCALL,
     "cq_put_packed(packed, pos, min_offset, queues, touched) -> int: ConsumeQueue.put for the packed entries "
     "that are their queue's next unit in its window; the position of the first left to it"},
    {"unpack_entry", (PyCFunction)(void (*)(void))codec_unpack_entry, METH_FASTCALL,
     "unpack_entry(packed, pos) -> (entry, next_pos): a packed dispatch entry as a DispatchEntry tuple"},
    {"index_put_records", (PyCFunction)(void (*)(void))codec_index_put_records, METH_FASTCALL,
     "index_put_records(buf, hash_slot_count, index_count_max, entries, entry, key, min_offset) -> (entry, key): "
     "index_put_keys for the records from entries[entry].keys[key:], while the file has room"},
    {"index_header", (PyCFunction)codec_index_header, METH_O,
     "The IndexFile header's six fields, the count loaded with acquire (see engine/codec_py.py)."},
    {"index_select", (PyCFunction)(void (*)(void))codec_index_select, METH_FASTCALL,
     "Commit log offsets of a key hash's chain below a header's count, newest first (see engine/codec_py.py)."},
    {"read_view", (PyCFunction)(void (*)(void))codec_read_view, METH_FASTCALL,
     "The record at buf[pos:] as a reply's message map; None if it fails any check."},
    {"pull_objects", (PyCFunction)(void (*)(void))codec_pull_objects, METH_FASTCALL,
     "pull_objects(factory, tuple_keys, units, ...) -> (messages, count, taken_bytes): pull_run's run, built by "
     "factory"},
    {"pull_run", (PyCFunction)(void (*)(void))codec_pull_run, METH_FASTCALL,
     "The plain run of an unfiltered pull as concatenated msgpack maps (see engine/codec_py.py)."},
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
    if (field_kwnames == NULL) {
        field_kwnames = PyTuple_New(F_COUNT);
        if (field_kwnames == NULL)
            return NULL;
        for (int i = 0; i < F_COUNT; i++)
            PyTuple_SET_ITEM(field_kwnames, i, Py_NewRef(field_keys[i]));
    }
    if (uniq_key_name == NULL && (uniq_key_name = PyUnicode_InternFromString("UNIQ_KEY")) == NULL)
        return NULL;
    static const char *const entry_fields[4] = {"topic", "commit_log_offset", "store_timestamp", "keys"};
    for (int i = 0; i < 4; i++)
        if (entry_names[i] == NULL && (entry_names[i] = PyUnicode_InternFromString(entry_fields[i])) == NULL)
            return NULL;
    static const char *const cq_fields[3] = {"max_offset", "max_physical_end", "window"};
    for (int i = 0; i < 3; i++)
        if (cq_names[i] == NULL && (cq_names[i] = PyUnicode_InternFromString(cq_fields[i])) == NULL)
            return NULL;
    if (window_start_name == NULL && (window_start_name = PyUnicode_InternFromString("window_start")) == NULL)
        return NULL;
    if (window_end_name == NULL && (window_end_name = PyUnicode_InternFromString("window_end")) == NULL)
        return NULL;
    if (intern_writer_names() < 0)
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
