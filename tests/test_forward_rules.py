"""The written tangent rules (``fwd=``) on the cases the operator table's first samples do not reach: zeros in a
product, ties, NaNs, every norm order, every loss reduction, probability targets, masks, eval-mode batch norm,
full and wide matrix decompositions. Each case is checked against torch's forward AD (float64, same tangents);
where torch has no forward rule, against our own reverse mode (``<u, J t> == <J^T u, t>``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as torch_fwad

import tilewise as tw
import tilewise.autograd.forward_ad as fwAD

RNG = np.random.default_rng(0)


def _normal(*shape):
    return RNG.standard_normal(shape)


def _with_zeros(*shape):
    x = _normal(*shape)
    x.reshape(-1)[::4] = 0.0
    return x


def _ties(*shape):
    return RNG.integers(-2, 3, size=shape).astype(np.float64)


def _spd(n, batch=()):
    a = RNG.standard_normal((*batch, n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _lib_tensor(lib, array):
    return lib.from_numpy(np.array(array))


def _jvp(lib, ad, fn, primals, tangents):
    """(outputs, their tangents) of ``fn(lib, *primals)`` in forward mode, as numpy arrays (None: no tangent)."""
    with ad.dual_level():
        duals = [ad.make_dual(_lib_tensor(lib, p), _lib_tensor(lib, t)) for p, t in zip(primals, tangents)]
        out = fn(lib, *duals)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        pairs = []
        for o in outs:
            t = ad.unpack_dual(o).tangent if o.dtype.is_floating_point else None
            if t is not None and lib is torch and t._is_zerotensor():
                t = torch.zeros_like(o)
            pairs.append((o.detach().numpy().copy(), None if t is None else t.detach().numpy().copy()))
    return pairs


def _check_against_torch(fn, primals):
    tangents = [_normal(*np.shape(p)) for p in primals]
    ours = _jvp(tw, fwAD, fn, primals, tangents)
    theirs = _jvp(torch, torch_fwad, fn, primals, tangents)
    for k, ((o, t), (e, et)) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(o, e, rtol=1e-10, atol=1e-12, err_msg=f"output {k}")
        if et is None:
            continue
        got = np.zeros_like(et) if t is None else t
        np.testing.assert_allclose(got, et, rtol=1e-8, atol=1e-10, equal_nan=True, err_msg=f"tangent {k}")


def _check_adjoint(fn, primals):
    """``<u, J t>`` by our forward rule against ``<J^T u, t>`` by our backward, in float64."""
    tangents = [_normal(*np.shape(p)) for p in primals]
    pairs = _jvp(tw, fwAD, fn, primals, tangents)
    leaves = [_lib_tensor(tw, p).requires_grad_() for p in primals]
    out = fn(tw, *leaves)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if o.dtype.is_floating_point]
    cotangents = [_normal(*o.shape) for o in outs]
    grads = tw.autograd.grad([o for o in outs if o.requires_grad],
                             leaves, [tw.from_numpy(u) for u, o in zip(cotangents, outs) if o.requires_grad],
                             allow_unused=True)
    forward = sum(float(np.sum(u * t)) for u, (_, t) in zip(cotangents, pairs) if t is not None)
    reverse = sum(float(np.sum(g.numpy() * t)) for g, t in zip(grads, tangents) if g is not None)
    assert abs(forward - reverse) <= 1e-10 * (1 + abs(forward) + abs(reverse)), (forward, reverse)


def _sign_free(factors):
    """Eigen- and singular vectors up to sign (LAPACKs choose signs differently): each vector's elements squared;
    of a full U or Vh, the columns (rows) beyond the singular values are any basis, so they are left out."""
    if len(factors) == 2:
        values, vectors = factors
        return values, vectors * vectors
    u, s, vh = factors
    k = s.shape[-1]
    u, vh = u[..., :k], vh[..., :k, :]
    return u * u, s, vh * vh


def F(lib):  # noqa: N802 — torch's spelling
    return lib.nn.functional


def _index(lib, array):
    return lib.from_numpy(np.asarray(array, dtype=np.int64))


BCE_WEIGHT = RNG.uniform(0.5, 2, (3, 4))
CLASSES = RNG.integers(0, 5, size=(4, 3))
CLASSES[0, 0] = -100
SCATTER_INDEX = RNG.integers(0, 3, size=(4, 5))

AGAINST_TORCH = {
    # reductions and selections
    "prod_zeros_dim": (lambda lib, x: x.prod(1), [_with_zeros(3, 4, 2)]),
    "prod_zeros_all": (lambda lib, x: x.prod(), [_with_zeros(2, 3)]),
    "prod_dtype": (lambda lib, x: x.prod(0, keepdim=True), [_normal(4, 3)]),
    "cumprod_zeros": (lambda lib, x: x.cumprod(1), [_with_zeros(3, 6)]),
    "cumprod_0d": (lambda lib, x: x.cumprod(0), [np.array(1.5)]),
    "amax_ties": (lambda lib, x: x.amax((0, 2)), [_ties(3, 4, 2)]),
    "amin_ties_keepdim": (lambda lib, x: x.amin(1, keepdim=True), [_ties(3, 5)]),
    "logsumexp_dims": (lambda lib, x: x.logsumexp((0, 2), keepdim=True), [_normal(2, 3, 4)]),
    "nansum_nan": (lambda lib, x: x.nansum(1), [np.where(_normal(3, 4) > 0.5, np.nan, _normal(3, 4))]),
    "max_dim_keepdim": (lambda lib, x: x.max(1, keepdim=True), [_normal(3, 4, 2)]),
    "min_dim": (lambda lib, x: x.min(0), [_normal(3, 4)]),
    "max_dim_0d": (lambda lib, x: x.max(0), [np.array(0.3)]),
    "median_dim": (lambda lib, x: x.median(1), [_normal(3, 5)]),
    "nanmedian_dim": (lambda lib, x: x.nanmedian(1), [np.where(_normal(3, 5) > 1.0, np.nan, _normal(3, 5))]),
    "mode": (lambda lib, x: x.mode(0, keepdim=True), [_ties(5, 3)]),
    "kthvalue": (lambda lib, x: x.kthvalue(2, 0), [_normal(4, 3)]),
    "sort_descending": (lambda lib, x: x.sort(0, descending=True), [_normal(5, 3)]),
    "topk_smallest": (lambda lib, x: x.topk(2, 1, largest=False), [_normal(3, 6)]),
    "cummax": (lambda lib, x: x.cummax(1), [_ties(3, 6)]),
    "cummin": (lambda lib, x: x.cummin(0), [_normal(5, 2)]),
    "norm_fro_dim": (lambda lib, x: x.norm("fro", dim=(0, 1)), [_normal(3, 4, 2)]),
    "norm_1": (lambda lib, x: x.norm(1, dim=1), [_normal(3, 4)]),
    "norm_3": (lambda lib, x: x.norm(3, dim=0, keepdim=True), [_normal(3, 4)]),
    "norm_inf": (lambda lib, x: x.norm(float("inf"), dim=1), [_normal(3, 4)]),
    "norm_nuc": (lambda lib, x: x.norm("nuc"), [_normal(4, 3)]),
    "vector_norm_zero": (lambda lib, x: x.norm(dim=1), [np.concatenate([np.zeros((1, 3)), _normal(2, 3)])]),
    "frexp": (lambda lib, x: lib.frexp(x), [_normal(3, 4) * 10]),
    "ldexp": (lambda lib, x: lib.ldexp(x, _index(lib, [[1, 0, 3]])), [_normal(2, 3)]),
    "ldexp_float_exponent": (lambda lib, x, e: lib.ldexp(x, e), [_normal(2, 3), _normal(2, 3)]),
    "mvlgamma": (lambda lib, x: lib.mvlgamma(x, 3), [RNG.uniform(2, 4, size=(3, 4))]),
    "scatter_reduce_sum": (lambda lib, x, s: x.scatter_reduce(1, _index(lib, SCATTER_INDEX), s, "sum"),
                           [_normal(4, 3), _normal(4, 5)]),
    "scatter_reduce_mean_exclusive": (
        lambda lib, x, s: x.scatter_reduce(1, _index(lib, SCATTER_INDEX), s, "mean", include_self=False),
        [_normal(4, 3), _normal(4, 5)]),
    # pooling and convolution
    "max_pool2d_indices": (lambda lib, x: F(lib).max_pool2d(x, 3, 2, 1, dilation=1, ceil_mode=True,
                                                             return_indices=True), [_normal(2, 3, 7, 6)]),
    "max_pool1d_unbatched": (lambda lib, x: F(lib).max_pool1d(x, 2, return_indices=True), [_normal(3, 8)]),
    "max_pool3d_dilated": (lambda lib, x: F(lib).max_pool3d(x, 2, 1, 0, dilation=2, return_indices=True),
                           [_normal(1, 2, 5, 5, 5)]),
    "adaptive_max_pool2d": (lambda lib, x: F(lib).adaptive_max_pool2d(x, (3, 2), return_indices=True),
                            [_normal(2, 2, 7, 5)]),
    "fractional_max_pool2d": (lambda lib, x: F(lib).fractional_max_pool2d(
        x, 2, output_size=(3, 3), return_indices=True,
        _random_samples=lib.from_numpy(np.array([[[0.3, 0.7], [0.1, 0.9]]]))), [_normal(1, 2, 7, 7)]),
    "avg_pool2d_no_pad_count": (lambda lib, x: F(lib).avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                                                 count_include_pad=False), [_normal(2, 2, 6, 7)]),
    "avg_pool3d_divisor": (lambda lib, x: F(lib).avg_pool3d(x, 2, divisor_override=3), [_normal(1, 2, 4, 4, 4)]),
    "adaptive_avg_pool3d": (lambda lib, x: F(lib).adaptive_avg_pool3d(x, (2, 3, 2)), [_normal(1, 2, 5, 5, 3)]),
    "conv2d_groups": (lambda lib, x, w: F(lib).conv2d(x, w, None, 2, 1, 2, 2), [_normal(2, 4, 7, 7),
                                                                             _normal(6, 2, 3, 3)]),
    "conv3d": (lambda lib, x, w: F(lib).conv3d(x, w, padding=1), [_normal(1, 2, 4, 4, 4), _normal(3, 2, 2, 2, 2)]),
    "conv_transpose2d_output_padding": (
        lambda lib, x, w: F(lib).conv_transpose2d(x, w, None, 2, 1, 1, 1), [_normal(1, 2, 4, 5), _normal(2, 3, 3, 3)]),
    "conv_transpose3d": (lambda lib, x, w: F(lib).conv_transpose3d(x, w, stride=2), [_normal(1, 2, 3, 3, 3),
                                                                                    _normal(2, 2, 2, 2, 2)]),
    # normalization and attention
    "layer_norm_affine": (lambda lib, x, w, b: F(lib).layer_norm(x, (3, 4), w, b), [_normal(2, 3, 4), _normal(3, 4),
                                                                                     _normal(3, 4)]),
    "rms_norm_weight": (lambda lib, x, w: F(lib).rms_norm(x, (4,), w), [_normal(3, 4), _normal(4)]),
    "batch_norm_training": (lambda lib, x, w, b: F(lib).batch_norm(x, None, None, w, b, training=True),
                            [_normal(4, 3, 5), _normal(3), _normal(3)]),
    "batch_norm_eval": (lambda lib, x, w, b: F(lib).batch_norm(
        x, lib.from_numpy(np.array([0.1, -0.2, 0.3])), lib.from_numpy(np.array([1.5, 0.5, 2.0])), w, b),
        [_normal(4, 3, 2, 2), _normal(3), _normal(3)]),
    "group_norm": (lambda lib, x, w, b: F(lib).group_norm(x, 2, w, b), [_normal(2, 4, 3), _normal(4), _normal(4)]),
    "sdpa_float_mask": (lambda lib, q, k, v, m: F(lib).scaled_dot_product_attention(q, k, v, m),
                        [_normal(2, 3, 4, 5), _normal(2, 3, 6, 5), _normal(2, 3, 6, 2), _normal(4, 6)]),
    "sdpa_causal": (lambda lib, q, k, v: F(lib).scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
                    [_normal(2, 5, 3), _normal(2, 5, 3), _normal(2, 5, 4)]),
    "sdpa_bool_mask": (lambda lib, q, k, v: F(lib).scaled_dot_product_attention(
        q, k, v, lib.from_numpy(np.tril(np.ones((4, 4), dtype=bool)))), [_normal(4, 3), _normal(4, 3), _normal(4, 3)]),
    # losses
    "cross_entropy_weighted_smoothed": (lambda lib, x: F(lib).cross_entropy(
        x, _index(lib, CLASSES), lib.from_numpy(np.array([1.0, 2.0, 0.5, 1.5, 1.0])), label_smoothing=0.2),
        [_normal(4, 5, 3)]),
    "cross_entropy_none": (lambda lib, x: F(lib).cross_entropy(x, _index(lib, CLASSES), reduction="none"),
                           [_normal(4, 5, 3)]),
    "cross_entropy_probabilities": (lambda lib, x, p: F(lib).cross_entropy(x, p.softmax(1), reduction="sum"),
                                    [_normal(3, 4), _normal(3, 4)]),
    "cross_entropy_probabilities_smoothed": (
        lambda lib, x, p: F(lib).cross_entropy(x, p.softmax(0), label_smoothing=0.1), [_normal(5), _normal(5)]),
    "nll_loss_weighted": (lambda lib, x: F(lib).nll_loss(x, _index(lib, CLASSES[:, 0].clip(0)),
                                                         lib.from_numpy(np.array([1.0, 2.0, 0.5, 1.5, 1.0]))),
                          [_normal(4, 5)]),
    "binary_cross_entropy_weighted": (lambda lib, x, t: F(lib).binary_cross_entropy(
        x.sigmoid(), t.sigmoid(), lib.from_numpy(BCE_WEIGHT), reduction="none"),
        [_normal(3, 4), _normal(3, 4)]),
    "binary_cross_entropy_mean": (lambda lib, x, t: F(lib).binary_cross_entropy(x.sigmoid(), t.sigmoid()),
                                  [_normal(3, 4), _normal(3, 4)]),
    "bce_with_logits_weighted": (lambda lib, x, t: F(lib).binary_cross_entropy_with_logits(
        x, t.sigmoid(), _lib_tensor(lib, BCE_WEIGHT[0]), pos_weight=_lib_tensor(lib, BCE_WEIGHT[1]),
        reduction="sum"), [_normal(3, 4), _normal(3, 4)]),
    "bce_with_logits_none": (lambda lib, x, t: F(lib).binary_cross_entropy_with_logits(x, t, reduction="none"),
                             [_normal(3, 4), _normal(3, 4)]),
    "huber_mean": (lambda lib, x, t: F(lib).huber_loss(x, t, delta=0.5), [_normal(3, 4), _normal(3, 4)]),
    "smooth_l1_none": (lambda lib, x, t: F(lib).smooth_l1_loss(x, t, reduction="none", beta=0.7),
                       [_normal(3, 4), _normal(3, 4)]),
    "mse_sum": (lambda lib, x, t: F(lib).mse_loss(x, t, reduction="sum"), [_normal(3, 4), _normal(3, 4)]),
    # recurrent cells
    "lstm_cell": (lambda lib, x, h, c, wi, wh: lib.lstm_cell(x, (h, c), wi, wh),
                  [_normal(3, 4), _normal(3, 2), _normal(3, 2), _normal(8, 4), _normal(8, 2)]),
    "gru_cell": (lambda lib, x, h, wi, wh, bi: lib.gru_cell(x, h, wi, wh, bi),
                 [_normal(3, 4), _normal(3, 2), _normal(6, 4), _normal(6, 2), _normal(6)]),
    # matrix functions
    "solve_batched": (lambda lib, a, b: lib.linalg.solve(a, b), [_normal(2, 3, 3), _normal(2, 3, 2)]),
    "solve_vector": (lambda lib, a, b: lib.linalg.solve(a, b), [_normal(3, 3), _normal(3)]),
    "inv": (lambda lib, a: lib.linalg.inv(a), [_normal(2, 3, 3)]),
    "det": (lambda lib, a: lib.linalg.det(a), [_normal(2, 3, 3)]),
    "slogdet": (lambda lib, a: lib.linalg.slogdet(a), [_normal(3, 3)]),
    "cholesky_upper": (lambda lib, a: lib.linalg.cholesky(a, upper=True), [_spd(3, (2,))]),
    "cholesky_solve_upper": (lambda lib, b, u: lib.cholesky_solve(b, u, upper=True),
                             [_normal(3, 2), np.linalg.cholesky(_spd(3)).T]),
    "cholesky_solve_lower": (lambda lib, b, low: lib.cholesky_solve(b, low),
                             [_normal(3, 2), np.linalg.cholesky(_spd(3))]),
    "qr_tall": (lambda lib, a: lib.linalg.qr(a), [_normal(5, 3)]),
    "qr_wide": (lambda lib, a: lib.linalg.qr(a), [_normal(3, 5)]),
    "qr_complete_wide": (lambda lib, a: lib.linalg.qr(a, mode="complete"), [_normal(2, 4)]),
    "svd_full_tall": (lambda lib, a: _sign_free(lib.linalg.svd(a, full_matrices=True)), [_normal(5, 3)]),
    "svd_full_wide": (lambda lib, a: _sign_free(lib.linalg.svd(a, full_matrices=True)), [_normal(2, 3, 5)]),
    "svd_reduced": (lambda lib, a: _sign_free(lib.linalg.svd(a, full_matrices=False)), [_normal(4, 4)]),
    "svdvals": (lambda lib, a: lib.linalg.svdvals(a), [_normal(3, 5)]),
    "eigh_upper": (lambda lib, a: _sign_free(lib.linalg.eigh(a, UPLO="U")), [_normal(4, 4)]),
    "eigvalsh": (lambda lib, a: lib.linalg.eigvalsh(a), [_normal(2, 3, 3)]),
    "solve_triangular_right_upper_unit": (lambda lib, a, b: lib.linalg.solve_triangular(
        a, b, upper=True, left=False, unitriangular=True), [_normal(3, 3), _normal(2, 3)]),
    "solve_triangular_lower": (lambda lib, a, b: lib.linalg.solve_triangular(a + 3 * lib.eye(3, dtype=a.dtype), b,
                                                                              upper=False),
                               [_normal(3, 3), _normal(3, 2)]),
    "lstsq_tall_residuals": (lambda lib, a, b: lib.linalg.lstsq(a, b, driver="gelsd")[:2],
                             [_normal(5, 3), _normal(5, 2)]),
    "lstsq_wide": (lambda lib, a, b: lib.linalg.lstsq(a, b)[0], [_normal(2, 4), _normal(2, 3)]),
    "pinv_tall": (lambda lib, a: lib.linalg.pinv(a), [_normal(5, 3)]),
    "pinv_wide": (lambda lib, a: lib.linalg.pinv(a), [_normal(2, 3, 4)]),
    "matrix_exp": (lambda lib, a: lib.linalg.matrix_exp(a), [_normal(2, 3, 3) * 0.5]),
}


@pytest.mark.parametrize("case", sorted(AGAINST_TORCH))
def test_tangent_matches_torch(case):
    fn, primals = AGAINST_TORCH[case]
    _check_against_torch(fn, primals)


AGAINST_REVERSE_MODE = {  # torch has no forward rule for these (or a rule that is not its own backward's adjoint)
    "scatter_reduce_prod": (lambda lib, x, s: x.scatter_reduce(1, _index(lib, SCATTER_INDEX), s, "prod"),
                            [_normal(4, 3), _normal(4, 5)]),
    "scatter_reduce_amax_exclusive": (
        lambda lib, x, s: x.scatter_reduce(1, _index(lib, SCATTER_INDEX), s, "amax", include_self=False),
        [_normal(4, 3), _normal(4, 5)]),
    "scatter_reduce_amin_ties": (lambda lib, x, s: x.scatter_reduce(1, _index(lib, SCATTER_INDEX), s, "amin"),
                                 [_ties(4, 3), _ties(4, 5)]),
    "cross_map_lrn2d": (lambda lib, x: lib.ops.registry.OPS["_cross_map_lrn2d"](x, 3, 0.1, 0.75, 1.0)
                        if lib is tw else None, [_normal(2, 5, 3, 2)]),
    "lstm_layer": (lambda lib, g, h, c, w: lib.ops.registry.OPS["_lstm_layer"](g, h, c, w),
                   [_normal(5, 2, 12), _normal(2, 3), _normal(2, 3), _normal(12, 3)]),
    "soft_margin": (lambda lib, x, t: F(lib).soft_margin_loss(x, t, reduction="none"),
                    [_normal(3, 4), _normal(3, 4)]),
    "bce_with_logits_all_tangents": (lambda lib, x, t, w, p: F(lib).binary_cross_entropy_with_logits(
        x, t.sigmoid(), w, pos_weight=p, reduction="none"), [_normal(3, 4), _normal(3, 4), _normal(4), _normal(4)]),
    "ldexp_negative_exponent": (lambda lib, x: lib.ldexp(x, _index(lib, [[1, -2, 3]])), [_normal(2, 3)]),
    "cholesky_lower": (lambda lib, a: lib.linalg.cholesky(a + a.mT), [_spd(3)]),
}


@pytest.mark.parametrize("case", sorted(AGAINST_REVERSE_MODE))
def test_tangent_is_the_adjoint_of_the_gradient(case):
    fn, primals = AGAINST_REVERSE_MODE[case]
    _check_adjoint(fn, primals)


ON_THE_GPU = ["conv2d_groups", "conv_transpose2d_output_padding", "sdpa_causal", "sdpa_float_mask", "layer_norm_affine",
              "rms_norm_weight", "batch_norm_training", "max_pool2d_indices", "avg_pool2d_no_pad_count",
              "cumprod_zeros", "logsumexp_dims", "amax_ties", "sort_descending", "lstm_cell", "svd_reduced", "det"]


@pytest.mark.cuda
@pytest.mark.parametrize("case", ON_THE_GPU)
def test_tangent_on_the_gpu_matches_torch(case):
    """The same rules on CUDA tensors (float32): tilewise's tangents against torch's on the CPU."""
    fn, primals = AGAINST_TORCH[case]
    primals = [np.asarray(p, dtype=np.float32) for p in primals]
    tangents = [_normal(*np.shape(p)).astype(np.float32) for p in primals]
    with fwAD.dual_level():
        duals = [fwAD.make_dual(_lib_tensor(tw, p).to("cuda"), _lib_tensor(tw, t).to("cuda"))
                 for p, t in zip(primals, tangents)]
        out = fn(tw, *duals)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        ours = [fwAD.unpack_dual(o).tangent if o.dtype.is_floating_point else None for o in outs]
        ours = [None if t is None else t.cpu().numpy() for t in ours]
    theirs = _jvp(torch, torch_fwad, fn, primals, tangents)
    for k, (t, (_, expected)) in enumerate(zip(ours, theirs)):
        if expected is not None:
            got = np.zeros_like(expected) if t is None else t
            np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4, err_msg=f"{case}: tangent {k}")
