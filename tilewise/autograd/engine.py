"""The backward engine: dependency-counted traversal of the graph from the roots.

[Note: engine] Gradients for a node are buffered per output until every edge into it has delivered, so
each node runs exactly once with its complete gradient (the same contract as torch's engine). Tensor
hooks and ``retain_grad`` fire on that complete gradient. ``autograd.grad`` captures the gradient that
reaches each requested input instead of accumulating into ``.grad``, and runs only the nodes from which
a requested input can be reached. With ``create_graph=True`` the formulas run in grad mode, so the
gradients carry their own graph (higher-order derivatives); otherwise saved tensors are freed as each
node finishes unless ``retain_graph`` is set. Callbacks queued while a backward runs
(``Variable._execution_engine.queue_callback``) run once its last node has finished, before it returns; a
callback may queue more. DistributedDataParallel waits for its gradient all-reduces there.
"""

from __future__ import annotations

from tilewise import dispatch
from tilewise.autograd.anomaly_mode import ANOMALY, check_node_outputs
from tilewise.autograd.graph import (
    GRAPH_TASKS,
    NODE_POST,
    NODE_PRE,
    AccumulateGrad,
    GraphTask,
    Node,
    accumulate_node,
    edge,
    forward_stack_warning,
)
from tilewise.config import settings
from tilewise.dispatch import STATE
from tilewise.tensor import TRACE_HOOKS, Tensor

# the profiler's ranges around a node's work (``autograd::engine::evaluate_function: MmBackward0`` holding
# ``MmBackward0``, as torch names them): ``profile_node(name)`` is a context manager, filled by the profiler
profile_node = None


def register_node_profiler(fn) -> None:
    global profile_node
    profile_node = fn


# the compiled replay of a whole backward ([Note: compiled backward] in compiler/backward.py), registered by the
# compiler: ``graph_runner(root_edges, grad_tensors, retain_graph)`` -> True when it ran the pass
graph_runner = None


def register_graph_runner(fn) -> None:
    global graph_runner
    graph_runner = fn


class ExecutionEngine:
    """torch's ``Variable._execution_engine``: the hook into the running backward pass."""

    def queue_callback(self, callback) -> None:
        """Run ``callback()`` once the innermost running backward pass has finished every node."""
        if not GRAPH_TASKS.running:
            raise RuntimeError("Final callbacks can only be installed during backward pass.")
        GRAPH_TASKS.running[-1].callbacks.append(callback)


def _run_final_callbacks(callbacks: list) -> None:
    k = 0
    while k < len(callbacks):  # a callback may queue another, which runs in this same pass
        callbacks[k]()
        k += 1


def _apply(node: Node, grads: list) -> list:
    if dispatch.profiling and profile_node is not None:
        with profile_node(node.name()):
            return node.apply(grads)
    return node.apply(grads)


def _dependencies(roots: list[Node]) -> dict[Node, int]:
    deps: dict[Node, int] = {}
    seen = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if nxt is not None:
                deps[nxt] = deps.get(nxt, 0) + 1
                stack.append(nxt)
    return deps


def _reaching(roots: list[Node], targets: set[Node]) -> set[Node]:
    """Nodes with an edge on a path to some target node, by iterative post-order DFS: the nodes ``autograd.grad`` must
    run. A target is captured where its gradient arrives, so it runs only when another target lies beyond it (as in
    torch; its own graph may be freed already)."""
    reaches: dict[Node, bool] = {}
    stack = [(n, False) for n in roots]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            reaches[node] = any(n in targets or reaches.get(n, False) for n, _ in node.next_functions
                                if n is not None)
            continue
        if node in reaches:
            continue
        reaches[node] = False  # provisional; the graph is acyclic, so this is never read before it is set
        stack.append((node, True))
        stack.extend((n, False) for n, _ in node.next_functions if n is not None and n not in reaches)
    return {n for n, ok in reaches.items() if ok}


