"""Function transforms with torch.func's names and semantics: grad, grad_and_value, vjp, jvp, jacrev, jacfwd,
hessian, functional_call (and vmap, from ``tilewise.func._vmap``).

[Note: function transforms] Each transform is ordinary autograd or forward-mode AD around the function, kept
apart from the caller's differentiation the way functorch's levels keep it:
  - reverse transforms (grad, vjp, jacrev) differentiate with respect to *fresh* tensors made for this call: a
    detached leaf for an input that nothing differentiates, else an alias (a view) whose node this call alone
    asks ``autograd.grad`` about; so a ``grad`` inside a ``grad`` differentiates its own inputs and the outer one
    differentiates through the inner's backward. A result is handed back detached (tangents kept) unless its
    graph reaches a tensor that is not this call's: then an outer transform, or the caller's autograd, still
    needs it. Nothing this call made requires grad afterwards.
  - forward transforms (jvp, jacfwd) open a forward-AD level of their own (``autograd.forward_ad``), so nested
    jvps carry separate tangents, and a level's tangents vanish when it closes.
Jacobians take one vjp per output element (jacrev) or one jvp per input element (jacfwd): exact, and fast for
the small functions these are meant for; batching them is vmap's job.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from tilewise.autograd import forward_ad
from tilewise.autograd import grad as autograd_grad
from tilewise.autograd.graph import AccumulateGrad
from tilewise.dispatch import STATE
from tilewise.func._pytree import tree_flatten, tree_unflatten
from tilewise.tensor import Tensor

__all__ = ["grad", "grad_and_value", "vjp", "jvp", "linearize", "jacrev", "jacfwd", "hessian", "functional_call",
           "stack_module_state", "replace_all_batch_norm_modules_", "vmap"]


def __getattr__(name: str):
    """``vmap`` lives in ``tilewise.func._vmap``; it is imported on first use."""
    if name == "vmap":
        from tilewise.func._vmap import vmap

        return vmap
    raise AttributeError(f"module 'tilewise.func' has no attribute {name!r}")


# ---------------------------------------------------------------------------- arguments

def _check_argnums(argnums, n_args: int) -> tuple[int, ...]:
    if isinstance(argnums, bool) or not isinstance(argnums, (int, tuple)):
        raise RuntimeError(f"argnums must be int or Tuple[int, ...], got: {type(argnums)}")
    many = isinstance(argnums, tuple)
    nums = argnums if many else (argnums,)
    if many and not nums:
        raise RuntimeError("argnums must be non-empty")
    for n in nums:
        if isinstance(n, bool) or not isinstance(n, int):
            raise RuntimeError(f"argnums must be int or Tuple[int, ...], got: {type(argnums)}")
        if not -n_args <= n < n_args:
            raise RuntimeError(f"Got argnum={n}, but only {n_args} positional inputs")
    normal = tuple(n % n_args for n in nums)
    if len(set(normal)) != len(normal):
        raise RuntimeError(f"argnums elements must be unique, got {argnums}")
    return normal


def _check_tensors(leaves: list) -> None:
    for leaf in leaves:
        if not isinstance(leaf, Tensor):
            raise ValueError(f"Thing passed to transform API must be Tensor, got {type(leaf)}")


def _selected(args: tuple, argnums):
    """The differentiated arguments: one argument, or a tuple of them for a tuple ``argnums``."""
    nums = _check_argnums(argnums, len(args))
    return tuple(args[n] for n in nums) if isinstance(argnums, tuple) else args[nums[0]], nums


def _replace(args: tuple, nums: tuple[int, ...], values, many: bool) -> tuple:
    new = list(args)
    for n, v in zip(nums, values if many else (values,)):
        new[n] = v
    return tuple(new)


# ---------------------------------------------------------------------------- this call's tensors

def _keep_tangents(source: Tensor, copy: Tensor) -> Tensor:
    tangents = source.__dict__.get("_tangents")
    if tangents:
        copy.__dict__["_tangents"] = dict(tangents)
    return copy


def _fresh_input(x: Tensor) -> Tensor:
    """A tensor this call differentiates with respect to: an alias that keeps the caller's graph, or a new leaf."""
    if x._requires_grad and STATE.grad_enabled:
        return x.view_as(x)
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise RuntimeError("only Tensors of floating point dtype can require gradients")
    return _keep_tangents(x, x.detach()).requires_grad_()


