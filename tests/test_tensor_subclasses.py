"""Tensor subclasses and the ``__torch_function__`` protocol, each scenario run with torch and with tilewise and
compared: the types results come back as, the values, the functions an override is told of, the switches that
turn overrides off, duck types, autograd through a subclass, pickling and copying, and the compiler's refusal."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import tilewise as tw

LIBS = {"torch": torch, "tilewise": tw}


def _disable_subclass(lib):
    return lib._C.DisableTorchFunctionSubclass()


def _disable_all(lib):
    return lib._C.DisableTorchFunction()


def _subclasses(lib):
    """A plain subclass, one that records what its override is given, and one that refuses everything."""

    class Tagged(lib.Tensor):
        pass

    class Logged(lib.Tensor):
        calls: list = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.calls.append((getattr(func, "__name__", None), [t.__name__ for t in types]))
            return super().__torch_function__(func, types, args, kwargs)

    class Refusing(lib.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return NotImplemented

    return Tagged, Logged, Refusing


def _both(scenario):
    """The scenario's result with torch and with tilewise (tensors as nested lists, types by name)."""
    return tuple(_plain(scenario(lib)) for lib in (torch, tw))


def _plain(value):
    if isinstance(value, (torch.Tensor, tw.Tensor)):
        values = np.asarray(value.detach().as_subclass(type(value).__mro__[-2]).tolist(), dtype=float)
        return type(value).__name__, np.round(values, 5).tolist()  # values to float32's precision
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, type):
        return value.__name__
    return value


def _assert_same(scenario):
    theirs, ours = _both(scenario)
    assert ours == theirs


# ------------------------------------------------------------------ making subclass instances
def test_making_subclass_instances():
    def scenario(lib):
        tagged, _, _ = _subclasses(lib)
        x = lib.tensor([1.0, 2.0])
        made = lib.Tensor._make_subclass(tagged, x, True)
        alias = tagged(x)
        alias[0] = 5.0  # T(tensor) is an alias of its memory
        return {"as_subclass": type(x.as_subclass(tagged)), "T(list)": type(tagged([1.0, 2.0])),
                "T()": [type(tagged()), list(tagged().shape)],
                "T(2, 3)": [type(tagged(2, 3)), list(tagged(2, 3).shape)],
                "_make_subclass": [type(made), made.requires_grad, made.is_leaf], "x after T(x) write": x.tolist(),
                "isinstance": [isinstance(made, lib.Tensor), isinstance(x, tagged), issubclass(tagged, lib.Tensor)],
                "unwrapped": type(x.as_subclass(tagged).as_subclass(lib.Tensor)), "repr": repr(x.as_subclass(tagged))}

    _assert_same(scenario)


def test_making_subclass_instances_refuses_as_torch():
    for lib in LIBS.values():
        with pytest.raises(TypeError, match="Creating a Tensor subclass from a class that does not inherit from"):
            lib.ones(2).as_subclass(int)
        with pytest.raises(TypeError, match=r"argument 'data' \(position 2\) must be Tensor, not list"):
            lib.Tensor._make_subclass(_subclasses(lib)[0], [1.0])


# ------------------------------------------------------------------ results keep the subclass
def test_results_keep_the_subclass():
    def scenario(lib):
        tagged, _, _ = _subclasses(lib)
        x = lib.tensor([[1.0, -2.0], [3.0, 4.0]])
        s = x.as_subclass(tagged)
        results = {
            "s + 1": s + 1, "1 + s": 1 + s, "x + s": x + s, "s - x": s - x, "-s": -s, "s @ s": s @ s,
            "add": lib.add(x, s), "s[0]": s[0], "s[:, 1]": s[:, 1], "detach": s.detach(), "clone": s.clone(),
            "cat": lib.cat([s, s]), "cat plain first": lib.cat([x, s]), "stack": lib.stack([x, s]), "sum": s.sum(),
            "sum dim": lib.sum(s, dim=0), "T": s.T, "view": s.view(4), "to": s.to(lib.float64), "relu":
            lib.nn.functional.relu(s), "softmax": lib.nn.functional.softmax(s, -1), "linear":
            lib.nn.functional.linear(s, lib.ones(3, 2)), "new_zeros": s.new_zeros(2), "zeros_like": lib.zeros_like(s),
            "max values": s.max(0).values, "unbind": list(s.unbind()), "iter": list(s), "abs_": s.clone().abs_(),
        }
        scalars = {"tolist": s.tolist(), "item": s[0, 0].item(), "float": float(s[1, 1]), "shape": list(s.shape),
                   "dtype": str(s.dtype).split(".")[-1], "size": list(s.size()), "dim": s.dim(), "len": len(s),
                   "numel": s.numel(), "max is named": type(s.max(0)).__name__}
        return {**results, **scalars}

    _assert_same(scenario)


