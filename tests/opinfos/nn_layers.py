"""Samples for tilewise.nn.functional's convolutions (3-D, transposed, TBC), pooling over one and three spatial dims,
adaptive max pooling and the layers' other functionals (compared with torch.nn.functional, forward and gradients)."""

from __future__ import annotations

from opinfo import OpInfo, Sample, T


def _conv3d():
    return [Sample((T((2, 4, 5, 4, 6)), T((6, 4, 3, 2, 3)), T((6,)))),
            Sample((T((2, 4, 6, 5, 5)), T((4, 2, 2, 3, 2)), None, (2, 1, 1), (1, 0, 1), (1, 2, 1), 2),
                   name="stride-pad-dilation-groups"),
            Sample((T((3, 4, 4, 5)), T((2, 3, 2, 2, 3))), {"padding": "same"}, name="unbatched-same")]


def _conv_transpose1d():
    return [Sample((T((2, 4, 5)), T((4, 3, 3)), T((3,)))),
            Sample((T((2, 4, 5)), T((4, 2, 3)), T((4,)), 3, 1, 2, 2, 2), name="stride-pad-outpad-groups-dilation"),
            Sample((T((2, 4, 5)), T((4, 2, 3))), {"output_padding": 2, "dilation": 3}, name="outpad-by-dilation"),
            Sample((T((4, 6)), T((4, 3, 2))), {"stride": 2}, name="unbatched")]


def _conv_transpose2d():
    return [Sample((T((2, 4, 4, 5)), T((4, 3, 3, 3)), T((3,)))),
            Sample((T((2, 4, 4, 3)), T((4, 1, 3, 2)), T((4,)), (2, 3), (1, 0), (1, 2), 4, (1, 2)),
                   name="stride-pad-outpad-depthwise-dilation"),
            Sample((T((4, 3, 3)), T((4, 2, 2, 2))), {"stride": 2, "padding": 1, "output_padding": 1},
                   name="unbatched"),
            # output padding below the dilation, not the stride: the last rows and columns read no input
            Sample((T((2, 4, 5, 4)), T((4, 1, 3, 3)), T((4,))), {"padding": 1, "output_padding": 1, "groups": 4,
                                                              "dilation": 2}, name="outpad-by-dilation")]


def _conv_transpose3d():
    return [Sample((T((2, 4, 3, 4, 3)), T((4, 3, 2, 3, 2)), T((3,)))),
            Sample((T((1, 4, 3, 3, 2)), T((4, 2, 2, 2, 3)), None, 2, (1, 0, 1), 1, 2, (1, 1, 2)),
                   name="stride-pad-outpad-groups-dilation"),
            Sample((T((1, 2, 3, 2, 3)), T((2, 2, 2, 3, 2))), {"output_padding": (1, 1, 0), "dilation": (2, 2, 1),
                                                              "stride": (1, 1, 2)}, name="outpad-by-dilation")]


def _conv_tbc():
    return [Sample((T((7, 2, 4)), T((3, 4, 5)), T((5,)))), Sample((T((6, 3, 2)), T((2, 2, 4)), T((4,)), 1), name="pad")]


def _max_pool1d():
    x = T((2, 3, 9), "distinct")
    return [Sample((x, 2)), Sample((x, 3, 2, 1), name="stride-pad"),
            Sample((x, 3, 2, 1, 2, True), name="dilation-ceil"),
            Sample((x, 3, 2), {"ceil_mode": True, "return_indices": True}, name="indices"),
            Sample((T((3, 8), "distinct"), 2, 1), name="unbatched")]


def _max_pool1d_with_indices():
    x = T((2, 3, 11), "nan")
    return [Sample((T((2, 3, 9), "distinct"), 3, 2, 1, 1, True)), Sample((x, 2), name="nan"),
            Sample((x, 3, 1, 1), name="nan-overlapping-pad"), Sample((x, 3, 2, 1, 2, True), name="nan-dilation-ceil"),
            Sample((T((2, 3, 9), "ties", -2, 0), 3, 2, 1), name="ties-pad")]


def _max_pool3d():
    x = T((2, 2, 5, 6, 5), "distinct")
    return [Sample((x, 2)), Sample((x, 3, 2, 1), name="stride-pad"),
            Sample((x, (3, 2, 2), (2, 1, 2), (1, 0, 1), (1, 2, 1), True), name="dilation-ceil"),
            Sample((x, 2), {"return_indices": True}, name="indices"),
            Sample((T((3, 4, 4, 4), "distinct"), 2, 1), name="unbatched")]


