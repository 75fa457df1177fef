"""FlexAttention's Python mask_mod and score_mod as flashjit expressions.

flashjit compiles mask_mod and score_mod from expression strings (flashjit.h's grammar). A
FlexAttention user writes them as Python functions of tensors:

    def mask_mod(b, h, q_idx, kv_idx):          # -> bool
        return (q_idx >= kv_idx) & (doc_ids[q_idx] == doc_ids[kv_idx])
    def score_mod(score, b, h, q_idx, kv_idx):  # -> the new score
        return score + rel_bias[h, q_idx - kv_idx + 4095]

`expressions` calls such a function once with symbols in place of the tensors. Each operation on
a symbol (operators, and the torch functions of `_TORCH` through __torch_function__) returns a
symbol carrying the expression text, so the function's return value is its expression. Python
semantics are kept where flashjit's differ: `//` and `%` floor (flashjit truncates), `/` of
integers divides as floats. Tensors the function reads (captured, like doc_ids above) become
mod_args: each is copied (float32, or int32 for integer and bool tensors) after the caller's
own mod_args, and read as arg[offset + index] or iarg[offset + index]. They are constants: no
gradient reaches them. Control flow on a symbol (`if`, `and`, `or`, `not`, int(), float())
cannot be traced and raises Unsupported naming the alternative (torch.where, &, |, ~).
Under torch.compile the trace runs inside dynamo's; a tensor indexed by a tuple of symbols is a
graph break there (dynamo's Tensor.__getitem__ takes no tuple of foreign objects)."""
import math
import numbers

import torch

from .errors import InvalidArgument, Unsupported

_INT32 = (-(2 ** 31), 2 ** 31 - 1)


class _Sym:
    """An expression of the traced function: its text, kind ("int", "float" or "bool") and
    whether its value is known to be nonnegative (which lets // and % use flashjit's own)."""
    __slots__ = ("text", "kind", "nonneg", "tracer")

    def __init__(self, text, kind, tracer, nonneg=False):
        self.text, self.kind, self.tracer, self.nonneg = text, kind, tracer, nonneg

    # Operators: each is the torch function of the same name (see _TORCH).
    def __add__(self, o): return _add(self, o)
    def __radd__(self, o): return _add(o, self)
    def __sub__(self, o): return _sub(self, o)
    def __rsub__(self, o): return _sub(o, self)
    def __mul__(self, o): return _mul(self, o)
    def __rmul__(self, o): return _mul(o, self)
    def __truediv__(self, o): return _truediv(self, o)
    def __rtruediv__(self, o): return _truediv(o, self)
    def __floordiv__(self, o): return _floordiv(self, o)
    def __rfloordiv__(self, o): return _floordiv(o, self)
    def __mod__(self, o): return _mod(self, o)
    def __rmod__(self, o): return _mod(o, self)
    def __pow__(self, o): return _pow(self, o)
    def __neg__(self): return _neg(self)
    def __pos__(self): return self
    def __abs__(self): return _call1("abs", self)
    def __invert__(self): return _not(self)
    def __and__(self, o): return _logic("&&", self, o)
    def __rand__(self, o): return _logic("&&", o, self)
    def __or__(self, o): return _logic("||", self, o)
    def __ror__(self, o): return _logic("||", o, self)
    def __xor__(self, o): return _xor(self, o)
    def __rxor__(self, o): return _xor(o, self)
    def __eq__(self, o): return _compare("==", self, o)
    def __ne__(self, o): return _compare("!=", self, o)
    def __lt__(self, o): return _compare("<", self, o)
    def __le__(self, o): return _compare("<=", self, o)
    def __gt__(self, o): return _compare(">", self, o)
    def __ge__(self, o): return _compare(">=", self, o)
    __hash__ = None

    def __bool__(self):
        raise Unsupported("mask_mod/score_mod: a traced value's truth is not known while tracing "
                          "(if, and, or, not on it): use torch.where(c, a, b), &, |, ~")

    def __int__(self):
        raise Unsupported("mask_mod/score_mod: int() of a traced value: use // or torch.floor")

    def __float__(self):
        raise Unsupported("mask_mod/score_mod: float() of a traced value: use .float() or * 1.0")

    def __index__(self):
        raise Unsupported("mask_mod/score_mod: a traced value as a Python index: index a "
                          "tensor with it instead (tensor[q_idx])")

    def __getitem__(self, index):
        raise Unsupported("mask_mod/score_mod: indexing a traced value (only captured tensors "
                          "are indexed)")

    # Tensor methods (x.abs(), x.new_ones(...), x.to(torch.float32)): the torch functions of the
    # same name with x first; x.where(c, y) is torch.where(c, x, y). A device is none, a dtype
    # the kind's.
    def __getattr__(self, name):
        if name == "where":
            return lambda cond, other: _where(cond, self, other)
        if name in _TORCH and not name.startswith("__"):
            return lambda *args, **kwargs: _TORCH[name](self, *args, **kwargs)
        if name == "device":
            return None
        if name == "dtype":
            return {"bool": torch.bool, "int": torch.int32, "float": torch.float32}[self.kind]
        raise AttributeError(f"mask_mod/score_mod: .{name} of a traced value is not traced")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        rule = _TORCH.get(name)
        if rule is None:
            raise Unsupported(f"mask_mod/score_mod: torch.{name} is not traced (traced: "
                              f"{', '.join(_DOCUMENTED)})")
        return rule(*args, **(kwargs or {}))

    def __repr__(self):
        return f"<traced {self.kind}: {self.text}>"


