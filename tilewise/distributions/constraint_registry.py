"""``biject_to`` and ``transform_to``, as torch's: from a constraint to a transform that maps unconstrained reals
into it (``biject_to`` a bijection, for reparametrised inference; ``transform_to`` any such map, for optimisation).
Both are looked up by the constraint's exact type, so a registration for ``constraints.positive`` is one for every
``greater_than`` constraint (their type is one), as in torch."""

from __future__ import annotations

from numbers import Number

from tilewise.distributions import constraints, transforms


class ConstraintRegistry:
    def __init__(self) -> None:
        self._registry: dict = {}

    def register(self, constraint, factory=None):
        """``registry.register(constraint, factory)``, or ``@registry.register(constraint)`` on the factory."""
        if factory is None:
            return lambda factory: self.register(constraint, factory)
        if isinstance(constraint, constraints.Constraint):
            constraint = type(constraint)
        if not isinstance(constraint, type) or not issubclass(constraint, constraints.Constraint):
            raise TypeError(f"Expected constraint to be either a Constraint subclass or instance, but got "
                            f"{constraint}")
        self._registry[constraint] = factory
        return factory

    def __call__(self, constraint):
        try:
            factory = self._registry[type(constraint)]
        except KeyError:
            raise NotImplementedError(f"Cannot transform {type(constraint).__name__} constraints") from None
        return factory(constraint)


biject_to = ConstraintRegistry()
transform_to = ConstraintRegistry()

_BOTH = (biject_to, transform_to)


def _register(registries, *kinds):
    def decorator(factory):
        for registry in registries:
            for kind in kinds:
                registry.register(kind, factory)
        return factory

    return decorator


@_register(_BOTH, constraints.real)
def _transform_to_real(constraint):
    return transforms.identity_transform


@_register((biject_to,), constraints.independent)
def _biject_to_independent(constraint):
    return transforms.IndependentTransform(biject_to(constraint.base_constraint), constraint.reinterpreted_batch_ndims)


@_register((transform_to,), constraints.independent)
def _transform_to_independent(constraint):
    return transforms.IndependentTransform(transform_to(constraint.base_constraint),
                                           constraint.reinterpreted_batch_ndims)


@_register(_BOTH, constraints.greater_than, constraints.greater_than_eq)
def _transform_to_greater_than(constraint):
    return transforms.ComposeTransform([transforms.ExpTransform(),
                                        transforms.AffineTransform(constraint.lower_bound, 1)])


@_register(_BOTH, constraints.less_than)
def _transform_to_less_than(constraint):
    return transforms.ComposeTransform([transforms.ExpTransform(),
                                        transforms.AffineTransform(constraint.upper_bound, -1)])


@_register(_BOTH, constraints.interval, constraints.half_open_interval)
def _transform_to_interval(constraint):
    lower, upper = constraint.lower_bound, constraint.upper_bound
    if isinstance(lower, Number) and lower == 0 and isinstance(upper, Number) and upper == 1:
        return transforms.SigmoidTransform()
    return transforms.ComposeTransform([transforms.SigmoidTransform(),
                                        transforms.AffineTransform(lower, upper - lower)])


@_register((biject_to,), constraints._Simplex)
def _biject_to_simplex(constraint):
    return transforms.StickBreakingTransform()


@_register((transform_to,), constraints._Simplex)
def _transform_to_simplex(constraint):
    return transforms.SoftmaxTransform()


@_register((transform_to,), constraints._LowerCholesky)
def _transform_to_lower_cholesky(constraint):
    return transforms.LowerCholeskyTransform()


@_register((transform_to,), constraints._PositiveDefinite, constraints._PositiveSemidefinite)
def _transform_to_positive_definite(constraint):
    return transforms.PositiveDefiniteTransform()


__all__ = ["ConstraintRegistry", "biject_to", "transform_to"]
