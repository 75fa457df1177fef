/* The template renderer: the engine's syntax, the sandbox's limits, errors with their template
** line, the embedded templates and the $FLASHJIT_TEMPLATE_DIR override. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "plan/families.h"
#include "plan/variant.h"
#include "templates/render.h"

/* In-memory templates for tests: the engine from the library plus named texts. */
typedef struct memsrc {
    const char *names[4];
    const char *texts[4];
} memsrc;

static const char *mem_lookup(void *ud, const char *name, size_t *len)
{
    const memsrc *m = ud;
    for (int i = 0; i < 4 && m->names[i]; i++)
        if (!strcmp(m->names[i], name)) {
            *len = strlen(m->texts[i]);
            return m->texts[i];
        }
    for (size_t i = 0; i < tpl_embedded_count; i++)
        if (!strcmp(tpl_embedded_files[i].name, name) && !strcmp(name, "engine.lua")) {
            *len = tpl_embedded_files[i].size;
            return tpl_embedded_files[i].text;
        }
    return NULL;
}

/* Renders a one-template source with a few parameters; returns the status, *out the text. */
static fj_status render_text(const char *text, char **out, fj__err *err, const tpl_limits *limits)
{
    memsrc m = {.names = {"t.lua", "helper.lua"},
                .texts = {text, "% local twice = n * 2\nhelper says ${twice}\n"}};
    tpl_param params[] = {{.name = "n", .kind = TPL_INT, .i = 21},
                          {.name = "flag", .kind = TPL_BOOL, .i = 0},
                          {.name = "dtype", .kind = TPL_STR, .s = "bf16"}};
    return tpl_render_with(mem_lookup, &m, limits, "t.lua", params, 3, NULL, out, err);
}

static void test_text_code_and_interpolation(void **state)
{
    (void)state;
    fj__err err = {{0}};
    char *out = NULL;
    const char *t = "% for i = 1, 3 do\n"
                    "x${i} = ${n + i};\n"
                    "% end\n"
                    "% if not flag then\n"
                    "type ${dtype}\n"
                    "% end\n";
    assert_int_equal(render_text(t, &out, &err, NULL), FJ_OK);
    assert_string_equal(out, "x1 = 22;\nx2 = 23;\nx3 = 24;\ntype bf16\n");
    free(out);
}

static void test_include_and_emit(void **state)
{
    (void)state;
    fj__err err = {{0}};
    char *out = NULL;
    assert_int_equal(render_text("a\n% include(\"helper.lua\")\n% emit(\"z\")\n", &out, &err, NULL),
                     FJ_OK);
    assert_string_equal(out, "a\nhelper says 42\nz");
    free(out);
}

/* Each case must fail with FJ_ERR_TEMPLATE and a message containing `want`. */
static void expect_template_error(const char *text, const char *want, const tpl_limits *limits)
{
    fj__err err = {{0}};
    char *out = NULL;
    fj_status st = render_text(text, &out, &err, limits);
    if (st != FJ_ERR_TEMPLATE || !strstr(err.msg, want))
        fail_msg("template %s: status %d, message '%s', expected '%s'", text, st, err.msg, want);
    assert_null(out);
}

static void test_sandbox_refuses_io_os_require_load(void **state)
{
    (void)state;
    expect_template_error("% io.open('/etc/passwd')\n", "unknown name 'io'", NULL);
    expect_template_error("% os.execute('true')\n", "unknown name 'os'", NULL);
    expect_template_error("% require('os')\n", "unknown name 'require'", NULL);
    expect_template_error("% load('return 1')\n", "unknown name 'load'", NULL);
    expect_template_error("% dofile('/etc/passwd')\n", "unknown name 'dofile'", NULL);
    expect_template_error("% collectgarbage()\n", "unknown name 'collectgarbage'", NULL);
    expect_template_error("% setmetatable({}, {})\n", "unknown name 'setmetatable'", NULL);
    /* string.dump would turn functions into bytecode; it is gone from the string library. */
    expect_template_error("% local f = ('x').dump(tostring)\n", "dump", NULL);
}

static void test_error_names_template_and_line(void **state)
{
    (void)state;
    expect_template_error("line one\n% error('boom')\n", "t.lua:2: boom", NULL);
    expect_template_error("${undefined_param}\n", "unknown name 'undefined_param'", NULL);
    expect_template_error("% include('missing.lua')\n", "no template named 'missing.lua'", NULL);
    expect_template_error("% for\n", "t.lua:1:", NULL); /* a Lua syntax error */
}