# ------------------------------------------------------------------ what an override is told
def test_override_is_told_the_public_callable():
    def scenario(lib):
        _, logged, _ = _subclasses(lib)
        x = lib.tensor([1.0, 2.0])
        s = x.as_subclass(logged)
        fn = lib.nn.functional
        calls = {"function": lambda: lib.add(s, 1), "method": lambda: s.add(1), "operator": lambda: s + 1,
                 "reflected": lambda: 1 + s, "plain operand first": lambda: x + s, "getitem": lambda: s[0],
                 "relu": lambda: fn.relu(s), "linear": lambda: fn.linear(s, lib.ones(3, 2)),
                 "cat": lambda: lib.cat([x, s]),
                 "sum": lambda: s.sum(dim=0), "detach": lambda: s.detach(), "size": lambda: s.size(),
                 "dim": lambda: s.dim(), "neg": lambda: -s, "transpose": lambda: s.transpose(0, 0),
                 "len": lambda: len(s)}
        seen = {}
        for name, call in calls.items():
            logged.calls.clear()
            call()
            seen[name] = list(logged.calls)
        return seen

    _assert_same(scenario)


def test_override_is_told_function_and_method_identities():
    for lib in LIBS.values():
        _, logged, _ = _subclasses(lib)
        s = lib.ones(2).as_subclass(logged)
        class Watching(lib.Tensor):
            told: list = []

            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                cls.told.append(func)
                return super().__torch_function__(func, types, args, kwargs)

        w = s.as_subclass(Watching)
        lib.add(w, 1)
        w.add(1)
        w.shape  # noqa: B018 — a property read goes through the override too
        w.size()
        told = Watching.told
        assert told[0] is lib.add and told[1] is lib.Tensor.add and told[3] is lib.Tensor.size
        assert told[2] == lib.Tensor.shape.__get__