def _hook_result(hook, grad: Tensor, new):
    """A tensor hook's replacement gradient, which must be a tensor like the one it was given (torch's rule)."""
    name = getattr(hook, "__name__", type(hook).__name__)
    if not isinstance(new, Tensor):
        raise TypeError(f"expected Variable, but hook returned '{type(new).__name__}' (hook '{name}' must return None "
                        f"or a tensor of the gradient's shape {list(grad.shape)} and dtype {grad.dtype.name})")
    if new.shape != grad.shape:
        raise RuntimeError(f"hook '{name}' has changed the size of value: the gradient of shape {list(grad.shape)} "
                           f"was replaced by one of shape {list(new.shape)}")
    if new.dtype is not grad.dtype:
        raise RuntimeError(f"hook '{name}' has changed the type of value (was {grad.dtype.name} got "
                           f"{new.dtype.name})")
    if new.device != grad.device:
        raise RuntimeError(f"hook '{name}' has changed the device of value (was {grad.device} got {new.device})")
    return new


def _run_hooks(node: Node, grads: list, runs: bool) -> list:
    """torch's order before a node runs: the tensor hooks of each output, retain_grad, then the node's pre-hooks
    (an AccumulateGrad's pre-hooks run after its leaf's hooks, in the engine's accumulate step). A node that
    ``autograd.grad`` does not run (``runs`` false: its gradient is captured, nothing it leads to is asked for) has
    its tensors' hooks run but not its own, as in torch."""
    for nr, hooks in node.pre_hooks.items():
        if type(nr) is not int or grads[nr] is None:
            continue
        for hook in list(hooks):
            new = hook(grads[nr])
            if new is not None:
                grads[nr] = _hook_result(hook, grads[nr], new)
    for nr, ref in node.retained.items():
        t = ref()
        if t is not None and grads[nr] is not None:
            g = grads[nr].detach()
            t._grad = g.clone() if t._grad is None else t._grad + g
    node_hooks = node.pre_hooks.get(NODE_PRE)
    if node_hooks and runs and not isinstance(node, AccumulateGrad):
        grads = _node_hook_grads(node_hooks, (tuple(grads),), list(grads))
    return grads


def _node_hook_grads(hooks: list, args: tuple, grads: list) -> list:
    """Run a node's own hooks on ``args``; what one returns (a tuple, one gradient or None per entry) replaces the
    gradients it was given, which the next hook then sees, as in torch."""
    for hook in list(hooks):
        new = hook(*args)
        if new is None:
            continue
        if not isinstance(new, (tuple, list)):
            raise TypeError(f"expected tuple, but hook returned '{type(new).__name__}'")
        if len(new) != len(grads):
            raise RuntimeError(f"hook '{getattr(hook, '__name__', type(hook).__name__)}' has returned an incorrect "
                               f"number of values (got {len(new)}, but expected {len(grads)})")
        grads = [n if n is None or g is None else _hook_result(hook, g, n) for g, n in zip(grads, new)]
        args = (tuple(grads), *args[1:])
    return grads


def _leaf_hooks(t: Tensor, grad):
    for hook in list(t._hooks or ()):
        new = hook(grad)
        if new is not None:
            grad = _hook_result(hook, grad, new)
    return grad


