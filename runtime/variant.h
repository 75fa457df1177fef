/* Variant parameters and keys (see variant.c). */
#ifndef FJ_RUNTIME_VARIANT_H
#define FJ_RUNTIME_VARIANT_H

#include "context.h"
#include "../templates/render.h"

#define FJ__MAX_PARAMS 40

/* The template parameters of v, in a fixed order. Returns their number. */
int fj__variant_params(const fj__variant *v, tpl_param out[FJ__MAX_PARAMS]);

#endif /* FJ_RUNTIME_VARIANT_H */
