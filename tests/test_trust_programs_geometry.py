"""Geometry programs in the styles their reference repositories publish, run under torch and under tilewise (``import
tilewise as torch``) from the same initial weights and batches, as in ``test_trust_programs.py``, whose helpers these
use: a RAFT optical-flow model (an all-pairs correlation volume, its pyramid, bilinear look-ups by grid_sample, a
ConvGRU, convex upsampling), a PointNet++ classifier (farthest point sampling, ball query and k nearest neighbours,
grouped shared MLPs), an ESPCN / EDSR super-resolution model (pixel shuffles, residual scaling, bicubic baselines),
a neural cellular automaton (Sobel perception by grouped convolutions, stochastic and alive masks, a sample pool), a
capsule network (squash, routing by agreement, margin loss, a masked decoder) and spatial transformers and image
registration (affine grids in 2D and 3D, displacement fields, inverse affine maps). Below the programs, the failures
they met, each reduced to a test.
"""
# ruff: noqa: N806 — the programs keep the scripts' names (B, N, C, H, W, F)

from __future__ import annotations

import math

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both

import tilewise

LIBRARIES = [real_torch, tilewise]

pytestmark = pytest.mark.usefixtures("torch_on_one_thread")  # (tests/conftest.py)


# ----------------------------------------------------------------------------------------------------------------------
# RAFT, as its repository writes it at a small size: a feature encoder (instance norm) and a context encoder (batch
# norm), the all-pairs correlation volume by matmul of the flattened feature maps, a pyramid of it by avg_pool2d,
# look-ups around the current coordinates by grid_sample of a delta grid from meshgrid (align_corners=True, as RAFT's
# bilinear_sampler normalises by W - 1), a motion encoder, a ConvGRU update and a flow head, iterations with the
# coordinates detached between them, convex upsampling (a softmax over a learned mask of 9 neighbours of F.unfold),
# or RAFT-small's bilinear upsampling by interpolate, the sequence loss with exponentially growing weights, and a
# photometric loss that warps the second image back by the
# flow through grid_sample (align_corners=False, border or zeros padding). AdamW, OneCycleLR and clip_grad_norm_.

