"""Samples for the torch-namespace breadth operators: special functions, numpy-style pointwise operators,
set and counting operators, stacking and shape helpers, scatter/index reductions, matrix-vector products."""

from __future__ import annotations

from opinfo import OpInfo, Sample, T


def unary(kind="float", low=-2.0, high=2.0):
    return lambda: [Sample((T((3, 4), kind, low, high),)), Sample((T((), kind, low, high),), name="0-dim"),
                    Sample((T((2, 3, 5), kind, low, high),), name="3d")]


def binary(kind="float", low=-2.0, high=2.0):
    return lambda: [Sample((T((3, 4), kind, low, high), T((3, 4), kind, low, high)), name="same"),
                    Sample((T((3, 4), kind, low, high), T((4,), kind, low, high)), name="broadcast"),
                    Sample((T((2, 1, 4), kind, low, high), T((3, 1), kind, low, high)), name="broadcast-both")]


SPECIAL_UNARY = {
    "asinh": unary(), "arcsinh": unary(), "acosh": unary("positive", 1.1, 4), "arccosh": unary("positive", 1.1, 4),
    "atanh": unary("float", -0.9, 0.9), "arctanh": unary("float", -0.9, 0.9), "erfc": unary("float", -3, 3),
    "lgamma": unary("positive", 0.1, 6), "digamma": unary("positive", 0.1, 9), "i0": unary("float", -20, 20),
    "sinc": unary(), "deg2rad": unary(), "rad2deg": unary(), "logit": unary("prob"),
    "positive": unary(),
}
OPINFOS = [OpInfo(n, s) for n, s in SPECIAL_UNARY.items()]
OPINFOS += [
    OpInfo("lgamma", lambda: [Sample((T((5, 4), "float", -4.5, -0.1),), name="negative")], rtol=1e-4),
    OpInfo("digamma", lambda: [Sample((T((5, 4), "float", -4.5, 0.45),), name="reflected"),
                               Sample((T((5, 4), "float", 10, 1e4),), name="large")], rtol=1e-4),
    OpInfo("erfc", lambda: [Sample((T((4,), "float", 4, 9),), name="tail")], rtol=1e-4),
    OpInfo("i0", lambda: [Sample((T((4, 4), "float", 14, 16),), name="switch"),
                          Sample((T((4, 4), "float", -80, 80),), name="wide")], dtypes=("float64",)),
    OpInfo("special_i1", lambda: [Sample((T((3, 4), "float", -20, 20),)), Sample((T((4, 4), "float", 14, 16),))],
           reference=lambda torch, nnf: torch.special.i1),
    OpInfo("special.i1", lambda: [Sample((T((3, 4), "float", -20, 20),))], covers=("special_i1",)),
    *[OpInfo(f"special.{n}", s, covers=(f"special_{n}",)) for n, s in (
        ("ndtr", unary("float", -6, 6)), ("ndtri", unary("prob")), ("log_ndtr", unary("float", -30, 6)),
        ("erfcx", unary("float", -4, 30)), ("entr", unary("positive", 0.05, 4)), ("i0e", unary("float", -30, 30)),
        ("i1e", unary("float", -30, 30)))],
    OpInfo("special.ndtri", lambda: [Sample((T((4, 4), "float", 1e-12, 0.13),), name="lower-tail"),
                                     Sample((T((4, 4), "float", 0.87, 1 - 1e-12),), name="upper-tail")],
           covers=("special_ndtri",), dtypes=("float64",)),
    OpInfo("special.log_ndtr", lambda: [Sample((T((4, 4), "float", -300, -20),), name="far-tail")],
           covers=("special_log_ndtr",), dtypes=("float64",)),
    OpInfo("special.erfcx", lambda: [Sample((T((4, 4), "float", 4.5, 5.5),), name="switch"),
                                     Sample((T((4, 4), "float", 20, 1e6),), name="large")], covers=("special_erfcx",)),
    OpInfo("special.i0e", lambda: [Sample((T((4, 4), "float", 14, 16),), name="switch"),
                                   Sample((T((4, 4), "float", -700, 700),), name="wide")], covers=("special_i0e",)),
    OpInfo("special.i1e", lambda: [Sample((T((4, 4), "float", 14, 16),), name="switch"),
                                   Sample((T((4, 4), "float", -700, 700),), name="wide")], covers=("special_i1e",)),
    OpInfo("special.entr", lambda: [Sample((T((3, 4), "float", -1, 1),), name="signs")], grad=False,
           covers=("special_entr",)),
    OpInfo("special.xlog1py", lambda: [Sample((T((3, 4)), T((3, 4), "positive", 0.1, 3))),
                                       Sample((T((3, 4), "int", 0, 1, dtype="float32"), T((4,), "float", -0.9, 3)),
                                              name="zeros"),
                                       Sample((2.0, T((3, 4), "positive", 0.1, 3)), name="scalar-self")],
           covers=("special_xlog1py",)),
    # torch differentiates igamma/igammac in ``other`` only (a gradient for ``self`` raises: test_breadth35.py)
    *(OpInfo(name, lambda: [Sample((T((3, 4), "positive", 0.2, 8, grad=False), T((3, 4), "positive", 0.1, 10))),
                            Sample((T((3, 4), "positive", 0.5, 3, grad=False), T((4,), "positive", 0.1, 4)),
                                   name="broadcast"),
                            Sample((T((4,), "positive", 20, 60, grad=False), T((4,), "positive", 15, 70)),
                                   name="large")])
      for name in ("igamma", "igammac")),
    *(OpInfo(f"special.{name}", lambda: [Sample((T((3, 4), "positive", 0.2, 8, grad=False),
                                                 T((3, 4), "positive", 0.1, 10)))], covers=(op,))
      for name, op in (("gammainc", "igamma"), ("gammaincc", "igammac"))),
    *(OpInfo(name, lambda: [Sample((T((3, 4), "positive", 0.2, 8, grad=False), T((4,), "positive", 0.1, 10)))],
             call="method") for name in ("igamma", "igammac")),
    *(OpInfo(name, lambda: [Sample((T((3, 4), "positive", 0.2, 8), T((4,), "positive", 0.1, 10)))], call="method",
             grad=False) for name in ("igamma_", "igammac_")),
    OpInfo("polygamma", lambda: [Sample((1, T((3, 4), "positive", 0.2, 8))), Sample((2, T((3, 4), "positive", 0.2, 8))),
                                 Sample((0, T((3, 4), "positive", 0.2, 8))), Sample((3, T((4,), "positive", 3, 40)))],
           rtol=1e-4),
    OpInfo("polygamma", lambda: [Sample((T((3, 4), "positive", 0.2, 8), 1))], call="method", rtol=1e-4),
    OpInfo("mvlgamma", lambda: [Sample((T((3, 4), "positive", 2.1, 5), 1)),
                                Sample((T((3, 4), "positive", 2.1, 5), 3))]),
    OpInfo("logit", lambda: [Sample((T((3, 4), "prob"), 0.2), name="eps")]),
    OpInfo("logaddexp", binary()), OpInfo("logaddexp2", binary()), OpInfo("hypot", binary()),
    OpInfo("xlogy", lambda: [Sample((T((3, 4)), T((3, 4), "positive", 0.1, 3))),
                             Sample((T((3, 4), "int", 0, 1, dtype="float32"), T((4,), "positive", 0.1, 3)),
                                    name="zeros"),
                             Sample((2.0, T((3, 4), "positive", 0.1, 3)), name="scalar-self")]),
    OpInfo("fmax", lambda: [*binary()(), Sample((T((5, 4), "nan"), T((5, 4), "nan")), name="nan")]),
    OpInfo("fmin", lambda: [*binary()(), Sample((T((5, 4), "nan"), T((5, 4), "nan")), name="nan")]),
    OpInfo("nextafter", binary(), grad=False),
    OpInfo("heaviside", lambda: [Sample((T((3, 4), "int", -1, 1, dtype="float32"), T((4,), "float")))], grad=False,
           dtypes=("float32",)),
    OpInfo("ldexp", lambda: [Sample((T((3, 4)), T((3, 4), "int", 0, 3))),  # torch differentiates 2 ** other in integers
                           Sample((T((3, 4)), T((3, 4), "int", -3, 3, dtype="float32")), name="float-exponent")]),
    OpInfo("float_power", lambda: [Sample((T((3, 4), "positive", 0.5, 2), T((3, 4)))), Sample((T((3, 4)), 2))]),
    OpInfo("frexp", lambda: [Sample((T((3, 4), "float", -50, 50),))], covers=("frexp.Tensor",)),
    OpInfo("gcd", lambda: [Sample((T((3, 4), "int", -30, 30), T((3, 4), "int", -30, 30)))], dtypes=("int64",),
           grad=False),
    OpInfo("lcm", lambda: [Sample((T((3, 4), "int", -30, 30), T((4,), "int", -30, 30)))], dtypes=("int64",),
           grad=False),
    OpInfo("clamp_min", lambda: [Sample((T((3, 4)), 0.3)), Sample((T((3, 4)), T((4,))))]),
    OpInfo("clamp_max", lambda: [Sample((T((3, 4)), 0.3)), Sample((T((3, 4)), T((4,))))]),
]

