/* The kernel cache: hits across contexts and processes, misses on any change of what a binary
** depends on, export/import, shipped read-only caches, every kind of damage (the library must
** still compute the right result), and many processes writing at once. Runs on the OpenCL
** backend (PoCL in CI); the store-level tests need no device at all. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "cache/cache.h"
#include "reference.h"
#include "templates/render.h"

extern char **environ;

static char tmpdir[] = "/tmp/fj-cache-test-XXXXXX";
static char golden[512]; /* a cache holding the kernel of small_case(), built once */
static int have_device;

static void path_in_tmp(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmpdir, name);
}

static fjh_case small_case(void)
{
    fjh_case c;
    fjh_case_init(&c);
    c.batch = 1;
    c.heads_q = c.heads_kv = 2;
    c.seqlen_q = c.seqlen_k = 33;
    c.head_dim = c.head_dim_v = 24;
    return c;
}

/* Creates a context on the given caches, runs small_case() and checks it. Returns where the
** kernel came from; *warning gets the context's warning text after creation. */
static fj_kernel_source run_with_cache(const char *path, const char *const *shipped, char *warning,
                                       size_t warning_size)
{
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_BACKEND_OPENCL;
    o.cache_path = path;
    o.shipped_caches = shipped;
    fj_context *ctx = NULL;
    fj_status st = fj_context_create(&o, &ctx);
    if (st != FJ_OK)
        fail_msg("context: %s", fj_last_create_error());
    if (warning)
        snprintf(warning, warning_size, "%s", fj_context_last_error(ctx));
    fjh_case c = small_case();
    fjh_result r;
    st = fjh_run(ctx, &c, &r);
    if (st != FJ_OK || !r.pass)
        fail_msg("run on cache %s: %s %s", path, fj_status_string(st), r.why);
    fj_kernel_source source = r.first.source;
    fj_context_destroy(ctx);
    return source;
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
}

static long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* Runs this test program again as `argv0 --worker ARGS...` and returns its exit status. */
static int spawn_worker(char *const args[], pid_t *pid_out)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = '\0';
    char *argv[8] = {self, "--worker"};
    for (int i = 0; args[i] && i < 5; i++)
        argv[2 + i] = args[i];
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, self, NULL, NULL, argv, environ), 0);
    if (pid_out) {
        *pid_out = pid;
        return 0;
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(tmpdir))
        return -1;
    int32_t n = 0;
    fj_device_count(FJ_BACKEND_OPENCL, &n);
    have_device = n > 0;
    if (!have_device) {
        printf("SKIP: no OpenCL device; only the store-level tests run\n");
        return 0;
    }
    path_in_tmp(golden, sizeof golden, "golden.db");
    return run_with_cache(golden, NULL, NULL, 0) == FJ_KERNEL_COMPILED ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s && rm -rf %s", tmpdir, tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void need_device(void)
{
    if (!have_device)
        skip();
}

/* ---- the store on its own ---------------------------------------------------------------- */

static void test_store_roundtrip_and_mismatches(void **state)
{
    (void)state;
    char path[512];
    path_in_tmp(path, sizeof path, "store/sub/roundtrip.db"); /* missing folders are created */
    fj__err warn = {{0}};
    fj_cache *c = NULL;
    cache_options o = {.path = path};
    assert_int_equal(cache_open(&o, &c, &warn), FJ_OK);
    assert_string_equal(warn.msg, "");
    assert_true(cache_writable(c));
    const char *text = "dtype=bf16\ntarget=sm_90a nvrtc-13.0\ntemplates=abc\n";
    char key[65];
    fj__sha256_hex(text, strlen(text), key);
    unsigned char bin[300];
    for (int i = 0; i < 300; i++)
        bin[i] = (unsigned char)(i * 7);
    cache_put_kernel(c, key, "cuda", "sm_90a nvrtc-13.0", "offline", text, bin, sizeof bin, 12.5,
                     "log", &warn);
    assert_string_equal(warn.msg, "");
    void *got = NULL;
    size_t size = 0;
    assert_int_equal(cache_get_kernel(c, key, text, &got, &size, &warn), CACHE_USER);
    assert_int_equal(size, sizeof bin);
    assert_memory_equal(got, bin, sizeof bin);
    free(got);
    /* Another compiler version, target or template set is another text: a miss, even if a
    ** caller got the key wrong. */
    assert_int_equal(
        cache_get_kernel(c, key, "dtype=bf16\ntarget=sm_90a nvrtc-13.1\n", &got, &size, &warn),
        CACHE_MISS);
    assert_int_equal(cache_get_kernel(c, "0000", text, &got, &size, &warn), CACHE_MISS);
    assert_null(got);

    /* Tuning records. */
    char *best = NULL;
    double us = 0;
    assert_false(cache_get_tuning(c, "fp", "bucket", "fwd", &best, &us));
    cache_put_tuning(c, "fp", "bucket", "fwd", "tile_m=64", 12.0, "[]", &warn);
    assert_true(cache_get_tuning(c, "fp", "bucket", "fwd", &best, &us));
    assert_string_equal(best, "tile_m=64");
    free(best);
    assert_false(cache_get_tuning(c, "other-device", "bucket", "fwd", &best, &us));
    cache_close(c);

    cache_verify_result r;
    assert_int_equal(cache_verify(path, NULL, 0, &r, &warn), FJ_OK);
    assert_int_equal(r.rows, 1);
    assert_false(r.is_signed);
}

