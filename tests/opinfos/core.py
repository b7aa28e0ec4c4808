"""Samples for the core pointwise, reduction, view, shape and matmul operators."""

from __future__ import annotations

from opinfo import Named, OpInfo, Sample, T

CL = Named("channels_last")


def binary(shape_a=(3, 4), shape_b=(3, 4), scalar=True):
    samples = [Sample((T(shape_a), T(shape_b)), name="same"),
               Sample((T(shape_a), T(shape_b[-1:])), name="broadcast"),
               Sample((T((2, 1, 4)), T((3, 1))), name="broadcast-both")]
    if scalar:
        samples.append(Sample((T(shape_a), 1.5), name="scalar"))
    return lambda: samples


def integer_division():
    """Integer dividends of both signs over positive, negative and scalar divisors (never zero)."""
    return [Sample((T((3, 4), "int", -9, 9), T((3, 4), "int", 1, 4)), name="int"),
            Sample((T((3, 4), "int", -9, 9), T((4,), "int", -4, -1)), name="int-negative-divisor"),
            Sample((T((3, 4), "int", -9, 9), -3), name="int-scalar")]


def implicit_softmax_dim():
    """torch.nn.functional's deprecated call without ``dim``: dim 0 of a 1- or 3-D input, dim 1 of a 2- or 4-D."""
    shapes = ((5,), (3, 4), (2, 3, 4), (2, 3, 2, 2))
    return [Sample((T(shape),), name=f"implicit-dim-{len(shape)}d") for shape in shapes]


def unary(kind="float", low=-2.0, high=2.0):
    return lambda: [Sample((T((3, 4), kind, low, high),)), Sample((T((), kind, low, high),), name="0-dim"),
                    Sample((T((2, 3, 5), kind, low, high),), name="3d")]


POINTWISE_UNARY = {
    "neg": unary(), "abs": unary(), "exp": unary(), "exp2": unary(), "expm1": unary(),
    "log": unary("positive", 0.1, 3), "log2": unary("positive", 0.1, 3), "log10": unary("positive", 0.1, 3),
    "log1p": unary("positive", 0.1, 3), "sqrt": unary("positive", 0.1, 3), "rsqrt": unary("positive", 0.1, 3),
    "reciprocal": unary("positive", 0.2, 3), "square": unary(), "sin": unary(), "cos": unary(), "tan": unary(
        "float", -1, 1), "asin": unary("float", -0.9, 0.9), "acos": unary("float", -0.9, 0.9), "atan": unary(),
    "sinh": unary(), "cosh": unary(), "tanh": unary(), "sigmoid": unary(), "erf": unary(),
    "erfinv": unary("float", -0.9, 0.9), "frac": unary(), "relu": unary(), "sign": unary(), "sgn": unary(),
}
def round_decimals():
    return [*unary("float", -200, 200)(), Sample((T((3, 4), "float", -200, 200),), {"decimals": 2}, name="decimals"),
            Sample((T((3, 4), "float", -200, 200),), {"decimals": -1}, name="negative-decimals")]


NO_GRAD_UNARY = {"floor": unary(), "ceil": unary(), "round": round_decimals, "trunc": unary(), "fix": unary(),
                 "isnan": unary(), "isinf": unary(), "isfinite": unary(), "signbit": unary(), "isposinf": unary(),
                 "isneginf": unary(), "logical_not": unary()}
ACTIVATIONS = {
    "relu6": unary("float", -8, 8), "silu": unary(), "mish": unary(), "hardswish": unary("float", -5, 5),
    "hardsigmoid": unary("float", -5, 5), "selu": unary(), "softsign": unary(), "logsigmoid": unary(),
}

