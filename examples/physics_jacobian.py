"""The Jacobian of a physics residual three ways — forward mode (jacfwd), reverse mode (jacrev), and torch.func's
when PyTorch is installed — then Newton's method with it.

The residual is the Bratu problem, u'' + lam * exp(u) = 0 on (0, 1) with u(0) = u(1) = 0, discretised with
second differences on n interior points: F(u) = D u + lam * exp(u), D the tridiagonal (1, -2, 1) / h^2. Its
Jacobian D + lam * diag(exp(u)) is known in closed form, so each transform is checked against it, and Newton's
iteration u <- u - J(u)^-1 F(u) converges to the lower solution in a handful of steps.

    python examples/physics_jacobian.py [--n 32] [--lam 1.0]
"""

import argparse

import numpy as np

import tilewise as tw
from tilewise.func import jacfwd, jacrev


def residual(u, lam: float):
    h = 1.0 / (u.shape[0] + 1)
    padded = tw.cat([u.new_zeros(1), u, u.new_zeros(1)])  # the boundary values u(0) = u(1) = 0
    second_difference = (padded[2:] - 2 * padded[1:-1] + padded[:-2]) / (h * h)
    return second_difference + lam * u.exp()


def exact_jacobian(u, lam: float) -> np.ndarray:
    n = u.shape[0]
    h = 1.0 / (n + 1)
    d = (np.diag(-2.0 * np.ones(n)) + np.diag(np.ones(n - 1), 1) + np.diag(np.ones(n - 1), -1)) / (h * h)
    return d + np.diag(lam * np.exp(u.numpy()))


def torch_jacobian(u, lam: float):
    try:
        import torch
        import torch.func
    except ImportError:
        return None

    def torch_residual(v):
        h = 1.0 / (v.shape[0] + 1)
        padded = torch.cat([v.new_zeros(1), v, v.new_zeros(1)])
        return (padded[2:] - 2 * padded[1:-1] + padded[:-2]) / (h * h) + lam * v.exp()

    return torch.func.jacfwd(torch_residual)(torch.tensor(u.numpy())).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32, help="interior grid points")
    parser.add_argument("--lam", type=float, default=1.0, help="the Bratu parameter (solutions exist below 3.51)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    x = tw.linspace(0, 1, args.n + 2, dtype=tw.float64, device=args.device)[1:-1]
    u = 0.1 * x * (1 - x)  # a starting guess that meets the boundary conditions
    forward = jacfwd(residual)(u, args.lam)
    reverse = jacrev(residual)(u, args.lam)
    exact = exact_jacobian(u.cpu(), args.lam)
    print(f"Jacobian {tuple(forward.shape)}: |jacfwd - exact| = {np.abs(forward.cpu().numpy() - exact).max():.2e}, "
          f"|jacrev - exact| = {np.abs(reverse.cpu().numpy() - exact).max():.2e}")
    assert np.allclose(forward.cpu().numpy(), exact, rtol=1e-12, atol=1e-9)
    assert np.allclose(reverse.cpu().numpy(), exact, rtol=1e-12, atol=1e-9)
    theirs = torch_jacobian(u.cpu(), args.lam)
    if theirs is not None:
        print(f"|jacfwd - torch.func.jacfwd| = {np.abs(forward.cpu().numpy() - theirs).max():.2e}")
        assert np.allclose(forward.cpu().numpy(), theirs, rtol=1e-12, atol=1e-9)

    for step in range(8):
        f = residual(u, args.lam)
        norm = f.norm().item()
        print(f"Newton step {step}: |F(u)| = {norm:.3e}")
        if norm < 1e-10:
            break
        u = u - tw.linalg.solve(jacfwd(residual)(u, args.lam), f)
    assert norm < 1e-10, "Newton's method did not converge"
    print(f"u(1/2) = {u[args.n // 2].item():.6f}")


if __name__ == "__main__":
    main()