static void test_instruction_and_memory_limits(void **state)
{
    (void)state;
    expect_template_error("% while true do end\n", "instruction limit", NULL);
    expect_template_error("% local s = string.rep('x', 64 * 1024 * 1024)\n", "memory limit", NULL);
    tpl_limits tight = {.memory_bytes = 256 * 1024, .instructions = 10000};
    expect_template_error("% local t = {} for i = 1, 1e6 do t[i] = i end\n", "limit", &tight);
    /* A pcall inside the template cannot swallow the instruction limit for good. */
    expect_template_error("% pcall(function() while true do end end) while true do end\n",
                          "instruction limit", NULL);
}

/* Lua's pattern matcher backtracks in C, where the instruction hook never runs: the sandbox has
** only plain find, and no match, gmatch or gsub (string methods included). */
static void test_sandbox_has_no_pattern_matching(void **state)
{
    (void)state;
    fj__err err = {{0}};
    char *out = NULL;
    /* 30 nested a* against 30 a's and no b: exponential as a pattern, instant as plain text. */
    assert_int_equal(render_text("${string.find(string.rep('a', 30), string.rep('a*', 30) .. 'b')}"
                                 " ${string.find('a.b', '.', 1)} ${('x%d'):find('%d')}\n",
                                 &out, &err, NULL),
                     FJ_OK);
    assert_string_equal(out, "nil 2 2\n");
    free(out);
    expect_template_error("% string.match('aaa', '(a*)*b')\n", "match", NULL);
    expect_template_error("% local n = ('aaa'):gsub('a', 'b')\n", "gsub", NULL);
    expect_template_error("% for w in ('a b'):gmatch('%a') do end\n", "gmatch", NULL);
}

/* One VM instruction can do work in proportion to a string's length, so the hook also keeps a
** wall-clock deadline. */
static void test_time_limit(void **state)
{
    (void)state;
    tpl_limits quick = {.seconds = 0.2};
    expect_template_error("% local s = string.rep('x', 1000000)\n"
                          "% for i = 1, 1e9 do local t = s:upper() end\n",
                          "time limit", &quick);
}

/* A template directory may replace engine.lua; the load it is given takes text chunks only. */
static void test_engine_loads_no_bytecode(void **state)
{
    (void)state;
    static const char engine[] =
        "local source, params, safe, load, main = ...\n"
        "local f, msg = load('\\27Lua\\84\\0\\25\\147\\13\\10', '=x', 'b')\n"
        "if f then return 'loaded bytecode' end\n"
        "local g = load('return 6 * 7', '=y', 'bt', {})\n"
        "return tostring(msg) .. ' | ' .. tostring(g())\n";
    memsrc m = {.names = {"engine.lua", "t.lua"}, .texts = {engine, "x\n"}};
    fj__err err = {{0}};
    char *out = NULL;
    assert_int_equal(tpl_render_with(mem_lookup, &m, NULL, "t.lua", NULL, 0, NULL, &out, &err),
                     FJ_OK);
    assert_non_null(strstr(out, "binary chunk"));
    assert_non_null(strstr(out, "| 42"));
    free(out);
}

static void test_banner_and_embedded_attention(void **state)
{
    (void)state;
    const fj_dtype dtypes[] = {FJ_DTYPE_F32, FJ_DTYPE_F16, FJ_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        /* The parameters come from a variant, as a call renders them. */
        fj__variant v;
        memset(&v, 0, sizeof v);
        v.family = FJ__FAMILY_FWD;
        v.backend = FJ_BACKEND_OPENCL;
        v.path = FJ__PATH_SIMT;
        v.q_dtype = v.kv_dtype = v.out_dtype = dtypes[i];
        v.acc_dtype = FJ_DTYPE_F32;
        v.head_dim_pad = 64;
        v.head_dim_v_pad = 48;
        v.tile_m = v.threads = 32;
        v.tile_n = 16;
        v.local_mask = i != 0;
        v.softcap = i == 2;
        v.write_lse = 1;
        v.mask_mod = i == 1 ? "(FJ_Q >= FJ_K)" : NULL;
        v.alibi = i == 0;
        v.bias = i == 1;
        v.mask_tensor = i == 2;
        v.varlen = (uint8_t)i;
        v.mask_ranges = (uint8_t)(2 * i);
        v.block_mask = i == 1;
        fj__err err = {{0}};
        char *out = NULL;
        assert_int_equal(fj__variant_render(&v, NULL, "dtype=x\n", &out, &err), FJ_OK);
        assert_true((strstr(out, "x -= c.slope") != NULL) == (i == 0));
        assert_true((strstr(out, "BIAS_LOAD(c.bias") != NULL) == (i == 1));
        assert_true((strstr(out, "LDG(c.mask + fj_q") != NULL) == (i == 2));
        assert_true((strstr(out, "cu_seqlens_q[batch + 1]") != NULL) == (i > 0));
        assert_true((strstr(out, "seqused_k[batch]") != NULL) == (i == 2));
        assert_true((strstr(out, "fj_q < LDG(r + 1)") != NULL) == (i > 0));
        assert_true((strstr(out, "fj_q < LDG(r + 3)") != NULL) == (i == 2));
        assert_true((strstr(out, "block_class == 0") != NULL) == (i == 1));
        assert_true((strstr(out, "keep = ((FJ_Q >= FJ_K))") != NULL) == (i == 1));
        assert_true(strncmp(out, "/* flashjit variant\ndtype=x\n*/\n", 30) == 0);
        assert_non_null(strstr(out, "__kernel"));
        assert_non_null(strstr(out, "#define DVP 48"));
        assert_true((strstr(out, "F_TANH(x)") != NULL) == (i == 2));
        /* One struct argument, written from the host's layout. */
        assert_non_null(strstr(out, "typedef struct fj_fwd_params {"));
        assert_non_null(strstr(out, "const fj_fwd_params P"));
        assert_non_null(strstr(out, "fj_fwd_params_matches_host[sizeof(fj_fwd_params) =="));
        free(out);
    }
}

