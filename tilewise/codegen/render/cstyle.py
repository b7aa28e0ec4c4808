"""One C-style renderer for every C-like target: scalar expressions, literals, storage conversions.

[Note: C-style rendering]
An operator's meaning is a scalar ``Expr`` (``tilewise.ops.expr``). This module turns such expressions into
C-family statements: type inference over the expression, the operators, literals, loads that convert a
stored value to its compute dtype and stores that convert back. The control flow around them — loops,
index arithmetic, thread mapping — is the kernel renderers' (``kernel_c``, ``kernel_cuda``), which render
the kernel IR of the compiler's fused kernels and of the eager CUDA backend's pointwise and reduction
kernels alike; the CUDA backend's templates (scans, sorts, search, random, ...) use these pieces directly.
A target is a :class:`Language`: pure data (type names, headers, how a storage type converts to and from
``float``, the few math functions a target spells differently). ``render.cuda.CUDA`` and ``render.c.C``
are the two instances (tinygrad's ``CStyleLanguage``, STYLE.md §2).

Types follow numpy's rules, which is what the CPU backend computes with: every tensor input is converted to
the operator's compute dtype on load; a Python constant adopts the dtype of what it meets (a float constant
meeting an integer makes a float64, NEP 50); comparisons give ``bool``. Helper functions that several ops
need (NaN-propagating maximum, numpy's floor division and remainder, integer power) are emitted once per
type, each inside an include guard, so many kernels can share one translation unit.

[Note: integer division] Integer ``//``, trunc division, ``%`` and ``fmod`` never trap: x86 faults (SIGFPE, killing the
process) on a zero divisor and on ``INT_MIN / -1``, so the helpers test for both. A divisor of -1 gives
the wrapped negation (floor and trunc division: ``INT_MIN``; remainders: 0), which is torch's answer on
the CPU and on CUDA. A zero divisor gives 0 after the target's ``on_zero_division`` statement: the C
target sets a flag in the library (``tw_zero_division``, stored atomically since OpenMP threads may
race to set it), which the program reads after each kernel that divides integers and turns into torch's
``ZeroDivisionError``; on CUDA, where torch raises nothing and the hardware's quotient is unspecified,
nothing more happens. The tests cost one compare per division, which an integer division (tens of
cycles, never vectorised on x86) hides.

``ExprRenderer`` shares common subexpressions between the expressions it renders for one scope (the
several stores and reductions of a fused nest).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tilewise import dtypes
from tilewise.dtypes import DType
from tilewise.ops.expr import BINARY, TERNARY, UNARY, Expr, toposort

SUFFIX = {"bool": "b", "uint8": "u8", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
          "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
          "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float8_e8m0fnu": "e8m0", "float4_e2m1fn_x2": "e2m1x2"}


class WeakType:
    """The dtype of a Python constant before it meets a typed operand."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"weak {self.name}"


WEAK_INT, WEAK_FLOAT = WeakType("int"), WeakType("float")

ZERO_DIVISION_FLAG = "tw_zero_division"  # the C target's flag (see [Note: integer division])


@dataclass(frozen=True)
class Language:
    """What a C-like target spells its own way. Everything else is shared (see the module note)."""

    name: str
    kernel_prefix: str  # before a kernel's name
    helper_prefix: str  # before a helper function
    restrict: str
    type_names: Mapping[str, str]  # storage dtype name -> C type
    headers: Mapping[str, str]  # storage dtype name -> the #include it needs
    loads: Mapping[str, str]  # half-width storage dtype -> format turning a stored value into float
    stores: Mapping[tuple[str, str], str]  # (storage dtype, "float"|"double") -> format; "{sat}" for fp8
    math: Mapping[str, str]  # float math ops the target spells differently from MATH_FLOAT ("op", or
    # "op:dtype" for one float dtype only)
    constants: Mapping[tuple[str, str], str]  # ("inf"|"nan", "float"|"double") -> literal
    prelude: str = ""  # text every kernel source starts with
    helpers: Mapping[str, str] = field(default_factory=dict)  # extra helper bodies for this target
    # what an integer division by zero does before it gives 0 (see [Note: integer division]): a statement, and
    # the declaration it needs
    on_zero_division: str = ""
    zero_division_flag: str = ""
    saturation: tuple[str, str] = ("__NV_NOSAT", "__NV_SATFINITE")  # what "{sat}" becomes: (wraps, saturates)

    def ctype(self, dtype: DType) -> str:
        try:
            return self.type_names[dtype.name]
        except KeyError:
            raise NotImplementedError(f"the {self.name} target has no storage type for {dtype.name}") from None


