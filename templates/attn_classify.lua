% -- Block classes of the masks beyond the band, for kernels that skip work by block (the Hopper
% -- forward): for each 128 x 128 block of (query rows, keys) of one (batch, head),
% --   0  no element is kept (the key tile is never loaded),
% --   1  some are (the element masks apply),
% --   2  all are (no per-element masking);
% -- elements outside the tensors count as neither. A work-group of 256 work-items per block,
% -- grid (key blocks, query blocks, cls_batches * cls_heads); a mask that reads neither b nor h
% -- is classified once for all (batch, head) and read with stride 0.
% --
% -- Parameters: backend, the dtypes, mask_mod, mask_tensor, mask_ranges (attn_masks.lua; score
% -- terms take no part), args (the classifier's parameter block, fj_classify_params).
% include("dialect.lua")
% include("attn_masks.lua")
% include("params.lua")
% params_struct(args)
#define CLS 128
#define THREADS 256

KERNEL(THREADS)
fj_attn_classify(
% params_arg(args)
)
{
    SHARED int any_kept, any_masked;
    const int tid = THREAD_X;
    const int kb = BLOCK_X, qb = BLOCK_Y;
    const int batch = BLOCK_Z / P.cls_heads, head = BLOCK_Z % P.cls_heads;
    if (tid == 0)
        any_kept = any_masked = 0;
    BARRIER();
    MASK_CTX(mc, P.mask, batch, head, P.seqlen_q, P.seqlen_k);
    const int q0 = qb * CLS, k0 = kb * CLS;
    const int rows = I_MIN(CLS, P.seqlen_q - q0), cols = I_MIN(CLS, P.seqlen_k - k0);
    /* A work-item per key and every STEP-th row: consecutive work-items take consecutive keys
    ** of a row (coalesced mask loads), a key's own terms stay in registers from row to row,
    ** and no index is divided per element. ROWS rows at a time, their masks evaluated before
    ** any is looked at (a row past the block's clamped to its last, its result dropped), so
    ** that what they load issues together rather than a row's after the last row's test. Each
    ** stops once it has seen both kinds. */
#define STEP (THREADS / CLS)
#define ROWS 8
    const int key = tid % CLS;
    bool kept = false, masked = false;
    for (int r = tid / CLS; key < cols && r < rows && !(kept && masked); r += ROWS * STEP) {
        bool keeps[ROWS];
#pragma unroll
        for (int i = 0; i < ROWS; i++)
            keeps[i] = fj_keeps(mc, q0 + I_MIN(r + i * STEP, rows - 1), k0 + key);
#pragma unroll
        for (int i = 0; i < ROWS; i++)
            if (r + i * STEP < rows) {
                kept = kept || keeps[i];
                masked = masked || !keeps[i];
            }
    }
    if (kept)
        LOCAL_FLAG_SET(any_kept);
    if (masked)
        LOCAL_FLAG_SET(any_masked);
    BARRIER();
    if (tid == 0)
        GPTR(int, P.classes)[batch * P.cls_sb + head * P.cls_sh + qb * P.cls_sq + kb] =
            any_kept ? (any_masked ? 1 : 2) : 0;
}
