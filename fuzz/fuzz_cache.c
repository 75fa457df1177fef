/* libFuzzer target: the cache reader on a fuzzed file. The input is written as a cache file and
** opened as the user cache (read-write, then read-only) and as a shipped cache (trusted as it is,
** then against a trusted key), looked up, stored into, listed, verified, exported and imported.
** Whatever the bytes, every step must end in a hit, a miss or a warning: no crash, no leak. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cache/cache.h"

static char dir[] = "/tmp/fj-fuzz-cache-XXXXXX";
static char path[128], side[160], other[160];

static void remove_files(void)
{
    static const char *const suffixes[] = {"", "-wal", "-shm", "-journal", ".damaged"};
    for (int i = 0; i < 5; i++) {
        snprintf(side, sizeof side, "%s%s", path, suffixes[i]);
        unlink(side);
        snprintf(side, sizeof side, "%s%s", other, suffixes[i]);
        unlink(side);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (!mkdtemp(dir))
        abort();
    snprintf(path, sizeof path, "%s/kernels.db", dir);
    snprintf(other, sizeof other, "%s/other.db", dir);
    return 0;
}

static void list_row(void *ud, const cache_row *r)
{
    *(size_t *)ud += strlen(r->key ? r->key : "") + (size_t)r->size;
}

/* Looks up the keys of the file's rows (as listed) and one that is surely absent. */
static void probe(fj_cache *c)
{
    static const char text[] = "variant";
    char key[65];
    fj__sha256_hex(text, sizeof text - 1, key);
    void *bin = NULL;
    size_t size = 0;
    fj__err warn = {{0}};
    if (cache_get_kernel(c, key, text, &bin, &size, &warn) != CACHE_MISS)
        free(bin);
    char *best = NULL;
    double us = 0;
    if (cache_get_tuning(c, "fp", "bucket", "fwd", &best, &us))
        free(best);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    remove_files();
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    fj__err warn = {{0}};
    fj_cache *c = NULL;

    /* As the user cache (it may be moved aside and replaced), then read-only. */
    for (int readonly = 1; readonly >= 0; readonly--) {
        cache_options o = {.path = path, .readonly = readonly, .busy_timeout_ms = 1};
        if (cache_open(&o, &c, &warn) != FJ_OK)
            abort();
        probe(c);
        static const unsigned char bin[16] = {1, 2, 3};
        cache_put_kernel(c, "k", "opencl", "t", "d", "x", bin, sizeof bin, 1, NULL, &warn);
        cache_close(c);
    }
    /* Rewrite the bytes (the user open may have moved them aside) and read them as shipped. */
    f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    fj__public_key key = {{7}};
    const char *const shipped[] = {path, NULL};
    for (int trusted = 0; trusted < 2; trusted++) {
        cache_options o = {.path = ":memory:",
                           .shipped = shipped,
                           .trusted = trusted ? &key : NULL,
                           .ntrusted = trusted};
        if (cache_open(&o, &c, &warn) != FJ_OK)
            abort();
        probe(c);
        cache_close(c);
    }
    /* The maintenance commands. */
    size_t seen = 0;
    fj__err err = {{0}};
    cache_verify_result r;
    cache_list(path, list_row, &seen, &err);
    cache_verify(path, &key, 1, &r, &err);
    cache_verify(path, NULL, 0, &r, &err); /* any valid signature: checks the seeds' */
    int64_t copied = 0, skipped = 0;
    cache_export(path, other, NULL, &copied, &err);
    cache_import(path, other, &copied, &skipped, &err);
    return 0;
}