# ----------------------------------------------------------------------------------------------- operators

MATH_FLOAT = {  # {0}, {1}: operands; {f}: "f" for float, "" for double; {T}: the C type; {S}: type suffix
    "neg": "(-{0})", "abs": "fabs{f}({0})", "sign": "tw_sign_{S}({0})", "exp": "exp{f}({0})",
    "exp2": "exp2{f}({0})", "expm1": "expm1{f}({0})", "log": "log{f}({0})", "log2": "log2{f}({0})",
    "log10": "log10{f}({0})", "log1p": "log1p{f}({0})", "sqrt": "sqrt{f}({0})",
    "rsqrt": "(({T})1 / sqrt{f}({0}))", "reciprocal": "(({T})1 / {0})", "sin": "sin{f}({0})",
    "cos": "cos{f}({0})", "tan": "tan{f}({0})", "asin": "asin{f}({0})", "acos": "acos{f}({0})",
    "atan": "atan{f}({0})", "sinh": "sinh{f}({0})", "cosh": "cosh{f}({0})", "tanh": "tanh{f}({0})",
    "erf": "erf{f}({0})", "erfinv": "tw_erfinv_{S}({0})", "floor": "floor{f}({0})", "ceil": "ceil{f}({0})",
    "round": "rint{f}({0})", "trunc": "trunc{f}({0})", "logical_not": "(!{0})", "isnan": "({0} != {0})",
    "isinf": "(fabs{f}({0}) == tw_inf_{S}())", "signbit": "(signbit({0}) != 0)",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "floordiv": "tw_floordiv_{S}({0}, {1})", "truncdiv": "trunc{f}({0} / {1})", "mod": "tw_mod_{S}({0}, {1})",
    "fmod": "fmod{f}({0}, {1})",
    "pow": "pow{f}({0}, {1})", "maximum": "tw_maximum_{S}({0}, {1})", "minimum": "tw_minimum_{S}({0}, {1})",
    "atan2": "atan2{f}({0}, {1})", "copysign": "copysign{f}({0}, {1})", "asinh": "asinh{f}({0})",
    "acosh": "acosh{f}({0})", "atanh": "atanh{f}({0})", "erfc": "erfc{f}({0})", "lgamma": "lgamma{f}({0})",
    "hypot": "hypot{f}({0}, {1})", "nextafter": "nextafter{f}({0}, {1})", "fma": "fma{f}({0}, {1}, {2})",
}
MATH_INT = {
    "neg": "(-{0})", "abs": "tw_abs_{S}({0})", "sign": "(({T})(({0} > 0) - ({0} < 0)))", "floor": "{0}",
    "ceil": "{0}", "round": "{0}", "trunc": "{0}", "logical_not": "(!{0})", "bitwise_not": "(~{0})",
    "isnan": "false", "isinf": "false", "signbit": "({0} < 0)",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "floordiv": "tw_floordiv_{S}({0}, {1})",
    "truncdiv": "tw_truncdiv_{S}({0}, {1})", "mod": "tw_mod_{S}({0}, {1})", "fmod": "tw_fmod_{S}({0}, {1})",
    "pow": "tw_pow_{S}({0}, {1})",
    "maximum": "({0} > {1} ? {0} : {1})", "minimum": "({0} < {1} ? {0} : {1})", "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})", "lshift": "({0} << {1})",
    "rshift": "({0} >> {1})", "fma": "({0} * {1} + {2})",
}
MATH_BOOL = {
    "logical_not": "(!{0})", "bitwise_not": "(!{0})", "isnan": "false", "isinf": "false", "signbit": "false",
    "abs": "{0}", "floor": "{0}", "ceil": "{0}", "round": "{0}", "trunc": "{0}", "sign": "{0}",
    "add": "({0} || {1})", "mul": "({0} && {1})", "maximum": "({0} || {1})", "minimum": "({0} && {1})",
    "bitwise_and": "({0} && {1})", "bitwise_or": "({0} || {1})", "bitwise_xor": "({0} != {1})",
    "lshift": "({0} << {1})", "rshift": "({0} >> {1})", "fma": "(({0} && {1}) || {2})",
}
MATH_ANY = {
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "(({0} != 0) && ({1} != 0))",
    "logical_or": "(({0} != 0) || ({1} != 0))", "logical_xor": "(({0} != 0) != ({1} != 0))",
}
BOOL_RESULT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
               "isnan", "isinf", "signbit"}

