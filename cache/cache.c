/* The SQLite kernel cache. See cache.h for the contract; the rules that shape this file:
**  - every SQLite failure on a lookup is a miss, on a store a warning: never a failed call;
**  - a file that is not ours (another application's, a newer schema, not a database at all) is
**    left alone, never overwritten;
**  - a row hits only if its variant text matches and its checksum (SHA-256 of key and binary)
**    matches, so a damaged row, or a binary moved to another row, can never run;
**  - a shipped cache must carry a valid signature by a trusted key when the caller gives any
**    (a cache is code): its signed rows are kept in memory, and a row hits only with the
**    checksum that was signed;
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

/* A kernel row as signed: its key and checksum. */
typedef struct signed_row {
    char key[65];
    char checksum[65];
} signed_row;

/* What a verified signature covers, kept in memory so that a file changed after opening still
** cannot supply another binary or tile choice: the kernel rows (sorted by key) and the hashes
** of the tuning rows (tuning_hash, sorted). */
typedef struct signed_set {
    signed_row *rows;
    size_t nrows;
    unsigned char (*tunings)[32];
    size_t ntunings;
} signed_set;

typedef struct shipped_cache {
    sqlite3 *db;
    int verified; /* checked against trusted keys: only `signed` can hit */
    signed_set signed_rows;
} shipped_cache;

struct fj_cache {
    sqlite3 *user;
    int writable;
    char *path; /* the user cache's path, to start afresh when it turns out damaged */
    int readonly;
    int own_file; /* cache_options.own_file */
    int busy_ms;
    shipped_cache shipped[CACHE_MAX_SHIPPED];
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
    " checksum TEXT NOT NULL," /* SHA-256 of key and binary (row_checksum) */
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
    " PRIMARY KEY(fingerprint, problem_bucket, variant_base));"
    /* Ed25519 signatures (hex) over the cache's manifest (manifest_digest); empty unless
    ** `flashjit cache sign` signed it. */
    "CREATE TABLE IF NOT EXISTS signatures("
    " public_key TEXT PRIMARY KEY,"
    " signature TEXT NOT NULL,"
    " created INTEGER NOT NULL);";

/* A row's checksum: SHA-256 over its key and its binary, each length-prefixed, so that a binary
** is bound to the variant it was compiled for. */
static void row_checksum(const char *key, const void *binary, size_t size, char hex[65])
{
    fj__sha256 h;
    unsigned char digest[32];
    fj__sha256_init(&h);
    fj__sha256_field(&h, key, strlen(key));
    fj__sha256_field(&h, binary, size);
    fj__sha256_final(&h, digest);
    fj__hex_encode(digest, sizeof digest, hex);
}

/* SQL functions, so that checks run inside queries: fj_sha256(x) is the hex SHA-256 of a blob or
** text, fj_checksum(key, binary) a row's checksum. */
static void sql_sha256(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    const void *data = sqlite3_value_blob(argv[0]);
    int n = sqlite3_value_bytes(argv[0]);
    char hex[65];
    fj__sha256_hex(data ? data : "", (size_t)n, hex);
    sqlite3_result_text(ctx, hex, 64, SQLITE_TRANSIENT);
}

static void sql_checksum(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    const char *key = (const char *)sqlite3_value_text(argv[0]);
    const void *data = sqlite3_value_blob(argv[1]);
    int n = sqlite3_value_bytes(argv[1]);
    char hex[65];
    row_checksum(key ? key : "", data ? data : "", (size_t)n, hex);
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
        rc = exec(db, "DROP TABLE IF EXISTS kernels; DROP TABLE IF EXISTS tunings; "
                      "DROP TABLE IF EXISTS signatures;");
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
    int rc = sqlite3_prepare_v2(db, "SELECT key, variant_text, binary, checksum FROM kernels", -1,
                                &st, NULL);
    sqlite3_finalize(st);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(db, "SELECT public_key, signature FROM signatures", -1, &st, NULL);
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
    sqlite3_create_function(db, "fj_checksum", 2, SQLITE_UTF8 | SQLITE_DETERMINISTIC, NULL,
                            sql_checksum, NULL, NULL);
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
** Files that are not ours are never touched: ours says so in its header, or is at the library's
** own location (own_file: its header may be the damaged part). Returns 0 when moved. */
static int move_aside(const char *path, int own_file, fj__err *warn)
{
    if (!own_file && !header_is_ours(path))
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
static sqlite3 *open_user(const char *path, int readonly, int own_file, int busy, int *writable,
                          fj__err *warn)
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
            if (attempt == 0 && damaged && move_aside(path, own_file, warn) == 0)
                db = open_db(path, 0, busy, why, sizeof why);
        }
    }
    /* Read-only; then, for a file we cannot write either (a read-only mount), immutable: a
    ** cache in WAL mode cannot be opened read-only without its -shm file, which such a place
    ** cannot hold. */
    for (int mode = 1; mode <= 2 && access(path, R_OK) == 0; mode++) {
        if (mode == 2 && access(path, W_OK) == 0)
            break;
        char why_ro[512] = "";
        db = open_db(path, mode, busy, why_ro, sizeof why_ro);
        if (db && check_schema(db, 0, why_ro, sizeof why_ro) == 0) {
            if (!readonly)
                fj__append(warn, "kernel cache %s is read-only here: %s", path, why);
            return db;
        }
        sqlite3_close(db);
        db = NULL;
        if (!why[0])
            snprintf(why, sizeof why, "%s", why_ro);
    }
    fj__append(warn, "kernel cache %s is not used (%s); kernels are kept in memory only", path,
               why[0] ? why : "missing");
    return NULL;
}

