/* Mask and score expressions: tokenizer, recursive-descent parser, type check, canonical C
** emission and an evaluator with the kernels' arithmetic. See expr.h for the grammar. */
#define _POSIX_C_SOURCE 200809L
#include "expr.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef enum node_kind {
    N_INT,
    N_FLOAT,
    N_VAR,
    N_NEG,
    N_NOT,
    N_BIN,
    N_COND,
    N_CALL,
    N_LOAD_F,
    N_LOAD_I
} node_kind;

typedef enum var_id { V_B, V_H, V_Q, V_K, V_SQ, V_SK, V_S } var_id;
typedef enum func_id { F_MIN, F_MAX, F_ABS, F_EXP, F_LOG, F_SQRT, F_TANH, F_FLOOR } func_id;

typedef struct node {
    node_kind kind;
    int is_float;
    char op[3];  /* N_BIN: "+", "<=", "&&", ... */
    int a, b, c; /* children (node indices), -1 when absent */
    int64_t ival;
    double fval;
    int id;    /* var_id or func_id */
    int nargs; /* N_CALL */
} node;

struct fj__expr {
    node nodes[FJ__EXPR_MAX_NODES];
    int n, root;
    int uses_args;
    char text[FJ__EXPR_MAX_TEXT];
    int grad_ok;                       /* score_mod: grad holds d(expr)/ds */
    char grad[FJ__EXPR_MAX_GRAD_TEXT]; /* "" when grad_ok is 0 */
};

/* ---- tokens ------------------------------------------------------------------------------ */

typedef enum tok_kind { T_END, T_INT, T_FLOAT, T_NAME, T_OP } tok_kind;

typedef struct parser {
    const char *field, *src;
    size_t pos;  /* start of the current token */
    size_t next; /* just past it */
    tok_kind kind;
    char tok[64];
    fj__expr *e;
    int allow_score;
    fj__err *err;
    int failed;
    int depth; /* nesting of parse_expr, bounded so that no input can exhaust the stack */
} parser;

static void fail(parser *p, const char *fmt, const char *detail)
{
    if (p->failed)
        return;
    p->failed = 1;
    char what[256];
    snprintf(what, sizeof what, fmt, detail);
    fj__fail(p->err, FJ_ERR_INVALID_ARGUMENT, "desc.%s: %s at position %zu of \"%.200s\"", p->field,
             what, p->pos + 1, p->src);
}

/* Reads the token at p->next. */
static void advance(parser *p)
{
    const char *s = p->src;
    size_t i = p->next;
    while (s[i] && isspace((unsigned char)s[i]))
        i++;
    p->pos = i;
    p->tok[0] = '\0';
    if (!s[i]) {
        p->kind = T_END;
        p->next = i;
        return;
    }
    size_t start = i;
    if (isdigit((unsigned char)s[i]) || (s[i] == '.' && isdigit((unsigned char)s[i + 1]))) {
        int is_float = 0;
        while (isdigit((unsigned char)s[i]))
            i++;
        if (s[i] == '.') {
            is_float = 1;
            i++;
            while (isdigit((unsigned char)s[i]))
                i++;
        }
        if (s[i] == 'e' || s[i] == 'E') {
            size_t j = i + 1;
            if (s[j] == '+' || s[j] == '-')
                j++;
            if (isdigit((unsigned char)s[j])) {
                is_float = 1;
                i = j;
                while (isdigit((unsigned char)s[i]))
                    i++;
            }
        }
        if (s[i] == 'f' || s[i] == 'F') {
            is_float = 1;
            i++;
        }
        p->kind = is_float ? T_FLOAT : T_INT;
    } else if (isalpha((unsigned char)s[i]) || s[i] == '_') {
        while (isalnum((unsigned char)s[i]) || s[i] == '_')
            i++;
        p->kind = T_NAME;
    } else {
        static const char *const two[] = {"<=", ">=", "==", "!=", "&&", "||"};
        p->kind = T_OP;
        i++;
        for (size_t t = 0; t < sizeof two / sizeof two[0]; t++)
            if (s[start] == two[t][0] && s[start + 1] == two[t][1])
                i = start + 2;
        if (i == start + 1 && !strchr("+-*/%<>!?:()[],", s[start])) {
            char c[64];
            snprintf(c, sizeof c, "'%c'%s", s[start],
                     s[start] == ';' || s[start] == '{' || s[start] == '}'
                         ? " (one expression, no statements)"
                     : s[start] == '#' ? " (no preprocessor)"
                                       : "");
            fail(p, "unexpected character %s", c);
        }
    }
    size_t len = i - start < sizeof p->tok - 1 ? i - start : sizeof p->tok - 1;
    memcpy(p->tok, s + start, len);
    p->tok[len] = '\0';
    p->next = i;
}