# Helper bodies. {FN}: the target's helper prefix; {T}: C type; {S}: suffix; {f}: float function suffix.
HELPERS = {
    ("maximum", "float"): "{FN} {T} tw_maximum_{S}({T} a, {T} b) {{\n"
                          "    return a != a ? a : (b != b ? b : (a > b ? a : b));\n}}",
    ("minimum", "float"): "{FN} {T} tw_minimum_{S}({T} a, {T} b) {{\n"
                          "    return a != a ? a : (b != b ? b : (a < b ? a : b));\n}}",
    ("sign", "float"): "{FN} {T} tw_sign_{S}({T} a) {{ return a > 0 ? ({T})1 : (a < 0 ? ({T})-1 : ({T})0); }}",
    ("floordiv", "float"): """{FN} {T} tw_floordiv_{S}({T} a, {T} b) {{
    if (b == 0) return a / b;
    {T} mod = fmod{f}(a, b);
    {T} div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
    if (div == 0) return copysign{f}(({T})0, a / b);
    {T} fl = floor{f}(div);
    return (div - fl > ({T})0.5) ? fl + 1 : fl;
}}""",
    ("mod", "float"): """{FN} {T} tw_mod_{S}({T} a, {T} b) {{
    {T} mod = fmod{f}(a, b);
    return (mod != 0 && ((b < 0) != (mod < 0))) ? mod + b : mod;  /* a zero keeps the dividend's sign */
}}""",
    ("abs", "int"): "{FN} {T} tw_abs_{S}({T} a) {{ return a < 0 ? ({T})-a : a; }}",
    ("floordiv", "int"): """{FN} {T} tw_floordiv_{S}({T} a, {T} b) {{
    if (b == 0) {{ {ZERO}return 0; }}
    if (b == -1) return ({T})(0ULL - (unsigned long long)a);
    {T} q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}}""",
    ("truncdiv", "int"): """{FN} {T} tw_truncdiv_{S}({T} a, {T} b) {{
    if (b == 0) {{ {ZERO}return 0; }}
    return b == -1 ? ({T})(0ULL - (unsigned long long)a) : a / b;
}}""",
    ("mod", "int"): """{FN} {T} tw_mod_{S}({T} a, {T} b) {{
    if (b == 0) {{ {ZERO}return 0; }}
    if (b == -1) return 0;
    {T} r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}""",
    ("fmod", "int"): """{FN} {T} tw_fmod_{S}({T} a, {T} b) {{
    if (b == 0) {{ {ZERO}return 0; }}
    return b == -1 ? 0 : a % b;
}}""",
    ("pow", "int"): """{FN} {T} tw_pow_{S}({T} a, {T} b) {{
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    {T} r = 1;
    while (b) {{ if (b & 1) r *= a; a *= a; b >>= 1; }}
    return r;
}}""",
    ("inf", "float"): "{FN} {T} tw_inf_{S}(void) {{ return {INF}; }}",
}


