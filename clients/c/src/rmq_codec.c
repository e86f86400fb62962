/*
 * rmq_codec.c: msgpack encoding of requests and decoding of replies (internal).
 * See rmq_codec.h for the conventions.
 */
#include "rmq_codec.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <msgpuck.h>

/* ---- encoding ------------------------------------------------------------- */

void rmq_buf_init(rmq_buf *buf, size_t len_max) {
    memset(buf, 0, sizeof *buf);
    buf->len_max = len_max;
}

void rmq_buf_free(rmq_buf *buf) {
    free(buf->data);
    memset(buf, 0, sizeof *buf);
}

/* Room for n more bytes: the write position, or NULL once the buffer failed. */
static char *buf_reserve(rmq_buf *buf, size_t n) {
    if (buf->failed != RMQ_BUF_OK) return NULL;
    if (n > buf->len_max || buf->len > buf->len_max - n) {
        buf->failed = RMQ_BUF_TOO_LARGE;
        return NULL;
    }
    if (buf->len + n > buf->cap) {
        size_t cap = buf->cap ? buf->cap : 256;
        while (cap < buf->len + n) cap *= 2;
        char *data = realloc(buf->data, cap);
        if (data == NULL) {
            buf->failed = RMQ_BUF_NO_MEMORY;
            return NULL;
        }
        buf->data = data;
        buf->cap = cap;
    }
    return buf->data + buf->len;
}

static void buf_commit(rmq_buf *buf, const char *start, const char *end, size_t reserved) {
    assert(end >= start && (size_t)(end - start) <= reserved);
    buf->len += (size_t)(end - start);
}

void rmq_put_map(rmq_buf *buf, uint32_t size) {
    char *w = buf_reserve(buf, mp_sizeof_map(size));
    if (w) buf_commit(buf, w, mp_encode_map(w, size), mp_sizeof_map(size));
}

void rmq_put_array(rmq_buf *buf, uint32_t size) {
    char *w = buf_reserve(buf, mp_sizeof_array(size));
    if (w) buf_commit(buf, w, mp_encode_array(w, size), mp_sizeof_array(size));
}

void rmq_put_str(rmq_buf *buf, const char *s) {
    size_t len = strlen(s);
    if (len > UINT32_MAX) {
        buf->failed = RMQ_BUF_TOO_LARGE;
        return;
    }
    size_t need = mp_sizeof_str((uint32_t)len);
    char *w = buf_reserve(buf, need);
    if (w) buf_commit(buf, w, mp_encode_str(w, s, (uint32_t)len), need);
}

void rmq_put_bin(rmq_buf *buf, const void *data, size_t len) {
    if (len > UINT32_MAX) {
        buf->failed = RMQ_BUF_TOO_LARGE;
        return;
    }
    size_t need = mp_sizeof_bin((uint32_t)len);
    char *w = buf_reserve(buf, need);
    /* mp_encode_bin copies with memcpy, which must not see NULL even for 0 bytes. */
    if (w) buf_commit(buf, w, mp_encode_bin(w, len ? data : "", (uint32_t)len), need);
}

void rmq_put_uint(rmq_buf *buf, uint64_t value) {
    char *w = buf_reserve(buf, mp_sizeof_uint(value));
    if (w) buf_commit(buf, w, mp_encode_uint(w, value), mp_sizeof_uint(value));
}

void rmq_put_int(rmq_buf *buf, int64_t value) {
    if (value >= 0) {
        rmq_put_uint(buf, (uint64_t)value);
        return;
    }
    char *w = buf_reserve(buf, mp_sizeof_int(value));
    if (w) buf_commit(buf, w, mp_encode_int(w, value), mp_sizeof_int(value));
}

void rmq_put_bool(rmq_buf *buf, int value) {
    char *w = buf_reserve(buf, mp_sizeof_bool(value != 0));
    if (w) buf_commit(buf, w, mp_encode_bool(w, value != 0), mp_sizeof_bool(value != 0));
}

void rmq_put_nil(rmq_buf *buf) {
    char *w = buf_reserve(buf, mp_sizeof_nil());
    if (w) buf_commit(buf, w, mp_encode_nil(w), mp_sizeof_nil());
}

/* ---- typed reads ------------------------------------------------------------ */