def run_backward(tensors, grad_tensors, *, retain_graph: bool, create_graph: bool, inputs=None,
                 allow_unused: bool = False, accumulate: bool = True):
    root_edges = []
    for k, t in enumerate(tensors):
        e = edge(t)
        if e[0] is None:
            raise RuntimeError(f"element {k} of tensors does not require grad and does not have a grad_fn")
        root_edges.append(e)
    captures: dict[tuple, list[int]] = {}
    input_edges = []
    for k, x in enumerate(inputs or ()):
        e = edge(x)
        if e[0] is None and type(x) is Tensor and x.requires_grad:  # through its base alone: no edge leads to it,
            e = (accumulate_node(x), 0)  # so it is unused, as in torch
        elif e[0] is None:
            raise RuntimeError(f"One of the differentiated Tensors (input {k}) does not require grad")
        input_edges.append(e)
        captures.setdefault((e[0], e[1]), []).append(k)
    captured: list = [None] * len(input_edges)

    if (settings.compiled_backward and graph_runner is not None and inputs is None and accumulate
            and not create_graph and not STATE.trace_depth and not STATE.vmap and not dispatch.dual_levels
            and not dispatch.profiling and not ANOMALY.enabled
            and graph_runner(root_edges, grad_tensors, retain_graph)):
        return captured
    roots = [e[0] for e in root_edges]
    deps = _dependencies(roots)
    if STATE.trace_depth and TRACE_HOOKS.backward_started is not None:
        TRACE_HOOKS.backward_started(tensors, [*roots, *deps])
    needed = _reaching(roots, {e[0] for e in input_edges}) if inputs is not None else None
    buffers: dict[Node, list] = {}
    for (node, nr), g in zip(root_edges, grad_tensors):
        buf = buffers.setdefault(node, [None] * node.n_outputs)
        buf[nr] = g if buf[nr] is None else buf[nr] + g
    ready = [n for n in dict.fromkeys(roots) if deps.get(n, 0) == 0]

    prev_mode, prev_autocast = STATE.grad_enabled, STATE.autocast
    STATE.grad_enabled = create_graph
    STATE.autocast = None  # the casts recorded in forward already fix every dtype backward sees, as in torch
    GRAPH_TASKS.running.append(GraphTask(deps, roots, needed, captures, accumulate))
    node = None  # the node running, for anomaly mode's warning if it fails
    try:
        while ready:
            node = ready.pop()
            grads = buffers.pop(node, None) or [None] * node.n_outputs
            hooked = node.pre_hooks or node.retained  # one test for every kind of hook (see Node.pre_hooks)
            run_it = needed is None or node in needed
            if hooked:
                grads = _run_hooks(node, grads, run_it)
            if captures:
                for nr, g in enumerate(grads):
                    for k in captures.get((node, nr), ()):
                        captured[k] = g if captured[k] is None or g is None else captured[k] + g
            if isinstance(node, AccumulateGrad):
                if accumulate and (inputs is None or (node, 0) in captures):
                    g, grads[0] = grads[0], None  # held by ``g`` alone: accumulate may take it as .grad
                    if g is not None:
                        g = _leaf_hooks(node.variable, g)
                        if hooked and NODE_PRE in node.pre_hooks:
                            g = _node_hook_grads(node.pre_hooks[NODE_PRE], ((g,),), [g])[0]
                        if (node, 0) in captures:
                            for k in captures[(node, 0)]:
                                captured[k] = g
                    if dispatch.profiling and profile_node is not None:
                        with profile_node("torch::autograd::AccumulateGrad"):
                            node.accumulate(g, create_graph)
                    else:
                        node.accumulate(g, create_graph)
                    for hook in node.variable.__dict__.get("_post_accumulate_grad_hooks", ()):
                        hook(node.variable)
                    if hooked and NODE_POST in node.pre_hooks:
                        _node_hook_grads(node.pre_hooks[NODE_POST], ((), (g,)), [])
                elif grads[0] is not None and node.variable._hooks:
                    g = _leaf_hooks(node.variable, grads[0])
                    for k in captures.get((node, 0), ()):
                        captured[k] = g
                continue
            in_grads = _apply(node, grads) if run_it else [None] * len(node.next_functions)
            if ANOMALY.enabled and ANOMALY.check_nan and run_it:
                check_node_outputs(node, in_grads)
            if hooked and run_it and NODE_POST in node.pre_hooks:
                in_grads = _node_hook_grads(node.pre_hooks[NODE_POST], (tuple(in_grads), tuple(grads)),
                                            list(in_grads))
            if not retain_graph and run_it:
                node.release()
            for (nxt, nr), g in zip(node.next_functions, in_grads):
                if nxt is None:
                    continue
                if g is not None:
                    buf = buffers.setdefault(nxt, [None] * nxt.n_outputs)
                    buf[nr] = g if buf[nr] is None else buf[nr] + g
                deps[nxt] -= 1
                if deps[nxt] == 0:
                    ready.append(nxt)
            in_grads = g = buf = None  # the buffers alone hold the gradients now (see AccumulateGrad.accumulate)
        node = None
        STATE.grad_enabled, STATE.autocast = prev_mode, prev_autocast
        _run_final_callbacks(GRAPH_TASKS.running[-1].callbacks)
    except BaseException:
        if ANOMALY.enabled and node is not None:
            forward_stack_warning(node)
        raise
    finally:
        STATE.grad_enabled, STATE.autocast = prev_mode, prev_autocast
        GRAPH_TASKS.running.pop()
    if inputs is not None and not allow_unused:
        for k, g in enumerate(captured):
            if g is None and accumulate is False:
                raise RuntimeError(f"The differentiated Tensor at index {k} appears to not have been used in the "
                                   "graph. Set allow_unused=True if this is the desired behavior.")
    return captured