# ----------------------------------------------------------------------------------------------- type rules

def kind_of(dtype: DType) -> str:
    if dtype is dtypes.bool_:
        return "bool"
    return "float" if dtype.is_floating_point else "int"


def join(a, b):
    """numpy's result dtype of a binary operation on two node types (constants are weak, NEP 50)."""
    if isinstance(a, WeakType) and isinstance(b, WeakType):
        return WEAK_FLOAT if WEAK_FLOAT in (a, b) else WEAK_INT
    if isinstance(a, WeakType):
        a, b = b, a
    if isinstance(b, WeakType):
        if b is WEAK_FLOAT and not a.is_floating_point:
            return dtypes.float64
        return dtypes.int64 if a is dtypes.bool_ else a
    return dtypes.promote_types(a, b)


def concrete(t) -> DType:
    if t is WEAK_FLOAT:
        return dtypes.float64
    if t is WEAK_INT:
        return dtypes.int64
    return t


def compute_of(storage: DType) -> DType:
    """The type a stored value has once loaded: half-width floats widen to float32."""
    return dtypes.float32 if storage.is_floating_point and storage.itemsize < 4 else storage


# ----------------------------------------------------------------------------------------------- source

class Source:
    """Kernel text being built: headers, helpers (each once) and body lines."""

    def __init__(self, lang: Language) -> None:
        self.lang = lang
        self.headers: list[str] = []
        self.helpers: dict[str, str] = {}

    def need_storage(self, dtype: DType) -> None:
        header = self.lang.headers.get(dtype.name)
        if header and header not in self.headers:
            self.headers.append(header)

    def need_helper(self, op: str, dtype: DType) -> None:
        kind = kind_of(dtype)
        name = f"tw_{op}_{SUFFIX[dtype.name]}"
        if name in self.helpers:
            return
        body = self.lang.helpers.get(f"{op}:{kind}") or HELPERS.get((op, kind))
        if body is None:
            return
        c = self.lang.ctype(dtype)
        f = "f" if dtype is dtypes.float32 else ""
        inf = self.lang.constants.get(("inf", c), "")
        if "{ZERO}" in body and self.lang.zero_division_flag:
            guard = "TW_ZERO_DIVISION_FLAG"
            self.helpers.setdefault(ZERO_DIVISION_FLAG,
                                    f"#ifndef {guard}\n#define {guard}\n{self.lang.zero_division_flag}\n#endif")
        text = body.format(FN=self.lang.helper_prefix, T=c, S=SUFFIX[dtype.name], f=f, INF=inf,
                           ZERO=self.lang.on_zero_division)
        guard = f"TW_HELPER_{name.upper()}"
        self.helpers[name] = f"#ifndef {guard}\n#define {guard}\n{text}\n#endif"

    def text(self, kernel: str) -> str:
        parts = [*self.headers, self.lang.prelude, *self.helpers.values(), kernel]
        return "\n".join(p for p in parts if p) + "\n"


def wrapped(value: int, dtype: DType) -> int:
    """``value`` wrapped into an integer dtype's range, as torch converts a Python int for an integer tensor
    (``int8 + 70000`` adds 112; ``uint8 * -3`` multiplies by 253)."""
    if isinstance(value, float) and not math.isfinite(value):
        return 0  # what C's conversion leaves undefined: no kernel of an integer result is given one
    bits = 8 * dtype.itemsize
    v = int(value) & ((1 << bits) - 1)
    return v - (1 << bits) if dtype.is_signed and v >= 1 << (bits - 1) else v