def _reaches_outside(t: Tensor, own: set) -> bool:
    """Whether ``t``'s graph reaches a tensor that is not one of this call's inputs (``own``: their nodes)."""
    seen, stack = set(), [t._grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in own or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AccumulateGrad):
            return True
        stack.extend(n for n, _ in node.next_functions)
    return False


def _own_nodes(fresh: list) -> set:
    """The leaves this call made: an alias of a caller's tensor is not one (what reaches it reaches the caller's)."""
    from tilewise.autograd.graph import accumulate_node

    return {accumulate_node(x) for x in fresh if x._grad_fn is None}


def _hand_back(value, own: set):
    """A result as the caller sees it: detached from this call's inputs unless it also depends on other tensors."""
    if not isinstance(value, Tensor):
        return value
    tangents = value.__dict__.get("_tangents")
    if tangents and any(t._requires_grad for t in tangents.values()):  # tangents computed from this call's inputs
        value = _keep_tangents(value, value.view_as(value) if value._requires_grad else value.detach())
        value.__dict__["_tangents"] = {level: _hand_back(t, own) for level, t in tangents.items()}
    if not value._requires_grad or (value._grad_fn is not None and _reaches_outside(value, own)):
        return value
    return _keep_tangents(value, value.detach())


def _hand_back_tree(tree, own: set):
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([_hand_back(v, own) for v in leaves], spec)


def _split_aux(output, has_aux: bool, api: str):
    if not has_aux:
        return output, None
    if not (isinstance(output, tuple) and len(output) == 2):
        raise RuntimeError(f"{api}: output of function f should be a tuple: (output, aux) if has_aux is True")
    return output


def _check_outputs(leaves: list, api: str) -> None:
    for leaf in leaves:
        if not isinstance(leaf, Tensor):
            raise RuntimeError(f"{api}: expected f(*primals) to return only tensors, got unsupported type "
                               f"{type(leaf)}")


# ---------------------------------------------------------------------------- grad, vjp

