/* The layouts of the parameter blocks (families.h). */
#include "families.h"

FJ__PARAM_LAYOUT(fj__mask_params, "fj_mask_params", FJ__MASK_PARAMS);
FJ__PARAM_LAYOUT(fj__fwd_params, "fj_fwd_params", FJ__FWD_PARAMS);
FJ__PARAM_LAYOUT(fj__fwd_tma_params, "fj_fwd_tma_params", FJ__FWD_TMA_PARAMS);
FJ__PARAM_LAYOUT(fj__classify_params, "fj_classify_params", FJ__CLASSIFY_PARAMS);
FJ__PARAM_LAYOUT(fj__merge_slot, "fj_merge_slot", FJ__MERGE_SLOT_PARAMS);
FJ__PARAM_LAYOUT(fj__merge_params, "fj_merge_params", FJ__MERGE_PARAMS);
FJ__PARAM_LAYOUT(fj__decode_params, "fj_decode_params", FJ__DECODE_PARAMS);
FJ__PARAM_LAYOUT(fj__decode_tma_params, "fj_decode_tma_params", FJ__DECODE_TMA_PARAMS);
FJ__PARAM_LAYOUT(fj__append_params, "fj_append_params", FJ__APPEND_PARAMS);
FJ__PARAM_LAYOUT(fj__dequant_params, "fj_dequant_params", FJ__DEQUANT_PARAMS);
FJ__PARAM_LAYOUT(fj__transpose_v_params, "fj_transpose_v_params", FJ__TRANSPOSE_V_PARAMS);
FJ__PARAM_LAYOUT(fj__bwd_params, "fj_bwd_params", FJ__BWD_PARAMS);
FJ__PARAM_LAYOUT(fj__bwd_tma_params, "fj_bwd_tma_params", FJ__BWD_TMA_PARAMS);
