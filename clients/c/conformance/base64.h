/*
 * base64.h: standard base64 (RFC 4648 alphabet, with padding) for the conformance driver.
 */
#ifndef RMQ_BASE64_H
#define RMQ_BASE64_H

#include <stddef.h>
#include <stdio.h>

/* Decodes text[0..len) into a new buffer (*out, *out_len; free with free()).
 * Returns 0, or -1 for text that is not padded base64 or on no memory. */
int base64_decode(const char *text, size_t len, unsigned char **out, size_t *out_len);

/* Writes the base64 text of data[0..len) to out. */
void base64_write(FILE *out, const unsigned char *data, size_t len);

#endif /* RMQ_BASE64_H */
