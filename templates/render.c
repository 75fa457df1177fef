/* The Lua sandbox that renders templates. A fresh Lua state per render (strings share one
** metatable, so a reused state could leak changes between renders), a byte-budget allocator,
** an instruction-count hook that also enforces a wall-clock deadline (one VM instruction can do
** work in proportion to a string's length), only base/string/table/math opened, no pattern
** matching (Lua's matcher backtracks in C, where the hook never runs: string.find is plain-only,
** match/gmatch/gsub are gone), and text chunks only, for the engine too (crafted bytecode can
** crash Lua). Every Lua call runs under lua_pcall. */
#define _POSIX_C_SOURCE 200809L
#include "render.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define TPL_DEFAULT_MEMORY (16u << 20)
#define TPL_DEFAULT_INSTRUCTIONS 50000000L
#define TPL_DEFAULT_SECONDS 10.0
#define TPL_HOOK_EVERY 100
#define TPL_ENGINE "engine.lua"

typedef struct sandbox {
    size_t used, budget;
    int over_budget;
    long instructions_left;
    double deadline; /* CLOCK_MONOTONIC seconds */
    tpl_lookup_fn lookup;
    void *ud;
} sandbox;

/* lua_Alloc with a budget: refusing a request makes Lua raise "not enough memory". */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    sandbox *sb = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        sb->used -= old;
        return NULL;
    }
    if (nsize > old && sb->used + (nsize - old) > sb->budget) {
        sb->over_budget = 1;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p)
        sb->used = sb->used - old + nsize;
    return p;
}

static double monotonic_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sandbox_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    sandbox *sb;
    lua_getallocf(L, (void **)&sb);
    sb->instructions_left -= TPL_HOOK_EVERY;
    if (sb->instructions_left < 0)
        luaL_error(L, "template exceeded the instruction limit");
    if (monotonic_seconds() > sb->deadline)
        luaL_error(L, "template exceeded the time limit");
}

/* load(text [, chunkname [, mode [, env]]]) for the engine: Lua's load restricted to text
** chunks whatever mode says, and to strings (no reader functions). */
static int lua_load_text(lua_State *L)
{
    size_t len = 0;
    const char *text = luaL_checklstring(L, 1, &len);
    const char *name = luaL_optstring(L, 2, "=(load)");
    int has_env = !lua_isnoneornil(L, 4);
    if (luaL_loadbufferx(L, text, len, name, "t") != LUA_OK) {
        luaL_pushfail(L);
        lua_insert(L, -2);
        return 2;
    }
    if (has_env) {
        lua_pushvalue(L, 4);
        if (!lua_setupvalue(L, -2, 1))
            lua_pop(L, 1);
    }
    return 1;
}

/* string.find(s, text [, init]): plain search only; the pattern flag is ignored. */
static int lua_plain_find(lua_State *L)
{
    lua_settop(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_pushboolean(L, 1);
    lua_call(L, 4, LUA_MULTRET);
    return lua_gettop(L);
}

/* Leaves the string library (which is also every string's metatable __index) with no bytecode
** and no pattern matching. */
static void restrict_string_library(lua_State *L)
{
    static const char *const removed[] = {"dump", "match",  "gmatch",  "gsub",
                                          "pack", "unpack", "packsize"};
    lua_getglobal(L, "string");
    for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++) {
        lua_pushnil(L);
        lua_setfield(L, -2, removed[i]);
    }
    lua_getfield(L, -1, "find");
    lua_pushcclosure(L, lua_plain_find, 1);
    lua_setfield(L, -2, "find");
    lua_pop(L, 1);
}

/* source(name) for the engine: the text of a template, or nil. */
static int lua_source(lua_State *L)
{
    sandbox *sb = lua_touserdata(L, lua_upvalueindex(1));
    const char *name = luaL_checkstring(L, 1);
    size_t len = 0;
    const char *text = sb->lookup(sb->ud, name, &len);
    if (!text)
        lua_pushnil(L);
    else
        lua_pushlstring(L, text, len);
    return 1;
}

/* Copies the whitelisted globals into a new table on the stack (the string library restricted
** first). */
static void push_safe_table(lua_State *L)
{
    static const char *const names[] = {"assert", "error",  "ipairs",   "next",     "pairs",
                                        "pcall",  "select", "tonumber", "tostring", "type",
                                        "string", "table",  "math"};
    lua_createtable(L, 0, (int)(sizeof names / sizeof names[0]));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        lua_getglobal(L, names[i]);
        lua_setfield(L, -2, names[i]);
    }
}

