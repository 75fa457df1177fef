/* The SQLite kernel cache. See cache.h for the contract; the rules that shape this file:
**  - every SQLite failure on a lookup is a miss, on a store a warning: never a failed call;
**  - a file that is not ours (another application's, a newer schema, not a database at all) is
**    left alone, never overwritten;
**  - a row hits only if its variant text and binary checksum match, so a damaged or foreign row
**    can never run;
**  - writes use BEGIN IMMEDIATE (a deferred transaction that upgrades ignores busy_timeout), and
**    compiles happen outside any transaction. */
#define _POSIX_C_SOURCE 200809L
#include "cache.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CACHE_DEFAULT_BUSY_MS 5000
#define CACHE_MAX_SHIPPED 16

struct fj_cache {
    sqlite3 *user;
    int writable;
    char *path; /* the user cache's path, to start afresh when it turns out damaged */
    int readonly;
    int busy_ms;
    sqlite3 *shipped[CACHE_MAX_SHIPPED];
    int nshipped;
};

static const char *const schema_sql =
    "CREATE TABLE IF NOT EXISTS kernels("
    " key TEXT PRIMARY KEY," /* SHA-256 of variant_text */
    " backend TEXT NOT NULL,"
    " target TEXT NOT NULL," /* compile target and compiler version */
    " device TEXT NOT NULL," /* the device it was built on, or 'offline' */
    " variant_text TEXT NOT NULL,"
    " binary BLOB NOT NULL,"
    " binary_sha256 TEXT NOT NULL,"
    " compile_ms REAL,"
    " log TEXT,"
    " created INTEGER NOT NULL,"
    " last_used INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS tunings("
    " fingerprint TEXT NOT NULL,"
    " problem_bucket TEXT NOT NULL,"
    " variant_base TEXT NOT NULL,"
    " best_config TEXT NOT NULL,"
    " measured_us REAL,"
    " all_results_json TEXT,"
    " created INTEGER NOT NULL,"
    " PRIMARY KEY(fingerprint, problem_bucket, variant_base));";

/* SQL function fj_sha256(x): hex SHA-256 of a blob or text, so checks run inside queries. */
static void sql_sha256(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    const void *data = sqlite3_value_blob(argv[0]);
    int n = sqlite3_value_bytes(argv[0]);
    char hex[65];
    fj__sha256_hex(data ? data : "", (size_t)n, hex);
    sqlite3_result_text(ctx, hex, 64, SQLITE_TRANSIENT);
}

static int64_t now_s(void)
{
    return (int64_t)time(NULL);
}

static int busy_ms(const cache_options *o)
{
    if (o && o->busy_timeout_ms > 0)
        return o->busy_timeout_ms;
    const char *env = getenv("FLASHJIT_CACHE_TIMEOUT_MS");
    int ms = env ? atoi(env) : 0;
    return ms > 0 ? ms : CACHE_DEFAULT_BUSY_MS;
}

/* Creates every missing parent folder of path. */
static int make_parents(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return 0;
}

/* Runs one statement whose result is a single integer (a PRAGMA). -1 on failure. */
static int64_t query_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static int exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* Creates (or, for an older schema of ours, recreates) the tables inside one write
** transaction. Another process may be doing the same: the checks are repeated under the lock. */
static int create_schema(sqlite3 *db, int64_t version)
{
    if (exec(db, "BEGIN IMMEDIATE") != SQLITE_OK)
        return -1;
    int rc = SQLITE_OK;
    if (version > 0 && version < CACHE_SCHEMA_VERSION)
        rc = exec(db, "DROP TABLE IF EXISTS kernels; DROP TABLE IF EXISTS tunings;");
    char pragmas[128];
    snprintf(pragmas, sizeof pragmas, "PRAGMA application_id=%d; PRAGMA user_version=%d;",
             CACHE_APPLICATION_ID, CACHE_SCHEMA_VERSION);
    if (rc == SQLITE_OK)
        rc = exec(db, schema_sql);
    if (rc == SQLITE_OK)
        rc = exec(db, pragmas);
    if (rc == SQLITE_OK)
        rc = exec(db, "COMMIT");
    if (rc != SQLITE_OK)
        exec(db, "ROLLBACK");
    return rc == SQLITE_OK ? 0 : -1;
}

