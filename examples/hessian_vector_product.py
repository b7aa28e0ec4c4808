"""Hessian-vector products of a small model's loss with respect to its parameters, by forward-over-reverse
differentiation: ``jvp(grad(loss), (params,), (v,))`` — one forward and one backward pass, never the Hessian.

The model is a two-layer MLP fitted to a noisy sine; its parameters are a dict, as ``tilewise.func.functional_call``
takes them. The product is checked three ways: against reverse-over-reverse (the gradient of <grad, v>), against
the full Hessian (``tilewise.func.hessian``, affordable at this size), and against torch.func when PyTorch is
installed. Then a few steps of Newton-CG use the products alone to fit the model.

    python examples/hessian_vector_product.py [--hidden 8] [--samples 64]
"""

import argparse

import numpy as np

import tilewise as tw
from tilewise.func import functional_call, grad, hessian, jvp


def make_problem(hidden: int, samples: int, device):
    tw.manual_seed(0)
    model = tw.nn.Sequential(tw.nn.Linear(1, hidden), tw.nn.Tanh(), tw.nn.Linear(hidden, 1)).double().to(device)
    x = tw.linspace(-3, 3, samples, dtype=tw.float64, device=device).unsqueeze(1)
    y = x.sin() + 0.05 * tw.randn(samples, 1, dtype=tw.float64, device=device)
    return model, x, y


def loss_of(model, x, y):
    def loss(params):
        return ((functional_call(model, params, (x,)) - y) ** 2).mean()

    return loss


def hvp(loss, params, v):
    """H v by forward mode through the gradient: the tangent of grad(loss) along v."""
    return jvp(grad(loss), (params,), (v,))[1]


def flat(tree) -> tw.Tensor:
    return tw.cat([t.reshape(-1) for t in tree.values()])


def unflat(vector, like):
    out, start = {}, 0
    for name, t in like.items():
        out[name] = vector[start:start + t.numel()].view_as(t)
        start += t.numel()
    return out


def torch_hvp(model, x, y, params, v):
    try:
        import torch
        import torch.func
    except ImportError:
        return None
    reference = torch.nn.Sequential(torch.nn.Linear(1, model[0].out_features), torch.nn.Tanh(),
                                    torch.nn.Linear(model[0].out_features, 1)).double()
    as_torch = {k: torch.tensor(t.cpu().numpy()) for k, t in params.items()}
    tx, ty = torch.tensor(x.cpu().numpy()), torch.tensor(y.cpu().numpy())

    def loss(p):
        return ((torch.func.functional_call(reference, p, (tx,)) - ty) ** 2).mean()

    tv = {k: torch.tensor(t.cpu().numpy()) for k, t in v.items()}
    product = torch.func.jvp(torch.func.grad(loss), (as_torch,), (tv,))[1]
    return np.concatenate([product[k].reshape(-1).numpy() for k in params])


def newton_cg_step(loss, params, iterations: int = 10):
    """One truncated Newton step: (H + damping) d = -g by conjugate gradients from Hessian-vector products alone,
    stopped where the curvature turns negative (the loss is not convex), then halved until the loss falls."""
    g = flat(grad(loss)(params))
    d, r = tw.zeros_like(g), -g
    p = r.clone()
    for _ in range(iterations):
        hp = flat(hvp(loss, params, unflat(p, params))) + 1e-2 * p
        curvature = p @ hp
        if curvature <= 0:
            break
        alpha = (r @ r) / curvature
        d, r_next = d + alpha * p, r - alpha * hp
        if r_next.norm() < 1e-10:
            break
        p, r = r_next + (r_next @ r_next) / (r @ r) * p, r_next
    if not d.abs().sum() > 0:
        d = -g
    before, scale = loss(params).item(), 1.0
    while scale > 1e-4:
        trial = {k: t + scale * step for (k, t), step in zip(params.items(), unflat(d, params).values())}
        if loss(trial).item() < before:
            return trial
        scale /= 2
    return params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    model, x, y = make_problem(args.hidden, args.samples, args.device)
    params = {k: t.detach() for k, t in model.named_parameters()}
    loss = loss_of(model, x, y)
    v = {k: tw.randn(t.shape, dtype=t.dtype, device=t.device) for k, t in params.items()}

    product = flat(hvp(loss, params, v))
    v_flat = flat(v)

    def inner(p):  # reverse over reverse: d/dp <grad(p), v>
        return sum((g * v[k]).sum() for k, g in grad(loss)(p).items())

    by_reverse = flat(grad(inner)(params))
    full = hessian(lambda w: loss(unflat(w, params)))(flat(params))
    print(f"{product.numel()} parameters: |Hv (jvp of grad) - Hv (grad of grad)| = "
          f"{(product - by_reverse).abs().max().item():.2e}, "
          f"|Hv - H @ v| = {(product - full @ v_flat).abs().max().item():.2e}")
    assert tw.allclose(product, by_reverse, rtol=1e-10, atol=1e-12)
    assert tw.allclose(product, full @ v_flat, rtol=1e-10, atol=1e-12)
    theirs = torch_hvp(model, x, y, params, v)
    if theirs is not None:
        print(f"|Hv - torch.func's| = {np.abs(product.cpu().numpy() - theirs).max():.2e}")
        assert np.allclose(product.cpu().numpy(), theirs, rtol=1e-10, atol=1e-12)

    start = loss(params).item()
    print(f"loss before: {start:.5f}")
    for step in range(5):
        params = newton_cg_step(loss, params)
        print(f"Newton-CG step {step}: loss {loss(params).item():.5f}")
    assert loss(params).item() < start, "Newton-CG did not reduce the loss"


if __name__ == "__main__":
    main()
