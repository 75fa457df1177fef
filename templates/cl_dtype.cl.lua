% -- Element access for OpenCL C: STORE_T is the element type in memory; LOAD(p, i) reads
% -- element i as float, STORE(p, i, x) writes x rounded to nearest even. Half uses the core
% -- vload_half/vstore_half (no cl_khr_fp16 needed); bfloat16 is the top half of a float.
% if dtype == "f32" then
typedef float STORE_T;
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, x) ((p)[i] = (x))
% elseif dtype == "f16" then
typedef half STORE_T;
#define LOAD(p, i) vload_half((i), (p))
#define STORE(p, i, x) vstore_half_rte((x), (i), (p))
% elseif dtype == "bf16" then
typedef ushort STORE_T;
inline float bf16_to_float(ushort b) { return as_float((uint)b << 16); }
inline ushort float_to_bf16(float f)
{
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
#define LOAD(p, i) bf16_to_float((p)[i])
#define STORE(p, i, x) ((p)[i] = float_to_bf16(x))
% else
%   error("cl_dtype: unsupported dtype " .. tostring(dtype))
% end
