/* Pseudo-random numbers for the checks and the tests, from fixed seeds so that a failure
** repeats. Three generators, because pinned cases were drawn with each and keep their data:
** splitmix64 (tools/check's random problems, test_append), xorshift64 with shifts 13/7/17 (the
** merge, graph, FP8 and random-request tests) and a 64-bit LCG with Knuth's MMIX constants (the
** backward's and the block mask's tests). New code takes splitmix64. */
#ifndef FJ_CHECK_RANDOM_H
#define FJ_CHECK_RANDOM_H

#include <stdint.h>

static inline uint64_t fjr_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t fjr_xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline uint64_t fjr_lcg(uint64_t *s)
{
    return *s = *s * 6364136223846793005ull + 1442695040888963407ull;
}

/* A draw's top 53 bits as a double in [0, 1), and in [-1, 1). */
static inline double fjr_unit(uint64_t bits)
{
    return (double)(bits >> 11) / 9007199254740992.0;
}
static inline double fjr_signed_unit(uint64_t bits)
{
    return fjr_unit(bits) * 2 - 1;
}

#endif