OPINFOS = [OpInfo(n, s) for n, s in POINTWISE_UNARY.items()]
OPINFOS += [OpInfo(n, s, grad=False) for n, s in NO_GRAD_UNARY.items()]
OPINFOS += [OpInfo(n, s, call="F") for n, s in ACTIVATIONS.items()]
OPINFOS += [
    OpInfo("add", binary()), OpInfo("sub", binary()), OpInfo("mul", binary()), OpInfo("div", binary()),
    OpInfo("divide", lambda: [Sample((T((3, 4)), T((3, 4), "positive", 0.5, 2)), {"rounding_mode": "floor"}),
                              Sample((T((3, 4)), T((3, 4), "positive", 0.5, 2)), {"rounding_mode": "trunc"}),
                              Sample((T((3, 4), "int", -9, 9), T((3, 4), "int", 1, 4)), {"rounding_mode": "trunc"}),
                              Sample((T((3, 4), "int", -9, 9), T((3, 4), "int", 1, 4)), {"rounding_mode": "floor"}),
                              Sample((T((3, 4), "int", -9, 9), T((4,), "int", -4, -1)), {"rounding_mode": "trunc"}),
                              Sample((T((3, 4), "int", -9, 9), -3), {"rounding_mode": "trunc"})]),
    OpInfo("maximum", binary(scalar=False)), OpInfo("minimum", binary(scalar=False)),
    OpInfo("atan2", binary(scalar=False)),
    OpInfo("remainder", lambda: [Sample((T((3, 4)), T((3, 4), "positive", 0.5, 2))), *integer_division()]),
    OpInfo("fmod", lambda: [Sample((T((3, 4)), T((3, 4), "positive", 0.5, 2))), *integer_division()]),
    OpInfo("pow", lambda: [Sample((T((3, 4), "positive", 0.5, 2), T((3, 4)))), Sample((T((3, 4)), 2)),
                           Sample((T((3, 4), "positive", 0.5, 2), 0.5))]),
    OpInfo("floor_divide", lambda: [Sample((T((3, 4)), T((3, 4), "positive", 0.5, 2))), *integer_division()],
           grad=False),
    OpInfo("copysign", binary(scalar=False)),
    OpInfo("lerp", lambda: [Sample((T((3, 4)), T((3, 4)), T((3, 4), "prob"))), Sample((T((3, 4)), T((4,)), 0.3)),
                            Sample((T((3, 4)), T((4,)), 0.8), name="large-weight")]),
    OpInfo("addcmul", lambda: [Sample((T((3, 4)), T((3, 4)), T((4,))), {"value": 0.5})]),
    OpInfo("addcdiv", lambda: [Sample((T((3, 4)), T((3, 4)), T((4,), "positive", 0.5, 2)), {"value": 2.0})]),
    OpInfo("where", lambda: [Sample((T((3, 4), "bool"), T((3, 4)), T((3, 4)))),
                             Sample((T((3, 1), "bool"), T((4,)), 0.5))]),
    OpInfo("clamp", lambda: [Sample((T((3, 4)), -0.5, 0.5)), Sample((T((3, 4)),), {"min": 0.1}),
                             Sample((T((3, 4)), T((3, 4)), T((3, 4), "float", 2.5, 3)))]),
    OpInfo("nan_to_num", lambda: [Sample((T((3, 4)),), {"nan": 0.5})]),
    OpInfo("leaky_relu", lambda: [Sample((T((3, 4)), 0.2))], call="F"),
    OpInfo("threshold", lambda: [Sample((T((3, 4)), 0.1, -1.0))], call="F"),
    OpInfo("hardtanh", lambda: [Sample((T((3, 4)), -0.5, 0.7))], call="F"),
    OpInfo("gelu", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)),), {"approximate": "tanh"})], call="F"),
    # the activations' backward operators (torch's ATen ones): relu, threshold, hardtanh, relu6 and hardswish derive
    # through them
    OpInfo("threshold_backward", lambda: [Sample((T((3, 4)), T((3, 4)), 0.0)), Sample((T((3, 4)), T((4,)), 0.25))],
           reference=lambda torch, nnf: torch.ops.aten.threshold_backward),
    OpInfo("hardtanh_backward", lambda: [Sample((T((3, 4)), T((3, 4)), -0.5, 0.5))],
           reference=lambda torch, nnf: torch.ops.aten.hardtanh_backward),
    OpInfo("hardswish_backward", lambda: [Sample((T((3, 4)), T((3, 4))))],
           reference=lambda torch, nnf: torch.ops.aten.hardswish_backward),
    OpInfo("softplus", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4), "float", -30, 30), 2.0, 10.0))], call="F"),
    OpInfo("elu", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 0.5))], call="F"),
    OpInfo("celu", lambda: [Sample((T((3, 4)), 0.7))], call="F"),
    OpInfo("eq", binary(), grad=False), OpInfo("ne", binary(), grad=False), OpInfo("lt", binary(), grad=False),
    OpInfo("le", binary(), grad=False), OpInfo("gt", binary(), grad=False), OpInfo("ge", binary(), grad=False),
    OpInfo("logical_and", binary(scalar=False), grad=False), OpInfo("logical_or", binary(scalar=False), grad=False),
    OpInfo("logical_xor", binary(scalar=False), grad=False),
    OpInfo("bitwise_and", lambda: [Sample((T((3, 4), "int", 0, 9), T((3, 4), "int", 0, 9)))], grad=False),
    OpInfo("bitwise_or", lambda: [Sample((T((3, 4), "int", 0, 9), T((3, 4), "int", 0, 9)))], grad=False),
    OpInfo("bitwise_xor", lambda: [Sample((T((3, 4), "int", 0, 9), T((3, 4), "int", 0, 9)))], grad=False),
    OpInfo("bitwise_not", lambda: [Sample((T((3, 4), "int", -9, 9),))], grad=False),
    OpInfo("bitwise_left_shift", lambda: [Sample((T((3, 4), "int", 0, 9), T((3, 4), "int", 0, 3)))], grad=False),
    OpInfo("bitwise_right_shift", lambda: [Sample((T((3, 4), "int", 0, 99), T((3, 4), "int", 0, 3)))], grad=False),
    # reductions
    OpInfo("sum", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1)), Sample((T((2, 3, 4)), (0, 2), True)),
                           Sample((T((3, 4)), -1), {"keepdim": True})]),
    OpInfo("prod", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1)), Sample((T((2, 3, 4)), 1, True))]),
    OpInfo("mean", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1)), Sample((T((2, 3, 4)), (0, 2), True))]),
    OpInfo("amax", lambda: [Sample((T((3, 4), "distinct"),)), Sample((T((3, 4), "distinct"), 1)),
                            Sample((T((2, 3, 4), "distinct"), (0, 2), True)), Sample((T((5, 4), "nan"), 1), name="nan"),
                            Sample((T((2, 3, 4), "nan"), (0, 2), True), name="nan-dims")]),
    OpInfo("amin", lambda: [Sample((T((3, 4), "distinct"),)), Sample((T((3, 4), "distinct"), 0)),
                            Sample((T((5, 4), "nan"), 1), name="nan")]),
    OpInfo("max", lambda: [Sample((T((3, 4), "distinct"),)), Sample((T((3, 4), "distinct"), 1)),
                           Sample((T((3, 4), "distinct"), 0, True)), Sample((T((3, 4)), T((3, 4)))),
                           Sample((T((5, 4), "nan"),), name="nan-all"), Sample((T((5, 4), "nan"), 1), name="nan-dim"),
                           Sample((T((5, 4), "nan"), 0, True), name="nan-dim0"),
                           Sample((T((5, 4), "nan"), T((5, 4), "nan")), name="nan-other"),
                           Sample((T(()), 0), name="0-dim")],
           covers=("max.dim", "max.other")),
    OpInfo("min", lambda: [Sample((T((3, 4), "distinct"),)), Sample((T((3, 4), "distinct"), 1)),
                           Sample((T((3, 4)), T((4,)))), Sample((T((5, 4), "nan"),), name="nan-all"),
                           Sample((T((5, 4), "nan"), 1), name="nan-dim"),
                           Sample((T((5, 4), "nan"), T((4,), "nan")), name="nan-other")],
           covers=("min.dim", "min.other")),
    OpInfo("maximum", lambda: [Sample((T((5, 4), "nan"), T((5, 4), "nan")), name="nan"),
                               Sample((T((5, 4), "ties", -1, 1), T((4,), "ties", -1, 1)),
                                      name="ties")]),
    OpInfo("minimum", lambda: [Sample((T((5, 4), "nan"), T((5, 4), "nan")), name="nan")]),
    OpInfo("argmax", lambda: [Sample((T((3, 4), "distinct"),)), Sample((T((3, 4), "distinct"), 1, True)),
                              Sample((T((5, 4), "nan"), 1), name="nan"), Sample((T((5, 4), "nan"),), name="nan-all")],
           grad=False),
    OpInfo("argmin", lambda: [Sample((T((3, 4), "distinct"),)), Sample((T((3, 4), "distinct"), 0)),
                              Sample((T((5, 4), "nan"), 1), name="nan")], grad=False),
    OpInfo("any", lambda: [Sample((T((3, 4), "bool"),)), Sample((T((3, 4), "bool"), 1))], grad=False),
    OpInfo("all", lambda: [Sample((T((3, 4), "bool"),)), Sample((T((3, 4), "bool"), 0))], grad=False),
    OpInfo("var", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1)), Sample((T((3, 4)), 1), {"correction": 0}),
                           Sample((T((2, 3, 4)), (0, 2), True, True))]),
    OpInfo("std", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1), {"keepdim": True}),
                           Sample((T((3, 4), "ties", 1, 1), 1), name="constant"),
                           Sample((T((5, 4), "nan"), 1), name="nan")]),
    OpInfo("var_mean", lambda: [Sample((T((3, 4)), 1)), Sample((T((3, 4), "ties", 1, 1),), name="constant")]),
    OpInfo("std_mean", lambda: [Sample((T((3, 4)), 1)), Sample((T((2, 3, 4)), (0, 2), True), name="dims"),
                                Sample((T((3, 4), "ties", 1, 1), 0, True), name="constant")]),
    OpInfo("logsumexp", lambda: [Sample((T((3, 4)), 1)), Sample((T((2, 3, 4)), (0, 2), True))]),
    OpInfo("norm", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1, 1)), Sample((T((3, 4)), 3, 0))]),
    OpInfo("count_nonzero", lambda: [Sample((T((3, 4), "int", 0, 2),)), Sample((T((3, 4), "int", 0, 2), 1))],
           grad=False),
    # views and shape
    OpInfo("view", lambda: [Sample((T((3, 4)), (4, 3))), Sample((T((3, 4)), -1)), Sample((T((2, 6)), 3, 4))],
           call="method", noncontiguous=False),
    OpInfo("reshape", lambda: [Sample((T((3, 4)), (4, 3))), Sample((T((2, 3, 4)), (-1, 4)))]),
    OpInfo("permute", lambda: [Sample((T((2, 3, 4)), (2, 0, 1)))]),
    OpInfo("transpose", lambda: [Sample((T((2, 3, 4)), 0, 2)), Sample((T((3, 4)), -1, 0))]),
    OpInfo("t", lambda: [Sample((T((3, 4)),)), Sample((T((3,)),))]),
    OpInfo("expand", lambda: [Sample((T((3, 1)), 3, 4)), Sample((T((4,)), (2, 3, 4))), Sample((T((3, 1)), -1, 5))],
           call="method"),
    OpInfo("squeeze", lambda: [Sample((T((3, 1, 4, 1)),)), Sample((T((3, 1, 4)), 1)), Sample((T((3, 1, 1)), (1, 2)))]),
    OpInfo("unsqueeze", lambda: [Sample((T((3, 4)), 0)), Sample((T((3, 4)), -1))]),
    OpInfo("select", lambda: [Sample((T((3, 4)), 1, 2)), Sample((T((3, 4)), 0, -1))]),
    OpInfo("narrow", lambda: [Sample((T((3, 6)), 1, 2, 3))], covers=("slice",)),
    OpInfo("as_strided", lambda: [Sample((T((3, 4)), (2, 2), (1, 2), 1))], noncontiguous=False),
    OpInfo("diagonal", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1)), Sample((T((2, 3, 4)), -1, 1, 2))]),
    OpInfo("unfold", lambda: [Sample((T((3, 8)), 1, 3, 2))], call="method"),
    OpInfo("contiguous", lambda: [Sample((T((3, 4)),)), Sample((T((2, 3, 4, 5)),), {"memory_format": CL}),
                                  Sample((T((2, 3, 2, 4, 5)),), {"memory_format": Named("channels_last_3d")})],
           call="method"),
    OpInfo("flatten", lambda: [Sample((T((2, 3, 4)),)), Sample((T((2, 3, 4)), 1))]),
    OpInfo("unflatten", lambda: [Sample((T((2, 12)), 1, (3, 4)))]),
    OpInfo("movedim", lambda: [Sample((T((2, 3, 4)), 0, 2)), Sample((T((2, 3, 4)), (0, 1), (2, 0)))]),
    OpInfo("split", lambda: [Sample((T((5, 4)), 2)), Sample((T((5, 4)), (1, 4))), Sample((T((3, 6)), 4, 1))]),
    OpInfo("chunk", lambda: [Sample((T((5, 4)), 2)), Sample((T((3, 6)), 4, 1))]),
    OpInfo("unbind", lambda: [Sample((T((3, 4)),)), Sample((T((3, 4)), 1))]),
    OpInfo("view_as", lambda: [Sample((T((3, 4)), T((4, 3), grad=False)))], call="method", noncontiguous=False),
    OpInfo("reshape_as", lambda: [Sample((T((3, 4)), T((4, 3), grad=False)))], call="method"),
    OpInfo("expand_as", lambda: [Sample((T((3, 1)), T((3, 4), grad=False)))], call="method"),
    OpInfo("broadcast_to", lambda: [Sample((T((3, 1)), (2, 3, 4)))]),
    OpInfo("ravel", lambda: [Sample((T((3, 4)),))]),
    OpInfo("sum_to_size", lambda: [Sample((T((2, 3, 4)), (3, 1)))], call="method"),
    OpInfo("clone", lambda: [Sample((T((3, 4)),)), Sample((T((2, 3, 4, 5)),), {"memory_format": CL}),
                             Sample((T((2, 3, 4, 5)),), {"memory_format": Named("contiguous_format")})]),
    OpInfo("masked_fill", lambda: [Sample((T((3, 4)), T((3, 4), "bool"), 0.5)), Sample((T((3, 4)), T((4,), "bool"),
                                                                                      -1.0))]),
    OpInfo("gather", lambda: [Sample((T((3, 4)), 1, T((3, 2), "index", high=4)))]),
    OpInfo("scatter", lambda: [Sample((T((3, 4)), 1, T((3, 1), "index", high=4), T((3, 1))))],
           covers=("scatter.src", "scatter.value")),
    OpInfo("scatter_add", lambda: [Sample((T((3, 4)), 1, T((3, 6), "index", high=4), T((3, 6))))]),
    OpInfo("index_put", lambda: [Sample((T((3, 4)), (T((2,), "index", high=3),), T((4,))))]),
    OpInfo("nonzero", lambda: [Sample((T((3, 4), "int", 0, 1),)),
                               Sample((T((2, 3, 4), "int", -1, 1, dtype="float32"),), name="3d-float"),
                               Sample((T((5, 3), "bool"),), name="bool"), Sample((T((), "int", 0, 1),), name="0-dim"),
                               Sample((T((0, 3)),), name="empty")], grad=False),
    # matmul
    OpInfo("mm", lambda: [Sample((T((3, 4)), T((4, 5))))]),
    OpInfo("bmm", lambda: [Sample((T((2, 3, 4)), T((2, 4, 5))))]),
    OpInfo("matmul", lambda: [Sample((T((3, 4)), T((4, 5)))), Sample((T((4,)), T((4, 5)))),
                              Sample((T((3, 4)), T((4,)))),
                              Sample((T((2, 3, 4)), T((4, 5)))), Sample((T((2, 1, 3, 4)), T((3, 4, 2)))),
                              Sample((T((4,)), T((4,))))]),
    OpInfo("linear", lambda: [Sample((T((2, 3, 4)), T((5, 4)), T((5,)))), Sample((T((3, 4)), T((5, 4))))], call="F"),
    OpInfo("addmm", lambda: [Sample((T((3, 5)), T((3, 4)), T((4, 5)))), Sample((T((5,)), T((3, 4)), T((4, 5))),
                                                                              {"beta": 0.5, "alpha": 2.0})]),
    # use_gelu: tilewise applies GELU's tanh approximation (torch's CUDA epilogue), torch's CPU kernel the exact
    # GELU; tests/test_compiler_cuda.py checks that case against gelu(approximate="tanh")
    OpInfo("_addmm_activation", lambda: [Sample((T((5,)), T((3, 4)), T((4, 5)))),
                                         Sample((T((3, 5)), T((3, 4)), T((4, 5))), {"beta": 0.5, "alpha": 2.0})],
           grad=False),  # torch defines no derivative for it (ours flows through the decomposition)
    # the compiler's CUDA target runs a linear + GELU(tanh) of a training step as these (cuBLASLt epilogues)
    OpInfo("_addmm_gelu", lambda: [Sample((T((5,)), T((3, 4)), T((4, 5))))],
           reference=lambda torch, nnf: lambda b, m1, m2: (nnf.gelu(torch.addmm(b, m1, m2), approximate="tanh"),
                                                          torch.addmm(b, m1, m2))),
    OpInfo("_mm_gelu_backward", lambda: [Sample((T((3, 4)), T((4, 5)), T((3, 5))))],
           reference=lambda torch, nnf: lambda m1, m2, pre: torch.ops.aten.gelu_backward(m1.mm(m2), pre,
                                                                                        approximate="tanh")),
    OpInfo("baddbmm", lambda: [Sample((T((2, 3, 5)), T((2, 3, 4)), T((2, 4, 5))))]),
    OpInfo("outer", lambda: [Sample((T((3,)), T((4,))))]),
    OpInfo("dot", lambda: [Sample((T((4,)), T((4,))))]),
    OpInfo("inner", lambda: [Sample((T((4,)), T((4,)))), Sample((T((2, 4)), T((3, 4)))),
                             Sample((T((2, 1, 4)), T((4,)))), Sample((T((3,)), T(()))),
                             Sample((T((2, 0)), T((3, 0))))]),
    OpInfo("softmax", lambda: [Sample((T((3, 4)), 1)), Sample((T((2, 3, 4)), 0)), *implicit_softmax_dim()],
           call="F", covers=("_softmax_backward_data",)),
    OpInfo("log_softmax", lambda: [Sample((T((3, 4)), 1)), Sample((T((2, 3, 4)), -1)), *implicit_softmax_dim()],
           call="F", covers=("_log_softmax_backward_data",)),
]
