"""Every differentiable operator in the op table: autograd against central finite differences in float64.

Independent of torch: for each operator's samples (``tests/opinfos``), hypothesis picks the input values
(a seed) and random probe directions ``v``; the directional derivative ``<grad, v>`` from backward must
match ``(f(x + eps v) - f(x - eps v)) / 2 eps`` for every floating input, where ``f`` is the output
contracted with a fixed random weight. Directional probes (torch's fast gradcheck) cost two forward calls
per probe, however large the input. Sample ranges in the op table already keep inputs away from kinks
(positive inputs for log, distinct values for sort/max), and random operators are re-seeded before each
evaluation so they are smooth functions of their inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opinfo import T, _build, _materialise
from test_ops import OPINFOS

import tilewise as tw
import tilewise.nn.functional as F  # noqa: N812 — torch's spelling

EPS = 1e-6
RTOL, ATOL = 1e-5, 1e-7
PROBES = 2
# Samples whose gradient is a convention rather than the derivative (torch's definition, which tilewise follows):
# embedding's padding row gets no gradient, scale_grad_by_freq rescales it, max_norm renormalises outside autograd;
# index_put with repeated indices keeps one write but sends the gradient to every repeated value;
# gaussian_nll_loss's clamp of var is invisible to the gradient; ctc_loss adds exp(log_probs) (which log_softmax's
# backward cancels) and is NaN where no alignment exists; embedding_bag's frequency scaling is embedding's.
CONVENTIONAL_GRADIENTS = {"embedding": {"padding_idx", "freq", "max_norm"}, "index_put": {""},
                          "gaussian_nll_loss": {"clamped"},
                          "ctc_loss": {"padded-mean", "padded-sum", "padded-none", "concatenated", "infeasible",
                                       "zero-infinity", "unbatched"},
                          "embedding_bag": {"freq", "mode1-freq"}}
# cholesky_solve and cholesky_inverse differentiate the factor as a full matrix (torch's formulas), though only its
# triangle is read.
CONVENTIONAL_GRADIENTS.update({"cholesky_solve": {"lower", "upper-broadcast"}, "cholesky_inverse": {"", "upper"}})
# put without accumulate and repeated positions: one write is kept, the gradient goes to every source (index_put's)
CONVENTIONAL_GRADIENTS["put"] = {""}
# scatter_reduce and index_reduce amax/amin without self: torch's formula (which tilewise matches bit for bit)
# and finite differences part where a probe step reorders the sources of one position
CONVENTIONAL_GRADIENTS["scatter_reduce"] = {"amax-False", "amin-False"}
CONVENTIONAL_GRADIENTS["index_reduce"] = {"amax-False", "amin-False"}
# fake quantisation rounds (finite differences see steps and flats); its gradient is the straight-through estimator
CONVENTIONAL_GRADIENTS["fake_quantize_per_tensor_affine"] = {"", "narrow-range", "tensor-qparams"}
CONVENTIONAL_GRADIENTS["fake_quantize_per_channel_affine"] = {"", "float-zero-point"}
# Inputs where every gradient is torch's convention: NaN and inf (no derivative), ties and constants (a kink).
CONVENTIONAL_KINDS = frozenset({"nan", "one_nan", "ties"})


def _at_a_convention(sample) -> bool:
    def placeholders(value):
        if isinstance(value, T):
            yield value
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from placeholders(v)

    values = [*sample.args, *sample.kwargs.values()]
    return any(t.kind in CONVENTIONAL_KINDS for t in placeholders(values))

DIFFERENTIABLE = [info for info in OPINFOS if info.grad and "float64" in info.dtypes]


def _outputs(info, out) -> list:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if info.output_index is not None:
        outs = [outs[info.output_index]]
    return [o for o in outs if isinstance(o, tw.Tensor) and o.dtype.is_floating_point]


class Probe:
    """One sample as a function of its float64 inputs."""

    def __init__(self, info, sample, seed: int):
        rng = np.random.default_rng(seed)
        made: list = []
        self.args = _materialise(sample.args, rng, "float64", made)
        self.kwargs = {k: _materialise(v, rng, "float64", made) for k, v in sample.kwargs.items()}
        self.arrays = [m[0] for m in made]
        self.diff = [k for k, (a, spec) in enumerate(made) if spec.grad and a.dtype == np.float64]
        self.fn = info.resolve(tw, F)
        self.info = info
        self.rng = rng
        self.weights = None

    def forward(self, arrays, requires_grad: bool):
        tensors = {}

        def make(k):
            t = tw.from_numpy(np.array(arrays[k]))
            if requires_grad and k in self.diff:
                t.requires_grad_(True)
            return tensors.setdefault(k, t)

        tw.manual_seed(0)
        args = _build(self.args, arrays, lambda k: tensors.get(k) or make(k))
        kwargs = {name: _build(v, arrays, lambda k: tensors.get(k) or make(k)) for name, v in self.kwargs.items()}
        outs = _outputs(self.info, self.fn(*args, **kwargs))
        if self.weights is None:
            self.weights = [self.rng.standard_normal(tuple(o.shape)) for o in outs]
        total = sum((o * tw.from_numpy(w)).sum() for o, w in zip(outs, self.weights))
        return total, tensors

    def value(self, arrays) -> float:
        with tw.no_grad():
            return float(self.forward(arrays, False)[0])

    def check(self) -> bool:
        """Compare every probe; False when the sample has nothing differentiable (e.g. integer inputs)."""
        total, tensors = self.forward(self.arrays, True)
        used = [k for k in self.diff if k in tensors]
        if not isinstance(total, tw.Tensor) or not total.requires_grad or not used:
            return False
        grads = tw.autograd.grad(total, [tensors[k] for k in used], allow_unused=True)
        for k, grad in zip(used, grads):
            grad = np.zeros_like(self.arrays[k]) if grad is None else grad.numpy()
            for _ in range(PROBES):
                v = self.rng.standard_normal(self.arrays[k].shape)
                analytic = float(np.sum(grad * v))
                for eps in (EPS, EPS / 64):  # a smaller step where a kink (a near-tie of max) lies within EPS
                    plus, minus = list(self.arrays), list(self.arrays)
                    plus[k], minus[k] = self.arrays[k] + eps * v, self.arrays[k] - eps * v
                    numeric = (self.value(plus) - self.value(minus)) / (2 * eps)
                    if abs(numeric - analytic) <= ATOL + RTOL * max(abs(numeric), abs(analytic), 1.0):
                        break
                assert abs(numeric - analytic) <= ATOL * 64 + RTOL * max(abs(numeric), abs(analytic), 1.0), (
                    f"{self.info.name}: input {k}: autograd gives <grad, v> = {analytic!r}, finite differences "
                    f"give {numeric!r}")
        return True


@pytest.mark.parametrize("info", DIFFERENTIABLE, ids=[i.name for i in DIFFERENTIABLE])
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16))
def test_gradient_matches_finite_differences(info, seed):
    samples = [s for s in info.samples()
               if s.name not in CONVENTIONAL_GRADIENTS.get(info.name, ()) and not _at_a_convention(s)]
    checked = [Probe(info, sample, seed).check() for sample in samples]
    if not any(checked):
        pytest.skip(f"{info.name}: no sample with a differentiable floating input and output (or only conventional "
                    "gradients)")
