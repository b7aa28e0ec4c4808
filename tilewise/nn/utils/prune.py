"""tilewise.nn.utils.prune: torch's pruning of module tensors by masks.

Pruning ``name`` of a module moves the parameter to ``name + "_orig"``, registers a buffer ``name + "_mask"``
(1 keeps an element, 0 prunes it), and makes ``name`` a plain attribute holding ``orig * mask``, recomputed by a
forward pre-hook before every forward, so gradients reach ``name_orig`` only where the mask keeps it. Pruning the
same tensor again combines the methods in a :class:`PruningContainer`: the new method decides only among what the
previous masks kept. :func:`remove` makes the pruning permanent: ``name`` is a parameter again, holding the pruned
values, and the hook, ``_orig`` and ``_mask`` are gone.

Methods: :class:`Identity`, :class:`RandomUnstructured`, :class:`L1Unstructured` (the smallest magnitudes),
:class:`RandomStructured` and :class:`LnStructured` (whole channels along ``dim``, by random draw or by their
L``n`` norm), :class:`CustomFromMask`; :func:`global_unstructured` prunes across several tensors at once.
``amount`` is a count of elements (channels) when an int, a fraction of them when a float in [0, 1], rounded
half to even as Python's ``round``. The same arguments and errors as torch's.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable

from tilewise.layouts import contiguous_format
from tilewise.ops.creation import ones_like, rand, rand_like, zeros_like
from tilewise.tensor import Tensor


class BasePruningMethod(ABC):
    """A way of choosing which elements of a tensor to prune: ``compute_mask`` returns the new mask from the
    tensor's importance scores and the mask already applied to it."""

    _tensor_name: str
    PRUNING_TYPE: str

    def __call__(self, module, inputs) -> None:
        """The forward pre-hook: recompute the pruned tensor from ``_orig`` and ``_mask``."""
        setattr(module, self._tensor_name, self.apply_mask(module))

    @abstractmethod
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """The mask for ``t``, given the mask ``default_mask`` already applied to it."""

    def apply_mask(self, module) -> Tensor:
        """``orig * mask`` of the pruned tensor of ``module``."""
        if getattr(self, "_tensor_name", None) is None:
            raise AssertionError(f"Module {module} has to be pruned")
        mask = getattr(module, self._tensor_name + "_mask")
        orig = getattr(module, self._tensor_name + "_orig")
        return mask.to(dtype=orig.dtype) * orig

    @classmethod
    def apply(cls, module, name: str, *args, importance_scores: Tensor | None = None, **kwargs):
        """Prune ``module.name`` in place by this method (built from ``args``/``kwargs``), combined with the
        methods already pruning it; the method (or container) that now prunes it is returned."""
        method = _composite_method(cls, module, name, *args, **kwargs)
        orig = getattr(module, name)
        if importance_scores is not None:
            if tuple(importance_scores.shape) != tuple(orig.shape):
                raise AssertionError(f"importance_scores should have the same shape as parameter {name} of "
                                     f"{module}")
        else:
            importance_scores = orig
        if not isinstance(method, PruningContainer):  # the first pruning of this tensor
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            default_mask = ones_like(orig)
        else:
            default_mask = getattr(module, name + "_mask").detach().clone(memory_format=contiguous_format)
        try:
            mask = method.compute_mask(importance_scores, default_mask=default_mask)
            module.register_buffer(name + "_mask", mask)
            setattr(module, name, method.apply_mask(module))
            module.register_forward_pre_hook(method)
        except Exception:
            if not isinstance(method, PruningContainer):  # leave the module as it was
                orig = getattr(module, name + "_orig")
                module.register_parameter(name, orig)
                del module._parameters[name + "_orig"]
            raise
        return method

    def prune(self, t: Tensor, default_mask: Tensor | None = None, importance_scores: Tensor | None = None) -> Tensor:
        """``t`` with this method's mask applied (nothing is registered on a module)."""
        if importance_scores is not None:
            if tuple(importance_scores.shape) != tuple(t.shape):
                raise AssertionError("importance_scores should have the same shape as tensor t")
        else:
            importance_scores = t
        default_mask = default_mask if default_mask is not None else ones_like(t)
        return t * self.compute_mask(importance_scores, default_mask=default_mask)

    def remove(self, module) -> None:
        """Make the pruning of ``module`` permanent: the parameter holds ``orig * mask`` and the reparametrization
        is gone."""
        if getattr(self, "_tensor_name", None) is None:
            raise AssertionError(f"Module {module} has to be pruned before pruning can be removed")
        weight = self.apply_mask(module)
        if hasattr(module, self._tensor_name):
            delattr(module, self._tensor_name)
        orig = module._parameters[self._tensor_name + "_orig"]
        orig.data = weight.data
        del module._parameters[self._tensor_name + "_orig"]
        del module._buffers[self._tensor_name + "_mask"]
        setattr(module, self._tensor_name, orig)


