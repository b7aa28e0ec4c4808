"""The operator table: one ``OpDef`` per operator, built from one declaration.

[Note: operator declarations] ``declare(...)`` takes everything tilewise knows about an operator — schema,
kind, meaning (a scalar ``Expr`` for pointwise primitives, a combiner for reductions, stride arithmetic
for views), dtype rule, derivative formulas, decomposition — and derives the rest: the argument binder,
the public function, the Tensor method, operator dunders and the in-place variant. Derivative formulas
are strings in the style of PyTorch's derivatives.yaml (``"grad * result"``); they are compiled once into
Python functions over tilewise operators, so backward is itself differentiable and traceable, and the
names a formula reads tell autograd exactly which values to save: the arguments it names, and the outputs it
reads (only output k where it reads ``result[k]``, as torch saves ``result1`` of a batch norm and not its
output). Saving what torch saves is what makes torch's in-place idioms work and fail alike here
(``tests/test_trust_saved.py``). Backends look operators up here by name; nothing else keeps a list of
operators.

A forward-mode (tangent) rule sits beside the derivative, as derivatives.yaml's ``result:`` line: ``fwd=`` is a
formula over the arguments, their tangents ``<name>_t`` and ``result`` (``"self_t.matmul(other) +
self.matmul(other_t)"``), or ``"auto_linear"`` (the operator applied to the tangents) or
``"auto_element_wise"`` (the backward formula with the tangent for ``grad``). Without one it is derived from the
kind (see [Note: forward-mode AD] in ``autograd/forward_ad.py``).
"""

from __future__ import annotations

import ast
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from tilewise.dispatch import call as dispatch_call
from tilewise.ops.expr import Expr
from tilewise.ops.schema import Schema, make_binder, parse_schema
from tilewise.overrides import TorchFunctionRequest, overridden_call

FORWARD_AUTO = ("auto_linear", "auto_element_wise")
KINDS = ("pointwise", "reduction", "view", "composite", "creation", "random", "index", "matmul", "scan", "sort",
         "copy", "other", "custom")  # custom: registered at run time through tilewise.library (see its note)
AUTOCAST_POLICIES = ("lower", "fp32", "promote", "banned")  # see [Note: autocast] in amp/autocast_mode.py
AUTOCAST_DEVICE_TYPES = ("cuda", "cpu")  # torch keeps one list per device type; each declares its policy for both

_FORMULA_NAMESPACE: dict = {}
OPS: dict[str, OpDef] = {}  # full name (name or name.overload) -> OpDef
OVERLOADS: dict[str, list[OpDef]] = {}  # public name -> overloads in resolution order


@dataclass(eq=False)
class Formula:
    """A derivative formula: an expression over ``grad``, ``grads`` (zeros where no gradient reached an output),
    ``output_grads`` (None there), ``result`` and the op's arguments.
    ``outputs`` are the outputs it reads when it reads ``result`` only as ``result[k]`` with constant k (None:
    the whole result), so that an operator saves just those, as torch saves ``result1`` without ``result0``."""

    text: str
    uses: frozenset[str]
    fn: Callable
    outputs: frozenset[int] | None = None

    def __call__(self, env: dict):
        return self.fn(env)


def outputs_read(tree: ast.AST) -> frozenset[int] | None:
    """The k of every ``result[k]`` in a formula, or None where it reads ``result`` any other way."""
    subscripted, indices = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "result" \
                and isinstance(node.slice, ast.Constant) and type(node.slice.value) is int:
            subscripted.add(id(node.value))
            indices.add(node.slice.value)
    whole = any(isinstance(n, ast.Name) and n.id == "result" and id(n) not in subscripted for n in ast.walk(tree))
    return None if whole else frozenset(indices)


def compile_formula(text: str, param_names: tuple[str, ...]) -> Formula:
    code = compile(text, f"<derivative {text}>", "eval")
    names = set(code.co_names)
    env_names = ("grad", "grads", "output_grads", "result", *param_names, *(f"{p}_shape" for p in param_names),
                 *(f"{p}_geometry" for p in param_names))
    uses = frozenset(n for n in names if n in env_names)
    outputs = outputs_read(ast.parse(text, mode="eval")) if "result" in uses else frozenset()
    unpack = "".join(f"    {n} = env[{n!r}]\n" for n in sorted(uses))
    src = f"def _formula(env):\n{unpack}    return {text}\n"
    scope: dict = {}
    exec(compile(src, f"<derivative {text}>", "exec"), _FORMULA_NAMESPACE, scope)
    return Formula(text, uses, scope["_formula"], outputs)


def compile_forward_formula(text: str, schema: Schema) -> Formula | str:
    """A tangent formula reads the arguments, ``result`` and each tensor argument's tangent ``<name>_t`` (zeros
    where it has none)."""
    if text in FORWARD_AUTO:
        return text
    names = tuple(p.name for p in schema.params)
    return compile_formula(text, (*names, *(f"{p.name}_t" for p in schema.params if p.is_tensor or p.is_tensor_list)))