static int is_op(const parser *p, const char *op)
{
    return p->kind == T_OP && strcmp(p->tok, op) == 0;
}

static void expect(parser *p, const char *op)
{
    if (!is_op(p, op)) {
        char want[16];
        snprintf(want, sizeof want, "'%s'", op);
        fail(p, "expected %s", want);
        return;
    }
    advance(p);
}

static int add_node(parser *p, node n)
{
    if (p->e->n >= FJ__EXPR_MAX_NODES) {
        fail(p, "%s", "expression too long");
        return 0;
    }
    p->e->nodes[p->e->n] = n;
    return p->e->n++;
}

/* ---- grammar --------------------------------------------------------------------------------- */

static int parse_expr(parser *p);

static int parse_primary(parser *p)
{
    if (p->failed)
        return 0;
    if (p->kind == T_INT || p->kind == T_FLOAT) {
        node n = {.kind = p->kind == T_INT ? N_INT : N_FLOAT,
                  .is_float = p->kind == T_FLOAT,
                  .a = -1,
                  .b = -1,
                  .c = -1};
        if (p->kind == T_INT)
            n.ival = strtoll(p->tok, NULL, 10);
        else
            n.fval = strtod(p->tok, NULL);
        if ((p->kind == T_INT && (n.ival > INT32_MAX || strlen(p->tok) > 10)) ||
            (p->kind == T_FLOAT && !(fabs(n.fval) <= 3.4e38))) {
            fail(p, "literal %s is out of range", p->tok);
            return 0;
        }
        advance(p);
        return add_node(p, n);
    }
    if (is_op(p, "(")) {
        advance(p);
        int inner = parse_expr(p);
        expect(p, ")");
        return inner;
    }
    if (p->kind != T_NAME) {
        fail(p, "expected a number, a name or '(' but found %s",
             p->kind == T_END ? "the end" : p->tok);
        return 0;
    }
    static const char *const vars[] = {"b", "h", "q", "k", "sq", "sk", "s"};
    for (int v = 0; v < 7; v++)
        if (!strcmp(p->tok, vars[v])) {
            if (v == V_S && !p->allow_score) {
                fail(p, "%s", "'s' (the score) exists only in score_mod");
                return 0;
            }
            advance(p);
            return add_node(
                p, (node){.kind = N_VAR, .id = v, .is_float = v == V_S, .a = -1, .b = -1, .c = -1});
        }
    if (!strcmp(p->tok, "arg") || !strcmp(p->tok, "iarg")) {
        int is_f = p->tok[0] == 'a';
        advance(p);
        expect(p, "[");
        int index = parse_expr(p);
        expect(p, "]");
        if (!p->failed && p->e->nodes[index].is_float)
            fail(p, "%s", "an index into mod_args must be an integer");
        p->e->uses_args = 1;
        return add_node(p, (node){.kind = is_f ? N_LOAD_F : N_LOAD_I,
                                  .is_float = is_f,
                                  .a = index,
                                  .b = -1,
                                  .c = -1});
    }
    static const char *const funcs[] = {"min", "max", "abs", "exp", "log", "sqrt", "tanh", "floor"};
    static const int arity[] = {2, 2, 1, 1, 1, 1, 1, 1};
    for (int f = 0; f < 8; f++)
        if (!strcmp(p->tok, funcs[f])) {
            advance(p);
            expect(p, "(");
            node n = {.kind = N_CALL, .id = f, .a = -1, .b = -1, .c = -1};
            n.a = parse_expr(p);
            n.nargs = 1;
            if (arity[f] == 2) {
                expect(p, ",");
                n.b = parse_expr(p);
                n.nargs = 2;
            }
            expect(p, ")");
            if (p->failed)
                return 0;
            int any_float = p->e->nodes[n.a].is_float || (n.b >= 0 && p->e->nodes[n.b].is_float);
            n.is_float = f >= F_EXP || any_float;
            return add_node(p, n);
        }
    char what[96];
    snprintf(what, sizeof what, "'%s'", p->tok);
    fail(p,
         "unknown name %s (names: b h q k sq sk s, arg[], iarg[], min max abs exp log "
         "sqrt tanh floor)",
         what);
    return 0;
}