int rmq_map_lookup(const char **p, const char *const *names, size_t count, const char **values) {
    if (mp_typeof(**p) != MP_MAP) return -1;
    for (size_t i = 0; i < count; i++) values[i] = NULL;
    uint32_t size = mp_decode_map(p);
    for (uint32_t k = 0; k < size; k++) {
        if (mp_typeof(**p) != MP_STR) {
            mp_next(p);
        } else {
            uint32_t len = 0;
            const char *key = mp_decode_str(p, &len);
            for (size_t i = 0; i < count; i++) {
                if (strlen(names[i]) == len && memcmp(names[i], key, len) == 0) {
                    values[i] = *p;
                    break;
                }
            }
        }
        mp_next(p); /* the value */
    }
    return 0;
}

int rmq_read_int64(const char *value, int64_t *out) {
    if (value == NULL) return -1;
    const char *p = value;
    switch (mp_typeof(*p)) {
    case MP_UINT: {
        uint64_t u = mp_decode_uint(&p);
        if (u > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)u;
        return 0;
    }
    case MP_INT:
        *out = mp_decode_int(&p);
        return 0;
    default:
        return -1;
    }
}

int rmq_read_int32(const char *value, int32_t *out) {
    int64_t v = 0;
    if (rmq_read_int64(value, &v) != 0 || v < INT32_MIN || v > INT32_MAX) return -1;
    *out = (int32_t)v;
    return 0;
}

int rmq_read_bool(const char *value, int *out) {
    if (value == NULL || mp_typeof(*value) != MP_BOOL) return -1;
    const char *p = value;
    *out = mp_decode_bool(&p) ? 1 : 0;
    return 0;
}

int rmq_read_str(const char *value, const char **s, uint32_t *len) {
    if (value == NULL || mp_typeof(*value) != MP_STR) return -1;
    const char *p = value;
    *s = mp_decode_str(&p, len);
    return 0;
}

void rmq_copy_utf8(char *out, size_t out_size, const char *s, size_t len) {
    assert(out_size > 0);
    size_t n = len < out_size - 1 ? len : out_size - 1;
    if (n < len) {
        /* s[n] is the first byte left out; if it continues a sequence, leave out its start too. */
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    }
    memcpy(out, s, n);
    out[n] = '\0';
}

int rmq_read_str_into(const char *value, char *out, size_t out_size) {
    const char *s = NULL;
    uint32_t len = 0;
    if (rmq_read_str(value, &s, &len) != 0) return -1;
    rmq_copy_utf8(out, out_size, s, len);
    return 0;
}

/* ---- message objects (protocol 6.1) ------------------------------------------ */

enum message_field {
    F_TOPIC, F_QUEUE_ID, F_QUEUE_OFFSET, F_COMMIT_LOG_OFFSET, F_STORE_SIZE, F_MSG_ID,
    F_BODY, F_BODY_CRC, F_TAGS, F_KEYS, F_UNIQ_KEY, F_PROPERTIES, F_FLAG, F_SYS_FLAG,
    F_BORN_TIMESTAMP, F_BORN_HOST, F_STORE_TIMESTAMP, F_STORE_HOST, F_RECONSUME_TIMES,
    F_COUNT
};

static const char *const message_fields[F_COUNT] = {
    "topic", "queue_id", "queue_offset", "commit_log_offset", "store_size", "msg_id",
    "body", "body_crc", "tags", "keys", "uniq_key", "properties", "flag", "sys_flag",
    "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
};

/* Bump allocation inside a message's single storage block. */
typedef struct arena {
    char *next;
    char *end;
} arena;

static const char *arena_copy(arena *a, const char *s, uint32_t len) {
    assert((size_t)(a->end - a->next) >= (size_t)len + 1);
    char *out = a->next;
    memcpy(out, s, len);
    out[len] = '\0';
    a->next += (size_t)len + 1;
    return out;
}

/* A str (or, when nullable, nil → NULL) value copied into the arena. */
static int copy_str(arena *a, const char *value, int nullable, const char **out) {
    if (value != NULL && nullable && mp_typeof(*value) == MP_NIL) {
        *out = NULL;
        return 0;
    }
    const char *s = NULL;
    uint32_t len = 0;
    if (rmq_read_str(value, &s, &len) != 0) return -1;
    *out = arena_copy(a, s, len);
    return 0;
}

static int copy_keys(arena *a, const char *value, const char **keys, size_t count) {
    const char *p = value;
    uint32_t size = mp_decode_array(&p);
    assert(size == count);
    for (uint32_t i = 0; i < size; i++) {
        if (copy_str(a, p, 0, &keys[i]) != 0) return -1;
        mp_next(&p);
    }
    return 0;
}

static int copy_properties(arena *a, const char *value, rmq_property *props, size_t count) {
    const char *p = value;
    uint32_t size = mp_decode_map(&p);
    assert(size == count);
    for (uint32_t i = 0; i < size; i++) {
        if (copy_str(a, p, 0, &props[i].name) != 0) return -1;
        mp_next(&p);
        if (copy_str(a, p, 0, &props[i].value) != 0) return -1;
        mp_next(&p);
    }
    return 0;
}

