/* Reading a fuzzer's bytes as typed fields: each read takes what it needs from the front and
** yields zeros once the input is used up, so every input is a complete, deterministic request. */
#ifndef FJ_FUZZ_INPUT_H
#define FJ_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fuzz_input {
    const uint8_t *data;
    size_t size, pos;
} fuzz_input;

static inline uint64_t fuzz_bits(fuzz_input *in, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)(in->pos < in->size ? in->data[in->pos++] : 0) << (8 * i);
    return v;
}

/* A small integer more often than a large one: 0..255 from one byte, else a signed 64-bit
** value (negative and huge ones included). */
static inline int64_t fuzz_int(fuzz_input *in)
{
    uint8_t tag = (uint8_t)fuzz_bits(in, 1);
    if (tag < 0xf0)
        return (int64_t)fuzz_bits(in, 1);
    return (int64_t)fuzz_bits(in, 8);
}

/* The next NUL-terminated string of the input (copied into buf), or "" at the end. */
static inline const char *fuzz_string(fuzz_input *in, char *buf, size_t size)
{
    size_t n = 0;
    while (in->pos < in->size && in->data[in->pos] != 0 && n + 1 < size)
        buf[n++] = (char)in->data[in->pos++];
    if (in->pos < in->size)
        in->pos++; /* the NUL */
    buf[n] = '\0';
    return buf;
}

#endif /* FJ_FUZZ_INPUT_H */