def test_override_arguments_and_types():
    def scenario(lib):
        seen = []

        class Recording(lib.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                seen.append((func.__name__, len(args), sorted(kwargs or {}), [t.__name__ for t in types]))
                return super().__torch_function__(func, types, args, kwargs)

        x = lib.tensor([1.0, 2.0])
        r = x.as_subclass(Recording)
        lib.add(r, 1, alpha=2)
        r.sum(0, keepdim=True)
        lib.add(x, r)
        r.transpose(0, 0)
        lib.cat([r, x])
        return seen

    _assert_same(scenario)


def test_notimplemented_everywhere_is_refused_as_torch():
    for lib, name in ((torch, "torch.add"), (tw, "tilewise.add")):
        _, _, refusing = _subclasses(lib)
        with pytest.raises(TypeError, match=f"Multiple dispatch failed for '{name}'; all __torch_function__ handlers "
                                            "returned NotImplemented"):
            lib.add(lib.ones(2).as_subclass(refusing), 1)


def test_unrelated_subclasses_refuse_one_another():
    for lib in LIBS.values():
        tagged, logged, _ = _subclasses(lib)
        with pytest.raises(TypeError, match="Multiple dispatch failed"):
            lib.cat([lib.ones(2).as_subclass(tagged), lib.ones(2).as_subclass(logged)])


def test_an_override_that_unwraps_returns_plain_tensors():
    def scenario(lib):
        class Unwrapping(lib.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                with lib._C.DisableTorchFunctionSubclass():
                    return func(*args, **(kwargs or {}))

        u = lib.tensor([1.0, 2.0]).as_subclass(Unwrapping)
        return [u + 1, u.sum(), lib.cat([u])]

    _assert_same(scenario)


# ------------------------------------------------------------------ the switches and torch.overrides' helpers
def test_disabling_overrides():
    def scenario(lib):
        tagged, logged, _ = _subclasses(lib)
        s, m = lib.ones(2).as_subclass(tagged), lib.ones(2).as_subclass(logged)
        logged.calls.clear()
        with _disable_subclass(lib):
            inside = [type(s + 1), type(m + 1), lib.overrides.has_torch_function((s,))]
        with _disable_all(lib):
            inside_all = [type(s + 1), lib.overrides.has_torch_function((s,))]
        return {"subclass off": inside, "all off": inside_all, "calls": list(logged.calls),
                "after": [type(s + 1), lib._C._is_torch_function_enabled()]}

    _assert_same(scenario)


class _Duck:
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return ("duck", func.__name__, [t.__name__ for t in types])


def test_duck_types():
    def scenario(lib):
        x = lib.ones(2)
        out = [lib.add(_Duck(), 1), lib.add(x, _Duck()), lib.cat([x, _Duck()]), x + _Duck()]
        helpers = [lib.overrides.has_torch_function((_Duck(),)), lib.overrides.has_torch_function((x,)),
                   lib.overrides.is_tensor_like(_Duck()), lib.overrides.is_tensor_like(x),
                   lib.overrides.is_tensor_like(1.0)]
        with _disable_subclass(lib):
            helpers.append(lib.overrides.has_torch_function((_Duck(),)))
        return out, helpers

    _assert_same(scenario)
    for lib in LIBS.values():
        with _disable_subclass(lib), pytest.raises(TypeError, match="must be Tensor"):
            lib.add(_Duck(), 1)


def test_handle_torch_function_and_nowrap():
    def scenario(lib):
        def my_fn(x, k=1):
            if lib.overrides.has_torch_function_unary(x):
                return lib.overrides.handle_torch_function(my_fn, (x,), x, k=k)
            return x * k

        tagged, logged, _ = _subclasses(lib)
        logged.calls.clear()
        s = lib.tensor([1.0, 2.0]).as_subclass(logged)
        s.requires_grad_()
        out = my_fn(s, k=3)
        nowrap = lib.overrides.get_default_nowrap_functions()
        return {"out": out, "calls": logged.calls[:1], "nowrap": len(nowrap),
                "grad get in nowrap": lib.Tensor.grad.__get__ in nowrap}

    _assert_same(scenario)
    for lib in LIBS.values():
        with pytest.raises(TypeError, match="no implementation found for"):
            lib.overrides.handle_torch_function(lambda x: x, (lib.ones(1).as_subclass(_subclasses(lib)[2]),),
                                                lib.ones(1))


# ------------------------------------------------------------------ parameters, pickling, copying, autograd
def test_parameters_of_subclass_instances():
    def scenario(lib):
        tagged, _, _ = _subclasses(lib)
        p = lib.nn.Parameter(lib.ones(2, 2).as_subclass(tagged))
        m = lib.nn.Linear(2, 2)
        m.weight = p
        y = m(lib.ones(1, 2))
        plain = lib.nn.Parameter(lib.ones(2))
        return {"type": type(p), "is Parameter": isinstance(p, lib.nn.Parameter), "requires_grad": p.requires_grad,
                "leaf": p.is_leaf, "output": type(y), "registered": "weight" in dict(m.named_parameters()),
                "plain is Parameter": isinstance(plain, lib.nn.Parameter), "plain + 1": type(plain + 1).__name__}

    theirs, ours = _both(scenario)
    assert ours == theirs


def test_pickle_and_copy():
    def scenario(lib):
        tagged, _, _ = _subclasses(lib)
        globals()["_PickledTagged_" + lib.__name__] = tagged  # picklable by name
        tagged.__qualname__ = "_PickledTagged_" + lib.__name__
        s = lib.tensor([1.0, 2.0]).as_subclass(tagged)
        s.note = "kept"
        back = pickle.loads(pickle.dumps(s))
        shallow = copy.copy(s)
        return [back, back.note, shallow]

    _assert_same(scenario)


def test_deepcopy_needs_new_empty_as_torch():
    for lib in LIBS.values():
        tagged, _, _ = _subclasses(lib)
        with pytest.raises(RuntimeError, match="The default implementation of __deepcopy__"):
            copy.deepcopy(lib.ones(2).as_subclass(tagged))

        class Copyable(lib.Tensor):
            def new_empty(self, *args, **kwargs):
                return super().new_empty(*args, **kwargs).as_subclass(Copyable)

        c = lib.tensor([1.0, 2.0]).as_subclass(Copyable)
        d = copy.deepcopy(c)
        assert type(d) is Copyable and d.tolist() == [1.0, 2.0]


def test_autograd_through_subclasses():
    def scenario(lib):
        tagged, logged, _ = _subclasses(lib)
        h = lib.tensor([1.0, 2.0], requires_grad=True)
        hs = h.as_subclass(tagged)
        (hs * 3).sum().backward()
        leaf = lib.Tensor._make_subclass(logged, lib.tensor([1.0, -2.0]), True)
        y = (leaf * leaf).sum()
        y.backward()
        z = lib.tensor([2.0], requires_grad=True).as_subclass(tagged)
        (g,) = lib.autograd.grad((z ** 2).sum(), z)
        w = lib.Tensor._make_subclass(tagged, lib.tensor([1.0, 2.0]), True)
        v = w * 1
        v.mul_(2)
        v.sum().backward()
        return {"alias": [h.grad, hs.is_leaf], "leaf grad": leaf.grad, "leaf type": type(y), "grad": g,
                "in place": w.grad}

    _assert_same(scenario)


def test_user_methods_and_attributes_stay():
    def scenario(lib):
        class Units(lib.Tensor):
            def in_units(self):
                return f"{self.tolist()} {self.unit}"

        u = lib.tensor([1.0, 2.0]).as_subclass(Units)
        u.unit = "m"
        return [u.in_units(), (u * 2).__dict__.get("unit"), type(u * 2)]

    _assert_same(scenario)


# ------------------------------------------------------------------ the compiler
def test_compile_refuses_subclass_arguments_by_name():
    class Tagged(tw.Tensor):
        pass

    f = tw.compile(lambda t: t * 2 + 1)
    assert f(tw.ones(2)).tolist() == [3.0, 3.0]
    with pytest.raises(TypeError, match="an instance of .*Tagged, a Tensor subclass, which the compiler cannot trace"):
        f(tw.ones(2).as_subclass(Tagged))


# ------------------------------------------------------------------ the plain path is untouched
def test_plain_tensors_never_reach_the_protocol():
    x = tw.ones(2)
    for call in (lambda: x + x, lambda: tw.add(x, 1), lambda: x.sum(), lambda: tw.cat([x, x])):
        assert type(call()) is tw.Tensor
    assert "__torch_function__" not in type(x + x).__dict__ or type(x + x) is tw.Tensor


def test_subclass_of_a_subclass_and_its_own_methods():
    def scenario(lib):
        class Base(lib.Tensor):
            def describe(self):
                return "base"

        class Child(Base):
            def add(self, other):  # a subclass's own method is its own: no override runs for it
                return "own add"

        c = lib.tensor([1.0, 2.0]).as_subclass(Child)
        b = lib.tensor([1.0, 2.0]).as_subclass(Base)
        return [type(c + 1), c.add(1), c.describe(), type(lib.cat([b, c])), type(b + c), type(c * b)]

    _assert_same(scenario)


def test_top_level_switch_names():
    assert tw.DisableTorchFunctionSubclass is tw._C.DisableTorchFunctionSubclass
    assert tw.DisableTorchFunction is tw._C.DisableTorchFunction


def test_a_subclass_adding_slots_is_refused_clearly():
    class Slotted(tw.Tensor):
        __slots__ = ("unit",)

    with pytest.raises(TypeError, match="Slotted: a Tensor subclass that adds __slots__ is not supported"):
        tw.ones(2).as_subclass(Slotted)