def _composite_method(cls, module, name: str, *args, **kwargs) -> BasePruningMethod:
    """The new method, in a container with the one already pruning ``name`` if there is one; that one's hook is
    taken off the module (the returned method's hook replaces it)."""
    old_method, found = None, []
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, BasePruningMethod) and hook._tensor_name == name:
            old_method = hook
            found.append(key)
    if len(found) > 1:
        raise AssertionError(f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}. "
                             "Use a PruningContainer.")
    for key in found:
        del module._forward_pre_hooks[key]
    method = cls(*args, **kwargs)
    method._tensor_name = name
    if old_method is not None:
        if isinstance(old_method, PruningContainer):
            old_method.add_pruning_method(method)
            method = old_method
        else:
            container = PruningContainer(old_method)
            container.add_pruning_method(method)
            method = container
    return method


class PruningContainer(BasePruningMethod):
    """The methods that pruned one tensor one after another; the mask is the last one's, computed only over what
    the earlier ones kept."""

    def __init__(self, *args) -> None:
        self._pruning_methods: tuple[BasePruningMethod, ...] = ()
        if len(args) == 1:
            self._tensor_name = args[0]._tensor_name
            self.add_pruning_method(args[0])
        else:
            for method in args:
                self.add_pruning_method(method)

    def add_pruning_method(self, method: BasePruningMethod | None) -> None:
        if not isinstance(method, BasePruningMethod) and method is not None:
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if method is not None and getattr(self, "_tensor_name", None) != method._tensor_name:
            raise ValueError(f"Can only add pruning methods acting on the parameter named "
                             f"'{getattr(self, '_tensor_name', None)}' to PruningContainer {self}. Found "
                             f"'{method._tensor_name}'")
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, index):
        return self._pruning_methods[index]

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        method = self._pruning_methods[-1]
        new_mask = default_mask.to(dtype=t.dtype)
        if method.PRUNING_TYPE == "unstructured":  # among the elements still kept
            region = default_mask == 1
        elif method.PRUNING_TYPE == "structured":  # among the channels with any element still kept
            if not hasattr(method, "dim"):
                raise AttributeError("Pruning methods of PRUNING_TYPE 'structured' need to have the attribute `dim` "
                                     "defined.")
            dims = t.dim()
            dim = method.dim + dims if method.dim < 0 else method.dim
            if dim < 0:
                raise IndexError(f"Index is out of bounds for tensor with dimensions {dims}")
            keep = default_mask.sum(dim=[d for d in range(dims) if d != dim]) != 0
            region = tuple(keep if d == dim else slice(None) for d in range(dims))
        elif method.PRUNING_TYPE == "global":
            region = tuple(slice(None) for _ in range(t.dim()))
        else:
            raise ValueError(f"Unrecognized PRUNING_TYPE {method.PRUNING_TYPE}")
        partial = method.compute_mask(t[region], default_mask=default_mask[region])
        new_mask[region] = partial.to(dtype=new_mask.dtype)
        return new_mask


