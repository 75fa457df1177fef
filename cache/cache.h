/* The kernel cache: compiled binaries and tuning results in SQLite, shared by processes, with
** read-only shipped caches consulted after the user's. The cache never makes a call fail: any
** problem with a file turns into a miss, or into no persistent cache, plus a warning. */
#ifndef FJ_CACHE_H
#define FJ_CACHE_H

#include "../core/core.h"

#define CACHE_SCHEMA_VERSION 2          /* 2: checksums bind key and binary; signatures */
#define CACHE_APPLICATION_ID 0x464a4954 /* "FJIT" */

typedef struct fj_cache fj_cache;

/* Where a looked-up binary came from. */
typedef enum cache_origin { CACHE_MISS = 0, CACHE_USER = 1, CACHE_SHIPPED = 2 } cache_origin;

typedef struct cache_options {
    const char *path;           /* user cache; NULL or ":memory:" for none */
    const char *const *shipped; /* NULL-terminated read-only caches; may be NULL */
    int readonly;               /* never write the user cache */
    int own_file;               /* path is the library's own (the default location): damaged
                                ** beyond recognition (its header too), it is still moved aside */
    int busy_timeout_ms;        /* 0: $FLASHJIT_CACHE_TIMEOUT_MS, else 5000 */
    /* Ed25519 public keys; with any, a shipped cache is used only when one of them signed it
    ** (cache_sign), and only its signed rows can hit. */
    const fj__public_key *trusted;
    int ntrusted;
} cache_options;

/* Opens the caches. Always succeeds unless out of memory: a user cache that cannot be used is
** dropped with a warning appended to warn (the store then keeps nothing across processes), and
** so is each unusable shipped cache. *out may be used even when no file is open. */
fj_status cache_open(const cache_options *o, fj_cache **out, fj__err *warn);
void cache_close(fj_cache *c);
/* The user cache's connection (NULL when none), for tests and tools. */
struct sqlite3 *cache_user_db(fj_cache *c);
/* Whether a user cache file is open for writing. */
int cache_writable(const fj_cache *c);

/* Looks a kernel up by its key (SHA-256 of variant_text), user cache first, then shipped ones.
** A row only hits when its variant text equals variant_text and its checksum is the SHA-256 of
** its key and binary (and, in a verified shipped cache, the checksum signed); anything else is a
** miss. *binary is malloc'd. A user cache found damaged is moved
** aside and replaced by a fresh one, with a warning in warn. */
cache_origin cache_get_kernel(fj_cache *c, const char *key, const char *variant_text, void **binary,
                              size_t *size, fj__err *warn);

/* Stores a compiled kernel in the user cache (replacing any row with that key). A failure is
** reported in warn and otherwise ignored. */
void cache_put_kernel(fj_cache *c, const char *key, const char *backend, const char *target,
                      const char *device, const char *variant_text, const void *binary, size_t size,
                      double compile_ms, const char *log, fj__err *warn);

/* Removes a user-cache row whose binary turned out unusable (it failed to load). */
void cache_forget_kernel(fj_cache *c, const char *key);

/* Tuning results, keyed by device fingerprint, problem bucket and variant family. */
int cache_get_tuning(fj_cache *c, const char *fingerprint, const char *bucket, const char *family,
                     char **best_config, double *measured_us);
void cache_put_tuning(fj_cache *c, const char *fingerprint, const char *bucket, const char *family,
                      const char *best_config, double measured_us, const char *all_results_json,
                      fj__err *warn);

/* ---- maintenance (the `flashjit cache` commands) -------------------------------------------- */

/* One kernel row, for listings. */
typedef struct cache_row {
    const char *key, *backend, *target, *device, *variant_text;
    int64_t size;
    double compile_ms;
    int64_t created, last_used;
} cache_row;
typedef void (*cache_row_fn)(void *ud, const cache_row *row);

/* Calls fn for every kernel row of the file at path (opened read-only). */
fj_status cache_list(const char *path, cache_row_fn fn, void *ud, fj__err *err);
/* What cache_verify found. */
typedef struct cache_verify_result {
    int64_t rows, damaged;
    int is_signed;          /* a valid signature (by a trusted key, when any are given) */
    char signer[65];        /* its public key, hex */
    char unsigned_why[160]; /* when not: why ("it is not signed ...") */
} cache_verify_result;
/* Checks the file at path: SQLite integrity, application id, schema version, each row's
** checksum and key, and its signature. Returns FJ_OK when sound (and, with trusted keys, signed
** by one of them). */
fj_status cache_verify(const char *path, const fj__public_key *trusted, int ntrusted,
                       cache_verify_result *r, fj__err *err);
/* Signs the cache at path with an Ed25519 secret key (replacing earlier signatures): the
** signature covers every kernel row's key and checksum and every tuning row. Refuses a cache
** with damaged rows. signer gets the public key (hex). Importing or pruning drops it. */
fj_status cache_sign(const char *path, const unsigned char secret_key[64], char signer[65],
                     fj__err *err);
/* Writes a standalone cache at dest with the rows of src whose device or target contains
** filter (all rows when filter is NULL), ready to ship: rollback journal, vacuumed. */
fj_status cache_export(const char *src, const char *dest, const char *filter, int64_t *copied,
                       fj__err *err);
/* Copies the sound rows of src into the cache at dest (created if needed). */
fj_status cache_import(const char *src, const char *dest, int64_t *copied, int64_t *skipped,
                       fj__err *err);
/* Deletes rows unused for at least older_than_s seconds (< 0: any age) whose device or target
** contains filter (NULL: any). */
fj_status cache_prune(const char *path, int64_t older_than_s, const char *filter, int64_t *deleted,
                      fj__err *err);

#endif /* FJ_CACHE_H */