/* With FJ_RENDER_OUT set (and `when`), writes source to that folder as the file named by fmt
** (printf-style), for compiling it by hand. */
static void save_render(int when, const char *source, const char *fmt, ...)
{
    const char *dir = getenv("FJ_RENDER_OUT");
    if (!dir || !when)
        return;
    char name[256], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(source, f);
    fclose(f);
}

/* The expressions of the backward's render tests: a mask_mod, and a score_mod with its
** derivative. */
static void set_test_mods(fj__variant *v)
{
    v->mask_mod = "(FJ_Q >= FJ_K)";
    v->score_mod = "(EXPR_TANH(FJ_S) * 2.0f)";
    v->score_mod_grad = "((1.0f - EXPR_TANH(FJ_S) * EXPR_TANH(FJ_S)) * 2.0f)";
}

/* v's kernel source (the caller frees it); a failure fails the test. */
static char *render_or_fail(const fj__variant *v)
{
    fj__err err = {{0}};
    char *out = NULL;
    if (fj__variant_render(v, NULL, "dtype=x\n", &out, &err) != FJ_OK)
        fail_msg("stage %d: %s", v->stage, err.msg);
    return out;
}

/* The SIMT forward with FP8 q, k, v and a 16-bit out, for both backends and both formats: the
** inputs are converted on load, the descale factors read only when given (FJ_RENDER_OUT: the
** CUDA sources are written there). */
static void test_fp8_forward_render(void **state)
{
    (void)state;
    for (int backend = 0; backend < 2; backend++)
        for (int e5m2 = 0; e5m2 < 2; e5m2++) {
            fj__variant v;
            memset(&v, 0, sizeof v);
            v.family = FJ__FAMILY_FWD;
            v.backend = backend ? FJ_BACKEND_CUDA : FJ_BACKEND_OPENCL;
            v.path = FJ__PATH_SIMT;
            v.q_dtype = v.kv_dtype = e5m2 ? FJ_DTYPE_F8_E5M2 : FJ_DTYPE_F8_E4M3;
            v.out_dtype = e5m2 ? FJ_DTYPE_F16 : FJ_DTYPE_BF16;
            v.acc_dtype = FJ_DTYPE_F32;
            v.head_dim_pad = 64;
            v.head_dim_v_pad = 48;
            v.tile_m = v.threads = 32;
            v.tile_n = 16;
            v.local_mask = v.write_lse = 1;
            v.descale = (uint8_t)!e5m2;
            char *out = render_or_fail(&v);
            assert_non_null(strstr(out, e5m2 ? "#define Q_LOAD(p, i) e5m2_to_float((p)[i])"
                                             : "#define KV_LOAD(p, i) e4m3_to_float((p)[i])"));
            assert_true((strstr(out, "vd[batch * P.vd_sb") != NULL) == !e5m2);
            assert_null(strstr(out, "#define Q_STORE"));
            save_render(backend, out, "fwd_fp8_%s.cu", e5m2 ? "e5m2" : "e4m3");
            free(out);
        }
}