/* Checks that db is a flashjit cache of this schema; creates the schema in an empty file when
** may_create. Returns 0 when usable, else -1 (or -2 for a damaged file) with the reason in
** why. */
static int check_schema(sqlite3 *db, int may_create, char *why, size_t why_size)
{
    /* One read transaction, so that the three values come from one snapshot even while another
    ** process is creating the schema. */
    int in_txn = exec(db, "BEGIN") == SQLITE_OK;
    int64_t tables = query_int(db, "SELECT count(*) FROM sqlite_master");
    int64_t app = tables < 0 ? -1 : query_int(db, "PRAGMA application_id");
    int64_t version = tables < 0 ? -1 : query_int(db, "PRAGMA user_version");
    int code = sqlite3_errcode(db);
    if (tables < 0)
        snprintf(why, why_size, "not a readable SQLite database (%s)", sqlite3_errmsg(db));
    if (in_txn)
        exec(db, "COMMIT");
    if (tables < 0) /* -2: the file is damaged (or not a database at all) */
        return code == SQLITE_CORRUPT || code == SQLITE_NOTADB ? -2 : -1;
    if (tables == 0 && app == 0 && version == 0) {
        if (may_create && create_schema(db, 0) == 0)
            return 0;
        snprintf(why, why_size, "empty, and the schema could not be created (%s)",
                 sqlite3_errmsg(db));
        return -1;
    }
    if (app != CACHE_APPLICATION_ID) {
        snprintf(why, why_size, "not a flashjit cache (application_id 0x%llx)",
                 (unsigned long long)app);
        return -1;
    }
    if (version > CACHE_SCHEMA_VERSION) {
        snprintf(why, why_size, "schema version %lld is newer than this library's %d",
                 (long long)version, CACHE_SCHEMA_VERSION);
        return -1;
    }
    if (version < CACHE_SCHEMA_VERSION) {
        if (may_create && create_schema(db, version) == 0)
            return 0;
        snprintf(why, why_size, "schema version %lld is older than %d and cannot be migrated here",
                 (long long)version, CACHE_SCHEMA_VERSION);
        return -1;
    }
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "SELECT key, variant_text, binary, binary_sha256 FROM kernels",
                                -1, &st, NULL);
    sqlite3_finalize(st);
    if (rc != SQLITE_OK) {
        snprintf(why, why_size, "damaged schema (%s)", sqlite3_errmsg(db));
        return -1;
    }
    return 0;
}

/* Writes path as a file: URI with the characters URIs reserve escaped. */
static void file_uri(const char *path, const char *query, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "file:");
    for (const char *p = path; *p && n + 4 < size; p++) {
        if (*p == '%' || *p == '?' || *p == '#')
            n += (size_t)snprintf(buf + n, size - n, "%%%02X", (unsigned char)*p);
        else
            buf[n++] = *p;
    }
    snprintf(buf + n, size - n, "?%s", query);
}

