"""Every declared operator has every rule its kind needs, and every public operator is in the test table."""

from __future__ import annotations

import dis

import pytest
from test_ops import OPINFOS

import tilewise  # noqa: F401 — loads every declaration
from tilewise.autograd.forward_ad import forward_rule_kind
from tilewise.backends.cpu import KERNELS
from tilewise.ops.registry import _FORMULA_NAMESPACE, OPS, Formula

# operators whose behaviour is random or creates tensors from sizes: tested in test_creation_random.py
NOT_IN_TABLE = {"full", "empty", "arange", "linspace", "eye", "_to_copy", "_write_", "uniform", "normal_sample",
                "randint", "bernoulli", "bernoulli.p", "randperm", "multinomial", "view_scatter_add", "view_scatter",
                "rsub", "rdiv", "rpow", "rmatmul", "gelu_backward", "dropout", "index.Tensor", "gumbel_softmax"}
# operators on float8 operands, which the table's samples do not make: tested against torch in test_scaled_mm.py
NOT_IN_TABLE |= {"_scaled_mm"}
# samplers whose draws cannot equal torch's (another generator): tested by their distributions in test_breadth35.py
NOT_IN_TABLE |= {"poisson", "binomial"}


def _ids(ops):
    return [op.full_name for op in ops]


ALL = list(OPS.values())


@pytest.mark.parametrize("op", ALL, ids=_ids(ALL))
def test_operator_has_rules_for_its_kind(op):
    if op.kind == "pointwise":
        assert op.expr is not None or "expr_builder" in op.attrs, "pointwise op without a scalar meaning"
        assert op.dtype_rule is not None, "pointwise op without a dtype rule"
    elif op.kind == "view":
        assert op.view is not None, "view op without a stride rule"
    elif op.kind == "composite":
        assert op.decomposition is not None, "composite op without a decomposition"
    elif op.kind == "reduction":
        assert op.reduce is not None or op.full_name in KERNELS, "reduction without a combiner or CPU kernel"
    elif op.kind == "custom":  # tilewise.library: its kernels by device type and the fake that types it in graphs
        custom = op.attrs["custom"]
        assert "cpu" in custom._kernels, "custom op without a CPU kernel"
        assert custom._fake is not None, "custom op without a fake implementation"
    else:
        assert op.full_name in KERNELS or op.decomposition is not None, f"{op.kind} op without a CPU kernel"


@pytest.mark.parametrize("op", ALL, ids=_ids(ALL))
def test_differentiable_primitives_cover_every_tensor_input(op):
    if not op.differentiable or (op.kind == "composite" and not op.derivatives) or op.kind == "custom":
        return  # a custom operator's backward is registered as a function (register_autograd), not per input
    missing = [p.name for p in op.schema.tensor_params if p.name not in op.derivatives]
    assert not missing, f"no derivative entry (a formula, or None for non-differentiable) for inputs {missing}"


@pytest.mark.parametrize("op", [o for o in ALL if o.derivatives], ids=_ids([o for o in ALL if o.derivatives]))
def test_derivative_formulas_only_use_known_names(op):
    env = {"grad", "grads", "result", *op.param_names(), *(f"{p}_shape" for p in op.param_names())}
    for name, formula in op.derivatives.items():
        if formula is None:
            continue
        names = {i.argval for i in dis.get_instructions(formula.fn) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        unknown = {n for n in names if n not in env and n not in _FORMULA_NAMESPACE and n not in dir(__builtins__)}
        assert not unknown, f"derivative of {name} uses unknown names {unknown}: {formula.text}"


# Operators whose tangents still come from the transposed backward formula (see [Note: forward-mode AD] in
# autograd/forward_ad.py): exact, but a second backward per call. The list only shrinks: give an operator a
# ``fwd=`` rule beside its derivative (a formula, "auto_linear" or "auto_element_wise") and take it off.
TRANSPOSED_FORWARD: set[str] = set()


@pytest.mark.parametrize("op", ALL, ids=_ids(ALL))
def test_differentiable_operators_have_a_forward_rule(op):
    kind = forward_rule_kind(op)
    has_derivative = any(f is not None for f in op.derivatives.values())
    if has_derivative:
        assert kind is not None, "an operator with a derivative but no forward (tangent) rule"
    if kind == "transposed":
        assert op.full_name in TRANSPOSED_FORWARD, (
            "a new differentiable operator needs a forward rule beside its derivative: fwd='auto_linear' (linear in "
            "its inputs), 'auto_element_wise' (pointwise), or a formula over the arguments, their tangents <name>_t "
            "and result")
    else:
        assert op.full_name not in TRANSPOSED_FORWARD, "has its own forward rule now: take it off TRANSPOSED_FORWARD"


def test_forward_formulas_only_use_known_names():
    for op in ALL:
        if not isinstance(op.forward, Formula):
            continue
        params = op.param_names()
        env = {"result", *params, *(f"{p}_t" for p in params), *(f"{p}_shape" for p in params)}
        names = {i.argval for i in dis.get_instructions(op.forward.fn) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        unknown = {n for n in names if n not in env and n not in _FORMULA_NAMESPACE and n not in dir(__builtins__)}
        assert not unknown, f"{op.full_name}: forward formula uses unknown names {unknown}: {op.forward.text}"


def test_every_public_operator_is_in_the_table():
    covered = set()
    for info in OPINFOS:
        covered.add(info.name)
        covered.add(info.name.replace(".", "_"))  # linalg.solve is the operator linalg_solve
        covered.update(info.covers)
        if info.torch_name:
            covered.add(info.torch_name)
    missing = []
    for op in ALL:
        if not op.attrs.get("public", True) or op.full_name in NOT_IN_TABLE or op.name in NOT_IN_TABLE:
            continue
        if op.name not in covered and op.full_name not in covered:
            missing.append(op.full_name)
    assert not missing, f"operators without OpInfo samples: {sorted(missing)}"


# operators that vmap runs one example at a time (with torch's performance warning): shrink this list
BATCHING_FALLBACKS = {"bincount", "histc"}


@pytest.mark.parametrize("op", ALL, ids=_ids(ALL))
def test_operator_has_a_batching_rule(op):
    from tilewise.ops.batching import has_batching_rule, loop, rule_of

    if op.kind == "custom":  # registered at run time by users: its own batch= rule, else the loop
        assert rule_of(op) is not None
    elif op.full_name in BATCHING_FALLBACKS:
        assert rule_of(op) is loop, f"{op.full_name} has a batching rule now: remove it from BATCHING_FALLBACKS"
    else:
        assert has_batching_rule(op), (f"{op.full_name} ({op.kind}) has no batching rule: declare one with "
                                       "batch=... (see ops/batching.py) or derive it from its kind")