/* The decode kernels (the portable one for both backends, CUDA's vector and tensor-core ones),
** dense and paged,
** whole and split: the page table is read (and its numbers clamped) only when paged, the
** workspace written only when split; the portable one paged and split also with an FP8 KV
** cache and its descales. With FJ_RENDER_OUT set, the CUDA sources are written there (for
** compiling them by hand). */
static void test_decode_variants_render(void **state)
{
    (void)state;
    static const char *const names[] = {"", "", "_vec", "_mma"};
    for (int kind = 0; kind < 4; kind++) /* OpenCL, CUDA, CUDA vector, CUDA tensor cores */
        for (int paged = 0; paged < 2; paged++)
            for (int partial = 0; partial < 2; partial++) {
                fj__variant v;
                memset(&v, 0, sizeof v);
                v.family = FJ__FAMILY_DECODE;
                v.backend = kind ? FJ_BACKEND_CUDA : FJ_BACKEND_OPENCL;
                v.path = kind == 2 ? FJ__PATH_VECTOR : kind == 3 ? FJ__PATH_MMA : FJ__PATH_SIMT;
                v.q_dtype = v.kv_dtype = v.out_dtype = FJ_DTYPE_BF16;
                v.acc_dtype = FJ_DTYPE_F32;
                v.head_dim_pad = 64;
                v.head_dim_v_pad = kind == 3 && paged ? 64 : 48; /* both of its loaders */
                v.tile_m = kind == 3 ? 16 << paged : 4; /* 4 or 2 warps a row slab */
                v.tile_n = kind == 2 ? 0 : kind == 3 ? 64 : 32;
                v.stages = kind >= 2 ? 3 : 0;
                v.warps = kind == 3 ? 4 : 0;
                v.q_in_regs = (uint8_t)(kind == 3 && partial);
                v.threads = 128;
                v.local_mask = (uint8_t)paged;
                v.softcap = (uint8_t)partial;
                v.write_lse = 1;
                v.paged = (uint8_t)paged;
                v.partial = (uint8_t)partial;
                const int fp8 = kind < 2 && paged && partial;
                if (fp8) {
                    v.kv_dtype = FJ_DTYPE_F8_E4M3;
                    v.descale = 1;
                }
                fj__err err = {{0}};
                char *out = NULL;
                assert_int_equal(fj__variant_render(&v, NULL, "dtype=x\n", &out, &err), FJ_OK);
                assert_non_null(strstr(out, "fj_attn_decode("));
                assert_true((strstr(out, "#define KV_LOAD(p, i) e4m3_to_float") != NULL) == fp8);
                assert_true((strstr(out, "vd[batch * P.fwd.vd_sb") != NULL) == fp8);
                assert_true((strstr(out, "P.page_table") != NULL) == paged);
                assert_true((strstr(out, "P.num_pages - 1") != NULL) == paged);
                assert_true((strstr(out, "P.part.o") != NULL) == partial);
                save_render(kind, out, "decode%s_p%d_s%d.cu", names[kind], paged, partial);
                free(out);
            }
}

/* The work-group size a rendered portable kernel declares: the value of the macro that its
** KERNEL(...) or KERNEL_ONE_BLOCK(...) names (0: none found). */
static int declared_work_group(const char *out)
{
    static const char *const spellings[] = {"\nKERNEL(", "\nKERNEL_ONE_BLOCK("};
    const char *k = NULL;
    for (int i = 0; i < 2 && !k; i++)
        if ((k = strstr(out, spellings[i])) != NULL)
            k += strlen(spellings[i]);
    char name[64], define[80];
    if (!k || sscanf(k, "%63[A-Z_]", name) != 1)
        return 0;
    snprintf(define, sizeof define, "#define %s ", name);
    const char *d = strstr(out, define);
    return d ? atoi(d + strlen(define)) : 0;
}