class _Tracer:
    """The captured tensors of one trace, in order, each at its mod_args offset."""

    def __init__(self, base):
        self.next = base  # the first free 4-byte element after the caller's mod_args
        self.tensors, self.offsets = [], {}

    def capture(self, t):
        """t's offset in mod_args (copied once however often it is read)."""
        if id(t) not in self.offsets:
            if t.is_complex() or t.element_size() > 8:
                raise InvalidArgument(f"mask_mod/score_mod: a captured tensor of {t.dtype}")
            self.offsets[id(t)] = self.next
            self.tensors.append(t)
            self.next += t.numel()
        return self.offsets[id(t)]

    def mod_args(self, given, device):
        """The caller's mod_args (4-byte elements) followed by the captured tensors, as one
        int32 tensor on device (floats as their bits); `given` unchanged where nothing was
        captured."""
        if not self.tensors:
            return given
        parts = []
        if given is not None:
            if given.element_size() != 4:
                raise InvalidArgument(f"mod_args: {given.dtype}; 4-byte elements (float32 or "
                                      "int32) are read by arg[] and iarg[]")
            parts.append(given.detach().reshape(-1).to(device).view(torch.int32))
        for t in self.tensors:
            flat = t.detach().reshape(-1).to(device)
            parts.append(flat.to(torch.float32).view(torch.int32) if t.is_floating_point()
                         else flat.to(torch.int32))
        return torch.cat(parts)


def _sym(x, tracer=None):
    """x as a symbol: symbols as they are, Python numbers as literals, captured 0-dim (or
    one-element) tensors as their mod_args element."""
    if isinstance(x, _Sym):
        return x
    if isinstance(x, bool):
        return _Sym("1" if x else "0", "bool", tracer, True)
    if isinstance(x, numbers.Integral) and not isinstance(x, int):  # NumPy's integers
        x = int(x)
    elif isinstance(x, numbers.Real) and not isinstance(x, (int, float)):
        x = float(x)
    if isinstance(x, int):
        if not _INT32[0] <= x <= _INT32[1]:
            raise InvalidArgument(f"mask_mod/score_mod: the integer {x} is beyond 32 bits")
        return _Sym(str(x) if x >= 0 else f"({x})", "int", tracer, x >= 0)
    if isinstance(x, float):
        if math.isnan(x):
            return _Sym("(0.0 / 0.0)", "float", tracer)
        if math.isinf(x):
            return _Sym("(1.0 / 0.0)" if x > 0 else "(-1.0 / 0.0)", "float", tracer, x > 0)
        text = repr(x)
        if "." not in text and "e" not in text:
            text += ".0"
        return _Sym(text if x >= 0 else f"({text})", "float", tracer, x >= 0)
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise InvalidArgument(f"mask_mod/score_mod: a captured tensor of shape "
                                  f"{tuple(x.shape)} used whole: index it (table[h], "
                                  "ids[q_idx])")
        if tracer is None:
            raise InvalidArgument("mask_mod/score_mod: a captured tensor with no traced value")
        return _element(x, tracer, tracer.capture(x))
    raise InvalidArgument(f"mask_mod/score_mod: a {type(x).__name__} in the expression")


def _element(t, tracer, at):
    """Element `at` (text, an int expression of mod_args offsets) of captured tensor t."""
    if t.is_floating_point():
        return _Sym(f"arg[{at}]", "float", tracer)
    return _Sym(f"iarg[{at}]", "bool" if t.dtype == torch.bool else "int", tracer,
                t.dtype in (torch.bool, torch.uint8))