/* ---- signatures ------------------------------------------------------------------------------ */

static void field_text(fj__sha256 *h, const unsigned char *text)
{
    const char *t = text ? (const char *)text : "";
    fj__sha256_field(h, t, strlen(t));
}

/* A tuning row's fields (fingerprint, bucket, family, config) hashed, each length-prefixed. */
static void tuning_hash(const unsigned char *const fields[4], unsigned char out[32])
{
    fj__sha256 h;
    fj__sha256_init(&h);
    for (int i = 0; i < 4; i++)
        field_text(&h, fields[i]);
    fj__sha256_final(&h, out);
}

static int compare_signed_rows(const void *a, const void *b)
{
    return strcmp(((const signed_row *)a)->key, ((const signed_row *)b)->key);
}

static int compare_hashes(const void *a, const void *b)
{
    return memcmp(a, b, 32);
}

static void signed_set_free(signed_set *set)
{
    free(set->rows);
    free(set->tunings);
    memset(set, 0, sizeof *set);
}

/* Room for one more of n elements of size bytes at *list (*cap allocated): the new
** allocation, or NULL when out of memory (then *list is unchanged). */
static void *reserve(void *list, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return list;
    size_t more = *cap ? 2 * *cap : 64;
    void *grown = realloc(list, more * size);
    if (grown)
        *cap = more;
    return grown;
}