def _max_pool3d_with_indices():
    x = T((1, 2, 5, 6, 5), "nan")
    return [Sample((T((2, 2, 5, 5, 6), "distinct"), 3, 2, 1, 1, True)), Sample((x, 2), name="nan"),
            Sample((x, 3, 2, 1, 1, True), name="nan-ceil"),
            Sample((T((1, 2, 5, 5, 5), "ties", -2, 0), 3, 2, 1), name="ties-pad")]


def _avg_pool1d():
    x = T((2, 3, 9))
    return [Sample((x, 2)), Sample((x, 3, 2, 1), name="stride-pad"),
            Sample((x, 3, 2, 1), {"count_include_pad": False, "ceil_mode": True}, name="exclude-pad-ceil"),
            Sample((x, 4, 3, 2, True), name="ceil-include-pad"), Sample((T((3, 7)), 2), name="unbatched")]


def _avg_pool3d():
    x = T((2, 2, 5, 6, 5))
    return [Sample((x, 2)), Sample((x, 3, 2, 1), name="stride-pad"),
            Sample((x, 3, 2, 1), {"count_include_pad": False, "ceil_mode": True}, name="exclude-pad-ceil"),
            Sample((x, (3, 2, 2), (2, 2, 1), (1, 1, 0), True), name="ceil-include-pad"),
            Sample((x, 3, 2, 1), {"divisor_override": 5}, name="divisor"),
            Sample((T((3, 4, 4, 5)), 2), name="unbatched")]


def _adaptive_avg_pool1d():
    return [Sample((T((2, 3, 7)), 3)), Sample((T((2, 3, 7)), 1), name="global"),
            Sample((T((2, 3, 5)), 8), name="upsample"), Sample((T((3, 6)), 4), name="unbatched")]


def _adaptive_avg_pool3d():
    x = T((2, 2, 5, 7, 4))
    return [Sample((x, (3, 2, 3))), Sample((x, 1), name="global"), Sample((x, (5, 7, 4)), name="identity"),
            Sample((x, (None, 3, 6)), name="none-upsample"), Sample((T((3, 6, 4, 5)), 2), name="unbatched")]


def _adaptive_max_pool(shape, sizes):
    def samples():
        return [Sample((T(shape, "distinct"), sizes[0])), Sample((T(shape, "distinct"), sizes[1]), name="upsample"),
                Sample((T(shape, "nan"), sizes[0]), name="nan"),
                Sample((T(shape, "ties", -1, 1), sizes[0]), name="ties"),
                Sample((T(shape[1:], "distinct"), sizes[0]), name="unbatched")]

    return samples


def _adaptive_max_pool_public(shape, size):
    return lambda: [Sample((T(shape, "distinct"), size)),
                    Sample((T(shape, "distinct"), size), {"return_indices": True}, name="indices")]


def _lp_pool(shape, kernel, stride):
    def samples():
        x = T(shape, "positive")
        return [Sample((x, 2.0, kernel)), Sample((x, 3.0, kernel, stride, True), name="p3-stride-ceil"),
                Sample((T(shape), 1.0, kernel, stride), name="p1-signed"),
                Sample((T(shape, "positive"), float("inf"), kernel), name="inf")]

    return samples


def _max_unpool(shape, kernel, out_shape):
    plane = 1
    for n in out_shape:
        plane *= n
    indices = T(shape, "plane_index", 2, plane, grad=False)
    return lambda: [Sample((T(shape), indices, kernel)),
                    Sample((T(shape), indices, kernel, None, 0, tuple(n + 1 for n in out_shape)), name="output_size"),
                    Sample((T(shape[1:]), T(shape[1:], "plane_index", 1, plane, grad=False), kernel), name="unbatched")]