/* Opens one database. mode: 0 read-write (created if missing), 1 read-only, 2 immutable. */
static sqlite3 *open_db(const char *path, int mode, int busy, char *why, size_t why_size)
{
    sqlite3 *db = NULL;
    char uri[4200];
    int flags = SQLITE_OPEN_URI | SQLITE_OPEN_FULLMUTEX;
    if (mode == 0) {
        file_uri(path, "mode=rwc", uri, sizeof uri);
        flags |= SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    } else {
        file_uri(path, mode == 2 ? "immutable=1" : "mode=ro", uri, sizeof uri);
        flags |= SQLITE_OPEN_READONLY;
    }
    if (sqlite3_open_v2(uri, &db, flags, NULL) != SQLITE_OK) {
        snprintf(why, why_size, "cannot open (%s)", db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, busy);
    sqlite3_create_function(db, "fj_sha256", 1, SQLITE_UTF8 | SQLITE_DETERMINISTIC, NULL,
                            sql_sha256, NULL, NULL);
    return db;
}

/* Whether the file at path says it is a flashjit cache in its SQLite header (application_id,
** a big-endian word at offset 68), readable even when the rest of the file is damaged. */
static int header_is_ours(const char *path)
{
    unsigned char h[72];
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    uint32_t app = (uint32_t)h[68] << 24 | (uint32_t)h[69] << 16 | (uint32_t)h[70] << 8 | h[71];
    return n == sizeof h && memcmp(h, "SQLite format 3", 16) == 0 && app == CACHE_APPLICATION_ID;
}

/* Moves a damaged cache of ours aside (PATH.damaged) so that a fresh one can take its place.
** Files that are not ours are never touched. Returns 0 when moved. */
static int move_aside(const char *path, fj__err *warn)
{
    if (!header_is_ours(path))
        return -1;
    char aside[4200], side[4200];
    snprintf(aside, sizeof aside, "%s.damaged", path);
    if (rename(path, aside) != 0)
        return -1;
    const char *suffixes[] = {"-wal", "-shm", "-journal"};
    for (int i = 0; i < 3; i++) {
        snprintf(side, sizeof side, "%s%s", path, suffixes[i]);
        unlink(side);
    }
    fj__append(warn, "kernel cache %s was damaged: moved to %s and started afresh", path, aside);
    return 0;
}

/* Opens the user cache read-write, falling back to read-only; NULL when neither works. */
static sqlite3 *open_user(const char *path, int readonly, int busy, int *writable, fj__err *warn)
{
    char why[512] = "";
    *writable = 0;
    sqlite3 *db = NULL;
    if (!readonly) {
        if (make_parents(path) != 0)
            snprintf(why, sizeof why, "cannot create its folder (%s)", strerror(errno));
        else
            db = open_db(path, 0, busy, why, sizeof why);
        for (int attempt = 0; db && attempt < 2; attempt++) {
            /* WAL lets readers and one writer work at once. It fails on some file systems
            ** (network ones, read-only folders); the rollback journal still works there. */
            exec(db, "PRAGMA journal_mode=WAL");
            exec(db, "PRAGMA synchronous=NORMAL");
            int checked = check_schema(db, 1, why, sizeof why);
            if (checked == 0) {
                *writable = 1;
                return db;
            }
            int code = checked == -2 ? SQLITE_CORRUPT : sqlite3_errcode(db);
            sqlite3_close(db);
            db = NULL;
            int damaged = code == SQLITE_CORRUPT || code == SQLITE_NOTADB;
            if (attempt == 0 && damaged && move_aside(path, warn) == 0)
                db = open_db(path, 0, busy, why, sizeof why);
        }
    }
    if (access(path, R_OK) == 0) {
        char why_ro[512] = "";
        db = open_db(path, 1, busy, why_ro, sizeof why_ro);
        if (db && check_schema(db, 0, why_ro, sizeof why_ro) == 0) {
            if (!readonly)
                fj__append(warn, "kernel cache %s is read-only here: %s", path, why);
            return db;
        }
        sqlite3_close(db);
        if (!why[0])
            snprintf(why, sizeof why, "%s", why_ro);
    }
    fj__append(warn, "kernel cache %s is not used (%s); kernels are kept in memory only", path,
               why[0] ? why : "missing");
    return NULL;
}

fj_status cache_open(const cache_options *o, fj_cache **out, fj__err *warn)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return fj__fail(warn, FJ_ERR_OUT_OF_MEMORY, "out of memory for the kernel cache");
    fj_cache *c = *out;
    int busy = busy_ms(o);
    c->busy_ms = busy;
    c->readonly = o->readonly;
    if (o->path && o->path[0] && strcmp(o->path, ":memory:") != 0) {
        c->path = fj__strdup(o->path);
        c->user = open_user(o->path, o->readonly, busy, &c->writable, warn);
    }
    for (const char *const *p = o->shipped; p && *p && c->nshipped < CACHE_MAX_SHIPPED; p++) {
        char why[512] = "";
        sqlite3 *db = open_db(*p, 2, busy, why, sizeof why);
        if (db && check_schema(db, 0, why, sizeof why) == 0) {
            c->shipped[c->nshipped++] = db;
            continue;
        }
        sqlite3_close(db);
        fj__append(warn, "shipped cache %s is not used (%s)", *p, why);
    }
    return FJ_OK;
}

