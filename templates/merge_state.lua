% -- The algebra of attention states, which every merge of them uses (attn_merge.lua's merges,
% -- decode_merge.lua's in the decode kernel): a state is the output o and log-sum-exp l of
% -- attention over one set of keys; over the union of disjoint sets, with m = max l_i and
% -- w_i = exp(l_i - m),
% --     o = sum w_i o_i / sum w_i,    l = m + log(sum w_i).
% -- A state with l = -inf holds no keys and weighs nothing; a row whose states all hold none
% -- gets o = 0, l = -inf; a NaN or +inf log-sum-exp makes the row NaN. An empty state's o is
% -- never used (whatever it holds).
% --
% -- Expressions (C text of the names given): merge_bad(bad, l), whether a row's states so far
% -- hold a NaN or +inf l, once l is seen; merge_weight(l, m), state l's weight w; merge_scale(sum,
% -- bad), the factor of sum w_i o_i; merge_lse(m, sum, bad), the row's log-sum-exp. Needs
% -- dialect.lua.
% function merge_bad(bad, l)
%   return "(" .. bad .. " || !(" .. l .. " < F_INF))"
% end
% function merge_weight(l, m)
%   return "(" .. m .. " > -F_INF ? EXPR_EXP(" .. l .. " - " .. m .. ") : 0.0f)"
% end
% function merge_scale(sum, bad)
%   return "(" .. bad .. " ? F_NAN : " .. sum .. " > 0.0f ? 1.0f / " .. sum .. " : 0.0f)"
% end
% function merge_lse(m, sum, bad)
%   return "(" .. bad .. " ? F_NAN : " .. m .. " > -F_INF ? " .. m .. " + EXPR_LOG(" .. sum ..
%          ") : -F_INF)"
% end
