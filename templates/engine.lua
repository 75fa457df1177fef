-- The template engine. Runs inside the renderer's sandbox (templates/render.c) and turns a
-- template into text.
--
-- A template is the kernel's source with two additions:
--   * a line whose first non-blank character is '%' is Lua code (loops, conditions, locals);
--   * ${expr} anywhere in another line is replaced by tostring(expr).
-- Every template line becomes exactly one Lua line, so a Lua error's line number is the
-- template's line number. Templates see their parameters, a few pure libraries, include(name)
-- to splice another template in place, and emit(text). Reading a name that is neither a
-- parameter nor a library is an error, so a misspelt parameter never renders silently.
--
-- Called as engine(source, params, safe, load, main): source(name) returns a template's text,
-- params the parameter table, safe the whitelisted library table, load a loader of Lua text
-- (never bytecode), main the template to render. The sandbox has no pattern matching (Lua's
-- matcher runs in C, outside the instruction limit, and can backtrack exponentially): the
-- engine scans with plain find.

local source, params, safe, load, main = ...
local concat, insert = safe.table.concat, safe.table.insert
local format, find, sub, byte = safe.string.format, safe.string.find, safe.string.sub,
    safe.string.byte

local out = {}
local function emit(text)
    insert(out, text)
end

-- Translates one text line into Lua statements that emit it: each ${expr} becomes
-- tostring(expr), the rest literal text.
local function text_line(line, code)
    local pos = 1
    while true do
        local s = find(line, "${", pos, true)
        local e = s and find(line, "}", s + 2, true)
        if not e then
            break
        end
        if s > pos then
            insert(code, format("_emit(%q)", sub(line, pos, s - 1)))
        end
        insert(code, format("_emit(_str(%s))", sub(line, s + 2, e - 1)))
        pos = e + 1
    end
    -- %q would write the newline as a backslash and a real line break, which would shift
    -- every later line number; the escape keeps the translation one line per line.
    insert(code, format("_emit(%q)", sub(line, pos)) .. ' _emit("\\n")')
end

-- The Lua code of a line whose first non-blank character is '%', or nil.
local function code_line(line)
    local i = 1
    local c = byte(line, i)
    while c == 32 or (c and c >= 9 and c <= 13) do -- space, \t \n \v \f \r
        i = i + 1
        c = byte(line, i)
    end
    if c == 37 then -- '%'
        return sub(line, i + 1)
    end
    return nil
end

-- Translates a template into Lua source, one Lua line per template line.
local function translate(text)
    local lines = {}
    local pos = 1
    while pos <= #text do
        local nl = find(text, "\n", pos, true) or #text + 1
        local line = sub(text, pos, nl - 1)
        pos = nl + 1
        local lua = code_line(line)
        if lua then
            insert(lines, lua)
        else
            local code = {}
            text_line(line, code)
            insert(lines, concat(code, " "))
        end
    end
    return concat(lines, "\n")
end

local env = {}
local function lookup(_, key)
    local value = params[key]
    if value ~= nil then
        return value
    end
    value = safe[key]
    if value ~= nil then
        return value
    end
    error(format("unknown name '%s' (not a parameter or library)", tostring(key)), 2)
end
setmetatable(env, { __index = lookup })

local function run(name)
    local text = source(name)
    if text == nil then
        error(format("no template named '%s'", name), 0)
    end
    local chunk, msg = load(translate(text), "=" .. name, "t", env)
    if not chunk then
        error(msg, 0)
    end
    chunk()
end

env._emit = emit
env._str = tostring
env.emit = emit
env.include = run
env.params = params

run(main)
return concat(out)