static int copy_body(arena *a, const char *value, rmq_message *m) {
    if (value == NULL || (mp_typeof(*value) != MP_BIN && mp_typeof(*value) != MP_STR)) return -1;
    const char *p = value;
    uint32_t len = 0;
    const char *data = mp_decode_strbin(&p, &len);
    m->body = (const unsigned char *)arena_copy(a, data, len);
    m->body_len = len;
    return 0;
}

static int read_numbers(const char *const *v, rmq_message *m, const char **why) {
    int64_t crc = 0;
    if (rmq_read_int32(v[F_QUEUE_ID], &m->queue_id) != 0) *why = "queue_id";
    else if (rmq_read_int64(v[F_QUEUE_OFFSET], &m->queue_offset) != 0) *why = "queue_offset";
    else if (rmq_read_int64(v[F_COMMIT_LOG_OFFSET], &m->commit_log_offset) != 0) *why = "commit_log_offset";
    else if (rmq_read_int32(v[F_STORE_SIZE], &m->store_size) != 0) *why = "store_size";
    else if (rmq_read_int64(v[F_BODY_CRC], &crc) != 0 || crc < 0 || crc > UINT32_MAX) *why = "body_crc";
    else if (rmq_read_int32(v[F_FLAG], &m->flag) != 0) *why = "flag";
    else if (rmq_read_int32(v[F_SYS_FLAG], &m->sys_flag) != 0) *why = "sys_flag";
    else if (rmq_read_int64(v[F_BORN_TIMESTAMP], &m->born_timestamp) != 0) *why = "born_timestamp";
    else if (rmq_read_int64(v[F_STORE_TIMESTAMP], &m->store_timestamp) != 0) *why = "store_timestamp";
    else if (rmq_read_int32(v[F_RECONSUME_TIMES], &m->reconsume_times) != 0) *why = "reconsume_times";
    else {
        m->body_crc = (uint32_t)crc;
        return 0;
    }
    return -1;
}

static int copy_strings(arena *a, const char *const *v, rmq_message *m, const char **why) {
    if (copy_str(a, v[F_TOPIC], 0, &m->topic) != 0) *why = "topic";
    else if (copy_str(a, v[F_MSG_ID], 0, &m->msg_id) != 0) *why = "msg_id";
    else if (copy_body(a, v[F_BODY], m) != 0) *why = "body";
    else if (copy_str(a, v[F_TAGS], 1, &m->tags) != 0) *why = "tags";
    else if (copy_str(a, v[F_UNIQ_KEY], 1, &m->uniq_key) != 0) *why = "uniq_key";
    else if (copy_str(a, v[F_BORN_HOST], 0, &m->born_host) != 0) *why = "born_host";
    else if (copy_str(a, v[F_STORE_HOST], 0, &m->store_host) != 0) *why = "store_host";
    else if (copy_keys(a, v[F_KEYS], (const char **)m->keys, m->key_count) != 0) *why = "keys";
    else if (copy_properties(a, v[F_PROPERTIES], (rmq_property *)m->properties, m->property_count) != 0)
        *why = "properties";
    else return 0;
    return -1;
}

int rmq_decode_message(const char *value, rmq_message *out, const char **why) {
    memset(out, 0, sizeof *out);
    const char *v[F_COUNT];
    const char *end = value;
    if (rmq_map_lookup(&end, message_fields, F_COUNT, v) != 0) {
        *why = "message is not a map";
        return RMQ_ERR_BAD_REPLY;
    }
    for (size_t i = 0; i < F_COUNT; i++) {
        if (v[i] == NULL) {
            *why = message_fields[i];
            return RMQ_ERR_BAD_REPLY;
        }
    }
    if (mp_typeof(*v[F_KEYS]) != MP_ARRAY) {
        *why = "keys";
        return RMQ_ERR_BAD_REPLY;
    }
    if (mp_typeof(*v[F_PROPERTIES]) != MP_MAP) {
        *why = "properties";
        return RMQ_ERR_BAD_REPLY;
    }
    const char *p = v[F_KEYS];
    size_t key_count = mp_decode_array(&p);
    p = v[F_PROPERTIES];
    size_t property_count = mp_decode_map(&p);

    /* Every str or bin of n bytes takes at least n + 1 bytes of the encoded object,
     * so the object's own size holds all of its strings with their NULs. */
    size_t span = (size_t)(end - value);
    size_t props_bytes = property_count * sizeof(rmq_property);
    size_t keys_bytes = key_count * sizeof(const char *);
    char *block = malloc(props_bytes + keys_bytes + span + 1);
    if (block == NULL) {
        *why = "message";
        return RMQ_ERR_NO_MEMORY;
    }
    out->storage = block;
    out->properties = (const rmq_property *)block;
    out->property_count = property_count;
    out->keys = (const char *const *)(block + props_bytes);
    out->key_count = key_count;
    arena a = {block + props_bytes + keys_bytes, block + props_bytes + keys_bytes + span + 1};

    if (read_numbers(v, out, why) != 0 || copy_strings(&a, v, out, why) != 0) {
        rmq_message_free(out);
        return RMQ_ERR_BAD_REPLY;
    }
    return 0;
}

