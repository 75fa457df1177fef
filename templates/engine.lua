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
-- params the parameter table, safe the whitelisted library table, load Lua's load, main the
-- template to render.

local source, params, safe, load, main = ...
local concat, insert = safe.table.concat, safe.table.insert
local format, find, sub = safe.string.format, safe.string.find, safe.string.sub

local out = {}
local function emit(text)
    insert(out, text)
end

-- Translates one text line into Lua statements that emit it.
local function text_line(line, code)
    local pos = 1
    while true do
        local s, e, expr = find(line, "%${(.-)}", pos)
        if not s then
            break
        end
        if s > pos then
            insert(code, format("_emit(%q)", sub(line, pos, s - 1)))
        end
        insert(code, format("_emit(_str(%s))", expr))
        pos = e + 1
    end
    -- %q would write the newline as a backslash and a real line break, which would shift
    -- every later line number; the escape keeps the translation one line per line.
    insert(code, format("_emit(%q)", sub(line, pos)) .. ' _emit("\\n")')
end

-- Translates a template into Lua source, one Lua line per template line.
local function translate(text)
    local lines = {}
    if sub(text, -1) ~= "\n" then
        text = text .. "\n"
    end
    for line in text:gmatch("([^\n]*)\n") do
        local lua = line:match("^%s*%%(.*)$")
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
