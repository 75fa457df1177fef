% -- FP8 inputs' descale factors (fj_attention_desc's q_descale, k_descale, v_descale) as a
% -- kernel reads them from the forward's parameter block: descale_factors(block) declares
% -- `qk_factor` (q's times k's: the scores' factor) and `v_factor` (the output's) of the
% -- kernel's (batch, head_kv), 1 where a factor is not given; both 1 without `descale`.
% -- block: the forward block's name ("P", or "P.fwd" where it is nested).
% -- Parameter: descale.
% function descale_factors(block)
%   if descale then
    GLOBAL const float *qd = GPTR(const float, ${block}.q_descale), *kd = GPTR(const float, ${block}.k_descale);
    GLOBAL const float *vd = GPTR(const float, ${block}.v_descale);
    const float qk_factor = (qd ? qd[batch * ${block}.qd_sb + head_kv * ${block}.qd_sh] : 1.0f) *
                            (kd ? kd[batch * ${block}.kd_sb + head_kv * ${block}.kd_sh] : 1.0f);
    const float v_factor = vd ? vd[batch * ${block}.vd_sb + head_kv * ${block}.vd_sh] : 1.0f;
%   else
    const float qk_factor = 1.0f, v_factor = 1.0f;
%   end
% end
