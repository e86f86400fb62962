/*
 * json.c: a small JSON reader and writer for the conformance driver (RFC 8259).
 */
#include "json.h"

#include <assert.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define DEPTH_MAX 64

/* ---- UTF-8 ------------------------------------------------------------------------ */

/* Length (1-4) of the valid UTF-8 sequence at s, or 0. */
static size_t utf8_sequence(const unsigned char *s, size_t len) {
    if (len == 0) return 0;
    unsigned char c = s[0];
    size_t n;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (len < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

int json_utf8_valid(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    while (len > 0) {
        size_t n = utf8_sequence(p, len);
        if (n == 0) return 0;
        p += n;
        len -= n;
    }
    return 1;
}

/* ---- reader ----------------------------------------------------------------------- */

typedef struct parser {
    const char *p;
    const char *end;
    char *error;
    size_t error_size;
    int failed;
} parser;

static int fail(parser *ps, const char *format, ...) __attribute__((format(printf, 2, 3)));

static int fail(parser *ps, const char *format, ...) {
    if (!ps->failed) {
        va_list args;
        va_start(args, format);
        vsnprintf(ps->error, ps->error_size, format, args);
        va_end(args);
        ps->failed = 1;
    }
    return -1;
}

static void skip_space(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return fail(ps, "unexpected token");
    ps->p += n;
    return 0;
}

/* A growable byte string. */
typedef struct text {
    char *data;
    size_t len;
    size_t cap;
} text;

static int text_append(text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 32;
        while (cap < t->len + n + 1) cap *= 2;
        char *data = realloc(t->data, cap);
        if (data == NULL) return -1;
        t->data = data;
        t->cap = cap;
    }
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
    return 0;
}

static int append_code_point(text *t, uint32_t cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) b[0] = (char)cp, n = 1;
    else if (cp < 0x800) b[0] = (char)(0xC0 | (cp >> 6)), b[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12)), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    } else {
        b[0] = (char)(0xF0 | (cp >> 18)), b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    }
    return text_append(t, b, n);
}

static int hex4(parser *ps, uint32_t *out) {
    if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return fail(ps, "bad \\u escape");
    }
    *out = v;
    return 0;
}

static int unicode_escape(parser *ps, text *t) {
    uint32_t cp = 0;
    if (hex4(ps, &cp) != 0) return -1;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(ps, "lone low surrogate in \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t low = 0;
        if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') return fail(ps, "lone high surrogate");
        ps->p += 2;
        if (hex4(ps, &low) != 0) return -1;
        if (low < 0xDC00 || low > 0xDFFF) return fail(ps, "bad surrogate pair");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    return append_code_point(t, cp) == 0 ? 0 : fail(ps, "out of memory");
}

static int escape(parser *ps, text *t) {
    if (ps->p >= ps->end) return fail(ps, "truncated escape");
    char c = *ps->p++;
    const char *plain = NULL;
    switch (c) {
    case '"': plain = "\""; break;
    case '\\': plain = "\\"; break;
    case '/': plain = "/"; break;
    case 'b': plain = "\b"; break;
    case 'f': plain = "\f"; break;
    case 'n': plain = "\n"; break;
    case 'r': plain = "\r"; break;
    case 't': plain = "\t"; break;
    case 'u': return unicode_escape(ps, t);
    default: return fail(ps, "bad escape \\%c", c);
    }
    return text_append(t, plain, 1) == 0 ? 0 : fail(ps, "out of memory");
}

/* Parses a string (ps->p at the opening quote) into a new NUL-terminated buffer. */
static int parse_string(parser *ps, char **out, size_t *out_len) {
    assert(ps->p < ps->end && *ps->p == '"');
    ps->p++;
    text t = {NULL, 0, 0};
    if (text_append(&t, "", 0) != 0) return fail(ps, "out of memory");
    for (;;) {
        if (ps->p >= ps->end) break;
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') {
            ps->p++;
            *out = t.data;
            *out_len = t.len;
            return 0;
        }
        if (c < 0x20) {
            fail(ps, "control character in string");
            break;
        }
        if (c == '\\') {
            ps->p++;
            if (escape(ps, &t) != 0) break;
            continue;
        }
        size_t n = utf8_sequence((const unsigned char *)ps->p, (size_t)(ps->end - ps->p));
        if (n == 0) {
            fail(ps, "invalid UTF-8 in string");
            break;
        }
        if (text_append(&t, ps->p, n) != 0) {
            fail(ps, "out of memory");
            break;
        }
        ps->p += n;
    }
    free(t.data);
    return fail(ps, "unterminated string");
}