void cache_close(fj_cache *c)
{
    if (!c)
        return;
    sqlite3_close(c->user);
    for (int i = 0; i < c->nshipped; i++)
        sqlite3_close(c->shipped[i]);
    free(c->path);
    free(c);
}

sqlite3 *cache_user_db(fj_cache *c)
{
    return c ? c->user : NULL;
}

int cache_writable(const fj_cache *c)
{
    return c && c->user && c->writable;
}

/* Looks key up in one database; a hit needs matching text and checksum. */
static int lookup(sqlite3 *db, const char *key, const char *variant_text, void **binary,
                  size_t *size)
{
    sqlite3_stmt *st = NULL;
    int hit = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT variant_text, binary, binary_sha256 FROM kernels WHERE key = ?",
                           -1, &st, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        const char *text = (const char *)sqlite3_column_text(st, 0);
        const void *blob = sqlite3_column_blob(st, 1);
        int n = sqlite3_column_bytes(st, 1);
        const char *sum = (const char *)sqlite3_column_text(st, 2);
        char hex[65];
        if (text && blob && n > 0 && sum && strcmp(text, variant_text) == 0) {
            fj__sha256_hex(blob, (size_t)n, hex);
            if (strcmp(hex, sum) == 0 && (*binary = malloc((size_t)n))) {
                memcpy(*binary, blob, (size_t)n);
                *size = (size_t)n;
                hit = 1;
            }
        }
    }
    sqlite3_finalize(st);
    return hit;
}

/* SQLite finds most damage only when it reads the damaged page. When the user cache reports
** it, the file is moved aside (if it is ours) and a fresh one takes its place. */
static void recover_if_damaged(fj_cache *c, fj__err *warn)
{
    int code = c->user ? sqlite3_errcode(c->user) : SQLITE_OK;
    if (code != SQLITE_CORRUPT && code != SQLITE_NOTADB)
        return;
    sqlite3_close(c->user);
    c->user = NULL;
    c->writable = 0;
    if (c->readonly || move_aside(c->path, warn) != 0) {
        fj__append(warn, "kernel cache %s is damaged; kernels are kept in memory only", c->path);
        return;
    }
    c->user = open_user(c->path, 0, c->busy_ms, &c->writable, warn);
}

cache_origin cache_get_kernel(fj_cache *c, const char *key, const char *variant_text, void **binary,
                              size_t *size, fj__err *warn)
{
    *binary = NULL;
    *size = 0;
    if (!c)
        return CACHE_MISS;
    int hit = c->user && lookup(c->user, key, variant_text, binary, size);
    if (!hit)
        recover_if_damaged(c, warn);
    if (hit) {
        if (c->writable) {
            sqlite3_stmt *st = NULL;
            if (sqlite3_prepare_v2(c->user, "UPDATE kernels SET last_used = ? WHERE key = ?", -1,
                                   &st, NULL) == SQLITE_OK) {
                sqlite3_bind_int64(st, 1, now_s());
                sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
                sqlite3_step(st); /* best effort: a busy database just keeps the old time */
            }
            sqlite3_finalize(st);
        }
        return CACHE_USER;
    }
    for (int i = 0; i < c->nshipped; i++)
        if (lookup(c->shipped[i], key, variant_text, binary, size))
            return CACHE_SHIPPED;
    return CACHE_MISS;
}

/* Runs a prepared write in its own IMMEDIATE transaction. Returns SQLITE_OK or the error. */
static int write_one(sqlite3 *db, sqlite3_stmt *st)
{
    int rc = exec(db, "BEGIN IMMEDIATE");
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        rc = rc == SQLITE_DONE ? exec(db, "COMMIT") : rc;
        if (rc != SQLITE_OK)
            exec(db, "ROLLBACK");
    }
    return rc;
}