/* Stores a kernel row whose text is name and binary is name's bytes repeated; returns the key. */
static void put_named(fj_cache *c, const char *name, char key[65])
{
    fj__err warn = {{0}};
    char bin[64];
    for (size_t i = 0; i < sizeof bin; i++)
        bin[i] = name[i % strlen(name)];
    fj__sha256_hex(name, strlen(name), key);
    cache_put_kernel(c, key, "opencl", "t", "d", name, bin, sizeof bin, 1, NULL, &warn);
    assert_string_equal(warn.msg, "");
}

/* Each row's checksum covers its key and binary: two rows whose binaries (with their
** checksums) were swapped by someone writing the file are misses, and verify reports them. */
static void test_binaries_are_bound_to_their_keys(void **state)
{
    (void)state;
    char path[512];
    path_in_tmp(path, sizeof path, "swap.db");
    fj__err warn = {{0}};
    fj_cache *c = NULL;
    cache_options o = {.path = path};
    assert_int_equal(cache_open(&o, &c, &warn), FJ_OK);
    char causal[65], plain[65];
    put_named(c, "causal=1", causal);
    put_named(c, "causal=0", plain);
    assert_int_equal(
        sqlite3_exec(cache_user_db(c),
                     "CREATE TEMP TABLE t AS SELECT key, binary, checksum FROM kernels;"
                     "UPDATE kernels SET binary = (SELECT binary FROM t WHERE t.key != "
                     "kernels.key), checksum = (SELECT checksum FROM t WHERE t.key != "
                     "kernels.key);",
                     NULL, NULL, NULL),
        SQLITE_OK);
    void *got = NULL;
    size_t size = 0;
    assert_int_equal(cache_get_kernel(c, causal, "causal=1", &got, &size, &warn), CACHE_MISS);
    assert_int_equal(cache_get_kernel(c, plain, "causal=0", &got, &size, &warn), CACHE_MISS);
    /* A damaged row is recompiled with a warning, not silently. */
    assert_non_null(strstr(warn.msg, "is damaged (its checksum does not match)"));
    cache_close(c);
    cache_verify_result r;
    fj__err err = {{0}};
    assert_int_equal(cache_verify(path, NULL, 0, &r, &err), FJ_ERR_CACHE);
    assert_int_equal(r.damaged, 2);
}