/* The digest a signature covers: every kernel row's key and checksum and every tuning row's
** fields, in key order, each field length-prefixed. With set, also what it covers (sorted,
** malloc'd; signed_set_free). Returns 0, or -1 when the tables cannot be read. */
static int manifest_digest(sqlite3 *db, unsigned char digest[32], signed_set *set)
{
    static const char *const queries[] = {
        "SELECT key, checksum FROM kernels ORDER BY key",
        "SELECT fingerprint, problem_bucket, variant_base, best_config FROM tunings "
        "ORDER BY fingerprint, problem_bucket, variant_base"};
    fj__sha256 h;
    fj__sha256_init(&h);
    field_text(&h, (const unsigned char *)"flashjit signed cache 2");
    signed_set local = {0};
    size_t row_cap = 0, tuning_cap = 0;
    int ok = 1;
    for (int q = 0; q < 2 && ok; q++) {
        sqlite3_stmt *st = NULL;
        ok = sqlite3_prepare_v2(db, queries[q], -1, &st, NULL) == SQLITE_OK;
        int rc = SQLITE_DONE;
        while (ok && (rc = sqlite3_step(st)) == SQLITE_ROW) {
            const unsigned char *f[4] = {NULL, NULL, NULL, NULL};
            for (int c = 0; c < sqlite3_column_count(st) && c < 4; c++)
                field_text(&h, f[c] = sqlite3_column_text(st, c));
            if (!set)
                continue;
            if (q == 0) {
                signed_row *rows = reserve(local.rows, local.nrows, &row_cap, sizeof *rows);
                if (!(ok = rows != NULL))
                    break;
                local.rows = rows;
                signed_row *r = &rows[local.nrows++];
                snprintf(r->key, sizeof r->key, "%s", f[0] ? (const char *)f[0] : "");
                snprintf(r->checksum, sizeof r->checksum, "%s", f[1] ? (const char *)f[1] : "");
            } else {
                unsigned char(*hashes)[32] =
                    reserve(local.tunings, local.ntunings, &tuning_cap, sizeof *hashes);
                if (!(ok = hashes != NULL))
                    break;
                local.tunings = hashes;
                tuning_hash(f, hashes[local.ntunings++]);
            }
        }
        ok = ok && rc == SQLITE_DONE;
        sqlite3_finalize(st);
        field_text(&h, (const unsigned char *)"end");
    }
    fj__sha256_final(&h, digest);
    if (!ok || !set) {
        signed_set_free(&local);
        return ok ? 0 : -1;
    }
    /* SQLite's ORDER BY sorted the keys as strcmp does; the hashes need sorting. */
    if (local.ntunings)
        qsort(local.tunings, local.ntunings, 32, compare_hashes);
    *set = local;
    return 0;
}

/* Checks db's signatures against the trusted keys (any trusted key with a valid signature
** will do; trusted may be NULL with ntrusted 0 to report the first valid signature of any key).
** Returns 1 when verified (the signer's public key in signer as hex), 0 when not (the reason in
** why), -1 when the file cannot be read. set as in manifest_digest (emptied unless verified). */
static int verify_signatures(sqlite3 *db, const fj__public_key *trusted, int ntrusted,
                             char signer[65], signed_set *set, char *why, size_t why_size)
{
    unsigned char digest[32];
    if (manifest_digest(db, digest, set) != 0) {
        snprintf(why, why_size, "cannot read its rows (%s)", sqlite3_errmsg(db));
        return -1;
    }
    sqlite3_stmt *st = NULL;
    int found = 0, from_trusted = 0, verified = 0;
    if (sqlite3_prepare_v2(db, "SELECT public_key, signature FROM signatures ORDER BY public_key",
                           -1, &st, NULL) == SQLITE_OK)
        while (!verified && sqlite3_step(st) == SQLITE_ROW) {
            unsigned char pk[32], sig[64];
            found++;
            if (fj__hex_decode((const char *)sqlite3_column_text(st, 0), pk, sizeof pk) != 0 ||
                fj__hex_decode((const char *)sqlite3_column_text(st, 1), sig, sizeof sig) != 0)
                continue;
            int trusted_key = ntrusted == 0;
            for (int i = 0; i < ntrusted && !trusted_key; i++)
                trusted_key = memcmp(trusted[i].bytes, pk, sizeof pk) == 0;
            if (!trusted_key)
                continue;
            from_trusted++;
            if (fj__sign_verify(digest, sizeof digest, pk, sig) == 0) {
                verified = 1;
                fj__hex_encode(pk, sizeof pk, signer);
            }
        }
    sqlite3_finalize(st);
    if (!verified) {
        snprintf(why, why_size, "%s",
                 !found          ? "it is not signed (flashjit cache sign)"
                 : !from_trusted ? "it is not signed by a trusted key"
                                 : "its signature does not match its contents (changed after "
                                   "signing?)");
        if (set)
            signed_set_free(set);
    }
    return verified;
}

/* The checksum signed for key in a verified shipped cache, or NULL. */
static const char *signed_checksum(const shipped_cache *sc, const char *key)
{
    signed_row probe;
    snprintf(probe.key, sizeof probe.key, "%s", key);
    const signed_row *r = sc->signed_rows.nrows
                              ? bsearch(&probe, sc->signed_rows.rows, sc->signed_rows.nrows,
                                        sizeof probe, compare_signed_rows)
                              : NULL;
    return r ? r->checksum : NULL;
}

