% -- A packed sequence (variable lengths), spelled once for every kernel that reads them: where
% -- the block's sequence starts in the packed tensors and how long it is, from cu_seqlens_q/k
% -- (and seqused_k when varlen is 2). The offsets are the caller's device data: clamped into the
% -- tensors and to the maxima.
% --
% -- Parameter: varlen. packed_sequence() goes where `batch` (the sequence) and the forward
% -- block's locals (cu_seqlens_q, cu_seqlens_k, seqused_k, total_q, total_k, max_seqlen_q,
% -- max_seqlen_k) are declared; it declares q_first, k_first, seqlen_q, len_k (the keys the
% -- sequence holds) and seqlen_k (the keys it uses).
% function packed_sequence()
    const int q_first = I_MIN(I_MAX(cu_seqlens_q[batch], 0), total_q);
    const int k_first = I_MIN(I_MAX(cu_seqlens_k[batch], 0), total_k);
    const int seqlen_q = I_MIN(I_MAX(I_MIN(cu_seqlens_q[batch + 1], total_q) - q_first, 0), max_seqlen_q);
    const int len_k = I_MIN(I_MAX(I_MIN(cu_seqlens_k[batch + 1], total_k) - k_first, 0), max_seqlen_k);
%   if varlen == 2 then
    const int seqlen_k = I_MIN(len_k, I_MAX(seqused_k[batch], 0));
%   else
    const int seqlen_k = len_k;
%   end
% end