static int parse_number(parser *ps, json_value *v) {
    int negative = ps->p < ps->end && *ps->p == '-';
    if (negative) ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
    if (*ps->p == '0' && ps->p + 1 < ps->end && ps->p[1] >= '0' && ps->p[1] <= '9') {
        return fail(ps, "leading zero in number");
    }
    uint64_t magnitude = 0;
    int overflow = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        unsigned digit = (unsigned)(*ps->p++ - '0');
        if (magnitude > (UINT64_MAX - digit) / 10) overflow = 1;
        else magnitude = magnitude * 10 + digit;
    }
    int fraction = 0;
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        fraction = 1;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad fraction");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        fraction = 1;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (fraction || overflow || magnitude > limit) {
        v->type = JSON_NUMBER;
        return 0;
    }
    v->type = JSON_INT;
    v->integer = negative ? (int64_t)(0 - magnitude) : (int64_t)magnitude;
    return 0;
}

static int parse_value(parser *ps, json_value *v, int depth);

static int grow(json_value *v, size_t *cap, int with_names) {
    if (v->count < *cap) return 0;
    size_t n = *cap ? *cap * 2 : 4;
    json_value *items = realloc(v->items, n * sizeof *items);
    if (items == NULL) return -1;
    v->items = items;
    if (with_names) {
        char **names = realloc(v->names, n * sizeof *names);
        if (names == NULL) return -1;
        v->names = names;
    }
    *cap = n;
    return 0;
}

static int parse_array(parser *ps, json_value *v, int depth) {
    v->type = JSON_ARRAY;
    ps->p++; /* '[' */
    size_t cap = 0;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return 0;
    }
    for (;;) {
        if (grow(v, &cap, 0) != 0) return fail(ps, "out of memory");
        json_value *item = &v->items[v->count];
        memset(item, 0, sizeof *item);
        v->count++;
        if (parse_value(ps, item, depth + 1) != 0) return -1;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == ']') {
            ps->p++;
            return 0;
        }
        return fail(ps, "expected ',' or ']'");
    }
}

static int parse_object(parser *ps, json_value *v, int depth) {
    v->type = JSON_OBJECT;
    ps->p++; /* '{' */
    size_t cap = 0;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return 0;
    }
    for (;;) {
        skip_space(ps);
        if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a member name");
        if (grow(v, &cap, 1) != 0) return fail(ps, "out of memory");
        json_value *item = &v->items[v->count];
        memset(item, 0, sizeof *item);
        size_t name_len = 0;
        if (parse_string(ps, &v->names[v->count], &name_len) != 0) return -1;
        v->count++;
        skip_space(ps);
        if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':'");
        ps->p++;
        if (parse_value(ps, item, depth + 1) != 0) return -1;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            return 0;
        }
        return fail(ps, "expected ',' or '}'");
    }
}

static int parse_value(parser *ps, json_value *v, int depth) {
    if (depth > DEPTH_MAX) return fail(ps, "nested too deeply");
    skip_space(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
    switch (*ps->p) {
    case 'n': v->type = JSON_NULL; return literal(ps, "null");
    case 't': v->type = JSON_BOOL; v->boolean = 1; return literal(ps, "true");
    case 'f': v->type = JSON_BOOL; v->boolean = 0; return literal(ps, "false");
    case '"': v->type = JSON_STRING; return parse_string(ps, &v->string, &v->string_len);
    case '[': return parse_array(ps, v, depth);
    case '{': return parse_object(ps, v, depth);
    default: return parse_number(ps, v);
    }
}

json_value *json_parse(const char *text_in, size_t len, char *error, size_t error_size) {
    parser ps = {text_in, text_in + len, error, error_size, 0};
    json_value *v = calloc(1, sizeof *v);
    if (v == NULL) {
        snprintf(error, error_size, "out of memory");
        return NULL;
    }
    if (parse_value(&ps, v, 0) == 0) {
        skip_space(&ps);
        if (ps.p == ps.end) return v;
        fail(&ps, "trailing characters after the document");
    }
    size_t offset = (size_t)(ps.p - text_in);
    size_t used = strlen(error);
    if (used < error_size) snprintf(error + used, error_size - used, " (at byte %zu)", offset);
    json_free(v);
    return NULL;
}

static void free_contents(json_value *v) {
    free(v->string);
    for (size_t i = 0; i < v->count; i++) {
        free_contents(&v->items[i]);
        if (v->names != NULL) free(v->names[i]);
    }
    free(v->items);
    free(v->names);
}

void json_free(json_value *value) {
    if (value == NULL) return;
    free_contents(value);
    free(value);
}

const json_value *json_get(const json_value *object, const char *name) {
    if (object == NULL || object->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < object->count; i++) {
        if (strcmp(object->names[i], name) == 0) return &object->items[i];
    }
    return NULL;
}

/* ---- writer ----------------------------------------------------------------------- */

void json_write_string(FILE *out, const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', out);
    while (len > 0) {
        unsigned char c = *p;
        size_t n = utf8_sequence(p, len);
        if (n == 0) {
            fputs("\\ufffd", out);
            n = 1;
        } else if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc(c, out);
        } else if (c == '\n') fputs("\\n", out);
        else if (c == '\r') fputs("\\r", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c < 0x20 || c == 0x7F) fprintf(out, "\\u%04x", c);
        else fwrite(p, 1, n, out);
        p += n;
        len -= n;
    }
    fputc('"', out);
}
