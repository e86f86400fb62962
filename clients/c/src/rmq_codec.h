/*
 * rmq_codec.h: msgpack encoding of requests and decoding of replies (internal).
 *
 * Encoding appends to an rmq_buf; a failed append (no memory, or the frame
 * would pass its size limit) sets `failed` and turns later appends into no-ops,
 * so a request is built without checks and checked once at the end.
 *
 * Decoding works on frames that already passed mp_check(), so every mp_decode_*
 * stays inside the frame; each value's type is checked before it is decoded.
 * Decoders return 0, RMQ_ERR_BAD_REPLY (with *why naming the field) or
 * RMQ_ERR_NO_MEMORY.
 */
#ifndef RMQ_CODEC_H
#define RMQ_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "rmq_client.h"

typedef enum rmq_buf_failure {
    RMQ_BUF_OK = 0,
    RMQ_BUF_NO_MEMORY,
    RMQ_BUF_TOO_LARGE,
} rmq_buf_failure;

typedef struct rmq_buf {
    char *data;
    size_t len;
    size_t cap;
    size_t len_max; /* appends that would pass this fail with RMQ_BUF_TOO_LARGE */
    rmq_buf_failure failed;
} rmq_buf;

void rmq_buf_init(rmq_buf *buf, size_t len_max);
void rmq_buf_free(rmq_buf *buf);

void rmq_put_map(rmq_buf *buf, uint32_t size);
void rmq_put_array(rmq_buf *buf, uint32_t size);
void rmq_put_str(rmq_buf *buf, const char *s); /* a NUL-terminated string as msgpack str */
void rmq_put_bin(rmq_buf *buf, const void *data, size_t len);
void rmq_put_int(rmq_buf *buf, int64_t value); /* uint formats for >= 0, int formats below */
void rmq_put_uint(rmq_buf *buf, uint64_t value);
void rmq_put_bool(rmq_buf *buf, int value);
void rmq_put_nil(rmq_buf *buf);

/* Scans the map at *p (advancing *p past it) and sets values[i] to the start of
 * the value of key names[i], or NULL when the map has no such key. Keys that are
 * not str or not in `names` are skipped. Returns -1 if *p is not a map. */
int rmq_map_lookup(const char **p, const char *const *names, size_t count, const char **values);

/* Typed reads of one value; -1 when the value is absent (NULL) or of another type or range. */
int rmq_read_int64(const char *value, int64_t *out);
int rmq_read_int32(const char *value, int32_t *out);
int rmq_read_bool(const char *value, int *out);
int rmq_read_str(const char *value, const char **s, uint32_t *len);

/* Copies a str value into a fixed buffer, truncating at a UTF-8 character boundary. */
int rmq_read_str_into(const char *value, char *out, size_t out_size);

int rmq_decode_message(const char *value, rmq_message *out, const char **why);
int rmq_decode_message_list(const char *value, rmq_message_list *out, const char **why);
int rmq_decode_send_results(const char *value, rmq_send_result *results, size_t count, const char **why);

/* Copies at most out_size - 1 bytes of s[0..len) into out, NUL-terminated, never
 * cutting a UTF-8 sequence in half. */
void rmq_copy_utf8(char *out, size_t out_size, const char *s, size_t len);

#endif /* RMQ_CODEC_H */
