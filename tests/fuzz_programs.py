"""Random programs for the trust fuzzer (tests/test_trust_fuzz.py): Python source over a small world of Python
state, run by tilewise compiled, tilewise eager and torch eager, with the state changed between calls.

A program is a function ``f(x, y)`` of statements over float32 values of shape (4, 5): pointwise operators,
reductions that keep their dims (argmax and max over a dim among them), softmax, views, in-place updates, and
the Python idioms compiled code must track: globals (a float ``G``, a tensor ``T``), a module ``M`` (a linear
layer, a batch norm and a float attribute), a config object ``C`` whose attribute sets a loop count, a list
``LOG`` appended to (a side effect), a branch on a tensor's value (a graph break) and ``.item()``. Between
calls a random change is made to that state. Inputs carry NaN and infinities at random places.
"""

from __future__ import annotations

import numpy as np

SHAPE = (4, 5)
UNARY = ("relu", "tanh", "sigmoid", "abs", "neg")
BINARY = ("add", "sub", "mul", "maximum", "minimum")
CHANGES = ("global float", "global tensor", "config", "module attribute", "train/eval", "weight", "none")


class Config:
    """A user's config object (a plain class: its attribute reads are what the guards must see)."""

    def __init__(self, k: int) -> None:
        self.k = k


def make_module(lib, rng: np.random.Generator):
    class Block(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lib.nn.Linear(5, 5)
            self.norm = lib.nn.BatchNorm1d(5, eps=0.1)  # a nearly constant column would magnify rounding
            self.scale = 0.5

        def forward(self, x):
            return self.norm(self.lin(x)) * self.scale

    weights = rng.standard_normal((5, 5)).astype(np.float32) * 0.5
    bias = rng.standard_normal(5).astype(np.float32) * 0.1
    m = Block()
    with lib.no_grad():
        m.lin.weight.copy_(lib.tensor(weights))
        m.lin.bias.copy_(lib.tensor(bias))
    return m


def program(rng: np.random.Generator) -> str:
    """The source of one random ``f(x, y)``."""
    values = ["x", "y"]
    lines = ["def f(x, y):"]
    for k in range(int(rng.integers(3, 12))):
        a = values[int(rng.integers(len(values)))]
        b = values[int(rng.integers(len(values)))]
        name = f"v{k}"
        kind = rng.choice(["unary", "binary", "binary", "reduce", "arg", "softmax", "view", "global", "tensor",
                           "module", "loop", "inplace", "log", "branch", "item"])
        if kind == "unary":
            lines.append(f"    {name} = L.{rng.choice(UNARY)}({a})")
        elif kind == "binary":
            lines.append(f"    {name} = L.{rng.choice(BINARY)}({a}, {b})")
        elif kind == "reduce":
            op = rng.choice(["sum", "amax", "amin", "mean"])
            lines.append(f"    {name} = {a}.{op}({int(rng.integers(2))}, keepdim=True) + {b}")
        elif kind == "arg":  # of an input: of a computed value, near-ties would follow each library's rounding
            dim = int(rng.integers(2))
            op = rng.choice(["argmax", "argmin"])
            src = rng.choice(["x", "y"])
            lines.append(f"    {name} = {a} * {src}.{op}({dim}, keepdim=True).float()")
        elif kind == "softmax":
            lines.append(f"    {name} = {a}.softmax({int(rng.integers(2))})")
        elif kind == "view":
            lines.append(f"    {name} = ({a}.t()[1:3] * 2).t().repeat(1, 3)[:, :5] + {a}[:, :1]")
        elif kind == "global":
            lines.append(f"    {name} = {a} * G")
        elif kind == "tensor":
            lines.append(f"    {name} = {a} + T")
        elif kind == "module":
            lines.append(f"    {name} = M(L.nan_to_num({a}, 0.0, 3.0, -3.0))")
        elif kind == "loop":
            lines.append(f"    {name} = {a}")
            lines.append("    for _ in range(C.k):")
            lines.append(f"        {name} = {name} * 0.5 + 1")
        elif kind == "inplace":
            lines.append(f"    {name} = {a} * 1")
            lines.append(f"    {name}[1:3].mul_(-2).add_({b}[1:3])")
        elif kind == "log":
            lines.append(f"    {name} = {a}")
            lines.append(f"    LOG.append({a}.sum())")
        elif kind == "branch":
            lines.append(f"    if ({a}.sum() > 0.25) or ({a}.sum() != {a}.sum()):")
            lines.append(f"        {name} = {a} + {b}")
            lines.append("    else:")
            lines.append(f"        {name} = {a} - 1")
        else:
            lines.append(f"    {name} = {a} * min(max(L.nan_to_num({a}).abs().amax().item(), -5.0), 5.0)")
        values.append(name)
    outputs = sorted({values[-1], *rng.choice(values[2:], size=min(2, len(values) - 2), replace=False)})
    lines.append(f"    return {', '.join(outputs)},")
    return "\n".join(lines)


def inputs(lib, rng: np.random.Generator) -> list:
    """Two float32 tensors of ``SHAPE`` with NaN and infinities at random places (sometimes none)."""
    out = []
    for _ in range(2):
        a = rng.uniform(-2, 2, SHAPE).astype(np.float32)
        specials = rng.random(SHAPE)
        a[specials < 0.06] = np.nan
        a[(specials >= 0.06) & (specials < 0.09)] = np.inf
        a[(specials >= 0.09) & (specials < 0.12)] = -np.inf
        if rng.random() < 0.4:
            a = np.nan_to_num(a, nan=0.5, posinf=1.5, neginf=-1.5)
        out.append(lib.tensor(a))
    return out


class World:
    """The Python state a program reads, for one library; ``change`` applies one random change to it."""

    def __init__(self, lib, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.lib = lib
        self.namespace = {"L": lib, "G": 1.5, "T": lib.tensor(rng.uniform(-1, 1, 5).astype(np.float32)),
                          "M": make_module(lib, rng), "C": Config(2), "LOG": []}

    def change(self, kind: str, rng: np.random.Generator) -> None:
        ns, lib = self.namespace, self.lib
        if kind == "global float":
            ns["G"] = float(rng.choice([-2.0, 0.25, 3.0]))
        elif kind == "global tensor":
            shape = (5,) if rng.random() < 0.7 else SHAPE
            ns["T"] = lib.tensor(rng.uniform(-1, 1, shape).astype(np.float32))
        elif kind == "config":
            ns["C"].k = int(rng.integers(0, 4))
        elif kind == "module attribute":
            ns["M"].scale = float(rng.choice([-1.0, 2.0, 0.1]))
        elif kind == "train/eval":
            ns["M"].train(not ns["M"].training)
        elif kind == "weight":
            ns["M"].lin.weight = lib.nn.Parameter(lib.tensor(rng.standard_normal((5, 5)).astype(np.float32)))