def literal(value, dtype: DType, lang: Language) -> str:
    """A C literal of ``value`` typed as ``dtype``; an integer one wrapped into the dtype's range."""
    if dtype is dtypes.bool_:
        return "true" if value else "false"
    if not dtype.is_floating_point:
        v = wrapped(value, dtype)
        if v == -(1 << 63):  # no literal spells it: -9223372036854775807LL - 1
            return "(-9223372036854775807LL - 1)"
        text = str(v)
        return f"{text}LL" if dtype.itemsize == 8 else text
    c = lang.ctype(dtype)
    value = float(value)
    if math.isnan(value):
        return lang.constants[("nan", c)]
    if math.isinf(value):
        inf = lang.constants[("inf", c)]
        return inf if value > 0 else f"(-{inf})"
    text = repr(value)
    if "." not in text and "e" not in text:
        text += ".0"
    return text + ("f" if dtype is dtypes.float32 else "")


def load_code(lang: Language, storage: DType, code: str) -> str:
    """Convert a stored value to ``compute_of(storage)``."""
    fmt = lang.loads.get(storage.name)
    return fmt.format(code) if fmt else code


def store_code(lang: Language, storage: DType, value: str, value_type: DType, saturate: bool = False) -> str:
    """Convert a computed value of ``value_type`` to the storage type."""
    if storage is dtypes.bool_:
        return f"({value} != 0)"
    wide = "double" if value_type is dtypes.float64 else "float"
    fmt = lang.stores.get((storage.name, wide))
    if fmt is not None:
        if value_type is not dtypes.float64 and value_type is not dtypes.float32:
            value = f"(float)({value})"
        return fmt.format(value, sat=lang.saturation[saturate])
    return f"({lang.ctype(storage)})({value})"


def new_nodes(exprs: list[Expr]) -> list[list[Expr]]:
    """For each of ``exprs`` in turn, the nodes a fresh ``ExprRenderer`` rendering them in this order makes for it
    (those no earlier expression made), operands first: the same for every vector lane of a nest, so the
    expressions are walked once for all of them rather than once a lane."""
    done: set[int] = set()
    out = []
    for expr in exprs:
        new = [node for node in toposort(expr, stop=done) if id(node) not in done]
        done.update(map(id, new))
        out.append(new)
    return out


