/* `flashjit cache ...`: inspect, verify, export, import, prune and sign kernel caches. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../cache/cache.h"
#include "../runtime/build.h"
#include "tools.h"

static int cache_usage(FILE *f)
{
    fprintf(
        f, "usage: flashjit cache <command> [--cache PATH]\n"
           "  path                        the cache file in use\n"
           "  ls                          kernels: key, backend, device, size, compile time, age\n"
           "  verify [FILE] [--trusted-key HEX]...\n"
           "                              integrity, schema, checksums, signature; exit 1 on\n"
           "                              damage (or, with trusted keys, no signature by one)\n"
           "  export FILE [--device S]    a standalone cache to ship (rows whose device or\n"
           "                              target contains S)\n"
           "  import FILE                 copy the sound kernels of FILE into the cache\n"
           "  prune [--older-than DAYS] [--device S] [--all]\n"
           "  keygen --key FILE           a new Ed25519 key pair: FILE (secret, mode 0600) and\n"
           "                              FILE.pub; prints the public key\n"
           "  sign --key FILE [CACHE]     sign CACHE (default the cache) for shipping; users pass\n"
           "                              the public key in fj_context_options.trusted_keys\n"
           "  build --arch sm_80|sm_90a ... compile CUDA kernels without a GPU (see "
           "`cache build --help`)\n");
    return 2;
}

static void print_age(int64_t seconds)
{
    if (seconds < 120)
        printf("%5llds", (long long)seconds);
    else if (seconds < 7200)
        printf("%5lldm", (long long)(seconds / 60));
    else if (seconds < 172800)
        printf("%5lldh", (long long)(seconds / 3600));
    else
        printf("%5lldd", (long long)(seconds / 86400));
}

/* The variant text as one line, without the long target and template-hash lines. */
static void print_variant_summary(const char *text)
{
    const char *p = text;
    while (p && *p) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (strncmp(p, "target=", 7) != 0 && strncmp(p, "templates=", 10) != 0 &&
            strncmp(p, "backend=", 8) != 0)
            printf(" %.*s", (int)n, p);
        p = end ? end + 1 : NULL;
    }
}

/* Writes text to path, created with mode (never replacing a file). 0 on success. */
static int write_new_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    if (fd < 0)
        return fprintf(stderr, "flashjit cache keygen: %s: %s\n", path, strerror(errno)), -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    ok = close(fd) == 0 && ok;
    if (!ok)
        fprintf(stderr, "flashjit cache keygen: %s: %s\n", path, strerror(errno));
    return ok ? 0 : -1;
}

static int keygen(const char *key_path)
{
    unsigned char pk[32], sk[64];
    char pk_hex[65], sk_hex[129], line[160], pub_path[4200];
    if (fj__sign_keypair(pk, sk) != 0)
        return fprintf(stderr, "flashjit cache keygen: no key pair (libsodium failed)\n"), 1;
    fj__hex_encode(pk, sizeof pk, pk_hex);
    fj__hex_encode(sk, sizeof sk, sk_hex);
    snprintf(pub_path, sizeof pub_path, "%s.pub", key_path);
    snprintf(line, sizeof line, "%s\n", sk_hex);
    int rc = write_new_file(key_path, line, 0600);
    snprintf(line, sizeof line, "%s\n", pk_hex);
    if (rc == 0)
        rc = write_new_file(pub_path, line, 0644);
    memset(sk, 0, sizeof sk);
    memset(sk_hex, 0, sizeof sk_hex);
    if (rc != 0)
        return 1;
    printf("secret key %s, public key %s:\n%s\n", key_path, pub_path, pk_hex);
    return 0;
}

/* Reads an Ed25519 secret key (128 hex digits, as keygen writes it) from path. */
static int read_secret_key(const char *path, unsigned char sk[64])
{
    char line[256] = "";
    FILE *f = fopen(path, "r");
    if (!f)
        return fprintf(stderr, "flashjit cache sign: %s: %s\n", path, strerror(errno)), -1;
    int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    line[strcspn(line, " \t\r\n")] = '\0';
    int ok = got && fj__hex_decode(line, sk, 64) == 0;
    memset(line, 0, sizeof line);
    if (!ok)
        fprintf(stderr,
                "flashjit cache sign: %s is not a secret key (128 hex digits, as `flashjit cache "
                "keygen` writes)\n",
                path);
    return ok ? 0 : -1;
}

typedef struct ls_state {
    int64_t count, bytes;
    int64_t now;
} ls_state;

static void ls_row(void *ud, const cache_row *r)
{
    ls_state *s = ud;
    if (s->count == 0)
        printf("%-12s %-7s %-28s %9s %10s %6s  variant\n", "key", "backend", "device", "size",
               "compile", "age");
    printf("%-12.12s %-7s %-28.28s %8.1fK %8.1fms ", r->key, r->backend, r->device,
           (double)r->size / 1024.0, r->compile_ms);
    print_age(s->now - r->created);
    printf(" ");
    print_variant_summary(r->variant_text);
    printf("\n");
    s->count++;
    s->bytes += r->size;
}