static int parse_unary(parser *p)
{
    if (is_op(p, "-") || is_op(p, "!")) {
        int neg = p->tok[0] == '-';
        advance(p);
        if (++p->depth > 100) {
            fail(p, "%s", "expression nested too deeply (100 levels)");
            return 0;
        }
        int a = parse_unary(p);
        p->depth--;
        if (p->failed)
            return 0;
        return add_node(p, (node){.kind = neg ? N_NEG : N_NOT,
                                  .is_float = neg && p->e->nodes[a].is_float,
                                  .a = a,
                                  .b = -1,
                                  .c = -1});
    }
    return parse_primary(p);
}

static int binary(parser *p, const char *op, int a, int b)
{
    if (p->failed)
        return 0;
    node n = {.kind = N_BIN, .a = a, .b = b, .c = -1};
    snprintf(n.op, sizeof n.op, "%s", op);
    int any_float = p->e->nodes[a].is_float || p->e->nodes[b].is_float;
    if (!strcmp(op, "%") && any_float)
        fail(p, "%s", "'%' needs integer operands");
    n.is_float = strchr("+-*/%", op[0]) && op[1] == '\0' ? any_float : 0;
    return add_node(p, n);
}

static int parse_level(parser *p, int level)
{
    static const char *const ops[5][7] = {
        {"||"}, {"&&"}, {"<", "<=", ">", ">=", "==", "!="}, {"+", "-"}, {"*", "/", "%"}};
    if (level == 5)
        return parse_unary(p);
    int left = parse_level(p, level + 1);
    for (;;) {
        const char *found = NULL;
        for (int i = 0; i < 7 && ops[level][i]; i++)
            if (is_op(p, ops[level][i]))
                found = ops[level][i];
        if (!found || p->failed)
            return left;
        advance(p);
        int right = parse_level(p, level + 1);
        left = binary(p, found, left, right);
        if (level == 2) /* comparisons do not chain */
            return left;
    }
}

static int parse_expr(parser *p)
{
    if (++p->depth > 100) {
        fail(p, "%s", "expression nested too deeply (100 levels)");
        return 0;
    }
    int cond = parse_level(p, 0);
    if (!is_op(p, "?") || p->failed) {
        p->depth--;
        return cond;
    }
    advance(p);
    int yes = parse_expr(p);
    expect(p, ":");
    int no = parse_expr(p);
    p->depth--;
    if (p->failed)
        return 0;
    return add_node(p, (node){.kind = N_COND,
                              .a = cond,
                              .b = yes,
                              .c = no,
                              .is_float = p->e->nodes[yes].is_float || p->e->nodes[no].is_float});
}

/* ---- emission ------------------------------------------------------------------------------ */

typedef struct out {
    char *buf;
    size_t size, used;
    int overflow;
} out;

static void put(out *o, const char *s)
{
    size_t n = strlen(s);
    if (o->used + n + 1 > o->size) {
        o->overflow = 1;
        return;
    }
    memcpy(o->buf + o->used, s, n + 1);
    o->used += n;
}

/* The function that computes integer op with the semantics of expr.h, or NULL for the operators
** C defines on every int (comparisons, logic). */
static const char *int_function(const char *op)
{
    static const char *const ops[][2] = {{"+", "EXPR_IADD"},
                                         {"-", "EXPR_ISUB"},
                                         {"*", "EXPR_IMUL"},
                                         {"/", "EXPR_IDIV"},
                                         {"%", "EXPR_IMOD"}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(op, ops[i][0]))
            return ops[i][1];
    return NULL;
}