void cache_put_kernel(fj_cache *c, const char *key, const char *backend, const char *target,
                      const char *device, const char *variant_text, const void *binary, size_t size,
                      double compile_ms, const char *log, fj__err *warn)
{
    if (!cache_writable(c))
        return;
    char sum[65];
    fj__sha256_hex(binary, size, sum);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        c->user,
        "INSERT OR REPLACE INTO kernels(key, backend, target, device, variant_text, binary, "
        "binary_sha256, compile_ms, log, created, last_used) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
        -1, &st, NULL);
    if (rc == SQLITE_OK) {
        int64_t now = now_s();
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, backend, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, target, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, device, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 5, variant_text, -1, SQLITE_STATIC);
        sqlite3_bind_blob64(st, 6, binary, size, SQLITE_STATIC);
        sqlite3_bind_text(st, 7, sum, -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 8, compile_ms);
        sqlite3_bind_text(st, 9, log ? log : "", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 10, now);
        sqlite3_bind_int64(st, 11, now);
        rc = write_one(c->user, st);
    }
    if (rc != SQLITE_OK)
        fj__append(warn, "kernel cache: cannot store a kernel (%s)", sqlite3_errmsg(c->user));
    sqlite3_finalize(st);
    recover_if_damaged(c, warn);
}

void cache_forget_kernel(fj_cache *c, const char *key)
{
    if (!cache_writable(c))
        return;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(c->user, "DELETE FROM kernels WHERE key = ?", -1, &st, NULL) ==
        SQLITE_OK) {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        write_one(c->user, st);
    }
    sqlite3_finalize(st);
}

static int tuning_lookup(sqlite3 *db, const char *fingerprint, const char *bucket,
                         const char *family, char **best, double *us)
{
    sqlite3_stmt *st = NULL;
    int hit = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT best_config, measured_us FROM tunings WHERE fingerprint = ? "
                           "AND problem_bucket = ? AND variant_base = ?",
                           -1, &st, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(st, 1, fingerprint, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, bucket, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, family, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0)) {
        *best = fj__strdup((const char *)sqlite3_column_text(st, 0));
        *us = sqlite3_column_double(st, 1);
        hit = *best != NULL;
    }
    sqlite3_finalize(st);
    return hit;
}

int cache_get_tuning(fj_cache *c, const char *fingerprint, const char *bucket, const char *family,
                     char **best_config, double *measured_us)
{
    *best_config = NULL;
    if (!c)
        return 0;
    if (c->user && tuning_lookup(c->user, fingerprint, bucket, family, best_config, measured_us))
        return 1;
    for (int i = 0; i < c->nshipped; i++)
        if (tuning_lookup(c->shipped[i], fingerprint, bucket, family, best_config, measured_us))
            return 1;
    return 0;
}

void cache_put_tuning(fj_cache *c, const char *fingerprint, const char *bucket, const char *family,
                      const char *best_config, double measured_us, const char *all_results_json,
                      fj__err *warn)
{
    if (!cache_writable(c))
        return;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(c->user,
                                "INSERT OR REPLACE INTO tunings(fingerprint, problem_bucket, "
                                "variant_base, best_config, measured_us, all_results_json, "
                                "created) VALUES(?,?,?,?,?,?,?)",
                                -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, fingerprint, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, bucket, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, family, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, best_config, -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 5, measured_us);
        sqlite3_bind_text(st, 6, all_results_json ? all_results_json : "[]", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 7, now_s());
        rc = write_one(c->user, st);
    }
    if (rc != SQLITE_OK)
        fj__append(warn, "kernel cache: cannot store a tuning result (%s)",
                   sqlite3_errmsg(c->user));
    sqlite3_finalize(st);
}

/* ---- maintenance ---------------------------------------------------------------------------- */

