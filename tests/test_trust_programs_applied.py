"""Applied programs in styles people publish, run under torch and under tilewise (``import tilewise as torch``) from
the same initial weights and batches, as in ``test_trust_programs.py``, whose helpers these use: a DLRM-style
recommender (embedding bags with offsets and per-sample weights, pairwise interactions through ``bmm`` and
``triu_indices``), a YOLO-style detection head on a tiny CNN (a grid from ``meshgrid``, IoU/GIoU/CIoU written out,
target assignment through masks and ``nonzero``, greedy NMS under ``inference_mode``) and a WaveNet-style model
(causal dilated convolutions, gated activations, mu-law companding, a 256-way cross entropy, greedy sampling). Below
the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (T, Z, lS_o, lS_i)

from __future__ import annotations

import math

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both
from test_trust_programs_styles2 import raised

import tilewise

LIBRARIES = [real_torch, tilewise]


# ----------------------------------------------------------------------------------------------------------------------
# A DLRM-style recommender, as the reference implementation writes it: dense features through a bottom MLP, each
# categorical feature through an nn.EmbeddingBag (mode="sum", flat indices with offsets, per-sample weights) or an
# nn.Embedding, the dot products of every pair of feature vectors through bmm of the stacked vectors, the upper
# triangle taken with triu_indices, a top MLP to one logit, BCE with logits, SGD.

def dlrm(torch, init, batches, dense_in=4, d=4, bag_rows=(10, 7), rows=6, sparse=False, style="reference"):
    # style "reference": sum bags, dot products without self-interaction, logits to BCEWithLogitsLoss, SGD;
    # "variant": mean bags with include_last_offset, self-interaction (the diagonal too), a sigmoid clamped into
    # BCELoss as the reference script's loss_threshold does, Adagrad
    nn = torch.nn
    reference = style == "reference"

    class DLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.bot_l = nn.Sequential(nn.Linear(dense_in, 8), nn.ReLU(), nn.Linear(8, d), nn.ReLU())
            self.emb_l = nn.ModuleList([nn.EmbeddingBag(n, d, mode="sum" if reference else "mean", sparse=sparse,
                                                        include_last_offset=not reference) for n in bag_rows])
            self.emb_c = nn.Embedding(rows, d, sparse=sparse)
            n_features = 2 + len(bag_rows)
            pairs = n_features * (n_features - 1) // 2 if reference else n_features * (n_features + 1) // 2
            self.top_l = nn.Sequential(nn.Linear(d + pairs, 8), nn.ReLU(), nn.Linear(8, 1))

        def apply_emb(self, lS_o, lS_i, lS_w):
            if reference:
                return [bag(lS_i[k], lS_o[k], per_sample_weights=lS_w[k]) for k, bag in enumerate(self.emb_l)]
            last_offsets = [torch.cat([offsets, torch.tensor([len(indices)])]) for offsets, indices in zip(lS_o, lS_i)]
            return [bag(lS_i[k], last_offsets[k]) for k, bag in enumerate(self.emb_l)]

        def interact_features(self, x, ly):
            (batch_size, d) = x.shape
            T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
            Z = torch.bmm(T, torch.transpose(T, 1, 2))
            _, ni, nj = Z.shape
            if reference:
                li, lj = torch.triu_indices(ni, nj, offset=1)
            else:  # the reference script's lists: the lower triangle with its diagonal (interaction with itself)
                li = torch.tensor([i for i in range(ni) for j in range(i + 1)])
                lj = torch.tensor([j for i in range(nj) for j in range(i + 1)])
            Zflat = Z[:, li, lj]
            return torch.cat([x, Zflat], dim=1)

        def forward(self, dense_x, lS_o, lS_i, lS_w, cat):
            x = self.bot_l(dense_x)
            ly = self.apply_emb(lS_o, lS_i, lS_w)
            ly.append(self.emb_c(cat))
            z = self.interact_features(x, ly)
            p = self.top_l(z).squeeze(-1)
            return p if reference else torch.clamp(torch.sigmoid(p), min=0.01, max=0.99)

    model = DLRM()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    if sparse:
        embeddings = [p for n, p in model.named_parameters() if n.startswith("emb")]
        dense = [p for n, p in model.named_parameters() if not n.startswith("emb")]
        optimizers = [torch.optim.SparseAdam(embeddings, lr=1e-2), torch.optim.Adam(dense, lr=1e-2)]
    elif reference:
        optimizers = [torch.optim.SGD(model.parameters(), lr=0.1)]
    else:
        optimizers = [torch.optim.Adagrad(model.parameters(), lr=0.05, initial_accumulator_value=0.1)]
    loss_fn = nn.BCEWithLogitsLoss(reduction="mean") if reference else nn.BCELoss(reduction="mean")

    def tensors(batch):
        bags = [tuple(torch.from_numpy(a) for a in bag) for bag in batch["bags"]]
        lS_i, lS_o, lS_w = (list(column) for column in zip(*bags))
        return torch.from_numpy(batch["dense"]), lS_o, lS_i, lS_w, torch.from_numpy(batch["cat"])

    for batch in batches:
        for optimizer in optimizers:
            optimizer.zero_grad()
        z = model(*tensors(batch))
        loss = loss_fn(z, torch.from_numpy(batch["label"]))
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append({n: numpy_of(g.to_dense() if g.is_sparse else g) for n, g in
                                ((n, p.grad) for n, p in model.named_parameters()) if g is not None})
    with torch.no_grad():
        z = model(*tensors(batches[0]))
        record["eval"] = numpy_of(torch.sigmoid(z) if reference else z)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def recommender_batches(rng, steps=4, batch=5, dense_in=4, bag_rows=(10, 7), rows=6):
    batches = []
    for _ in range(steps):
        bags = []
        for n in bag_rows:
            lengths = rng.integers(0, 4, batch)  # an empty bag sums to zeros
            indices = rng.integers(0, n, int(lengths.sum())).astype(np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            weights = rng.uniform(0.5, 1.5, len(indices)).astype(np.float32)
            bags.append((indices, offsets, weights))
        batches.append({"dense": rng.standard_normal((batch, dense_in)).astype(np.float32), "bags": bags,
                        "cat": rng.integers(0, rows, batch).astype(np.int64),
                        "label": rng.integers(0, 2, batch).astype(np.float32)})
    return batches


@pytest.mark.parametrize("style", ["reference", "variant"])
def test_dlrm_with_weighted_embedding_bags_and_pairwise_interactions_trains_like_torch(style):
    ours, theirs = run_both(dlrm, recommender_batches(np.random.default_rng(0)), style=style)
    assert_same(ours, theirs)


def test_dlrm_with_sparse_embeddings_and_sparse_adam_is_refused_by_name():
    # torch trains it with sparse gradients; tilewise has none, and says so at the first lookup (after building the
    # optimizers as torch does) rather than training the tables some other way
    batches = recommender_batches(np.random.default_rng(1), steps=2)
    real_torch.manual_seed(0)
    theirs = dlrm(real_torch, None, batches, sparse=True)
    assert np.all(np.isfinite(theirs["loss"]))
    with pytest.raises(NotImplementedError, match=r"embedding_bag: sparse=True needs sparse gradients.*sparse=False"):
        dlrm(tilewise, theirs["init"], batches, sparse=True)


# ----------------------------------------------------------------------------------------------------------------------
# A YOLO-style detector: a tiny CNN, a head predicting (x, y, w, h, objectness, classes) per anchor and cell, the grid
# from meshgrid(indexing="ij") and arange, boxes decoded with sigmoid and exp, IoU/GIoU/CIoU written with the corners'
# max and min and clamp(min=0), targets assigned to the anchor of best shape IoU (argmax) in the cell of the box's
# centre, positives picked by a boolean mask and nonzero; BCE with logits on objectness, CIoU on boxes, cross entropy
# with label smoothing on classes; at evaluation, greedy NMS under inference_mode.

def box_iou_xyxy(torch, box1, box2, kind="iou", eps=1e-7):
    """IoU of pairs of boxes (..., 4) in corner form; ``kind`` adds GIoU's or CIoU's penalty, as YOLO repositories
    write it."""
    b1_x1, b1_y1, b1_x2, b1_y2 = box1.unbind(-1)
    b2_x1, b2_y1, b2_x2, b2_y2 = box2.unbind(-1)
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(min=0) * \
            (torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)).clamp(min=0)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    if kind == "iou":
        return iou
    cw = torch.max(b1_x2, b2_x2) - torch.min(b1_x1, b2_x1)
    ch = torch.max(b1_y2, b2_y2) - torch.min(b1_y1, b2_y1)
    if kind == "giou":
        c_area = cw * ch + eps
        return iou - (c_area - union) / c_area
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    v = (4 / math.pi ** 2) * torch.pow(torch.atan(w2 / h2) - torch.atan(w1 / h1), 2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def nms(torch, boxes, scores, threshold):
    order = scores.argsort(descending=True)
    keep = []
    while order.numel() > 0:
        i = order[0]
        keep.append(i)
        if order.numel() == 1:
            break
        ious = box_iou_xyxy(torch, boxes[i].unsqueeze(0), boxes[order[1:]])
        order = order[1:][ious <= threshold]
    return torch.stack(keep) if keep else torch.zeros(0, dtype=torch.long)


def yolo(torch, init, batches, classes=3, size=16):
    nn, F = torch.nn, torch.nn.functional
    anchors_px = [[3.0, 4.0], [6.0, 5.0], [10.0, 9.0]]

    class Detect(nn.Module):
        def __init__(self, channels, stride):
            super().__init__()
            self.na, self.no, self.stride = len(anchors_px), 5 + classes, stride
            self.register_buffer("anchors", torch.tensor(anchors_px))
            self.m = nn.Conv2d(channels, self.na * self.no, 1)

        def make_grid(self, nx, ny):
            yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
            return torch.stack((xv, yv), 2).view((1, 1, ny, nx, 2)).float()

        def forward(self, x):
            bs, _, ny, nx = x.shape
            p = self.m(x).view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            return p, self.make_grid(nx, ny)

        def decode(self, p, grid):
            xy = (p[..., :2].sigmoid() + grid) * self.stride
            wh = torch.exp(p[..., 2:4]).clamp(max=1e3) * self.anchors.view(1, self.na, 1, 1, 2)
            return torch.cat((xy - wh / 2, xy + wh / 2), -1)

    class TinyYolo(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(
                nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU(),
                nn.Conv2d(8, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU(),
                nn.MaxPool2d(2, 2))
            self.detect = Detect(8, stride=4)

        def forward(self, x):
            return self.detect(self.backbone(x))

    def build_targets(targets, grid_shape, detect):
        # targets: (n, 6) rows of (image, class, x1, y1, x2, y2) in pixels
        ny, nx = grid_shape
        centres = (targets[:, 2:4] + targets[:, 4:6]) / 2
        wh = targets[:, 4:6] - targets[:, 2:4]
        shape_inter = torch.min(wh[:, None], detect.anchors[None]).prod(2)
        shape_iou = shape_inter / (wh.prod(1)[:, None] + detect.anchors.prod(1)[None] - shape_inter)
        best = shape_iou.argmax(1)
        cells = (centres / detect.stride).long()
        gi, gj = cells[:, 0].clamp(0, nx - 1), cells[:, 1].clamp(0, ny - 1)
        b = targets[:, 0].long()
        obj_mask = torch.zeros(int(b.max()) + 1 if len(b) else 0, detect.na, ny, nx, dtype=torch.bool)
        obj_mask[b, best, gj, gi] = True
        return obj_mask, (b, best, gj, gi), targets[:, 2:6], targets[:, 1].long()

    def compute_loss(p, grid, targets, detect):
        obj_mask, (b, a, gj, gi), tbox, tcls = build_targets(targets, grid.shape[2:4], detect)
        boxes = detect.decode(p, grid)
        positives = obj_mask.nonzero()
        assert len(positives) <= len(b)
        ps_box = boxes[b, a, gj, gi]
        ciou = box_iou_xyxy(torch, ps_box, tbox, kind="ciou")
        lbox = (1.0 - ciou).mean()
        tobj = torch.zeros_like(p[..., 4])
        tobj[b, a, gj, gi] = ciou.detach().clamp(0).type(tobj.dtype)
        lobj = F.binary_cross_entropy_with_logits(p[..., 4], tobj, pos_weight=torch.tensor([1.5]))
        lcls = F.cross_entropy(p[b, a, gj, gi][:, 5:], tcls, label_smoothing=0.1)
        loss = 0.05 * lbox + 1.0 * lobj + 0.5 * lcls
        return loss, torch.stack((lbox, lobj, lcls)).detach(), obj_mask.sum()

    model = TinyYolo()
    record = {"init": initial_state(torch, model, init), "loss": [], "parts": [], "grads": []}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    for images, targets in batches:
        p, grid = model(torch.from_numpy(images))
        loss, parts, positives = compute_loss(p, grid, torch.from_numpy(targets), model.detect)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["parts"].append(numpy_of(parts))
        record["positives"] = int(positives)
        record["grads"].append(gradients(model))
    model.eval()
    record["detections"] = []
    with torch.inference_mode():
        p, grid = model(torch.from_numpy(batches[0][0]))
        boxes = model.detect.decode(p, grid).view(p.shape[0], -1, 4)
        scores, labels = (p[..., 4:5].sigmoid() * p[..., 5:].softmax(-1)).view(p.shape[0], -1, classes).max(-1)
        record["inference"] = not boxes.requires_grad and boxes.is_inference()
        for image_boxes, image_scores, image_labels in zip(boxes, scores, labels):
            candidates = (image_scores > 0.05).nonzero().squeeze(1)
            giou = box_iou_xyxy(torch, image_boxes[candidates][:1], image_boxes[candidates], kind="giou")
            keep = candidates[nms(torch, image_boxes[candidates], image_scores[candidates], 0.3)]
            record["detections"].append({"keep": numpy_of(keep), "boxes": numpy_of(image_boxes[keep]),
                                         "scores": numpy_of(image_scores[keep]), "labels": numpy_of(image_labels[keep]),
                                         "giou": numpy_of(giou)})
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def detection_batches(rng, steps=3, batch=2, size=16, classes=3):
    batches = []
    for _ in range(steps):
        images = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
        rows = []
        for image in range(batch):
            for _ in range(rng.integers(1, 3)):
                x1, y1 = rng.uniform(0, size - 6, 2)
                w, h = rng.uniform(2, 6, 2)
                rows.append([image, rng.integers(0, classes), x1, y1, x1 + w, y1 + h])
        batches.append((images, np.asarray(rows, np.float32)))
    return batches


def test_yolo_head_with_ciou_loss_label_smoothing_and_nms_trains_and_detects_like_torch():
    ours, theirs = run_both(yolo, detection_batches(np.random.default_rng(0)))
    assert theirs["inference"] and ours["inference"]
    assert any(len(d["keep"]) > 1 for d in theirs["detections"])
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A WaveNet-style model: audio companded by mu-law (sign, log1p) and quantised to 256 classes with .long(), one-hot
# inputs, a causal convolution, dilated causal Conv1d layers padded on the left with F.pad, gated activations
# (tanh * sigmoid), residual and skip 1x1 convolutions, cross entropy over (N, 256, T) logits, Adam with ExponentialLR;
# then greedy autoregressive sampling (argmax in place of multinomial, whose generators differ) and mu-law decoding.

def mu_law_encoding(torch, x, quantization_channels=256):
    mu = torch.tensor(quantization_channels - 1.0, dtype=x.dtype)
    x_mu = torch.sign(x) * torch.log1p(mu * torch.abs(x)) / torch.log1p(mu)
    return ((x_mu + 1) / 2 * mu + 0.5).long()


def mu_law_decoding(torch, x_mu, quantization_channels=256):
    mu = torch.tensor(quantization_channels - 1.0)
    x = (x_mu.float() / mu) * 2 - 1.0
    return torch.sign(x) * (torch.exp(torch.abs(x) * torch.log1p(mu)) - 1.0) / mu


def wavenet(torch, init, batches, classes=256, residual=8, skip=8, dilations=(1, 2, 4, 1, 2), generate=5):
    nn, F = torch.nn, torch.nn.functional

    class CausalConv1d(nn.Conv1d):
        def __init__(self, in_channels, out_channels, kernel_size=2, dilation=1):
            super().__init__(in_channels, out_channels, kernel_size, dilation=dilation)
            self.left = (kernel_size - 1) * dilation

        def forward(self, x):
            return super().forward(F.pad(x, (self.left, 0)))

    class ResidualLayer(nn.Module):
        def __init__(self, dilation):
            super().__init__()
            self.filter = CausalConv1d(residual, residual, 2, dilation)
            self.gate = CausalConv1d(residual, residual, 2, dilation)
            self.residual = nn.Conv1d(residual, residual, 1)
            self.skip = nn.Conv1d(residual, skip, 1)

        def forward(self, x):
            z = torch.tanh(self.filter(x)) * torch.sigmoid(self.gate(x))
            return x + self.residual(z), self.skip(z)

    class WaveNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.causal = CausalConv1d(classes, residual, 2)
            self.layers = nn.ModuleList(ResidualLayer(d) for d in dilations)
            self.end1 = nn.Conv1d(skip, skip, 1)
            self.end2 = nn.Conv1d(skip, classes, 1)

        def forward(self, x):
            h = self.causal(F.one_hot(x, classes).float().transpose(1, 2))
            skips = 0
            for layer in self.layers:
                h, s = layer(h)
                skips = skips + s
            return self.end2(F.relu(self.end1(F.relu(skips))))

    model = WaveNet()
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
    for audio in batches:
        q = mu_law_encoding(torch, torch.from_numpy(audio))
        logits = model(q[:, :-1])
        loss = F.cross_entropy(logits, q[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["lr"].append(scheduler.get_last_lr()[0])
        record["grads"].append(gradients(model))
    record["codes"] = numpy_of(mu_law_encoding(torch, torch.from_numpy(batches[0])))
    model.eval()
    with torch.no_grad():
        samples = mu_law_encoding(torch, torch.from_numpy(batches[0][:, :8]))
        for _ in range(generate):
            probabilities = F.softmax(model(samples)[:, :, -1], dim=1)
            samples = torch.cat([samples, probabilities.argmax(dim=1, keepdim=True)], dim=1)
        record["samples"] = numpy_of(samples)
        record["waveform"] = numpy_of(mu_law_decoding(torch, samples))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def audio_batches(rng, steps=4, batch=2, length=17):
    t = np.arange(length, dtype=np.float32)
    return [(0.6 * np.sin(t * rng.uniform(0.2, 0.9, (batch, 1))) + 0.05 * rng.standard_normal((batch, length)))
            .clip(-1, 1).astype(np.float32) for _ in range(steps)]


def test_wavenet_with_mu_law_gated_dilated_convolutions_and_exponential_lr_trains_and_samples_like_torch():
    ours, theirs = run_both(wavenet, audio_batches(np.random.default_rng(0)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

def test_sparse_adam_is_there_and_checks_its_arguments_as_torch():
    # the optimizer itself exists (the recommender builds it before its first lookup) and refuses what torch refuses
    def build(torch, **kwargs):
        return torch.optim.SparseAdam([torch.zeros(2, requires_grad=True)], **kwargs)

    for kwargs in ({"lr": 0.0}, {"eps": 0.0}, {"betas": (1.0, 0.9)}, {"betas": (0.9, 1.0)}):
        theirs, ours = (raised(lambda t, kw=kwargs: build(t, **kw), t) for t in LIBRARIES)
        assert type(ours) is type(theirs) is ValueError and str(ours) == str(theirs)


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_sparse_adam_refuses_a_dense_gradient_with_torchs_message(torch):
    table = torch.nn.Embedding(4, 2)
    optimizer = torch.optim.SparseAdam(table.parameters(), lr=1e-2)
    optimizer.step()  # no gradient yet: nothing to do
    table(torch.tensor([1, 3])).sum().backward()
    with pytest.raises(RuntimeError, match="^SparseAdam does not support dense gradients, please consider Adam "
                                           "instead$"):
        optimizer.step()


@pytest.mark.parametrize("name", ["triu_indices", "tril_indices"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8", "bool"])
def test_triangle_indices_refuse_a_dtype_other_than_int32_or_int64_as_torch(name, dtype):
    theirs, ours = (raised(lambda t: getattr(t, name)(3, 3, dtype=getattr(t, dtype)), t) for t in LIBRARIES)
    assert type(ours) is type(theirs) is NotImplementedError and str(ours) == str(theirs)
    for wide in ("int32", "int64"):
        assert getattr(tilewise, name)(3, 4, 1, dtype=getattr(tilewise, wide)).dtype == getattr(tilewise, wide)


@pytest.mark.parametrize("op", ["sign", "sgn", "square"])
def test_sign_and_square_of_a_bool_tensor_as_torch(op):
    # mu-law companding takes torch.sign of whatever it is given; sign of a bool is itself, square (pow(x, 2)) int64
    theirs, ours = (getattr(t, op)(t.tensor([True, False])) for t in LIBRARIES)
    assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_embedding_bag_scales_the_gradient_by_each_rows_frequency_as_embedding_does():
    # A bag of sums is embedding's rows summed per bag, so scale_grad_by_freq divides each row's gradient by how often
    # that row was looked up, as embedding does (and torch's CUDA kernel). torch's CPU kernel reads the count of the
    # k-th sorted index for the k-th distinct row instead, which agrees only while no row before it repeats; tilewise
    # keeps the rule, not the slip.
    indices, offsets, rows = [1, 2, 4, 5, 4, 3, 2, 9], [0, 4], np.arange(30, dtype=np.float32).reshape(10, 3)

    def bag_gradient(torch):
        weight = torch.tensor(rows, requires_grad=True)
        out = torch.nn.functional.embedding_bag(torch.tensor(indices), weight, torch.tensor(offsets), mode="sum",
                                                scale_grad_by_freq=True)
        (out * torch.tensor([[1.0], [2.0]])).sum().backward()
        return weight.grad.numpy()

    weight = real_torch.tensor(rows, requires_grad=True)
    looked_up = real_torch.nn.functional.embedding(real_torch.tensor(indices), weight, scale_grad_by_freq=True)
    (looked_up * real_torch.tensor([1.0] * 4 + [2.0] * 4)[:, None]).sum().backward()
    np.testing.assert_allclose(bag_gradient(tilewise), weight.grad.numpy())


@pytest.mark.parametrize("build", [
    lambda t: t.nn.Embedding(10, 3, padding_idx=10),
    lambda t: t.nn.Embedding(10, 3, padding_idx=-11),
    lambda t: t.nn.Embedding(3, 2, _weight=t.ones(2, 2)),
    lambda t: t.nn.functional.embedding(t.tensor([1]), t.ones(4, 2), padding_idx=4),
], ids=["padding past the end", "padding before the start", "weight of another shape", "functional padding"])
def test_embedding_refuses_a_padding_row_or_weight_outside_the_table_as_torch(build):
    theirs, ours = (raised(build, t) for t in LIBRARIES)
    assert type(ours) is type(theirs) is AssertionError and str(ours).startswith(str(theirs))  # (with the values)


def test_embedding_repr_names_every_option_that_differs_from_its_default_as_torch():
    def build(t):
        return t.nn.Embedding(3, 2, padding_idx=1, max_norm=2.0, norm_type=1.0, scale_grad_by_freq=True, sparse=True)

    assert repr(build(tilewise)) == repr(build(real_torch))


def test_abs_of_a_bool_tensor_is_refused_as_torch():
    for spell in (lambda t, x: t.abs(x), lambda t, x: abs(x), lambda t, x: x.abs_(), lambda t, x: t.absolute(x)):
        theirs, ours = (raised(lambda t, spell=spell: spell(t, t.tensor([True, False])), t) for t in LIBRARIES)
        assert type(ours) is type(theirs) is NotImplementedError and str(ours).startswith(str(theirs))