int rmq_decode_message_list(const char *value, rmq_message_list *out, const char **why) {
    out->items = NULL;
    out->count = 0;
    if (value == NULL || mp_typeof(*value) != MP_ARRAY) {
        *why = "messages";
        return RMQ_ERR_BAD_REPLY;
    }
    const char *p = value;
    uint32_t size = mp_decode_array(&p);
    if (size == 0) return 0;
    rmq_message *items = calloc(size, sizeof *items);
    if (items == NULL) {
        *why = "messages";
        return RMQ_ERR_NO_MEMORY;
    }
    out->items = items;
    for (uint32_t i = 0; i < size; i++) {
        int rc = rmq_decode_message(p, &items[i], why);
        if (rc != 0) {
            rmq_message_list_free(out);
            return rc;
        }
        out->count = i + 1;
        mp_next(&p);
    }
    return 0;
}

/* ---- send results (protocol 4.1) ----------------------------------------------- */

enum result_field {
    R_STATUS, R_STATUS_CODE, R_MSG_ID, R_QUEUE_ID, R_QUEUE_OFFSET, R_COMMIT_LOG_OFFSET,
    R_STORE_TIMESTAMP, R_COUNT
};

static const char *const result_fields[R_COUNT] = {
    "status", "status_code", "msg_id", "queue_id", "queue_offset", "commit_log_offset", "store_timestamp",
};

static int decode_send_result(const char **p, rmq_send_result *r, const char **why) {
    const char *v[R_COUNT];
    memset(r, 0, sizeof *r);
    if (rmq_map_lookup(p, result_fields, R_COUNT, v) != 0) *why = "results[i] is not a map";
    else if (rmq_read_str_into(v[R_STATUS], r->status, sizeof r->status) != 0) *why = "status";
    else if (rmq_read_int32(v[R_STATUS_CODE], &r->status_code) != 0) *why = "status_code";
    else if (rmq_read_str_into(v[R_MSG_ID], r->msg_id, sizeof r->msg_id) != 0) *why = "msg_id";
    else if (rmq_read_int32(v[R_QUEUE_ID], &r->queue_id) != 0) *why = "queue_id";
    else if (rmq_read_int64(v[R_QUEUE_OFFSET], &r->queue_offset) != 0) *why = "queue_offset";
    else if (rmq_read_int64(v[R_COMMIT_LOG_OFFSET], &r->commit_log_offset) != 0) *why = "commit_log_offset";
    else if (rmq_read_int64(v[R_STORE_TIMESTAMP], &r->store_timestamp) != 0) *why = "store_timestamp";
    else return 0;
    return RMQ_ERR_BAD_REPLY;
}

int rmq_decode_send_results(const char *value, rmq_send_result *results, size_t count, const char **why) {
    if (value == NULL || mp_typeof(*value) != MP_ARRAY) {
        *why = "results";
        return RMQ_ERR_BAD_REPLY;
    }
    const char *p = value;
    if (mp_decode_array(&p) != count) {
        *why = "results (not one per message)";
        return RMQ_ERR_BAD_REPLY;
    }
    for (size_t i = 0; i < count; i++) {
        int rc = decode_send_result(&p, &results[i], why);
        if (rc != 0) return rc;
    }
    return 0;
}

/* ---- freeing --------------------------------------------------------------------- */

void rmq_message_free(rmq_message *message) {
    if (message == NULL) return;
    free(message->storage);
    memset(message, 0, sizeof *message);
}

void rmq_message_list_free(rmq_message_list *list) {
    if (list == NULL) return;
    for (size_t i = 0; i < list->count; i++) rmq_message_free(&list->items[i]);
    free(list->items);
    list->items = NULL;
    list->count = 0;
}

void rmq_pull_result_free(rmq_pull_result *result) {
    if (result == NULL) return;
    rmq_message_list_free(&result->messages);
}
