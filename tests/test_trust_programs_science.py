"""Scientific-computing and control programs in the styles their papers' code is published in, run under torch and
under tilewise (``import tilewise as torch``) from the same initial weights and data, as in ``test_trust_programs.py``,
whose helpers these use: a Fourier neural operator in 1-D and 2-D (spectral convolutions with complex weights), neural
style transfer optimising the input image with L-BFGS, and a DQN agent on a small deterministic environment written
in tensors. Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (G, Q)

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
# A Fourier neural operator, as the reference scripts write it: a lifting Linear over (u, grid), spectral convolutions
# (rfft / rfft2, the lowest modes multiplied by complex weights through einsum, written into a zero complex spectrum,
# irfft / irfft2 back with n= / s=) beside pointwise 1x1 convolutions, GELU, a projection MLP; the 2-D model pads the
# domain with F.pad and crops it after. A unit Gaussian normaliser on the targets, the relative L2 loss (LpLoss), Adam
# with weight decay under StepLR.

def fno(torch, init, batches, dims=1, modes=4, width=8, layers=2, padding=2):
    nn, F = torch.nn, torch.nn.functional
    library = dims == "nd"  # the library's form: real weights viewed as complex, rfftn / irfftn over named dims
    dims = 2 if library else dims

    class SpectralConv1d(nn.Module):
        def __init__(self, in_channels, out_channels, modes1):
            super().__init__()
            self.out_channels, self.modes1 = out_channels, modes1
            self.scale = 1 / (in_channels * out_channels)
            self.weights1 = nn.Parameter(self.scale * torch.rand(in_channels, out_channels, modes1, dtype=torch.cfloat))

        def compl_mul1d(self, input, weights):
            return torch.einsum("bix,iox->box", input, weights)

        def forward(self, x):
            batchsize = x.shape[0]
            x_ft = torch.fft.rfft(x)
            out_ft = torch.zeros(batchsize, self.out_channels, x.size(-1) // 2 + 1, device=x.device, dtype=torch.cfloat)
            out_ft[:, :, :self.modes1] = self.compl_mul1d(x_ft[:, :, :self.modes1], self.weights1)
            return torch.fft.irfft(out_ft, n=x.size(-1))

    class SpectralConv2d(nn.Module):
        def __init__(self, in_channels, out_channels, modes1, modes2):
            super().__init__()
            self.out_channels, self.modes1, self.modes2 = out_channels, modes1, modes2
            self.scale = 1 / (in_channels * out_channels)
            self.weights1 = nn.Parameter(
                self.scale * torch.rand(in_channels, out_channels, modes1, modes2, dtype=torch.cfloat))
            self.weights2 = nn.Parameter(
                self.scale * torch.rand(in_channels, out_channels, modes1, modes2, dtype=torch.cfloat))

        def compl_mul2d(self, input, weights):
            return torch.einsum("bixy,ioxy->boxy", input, weights)

        def forward(self, x):
            batchsize = x.shape[0]
            x_ft = torch.fft.rfft2(x)
            out_ft = torch.zeros(batchsize, self.out_channels, x.size(-2), x.size(-1) // 2 + 1, dtype=torch.cfloat,
                                 device=x.device)
            out_ft[:, :, :self.modes1, :self.modes2] = self.compl_mul2d(x_ft[:, :, :self.modes1, :self.modes2],
                                                                        self.weights1)
            out_ft[:, :, -self.modes1:, :self.modes2] = self.compl_mul2d(x_ft[:, :, -self.modes1:, :self.modes2],
                                                                         self.weights2)
            return torch.fft.irfft2(out_ft, s=(x.size(-2), x.size(-1)))

    class SpectralConvNd(nn.Module):
        def __init__(self, in_channels, out_channels, n_modes, norm="ortho"):
            super().__init__()
            self.out_channels, self.n_modes, self.norm = out_channels, n_modes, norm
            scale = (2 / (in_channels + out_channels)) ** 0.5
            self.weight = nn.Parameter(scale * torch.randn(2, in_channels, out_channels, *n_modes, 2))
            self.bias = nn.Parameter(torch.zeros(out_channels, 1, 1))

        def forward(self, x):
            batchsize, channels, *mode_sizes = x.shape
            fft_dims = list(range(-len(mode_sizes), 0))
            x_ft = torch.fft.rfftn(x.float(), norm=self.norm, dim=fft_dims)
            weight = torch.view_as_complex(self.weight)
            out_ft = torch.zeros([batchsize, self.out_channels, *x_ft.shape[2:]], dtype=x_ft.dtype, device=x.device)
            m1, m2 = self.n_modes
            slices = [(slice(None), slice(None), slice(None, m1), slice(None, m2)),
                      (slice(None), slice(None), slice(-m1, None), slice(None, m2))]
            for w, idx in zip(weight, slices):
                out_ft[idx] = torch.einsum("bixy,ioxy->boxy", x_ft[idx], w)
            x = torch.fft.irfftn(out_ft, s=mode_sizes, norm=self.norm, dim=fft_dims)
            return x + self.bias

    class FNO(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc0 = nn.Linear(1 + dims, width)
            if library:
                self.convs = nn.ModuleList([SpectralConvNd(width, width, (modes, modes)) for _ in range(layers)])
                self.ws = nn.ModuleList([nn.Conv2d(width, width, 1, bias=False) for _ in range(layers)])
            elif dims == 1:
                self.convs = nn.ModuleList([SpectralConv1d(width, width, modes) for _ in range(layers)])
                self.ws = nn.ModuleList([nn.Conv1d(width, width, 1) for _ in range(layers)])
            else:
                self.convs = nn.ModuleList([SpectralConv2d(width, width, modes, modes) for _ in range(layers)])
                self.ws = nn.ModuleList([nn.Conv2d(width, width, 1) for _ in range(layers)])
            self.fc1 = nn.Linear(width, 16)
            self.fc2 = nn.Linear(16, 1)

        def get_grid(self, shape, device):
            batchsize, size_x = shape[0], shape[1]
            gridx = torch.tensor(np.linspace(0, 1, size_x), dtype=torch.float)
            if dims == 1:
                return gridx.reshape(1, size_x, 1).repeat([batchsize, 1, 1]).to(device)
            size_y = shape[2]
            gridx = gridx.reshape(1, size_x, 1, 1).repeat([batchsize, 1, size_y, 1])
            gridy = torch.tensor(np.linspace(0, 1, size_y), dtype=torch.float)
            gridy = gridy.reshape(1, 1, size_y, 1).repeat([batchsize, size_x, 1, 1])
            return torch.cat((gridx, gridy), dim=-1).to(device)

        def forward(self, x):
            grid = self.get_grid(x.shape, x.device)
            x = torch.cat((x, grid), dim=-1)
            x = self.fc0(x)
            if dims == 1:
                x = x.permute(0, 2, 1)
            else:
                x = x.permute(0, 3, 1, 2)
                x = F.pad(x, [0, padding, 0, padding])
            for i, (conv, w) in enumerate(zip(self.convs, self.ws)):
                x = conv(x) + w(x)
                if i < layers - 1:
                    x = F.gelu(x)
            if dims == 1:
                x = x.permute(0, 2, 1)
            else:
                x = x[..., :-padding, :-padding]
                x = x.permute(0, 2, 3, 1)
            x = F.gelu(self.fc1(x))
            return self.fc2(x)

    class UnitGaussianNormalizer:
        def __init__(self, x, eps=0.00001):
            self.mean = torch.mean(x, 0)
            self.std = torch.std(x, 0)
            self.eps = eps

        def encode(self, x):
            return (x - self.mean) / (self.std + self.eps)

        def decode(self, x):
            return (x * (self.std + self.eps)) + self.mean

    class LpLoss:
        def __init__(self, d=2, p=2, size_average=True, reduction=True):
            self.d, self.p, self.reduction, self.size_average = d, p, reduction, size_average

        def rel(self, x, y):
            num_examples = x.size()[0]
            diff_norms = torch.norm(x.reshape(num_examples, -1) - y.reshape(num_examples, -1), self.p, 1)
            y_norms = torch.norm(y.reshape(num_examples, -1), self.p, 1)
            if self.reduction:
                if self.size_average:
                    return torch.mean(diff_norms / y_norms)
                return torch.sum(diff_norms / y_norms)
            return diff_norms / y_norms

        def __call__(self, x, y):
            return self.rel(x, y)

    model = FNO()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    y_normalizer = UnitGaussianNormalizer(torch.from_numpy(np.concatenate([y for _, y in batches])))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    myloss = LpLoss(size_average=False)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        optimizer.zero_grad()
        out = y_normalizer.decode(model(x).reshape(y.shape))
        loss = myloss(out.view(x.shape[0], -1), y.view(x.shape[0], -1))
        loss.backward()
        optimizer.step()
        record["lr"].append(scheduler.get_last_lr()[0])
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        x, y = (torch.from_numpy(a) for a in batches[0])
        out = y_normalizer.decode(model(x).reshape(y.shape))
        record["eval"] = numpy_of(out)
        record["per_sample"] = numpy_of(LpLoss(reduction=False)(out, y))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def burgers_like(rng, dims, steps=4, batch=3, size=16):
    """Smooth random fields u0 on a periodic grid and targets from a fixed nonlinear smoothing of them."""
    batches = []
    shape = (batch, size) if dims == 1 else (batch, size, size)
    for _ in range(steps):
        spectrum = rng.normal(size=shape) * np.exp(-0.3 * np.arange(size))
        u0 = np.real(np.fft.ifft(spectrum, axis=-1)) * size
        u = np.tanh(np.roll(u0, 1, axis=-1) + 0.5 * u0) + 0.1 * u0 ** 2
        batches.append((u0[..., None].astype(np.float32), u.astype(np.float32)))
    return batches


@pytest.mark.parametrize("dims", [1, 2, "nd"])
def test_fourier_neural_operator_trains_like_torch(dims):
    ours, theirs = run_both(fno, burgers_like(np.random.default_rng(0), 1 if dims == 1 else 2), dims=dims)
    assert any(np.iscomplexobj(v) for v in theirs["init"].values()) == (dims != "nd")
    assert theirs["lr"] == [1e-2, 1e-2, 5e-3, 5e-3]
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Neural style transfer, as the tutorials write it: a small VGG-like feature extractor, frozen (requires_grad_(False),
# eval()), rebuilt as an nn.Sequential with a normalisation first and content/style loss modules inserted after chosen
# layers (the ReLUs replaced by out-of-place ones), then cut after the last loss; Gram matrices from mm of the flattened
# features (the PyTorch tutorial) or bmm of a batch (fast-neural-style's gram_matrix); the input image itself optimised
# by L-BFGS with a closure, clamped to [0, 1] between steps with img.data.clamp_ or clamp_ under no_grad.

def style_transfer(torch, init, images, gram="mm", clamp="no_grad", line_search=None, steps=3):
    nn, F = torch.nn, torch.nn.functional

    def gram_matrix(input):
        if gram == "bmm":
            b, ch, h, w = input.size()
            features = input.view(b, ch, w * h)
            features_t = features.transpose(1, 2)
            return features.bmm(features_t) / (ch * h * w)
        a, b, c, d = input.size()
        features = input.view(a * b, c * d)
        G = torch.mm(features, features.t())
        return G.div(a * b * c * d)

    class ContentLoss(nn.Module):
        def __init__(self, target):
            super().__init__()
            self.target = target.detach()

        def forward(self, input):
            self.loss = F.mse_loss(input, self.target)
            return input

    class StyleLoss(nn.Module):
        def __init__(self, target_feature):
            super().__init__()
            self.target = gram_matrix(target_feature).detach()

        def forward(self, input):
            G = gram_matrix(input)
            self.loss = F.mse_loss(G, self.target)
            return input

    class Normalization(nn.Module):
        def __init__(self, mean, std):
            super().__init__()
            self.mean = torch.tensor(mean).view(-1, 1, 1)
            self.std = torch.tensor(std).view(-1, 1, 1)

        def forward(self, img):
            return (img - self.mean) / self.std

    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, padding=1),
                        nn.ReLU(inplace=True), nn.MaxPool2d(2, 2), nn.Conv2d(8, 16, 3, padding=1),
                        nn.ReLU(inplace=True), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(inplace=True),
                        nn.MaxPool2d(2, 2), nn.Conv2d(16, 16, 3, padding=1))
    record = {"init": initial_state(torch, cnn, init)}
    cnn.eval()
    cnn.requires_grad_(False)
    content_layers, style_layers = ["conv_3"], ["conv_1", "conv_2", "conv_3", "conv_4"]
    content_img, style_img = torch.from_numpy(images["content"]), torch.from_numpy(images["style"])

    normalization = Normalization([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    content_losses, style_losses = [], []
    model = nn.Sequential(normalization)
    i = 0
    for layer in cnn.children():
        if isinstance(layer, nn.Conv2d):
            i += 1
            name = f"conv_{i}"
        elif isinstance(layer, nn.ReLU):
            name = f"relu_{i}"
            layer = nn.ReLU(inplace=False)
        elif isinstance(layer, nn.MaxPool2d):
            name = f"pool_{i}"
        else:
            raise RuntimeError(f"Unrecognized layer: {layer.__class__.__name__}")
        model.add_module(name, layer)
        if name in content_layers:
            target = model(content_img).detach()
            content_loss = ContentLoss(target)
            model.add_module(f"content_loss_{i}", content_loss)
            content_losses.append(content_loss)
        if name in style_layers:
            target_feature = model(style_img).detach()
            style_loss = StyleLoss(target_feature)
            model.add_module(f"style_loss_{i}", style_loss)
            style_losses.append(style_loss)
    for i in range(len(model) - 1, -1, -1):
        if isinstance(model[i], (ContentLoss, StyleLoss)):
            break
    model = model[:(i + 1)]
    record["layers"] = [name for name, _ in model.named_children()]

    input_img = content_img.clone()
    input_img.requires_grad_(True)
    model.eval()
    model.requires_grad_(False)
    # lr=0.5: at the tutorial's 1 a step overshoots to a loss of 1e7, where float32 rounding decides the rest
    optimizer = torch.optim.LBFGS([input_img], lr=0.5, max_iter=5, history_size=4, line_search_fn=line_search)
    style_weight, content_weight = 1e4, 1
    record["losses"], record["images"] = [], []
    run = [0]
    for _ in range(steps):
        def closure():
            if clamp == "no_grad":
                with torch.no_grad():
                    input_img.clamp_(0, 1)
            optimizer.zero_grad()
            model(input_img)
            style_score = 0
            content_score = 0
            for sl in style_losses:
                style_score += sl.loss
            for cl in content_losses:
                content_score += cl.loss
            style_score *= style_weight
            content_score *= content_weight
            loss = style_score + content_score
            loss.backward()
            run[0] += 1
            record["losses"].append([style_score.item(), content_score.item()])
            return style_score + content_score

        optimizer.step(closure)
        if clamp == "data":
            input_img.data.clamp_(0, 1)
        record["images"].append(numpy_of(input_img))
    with torch.no_grad():
        input_img.clamp_(0, 1)
    record["final"] = numpy_of(input_img)
    record["evaluations"] = run[0]
    record["frozen"] = [p.requires_grad for p in cnn.parameters()] + [cnn.training]
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    record["lbfgs"] = {"func_evals": state["func_evals"], "n_iter": state["n_iter"], "d": numpy_of(state["d"]),
                       "t": float(state["t"])}
    return record


def style_images(rng, size=12):
    content = rng.uniform(0, 1, (1, 3, size, size)).astype(np.float32)
    stripes = 0.5 + 0.5 * np.sin(np.arange(size)[None, :] * 1.3 + np.arange(3)[:, None, None] * 2.0)
    style = np.clip(stripes + 0.1 * rng.normal(size=(3, size, size)), 0, 1)[None].astype(np.float32)
    return {"content": content, "style": style}


@pytest.mark.parametrize(("gram", "clamp", "line_search"), [("mm", "no_grad", None), ("bmm", "data", None),
                                                             ("mm", "no_grad", "strong_wolfe")])
def test_neural_style_transfer_optimising_the_image_with_lbfgs_matches_torch(gram, clamp, line_search):
    ours, theirs = run_both(style_transfer, style_images(np.random.default_rng(5)), gram=gram, clamp=clamp,
                            line_search=line_search)
    layers = theirs.pop("layers")
    assert ours.pop("layers") == layers and layers[-1] == "style_loss_4" and not any(theirs["frozen"])
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A DQN agent, as the tutorials write it, on a deterministic grid world written in tensors (moves clamped to the grid, a
# goal, a step penalty, a time limit). A replay memory of transitions (a list whose samples are stacked with torch.stack
# and a terminal's next state None, masked as the PyTorch tutorial masks it; or preallocated tensors written in place
# and indexed), epsilon-greedy on an exponential schedule, the Q-value of each action taken through gather, targets
# under no_grad from a target network synced by load_state_dict(state_dict()) every few steps (or softly, key by key),
# plain or double DQN, the Huber loss, clip_grad_norm_, RMSprop or AdamW with amsgrad. The exploration draws and the
# replay indices are numpy's, fixed in advance: both runs take them.

def dqn(torch, init, draws, buffer="list", double=False, sync="hard", size=3, hidden=16, batch_size=8, gamma=0.9,
        max_steps=8):
    nn, F = torch.nn, torch.nn.functional
    n_obs, n_actions = size * size, 4

    class GridWorld:
        moves = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]])

        def __init__(self):
            self.goal = torch.tensor([size - 1, size - 1])

        def observe(self):
            obs = torch.zeros(n_obs)
            obs[self.pos[0] * size + self.pos[1]] = 1.0
            return obs

        def reset(self, start):
            self.pos, self.t = torch.tensor(start), 0
            return self.observe()

        def step(self, action):
            self.pos = (self.pos + self.moves[action]).clamp(0, size - 1)
            self.t += 1
            reached = bool(torch.equal(self.pos, self.goal))
            reward = 1.0 if reached else -0.05
            return self.observe(), reward, reached, self.t >= max_steps

    class DQN(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer1 = nn.Linear(n_obs, hidden)
            self.layer2 = nn.Linear(hidden, hidden)
            self.layer3 = nn.Linear(hidden, n_actions)

        def forward(self, x):
            x = F.relu(self.layer1(x))
            x = F.relu(self.layer2(x))
            return self.layer3(x)

    class ListMemory:
        def __init__(self, capacity):
            self.memory, self.capacity = [], capacity

        def push(self, state, action, next_state, reward):
            if len(self.memory) == self.capacity:
                self.memory.pop(0)
            self.memory.append((state, action, next_state, reward))

        def sample(self, idx):
            batch = [self.memory[i] for i in idx.tolist()]
            states, actions, next_states, rewards = zip(*batch)
            return torch.stack(states), torch.stack(actions), next_states, torch.stack(rewards)

        def __len__(self):
            return len(self.memory)

    class TensorMemory:
        def __init__(self, capacity):
            self.states = torch.zeros(capacity, n_obs)
            self.next_states = torch.zeros(capacity, n_obs)
            self.actions = torch.zeros(capacity, 1, dtype=torch.long)
            self.rewards = torch.zeros(capacity)
            self.dones = torch.zeros(capacity, dtype=torch.bool)
            self.capacity, self.ptr, self.size = capacity, 0, 0

        def push(self, state, action, next_state, reward):
            self.states[self.ptr] = state
            self.actions[self.ptr] = action
            self.next_states[self.ptr] = next_state if next_state is not None else torch.zeros(n_obs)
            self.dones[self.ptr] = next_state is None
            self.rewards[self.ptr] = reward
            self.ptr = (self.ptr + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

        def sample(self, idx):
            return (self.states[idx], self.actions[idx], self.next_states[idx], self.rewards[idx],
                    self.dones[idx].float())

        def __len__(self):
            return self.size

    policy_net = DQN()
    record = {"init": initial_state(torch, policy_net, init), "loss": [], "actions": [], "returns": [], "grads": []}
    target_net = DQN()
    target_net.load_state_dict(policy_net.state_dict())
    target_net.eval()
    if buffer == "list":
        optimizer = torch.optim.RMSprop(policy_net.parameters(), lr=1e-2, alpha=0.95, eps=0.01)
    else:
        optimizer = torch.optim.AdamW(policy_net.parameters(), lr=1e-2, amsgrad=True)
    memory = ListMemory(32) if buffer == "list" else TensorMemory(32)
    env = GridWorld()

    def select_action(state, steps_done):
        eps_threshold = 0.05 + (0.9 - 0.05) * math.exp(-1.0 * steps_done / 20)
        if draws["explore"][steps_done] > eps_threshold:
            with torch.no_grad():
                return policy_net(state.unsqueeze(0)).max(1).indices.view(1)
        return torch.tensor([draws["actions"][steps_done]], dtype=torch.long)

    def optimize_model(step):
        if len(memory) < batch_size:
            return
        idx = torch.from_numpy(draws["replay"][step] % len(memory))
        if buffer == "list":
            state_batch, action_batch, next_states, reward_batch = memory.sample(idx)
            non_final_mask = torch.tensor(tuple(s is not None for s in next_states), dtype=torch.bool)
            non_final_next_states = torch.stack([s for s in next_states if s is not None])
        else:
            state_batch, action_batch, next_state_batch, reward_batch, done_batch = memory.sample(idx)
        state_action_values = policy_net(state_batch).gather(1, action_batch)
        with torch.no_grad():
            if buffer == "list":
                next_state_values = torch.zeros(batch_size)
                if double:
                    best = policy_net(non_final_next_states).argmax(1, keepdim=True)
                    next_state_values[non_final_mask] = target_net(non_final_next_states).gather(1, best).squeeze(1)
                else:
                    next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
            else:
                if double:
                    best = policy_net(next_state_batch).argmax(dim=1, keepdim=True)
                    next_q = target_net(next_state_batch).gather(1, best).squeeze(1)
                else:
                    next_q = target_net(next_state_batch).max(1)[0]
                next_state_values = next_q * (1 - done_batch)
            expected_state_action_values = (next_state_values * gamma) + reward_batch
        loss = F.smooth_l1_loss(state_action_values, expected_state_action_values.unsqueeze(1))
        optimizer.zero_grad()
        loss.backward()
        record["norm"] = torch.nn.utils.clip_grad_norm_(policy_net.parameters(), 1.0).item()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(policy_net))

    steps_done = 0
    for start in draws["starts"]:
        state = env.reset(start)
        episode_return = 0.0
        while True:
            action = select_action(state, steps_done)
            observation, reward, terminated, truncated = env.step(action.item())
            episode_return += reward
            reward = torch.tensor([reward]).squeeze(0)
            next_state = None if terminated else observation
            memory.push(state, action, next_state, reward)
            state = observation
            optimize_model(steps_done)
            steps_done += 1
            record["actions"].append(action.item())
            if sync == "hard" and steps_done % 5 == 0:
                target_net.load_state_dict(policy_net.state_dict())
            elif sync == "soft":
                target_net_state_dict = target_net.state_dict()
                policy_net_state_dict = policy_net.state_dict()
                for key in policy_net_state_dict:
                    target_net_state_dict[key] = policy_net_state_dict[key] * 0.1 + target_net_state_dict[key] * 0.9
                target_net.load_state_dict(target_net_state_dict)
            if terminated or truncated:
                record["returns"].append(episode_return)
                break
    with torch.no_grad():
        record["q"] = numpy_of(policy_net(torch.eye(n_obs)))
        record["target_q"] = numpy_of(target_net(torch.eye(n_obs)))
    record["final"] = {k: numpy_of(v) for k, v in policy_net.state_dict().items()}
    return record


def exploration(rng, episodes=5, steps=40, batch_size=8):
    return {"explore": rng.uniform(size=steps + 1), "actions": rng.integers(0, 4, steps + 1),
            "replay": rng.integers(0, 1 << 30, (steps + 1, batch_size)),
            "starts": [list(rng.integers(0, 2, 2)) for _ in range(episodes)]}


@pytest.mark.parametrize(("buffer", "double", "sync"), [("list", False, "hard"), ("list", True, "hard"),
                                                         ("tensor", False, "soft"), ("tensor", True, "hard")])
def test_dqn_with_replay_and_a_target_network_trains_like_torch(buffer, double, sync):
    ours, theirs = run_both(dqn, exploration(np.random.default_rng(0)), buffer=buffer, double=double, sync=sync)
    assert ours["actions"] == theirs["actions"] and len(theirs["loss"]) > 10
    assert ours.pop("returns") == theirs.pop("returns")
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

EINSUM_PROMOTIONS = {
    # torch's einsum multiplies a pair where nothing is summed (element-wise, outer, an index summed within one
    # operand first), promoting the dtypes as mul does; a contraction runs bmm, which takes one dtype
    "hadamard": ("ij,ij->ij", [(2, 3), (2, 3)], ["float32", "complex64"]),
    "outer": ("i,j->ij", [(2,), (3,)], ["float32", "float64"]),
    "summed within one operand": ("ij,j->j", [(2, 3), (3,)], ["float32", "float64"]),
    "three operands": ("i,i,i->i", [(2,), (2,), (2,)], ["float32", "float64", "complex64"]),
    "spectral weights, modes broadcast": ("bix,ix->bix", [(2, 3, 4), (3, 4)], ["complex64", "float32"]),
}


@pytest.mark.parametrize("case", EINSUM_PROMOTIONS)
def test_einsum_without_a_contraction_promotes_mixed_dtypes_as_torch(case):
    equation, shapes, names = EINSUM_PROMOTIONS[case]
    rng = np.random.default_rng(0)
    data = [rng.normal(size=s).astype(np.float32) for s in shapes]
    seen = []
    for torch in LIBRARIES:
        operands = [torch.tensor(d).to(getattr(torch, n)).requires_grad_() for d, n in zip(data, names)]
        out = torch.einsum(equation, *operands)
        out.abs().sum().backward()
        seen.append([str(out.dtype).split(".")[-1], numpy_of(out), [numpy_of(t.grad) for t in operands]])
    assert_same(seen[1][1:], seen[0][1:])
    assert seen[1][0] == seen[0][0]


PRODUCT_DTYPE_REFUSALS = {
    "mm": (lambda t: t.mm(t.ones(2, 2), t.ones(2, 2, dtype=t.float64)),
           "expected m1 and m2 to have the same dtype, but got: float != double"),
    "mm, complex weights": (lambda t: t.ones(2, 2, dtype=t.cfloat) @ t.ones(2, 2),
                            "expected m1 and m2 to have the same dtype, but got: c10::complex<float> != float"),
    "linear": (lambda t: t.nn.functional.linear(t.ones(2, 2), t.ones(2, 2, dtype=t.float64)),
               "expected m1 and m2 to have the same dtype, but got: float != double"),
    "bmm": (lambda t: t.bmm(t.ones(1, 2, 2), t.ones(1, 2, 2, dtype=t.float64)),
            "expected scalar type Float but found Double"),
    "batched matmul": (lambda t: t.ones(3, 2, 2) @ t.ones(3, 2, 2, dtype=t.float64),
                       "expected scalar type Float but found Double"),
    "einsum contraction of complex by real": (
        lambda t: t.einsum("bix,iox->box", t.ones(2, 3, 4, dtype=t.cfloat), t.ones(3, 5, 4)),
        "expected scalar type ComplexFloat but found Float"),
    "einsum, the promoted pair then contracted": (
        lambda t: t.einsum("i,i,i->", t.ones(2), t.ones(2, dtype=t.float64), t.ones(2)),
        "expected scalar type Double but found Float"),
    "matrix @ vector": (lambda t: t.ones(3, 2, 2) @ t.ones(2, dtype=t.float64),
                        "addmv input tensors must have the same dtype, but got Double, Float, and Double"),
    "mv": (lambda t: t.mv(t.ones(2, 2, dtype=t.float64), t.ones(2)),
           "addmv input tensors must have the same dtype, but got Float, Double, and Float"),
    "vector @ vector": (lambda t: t.ones(2) @ t.ones(2, dtype=t.float64),
                        "dot : expected both vectors to have same dtype, but found Float and Double"),
    "vdot": (lambda t: t.vdot(t.ones(2), t.ones(2, dtype=t.float64)),
             "dot : expected both vectors to have same dtype, but found Float and Double"),
    "rfft of a complex signal": (lambda t: t.fft.rfft(t.ones(4, dtype=t.cfloat)),
                                 "rfft expects a real input tensor, but got ComplexFloat"),
    "rfft2 of a complex signal": (lambda t: t.fft.rfft2(t.ones(4, 4, dtype=t.cdouble)),
                                  "rfftn expects a real-valued input tensor, but got ComplexDouble"),
    "fft of half": (lambda t: t.fft.fft(t.ones(4, dtype=t.half)), "Unsupported dtype Half"),
}


REPLAY_REFUSALS = {
    # a replay batch's actions gathered from Q-values, and transitions stacked, with the mistakes that are easy to make
    "gather, an index taller than the Q-values": (
        lambda t: t.ones(4, 3).gather(1, t.zeros(5, 1, dtype=t.long)),
        "Size does not match at dimension 0 expected index [5, 1] to be no larger than self [4, 3] apart from "
        "dimension 1"),
    "gather, wider in a later dim": (
        lambda t: t.ones(4, 3, 2).gather(1, t.zeros(4, 1, 5, dtype=t.long)),
        "Size does not match at dimension 2 expected index [4, 1, 5] to be no larger than self [4, 3, 2] apart from "
        "dimension 1"),
    "gather, an action out of range": (lambda t: t.ones(4, 3).gather(1, t.full((4, 1), 3)),
                                       "index 3 is out of bounds for dimension 1 with size 3"),
    "stack of no transitions": (lambda t: t.stack([]), "stack expects a non-empty TensorList"),
    "hstack of nothing": (lambda t: t.hstack([]), "hstack expects a non-empty TensorList"),
    "vstack of nothing": (lambda t: t.vstack([]), "vstack expects a non-empty TensorList"),
    "stack of observations of two sizes": (
        lambda t: t.stack([t.ones(2), t.ones(3)]),
        "stack expects each tensor to be equal size, but got [2] at entry 0 and [3] at entry 1"),
}


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", {**PRODUCT_DTYPE_REFUSALS, **REPLAY_REFUSALS})
def test_products_transforms_gathers_and_stacks_refuse_in_torchs_words(torch, case):
    # met forgetting dtype=torch.cfloat on a spectral layer's weights (or its spectrum's zeros), and in replay batches
    call, message = {**PRODUCT_DTYPE_REFUSALS, **REPLAY_REFUSALS}[case]
    exc = raised(call, torch)
    assert type(exc) is RuntimeError, repr(exc)
    assert str(exc).startswith(message) if case in PRODUCT_DTYPE_REFUSALS else message in str(exc), str(exc)


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_optimises_a_complex_parameter_as_its_real_and_imaginary_parts(line_search):
    # met optimising a spectral layer's complex weights by L-BFGS, as style transfer optimises its image
    rng = np.random.default_rng(0)
    w0 = (rng.normal(size=(3, 2)) + 1j * rng.normal(size=(3, 2))).astype(np.complex64)
    target = (rng.normal(size=(3, 2)) + 1j * rng.normal(size=(3, 2))).astype(np.complex64)
    seen = []
    for torch in LIBRARIES:
        w = torch.nn.Parameter(torch.tensor(w0))
        optimizer = torch.optim.LBFGS([w], max_iter=4, line_search_fn=line_search)
        goal = torch.tensor(target)

        def closure(w=w, optimizer=optimizer, goal=goal):
            optimizer.zero_grad()
            loss = (w - goal).abs().pow(3).sum()
            loss.backward()
            return loss

        first = optimizer.step(closure).item()
        state = optimizer.state[w]
        seen.append([first, numpy_of(w), numpy_of(state["d"]), state["func_evals"]])
    assert seen[1][2].dtype == np.float32 and seen[1][2].shape == (12,)
    assert_same(seen[1], seen[0])


def test_variance_and_standard_deviation_of_complex_tensors_are_real_as_torchs():
    # met normalising a spectrum by its standard deviation: the mean modulus of the deviations, squared
    rng = np.random.default_rng(1)
    z0 = (rng.normal(size=(4, 3)) + 1j * rng.normal(size=(4, 3))).astype(np.complex64)
    seen = []
    for torch in LIBRARIES:
        z = torch.tensor(z0, requires_grad=True)
        var, std = z.var(0), z.std(1, keepdim=True)
        var_mean, std_mean = torch.var_mean(z, 0), torch.std_mean(z.to(torch.complex128), correction=0)
        (var.sum() + std.sum() + var_mean[0].sum() + var_mean[1].abs().sum() + std_mean[0] +
         std_mean[1].abs()).backward()
        dtypes = [str(t.dtype).split(".")[-1] for t in (var, std, *var_mean, *std_mean)]
        seen.append([dtypes, [numpy_of(t) for t in (var, std, *var_mean, *std_mean)], numpy_of(z.grad)])
    assert seen[1][0] == seen[0][0] == ["float32", "float32", "float32", "complex64", "float64", "complex128"]
    assert_same(seen[1][1:], seen[0][1:])