class ExprRenderer:
    """Renders ``Expr`` nodes into ``const T tK = ...;`` statements, sharing nodes across calls."""

    def __init__(self, source: Source, leaves: Mapping[tuple, tuple[str, DType]], suffix: str = "") -> None:
        self.source = source
        self.lang = source.lang
        self.leaves = leaves  # ("input", k) or ("scalar", name) -> (C name, dtype)
        self.suffix = suffix
        self.lines: list[str] = []
        self.done: dict[int, tuple[str, object]] = {}

    def render(self, expr: Expr, new: list[Expr] | None = None) -> tuple[str, DType]:
        """The C name (or literal) of ``expr``'s value and its concrete dtype. ``new``: the nodes it adds, from
        ``new_nodes`` (what a renderer that has rendered the same expressions before this one adds)."""
        for node in toposort(expr, stop=self.done) if new is None else new:  # what is done was made with its operands
            if id(node) not in self.done:
                self.done[id(node)] = self._node(node, len(self.done))
        code, t = self.done[id(expr)]
        if isinstance(t, WeakType):
            t = concrete(t)
            code = literal(expr.arg, t, self.lang)
        return code, t

    def _operand(self, node: Expr, as_type) -> str:
        code, t = self.done[id(node)]
        if isinstance(t, WeakType):
            return literal(node.arg, concrete(as_type) if not isinstance(as_type, WeakType) else concrete(t), self.lang)
        return code

    def _node(self, node: Expr, k: int) -> tuple[str, object]:
        op = node.op
        if op in ("input", "scalar"):
            return self.leaves[(op, node.arg)]
        if op == "const":
            return "", WEAK_FLOAT if isinstance(node.arg, float) else WEAK_INT
        if op == "cast":
            return self._emit(self._cast(node), node.arg if node.arg.itemsize >= 4 or not node.arg.is_floating_point
                              else dtypes.float32, k)
        if op == "where":
            c, a, b = node.srcs
            t = join(self.done[id(a)][1], self.done[id(b)][1])
            if isinstance(t, WeakType):
                t = concrete(t)
            code = f"({self._operand(c, dtypes.bool_)} ? {self._operand(a, t)} : {self._operand(b, t)})"
            return self._emit(code, t, k)
        if op in UNARY:
            (a,) = node.srcs
            t = self.done[id(a)][1]
            t = concrete(t) if isinstance(t, WeakType) else t
            if t is dtypes.bool_ and op == "neg":
                raise TypeError("neg: negation of a bool tensor is not supported; use logical_not() or ~ instead")
            out = dtypes.bool_ if op in BOOL_RESULT else t
            return self._emit(self._math(op, t, [self._operand(a, t)]), out, k)
        if op in BINARY:
            a, b = node.srcs
            t = join(self.done[id(a)][1], self.done[id(b)][1])
            t = concrete(t) if isinstance(t, WeakType) else t
            if op == "div" and not t.is_floating_point:
                t = dtypes.float64
            if t is dtypes.bool_ and op not in MATH_BOOL and op not in MATH_ANY:
                if op == "sub":
                    raise TypeError("sub: subtraction of bool tensors is not supported; use logical_xor() or ^ instead")
                t = dtypes.int8  # numpy computes the remaining arithmetic on bools in int8
            out = dtypes.bool_ if op in BOOL_RESULT else t
            return self._emit(self._math(op, t, [self._operand(a, t), self._operand(b, t)]), out, k)
        if op in TERNARY:
            a, b, c = (self.done[id(s)][1] for s in node.srcs)
            t = join(join(a, b), c)
            t = concrete(t) if isinstance(t, WeakType) else t
            return self._emit(self._math(op, t, [self._operand(s, t) for s in node.srcs]), t, k)
        raise NotImplementedError(f"{self.lang.name} renderer: no rule for scalar op {op!r}")

    def _cast(self, node: Expr) -> str:
        (a,) = node.srcs
        src_code, src_t = self.done[id(a)]
        target: DType = node.arg
        if isinstance(src_t, WeakType):  # a Python number: an integer target wraps it, a half one computes in float
            if not target.is_floating_point:
                return literal(a.arg, target, self.lang)
            return literal(a.arg, target if target.itemsize >= 4 else dtypes.float32, self.lang)
        if target is dtypes.bool_:
            return f"({src_code} != 0)"
        if target.is_floating_point and target.itemsize < 4:
            self.source.need_storage(target)
            return load_code(self.lang, target, store_code(self.lang, target, src_code, src_t))
        return f"(({self.lang.ctype(target)}){src_code})"

    def _math(self, op: str, t: DType, args: list[str]) -> str:
        kind = kind_of(t)
        table = {"float": MATH_FLOAT, "int": MATH_INT, "bool": MATH_BOOL}[kind]
        own = (self.lang.math.get(f"{op}:{t.name}") or self.lang.math.get(op)) if kind == "float" else None
        fmt = MATH_ANY.get(op) or own or table.get(op)
        if fmt is None:
            raise NotImplementedError(f"{self.lang.name} renderer: {op} is not defined for {t.name}")
        if "tw_" in fmt:
            helper = fmt.split("tw_", 1)[1].split("_{S}", 1)[0]
            self.source.need_helper(helper, t)
            if "tw_inf_" in fmt:
                self.source.need_helper("inf", t)
        c = self.lang.ctype(t)
        return fmt.format(*args, f="f" if t is dtypes.float32 else "", T=c, S=SUFFIX[t.name])

    def _emit(self, code: str, t: DType, k: int) -> tuple[str, DType]:
        name = f"t{k}{self.suffix}"
        self.lines.append(f"const {self.lang.ctype(t)} {name} = {code};")
        return name, t