def _pair(a, b):
    tracer = a.tracer if isinstance(a, _Sym) else b.tracer if isinstance(b, _Sym) else None
    return _sym(a, tracer), _sym(b, tracer)


def _num(kind_a, kind_b):
    return "float" if "float" in (kind_a, kind_b) else "int"


def _add(a, b, alpha=1):
    if alpha != 1:
        b = _mul(b, alpha)
    a, b = _pair(a, b)
    return _Sym(f"({a.text} + {b.text})", _num(a.kind, b.kind), a.tracer, a.nonneg and b.nonneg)


def _sub(a, b, alpha=1):
    if alpha != 1:
        b = _mul(b, alpha)
    a, b = _pair(a, b)
    return _Sym(f"({a.text} - {b.text})", _num(a.kind, b.kind), a.tracer)


def _rsub(a, b, alpha=1):
    return _sub(b, _mul(a, alpha) if alpha != 1 else a)


def _mul(a, b):
    a, b = _pair(a, b)
    return _Sym(f"({a.text} * {b.text})", _num(a.kind, b.kind), a.tracer, a.nonneg and b.nonneg)


def _truediv(a, b, rounding_mode=None):
    if rounding_mode == "floor":
        return _floordiv(a, b)
    if rounding_mode == "trunc":
        a, b = _pair(a, b)
        if a.kind != "float" and b.kind != "float":  # flashjit's integer division truncates
            return _Sym(f"({a.text} / {b.text})", "int", a.tracer, a.nonneg and b.nonneg)
        q = _truediv(a, b)
        return _Sym(f"({q.text} < 0.0 ? -floor(-{q.text}) : floor({q.text}))", "float",
                    a.tracer, q.nonneg)
    a, b = _pair(a, b)
    left = a.text if a.kind == "float" or b.kind == "float" else f"(1.0 * {a.text})"
    return _Sym(f"({left} / {b.text})", "float", a.tracer, a.nonneg and b.nonneg)


def _positive_literal(s):
    return s.kind != "float" and s.text.isdigit() and int(s.text) > 0


def _floordiv(a, b):
    a, b = _pair(a, b)
    if a.kind == "float" or b.kind == "float":
        return _Sym(f"floor({_truediv(a, b).text})", "float", a.tracer, a.nonneg and b.nonneg)
    x, y = a.text, b.text
    if _positive_literal(b):
        if a.nonneg:
            return _Sym(f"({x} / {y})", "int", a.tracer, True)
        return _Sym(f"({x} / {y} - ({x} % {y} != 0 && {x} < 0))", "int", a.tracer)
    # Python floors: one less than the truncated quotient where the signs differ and it is
    # inexact.
    return _Sym(f"({x} / {y} - ({x} % {y} != 0 && ({x} < 0) != ({y} < 0)))", "int", a.tracer)


def _mod(a, b):
    a, b = _pair(a, b)
    if a.kind == "float" or b.kind == "float":
        q = _floordiv(a, b)
        return _Sym(f"({a.text} - {b.text} * {q.text})", "float", a.tracer)
    x, y = a.text, b.text
    if _positive_literal(b):
        if a.nonneg:
            return _Sym(f"({x} % {y})", "int", a.tracer, True)
        return _Sym(f"({x} % {y} + ({x} % {y} < 0 ? {y} : 0))", "int", a.tracer, True)
    # Python's remainder has the divisor's sign.
    return _Sym(f"({x} % {y} + ({x} % {y} != 0 && ({x} % {y} < 0) != ({y} < 0) ? {y} : 0))",
                "int", a.tracer, b.nonneg)


def _pow(a, b):
    a, b = _pair(a, b)
    if b.kind != "float" and b.text.isdigit() and int(b.text) <= 4:
        n = int(b.text)
        if n == 0:
            return _Sym("1", a.kind if a.kind != "bool" else "int", a.tracer, True)
        return _Sym("(" + " * ".join([a.text] * n) + ")", _num(a.kind, "int"), a.tracer,
                    a.nonneg or n % 2 == 0)
    if b.text == "0.5":
        return _call1("sqrt", a)
    raise Unsupported(f"mask_mod/score_mod: x ** {b.text}: integer powers 0 to 4 and 0.5 are "
                      "traced (write exp(p * log(x)) for x > 0)")


