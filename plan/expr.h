/* Mask and score expressions (fj_attention_desc.mask_mod, .score_mod): a small C-like grammar,
** parsed and checked here before anything reaches a compiler. A checked expression is emitted
** again from its parse tree, so the generated kernel contains only what the grammar allows.
**
**   expr    := cond
**   cond    := or ( '?' expr ':' expr )?
**   or      := and ( '||' and )*          and := cmp ( '&&' cmp )*
**   cmp     := sum ( ('<'|'<='|'>'|'>='|'=='|'!=') sum )?
**   sum     := prod ( ('+'|'-') prod )*   prod := unary ( ('*'|'/'|'%') unary )*
**   unary   := ('-'|'!') unary | primary
**   primary := number | name | func '(' expr (',' expr)* ')' | ('arg'|'iarg') '[' expr ']'
**            | '(' expr ')'
**   names: b h q k (batch, head, query row, key: integers), sq sk (sequence lengths), and in
**          score_mod s (the score after scaling and soft-capping, float)
**   funcs: min max abs (any), exp log sqrt tanh (float), floor (float -> float)
**   arg[i] reads float i of mod_args, iarg[i] int32 i of mod_args
** Integer arithmetic stays integer (q / 64 is a block index); a float operand makes it float.
** Semantics (flashjit.h, fj_attention_desc.mask_mod): int32 wraps, a zero divisor gives 0, floats
** are single precision. The emitted C computes integer + - * / % and unary - through EXPR_I*
** functions (templates/dialect.lua) and the evaluator rounds as the kernels do. */
#ifndef FJ_PLAN_EXPR_H
#define FJ_PLAN_EXPR_H

#include <math.h>

#include "../core/core.h"

#define FJ__EXPR_MAX_NODES 256
#define FJ__EXPR_MAX_TEXT 2048
#define FJ__EXPR_MAX_GRAD_TEXT 16384

typedef struct fj__expr fj__expr;

/* Values the evaluator binds to the names. */
typedef struct fj__expr_env {
    int64_t b, h, q, k, sq, sk;
    double s;
    const void *args; /* host copy of mod_args, or NULL */
    int64_t nargs;    /* elements of 4 bytes in args */
    int exact;        /* 1: float arithmetic in double precision (finite-difference checks);
                      ** 0: rounded to single precision as the kernels do */
} fj__expr_env;

/* Parses text; allow_score permits the name s. On success *out (malloc'd, fj__expr_free) holds
** the tree and its canonical C text. On failure: FJ_ERR_INVALID_ARGUMENT with the field name,
** the offending position (1-based) and what was expected. */
fj_status fj__expr_parse(const char *field, const char *text, int allow_score, fj__expr **out,
                         fj__err *err);
void fj__expr_free(fj__expr *e);
/* The canonical C text: fully parenthesised, only grammar tokens, integers as int, floats as
** float literals, loads through the macros ARG_F(i) and ARG_I(i), functions through EXPR_*. */
const char *fj__expr_text(const fj__expr *e);
/* A score_mod's derivative with respect to s as canonical C text (the chain rule over the parse
** tree: comparisons, floor and integer parts are piecewise constant, min/max/abs and ternaries
** take the derivative of the branch they pick), or NULL where the text would exceed
** FJ__EXPR_MAX_GRAD_TEXT (or e is not a score_mod). */
const char *fj__expr_grad_text(const fj__expr *e);
/* The same derivative evaluated in double precision at env (the value part as the kernels
** compute it): the reference's. */
double fj__expr_eval_grad(const fj__expr *e, const fj__expr_env *env);
/* Whether the expression reads mod_args. */
int fj__expr_uses_args(const fj__expr *e);
/* Evaluates the expression with the kernels' arithmetic (reference and tests). */
double fj__expr_eval(const fj__expr *e, const fj__expr_env *env);

/* The kernels hold scores in log2 units, so a score_mod value of magnitude beyond FLT_MAX * ln 2
** saturates there (flashjit.h); infinities and NaN stay. score_to_log2 in attn_masks.lua. */
#define FJ__SCORE_MOD_MAX 2.3586574916681825e38
static inline double fj__score_mod_saturate(double s)
{
    return s > FJ__SCORE_MOD_MAX && s != INFINITY     ? FJ__SCORE_MOD_MAX
           : s < -FJ__SCORE_MOD_MAX && s != -INFINITY ? -FJ__SCORE_MOD_MAX
                                                      : s;
}

#endif /* FJ_PLAN_EXPR_H */