/* Opens path for a maintenance command: mode as in open_db, schema checked. */
static fj_status open_checked(const char *path, int mode, sqlite3 **db, fj__err *err)
{
    char why[512] = "";
    if (mode == 1 && access(path, R_OK) != 0)
        return fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, strerror(errno));
    if (mode == 0 && make_parents(path) != 0)
        return fj__fail(err, FJ_ERR_CACHE, "%s: cannot create its folder (%s)", path,
                        strerror(errno));
    *db = open_db(path, mode, busy_ms(NULL), why, sizeof why);
    if (*db && check_schema(*db, mode == 0, why, sizeof why) == 0)
        return FJ_OK;
    sqlite3_close(*db);
    *db = NULL;
    return fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, why);
}

fj_status cache_list(const char *path, cache_row_fn fn, void *ud, fj__err *err)
{
    sqlite3 *db = NULL;
    fj_status s = open_checked(path, 1, &db, err);
    if (s != FJ_OK)
        return s;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT key, backend, target, device, variant_text, length(binary), "
                           "compile_ms, created, last_used FROM kernels ORDER BY created",
                           -1, &st, NULL) != SQLITE_OK) {
        s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, sqlite3_errmsg(db));
    } else {
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            cache_row r = {
                .key = (const char *)sqlite3_column_text(st, 0),
                .backend = (const char *)sqlite3_column_text(st, 1),
                .target = (const char *)sqlite3_column_text(st, 2),
                .device = (const char *)sqlite3_column_text(st, 3),
                .variant_text = (const char *)sqlite3_column_text(st, 4),
                .size = sqlite3_column_int64(st, 5),
                .compile_ms = sqlite3_column_double(st, 6),
                .created = sqlite3_column_int64(st, 7),
                .last_used = sqlite3_column_int64(st, 8),
            };
            fn(ud, &r);
        }
        if (rc != SQLITE_DONE)
            s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, sqlite3_errmsg(db));
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return s;
}

/* A row is sound when its key is the hash of its variant text and its binary matches its
** checksum. */
#define SOUND_ROW "fj_sha256(binary) = binary_sha256 AND fj_sha256(variant_text) = key"

fj_status cache_verify(const char *path, int64_t *rows, int64_t *damaged, fj__err *err)
{
    *rows = *damaged = 0;
    sqlite3 *db = NULL;
    fj_status s = open_checked(path, 1, &db, err);
    if (s != FJ_OK)
        return s;
    sqlite3_stmt *st = NULL;
    int ok = sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK &&
             sqlite3_step(st) == SQLITE_ROW &&
             strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
    if (!ok)
        s = fj__fail(err, FJ_ERR_CACHE, "%s: SQLite integrity check failed: %s", path,
                     st && sqlite3_column_text(st, 0) ? (const char *)sqlite3_column_text(st, 0)
                                                      : sqlite3_errmsg(db));
    sqlite3_finalize(st);
    if (s == FJ_OK) {
        *rows = query_int(db, "SELECT count(*) FROM kernels");
        int64_t sound = query_int(db, "SELECT count(*) FROM kernels WHERE " SOUND_ROW);
        if (*rows < 0 || sound < 0)
            s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, sqlite3_errmsg(db));
        else if ((*damaged = *rows - sound) > 0)
            s = fj__fail(err, FJ_ERR_CACHE, "%s: %lld of %lld kernels are damaged", path,
                         (long long)*damaged, (long long)*rows);
    }
    sqlite3_close(db);
    return s;
}

/* ATTACHes src read-only as "src" after checking it is a flashjit cache of this schema. */
static fj_status attach_source(sqlite3 *db, const char *src, fj__err *err)
{
    sqlite3 *probe = NULL;
    fj_status s = open_checked(src, 1, &probe, err);
    sqlite3_close(probe);
    if (s != FJ_OK)
        return s;
    char uri[4200];
    file_uri(src, "mode=ro", uri, sizeof uri);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "ATTACH DATABASE ? AS src", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, uri, -1, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        return fj__fail(err, FJ_ERR_CACHE, "%s: cannot attach (%s)", src, sqlite3_errmsg(db));
    return FJ_OK;
}