# sets, counting, closeness
OPINFOS += [
    OpInfo("isclose", lambda: [Sample((T((3, 4)), T((3, 4)))), Sample((T((5, 4), "nan"), T((5, 4), "nan")), name="nan"),
                               Sample((T((5, 4), "nan"), T((5, 4), "nan")), {"equal_nan": True}, name="equal-nan"),
                               Sample((T((3, 4), "ties", 0, 3), T((4,), "ties", 0, 3)), {"rtol": 0.5, "atol": 0.1})],
           grad=False),
    OpInfo("allclose", lambda: [Sample((T((3, 4), "ties", 0, 1), T((3, 4), "ties", 0, 1))),
                                Sample((T((3, 4)), T((3, 4))), {"atol": 10.0})], grad=False),
    OpInfo("equal", lambda: [Sample((T((3, 4), "ties", 0, 1), T((3, 4), "ties", 0, 1))),
                             Sample((T((3, 4), "ties", 1, 1), T((3, 4), "ties", 1, 1)))], grad=False),
    OpInfo("unique", lambda: [Sample((T((4, 5), "ties", 0, 5),)), Sample((T((5, 4), "nan"),), name="nan"),
                              Sample((T((4, 5), "ties", 0, 5),), {"return_inverse": True, "return_counts": True}),
                              Sample((T((6, 2), "ties", 0, 1),), {"dim": 0, "return_inverse": True,
                                                                  "return_counts": True}, name="dim0"),
                              Sample((T((2, 6), "ties", 0, 1),), {"dim": 1, "return_counts": True}, name="dim1"),
                              Sample((T((), "ties", 0, 5),), {"return_inverse": True}, name="0-dim")],
           grad=False, covers=("unique_dim",)),
    OpInfo("unique_consecutive", lambda: [Sample((T((12,), "ties", 0, 2),), {"return_inverse": True,
                                                                             "return_counts": True}),
                                          Sample((T((6, 2), "ties", 0, 1),), {"dim": 0, "return_counts": True})],
           grad=False),
    OpInfo("isin", lambda: [Sample((T((3, 4), "ties", 0, 9), T((5,), "ties", 0, 9))),
                            Sample((T((3, 4), "ties", 0, 9), T((2, 2), "ties", 0, 9)), {"invert": True}),
                            Sample((T((3, 4), "ties", 0, 9), 3.0), name="scalar-test")], grad=False),
    OpInfo("bincount", lambda: [Sample((T((12,), "index", high=6),)), Sample((T((12,), "index", high=6),),
                                                                             {"minlength": 9}),
                                Sample((T((12,), "index", high=6), T((12,))), name="weights"),
                                Sample((T((0,), "index", high=6),), name="empty")], grad=False),
    OpInfo("histc", lambda: [Sample((T((20,)),)), Sample((T((20,)),), {"bins": 7, "min": -1, "max": 1}),
                             Sample((T((3, 5), "ties", 0, 3),), {"bins": 4})], grad=False),
    OpInfo("bucketize", lambda: [Sample((T((3, 4), "ties", 0, 9), T((5,), "distinct"))),
                                 Sample((T((3, 4), "ties", 0, 4), T((5,), "ties", 0, 4)), {"right": True}),
                                 Sample((T((3, 4)), T((6,), "distinct")), {"out_int32": True})], grad=False),
    OpInfo("nansum", lambda: [Sample((T((5, 4), "nan"),)), Sample((T((5, 4), "one_nan"), 1)),
                              Sample((T((2, 3, 4), "one_nan"), (0, 2), True))]),
    OpInfo("nanmean", lambda: [Sample((T((5, 4), "one_nan"),)), Sample((T((5, 4), "one_nan"), 1)),
                               Sample((T((2, 3, 4), "one_nan"), (0, 2), True))]),
    OpInfo("aminmax", lambda: [Sample((T((3, 4), "distinct"),)), Sample((T((3, 4), "distinct"),), {"dim": 1}),
                               Sample((T((3, 4), "distinct"),), {"dim": 0, "keepdim": True}),
                               Sample((T((3, 4), "distinct"),), {"keepdim": True}, name="all-keepdim")]),
    OpInfo("logcumsumexp", lambda: [Sample((T((3, 4)), 1)), Sample((T((3, 4), "float", -50, 50), 0)),
                                    Sample((T(()), 0), name="0-dim")]),
    OpInfo("argwhere", lambda: [Sample((T((3, 4), "int", 0, 1),))], grad=False),
    OpInfo("msort", lambda: [Sample((T((4, 3), "distinct"),))]),
]