def joint_formula_output(formula: Formula, k: int) -> Formula:
    """Output ``k`` of a joint formula: ``grad={"input, weight, bias": "f(...)"}`` where ``f`` returns one
    gradient per listed input, as in derivatives.yaml. The tuple is computed once per backward call and kept in
    that call's environment, so inputs that share intermediate results do not recompute them."""
    def output(env):
        if formula not in env:
            env[formula] = formula(env)
        return env[formula][k]

    return Formula(f"({formula.text})[{k}]", formula.uses, output, formula.outputs)


_ARITHMETIC_KINDS = frozenset({"pointwise", "reduction", "matmul", "scan", "sort", "random", "other"})
_BYTEWISE_OPS = frozenset({"eq", "ne"})  # torch compares float8_e8m0fnu and float4_e2m1fn_x2 values bit for bit


@dataclass(eq=False)
class OpDef:
    schema: Schema
    kind: str
    dtype_rule: Callable | None = None
    expr: Expr | None = None
    derivatives: dict[str, Formula | None] = field(default_factory=dict)
    decomposition: Callable | None = None
    view: Callable | None = None
    reduce: str | None = None
    differentiable: bool = True
    nondiff_outputs: tuple[int, ...] = ()
    # device type -> one of AUTOCAST_POLICIES (or a function of the bound arguments naming one); None where no
    # device type has a policy (untouched by autocast). See autocast_policies.
    autocast: dict[str, str | Callable] | None = None
    forward: Formula | str | None = None  # the tangent rule: a Formula, one of FORWARD_AUTO, or None (derived)
    doc: str = ""
    binder: Callable = None
    tensor_idx: tuple[int, ...] = ()
    list_idx: tuple[int, ...] = ()
    saved_params: frozenset[str] = frozenset()
    saves_result: bool = False
    # a check of argument values that a dtype rule (kept per operand signature by the backends) cannot see, such
    # as the sign of a Python-number exponent; run by the dispatcher on every call, before any backend
    check: Callable | None = None
    # a composite of views and other operators, with no rule of its own for any dispatcher key: the dispatcher runs
    # its decomposition straight away (see [Note: inline composites] in dispatch.py)
    inline: bool = False
    attrs: dict = field(default_factory=dict)
    _param_names: tuple[str, ...] | None = field(default=None, repr=False)

    @cached_property  # read on every call by the dispatcher: after the first read, a plain attribute
    def arithmetic_tensor_idx(self) -> tuple[int, ...]:
        """The tensor arguments that may not be of a storage-only dtype (float8_e8m0fnu, float4_e2m1fn_x2: no
        arithmetic in torch): every tensor argument of an arithmetic operator; none for views, copies, casts
        and factories, nor for ``eq``/``ne``, which compare those values bit for bit."""
        if self.kind not in _ARITHMETIC_KINDS or self.schema.name in _BYTEWISE_OPS:
            return ()
        return self.tensor_idx

    @cached_property  # read on every call by backends and errors: after the first read, a plain attribute
    def name(self) -> str:
        return self.schema.name

    @cached_property
    def full_name(self) -> str:
        return self.schema.full_name

    def __call__(self, *args, **kwargs):
        return dispatch_call(self, self.binder(*args, **kwargs))

    def __repr__(self) -> str:
        return f"<op {self.schema.text}>"

    def param_names(self) -> tuple[str, ...]:
        names = self._param_names
        if names is None:
            names = self._param_names = tuple(p.name for p in self.schema.params)
        return names

    def expr_on(self, device_type: str) -> Expr | None:
        """The pointwise meaning on a device type: ``expr``, unless the declaration gives that device type its own
        (``expr_on={"cuda": ...}``, where torch's kernels there compute in another order)."""
        return self.attrs.get("expr_on", {}).get(device_type, self.expr)

    def differentiable_inputs(self) -> tuple[str, ...]:
        return tuple(name for name, f in self.derivatives.items() if f is not None)


def _symbolic_expr(fn: Callable, schema: Schema) -> Expr:
    """Call a pointwise meaning once on symbolic scalars named after the schema's parameters."""
    args, k = [], 0
    for p in schema.params:
        if p.type == "Tensor":
            args.append(Expr("input", (), k))
            k += 1
        else:
            args.append(Expr("scalar", (), p.name))
    return fn(*args)


