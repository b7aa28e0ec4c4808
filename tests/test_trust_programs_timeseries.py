"""Time-series forecasting programs in the styles their papers' code is published in, run under torch and under
tilewise (``import tilewise as torch``) from the same initial weights and data, as in ``test_trust_programs.py``,
whose helpers these use: a PatchTST-style forecaster (RevIN written out, patches by ``unfold`` after a replicate pad, a
transformer encoder with learned positions, a flatten head, AdamW under OneCycleLR), a TCN (causal dilated
convolutions under weight normalisation, both the parametrization and the older hook, chomped padding, 1x1 residual
convolutions, Adam under ReduceLROnPlateau) and N-BEATS (trend and seasonality bases, residual backcasts, sMAPE and
MASE written out, clipping by value, a rolling forecast under no_grad). Below the programs, the failures they met,
each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (B, L, H, W_P, W_pos)

from __future__ import annotations

import math

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both
from test_trust_programs_styles2 import raised

import tilewise

LIBRARIES = [real_torch, tilewise]


def series(rng, batches, batch, channels, length, horizon):
    """Sums of sines with trends and noise, cut into (input window, target window) pairs: (B, L, C) and (B, H, C)."""
    t = np.arange(batches * batch * 3 + length + horizon, dtype=np.float64)
    out = []
    for _ in range(batches):
        starts = rng.integers(0, len(t) - length - horizon, batch)
        xs, ys = [], []
        for s in starts:
            window = t[s:s + length + horizon, None]
            phase = rng.uniform(0, 2 * np.pi, channels)
            level = rng.uniform(-3, 3, channels)
            values = level + 2 * np.sin(2 * np.pi * window / 12 + phase) + 0.02 * window
            values = values + 0.1 * rng.normal(size=values.shape)
            xs.append(values[:length])
            ys.append(values[length:])
        out.append((np.stack(xs).astype(np.float32), np.stack(ys).astype(np.float32)))
    return out


# ----------------------------------------------------------------------------------------------------------------------
# A PatchTST-style forecaster, as the paper's repository writes it: reversible instance normalisation (RevIN) with the
# statistics detached and affine parameters, undone on the output; each channel alone (channel independence), padded at
# the end by repeating its last value (nn.ReplicationPad1d or F.pad(mode="replicate")), cut into overlapping patches by
# unfold(dimension=-1, size=P, step=S), each patch projected to d_model, learned positional embeddings added, an
# nn.TransformerEncoder (batch_first) over the patches, a flatten head to the horizon; MSE or Huber loss, AdamW under
# OneCycleLR stepped each batch; a forecast in eval mode under no_grad.

def patch_tst(torch, init, data, patch_len=4, stride=2, d_model=16, heads=2, layers=2, loss="mse", pad="layer",
              stats="std", epochs=2):
    nn, F = torch.nn, torch.nn.functional
    L, C = data["train"][0][0].shape[1:]
    H = data["train"][0][1].shape[1]

    class RevIN(nn.Module):
        def __init__(self, num_features, eps=1e-5, affine=True):
            super().__init__()
            self.num_features, self.eps, self.affine = num_features, eps, affine
            if self.affine:
                self.affine_weight = nn.Parameter(torch.ones(self.num_features))
                self.affine_bias = nn.Parameter(torch.zeros(self.num_features))

        def forward(self, x, mode):
            if mode == "norm":
                self._get_statistics(x)
                return self._normalize(x)
            return self._denormalize(x)

        def _get_statistics(self, x):
            dim2reduce = tuple(range(1, x.ndim - 1))
            self.mean = torch.mean(x, dim=dim2reduce, keepdim=True).detach()
            if stats == "std":
                self.stdev = x.std(dim=dim2reduce, keepdim=True, unbiased=False).detach() + self.eps
            else:
                self.stdev = torch.sqrt(torch.var(x, dim=dim2reduce, keepdim=True, unbiased=False) + self.eps).detach()

        def _normalize(self, x):
            x = (x - self.mean) / self.stdev
            if self.affine:
                x = x * self.affine_weight + self.affine_bias
            return x

        def _denormalize(self, x):
            if self.affine:
                x = (x - self.affine_bias) / (self.affine_weight + self.eps * self.eps)
            return x * self.stdev + self.mean

    class FlattenHead(nn.Module):
        def __init__(self, nf, target_window):
            super().__init__()
            self.flatten = nn.Flatten(start_dim=-2)
            self.linear = nn.Linear(nf, target_window)

        def forward(self, x):  # x: [bs x nvars x d_model x patch_num]
            return self.linear(self.flatten(x))

    class PatchTST(nn.Module):
        def __init__(self):
            super().__init__()
            self.revin_layer = RevIN(C)
            self.padding_patch_layer = nn.ReplicationPad1d((0, stride))
            patch_num = (L - patch_len) // stride + 1 + 1
            self.W_P = nn.Linear(patch_len, d_model)
            W_pos = torch.empty((patch_num, d_model))
            nn.init.uniform_(W_pos, -0.02, 0.02)
            self.W_pos = nn.Parameter(W_pos, requires_grad=True)
            layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=0.0,
                                               activation="gelu", batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=layers)
            self.head = FlattenHead(d_model * patch_num, H)

        def forward(self, z):  # z: [bs x seq_len x nvars]
            z = self.revin_layer(z, "norm")
            z = z.permute(0, 2, 1)
            if pad == "layer":
                z = self.padding_patch_layer(z)
            else:
                z = F.pad(z, (0, stride), mode="replicate")
            z = z.unfold(dimension=-1, size=patch_len, step=stride)  # [bs x nvars x patch_num x patch_len]
            n_vars = z.shape[1]
            u = self.W_P(z)
            u = torch.reshape(u, (u.shape[0] * u.shape[1], u.shape[2], u.shape[3]))
            u = u + self.W_pos
            u = self.encoder(u)
            u = torch.reshape(u, (-1, n_vars, u.shape[-2], u.shape[-1]))
            u = u.permute(0, 1, 3, 2)  # [bs x nvars x d_model x patch_num]
            z = self.head(u)
            z = z.permute(0, 2, 1)
            return self.revin_layer(z, "denorm")

    model = PatchTST()
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": []}
    criterion = nn.MSELoss() if loss == "mse" else nn.HuberLoss(delta=0.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer=optimizer, steps_per_epoch=len(data["train"]),
                                                    pct_start=0.3, epochs=epochs, max_lr=1e-2)
    for _ in range(epochs):
        model.train()
        for batch_x, batch_y in data["train"]:
            batch_x, batch_y = torch.from_numpy(batch_x), torch.from_numpy(batch_y)
            optimizer.zero_grad()
            outputs = model(batch_x)
            loss_value = criterion(outputs, batch_y)
            loss_value.backward()
            optimizer.step()
            scheduler.step()
            record["loss"].append(loss_value.item())
            record["lr"].append(scheduler.get_last_lr()[0])
            record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        batch_x, batch_y = (torch.from_numpy(a) for a in data["test"])
        pred = model(batch_x)
        record["pred"] = numpy_of(pred)
        record["mse"] = F.mse_loss(pred, batch_y).item()
        record["mae"] = F.l1_loss(pred, batch_y).item()
        record["huber"] = F.huber_loss(pred, batch_y, reduction="none", delta=0.5).mean(dim=(0, 1)).numpy().copy()
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    for k in [k for k in record["final"] if k.endswith("self_attn.in_proj_bias")]:
        # the keys' bias shifts all of a query's scores alike, which softmax ignores: its gradient is zero but for
        # rounding, which AdamW scales to steps of lr in either library
        record["final"][k] = np.delete(record["final"][k], np.s_[d_model:2 * d_model])
    return record


def forecasting_windows(rng, batches=3, batch=4, channels=3, length=16, horizon=6):
    train = series(rng, batches, batch, channels, length, horizon)
    return {"train": train, "test": series(rng, 1, 5, channels, length, horizon)[0]}


@pytest.mark.parametrize(("loss", "pad", "stats"), [("mse", "layer", "std"), ("huber", "functional", "var")])
def test_patch_tst_with_revin_replicate_padding_and_unfolded_patches_trains_like_torch(loss, pad, stats):
    ours, theirs = run_both(patch_tst, forecasting_windows(np.random.default_rng(0)), loss=loss, pad=pad, stats=stats)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A temporal convolutional network, as Bai, Kolter and Koltun's repository writes it: each level a TemporalBlock of two
# causal dilated nn.Conv1d under weight normalisation (torch.nn.utils.parametrizations.weight_norm, or the older hook
# torch.nn.utils.weight_norm that the repository imports), the padding of (k - 1) * dilation chomped off the end by
# slicing, ReLU, dropout (p=0), a 1x1 convolution on the residual where the widths differ; the last time step to a
# linear head; MSE, Adam with ReduceLROnPlateau on a validation loss; the state_dict keys of both weight
# normalisations; and causality, through the gradient of the first outputs with respect to the inputs.

def tcn(torch, init, data, num_channels=(6, 6, 8), kernel_size=3, norm="parametrization", epochs=3):
    nn = torch.nn
    weight_norm = torch.nn.utils.parametrizations.weight_norm if norm == "parametrization" else (
        torch.nn.utils.weight_norm)

    class Chomp1d(nn.Module):
        def __init__(self, chomp_size):
            super().__init__()
            self.chomp_size = chomp_size

        def forward(self, x):
            return x[:, :, :-self.chomp_size].contiguous()

    class TemporalBlock(nn.Module):
        def __init__(self, n_inputs, n_outputs, kernel_size, stride, dilation, padding, dropout=0.0):
            super().__init__()
            self.conv1 = weight_norm(nn.Conv1d(n_inputs, n_outputs, kernel_size, stride=stride, padding=padding,
                                               dilation=dilation))
            self.chomp1 = Chomp1d(padding)
            self.relu1 = nn.ReLU()
            self.dropout1 = nn.Dropout(dropout)
            self.conv2 = weight_norm(nn.Conv1d(n_outputs, n_outputs, kernel_size, stride=stride, padding=padding,
                                               dilation=dilation))
            self.chomp2 = Chomp1d(padding)
            self.relu2 = nn.ReLU()
            self.dropout2 = nn.Dropout(dropout)
            self.net = nn.Sequential(self.conv1, self.chomp1, self.relu1, self.dropout1,
                                     self.conv2, self.chomp2, self.relu2, self.dropout2)
            self.downsample = nn.Conv1d(n_inputs, n_outputs, 1) if n_inputs != n_outputs else None
            self.relu = nn.ReLU()

        def forward(self, x):
            out = self.net(x)
            res = x if self.downsample is None else self.downsample(x)
            return self.relu(out + res)

    class TemporalConvNet(nn.Module):
        def __init__(self, num_inputs, num_channels, kernel_size=2, dropout=0.0):
            super().__init__()
            layers = []
            for i in range(len(num_channels)):
                dilation_size = 2 ** i
                in_channels = num_inputs if i == 0 else num_channels[i - 1]
                out_channels = num_channels[i]
                layers += [TemporalBlock(in_channels, out_channels, kernel_size, stride=1, dilation=dilation_size,
                                         padding=(kernel_size - 1) * dilation_size, dropout=dropout)]
            self.network = nn.Sequential(*layers)

        def forward(self, x):
            return self.network(x)

    class TCN(nn.Module):
        def __init__(self, input_size, output_size):
            super().__init__()
            self.tcn = TemporalConvNet(input_size, num_channels, kernel_size=kernel_size)
            self.linear = nn.Linear(num_channels[-1], output_size)

        def forward(self, x):  # x: (N, C_in, L)
            y1 = self.tcn(x)
            return self.linear(y1[:, :, -1]), y1

    C = data["train"][0][0].shape[2]
    model = TCN(C, data["train"][0][1].shape[1] * C)
    record = {"init": initial_state(torch, model, init), "loss": [], "val": [], "lr": [], "grads": []}
    record["keys"] = list(model.state_dict().keys())
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, "min", factor=0.3, patience=0, threshold=0.5)

    def predict(batch_x):
        out, _ = model(batch_x.transpose(1, 2))
        return out.view(batch_x.shape[0], -1, C)

    for _ in range(epochs):
        model.train()
        for batch_x, batch_y in data["train"]:
            batch_x, batch_y = torch.from_numpy(batch_x), torch.from_numpy(batch_y)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(predict(batch_x), batch_y)
            loss.backward()
            optimizer.step()
            record["loss"].append(loss.item())
            record["grads"].append(gradients(model))
        model.eval()
        with torch.no_grad():
            val_x, val_y = (torch.from_numpy(a) for a in data["test"])
            val_loss = torch.nn.functional.mse_loss(predict(val_x), val_y)
        scheduler.step(val_loss)
        record["val"].append(val_loss.item())
        record["lr"].append(optimizer.param_groups[0]["lr"])
    x = torch.from_numpy(data["test"][0]).transpose(1, 2).clone().requires_grad_(True)
    _, features = model(x)
    features[:, :, :5].sum().backward()
    record["input_grad"] = numpy_of(x.grad)
    record["weight"] = numpy_of(model.tcn.network[0].conv1.weight)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def tcn_windows(rng, batches=3, batch=4, channels=2, length=20, horizon=3):
    return {"train": series(rng, batches, batch, channels, length, horizon),
            "test": series(rng, 1, 5, channels, length, horizon)[0]}


@pytest.mark.parametrize("norm", ["parametrization", "hook"])
def test_tcn_with_weight_norm_causal_dilated_convolutions_and_plateau_trains_like_torch(norm):
    ours, theirs = run_both(tcn, tcn_windows(np.random.default_rng(1)), norm=norm)
    keys = theirs.pop("keys")
    assert ours.pop("keys") == keys
    if norm == "parametrization":
        assert "tcn.network.0.conv1.parametrizations.weight.original0" in keys
    else:
        assert "tcn.network.0.conv1.weight_g" in keys and "tcn.network.0.conv1.weight_v" in keys
    assert np.all(theirs["input_grad"][:, :, 5:] == 0) and np.any(theirs["input_grad"][:, :, :5] != 0)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# N-BEATS, as the paper's repository writes it: stacks of blocks, each a ReLU MLP to expansion coefficients theta and a
# basis that turns them into a backcast and a forecast (a trend basis of powers of torch.linspace, a seasonality basis
# of cos and sin harmonics, a generic basis of slices of theta), the input read backwards (flip) with the backcast
# subtracted and masked, the blocks' forecasts summed onto the last value; sMAPE and MASE written in torch
# (divide_no_nan by in-place masking, or by torch.where); Adam with gradient clipping by value; then a rolling forecast
# under no_grad that feeds each forecast back in with cat and slicing.

def n_beats(torch, init, data, layers=2, layer_size=16, degree=2, harmonics=2, loss="smape", no_nan="mask",
            roll=3):
    nn = torch.nn
    L, H = data["x"].shape[1], data["y"].shape[1]

    class NBeatsBlock(nn.Module):
        def __init__(self, input_size, theta_size, basis_function):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(in_features=input_size, out_features=layer_size)] +
                                        [nn.Linear(in_features=layer_size, out_features=layer_size)
                                         for _ in range(layers - 1)])
            self.basis_parameters = nn.Linear(in_features=layer_size, out_features=theta_size)
            self.basis_function = basis_function

        def forward(self, x):
            block_input = x
            for layer in self.layers:
                block_input = torch.relu(layer(block_input))
            basis_parameters = self.basis_parameters(block_input)
            return self.basis_function(basis_parameters)

    class NBeats(nn.Module):
        def __init__(self, blocks):
            super().__init__()
            self.blocks = blocks

        def forward(self, x, input_mask):
            residuals = x.flip(dims=(1,))
            input_mask = input_mask.flip(dims=(1,))
            forecast = x[:, -1:]
            for block in self.blocks:
                backcast, block_forecast = block(residuals)
                residuals = (residuals - backcast) * input_mask
                forecast = forecast + block_forecast
            return forecast

    class GenericBasis(nn.Module):
        def __init__(self, backcast_size, forecast_size):
            super().__init__()
            self.backcast_size, self.forecast_size = backcast_size, forecast_size

        def forward(self, theta):
            return theta[:, :self.backcast_size], theta[:, -self.forecast_size:]

    class TrendBasis(nn.Module):
        def __init__(self, degree_of_polynomial, backcast_size, forecast_size):
            super().__init__()
            self.polynomial_size = degree_of_polynomial + 1
            backcast_t = torch.linspace(0, 1, backcast_size + 1)[:-1]
            forecast_t = torch.linspace(0, 1, forecast_size + 1)[:-1]
            self.backcast_time = nn.Parameter(torch.stack([backcast_t ** i for i in range(self.polynomial_size)]),
                                              requires_grad=False)
            self.register_buffer("forecast_time", torch.stack([torch.pow(forecast_t, i)
                                                               for i in range(self.polynomial_size)]))

        def forward(self, theta):
            backcast = torch.einsum("bp,pt->bt", theta[:, self.polynomial_size:], self.backcast_time)
            forecast = torch.einsum("bp,pt->bt", theta[:, :self.polynomial_size], self.forecast_time)
            return backcast, forecast

    class SeasonalityBasis(nn.Module):
        def __init__(self, harmonics, backcast_size, forecast_size):
            super().__init__()
            frequency = torch.cat([torch.zeros(1), torch.arange(harmonics, harmonics / 2 * forecast_size) / harmonics])
            backcast_grid = -2 * math.pi * (torch.arange(backcast_size)[:, None] / forecast_size) * frequency
            forecast_grid = 2 * math.pi * (torch.arange(forecast_size)[:, None] / forecast_size) * frequency
            self.register_buffer("backcast_cos_template", torch.cos(backcast_grid).T.contiguous())
            self.register_buffer("backcast_sin_template", torch.sin(backcast_grid).T.contiguous())
            self.register_buffer("forecast_cos_template", torch.transpose(torch.cos(forecast_grid), 0, 1))
            self.register_buffer("forecast_sin_template", torch.transpose(torch.sin(forecast_grid), 0, 1))
            self.theta_size = 4 * len(frequency)

        def forward(self, theta):
            params_per_harmonic = theta.shape[1] // 4
            p = params_per_harmonic
            backcast_harmonics_cos = torch.einsum("bp,pt->bt", theta[:, 2 * p:3 * p], self.backcast_cos_template)
            backcast_harmonics_sin = torch.einsum("bp,pt->bt", theta[:, 3 * params_per_harmonic:],
                                                  self.backcast_sin_template)
            backcast = backcast_harmonics_sin + backcast_harmonics_cos
            forecast_harmonics_cos = theta[:, :params_per_harmonic] @ self.forecast_cos_template
            forecast_harmonics_sin = torch.matmul(theta[:, params_per_harmonic:2 * params_per_harmonic],
                                                  self.forecast_sin_template)
            forecast = forecast_harmonics_sin + forecast_harmonics_cos
            return backcast, forecast

    seasonality = SeasonalityBasis(harmonics, L, H)
    blocks = nn.ModuleList(
        [NBeatsBlock(L, 2 * (degree + 1), TrendBasis(degree, L, H)) for _ in range(2)]
        + [NBeatsBlock(L, seasonality.theta_size, seasonality) for _ in range(2)]
        + [NBeatsBlock(L, L + H, GenericBasis(L, H))])
    model = NBeats(blocks)
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "clipped": []}
    record["templates"] = {k: numpy_of(v) for k, v in model.named_buffers()}

    def divide_no_nan(a, b):
        if no_nan == "mask":
            result = a / b
            result[result != result] = 0.0
            result[result == np.inf] = 0.0
            return result
        nonzero = b != 0
        return torch.where(nonzero, a / torch.where(nonzero, b, torch.ones_like(b)), torch.zeros_like(a))

    def smape_2_loss(forecast, target, mask):
        return 200 * torch.mean(divide_no_nan(torch.abs(forecast - target),
                                              torch.abs(forecast.data) + torch.abs(target.data)) * mask)

    def mase_loss(insample, freq, forecast, target, mask):
        masep = torch.mean(torch.abs(insample[:, freq:] - insample[:, :-freq]), dim=1)
        masked_masep_inv = divide_no_nan(mask, masep[:, None])
        return torch.mean(torch.abs(target - forecast) * masked_masep_inv)

    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    record["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    x_mask, y_mask = torch.from_numpy(data["x_mask"]), torch.from_numpy(data["y_mask"])
    for batch in data["batches"]:
        batch = torch.from_numpy(batch)
        model.train()
        optimizer.zero_grad()
        forecast = model(x[batch], x_mask[batch])
        if loss == "smape":
            training_loss = smape_2_loss(forecast, y[batch], y_mask[batch])
        else:
            training_loss = mase_loss(x[batch], 4, forecast, y[batch], y_mask[batch])
        training_loss.backward()
        record["clipped"].append(sum(int((p.grad.abs() > 0.05).sum()) for p in model.parameters()
                                     if p.grad is not None))
        torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=0.05)
        optimizer.step()
        record["loss"].append(training_loss.item())
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        window, ones = x.clone(), torch.ones_like(x)
        forecasts = []
        for _ in range(roll):
            forecast = model(window, ones)
            forecasts.append(forecast)
            window = torch.cat([window, forecast], dim=1)[:, -L:]
        record["rolled"] = numpy_of(torch.cat(forecasts, dim=1))
        record["window"] = numpy_of(window)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def m4_like(rng, n=8, length=12, horizon=4, steps=5, batch=4):
    t = np.arange(length + horizon)
    values = 10 + 0.3 * t * rng.uniform(0.5, 1.5, (n, 1)) + 3 * np.sin(2 * np.pi * t / 4 + rng.uniform(0, 6, (n, 1)))
    values = values + 0.2 * rng.normal(size=values.shape)
    values[0] = 5.0  # a flat series: its MASE scale is zero, the 0/0 divide_no_nan guards
    values[1, :3] = 0.0  # a series padded at the start, masked out
    x_mask = np.ones((n, length), np.float32)
    x_mask[1, :3] = 0.0
    y_mask = np.ones((n, horizon), np.float32)
    y_mask[2, -1] = 0.0
    return {"x": values[:, :length].astype(np.float32), "y": values[:, length:].astype(np.float32), "x_mask": x_mask,
            "y_mask": y_mask, "batches": [rng.choice(n, batch, replace=False) if s else np.arange(batch)
                                          for s in range(steps)]}


@pytest.mark.parametrize(("loss", "no_nan"), [("smape", "mask"), ("mase", "mask"), ("mase", "where")])
def test_n_beats_with_trend_and_seasonality_bases_clipping_and_rolling_forecast_trains_like_torch(loss, no_nan):
    ours, theirs = run_both(n_beats, m4_like(np.random.default_rng(2)), loss=loss, no_nan=no_nan)
    assert ours.pop("trainable") == theirs.pop("trainable")
    assert ours.pop("clipped") == theirs["clipped"] and sum(theirs.pop("clipped")) > 0
    assert np.all(np.isfinite(theirs["loss"]))
    assert_same(ours, theirs)


def test_the_older_weight_norm_hook_warns_as_torch_does_and_keeps_its_keys():
    seen = []
    for torch in LIBRARIES:
        with pytest.warns(FutureWarning) as caught:
            conv = torch.nn.utils.weight_norm(torch.nn.Conv1d(2, 3, 2))
        seen.append([str(w.message) for w in caught] + sorted(conv.state_dict()))
    assert seen[1] == seen[0]
    assert seen[0][0].startswith("`torch.nn.utils.weight_norm` is deprecated in favor of")


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

LIST_KEYWORDS = {
    # N-BEATS reads its input backwards with x.flip(dims=(1,)): a size or dims list that torch also takes as varargs
    # was refused by name
    "flip": lambda t: t.arange(6.0).view(2, 3).flip(dims=(1,)),
    "torch.flip": lambda t: t.flip(t.arange(6.0).view(2, 3), dims=[0, 1]),
    "permute": lambda t: t.arange(6.0).view(2, 3).permute(dims=(1, 0)),
    "view": lambda t: t.arange(6.0).view(size=(3, 2)),
    "reshape": lambda t: t.reshape(t.arange(6.0), shape=(3, 2)),
    "expand": lambda t: t.ones(1, 3).expand(size=(2, 3)),
    "repeat": lambda t: t.arange(3.0).repeat(repeats=(2, 1)),
    "tile": lambda t: t.arange(3.0).tile(dims=(2,)),
    "sum_to_size": lambda t: t.arange(6.0).view(2, 3).sum_to_size(size=(1, 3)),
    "new_zeros": lambda t: t.ones(2).new_zeros(size=(2, 1)),
    "new_ones": lambda t: t.ones(2).new_ones(size=[3]),
}


@pytest.mark.parametrize("case", LIST_KEYWORDS)
def test_a_size_or_dims_list_is_taken_by_keyword_as_torch_takes_it(case):
    seen = [numpy_of(LIST_KEYWORDS[case](torch)) for torch in LIBRARIES]
    assert seen[1].shape == seen[0].shape
    assert_same(seen[1], seen[0])


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_a_list_given_both_ways_or_not_at_all_is_refused_as_torch_does(torch):
    x = torch.ones(2, 3)
    exc = raised(lambda t: x.flip(1, dims=(1,)), torch)
    assert type(exc) is TypeError and str(exc) == "flip() got multiple values for argument 'dims'"
    exc = raised(lambda t: x.permute(), torch)
    assert type(exc) is TypeError and str(exc) == 'permute() missing 1 required positional arguments: "dims"'


SERIES_REFUSALS = {
    # met cutting patches (unfold) after a replicate pad, normalising (std) and scoring forecasts (losses); the text
    # is torch's, where tilewise had its own words or let numpy's ValueError through
    "unfold, size past the end": (lambda t: t.ones(2, 4).unfold(-1, 5, 1), RuntimeError,
                                  "maximum size for tensor at dimension 1 is 4 but size is 5"),
    "unfold, a 0-d tensor": (lambda t: t.tensor(3.0).unfold(0, 2, 1), RuntimeError,
                             "maximum size for tensor at dimension 0 is 1 but size is 2"),
    "unfold, negative size": (lambda t: t.ones(2, 4).unfold(-1, -1, 1), RuntimeError, "size is -1 but must be >= 0"),
    "unfold, step 0": (lambda t: t.ones(2, 4).unfold(-1, 2, 0), RuntimeError, "step is 0 but must be > 0"),
    "pad, odd length": (lambda t: t.nn.functional.pad(t.ones(2, 3), (1,), mode="replicate"), RuntimeError,
                        "Padding length must be divisible by 2"),
    "pad, too long": (lambda t: t.nn.functional.pad(t.ones(3), (1, 1, 1, 1)), RuntimeError,
                      "Padding length should be less than or equal to two times the input dimension but got padding "
                      "length 4 and input of dimension 1"),
    "pad, replicate of a 4-d input by 2": (
        lambda t: t.nn.functional.pad(t.ones(1, 2, 3, 4), (0, 2), mode="replicate"), NotImplementedError,
        "Padding size 2 is not supported for 4D input tensor.\nSupported combinations for non-constant padding:\n"
        "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
        "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
        "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)"),
    "pad, replicate of an empty series": (
        lambda t: t.nn.functional.pad(t.ones(1, 2, 0), (0, 2), mode="replicate"), RuntimeError,
        "Expected 2D or 3D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, "
        "but got: [1, 2, 0]"),
    "pad, reflect past the height": (
        lambda t: t.nn.functional.pad(t.ones(1, 2, 3, 3), (1, 1, 3, 0), mode="reflect"), RuntimeError,
        "Argument #6: Padding size should be less than the corresponding input dimension, but got: padding (3, 0) at "
        "dimension 2 of input [1, 2, 3, 3]"),
    "pad, circular twice around": (lambda t: t.nn.functional.pad(t.ones(1, 2, 3), (4, 0), mode="circular"),
                                   RuntimeError, "Padding value causes wrapping around more than once."),
    "pad, no such mode": (lambda t: t.nn.functional.pad(t.ones(1, 2, 3), (1, 0), mode="edge"), NotImplementedError,
                          "Unrecognised padding mode edge"),
    "pad, replicate with a value": (
        lambda t: t.nn.functional.pad(t.ones(1, 2, 3), (1, 0), mode="replicate", value=1.0), RuntimeError,
        "Padding mode \"replicate\" doesn't take in value argument"),
    "std of integers": (lambda t: t.arange(4).std(), RuntimeError,
                        "std and var only support floating point and complex dtypes"),
    "var_mean of integers": (lambda t: t.var_mean(t.arange(4)), RuntimeError,
                             "var_mean only support floating point and complex dtypes"),
    "std, unbiased and correction": (lambda t: t.ones(3, 4).std(1, unbiased=False, correction=0), TypeError,
                                     "std() received an invalid combination of arguments"),
    "huber_loss, delta 0": (lambda t: t.nn.functional.huber_loss(t.ones(3), t.zeros(3), delta=0.0), RuntimeError,
                            "huber_loss does not support non-positive values for delta."),
    "huber_loss of integers": (lambda t: t.nn.functional.huber_loss(t.ones(3, dtype=t.long), t.zeros(3, dtype=t.long)),
                               NotImplementedError, "\"huber_cpu\" not implemented for 'Long'"),
    "mse_loss of bools": (lambda t: t.nn.functional.mse_loss(t.ones(3, dtype=t.bool), t.zeros(3, dtype=t.bool)),
                          NotImplementedError, "\"mse_cpu\" not implemented for 'Bool'"),
    "smooth_l1_loss of complex": (
        lambda t: t.nn.functional.smooth_l1_loss(t.ones(3, dtype=t.complex64), t.zeros(3, dtype=t.complex64)),
        NotImplementedError, "\"smooth_l1_cpu\" not implemented for 'ComplexFloat'"),
    "smooth_l1_loss, negative beta": (lambda t: t.nn.functional.smooth_l1_loss(t.ones(3), t.zeros(3), beta=-1.0),
                                      RuntimeError, "smooth_l1_loss does not support negative values for beta."),
    "a loss, no such reduction": (lambda t: t.nn.functional.huber_loss(t.ones(3), t.zeros(3), reduction="avg"),
                                  ValueError, "avg is not a valid value for reduction"),
    "a loss, weights of another size": (lambda t: t.nn.functional.mse_loss(t.ones(3), t.zeros(3), weight=t.ones(2)),
                                        ValueError, "Weights and input must have the same size."),
    "binary_cross_entropy, target of another size": (
        lambda t: t.nn.functional.binary_cross_entropy(t.full((3,), 0.5), t.zeros(2)), ValueError,
        "Using a target size ({t}.Size([2])) that is different to the input size ({t}.Size([3])) is deprecated. "
        "Please ensure they have the same size."),
}


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", SERIES_REFUSALS)
def test_patching_normalising_and_losses_refuse_in_torchs_words(torch, case):
    call, kind, message = SERIES_REFUSALS[case]
    exc = raised(call, torch)
    assert type(exc) is kind and str(exc).startswith(message.format(t=torch.__name__)), repr(exc)


@pytest.mark.parametrize("loss", ["mse_loss", "huber_loss", "l1_loss"])
def test_a_loss_of_a_broadcast_target_warns_in_torchs_words(loss):
    seen = []
    for torch in LIBRARIES:
        with pytest.warns(UserWarning) as caught:
            value = getattr(torch.nn.functional, loss)(torch.ones(2, 3, 4), torch.zeros(3, 4))
        seen.append((value.item(), str(caught[0].message).replace(torch.__name__, "torch")))
    assert seen[1][0] == seen[0][0] and seen[1][1].startswith(seen[0][1]), seen


def test_unfold_of_a_0d_tensor_and_its_gradient_through_overlapping_windows_match_torch():
    seen = []
    for torch in LIBRARIES:
        x = torch.arange(7.0, requires_grad=True)
        windows = x.unfold(0, 3, 2)
        (windows * torch.arange(9.0).view(3, 3)).sum().backward()
        seen.append([numpy_of(windows), numpy_of(x.grad), numpy_of(torch.tensor(2.0).unfold(0, 1, 1)),
                     numpy_of(torch.tensor(2.0).unfold(0, 0, 1))])
    assert_same(seen[1], seen[0])