/* A shipped cache with trusted keys: used only when signed by one of them and unchanged since;
** only its signed rows hit, even if the file changes while open. */
static void test_signed_shipped_caches(void **state)
{
    (void)state;
    char path[512];
    path_in_tmp(path, sizeof path, "signed.db");
    fj__err warn = {{0}}, err = {{0}};
    fj_cache *c = NULL;
    cache_options o = {.path = path};
    assert_int_equal(cache_open(&o, &c, &warn), FJ_OK);
    char k1[65], k2[65], k3[65];
    put_named(c, "variant one", k1);
    put_named(c, "variant two", k2);
    cache_put_tuning(c, "fp", "bucket", "fwd", "tile_m=64", 12.0, "[]", &warn);
    cache_close(c);

    fj__public_key pk, other;
    unsigned char sk[64], other_sk[64];
    char signer[65], pk_hex[65];
    assert_int_equal(fj__sign_keypair(pk.bytes, sk), 0);
    assert_int_equal(fj__sign_keypair(other.bytes, other_sk), 0);
    fj__hex_encode(pk.bytes, 32, pk_hex);
    cache_verify_result r;
    assert_int_equal(cache_verify(path, &pk, 1, &r, &err), FJ_ERR_CACHE);
    assert_non_null(strstr(err.msg, "not signed"));
    assert_int_equal(cache_sign(path, sk, signer, &err), FJ_OK);
    assert_string_equal(signer, pk_hex);
    assert_int_equal(cache_verify(path, &pk, 1, &r, &err), FJ_OK);
    assert_true(r.is_signed);
    assert_string_equal(r.signer, pk_hex);

    const char *shipped[] = {path, NULL};
    void *got = NULL;
    size_t size = 0;
    /* Trusted: hits. Another key only: not used, with the reason. */
    cache_options ship = {.shipped = shipped, .trusted = &pk, .ntrusted = 1};
    assert_int_equal(cache_open(&ship, &c, &warn), FJ_OK);
    assert_string_equal(warn.msg, "");
    assert_int_equal(cache_get_kernel(c, k1, "variant one", &got, &size, &warn), CACHE_SHIPPED);
    free(got);
    char *best = NULL;
    double us = 0;
    assert_true(cache_get_tuning(c, "fp", "bucket", "fwd", &best, &us));
    assert_string_equal(best, "tile_m=64");
    free(best);
    /* A tuning record changed in the file after it was verified is not the one signed: the
    ** lookup gives the signed record (pages read before) or none, never the new one. */
    sqlite3 *edit = NULL;
    assert_int_equal(sqlite3_open(path, &edit), SQLITE_OK);
    assert_int_equal(sqlite3_exec(edit,
                                  "PRAGMA journal_mode=DELETE; UPDATE tunings SET best_config = "
                                  "'tile_m=16'",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(edit);
    best = NULL;
    if (cache_get_tuning(c, "fp", "bucket", "fwd", &best, &us))
        assert_string_equal(best, "tile_m=64");
    free(best);
    assert_int_equal(sqlite3_open(path, &edit), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(edit, "UPDATE tunings SET best_config = 'tile_m=64'", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(edit);

    /* A row added to the file after it was opened (and verified) is not among the signed ones. */
    fj_cache *writer = NULL;
    cache_options wo = {.path = path};
    assert_int_equal(cache_open(&wo, &writer, &warn), FJ_OK);
    put_named(writer, "variant three", k3);
    cache_close(writer); /* checkpoints the row into the file itself */
    assert_int_equal(cache_get_kernel(c, k3, "variant three", &got, &size, &warn), CACHE_MISS);
    cache_close(c);

    /* Now the file's contents differ from what was signed: not used at all. */
    assert_int_equal(cache_open(&ship, &c, &warn), FJ_OK);
    assert_non_null(strstr(warn.msg, "does not match its contents"));
    assert_int_equal(cache_get_kernel(c, k2, "variant two", &got, &size, &warn), CACHE_MISS);
    cache_close(c);
    assert_int_equal(cache_open(&wo, &writer, &warn), FJ_OK);
    cache_forget_kernel(writer, k3);
    cache_close(writer);
    warn.msg[0] = '\0';

    cache_options wrong = {.shipped = shipped, .trusted = &other, .ntrusted = 1};
    assert_int_equal(cache_open(&wrong, &c, &warn), FJ_OK);
    assert_non_null(strstr(warn.msg, "not signed by a trusted key"));
    assert_int_equal(cache_get_kernel(c, k1, "variant one", &got, &size, &warn), CACHE_MISS);
    cache_close(c);
    warn.msg[0] = '\0';

    /* Changing a tuning record breaks the signature too; without trusted keys the file is used
    ** as it is. */
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db, "UPDATE tunings SET best_config = 'tile_m=128'", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(cache_open(&ship, &c, &warn), FJ_OK);
    assert_non_null(strstr(warn.msg, "does not match"));
    cache_close(c);
    cache_options trusting = {.shipped = shipped};
    warn.msg[0] = '\0';
    assert_int_equal(cache_open(&trusting, &c, &warn), FJ_OK);
    assert_string_equal(warn.msg, "");
    assert_int_equal(cache_get_kernel(c, k1, "variant one", &got, &size, &warn), CACHE_SHIPPED);
    free(got);
    cache_close(c);

    /* Pruning drops the signature (it covered the rows pruned). */
    assert_int_equal(cache_sign(path, sk, signer, &err), FJ_OK);
    int64_t deleted = 0;
    assert_int_equal(cache_prune(path, -1, "d", &deleted, &err), FJ_OK);
    assert_int_equal(cache_verify(path, NULL, 0, &r, &err), FJ_OK);
    assert_false(r.is_signed);
}

/* A cache whose first page (the header) is garbage cannot say it is ours. At the library's own
** location it is moved aside and replaced; anywhere else it is left alone and not used. */
static void test_damaged_header(void **state)
{
    (void)state;
    char path[512];
    path_in_tmp(path, sizeof path, "header.db");
    for (int own = 0; own < 2; own++) {
        fj__err warn = {{0}};
        fj_cache *c = NULL;
        cache_options o = {.path = path, .own_file = own};
        assert_int_equal(cache_open(&o, &c, &warn), FJ_OK);
        char key[65];
        put_named(c, "some variant", key);
        cache_close(c);
        FILE *f = fopen(path, "r+b");
        assert_non_null(f);
        for (int i = 0; i < 100; i++)
            fputc(0x5a, f);
        fclose(f);
        assert_int_equal(cache_open(&o, &c, &warn), FJ_OK);
        if (own) {
            assert_non_null(strstr(warn.msg, "moved to"));
            assert_true(cache_writable(c));
        } else {
            assert_non_null(strstr(warn.msg, "is not used"));
            assert_false(cache_writable(c));
        }
        cache_close(c);
        unlink(path);
    }
}

static void test_store_full_is_a_warning(void **state)
{
    (void)state;
    char path[512];
    path_in_tmp(path, sizeof path, "full.db");
    fj__err warn = {{0}};
    fj_cache *c = NULL;
    cache_options o = {.path = path};
    assert_int_equal(cache_open(&o, &c, &warn), FJ_OK);
    /* Cap the file at its current size: the next insert fails with SQLITE_FULL. */
    assert_int_equal(sqlite3_exec(cache_user_db(c), "PRAGMA max_page_count = 1", NULL, NULL, NULL),
                     SQLITE_OK);
    static unsigned char big[100000];
    cache_put_kernel(c, "k", "opencl", "t", "d", "text", big, sizeof big, 1, NULL, &warn);
    /* The cause, not the failed rollback's "no transaction is active". */
    assert_non_null(strstr(warn.msg, "cannot store a kernel (database or disk is full)"));
    void *got = NULL;
    size_t size;
    assert_int_equal(cache_get_kernel(c, "k", "text", &got, &size, &warn), CACHE_MISS);
    cache_close(c);
}

/* Many processes insert and look up overlapping keys at once; none may see an error, every
** key must end up stored once, and the file must verify. */
static void test_concurrent_processes(void **state)
{
    (void)state;
    char path[512];
    path_in_tmp(path, sizeof path, "concurrent.db");
    enum { WORKERS = 8 };
    pid_t pids[WORKERS];
    char ids[WORKERS][8];
    for (int i = 0; i < WORKERS; i++) {
        snprintf(ids[i], sizeof ids[i], "%d", i);
        char *args[] = {"hammer", path, ids[i], NULL};
        spawn_worker(args, &pids[i]);
    }
    for (int i = 0; i < WORKERS; i++) {
        int status = 0;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("worker %d failed (status 0x%x)", i, status);
    }
    cache_verify_result r;
    fj__err err = {{0}};
    assert_int_equal(cache_verify(path, NULL, 0, &r, &err), FJ_OK);
    assert_int_equal(r.rows, 24);
}

/* Worker body: 150 rounds over 24 shared keys; a hit must hold exactly the expected bytes. */
static int hammer(const char *path, int id)
{
    fj__err warn = {{0}};
    fj_cache *c = NULL;
    cache_options o = {.path = path, .busy_timeout_ms = 30000};
    if (cache_open(&o, &c, &warn) != FJ_OK || warn.msg[0] || !cache_writable(c)) {
        fprintf(stderr, "worker %d: open: %s\n", id, warn.msg);
        return 1;
    }
    int errors = 0;
    for (int round = 0; round < 150; round++) {
        int j = (id * 7 + round * 5) % 24;
        char text[64], key[65];
        snprintf(text, sizeof text, "variant=%d\n", j);
        fj__sha256_hex(text, strlen(text), key);
        unsigned char bin[2000];
        for (size_t b = 0; b < sizeof bin; b++)
            bin[b] = (unsigned char)(j * 31 + b);
        void *got = NULL;
        size_t size = 0;
        cache_origin origin = cache_get_kernel(c, key, text, &got, &size, &warn);
        if (origin == CACHE_USER) {
            errors += size != sizeof bin || memcmp(got, bin, size) != 0;
            free(got);
        } else {
            cache_put_kernel(c, key, "opencl", "target", "device", text, bin, sizeof bin, 1.0, NULL,
                             &warn);
        }
        if (warn.msg[0]) {
            fprintf(stderr, "worker %d: %s\n", id, warn.msg);
            errors++;
            warn.msg[0] = '\0';
        }
    }
    cache_close(c);
    return errors ? 1 : 0;
}

/* ---- through the library ------------------------------------------------------------------- */

static void test_second_context_and_process_hit(void **state)
{
    (void)state;
    need_device();
    char path[512];
    path_in_tmp(path, sizeof path, "second.db");
    copy_file(golden, path);
    assert_int_equal(run_with_cache(path, NULL, NULL, 0), FJ_KERNEL_USER_CACHE);
    char *args[] = {"run", path, NULL};
    assert_int_equal(spawn_worker(args, NULL), FJ_KERNEL_USER_CACHE);
}

static void test_template_change_misses(void **state)
{
    (void)state;
    need_device();
    char path[512], dir[512], tpl[600];
    path_in_tmp(path, sizeof path, "template.db");
    copy_file(golden, path);
    path_in_tmp(dir, sizeof dir, "templates");
    mkdir(dir, 0777);
    snprintf(tpl, sizeof tpl, "%s/dialect.lua", dir);
    /* The embedded helper plus one comment: same kernel, different template set. */
    FILE *f = fopen(tpl, "w");
    assert_non_null(f);
    for (size_t i = 0; i < tpl_embedded_count; i++)
        if (!strcmp(tpl_embedded_files[i].name, "dialect.lua"))
            fputs(tpl_embedded_files[i].text, f);
    fputs("/* edited */\n", f);
    fclose(f);
    setenv("FLASHJIT_TEMPLATE_DIR", dir, 1);
    fj_kernel_source s = run_with_cache(path, NULL, NULL, 0);
    unsetenv("FLASHJIT_TEMPLATE_DIR");
    assert_int_equal(s, FJ_KERNEL_COMPILED);
    /* The original templates still hit their own row. */
    assert_int_equal(run_with_cache(path, NULL, NULL, 0), FJ_KERNEL_USER_CACHE);
}

static void test_export_import_and_shipped(void **state)
{
    (void)state;
    need_device();
    char ship_dir[512], ship[600], user[512], empty[512];
    path_in_tmp(ship_dir, sizeof ship_dir, "ship");
    mkdir(ship_dir, 0777);
    snprintf(ship, sizeof ship, "%s/app-kernels.db", ship_dir);
    fj__err err = {{0}};
    int64_t copied = 0, skipped = 0;
    assert_int_equal(cache_export(golden, ship, NULL, &copied, &err), FJ_OK);
    assert_int_equal(copied, 1);
    /* The filter keeps only matching devices. */
    path_in_tmp(empty, sizeof empty, "filtered.db");
    assert_int_equal(cache_export(golden, empty, "no-such-gpu", &copied, &err), FJ_OK);
    assert_int_equal(copied, 0);

    /* Import into an empty cache, then a new context hits it. */
    path_in_tmp(user, sizeof user, "imported.db");
    assert_int_equal(cache_import(ship, user, &copied, &skipped, &err), FJ_OK);
    assert_int_equal(copied, 1);
    assert_int_equal(run_with_cache(user, NULL, NULL, 0), FJ_KERNEL_USER_CACHE);

    /* A shipped cache in a read-only folder, behind an empty user cache. */
    chmod(ship, 0444);
    chmod(ship_dir, 0555);
    char fresh[512];
    path_in_tmp(fresh, sizeof fresh, "fresh-user.db");
    const char *shipped[] = {ship, NULL};
    char warning[2048];
    assert_int_equal(run_with_cache(fresh, shipped, warning, sizeof warning),
                     FJ_KERNEL_SHIPPED_CACHE);
    assert_string_equal(warning, "");
    /* A shipped cache that is not a cache is skipped with a warning. */
    const char *bad[] = {"/nonexistent/kernels.db", ship, NULL};
    assert_int_equal(run_with_cache(":memory:", bad, warning, sizeof warning),
                     FJ_KERNEL_SHIPPED_CACHE);
    assert_non_null(strstr(warning, "/nonexistent/kernels.db"));
    chmod(ship_dir, 0755);
}

typedef enum damage {
    TRUNCATE,
    RANDOM_PAGES,
    FLIP_BLOB,
    OTHER_VERSION,
    FOREIGN_DB,
    RANDOM_FILE,
    UNWRITABLE_DIR,
    PARENT_IS_FILE,
    LOCKED
} damage;

static const char *damage_names[] = {"truncate",      "random pages",     "flip blob bits",
                                     "user_version",  "foreign db",       "random bytes",
                                     "read-only dir", "parent is a file", "locked"};

static void flip_inside_blob(const char *path)
{
    /* Find 32 bytes of the stored binary in the file and flip a bit in their middle. The blob
    ** may be split across database pages, so several slices are tried. */
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT binary FROM kernels", -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int blob_size = sqlite3_column_bytes(st, 0);
    unsigned char *blob = malloc(blob_size > 0 ? (size_t)blob_size : 1);
    assert_non_null(blob);
    memcpy(blob, sqlite3_column_blob(st, 0), (size_t)blob_size);
    sqlite3_finalize(st);
    sqlite3_close(db);
    long size = file_size(path);
    assert_true(size > 0);
    unsigned char *buf = malloc(size > 0 ? (size_t)size : 1);
    assert_non_null(buf);
    FILE *f = fopen(path, "r+b");
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    long at = -1;
    for (int slice = 0; slice + 32 <= blob_size && at < 0; slice += 97)
        for (long i = 0; i + 32 <= size && at < 0; i++)
            if (!memcmp(buf + i, blob + slice, 32))
                at = i + 16;
    assert_true(at >= 0);
    fseek(f, at, SEEK_SET);
    unsigned char byte = buf[at] ^ 0x10;
    fwrite(&byte, 1, 1, f);
    fclose(f);
    free(buf);
    free(blob);
}

static void apply_damage(damage d, const char *path)
{
    long size = file_size(path);
    FILE *f;
    switch (d) {
    case TRUNCATE: assert_int_equal(truncate(path, size / 2), 0); break;
    case RANDOM_PAGES:
        f = fopen(path, "r+b");
        srand((unsigned)getpid());
        fseek(f, 4096, SEEK_SET); /* keep the header: the pages behind it are noise */
        for (long i = 4096; i < size; i++)
            fputc(rand() & 0xff, f);
        fclose(f);
        break;
    case FLIP_BLOB: flip_inside_blob(path); break;
    case OTHER_VERSION:
    case FOREIGN_DB: {
        sqlite3 *db = NULL;
        assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
        const char *sql = d == OTHER_VERSION ? "PRAGMA user_version = 99"
                                             : "PRAGMA application_id = 0; CREATE TABLE theirs(x); "
                                               "INSERT INTO theirs VALUES (42)";
        assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
        break;
    }
    case RANDOM_FILE:
        f = fopen(path, "wb");
        for (int i = 0; i < 10000; i++)
            fputc(rand() & 0xff, f);
        fclose(f);
        break;
    default: break;
    }
}

static void test_every_damage_still_computes(void **state)
{
    (void)state;
    need_device();
    for (int d = TRUNCATE; d <= LOCKED; d++) {
        char dir[512], path[600];
        snprintf(dir, sizeof dir, "%s/damage-%d", tmpdir, d);
        mkdir(dir, 0777);
        snprintf(path, sizeof path, "%s/kernels.db", dir);
        if (d != PARENT_IS_FILE)
            copy_file(golden, path);
        sqlite3 *locker = NULL;
        if (d == UNWRITABLE_DIR) {
            chmod(path, 0444);
            chmod(dir, 0555);
        } else if (d == PARENT_IS_FILE) {
            FILE *f = fopen(path, "w"); /* kernels.db is a file: kernels.db/x.db cannot exist */
            fclose(f);
            strcat(path, "/x.db");
        } else if (d == LOCKED) {
            /* In WAL mode readers pass a writer's lock (and do hit); with a rollback journal
            ** an exclusive lock blocks everyone. */
            assert_int_equal(sqlite3_open(path, &locker), SQLITE_OK);
            assert_int_equal(sqlite3_exec(locker,
                                          "PRAGMA journal_mode=DELETE; BEGIN EXCLUSIVE; "
                                          "UPDATE kernels SET last_used = 0",
                                          NULL, NULL, NULL),
                             SQLITE_OK);
            setenv("FLASHJIT_CACHE_TIMEOUT_MS", "50", 1);
        } else {
            apply_damage((damage)d, path);
        }
        char warning[2048];
        fj_kernel_source s = run_with_cache(path, NULL, warning, sizeof warning);
        printf("  %-16s -> kernel from %d; warning: %.160s\n", damage_names[d], s,
               warning[0] ? warning : "(none)");
        /* Damage that cannot hit (a flipped blob, unusable or locked files) must recompile. */
        if (d != UNWRITABLE_DIR && d != PARENT_IS_FILE)
            assert_int_equal(s, FJ_KERNEL_COMPILED);
        if (d == TRUNCATE || d == RANDOM_FILE || d == FOREIGN_DB || d == OTHER_VERSION ||
            d == PARENT_IS_FILE || d == LOCKED)
            assert_true(strlen(warning) > 0);
        if (d == TRUNCATE) { /* ours but damaged: moved aside and started afresh, then it hits */
            char aside[700];
            snprintf(aside, sizeof aside, "%s.damaged", path);
            assert_true(file_size(aside) > 0);
            assert_int_equal(run_with_cache(path, NULL, NULL, 0), FJ_KERNEL_USER_CACHE);
        }
        if (d == FOREIGN_DB) { /* another application's data is left alone */
            sqlite3 *db = NULL;
            assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
            sqlite3_stmt *st = NULL;
            assert_int_equal(sqlite3_prepare_v2(db, "SELECT x FROM theirs", -1, &st, NULL),
                             SQLITE_OK);
            assert_int_equal(sqlite3_step(st), SQLITE_ROW);
            assert_int_equal(sqlite3_column_int(st, 0), 42);
            sqlite3_finalize(st);
            sqlite3_close(db);
        }
        if (d == FLIP_BLOB) { /* the bad row was replaced by the rebuilt kernel */
            cache_verify_result r;
            fj__err err = {{0}};
            assert_int_equal(cache_verify(path, NULL, 0, &r, &err), FJ_OK);
            assert_int_equal(r.damaged, 0);
        }
        /* A second process on the same file also computes correctly, whatever it finds. */
        fj_kernel_source again = run_with_cache(path, NULL, warning, sizeof warning);
        printf("  %-16s    again: kernel from %d; warning: %.120s\n", "", again,
               warning[0] ? warning : "(none)");
        if (locker) {
            sqlite3_exec(locker, "ROLLBACK", NULL, NULL, NULL);
            sqlite3_close(locker);
            unsetenv("FLASHJIT_CACHE_TIMEOUT_MS");
        }
        chmod(dir, 0755);
    }
}

static void test_verify_reports_damage(void **state)
{
    (void)state;
    need_device();
    char path[512];
    path_in_tmp(path, sizeof path, "verify.db");
    copy_file(golden, path);
    cache_verify_result r;
    fj__err err = {{0}};
    assert_int_equal(cache_verify(path, NULL, 0, &r, &err), FJ_OK);
    flip_inside_blob(path);
    assert_int_equal(cache_verify(path, NULL, 0, &r, &err), FJ_ERR_CACHE);
    assert_non_null(strstr(err.msg, "damaged"));
}

/* ---- worker mode ----------------------------------------------------------------------------- */

static int worker(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[2], "run"))
        return (int)run_with_cache(argv[3], NULL, NULL, 0);
    if (argc >= 5 && !strcmp(argv[2], "hammer"))
        return hammer(argv[3], atoi(argv[4]));
    return 99;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--worker"))
        return worker(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_roundtrip_and_mismatches),
        cmocka_unit_test(test_store_full_is_a_warning),
        cmocka_unit_test(test_binaries_are_bound_to_their_keys),
        cmocka_unit_test(test_damaged_header),
        cmocka_unit_test(test_signed_shipped_caches),
        cmocka_unit_test(test_concurrent_processes),
        cmocka_unit_test(test_second_context_and_process_hit),
        cmocka_unit_test(test_template_change_misses),
        cmocka_unit_test(test_export_import_and_shipped),
        cmocka_unit_test(test_every_damage_still_computes),
        cmocka_unit_test(test_verify_reports_damage),
    };
    return cmocka_run_group_tests_name("cache", tests, setup, teardown);
}