def raft(torch, init, batches, iters=3, radius=1, levels=2, factor=4, gamma=0.8, padding_mode="border",
         corr_form="matmul", upsample="convex"):
    nn, F = torch.nn, torch.nn.functional

    def upflow(flow, mode="bilinear"):
        # RAFT-small's upflow8, at this model's factor
        new_size = (factor * flow.shape[2], factor * flow.shape[3])
        return factor * F.interpolate(flow, size=new_size, mode=mode, align_corners=True)

    def coords_grid(batch, ht, wd):
        coords = torch.meshgrid(torch.arange(ht), torch.arange(wd), indexing="ij")
        coords = torch.stack(coords[::-1], dim=0).float()
        return coords[None].repeat(batch, 1, 1, 1)

    def bilinear_sampler(img, coords):
        H, W = img.shape[-2:]
        xgrid, ygrid = coords.split([1, 1], dim=-1)
        xgrid = 2 * xgrid / (W - 1) - 1
        ygrid = 2 * ygrid / (H - 1) - 1
        grid = torch.cat([xgrid, ygrid], dim=-1)
        return F.grid_sample(img, grid, align_corners=True)

    class CorrBlock:
        def __init__(self, fmap1, fmap2):
            self.corr_pyramid = []
            corr = CorrBlock.corr(fmap1, fmap2)
            batch, h1, w1, dim, h2, w2 = corr.shape
            corr = corr.reshape(batch * h1 * w1, dim, h2, w2)
            self.corr_pyramid.append(corr)
            for _ in range(levels - 1):
                corr = F.avg_pool2d(corr, 2, stride=2)
                self.corr_pyramid.append(corr)

        def __call__(self, coords):
            r = radius
            coords = coords.permute(0, 2, 3, 1)
            batch, h1, w1, _ = coords.shape
            out_pyramid = []
            for i in range(levels):
                corr = self.corr_pyramid[i]
                dx = torch.linspace(-r, r, 2 * r + 1, device=coords.device)
                dy = torch.linspace(-r, r, 2 * r + 1, device=coords.device)
                delta = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), axis=-1)
                centroid_lvl = coords.reshape(batch * h1 * w1, 1, 1, 2) / 2**i
                delta_lvl = delta.view(1, 2 * r + 1, 2 * r + 1, 2)
                coords_lvl = centroid_lvl + delta_lvl
                corr = bilinear_sampler(corr, coords_lvl)
                out_pyramid.append(corr.view(batch, h1, w1, -1))
            out = torch.cat(out_pyramid, dim=-1)
            return out.permute(0, 3, 1, 2).contiguous().float()

        @staticmethod
        def corr(fmap1, fmap2):
            batch, dim, ht, wd = fmap1.shape
            if corr_form == "einsum":
                corr = torch.einsum("bdhw,bdij->bhwij", fmap1, fmap2).unsqueeze(3)
                return corr / math.sqrt(dim)
            fmap1 = fmap1.view(batch, dim, ht * wd)
            fmap2 = fmap2.view(batch, dim, ht * wd)
            corr = torch.matmul(fmap1.transpose(1, 2), fmap2)
            corr = corr.view(batch, ht, wd, 1, ht, wd)
            return corr / torch.sqrt(torch.tensor(dim).float())

    class Encoder(nn.Module):
        def __init__(self, output_dim, norm_fn):
            super().__init__()
            norm = (lambda c: nn.InstanceNorm2d(c)) if norm_fn == "instance" else (lambda c: nn.BatchNorm2d(c))
            # no bias before a norm, which cancels it (its gradient is rounding noise that Adam would scale up)
            self.conv1 = nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1, bias=False)
            self.norm1 = norm(8)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(8, 12, kernel_size=3, stride=2, padding=1, bias=False)
            self.norm2 = norm(12)
            self.conv3 = nn.Conv2d(12, output_dim, kernel_size=1)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def forward(self, x):
            is_list = isinstance(x, (tuple, list))
            if is_list:
                batch_dim = x[0].shape[0]
                x = torch.cat(x, dim=0)
            x = self.relu1(self.norm1(self.conv1(x)))
            x = F.relu(self.norm2(self.conv2(x)))
            x = self.conv3(x)
            if is_list:
                x = torch.split(x, [batch_dim, batch_dim], dim=0)
            return x

    class ConvGRU(nn.Module):
        def __init__(self, hidden_dim, input_dim):
            super().__init__()
            self.convz = nn.Conv2d(hidden_dim + input_dim, hidden_dim, 3, padding=1)
            self.convr = nn.Conv2d(hidden_dim + input_dim, hidden_dim, 3, padding=1)
            self.convq = nn.Conv2d(hidden_dim + input_dim, hidden_dim, 3, padding=1)

        def forward(self, h, x):
            hx = torch.cat([h, x], dim=1)
            z = torch.sigmoid(self.convz(hx))
            r = torch.sigmoid(self.convr(hx))
            q = torch.tanh(self.convq(torch.cat([r * h, x], dim=1)))
            return (1 - z) * h + z * q

    class MotionEncoder(nn.Module):
        def __init__(self, cor_planes, out):
            super().__init__()
            self.convc1 = nn.Conv2d(cor_planes, 16, 1, padding=0)
            self.convf1 = nn.Conv2d(2, 8, 7, padding=3)
            self.convf2 = nn.Conv2d(8, 8, 3, padding=1)
            self.conv = nn.Conv2d(16 + 8, out - 2, 3, padding=1)

        def forward(self, flow, corr):
            cor = F.relu(self.convc1(corr))
            flo = F.relu(self.convf1(flow))
            flo = F.relu(self.convf2(flo))
            out = F.relu(self.conv(torch.cat([cor, flo], dim=1)))
            return torch.cat([out, flow], dim=1)

    class UpdateBlock(nn.Module):
        def __init__(self, hidden_dim, context_dim):
            super().__init__()
            self.encoder = MotionEncoder(levels * (2 * radius + 1) ** 2, 16)
            self.gru = ConvGRU(hidden_dim, 16 + context_dim)
            self.flow_head = nn.Sequential(nn.Conv2d(hidden_dim, 16, 3, padding=1), nn.ReLU(inplace=True),
                                           nn.Conv2d(16, 2, 3, padding=1))
            self.mask = nn.Sequential(nn.Conv2d(hidden_dim, 16, 3, padding=1), nn.ReLU(inplace=True),
                                      nn.Conv2d(16, factor * factor * 9, 1, padding=0))

        def forward(self, net, inp, corr, flow):
            motion_features = self.encoder(flow, corr)
            inp = torch.cat([inp, motion_features], dim=1)
            net = self.gru(net, inp)
            delta_flow = self.flow_head(net)
            mask = 0.25 * self.mask(net)  # scale mask to balance gradients
            return net, mask, delta_flow

    class RAFT(nn.Module):
        def __init__(self, hidden_dim=8, context_dim=8):
            super().__init__()
            self.hidden_dim, self.context_dim = hidden_dim, context_dim
            self.fnet = Encoder(16, "instance")
            self.cnet = Encoder(hidden_dim + context_dim, "batch")
            self.update_block = UpdateBlock(hidden_dim, context_dim)

        def initialize_flow(self, img):
            N, C, H, W = img.shape
            coords0 = coords_grid(N, H // factor, W // factor).to(img.device)
            coords1 = coords_grid(N, H // factor, W // factor).to(img.device)
            return coords0, coords1

        def upsample_flow(self, flow, mask):
            N, _, H, W = flow.shape
            mask = mask.view(N, 1, 9, factor, factor, H, W)
            mask = torch.softmax(mask, dim=2)
            up_flow = F.unfold(factor * flow, [3, 3], padding=1)
            up_flow = up_flow.view(N, 2, 9, 1, 1, H, W)
            up_flow = torch.sum(mask * up_flow, dim=2)
            up_flow = up_flow.permute(0, 1, 4, 2, 5, 3)
            return up_flow.reshape(N, 2, factor * H, factor * W)

        def forward(self, image1, image2, iters):
            image1 = 2 * (image1 / 255.0) - 1.0
            image2 = 2 * (image2 / 255.0) - 1.0
            image1, image2 = image1.contiguous(), image2.contiguous()
            fmap1, fmap2 = self.fnet([image1, image2])
            corr_fn = CorrBlock(fmap1.float(), fmap2.float())
            cnet = self.cnet(image1)
            net, inp = torch.split(cnet, [self.hidden_dim, self.context_dim], dim=1)
            net, inp = torch.tanh(net), torch.relu(inp)
            coords0, coords1 = self.initialize_flow(image1)
            flow_predictions = []
            for _ in range(iters):
                coords1 = coords1.detach()
                corr = corr_fn(coords1)
                flow = coords1 - coords0
                net, up_mask, delta_flow = self.update_block(net, inp, corr, flow)
                coords1 = coords1 + delta_flow
                if upsample == "convex":
                    flow_up = self.upsample_flow(coords1 - coords0, up_mask)
                else:
                    flow_up = upflow(coords1 - coords0)
                flow_predictions.append(flow_up)
            return flow_predictions

    def sequence_loss(flow_preds, flow_gt, valid, max_flow=400):
        n_predictions = len(flow_preds)
        flow_loss = 0.0
        mag = torch.sum(flow_gt**2, dim=1).sqrt()
        valid = (valid >= 0.5) & (mag < max_flow)
        for i in range(n_predictions):
            i_weight = gamma ** (n_predictions - i - 1)
            i_loss = (flow_preds[i] - flow_gt).abs()
            flow_loss += i_weight * (valid[:, None] * i_loss).mean()
        epe = torch.sum((flow_preds[-1] - flow_gt) ** 2, dim=1).sqrt()
        epe = epe.view(-1)[valid.view(-1)]
        metrics = {"epe": epe.mean().item(), "1px": (epe < 1).float().mean().item()}
        return flow_loss, metrics

    def warp(image, flow):
        # backward warping with pixel-centre coordinates (align_corners=False)
        N, _, H, W = image.shape
        ys, xs = torch.meshgrid(torch.arange(H, dtype=torch.float32), torch.arange(W, dtype=torch.float32),
                                indexing="ij")
        base = torch.stack((xs, ys), dim=-1).unsqueeze(0)
        pos = base + flow.permute(0, 2, 3, 1)
        scale = torch.tensor([W, H], dtype=torch.float32)
        grid = (2 * pos + 1) / scale - 1
        return F.grid_sample(image, grid, mode="bilinear", padding_mode=padding_mode, align_corners=False)

    model = RAFT()
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": [], "metrics": []}
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=1e-4, eps=1e-8)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 4e-3, len(batches) + 1, pct_start=0.3,
                                                    cycle_momentum=False, anneal_strategy="linear")
    model.train()
    for image1, image2, flow, valid in batches:
        image1, image2 = torch.from_numpy(image1), torch.from_numpy(image2)
        flow, valid = torch.from_numpy(flow), torch.from_numpy(valid)
        optimizer.zero_grad()
        flow_predictions = model(image1, image2, iters=iters)
        loss, metrics = sequence_loss(flow_predictions, flow, valid)
        warped = warp(image2 / 255.0, flow_predictions[-1])
        loss = loss + 0.1 * (warped - image1 / 255.0).abs().mean()
        loss.backward()
        record["total_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["metrics"].append(metrics)
        record["lr"].append(scheduler.get_last_lr()[0])
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        image1, image2 = torch.from_numpy(batches[0][0]), torch.from_numpy(batches[0][1])
        record["eval"] = numpy_of(model(image1, image2, iters=iters)[-1])
        record["warp_zeros"] = numpy_of(F.grid_sample(image1, F.affine_grid(
            torch.tensor([[[1.1, 0.1, 0.2], [-0.1, 0.9, -0.3]]]).repeat(image1.shape[0], 1, 1), list(image1.shape),
            align_corners=False), padding_mode="zeros", align_corners=False))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def flow_batches(rng, steps=3, batch=2, size=16):
    out = []
    for _ in range(steps):
        image1 = (rng.random((batch, 3, size, size)) * 255).astype(np.float32)
        image2 = np.roll(image1, 1, axis=-1) + rng.standard_normal((batch, 3, size, size)).astype(np.float32)
        flow = (rng.standard_normal((batch, 2, size, size)) * 0.5 + np.array([1.0, 0.0])[:, None, None]).astype(
            np.float32)
        valid = (rng.random((batch, size, size)) > 0.1).astype(np.float32)
        out.append((image1, image2, flow, valid))
    return out


@pytest.mark.parametrize("padding_mode,corr_form,upsample", [("border", "matmul", "convex"),
                                                              ("zeros", "einsum", "convex"),
                                                              ("zeros", "matmul", "bilinear")])
def test_raft_with_a_correlation_pyramid_grid_sample_lookups_and_convex_upsampling_trains_like_torch(padding_mode,
                                                                                                      corr_form,
                                                                                                      upsample):
    ours, theirs = run_both(raft, flow_batches(np.random.default_rng(0)), padding_mode=padding_mode,
                            corr_form=corr_form, upsample=upsample)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# PointNet++ (single-scale grouping), as the widely used PyTorch port writes it: farthest point sampling by a loop of
# argmax over running minimum distances (updated through a boolean mask), square distances by matmul, ball query by
# masking and sorting an arange, neighbourhoods gathered by advanced indexing with a broadcast batch index, relative
# coordinates concatenated with features, shared MLPs as 1x1 Conv2d + BatchNorm2d, max pooling over the neighbours, a
# group-all layer with Conv1d; k nearest neighbours by torch.cdist + topk and gather for a second branch. The head is
# Linear + LayerNorm + Dropout with log_softmax, trained with label smoothing written out (one-hot by scatter) or by
# cross_entropy's label_smoothing; a part-segmentation head propagates features back to every point (inverse-distance
# weights of the 3 nearest sampled points, found by sort) for an nll_loss with ignore_index. Adam with StepLR. The
# farthest-point starts come from the batches (the script draws them with torch.randint).

def pointnet2(torch, init, batches, npoint=8, radius=0.6, nsample=6, k=4, classes=4, smoothing="written",
              part_classes=3):
    nn, F = torch.nn, torch.nn.functional

    def square_distance(src, dst):
        B, N, _ = src.shape
        _, M, _ = dst.shape
        dist = -2 * torch.matmul(src, dst.permute(0, 2, 1))
        dist += torch.sum(src**2, -1).view(B, N, 1)
        dist += torch.sum(dst**2, -1).view(B, 1, M)
        return dist

    def index_points(points, idx):
        B = points.shape[0]
        view_shape = list(idx.shape)
        view_shape[1:] = [1] * (len(view_shape) - 1)
        repeat_shape = list(idx.shape)
        repeat_shape[0] = 1
        batch_indices = torch.arange(B, dtype=torch.long).to(points.device).view(view_shape).repeat(repeat_shape)
        return points[batch_indices, idx, :]

    def farthest_point_sample(xyz, npoint, farthest):
        device = xyz.device
        B, N, C = xyz.shape
        centroids = torch.zeros(B, npoint, dtype=torch.long).to(device)
        distance = torch.ones(B, N).to(device) * 1e10
        batch_indices = torch.arange(B, dtype=torch.long).to(device)
        for i in range(npoint):
            centroids[:, i] = farthest
            centroid = xyz[batch_indices, farthest, :].view(B, 1, 3)
            dist = torch.sum((xyz - centroid) ** 2, -1)
            mask = dist < distance
            distance[mask] = dist[mask]
            farthest = torch.max(distance, -1)[1]
        return centroids

    def query_ball_point(radius, nsample, xyz, new_xyz):
        device = xyz.device
        B, N, C = xyz.shape
        _, S, _ = new_xyz.shape
        group_idx = torch.arange(N, dtype=torch.long).to(device).view(1, 1, N).repeat([B, S, 1])
        sqrdists = square_distance(new_xyz, xyz)
        group_idx[sqrdists > radius**2] = N
        group_idx = group_idx.sort(dim=-1)[0][:, :, :nsample]
        group_first = group_idx[:, :, 0].view(B, S, 1).repeat([1, 1, nsample])
        mask = group_idx == N
        group_idx[mask] = group_first[mask]
        return group_idx

    def knn_group(xyz, new_xyz, points, k):
        dists = torch.cdist(new_xyz, xyz)  # B, S, N
        _, idx = dists.topk(k, dim=-1, largest=False, sorted=True)
        B, S, _ = idx.shape
        D = points.shape[-1]
        gathered = torch.gather(points.unsqueeze(1).expand(B, S, -1, D), 2, idx.unsqueeze(-1).expand(B, S, k, D))
        return gathered, idx

    class SetAbstraction(nn.Module):
        def __init__(self, npoint, radius, nsample, in_channel, mlp, group_all):
            super().__init__()
            self.npoint, self.radius, self.nsample, self.group_all = npoint, radius, nsample, group_all
            self.mlp_convs = nn.ModuleList()
            self.mlp_bns = nn.ModuleList()
            last_channel = in_channel
            for out_channel in mlp:
                # no bias before a batch norm, which cancels it (its gradient is rounding noise Adam would scale up)
                if group_all:
                    self.mlp_convs.append(nn.Conv1d(last_channel, out_channel, 1, bias=False))
                    self.mlp_bns.append(nn.BatchNorm1d(out_channel))
                else:
                    self.mlp_convs.append(nn.Conv2d(last_channel, out_channel, 1, bias=False))
                    self.mlp_bns.append(nn.BatchNorm2d(out_channel))
                last_channel = out_channel

        def forward(self, xyz, points, farthest=None):
            xyz = xyz.permute(0, 2, 1)
            if points is not None:
                points = points.permute(0, 2, 1)
            if self.group_all:
                new_xyz = torch.zeros(xyz.shape[0], 1, xyz.shape[2])
                new_points = torch.cat([xyz, points], dim=-1) if points is not None else xyz
                new_points = new_points.permute(0, 2, 1)  # B, C, N
                for i, conv in enumerate(self.mlp_convs):
                    new_points = F.relu(self.mlp_bns[i](conv(new_points)))
                new_points = torch.max(new_points, 2, keepdim=True)[0]
                return new_xyz.permute(0, 2, 1), new_points
            B, N, C = xyz.shape
            fps_idx = farthest_point_sample(xyz, self.npoint, farthest)
            new_xyz = index_points(xyz, fps_idx)
            idx = query_ball_point(self.radius, self.nsample, xyz, new_xyz)
            grouped_xyz = index_points(xyz, idx)
            grouped_xyz_norm = grouped_xyz - new_xyz.view(B, self.npoint, 1, C)
            if points is not None:
                new_points = torch.cat([grouped_xyz_norm, index_points(points, idx)], dim=-1)
            else:
                new_points = grouped_xyz_norm
            new_points = new_points.permute(0, 3, 2, 1)  # B, C, nsample, npoint
            for i, conv in enumerate(self.mlp_convs):
                new_points = F.relu(self.mlp_bns[i](conv(new_points)))
            new_points = torch.max(new_points, 2)[0]
            return new_xyz.permute(0, 2, 1), new_points, fps_idx

    class KnnBranch(nn.Module):
        # an EdgeConv-like branch: features of the k nearest points relative to the centre, max over neighbours
        def __init__(self, in_channel, out_channel):
            super().__init__()
            self.conv = nn.Conv2d(2 * in_channel, out_channel, 1, bias=False)
            self.bn = nn.BatchNorm2d(out_channel)

        def forward(self, xyz, new_xyz):
            neighbours, idx = knn_group(xyz, new_xyz, xyz, k)
            centre = new_xyz.unsqueeze(2).expand_as(neighbours)
            edge = torch.cat([neighbours - centre, centre], dim=-1).permute(0, 3, 1, 2)
            return F.leaky_relu(self.bn(self.conv(edge)), negative_slope=0.2).max(dim=-1)[0], idx

    class FeaturePropagation(nn.Module):
        # inverse-distance weighted interpolation from the 3 nearest sampled points, then a shared MLP
        def __init__(self, in_channel, mlp):
            super().__init__()
            self.mlp_convs = nn.ModuleList()
            self.mlp_bns = nn.ModuleList()
            last_channel = in_channel
            for out_channel in mlp:
                self.mlp_convs.append(nn.Conv1d(last_channel, out_channel, 1, bias=False))
                self.mlp_bns.append(nn.BatchNorm1d(out_channel))
                last_channel = out_channel

        def forward(self, xyz1, xyz2, points1, points2):
            xyz1, xyz2 = xyz1.permute(0, 2, 1), xyz2.permute(0, 2, 1)
            points2 = points2.permute(0, 2, 1)
            B, N, C = xyz1.shape
            dists = square_distance(xyz1, xyz2)
            dists, idx = dists.sort(dim=-1)
            dists, idx = dists[:, :, :3], idx[:, :, :3]
            dist_recip = 1.0 / (dists + 1e-8)
            norm = torch.sum(dist_recip, dim=2, keepdim=True)
            weight = dist_recip / norm
            interpolated_points = torch.sum(index_points(points2, idx) * weight.view(B, N, 3, 1), dim=2)
            new_points = torch.cat([points1.permute(0, 2, 1), interpolated_points], dim=-1).permute(0, 2, 1)
            for i, conv in enumerate(self.mlp_convs):
                new_points = F.relu(self.mlp_bns[i](conv(new_points)))
            return new_points

    class PointNet2(nn.Module):
        def __init__(self):
            super().__init__()
            self.fp1 = FeaturePropagation(3 + 24, [12])
            self.seg = nn.Conv1d(12, part_classes, 1)
            self.sa1 = SetAbstraction(npoint, radius, nsample, 3 + 3, [8, 16], False)
            self.knn = KnnBranch(3, 8)
            self.sa3 = SetAbstraction(None, None, None, 16 + 8 + 3, [16, 24], True)
            self.fc1 = nn.Linear(24, 16)
            self.bn1 = nn.LayerNorm(16)  # a batch norm here would cancel the shift sa3's last bias adds
            self.drop1 = nn.Dropout(0.0)
            self.fc3 = nn.Linear(16, classes)

        def forward(self, xyz, farthest):
            B, _, _ = xyz.shape
            norm = xyz[:, 3:, :]
            xyz = xyz[:, :3, :]
            l1_xyz, l1_points, fps_idx = self.sa1(xyz, norm, farthest)
            knn_points, knn_idx = self.knn(xyz.transpose(1, 2), l1_xyz.transpose(1, 2))
            l1_points = torch.cat([l1_points, knn_points], dim=1)
            l3_xyz, l3_points = self.sa3(l1_xyz, l1_points)
            x = l3_points.view(B, 24)
            x = self.drop1(F.relu(self.bn1(self.fc1(x))))
            x = self.fc3(x)
            parts = self.seg(self.fp1(xyz, l1_xyz, norm, l1_points + l3_points))  # local and global features
            return F.log_softmax(x, -1), fps_idx, knn_idx, F.log_softmax(parts, dim=1)

    def smooth_loss(pred, gold, eps=0.2):
        n_class = pred.size(1)
        one_hot = torch.zeros_like(pred).scatter(1, gold.view(-1, 1), 1)
        one_hot = one_hot * (1 - eps) + (1 - one_hot) * eps / (n_class - 1)
        return -(one_hot * pred).sum(dim=1).mean()

    model = PointNet2()
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": [], "fps": [], "knn": [],
              "acc": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-08, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    model.train()
    for points, target, farthest, parts in batches:
        points, target = torch.from_numpy(points), torch.from_numpy(target)
        points = points.transpose(2, 1)
        optimizer.zero_grad()
        pred, fps_idx, knn_idx, part_pred = model(points, torch.from_numpy(farthest))
        if smoothing == "written":
            loss = smooth_loss(pred, target.long())
        else:
            loss = F.cross_entropy(pred, target.long(), label_smoothing=0.2)
        loss = loss + F.nll_loss(part_pred, torch.from_numpy(parts), ignore_index=-1)
        loss.backward()
        optimizer.step()
        scheduler.step()
        pred_choice = pred.data.max(1)[1]
        record["acc"].append(pred_choice.eq(target.long().data).cpu().sum().item())
        record["loss"].append(loss.item())
        record["lr"].append(scheduler.get_last_lr()[0])
        record["grads"].append(gradients(model))
        record["fps"].append(numpy_of(fps_idx))
        record["knn"].append(numpy_of(knn_idx))
    model.eval()
    with torch.no_grad():
        points = torch.from_numpy(batches[0][0]).transpose(2, 1)
        pred, _, _, part_pred = model(points, torch.from_numpy(batches[0][2]))
        record["eval"] = [numpy_of(pred), numpy_of(part_pred)]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def point_batches(rng, steps=4, batch=4, n=24, classes=4):
    out = []
    for _ in range(steps):
        xyz = rng.standard_normal((batch, n, 3)).astype(np.float32) * 0.5
        normals = rng.standard_normal((batch, n, 3)).astype(np.float32)
        normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
        parts = (xyz[..., 0] > 0).astype(np.int64) + (xyz[..., 2] > 0.3)
        parts[rng.random((batch, n)) < 0.1] = -1  # unlabelled points
        out.append((np.concatenate([xyz, normals], -1), rng.integers(0, classes, batch).astype(np.int32),
                    rng.integers(0, n, batch).astype(np.int64), parts))
    return out


@pytest.mark.parametrize("smoothing", ["written", "torch"])
def test_pointnet2_with_farthest_point_sampling_ball_query_and_knn_grouping_trains_like_torch(smoothing):
    ours, theirs = run_both(pointnet2, point_batches(np.random.default_rng(1)), smoothing=smoothing)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Super-resolution: ESPCN (tanh convolutions and a PixelShuffle) on the luminance channel, and EDSR (a MeanShift
# convolution with frozen weights, residual blocks scaled by res_scale, an upsampler of conv + PixelShuffle, a global
# skip) fed a PixelUnshuffle'd input as Real-ESRGAN does for small scales. Low-resolution inputs are made from the
# high-resolution batch by antialiased bicubic downsampling; the bicubic upsampling baseline's PSNR is recorded beside
# the model's. L1 loss, Adam with MultiStepLR, clamping to [0, 1] at evaluation.

def super_resolution(torch, init, batches, scale=2, arch="edsr", antialias=True):
    nn, F = torch.nn, torch.nn.functional

    class ESPCN(nn.Module):
        def __init__(self, upscale_factor, num_channels=1):
            super().__init__()
            self.first_part = nn.Sequential(nn.Conv2d(num_channels, 16, kernel_size=5, padding=5 // 2), nn.Tanh(),
                                            nn.Conv2d(16, 8, kernel_size=3, padding=3 // 2), nn.Tanh())
            self.last_part = nn.Sequential(
                nn.Conv2d(8, num_channels * (upscale_factor**2), kernel_size=3, padding=3 // 2),
                nn.PixelShuffle(upscale_factor))
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    if m.in_channels == 8:
                        nn.init.normal_(m.weight.data, mean=0.0, std=0.01)
                        nn.init.zeros_(m.bias.data)
                    else:
                        nn.init.normal_(m.weight.data, mean=0.0,
                                        std=math.sqrt(2 / (m.out_channels * m.weight.data[0][0].numel())))
                        nn.init.zeros_(m.bias.data)

        def forward(self, x):
            return self.last_part(self.first_part(x))

    class MeanShift(nn.Conv2d):
        def __init__(self, rgb_range, rgb_mean=(0.4488, 0.4371, 0.4040), rgb_std=(1.0, 1.0, 1.0), sign=-1):
            super().__init__(3, 3, kernel_size=1)
            std = torch.Tensor(rgb_std)
            self.weight.data = torch.eye(3).view(3, 3, 1, 1) / std.view(3, 1, 1, 1)
            self.bias.data = sign * rgb_range * torch.Tensor(rgb_mean) / std
            for p in self.parameters():
                p.requires_grad = False

    def default_conv(in_channels, out_channels, kernel_size, bias=True):
        return nn.Conv2d(in_channels, out_channels, kernel_size, padding=(kernel_size // 2), bias=bias)

    class ResBlock(nn.Module):
        def __init__(self, conv, n_feats, kernel_size, bias=True, act=nn.ReLU(True), res_scale=1):  # noqa: B008 — EDSR's signature
            super().__init__()
            m = []
            for i in range(2):
                m.append(conv(n_feats, n_feats, kernel_size, bias=bias))
                if i == 0:
                    m.append(act)
            self.body = nn.Sequential(*m)
            self.res_scale = res_scale

        def forward(self, x):
            res = self.body(x).mul(self.res_scale)
            res += x
            return res

    class Upsampler(nn.Sequential):
        def __init__(self, conv, scale, n_feats, bias=True):
            m = []
            if (scale & (scale - 1)) == 0:
                for _ in range(int(math.log(scale, 2))):
                    m.append(conv(n_feats, 4 * n_feats, 3, bias))
                    m.append(nn.PixelShuffle(2))
            super().__init__(*m)

    class EDSR(nn.Module):
        def __init__(self, n_resblocks=2, n_feats=8, res_scale=0.1, conv=default_conv):
            super().__init__()
            self.sub_mean = MeanShift(1.0)
            self.add_mean = MeanShift(1.0, sign=1)
            self.unshuffle = nn.PixelUnshuffle(2)
            m_head = [conv(3 * 4, n_feats, 3)]
            m_body = [ResBlock(conv, n_feats, 3, act=nn.ReLU(True), res_scale=res_scale) for _ in range(n_resblocks)]
            m_body.append(conv(n_feats, n_feats, 3))
            m_tail = [Upsampler(conv, 2 * scale, n_feats), conv(n_feats, 3, 3)]
            self.head = nn.Sequential(*m_head)
            self.body = nn.Sequential(*m_body)
            self.tail = nn.Sequential(*m_tail)

        def forward(self, x):
            x = self.sub_mean(x)
            x = self.head(self.unshuffle(x))
            res = self.body(x)
            res += x
            x = self.tail(res)
            return self.add_mean(x)

    def psnr(sr, hr):
        mse = torch.mean((sr - hr) ** 2, dim=[1, 2, 3])
        return (10 * torch.log10(1.0 / mse)).mean()

    model = ESPCN(scale) if arch == "espcn" else EDSR()
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": [], "psnr": [], "bicubic": []}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[1, 3], gamma=0.5)
    criterion = nn.L1Loss()
    for hr in batches:
        hr = torch.from_numpy(hr)
        if arch == "espcn":
            hr = (0.299 * hr[:, 0] + 0.587 * hr[:, 1] + 0.114 * hr[:, 2]).unsqueeze(1)
        lr = F.interpolate(hr, scale_factor=1 / scale, mode="bicubic", align_corners=False, antialias=antialias)
        lr = lr.clamp(0, 1)
        bicubic = F.interpolate(lr, size=hr.shape[-2:], mode="bicubic", align_corners=False).clamp(0, 1)
        record["bicubic"].append(psnr(bicubic, hr).item())
        sr = model(lr)
        loss = criterion(sr, hr)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["lr"].append(scheduler.get_last_lr()[0])
        record["grads"].append(gradients(model))
        with torch.no_grad():
            record["psnr"].append(psnr(sr.clamp(0, 1), hr).item())
    model.eval()
    with torch.no_grad():
        hr = torch.from_numpy(batches[0])
        if arch == "espcn":
            hr = hr.mean(1, keepdim=True)
        lr = F.interpolate(hr, scale_factor=1 / scale, mode="bicubic", antialias=antialias)
        record["eval"] = numpy_of(model(lr).clamp(0.0, 1.0))
        record["unshuffled"] = numpy_of(F.pixel_shuffle(F.pixel_unshuffle(hr, 2), 2) - hr)
    record["requires_grad"] = [p.requires_grad for p in model.parameters()]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def image_batches(rng, steps=4, batch=2, size=16):
    # smooth images (sums of a few sinusoids), so that bicubic upsampling is a baseline worth beating
    ys, xs = np.meshgrid(np.linspace(0, 1, size), np.linspace(0, 1, size), indexing="ij")
    out = []
    for _ in range(steps):
        f = rng.uniform(0.5, 3.0, (batch, 3, 2, 1, 1))
        phase = rng.uniform(0, 2 * np.pi, (batch, 3, 1, 1))
        image = 0.5 + 0.25 * np.sin(2 * np.pi * (f[:, :, 0] * xs + f[:, :, 1] * ys) + phase)
        out.append((image + 0.05 * rng.standard_normal(image.shape)).clip(0, 1).astype(np.float32))
    return out


@pytest.mark.parametrize("arch,antialias", [("espcn", True), ("edsr", True), ("edsr", False)])
def test_super_resolution_with_pixel_shuffles_residual_scaling_and_bicubic_baselines_trains_like_torch(arch, antialias):
    ours, theirs = run_both(super_resolution, image_batches(np.random.default_rng(2)), arch=arch, antialias=antialias)
    assert theirs["lr"][-1] == 2.5e-4 and all(theirs["requires_grad"]) == (arch == "espcn")  # MeanShift is frozen
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A growing neural cellular automaton, as the Distill article's PyTorch ports write it: perception by a depthwise 3x3
# convolution (identity and Sobel kernels, groups=channels) with circular padding through F.pad, an update MLP of 1x1
# convolutions whose last layer starts at zero, a stochastic update mask (torch.rand(...) <= fire_rate; here the
# uniforms come from the batches), alive masks from max_pool2d of the alpha channel before and after the step, a pool of
# samples (the worst-loss sample replaced by the seed, results written back by index), a random number of steps per
# batch, each parameter's gradient divided by its norm before Adam, and a lr scheduler.

def cellular_automaton(torch, init, batches, channel_n=8, hidden=16, fire_rate=0.5, size=8, pool_size=6,
                       padding="circular"):
    nn, F = torch.nn, torch.nn.functional

    class CAModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.channel_n = channel_n
            self.fc0 = nn.Conv2d(channel_n * 3, hidden, kernel_size=1)
            self.fc1 = nn.Conv2d(hidden, channel_n, kernel_size=1, bias=False)
            with torch.no_grad():
                self.fc1.weight.zero_()
            ident = torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
            sobel_x = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 8.0
            kernel = torch.stack([ident, sobel_x, sobel_x.T])
            self.register_buffer("kernel", kernel[:, None, :, :].repeat(channel_n, 1, 1, 1))

        def alive(self, x):
            return F.max_pool2d(x[:, 3:4, :, :], kernel_size=3, stride=1, padding=1) > 0.1

        def perceive(self, x):
            if padding == "circular":
                return F.conv2d(F.pad(x, (1, 1, 1, 1), "circular"), self.kernel, groups=self.channel_n)
            return F.conv2d(x, self.kernel, padding=1, groups=self.channel_n)

        def update(self, x, fire):
            x = x.transpose(1, 3)
            pre_life_mask = self.alive(x.transpose(1, 3))
            dx = self.perceive(x.transpose(1, 3))
            dx = dx.transpose(1, 3)
            dx = self.fc0(dx.transpose(1, 3)).transpose(1, 3)
            dx = F.relu(dx)
            dx = self.fc1(dx.transpose(1, 3)).transpose(1, 3)
            stochastic = fire.transpose(1, 3) > fire_rate
            stochastic = stochastic.float()
            dx = dx * stochastic
            x = x + dx
            post_life_mask = self.alive(x.transpose(1, 3))
            life_mask = (pre_life_mask & post_life_mask).float()
            x = x.transpose(1, 3) * life_mask
            return x

        def forward(self, x, fires):
            for fire in fires:
                if fire is None:  # the script's own draw
                    fire = torch.rand(x[:, :1, :, :].transpose(1, 3).shape).transpose(1, 3)
                x = self.update(x, fire)
            return x

    def make_seed():
        seed = torch.zeros(1, channel_n, size, size)
        seed[:, 3:, size // 2, size // 2] = 1.0
        return seed

    target = torch.zeros(1, 4, size, size)
    target[:, :, 2:6, 3:5] = torch.tensor([0.9, 0.2, 0.4, 1.0]).view(1, 4, 1, 1)
    ca = CAModel()
    record = {"init": initial_state(torch, ca, init), "loss": [], "lr": [], "grads": [], "pool": []}
    optimizer = torch.optim.Adam(ca.parameters(), lr=2e-3, betas=(0.5, 0.5))
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.9)
    pool = make_seed().repeat(pool_size, 1, 1, 1)
    for batch_idx, fires in batches:
        batch_idx = torch.from_numpy(batch_idx)
        x0 = pool[batch_idx].clone()
        with torch.no_grad():
            losses = F.mse_loss(x0[:, :4], target.expand(len(batch_idx), -1, -1, -1), reduction="none").mean([1, 2, 3])
        loss_rank = losses.argsort(descending=True)
        x0 = x0[loss_rank]
        batch_idx = batch_idx[loss_rank]
        x0[:1] = make_seed()
        x = ca(x0, [None if f is None else torch.from_numpy(f) for f in fires])
        loss = F.mse_loss(x[:, :4, :, :], target.expand_as(x[:, :4]))
        optimizer.zero_grad()
        loss.backward()
        for p in ca.parameters():
            p.grad /= p.grad.norm() + 1e-8
        record["grads"].append(gradients(ca))
        optimizer.step()
        scheduler.step()
        pool[batch_idx] = x.detach()
        record["loss"].append(loss.item())
        record["lr"].append(scheduler.get_last_lr()[0])
        record["pool"].append(numpy_of(pool))
    record["alive"] = numpy_of(ca.alive(pool).sum(dim=(1, 2, 3)))
    record["final"] = {k: numpy_of(v) for k, v in ca.state_dict().items()}
    return record


def automaton_batches(rng, steps=4, batch=3, pool_size=6, channel_n=8, size=8):
    return [(rng.choice(pool_size, batch, replace=False).astype(np.int64),
             [rng.random((batch, 1, size, size)).astype(np.float32) for _ in range(rng.integers(3, 6))])
            for _ in range(steps)]


@pytest.mark.parametrize("padding", ["circular", "zeros"])
def test_neural_cellular_automaton_with_sobel_perception_alive_masks_and_a_sample_pool_trains_like_torch(padding):
    ours, theirs = run_both(cellular_automaton, automaton_batches(np.random.default_rng(3)), padding=padding)
    assert theirs["loss"][0] != theirs["loss"][-1]
    assert_same(ours, theirs)


def test_neural_cellular_automaton_with_its_own_torch_rand_masks_trains_reproducibly():
    # the script's torch.rand draws: not comparable across libraries (their generators differ), but each library's
    # run is the same from the same seed, and the stochastic masks move the training as the given ones do
    batches = [(idx, [None] * len(fires)) for idx, fires in automaton_batches(np.random.default_rng(3))]
    real_torch.manual_seed(0)
    init = cellular_automaton(real_torch, None, batches)["init"]
    for torch in LIBRARIES:
        runs = []
        for _ in range(2):
            torch.manual_seed(5)
            runs.append(cellular_automaton(torch, init, batches))
        assert_same(runs[0], runs[1], rtol=0, atol=0)
        assert np.isfinite(runs[0]["loss"]).all() and runs[0]["loss"][0] != runs[0]["loss"][-1]


# ----------------------------------------------------------------------------------------------------------------------
# A capsule network, as the popular PyTorch ports write it: a convolution, primary capsules (a convolution reshaped to
# 8-dimensional capsules and squashed), digit capsules with a weight per route (prediction vectors u_hat by matmul, or
# by einsum in the routing written the other way), dynamic routing by agreement over three iterations (a softmax of the
# logits over the digit capsules, the weighted sum, squash, the agreement added to the logits with u_hat detached in
# all but the last iteration), the margin loss, and a reconstruction decoder fed the capsules masked by the one-hot of
# the longest capsule (torch.eye(...).index_select, or F.one_hot of argmax), its MSE scaled by 0.0005. Adam, then
# accuracy from the capsule lengths.

def capsule_net(torch, init, batches, classes=4, routing="matmul", masking="eye"):
    nn, F = torch.nn, torch.nn.functional

    def squash(input_tensor, dim=-1):
        squared_norm = (input_tensor**2).sum(dim, keepdim=True)
        return squared_norm * input_tensor / ((1.0 + squared_norm) * torch.sqrt(squared_norm + 1e-9))

    class PrimaryCaps(nn.Module):
        def __init__(self, num_capsules=4, in_channels=8, out_channels=4, kernel_size=3):
            super().__init__()
            self.capsules = nn.ModuleList([nn.Conv2d(in_channels, out_channels, kernel_size, stride=2, padding=0)
                                           for _ in range(num_capsules)])

        def forward(self, x):
            u = [capsule(x) for capsule in self.capsules]
            u = torch.stack(u, dim=1)
            u = u.view(x.size(0), -1, len(self.capsules))
            return squash(u)

    class DigitCaps(nn.Module):
        def __init__(self, num_routes, in_channels=4, out_channels=6, iterations=3):
            super().__init__()
            self.num_routes, self.num_capsules, self.iterations = num_routes, classes, iterations
            self.W = nn.Parameter(0.1 * torch.randn(1, num_routes, classes, out_channels, in_channels))

        def forward(self, x):
            batch_size = x.size(0)
            if routing == "matmul":
                x = torch.stack([x] * self.num_capsules, dim=2).unsqueeze(4)
                W = torch.cat([self.W] * batch_size, dim=0)
                u_hat = torch.matmul(W, x).squeeze(-1)  # B, routes, classes, out
            else:
                u_hat = torch.einsum("rcoi,bri->brco", self.W[0], x)
            b_ij = torch.zeros(batch_size, self.num_routes, self.num_capsules, 1)
            u_hat_detached = u_hat.detach()
            for iteration in range(self.iterations):
                c_ij = F.softmax(b_ij, dim=2)
                if iteration == self.iterations - 1:
                    s_j = (c_ij * u_hat).sum(dim=1, keepdim=True)
                    v_j = squash(s_j)
                else:
                    s_j = (c_ij * u_hat_detached).sum(dim=1, keepdim=True)
                    v_j = squash(s_j)
                    if routing == "matmul":
                        a_ij = torch.matmul(u_hat_detached.unsqueeze(3), v_j.unsqueeze(4)).squeeze(-1)
                    else:
                        a_ij = torch.einsum("brco,bxco->brc", u_hat_detached, v_j).unsqueeze(-1)
                    b_ij = b_ij + a_ij
            return v_j.squeeze(1), c_ij

    class Decoder(nn.Module):
        def __init__(self, out_channels=6, size=12):
            super().__init__()
            self.size = size
            self.reconstruction_layers = nn.Sequential(nn.Linear(out_channels * classes, 32), nn.ReLU(inplace=True),
                                                       nn.Linear(32, size * size), nn.Sigmoid())

        def forward(self, x):
            classes_ = torch.sqrt((x**2).sum(2))
            classes_ = F.softmax(classes_, dim=1)
            _, max_length_indices = classes_.max(dim=1)
            if masking == "eye":
                masked = torch.eye(classes).index_select(dim=0, index=max_length_indices.squeeze())
            else:
                masked = F.one_hot(classes_.argmax(dim=1), num_classes=classes).float()
            t = (x * masked[:, :, None]).view(x.size(0), -1)
            reconstructions = self.reconstruction_layers(t)
            return reconstructions.view(-1, 1, self.size, self.size), masked

    class CapsNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_layer = nn.Sequential(nn.Conv2d(1, 8, kernel_size=3, stride=1), nn.ReLU())
            self.primary_capsules = PrimaryCaps()
            self.digit_capsules = DigitCaps(num_routes=4 * 4 * 4)
            self.decoder = Decoder()

        def forward(self, data):
            output, c_ij = self.digit_capsules(self.primary_capsules(self.conv_layer(data)))
            reconstructions, masked = self.decoder(output)
            return output, reconstructions, masked, c_ij

    def margin_loss(x, labels):
        batch_size = x.size(0)
        v_c = torch.sqrt((x**2).sum(dim=2, keepdim=True))
        left = F.relu(0.9 - v_c).view(batch_size, -1)
        right = F.relu(v_c - 0.1).view(batch_size, -1)
        loss = labels * left**2 + 0.5 * (1.0 - labels) * right**2
        return loss.sum(dim=1).mean()

    def reconstruction_loss(data, reconstructions):
        loss = F.mse_loss(reconstructions.view(reconstructions.size(0), -1), data.view(reconstructions.size(0), -1))
        return loss * 0.0005

    model = CapsNet()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "correct": [], "routes": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for data, target in batches:
        data = torch.from_numpy(data)
        target = torch.sparse.torch.eye(classes).index_select(dim=0, index=torch.from_numpy(target))
        optimizer.zero_grad()
        output, reconstructions, masked, c_ij = model(data)
        loss = margin_loss(output, target) + reconstruction_loss(data, reconstructions)
        loss.backward()
        optimizer.step()
        correct = sum(np.argmax(masked.data.cpu().numpy(), 1) == np.argmax(target.data.cpu().numpy(), 1))
        record["correct"].append(int(correct))
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["routes"].append(numpy_of(c_ij))
    model.eval()
    with torch.no_grad():
        output, reconstructions, masked, _ = model(torch.from_numpy(batches[0][0]))
        record["eval"] = [numpy_of(output.norm(dim=-1)), numpy_of(reconstructions), numpy_of(masked)]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def capsule_batches(rng, steps=4, batch=4, size=12, classes=4):
    out = []
    for _ in range(steps):
        labels = rng.integers(0, classes, batch)
        images = rng.random((batch, 1, size, size)).astype(np.float32) * 0.3
        for i, label in enumerate(labels):  # a bar whose position is the class
            images[i, 0, 2 + 2 * label: 4 + 2 * label, 2:10] += 0.7
        out.append((images.clip(0, 1), labels.astype(np.int64)))
    return out


@pytest.mark.parametrize("routing,masking", [("matmul", "eye"), ("einsum", "one_hot")])
def test_capsule_network_with_routing_by_agreement_margin_loss_and_a_masked_decoder_trains_like_torch(routing,
                                                                                                     masking):
    ours, theirs = run_both(capsule_net, capsule_batches(np.random.default_rng(4)), routing=routing, masking=masking)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Spatial transformers and image registration. A spatial transformer network as the PyTorch tutorial writes it: a
# localisation network whose last layer starts at the identity transform, F.affine_grid and F.grid_sample before a
# classifier. A VoxelMorph-style registration: a small encoder-decoder predicts a displacement field, a
# SpatialTransformer module adds it to an identity grid (a buffer from meshgrid), normalises to [-1, 1], flips the
# coordinate order and resamples with grid_sample (align_corners=True); the loss is an MSE similarity plus the
# gradient (smoothness) loss of the field by finite differences ('l2', or 'l1' by abs), or a local normalised cross
# correlation through convolutions with ones; a diffeomorphic variant integrates a half-resolution velocity field by
# scaling and squaring (the field resampling itself) and resizes it by interpolate; the Jacobian determinant of the
# field counts foldings. A 3D affine registration of a
# small volume: parameters of a 3x4 matrix, affine_grid and 5-D grid_sample (bilinear, i.e. trilinear), an
# inverse-consistency term through torch.linalg.inv of the 4x4 homogeneous matrices, and a 3D displacement refinement
# with its own smoothness loss. Adam for all three.

def spatial_transformers(torch, init, batches, penalty="l2", align_corners=False, mode="bilinear", padding="zeros",
                         int_steps=0, similarity="mse"):
    nn, F = torch.nn, torch.nn.functional

    class STN(nn.Module):
        def __init__(self, classes=3):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, kernel_size=3)
            self.fc = nn.Linear(4 * 3 * 3, classes)
            self.localization = nn.Sequential(nn.Conv2d(1, 4, kernel_size=3), nn.MaxPool2d(2, stride=2), nn.ReLU(True),
                                              nn.Conv2d(4, 6, kernel_size=3), nn.MaxPool2d(2, stride=2), nn.ReLU(True))
            self.fc_loc = nn.Sequential(nn.Linear(6 * 2 * 2, 16), nn.ReLU(True), nn.Linear(16, 3 * 2))
            self.fc_loc[2].weight.data.zero_()
            self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))

        def stn(self, x):
            xs = self.localization(x)
            xs = xs.view(-1, 6 * 2 * 2)
            theta = self.fc_loc(xs)
            theta = theta.view(-1, 2, 3)
            grid = F.affine_grid(theta, x.size(), align_corners=align_corners)
            return F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align_corners), theta

        def forward(self, x):
            x, theta = self.stn(x)
            x = F.relu(F.max_pool2d(self.conv1(x), 4))
            x = x.view(-1, 4 * 3 * 3)
            return F.log_softmax(self.fc(x), dim=1), theta

    class SpatialTransformer(nn.Module):
        def __init__(self, size, mode="bilinear"):
            super().__init__()
            self.mode = mode
            vectors = [torch.arange(0, s) for s in size]
            grids = torch.meshgrid(vectors, indexing="ij")
            grid = torch.stack(grids)
            grid = torch.unsqueeze(grid, 0)
            grid = grid.type(torch.FloatTensor)
            self.register_buffer("grid", grid, persistent=False)

        def forward(self, src, flow):
            new_locs = self.grid + flow
            shape = flow.shape[2:]
            for i in range(len(shape)):
                new_locs[:, i, ...] = 2 * (new_locs[:, i, ...] / (shape[i] - 1) - 0.5)
            if len(shape) == 2:
                new_locs = new_locs.permute(0, 2, 3, 1)
                new_locs = new_locs[..., [1, 0]]
            elif len(shape) == 3:
                new_locs = new_locs.permute(0, 2, 3, 4, 1)
                new_locs = new_locs[..., [2, 1, 0]]
            return F.grid_sample(src, new_locs, align_corners=True, mode=self.mode)

    class VecInt(nn.Module):
        # VoxelMorph's integration of a stationary velocity field by scaling and squaring
        def __init__(self, inshape, nsteps):
            super().__init__()
            self.nsteps = nsteps
            self.scale = 1.0 / (2**self.nsteps)
            self.transformer = SpatialTransformer(inshape)

        def forward(self, vec):
            vec = vec * self.scale
            for _ in range(self.nsteps):
                vec = vec + self.transformer(vec, vec)
            return vec

    class ResizeTransform(nn.Module):
        def __init__(self, vel_resize, ndims):
            super().__init__()
            self.factor = 1.0 / vel_resize
            self.mode = "linear" if ndims == 1 else ("bilinear" if ndims == 2 else "trilinear")

        def forward(self, x):
            if self.factor < 1:
                x = F.interpolate(x, align_corners=True, scale_factor=self.factor, mode=self.mode)
                x = self.factor * x
            elif self.factor > 1:
                x = self.factor * x
                x = F.interpolate(x, align_corners=True, scale_factor=self.factor, mode=self.mode)
            return x

    class RegNet(nn.Module):
        def __init__(self, size, ndim=2, features=8):
            super().__init__()
            Conv = getattr(nn, f"Conv{ndim}d")
            self.enc1 = Conv(2, features, 3, padding=1)
            self.enc2 = Conv(features, features, 3, stride=2, padding=1)
            self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
            self.dec = Conv(2 * features, features, 3, padding=1)
            self.flow = Conv(features, ndim, 3, padding=1)
            self.flow.weight = nn.Parameter(torch.distributions.Normal(0, 1e-2).sample(self.flow.weight.shape))
            self.flow.bias = nn.Parameter(torch.zeros(self.flow.bias.shape))
            if int_steps:
                self.resize = ResizeTransform(2, ndim)
                self.fullsize = ResizeTransform(0.5, ndim)
                self.integrate = VecInt([s // 2 for s in size], int_steps)
            self.transformer = SpatialTransformer(size)

        def forward(self, source, target):
            x = torch.cat([source, target], dim=1)
            x1 = F.leaky_relu(self.enc1(x), 0.2)
            x2 = F.leaky_relu(self.enc2(x1), 0.2)
            x = F.leaky_relu(self.dec(torch.cat([self.upsample(x2), x1], dim=1)), 0.2)
            flow_field = self.flow(x)
            if int_steps:
                pos_flow = self.integrate(self.resize(flow_field))
                flow_field = self.fullsize(pos_flow)
            return self.transformer(source, flow_field), flow_field

    def ncc_loss(y_true, y_pred, win=5):
        # VoxelMorph's local normalised cross correlation, window sums by a convolution with ones
        Ii, Ji = y_true, y_pred
        ndims = len(list(Ii.size())) - 2
        sum_filt = torch.ones([1, 1, *[win] * ndims])
        pad_no = math.floor(win / 2)
        stride, padding = (1,) * ndims, (pad_no,) * ndims
        conv_fn = getattr(F, f"conv{ndims}d")
        I2, J2, IJ = Ii * Ii, Ji * Ji, Ii * Ji
        I_sum = conv_fn(Ii, sum_filt, stride=stride, padding=padding)
        J_sum = conv_fn(Ji, sum_filt, stride=stride, padding=padding)
        I2_sum = conv_fn(I2, sum_filt, stride=stride, padding=padding)
        J2_sum = conv_fn(J2, sum_filt, stride=stride, padding=padding)
        IJ_sum = conv_fn(IJ, sum_filt, stride=stride, padding=padding)
        win_size = np.prod([win] * ndims)
        u_I, u_J = I_sum / win_size, J_sum / win_size
        cross = IJ_sum - u_J * I_sum - u_I * J_sum + u_I * u_J * win_size
        I_var = I2_sum - 2 * u_I * I_sum + u_I * u_I * win_size
        J_var = J2_sum - 2 * u_J * J_sum + u_J * u_J * win_size
        cc = cross * cross / (I_var * J_var + 1e-5)
        return -torch.mean(cc)

    def jacobian_determinant(flow):
        # of the map x + u(x), by forward differences on the (N, 2, H, W) displacement field
        du_dy = flow[:, :, 1:, :-1] - flow[:, :, :-1, :-1]
        du_dx = flow[:, :, :-1, 1:] - flow[:, :, :-1, :-1]
        return (1 + du_dy[:, 0]) * (1 + du_dx[:, 1]) - du_dx[:, 0] * du_dy[:, 1]

    def grad_loss(y_pred):
        if y_pred.dim() == 4:
            dy = torch.abs(y_pred[:, :, 1:, :] - y_pred[:, :, :-1, :])
            dx = torch.abs(y_pred[:, :, :, 1:] - y_pred[:, :, :, :-1])
            if penalty == "l2":
                dy, dx = dy * dy, dx * dx
            return (torch.mean(dx) + torch.mean(dy)) / 2.0
        dy = torch.abs(y_pred[:, :, 1:, :, :] - y_pred[:, :, :-1, :, :])
        dx = torch.abs(y_pred[:, :, :, 1:, :] - y_pred[:, :, :, :-1, :])
        dz = torch.abs(y_pred[:, :, :, :, 1:] - y_pred[:, :, :, :, :-1])
        if penalty == "l2":
            dy, dx, dz = dy * dy, dx * dx, dz * dz
        return (torch.mean(dx) + torch.mean(dy) + torch.mean(dz)) / 3.0

    class Affine3d(nn.Module):
        # a 3x4 affine transform near the identity, and a displacement refinement on top of it
        def __init__(self, size):
            super().__init__()
            self.theta = nn.Parameter(torch.eye(3, 4) + 0.01 * torch.randn(3, 4))
            self.refine = nn.Conv3d(2, 3, 3, padding=1)
            nn.init.normal_(self.refine.weight, std=1e-2)
            nn.init.zeros_(self.refine.bias)
            self.transformer = SpatialTransformer(size)

        def homogeneous(self, theta):
            bottom = torch.tensor([[0.0, 0.0, 0.0, 1.0]]).expand(theta.shape[0], 1, 4)
            return torch.cat([theta, bottom], dim=1)

        def forward(self, moving, fixed):
            theta = self.theta.unsqueeze(0).expand(moving.shape[0], 3, 4)
            grid = F.affine_grid(theta, list(moving.shape), align_corners=align_corners)
            mode_3d = "bilinear" if mode == "bicubic" else mode  # (bicubic is for 2D only)
            warped = F.grid_sample(moving, grid, mode=mode_3d, padding_mode="border", align_corners=align_corners)
            inverse = torch.linalg.inv(self.homogeneous(theta))[:, :3, :]
            back_grid = F.affine_grid(inverse, list(moving.shape), align_corners=align_corners)
            back = F.grid_sample(warped, back_grid, padding_mode="border", align_corners=align_corners)
            flow = self.refine(torch.cat([warped, fixed], dim=1))
            return self.transformer(warped, flow), flow, back, inverse

    stn, reg2d, reg3d = STN(), RegNet((8, 8)), Affine3d((6, 6, 6))
    models = nn.ModuleDict({"stn": stn, "reg2d": reg2d, "reg3d": reg3d})
    record = {"init": initial_state(torch, models, init), "loss": [], "grads": [], "theta": [], "inverse": [],
              "folding": []}
    optimizer = torch.optim.Adam(models.parameters(), lr=1e-2)
    for (digits, labels), (moving, fixed), (moving3, fixed3) in batches:
        digits, labels = torch.from_numpy(digits), torch.from_numpy(labels)
        output, theta = stn(digits)
        loss_stn = F.nll_loss(output, labels)
        moving, fixed = torch.from_numpy(moving), torch.from_numpy(fixed)
        moved, flow = reg2d(moving, fixed)
        sim = ncc_loss(fixed, moved) if similarity == "ncc" else F.mse_loss(moved, fixed)
        loss_reg = sim + 0.1 * grad_loss(flow)
        moving3, fixed3 = torch.from_numpy(moving3), torch.from_numpy(fixed3)
        moved3, flow3, back3, inverse = reg3d(moving3, fixed3)
        loss_3d = F.mse_loss(moved3, fixed3) + 0.1 * grad_loss(flow3) + 0.1 * F.mse_loss(back3, moving3)
        loss = loss_stn + loss_reg + loss_3d
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append([loss_stn.item(), loss_reg.item(), loss_3d.item()])
        record["grads"].append(gradients(models))
        record["theta"].append(numpy_of(theta))
        record["inverse"].append(numpy_of(inverse))
        with torch.no_grad():
            det = jacobian_determinant(flow)
            record["folding"].append([(det <= 0).sum().item(), det.min().item(), det.std().item()])
    models.eval()
    with torch.no_grad():
        (digits, _), (moving, fixed), (moving3, fixed3) = batches[0]
        record["eval"] = [numpy_of(stn(torch.from_numpy(digits))[0]),
                          numpy_of(reg2d(torch.from_numpy(moving), torch.from_numpy(fixed))[0]),
                          numpy_of(reg3d(torch.from_numpy(moving3), torch.from_numpy(fixed3))[0])]
    record["final"] = {k: numpy_of(v) for k, v in models.state_dict().items()}
    return record


def registration_batches(rng, steps=4, batch=2):
    out = []
    ys, xs = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    for _ in range(steps):
        digits = rng.random((batch, 1, 16, 16)).astype(np.float32)
        labels = rng.integers(0, 3, batch).astype(np.int64)
        centre = rng.uniform(2.5, 4.5, (2, batch, 2))
        blobs = np.exp(-((ys - centre[..., 0, None, None]) ** 2 + (xs - centre[..., 1, None, None]) ** 2) / 4.0)
        moving, fixed = blobs[:, :, None].astype(np.float32)
        volumes = rng.random((2, batch, 1, 6, 6, 6)).astype(np.float32)
        out.append(((digits, labels), (moving, fixed), (volumes[0], volumes[1])))
    return out


@pytest.mark.parametrize("penalty,align_corners,mode,padding,int_steps,similarity", [
    ("l2", False, "bilinear", "zeros", 0, "mse"), ("l1", True, "bilinear", "border", 0, "ncc"),
    ("l2", False, "nearest", "zeros", 0, "mse"), ("l2", True, "bicubic", "reflection", 3, "ncc"),
    ("l1", False, "bilinear", "reflection", 2, "mse")])
def test_spatial_transformers_and_registration_in_2d_and_3d_train_like_torch(penalty, align_corners, mode, padding,
                                                                             int_steps, similarity):
    ours, theirs = run_both(spatial_transformers, registration_batches(np.random.default_rng(5)), penalty=penalty,
                            align_corners=align_corners, mode=mode, padding=padding, int_steps=int_steps,
                            similarity=similarity)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced to a test.

def bits(t):
    """A tensor's elements as integers of its width (16-bit floats through int16), for comparison to the bit."""
    name = str(t.dtype).split(".")[-1]
    if name in ("float16", "bfloat16"):
        return t.view(int16_of(t)).numpy()
    return t.numpy().view(np.int64 if t.numpy().dtype.itemsize == 8 else np.int32) if t.is_floating_point() \
        else t.numpy()


def int16_of(t):
    return real_torch.int16 if isinstance(t, real_torch.Tensor) else tilewise.int16


LINSPACES = [(-1, 1, 7), (-1, 1, 16), (-1, 1, 31), (0, 1, 100), (-3.7, 11.2, 17), (2, -5, 1001), (1e-4, 0.02, 1000),
             (0, 2 * math.pi, 64), (-7, 3, 14), (0.5, 0.5, 5), (5, 2, 1), (-1, 1, 2)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int8"])
def test_linspace_gives_torch_values_to_the_bit(dtype):
    # torch counts the first half up from the start and the second down from the end with a fused multiply-add;
    # tilewise's correctly rounded float64 points differed in the last bit of up to half the elements, which moved
    # affine_grid's identity grid off torch's and grid_sample's gradient at pixel centres to the other side
    for start, end, steps in LINSPACES:
        if dtype == "int8" and max(abs(start), abs(end)) > 127:
            continue
        ours = tilewise.linspace(start, end, steps, dtype=getattr(tilewise, dtype))
        theirs = real_torch.linspace(start, end, steps, dtype=getattr(real_torch, dtype))
        np.testing.assert_array_equal(bits(ours), bits(theirs), err_msg=f"linspace({start}, {end}, {steps})")


def test_linspace_of_non_finite_ends_and_single_steps_as_torch():
    for torch in LIBRARIES:
        inf, nan = float("inf"), float("nan")
        assert torch.linspace(inf, 1, 1).tolist() == [inf]  # one step is the start, whatever the end
        assert torch.linspace(2, nan, 1, dtype=torch.int64).tolist() == [2]
        assert str(torch.linspace(inf, 1, 3).tolist()) == "[nan, inf, nan]"
        assert torch.linspace(-7, 3, 3, dtype=torch.uint8).tolist() == [249, 126, 3]  # -7 wraps, as torch's does


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_linspace_refuses_a_bool_dtype_and_ends_out_of_range_as_torch(torch):
    with pytest.raises(NotImplementedError, match="\"linspace_cpu\" not implemented for 'Bool'"):
        torch.linspace(0, 1, 3, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="value cannot be converted to type"):
        torch.linspace(0, 300, 3, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="value cannot be converted to type"):
        torch.linspace(0, 1e40, 3)
    assert torch.linspace(0, 300, 1, dtype=torch.int8).tolist() == [0]  # the end is not read for one step
    assert torch.linspace(300, 1e40, 0, dtype=torch.int8).tolist() == []


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_linspace_on_cuda_gives_torch_values_to_the_bit(dtype):
    for start, end, steps in LINSPACES + [(-1, 1, 100_003)]:
        ours = tilewise.linspace(start, end, steps, dtype=getattr(tilewise, dtype), device="cuda").cpu()
        theirs = real_torch.linspace(start, end, steps, dtype=getattr(real_torch, dtype))
        np.testing.assert_array_equal(bits(ours), bits(theirs), err_msg=f"linspace({start}, {end}, {steps})")


def identity_transformer(torch, align_corners, padding_mode, size=8):
    x = torch.from_numpy(np.random.default_rng(7).random((2, 1, size, size)).astype(np.float32))
    theta = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]).repeat(2, 1, 1).requires_grad_()
    grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=align_corners)
    out = torch.nn.functional.grid_sample(x, grid, padding_mode=padding_mode, align_corners=align_corners)
    weights = torch.from_numpy(np.random.default_rng(8).standard_normal(tuple(out.shape)).astype(np.float32))
    (out * weights).sum().backward()
    return {"grid": numpy_of(grid), "out": numpy_of(out), "grad": numpy_of(theta.grad)}


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [True, False])
def test_a_spatial_transformer_at_the_identity_has_torch_grid_and_gradient(align_corners, padding_mode):
    # at the identity every grid point lands on a pixel centre, where bilinear sampling has a kink: the gradient
    # is the one of the cell the rounded coordinate floors into, so it follows the grid's last bit; and the edge
    # points lie on the border, where torch's border and reflection padding pass no gradient (clamp's would)
    ours = identity_transformer(tilewise, align_corners, padding_mode)
    theirs = identity_transformer(real_torch, align_corners, padding_mode)
    np.testing.assert_array_equal(ours["grid"], theirs["grid"])
    assert_same(ours, theirs, atol=1e-5)


def nearest_sampling(torch, padding_mode):
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    inf, nan = float("inf"), float("nan")
    grid = torch.tensor([[[[nan, 0.2], [inf, 0.0]], [[0.5, -inf], [0.1, 0.1]]]], requires_grad=True)
    out = torch.nn.functional.grid_sample(x, grid, mode="nearest", padding_mode=padding_mode, align_corners=False)
    assert out.requires_grad
    out.sum().backward()
    return {"out": numpy_of(out), "grad": numpy_of(grid.grad)}


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_nearest_grid_sample_gives_the_grid_a_zero_gradient_as_torch(padding_mode):
    # a spatial transformer trained with mode='nearest': torch's output requires grad through the grid (whose
    # gradient is zeros), so the localisation network's parameters get zero gradients, not None
    ours, theirs = nearest_sampling(tilewise, padding_mode), nearest_sampling(real_torch, padding_mode)
    assert_same(ours, theirs, rtol=0, atol=0)


def test_torch_is_reachable_through_the_sparse_namespace():
    # a widely copied capsule network makes one-hot targets by torch.sparse.torch.eye(10).index_select(...)
    for torch in LIBRARIES:
        assert torch.sparse.torch is torch
        target = torch.sparse.torch.eye(4).index_select(dim=0, index=torch.tensor([2, 0]))
        assert target.tolist() == [[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    with pytest.raises(AttributeError, match="tilewise has no sparse tensors"):
        tilewise.sparse.mm  # noqa: B018 — the attribute access is what is tested


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_linspace_cuda_kernel_compiled_on_the_host_gives_torch_values(dtype, tmp_path):
    # the CUDA kernel's own text, built by g++ beside a shim of CUDA's names (tests/cuda_on_host.py), run one
    # thread after another: its formula and arguments are checked without a GPU
    import ctypes
    import subprocess
    from unittest import mock

    from cuda_on_host import COMPILER, SHIM

    from tilewise.backends.cuda.kernels import creation

    if COMPILER is None:
        pytest.skip("no C++ compiler")
    tw_dtype = getattr(tilewise, dtype)
    formula, wide, _ = creation.linspace_plan(0, 1, 2, tw_dtype)  # one kernel for every start, end and size
    with mock.patch.object(creation, "load", lambda text, name, device: text):
        text = creation._index_kernel("tw_linspace", tw_dtype, formula, creation.LINSPACE_PARAMS, wide, 0)
    c_out = {"float32": "float", "float64": "double", "int64": "long long"}[dtype]
    driver = f"""
static tw_dim3 blockDim = {{256, 1, 1}};
{text}
extern "C" void tw_run({c_out}* out, long long n, double start, double step, double end, long long halfway) {{
    for (long long i = 0; i < n; ++i) {{
        blockIdx.x = (unsigned)(i / 256);
        threadIdx.x = (unsigned)(i % 256);
        tw_linspace(out, n, start, step, end, halfway);
    }}
}}"""
    cpp, lib = tmp_path / "linspace.cpp", tmp_path / "linspace.so"
    cpp.write_text(SHIM + driver)
    subprocess.run([COMPILER, "-O1", "-std=c++17", "-shared", "-fPIC", "-w", str(cpp), "-o", str(lib)], check=True,
                   capture_output=True)
    run = ctypes.CDLL(str(lib)).tw_run
    run.argtypes = [ctypes.c_void_p, ctypes.c_longlong] + [ctypes.c_double] * 3 + [ctypes.c_longlong]
    for start, end, steps in LINSPACES + [(-1, 1, 100_003)]:
        if steps < 2:
            continue
        formula_here, _, args = creation.linspace_plan(start, end, steps, tw_dtype)
        assert formula_here == formula
        out = np.empty(steps, {"float32": np.float32, "float64": np.float64, "int64": np.int64}[dtype])
        run(out.ctypes.data, steps, *args)
        theirs = real_torch.linspace(start, end, steps, dtype=getattr(real_torch, dtype))
        np.testing.assert_array_equal(out, theirs.numpy(), err_msg=f"linspace({start}, {end}, {steps})")