int fjt_cache_command(int argc, char **argv)
{
    if (argc < 2)
        return cache_usage(stderr);
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help"))
        return cache_usage(stdout), 0;
    if (!strcmp(sub, "build"))
        return fjt_cache_build(argc - 1, argv + 1);
    enum { O_CACHE = 256, O_DEVICE, O_OLDER, O_ALL, O_HELP, O_KEY, O_TRUSTED };
    static const struct option opts[] = {{"cache", required_argument, 0, O_CACHE},
                                         {"key", required_argument, 0, O_KEY},
                                         {"trusted-key", required_argument, 0, O_TRUSTED},
                                         {"device", required_argument, 0, O_DEVICE},
                                         {"older-than", required_argument, 0, O_OLDER},
                                         {"all", no_argument, 0, O_ALL},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    char *path = NULL;
    const char *device = NULL, *key_path = NULL;
    fj__public_key trusted[8];
    int ntrusted = 0;
    double older_days = -1;
    int all = 0, opt;
    optind = 2;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case O_CACHE:
            free(path);
            path = fj__strdup(optarg);
            break;
        case O_DEVICE: device = optarg; break;
        case O_OLDER: {
            float days = 0;
            if (fjt_parse_float("older-than", optarg, &days) || days < 0) {
                free(path);
                return fprintf(stderr, "flashjit cache: --older-than takes days >= 0\n"), 2;
            }
            older_days = days;
            break;
        }
        case O_ALL: all = 1; break;
        case O_KEY: key_path = optarg; break;
        case O_TRUSTED:
            if (ntrusted == 8 || fj__hex_decode(optarg, trusted[ntrusted].bytes, 32) != 0) {
                free(path);
                fprintf(stderr,
                        "flashjit cache: --trusted-key takes an Ed25519 public key (64 hex "
                        "digits, at most 8 keys), not '%s'\n",
                        optarg);
                return 2;
            }
            ntrusted++;
            break;
        case O_HELP:
            free(path);
            cache_usage(stdout);
            return 0;
        default: free(path); return cache_usage(stderr);
        }
    }
    if (!path)
        path = fj__default_cache_path();
    const char *file = optind < argc ? argv[optind] : NULL;
    fj__err err = {{0}};
    fj_status st = FJ_OK;
    int rc = 0;
    if (!strcmp(sub, "path")) {
        printf("%s\n", path);
    } else if (!strcmp(sub, "ls")) {
        ls_state s = {.now = (int64_t)time(NULL)};
        st = cache_list(path, ls_row, &s, &err);
        if (st == FJ_OK)
            printf("%lld kernels, %.1f KiB in %s\n", (long long)s.count, (double)s.bytes / 1024.0,
                   path);
    } else if (!strcmp(sub, "verify")) {
        cache_verify_result r;
        const char *target = file ? file : path;
        st = cache_verify(target, trusted, ntrusted, &r, &err);
        if (st == FJ_OK && r.is_signed)
            printf("%s: ok, %lld kernels, signed by %s\n", target, (long long)r.rows, r.signer);
        else if (st == FJ_OK)
            printf("%s: ok, %lld kernels; %s\n", target, (long long)r.rows, r.unsigned_why);
        rc = st == FJ_OK ? 0 : 1;
    } else if (!strcmp(sub, "keygen") || !strcmp(sub, "sign")) {
        if (!key_path) {
            fprintf(stderr, "flashjit cache %s: --key FILE is missing\n", sub);
            free(path);
            return 2;
        }
        if (!strcmp(sub, "keygen")) {
            rc = keygen(key_path);
        } else {
            unsigned char sk[64];
            char signer[65];
            const char *target = file ? file : path;
            if (read_secret_key(key_path, sk) != 0) {
                free(path);
                return 1;
            }
            st = cache_sign(target, sk, signer, &err);
            memset(sk, 0, sizeof sk);
            if (st == FJ_OK)
                printf("signed %s with public key %s\n", target, signer);
        }
    } else if (!strcmp(sub, "export") || !strcmp(sub, "import")) {
        if (!file) {
            fprintf(stderr, "flashjit cache %s: FILE is missing\n", sub);
            free(path);
            return 2;
        }
        int64_t copied = 0, skipped = 0;
        if (!strcmp(sub, "export")) {
            st = cache_export(path, file, device, &copied, &err);
            if (st == FJ_OK)
                printf("exported %lld kernels to %s\n", (long long)copied, file);
        } else {
            st = cache_import(file, path, &copied, &skipped, &err);
            if (st == FJ_OK)
                printf("imported %lld kernels into %s (%lld damaged rows skipped)\n",
                       (long long)copied, path, (long long)skipped);
        }
    } else if (!strcmp(sub, "prune")) {
        if (older_days < 0 && !device && !all) {
            fprintf(stderr, "flashjit cache prune: say --older-than DAYS, --device S or --all\n");
            free(path);
            return 2;
        }
        int64_t deleted = 0;
        st = cache_prune(path, older_days < 0 ? -1 : (int64_t)(older_days * 86400), device,
                         &deleted, &err);
        if (st == FJ_OK)
            printf("pruned %lld kernels from %s\n", (long long)deleted, path);
    } else {
        fprintf(stderr, "flashjit cache: unknown command '%s'\n", sub);
        free(path);
        return cache_usage(stderr);
    }
    if (st != FJ_OK) {
        fprintf(stderr, "flashjit cache %s: %s\n", sub, err.msg);
        rc = 1;
    }
    free(path);
    return rc;
}