/* Pushes a layout as {name, size, align, fields = {{name, kind, ctype, offset, size, block},
** ...}} with kind one of "ptr", "i32", "i64", "f32", "tmap", "block" (block: the nested
** layout's table). */
static void push_layout(lua_State *L, const fj__playout *l)
{
    static const char *const kinds[] = {"ptr", "i32", "i64", "f32", "tmap", "block"};
    lua_createtable(L, 0, 4);
    lua_pushstring(L, l->name);
    lua_setfield(L, -2, "name");
    lua_pushinteger(L, (lua_Integer)l->size);
    lua_setfield(L, -2, "size");
    lua_pushinteger(L, (lua_Integer)l->align);
    lua_setfield(L, -2, "align");
    lua_createtable(L, l->nfields, 0);
    for (int i = 0; i < l->nfields; i++) {
        const fj__pfield *f = &l->fields[i];
        lua_createtable(L, 0, 6);
        lua_pushstring(L, f->name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, kinds[f->kind]);
        lua_setfield(L, -2, "kind");
        lua_pushstring(L, f->ctype ? f->ctype : "");
        lua_setfield(L, -2, "ctype");
        lua_pushinteger(L, (lua_Integer)f->offset);
        lua_setfield(L, -2, "offset");
        lua_pushinteger(L, (lua_Integer)f->size);
        lua_setfield(L, -2, "size");
        if (f->block) {
            push_layout(L, f->block);
            lua_setfield(L, -2, "block");
        }
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "fields");
}

static void push_params(lua_State *L, const tpl_param *params, int nparams)
{
    lua_createtable(L, 0, nparams);
    for (int i = 0; i < nparams; i++) {
        switch (params[i].kind) {
        case TPL_INT: lua_pushinteger(L, (lua_Integer)params[i].i); break;
        case TPL_BOOL: lua_pushboolean(L, params[i].i != 0); break;
        case TPL_STR: lua_pushstring(L, params[i].s ? params[i].s : ""); break;
        case TPL_LAYOUT: push_layout(L, params[i].layout); break;
        }
        lua_setfield(L, -2, params[i].name);
    }
}

/* The protected part of a render: everything that can raise a Lua error. Leaves the rendered
** text on the stack. */
static int render_protected(lua_State *L)
{
    sandbox *sb = lua_touserdata(L, 1);
    const char *name = lua_tostring(L, 2);
    const tpl_param *params = lua_touserdata(L, 3);
    int nparams = (int)lua_tointeger(L, 4);

    static const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},
                                    {LUA_STRLIBNAME, luaopen_string},
                                    {LUA_TABLIBNAME, luaopen_table},
                                    {LUA_MATHLIBNAME, luaopen_math}};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        luaL_requiref(L, libs[i].name, libs[i].func, 1);
        lua_pop(L, 1);
    }
    restrict_string_library(L);
    size_t len = 0;
    const char *engine = sb->lookup(sb->ud, TPL_ENGINE, &len);
    if (!engine)
        return luaL_error(L, "the template engine (%s) is missing", TPL_ENGINE);
    if (luaL_loadbufferx(L, engine, len, "=" TPL_ENGINE, "t") != LUA_OK)
        return lua_error(L);
    /* The engine's _ENV holds only the three base functions it needs beyond its arguments. */
    lua_newtable(L);
    static const char *const engine_globals[] = {"error", "setmetatable", "tostring"};
    for (size_t i = 0; i < sizeof engine_globals / sizeof engine_globals[0]; i++) {
        lua_getglobal(L, engine_globals[i]);
        lua_setfield(L, -2, engine_globals[i]);
    }
    lua_setupvalue(L, -2, 1);

    lua_pushlightuserdata(L, sb);
    lua_pushcclosure(L, lua_source, 1);
    push_params(L, params, nparams);
    push_safe_table(L);
    lua_pushcfunction(L, lua_load_text);
    lua_pushstring(L, name);
    lua_call(L, 5, 1);
    if (!lua_isstring(L, -1))
        return luaL_error(L, "the template engine returned no text");
    return 1;
}

fj_status tpl_render_with(tpl_lookup_fn lookup, void *ud, const tpl_limits *limits,
                          const char *name, const tpl_param *params, int nparams,
                          const char *banner, char **out, fj__err *err)
{
    *out = NULL;
    sandbox sb = {
        .budget = limits && limits->memory_bytes ? limits->memory_bytes : TPL_DEFAULT_MEMORY,
        .instructions_left =
            limits && limits->instructions ? limits->instructions : TPL_DEFAULT_INSTRUCTIONS,
        .deadline = monotonic_seconds() +
                    (limits && limits->seconds > 0 ? limits->seconds : TPL_DEFAULT_SECONDS),
        .lookup = lookup,
        .ud = ud};
    lua_State *L = lua_newstate(sandbox_alloc, &sb);
    if (!L)
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "rendering %s: cannot create a Lua state", name);
    lua_sethook(L, sandbox_hook, LUA_MASKCOUNT, TPL_HOOK_EVERY);

    fj_status st = FJ_OK;
    lua_pushcfunction(L, render_protected);
    lua_pushlightuserdata(L, &sb);
    lua_pushstring(L, name);
    lua_pushlightuserdata(L, (void *)params);
    lua_pushinteger(L, nparams);
    if (lua_pcall(L, 4, 1, 0) != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        if (sb.over_budget)
            st = fj__fail(err, FJ_ERR_TEMPLATE,
                          "rendering %s: template exceeded the memory limit (%zu bytes): %s", name,
                          sb.budget, msg ? msg : "");
        else
            st = fj__fail(err, FJ_ERR_TEMPLATE, "rendering %s: %s", name,
                          msg ? msg : "(error object is not a string)");
        goto out;
    }
    size_t len = 0;
    const char *text = lua_tolstring(L, -1, &len);
    size_t banner_len = banner ? strlen(banner) + 32 : 0;
    *out = malloc(len + banner_len + 1);
    if (!*out) {
        st = fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "rendering %s: out of memory", name);
        goto out;
    }
    size_t n = 0;
    if (banner)
        n = (size_t)snprintf(*out, banner_len + 1, "/* flashjit variant\n%s*/\n", banner);
    memcpy(*out + n, text, len);
    (*out)[n + len] = '\0';