def _neg(a):
    a = _sym(a)
    return _Sym(f"(-{a.text})", "int" if a.kind == "bool" else a.kind, a.tracer)


def _call1(name, a):
    """A function of flashjit's grammar: abs keeps the kind, the others give floats."""
    a = _sym(a)
    kind = ("int" if a.kind == "bool" else a.kind) if name == "abs" else "float"
    return _Sym(f"{name}({a.text})", kind, a.tracer, name in ("abs", "exp", "sqrt"))


def _floor(a):
    a = _sym(a)
    return a if a.kind != "float" else _Sym(f"floor({a.text})", "float", a.tracer, a.nonneg)


def _ceil(a):
    a = _sym(a)
    return a if a.kind != "float" else _Sym(f"(-floor(-{a.text}))", "float", a.tracer, a.nonneg)


def _convert(a, floating):
    """a as a float (floating) or an integer: integers convert to floats exactly; a float
    to an integer is refused (flashjit's expressions have no such conversion)."""
    a = _sym(a)
    if floating:
        return a if a.kind == "float" else _Sym(f"(1.0 * {a.text})", "float", a.tracer, a.nonneg)
    if a.kind == "float":
        raise Unsupported("mask_mod/score_mod: a float converted to an integer: use torch.floor "
                          "and compare, or integer arithmetic on the indices")
    return a


def _to(a, *args, **kwargs):
    """Tensor.to: a dtype converts (see _convert); a device or a copy changes nothing."""
    dtype = kwargs.get("dtype", next((x for x in args if isinstance(x, torch.dtype)), None))
    return _sym(a) if dtype is None else _convert(a, dtype.is_floating_point)


def _type_as(a, other):
    floating = other.kind == "float" if isinstance(other, _Sym) else other.is_floating_point()
    return _convert(a, floating)


def _compare(op, a, b):
    a, b = _pair(a, b)
    return _Sym(f"({a.text} {op} {b.text})", "bool", a.tracer, True)


def _logic(op, a, b):
    a, b = _pair(a, b)
    if a.kind != "bool" or b.kind != "bool":
        raise Unsupported(f"mask_mod/score_mod: bitwise {'&' if op == '&&' else '|'} of "
                          "integers (traced for booleans: comparisons and bool tensors)")
    return _Sym(f"({a.text} {op} {b.text})", "bool", a.tracer, True)


def _xor(a, b):
    a, b = _pair(a, b)
    if a.kind != "bool" or b.kind != "bool":
        raise Unsupported("mask_mod/score_mod: bitwise ^ of integers (traced for booleans)")
    return _Sym(f"({a.text} != {b.text})", "bool", a.tracer, True)


def _not(a):
    a = _sym(a)
    if a.kind != "bool":
        raise Unsupported("mask_mod/score_mod: ~ of an integer (traced for booleans: use == 0)")
    return _Sym(f"(!{a.text})", "bool", a.tracer, True)


def _where(cond, a, b):
    cond = _sym(cond, getattr(a, "tracer", None) or getattr(b, "tracer", None))
    a, b = _sym(a, cond.tracer), _sym(b, cond.tracer)
    kind = "float" if "float" in (a.kind, b.kind) else "bool" if a.kind == b.kind == "bool" \
        else "int"
    return _Sym(f"({cond.text} ? {a.text} : {b.text})", kind, cond.tracer,
                a.nonneg and b.nonneg)


def _minmax(name, a, b):
    a, b = _pair(a, b)
    nonneg = a.nonneg and b.nonneg if name == "min" else a.nonneg or b.nonneg
    return _Sym(f"{name}({a.text}, {b.text})", _num(a.kind, b.kind), a.tracer, nonneg)


def _clamp(a, min=None, max=None):
    if min is not None:
        a = _minmax("max", a, min)
    if max is not None:
        a = _minmax("min", a, max)
    return _sym(a)


def _binary_minmax(name):
    """torch.min / torch.max of two values (their one-tensor reductions are not traced)."""
    def rule(a, other=None, *rest, **kw):
        if other is None or rest or kw or isinstance(other, int) and not isinstance(a, _Sym):
            raise Unsupported(f"mask_mod/score_mod: torch.{name} as a reduction (traced: "
                              f"torch.{name}(a, b), minimum, maximum)")
        return _minmax(name, a, other)
    return rule


