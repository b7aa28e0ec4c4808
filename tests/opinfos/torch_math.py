"""Samples for the torch-namespace products, distances, norms and statistics: mv, vdot, tensordot, chain_matmul,
dist, cdist, renorm, frobenius_norm, nuclear_norm, cov, corrcoef, mode and split_with_sizes."""

from __future__ import annotations

from opinfo import OpInfo, Sample, T


def _tensordot():
    return [Sample((T((3, 4)), T((4, 5)), 1)), Sample((T((2, 3, 4)), T((3, 4, 5))), name="dims2"),
            Sample((T((2, 3, 4)), T((4, 2, 5)), ([0, 2], [1, 0])), name="lists"),
            Sample((T((2, 3)), T((4,)), 0), name="outer"), Sample((T((3, 4)), T((3, 4)), ([1, 0], [1, 0])),
                                                                   name="all"),
            Sample((T((2, 0)), T((0, 3)), 1), name="empty-contraction"), Sample((T((0, 4)), T((4, 5)), 1),
                                                                                 name="empty-free")]


def _cdist():
    return [Sample((T((4, 3)), T((5, 3)))), Sample((T((2, 4, 3)), T((2, 5, 3)), 1.0), name="batched-p1"),
            Sample((T((2, 4, 3)), T((1, 5, 3)), 3.0), name="broadcast-p3"),
            Sample((T((4, 3)), T((5, 3)), float("inf")), name="inf"),
            Sample((T((3, 2)), T((2, 2)), 0.5), name="p-half")]


def _cov_weights(n):
    return T((n,), "int", 0, 3, grad=False), T((n,), "positive", 0.2, 2.0, grad=False)


def _cov():
    fweights, aweights = _cov_weights(6)
    return [Sample((T((3, 6)),)), Sample((T((6,)),), name="1d"), Sample((T((3, 6)),), {"correction": 0}, name="c0"),
            Sample((T((3, 6)),), {"fweights": fweights}, name="fweights"),
            Sample((T((3, 6)),), {"aweights": aweights}, name="aweights"),
            Sample((T((3, 6)),), {"fweights": fweights, "aweights": aweights, "correction": 2}, name="both")]


def _mode():
    ties = T((4, 7), "ties", 0, 3)
    return [Sample((ties,)), Sample((ties, 0), name="dim0"), Sample((ties, 1, True), name="keepdim"),
            Sample((T((2, 3, 5), "ties", -1, 1), 1), name="3d"), Sample((T((), "ties", 0, 3),), name="0d"),
            Sample((T((6,), "distinct"),), name="distinct")]


OPINFOS = [
    OpInfo("mv", lambda: [Sample((T((3, 4)), T((4,)))), Sample((T((1, 5)), T((5,))), name="row")]),
    OpInfo("mv", lambda: [Sample((T((3, 4)), T((4,))))], call="method"),
    OpInfo("vdot", lambda: [Sample((T((5,)), T((5,)))), Sample((T((0,)), T((0,))), name="empty")]),
    OpInfo("vdot", lambda: [Sample((T((5,)), T((5,))))], call="method"),
    OpInfo("tensordot", _tensordot),
    OpInfo("chain_matmul", lambda: [Sample((T((2, 3)), T((3, 4)), T((4, 2)))), Sample((T((3, 3)),), name="one")]),
    OpInfo("dist", lambda: [Sample((T((3, 4)), T((3, 4)))), Sample((T((3, 4)), T((4,)), 1), name="p1-broadcast"),
                            Sample((T((3, 4)), T((3, 4)), float("inf")), name="inf"),
                            Sample((T((3, 4)), T((3, 4)), 3.5), name="p3.5")]),
    OpInfo("dist", lambda: [Sample((T((3, 4)), T((3, 4)), 0), name="p0")], grad=False),
    OpInfo("dist", lambda: [Sample((T((3, 4)), T((3, 4))))], call="method"),
    OpInfo("cdist", _cdist),
    OpInfo("renorm", lambda: [Sample((T((3, 4)), 2, 0, 1.0)), Sample((T((3, 4), "float", -0.2, 0.2), 1, 1, 1.0),
                                                                      name="below"),
                              Sample((T((2, 3, 4)), 3, -1, 0.5), name="3d-p3")]),
    OpInfo("renorm", lambda: [Sample((T((3, 4)), 2, 0, 1.0))], call="method"),
    OpInfo("renorm_", lambda: [Sample((T((3, 4), grad=False), 2, 1, 0.5))], call="method", grad=False),
    OpInfo("frobenius_norm", lambda: [Sample((T((3, 4)), [0, 1])), Sample((T((3, 4)), [1], True), name="keepdim"),
                                      Sample((T((2, 3, 4)), [0, 2]), name="3d")]),
    OpInfo("nuclear_norm", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), True), name="keepdim"),
                                    Sample((T((2, 3, 4)), [0, 2]), name="dim")], covers=("nuclear_norm.dim",),
           rtol=1e-3),
    OpInfo("cov", _cov, dtypes=("float64",)),
    OpInfo("cov", lambda: [Sample((T((3, 6)),))], call="method"),
    OpInfo("cov", lambda: [Sample((T((3, 6), "int", -5, 5),), name="int")], dtypes=("float32",), rtol=1e-6),
    OpInfo("corrcoef", lambda: [Sample((T((3, 6)),)), Sample((T((5,)),), name="1d")]),
    OpInfo("corrcoef", lambda: [Sample((T((3, 6)),))], call="method"),
    OpInfo("mode", _mode),
    OpInfo("mode", lambda: [Sample((T((4, 7), "ties", 0, 3), 0))], call="method"),
    OpInfo("split_with_sizes", lambda: [Sample((T((6, 3)), [1, 2, 3])), Sample((T((3, 5)), [2, 0, 3], 1),
                                                                                name="empty-piece")]),
    OpInfo("split_with_sizes", lambda: [Sample((T((6, 3)), [4, 2]))], call="method"),
]