def grad_and_value(func: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """``(gradient, value)`` of a function returning a scalar tensor, with respect to ``args[argnums]``.

    >>> import tilewise as tw
    >>> g, v = tw.func.grad_and_value(lambda x: (x * x).sum())(tw.tensor([1.0, 2.0]))
    >>> g.tolist(), v.item()
    ([2.0, 4.0], 5.0)
    """

    @wraps(func)
    def wrapper(*args, **kwargs):
        api = "grad_and_value(f)(*args)"
        chosen, nums = _selected(args, argnums)
        leaves, spec = tree_flatten(chosen)
        _check_tensors(leaves)
        from tilewise.autograd.grad_mode import enable_grad

        with enable_grad():
            fresh = [_fresh_input(x) for x in leaves]
            many = isinstance(argnums, tuple)
            output = func(*_replace(args, nums, tree_unflatten(fresh, spec), many), **kwargs)
            output, aux = _split_aux(output, has_aux, api)
            if not isinstance(output, Tensor):
                raise RuntimeError(f"{api}: Expected f(*args) to return a Tensor, got {type(output)}")
            if output.dim() != 0:
                raise RuntimeError(f"{api}: Expected f(*args) to return a scalar Tensor, got tensor with "
                                   f"{output.dim()} dims. Maybe you wanted to use the vjp or jacrev APIs instead?")
            grads = _gradients([output], fresh, None, keep_graph=False)
        own = _own_nodes(fresh)
        result = _hand_back_tree(tree_unflatten(grads, spec), own)
        value = _hand_back(output, own)
        if has_aux:
            return result, (value, _hand_back_tree(aux, own))
        return result, value

    return wrapper


def grad(func: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """The gradient of a function returning a scalar tensor, with respect to ``args[argnums]`` (an int or a tuple
    of ints; each argument may be a tensor or a container of tensors, such as a dict of parameters).

    >>> import tilewise as tw
    >>> tw.func.grad(lambda x: x.sin().sum())(tw.tensor([0.0])).tolist()
    [1.0]
    """
    both = grad_and_value(func, argnums, has_aux)

    @wraps(func)
    def wrapper(*args, **kwargs):
        gradients, value = both(*args, **kwargs)
        return (gradients, value[1]) if has_aux else gradients

    return wrapper


def _gradients(outputs: list, inputs: list, cotangents, keep_graph: bool) -> list:
    """d outputs / d inputs (zeros for an input the outputs do not reach), differentiable where grad mode is on."""
    from tilewise.ops.creation import zeros_like

    found = autograd_grad(outputs, inputs, cotangents, retain_graph=True if keep_graph else None,
                          create_graph=True, allow_unused=True)
    return [g if g is not None else zeros_like(x) for g, x in zip(found, inputs)]


def vjp(func: Callable, *primals, has_aux: bool = False):
    """``(func(*primals), vjp_fn[, aux])``: ``vjp_fn(cotangents)`` gives the cotangents' pullback to each primal.

    >>> import tilewise as tw
    >>> out, pull = tw.func.vjp(lambda x: x * 3, tw.tensor([1.0]))
    >>> pull(tw.tensor([2.0]))[0].tolist()
    [6.0]
    """
    api = "vjp(f, *primals)"
    leaves, spec = tree_flatten(primals)
    _check_tensors(leaves)
    from tilewise.autograd.grad_mode import enable_grad

    with enable_grad():
        fresh = [_fresh_input(x) for x in leaves]
        output = func(*tree_unflatten(fresh, spec))
    output, aux = _split_aux(output, has_aux, api)
    out_leaves, out_spec = tree_flatten(output)
    _check_outputs(out_leaves, api)
    own = _own_nodes(fresh)

    def vjp_fn(cotangents):
        cot_leaves, cot_spec = tree_flatten(cotangents)
        if cot_spec != out_spec:
            raise RuntimeError(f"Expected pytree structure of cotangents to be the same as pytree structure of "
                               f"outputs to the function. cotangents: {cot_spec}, primal output: {out_spec}")
        for k, (c, o) in enumerate(zip(cot_leaves, out_leaves)):
            if c.shape != o.shape:
                raise RuntimeError(f"Mismatch in shape: grad_output[{k}] has a shape of {c.shape} and output[{k}] "
                                   f"has a shape of {o.shape}.")
        live = [(o, c) for o, c in zip(out_leaves, cot_leaves) if o._requires_grad]
        with enable_grad():
            if live:
                grads = _gradients([o for o, _ in live], fresh, [c for _, c in live], keep_graph=True)
            else:
                from tilewise.ops.creation import zeros_like

                grads = [zeros_like(x) for x in fresh]
        return _hand_back_tree(tree_unflatten(grads, spec), own)

    handed = _hand_back_tree(output, own)
    return (handed, vjp_fn, _hand_back_tree(aux, own)) if has_aux else (handed, vjp_fn)


# ---------------------------------------------------------------------------- jvp

def jvp(func: Callable, primals, tangents, *, strict: bool = False, has_aux: bool = False):
    """``(func(*primals), J tangents[, aux])`` by forward-mode AD.

    >>> import tilewise as tw
    >>> _, t = tw.func.jvp(lambda x: x * x, (tw.tensor([3.0]),), (tw.tensor([1.0]),))
    >>> t.tolist()
    [6.0]
    """
    api = "jvp(f, primals, tangents)"
    if not isinstance(primals, tuple):
        raise RuntimeError(f"{api}: Expected primals to be a tuple. E.g. it should be valid to call f(*primals).")
    p_leaves, p_spec = tree_flatten(primals)
    t_leaves, t_spec = tree_flatten(tangents)
    if p_spec != t_spec:
        raise RuntimeError(f"{api}: Expected primals and tangents to have the same python structure. For example, "
                           f"if primals is a tuple of 3 tensors, tangents also must be. Got primals with structure "
                           f"{p_spec} and tangents with structure {t_spec}")
    _check_tensors(p_leaves)
    _check_tensors(t_leaves)
    level = forward_ad.open_level()
    try:
        duals = [forward_ad.make_dual(p, t, level=level) for p, t in zip(p_leaves, t_leaves)]
        output = func(*tree_unflatten(duals, p_spec))
        output, aux = _split_aux(output, has_aux, api)
        out_leaves, out_spec = tree_flatten(output)
        _check_outputs(out_leaves, api)
        primal_out, tangent_out = [], []
        for o in out_leaves:
            p, t = forward_ad.unpack_dual(o, level=level)
            primal_out.append(p)
            tangent_out.append(t if t is not None else _zeros_like(p))
        aux = _without_level(aux, level) if has_aux else None
    finally:
        forward_ad.close_level(level)
    result = (tree_unflatten(primal_out, out_spec), tree_unflatten(tangent_out, out_spec))
    return (*result, aux) if has_aux else result


def linearize(func: Callable, *primals):
    """``(func(*primals), jvp_fn)``: ``jvp_fn(*tangents)`` is ``J tangents`` at ``primals``, each call a forward-mode
    pass of ``func`` (the tangents checked against the primals' structure, shapes, devices and dtypes, as torch's).

    >>> import tilewise as tw
    >>> out, jvp_fn = tw.func.linearize(lambda x: x.sin(), tw.zeros(2))
    >>> jvp_fn(tw.ones(2)).tolist()
    [1.0, 1.0]
    """
    output = func(*primals)
    flat_primals, primals_spec = tree_flatten(primals)
    # the primals as they are now: the jvps are taken where the function was linearised
    frozen = tree_unflatten([p.detach().clone() for p in flat_primals], primals_spec)

    def jvp_fn(*tangents):
        flat_tangents, tangents_spec = tree_flatten(tangents)
        if tangents_spec != primals_spec:
            raise RuntimeError(f"Expected the tangents {tangents_spec} to have the same argspec as the primals "
                               f"{primals_spec}")
        for idx, (t, p) in enumerate(zip(flat_tangents, flat_primals)):
            for what in ("shape", "device", "dtype"):
                if getattr(t, what) != getattr(p, what):
                    raise RuntimeError(f"tangent:{idx} with {what} {getattr(t, what)} in flattened pytree doesn't "
                                       f"match the {what} {getattr(p, what)} of the corresponding primal.")
        return jvp(func, frozen, tangents)[1]

    return output, jvp_fn


def _zeros_like(t: Tensor) -> Tensor:
    from tilewise.ops.creation import zeros_like

    return zeros_like(t)


def _without_level(tree, level: int):
    def strip(x):
        return forward_ad.unpack_dual(x, level=level).primal if isinstance(x, Tensor) else x

    leaves, spec = tree_flatten(tree)
    return tree_unflatten([strip(x) for x in leaves], spec)


# ---------------------------------------------------------------------------- Jacobians

def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1)


def jacrev(func: Callable, argnums=0, *, has_aux: bool = False, chunk_size: int | None = None,
           _preallocate_and_copy: bool = False) -> Callable:
    """The Jacobian of ``func`` with respect to ``args[argnums]`` by reverse mode: one vjp per output element.
    Each output's Jacobian has shape ``output.shape + input.shape``.

    >>> import tilewise as tw
    >>> tw.func.jacrev(lambda x: x * x)(tw.tensor([1.0, 2.0])).tolist()
    [[2.0, 0.0], [0.0, 4.0]]
    """
    if chunk_size is not None and chunk_size < 1:
        raise ValueError("jacrev: `chunk_size` should be greater than 0.")

    @wraps(func)
    def wrapper(*args, **kwargs):
        chosen, nums = _selected(args, argnums)
        many = isinstance(argnums, tuple)

        def inner(*picked):
            return func(*_replace(args, nums, picked if many else picked[0], many), **kwargs)

        found = vjp(inner, *(chosen if many else (chosen,)), has_aux=has_aux)
        output, pull = found[0], found[1]
        out_leaves, out_spec = tree_flatten(output)
        in_leaves, in_spec = tree_flatten(chosen if many else (chosen,))
        per_output = []
        for k, o in enumerate(out_leaves):
            rows = [[] for _ in in_leaves]
            for i in range(o.numel()):
                cot = [_zeros_like(x) for x in out_leaves]
                cot[k] = _flat(cot[k]).index_fill(0, _index(i, o), 1.0).reshape(o.shape)
                pulled, _ = tree_flatten(pull(tree_unflatten(cot, out_spec)))
                for r, g in zip(rows, pulled):
                    r.append(_flat(g))
            jac = tree_unflatten([_stack_rows(r, o, x) for r, x in zip(rows, in_leaves)], in_spec)
            per_output.append(jac if many else jac[0])  # an argument that is a dict of tensors keeps its keys
        result = tree_unflatten(per_output, out_spec)
        return (result, found[2]) if has_aux else result

    return wrapper


def _index(i: int, like: Tensor) -> Tensor:
    from tilewise.tensor import tensor

    return tensor([i], device=like.device)


def _stack_rows(rows: list, out: Tensor, x: Tensor) -> Tensor:
    from tilewise.ops.creation import zeros

    if not rows:
        return zeros((*out.shape, *x.shape), dtype=x.dtype, device=x.device)
    from tilewise.ops.registry import OPS

    return OPS["stack"](rows, 0).reshape(*out.shape, *x.shape)


def jacfwd(func: Callable, argnums=0, has_aux: bool = False, *, randomness: str = "error") -> Callable:
    """The Jacobian of ``func`` with respect to ``args[argnums]`` by forward mode: one jvp per input element.

    >>> import tilewise as tw
    >>> tw.func.jacfwd(lambda x: x.sin())(tw.tensor([0.0])).tolist()
    [[1.0]]
    """
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")

    @wraps(func)
    def wrapper(*args, **kwargs):
        chosen, nums = _selected(args, argnums)
        many = isinstance(argnums, tuple)
        in_leaves, in_spec = tree_flatten(chosen if many else (chosen,))
        _check_tensors(in_leaves)

        def inner(*leaves):
            picked = tree_unflatten(list(leaves), in_spec)
            return func(*_replace(args, nums, picked if many else picked[0], many), **kwargs)

        columns: list = [[] for _ in in_leaves]
        output = aux = None
        for j, x in enumerate(in_leaves):
            for i in range(x.numel()):
                tangents = [_zeros_like(y) for y in in_leaves]
                tangents[j] = _flat(tangents[j]).index_fill(0, _index(i, x), 1.0).reshape(x.shape)
                found = jvp(inner, tuple(in_leaves), tuple(tangents), has_aux=has_aux)
                output, aux = found[0], (found[2] if has_aux else None)
                columns[j].append(found[1])
        if output is None:  # every input is empty: one call for the output's structure
            found = jvp(inner, tuple(in_leaves), tuple(_zeros_like(y) for y in in_leaves), has_aux=has_aux)
            output, aux = found[0], (found[2] if has_aux else None)
        out_leaves, out_spec = tree_flatten(output)
        per_output = []
        for k, o in enumerate(out_leaves):
            jac = []
            for j, x in enumerate(in_leaves):
                cols = [_flat(tree_flatten(c)[0][k]) for c in columns[j]]
                jac.append(_stack_columns(cols, o, x))
            picked = tree_unflatten(jac, in_spec)
            per_output.append(picked if many else picked[0])
        result = tree_unflatten(per_output, out_spec)
        return (result, aux) if has_aux else result

    return wrapper


def _stack_columns(cols: list, out: Tensor, x: Tensor) -> Tensor:
    from tilewise.ops.creation import zeros
    from tilewise.ops.registry import OPS

    if not cols:
        return zeros((*out.shape, *x.shape), dtype=out.dtype, device=out.device)
    return OPS["stack"](cols, -1).reshape(*out.shape, *x.shape)


def hessian(func: Callable, argnums=0) -> Callable:
    """The Hessian of a scalar function: ``jacfwd(jacrev(func, argnums), argnums)``, as torch.func's.

    >>> import tilewise as tw
    >>> tw.func.hessian(lambda x: (x ** 3).sum())(tw.tensor([1.0, 2.0])).tolist()
    [[6.0, 0.0], [0.0, 12.0]]
    """
    return jacfwd(jacrev(func, argnums), argnums)


# ---------------------------------------------------------------------------- modules

def functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *, tie_weights: bool = True,
                    strict: bool = False):
    """Call ``module`` with its parameters and buffers replaced, for this call only, by the tensors given by
    name (a dict, or a tuple of dicts), as torch.func.functional_call.

    >>> import tilewise as tw
    >>> lin = tw.nn.Linear(2, 1)
    >>> params = {"weight": tw.ones(1, 2), "bias": tw.zeros(1)}
    >>> tw.func.functional_call(lin, params, (tw.tensor([1.0, 2.0]),)).tolist()
    [3.0]
    """
    from tilewise.func._stateless import reparametrized

    if isinstance(parameter_and_buffer_dicts, dict):
        values = parameter_and_buffer_dicts
    else:
        values = {}
        for d in parameter_and_buffer_dicts:
            repeated = [k for k in d if k in values]
            if repeated:
                raise ValueError(f"{repeated} appeared in multiple dictionaries; behavior of functional call is "
                                 "ambiguous")
            values.update(d)
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with reparametrized(module, values, tie_weights=tie_weights, strict=strict):
        return module(*args, **(kwargs or {}))