/* Whether a tuning row with these fields is among those a verified shipped cache signed. */
static int tuning_signed(const shipped_cache *sc, const unsigned char *const fields[4])
{
    unsigned char hash[32];
    tuning_hash(fields, hash);
    return sc->signed_rows.ntunings &&
           bsearch(hash, sc->signed_rows.tunings, sc->signed_rows.ntunings, 32, compare_hashes);
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
    c->own_file = o->own_file;
    if (o->path && o->path[0] && strcmp(o->path, ":memory:") != 0) {
        c->path = fj__strdup(o->path);
        c->user = open_user(o->path, o->readonly, o->own_file, busy, &c->writable, warn);
    }
    for (const char *const *p = o->shipped; p && *p && c->nshipped < CACHE_MAX_SHIPPED; p++) {
        char why[512] = "", signer[65];
        shipped_cache sc = {.db = open_db(*p, 2, busy, why, sizeof why)};
        int usable = sc.db && check_schema(sc.db, 0, why, sizeof why) == 0;
        if (usable && o->ntrusted > 0)
            usable = sc.verified = verify_signatures(sc.db, o->trusted, o->ntrusted, signer,
                                                     &sc.signed_rows, why, sizeof why) == 1;
        if (usable) {
            c->shipped[c->nshipped++] = sc;
            continue;
        }
        sqlite3_close(sc.db);
        fj__append(warn, "shipped cache %s is not used (%s)", *p, why);
    }
    return FJ_OK;
}

