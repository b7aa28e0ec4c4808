"""Operator schemas in PyTorch's schema language, and argument binders generated from them.

[Note: schemas] ``add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor`` is parsed once into
a ``Schema``; from it we generate (with ``exec``) a binder: a plain Python function with the operator's
own name and signature, whose body normalises each argument (int-or-list dims, dtype and device objects)
and checks its type. Letting CPython parse positional/keyword/default arguments keeps the per-call cost
near a plain function call, and a wrong call fails like a wrong call to any Python function
("add() got an unexpected keyword argument 'beta'"). Tensor parameters also accept Python numbers,
which travel unwrapped as "wrapped numbers" for type promotion, as in torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from numbers import Number

from tilewise.overrides import STATE as _TORCH_FUNCTION_STATE
from tilewise.overrides import TorchFunctionRequest, overridden_call

_ARG_RE = re.compile(r"^(?P<type>[A-Za-z]+(?:\[\d*\])?(?:\([a-z]\d*!?\))?\??(?:\[\])?\??)"
                     r"\s+(?P<name>\w+)(?:=(?P<default>.+))?$")


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # base type: Tensor, int, float, bool, Scalar, str, ScalarType, Device, Generator, Layout
    is_list: bool
    list_len: int | None
    optional: bool
    kwarg_only: bool
    default: object
    has_default: bool
    alias: str | None  # "a" for Tensor(a), "a!" for Tensor(a!)
    position: int = 0  # its index in the schema, which torch's errors name ("in argument 1")

    @property
    def is_tensor(self) -> bool:
        return self.type == "Tensor" and not self.is_list

    @property
    def is_tensor_list(self) -> bool:
        return self.type == "Tensor" and self.is_list

    @property
    def mutated(self) -> bool:
        return bool(self.alias and self.alias.endswith("!"))


@dataclass(frozen=True)
class Return:
    name: str | None
    type: str
    alias: str | None


@dataclass(frozen=True)
class Schema:
    name: str
    overload: str
    params: tuple[Param, ...]
    returns: tuple[Return, ...]
    text: str

    @property
    def full_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def tensor_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.type == "Tensor")

    @property
    def is_view(self) -> bool:
        return any(r.alias and not r.alias.endswith("!") for r in self.returns)

    @property
    def is_inplace(self) -> bool:
        return any(p.mutated for p in self.params)

    def index(self, name: str) -> int:
        for k, p in enumerate(self.params):
            if p.name == name:
                return k
        raise KeyError(f"{self.full_name} has no parameter {name!r}")

    def __str__(self) -> str:
        return self.text


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _parse_default(text: str, type_name: str):
    text = text.strip()
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return tuple(_parse_default(x, type_name) for x in inner.split(",")) if inner else ()
    if text.startswith(("'", '"')):
        return text[1:-1]
    if re.fullmatch(r"-?\d+", text):
        value = int(text)
        return float(value) if type_name == "float" else value
    try:
        return float(text)
    except ValueError:
        return text  # e.g. contiguous_format


def _parse_type(text: str) -> tuple[str, bool, int | None, bool, str | None]:
    alias = None
    m = re.search(r"\(([a-z]\d*!?)\)", text)
    if m:
        alias = m.group(1)
        text = text[: m.start()] + text[m.end():]
    elements_optional = "?[" in text
    text = text.replace("?[", "[")
    optional = text.endswith("?") or elements_optional
    text = text.rstrip("?")
    is_list, list_len = False, None
    m = re.fullmatch(r"(\w+)\[(\d*)\]\??", text)
    if m:
        text, is_list = m.group(1), True
        list_len = int(m.group(2)) if m.group(2) else None
    if text == "SymInt":
        text = "int"
    return text, is_list, list_len, optional, alias


def parse_schema(text: str) -> Schema:
    m = re.fullmatch(r"\s*((?:\w+::)?[\w.]+)\s*\((.*)\)\s*->\s*(.+?)\s*", text)
    if not m:
        raise ValueError(f"malformed schema: {text!r}")
    full, args, rets = m.groups()
    name, _, overload = full.partition(".")
    params, kwarg_only = [], False
    for part in _split_top(args):
        if part == "*":
            kwarg_only = True
            continue
        pm = _ARG_RE.match(part)
        if not pm:
            raise ValueError(f"malformed argument {part!r} in schema {text!r}")
        type_name, is_list, list_len, optional, alias = _parse_type(pm.group("type"))
        default_text = pm.group("default")
        default = _parse_default(default_text, type_name) if default_text is not None else None
        if is_list and isinstance(default, int) and list_len:
            default = (default,) * list_len
        params.append(Param(pm.group("name"), type_name, is_list, list_len, optional or default_text == "None",
                            kwarg_only, default, default_text is not None, alias, len(params)))
    rets = rets.strip()
    if rets.startswith("(") and rets.endswith(")"):
        rets = rets[1:-1]
    returns = []
    for part in _split_top(rets):
        if not part:
            continue
        bits = part.split()
        type_name, _, _, _, alias = _parse_type(bits[0])
        returns.append(Return(bits[1] if len(bits) > 1 else None, type_name, alias))
    return Schema(name, overload, tuple(params), tuple(returns), text.strip())


# ---------------------------------------------------------------------------- binders


class ArgumentError(TypeError):
    """A call whose arguments do not fit the operator's schema."""


