% -- Kernel parameter blocks. A family's argument list is written once, on the host
% -- (plan/families.h); the renderer passes its layout as a template parameter (a table: name,
% -- size, align, fields = {name, kind, ctype, offset, size, block}), and these helpers write
% -- the kernel's side from it:
% --   params_struct(l)      the struct (nested blocks first), after a check, at render time,
% --                         that the layout the kernel's compiler will use (natural alignment)
% --                         puts every field at the host's offset and has the host's size; the
% --                         device compiler checks the size again (NVRTC has no offsetof).
% --   params_arg(l, name)   the kernel's one parameter, P (or name).
% --   params_block(l, name) the block field `name` of l (a kernel's block around its family's,
% --                         e.g. tensor maps beside it), or l itself where it has none.
% --   params_unpack(l, var, rename)
% --                         locals named as the fields (or rename[field]) holding var's scalar
% --                         and pointer fields, for portable kernels: on OpenCL a struct
% --                         argument cannot hold pointers, so they travel as ulong.
% -- Pointer fields name their pointee as kernels spell it (q_t, kv_t, o_t are the family's
% -- element types, which the kernel defines before the struct). Parameter: backend. Include
% -- once per kernel.
% local cuda = backend == "cuda"
% local emitted = {}

% -- Size and alignment of a field of the given kind on the device.
% local function kind_size(f)
%   if f.kind == "i32" or f.kind == "f32" then return 4, 4 end
%   if f.kind == "i64" or f.kind == "ptr" then return 8, 8 end
%   if f.kind == "tmap" then
%     assert(cuda, "tensor maps exist on CUDA only: " .. f.name)
%     return 128, 64
%   end
%   return f.block.size, f.block.align
% end

% -- The kernel compiler's layout of l (natural alignment), checked against the host's.
% local function check_layout(l)
%   local offset, align = 0, 1
%   for _, f in ipairs(l.fields) do
%     if f.kind == "block" then check_layout(f.block) end
%     local size, a = kind_size(f)
%     offset = (offset + a - 1) // a * a
%     if offset ~= f.offset then
%       error(string.format("parameter block %s: field %s is at offset %d in kernels but %d on the host", l.name, f.name, offset, f.offset))
%     end
%     offset = offset + size
%     align = math.max(align, a)
%   end
%   local size = (offset + align - 1) // align * align
%   if size ~= l.size or align ~= l.align then
%     error(string.format("parameter block %s: %d bytes aligned to %d in kernels, %d aligned to %d on the host", l.name, size, align, l.size, l.align))
%   end
% end

% local function field_type(f)
%   if f.kind == "ptr" then return cuda and (f.ctype .. " *") or "ulong" end
%   if f.kind == "i64" then return cuda and "long long" or "long" end
%   if f.kind == "i32" then return "int" end
%   if f.kind == "f32" then return "float" end
%   if f.kind == "tmap" then return "tmap_t" end
%   return f.block.name
% end

% function params_struct(l)
%   if emitted[l.name] then return end
%   emitted[l.name] = true
%   for _, f in ipairs(l.fields) do
%     if f.kind == "block" then params_struct(f.block) end
%   end
%   check_layout(l)
typedef struct ${l.name} {
%   for _, f in ipairs(l.fields) do
    ${field_type(f)} ${f.name};
%   end
} ${l.name};
%   if cuda then
static_assert(sizeof(${l.name}) == ${l.size} && alignof(${l.name}) == ${l.align}, "${l.name}: the host's layout");
%   else
typedef char ${l.name}_matches_host[sizeof(${l.name}) == ${l.size} ? 1 : -1];
%   end
% end

% function params_arg(l, name)
%   name = name or "P"
%   if cuda then
const __grid_constant__ ${l.name} ${name}
%   else
const ${l.name} ${name}
%   end
% end

% function params_block(l, name)
%   for _, f in ipairs(l.fields) do
%     if f.name == name and f.kind == "block" then return f.block end
%   end
%   return l
% end
% function params_unpack(l, var, rename)
%   for _, f in ipairs(l.fields) do
%     local name = rename and rename[f.name] or f.name
%     if f.kind == "ptr" and cuda then
    ${f.ctype} *${name} = ${var}.${f.name};
%     elseif f.kind == "ptr" then
    __global ${f.ctype} *${name} = (__global ${f.ctype} *)(${var}.${f.name});
%     elseif f.kind == "i64" then
    const ${field_type(f)} ${name} = ${var}.${f.name};
%     elseif f.kind == "i32" then
    const int ${name} = ${var}.${f.name};
%     elseif f.kind == "f32" then
    const float ${name} = ${var}.${f.name};
%     end
%   end
% end