void cache_close(fj_cache *c)
{
    if (!c)
        return;
    sqlite3_close(c->user);
    for (int i = 0; i < c->nshipped; i++) {
        sqlite3_close(c->shipped[i].db);
        signed_set_free(&c->shipped[i].signed_rows);
    }
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

/* Looks key up in one database; a hit needs matching text and checksum, and where signed_sum is
** not NULL, that checksum. */
static int lookup(sqlite3 *db, const char *key, const char *variant_text, const char *signed_sum,
                  void **binary, size_t *size, fj__err *warn)
{
    sqlite3_stmt *st = NULL;
    int hit = 0;
    if (sqlite3_prepare_v2(db, "SELECT variant_text, binary, checksum FROM kernels WHERE key = ?",
                           -1, &st, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        const char *text = (const char *)sqlite3_column_text(st, 0);
        const void *blob = sqlite3_column_blob(st, 1);
        int n = sqlite3_column_bytes(st, 1);
        const char *sum = (const char *)sqlite3_column_text(st, 2);
        char hex[65];
        if (text && blob && n > 0 && sum && strcmp(text, variant_text) == 0 &&
            (!signed_sum || strcmp(sum, signed_sum) == 0)) {
            row_checksum(key, blob, (size_t)n, hex);
            if (strcmp(hex, sum) != 0)
                fj__append(warn,
                           "kernel cache %s: the row of kernel %.12s is damaged (its checksum "
                           "does not match); compiling the kernel again",
                           sqlite3_db_filename(db, "main"), key);
            else if ((*binary = malloc((size_t)n))) {
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
    if (c->readonly || move_aside(c->path, c->own_file, warn) != 0) {
        fj__append(warn, "kernel cache %s is damaged; kernels are kept in memory only", c->path);
        return;
    }
    c->user = open_user(c->path, 0, c->own_file, c->busy_ms, &c->writable, warn);
}

cache_origin cache_get_kernel(fj_cache *c, const char *key, const char *variant_text, void **binary,
                              size_t *size, fj__err *warn)
{
    *binary = NULL;
    *size = 0;
    if (!c)
        return CACHE_MISS;
    int hit = c->user && lookup(c->user, key, variant_text, NULL, binary, size, warn);
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
    for (int i = 0; i < c->nshipped; i++) {
        const shipped_cache *sc = &c->shipped[i];
        const char *signed_sum = NULL;
        if (sc->verified && !(signed_sum = signed_checksum(sc, key)))
            continue; /* not among the signed rows */
        if (lookup(sc->db, key, variant_text, signed_sum, binary, size, warn))
            return CACHE_SHIPPED;
    }
    return CACHE_MISS;
}

/* Runs a prepared write in its own IMMEDIATE transaction. Returns SQLITE_OK or the error; why
** (may be NULL) gets the failing step's message, before a rollback can replace it. */
static int write_one(sqlite3 *db, sqlite3_stmt *st, char *why, size_t why_size)
{
    int rc = exec(db, "BEGIN IMMEDIATE");
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        rc = rc == SQLITE_DONE ? exec(db, "COMMIT") : rc;
    }
    if (rc != SQLITE_OK && why)
        snprintf(why, why_size, "%s", sqlite3_errmsg(db));
    if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
        exec(db, "ROLLBACK");
    return rc;
}

void cache_put_kernel(fj_cache *c, const char *key, const char *backend, const char *target,
                      const char *device, const char *variant_text, const void *binary, size_t size,
                      double compile_ms, const char *log, fj__err *warn)
{
    if (!cache_writable(c))
        return;
    char sum[65], why[256] = "";
    row_checksum(key, binary, size, sum);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        c->user,
        "INSERT OR REPLACE INTO kernels(key, backend, target, device, variant_text, binary, "
        "checksum, compile_ms, log, created, last_used) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
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
        rc = write_one(c->user, st, why, sizeof why);
    } else {
        snprintf(why, sizeof why, "%s", sqlite3_errmsg(c->user));
    }
    if (rc != SQLITE_OK)
        fj__append(warn, "kernel cache: cannot store a kernel (%s)", why);
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
        write_one(c->user, st, NULL, 0);
    }
    sqlite3_finalize(st);
}

/* Looks a tuning record up in db; where sc is a verified shipped cache, only a signed one. */
static int tuning_lookup(sqlite3 *db, const shipped_cache *sc, const char *fingerprint,
                         const char *bucket, const char *family, char **best, double *us)
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
    const unsigned char *config = NULL;
    if (sqlite3_step(st) == SQLITE_ROW && (config = sqlite3_column_text(st, 0)) &&
        (!sc || !sc->verified ||
         tuning_signed(sc, (const unsigned char *const[4]){
                               (const unsigned char *)fingerprint, (const unsigned char *)bucket,
                               (const unsigned char *)family, config}))) {
        *best = fj__strdup((const char *)config);
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
    if (c->user &&
        tuning_lookup(c->user, NULL, fingerprint, bucket, family, best_config, measured_us))
        return 1;
    for (int i = 0; i < c->nshipped; i++)
        if (tuning_lookup(c->shipped[i].db, &c->shipped[i], fingerprint, bucket, family,
                          best_config, measured_us))
            return 1;
    return 0;
}

void cache_put_tuning(fj_cache *c, const char *fingerprint, const char *bucket, const char *family,
                      const char *best_config, double measured_us, const char *all_results_json,
                      fj__err *warn)
{
    if (!cache_writable(c))
        return;
    char why[256] = "";
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
        rc = write_one(c->user, st, why, sizeof why);
    } else {
        snprintf(why, sizeof why, "%s", sqlite3_errmsg(c->user));
    }
    if (rc != SQLITE_OK)
        fj__append(warn, "kernel cache: cannot store a tuning result (%s)", why);
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

/* A row is sound when its key is the hash of its variant text and its checksum is that of its
** key and binary. */
#define SOUND_ROW "fj_checksum(key, binary) = checksum AND fj_sha256(variant_text) = key"

fj_status cache_verify(const char *path, const fj__public_key *trusted, int ntrusted,
                       cache_verify_result *r, fj__err *err)
{
    memset(r, 0, sizeof *r);
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
        r->rows = query_int(db, "SELECT count(*) FROM kernels");
        int64_t sound = query_int(db, "SELECT count(*) FROM kernels WHERE " SOUND_ROW);
        if (r->rows < 0 || sound < 0)
            s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, sqlite3_errmsg(db));
        else if ((r->damaged = r->rows - sound) > 0)
            s = fj__fail(err, FJ_ERR_CACHE, "%s: %lld of %lld kernels are damaged", path,
                         (long long)r->damaged, (long long)r->rows);
    }
    if (s == FJ_OK) {
        int v = verify_signatures(db, trusted, ntrusted, r->signer, NULL, r->unsigned_why,
                                  sizeof r->unsigned_why);
        r->is_signed = v == 1;
        if (v < 0 || (!r->is_signed && ntrusted > 0))
            s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, r->unsigned_why);
    }
    sqlite3_close(db);
    return s;
}