/* Emits node i; as_float converts an integer node to float. */
static void emit(const fj__expr *e, int i, int as_float, out *o)
{
    const node *n = &e->nodes[i];
    char tmp[64];
    if (o->overflow) /* too long already: the rest would be dropped */
        return;
    if (as_float && !n->is_float) {
        put(o, "((float)");
        emit(e, i, 0, o);
        put(o, ")");
        return;
    }
    static const char *const vars[] = {"FJ_B", "FJ_H", "FJ_Q", "FJ_K", "FJ_SQ", "FJ_SK", "FJ_S"};
    switch (n->kind) {
    case N_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)n->ival);
        put(o, tmp);
        break;
    case N_FLOAT:
        snprintf(tmp, sizeof tmp, "%.9g", n->fval);
        /* "2f" is not a float literal in C: the digits need a point or an exponent. */
        put(o, tmp);
        put(o, strpbrk(tmp, ".e") ? "f" : ".0f");
        break;
    case N_VAR: put(o, vars[n->id]); break;
    case N_NEG:
        /* Integer negation wraps (expr.h): through a function, as C's '-' may not. */
        put(o, n->is_float ? "(-" : "EXPR_INEG(");
        emit(e, n->a, 0, o);
        put(o, ")");
        break;
    case N_NOT:
        put(o, "(!");
        emit(e, n->a, 0, o);
        put(o, ")");
        break;
    case N_BIN: {
        int f = e->nodes[n->a].is_float || e->nodes[n->b].is_float;
        const char *func = f ? NULL : int_function(n->op);
        if (func) { /* integer arithmetic: wrapping, and defined for a zero divisor */
            put(o, func);
            put(o, "(");
            emit(e, n->a, 0, o);
            put(o, ", ");
            emit(e, n->b, 0, o);
            put(o, ")");
            break;
        }
        put(o, "(");
        emit(e, n->a, f, o);
        snprintf(tmp, sizeof tmp, " %s ", n->op);
        put(o, tmp);
        emit(e, n->b, f, o);
        put(o, ")");
        break;
    }
    case N_COND:
        put(o, "(");
        emit(e, n->a, 0, o);
        put(o, " ? ");
        emit(e, n->b, n->is_float, o);
        put(o, " : ");
        emit(e, n->c, n->is_float, o);
        put(o, ")");
        break;
    case N_CALL: {
        static const char *const ffuncs[] = {"EXPR_FMIN", "EXPR_FMAX", "EXPR_FABS", "EXPR_EXP",
                                             "EXPR_LOG",  "EXPR_SQRT", "EXPR_TANH", "EXPR_FLOOR"};
        static const char *const ifuncs[] = {"EXPR_IMIN", "EXPR_IMAX", "EXPR_IABS"};
        put(o, n->is_float ? ffuncs[n->id] : ifuncs[n->id]);
        put(o, "(");
        emit(e, n->a, n->is_float, o);
        if (n->b >= 0) {
            put(o, ", ");
            emit(e, n->b, n->is_float, o);
        }
        put(o, ")");
        break;
    }
    case N_LOAD_F:
    case N_LOAD_I:
        put(o, n->kind == N_LOAD_F ? "ARG_F(" : "ARG_I(");
        emit(e, n->a, 0, o);
        put(o, ")");
        break;
    }
}

/* ---- the derivative with respect to s ----------------------------------------------------- */

/* Whether node i varies smoothly with s: a float that reads s through arithmetic, the selected
** branch of a ternary or a differentiable function (comparisons, floor and integers are
** piecewise constant: derivative 0). */
static int varies(const fj__expr *e, int i)
{
    const node *n = &e->nodes[i];
    if (!n->is_float)
        return 0;
    switch (n->kind) {
    case N_VAR: return n->id == V_S;
    case N_NEG: return varies(e, n->a);
    case N_BIN: return varies(e, n->a) || varies(e, n->b);
    case N_COND: return varies(e, n->b) || varies(e, n->c);
    case N_CALL: return n->id != F_FLOOR && (varies(e, n->a) || (n->b >= 0 && varies(e, n->b)));
    default: return 0;
    }
}

static void emit_grad(const fj__expr *e, int i, out *o);

/* The derivative of node i, or 0 where it does not vary. */
static void emit_grad_or_zero(const fj__expr *e, int i, out *o)
{
    if (varies(e, i))
        emit_grad(e, i, o);
    else
        put(o, "0.0f");
}