/* The backward's SIMT stages render for both backends, with soft-capping, a window, a bias,
** a mask_mod and a score_mod with its derivative, each declaring the work-group it is launched
** with (the D stage, the cast and the sum of dbias's shares: work-items over rows or elements;
** dbias a work-item per 4 x 4 elements; FJ_RENDER_OUT: the CUDA sources are written there). */
static void test_backward_stages_render(void **state)
{
    (void)state;
    static const char *const entries[6] = {"fj_attn_bwd_dot(",      "fj_attn_bwd_dkdv(",
                                           "fj_attn_bwd_dq(",       "fj_attn_bwd_dbias(",
                                           "fj_attn_bwd_dq_store(", "fj_attn_bwd_dbias_sum("};
    for (int backend = 0; backend < 2; backend++)
        for (int stage = 1; stage <= 6; stage++) {
            fj__variant v;
            memset(&v, 0, sizeof v);
            v.family = FJ__FAMILY_BWD;
            v.backend = backend ? FJ_BACKEND_CUDA : FJ_BACKEND_OPENCL;
            v.path = FJ__PATH_SIMT;
            v.q_dtype = v.kv_dtype = v.out_dtype = backend ? FJ_DTYPE_BF16 : FJ_DTYPE_F16;
            v.acc_dtype = FJ_DTYPE_F32;
            v.head_dim_pad = 64;
            v.head_dim_v_pad = 48;
            v.tile_m = v.tile_n = 16;
            v.threads = stage == 1 || stage >= 5 ? 128 : 16;
            v.stage = (uint8_t)stage;
            v.local_mask = v.softcap = 1;
            v.bias = 1;
            set_test_mods(&v);
            char *out = render_or_fail(&v);
            assert_non_null(strstr(out, entries[stage - 1]));
            assert_int_equal(declared_work_group(out), v.threads);
            const int scores = stage > 1 && stage < 5; /* 5 and 6 add sums up */
            assert_true((strstr(out, "1.0f - t * t") != NULL) == scores);
            assert_true((strstr(out, "fj_score_grad(mc, capped") != NULL) == scores);
            save_render(backend, out, "bwd_stage%d.cu", stage);
            free(out);
        }
}

/* A backward variant on CUDA's tensor cores (`path`) in `dtype`, f32 accumulators. */
static fj__variant tc_bwd_variant(fj__kernel_path path, fj_dtype dtype)
{
    fj__variant v;
    memset(&v, 0, sizeof v);
    v.family = FJ__FAMILY_BWD;
    v.backend = FJ_BACKEND_CUDA;
    v.path = path;
    v.q_dtype = v.kv_dtype = v.out_dtype = dtype;
    v.acc_dtype = FJ_DTYPE_F32;
    return v;
}

/* One on mma.sync at head dims 64 (wide 0), 128 / 96 (1) or 256 (2). */
static fj__variant mma_bwd_variant(fj_dtype dtype, int wide)
{
    fj__variant v = tc_bwd_variant(FJ__PATH_MMA, dtype);
    v.head_dim_pad = wide == 2 ? 256 : wide ? 128 : 64;
    v.head_dim_v_pad = wide == 2 ? 256 : wide ? 96 : 64;
    return v;
}