# assembling and taking apart
OPINFOS += [
    OpInfo("atleast_1d", lambda: [Sample((T(()),)), Sample((T((3,)),)), Sample((T(()), T((2, 3))), name="several")],
           covers=("atleast_1d.Sequence",)),
    OpInfo("atleast_2d", lambda: [Sample((T(()),)), Sample((T((3,)),)), Sample(([T(()), T((3,))],), name="list")],
           covers=("atleast_2d.Sequence",)),
    OpInfo("atleast_3d", lambda: [Sample((T(()),)), Sample((T((3,)),)), Sample((T((2, 3)),)),
                                  Sample((T((2, 3, 4)),)),
                                  Sample((T((3,)), T((2, 3))), name="several")], covers=("atleast_3d.Sequence",)),
    OpInfo("dstack", lambda: [Sample(([T((3,)), T((3,))],)), Sample(([T((2, 3)), T((2, 3, 2))],))]),
    OpInfo("column_stack", lambda: [Sample(([T((3,)), T((3, 2)), T((3,))],)), Sample(([T(()), T((1, 2))],))]),
    OpInfo("row_stack", lambda: [Sample(([T((3,)), T((2, 3))],))]),
    OpInfo("hsplit", lambda: [Sample((T((4, 6)), 3)), Sample((T((6,)), [1, 4])), Sample((T((2, 6, 2)), [2]))],
           covers=("hsplit.int", "hsplit.array")),
    OpInfo("vsplit", lambda: [Sample((T((4, 6)), 2)), Sample((T((5, 2)), [1, 3]))],
           covers=("vsplit.int", "vsplit.array")),
    OpInfo("dsplit", lambda: [Sample((T((2, 2, 4)), 2)), Sample((T((2, 2, 5)), [3]))],
           covers=("dsplit.int", "dsplit.array")),
    OpInfo("rot90", lambda: [Sample((T((2, 3)),)), Sample((T((2, 3, 4)), 2, [2, 0])),
                             Sample((T((2, 3)), -1, [1, 0])),
                             Sample((T((2, 3)), 4))]),
    OpInfo("diff", lambda: [Sample((T((3, 5)),)), Sample((T((4, 3)), 2, 0)),
                            Sample((T((5,)), 1, -1, T((2,)), T((1,)))),
                            Sample((T((5,)), 9), name="past-length")]),
    OpInfo("diff", lambda: [Sample((T((6,), "bool"),)), Sample((T((6,), "int", -5, 5),))], grad=False),
    OpInfo("cartesian_prod", lambda: [Sample((T((2,)), T((3,)))), Sample((T((2,)), T((1,)), T((3,)))),
                                      Sample((T((4,)),))]),
    OpInfo("combinations", lambda: [Sample((T((4,)),)), Sample((T((4,)), 3)), Sample((T((3,)), 2, True)),
                                    Sample((T((2,)), 0))]),
    OpInfo("tril_indices", lambda: [Sample((3, 3)), Sample((4, 3, 1)), Sample((3, 5, -1)), Sample((0, 3))],
           grad=False, dtypes=("int64",)),
    OpInfo("triu_indices", lambda: [Sample((3, 3)), Sample((4, 3, 1)), Sample((3, 5, -1))], grad=False,
           dtypes=("int64",)),
    OpInfo("kron", lambda: [Sample((T((2, 3)), T((3, 2)))), Sample((T((2,)), T((3, 2)))),
                            Sample((T((2, 1, 2)), T((2,))))]),
    OpInfo("block_diag", lambda: [Sample((T((2, 2)), T(()), T((3,)), T((1, 2))))]),
    OpInfo("vander", lambda: [Sample((T((3,)),)), Sample((T((3,)), 5, True)), Sample((T((3,)), 0))],
           grad=False),  # torch fails to differentiate its own vander (an in-place cumprod)
    OpInfo("diagflat", lambda: [Sample((T((3,)),)), Sample((T((2, 2)), 1)), Sample((T((3,)), -2))]),
    OpInfo("trapezoid", lambda: [Sample((T((3, 5)),)), Sample((T((3, 5)),), {"dx": 0.5, "dim": 0}),
                                 Sample((T((3, 5)), T((5,), "distinct"))), Sample((T((3, 5)), T((3, 5)))),
                                 Sample((T((3, 5)), T((3,), "distinct")), {"dim": 0})],
           covers=("trapezoid.x", "trapezoid.dx")),
    OpInfo("trapz", lambda: [Sample((T((3, 5)), T((5,), "distinct"))), Sample((T((3, 5)),), {"dx": 2.0})],
           covers=("trapz.x", "trapz.dx")),
    OpInfo("cumulative_trapezoid", lambda: [Sample((T((3, 5)),)), Sample((T((3, 5)), T((5,), "distinct"))),
                                            Sample((T((3, 5)),), {"dx": 0.5, "dim": 0})],
           covers=("cumulative_trapezoid.x", "cumulative_trapezoid.dx")),
    OpInfo("select_scatter", lambda: [Sample((T((3, 4)), T((4,)), 0, 1)), Sample((T((3, 4)), T((3,)), 1, -1))]),
    OpInfo("slice_scatter", lambda: [Sample((T((6, 4)), T((2, 4))), {"start": 2, "end": 6, "step": 2}),
                                     Sample((T((3, 4)), T((3, 2)), 1, 1, 3))]),
    OpInfo("diagonal_scatter", lambda: [Sample((T((3, 4)), T((3,)))), Sample((T((3, 4)), T((2,)), 2)),
                                        Sample((T((2, 3, 4)), T((4, 2)), 0, 0, 1))]),
    OpInfo("narrow_copy", lambda: [Sample((T((3, 6)), 1, 2, 3))]),
]