/* The product rule's terms of binary node n, a' b and a b', joined by sign ('+': d(a * b); '-':
** the numerator of d(a / b)); a term whose factor does not vary is left out. */
static void emit_product_rule(const fj__expr *e, const node *n, char sign, out *o)
{
    const int da = varies(e, n->a), db = varies(e, n->b);
    if (da) {
        emit_grad(e, n->a, o);
        put(o, " * ");
        emit(e, n->b, 1, o);
    }
    if (db) {
        put(o, da ? (sign == '+' ? " + " : " - ") : sign == '+' ? "" : "-");
        emit(e, n->a, 1, o);
        put(o, " * ");
        emit_grad(e, n->b, o);
    }
}

/* Emits d(node i)/ds for a node that varies, in the kernels' float arithmetic: the chain rule
** over the parse tree, terms that do not vary left out. Values are emitted as emit() does. Each
** node's derivative is emitted once per use of the node (never twice, as `x >= 0 ? x' : -x'`
** would: that doubles the text at every level of nesting, 2^depth in time and length). */
static void emit_grad(const fj__expr *e, int i, out *o)
{
    const node *n = &e->nodes[i];
    if (o->overflow)
        return;
    switch (n->kind) {
    case N_VAR: put(o, "1.0f"); break;
    case N_NEG:
        put(o, "(-");
        emit_grad(e, n->a, o);
        put(o, ")");
        break;
    case N_BIN: {
        const int da = varies(e, n->a), db = varies(e, n->b);
        put(o, "(");
        switch (n->op[0]) {
        case '+':
        case '-':
            if (da)
                emit_grad(e, n->a, o);
            if (da && db)
                put(o, n->op[0] == '+' ? " + " : " - ");
            else if (db && n->op[0] == '-')
                put(o, "-");
            if (db)
                emit_grad(e, n->b, o);
            break;
        case '*': emit_product_rule(e, n, '+', o); break;
        default: /* '/': (a' b - a b') / b^2 */
            put(o, "(");
            emit_product_rule(e, n, '-', o);
            put(o, ") / (");
            emit(e, n->b, 1, o);
            put(o, " * ");
            emit(e, n->b, 1, o);
            put(o, ")");
            break;
        }
        put(o, ")");
        break;
    }
    case N_COND:
        put(o, "(");
        emit(e, n->a, 0, o);
        put(o, " ? ");
        emit_grad_or_zero(e, n->b, o);
        put(o, " : ");
        emit_grad_or_zero(e, n->c, o);
        put(o, ")");
        break;
    case N_CALL:
        put(o, "(");
        switch (n->id) {
        case F_MIN:
        case F_MAX: /* the derivative of the operand the function picks */
            emit(e, n->a, 1, o);
            put(o, n->id == F_MIN ? " <= " : " >= ");
            emit(e, n->b, 1, o);
            put(o, " ? ");
            emit_grad_or_zero(e, n->a, o);
            put(o, " : ");
            emit_grad_or_zero(e, n->b, o);
            break;
        case F_ABS: /* the sign of the operand (+1 at 0) times its derivative */
            put(o, "(");
            emit(e, n->a, 1, o);
            put(o, " >= 0.0f ? 1.0f : -1.0f) * ");
            emit_grad(e, n->a, o);
            break;
        case F_EXP:
            put(o, "EXPR_EXP(");
            emit(e, n->a, 1, o);
            put(o, ") * ");
            emit_grad(e, n->a, o);
            break;
        case F_LOG:
            emit_grad(e, n->a, o);
            put(o, " / ");
            emit(e, n->a, 1, o);
            break;
        case F_SQRT:
            emit_grad(e, n->a, o);
            put(o, " / (2.0f * EXPR_SQRT(");
            emit(e, n->a, 1, o);
            put(o, "))");
            break;
        default: /* F_TANH: 1 - tanh^2 */
            put(o, "(1.0f - EXPR_TANH(");
            emit(e, n->a, 1, o);
            put(o, ") * EXPR_TANH(");
            emit(e, n->a, 1, o);
            put(o, ")) * ");
            emit_grad(e, n->a, o);
            break;
        }
        put(o, ")");
        break;
    default: put(o, "0.0f"); break;
    }
}