/* The backward's tensor-core stages (dk and dv, with dq by atomics or not; dq) render, with and
** without the band and soft-capping, at head dims 64, 128 / 96 and 256 (dV and dK in separate
** launches there), and the dk/dv stage with its warps in a grid: the products are mma.sync,
** soft-capping's derivative is in dS where dS is computed, and dq is added by atomics where
** asked (FJ_RENDER_OUT: the sources are written there). */
static void test_backward_mma_render(void **state)
{
    (void)state;
    for (int stage = 2; stage <= 3; stage++)
        for (int wide = 0; wide < 3; wide++)
            for (int extras = 0; extras < 2; extras++)
                for (int atomic = 0; atomic < (stage == 2 ? 2 : 1); atomic++) {
                    fj__variant v = mma_bwd_variant(FJ_DTYPE_BF16, wide);
                    /* at 256, stage 2 writes dV (plain) or dK (with the band and soft-capping) */
                    v.grads = stage == 3 ? 0 : wide < 2 ? 3 : extras ? 1 : 2;
                    if (atomic && (v.grads & 1))
                        v.grads |= 4;
                    v.warps = 4;
                    v.threads = 128;
                    v.tile_m = stage == 2 ? (wide ? 32 : 64) : 64;
                    v.tile_n = stage == 2 || wide < 2 ? 64 : 32;
                    v.stage = (uint8_t)stage;
                    v.local_mask = v.softcap = (uint8_t)extras;
                    v.varlen = (uint8_t)(wide == 0 ? 2 * extras : 0); /* packed, with seqused_k */
                    if (extras && wide == 1) { /* attn_masks.lua's masks and terms, block classes */
                        v.alibi = v.mask_tensor = v.block_mask = 1;
                        v.bias = 2;
                        v.mask_ranges = 4;
                        set_test_mods(&v);
                    }
                    char *out = render_or_fail(&v);
                    assert_non_null(
                        strstr(out, stage == 2 ? "fj_attn_bwd_dkdv(" : "fj_attn_bwd_dq("));
                    assert_non_null(strstr(out, "mma.sync.aligned.m16n8k16"));
                    assert_true((strstr(out, "1.0f - th * th") != NULL) ==
                                (extras && (stage == 3 || v.grads & 1)));
                    assert_true((strstr(out, "*(u32 *)(dk + ") != NULL) ==
                                (stage == 2 && (v.grads & 1)));
                    assert_true((strstr(out, "*(u32 *)(dv + ") != NULL) ==
                                (stage == 2 && (v.grads & 2)));
                    assert_true((strstr(out, "fj_score_grad(mc, capped") != NULL) ==
                                (v.score_mod != NULL));
                    assert_true((strstr(out, "add_dq_tile(P.dq_acc") != NULL) ==
                                ((v.grads & 4) != 0));
                    save_render(1, out, "bwd_mma_stage%d_d%d_x%d_g%d.cu", stage, v.head_dim_pad,
                                extras, v.grads);
                    free(out);
                }
    /* The dk/dv stage with its warps in a grid (d_split, attn_bwd_mma_grid.cu.lua), d 64 and
    ** 128 / 96, dQ by atomics or not: P^T and dS^T through shared memory, a barrier a pair of
    ** warps; extras 1: the band, soft-capping and (at 128 / 96) every mask and term; 2: the same
    ** without soft-capping or score_mod. P^T's exponentials unmasked beside dP^T's products where only the
    ** ends and the band mask, P^T before those products where dS needs no score again (no
    ** soft-capping), else both after them. */
    for (int wide = 0; wide < 2; wide++)
        for (int extras = 0; extras < 3; extras++)
            for (int atomic = 0; atomic < 2; atomic++) {
                fj__variant v = mma_bwd_variant(FJ_DTYPE_BF16, wide);
                v.stage = 2;
                v.d_split = 1;
                v.grads = atomic ? 7 : 3;
                v.warps = 8;
                v.threads = 256;
                v.tile_n = 128;
                v.tile_m = wide ? 64 : 128;
                v.local_mask = extras > 0;
                v.softcap = extras == 1;
                v.varlen = (uint8_t)(wide == 0 && extras ? 2 : 0);
                if (extras && wide == 1) {
                    v.alibi = v.mask_tensor = v.block_mask = 1;
                    v.bias = 2;
                    v.mask_ranges = 4;
                    set_test_mods(&v);
                    if (extras == 2)
                        v.score_mod = v.score_mod_grad = NULL;
                }
                char *out = render_or_fail(&v);
                assert_non_null(strstr(out, "fj_attn_bwd_dkdv("));
                assert_non_null(strstr(out, "mma.sync.aligned.m16n8k16"));
                assert_non_null(strstr(out, "bar_sync(1 + wk, 64);"));
                assert_non_null(strstr(out, "*(u32 *)(dk + "));
                assert_non_null(strstr(out, "*(u32 *)(dv + "));
                const int masks = extras && wide == 1;
                assert_true((strstr(out, "1.0f - th * th") != NULL) == (extras == 1));
                assert_true((strstr(out, "P^T unmasked") != NULL) ==
                            (extras == 0 || (extras == 2 && !masks)));
                assert_true((strstr(out, "P^T first") != NULL) == (extras == 2 && masks));
                assert_true((strstr(out, "add_dq(last, sDS)") != NULL) == atomic);
                assert_true((strstr(out, "fj_score_grad(mc, capped") != NULL) ==
                            (v.score_mod != NULL));
                save_render(1, out, "bwd_mma_grid_d%d_x%d_g%d.cu", v.head_dim_pad, extras,
                            v.grads);
                free(out);
            }
    /* The bias's gradient (stage 4, attn_bwd_dbias_mma.cu.lua): dS before soft-capping's
    ** derivative (the bias is added after the cap), through score_mod's; a key bias's shares
    ** into the workspace. */
    for (int wide = 0; wide < 3; wide++)
        for (int extras = 0; extras < 2; extras++) {
            fj__variant v = mma_bwd_variant(FJ_DTYPE_F16, wide);
            v.warps = 4;
            v.threads = 128;
            v.tile_m = v.tile_n = 64;
            v.stage = 4;
            v.bias = (uint8_t)(1 + extras);
            v.local_mask = v.softcap = (uint8_t)extras;
            if (extras && wide == 1) {
                v.alibi = v.mask_tensor = v.block_mask = 1;
                set_test_mods(&v);
            }
            char *out = render_or_fail(&v);
            assert_non_null(strstr(out, "fj_attn_bwd_dbias("));
            assert_non_null(strstr(out, "mma.sync.aligned.m16n8k16"));
            assert_non_null(strstr(out, "P.dbias_part"));
            assert_true((strstr(out, "tanhf(") != NULL) == extras);
            assert_null(strstr(out, "1.0f - th * th"));
            assert_true((strstr(out, "fj_score_grad(mc, capped") != NULL) ==
                        (v.score_mod != NULL));
            save_render(1, out, "bwd_mma_dbias_d%d_x%d.cu", v.head_dim_pad, extras);
            free(out);
        }
}