class Identity(BasePruningMethod):
    """Prunes nothing: the mask stays all ones."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask

    @classmethod
    def apply(cls, module, name: str):  # noqa: D102
        return super().apply(module, name)


class _UnstructuredByCount(BasePruningMethod):
    """Prunes ``amount`` single elements, the ones :meth:`_chosen` picks."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount) -> None:
        _validate_pruning_amount_init(amount)
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        size = t.nelement()
        count = _compute_nparams_toprune(self.amount, size)
        _validate_pruning_amount(count, size)
        mask = default_mask.clone(memory_format=contiguous_format)
        if count != 0:
            mask.view(-1)[self._chosen(t, count)] = 0
        return mask

    def _chosen(self, t: Tensor, count: int) -> Tensor:
        raise NotImplementedError


class RandomUnstructured(_UnstructuredByCount):
    """Prunes ``amount`` elements drawn at random."""

    def _chosen(self, t: Tensor, count: int) -> Tensor:
        return rand_like(t).view(-1).topk(count).indices

    @classmethod
    def apply(cls, module, name: str, amount):  # noqa: D102
        return super().apply(module, name, amount=amount)


class L1Unstructured(_UnstructuredByCount):
    """Prunes the ``amount`` elements of smallest magnitude (of the importance scores)."""

    def _chosen(self, t: Tensor, count: int) -> Tensor:
        return t.abs().view(-1).topk(count, largest=False).indices

    @classmethod
    def apply(cls, module, name: str, amount, importance_scores=None):  # noqa: D102
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


class RandomStructured(BasePruningMethod):
    """Prunes ``amount`` whole channels along ``dim``, drawn at random."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount, dim: int = -1) -> None:
        _validate_pruning_amount_init(amount)
        self.amount = amount
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        channels, count = _structured_count(t, self.amount, self.dim)
        if count == 0:
            return default_mask
        draws = rand(channels)
        threshold = draws.kthvalue(count).values
        mask = _channels_mask(t, self.dim, draws > threshold)
        mask *= default_mask.to(dtype=mask.dtype)
        return mask

    @classmethod
    def apply(cls, module, name: str, amount, dim: int = -1):  # noqa: D102
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(BasePruningMethod):
    """Prunes the ``amount`` channels along ``dim`` of smallest L``n`` norm (of the importance scores)."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount, n, dim: int = -1) -> None:
        _validate_pruning_amount_init(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        channels, count = _structured_count(t, self.amount, self.dim)
        norm = _compute_norm(t, self.n, self.dim)
        kept = norm.topk(channels - count, largest=True).indices
        if count == 0:
            return default_mask
        mask = _channels_mask(t, self.dim, kept)
        mask *= default_mask.to(dtype=mask.dtype)
        return mask

    @classmethod
    def apply(cls, module, name: str, amount, n, dim: int, importance_scores=None):  # noqa: D102
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod):
    """Prunes where the given mask is 0."""

    PRUNING_TYPE = "global"

    def __init__(self, mask: Tensor) -> None:
        self.mask = mask

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        if tuple(default_mask.shape) != tuple(self.mask.shape):
            raise AssertionError(f"the mask's shape {list(self.mask.shape)} differs from the tensor's "
                                 f"{list(default_mask.shape)}")
        return default_mask * self.mask.to(dtype=default_mask.dtype)

    @classmethod
    def apply(cls, module, name: str, mask):  # noqa: D102
        return super().apply(module, name, mask=mask)


# ---------------------------------------------------------------------------- functions


def identity(module, name: str):
    """Prune nothing, but reparametrize ``name`` as the pruning functions do."""
    Identity.apply(module, name)
    return module


def random_unstructured(module, name: str, amount):
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(module, name: str, amount, importance_scores=None):
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module, name: str, amount, dim: int):
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(module, name: str, amount, n, dim: int, importance_scores=None):
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module, name: str, mask: Tensor):
    CustomFromMask.apply(module, name, mask)
    return module