def _fractional_max_pool(shape, kernel, sizes, ratio):
    spatial = len(kernel)

    def samples():
        random = T((shape[0], shape[1], spatial), "prob", grad=False)
        return [Sample((T(shape, "distinct"), kernel), {"output_size": sizes, "_random_samples": random}),
                Sample((T(shape, "nan"), kernel), {"output_ratio": ratio, "_random_samples": random},
                       name="nan-ratio"),
                Sample((T(shape, "distinct"), kernel), {"output_size": (1,) * spatial, "_random_samples": random},
                       name="one"),
                Sample((T(shape[1:], "distinct"), kernel),
                       {"output_size": sizes, "_random_samples": T((1, shape[1], spatial), "prob", grad=False)},
                       name="unbatched")]

    return samples


def _fractional_public(shape, kernel, sizes):
    spatial = len(sizes)
    return lambda: [Sample((T(shape, "distinct"), kernel, sizes), {
        "return_indices": True, "_random_samples": T((shape[0], shape[1], spatial), "prob", grad=False)})]


def _unfold():
    return [Sample((T((2, 3, 5, 6)), 2), name="blocks"),
            Sample((T((2, 3, 6, 7)), (2, 3), (2, 1), (1, 2), (2, 1)), name="dilation-pad-stride"),
            Sample((T((3, 4, 5)), 3), {"padding": 1}, name="unbatched")]


def _fold():
    return [Sample((T((2, 12, 20)), (5, 6), 2)),
            Sample((T((2, 18, 27)), (6, 7), (2, 3), (2, 1), (1, 2), (2, 1)), name="dilation-pad-stride"),
            Sample((T((36, 20)), (5, 4), 3), {"padding": 1}, name="unbatched")]


def _affine_grid():
    return [Sample((T((2, 2, 3)), (2, 3, 4, 5))), Sample((T((2, 2, 3)), (2, 3, 1, 5), True), name="align-one-row"),
            Sample((T((2, 3, 4)), (2, 3, 3, 4, 2)), name="3d"),
            Sample((T((1, 3, 4)), (1, 1, 2, 3, 4)), {"align_corners": True}, name="3d-align")]


def _grid_sample():
    image, grid = T((2, 3, 4, 5)), T((2, 6, 7, 2), "float", -1.3, 1.3)
    volume, grid3 = T((2, 2, 3, 4, 5)), T((2, 3, 4, 2, 3), "float", -1.3, 1.3)
    return [Sample((image, grid)),
            Sample((image, grid), {"padding_mode": "border", "align_corners": True}, name="border-align"),
            Sample((image, grid), {"padding_mode": "reflection"}, name="reflection"),
            Sample((image, grid), {"padding_mode": "reflection", "align_corners": True}, name="reflection-align"),
            Sample((image, T((2, 6, 7, 2), "float", -1.3, 1.3)), {"mode": "nearest"}, name="nearest"),
            Sample((image, grid), {"mode": "bicubic"}, name="bicubic"),
            Sample((image, grid), {"mode": "bicubic", "padding_mode": "border"}, name="bicubic-border"),
            Sample((image, grid), {"mode": "bicubic", "padding_mode": "reflection", "align_corners": True},
                   name="bicubic-reflection-align"),
            Sample((volume, grid3), name="3d"),
            Sample((volume, grid3), {"padding_mode": "reflection"}, name="3d-reflection"),
            Sample((volume, grid3), {"padding_mode": "border", "align_corners": True}, name="3d-border-align"),
            Sample((volume, T((2, 3, 4, 2, 3), "float", -1.3, 1.3, grad=False)),
                   {"mode": "nearest", "padding_mode": "reflection", "align_corners": True}, name="3d-nearest"),
            Sample((image, T((2, 6, 7, 2), "float", -1.3, 1.3, grad=False)),
                   {"mode": "nearest", "padding_mode": "border", "align_corners": True}, name="nearest-border-align"),
            Sample((T((0, 3, 4, 5)), T((0, 6, 7, 2))), name="empty-batch")]