/* Hopper's backward kernels render at head dims 64 and 128 / 64 (dk/dv with and without dq's
** atomics; dq), plain and with the band, soft-capping, the masks and score terms, block classes
** and packed sequences: their products are wgmma, dk/dv stores dK and dV and adds dq (bulk
** reductions) where asked, dq stores dQ (FJ_RENDER_OUT: the sources are written there). */
static void test_backward_wgmma_render(void **state)
{
    (void)state;
    for (int wide = 0; wide < 2; wide++)
        for (int extras = 0; extras < 3; extras++)
            for (int atomic = 0; atomic < 3; atomic++) { /* 2: stage 3, dq */
                fj__variant v = tc_bwd_variant(FJ__PATH_WGMMA, FJ_DTYPE_BF16);
                v.head_dim_pad = wide ? 128 : 64;
                v.head_dim_v_pad = 64;
                const int dq = atomic == 2;
                v.grads = dq ? 0 : atomic ? 7 : 3;
                v.warps = 8;
                v.stage = dq ? 3 : 2;
                v.threads = 256;
                v.stages = 2;
                v.tile_m = dq ? 128 : 64;
                v.tile_n = dq ? 64 : 128;
                v.local_mask = v.softcap = (uint8_t)(extras > 0);
                v.varlen = (uint8_t)(extras == 1 && !wide ? 2 : 0); /* packed, with seqused_k */
                if (extras == 2) { /* attn_masks.lua's masks and terms, block classes */
                    v.alibi = v.mask_tensor = v.block_mask = 1;
                    v.bias = 2;
                    v.mask_ranges = 4;
                    set_test_mods(&v);
                }
                char *out = render_or_fail(&v);
                assert_non_null(strstr(out, dq ? "fj_attn_bwd_dq(" : "fj_attn_bwd_dkdv("));
                assert_non_null(strstr(out, "wgmma.mma_async.sync.aligned.m64n64k16"));
                assert_true((strstr(out, "1.0f - th * th") != NULL) == (extras > 0));
                assert_true((strstr(out, "*(u32 *)(dk + ") != NULL) == !dq);
                assert_true((strstr(out, "*(u32 *)(dv + ") != NULL) == !dq);
                assert_true((strstr(out, "*(u32 *)(dq + ") != NULL) == dq);
                assert_true((strstr(out, "fj_score_grad(mc, capped") != NULL) == (extras == 2));
                /* stage 2 with dq: the pieces added by bulk tensor reductions into the sum */
                assert_true((strstr(out, "add_dq_rows(&T.tm_dq_acc, ") != NULL) == (atomic == 1));
                /* stage 2: bulk tensor copies into a ring of mbarrier-guarded slots */
                assert_true((strstr(out, "load_panels<DP>(sQ, &T.tm_q") != NULL) == !dq);
                save_render(1, out, "bwd_wgmma_stage%d_d%d_x%d_g%d.cu", v.stage, v.head_dim_pad,
                            extras, v.grads);
                free(out);
            }
}

/* Renders params_struct() of layout l for backend; returns the status, the text in *out. */
static fj_status render_layout(const fj__playout *l, const char *backend, char **out, fj__err *err)
{
    const tpl_embedded_file *params_lua = NULL;
    for (size_t i = 0; i < tpl_embedded_count; i++)
        if (!strcmp(tpl_embedded_files[i].name, "params.lua"))
            params_lua = &tpl_embedded_files[i];
    assert_non_null(params_lua);
    memsrc m = {.names = {"t.lua", "params.lua"},
                .texts = {"% include('params.lua')\n% params_struct(args)\n", params_lua->text}};
    tpl_param params[] = {{.name = "backend", .kind = TPL_STR, .s = backend},
                          {.name = "args", .kind = TPL_LAYOUT, .layout = l}};
    return tpl_render_with(mem_lookup, &m, NULL, "t.lua", params, 2, NULL, out, err);
}