def replace_all_batch_norm_modules_(root):
    """Every batch norm of ``root`` (``root`` included) made to normalise by its batch's statistics alone, in
    place: no running statistics to update (which a vmapped call could not write), as torch.func's."""
    from tilewise.nn.modules.normalization import _BatchNorm

    for module in root.modules():
        if isinstance(module, _BatchNorm) and module.track_running_stats:
            module.running_mean = module.running_var = module.num_batches_tracked = None
            module.track_running_stats = False
    return root


def stack_module_state(models) -> tuple[dict, dict]:
    """The parameters and buffers of several models of one class, each name's tensors stacked along a new first
    dim (torch.func.stack_module_state): what ``vmap`` over ``functional_call`` of one base model takes to run
    them all as an ensemble. Stacked parameters are fresh leaves that require grad where the models' did."""
    if len(models) == 0:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if not (all(m.training for m in models) or all(not m.training for m in models)):
        raise RuntimeError("stack_module_state: Expected all models to have the same training/eval mode.")
    first = type(models[0])
    if not all(type(m) is first for m in models):
        raise RuntimeError("stack_module_state: Expected all models to be of the same class.")
    all_params = [dict(model.named_parameters()) for model in models]
    params = {k: _stacked_leaf([p[k] for p in all_params], k) for k in all_params[0]}
    all_buffers = [dict(model.named_buffers()) for model in models]
    buffers = {k: _stacked_leaf([b[k] for b in all_buffers], k) for k in all_buffers[0]}
    return params, buffers


def _stacked_leaf(tensors: list, name: str) -> Tensor:
    from tilewise.ops.nn_functional import call_public

    requiring = [t.requires_grad for t in tensors]
    if any(requiring) and not all(requiring):
        raise RuntimeError(f"Expected {name} from each model to have the same .requires_grad")
    result = call_public("stack", tensors)
    return result.detach().requires_grad_() if all(requiring) else result
