"""Scientific machine-learning programs in the styles their papers' code is published in, run under torch and under
tilewise (``import tilewise as torch``) from the same initial weights and data, as in ``test_trust_programs.py``,
whose helpers these use: a NeRF (positional encoding, rays from a pinhole camera, stratified and hierarchical
sampling, volume rendering), Gaussian-process regression written out (kernels from log-parameters, Cholesky solves,
the log marginal likelihood, the predictive mean and variance) and an FT-Transformer on tabular data (feature
tokenizers, a CLS token, a pre-norm transformer encoder with a padding mask, BCE with pos_weight, a plateau
schedule). Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (H, W, K, L, D)

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
# A NeRF, as nerf-pytorch writes it: a positional encoding of points and view directions (sin and cos of 2**k * pi * x,
# concatenated with the input), an MLP with a skip connection that concatenates the encoded points back in, a density
# head and a view-dependent colour head; rays from a pinhole camera (meshgrid with indexing="xy", directions rotated by
# the camera-to-world matrix); stratified samples jittered by given uniforms; volume rendering (alpha from
# 1 - exp(-sigma * delta), transmittance by an exclusive cumprod); hierarchical samples drawn from the coarse weights'
# piecewise-constant PDF (cumsum, searchsorted with right=True, gather of the bracketing CDF values and bins) and sorted
# in with the coarse ones; a coarse and a fine network; MSE against the target pixels, PSNR, Adam under ExponentialLR.

def nerf(torch, init, data, L_pts=4, L_dirs=2, width=32, depth=4, skips=(2,), n_coarse=8, n_fine=8, near=2.0,
         far=6.0, clamp_style=False):
    nn, F = torch.nn, torch.nn.functional

    class Embedder:
        def __init__(self, multires):
            self.freq_bands = 2.0 ** torch.linspace(0.0, multires - 1, steps=multires)
            self.out_dim = 3 + 3 * 2 * multires

        def embed(self, inputs):
            outputs = [inputs]
            for freq in self.freq_bands:
                for p_fn in (torch.sin, torch.cos):
                    outputs.append(p_fn(inputs * freq * math.pi))
            return torch.cat(outputs, -1)

    class NeRF(nn.Module):
        def __init__(self, input_ch, input_ch_views, D=depth, W=width):
            super().__init__()
            self.input_ch, self.input_ch_views, self.skips = input_ch, input_ch_views, skips
            self.pts_linears = nn.ModuleList([nn.Linear(input_ch, W)] + [
                nn.Linear(W, W) if i not in skips else nn.Linear(W + input_ch, W) for i in range(D - 1)])
            self.views_linears = nn.ModuleList([nn.Linear(input_ch_views + W, W // 2)])
            self.feature_linear = nn.Linear(W, W)
            self.alpha_linear = nn.Linear(W, 1)
            self.rgb_linear = nn.Linear(W // 2, 3)

        def forward(self, x):
            input_pts, input_views = torch.split(x, [self.input_ch, self.input_ch_views], dim=-1)
            h = input_pts
            for i, layer in enumerate(self.pts_linears):
                h = F.relu(layer(h))
                if i in self.skips:
                    h = torch.cat([input_pts, h], -1)
            alpha = self.alpha_linear(h)
            feature = self.feature_linear(h)
            h = torch.cat([feature, input_views], -1)
            for layer in self.views_linears:
                h = F.relu(layer(h))
            rgb = self.rgb_linear(h)
            return torch.cat([rgb, alpha], -1)

    def get_rays(H, W, K, c2w):
        i, j = torch.meshgrid(torch.linspace(0, W - 1, W), torch.linspace(0, H - 1, H), indexing="xy")
        dirs = torch.stack([(i - K[0][2]) / K[0][0], -(j - K[1][2]) / K[1][1], -torch.ones_like(i)], -1)
        rays_d = torch.sum(dirs[..., None, :] * c2w[:3, :3], -1)
        rays_o = c2w[:3, -1].expand(rays_d.shape)
        return rays_o, rays_d

    def raw2outputs(raw, z_vals, rays_d):
        raw2alpha = lambda raw, dists, act_fn=F.relu: 1.0 - torch.exp(-act_fn(raw) * dists)  # noqa: E731
        dists = z_vals[..., 1:] - z_vals[..., :-1]
        dists = torch.cat([dists, torch.Tensor([1e10]).expand(dists[..., :1].shape)], -1)
        dists = dists * torch.norm(rays_d[..., None, :], dim=-1)
        rgb = torch.sigmoid(raw[..., :3])
        alpha = raw2alpha(raw[..., 3], dists)
        weights = alpha * torch.cumprod(torch.cat([torch.ones((alpha.shape[0], 1)), 1.0 - alpha + 1e-10], -1),
                                        -1)[:, :-1]
        rgb_map = torch.sum(weights[..., None] * rgb, -2)
        depth_map = torch.sum(weights * z_vals, -1)
        disp_map = 1.0 / torch.max(1e-10 * torch.ones_like(depth_map), depth_map / torch.sum(weights, -1))
        acc_map = torch.sum(weights, -1)
        return rgb_map, disp_map, acc_map, weights, depth_map

    def sample_pdf(bins, weights, u):
        weights = weights + 1e-5
        pdf = weights / torch.sum(weights, -1, keepdim=True)
        cdf = torch.cumsum(pdf, -1)
        cdf = torch.cat([torch.zeros_like(cdf[..., :1]), cdf], -1)
        u = u.contiguous()
        inds = torch.searchsorted(cdf, u, right=True)
        if clamp_style:
            below = (inds - 1).clamp(min=0)
            above = inds.clamp(max=cdf.shape[-1] - 1)
        else:
            below = torch.max(torch.zeros_like(inds - 1), inds - 1)
            above = torch.min((cdf.shape[-1] - 1) * torch.ones_like(inds), inds)
        inds_g = torch.stack([below, above], -1)
        matched_shape = [inds_g.shape[0], inds_g.shape[1], cdf.shape[-1]]
        cdf_g = torch.gather(cdf.unsqueeze(1).expand(matched_shape), 2, inds_g)
        bins_g = torch.gather(bins.unsqueeze(1).expand(matched_shape), 2, inds_g)
        denom = cdf_g[..., 1] - cdf_g[..., 0]
        denom = torch.where(denom < 1e-5, torch.ones_like(denom), denom)
        t = (u - cdf_g[..., 0]) / denom
        return bins_g[..., 0] + t * (bins_g[..., 1] - bins_g[..., 0])

    embed_pts, embed_dirs = Embedder(L_pts), Embedder(L_dirs)
    model = NeRF(embed_pts.out_dim, embed_dirs.out_dim)
    model_fine = NeRF(embed_pts.out_dim, embed_dirs.out_dim)
    nets = nn.ModuleDict({"coarse": model, "fine": model_fine})
    record = {"init": initial_state(torch, nets, init), "loss": [], "psnr": [], "lr": [], "grads": [], "z": []}

    def network_query_fn(pts, viewdirs, network):
        inputs_flat = torch.reshape(pts, [-1, pts.shape[-1]])
        input_dirs = viewdirs[:, None].expand(pts.shape)
        input_dirs_flat = torch.reshape(input_dirs, [-1, input_dirs.shape[-1]])
        embedded = torch.cat([embed_pts.embed(inputs_flat), embed_dirs.embed(input_dirs_flat)], -1)
        outputs_flat = network(embedded)
        return torch.reshape(outputs_flat, list(pts.shape[:-1]) + [outputs_flat.shape[-1]])

    def render_rays(rays_o, rays_d, t_rand, u):
        N_rays = rays_o.shape[0]
        viewdirs = rays_d / torch.norm(rays_d, dim=-1, keepdim=True)
        t_vals = torch.linspace(0.0, 1.0, steps=n_coarse)
        z_vals = near * (1.0 - t_vals) + far * t_vals
        z_vals = z_vals.expand([N_rays, n_coarse])
        mids = 0.5 * (z_vals[..., 1:] + z_vals[..., :-1])
        upper = torch.cat([mids, z_vals[..., -1:]], -1)
        lower = torch.cat([z_vals[..., :1], mids], -1)
        z_vals = lower + (upper - lower) * t_rand
        pts = rays_o[..., None, :] + rays_d[..., None, :] * z_vals[..., :, None]
        raw = network_query_fn(pts, viewdirs, model)
        rgb_map_0, _, _, weights, _ = raw2outputs(raw, z_vals, rays_d)
        z_vals_mid = 0.5 * (z_vals[..., 1:] + z_vals[..., :-1])
        z_samples = sample_pdf(z_vals_mid, weights[..., 1:-1], u)
        z_samples = z_samples.detach()
        z_vals, _ = torch.sort(torch.cat([z_vals, z_samples], -1), -1)
        pts = rays_o[..., None, :] + rays_d[..., None, :] * z_vals[..., :, None]
        raw = network_query_fn(pts, viewdirs, model_fine)
        rgb_map, disp_map, acc_map, _, depth_map = raw2outputs(raw, z_vals, rays_d)
        return {"rgb0": rgb_map_0, "rgb": rgb_map, "disp": disp_map, "acc": acc_map, "depth": depth_map,
                "z": z_vals, "z_samples": z_samples}

    img2mse = lambda x, y: torch.mean((x - y) ** 2)  # noqa: E731
    mse2psnr = lambda x: -10.0 * torch.log(x) / torch.log(torch.Tensor([10.0]))  # noqa: E731

    H, W, focal = data["image"].shape[0], data["image"].shape[1], data["focal"]
    K = np.array([[focal, 0, 0.5 * W], [0, focal, 0.5 * H], [0, 0, 1]])
    rays_o, rays_d = get_rays(H, W, K, torch.Tensor(data["c2w"][:3, :4]))
    rays_o, rays_d = rays_o.reshape(-1, 3), rays_d.reshape(-1, 3)
    target = torch.Tensor(data["image"]).reshape(-1, 3)
    optimizer = torch.optim.Adam(params=list(nets.parameters()), lr=5e-3, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    for step in range(len(data["select"])):
        select = torch.from_numpy(data["select"][step])
        t_rand = torch.from_numpy(data["t_rand"][step])
        u = torch.from_numpy(data["u"][step])
        out = render_rays(rays_o[select], rays_d[select], t_rand, u)
        optimizer.zero_grad()
        img_loss = img2mse(out["rgb"], target[select])
        loss = img_loss + img2mse(out["rgb0"], target[select])
        psnr = mse2psnr(img_loss)
        loss.backward()
        optimizer.step()
        record["lr"].append(scheduler.get_last_lr()[0])
        scheduler.step()
        record["loss"].append(loss.item())
        record["psnr"].append(psnr.item())
        record["grads"].append(gradients(nets))
        record["z"].append(numpy_of(out["z"]))
    with torch.no_grad():
        out = render_rays(rays_o, rays_d, torch.from_numpy(data["t_rand"][0][:1]).expand(H * W, -1),
                          torch.linspace(0.0, 1.0, steps=n_fine).expand(H * W, n_fine))
        record["render"] = {k: numpy_of(v) for k, v in out.items()}
    record["final"] = {k: numpy_of(v) for k, v in nets.state_dict().items()}
    return record


def pinhole_scene(rng, steps=4, size=4, n_coarse=8, n_fine=8, rays=10):
    theta = 0.3
    c2w = np.array([[np.cos(theta), 0, np.sin(theta), 0.3], [0, 1, 0, -0.2], [-np.sin(theta), 0, np.cos(theta), 4.0],
                    [0, 0, 0, 1]], np.float32)
    return {"image": rng.uniform(size=(size, size, 3)).astype(np.float32), "focal": 5.0, "c2w": c2w,
            "select": [rng.choice(size * size, rays, replace=False) for _ in range(steps)],
            "t_rand": rng.uniform(size=(steps, rays, n_coarse)).astype(np.float32),
            "u": rng.uniform(size=(steps, rays, n_fine)).astype(np.float32)}


@pytest.mark.parametrize("clamp_style", [False, True])
def test_nerf_with_hierarchical_sampling_trains_like_torch(clamp_style):
    ours, theirs = run_both(nerf, pinhole_scene(np.random.default_rng(0)), clamp_style=clamp_style)
    assert np.all(np.diff(theirs["render"]["z"], axis=-1) >= 0)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Gaussian-process regression written without GPyTorch, as tutorials and papers' appendices write it: an RBF kernel with
# one log-lengthscale per input dimension plus a linear kernel, their scales and the noise as log-parameters
# (nn.Parameter), squared distances from cdist or from broadcasting, a jitter on the diagonal, the Cholesky factor, the
# weights by cholesky_solve or by two triangular solves, the negative log marginal likelihood with
# log(diagonal(L)).sum(), Adam on the hyperparameters; then the predictive mean and variance in float64. GPyTorch's
# psd_safe_cholesky (cholesky_ex, jitter added until info is zero) on a kernel matrix that is not positive-definite,
# and the error linalg.cholesky raises there.

def gaussian_process(torch, init, data, distance="cdist", solve="cholesky_solve", dtype="float32", steps=5):
    nn = torch.nn

    class RBFPlusLinear(nn.Module):
        def __init__(self, dims):
            super().__init__()
            self.log_lengthscale = nn.Parameter(torch.zeros(dims))
            self.log_outputscale = nn.Parameter(torch.tensor(0.0))
            self.log_variance = nn.Parameter(torch.tensor(-1.0))

        def forward(self, x1, x2):
            ls = self.log_lengthscale.exp()
            a, b = x1 / ls, x2 / ls
            if distance == "cdist":
                sqdist = torch.cdist(a, b, p=2).pow(2)
            else:
                sqdist = (a[:, None] - b[None]).pow(2).sum(-1)
            return self.log_outputscale.exp() * torch.exp(-0.5 * sqdist) + self.log_variance.exp() * (x1 @ x2.T)

    class ExactGP(nn.Module):
        def __init__(self, dims):
            super().__init__()
            self.kernel = RBFPlusLinear(dims)
            self.log_noise = nn.Parameter(torch.tensor(-2.0))
            self.mean = nn.Parameter(torch.tensor(0.0))

        def factor(self, x):
            K = self.kernel(x, x) + (self.log_noise.exp() + 1e-6) * torch.eye(x.shape[0], dtype=x.dtype)
            return torch.linalg.cholesky(K)

        def weights(self, L, r):
            if solve == "cholesky_solve":
                return torch.cholesky_solve(r, L)
            v = torch.linalg.solve_triangular(L, r, upper=False)
            return torch.linalg.solve_triangular(L.T, v, upper=True)

        def neg_log_marginal_likelihood(self, x, y):
            L = self.factor(x)
            r = (y - self.mean)[:, None]
            alpha = self.weights(L, r)
            n = x.shape[0]
            return 0.5 * (r * alpha).sum() + torch.log(torch.diagonal(L)).sum() + 0.5 * n * math.log(2 * math.pi)

        def predict(self, x, y, xs):
            L = self.factor(x)
            alpha = self.weights(L, (y - self.mean)[:, None])
            Ks = self.kernel(x, xs)
            mean = self.mean + (Ks.T @ alpha).squeeze(-1)
            v = torch.linalg.solve_triangular(L, Ks, upper=False)
            var = torch.diagonal(self.kernel(xs, xs)) - v.pow(2).sum(0) + self.log_noise.exp()
            return mean, var

    def psd_safe_cholesky(A, jitter=1e-6, max_tries=5):
        L, info = torch.linalg.cholesky_ex(A)
        if not torch.any(info):
            return L, 0, info
        Aprime = A.clone()
        jitter_prev = 0
        for i in range(max_tries):
            jitter_new = jitter * (10 ** i)
            Aprime.diagonal(dim1=-2, dim2=-1).add_(jitter_new - jitter_prev)
            jitter_prev = jitter_new
            L, info_i = torch.linalg.cholesky_ex(Aprime)
            if not torch.any(info_i):
                return L, i + 1, info
        raise RuntimeError(f"Matrix not positive definite after repeatedly adding jitter up to {jitter_new:.1e}.")

    wide = getattr(torch, dtype)
    x, y = torch.from_numpy(data["x"]).to(wide), torch.from_numpy(data["y"]).to(wide)
    model = ExactGP(x.shape[1]).to(wide)
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model.neg_log_marginal_likelihood(x, y)
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    model = model.double()
    model.eval()
    with torch.no_grad():
        xs = torch.from_numpy(data["xs"])
        mean, var = model.predict(x.double(), y.double(), xs)
        record["dtypes"] = [str(t.dtype) for t in (mean, var)]
        record["mean"], record["var"] = numpy_of(mean), numpy_of(var)
        duplicated = torch.cat([xs, xs[:2]])
        K = model.kernel(duplicated, duplicated) - 3e-4 * torch.eye(len(duplicated), dtype=torch.float64)
        L, tries, info = psd_safe_cholesky(K)
        record["jitter"] = {"tries": tries, "info": info.item(), "L": numpy_of(L)}
        partial, info = torch.linalg.cholesky_ex(K)
        record["partial"] = {"L": numpy_of(partial), "info": info.item()}
        exc = raised(lambda torch: torch.linalg.cholesky(K), torch)
        record["error"] = [type(exc).__name__, issubclass(type(exc), RuntimeError), str(exc)]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def regression_data(rng, n=16, dims=2, tests=6):
    x = rng.uniform(-2, 2, (n, dims))
    y = np.sin(2 * x[:, 0]) + 0.3 * x[:, 1] + 0.1 * rng.normal(size=n)
    return {"x": x.astype(np.float32), "y": y.astype(np.float32), "xs": rng.uniform(-2, 2, (tests, dims))}


@pytest.mark.parametrize(("distance", "solve", "dtype"), [("cdist", "cholesky_solve", "float32"),
                                                          ("broadcast", "solve_triangular", "float32"),
                                                          ("cdist", "solve_triangular", "float64")])
def test_gaussian_process_hyperparameters_and_predictions_match_torch(distance, solve, dtype):
    ours, theirs = run_both(gaussian_process, regression_data(np.random.default_rng(0)), distance=distance,
                            solve=solve, dtype=dtype)
    assert theirs.pop("dtypes") == ["torch.float64"] * 2 and ours.pop("dtypes") == ["tilewise.float64"] * 2
    error = theirs.pop("error")
    assert ours.pop("error") == ["LinAlgError", True, error[2]]
    assert theirs["jitter"]["tries"] > 1 and theirs["partial"]["info"] > 0
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# An FT-Transformer for tabular data, as rtdl writes it: each numerical column a token (weight[None] * x[..., None] +
# bias), each categorical column an nn.Embedding row found through per-column offsets (a non-persistent buffer), a
# CLS token expanded over the batch and prepended with cat, nn.TransformerEncoder over pre-norm GELU layers
# (batch_first, norm_first, dropout 0) with a boolean src_key_padding_mask for the missing (NaN) numerical entries, a
# head on the CLS token, BCE with logits and pos_weight from the class balance, AdamW with the tokenizers, norms and
# biases kept out of weight decay, ReduceLROnPlateau on the validation loss, evaluation under no_grad and eval().

def ft_transformer(torch, init, data, d_token=8, heads=2, layers=2, epochs=4):
    nn, F = torch.nn, torch.nn.functional

    class NumericalFeatureTokenizer(nn.Module):
        def __init__(self, n_features, d_token):
            super().__init__()
            self.weight = nn.Parameter(torch.Tensor(n_features, d_token))
            self.bias = nn.Parameter(torch.Tensor(n_features, d_token))
            for parameter in (self.weight, self.bias):
                nn.init.uniform_(parameter, -(d_token ** -0.5), d_token ** -0.5)

        def forward(self, x):
            x = self.weight[None] * x[..., None]
            return x + self.bias[None]

    class CategoricalFeatureTokenizer(nn.Module):
        def __init__(self, cardinalities, d_token):
            super().__init__()
            category_offsets = torch.tensor([0] + cardinalities[:-1]).cumsum(0)
            self.register_buffer("category_offsets", category_offsets, persistent=False)
            self.embeddings = nn.Embedding(sum(cardinalities), d_token)
            self.bias = nn.Parameter(torch.Tensor(len(cardinalities), d_token))
            nn.init.uniform_(self.bias, -(d_token ** -0.5), d_token ** -0.5)

        def forward(self, x):
            x = self.embeddings(x + self.category_offsets[None])
            return x + self.bias[None]

    class FTTransformer(nn.Module):
        def __init__(self, n_num, cardinalities):
            super().__init__()
            self.num_tokenizer = NumericalFeatureTokenizer(n_num, d_token)
            self.cat_tokenizer = CategoricalFeatureTokenizer(cardinalities, d_token)
            self.cls = nn.Parameter(torch.empty(1, 1, d_token))
            nn.init.uniform_(self.cls, -(d_token ** -0.5), d_token ** -0.5)
            layer = nn.TransformerEncoderLayer(d_token, heads, dim_feedforward=2 * d_token, dropout=0.0,
                                               activation="gelu", batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=layers, norm=nn.LayerNorm(d_token))
            self.head = nn.Sequential(nn.LayerNorm(d_token), nn.ReLU(), nn.Linear(d_token, 1))

        def forward(self, x_num, x_cat):
            missing = torch.isnan(x_num)
            x_num = torch.nan_to_num(x_num, nan=0.0)
            tokens = torch.cat([self.num_tokenizer(x_num), self.cat_tokenizer(x_cat)], dim=1)
            B = tokens.shape[0]
            x = torch.cat([self.cls.expand(B, -1, -1), tokens], dim=1)
            mask = torch.cat([torch.zeros(B, 1, dtype=torch.bool), missing,
                              torch.zeros(B, x_cat.shape[1], dtype=torch.bool)], dim=1)
            x = self.encoder(x, src_key_padding_mask=mask)
            return self.head(x[:, 0]).squeeze(-1)

    model = FTTransformer(data["train"][0][0].shape[1], data["cardinalities"])
    record = {"init": initial_state(torch, model, init), "loss": [], "val": [], "lr": [], "grads": []}
    record["buffers"] = sorted(name for name, _ in model.named_buffers())
    no_decay = [p for n, p in model.named_parameters() if "tokenizer" in n or "norm" in n or n.endswith(".bias")]
    decay = [p for n, p in model.named_parameters() if not any(p is q for q in no_decay)]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=2e-2,
                                  weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0)
    y_all = torch.from_numpy(np.concatenate([y for _, _, y in data["train"]]))
    pos_weight = (y_all == 0).sum() / (y_all == 1).sum()

    def evaluate(split):
        model.eval()
        with torch.no_grad():
            x_num, x_cat, y = (torch.from_numpy(a) for a in data[split])
            logits = model(x_num, x_cat)
            loss = F.binary_cross_entropy_with_logits(logits, y, pos_weight=pos_weight)
        model.train()
        return loss, logits

    for _ in range(epochs):
        for x_num, x_cat, y in data["train"]:
            x_num, x_cat, y = torch.from_numpy(x_num), torch.from_numpy(x_cat), torch.from_numpy(y)
            optimizer.zero_grad()
            loss = F.binary_cross_entropy_with_logits(model(x_num, x_cat), y, pos_weight=pos_weight)
            loss.backward()
            optimizer.step()
            record["loss"].append(loss.item())
            record["grads"].append(gradients(model))
        val_loss, _ = evaluate("val")
        scheduler.step(val_loss)
        record["val"].append(val_loss.item())
        record["lr"].append([group["lr"] for group in optimizer.param_groups])
    _, logits = evaluate("test")
    record["probabilities"] = numpy_of(torch.sigmoid(logits))
    record["training"] = model.training
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    for k in [k for k in record["final"] if k.endswith("self_attn.in_proj_bias")]:
        # the keys' bias shifts all of a query's scores alike, which softmax ignores: its gradient is zero but for
        # rounding, which Adam scales to steps of lr in either library
        record["final"][k] = np.delete(record["final"][k], np.s_[d_token:2 * d_token])
    return record


def tabular(rng, batches=2, batch=12, n_num=3, cardinalities=(3, 4, 2)):
    def split(n):
        x_num = rng.normal(size=(n, n_num)).astype(np.float32)
        x_num[rng.uniform(size=x_num.shape) < 0.2] = np.nan
        x_cat = np.stack([rng.integers(0, c, n) for c in cardinalities], 1)
        score = np.nan_to_num(x_num[:, 0]) - 0.5 * np.nan_to_num(x_num[:, 1]) + (x_cat[:, 0] == 1) - 0.8
        return x_num, x_cat, (score > 0).astype(np.float32)

    return {"train": [split(batch) for _ in range(batches)], "val": split(10), "test": split(8),
            "cardinalities": list(cardinalities)}


def test_ft_transformer_with_missing_columns_masked_trains_like_torch():
    ours, theirs = run_both(ft_transformer, tabular(np.random.default_rng(0)))
    assert ours.pop("buffers") == theirs.pop("buffers") == ["cat_tokenizer.category_offsets"]
    assert "cat_tokenizer.category_offsets" not in theirs["final"] and theirs["training"]
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

INDEFINITE = {
    # LAPACK's potrf stops at the first leading minor that is not positive-definite, leaving the columns before it
    # factored, the pivot's reduced value on the diagonal and the rest of the triangle as it was; torch returns that
    "third pivot negative": [[4.0, 2, 1, 3], [2, 5, 3, 1], [1, 3, -2, 2], [3, 1, 2, 7]],
    "first pivot negative": [[-1.0, 0], [0, 1]],
    "NaN pivot": [[4.0, 2, 1], [2, 5, 3], [1, 3, float("nan")]],
    "a batch, one indefinite": [[[4.0, 2], [2, 5]], [[1.0, 2], [2, 1]]],
    # upper=True reads the upper triangle only (a lower triangle that would factor is not looked at)
    "not symmetric, upper indefinite": [[2.0, 100], [1, 3]],
    "not symmetric, lower indefinite": [[2.0, 1], [100, 3]],
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("case", INDEFINITE)
def test_cholesky_ex_of_a_matrix_that_is_not_positive_definite_returns_lapacks_partial_factor(case, upper, dtype):
    # met in psd_safe_cholesky: cholesky_ex's L was all NaN where torch's holds the factor up to the failing pivot
    seen = []
    for torch in LIBRARIES:
        L, info = torch.linalg.cholesky_ex(torch.tensor(INDEFINITE[case], dtype=getattr(torch, dtype)), upper=upper)
        seen.append([numpy_of(L), numpy_of(info)])
    assert seen[1][1].dtype == np.int32
    assert_same(seen[1], seen[0])


def test_cholesky_ex_partial_factor_of_a_large_matrix_matches_torchs():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(80, 80))
    K = M @ M.T
    K[50, 50] = -5.0
    seen = [[numpy_of(t) for t in torch.linalg.cholesky_ex(torch.tensor(K))] for torch in LIBRARIES]
    assert seen[0][1] == 51
    assert_same(seen[1], seen[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("p", [0.5, 1.5, -1.0, 2.0, 3.0])
@pytest.mark.parametrize("rows", ["a zero entry", "all zero"])
def test_vector_norm_and_cdist_gradients_where_an_entry_or_the_distance_is_zero_are_torchs(p, rows):
    # met in a kernel's cdist of the training points with themselves, p < 2: torch's gradient is zero at a zero entry
    # (p < 1) or a zero norm, where |x| ** (p - 2) made NaN
    values = [[0.0, 1.0, -2.0], [0.0, 0.5, 0.0]] if rows == "a zero entry" else [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    points = np.random.default_rng(0).normal(size=(4, 3))
    seen = []
    for torch in LIBRARIES:
        x = torch.tensor(values, requires_grad=True)
        torch.linalg.vector_norm(x, p, dim=-1).sum().backward()
        a = torch.tensor(points, requires_grad=True)
        distances = torch.cdist(a, a, p=abs(p))  # cdist refuses p < 0
        (distances * torch.arange(16.0, dtype=torch.float64).view(4, 4)).sum().backward()
        seen.append([numpy_of(x.grad), numpy_of(distances), numpy_of(a.grad)])
    assert np.isfinite(seen[0][2]).all()
    assert_same(seen[1], seen[0])


CHOLESKY_REFUSALS = {
    "cholesky_ex, check_errors": (lambda t: t.linalg.cholesky_ex(-t.eye(2), check_errors=True), (
        "linalg.cholesky_ex: The factorization could not be completed because the input is not positive-definite "
        "(the leading minor of order 1 is not positive-definite).")),
    "cholesky, a batch": (lambda t: t.linalg.cholesky(t.stack([t.eye(2), -t.eye(2)])),
                          "linalg.cholesky: (Batch element 1): The factorization could not be completed"),
    "the deprecated cholesky": (lambda t: t.cholesky(-t.eye(2)), "cholesky: The factorization could not be completed"),
    "cholesky_solve, dtypes": (
        lambda t: t.cholesky_solve(t.ones(2, 1, dtype=t.float64), t.eye(2)),
        "Expected b and A to have the same dtype, but found b of type Double and A of type Float instead."),
    "cdist of integers": (lambda t: t.cdist(t.ones(3, 2, dtype=t.long), t.ones(3, 2, dtype=t.long)),
                          "cdist only supports floating-point dtypes, X1 got: Long"),
}


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", CHOLESKY_REFUSALS)
def test_cholesky_solves_and_distances_refuse_in_torchs_words(torch, case):
    call, message = CHOLESKY_REFUSALS[case]
    exc = raised(call, torch)
    assert isinstance(exc, RuntimeError) and str(exc).startswith(message), repr(exc)
    assert isinstance(exc, torch.linalg.LinAlgError) == ("factorization" in message)


SAMPLING_REFUSALS = {
    # a mismatch of shapes in pointwise arithmetic, as met writing a kernel's or a renderer's broadcasts
    "broadcast": (lambda t: t.ones(4) * t.ones(5, 3),
                  "The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 1"),
    "broadcast, the innermost mismatch": (
        lambda t: t.ones(2, 3) + t.ones(3, 2),
        "The size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 1"),
    "searchsorted, batch dims differ": (
        lambda t: t.searchsorted(t.ones(3, 5), t.ones(2, 4)),
        "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries "
        "tensor and input value tensor must match, but we got boundaries tensor [3, 5] and input value tensor [2, 4]"),
    "searchsorted, a scalar into rows": (
        lambda t: t.searchsorted(t.ones(3, 5), 0.5),
        "torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension is 1, but we got "
        "boundaries tensor dim(2) and input value's dim(0) numel(1)"),
    "searchsorted, side against right": (
        lambda t: t.searchsorted(t.ones(5), t.ones(3), right=True, side="left"),
        "torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True"),
    "searchsorted, no such side": (lambda t: t.searchsorted(t.ones(5), t.ones(3), side="rght"),
                                   "torch.searchsorted(): side can only be 'left' or 'right' but got rght"),
    "meshgrid, no such indexing": (lambda t: t.meshgrid(t.arange(3), t.arange(4), indexing="yx"),
                                   'torch.meshgrid: indexing must be one of "xy" or "ij", but received: yx'),
}


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", SAMPLING_REFUSALS)
def test_broadcasts_searchsorted_and_meshgrid_refuse_in_torchs_words(torch, case):
    call, message = SAMPLING_REFUSALS[case]
    exc = raised(call, torch)
    assert type(exc) is RuntimeError and str(exc).startswith(message), repr(exc)
