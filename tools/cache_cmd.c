/* `flashjit cache ...`: inspect, verify, export, import and prune kernel caches. */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cache/cache.h"
#include "../runtime/build.h"
#include "tools.h"

static int cache_usage(FILE *f)
{
    fprintf(f,
            "usage: flashjit cache <command> [--cache PATH]\n"
            "  path                        the cache file in use\n"
            "  ls                          kernels: key, backend, device, size, compile time, age\n"
            "  verify [FILE]               integrity, schema, checksums; exit 1 on damage\n"
            "  export FILE [--device S]    a standalone cache to ship (rows whose device or\n"
            "                              target contains S)\n"
            "  import FILE                 copy the sound kernels of FILE into the cache\n"
            "  prune [--older-than DAYS] [--device S] [--all]\n"
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
    enum { O_CACHE = 256, O_DEVICE, O_OLDER, O_ALL, O_HELP };
    static const struct option opts[] = {{"cache", required_argument, 0, O_CACHE},
                                         {"device", required_argument, 0, O_DEVICE},
                                         {"older-than", required_argument, 0, O_OLDER},
                                         {"all", no_argument, 0, O_ALL},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    char *path = NULL;
    const char *device = NULL;
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
        int64_t rows = 0, damaged = 0;
        const char *target = file ? file : path;
        st = cache_verify(target, &rows, &damaged, &err);
        if (st == FJ_OK)
            printf("%s: ok, %lld kernels\n", target, (long long)rows);
        rc = st == FJ_OK ? 0 : 1;
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