/* Runs one statement whose ?1 is the row filter (NULL: every row); returns SQLITE_OK or an
** error code. */
static int run_filtered(sqlite3 *db, const char *sql, const char *filter)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, filter, -1, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Copies the sound kernel rows (and the tuning rows) of attached src into main. */
static fj_status copy_rows(sqlite3 *db, const char *filter, int64_t *copied, fj__err *err)
{
    int rc = exec(db, "BEGIN IMMEDIATE");
    if (rc == SQLITE_OK)
        rc = run_filtered(
            db,
            "INSERT OR REPLACE INTO main.kernels SELECT * FROM src.kernels WHERE " SOUND_ROW
            " AND (?1 IS NULL OR instr(device, ?1) > 0 OR "
            "instr(target, ?1) > 0)",
            filter);
    if (rc == SQLITE_OK)
        *copied = sqlite3_changes(db);
    if (rc == SQLITE_OK)
        rc = run_filtered(db,
                          "INSERT OR REPLACE INTO main.tunings SELECT * FROM src.tunings "
                          "WHERE ?1 IS NULL OR instr(fingerprint, ?1) > 0",
                          filter);
    if (rc == SQLITE_OK)
        rc = exec(db, "COMMIT");
    if (rc != SQLITE_OK) {
        fj_status s = fj__fail(err, FJ_ERR_CACHE, "copying kernels: %s", sqlite3_errmsg(db));
        exec(db, "ROLLBACK");
        return s;
    }
    return FJ_OK;
}

fj_status cache_export(const char *src, const char *dest, const char *filter, int64_t *copied,
                       fj__err *err)
{
    *copied = 0;
    if (strcmp(src, dest) == 0)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "export: the destination is the source");
    if (unlink(dest) != 0 && errno != ENOENT)
        return fj__fail(err, FJ_ERR_CACHE, "%s: cannot replace (%s)", dest, strerror(errno));
    sqlite3 *db = NULL;
    fj_status s = open_checked(dest, 0, &db, err);
    if (s == FJ_OK)
        s = attach_source(db, src, err);
    if (s == FJ_OK)
        s = copy_rows(db, filter, copied, err);
    if (s == FJ_OK &&
        (exec(db, "DETACH DATABASE src") != SQLITE_OK ||
         exec(db, "PRAGMA journal_mode=DELETE") != SQLITE_OK || exec(db, "VACUUM") != SQLITE_OK))
        s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", dest, sqlite3_errmsg(db));
    sqlite3_close(db);
    return s;
}

fj_status cache_import(const char *src, const char *dest, int64_t *copied, int64_t *skipped,
                       fj__err *err)
{
    *copied = *skipped = 0;
    sqlite3 *db = NULL;
    fj_status s = open_checked(dest, 0, &db, err);
    if (s == FJ_OK)
        s = attach_source(db, src, err);
    if (s == FJ_OK)
        s = copy_rows(db, NULL, copied, err);
    if (s == FJ_OK)
        *skipped = query_int(db, "SELECT count(*) FROM src.kernels") - *copied;
    sqlite3_close(db);
    return s;
}

fj_status cache_prune(const char *path, int64_t older_than_s, const char *filter, int64_t *deleted,
                      fj__err *err)
{
    *deleted = 0;
    sqlite3 *db = NULL;
    fj_status s = open_checked(path, 0, &db, err);
    if (s != FJ_OK)
        return s;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db,
                                "DELETE FROM kernels WHERE (?1 < 0 OR last_used <= ?2) AND "
                                "(?3 IS NULL OR instr(device, ?3) > 0 OR instr(target, ?3) > 0)",
                                -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, older_than_s);
        sqlite3_bind_int64(st, 2, now_s() - older_than_s);
        sqlite3_bind_text(st, 3, filter, -1, SQLITE_STATIC);
        rc = write_one(db, st);
        *deleted = sqlite3_changes(db);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, sqlite3_errmsg(db));
    sqlite3_close(db);
    return s;
}
