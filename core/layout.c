/* Signatures of parameter-block layouts (layout.h). */
#include "layout.h"

#include <stdio.h>
#include <string.h>

#include "core.h"

/* Appends l's canonical text ("name{field:kind:type@offset,...}size") to buf. */
static size_t describe(const fj__playout *l, char *buf, size_t size, size_t used)
{
    used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s{", l->name);
    for (int i = 0; i < l->nfields; i++) {
        const fj__pfield *f = &l->fields[i];
        used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s:%d:%s@%zu,",
                                 f->name, (int)f->kind, f->ctype ? f->ctype : "", f->offset);
        if (f->block)
            used = describe(f->block, buf, size, used);
    }
    used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "}%zu;", l->size);
    return used;
}

void fj__playout_signature(const fj__playout *l, char hex[17])
{
    char text[8192], full[65];
    size_t n = describe(l, text, sizeof text, 0);
    fj__sha256_hex(text, n < sizeof text ? n : sizeof text - 1, full);
    memcpy(hex, full, 16);
    hex[16] = '\0';
}

/* Appends the pointer fields of the block at base to out[*n...]. */
static void pointers(const fj__playout *l, const unsigned char *base, void **out, int max, int *n)
{
    for (int i = 0; i < l->nfields; i++) {
        const fj__pfield *f = &l->fields[i];
        if (f->kind == FJ__PK_BLOCK) {
            pointers(f->block, base + f->offset, out, max, n);
        } else if (f->kind == FJ__PK_PTR) {
            void *ptr;
            memcpy(&ptr, base + f->offset, sizeof ptr);
            if (ptr && *n < max)
                out[*n] = ptr;
            *n += ptr != NULL;
        }
    }
}

int fj__playout_pointers(const fj__playout *l, const void *params, void **out, int max)
{
    int n = 0;
    pointers(l, params, out, max, &n);
    return n;
}