out:
    lua_close(L);
    return st;
}

/* ---- template sources: embedded, with a folder's files taking precedence ---------------- */

#define TPL_MAX_LOADED 32

typedef struct dir_lookup {
    const char *dir;
    int n;
    char *names[TPL_MAX_LOADED];
    char *texts[TPL_MAX_LOADED];
    size_t sizes[TPL_MAX_LOADED];
} dir_lookup;

static const tpl_embedded_file *find_embedded(const char *name)
{
    for (size_t i = 0; i < tpl_embedded_count; i++)
        if (strcmp(tpl_embedded_files[i].name, name) == 0)
            return &tpl_embedded_files[i];
    return NULL;
}

/* Reads a whole file into a malloc'd, NUL-terminated buffer; NULL if it cannot. */
static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
                buf[n] = '\0';
                *size = (size_t)n;
            } else {
                FJ_FREE(buf);
            }
        }
    }
    fclose(f);
    return buf;
}

static const char *lookup_default(void *ud, const char *name, size_t *len)
{
    dir_lookup *dl = ud;
    /* Names are plain file names: anything with a path separator or ".." is not a template. */
    if (strchr(name, '/') || strstr(name, ".."))
        return NULL;
    if (dl && dl->dir && dl->dir[0]) {
        for (int i = 0; i < dl->n; i++)
            if (strcmp(dl->names[i], name) == 0) {
                *len = dl->sizes[i];
                return dl->texts[i];
            }
        if (dl->n < TPL_MAX_LOADED) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dl->dir, name);
            size_t size = 0;
            char *text = read_file(path, &size);
            if (text) {
                dl->names[dl->n] = fj__strdup(name);
                dl->texts[dl->n] = text;
                dl->sizes[dl->n] = size;
                if (!dl->names[dl->n]) {
                    FJ_FREE(dl->texts[dl->n]);
                } else {
                    dl->n++;
                    *len = size;
                    return text;
                }
            }
        }
    }
    const tpl_embedded_file *f = find_embedded(name);
    if (!f)
        return NULL;
    *len = f->size;
    return f->text;
}

static void dir_lookup_free(dir_lookup *dl)
{
    for (int i = 0; i < dl->n; i++) {
        FJ_FREE(dl->names[i]);
        FJ_FREE(dl->texts[i]);
    }
    dl->n = 0;
}

fj_status tpl_render(const char *dir, const char *name, const tpl_param *params, int nparams,
                     const char *banner, char **out, fj__err *err)
{
    dir_lookup dl = {.dir = dir};
    fj_status st =
        tpl_render_with(lookup_default, &dl, NULL, name, params, nparams, banner, out, err);
    dir_lookup_free(&dl);
    return st;
}

const char *tpl_env_dir(void)
{
    const char *dir = getenv("FLASHJIT_TEMPLATE_DIR");
    return dir && dir[0] ? dir : NULL;
}

fj_status tpl_set_hash(const char *dir, char hex[65], fj__err *err)
{
    dir_lookup dl = {.dir = dir};
    size_t total = 0;
    for (size_t i = 0; i < tpl_embedded_count; i++) {
        size_t len = 0;
        if (lookup_default(&dl, tpl_embedded_files[i].name, &len))
            total += strlen(tpl_embedded_files[i].name) + 1 + len + 1;
    }
    char *all = calloc(total + 1, 1);
    if (!all) {
        dir_lookup_free(&dl);
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "hashing templates: out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < tpl_embedded_count; i++) {
        size_t len = 0;
        const char *text = lookup_default(&dl, tpl_embedded_files[i].name, &len);
        if (!text)
            continue;
        size_t nl = strlen(tpl_embedded_files[i].name) + 1;
        memcpy(all + n, tpl_embedded_files[i].name, nl);
        n += nl;
        memcpy(all + n, text, len);
        n += len;
        all[n++] = '\0';
    }
    fj__sha256_hex(all, n, hex);
    free(all);
    dir_lookup_free(&dl);
    return FJ_OK;
}