def global_unstructured(parameters, pruning_method, importance_scores=None, **kwargs) -> None:
    """Prune the (module, name) pairs of ``parameters`` together: ``pruning_method`` (an unstructured method's
    class, with ``kwargs``) chooses among all their elements at once."""
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    parameters = list(parameters)
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    from tilewise.nn.utils.convert_parameters import parameters_to_vector

    scores = parameters_to_vector([importance_scores.get((module, name), getattr(module, name))
                                   for module, name in parameters])
    default_mask = parameters_to_vector([getattr(module, name + "_mask", ones_like(getattr(module, name)))
                                         for module, name in parameters])
    container = PruningContainer()
    container._tensor_name = "temp"
    method = pruning_method(**kwargs)
    method._tensor_name = "temp"
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(f'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. Found method '
                        f"{pruning_method} of type {method.PRUNING_TYPE}")
    container.add_pruning_method(method)
    final = container.compute_mask(scores, default_mask)
    start = 0
    for module, name in parameters:
        param = getattr(module, name)
        count = param.numel()
        custom_from_mask(module, name, mask=final[start:start + count].view_as(param))
        start += count


def remove(module, name: str):
    """Make the pruning of ``module.name`` permanent (see the module's docstring)."""
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, BasePruningMethod) and hook._tensor_name == name:
            hook.remove(module)
            del module._forward_pre_hooks[key]
            return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module) -> bool:
    """Whether any tensor of ``module`` or its submodules is pruned."""
    return any(isinstance(hook, BasePruningMethod)
               for sub in module.modules() for hook in sub._forward_pre_hooks.values())


# ---------------------------------------------------------------------------- the amount and the tensor


def _validate_pruning_amount_init(amount) -> None:
    if not isinstance(amount, numbers.Real):
        raise TypeError(f"Invalid type for amount: {amount}. Must be int or float.")
    if (isinstance(amount, numbers.Integral) and amount < 0) or (
            not isinstance(amount, numbers.Integral) and (float(amount) > 1.0 or float(amount) < 0.0)):
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a non-negative integer")


def _validate_pruning_amount(amount, tensor_size: int) -> None:
    if isinstance(amount, numbers.Integral) and amount > tensor_size:
        raise ValueError(f"amount={amount} should be smaller than the number of parameters to prune={tensor_size}")


def _validate_structured_pruning(t: Tensor) -> None:
    shape = t.shape
    if len(shape) <= 1:
        raise ValueError(f"Structured pruning can only be applied to multidimensional tensors. Found tensor of shape "
                         f"{shape} with {len(shape)} dims")


def _compute_nparams_toprune(amount, tensor_size: int) -> int:
    if isinstance(amount, numbers.Integral):
        return amount
    return round(amount * tensor_size)


def _validate_pruning_dim(t: Tensor, dim: int) -> None:
    if dim >= t.dim():
        raise IndexError(f"Invalid index {dim} for tensor of size {t.shape}")


def _structured_count(t: Tensor, amount, dim: int) -> tuple[int, int]:
    """(channels along ``dim``, how many of them to prune), after torch's checks of the tensor and the amount."""
    _validate_structured_pruning(t)
    _validate_pruning_dim(t, dim)
    channels = t.shape[dim]
    count = _compute_nparams_toprune(amount, channels)
    _validate_pruning_amount(count, channels)
    return channels, count


def _compute_norm(t: Tensor, n, dim: int) -> Tensor:
    dims = list(range(t.dim()))
    dims.remove(dims[dim])
    return t.norm(p=n, dim=dims)


def _channels_mask(t: Tensor, dim: int, channels) -> Tensor:
    """Ones on the chosen channels of ``dim`` (a bool mask or indices), zeros elsewhere."""
    mask = zeros_like(t)
    mask[tuple(channels if d == dim % t.dim() else slice(None) for d in range(t.dim()))] = 1
    return mask
