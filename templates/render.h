/* The template renderer: Lua 5.4 in a sandbox turns a template and its parameters into kernel
** source text. Templates are data -> text; they see their parameters and a few pure libraries,
** nothing of the file system or the process. */
#ifndef FJ_TEMPLATES_RENDER_H
#define FJ_TEMPLATES_RENDER_H

#include "../core/core.h"
#include "../core/layout.h"

typedef enum tpl_kind {
    TPL_INT,
    TPL_BOOL,
    TPL_STR,
    TPL_LAYOUT /* a parameter block's layout: a table {name, size, align, fields = {...}} */
} tpl_kind;

/* One named parameter, visible to the template as a global of that name. */
typedef struct tpl_param {
    const char *name;
    tpl_kind kind;
    int64_t i;                 /* TPL_INT, TPL_BOOL (0 or 1) */
    const char *s;             /* TPL_STR */
    const fj__playout *layout; /* TPL_LAYOUT */
} tpl_param;

/* Finds the text of a template by file name ("attn_fwd.cl.lua"). Returns NULL when there is no
** such template. The text must stay valid until the render returns. */
typedef const char *(*tpl_lookup_fn)(void *ud, const char *name, size_t *len);

/* Limits of one render; zeros select the defaults (16 MiB, 50 million VM instructions, 10 s of
** wall-clock time). */
typedef struct tpl_limits {
    size_t memory_bytes;
    long instructions;
    double seconds;
} tpl_limits;

/* Renders template `name` with params. The output starts with `banner` inside a C comment (the
** variant key) when banner is not NULL. *out is malloc'd. Templates come from the library's
** embedded set, with files in folder `dir` taking precedence (NULL or "": none; a context's is
** $FLASHJIT_TEMPLATE_DIR when it was made).
** Returns FJ_ERR_TEMPLATE with the Lua message (file:line: ...) on any template error. */
fj_status tpl_render(const char *dir, const char *name, const tpl_param *params, int nparams,
                     const char *banner, char **out, fj__err *err);

/* The same with an explicit template source and limits (tests, tools). */
fj_status tpl_render_with(tpl_lookup_fn lookup, void *ud, const tpl_limits *limits,
                          const char *name, const tpl_param *params, int nparams,
                          const char *banner, char **out, fj__err *err);

/* The folder $FLASHJIT_TEMPLATE_DIR names (development), or NULL: what a context reads once,
** when it is made, and passes as `dir` below. */
const char *tpl_env_dir(void);

/* SHA-256 over every template tpl_render(dir, ...) loads (embedded, or overridden by files in
** dir), so any change to any template changes every variant key. */
fj_status tpl_set_hash(const char *dir, char hex[65], fj__err *err);

/* The embedded templates, generated at build time from templates/ (templates_embedded.c). */
typedef struct tpl_embedded_file {
    const char *name;
    const char *text;
    size_t size;
} tpl_embedded_file;
extern const tpl_embedded_file tpl_embedded_files[];
extern const size_t tpl_embedded_count;

#endif /* FJ_TEMPLATES_RENDER_H */
