"""Samples for scans, sorting, concatenation, padding, repetition, index-based selection and updates,
triangles and diagonals, and einsum."""

from __future__ import annotations

from dataclasses import dataclass

from opinfo import OpInfo, Sample, T


def S(*args, name: str = "", **kwargs) -> Sample:
    return Sample(args, kwargs, name=name)


def distinct(*shape) -> T:
    return T(shape, "distinct")


def index(shape, high) -> T:
    return T(shape, "index", high=high)


def with_nans(*shape) -> T:
    """Distinct floats with NaN and +-inf at random places (the per-slice NaN rules)."""
    return T(shape, "nan")


def one_nan(*shape) -> T:
    """Distinct floats with at most one NaN per innermost slice, for ops whose order among equal elements torch
    leaves unspecified (topk, kthvalue)."""
    return T(shape, "one_nan")


def with_zeros(*shape) -> T:
    """Small integers as floats: many slices hold one zero, some several."""
    return T(shape, "int", -2, 2, dtype="float64")


@dataclass
class SortedFirst(OpInfo):
    """searchsorted needs a sorted first argument: both frameworks sort the same random one first."""

    def resolve(self, module, functional):
        fn = getattr(module, self.name)
        return lambda seq, *args, **kwargs: fn(seq.sort(-1)[0], *args, **kwargs)


@dataclass
class WithSorter(OpInfo):
    """searchsorted of an unsorted first argument through its sorter: both frameworks argsort the same one."""

    def resolve(self, module, functional):
        fn = getattr(module, self.name)
        return lambda seq, *args, **kwargs: fn(seq, *args, sorter=seq.argsort(-1), **kwargs)


SCANS = [
    OpInfo("cumsum", lambda: [S(T((3, 4)), 1), S(T((3, 4)), -1), S(T((2, 3, 4)), 0), S(T(()), 0, name="0-dim"),
                              S(T((3, 0)), 1, name="empty"), S(T((3, 4), "int", -3, 3), 0, name="int"),
                              S(T((3, 4), "bool"), 1, name="bool"), S(with_nans(4, 5), 1, name="nan")]),
    OpInfo("cumprod", lambda: [S(T((3, 4)), 1), S(T((2, 3, 4)), -2), S(T(()), 0, name="0-dim"),
                               S(with_zeros(4, 6), 1, name="zeros"), S(with_zeros(6, 3), 0, name="zeros-dim0")]),
    OpInfo("cummax", lambda: [S(distinct(3, 4), 1), S(distinct(2, 3, 4), -2), S(T(()), 0, name="0-dim"),
                              S(T((3, 6), "int", 0, 3), 1, name="ties"), S(with_nans(4, 6), 1, name="nan"),
                              S(with_nans(2, 5, 3), 1, name="nan-dim1")]),
    OpInfo("cummin", lambda: [S(distinct(3, 4), 0), S(distinct(2, 3, 4), -1), S(T((3, 6), "int", 0, 3), 1,
                                                                                 name="ties"),
                              S(with_nans(4, 6), 1, name="nan"), S(with_nans(6, 4), 0, name="nan-dim0")]),
    OpInfo("sort", lambda: [S(distinct(3, 4)), S(distinct(3, 4), 0), S(distinct(3, 4), -1, True),
                            S(T(()), name="0-dim"), S(T((3, 0)), name="empty"),
                            S(T((4, 6), "int", 0, 3), stable=True, name="stable-ties"),
                            S(T((4, 6), "int", 0, 3), dim=0, stable=True, descending=True, name="stable-descending"),
                            S(with_nans(4, 6), stable=True, name="nan"),
                            S(with_nans(4, 6), dim=0, stable=True, descending=True, name="nan-descending")]),
    OpInfo("sort", lambda: [S(distinct(3, 4), 0), S(distinct(3, 4), descending=True)], call="method"),
    OpInfo("argsort", lambda: [S(distinct(3, 4)), S(distinct(3, 4), 0, True),
                               S(T((4, 6), "int", 0, 3), stable=True, name="stable-ties"),
                               S(with_nans(4, 6), dim=-1, descending=True, stable=True, name="nan")]),
    OpInfo("topk", lambda: [S(distinct(3, 5), 2), S(distinct(3, 5), 3, 0), S(distinct(3, 5), 2, -1, False),
                            S(distinct(3, 5), 0, name="k=0"), S(distinct(5), 5, name="k=n"),
                            S(one_nan(6, 5), 2, name="nan"), S(one_nan(6, 5), 3, -1, False, name="nan-smallest")]),
    OpInfo("topk", lambda: [S(distinct(3, 5), 2, largest=False)], call="method"),
    OpInfo("kthvalue", lambda: [S(distinct(3, 5), 2), S(distinct(3, 5), 1, 0, True), S(distinct(4, 5), 4, -2),
                                S(one_nan(6, 5), 5, name="nan-last"), S(one_nan(6, 5), 2, name="nan"),
                                S(T(()), 1, 0, name="0-dim")]),
    OpInfo("median", lambda: [S(distinct(3, 5)), S(distinct(3, 4)), S(distinct(3, 4), 1), S(distinct(3, 4), 0, True),
                              S(distinct(2, 3, 4), -1), S(with_nans(5, 4), 1, name="nan"),
                              S(with_nans(5, 4), name="nan-all"), S(one_nan(2, 3), name="one-nan-all"),
                              S(T(()), 0, name="0-dim"), S(with_nans(5, 4), 0, True, name="nan-keepdim")],
           covers=("median.dim",), torch_on_cpu=True),  # a row of two -inf: torch's CUDA picks the other one
    SortedFirst("searchsorted", lambda: [S(T((6,)), T((3, 4))), S(T((6,)), T((5,)), right=True),
                                         S(T((3, 6)), T((3, 4)), side="right"), S(T((6,)), 0.5, name="scalar"),
                                         S(T((6,)), T((4,)), out_int32=True)], grad=False),
    WithSorter("searchsorted", lambda: [S(T((7,)), T((3, 4))), S(T((3, 6)), T((3, 5)), right=True),
                                        S(T((5,)), T(()), side="left", out_int32=True, name="0-dim")], grad=False),
    OpInfo("prod", lambda: [S(with_zeros(4, 6)), S(with_zeros(4, 6), 1), S(with_zeros(6, 4), 0, True)]),
]