# reductions into indexed positions, products with an added term, broadcasting and index arithmetic
SCATTER_SAMPLES = [
    (reduce, include_self)
    for reduce in ("sum", "mean", "amax", "amin") for include_self in (True, False)
]
OPINFOS += [
    OpInfo("scatter_reduce", lambda: [
        Sample((T((3, 5), "distinct"), 1, T((3, 4), "index", high=5), T((3, 4), "distinct", dtype=None)), {
            "reduce": r, "include_self": s}, name=f"{r}-{s}") for r, s in SCATTER_SAMPLES] + [
        Sample((T((4, 3), "positive", 0.5, 2), 0, T((6, 3), "index", high=4), T((6, 3), "positive", 0.5, 2), "prod"),
               name="prod-positive"),
        Sample((T((4, 3), "positive", 0.5, 2), 0, T((6, 3), "index", high=4), T((6, 3), "positive", 0.5, 2), "prod"),
               {"include_self": False}, name="prod-without-self")], covers=("scatter_reduce.two",)),
    OpInfo("scatter_reduce", lambda: [
        Sample((T((3, 5), "int", -9, 9), 1, T((3, 4), "index", high=5), T((3, 4), "int", -9, 9)),
               {"reduce": r, "include_self": s}, name=f"int-{r}-{s}")
        for r, s in [*SCATTER_SAMPLES, ("prod", True), ("prod", False)]],
           grad=False, dtypes=("int64",)),
    OpInfo("scatter_reduce", lambda: [Sample((T((3, 5), "distinct"), 1, T((3, 4), "index", high=5),
                                              T((3, 4), "distinct"), "amax"))], call="method"),
    # torch's older spelling (reduce="add" | "multiply"), which has no derivative in torch
    OpInfo("scatter", lambda: [
        Sample((T((3, 5), "distinct"), 1, T((3, 4), "index", high=5), T((3, 4), "distinct")), {"reduce": r},
               name=f"reduce-{r}") for r in ("add", "multiply")] + [
        Sample((T((3, 5), "distinct"), 0, T((2, 5), "index", high=3), 2.5), {"reduce": r}, name=f"value-{r}")
        for r in ("add", "multiply")], grad=False, covers=("scatter.reduce", "scatter.value_reduce")),
    OpInfo("index_reduce", lambda: [Sample((T((4, 3), "distinct"), 0, T((5,), "index", high=4),
                                            T((5, 3), "distinct"), r), {"include_self": s}, name=f"{r}-{s}")
                                    for r in ("mean", "amax", "amin") for s in (True, False)] + [
        Sample((T((4, 3), "positive", 0.5, 2), 0, T((5,), "index", high=4), T((5, 3), "positive", 0.5, 2), "prod"),
               name="prod")]),
    OpInfo("put", lambda: [Sample((T((3, 4)), T((5,), "index", high=12), T((5,)))),
                           Sample((T((3, 4)), T((2, 2), "index", high=12), T((4,)), True), name="accumulate")],
           call="method", noncontiguous=False),
    OpInfo("addmv", lambda: [Sample((T((3,)), T((3, 4)), T((4,)))),
                             Sample((T((1,)), T((3, 4)), T((4,))), {"beta": 0.5, "alpha": 2.0}),
                             Sample((T((3,)), T((3, 4)), T((4,))), {"beta": 0}, name="beta-0")]),
    OpInfo("addr", lambda: [Sample((T((3, 4)), T((3,)), T((4,)))),
                            Sample((T((4,)), T((3,)), T((4,))), {"beta": 2.0, "alpha": -1.0})]),
    OpInfo("addbmm", lambda: [Sample((T((3, 5)), T((2, 3, 4)), T((2, 4, 5)))),
                              Sample((T((5,)), T((2, 3, 4)), T((2, 4, 5))), {"beta": 0.5, "alpha": 2.0})]),
    OpInfo("broadcast_tensors", lambda: [Sample((T((3, 1)), T((4,)), T(())))]),
    OpInfo("unravel_index", lambda: [Sample((T((5,), "index", high=24), (2, 3, 4))),
                                     Sample((T((2, 2), "int", -24, 23), (4, 6)), name="negative")],
           grad=False, dtypes=("int64",)),
    OpInfo("logspace", lambda: [Sample((0, 2, 5)), Sample((-1.5, 3, 7), {"base": 2.0}),
                                Sample((0, 1, 4), {"dtype": None})], grad=False, dtypes=("float32",)),
]
OPINFOS += [OpInfo("adjoint", lambda: [Sample((T((3, 4)),)), Sample((T((2, 3, 4)),))], call="method")]
OPINFOS += [
    OpInfo("quantile", lambda: [Sample((T((4, 5), "distinct"), 0.3)), Sample((T((4, 5), "distinct"), 0.3, 1)),
                                Sample((T((4, 5), "distinct"), T((3,), "prob", grad=False), 0, True)),
                                Sample((T((4, 5), "distinct"), 0.37, 1), {"interpolation": "midpoint"}),
                                Sample((T((4, 5), "distinct"), 0.4, -1), {"interpolation": "nearest"}),
                                Sample((T((4, 5), "distinct"), 0.37), {"interpolation": "lower", "keepdim": True}),
                                Sample((T((4, 5), "distinct"), 0.37, 0), {"interpolation": "higher"}),
                                Sample((T((5, 4), "one_nan"), 0.5, 1), name="nan")]),
    OpInfo("nanquantile", lambda: [Sample((T((5, 4), "one_nan"), 0.5, 1)),
                                   Sample((T((5, 4), "one_nan"), T((2,), "prob", grad=False), 1, True)),
                                   Sample((T((5, 4), "nan"), 0.25), name="nan-all")]),
]
OPINFOS += [
    OpInfo("nanmedian", lambda: [Sample((T((5, 4), "one_nan"),)), Sample((T((5, 4), "one_nan"), 1)),
                                 Sample((T((5, 4), "distinct"), 0, True)), Sample((T((4, 3), "nan"), 1), name="nan"),
                                 Sample((T((3, 4), "distinct"),), name="all")], covers=("nanmedian.dim",)),
]