def _describe(value) -> str:
    from tilewise.tensor import Tensor

    if isinstance(value, Tensor):
        return f"Tensor(shape={list(value.shape)}, dtype={value.dtype.name}, device={value.device})"
    return f"{type(value).__name__} {value!r}"


def bad_argument(op: str, param: str, expected: str, value) -> ArgumentError:
    return ArgumentError(f"{op}(): argument '{param}' must be {expected}, but got {_describe(value)}")


def _value_of(value):
    """A compiled function's dynamic number (``compiler/numbers.py``) as its value, which it then guards; anything
    else as it is. Only parameters read as a Tensor keep such a number as it is. The checks below take plain
    Python numbers before asking (a stand-in number is an instance of int or float, never of exactly that type)."""
    return value._tw_concrete() if hasattr(type(value), "_tw_concrete") else value


def _as_int_list(op: str, p: Param, value) -> tuple[int, ...]:
    if type(value) is tuple and not (p.list_len and len(value) == 1):
        for v in value:  # a loop rather than all(...): no generator to create on the common path
            if type(v) is not int:
                break
        else:
            return value  # the common case, already normalised
    value = _value_of(value)
    if _is_int_like(value):  # a numpy integer (``x.sum(np.int64(1))``) is the int it holds
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * p.list_len if p.list_len and p.list_len > 1 else (value,)
    from tilewise.tensor import Tensor

    if isinstance(value, Tensor):
        if value.dtype.is_floating_point:
            raise bad_argument(op, p.name, "a tuple of ints", value)
        return tuple(int(v) for v in value.tolist()) if value.ndim else (int(value.item()),)
    try:
        out = tuple(value)
    except TypeError:
        raise bad_argument(op, p.name, "a tuple of ints", value) from None
    for v in out:
        if not (isinstance(v, int) and not isinstance(v, bool)) and not _is_int_like(v):
            raise bad_argument(op, p.name, "a tuple of ints", value)
    out = tuple(int(v) for v in out)
    if p.list_len and len(out) == 1 and p.list_len > 1:
        out = out * p.list_len
    return out


def _is_int_like(v) -> bool:
    import numpy as np

    return isinstance(v, np.integer) or (type(v).__name__ == "SymInt")