fj_status cache_sign(const char *path, const unsigned char secret_key[64], char signer[65],
                     fj__err *err)
{
    sqlite3 *db = NULL;
    fj_status s = open_checked(path, 0, &db, err);
    if (s != FJ_OK)
        return s;
    /* One write transaction: the rows signed are the rows in the file when it commits. */
    int rc = exec(db, "BEGIN IMMEDIATE");
    int64_t rows = query_int(db, "SELECT count(*) FROM kernels");
    int64_t sound = query_int(db, "SELECT count(*) FROM kernels WHERE " SOUND_ROW);
    unsigned char digest[32], signature[64];
    char sig_hex[129];
    if (rc != SQLITE_OK || rows < 0 || sound < 0)
        s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, sqlite3_errmsg(db));
    else if (sound != rows)
        s = fj__fail(err, FJ_ERR_CACHE, "%s: %lld of %lld kernels are damaged; not signed", path,
                     (long long)(rows - sound), (long long)rows);
    else if (manifest_digest(db, digest, NULL) != 0)
        s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, sqlite3_errmsg(db));
    else if (fj__sign(digest, sizeof digest, secret_key, signature) != 0)
        s = fj__fail(err, FJ_ERR_CACHE, "%s: signing failed (libsodium)", path);
    if (s == FJ_OK) {
        fj__hex_encode(secret_key + 32, 32, signer); /* Ed25519 secret keys end with the public */
        fj__hex_encode(signature, sizeof signature, sig_hex);
        sqlite3_stmt *st = NULL;
        rc = exec(db, "DELETE FROM signatures");
        if (rc == SQLITE_OK)
            rc = sqlite3_prepare_v2(db, "INSERT INTO signatures VALUES(?, ?, ?)", -1, &st, NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_text(st, 1, signer, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, sig_hex, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 3, now_s());
            rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
        }
        sqlite3_finalize(st);
        if (rc == SQLITE_OK)
            rc = exec(db, "COMMIT");
        if (rc != SQLITE_OK)
            s = fj__fail(err, FJ_ERR_CACHE, "%s: cannot store the signature (%s)", path,
                         sqlite3_errmsg(db));
    }
    if (s != FJ_OK && !sqlite3_get_autocommit(db))
        exec(db, "ROLLBACK");
    /* Shipped caches are opened immutable, which ignores a write-ahead log: fold it in. */
    if (s == FJ_OK)
        exec(db, "PRAGMA journal_mode=DELETE");
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
    if (rc == SQLITE_OK) /* a signature covers the rows it was made for, no others */
        rc = exec(db, "DELETE FROM main.signatures");
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
    if (rc == SQLITE_OK)
        rc = exec(db, "BEGIN IMMEDIATE");
    if (rc == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, older_than_s);
        sqlite3_bind_int64(st, 2, now_s() - older_than_s);
        sqlite3_bind_text(st, 3, filter, -1, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
        *deleted = sqlite3_changes(db);
        if (rc == SQLITE_OK && *deleted > 0) /* a signature covered the deleted rows too */
            rc = exec(db, "DELETE FROM signatures");
        if (rc == SQLITE_OK)
            rc = exec(db, "COMMIT");
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK) {
        s = fj__fail(err, FJ_ERR_CACHE, "%s: %s", path, sqlite3_errmsg(db));
        *deleted = 0;
        if (!sqlite3_get_autocommit(db))
            exec(db, "ROLLBACK");
    }
    sqlite3_close(db);
    return s;
}