def declare(schema: str, kind: str, *, expr: Callable | None = None, dtype: Callable | None = None,
            grad: dict[str, str | None] | None = None, decomposition: Callable | None = None,
            view: Callable | None = None, reduce: str | None = None, differentiable: bool | None = None,
            nondiff_outputs: tuple[int, ...] = (), autocast: str | None = None, fwd: str | None = None, doc: str = "",
            check: Callable | None = None, **attrs) -> OpDef:
    if kind not in KINDS:
        raise ValueError(f"unknown operator kind {kind!r}; kinds: {KINDS}")
    s = parse_schema(schema)
    autocast = autocast_policies(s.full_name, autocast)
    if s.full_name in OPS:
        raise ValueError(f"operator {s.full_name} declared twice")
    param_names = tuple(p.name for p in s.params)
    _check_half_rounded(s.full_name, attrs.get("half_rounded"), param_names)
    derivatives = {}
    for names, text in (grad or {}).items():
        formula = compile_formula(text, param_names) if text is not None else None
        targets = [n.strip() for n in names.split(",")]
        for k, name in enumerate(targets):
            if name not in param_names:
                raise ValueError(f"{s.full_name}: derivative given for unknown input {name!r}")
            derivatives[name] = formula if formula is None or len(targets) == 1 else joint_formula_output(formula, k)
    uses = frozenset().union(*(f.uses for f in derivatives.values() if f is not None)) if derivatives else frozenset()
    op = OpDef(
        schema=s, kind=kind, dtype_rule=dtype, derivatives=derivatives, decomposition=decomposition, view=view,
        reduce=reduce, differentiable=(bool(grad) or kind == "composite") if differentiable is None else differentiable,
        nondiff_outputs=nondiff_outputs, autocast=autocast, doc=doc, check=check, attrs=attrs,
        forward=compile_forward_formula(fwd, s) if fwd is not None else None,
        saved_params=frozenset(n for n in uses if n in param_names), saves_result="result" in uses,
    )
    if attrs.get("inline"):
        _check_inline(op)
        op.inline = True
    if expr is not None:
        op.expr = _symbolic_expr(expr, s)
    if "expr_on" in attrs:
        _check_device_types(s.full_name, "expr_on", attrs["expr_on"])
        attrs["expr_on"] = {device_type: _symbolic_expr(fn, s) for device_type, fn in attrs["expr_on"].items()}
    op.binder = make_binder(s, s.name, tensor_varargs=attrs.get("varargs", False))
    op.tensor_idx = tuple(k for k, p in enumerate(s.params) if p.is_tensor)
    op.list_idx = tuple(k for k, p in enumerate(s.params) if p.is_tensor_list)
    OPS[s.full_name] = op
    OVERLOADS.setdefault(s.name, []).append(op)
    return op


def _check_inline(op: OpDef) -> None:
    """An inline composite skips every dispatcher key but the profiler's, which is right only when no key would
    treat the operator itself other than by running its decomposition."""
    rules = {"a derivative": op.derivatives, "a tangent rule": op.forward, "an autocast policy": op.autocast,
             "an argument check": op.check, "a batching rule": op.attrs.get("batch"),
             "a decomposition": op.decomposition is None or None}
    given = [what for what, rule in rules.items() if rule]
    if op.kind != "composite" or given:
        raise ValueError(f"{op.full_name}: inline=True is for composites with no rule of their own, but it is a "
                         f"{op.kind} operator" + (f" with {', '.join(given)}" if given else ""))


def _check_device_types(name: str, what: str, declared) -> None:
    for device_type in declared or {}:
        if device_type not in AUTOCAST_DEVICE_TYPES:
            raise ValueError(f"{name}: {what} given for unknown device type {device_type!r}; device types: "
                             f"{AUTOCAST_DEVICE_TYPES}")


def _check_half_rounded(name: str, declared, param_names: tuple) -> None:
    """``half_rounded={device type: parameter names}`` (see [Note: half operands]) names known device types and
    parameters."""
    _check_device_types(name, "half_rounded", declared)
    for names in (declared or {}).values():
        unknown = [n for n in names if n not in param_names]
        if unknown:
            raise ValueError(f"{name}: half_rounded names unknown parameter(s) {unknown}; parameters: {param_names}")


def autocast_policies(name: str, autocast) -> dict[str, str | Callable] | None:
    """A declaration's ``autocast=`` as one policy per device type: a policy name (``"fp32"``) holds on every
    device type, a dict (``{"cuda": "fp32", "cpu": None}``) names each device type's, a device type left out having
    none; a function of (op, bound arguments) returning a policy name or None decides per call. None: no policy."""
    if autocast is None:
        return None
    given = autocast if isinstance(autocast, dict) else dict.fromkeys(AUTOCAST_DEVICE_TYPES, autocast)
    unknown = [d for d in given if d not in AUTOCAST_DEVICE_TYPES]
    if unknown:
        raise ValueError(f"{name}: autocast policy given for unknown device type(s) {unknown}; device types: "
                         f"{AUTOCAST_DEVICE_TYPES}")
    for device_type, policy in given.items():
        if policy is not None and not callable(policy) and policy not in AUTOCAST_POLICIES:
            where = f" for {device_type!r}" if isinstance(autocast, dict) else ""
            raise ValueError(f"{name}: unknown autocast policy {policy!r}{where}; policies: {AUTOCAST_POLICIES}, a "
                             "function of (op, args) naming one, or None; per device type, a dict such as "
                             "{'cuda': 'fp32', 'cpu': None}")
    policies = {d: p for d, p in given.items() if p is not None}
    return policies or None