def _check_int(op: str, p: Param, value):
    if type(value) is int:
        return value
    value = _value_of(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if _is_int_like(value):
        return int(value)
    from tilewise.tensor import Tensor

    if isinstance(value, Tensor) and value.ndim == 0 and not value.dtype.is_floating_point:
        return int(value.item())
    raise bad_argument(op, p.name, "int", value)


def _check_float(op: str, p: Param, value):
    if type(value) is float:
        return value
    value = _value_of(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    import numpy as np

    if isinstance(value, (np.floating, np.integer)):
        return float(value)
    raise bad_argument(op, p.name, "float", value)


def _check_scalar(op: str, p: Param, value):
    if type(value) is int or type(value) is float:
        return value
    value = _value_of(value)
    if isinstance(value, Number):
        import numpy as np

        # a numpy number is the Python number it holds (np.float64 is a float, yet formulas must not see its dtype)
        return value.item() if isinstance(value, np.generic) else value
    from tilewise.tensor import Tensor

    _refer_overloaded(value)
    if isinstance(value, Tensor) and value.ndim == 0:
        return value.item()
    raise bad_argument(op, p.name, "a number", value)


def _refer_overloaded(value) -> None:
    """A Tensor subclass instance, or with ``__torch_function__`` on, an object of a type that has one: the public
    function's own handler takes the call (see [Note: subclasses and __torch_function__] in overrides.py)."""
    from tilewise.tensor import Tensor

    if isinstance(value, Tensor):
        if type(value) is not Tensor:
            raise TorchFunctionRequest
    elif _TORCH_FUNCTION_STATE.disabled == 0 and hasattr(type(value), "__torch_function__"):
        raise TorchFunctionRequest


def _check_bool(op: str, p: Param, value):
    if value is True or value is False:
        return value
    value = _value_of(value)
    if isinstance(value, bool):
        return value
    import numpy as np

    if isinstance(value, np.bool_):
        return bool(value)
    raise bad_argument(op, p.name, "bool", value)


def _check_tensor(op: str, p: Param, value):
    if type(value) in _PYTHON_NUMBERS:
        return value
    from tilewise.tensor import Tensor

    if type(value) is Tensor:
        return value
    _refer_overloaded(value)
    import numpy as np

    if isinstance(value, np.generic):  # before Number: np.float64 is a float, yet formulas must not see its dtype
        # torch reads a numpy bool as the number 1.0 or 0.0 (``tensor([1, 2]) + np.bool_(True)`` is float)
        return float(value) if isinstance(value, np.bool_) else value.item()
    if isinstance(value, Number):
        return value
    raise bad_argument(op, p.name, "Tensor" if not p.optional else "Tensor or None", value)


def _check_tensor_list(op: str, p: Param, value):
    from tilewise.tensor import Tensor

    if isinstance(value, Tensor) or not isinstance(value, (list, tuple)):
        _refer_overloaded(value)
        raise ArgumentError(f"{op}(): argument '{p.name}' (position {p.position + 1}) must be tuple of Tensors, not "
                            f"{_type_name(value)}")
    for k, v in enumerate(value):
        if type(v) is Tensor:
            continue
        if isinstance(v, Tensor) or not (isinstance(v, Number) or (p.optional and v is None)):
            _refer_overloaded(v)
            raise ArgumentError(f"expected Tensor as element {k} in argument {p.position}, but got "
                                f"{_type_name(v)}")
    return tuple(value)


def _type_name(value) -> str:
    """A value's type as torch's argument errors name it: ``int``, ``list``, ``numpy.ndarray``."""
    from tilewise.tensor import Tensor

    kind = type(value)
    if isinstance(value, Tensor) or kind.__module__ == "builtins":
        return kind.__name__
    return f"{kind.__module__}.{kind.__qualname__}"


def _check_dtype(op: str, p: Param, value):
    from tilewise.dtypes import as_dtype

    try:
        return as_dtype(value)
    except TypeError:
        raise bad_argument(op, p.name, "a dtype", value) from None


def _check_device(op: str, p: Param, value):
    from tilewise.device import as_device

    try:
        return as_device(value)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"{op}(): argument '{p.name}': {exc}") from None


def _check_str(op: str, p: Param, value):
    if isinstance(value, str):
        return value
    raise bad_argument(op, p.name, "str", value)


def _passthrough(op: str, p: Param, value):
    return value


_generator_class: type | None = None  # ops.creation's Generator, registered where it is defined (it imports us)


def register_generator_class(cls: type) -> None:
    global _generator_class
    _generator_class = cls


def _check_generator(op: str, p: Param, value):
    if _generator_class is None or isinstance(value, _generator_class):
        return value
    raise bad_argument(op, p.name, "tilewise.Generator" + (" or None" if p.optional else ""), value)


def _check_memory_format(op: str, p: Param, value):
    from tilewise.layouts import format_name

    format_name(value, op)
    return value


_PYTHON_NUMBERS = (int, float, bool)

# Per parameter type, the test under which a value passes its checker unchanged: a binder tests it inline
# and calls the checker only for other values (``int`` excludes bool, which the int checker refuses).
_FAST_TYPES = {"Tensor": "is _Tensor", "int": "is int", "bool": "is bool", "str": "is str", "float": "is float",
               "Scalar": "in _PYTHON_NUMBERS"}

_CHECKERS = {
    "int": _check_int, "float": _check_float, "Scalar": _check_scalar, "bool": _check_bool,
    "Tensor": _check_tensor, "ScalarType": _check_dtype, "Device": _check_device, "str": _check_str,
    "Generator": _check_generator, "Layout": _passthrough, "MemoryFormat": _check_memory_format,
    "Any": _passthrough,  # a number or a string: linalg's matrix norm orders ('fro', 'nuc', 2, inf, ...)
}


def _checker_for(p: Param):
    if p.type == "Tensor" and p.is_list:
        return _check_tensor_list
    if p.type == "int" and p.is_list:
        return _as_int_list
    if p.is_list:
        return _passthrough
    return _CHECKERS[p.type]


def _varargs_param(schema: Schema, tensor_varargs: bool = False) -> int | None:
    """torch lets a required size/dims list after a tensor be spelled as varargs: x.view(2, 3), x.permute(1, 0);
    operators declared with ``varargs=True`` take their trailing tensor list so: meshgrid(x, y), einsum(eq, a, b)."""
    positional = [k for k, p in enumerate(schema.params) if not p.kwarg_only]
    if tensor_varargs:
        last = schema.params[positional[-1]]
        return positional[-1] if last.is_tensor_list and not last.has_default else None
    if len(positional) != 2 or not schema.params[0].is_tensor:
        return None
    p = schema.params[positional[1]]
    if p.type == "int" and p.is_list and p.list_len is None and not p.has_default:
        return positional[1]
    return None


# numpy's spellings that torch's argument parser accepts for these parameters (``x.sum(axis=0, keepdims=True)``,
# ``torch.sum(input=x)``), each a keyword of its own
NUMPY_ALIASES = {"dim": ("axis",), "keepdim": ("keepdims",), "self": ("input",)}


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def _aliases(schema: Schema, varargs: int | None) -> dict[int, tuple[str, ...]]:
    """Parameter position -> the numpy spellings it also answers to (those no other parameter is named)."""
    names = {p.name for p in schema.params}
    return {k: tuple(a for a in NUMPY_ALIASES[p.name] if a not in names) for k, p in enumerate(schema.params)
            if p.name in NUMPY_ALIASES and k != varargs}


def _alias_lines(op_name: str, name: str, aliases: tuple[str, ...], default_key: str | None,
                 out_needs_it: bool = False) -> list[str]:
    """Body lines that take ``name`` from whichever of its spellings was given (torch refuses two) and fall back
    to its default, or report it missing. With ``out_needs_it``, ``out=`` without ``name`` given is refused first."""
    lines = []
    for alias in aliases:
        lines += [f"    if {alias} is not _MISSING:",
                  f"        if {name} is not _MISSING:",
                  f"            raise TypeError(\"{op_name}() got an unexpected keyword argument '{alias}'\")",
                  f"        {name} = {alias}"]
    if out_needs_it:
        lines += [f"    if {name} is _MISSING and out is not None:",
                  f"        raise TypeError(\"{op_name}() got an unexpected keyword argument 'out' (torch's {op_name} "
                  f"takes out= only with '{name}' given)\")"]
    fallback = f"{name} = {default_key}" if default_key else \
        f"raise TypeError(\"{op_name}() missing 1 required positional argument: '{name}'\")"
    return lines + [f"    if {name} is _MISSING: {fallback}"]


def make_binder(schema: Schema, op_name: str | None = None, tensor_varargs: bool = False, dispatch: tuple = (),
                out_arg: tuple | None = None, out_needs: str | None = None):
    """A function with the schema's signature that returns the normalised arguments as a tuple; with
    ``dispatch=(call, op)`` it returns ``call(op, arguments)`` instead (an operator's public function, one
    Python frame shorter than a wrapper around the binder). With ``out_arg=(check, write, named)`` it takes a
    keyword ``out=`` too (see [Note: out= arguments] in ``ops/out_args.py``), and with ``out_needs`` (a parameter's
    name) only when that parameter is given, default or not: torch's ``sum(x, out=o)`` is refused where
    ``sum(x, None, out=o)`` is taken."""
    op_name = op_name or schema.name
    sig, body, ns = [], [], {"_MISSING": MISSING}
    star_done = False
    varargs = _varargs_param(schema, tensor_varargs)
    aliased = {k: a for k, a in _aliases(schema, varargs).items() if a}
    first_aliased = min(aliased, default=len(schema.params))
    needed = None
    if out_arg and out_needs is not None:  # told apart from its default as an aliased parameter is: MISSING until given
        needed = next(k for k, p in enumerate(schema.params) if p.name == out_needs and p.has_default)
        aliased.setdefault(needed, ())
    for k, p in enumerate(schema.params):
        if k in aliased or (k > first_aliased and not p.has_default and k != varargs and not p.kwarg_only):
            # a parameter after a now-optional one needs a default too: MISSING, checked in the body
            body += _alias_lines(op_name, p.name, aliased.get(k, ()), f"_d{k}" if p.has_default else None,
                                 out_needs_it=k == needed)
        if k == varargs and tensor_varargs:  # meshgrid(x, y), einsum(eq, a, b): no keyword spelling
            sig.append(f"*{p.name}")
            star_done = True
            packed = f"isinstance({p.name}[0], (list, tuple))" if p.is_list and p.type == "Tensor" else \
                f"not isinstance({p.name}[0], int)"
            body.append(f"    {p.name} = {p.name}[0] if len({p.name}) == 1 and {packed} else {p.name}")
        elif k == varargs:  # x.flip(1), x.flip([1]) or x.flip(dims=[1]); the list is required, even for a 0-d tensor
            sig += [f"*_v{k}", f"{p.name}=_MISSING"]
            star_done = True
            short_name = op_name.rpartition("::")[2]
            body += [f"    if _v{k}:",
                     f"        if {p.name} is not _MISSING:",
                     f"            raise TypeError(\"{short_name}() got multiple values for argument '{p.name}'\")",
                     f"        {p.name} = _v{k}[0] if len(_v{k}) == 1 and not isinstance(_v{k}[0], int) else _v{k}",
                     f"    elif {p.name} is _MISSING:",
                     f"        raise TypeError('{short_name}() missing 1 required positional arguments: \"{p.name}\"')"]
        elif p.kwarg_only and not star_done:
            sig.append("*")
            star_done = True
        if k == varargs:
            pass
        elif k in aliased or (k > first_aliased and not p.has_default and not p.kwarg_only):
            ns[f"_d{k}"] = p.default if p.has_default else None
            sig.append(f"{p.name}=_MISSING")
        elif p.has_default:
            ns[f"_d{k}"] = p.default
            sig.append(f"{p.name}=_d{k}")
        else:
            sig.append(p.name)
        ns[f"_c{k}"], ns[f"_p{k}"] = _checker_for(p), p
        check = f"_c{k}({op_name!r}, _p{k}, {p.name})"
        fast = _FAST_TYPES.get(p.type) if not p.is_list else None
        line = f"{p.name} if type({p.name}) {fast} else {check}" if fast else check
        if p.optional or (p.has_default and p.default is None):
            line = f"None if {p.name} is None else ({line})"
        body.append(f"    {p.name} = {line}")
    if (aliased or out_arg) and not star_done:
        sig.append("*")
    sig += [f"{a}=_MISSING" for k in sorted(aliased) for a in aliased[k]]
    names = ", ".join(p.name for p in schema.params)
    bound = f"({names}{',' if len(schema.params) == 1 else ''})"
    if dispatch:
        ns["_call"], ns["_op"] = dispatch
        if out_arg:
            sig.append("out=None")
            ns["_check_out"], ns["_write_out"], ns["_named"] = out_arg
            body.append("    if out is not None:")
            body.append(f"        _check_out({op_name!r}, {bound}, out)")
            body.append(f"        return _write_out({op_name!r}, _call(_op, {bound}), out, _named)")
        bound = f"_call(_op, {bound})"
    fn_name = op_name.rpartition("::")[2]  # a custom operator's own name, without its namespace
    fn_name = fn_name if fn_name.isidentifier() else "op"
    body.append(f"    return {bound}")
    if dispatch:  # a public function: it takes the calls that hold a subclass instance or a __torch_function__ object
        body = ["    try:", *(f"    {line}" for line in body), "    except _TorchFunctionRequest:",
                "        _given = _raw_call(_spec, locals())",  # handled past the except: no exception chained
                "    return _overridden(_entry, *_given)"]
        ns.update(_TorchFunctionRequest=TorchFunctionRequest, _overridden=overridden_call, _raw_call=raw_call)
        ns["_spec"] = _call_spec(schema, varargs, tensor_varargs, aliased, bool(out_arg), ns)
    src = f"def {fn_name}({', '.join(sig)}):\n" + "".join(f"{line}\n" for line in body)
    from tilewise.tensor import Tensor

    ns["_Tensor"], ns["_PYTHON_NUMBERS"] = Tensor, _PYTHON_NUMBERS
    exec(compile(src, f"<binder {schema.full_name}>", "exec"), ns)
    binder = ns[fn_name]
    binder.__source__ = src
    ns["_entry"] = binder  # what __torch_function__ is given as ``func``: the binder, or what the API wraps it in
    return binder


def set_torch_function_entry(binder, entry) -> None:
    """The public callable a binder's overrides are told of (``Tensor.add`` for the method's binder)."""
    binder.__globals__["_entry"] = entry


def _call_spec(schema: Schema, varargs: int | None, tensor_varargs: bool, aliased: dict, takes_out: bool,
               ns: dict) -> tuple:
    """How ``raw_call`` reads a binder's locals back into the call it was given: (name, how, default) per
    parameter, ``how`` one of positional, int varargs, tensor varargs, keyword; then the aliases and out=."""
    params = []
    for k, p in enumerate(schema.params):
        default = ns.get(f"_d{k}", MISSING) if p.has_default or k in aliased else MISSING
        how = ("tensor varargs" if tensor_varargs else "int varargs") if k == varargs else \
            "keyword" if p.kwarg_only else "positional"
        params.append((p.name, how, default, f"_v{k}", aliased.get(k, ())))
    return tuple(params), takes_out


def raw_call(spec: tuple, local: dict) -> tuple[tuple, dict]:
    """(args, kwargs) of the call a binder was given, read from its locals where a checker sent the call on (the
    values checked so far normalised, the rest as given; trailing defaults left out, as the caller most likely did)."""
    params, takes_out = spec
    given, kwargs, positional = [], {}, True  # given: (value, default) of the positional arguments
    for name, how, default, var, aliases in params:
        value = local.get(name, MISSING)
        for alias in aliases:
            if value is MISSING and local.get(alias, MISSING) is not MISSING:
                kwargs[alias] = local[alias]
        if how == "tensor varargs":
            given += [(v, MISSING) for v in value]
        elif how == "int varargs":
            if value is MISSING and local.get(var):
                given += [(v, MISSING) for v in local[var]]
            elif value is not MISSING:
                kwargs[name] = value
        elif how == "positional" and positional and value is not MISSING:
            given.append((value, default))
        else:
            positional = positional and how != "positional"
            if value is not MISSING and value is not default:
                kwargs[name] = value
    while given and given[-1][1] is not MISSING and given[-1][0] is given[-1][1]:
        given.pop()
    if takes_out and local.get("out") is not None:
        kwargs["out"] = local["out"]
    return tuple(v for v, _ in given), kwargs