def _fmod(a, b):
    """C's remainder (the dividend's sign), flashjit's own for integers."""
    a, b = _pair(a, b)
    if a.kind != "float" and b.kind != "float":
        return _Sym(f"({a.text} % {b.text})", "int", a.tracer, a.nonneg)
    q = _truediv(a, b, rounding_mode="trunc")
    return _Sym(f"({a.text} - {b.text} * {q.text})", "float", a.tracer)


def _filled(value, like=None, dtype=None):
    """A constant shaped like a traced value (zeros_like, new_ones, ...): the constant, of the
    dtype asked for, else of `like`'s kind."""
    kind = like.kind if isinstance(like, _Sym) else "float" if isinstance(value, float) else "int"
    if dtype is not None:
        kind = "bool" if dtype == torch.bool else "float" if dtype.is_floating_point else "int"
    if kind == "bool":
        value = bool(value)
    elif kind == "float":
        value = float(value)
    return _sym(value, like.tracer if isinstance(like, _Sym) else None)


def _getitem(t, index):
    """A captured tensor indexed by symbols and integers (every dimension, no slices)."""
    if isinstance(t, _Sym):
        return t[index]
    index = index if isinstance(index, tuple) else (index,)
    tracer = next((i.tracer for i in index if isinstance(i, _Sym)), None)
    if tracer is None:
        raise InvalidArgument("mask_mod/score_mod: a captured tensor indexed without a traced "
                              "value")
    if len(index) != t.dim() or any(isinstance(i, (slice, type(Ellipsis))) or i is None
                                    for i in index):
        raise Unsupported(f"mask_mod/score_mod: a captured tensor of shape {tuple(t.shape)} "
                          f"indexed by {len(index)} value(s): index every dimension by one "
                          "(no slices)")
    offset, at, stride = tracer.capture(t), None, 1
    for i, n in zip(reversed(index), reversed(t.shape)):  # row-major, as mod_args holds it
        i = _sym(i, tracer)
        if i.kind == "float":
            raise InvalidArgument("mask_mod/score_mod: a tensor indexed by a float")
        term = i if stride == 1 else _mul(i, stride)
        at = term if at is None else _add(at, term)
        stride *= n
    return _element(t, tracer, _add(offset, at).text if offset else at.text)


