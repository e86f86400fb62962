/*
 * base64.c: standard base64 (RFC 4648 alphabet, with padding).
 */
#include "base64.h"

#include <stdint.h>
#include <stdlib.h>

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int sextet(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int base64_decode(const char *text, size_t len, unsigned char **out, size_t *out_len) {
    if (len % 4 != 0) return -1;
    size_t padding = 0;
    if (len > 0 && text[len - 1] == '=') padding++;
    if (len > 1 && text[len - 2] == '=') padding++;
    size_t n = len / 4 * 3 - padding;
    unsigned char *data = malloc(n + 1); /* + 1: never malloc(0) */
    if (data == NULL) return -1;
    size_t w = 0;
    for (size_t i = 0; i < len; i += 4) {
        int last = i + 4 == len;
        int pad = last ? (int)padding : 0;
        uint32_t group = 0;
        for (int j = 0; j < 4; j++) {
            int v = j >= 4 - pad ? 0 : sextet(text[i + (size_t)j]);
            if (v < 0) {
                free(data);
                return -1;
            }
            group = (group << 6) | (uint32_t)v;
        }
        data[w++] = (unsigned char)(group >> 16);
        if (pad < 2) data[w++] = (unsigned char)(group >> 8);
        if (pad < 1) data[w++] = (unsigned char)group;
    }
    *out = data;
    *out_len = w;
    return 0;
}

void base64_write(FILE *out, const unsigned char *data, size_t len) {
    for (size_t i = 0; i < len; i += 3) {
        size_t left = len - i;
        uint32_t group = (uint32_t)data[i] << 16;
        if (left > 1) group |= (uint32_t)data[i + 1] << 8;
        if (left > 2) group |= data[i + 2];
        fputc(alphabet[(group >> 18) & 63], out);
        fputc(alphabet[(group >> 12) & 63], out);
        fputc(left > 1 ? alphabet[(group >> 6) & 63] : '=', out);
        fputc(left > 2 ? alphabet[group & 63] : '=', out);
    }
}