MOVEMENT = [
    OpInfo("cat", lambda: [S([T((2, 3)), T((4, 3))]), S([T((2, 3)), T((2, 5))], 1), S([T((2, 3)), T((2, 1))], -1),
                           S([T((2, 3)), T((0,)), T((1, 3))], name="legacy-empty"), S([T((0, 3)), T((2, 3))]),
                           S([T((2, 3))], name="single"), S([T((2, 3)), T((2, 3), "int")], name="promote")]),
    OpInfo("concat", lambda: [S([T((2, 3)), T((2, 2))], 1)]),
    OpInfo("concatenate", lambda: [S([T((2, 3)), T((1, 3))])]),
    OpInfo("stack", lambda: [S([T((2, 3)), T((2, 3))]), S([T((2, 3))] * 3, -1), S([T(()), T(())], name="0-dim")]),
    OpInfo("hstack", lambda: [S([T((2, 3)), T((2, 1))]), S([T((3,)), T((2,))]), S([T(()), T(())], name="0-dim")]),
    OpInfo("vstack", lambda: [S([T((2, 3)), T((1, 3))]), S([T((3,)), T((3,))]), S([T(()), T(())], name="0-dim")]),
    OpInfo("flip", lambda: [S(T((2, 3, 4)), (0, 2)), S(T((3, 4)), (-1,)), S(T((3, 4)), [0, 1]),
                            S(T(()), (), name="0-dim"), S(T((3, 0)), (1,), name="empty")]),
    OpInfo("flip", lambda: [S(T((2, 3, 4)), (0, -1)), S(T((2, 3)), 1)], call="method"),
    OpInfo("fliplr", lambda: [S(T((3, 4))), S(T((2, 3, 4)))]),
    OpInfo("flipud", lambda: [S(T((3,))), S(T((3, 4)))]),
    OpInfo("roll", lambda: [S(T((3, 4)), 1), S(T((3, 4)), -2, 1), S(T((3, 4)), (1, 2), (0, 1)), S(T((3, 4)), 5, -1),
                            S(T((3, 4)), 0, 0, name="no-shift"), S(T(()), 1, name="0-dim")]),
    OpInfo("pad", lambda: [
        S(T((2, 3)), (1, 2)), S(T((2, 3, 4)), (1, 1, 2, 0)), S(T((2, 3)), (-1, 1), name="negative"),
        S(T((2, 3)), (1, 1), "constant", 2.5, name="value"), S(T((2, 3)), (0, 0), name="zero"),
        S(T((2, 3, 4)), (0, 0, -1, -2), name="crop"),
        S(T((2, 3, 5)), (2, 1), "reflect"), S(T((2, 3, 4, 5)), (1, 2, 2, 1), "reflect"),
        S(T((2, 5)), (-1, 2), "reflect", name="reflect-negative"),
        S(T((2, 3, 5)), (2, 3), "replicate"), S(T((1, 2, 3, 4)), (1, 0, 2, 3), mode="replicate"),
        S(T((1, 2, 3, 4)), (1, 2, 3, 1), "circular"), S(T((2, 5)), (-1, 2), "circular", name="circular-negative"),
        S(T((1, 2, 2, 3, 4)), (1, 1, 1, 0, 0, 1), "replicate", name="3d")], call="F"),
    OpInfo("repeat", lambda: [S(T((2, 3)), (2, 1)), S(T((2, 3)), (2, 1, 3)), S(T(()), (3,), name="0-dim"),
                              S(T((2, 3)), 1, 1, name="ones"), S(T((2, 3)), 2, 0, name="zero")], call="method"),
    OpInfo("tile", lambda: [S(T((2, 3)), (2,)), S(T((2, 3)), (2, 1, 2)), S(T(()), (2, 2), name="0-dim")]),
    OpInfo("repeat_interleave", lambda: [
        S(T((2, 3)), 2), S(T((2, 3)), 2, 1), S(T((2, 3)), 3, -2), S(T(()), 2, name="0-dim"),
        S(T((2, 3)), T((3,), "int", 0, 3), 1, name="tensor"), S(T((3,)), T((3,), "int", 0, 2), name="tensor-flat"),
        S(T((2, 3)), T((1,), "int", 1, 3), 0, name="one-repeat"), S(T((4,), "int", 0, 3), name="repeats-only"),
        S(T((5,), "int", 0, 3, dtype="int32"), name="repeats-only-int32")],
        covers=("repeat_interleave.self_int", "repeat_interleave.self_Tensor", "repeat_interleave.Tensor")),
    OpInfo("repeat_interleave", lambda: [S(T((2, 3)), 2, dim=0)], call="method"),
    OpInfo("index_select", lambda: [S(T((3, 4)), 0, index((5,), 3)), S(T((3, 4)), -1, index((2,), 4)),
                                    S(T((3, 4)), 1, index((), 4), name="0-dim-index"),
                                    S(T(()), 0, index((1,), 1), name="0-dim"), S(T((3, 4)), 0, index((0,), 3))]),
    OpInfo("masked_select", lambda: [S(T((3, 4)), T((3, 4), "bool")), S(T((3, 4)), T((4,), "bool")),
                                     S(T((4,)), T((3, 4), "bool"), name="broadcast-self")]),
    OpInfo("masked_scatter", lambda: [S(T((3, 4)), T((3, 4), "bool"), T((12,))),
                                      S(T((3, 4)), T((4,), "bool"), T((3, 5))),
                                      S(T((4,)), T((2, 4), "bool"), T((9,)), name="broadcast-self")]),
    OpInfo("index_add", lambda: [S(T((5, 3)), 0, index((4,), 5), T((4, 3))),
                                 S(T((3, 5)), 1, index((2,), 5), T((3, 2)), alpha=2.0),
                                 S(T((3, 5)), -1, index((), 5), T((3, 1)), name="0-dim-index")]),
    OpInfo("index_copy", lambda: [S(T((5, 3)), 0, index((1,), 5), T((1, 3))), S(T((3, 5)), -1, index((1,), 5),
                                                                                 T((3, 1)))]),
    OpInfo("index_fill", lambda: [S(T((3, 4)), 1, index((2,), 4), -1.0), S(T((3, 4)), 0, index((1,), 3), T(())),
                                  S(T((3, 4), "int"), -1, index((3,), 4), 7, name="int")]),
    OpInfo("take", lambda: [S(T((3, 4)), index((5,), 12)), S(T((3, 4)), index((2, 2), 12)),
                            S(T((3, 4)), T((4,), "int", -12, 11), name="negative"), S(T(()), index((), 1))]),
    OpInfo("take_along_dim", lambda: [S(T((3, 4)), index((3, 2), 4), 1), S(T((3, 4)), index((5,), 12)),
                                      S(T((3, 4)), index((1, 2), 4), 1, name="broadcast-indices"),
                                      S(T((3, 1)), index((3, 2), 1), 1, name="broadcast-self"),
                                      S(T((2, 3, 4)), index((2, 3, 4), 3), -2)]),
    OpInfo("tril", lambda: [S(T((4, 5))), S(T((4, 5)), 1), S(T((2, 4, 3)), -1), S(T((3, 3)), 10),
                            S(T((3, 3), "bool"), name="bool")]),
    OpInfo("triu", lambda: [S(T((4, 5))), S(T((4, 5)), -1), S(T((2, 4, 3)), 2), S(T((3, 3)), -10)]),
    OpInfo("one_hot", lambda: [S(index((5,), 4)), S(index((2, 3), 3), 5), S(index((), 3), 3, name="0-dim")],
           call="F", grad=False),
    OpInfo("tensor_split", lambda: [S(T((7, 4)), 3), S(T((7, 4)), (2, 5)), S(T((3, 7)), (1, -2, 9), 1),
                                    S(T((3, 7)), 4, -1), S(T((3, 2)), 5, name="more-sections-than-elements")],
           covers=("tensor_split.sections", "tensor_split.indices")),
    OpInfo("meshgrid", lambda: [S(T((3,)), T((4,)), indexing="ij"), S(T((3,)), T((4,)), T((2,)), indexing="xy"),
                                S([T((3,)), T(())], indexing="ij", name="list")]),
    OpInfo("diag", lambda: [S(T((4,))), S(T((4,)), 1), S(T((3,)), -2), S(T((3, 4))), S(T((3, 4)), -1)]),
    OpInfo("diag_embed", lambda: [S(T((2, 3))), S(T((2, 3)), 1, 0, 2), S(T((3,)), -1), S(T((2, 3)), 0, -1, 0)]),
    OpInfo("trace", lambda: [S(T((3, 4))), S(T((3, 3), "int"), name="int")]),
    OpInfo("cross", lambda: [S(T((4, 3)), T((4, 3)), 1), S(T((3, 5)), T((3, 5)), 0),
                             S(T((4, 3)), T((1, 3)), -1, name="broadcast")]),
    OpInfo("einsum", lambda: [
        S("ij,jk->ik", T((2, 3)), T((3, 4))), S("bij,bjk->bik", T((2, 3, 4)), T((2, 4, 5))),
        S("ii->i", T((3, 3))), S("ii", T((3, 3)), name="trace"), S("ij->", T((2, 3))), S("ij->ji", T((2, 3))),
        S("...ij,...jk->...ik", T((2, 1, 3, 4)), T((5, 4, 2)), name="ellipsis-broadcast"),
        S("i,j->ij", T((3,)), T((4,))), S("ij,ij->ij", T((2, 3)), T((2, 3))),
        S("bn,anm,bm->ba", T((2, 3)), T((4, 3, 5)), T((2, 5)), name="three"), S("i...->...", T((3, 2, 4))),
        S("ij,jk", T((2, 3)), T((3, 4)), name="implicit"), S("...ii->...i", T((2, 3, 3))),
        S("iij->ij", T((3, 3, 2))), S("i,i->i", T((1,)), T((3,)), name="broadcast-size-1"),
        S("ij,kj->ik", T((2, 3)), T((4, 1)), name="broadcast-contracted"),
        S(" ij , jk -> ik ", T((2, 3)), T((3, 4)), name="spaces"), S("ij,jk->ik", [T((2, 3)), T((3, 4))], name="list"),
        S("ba,ab->", T((2, 3)), T((3, 2)))]),
]

INPLACE = [
    OpInfo("cumsum_", lambda: [S(T((3, 4)), 1)], call="method", grad=False),
    OpInfo("cumprod_", lambda: [S(T((3, 4)), 0)], call="method", grad=False),
    OpInfo("tril_", lambda: [S(T((3, 4)), 1)], call="method", grad=False),
    OpInfo("triu_", lambda: [S(T((3, 4)))], call="method", grad=False),
    OpInfo("index_add_", lambda: [S(T((5, 3)), 0, index((4,), 5), T((4, 3)))], call="method", grad=False),
    OpInfo("index_copy_", lambda: [S(T((5, 3)), 0, index((1,), 5), T((1, 3)))], call="method", grad=False),
    OpInfo("index_fill_", lambda: [S(T((3, 4)), 1, index((2,), 4), 3.0)], call="method", grad=False),
    OpInfo("masked_scatter_", lambda: [S(T((3, 4)), T((4,), "bool"), T((12,)))], call="method", grad=False),
]

OPINFOS = SCANS + MOVEMENT + INPLACE