def get(name: str) -> OpDef:
    op = OPS.get(name)
    if op is None:
        raise KeyError(f"no operator named {name!r}")
    return op


def call(name: str, *args, **kwargs):
    """Call an operator by name (resolving overloads), as the public function would."""
    return public_function(name)(*args, **kwargs)


def resolve(name: str, args: tuple, kwargs: dict):
    """Pick the overload whose schema accepts the call; return (op, bound arguments)."""
    overloads = OVERLOADS[name]
    if len(overloads) == 1:
        op = overloads[0]
        return op, op.binder(*args, **kwargs)
    errors = []
    for op in overloads:
        try:
            return op, op.binder(*args, **kwargs)
        except TypeError as exc:
            errors.append(f"  {op.schema.text}: {exc}")
    raise TypeError(f"{name}() received an invalid combination of arguments. Valid signatures:\n" + "\n".join(errors))


_PUBLIC: dict[str | tuple[str, str], Callable] = {}
_RETURN_TYPES: dict[str, type] = {}


def return_type(op: OpDef) -> type | None:
    """torch.return_types-style named tuple for operators whose schema names several results."""
    returns = op.schema.returns
    if len(returns) < 2 or not all(r.name for r in returns):
        return None
    cls = _RETURN_TYPES.get(op.full_name)
    if cls is None:
        cls = namedtuple(op.name, [r.name for r in returns])
        cls.__module__ = "tilewise.return_types"
        _RETURN_TYPES[op.full_name] = cls
    return cls


def public_function(name: str, out: bool = True) -> Callable:
    """The operator's public function (``tilewise.<name>``); with ``out=False`` one that takes no ``out=`` even where
    the operator has it (torch.nn.functional's Python functions: ``F.softmax`` beside ``torch.softmax``)."""
    key = name if out else (name, "without out")
    fn = _PUBLIC.get(key)
    if fn is not None:
        return fn
    overloads = OVERLOADS[name]
    named = {op: return_type(op) for op in overloads if return_type(op) is not None}
    from tilewise.ops.out_args import check_out_autograd, out_needs, takes_out, write_out

    if len(overloads) == 1 and not named:
        op = overloads[0]
        out_arg = (check_out_autograd, write_out, None) if out and takes_out(op) else None
        fn = make_binder(op.schema, op.name, op.attrs.get("varargs", False), dispatch=(dispatch_call, op),
                         out_arg=out_arg, out_needs=out_needs(op))
    else:
        needing = [op.full_name for op in overloads if out_needs(op)]
        if needing:
            raise ValueError(f"{', '.join(needing)}: out_needs= is for an operator of one overload (the binder of "
                             f"its public function tells a given argument from its default), but {name} has "
                             f"{len(overloads)}")
        with_out = {op for op in overloads if out and takes_out(op)}

        def fn(*args, out=None, **kwargs):
            try:
                op, bound = resolve(name, args, kwargs)
            except TorchFunctionRequest:  # see [Note: subclasses and __torch_function__] in overrides.py
                op = None
            if op is None:
                return overridden_call(fn, args, kwargs if out is None else {**kwargs, "out": out})
            cls = named.get(op)
            if out is not None:
                if op not in with_out:
                    raise TypeError(f"{name}() got an unexpected keyword argument 'out'")
                check_out_autograd(name, bound, out)
                return write_out(name, dispatch_call(op, bound), out, cls)
            result = dispatch_call(op, bound)
            return cls(*result) if cls is not None else result

    spelled = overloads[0].attrs.get("python_spelling")
    if spelled is not None:  # another way torch's Python function takes the arguments (einsum's sublists)
        fn = _respelled(fn, spelled)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = "\n".join(o.schema.text for o in overloads) + ("\n\n" + overloads[0].doc if overloads[0].doc else "")
    fn.__module__ = "tilewise"
    _PUBLIC[key] = fn
    return fn


def _respelled(fn: Callable, spelling: Callable) -> Callable:
    """A public function that takes its positional arguments as ``spelling`` rewrites them to the schema's."""
    def respelled(*args, **kwargs):
        return fn(*spelling(args), **kwargs)

    return respelled


def set_formula_namespace(namespace: dict) -> None:
    """Names derivative formulas may use (the public operators plus autograd helpers)."""
    _FORMULA_NAMESPACE.clear()
    _FORMULA_NAMESPACE.update(namespace)