# The torch functions and Tensor methods a traced function may apply to symbols, by name (as
# __torch_function__ sees them: torch.tanh and Tensor.tanh are both "tanh").
_TORCH = {
    "add": _add, "__add__": _add, "__radd__": lambda a, b: _add(b, a),
    "sub": _sub, "subtract": _sub, "__sub__": _sub, "rsub": _rsub,
    "__rsub__": lambda a, b: _sub(b, a),
    "mul": _mul, "multiply": _mul, "__mul__": _mul, "__rmul__": lambda a, b: _mul(b, a),
    "div": _truediv, "divide": _truediv, "true_divide": _truediv, "__truediv__": _truediv,
    "__rtruediv__": lambda a, b: _truediv(b, a), "__rdiv__": lambda a, b: _truediv(b, a),
    "__div__": _truediv,
    "floor_divide": _floordiv, "__floordiv__": _floordiv,
    "__rfloordiv__": lambda a, b: _floordiv(b, a),
    "remainder": _mod, "__mod__": _mod, "__rmod__": lambda a, b: _mod(b, a),
    "pow": _pow, "__pow__": _pow, "square": lambda a: _pow(a, 2),
    "neg": _neg, "negative": _neg, "__neg__": _neg,
    "abs": lambda a: _call1("abs", a), "absolute": lambda a: _call1("abs", a),
    "__abs__": lambda a: _call1("abs", a),
    "exp": lambda a: _call1("exp", a), "log": lambda a: _call1("log", a),
    "sqrt": lambda a: _call1("sqrt", a), "tanh": lambda a: _call1("tanh", a),
    "exp2": lambda a: _call1("exp", _mul(a, math.log(2.0))),
    "log2": lambda a: _mul(_call1("log", a), 1.0 / math.log(2.0)),
    "rsqrt": lambda a: _truediv(1.0, _call1("sqrt", a)),
    "sigmoid": lambda a: _truediv(1.0, _add(1.0, _call1("exp", _neg(a)))),
    "floor": _floor, "ceil": _ceil,
    "eq": lambda a, b: _compare("==", a, b), "__eq__": lambda a, b: _compare("==", a, b),
    "ne": lambda a, b: _compare("!=", a, b), "__ne__": lambda a, b: _compare("!=", a, b),
    "lt": lambda a, b: _compare("<", a, b), "__lt__": lambda a, b: _compare("<", a, b),
    "le": lambda a, b: _compare("<=", a, b), "__le__": lambda a, b: _compare("<=", a, b),
    "gt": lambda a, b: _compare(">", a, b), "__gt__": lambda a, b: _compare(">", a, b),
    "ge": lambda a, b: _compare(">=", a, b), "__ge__": lambda a, b: _compare(">=", a, b),
    "logical_and": lambda a, b: _logic("&&", a, b), "bitwise_and": lambda a, b: _logic("&&", a, b),
    "__and__": lambda a, b: _logic("&&", a, b), "__rand__": lambda a, b: _logic("&&", b, a),
    "logical_or": lambda a, b: _logic("||", a, b), "bitwise_or": lambda a, b: _logic("||", a, b),
    "__or__": lambda a, b: _logic("||", a, b), "__ror__": lambda a, b: _logic("||", b, a),
    "logical_xor": _xor, "bitwise_xor": _xor, "__xor__": _xor,
    "logical_not": _not, "bitwise_not": _not, "__invert__": _not,
    "where": _where,
    "minimum": lambda a, b: _minmax("min", a, b), "maximum": lambda a, b: _minmax("max", a, b),
    "fmin": lambda a, b: _minmax("min", a, b), "fmax": lambda a, b: _minmax("max", a, b),
    "clamp": _clamp, "clip": _clamp, "min": _binary_minmax("min"), "max": _binary_minmax("max"),
    "fmod": _fmod,
    "zeros_like": lambda a, dtype=None, **kw: _filled(0, a, dtype),
    "ones_like": lambda a, dtype=None, **kw: _filled(1, a, dtype),
    "full_like": lambda a, value, dtype=None, **kw: _filled(value, a, dtype),
    "new_zeros": lambda a, *size, dtype=None, **kw: _filled(0, a, dtype),
    "new_ones": lambda a, *size, dtype=None, **kw: _filled(1, a, dtype),
    "new_full": lambda a, size, value, dtype=None, **kw: _filled(value, a, dtype),
    "__getitem__": _getitem,
    "to": _to, "type_as": _type_as, "float": lambda a: _convert(a, True),
    "double": lambda a: _convert(a, True), "int": lambda a: _convert(a, False),
    "long": lambda a: _convert(a, False),
}
_DOCUMENTED = ("+ - * / // % **", "comparisons", "& | ^ ~ on booleans", "where", "abs", "exp",
               "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "floor", "ceil",
               "minimum", "maximum", "min and max of two", "clamp", "fmod", "zeros_like and "
               "the like", "captured tensors indexed")


def _text(result, tracer, what, want_bool):
    """The returned value's expression text (a constant where the function ignored its
    arguments)."""
    r = _sym(result, tracer) if isinstance(result, (_Sym, bool, int, float, torch.Tensor)) \
        else None
    if r is None:
        raise InvalidArgument(f"{what} returned a {type(result).__name__}; a traced expression "
                              f"was expected")
    if want_bool and r.kind == "float":
        raise InvalidArgument(f"{what} returned a float expression ({r.text}); a mask is a "
                              "boolean (a comparison)")
    return r.text


def expressions(mask_mod, score_mod, mod_args, device):
    """(mask_mod, score_mod, mod_args) with callables traced: FlexAttention's
    mask_mod(b, h, q_idx, kv_idx) and score_mod(score, b, h, q_idx, kv_idx) as expression
    texts, the tensors they read appended to mod_args (on device). Strings and None pass
    through. A captured tensor that requires a gradient (where autograd records) raises
    Unsupported: no gradient reaches mod_args."""
    tracer = _Tracer(mod_args.numel() if mod_args is not None else 0)
    b, h, q, k = (_Sym(n, "int", tracer, True) for n in "bhqk")
    if callable(mask_mod):
        mask_mod = _text(mask_mod(b, h, q, k), tracer, "mask_mod", True)
        mask_mod = None if mask_mod == "1" else mask_mod  # keeps every pair (noop_mask)
    if callable(score_mod):
        score_mod = _text(score_mod(_Sym("s", "float", tracer), b, h, q, k), tracer,
                          "score_mod", False)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tracer.tensors):
        raise Unsupported("mask_mod/score_mod: a captured tensor requires grad; flashjit gives "
                          "no gradient to captured tensors (mod_args): detach it, or pass it "
                          "as bias=")
    return mask_mod, score_mod, tracer.mod_args(mod_args, device)
