/*
 * json.h: a small JSON reader and writer for the conformance driver (not part
 * of the library). Integers that fit int64 are kept exactly; other numbers are
 * only marked as JSON_NUMBER. Strings are UTF-8 with their length (they may hold
 * NUL bytes); object members keep their order.
 */
#ifndef RMQ_JSON_H
#define RMQ_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum json_type {
    JSON_NULL,
    JSON_BOOL,
    JSON_INT,    /* an integer literal that fits int64 */
    JSON_NUMBER, /* any other number (fraction, exponent or out of range); value not kept */
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT,
} json_type;

typedef struct json_value json_value;

struct json_value {
    json_type type;
    int boolean;
    int64_t integer;
    char *string;       /* JSON_STRING: string_len bytes, NUL-terminated */
    size_t string_len;
    json_value *items;  /* JSON_ARRAY elements, or JSON_OBJECT member values */
    char **names;       /* JSON_OBJECT member names (NUL-terminated) */
    size_t count;
};

/* Parses one JSON document (trailing whitespace allowed). Returns NULL and a
 * description in `error` when the text is not valid JSON or not valid UTF-8. */
json_value *json_parse(const char *text, size_t len, char *error, size_t error_size);
void json_free(json_value *value);

/* The value of member `name` of an object, or NULL (also when `object` is not an object). */
const json_value *json_get(const json_value *object, const char *name);

/* Writes s[0..len) as a JSON string; bytes that are not valid UTF-8 become U+FFFD. */
void json_write_string(FILE *out, const char *s, size_t len);

/* Whether s[0..len) is valid UTF-8 (no surrogates, no overlong forms). */
int json_utf8_valid(const char *s, size_t len);

#endif /* RMQ_JSON_H */