fj_status fj__expr_parse(const char *field, const char *text, int allow_score, fj__expr **out_e,
                         fj__err *err)
{
    *out_e = NULL;
    fj__expr *e = calloc(1, sizeof *e);
    if (!e)
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory for an expression");
    parser p = {.field = field, .src = text, .e = e, .allow_score = allow_score, .err = err};
    advance(&p);
    if (p.kind == T_END && !p.failed)
        fail(&p, "%s", "the expression is empty");
    e->root = parse_expr(&p);
    if (!p.failed && p.kind != T_END)
        fail(&p, "unexpected '%s' after the expression", p.tok);
    if (!p.failed) {
        out o = {.buf = e->text, .size = sizeof e->text};
        emit(e, e->root, 0, &o);
        if (o.overflow)
            fail(&p, "%s", "expression too long");
    }
    if (!p.failed && allow_score) { /* an expression too long to differentiate has no grad */
        out g = {.buf = e->grad, .size = sizeof e->grad};
        emit_grad_or_zero(e, e->root, &g);
        e->grad_ok = !g.overflow;
        if (g.overflow)
            e->grad[0] = '\0';
    }
    if (p.failed) {
        free(e);
        return FJ_ERR_INVALID_ARGUMENT;
    }
    *out_e = e;
    return FJ_OK;
}

void fj__expr_free(fj__expr *e)
{
    free(e);
}

const char *fj__expr_text(const fj__expr *e)
{
    return e ? e->text : "";
}

const char *fj__expr_grad_text(const fj__expr *e)
{
    return e && e->grad_ok ? e->grad : NULL;
}