/* Every family's parameter block renders on both backends, with the device compiler's own check
** of the host's layout; a block whose host layout differs from the kernel's (a field moved, a
** size changed) fails at render time, naming the field. */
static void test_param_blocks_match_the_host(void **state)
{
    (void)state;
    const fj__playout *blocks[] = {&fj__fwd_tma_params_layout, &fj__fwd_params_layout,
                                   &fj__classify_params_layout, &fj__merge_params_layout,
                                   &fj__decode_params_layout, &fj__append_params_layout,
                                   &fj__bwd_params_layout};
    for (int b = 0; b < (int)(sizeof blocks / sizeof blocks[0]); b++)
        for (int cuda = b == 0; cuda < 2; cuda++) { /* tensor maps: CUDA only */
            fj__err err = {{0}};
            char *out = NULL;
            if (render_layout(blocks[b], cuda ? "cuda" : "opencl", &out, &err) != FJ_OK)
                fail_msg("%s (%s): %s", blocks[b]->name, cuda ? "cuda" : "opencl", err.msg);
            char want[128];
            if (cuda)
                snprintf(want, sizeof want, "static_assert(sizeof(%s) == %zu && alignof",
                         blocks[b]->name, blocks[b]->size);
            else
                snprintf(want, sizeof want, "%s_matches_host[sizeof(%s) == %zu", blocks[b]->name,
                         blocks[b]->name, blocks[b]->size);
            assert_non_null(strstr(out, want));
            free(out);
        }

    /* A deliberate mismatch: the host puts one field 4 bytes further than the kernel would. */
    const fj__playout *real = &fj__classify_params_layout;
    fj__pfield fields[16];
    assert_true(real->nfields <= 16);
    memcpy(fields, real->fields, (size_t)real->nfields * sizeof fields[0]);
    int moved = -1;
    for (int i = 0; i < real->nfields && moved < 0; i++)
        if (!strcmp(fields[i].name, "seqlen_k"))
            moved = i;
    assert_true(moved > 0);
    fields[moved].offset += 4;
    fj__playout bad = *real;
    bad.fields = fields;
    fj__err err = {{0}};
    char *out = NULL;
    assert_int_equal(render_layout(&bad, "cuda", &out, &err), FJ_ERR_TEMPLATE);
    assert_null(out);
    if (!strstr(err.msg, "field seqlen_k is at offset"))
        fail_msg("mismatch message: '%s'", err.msg);
    /* And a block whose host size differs. */
    memcpy(fields, real->fields, (size_t)real->nfields * sizeof fields[0]);
    bad.size += 8;
    assert_int_equal(render_layout(&bad, "opencl", &out, &err), FJ_ERR_TEMPLATE);
    if (!strstr(err.msg, "fj_classify_params:") || !strstr(err.msg, "on the host"))
        fail_msg("size message: '%s'", err.msg);
}

static void test_template_dir_override_and_hash(void **state)
{
    (void)state;
    fj__err err = {{0}};
    char before[65], after[65];
    assert_int_equal(tpl_set_hash(NULL, before, &err), FJ_OK);

    char dir[] = "/tmp/fj-templates-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/attn_fwd_simt.lua", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("% error('override in use')\n", f);
    fclose(f);

    assert_int_equal(tpl_set_hash(dir, after, &err), FJ_OK);
    assert_string_not_equal(before, after);
    char *out = NULL;
    assert_int_equal(tpl_render(dir, "attn_fwd_simt.lua", NULL, 0, NULL, &out, &err),
                     FJ_ERR_TEMPLATE);
    assert_non_null(strstr(err.msg, "override in use"));
    /* Names are file names only: a path does not escape the template folder. */
    assert_int_equal(tpl_render(dir, "../etc/passwd", NULL, 0, NULL, &out, &err),
                     FJ_ERR_TEMPLATE);
    /* No folder (NULL or ""): the embedded templates alone. */
    assert_int_equal(tpl_set_hash("", after, &err), FJ_OK);
    assert_string_equal(before, after);

    unlink(path);
    rmdir(dir);
    assert_int_equal(tpl_set_hash(dir, after, &err), FJ_OK); /* a folder that is gone */
    assert_string_equal(before, after);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_code_and_interpolation),
        cmocka_unit_test(test_include_and_emit),
        cmocka_unit_test(test_sandbox_refuses_io_os_require_load),
        cmocka_unit_test(test_error_names_template_and_line),
        cmocka_unit_test(test_instruction_and_memory_limits),
        cmocka_unit_test(test_sandbox_has_no_pattern_matching),
        cmocka_unit_test(test_time_limit),
        cmocka_unit_test(test_engine_loads_no_bytecode),
        cmocka_unit_test(test_banner_and_embedded_attention),
        cmocka_unit_test(test_param_blocks_match_the_host),
        cmocka_unit_test(test_decode_variants_render),
        cmocka_unit_test(test_backward_stages_render),
        cmocka_unit_test(test_backward_mma_render),
        cmocka_unit_test(test_backward_wgmma_render),
        cmocka_unit_test(test_fp8_forward_render),
        cmocka_unit_test(test_template_dir_override_and_hash),
    };
    return cmocka_run_group_tests_name("render", tests, NULL, NULL);
}