OPINFOS += [
    OpInfo("nonzero_static", lambda: [Sample((T((3, 4), "int", 0, 1),), {"size": 8}),
                                      Sample((T((3, 4), "int", 0, 1),), {"size": 2}, name="truncated"),
                                      Sample((T((5,), "int", 0, 1),), {"size": 6, "fill_value": 9}, name="fill"),
                                      Sample((T((2, 3), "int", 0, 1),), {"size": 0}, name="none")], grad=False),
    # self without a gradient: torch's backward for self copies the gradient's slice where the scattered view was
    # (its as_strided_scatter_backward), tilewise zeroes it, as the composition clone / as_strided / copy_ does in
    # torch too (test_torch_math.py checks that one)
    OpInfo("as_strided_scatter", lambda: [Sample((T((6,), grad=False), T((2, 2)), (2, 2), (3, 1))),
                                          Sample((T((6,), grad=False), T((2, 2)), (2, 2), (3, 1), 1), name="offset"),
                                          Sample((T((2, 3), grad=False), T((2,)), (2,), (1,)), name="2d"),
                                          Sample((T((3, 2), grad=False), T((2, 2)), (2, 2), (1, 2)), name="strided")]),
    OpInfo("as_strided_scatter", lambda: [Sample((T((6,), grad=False), T((2, 2)), (2, 2), (3, 1)))], call="method"),
]


class _EdgesOpInfo(OpInfo):
    """histogramdd: its bin edges come back as a tuple; the table compares the histogram and each edge tensor."""

    def resolve(self, module, functional):
        fn = super().resolve(module, functional)
        return lambda *args, **kwargs: (lambda out: (out[0], *out[1]))(fn(*args, **kwargs))


def _histogram():
    return [Sample((T((20,)), 5)), Sample((T((4, 5)), 3), {"range": (-1.0, 1.0)}, name="range"),
            Sample((T((20,)), T((4,), "distinct", grad=False)), name="edges"),
            Sample((T((20,)), 4), {"weight": T((20,), "positive", grad=False), "density": True}, name="density"),
            Sample((T((0,)), 3), name="empty")]


def _histogramdd():
    return [Sample((T((30, 2)),), {"bins": [3, 4]}), Sample((T((30, 3)),), {"bins": 2, "range": [-1.0, 1.0] * 3},
                                                           name="range"),
            Sample((T((30, 2)),), {"bins": [T((4,), "distinct", grad=False), T((3,), "distinct", grad=False)],
                                   "weight": T((30,), "positive", grad=False), "density": True}, name="edges")]


def _sorted_edges(fn, module):
    """Edge tensors drawn at random, sorted (edges increase) before both frameworks see them."""
    def sort(bins):
        if isinstance(bins, module.Tensor):
            return bins.sort().values
        return [sort(b) for b in bins] if isinstance(bins, list) else bins

    def call(input, *args, **kwargs):
        args = tuple(sort(a) for a in args)
        return fn(input, *args, **{k: sort(v) if k == "bins" else v for k, v in kwargs.items()})

    return call


# torch computes histograms on the CPU only (its CUDA build has no kernel for them); tilewise's run on CUDA too, and
# the table checks them there against torch's CPU result
OPINFOS += [
    OpInfo("histogram", _histogram, grad=False, covers=("histogram.bins_tensor", "histogram.bin_ct"),
           wrap=_sorted_edges, torch_on_cpu=True),
    OpInfo("histogram", lambda: [Sample((T((20,)), 5))], call="method", grad=False, torch_on_cpu=True),
    _EdgesOpInfo("histogramdd", _histogramdd, grad=False, wrap=_sorted_edges, covers=("_histogramdd",),
                 torch_on_cpu=True),
]


def _gradient():
    return [Sample((T((4, 5)),)), Sample((T((4, 5)),), {"spacing": 2.0, "dim": 1}, name="spacing"),
            Sample((T((4, 5)),), {"spacing": [0.5, 3.0]}, name="per-dim"),
            Sample((T((4, 5)),), {"edge_order": 2}, name="edge2"),
            Sample((T((3, 6)),), {"spacing": (T((6,), "distinct", grad=False),), "dim": 1}, name="coordinates"),
            Sample((T((3, 6)),), {"spacing": (T((6,), "distinct", grad=False),), "dim": -1, "edge_order": 2},
                   name="coordinates-edge2"),
            Sample((T((2, 3, 4)),), {"dim": (0, 2)}, name="dims")]


def _sorted_coordinates(fn, module):
    def call(input, spacing=1, **kwargs):
        if isinstance(spacing, tuple):
            spacing = tuple(s.sort().values * 3 for s in spacing)
        return fn(input, spacing=spacing, **kwargs)

    return call


OPINFOS += [OpInfo("gradient", _gradient, wrap=_sorted_coordinates)]