int fj__expr_uses_args(const fj__expr *e)
{
    return e && e->uses_args;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

/* The kernels' arithmetic (expr.h): integers are int32 and wrap, floats are IEEE single. Every
** value is held in a double, which holds both exactly. */
static double wrap32(int64_t v)
{
    return (double)(int32_t)(uint32_t)(uint64_t)v;
}

/* A float result as the kernels round it (single precision), or exactly where env asks. */
static double f32(const fj__expr_env *env, double v)
{
    return env->exact ? v : (double)(float)v;
}

static double int_op(const char *op, int64_t x, int64_t y)
{
    switch (op[0]) {
    case '+': return wrap32(x + y);
    case '-': return wrap32(x - y);
    case '*': return wrap32(x * y);
    case '/': return y == 0 ? 0 : wrap32(x / y);
    default: return y == 0 ? 0 : (double)(x % y);
    }
}

static double float_op(const fj__expr_env *env, const char *op, double x, double y)
{
    switch (op[0]) {
    case '+': return f32(env, x + y);
    case '-': return f32(env, x - y);
    case '*': return f32(env, x * y);
    default: return f32(env, x / y);
    }
}

static double compare(const char *op, double x, double y)
{
    if (!strcmp(op, "<"))
        return x < y;
    if (!strcmp(op, "<="))
        return x <= y;
    if (!strcmp(op, ">"))
        return x > y;
    if (!strcmp(op, ">="))
        return x >= y;
    if (!strcmp(op, "=="))
        return x == y;
    if (!strcmp(op, "!="))
        return x != y;
    if (!strcmp(op, "&&"))
        return x != 0 && y != 0;
    return x != 0 || y != 0;
}

static double eval(const fj__expr *e, int i, const fj__expr_env *env);

/* Node i as the kernel sees it where a float is expected: integers convert to float. */
static double eval_as(const fj__expr *e, int i, int as_float, const fj__expr_env *env)
{
    double v = eval(e, i, env);
    return as_float ? f32(env, v) : v;
}

static double call(const fj__expr_env *env, const node *n, double x, double y)
{
    if (!n->is_float)
        switch (n->id) {
        case F_MIN: return x < y ? x : y;
        case F_MAX: return x > y ? x : y;
        default: return wrap32(x < 0 ? -(int64_t)x : (int64_t)x);
        }
    switch (n->id) {
    case F_MIN: return fmin(x, y); /* as fminf: a NaN operand yields the other one */
    case F_MAX: return fmax(x, y);
    case F_ABS: return fabs(x);
    case F_EXP: return f32(env, exp(x));
    case F_LOG: return f32(env, log(x));
    case F_SQRT: return f32(env, sqrt(x));
    case F_TANH: return f32(env, tanh(x));
    default: return floor(x);
    }
}

static double eval(const fj__expr *e, int i, const fj__expr_env *env)
{
    const node *n = &e->nodes[i];
    switch (n->kind) {
    case N_INT: return (double)n->ival;
    case N_FLOAT: return f32(env, n->fval);
    case N_VAR: {
        const int64_t ints[] = {env->b, env->h, env->q, env->k, env->sq, env->sk};
        return n->id == V_S ? f32(env, env->s) : (double)ints[n->id];
    }
    case N_NEG: {
        double x = eval(e, n->a, env);
        return n->is_float ? -x : wrap32(-(int64_t)x);
    }
    case N_NOT: return !eval(e, n->a, env);
    case N_BIN: {
        int f = e->nodes[n->a].is_float || e->nodes[n->b].is_float;
        double x = eval_as(e, n->a, f, env), y = eval_as(e, n->b, f, env);
        if (!strchr("+-*/%", n->op[0]) || n->op[1] != '\0')
            return compare(n->op, x, y);
        return f ? float_op(env, n->op, x, y) : int_op(n->op, (int64_t)x, (int64_t)y);
    }
    case N_COND:
        return eval(e, n->a, env) != 0 ? eval_as(e, n->b, n->is_float, env)
                                       : eval_as(e, n->c, n->is_float, env);
    case N_CALL: {
        double x = eval_as(e, n->a, n->is_float, env);
        double y = n->b >= 0 ? eval_as(e, n->b, n->is_float, env) : 0;
        return call(env, n, x, y);
    }
    case N_LOAD_F:
    case N_LOAD_I: {
        /* Indices are clamped into the array, as in the kernels: never a read outside it. The
        ** index is an int32 value, so the conversion is exact. */
        int64_t idx = (int64_t)eval(e, n->a, env);
        if (!env->args || env->nargs <= 0)
            return 0;
        idx = idx < 0 ? 0 : idx >= env->nargs ? env->nargs - 1 : idx;
        if (n->kind == N_LOAD_F) {
            float f;
            memcpy(&f, (const char *)env->args + 4 * idx, 4);
            return f;
        }
        int32_t v;
        memcpy(&v, (const char *)env->args + 4 * idx, 4);
        return v;
    }
    }
    return 0;
}

double fj__expr_eval(const fj__expr *e, const fj__expr_env *env)
{
    return eval(e, e->root, env);
}

/* The value and derivative with respect to s of node i (dual numbers), the value as eval()
** computes it, the derivative in double precision following emit_grad's rules. */
static double eval_grad(const fj__expr *e, int i, const fj__expr_env *env)
{
    const node *n = &e->nodes[i];
    if (!varies(e, i))
        return 0;
    switch (n->kind) {
    case N_VAR: return 1;
    case N_NEG: return -eval_grad(e, n->a, env);
    case N_BIN: {
        const double a = eval_as(e, n->a, 1, env), b = eval_as(e, n->b, 1, env);
        const double da = eval_grad(e, n->a, env), db = eval_grad(e, n->b, env);
        switch (n->op[0]) {
        case '+': return da + db;
        case '-': return da - db;
        case '*': return da * b + a * db;
        default: return (da * b - a * db) / (b * b);
        }
    }
    case N_COND:
        return eval(e, n->a, env) != 0 ? eval_grad(e, n->b, env) : eval_grad(e, n->c, env);
    case N_CALL: {
        const double a = eval_as(e, n->a, 1, env), da = eval_grad(e, n->a, env);
        switch (n->id) {
        case F_MIN:
        case F_MAX: {
            const double b = eval_as(e, n->b, 1, env);
            const int first = n->id == F_MIN ? a <= b : a >= b;
            return first ? da : eval_grad(e, n->b, env);
        }
        case F_ABS: return a >= 0 ? da : -da;
        case F_EXP: return exp(a) * da;
        case F_LOG: return da / a;
        case F_SQRT: return da / (2 * sqrt(a));
        default: return (1 - tanh(a) * tanh(a)) * da;
        }
    }
    default: return 0;
    }
}

double fj__expr_eval_grad(const fj__expr *e, const fj__expr_env *env)
{
    return eval_grad(e, e->root, env);
}
