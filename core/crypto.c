/* Hashes and signatures through libsodium: SHA-256 for variant keys, template hashes and cache
** checksums, Ed25519 for signed shipped caches. */
#include "core.h"

#include <pthread.h>
#include <sodium.h>
#include <string.h>

static int sodium_ready = -1;
static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;

static void init_sodium(void)
{
    sodium_ready = sodium_init() >= 0;
}

/* libsodium must be initialised before use; sodium_init is idempotent and thread-safe, the once
** makes later calls free. */
static int ensure_sodium(void)
{
    pthread_once(&sodium_once, init_sodium);
    return sodium_ready == 1;
}

void fj__sha256_hex(const void *data, size_t size, char hex[65])
{
    unsigned char digest[crypto_hash_sha256_BYTES];
    ensure_sodium();
    crypto_hash_sha256(digest, data, size);
    sodium_bin2hex(hex, 65, digest, sizeof digest);
}

_Static_assert(sizeof(((fj__sha256 *)0)->state) >= sizeof(crypto_hash_sha256_state),
               "fj__sha256 holds libsodium's state");

void fj__sha256_init(fj__sha256 *h)
{
    ensure_sodium();
    crypto_hash_sha256_init((crypto_hash_sha256_state *)h->state);
}

void fj__sha256_update(fj__sha256 *h, const void *data, size_t size)
{
    crypto_hash_sha256_update((crypto_hash_sha256_state *)h->state, data, size);
}

void fj__sha256_field(fj__sha256 *h, const void *data, size_t size)
{
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)size >> (8 * i));
    fj__sha256_update(h, len, sizeof len);
    fj__sha256_update(h, data, size);
}

void fj__sha256_final(fj__sha256 *h, unsigned char digest[32])
{
    crypto_hash_sha256_final((crypto_hash_sha256_state *)h->state, digest);
}

_Static_assert(crypto_sign_PUBLICKEYBYTES == 32 && crypto_sign_SECRETKEYBYTES == 64 &&
                   crypto_sign_BYTES == 64 && crypto_sign_SEEDBYTES == 32,
               "Ed25519 sizes");

int fj__sign_keypair(unsigned char public_key[32], unsigned char secret_key[64])
{
    if (!ensure_sodium())
        return -1;
    return crypto_sign_keypair(public_key, secret_key) == 0 ? 0 : -1;
}

int fj__sign(const unsigned char *message, size_t size, const unsigned char secret_key[64],
             unsigned char signature[64])
{
    if (!ensure_sodium())
        return -1;
    return crypto_sign_detached(signature, NULL, message, size, secret_key) == 0 ? 0 : -1;
}

int fj__sign_verify(const unsigned char *message, size_t size, const unsigned char public_key[32],
                    const unsigned char signature[64])
{
    if (!ensure_sodium())
        return -1;
    return crypto_sign_verify_detached(signature, message, size, public_key) == 0 ? 0 : -1;
}

int fj__hex_decode(const char *hex, unsigned char *out, size_t size)
{
    size_t n = 0;
    const char *end = NULL;
    if (!hex || strlen(hex) != 2 * size ||
        sodium_hex2bin(out, size, hex, 2 * size, NULL, &n, &end) != 0 || n != size)
        return -1;
    return 0;
}

void fj__hex_encode(const unsigned char *data, size_t size, char *hex)
{
    sodium_bin2hex(hex, 2 * size + 1, data, size);
}