OPINFOS = [
    OpInfo("conv3d", _conv3d, call="F",
           covers=("conv3d.padding", "_conv3d", "_conv3d_backward_input", "_conv3d_backward_weight")),
    OpInfo("conv_transpose1d", _conv_transpose1d, call="F"),
    OpInfo("conv_transpose2d", _conv_transpose2d, call="F",
           covers=("_conv_transpose2d", "_conv_transpose2d_backward_input",
                   "_conv_transpose2d_backward_weight")),
    OpInfo("conv_transpose3d", _conv_transpose3d, call="F",
           covers=("_conv_transpose3d", "_conv_transpose3d_backward_input",
                   "_conv_transpose3d_backward_weight")),
    OpInfo("conv_tbc", _conv_tbc, call="F"),
    OpInfo("max_pool1d", _max_pool1d, call="F"),
    OpInfo("max_pool1d_with_indices", _max_pool1d_with_indices, call="F"),
    OpInfo("max_pool3d", _max_pool3d, call="F"),
    OpInfo("max_pool3d_with_indices", _max_pool3d_with_indices, call="F"),
    OpInfo("avg_pool1d", _avg_pool1d, call="F"),
    OpInfo("avg_pool3d", _avg_pool3d, call="F"),
    OpInfo("adaptive_avg_pool1d", _adaptive_avg_pool1d, call="F"),
    OpInfo("adaptive_avg_pool3d", _adaptive_avg_pool3d, call="F", covers=("_adaptive_avg_pool3d",)),
    OpInfo("adaptive_max_pool1d_with_indices", _adaptive_max_pool((2, 3, 7), (3, 9)), call="F"),
    OpInfo("adaptive_max_pool2d_with_indices", _adaptive_max_pool((2, 3, 7, 5), ((3, 2), (9, 6))), call="F"),
    OpInfo("adaptive_max_pool3d_with_indices", _adaptive_max_pool((1, 2, 5, 4, 6), ((2, 3, 4), (6, 5, 7))), call="F"),
    OpInfo("adaptive_max_pool1d", _adaptive_max_pool_public((2, 3, 7), 3), call="F"),
    OpInfo("adaptive_max_pool2d", _adaptive_max_pool_public((2, 3, 7, 5), (3, None)), call="F"),
    OpInfo("adaptive_max_pool3d", _adaptive_max_pool_public((2, 2, 5, 4, 6), (2, 3, 4)), call="F"),
    OpInfo("lp_pool1d", _lp_pool((2, 3, 9), 3, 2), call="F"),
    OpInfo("lp_pool2d", _lp_pool((2, 3, 7, 6), (3, 2), (2, 1)), call="F"),
    OpInfo("lp_pool3d", _lp_pool((2, 2, 5, 4, 5), 2, (2, 1, 2)), call="F"),
    OpInfo("max_unpool1d", _max_unpool((2, 3, 4), 2, (8,)), call="F"),
    OpInfo("max_unpool2d", _max_unpool((2, 3, 3, 2), 2, (6, 4)), call="F"),
    OpInfo("max_unpool3d", _max_unpool((1, 2, 2, 3, 2), 2, (4, 6, 4)), call="F"),
    OpInfo("fractional_max_pool2d_with_indices", _fractional_max_pool((2, 3, 9, 8), (3, 2), (5, 4), (0.6, 0.5)),
           call="F"),
    OpInfo("fractional_max_pool3d_with_indices",
           _fractional_max_pool((2, 2, 7, 6, 8), (2, 3, 2), (4, 3, 5), (0.5, 0.6, 0.7)), call="F"),
    OpInfo("fractional_max_pool2d", _fractional_public((2, 3, 9, 8), 2, (4, 5)), call="F"),
    OpInfo("fractional_max_pool3d", _fractional_public((1, 2, 6, 7, 5), 2, (3, 4, 3)), call="F"),
    OpInfo("unfold", _unfold, call="F", covers=("im2col",)),
    OpInfo("fold", _fold, call="F", covers=("col2im",)),
    OpInfo("affine_grid", _affine_grid, call="F"),
    OpInfo("grid_sample", _grid_sample, call="F"),
    OpInfo("upsample", lambda: [Sample((T((2, 3, 4, 5)),), {"scale_factor": 2, "mode": "bilinear"})], call="F"),
    OpInfo("upsample_nearest", lambda: [Sample((T((2, 3, 4, 5)),), {"size": (6, 7)})], call="F"),
    OpInfo("upsample_bilinear", lambda: [Sample((T((2, 3, 4, 5)),), {"scale_factor": 1.5})], call="F"),
    OpInfo("local_response_norm", lambda: [Sample((T((2, 5, 4)), 3)),
                                           Sample((T((2, 6, 3, 4)), 4, 1e-2, 0.6, 2.0), name="4d-even"),
                                           Sample((T((1, 3, 2, 2, 3)), 5), {"beta": 1.2}, name="5d-wide")], call="F"),
]
